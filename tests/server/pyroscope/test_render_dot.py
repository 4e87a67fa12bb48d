"""``/pyroscope/render?format=dot`` over real HTTP, as Grafana's "Explain flame graph" asks it
(``max-nodes=100``): the profile of the query as a DOT call graph, and no text for no samples."""

from __future__ import annotations

import re
import uuid

T0 = 1_700_000_000


def test_render_as_a_call_graph(module_server) -> None:  # type: ignore[no-untyped-def]
    service = f"dot_{uuid.uuid4().hex[:6]}"
    with module_server.client() as c:
        r = c.post(
            "/ingest",
            params={"name": f"{service}.cpu", "from": str(T0), "sampleRate": "100"},
            content=b"main;checkout;tax 30\nmain;checkout 10\nmain;idle 5\n",
        )
        assert r.status_code == 200, r.text
        params = {
            "query": f'process_cpu:cpu:nanoseconds:cpu:nanoseconds{{service_name="{service}"}}',
            "from": str((T0 - 60) * 1000),
            "until": str((T0 + 60) * 1000),
            "format": "dot",
            "max-nodes": "100",
        }
        r = c.get("/pyroscope/render", params=params)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/plain")
        text = r.text
        assert text.startswith('digraph "cpu" {') and text.rstrip().endswith("}")
        # 100 Hz: a sample is 10 ms; tax 300 ms of its own, checkout 400 ms in all.
        assert re.search(r'label="tax\\n300\.00ms \(66\.67%\)\\nof 300\.00ms', text), text
        assert re.search(r'label="checkout\\n100\.00ms \(22\.22%\)\\nof 400\.00ms', text), text
        assert len(re.findall(r"^N\d+ -> N\d+ ", text, re.M)) == 3
        # Three functions asked: the rest left out, the total still the whole profile's.
        r = c.get("/pyroscope/render", params={**params, "max-nodes": "2"})
        assert len(re.findall(r"^N\d+ \[", r.text, re.M)) == 2 and "of 450.00ms total" in r.text
        r = c.get("/pyroscope/render", params={**params, "from": "1000", "until": "2000"})
        assert r.status_code == 200 and r.text == ""
