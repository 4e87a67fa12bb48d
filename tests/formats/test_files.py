"""Profile files: pprof, folded, speedscope and the standalone HTML flame graph, read and
written through hotspan.cli.profile_files, on real profiles (Go CPU and heap profiles written by
runtime/pprof, see the ``go_profiles`` fixture, and speedscope's own examples) and checked with
``go tool pprof``."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path
from typing import Dict, Tuple

import pytest

from hotspan.cli import profile_files
from hotspan.formats import files
from hotspan.formats.errors import FormatError
from hotspan.formats.folded import parse_folded, write_folded
from hotspan.formats.speedscope import SCHEMA, read_speedscope, write_speedscope
from hotspan.model.profile import Frame
from hotspan.model.stack_profile import SampleType, StackProfile
from hotspan.ui.standalone import (
    diff_flamegraph_data,
    embedded_data,
    flamegraph_data,
    page_profile,
    standalone_html,
    strip_module,
)
from tests.conftest import shared_fixture
from tests.helpers import GoProfiles
from tests.server.pyroscope.test_go_pprof import GO, parse_top, pprof_top

SUFFIX = {"pprof": ".pb.gz", "folded": ".folded", "speedscope": ".speedscope.json", "html": ".html"}


def by_names(profile: StackProfile, position: int = 0) -> Dict[Tuple[str, ...], int]:
    out: Dict[Tuple[str, ...], int] = Counter()
    for stack, value in profile.values(position):
        out[tuple(f.name for f in stack)] += value
    return dict(out)


def small() -> StackProfile:
    p = StackProfile(
        [SampleType("cpu", "nanoseconds", "process_cpu"), SampleType("samples", "count", "")]
    )
    main, work, idle = Frame("main", "app.py", 1), Frame("work", "app.py", 7), Frame("idle")
    p.add([main, work], [30_000_000, 3])
    p.add([main, idle], [10_000_000, 1])
    p.add([main], [5_000_000, 1])
    return p


def test_round_trips_keep_totals_and_stacks(tmp_path: Path, go_profiles: GoProfiles) -> None:
    cpu = profile_files.read_profile(go_profiles.cpu)
    assert cpu.total(0) > 0 and len(cpu.stacks) > 5
    position = cpu.select("cpu")
    expected = by_names(cpu, position)
    assert sum(expected.values()) == cpu.total(position) == cpu.total(0) * cpu.period
    assert any("main.burnHot" in stack for stack in expected)
    # pprof -> speedscope -> folded -> pprof, each through a file and format detection.
    speedscope_file = tmp_path / "a.speedscope.json"
    speedscope_file.write_bytes(profile_files.write_profile(cpu, "speedscope"))
    from_speedscope = profile_files.read_profile(speedscope_file)
    assert [st.type for st in from_speedscope.sample_types] == [st.type for st in cpu.sample_types]
    assert by_names(from_speedscope, position) == expected
    folded_file = tmp_path / "b.txt"
    folded_file.write_bytes(profile_files.write_profile(from_speedscope, "folded", "cpu"))
    from_folded = profile_files.read_profile(folded_file)
    assert from_folded.sample_types == [SampleType("samples", "count")]
    assert by_names(from_folded) == expected
    pprof_file = tmp_path / "c.pb.gz"
    pprof_file.write_bytes(profile_files.write_profile(from_folded, "pprof"))
    assert by_names(profile_files.read_profile(pprof_file)) == expected


def test_speedscope_keeps_every_sample_type_and_frame_files(go_profiles: GoProfiles) -> None:
    heap = profile_files.read_profile(go_profiles.heap)
    assert len(heap.sample_types) == 4
    doc = json.loads(write_speedscope(heap, name="heap"))
    assert doc["$schema"] == SCHEMA == "https://www.speedscope.app/file-format-schema.json"
    assert [p["type"] for p in doc["profiles"]] == ["sampled"] * 4
    assert {p["unit"] for p in doc["profiles"]} == {"none", "bytes"}
    assert all(isinstance(f["name"], str) for f in doc["shared"]["frames"])
    assert any("file" in f and "line" in f for f in doc["shared"]["frames"])
    back = read_speedscope(json.dumps(doc).encode())
    assert back.sample_types == heap.sample_types
    for i in range(4):
        assert by_names(back, i) == by_names(heap, i)
        p = doc["profiles"][i]
        assert p["endValue"] == sum(p["weights"]) == heap.total(i)
    # Frames keep their file and line, not only their name.
    assert set(back.stacks) == {s for s, values in heap.stacks.items() if any(values)}


def test_speedscope_reads_speedscope_examples() -> None:
    # Files from speedscope's own test data: evented and sampled, seconds become nanoseconds.
    path = shared_fixture("og/convert/speedscope/testdata/simple.speedscope.json")
    assert files.detect_format(path, path.read_bytes()) == "speedscope"
    evented = profile_files.read_profile(path)
    assert evented.sample_types[0].unit == "count" and evented.total(0) == 14
    path = shared_fixture("og/convert/speedscope/testdata/two-sampled.speedscope.json")
    sampled = profile_files.read_profile(path)
    assert sampled.sample_types == [
        SampleType("one", "nanoseconds"),
        SampleType("two", "nanoseconds"),
    ]
    assert sampled.total(0) == sampled.total(1) == 14_000_000_000


def test_folded_is_sorted_and_names_only() -> None:
    text = write_folded(small()).decode()
    assert text == "main 5000000\nmain;idle 10000000\nmain;work 30000000\n"
    assert list(parse_folded(text.encode())) == [
        (["main"], 5_000_000),
        (["main", "idle"], 10_000_000),
        (["main", "work"], 30_000_000),
    ]
    assert write_folded(small(), 1).decode().splitlines()[-1] == "main;work 3"


def test_folded_holds_names_with_separators_and_line_breaks() -> None:
    """A frame name is any text (a qualname can hold a line break): folded output must still
    read back as the same stacks, one per line."""
    profile = StackProfile([SampleType("cpu", "nanoseconds")])
    odd = ["new\nline", "a;b", "cr\rhere", "sep\u2028arator", "vt\x0bab"]
    profile.add([Frame("main")] + [Frame(name) for name in odd], [7])
    text = write_folded(profile)
    assert text.count(b"\n") == 1
    [(frames, value)] = list(parse_folded(text))
    assert value == 7
    assert frames == ["main", "new\\nline", "a:b", "cr\\rhere", "sep\u2028arator", "vt\x0bab"]


def test_folded_files_with_a_byte_order_mark_or_latin1_are_text(tmp_path: Path) -> None:
    bom = tmp_path / "bom.folded"
    bom.write_bytes(b"\xef\xbb\xbfmain;a 5\n")
    assert files.detect_format(bom, bom.read_bytes()) == "folded"
    [(frames, value)] = list(parse_folded(bom.read_bytes()))
    assert (frames, value) == (["main", "a"], 5)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("main;caf\xe9 3\n".encode("latin-1"))
    assert profile_files.read_profile(latin1).total() == 3


def test_lock_aliases_and_values_past_int64(tmp_path: Path) -> None:
    locks = StackProfile(
        [SampleType("contentions", "count", "mutex"), SampleType("delay", "nanoseconds", "mutex")]
    )
    locks.add([Frame("main"), Frame("acquire")], [2, 900])
    assert profile_files.write_profile(locks, "folded", "lock_time") == b"main;acquire 900\n"
    assert profile_files.write_profile(locks, "folded", "lock_count") == b"main;acquire 2\n"
    with pytest.raises(FormatError, match="no 'bogus' samples"):
        profile_files.write_profile(locks, "pprof", "bogus")
    huge = StackProfile([SampleType("cpu", "nanoseconds")])
    for _ in range(1100):
        huge.add([Frame("a"), Frame("b")], [9_007_199_254_740_991])
    for fmt in ("pprof", "html"):
        with pytest.raises(FormatError, match="do not fit"):
            profile_files.write_profile(huge, fmt)


@pytest.mark.skipif(GO is None, reason="`go` is not on PATH")
def test_go_tool_pprof_reads_written_pprof(tmp_path: Path, go_profiles: GoProfiles) -> None:
    heap = profile_files.read_profile(go_profiles.heap)
    out = tmp_path / "heap.pb.gz"
    out.write_bytes(profile_files.write_profile(heap, "pprof"))
    position = heap.select("alloc_space")
    total, unit, rows = parse_top(pprof_top(out, tmp_path, "-sample_index=alloc_space"))
    # -top rounds to 3 significant digits in its unit.
    assert abs(total - heap.total(position)) <= 0.01 * heap.total(position), (total, unit)
    # ... and reads the same as from the file Go wrote.
    go_total, go_unit, go_rows = parse_top(
        pprof_top(go_profiles.heap, tmp_path, "-sample_index=alloc_space")
    )
    assert (total, unit) == (go_total, go_unit) and rows
    # The small profile: exact.
    out = tmp_path / "small.pb.gz"
    out.write_bytes(profile_files.write_profile(small(), "pprof"))
    total, unit, rows = parse_top(pprof_top(out, tmp_path, "-sample_index=cpu"))
    assert (total, unit) == (45_000_000, "ms")
    assert rows["work"] == 30_000_000 and rows["main"] == 5_000_000


def test_html_has_the_data_and_the_inlined_scripts() -> None:
    page = profile_files.write_profile(small(), "html", "cpu", title="small <cpu>").decode()
    assert page.startswith("<!doctype html>")
    assert "<title>small &lt;cpu&gt;</title>" in page
    data = embedded_data(page)
    assert data["unit"] == "nanoseconds"
    assert data["flamegraph"] == flamegraph_data(small(), 0)
    assert data["flamegraph"]["total"] == "45000000"
    assert data["flamegraph"]["names"][0] == "total"
    script = page[page.index("<script>") :]
    for name in ("function decodeFlamegraph", "class FlameGraph", "function formatValue"):
        assert name in script
    assert not re.search(r"^\s*(import|export)\s", script, re.M)
    # No placeholder survives and no script is left to be fetched.
    assert not re.search(r"\{\{\w+\}\}", page)
    assert "src=" not in page
    # And reading it back gives the same stacks.
    back = page_profile(page.encode())
    assert by_names(back) == by_names(small())


def test_html_escapes_data_that_would_end_the_script() -> None:
    p = StackProfile([SampleType("cpu", "nanoseconds")])
    p.add([Frame("</script><b>x"), Frame("f")], [7])
    page = standalone_html(flamegraph_data(p), title="t", unit="nanoseconds")
    assert "</script><b>" not in page
    assert by_names(page_profile(page.encode())) == {("</script><b>x", "f"): 7}


def test_strip_module_matches_the_ui_export() -> None:
    src = (
        'import { a, b } from "./x.js";\nexport function f() {}\nexport class C {}\nconst z = 1;\n'
    )
    assert strip_module(src) == "\nfunction f() {}\nclass C {}\nconst z = 1;\n"


def test_flamegraph_data_is_the_querier_encoding() -> None:
    fg = flamegraph_data(small(), 0)
    # Root, main, then idle and work (name order), self after the children.
    assert fg["names"] == ["total", "idle", "main", "work"]
    assert [lv["values"] for lv in fg["levels"]] == [
        ["0", "45000000", "0", "0"],
        ["0", "45000000", "5000000", "2"],
        ["0", "10000000", "10000000", "1", "0", "30000000", "30000000", "3"],
    ]
    assert fg["maxSelf"] == "30000000"
    diff = diff_flamegraph_data(small(), 1, small(), 1)
    assert (diff["leftTicks"], diff["rightTicks"], diff["total"]) == ("5", "5", "10")
    assert len(diff["levels"][1]["values"]) == 7
    empty = flamegraph_data(StackProfile([SampleType("cpu", "nanoseconds")]))
    assert empty["names"] == ["total"]


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("empty.pb.gz", b"", "empty"),
        ("bad.pb.gz", b"\x1f\x8b\x08\x00garbage", "pprof"),
        ("bad.json", b'{"profiles": []}', "not a speedscope file"),
        ("bad.speedscope.json", b'{"$schema": "' + SCHEMA.encode() + b'", "x": 1}', "speedscope"),
        ("bad.folded", b"main;work ten\n", "line 1"),
        ("other.html", b"<!doctype html><p>hi</p>", "HTML is an output format"),
        ("missing.pb.gz", None, "cannot read"),
    ],
)
def test_bad_files_give_a_reason(tmp_path: Path, name: str, content: bytes, reason: str) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(FormatError) as exc:
        profile_files.read_profile(path)
    assert reason in str(exc.value) and name in str(exc.value)


def test_format_for_path_and_detection(tmp_path: Path) -> None:
    assert files.format_for_path("x.pb.gz") == "pprof"
    assert files.format_for_path("x.pprof") == "pprof"
    assert files.format_for_path("x.speedscope.json") == "speedscope"
    assert files.format_for_path("x.json") == "speedscope"
    assert files.format_for_path("x.collapsed") == "folded"
    assert files.format_for_path("X.HTML") == "html"
    with pytest.raises(FormatError, match="x.png"):
        files.format_for_path("x.png")
    # Content wins over the name.
    folded_named_pprof = tmp_path / "oops.pb.gz"
    folded_named_pprof.write_bytes(b"a;b 3\n")
    assert profile_files.read_profile(folded_named_pprof).total() == 3
    with pytest.raises(FormatError, match="no 'wall' samples"):
        profile_files.write_profile(small(), "folded", "wall")
    with pytest.raises(FormatError, match="not a profile format"):
        profile_files.write_profile(small(), "svg")


def test_the_default_sample_type_is_what_is_shown_by_default() -> None:
    """pprof's default_sample_type (what `go tool pprof` shows unless told): read by both
    decoders, kept when written again, and what folded and html output hold by default."""
    from hotspan.formats import pprof, pprof_decode

    profile = StackProfile(
        [SampleType("wall", "nanoseconds", "wall"), SampleType("alloc_space", "bytes", "memory")]
    )
    profile.add([Frame("main"), Frame("sleep")], [900, 0])
    profile.add([Frame("main"), Frame("build")], [100, 4096])
    raw = pprof.write_stack_profile(profile, default_sample_type="wall")
    back = pprof.read_stack_profile(raw)
    assert back.default_type == "wall"
    assert profile_files.write_profile(back, "folded") == b"main;build 100\nmain;sleep 900\n"
    again = pprof.read_stack_profile(pprof.write_stack_profile(back))
    assert again.default_type == "wall"
    plain = gzip.decompress(raw)
    assert pprof_decode.decode_python(plain).default_sample_type == (
        pprof_decode.decode(plain).default_sample_type
    )


def test_speedscope_keeps_type_names_in_other_units() -> None:
    profile = StackProfile(
        [
            SampleType("wall", "milliseconds", "wall"),
            SampleType("alloc_objects", "objects", "memory"),
        ]
    )
    profile.add([Frame("a"), Frame("b")], [5, 7])
    back = read_speedscope(write_speedscope(profile))
    assert [(st.name, st.type) for st in back.sample_types] == [
        ("wall", "wall"),
        ("memory", "alloc_objects"),
    ]
    assert (back.total(0), back.total(1)) == (5_000_000, 7)  # milliseconds as nanoseconds
