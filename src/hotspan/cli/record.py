"""``hotspan record``: profile a program into a file, with no server.

The program runs as under ``hotspan run`` (the same launch code, :mod:`hotspan.agent.run`),
but its agent's server address is ``file://<spool directory>``: every window's profiles become
files there (see ``SpoolConnection`` in :mod:`hotspan.agent.transport`), the exit flush and
the Python processes the program starts included.  When the program has ended, the files are
merged into one profile and written as pprof, folded text, speedscope or an HTML flame graph.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from hotspan.cli.client import CLIError, profile_type_id
from hotspan.model.stack_profile import StackProfile

USAGE = (
    "hotspan record -o FILE [options] -- python app.py [args...]\n"
    "       hotspan record -o FILE [options] -m module [args...]\n"
    "       hotspan record -o FILE [options] app.py [args...]"
)

# Sample type -> (period type, period) of the profile it came in.
Periods = Dict[str, Tuple[Tuple[str, str], int]]

EXAMPLES = """\
examples:
  hotspan record -o job.pb.gz -- python job.py --day 2024-05-01
  go tool pprof -top -sample_index=alloc_space job.pb.gz
  hotspan record -o job.html --profile-type wall -m jobs.nightly
  hotspan record -o job.speedscope.json --types cpu,wall --sample-rate 250 job.py
"""

AGENT_TYPES = ("cpu", "wall", "alloc", "locks", "threads")

# Sample types that are a snapshot at the end of a window, not a sum over it: the live heap
# and the threads standing on each stack.  Summing them over windows would count one live
# object once per window it survived.
GAUGE_TYPES = ("inuse_objects", "inuse_space", "goroutine")

# Which agent profile gives each sample type (to check --profile-type against --types).
_TYPE_SOURCE = {
    "cpu": "cpu",
    "wall": "wall",
    "gil_wait": "wall",
    "gil_held": "wall",
    "alloc_objects": "alloc",
    "alloc_space": "alloc",
    "inuse_objects": "alloc",
    "inuse_space": "alloc",
    "contentions": "locks",
    "delay": "locks",
    "goroutine": "threads",
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    from hotspan.cli.run import add_program_command

    add_program_command(
        sub,
        "record",
        "profile a program into a file: hotspan record -o out.pb.gz -- python app.py",
        main,
    )


def build_parser() -> argparse.ArgumentParser:
    from hotspan.agent.run import add_program_options
    from hotspan.formats.files import FORMATS

    parser = argparse.ArgumentParser(
        prog="hotspan record",
        usage=USAGE,
        allow_abbrev=False,
        description="Run a Python program with the hotspan agent and write its profile to a "
        "file: no server is contacted. Every profile type the agent takes is recorded unless "
        "--types says otherwise; the program's exit code is hotspan record's.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="the profile file to write"
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        help="file format (default: from the extension: .pb.gz pprof, .folded, "
        ".speedscope.json, .html)",
    )
    parser.add_argument(
        "--profile-type",
        metavar="TYPE",
        help="the one type folded and html files hold (cpu, wall, gil_wait, gil_held, "
        "alloc_space, alloc_objects, inuse_space, inuse_objects, lock_count, lock_time, "
        "goroutines; default: the first "
        "recorded); for pprof and speedscope, keep only that type",
    )
    parser.add_argument(
        "--types",
        default=",".join(AGENT_TYPES),
        metavar="LIST",
        help=f"the profiles to take, comma-separated (default: {','.join(AGENT_TYPES)})",
    )
    add_program_options(parser)
    return parser


def main(argv: Sequence[str]) -> int:
    from hotspan.agent.run import check_settings, prepare

    parser = build_parser()
    options, command, env = prepare(parser, argv)
    try:
        fmt, wanted = output_settings(options)
    except CLIError as exc:
        parser.error(str(exc))
    spool = tempfile.mkdtemp(prefix="hotspan-record-")
    try:
        try:
            record_environment(env, spool, options)
        except CLIError as exc:
            parser.error(str(exc))
        check_settings(parser, env)
        from hotspan.agent.run import run_child

        started = time.monotonic()
        code = run_child(command, env)
        elapsed = time.monotonic() - started
        try:
            return write_recording(options, fmt, wanted, spool, code, elapsed)
        except CLIError as exc:
            print(f"hotspan record: {exc}", file=sys.stderr)
            return code or exc.code
    finally:
        shutil.rmtree(spool, ignore_errors=True)


def output_settings(options: argparse.Namespace) -> Tuple[str, Optional[str]]:
    """(format, profile type id or None), checked before the program runs."""
    from hotspan.formats.errors import FormatError
    from hotspan.formats.files import format_for_path

    fmt = options.format
    if fmt is None:
        try:
            fmt = format_for_path(options.output)
        except FormatError as exc:
            raise CLIError(f"{exc}: or give --format", 2) from None
    types = agent_types(options.types)
    wanted = None
    if options.profile_type:
        wanted = profile_type_id(options.profile_type)
        sample_type = wanted.split(":")[1]
        source = _TYPE_SOURCE.get(sample_type)
        if source is not None and source not in types:
            raise CLIError(
                f"--profile-type {options.profile_type} needs the {source} profile, "
                f"which --types {options.types} leaves out",
                2,
            )
    directory = os.path.dirname(os.path.abspath(options.output))
    if not os.path.isdir(directory):
        raise CLIError(f"cannot write {options.output}: no directory {directory}", 2)
    return fmt, wanted


def agent_types(text: str) -> List[str]:
    types = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in types if t not in AGENT_TYPES]
    if unknown or not types:
        raise CLIError(
            f"--types {text!r}: unknown profile type(s) {', '.join(unknown) or '(none given)'} "
            f"(known: {', '.join(AGENT_TYPES)})",
            2,
        )
    return types


def types_environment(env: Dict[str, str], text: str) -> None:
    """The agent takes the profiles ``text`` lists (--types) and no others; allocations at
    512 KiB a sample unless a rate is set already."""
    from hotspan.agent.config import env_value

    types = agent_types(text)
    for name in ("cpu", "wall", "locks", "threads"):
        env["HOTSPAN_" + name.upper()] = "true" if name in types else "false"
    alloc = env_value("ALLOC_SAMPLE_BYTES", env)
    if "alloc" not in types:
        env["HOTSPAN_ALLOC_SAMPLE_BYTES"] = "0"
    elif alloc is None or alloc[1].strip() == "0":
        env["HOTSPAN_ALLOC_SAMPLE_BYTES"] = str(512 * 1024)


def record_environment(env: Dict[str, str], spool: str, options: argparse.Namespace) -> None:
    """The child's agent writes to the spool and takes what --types asks, as fully as it can:
    a recording is asked for, so the load-shedding pauses a service needs would only leave
    holes in it."""
    from hotspan.agent.config import env_value

    env["HOTSPAN_SERVER_ADDRESS"] = "file://" + spool
    env["HOTSPAN_ENABLED"] = "true"
    env["HOTSPAN_REMOTE_SETTINGS"] = "false"
    # Span ids label samples for the server's trace views; a file keeps no labels.
    env["HOTSPAN_TRACE_CORRELATION"] = "false"
    types_environment(env, options.types)
    defaults = {
        "LOAD_SHEDDING_CPU": "0",
        "CPU_THRESHOLD": "0",
        # Windows of a second: the live heap and threads are snapshots at window ends, and
        # the merge keeps each process's largest, so shorter windows catch a higher peak.
        "UPLOAD_INTERVAL": "1",
    }
    for suffix, value in defaults.items():
        if env_value(suffix, env) is None:
            env["HOTSPAN_" + suffix] = value


# --- merging and writing ---------------------------------------------------------------------


def _spool_files(spool: str) -> List[Tuple[int, int, str]]:
    """(pid, sequence, path) of each finished upload, in order."""
    out = []
    for name in os.listdir(spool):
        stem, dot, ext = name.partition(".")
        pid, dash, seq = stem.partition("-")
        if ext == "pprof" and dash and pid.isdigit() and seq.isdigit():
            out.append((int(pid), int(seq), os.path.join(spool, name)))
    return sorted(out)


def merge_spool(spool: str, progress: Optional[Any] = None) -> Tuple[StackProfile, Periods]:
    """The spool's profiles as one StackProfile, and the period of each sample type.

    Cumulative types (CPU, wall, allocations, lock waits) add up over windows and processes.
    Gauges (live heap, threads) are one snapshot per window: of each process the window with
    the highest total is kept (its live heap at the largest seen, as one coherent snapshot,
    not a per-stack maximum that never existed at once), and processes' snapshots add up.
    The last snapshot would be the heap at exit, after the program's objects were freed."""
    from hotspan.formats.pprof import read_stack_profile

    files = _spool_files(spool)
    merged = StackProfile([])
    periods: Periods = {}
    peaks: Dict[Tuple[int, Tuple[str, ...]], Tuple[int, StackProfile]] = {}
    for pid, _seq, path in _iterate(files, progress):
        with open(path, "rb") as f:
            profile = read_stack_profile(f.read())
        for st in profile.sample_types:
            periods.setdefault(st.type, (profile.period_type, profile.period))
        gauges = [i for i, st in enumerate(profile.sample_types) if st.type in GAUGE_TYPES]
        sums = [i for i in range(len(profile.sample_types)) if i not in gauges]
        if sums:
            merged.merge(profile.subset(sums))
        if gauges:
            snapshot = profile.subset(gauges)
            names = tuple(st.type for st in snapshot.sample_types)
            key_type = names.index("inuse_space") if "inuse_space" in names else 0
            total = snapshot.total(key_type)
            best = peaks.get((pid, names))
            if best is None or total > best[0]:
                peaks[(pid, names)] = (total, snapshot)
    for _total, snapshot in peaks.values():
        # The snapshot's time is its window's: the whole recording's span stays the sums'.
        snapshot.time_ns = snapshot.duration_ns = 0
        merged.merge(snapshot)
    return merged, periods


def _iterate(
    files: List[Tuple[int, int, str]], progress: Optional[Any]
) -> Iterator[Tuple[int, int, str]]:
    if progress is None:
        yield from files
        return
    task = progress.add_task("merging", total=len(files))
    for item in files:
        yield item
        progress.advance(task)


# The order types are written in: pprof's tools show the default (CPU) first.
_ORDER: Tuple[str, ...] = ("cpu", "wall", "gil_wait", "gil_held", "alloc_space", "alloc_objects")
_ORDER += ("inuse_space",)
_ORDER += ("inuse_objects", "delay", "contentions", "goroutine")


def _ordered(profile: StackProfile) -> StackProfile:
    types = profile.sample_types
    rank = {t: i for i, t in enumerate(_ORDER)}
    positions = sorted(range(len(types)), key=lambda i: (rank.get(types[i].type, 99), i))
    return profile.subset(positions)


def encode_pprof(profile: StackProfile, periods: Periods) -> bytes:
    """pprof with every sample type, CPU (or the first type) the default one, and the period
    of that type (a merged profile has one period field for all)."""
    from dataclasses import replace

    from hotspan.formats.pprof import write_stack_profile

    first = profile.sample_types[0].type
    period_type, period = periods.get(first, (("", ""), 0))
    profile = replace(profile, period_type=period_type, period=period)
    return write_stack_profile(profile, default_sample_type=first)


def write_recording(
    options: argparse.Namespace,
    fmt: str,
    wanted: Optional[str],
    spool: str,
    code: int,
    elapsed: float,
) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn

    from hotspan.cli.output import write_output
    from hotspan.cli.profile_files import write_profile
    from hotspan.model.stack_profile import ProfileSelectError

    console = Console(stderr=True)
    progress = None
    if console.is_terminal:
        progress = Progress(
            SpinnerColumn(),
            TextColumn("hotspan record: {task.description}", markup=False),  # a file name
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            console=console,
            transient=True,
        )
        progress.start()
    try:
        merged, periods = merge_spool(spool, progress)
        if not merged.stacks:
            raise CLIError(
                f"nothing was recorded (the program ran {elapsed:.1f} s); "
                f"{options.output} not written",
                1,
            )
        merged = _ordered(merged)
        if wanted is not None or fmt in ("folded", "html"):
            # The one type the file holds, so the summary below tells what is in it: by
            # default the first recorded (CPU when taken), the pprof's default type too.
            try:
                merged = merged.only(merged.select(wanted) if wanted else 0)
            except ProfileSelectError as exc:
                raise CLIError(f"{exc}; {options.output} not written", 1) from None
        writing = None
        if progress is not None:
            writing = progress.add_task(f"writing {options.output}", total=1)
        title = f"{options.application_name or _title(options)} (hotspan record)"
        data = (
            encode_pprof(merged, periods)
            if fmt == "pprof"
            else write_profile(merged, fmt, wanted, title)
        )
        write_output(options.output, data)
        if progress is not None and writing is not None:
            progress.advance(writing)
    finally:
        if progress is not None:
            progress.stop()
    print(_summary(options.output, fmt, len(data), merged, periods, elapsed, code), file=sys.stderr)
    return code


def _title(options: argparse.Namespace) -> str:
    return options.module or os.path.basename(options.output)


def _summary(
    path: str,
    fmt: str,
    size: int,
    profile: StackProfile,
    periods: Periods,
    elapsed: float,
    code: int,
) -> str:
    parts = []
    cpu_samples = ""
    for i, st in enumerate(profile.sample_types):
        total = profile.total(i)
        peak = " peak" if st.type in GAUGE_TYPES else ""
        parts.append(f"{st.type} {_amount(total, st.unit)}{peak}")
        if st.type == "cpu":
            period = periods.get("cpu", (("", ""), 0))[1]
            if period:
                cpu_samples = f", {total // period:,} cpu samples"
    ended = f", exit code {code}" if code else ""
    return (
        f"hotspan record: wrote {path} ({fmt}, {_amount(size, 'bytes')}): "
        f"{elapsed:.1f} s{ended}{cpu_samples}; {', '.join(parts)}"
    )


def _amount(value: int, unit: str) -> str:
    if unit == "nanoseconds":
        return f"{value / 1e9:.2f} s"
    if unit == "bytes":
        for suffix, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if value >= size:
                return f"{value / size:.1f} {suffix}"
        return f"{value} B"
    return f"{value:,}"
