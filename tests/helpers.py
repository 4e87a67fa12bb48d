"""Test-side builders: pprof payloads made directly with the protobuf classes, and small
clients for the query API."""

from __future__ import annotations

import gzip
import time
from typing import Dict, List, Optional, Sequence, Tuple

import httpx

from hotspan.formats.proto import profile_pb2

CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
QUERIER = "/querier.v1.QuerierService"


def make_pprof(
    samples: Sequence[Tuple[Sequence[str], int, Dict[str, str]]],
    sample_type: Tuple[str, str] = ("cpu", "nanoseconds"),
    period_type: Tuple[str, str] = ("cpu", "nanoseconds"),
    time_ns: Optional[int] = None,
    compress: bool = True,
) -> bytes:
    """samples: (frame names leaf first, value, string labels)."""
    strings: List[str] = [""]

    def s(text: str) -> int:
        if text not in strings:
            strings.append(text)
        return strings.index(text)

    p = profile_pb2.Profile()
    p.sample_type.add(type=s(sample_type[0]), unit=s(sample_type[1]))
    p.period_type.type, p.period_type.unit = s(period_type[0]), s(period_type[1])
    p.period = 10_000_000
    p.time_nanos = time_ns if time_ns is not None else time.time_ns()
    funcs: Dict[str, int] = {}
    for names, value, labels in samples:
        loc_ids = []
        for name in names:
            if name not in funcs:
                funcs[name] = len(funcs) + 1
                p.function.add(id=funcs[name], name=s(name), filename=s(name.split(".")[0] + ".py"))
                loc = p.location.add(id=funcs[name])
                loc.line.add(function_id=funcs[name], line=funcs[name])
            loc_ids.append(funcs[name])
        sample = p.sample.add(location_id=loc_ids, value=[value])
        for k, v in labels.items():
            sample.label.add(key=s(k), str=s(v))
    p.string_table.extend(x.encode() for x in strings)
    raw = p.SerializeToString()
    return gzip.compress(raw) if compress else raw


def ingest_pprof(
    client: httpx.Client, name: str, body: bytes, start_s: int, headers: Optional[dict] = None
) -> httpx.Response:
    return client.post(
        "/ingest",
        params={"name": name, "from": str(start_s), "until": str(start_s + 10), "format": "pprof"},
        content=body,
        headers=headers or {},
    )


def flamegraph(
    client: httpx.Client,
    selector: str,
    start_s: int,
    end_s: int,
    profile_type: str = CPU,
    headers: Optional[dict] = None,
    **extra,
) -> dict:  # type: ignore[no-untyped-def]
    r = client.post(
        f"{QUERIER}/SelectMergeStacktraces",
        json={
            "profileTypeID": profile_type,
            "labelSelector": selector,
            "start": start_s * 1000,
            "end": end_s * 1000,
            **extra,
        },
        headers=headers or {},
    )
    assert r.status_code == 200, r.text
    return r.json().get("flamegraph", {})


def _per_function(graph: dict, column: int) -> Dict[str, int]:
    """Sum of one node column (1: total, 2: self) per function name, over all its nodes."""
    names = graph.get("names", [])
    out: Dict[str, int] = {}
    for level in graph.get("levels", [])[1:]:
        values = [int(v) for v in level.get("values", [])]
        for i in range(0, len(values), 4):
            name = names[values[i + 3]]
            out[name] = out.get(name, 0) + values[i + column]
    return out


def function_totals(graph: dict) -> Dict[str, int]:
    return _per_function(graph, 1)


def self_totals(graph: dict) -> Dict[str, int]:
    return _per_function(graph, 2)
