"""``hotspan query SELECTOR``: a service's merged profile from a server, as a top table of
functions, JSON, folded stacks or pprof.

The profile comes from the querier's ``SelectMergeProfile`` (a pprof of every stack in the
range), so the table, the JSON and the files hold the same numbers as ``hotspan export``.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from datetime import datetime, timezone
from typing import IO, Callable, Dict, List, Optional

from hotspan.cli.client import (
    Client,
    CLIError,
    TimeRange,
    add_server_options,
    add_time_options,
    args_time_range,
    profile_type_id,
    selector_query,
)

QUERIER = "/querier.v1.QuerierService"
QUERY_FORMATS = ("table", "json", "folded", "pprof")

EXAMPLES = """\
The merged profile of SELECTOR over a time range: by default a table of the functions with
the most self time (self, self %, total, total %), values in their unit (ms, s, KiB, MiB).

SELECTOR is a service name, optionally with labels: my-service, my-service{env=prod},
or the server's form {service_name="my-service", env="prod"}.

examples:
  hotspan query my-service                              top 20 functions by CPU, last hour
  hotspan query 'my-service{commit=abc123}' --time-range 6h --top 50
  hotspan query my-service --profile-type alloc_space --from now-2d --until now-1d
  hotspan query my-service --format json | jq '.functions[0]'
  hotspan query my-service --format folded > cpu.folded
  hotspan query my-service --format pprof -o cpu.pb.gz && go tool pprof -top cpu.pb.gz

JSON output: {"selector", "profile_type", "unit", "from", "until" (RFC 3339), "start_ms",
"end_ms", "total", "functions": [{"name", "self", "self_percent", "total",
"total_percent"}]} with the functions by self value, the --top first (all with --top 0).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "query",
        help="top functions of a service's profile (or its folded stacks, JSON, pprof)",
        description=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("selector", metavar="SELECTOR", help="service{label=value,...}")
    add_profile_type_option(parser)
    add_time_options(parser)
    parser.add_argument(
        "--format",
        choices=QUERY_FORMATS,
        default="table",
        help="table (default), json, folded or pprof",
    )
    parser.add_argument(
        "--top", type=int, default=20, metavar="N", help="functions to list (0: all; default 20)"
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="write to FILE, not stdout")
    add_server_options(parser)
    parser.set_defaults(func=run, log_level="warning")


def add_profile_type_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile-type",
        default="cpu",
        metavar="TYPE",
        help="cpu (default), wall, alloc_space, alloc_objects, inuse_space, inuse_objects, "
        "lock_count, lock_time, or a full profile type id",
    )


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except CLIError as exc:
        print(f"hotspan query: {exc}", file=sys.stderr)
        return exc.code
    except BrokenPipeError:
        return 0  # `hotspan query ... | head`: the reader has all it wanted


def _run(args: argparse.Namespace) -> int:
    from hotspan.formats.files import write_profile

    if args.top < 0:
        raise CLIError("--top must be 0 (all) or more", 2)
    selector = selector_query(args.selector)
    type_id = profile_type_id(args.profile_type)
    window = args_time_range(args)
    client = Client.from_args(args)
    profile = fetch_profile(client, selector, type_id, window)
    if args.format == "table":
        text = top_table(profile, selector, type_id, window, args.top, args.output is None)
        if text:
            _write_text(args.output, text)
    elif args.format == "json":
        doc = query_json(profile, selector, type_id, window, args.top)
        _write_text(args.output, json.dumps(doc, indent=2) + "\n")
    elif args.format == "folded":
        _write_bytes(args.output, write_profile(profile, "folded"))
    else:
        if args.output is None and sys.stdout.isatty():
            raise CLIError("pprof is binary: write it with -o FILE or pipe it to a file", 2)
        _write_bytes(args.output, write_profile(profile, "pprof"))
    return 0


# --- fetching ---------------------------------------------------------------------------------


def fetch_profile(
    client: Client,
    selector: str,
    type_id: str,
    window: TimeRange,
    progress: Optional[Callable[[int, Optional[int]], None]] = None,
):  # type: ignore[no-untyped-def]
    """The merged profile of ``selector`` as a StackProfile; CLIError (exit 1) naming what
    does exist when nothing matches."""
    from hotspan.formats.errors import FormatError
    from hotspan.formats.pprof import read_stack_profile
    from hotspan.formats.proto import querier_pb2

    request = querier_pb2.SelectMergeProfileRequest(
        profile_typeID=type_id,
        label_selector=selector,
        start=window.start_ms,
        end=window.end_ms,
    )
    body = client.bytes(
        "POST",
        f"{QUERIER}/SelectMergeProfile",
        request.SerializeToString(),
        headers={"Content-Type": "application/proto", "Accept": "application/proto"},
        progress=progress,
    )
    try:
        profile = read_stack_profile(body)
    except FormatError as exc:
        raise CLIError(f"the server's answer is not a pprof profile: {exc}") from None
    if not profile.sample_types or profile.total(0) == 0:
        raise CLIError(no_data_message(client, selector, type_id, window))
    return profile


def no_data_message(client: Client, selector: str, type_id: str, window: TimeRange) -> str:
    where = f"{selector} ({type_id}) between {iso(window.start_ms)} and {iso(window.end_ms)}"
    span = {"start": window.start_ms, "end": window.end_ms}
    try:
        types = client.json("POST", f"{QUERIER}/ProfileTypes", span)
        services = client.json(
            "POST", f"{QUERIER}/LabelValues", {"name": "service_name", "matchers": [], **span}
        )
    except CLIError:
        return f"no profiles match {where}"
    type_ids = sorted(t.get("ID", "") for t in (types or {}).get("profileTypes", []))
    names = sorted((services or {}).get("names", []))
    if not type_ids and not names:
        return f"no profiles match {where}; the server has no profiles at all in that range"
    return (
        f"no profiles match {where}; in that range the server has profile types: "
        f"{', '.join(type_ids) or 'none'}; services: {', '.join(names) or 'none'}"
    )


def iso(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
        .isoformat(timespec="seconds")
        .replace("+00:00", "Z")
    )


# --- output -----------------------------------------------------------------------------------


def _rows(profile, top: int) -> List[Dict[str, object]]:  # type: ignore[no-untyped-def]
    from hotspan.model.stack_profile import function_values

    total = profile.total(0)
    values = sorted(
        function_values(profile, 0).values(),
        key=lambda f: (-f.self_value, -f.total_value, f.name),
    )
    if top:
        values = values[:top]
    return [
        {
            "name": f.name,
            "self": f.self_value,
            "self_percent": round(100.0 * f.self_value / total, 3) if total else 0.0,
            "total": f.total_value,
            "total_percent": round(100.0 * f.total_value / total, 3) if total else 0.0,
        }
        for f in values
    ]


def query_json(profile, selector: str, type_id: str, window: TimeRange, top: int) -> dict:  # type: ignore[no-untyped-def]
    return {
        "selector": selector,
        "profile_type": type_id,
        "unit": profile.sample_types[0].unit,
        "from": iso(window.start_ms),
        "until": iso(window.end_ms),
        "start_ms": window.start_ms,
        "end_ms": window.end_ms,
        "total": profile.total(0),
        "functions": _rows(profile, top),
    }


def top_table(  # type: ignore[no-untyped-def]
    profile, selector: str, type_id: str, window: TimeRange, top: int, to_stdout: bool
) -> str:
    """The table as plain text, or "" when it was printed on the terminal with rich's boxes
    and colours (stdout a terminal and ``to_stdout``)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    unit = profile.sample_types[0].unit
    total = profile.total(0)
    terminal = to_stdout and sys.stdout.isatty()
    table = Table(
        box=box.SIMPLE_HEAD if terminal else None,
        show_edge=terminal,
        pad_edge=False,
        header_style="bold" if terminal else "",
    )
    for name in ("SELF", "SELF %", "TOTAL", "TOTAL %"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("FUNCTION", no_wrap=True, overflow="fold")
    for row in _rows(profile, top):
        table.add_row(
            format_value(int(row["self"]), unit),  # type: ignore[call-overload]
            f"{row['self_percent']:.2f}%",
            format_value(int(row["total"]), unit),  # type: ignore[call-overload]
            f"{row['total_percent']:.2f}%",
            str(row["name"]),
        )
    header = (
        f"{type_id}  {selector}  {iso(window.start_ms)} .. {iso(window.end_ms)}"
        f"  total {format_value(total, unit)}"
    )
    if terminal:
        console = Console()
        console.print(header, soft_wrap=True, markup=False, highlight=False, style="bold")
        console.print(table)
        return ""
    # Piped or to a file: no colour, and a width no function name reaches, so nothing is cut
    # or wrapped.
    buffer = io.StringIO()
    console = Console(file=buffer, width=100_000, no_color=True, force_terminal=False)
    console.print(header, soft_wrap=True, markup=False, highlight=False)
    console.print(table)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


_DURATIONS = ((3600e9, "h"), (60e9, "min"), (1e9, "s"), (1e6, "ms"), (1e3, "µs"))
_BYTES = ((1024**4, "TiB"), (1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB"))
_TIME_SCALE = {"nanoseconds": 1, "microseconds": 1e3, "milliseconds": 1e6, "seconds": 1e9}


def format_value(value: int, unit: str) -> str:
    """As the UI's formatValue: ``1.23 ms``, ``4.5 MiB``, ``12.3 k``."""
    if unit in _TIME_SCALE:
        ns = value * _TIME_SCALE[unit]
        for size, name in _DURATIONS:
            if abs(ns) >= size:
                return f"{_trim(ns / size)} {name}"
        return f"{_trim(ns)} ns"
    if unit == "bytes":
        for size, name in _BYTES:
            if abs(value) >= size:
                return f"{_trim(value / size)} {name}"
        return f"{value} B"
    if abs(value) >= 1e9:
        return f"{_trim(value / 1e9)} G"
    if abs(value) >= 1e6:
        return f"{_trim(value / 1e6)} M"
    if abs(value) >= 1e4:
        return f"{_trim(value / 1e3)} k"
    return str(value)


def _trim(x: float) -> str:
    digits = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2
    return f"{round(x, digits):.{digits}f}".rstrip("0").rstrip(".") if digits else f"{x:.0f}"


def _write_text(path: Optional[str], text: str) -> None:
    _write_bytes(path, text.encode("utf-8"))


def _write_bytes(path: Optional[str], data: bytes) -> None:
    if path is None or path == "-":
        out: IO[bytes] = sys.stdout.buffer
        out.write(data)
        out.flush()
        return
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise CLIError(f"cannot write {path}: {exc.strerror or exc}") from None
