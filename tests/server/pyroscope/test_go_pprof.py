"""``go tool pprof`` reads what ``SelectMergeProfile`` returns, and the server reads what Go's
``runtime/pprof`` writes."""

from __future__ import annotations

import collections
import gzip
import re
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Dict

import httpx
import pytest

from hotspan.formats.proto import profile_pb2, querier_pb2
from tests.conftest import RunningServer, shared_fixture
from tests.helpers import go_env

GO = shutil.which("go")
pytestmark = pytest.mark.skipif(
    GO is None, reason="`go` is not on PATH (install golang-go to run the go tool pprof tests)"
)
QUERIER = "/querier.v1.QuerierService"
CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"


def load(path: Path) -> profile_pb2.Profile:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return profile_pb2.Profile.FromString(raw)


def leaf_self(p: profile_pb2.Profile, index: int) -> Dict[str, int]:
    s = [x.decode("utf-8", "replace") for x in p.string_table]
    fn = {f.id: s[f.name] for f in p.function}
    loc = {loc.id: loc for loc in p.location}
    out: Dict[str, int] = collections.Counter()
    for sample in p.sample:
        if sample.value[index]:
            out[fn[loc[sample.location_id[0]].line[0].function_id]] += sample.value[index]
    return dict(out)


def select_merge_profile(client: httpx.Client, type_id: str, selector: str) -> bytes:
    req = querier_pb2.SelectMergeProfileRequest(
        profile_typeID=type_id,
        label_selector=selector,
        start=1,
        end=int(time.time() * 1000) + 86_400_000,
    )
    resp = client.post(
        f"{QUERIER}/SelectMergeProfile",
        content=req.SerializeToString(),
        headers={"content-type": "application/proto"},
    )
    assert resp.status_code == 200, resp.text
    assert resp.content[:2] != b"\x1f\x8b", "the response body is a plain pprof, not gzip"
    return resp.content


_UNITS = {
    "ns": 1,
    "us": 1e3,
    "µs": 1e3,
    "ms": 1e6,
    "s": 1e9,
    "": 1,
    "B": 1,
    "kB": 1024,
    "MB": 1024**2,
    "GB": 1024**3,
}


def pprof_top(path: Path, tmp: Path, *args: str) -> str:
    proc = subprocess.run(
        [GO, "tool", "pprof", "-top", "-nodecount=20", *args, str(path)],  # type: ignore[list-item]
        capture_output=True,
        text=True,
        timeout=120,
        env=go_env(tmp),
    )
    assert proc.returncode == 0, f"go tool pprof failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def parse_top(text: str):  # type: ignore[no-untyped-def]
    """(total, unit, {function: flat}) from ``go tool pprof -top`` output."""
    m = re.search(r"of ([\d.]+)(\w*) total", text)
    assert m, text
    total, unit = float(m.group(1)), m.group(2)
    rows = {}
    for line in text.splitlines():
        cols = line.split()
        if len(cols) >= 6 and cols[1].endswith("%") and cols[4].endswith("%"):
            flat = re.fullmatch(r"([\d.]+)(\D*)", cols[0])
            if flat:
                rows[" ".join(cols[5:])] = float(flat.group(1)) * _UNITS.get(flat.group(2), 1)
    return total * _UNITS.get(unit, 1), unit, rows


def test_go_tool_pprof_reads_select_merge_profile(server: RunningServer, tmp_path: Path) -> None:
    fixture = shared_fixture("og/convert/pprof/testdata/cpu.pb.gz")
    source = load(fixture)
    with server.client() as client:
        resp = client.post(
            "/ingest?" + urllib.parse.urlencode({"name": "gopprof.app", "format": "pprof"}),
            content=fixture.read_bytes(),
        )
        assert resp.status_code == 200, resp.text
        body = select_merge_profile(client, CPU, '{service_name="gopprof.app"}')
    out = tmp_path / "merged.pb"
    out.write_bytes(body)
    text = pprof_top(out, tmp_path)
    total, unit, rows = parse_top(text)
    expected_total = sum(s.value[1] for s in source.sample)  # 470 ms
    assert expected_total == 470_000_000
    assert unit == "ms" and total == expected_total, text
    assert "Type: cpu" in text, text
    expected = leaf_self(source, 1)
    # -nodecount=20 covers every leaf of this profile (7 samples).
    assert len(expected) <= 20
    flat = {name: v for name, v in rows.items() if v}
    assert flat == {name: float(v) for name, v in expected.items()}, text

    # The raw value view (-raw) lists every sample: the same multiset of values.
    raw = subprocess.run(
        [GO, "tool", "pprof", "-raw", str(out)],  # type: ignore[list-item]
        capture_output=True,
        text=True,
        timeout=120,
        env=go_env(tmp_path),
    )
    assert raw.returncode == 0, raw.stderr
    assert "runtime.pthread_cond_wait" in raw.stdout


def test_go_tool_pprof_reads_heap_merge(server: RunningServer, tmp_path: Path) -> None:
    fixture = shared_fixture("og/convert/pprof/testdata/heap.pb.gz")
    source = load(fixture)
    with server.client() as client:
        resp = client.post(
            "/ingest?" + urllib.parse.urlencode({"name": "gopprof.heap", "format": "pprof"}),
            content=fixture.read_bytes(),
        )
        assert resp.status_code == 200, resp.text
        body = select_merge_profile(
            client, "memory:alloc_objects:count:space:bytes", '{service_name="gopprof.heap"}'
        )
    out = tmp_path / "heap.pb"
    out.write_bytes(body)
    text = pprof_top(out, tmp_path)
    total, _, rows = parse_top(text)
    assert total == sum(s.value[0] for s in source.sample), text
    expected = leaf_self(source, 0)
    top = max(expected, key=expected.get)
    assert rows[top] == expected[top], text


GO_PROGRAM = r"""
package main

import (
	"os"
	"runtime/pprof"
	"time"
)

//go:noinline
func hotspanBurnCPU(d time.Duration) int {
	x := 0
	for end := time.Now().Add(d); time.Now().Before(end); {
		for i := 0; i < 100000; i++ {
			x += i * i
		}
	}
	return x
}

func main() {
	f, err := os.Create(os.Args[1])
	if err != nil {
		panic(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		panic(err)
	}
	hotspanBurnCPU(700 * time.Millisecond)
	pprof.StopCPUProfile()
	f.Close()
}
"""


def test_runtime_pprof_cpu_profile_ingested(server: RunningServer, tmp_path: Path) -> None:
    src = tmp_path / "burn.go"
    src.write_text(GO_PROGRAM)
    out = tmp_path / "cpu.pprof"
    try:
        proc = subprocess.run(
            [GO, "run", str(src), str(out)],  # type: ignore[list-item]
            capture_output=True,
            text=True,
            timeout=240,
            env=go_env(tmp_path),
            cwd=tmp_path,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("`go run` took over 240 s (cold build cache on a slow machine)")
    assert proc.returncode == 0, f"go run failed:\n{proc.stdout}\n{proc.stderr}"
    source = load(out)
    strs = [x.decode() for x in source.string_table]
    types = [(strs[t.type], strs[t.unit]) for t in source.sample_type]
    assert types == [("samples", "count"), ("cpu", "nanoseconds")]
    cpu_total = sum(s.value[1] for s in source.sample)
    assert cpu_total > 0, "the Go program recorded no CPU samples"
    with server.client() as client:
        resp = client.post(
            "/ingest?"
            + urllib.parse.urlencode(
                {"name": "gorun.app{lang=go}", "format": "pprof", "spyName": "gospy"}
            ),
            content=out.read_bytes(),
        )
        assert resp.status_code == 200, resp.text
        resp = client.post(
            f"{QUERIER}/SelectMergeStacktraces",
            json={
                "profileTypeID": CPU,
                "labelSelector": '{service_name="gorun.app"}',
                "start": 1,
                "end": int(time.time() * 1000) + 86_400_000,
            },
        )
        assert resp.status_code == 200, resp.text
        fg = resp.json()["flamegraph"]
    assert int(fg["total"]) == cpu_total
    assert "main.hotspanBurnCPU" in fg["names"]
    # The burner is where the CPU went: its node totals dominate the flame graph.
    idx = fg["names"].index("main.hotspanBurnCPU")
    burn_total = 0
    for level in fg["levels"]:
        vals = [int(v) for v in level["values"]]
        burn_total += sum(vals[i + 1] for i in range(0, len(vals), 4) if vals[i + 3] == idx)
    assert burn_total >= 0.8 * cpu_total
