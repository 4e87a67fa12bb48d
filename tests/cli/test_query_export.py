"""``hotspan query``, ``export``, ``convert`` and ``view`` as a user runs them: the real command
(a subprocess, output through a pipe) against a real server holding real profiles (Go CPU and
heap profiles written by runtime/pprof in a program built for the session, see the
``go_profiles`` fixture, and a Python program profiled by the real agent under ``hotspan run``),
with pprof files checked by ``go tool pprof``."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from hotspan.cli.profile_files import read_profile
from hotspan.formats.pprof import read_stack_profile
from hotspan.formats.proto import profile_pb2
from hotspan.model.stack_profile import StackProfile, function_values
from hotspan.ui.standalone import embedded_data
from tests.conftest import RunningServer, start_server
from tests.helpers import (
    CPU,
    GoProfiles,
    flamegraph,
    function_totals_once,
    ingest_pprof,
    self_totals,
)
from tests.server.pyroscope.test_go_pprof import GO, parse_top, pprof_top

ESC = "\x1b"
# How `go tool pprof -top` marks a function inlined into its caller, wholly or in part.
INLINE_MARK = re.compile(r" \((?:partial-)?inline\)$")
BURNER = """\
import time

def hot_loop(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

def cold_loop(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

def main():
    for _ in range(6):
        hot_loop(0.4)
        cold_loop(0.05)

main()
"""


def go_profile(path: Path) -> StackProfile:
    return read_stack_profile(path.read_bytes())


def cpu_total(path: Path) -> int:
    """CPU nanoseconds in a Go CPU profile, read from the file itself."""
    profile = go_profile(path)
    return profile.total(profile.select("cpu"))


def format_duration(ns: int) -> str:
    """The page's formatDuration (src/hotspan/ui/static/js/format.js), for the expected text."""
    steps = ((3600e9, "h"), (60e9, "min"), (1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1, "ns"))
    size, unit = next((step for step in steps if abs(ns) >= step[0]), steps[-1])
    value = ns / size
    return f"{trim(value)} {unit}"


def format_count(count: int) -> str:
    """The page's formatCount."""
    for size, unit in ((1e9, " G"), (1e6, " M"), (1e4, " k")):
        if abs(count) >= size:
            return trim(count / size) + unit
    return trim(count)


def trim(value: float) -> str:
    """The page's trim: 3 significant digits at most, no trailing zeros."""
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    text = f"{value:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


class Data:
    def __init__(self, server: RunningServer, start_s: int, go: GoProfiles) -> None:
        self.server = server
        self.start_s = start_s
        self.go = go
        self.cpu_total = cpu_total(go.cpu)  # what gocpu holds


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory, go_profiles: GoProfiles) -> Iterator[Data]:
    tmp = tmp_path_factory.mktemp("cli")
    srv = start_server(tmp / "data")
    try:
        start_s = int(time.time()) - 300
        with srv.client() as client:
            for name, path in (("gocpu", go_profiles.cpu), ("goheap", go_profiles.heap)):
                # Stamped now, so that the default range (the last hour) holds them.
                raw = gzip.decompress(path.read_bytes())
                profile = profile_pb2.Profile.FromString(raw)
                profile.time_nanos = start_s * 1_000_000_000
                body = gzip.compress(profile.SerializeToString())
                resp = ingest_pprof(client, name, body, start_s)
                assert resp.status_code == 200, resp.text
        # A Python program under the real agent: hot_loop burns 8x the CPU of cold_loop.
        program = tmp / "burner.py"
        program.write_text(BURNER)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HOTSPAN_", "OTEL_"))}
        env["HOTSPAN_UPLOAD_INTERVAL"] = "1"
        run = subprocess.run(
            [sys.executable, "-m", "hotspan", "run", "--application-name", "burner"]
            + ["--server-address", srv.url, "--", sys.executable, str(program)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        yield Data(srv, start_s, go_profiles)
    finally:
        if srv.process.poll() is None:
            srv.stop()
        if srv.process.stdout:
            srv.process.stdout.close()


def hotspan(
    *args: str,
    server: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    binary: bool = False,
) -> subprocess.CompletedProcess:
    """The command through pipes (stdout and stderr are not terminals)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("HOTSPAN_")}
    base.pop("BROWSER", None)
    base.pop("DISPLAY", None)
    base.pop("WAYLAND_DISPLAY", None)
    if server:
        base["HOTSPAN_SERVER"] = server
    proc = subprocess.run(
        [sys.executable, "-m", "hotspan", *args],
        capture_output=True,
        env={**base, **(env or {})},
        timeout=120,
    )
    assert ESC.encode() not in proc.stderr, proc
    assert binary or ESC.encode() not in proc.stdout, proc
    return proc


def ok(proc: subprocess.CompletedProcess) -> bytes:
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stderr == b"", proc.stderr.decode()
    return proc.stdout


def folded_totals(text: str) -> Dict[str, int]:
    """Total per function (once per stack) from folded lines."""
    out: Dict[str, int] = Counter()
    for line in text.splitlines():
        stack, _, value = line.rpartition(" ")
        for name in set(stack.split(";")):
            out[name] += int(value)
    return dict(out)


def table_rows(text: str) -> Tuple[str, list]:
    lines = text.splitlines()
    header, columns = lines[0], lines[1].split()
    assert columns == ["SELF", "SELF", "%", "TOTAL", "TOTAL", "%", "FUNCTION"], lines[1]
    rows = []
    for line in lines[2:]:
        if line.strip():
            m = re.match(r"\s*(\S+ \S+)\s+(\S+%)\s+(\S+ \S+)\s+(\S+%)\s+(.+)$", line)
            assert m, line
            rows.append(m.groups())
    return header, rows


def test_query_table_names_the_hot_function_first(data: Data) -> None:
    out = ok(hotspan("query", "burner", "--top", "5", server=data.server.url)).decode()
    header, rows = table_rows(out)
    assert header.startswith(CPU) and '{service_name="burner"}' in header
    assert rows[0][4] == "__main__.hot_loop", out
    names = [r[4] for r in rows]
    assert "__main__.cold_loop" in names and len(rows) <= 5
    # Values in their unit: CPU time in ms or s.
    assert re.fullmatch(r"[\d.]+ (ms|s)", rows[0][0]), rows[0]
    assert float(rows[0][1].rstrip("%")) > 50


def test_query_table_is_not_cut_when_piped(data: Data) -> None:
    args = ["query", "goheap", "--profile-type", "alloc_space", "--top", "0"]
    out = ok(hotspan(*args, server=data.server.url)).decode()
    _, rows = table_rows(out)
    type_id = "memory:alloc_space:bytes:space:bytes"
    graph = flamegraph(data.server.client(), '{service_name="goheap"}', 1, 2**31, type_id)
    # Every function, each on one line with its name in full, however wide the lines get.
    assert [r[4] for r in rows if r[4] in function_totals_once(graph)] == [r[4] for r in rows]
    assert len(rows) == len(function_totals_once(graph))
    assert max(len(line) for line in out.splitlines()) > 120
    assert "…" not in out
    expected = self_totals(graph)
    assert expected[rows[0][4]] == max(expected.values())


def test_query_json(data: Data) -> None:
    doc = json.loads(ok(hotspan("query", "gocpu", "--format", "json", server=data.server.url)))
    assert doc["profile_type"] == CPU and doc["unit"] == "nanoseconds"
    assert doc["selector"] == '{service_name="gocpu"}'
    assert doc["total"] == data.cpu_total > 0
    assert doc["end_ms"] - doc["start_ms"] == 3_600_000
    assert doc["from"].endswith("Z") and doc["until"].endswith("Z")
    functions = doc["functions"]
    profile = go_profile(data.go.cpu)
    in_file = function_values(profile, profile.select("cpu"))
    assert len(in_file) > 20  # so that the default --top 20 cuts
    assert len(functions) == 20
    selfs = [f["self"] for f in functions]
    assert selfs == sorted(selfs, reverse=True)
    graph = flamegraph(data.server.client(), '{service_name="gocpu"}', 1, 2**31)
    server_self, server_total = self_totals(graph), function_totals_once(graph)
    for f in functions:
        assert f["self"] == server_self[f["name"]] and f["total"] == server_total[f["name"]]
        assert f["self"] == in_file[f["name"]].self_value
        assert abs(f["self_percent"] - 100 * f["self"] / data.cpu_total) < 0.001
    every = json.loads(
        ok(hotspan("query", "gocpu", "--format", "json", "--top", "0", server=data.server.url))
    )
    assert sum(f["self"] for f in every["functions"]) == data.cpu_total
    totals = {f["name"]: f["total"] for f in every["functions"]}
    assert totals == {name: v.total_value for name, v in in_file.items()}
    # The Go program spends its CPU time under main.main, but for what Go's runtime does on
    # goroutines of its own (a background sweep or a stack growth may fall in the profile, or
    # runtime/pprof's own goroutine writing the CPU profile).
    cpu = profile.select("cpu")
    under_main = outside = 0
    for stack, value in profile.values(cpu):
        if any(f.name == "main.main" for f in stack):
            under_main += value
        else:
            assert stack[0].name.startswith(("runtime.", "runtime/pprof.")), stack
            outside += value
    assert totals["main.main"] == under_main == data.cpu_total - outside
    assert outside <= data.cpu_total // 10
    assert totals["main.burnHot"] > max(totals["main.burnWarm"], totals["main.burnCold"]) > 0


def test_query_folded_and_pprof(data: Data, tmp_path: Path) -> None:
    folded = ok(hotspan("query", "gocpu", "--format", "folded", server=data.server.url)).decode()
    assert sum(int(line.rsplit(" ", 1)[1]) for line in folded.splitlines()) == data.cpu_total
    graph = flamegraph(data.server.client(), '{service_name="gocpu"}', 1, 2**31)
    assert folded_totals(folded) == function_totals_once(graph)
    raw = ok(hotspan("query", "gocpu", "--format", "pprof", server=data.server.url, binary=True))
    assert read_stack_profile(raw).total(0) == data.cpu_total
    out = tmp_path / "q.pb.gz"
    assert (
        ok(
            hotspan(
                "query", "gocpu", "--format", "pprof", "-o", str(out), "--server", data.server.url
            )
        )
        == b""
    )
    assert read_profile(out).total(0) == data.cpu_total


def test_query_heap_types_in_bytes(data: Data) -> None:
    out = ok(
        hotspan("query", "goheap", "--profile-type", "alloc_space", server=data.server.url)
    ).decode()
    _, rows = table_rows(out)
    assert rows and all(re.fullmatch(r"[\d.]+ (B|KiB|MiB|GiB)", r[0]) for r in rows), out


@pytest.mark.skipif(GO is None, reason="`go` is not on PATH")
def test_export_every_format_and_round_trip(data: Data, tmp_path: Path) -> None:
    url = data.server.url
    graph = flamegraph(data.server.client(), '{service_name="gocpu"}', 1, 2**31)
    expected = function_totals_once(graph)
    paths = {
        "pprof": tmp_path / "cpu.pb.gz",
        "folded": tmp_path / "cpu.folded",
        "speedscope": tmp_path / "cpu.speedscope.json",
        "html": tmp_path / "cpu.html",
    }
    for path in paths.values():
        assert ok(hotspan("export", "gocpu", "-o", str(path), server=url)) == b""
    # go tool pprof reads the pprof export, with the total it reads in the Go program's own
    # profile (-top prints two decimals in its unit; Go's CPU values are multiples of 10 ms).
    total, unit, rows = parse_top(pprof_top(paths["pprof"], tmp_path))
    go_total, go_unit, go_rows = parse_top(pprof_top(data.go.cpu, tmp_path))
    assert (total, unit) == (go_total, go_unit) == (data.cpu_total, go_unit), (total, unit)

    # The same flat time per function, for every function with some (the export does not keep
    # Go's inlining marks, so "f (inline)" and "f (partial-inline)" are compared as "f").
    def flat(top_rows: Dict[str, float]) -> Dict[str, float]:
        return {INLINE_MARK.sub("", k): v for k, v in top_rows.items() if v}

    assert unit in ("ms", "s") and flat(rows) == flat(go_rows)
    assert folded_totals(paths["folded"].read_text()) == expected
    doc = json.loads(paths["speedscope"].read_bytes())
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    assert sum(doc["profiles"][0]["weights"]) == data.cpu_total
    page = embedded_data(paths["html"].read_text())
    assert page["unit"] == "nanoseconds"
    assert page["flamegraph"]["total"] == graph["total"] == str(data.cpu_total)
    assert function_totals_once(page["flamegraph"]) == expected
    # export pprof -> convert to speedscope -> convert to folded: the server's flame graph.
    converted = tmp_path / "again.speedscope.json"
    ok(hotspan("convert", str(paths["pprof"]), str(converted)))
    back = tmp_path / "again.txt"
    ok(hotspan("convert", str(converted), str(back)))
    assert folded_totals(back.read_text()) == expected
    # ... and back to pprof, still what go tool pprof reads.
    again = tmp_path / "again.pprof"
    ok(hotspan("convert", str(back), str(again)))
    total, unit, _ = parse_top(pprof_top(again, tmp_path))
    assert total == data.cpu_total and unit == ""  # folded has counts, no unit
    # --format wins over the name; stdout with "-".
    text = ok(hotspan("export", "gocpu", "--format", "folded", "-o", "-", server=url)).decode()
    assert folded_totals(text) == expected


def test_convert_selects_a_sample_type_for_folded(tmp_path: Path, go_profiles: GoProfiles) -> None:
    heap = go_profiles.heap
    profile = read_profile(heap)
    out = tmp_path / "inuse.folded"
    ok(hotspan("convert", str(heap), str(out), "--profile-type", "inuse_space"))
    total = sum(int(line.rsplit(" ", 1)[1]) for line in out.read_text().splitlines())
    assert total == profile.total(profile.select("inuse_space")) > 0
    assert total != profile.total(profile.select("alloc_space"))  # the type chosen, not the first
    proc = hotspan("convert", str(heap), str(out), "--profile-type", "wall")
    assert proc.returncode == 2
    assert b"no 'wall' samples" in proc.stderr and b"alloc_space" in proc.stderr


def test_view_prints_the_page_path(tmp_path: Path, go_profiles: GoProfiles) -> None:
    cpu = go_profiles.cpu
    profile = go_profile(cpu)
    samples, nanoseconds = profile.total(profile.select("samples")), cpu_total(cpu)
    assert nanoseconds == samples * profile.period > 0
    out = ok(hotspan("view", str(cpu), "--no-browser")).decode().strip()
    path = Path(out)
    assert path.is_absolute() and path.suffix == ".html" and path.exists(), out
    # CPU time unless told, as go tool pprof (Go CPU profiles start with the sample count).
    page = embedded_data(path.read_text())
    assert page["flamegraph"]["total"] == str(nanoseconds) and page["unit"] == "nanoseconds"
    out = ok(hotspan("view", str(cpu), "--no-browser", "--profile-type", "samples")).decode()
    assert embedded_data(Path(out.strip()).read_text())["flamegraph"]["total"] == str(samples)
    # No display and no BROWSER: nothing to open, so the path again.
    chosen = tmp_path / "chosen.html"
    assert ok(hotspan("view", str(cpu), "-o", str(chosen))).decode().strip() == str(chosen)
    assert "decodeFlamegraph" in chosen.read_text()


def test_no_data_names_what_exists(data: Data) -> None:
    proc = hotspan("query", "nosuch{env=prod}", server=data.server.url)
    assert proc.returncode == 1 and proc.stdout == b""
    err = proc.stderr.decode()
    assert err.count("\n") == 1, err
    assert '{service_name="nosuch", env="prod"}' in err and CPU in err
    assert "services with profiles in that range: burner, gocpu, goheap" in err
    proc = hotspan(
        "export", "gocpu", "--profile-type", "wall", "-o", "x.pb.gz", server=data.server.url
    )
    assert proc.returncode == 1 and b"wall:wall:nanoseconds" in proc.stderr
    # What gocpu has instead: Go's CPU profile, samples and time.
    assert b"it has: cpu, process_cpu:samples:count:cpu:nanoseconds" in proc.stderr
    proc = hotspan(
        "query",
        "gocpu",
        "--from",
        "2001-01-01T00:00:00Z",
        "--until",
        "2001-01-02T00:00:00Z",
        server=data.server.url,
    )
    assert proc.returncode == 1 and b"no profiles at all in that range" in proc.stderr


def test_an_alias_finds_the_type_an_sdk_files_it_under(data: Data) -> None:
    """Pyroscope's Node.js SDK sends CPU time as a sample type of its wall profile
    (wall:cpu:nanoseconds:wall:nanoseconds): `--profile-type cpu`, the default, finds it."""
    p = profile_pb2.Profile()
    strings = ["", "samples", "count", "wall", "nanoseconds", "cpu", "burn", "burn.js", "idle"]
    p.string_table.extend(s.encode() for s in strings)
    for kind, unit in (("samples", "count"), ("wall", "nanoseconds"), ("cpu", "nanoseconds")):
        p.sample_type.add(type=strings.index(kind), unit=strings.index(unit))
    p.period_type.type, p.period_type.unit = strings.index("wall"), strings.index("nanoseconds")
    p.period, p.time_nanos = 10_000_000, data.start_s * 1_000_000_000
    for fid, name in ((1, "burn"), (2, "idle")):
        p.function.add(id=fid, name=strings.index(name), filename=strings.index("burn.js"))
        p.location.add(id=fid).line.add(function_id=fid, line=fid)
    p.sample.add(location_id=[1], value=[30, 300_000_000, 290_000_000])
    p.sample.add(location_id=[2], value=[70, 700_000_000, 0])
    body = gzip.compress(p.SerializeToString())
    with data.server.client() as client:
        resp = ingest_pprof(client, "nodeapp.wall", body, data.start_s)
        assert resp.status_code == 200, resp.text
    out = ok(hotspan("query", "nodeapp", "--format", "json", server=data.server.url))
    doc = json.loads(out)
    assert doc["profile_type"] == "wall:cpu:nanoseconds:wall:nanoseconds", doc
    assert [f["name"] for f in doc["functions"]] == ["burn"]
    assert doc["total"] == 290_000_000


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["query", "svc{env="], b"bad selector"),
        (["query", "svc", "--profile-type", "nope"], b"unknown profile type 'nope'"),
        (["query", "svc", "--time-range", "5x"], b"--time-range"),
        (["query", "svc", "--time-range", "1h", "--from", "now-2h"], b"not both"),
        (["query", "svc", "--top", "-1"], b"--top"),
        (["query", "svc", "--format", "svg"], b"invalid choice: 'svg'"),
        (["export", "svc", "-o", "out.png"], b"out.png"),
        (["export", "svc"], b"-o/--output"),
        (["export", "svc", "-o", "-"], b"--format"),
        (["convert", "missing.pb.gz", "out.folded"], b"missing.pb.gz: no such file"),
        (["convert", "{in}", "out.png"], b"out.png"),
        (["view", "{bad}"], b"bad.pb.gz: not a valid pprof file"),
        (["query", "svc", "--server", "ftp://x"], b"--server 'ftp://x'"),
    ],
)
def test_bad_arguments_exit_2(tmp_path: Path, args: list, needle: bytes) -> None:
    good = tmp_path / "in.folded"
    good.write_text("a;b 1\n")
    bad = tmp_path / "bad.pb.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    args = [a.replace("{in}", str(good)).replace("{bad}", str(bad)) for a in args]
    # Nothing listens on the default server: arguments are checked before any request.
    proc = hotspan(*args, server="http://127.0.0.1:9")
    assert proc.returncode == 2, proc
    assert needle in proc.stderr, proc.stderr
    assert proc.stdout == b""


def test_unreachable_server() -> None:
    proc = hotspan("query", "svc", server="http://127.0.0.1:9")
    assert proc.returncode == 1
    assert proc.stderr.decode().startswith("hotspan query: cannot reach http://127.0.0.1:9")
    proc = hotspan("export", "svc", "-o", "x.pb.gz", "--server", "http://127.0.0.1:9")
    assert proc.returncode == 1 and b"cannot reach" in proc.stderr


def test_help_has_examples() -> None:
    for command in ("query", "export", "convert", "view"):
        text = ok(hotspan(command, "--help")).decode()
        assert "examples:" in text and f"hotspan {command} " in text


def _on_a_terminal(argv: List[str]) -> Tuple[int, str]:
    """``hotspan ARGV`` with stdin, stdout and stderr a pseudo-terminal: its exit status and
    all it wrote there."""
    import pty

    code = f"import sys\nfrom hotspan.cli import main\nsys.exit(main({argv!r}))\n"
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdin, stdout and stderr are the terminal
        os.execvpe(sys.executable, [sys.executable, "-c", code], os.environ)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode("utf-8", "replace")


def test_export_progress_on_a_terminal(data: Data, tmp_path: Path) -> None:
    """Under a pseudo-terminal the download shows a progress display (and a closing line);
    through pipes (every other test) stderr stays empty.  pprof is not written to one."""
    out = tmp_path / "tty.pb.gz"
    code, text = _on_a_terminal(["export", "gocpu", "-o", str(out), "--server", data.server.url])
    assert code == 0, text
    assert f"wrote {out} (pprof" in text
    assert ESC in text  # rich drew on the terminal
    assert read_profile(out).total(0) == data.cpu_total
    code, text = _on_a_terminal(
        ["export", "gocpu", "-o", "-", "--format", "pprof", "--server", data.server.url]
    )
    assert code == 2 and "pprof is binary" in text, text


def test_view_page_draws_in_chromium(tmp_path: Path, go_profiles: GoProfiles) -> None:
    """The page ``hotspan view`` writes, opened from file:// in Chromium: the flame graph draws
    from the inlined scripts (no network), with the same frames as the profile, and a diff page
    from diff_flamegraph_data draws too."""
    from hotspan.cli.profile_files import read_profile as read
    from hotspan.ui.standalone import diff_flamegraph_data, standalone_html
    from tests.ui.conftest import chromium_path

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if os.environ.get("HOTSPAN_REQUIRE_BROWSER") == "1":
            pytest.fail("Playwright is not installed")
        pytest.skip("Playwright is not installed")
    executable = chromium_path()
    cpu = go_profiles.cpu
    page_path = tmp_path / "cpu.html"
    ok(hotspan("view", str(cpu), "--no-browser", "--profile-type", "cpu", "-o", str(page_path)))
    profile = read(cpu)
    leaves = {stack[-1].name for stack, _ in profile.values(profile.select("cpu"))}
    diff_path = tmp_path / "diff.html"
    diff = diff_flamegraph_data(profile, 0, profile, profile.select("cpu"))
    diff_path.write_text(standalone_html(diff, title="diff", unit="count"))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            errors: list = []
            requests: list = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_path.as_uri())
            drawn = page.evaluate(
                "() => document.querySelector('#hs-graph').flamegraph.frames().map(f => f.name)"
            )
            total = profile.total(profile.select("cpu"))
            assert page.locator("#hs-total").inner_text() == f"total {format_duration(total)}"
            assert "total" in drawn and leaves & set(drawn), drawn[:20]
            page.goto(diff_path.as_uri())
            samples = profile.total(profile.select("samples"))
            assert (
                page.locator("#hs-total").inner_text()
                == f"baseline {samples}, comparison {format_count(total)}"
            )
            assert not errors, errors
            assert [u for u in requests if not u.startswith("file:")] == []
        finally:
            browser.close()
