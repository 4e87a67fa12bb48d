"""``hotspan diff`` against a real server holding two runs of a real program under the real
agent (``hotspan run --tag commit=...``), the second with one function made 3x slower."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from tests.conftest import RunningServer

SERVICE = "diff-checkout"
SLOW = "workload.compute_checksum"
OTHERS = ("workload.parse_input", "workload.render_output")
BASELINE = f"{SERVICE}{{commit=a}}"
COMPARISON = f"{SERVICE}{{commit=b}}"

# Three functions burning CPU alike, each in its own loop (so that self = total); SLOW_FACTOR
# makes one of them slower.  In an imported module, and uploads every 0.5 s: the agent names
# the script's own functions __main__.f while it runs but prog.f when it first sees them at
# exit (CPython has deleted __main__.__file__ by then), so both runs must upload mid-run.
WORKLOAD = textwrap.dedent(
    """
    import os, time

    def _until(seconds):
        return time.process_time() + seconds

    def parse_input(seconds):
        end, n = _until(seconds), 0
        while time.process_time() < end:
            n += 1

    def compute_checksum(seconds):
        end, n = _until(seconds * float(os.environ.get("SLOW_FACTOR", "1"))), 0
        while time.process_time() < end:
            n += 1

    def render_output(seconds):
        end, n = _until(seconds), 0
        while time.process_time() < end:
            n += 1

    def main():
        for _ in range(3):
            parse_input(0.1)
            compute_checksum(0.1)
            render_output(0.1)
    """
)


@dataclass
class Runs:
    server: RunningServer
    directory: Path


def _clean_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HOTSPAN_", "PYROSCOPE_", "OTEL_", "NO_COLOR", "FORCE_COLOR"))
    }
    env.update(extra or {})
    return env


@pytest.fixture(scope="module")
def runs(module_server: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    directory = tmp_path_factory.mktemp("diff-program")
    (directory / "workload.py").write_text(WORKLOAD)
    (directory / "prog.py").write_text("import workload\nworkload.main()\n")
    for commit, factor in (("a", "1"), ("b", "3")):
        result = subprocess.run(
            [sys.executable, "-m", "hotspan", "run", "--application-name", SERVICE]
            + ["--tag", f"commit={commit}", "--server-address", module_server.url]
            + ["--sample-rate", "200", "--no-trace-correlation", "--", "python", "prog.py"],
            cwd=directory,
            env=_clean_env({"SLOW_FACTOR": factor, "HOTSPAN_UPLOAD_INTERVAL": "0.5"}),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
    return Runs(module_server, directory)


def diff(runs: Runs, *args: str, sides: bool = True) -> subprocess.CompletedProcess:
    base = ["--baseline", BASELINE, "--comparison", COMPARISON] if sides else []
    return subprocess.run(
        [sys.executable, "-m", "hotspan", "diff", "--server", runs.server.url, *base, *args],
        env=_clean_env(),
        capture_output=True,  # a pipe: no terminal
        text=True,
        timeout=60,
    )


def table_rows(text: str) -> List[List[str]]:
    """The data rows of the table: six numbers, then the function."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"^\s*([-+]?\d+\.\d\d(?:\s+[-+]?\d+\.\d\d){5})\s+(\S.*)$", line)
        if m:
            rows.append(m.group(1).split() + [m.group(2)])
    return rows


def test_table_ranks_the_slower_function_first(runs: Runs) -> None:
    result = diff(runs)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "\x1b" not in out  # piped: no colour, no cursor codes
    rows = table_rows(out)
    assert rows, out
    first = rows[0]
    assert first[6] == SLOW, out
    # Baseline about a third of the CPU, comparison about 60%: some 27 points more.
    self_delta, total_delta = float(first[2]), float(first[5])
    assert 15 < self_delta < 40 and 15 < total_delta < 40, out
    others = {r[6]: r for r in rows if r[6] in OTHERS}
    assert set(others) == set(OTHERS), out
    assert all(float(r[2]) < -5 for r in others.values()), out  # their share shrank
    # Whole lines, however long: the heading is over 80 columns and is not wrapped.
    assert any(len(line) > 100 for line in out.splitlines()), out
    assert all(line == line.rstrip() for line in out.splitlines())
    assert f"baseline    {BASELINE}" in out and f"comparison  {COMPARISON}" in out


def test_json_agrees_with_the_table(runs: Runs) -> None:
    table = diff(runs, "--top", "0")
    doc_run = diff(runs, "--format", "json", "--top", "0")
    assert table.returncode == doc_run.returncode == 0, doc_run.stderr
    doc = json.loads(doc_run.stdout)
    assert doc["profile_type"] == "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
    assert doc["unit"] == "nanoseconds"
    assert doc["baseline"]["selector"] == BASELINE
    assert doc["comparison"]["query"] == f'{{service_name="{SERVICE}", commit="b"}}'
    assert doc["baseline"]["duration_s"] == 3600.0
    # The slower side spent more CPU in all: shares, not values, are compared.
    assert doc["comparison"]["total"] > 1.3 * doc["baseline"]["total"]
    assert "regressions" not in doc and doc["fail_above"] is None
    functions = doc["functions"]
    assert functions[0]["name"] == SLOW
    for side in ("baseline", "comparison"):
        total = doc[side]["total"]
        assert sum(f[side]["self"] for f in functions) == total
        assert abs(sum(f[side]["self_share"] for f in functions) - 100) < 0.01
        slow = functions[0][side]
        assert slow["self_share"] == pytest.approx(100 * slow["self"] / total, abs=1e-3)
    rows = table_rows(table.stdout)
    assert [r[6] for r in rows] == [f["name"] for f in functions]
    for row, f in zip(rows, functions):
        expected = [
            f["baseline"]["self_share"],
            f["comparison"]["self_share"],
            f["self_delta"],
            f["baseline"]["total_share"],
            f["comparison"]["total_share"],
            f["total_delta"],
        ]
        assert [float(x) for x in row[:6]] == pytest.approx(expected, abs=0.0051), f["name"]


def test_fail_above_both_ways(runs: Runs) -> None:
    doc = json.loads(diff(runs, "--format", "json").stdout)
    growth = max(doc["functions"][0]["self_delta"], doc["functions"][0]["total_delta"])

    failing = diff(runs, "--fail-above", f"{growth - 5:.2f}")
    assert failing.returncode == 1, failing.stderr
    assert SLOW in failing.stderr
    assert not any(name in failing.stderr for name in OTHERS)
    assert table_rows(failing.stdout)[0][6] == SLOW  # the table is still printed

    passing = diff(runs, "--fail-above", f"{growth + 5:.2f}")
    assert passing.returncode == 0, passing.stderr
    assert passing.stderr == ""

    as_json = diff(runs, "--format", "json", "--fail-above", f"{growth - 5:.2f}")
    assert as_json.returncode == 1
    regressions = json.loads(as_json.stdout)["regressions"]
    assert [r["name"] for r in regressions] == [SLOW]


@pytest.mark.parametrize("fmt", ["table", "folded"])
def test_gate_holds_when_the_reader_stops_early(runs: Runs, fmt: str) -> None:
    """``hotspan diff ... | head -1`` in CI: the reader closes the pipe before the table is
    written; the regression still fails the job."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: the first write breaks the pipe
    try:
        result = subprocess.run(
            [sys.executable, "-m", "hotspan", "diff", "--server", runs.server.url]
            + ["--baseline", BASELINE, "--comparison", COMPARISON, "--format", fmt]
            + ["--top", "0", "--fail-above", "5"],
            env=_clean_env(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert result.returncode == 1, result.stderr
    assert SLOW in result.stderr
    assert "Traceback" not in result.stderr


def test_folded_has_two_value_columns(runs: Runs) -> None:
    result = diff(runs, "--format", "folded")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines
    sums = [0, 0]
    for line in lines:
        m = re.fullmatch(r"(\S[^ ]*(?: [^ ]+)*?) (\d+) (\d+)", line)
        assert m, line
        sums[0] += int(m.group(2))
        sums[1] += int(m.group(3))
    doc = json.loads(diff(runs, "--format", "json").stdout)
    assert sums == [doc["baseline"]["total"], doc["comparison"]["total"]]
    slow = [line for line in lines if line.split(" ")[0].endswith(";" + SLOW)]
    assert slow and all(";workload.main;" in line for line in slow)

    normalized = diff(runs, "--format", "folded", "--normalize")
    before = sum(int(line.split(" ")[-2]) for line in normalized.stdout.splitlines())
    assert before == pytest.approx(doc["comparison"]["total"], rel=1e-3)


def test_per_side_time_range(runs: Runs) -> None:
    # The baseline's own range (an hour that ended an hour ago) holds nothing: an error that
    # names the selector, the range and the type, never a pass.
    result = diff(runs, "--baseline-until", "now-1h", "--fail-above", "50")
    assert result.returncode == 2
    message = result.stderr.strip()
    assert "\n" not in message
    assert "no cpu samples for the baseline" in message and BASELINE in message
    # From, until: the range asked for, an hour long and ending an hour ago.
    start, end = re.findall(r"\d{4}-\d\d-\d\dT[\d:]+Z", message)[:2]
    span = time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%SZ")) - time.mktime(
        time.strptime(start, "%Y-%m-%dT%H:%M:%SZ")
    )
    assert span == 3600
    # Its own range replaces the shared --time-range rather than clashing with it.
    ok = diff(runs, "--time-range", "2h", "--baseline-from", "now-1h")
    assert ok.returncode == 0, ok.stderr


def test_empty_side_says_what_exists(runs: Runs) -> None:
    result = diff(
        runs, "--baseline", f"{SERVICE}{{commit=nope}}", "--comparison", COMPARISON, sides=False
    )
    assert result.returncode == 2
    assert f"{SERVICE}{{commit=nope}}" in result.stderr
    assert "commit: a, b" in result.stderr

    # A type nothing sends: the types the selection does have are named.
    missing_type = diff(runs, "--profile-type", "custom:nothing:count:nothing:count")
    assert missing_type.returncode == 2
    assert "no custom:nothing:count:nothing:count samples for the baseline" in missing_type.stderr
    assert re.search(r"it has: .*\bcpu\b", missing_type.stderr), missing_type.stderr


@pytest.mark.parametrize(
    "args, problem",
    [
        (["--baseline", f"{SERVICE}{{commit=a", "--comparison", COMPARISON], "bad selector"),
        (["--baseline", BASELINE, "--comparison", COMPARISON, "--profile-type", "cpux"], "cpux"),
        (
            ["--baseline", BASELINE, "--comparison", COMPARISON, "--time-range", "1h"]
            + ["--from", "now-2h"],
            "give --time-range or --from/--until, not both",
        ),
        (
            ["--baseline", BASELINE, "--comparison", COMPARISON]
            + ["--comparison-time-range", "1h", "--comparison-from", "now-2h"],
            "give --comparison-time-range or --comparison-from",
        ),
        (["--baseline", BASELINE, "--comparison", COMPARISON, "--top", "-1"], "--top"),
        (
            ["--baseline", BASELINE, "--comparison", COMPARISON, "--fail-above", "-1"],
            "--fail-above",
        ),
        (["--baseline", BASELINE], "--comparison"),
        (["--baseline", BASELINE, "--comparison", COMPARISON, "--format", "svg"], "svg"),
    ],
)
def test_bad_arguments(runs: Runs, args: List[str], problem: str) -> None:
    result = diff(runs, *args, sides=False)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if not line.startswith("usage:")]
    assert len(lines) == 1 or lines[-1].startswith("hotspan diff: error:"), result.stderr
    assert problem in result.stderr


def test_unreachable_server(runs: Runs) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hotspan", "diff", "--server", "http://127.0.0.1:9"]
        + ["--baseline", BASELINE, "--comparison", COMPARISON],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().startswith("hotspan diff: cannot reach http://127.0.0.1:9")
    assert "\n" not in result.stderr.strip()


def _on_a_terminal(args: List[str], columns: int) -> str:
    """What the command writes to a pseudo-terminal ``columns`` wide."""
    main, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = _clean_env({"TERM": "xterm-256color"})
    env.pop("COLUMNS", None)
    proc = subprocess.Popen(args, stdout=secondary, stderr=subprocess.PIPE, env=env)
    os.close(secondary)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([main], [], [], 30)
            if not ready:
                break
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(main)
        proc.wait(timeout=30)
    return b"".join(chunks).decode("utf-8", "replace")


def test_terminal_colour_and_left_truncation(runs: Runs) -> None:
    out = _on_a_terminal(
        [sys.executable, "-m", "hotspan", "diff", "--server", runs.server.url]
        + ["--baseline", BASELINE, "--comparison", COMPARISON],
        columns=72,
    )
    assert "\x1b[" in out  # coloured
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out).replace("\r", "")
    rows = table_rows(plain)
    assert rows, plain
    assert all(len(line) <= 72 for line in plain.splitlines() if re.match(r"^\s*[-+]?\d", line))
    # Cut on the left: the end of the name, the function itself, stays.
    name = rows[0][6]
    assert name == SLOW or (name.startswith("\u2026") and SLOW.endswith(name[1:])), plain
    assert name.endswith(".compute_checksum"), plain


def test_output_file(runs: Runs, tmp_path: Path) -> None:
    target = tmp_path / "diff.json"
    result = diff(runs, "--format", "json", "-o", str(target))
    assert result.returncode == 0 and result.stdout == ""
    assert json.loads(target.read_text())["functions"][0]["name"] == SLOW


def test_html_is_the_diff_flame_graph(runs: Runs, tmp_path: Path) -> None:
    from hotspan.ui.standalone import embedded_data

    target = tmp_path / "diff.html"
    result = diff(runs, "--format", "html", "-o", str(target))
    assert result.returncode == 0, result.stderr
    page = target.read_text()
    assert page.lstrip().lower().startswith("<!doctype html")
    assert "<script src=" not in page  # standalone: nothing fetched
    doc = embedded_data(page)
    assert doc["unit"] == "nanoseconds"
    graph = doc["flamegraph"]
    totals = json.loads(diff(runs, "--format", "json").stdout)
    # The two sides' totals, as the querier's Diff answers them (protojson: int64 as strings).
    assert int(graph["leftTicks"]) == totals["baseline"]["total"]
    assert int(graph["rightTicks"]) == totals["comparison"]["total"]
    assert SLOW in graph["names"]
