"""The agent's hand-written pprof encoder, read back by protobuf and by ``go tool pprof``."""

from __future__ import annotations

import gzip
import shutil
import subprocess
from pathlib import Path

import pytest

from hotspan.agent.pprof_writer import ProfileWriter
from hotspan.formats.proto import profile_pb2


def _profile() -> bytes:
    writer = ProfileWriter(("cpu", "nanoseconds"), ("cpu", "nanoseconds"), 10_000_000)
    leaf = ("app.handlers.slow", "/srv/app/handlers.py", 42, 40)
    root = ("app.main.<module>", "/srv/app/main.py", 7, 1)
    writer.add([leaf, root], 30_000_000, [("span_id", "00f067aa0ba902b7")])
    writer.add([leaf, root], 20_000_000, [("span_id", "00f067aa0ba902b7")])  # merged
    writer.add([("app.handlers.fast", "/srv/app/handlers.py", 9, 8), root], 10_000_000)
    writer.add([root], 0)  # nothing to record
    return writer.encode(time_ns=1_700_000_000_000_000_000, duration_ns=10_000_000_000)


def test_decodes_with_protobuf() -> None:
    p = profile_pb2.Profile()
    p.ParseFromString(gzip.decompress(_profile()))
    s = [text.decode() for text in p.string_table]  # bytes in our .proto: see formats/proto
    assert s[0] == ""
    assert [(s[t.type], s[t.unit]) for t in p.sample_type] == [("cpu", "nanoseconds")]
    assert (s[p.period_type.type], s[p.period_type.unit], p.period) == (
        "cpu",
        "nanoseconds",
        10_000_000,
    )
    assert p.time_nanos == 1_700_000_000_000_000_000 and p.duration_nanos == 10_000_000_000
    functions = {f.id: f for f in p.function}
    locations = {loc.id: loc for loc in p.location}

    def stack(sample: profile_pb2.Sample) -> list:
        out = []
        for lid in sample.location_id:
            line = locations[lid].line[0]
            fn = functions[line.function_id]
            out.append((s[fn.name], s[fn.filename], line.line, fn.start_line))
        return out

    got = sorted(
        (stack(x), list(x.value), [(s[lb.key], s[lb.str]) for lb in x.label]) for x in p.sample
    )
    assert got == [
        (
            [
                ("app.handlers.fast", "/srv/app/handlers.py", 9, 8),
                ("app.main.<module>", "/srv/app/main.py", 7, 1),
            ],
            [10_000_000],
            [],
        ),
        (
            [
                ("app.handlers.slow", "/srv/app/handlers.py", 42, 40),
                ("app.main.<module>", "/srv/app/main.py", 7, 1),
            ],
            [50_000_000],
            [("span_id", "00f067aa0ba902b7")],
        ),
    ]


@pytest.mark.skipif(shutil.which("go") is None, reason="needs Go (scripts/test.sh installs it)")
def test_go_tool_pprof_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "agent.pb.gz"
    path.write_bytes(_profile())
    out = subprocess.run(
        ["go", "tool", "pprof", "-top", "-nodecount=10", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "app.handlers.slow" in out and "app.handlers.fast" in out
    assert "Total: 60ms" in out or "of 60ms total" in out, out


def test_several_sample_types_per_sample() -> None:
    """Go's heap shape: four values per sample, summed per stack and labels, zeros kept where
    another value of the same sample is not zero."""
    types = (
        ("alloc_objects", "count"),
        ("alloc_space", "bytes"),
        ("inuse_objects", "count"),
        ("inuse_space", "bytes"),
    )
    writer = ProfileWriter(types, ("space", "bytes"), 524288)
    leaf = ("app.cache.fill", "/srv/app/cache.py", 12, 10)
    writer.add([leaf], (3, 300, 1, 100), [("span_id", "00f067aa0ba902b7")])
    writer.add([leaf], (1, 100, 0, 0), [("span_id", "00f067aa0ba902b7")])
    writer.add([leaf], (0, 0, 2, 2048))  # only live now: no allocation in this window
    writer.add([leaf], (0, 0, 0, 0))  # nothing
    with pytest.raises(ValueError):
        writer.add([leaf], (1, 2))
    p = profile_pb2.Profile()
    p.ParseFromString(gzip.decompress(writer.encode(time_ns=1, duration_ns=2)))
    s = [text.decode() for text in p.string_table]
    assert [(s[t.type], s[t.unit]) for t in p.sample_type] == list(types)
    assert (s[p.period_type.type], s[p.period_type.unit], p.period) == ("space", "bytes", 524288)
    got = sorted((list(x.value), [(s[lb.key], s[lb.str]) for lb in x.label]) for x in p.sample)
    assert got == [
        ([0, 0, 2, 2048], []),
        ([4, 400, 1, 100], [("span_id", "00f067aa0ba902b7")]),
    ]
