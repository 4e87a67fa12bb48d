"""``hotspan why TRACE_ID``: why one request was slow, from the server's
``/api/traces/{id}/why``: a sentence, then per profile type the functions holding the most
extra time against the spans like it."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, Dict, List

from hotspan.cli.client import (
    PROFILE_TYPE_ALIASES,
    Client,
    CLIError,
    add_server_options,
    duration_s,
    profile_type_id,
)
from hotspan.cli.output import format_value
from hotspan.cli.profiles import type_name

DESCRIPTION = """\
Compares a span of a trace (by default its root) and its descendants with the spans like it:
the same service and name, in a window before it (default 24h), the ones nearest their median
duration.  Says whether the span was computing or waiting (its CPU against its duration),
then lists, per profile type (CPU, and wall time where the agent sends it), the functions
with the most extra self time per request: the span's value minus the baseline's mean.

examples:
  hotspan why 4bf92f3577b34da6a3ce929d0e0e4736
  hotspan why 4bf92f3577b34da6a3ce929d0e0e4736 --span 00f067aa0ba902b7 --window 2h
  hotspan why 4bf92f3577b34da6a3ce929d0e0e4736 --json | jq .verdict
"""

_HEX = re.compile(r"[0-9a-fA-F]+")


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "why",
        help="why one trace (or span) was slow, against the spans like it",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("trace_id", metavar="TRACE_ID", help="the trace (up to 32 hex digits)")
    parser.add_argument("--span", metavar="ID", help="a span of it (16 hex digits; default root)")
    parser.add_argument(
        "--profile-type",
        metavar="TYPE",
        help=f"the type compared first ({', '.join(PROFILE_TYPE_ALIASES)} or a full id; "
        "default cpu); CPU and wall follow when stored",
    )
    parser.add_argument(
        "--window",
        default="24h",
        metavar="DURATION",
        help="how far back the spans like it are looked for (default 24h)",
    )
    parser.add_argument(
        "--baseline-spans",
        type=int,
        default=50,
        metavar="N",
        help="at most N spans like it, nearest their median duration (default 50)",
    )
    parser.add_argument(
        "--limit", type=int, default=10, metavar="N", help="functions per profile type (10)"
    )
    parser.add_argument("--json", action="store_true", help="the server's answer as JSON")
    add_server_options(parser)
    parser.set_defaults(func=run, log_level="warning")


def query(args: argparse.Namespace) -> Dict[str, Any]:
    """The query string for the server, from the arguments (CLIError, exit 2, if bad)."""
    if not _HEX.fullmatch(args.trace_id) or len(args.trace_id) > 32:
        raise CLIError(f"trace id {args.trace_id!r} is not up to 32 hex digits", 2)
    params: Dict[str, Any] = {}
    if args.span is not None:
        if not _HEX.fullmatch(args.span) or len(args.span) != 16:
            raise CLIError(f"--span {args.span!r} is not 16 hex digits", 2)
        params["spanID"] = args.span.lower()
    if args.profile_type:
        params["profileType"] = profile_type_id(args.profile_type)
    try:
        window = duration_s(args.window)
    except argparse.ArgumentTypeError as exc:
        raise CLIError(f"--window: {exc}", 2) from None
    if window <= 0:
        raise CLIError("--window must be longer than 0", 2)
    params["window"] = f"{round(window * 1000)}ms"
    for name, value in (("baselineSpans", args.baseline_spans), ("limit", args.limit)):
        if value <= 0:
            option = "--baseline-spans" if name == "baselineSpans" else "--limit"
            raise CLIError(f"{option} must be at least 1, got {value}", 2)
        params[name] = value
    return params


def run(args: argparse.Namespace) -> int:
    params = query(args)
    client = Client.from_args(args)
    answer = client.json("GET", f"/api/traces/{args.trace_id.lower()}/why", query=params)
    if args.json:
        json.dump(answer, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(answer))
    return 0


def _signed(value: float, unit: str) -> str:
    return ("+" if value > 0 else "-" if value < 0 else "") + format_value(abs(value), unit)


def render(answer: Dict[str, Any]) -> str:
    """The answer as text: the summary, then one table per profile type."""
    lines: List[str] = [answer["summary"], ""]
    base = answer["baseline"]
    lines.append(
        f"trace {answer['traceID']} span {answer['spanID']} ({answer['verdict']}); "
        f"baseline: {base['spans']} spans"
    )
    split = answer.get("split")
    if split:
        parts = [
            ("CPU", "cpuNanos"),
            ("GIL wait", "gilWaitNanos"),
            ("CPU wait", "cpuWaitNanos"),
            ("other (off CPU)", "otherNanos"),
        ]
        lines.append(
            f"its {format_value(int(split['durationNanos']), 'nanoseconds')}: "
            + ", ".join(
                f"{name} {format_value(int(split[key]), 'nanoseconds')}" for name, key in parts
            )
        )
    for profile in answer["profiles"]:
        ptype = profile["profileType"]
        unit = ptype.split(":")[2]
        lines += [
            "",
            f"{type_name(ptype)}: {format_value(profile['spanValue'], unit)} in the span, "
            f"{format_value(profile['baselineMean'], unit)} per baseline span "
            f"({_signed(profile['extra'], unit)})",
        ]
        header = ("extra self", "self", "baseline", "extra total", "of extra", "function")
        rows = [header]
        for f in profile["functions"]:
            share = f["shareOfExtraDuration"]
            rows.append(
                (
                    _signed(f["self"]["extra"], unit),
                    format_value(f["self"]["span"], unit),
                    format_value(f["self"]["baseline"], unit),
                    _signed(f["total"]["extra"], unit),
                    "" if share is None else f"{share * 100:.0f}%",
                    f["name"],
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
        for row in rows:
            cells = [c.rjust(w) for c, w in zip(row, widths)]
            lines.append("  " + "  ".join(cells + [row[-1]]))
    return "\n".join(lines) + "\n"
