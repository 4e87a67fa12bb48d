"""The published Pyroscope Python SDK (``pyroscope-io``) profiling a real child process and
pushing to a real server (``POST /push.v1.PusherService/Push``, gzip, ``application/proto``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, Optional

import pytest

from tests.conftest import RunningServer

try:
    import pyroscope  # noqa: F401
except Exception as exc:  # noqa: BLE001 - any import failure means: no SDK here
    pytest.skip(
        f"the pyroscope-io SDK cannot be imported ({exc!r}): pip install pyroscope-io",
        allow_module_level=True,
    )

QUERIER = "/querier.v1.QuerierService"
CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
BURN_SECONDS = 3.0

CHILD = r"""
import json, sys, time
import pyroscope

opts = json.loads(sys.argv[1])
ok = pyroscope.configure(**opts)
assert ok is not False, "pyroscope.configure failed"  # releases before 1.4 return None

def hotspan_sdk_unique_burner(seconds):
    end = time.time() + seconds
    x = 0
    while time.time() < end:
        for i in range(2000):
            x += i * i
    return x

hotspan_sdk_unique_burner(float(sys.argv[2]))
assert pyroscope.shutdown() is not False, "pyroscope.shutdown failed"
print("child done", flush=True)
"""


def run_children(server: RunningServer, tmp: Path, runs: Dict[str, dict]) -> None:
    """Run one profiled child per entry, concurrently; each flushes on shutdown."""
    script = tmp / "sdk_child.py"
    script.write_text(CHILD)
    procs = {}
    for key, extra in runs.items():
        opts = {"server_address": server.url, "sample_rate": 100, **extra}
        procs[key] = subprocess.Popen(
            [sys.executable, str(script), json.dumps(opts), str(BURN_SECONDS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    for key, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            raise AssertionError(f"SDK child {key} did not finish:\n{out}") from None
        assert proc.returncode == 0, f"SDK child {key} failed:\n{out}"


@pytest.fixture(scope="module")
def sdk_server(
    module_server: RunningServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    started = time.time()
    run_children(
        module_server,
        tmp_path_factory.mktemp("sdk"),
        {
            "default": {"application_name": "sdk.app", "tags": {"env": "test"}},
            "tenant": {
                "application_name": "sdk.tenant",
                "tags": {"env": "tenanted"},
                "tenant_id": "t1",
            },
        },
    )
    module_server.sdk_window_ms = (int(started * 1000) - 60_000, int(time.time() * 1000) + 60_000)  # type: ignore[attr-defined]
    yield module_server


def call(server: RunningServer, method: str, body: dict, tenant: Optional[str] = None) -> dict:
    start, end = server.sdk_window_ms  # type: ignore[attr-defined]
    headers = {"X-Scope-OrgID": tenant} if tenant else {}
    with server.client() as client:
        resp = client.post(
            f"{QUERIER}/{method}", json={"start": start, "end": end, **body}, headers=headers
        )
    assert resp.status_code == 200, f"{method}: {resp.status_code} {resp.text}"
    return resp.json()


def node_totals(fg: dict, name: str) -> int:
    """Sum of the totals of every flame graph node named ``name``."""
    if name not in fg.get("names", []):
        return 0
    idx = fg["names"].index(name)
    total = 0
    for level in fg.get("levels", []):
        vals = [int(v) for v in level.get("values", [])]
        total += sum(vals[i + 1] for i in range(0, len(vals), 4) if vals[i + 3] == idx)
    return total


def test_sdk_cpu_profile_is_queryable(sdk_server: RunningServer) -> None:
    msg = call(
        sdk_server,
        "SelectMergeStacktraces",
        {"profileTypeID": CPU, "labelSelector": '{service_name="sdk.app"}'},
    )
    fg = msg["flamegraph"]
    total = int(fg["total"])
    # ~3 s of CPU at 100 Hz, each sample worth 10 ms of CPU (allow a loaded machine).
    assert 1_000_000_000 <= total <= 4 * 1_000_000_000, total
    assert total % 10_000_000 == 0, total
    burner = node_totals(fg, "hotspan_sdk_unique_burner")
    assert burner > 0, fg["names"]
    # The burner dominates the child's CPU time.
    assert burner >= 0.7 * total, (burner, total)


def test_sdk_profile_type_and_labels(sdk_server: RunningServer) -> None:
    types = {t["ID"] for t in call(sdk_server, "ProfileTypes", {}).get("profileTypes", [])}
    assert CPU in types
    env = call(
        sdk_server, "LabelValues", {"name": "env", "matchers": ['{service_name="sdk.app"}']}
    ).get("names", [])
    assert env == ["test"]
    services = call(sdk_server, "LabelValues", {"name": "service_name"}).get("names", [])
    assert "sdk.app" in services
    names = call(sdk_server, "LabelNames", {"matchers": ['{service_name="sdk.app"}']})["names"]
    assert {"__name__", "service_name", "env"} <= set(names)
    # The SDK's exemplar labels are not series labels.
    assert "span_id" not in names and "profile_id" not in names


def test_sdk_tenant_header(sdk_server: RunningServer) -> None:
    sel = {"profileTypeID": CPU, "labelSelector": '{service_name="sdk.tenant"}'}
    visible = call(sdk_server, "SelectMergeStacktraces", sel, tenant="t1")["flamegraph"]
    assert int(visible["total"]) >= 1_000_000_000
    assert node_totals(visible, "hotspan_sdk_unique_burner") > 0
    assert call(sdk_server, "LabelValues", {"name": "env"}, tenant="t1")["names"] == ["tenanted"]
    # Not visible to the default tenant, nor to another one...
    hidden = call(sdk_server, "SelectMergeStacktraces", sel)["flamegraph"]
    assert int(hidden.get("total", 0)) == 0
    assert "sdk.tenant" not in call(sdk_server, "LabelValues", {"name": "service_name"})["names"]
    other = call(sdk_server, "SelectMergeStacktraces", sel, tenant="t2")["flamegraph"]
    assert int(other.get("total", 0)) == 0
    # ... and the default tenant's data is not visible to t1.
    assert (
        "sdk.app"
        not in call(sdk_server, "LabelValues", {"name": "service_name"}, tenant="t1")["names"]
    )
