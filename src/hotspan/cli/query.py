"""``hotspan query SELECTOR``: a service's merged profile from a server, as a top table of
functions, JSON, folded stacks or pprof.

The profile comes from the querier's ``SelectMergeProfile`` (a pprof of every stack in the
range), so the table, the JSON and the files hold the same numbers as ``hotspan export``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List

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
from hotspan.cli.output import format_value, iso, plain_console, plain_text, write_output
from hotspan.cli.profiles import add_profile_type_option, fetch_profile, resolve_type

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


def run(args: argparse.Namespace) -> int:
    from hotspan.cli.profile_files import write_profile

    if args.top < 0:
        raise CLIError("--top must be 0 (all) or more", 2)
    selector = selector_query(args.selector)
    type_id = profile_type_id(args.profile_type)
    window = args_time_range(args)
    client = Client.from_args(args)
    type_id = resolve_type(client, args.profile_type, type_id, selector, window)
    profile = fetch_profile(client, selector, type_id, window, typed=args.selector)
    if args.format == "table":
        text = top_table(profile, selector, type_id, window, args.top, args.output is None)
        if text:
            write_output(args.output, text.encode())
    elif args.format == "json":
        doc = query_json(profile, selector, type_id, window, args.top)
        write_output(args.output, (json.dumps(doc, indent=2) + "\n").encode())
    elif args.format == "folded":
        write_output(args.output, write_profile(profile, "folded"))
    else:
        if args.output is None and sys.stdout.isatty():
            raise CLIError("pprof is binary: write it with -o FILE or pipe it to a file", 2)
        write_output(args.output, write_profile(profile, "pprof"))
    return 0


# --- output -----------------------------------------------------------------------------------


def _rows(profile, top: int) -> List[Dict[str, object]]:
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


def query_json(profile, selector: str, type_id: str, window: TimeRange, top: int) -> dict:
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


def top_table(
    profile, selector: str, type_id: str, window: TimeRange, top: int, to_stdout: bool
) -> str:
    """The table as plain text, or "" when it was printed on the terminal with rich's boxes
    and colours (stdout a terminal and ``to_stdout``)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

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
            Text(str(row["name"])),  # a name is text, never rich markup ("[/b]" would raise)
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
    console, buffer = plain_console()
    console.print(header, soft_wrap=True, markup=False, highlight=False)
    console.print(table)
    return plain_text(buffer)
