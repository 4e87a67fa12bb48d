"""``/ingest`` of Pyroscope's binary formats over real HTTP: ``format=trie`` and
``format=tree``, or their ``binary/octet-stream+trie`` and ``+tree`` content types alone, gzipped
or not, read back through the querier as the folded stacks they hold."""

from __future__ import annotations

import gzip
import uuid
from typing import Dict

import pytest

from tests.formats.test_pyroscope_binary import STACKS, tree_of, trie_of
from tests.helpers import flamegraph, function_totals_once, self_totals

T0 = 1_700_000_000
PERIOD = 10**7  # 100 Hz: one sample is 10 ms of CPU


def expected(column: str) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for key, value in STACKS.items():
        frames = key.split(";")
        names = frames[-1:] if column == "self" else list(dict.fromkeys(frames))
        for name in names:
            out[name] = out.get(name, 0) + value * PERIOD
    return out


@pytest.mark.parametrize(
    "kind, how",
    [
        ("trie", "format"),
        ("trie", "content-type"),
        ("trie", "gzip"),
        ("tree", "format"),
        ("tree", "content-type"),
    ],
)
def test_binary_upload_reads_as_its_stacks(module_server, kind: str, how: str) -> None:  # type: ignore[no-untyped-def]
    service = f"legacy_{kind}_{uuid.uuid4().hex[:6]}"
    body = trie_of(STACKS) if kind == "trie" else tree_of(STACKS)
    params = {"name": f"{service}.cpu{{env=old}}", "from": str(T0), "sampleRate": "100"}
    headers = {}
    if how == "content-type":
        headers["content-type"] = f"binary/octet-stream+{kind}"
    else:
        params["format"] = kind
    if how == "gzip":
        body = gzip.compress(body)
    with module_server.client() as c:
        r = c.post("/ingest", params=params, content=body, headers=headers)
        assert r.status_code == 200, r.text
        graph = flamegraph(c, f'{{service_name="{service}"}}', T0 - 60, T0 + 60)
        assert {k: v for k, v in self_totals(graph).items() if v} == expected("self")
        assert function_totals_once(graph) == expected("total")
        r = c.post(
            "/querier.v1.QuerierService/LabelValues",
            json={
                "name": "env",
                "matchers": [f'{{service_name="{service}"}}'],
                "start": (T0 - 60) * 1000,
                "end": (T0 + 60) * 1000,
            },
        )
        assert r.status_code == 200 and r.json()["names"] == ["old"], r.text


def test_a_trie_standing_for_too_much_text_is_refused_and_the_server_goes_on(module_server) -> None:  # type: ignore[no-untyped-def]
    # 60,000 nested nodes of "a;", each a stack: 300 KB for 3.6 GB of folded text.
    body = b"\x00\x00\x01" + b"\x02a;\x01\x01" * 59_999 + b"\x01a\x01\x00"
    service = f"bomb_{uuid.uuid4().hex[:6]}"
    with module_server.client() as c:
        r = c.post("/ingest", params={"name": service, "format": "trie"}, content=body)
        # Its frames (1.8 billion) are past their bound before its folded text is.
        assert r.status_code == 400 and "more than 2097152 frames" in r.text, r.text
        r = c.post(
            "/ingest",
            params={"name": service, "format": "trie"},
            content=trie_of({"a;b": 1}),
        )
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("fmt", ["trie", "lines", "folded"])
def test_a_small_gzipped_body_of_millions_of_stacks_is_refused_quickly(module_server, fmt) -> None:  # type: ignore[no-untyped-def]
    # A few kilobytes gzipped that stand for millions of nodes or lines: refused within
    # seconds (before, each was read to the end: tens of seconds of a decoding thread and
    # gigabytes), and an upload behind them still goes through.
    body = {"trie": b"\x00\x00\x00", "lines": b"ab\n", "folded": b"ab 1\n"}[fmt] * 10_000_000
    service = f"bomb_{uuid.uuid4().hex[:6]}"
    with module_server.client() as c:
        r = c.post(
            "/ingest",
            params={"name": service, "format": fmt},
            content=gzip.compress(body, 9),
            headers={"Content-Encoding": "gzip"},
        )
        assert r.status_code == 400 and "more than 2097152" in r.text, r.text
        r = c.post("/ingest", params={"name": service}, content=b"main;work 3\n")
        assert r.status_code == 200, r.text


def test_pyroscopes_own_upload_by_content_type_alone(module_server) -> None:  # type: ignore[no-untyped-def]
    # The trie of Pyroscope's ingest tests: foo;bar 2 and foo;baz 3, the split inside "bar";
    # its Content-Type wins over another format, as in Pyroscope.
    body = b"\x00\x00\x01\x06foo;ba\x00\x02\x01r\x02\x00\x01z\x03\x00"
    service = f"legacy_{uuid.uuid4().hex[:6]}"
    with module_server.client() as c:
        r = c.post(
            "/ingest",
            params={"name": service, "from": str(T0), "format": "folded"},
            content=body,
            headers={"content-type": "binary/octet-stream+trie"},
        )
        assert r.status_code == 200, r.text
        graph = flamegraph(c, f'{{service_name="{service}"}}', T0 - 60, T0 + 60)
        assert {k: v for k, v in self_totals(graph).items() if v} == {
            "bar": 2 * PERIOD,
            "baz": 3 * PERIOD,
        }
