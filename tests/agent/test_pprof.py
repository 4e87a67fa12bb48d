"""The agent's hand-written pprof encoders (C and its pure-Python twin), read back by protobuf
and by ``go tool pprof``, and byte-for-byte the same for the same calls."""

from __future__ import annotations

import gzip
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any, List, Tuple

import pytest

from hotspan.agent import pprof_writer
from hotspan.agent.pprof_writer import PyProfileWriter
from hotspan.formats.proto import profile_pb2

WRITERS = [pytest.param(PyProfileWriter, id="python")]
if pprof_writer._native is not None:
    WRITERS.append(pytest.param(pprof_writer.ProfileWriter, id="c"))


@pytest.fixture(params=WRITERS)
def ProfileWriter(request: pytest.FixtureRequest) -> Any:  # noqa: N802 - stands for the class
    return request.param


def _profile(ProfileWriter: Any) -> bytes:  # noqa: N803
    writer = ProfileWriter(("cpu", "nanoseconds"), ("cpu", "nanoseconds"), 10_000_000)
    leaf = ("app.handlers.slow", "/srv/app/handlers.py", 42, 40)
    root = ("app.main.<module>", "/srv/app/main.py", 7, 1)
    writer.add([leaf, root], 30_000_000, [("span_id", "00f067aa0ba902b7")])
    writer.add([leaf, root], 20_000_000, [("span_id", "00f067aa0ba902b7")])  # merged
    writer.add([("app.handlers.fast", "/srv/app/handlers.py", 9, 8), root], 10_000_000)
    writer.add([root], 0)  # nothing to record
    return writer.encode(time_ns=1_700_000_000_000_000_000, duration_ns=10_000_000_000)


def test_decodes_with_protobuf(ProfileWriter: Any) -> None:  # noqa: N803
    p = profile_pb2.Profile()
    p.ParseFromString(gzip.decompress(_profile(ProfileWriter)))
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
def test_go_tool_pprof_reads_it(tmp_path: Path, ProfileWriter: Any) -> None:  # noqa: N803
    path = tmp_path / "agent.pb.gz"
    path.write_bytes(_profile(ProfileWriter))
    out = subprocess.run(
        ["go", "tool", "pprof", "-top", "-nodecount=10", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "app.handlers.slow" in out and "app.handlers.fast" in out
    assert "Total: 60ms" in out or "of 60ms total" in out, out


def test_several_sample_types_per_sample(ProfileWriter: Any) -> None:  # noqa: N803
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


def _calls(seed: int) -> List[Tuple[Any, ...]]:
    """A profile's worth of add() calls as the agent makes them, and the odd ones it does not:
    stacks shared by key, equal stacks under other keys, list stacks and labels, zero and
    negative values, negative lines, a lone surrogate in a file name, an empty stack."""
    rng = random.Random(seed)
    frames = [
        (f"mod{i % 7}.func{i}", f"/srv/app/mod{i % 7}.py", rng.randrange(1, 900), i)
        for i in range(40)
    ]
    frames.append(("weird.<lambda>", "/srv/\udcff/bad.py", -1, 0))
    frames.append(("", "", 0, 0))
    stacks = [tuple(rng.sample(frames, rng.randrange(0, 12))) for _ in range(30)]
    spans = [format(rng.getrandbits(64), "016x") for _ in range(25)]
    calls: List[Tuple[Any, ...]] = []
    for _ in range(600):
        stack = rng.choice(stacks)
        labels: Any = (("span_id", rng.choice(spans)), ("trace_id", "ab" * 16))[: rng.randrange(3)]
        if rng.random() < 0.1:
            labels = [list(pair) for pair in labels]
        value = rng.choice([0, -5, 1, 10_000_000, 2**40])
        how = rng.random()
        if how < 0.5:
            calls.append((stack, value, labels, id(stack)))
        elif how < 0.8:
            calls.append((stack, value, labels, None))
        else:
            calls.append((list(stack), value, labels, None))
    return calls


@pytest.mark.skipif(pprof_writer._native is None, reason="the C encoder is not built")
@pytest.mark.parametrize("seed", range(5))
def test_c_and_python_encoders_write_the_same_bytes(seed: int) -> None:
    c_types: Any = pprof_writer.ProfileWriter
    for types in [("cpu", "nanoseconds"), [("alloc_objects", "count"), ("alloc_space", "bytes")]]:
        c = c_types(types, ("cpu", "nanoseconds"), 10_000_000)
        py = PyProfileWriter(types, ("cpu", "nanoseconds"), 10_000_000)
        for stack, value, labels, key in _calls(seed):
            if isinstance(types, list):
                value = (value, value * 64) if value >= 0 else (0, 0)
            c.add(stack, value, labels, stack_key=key)
            py.add(stack, value, labels, stack_key=key)
        assert len(c) == len(py) > 0
        assert c.sample_types == py.sample_types
        raw = c.encode_raw(1_700_000_000_000_000_000, 10_000_000_000)
        assert raw == py.encode_raw(1_700_000_000_000_000_000, 10_000_000_000)
        p = profile_pb2.Profile()
        p.ParseFromString(gzip.decompress(c.encode(1, 2)))
        assert len(p.sample) == len(c)


def test_bad_calls_raise_and_leave_the_profile_usable(ProfileWriter: Any) -> None:  # noqa: N803
    writer = ProfileWriter(("cpu", "nanoseconds"), ("cpu", "nanoseconds"), 10)
    leaf = ("f", "/f.py", 3, 1)
    with pytest.raises(ValueError):
        writer.add([leaf], (1, 2))  # two values for one type
    with pytest.raises((TypeError, ValueError)):
        writer.add([("f", "/f.py")], 5)  # a frame of two fields
    with pytest.raises((TypeError, ValueError)):
        writer.add([leaf], 5, [("span_id",)])  # a label without a value
    writer.add([leaf], 5)
    p = profile_pb2.Profile()
    p.ParseFromString(gzip.decompress(writer.encode(1, 2)))
    assert [list(x.value) for x in p.sample][-1] == [5]


def test_default_sample_type(ProfileWriter: Any) -> None:  # noqa: N803
    # What /debug/pprof/allocs asks for: pprof's tools then show alloc_space, not the last.
    types = (("alloc_objects", "count"), ("alloc_space", "bytes"))
    writer = ProfileWriter(types, ("space", "bytes"), 512)
    writer.add((("f", "a.py", 1, 1),), [1, 100])
    chosen = profile_pb2.Profile.FromString(gzip.decompress(writer.encode(1, 2, "alloc_space")))
    assert chosen.string_table[chosen.default_sample_type] == b"alloc_space"
    assert [list(s.value) for s in chosen.sample] == [[1, 100]]
    plain = profile_pb2.Profile.FromString(gzip.decompress(writer.encode(1, 2)))
    assert plain.default_sample_type == 0
