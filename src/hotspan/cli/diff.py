"""``hotspan diff``: which functions' share of a profile changed most between two selections
(two commits, two deployments, two hours), as a table, JSON, diff-folded stacks or a diff
flame graph; ``--fail-above`` turns it into a regression gate for CI.

Shares, not absolute values: the two sides cover different durations and request counts, so
"this function went from 12% to 31% of the CPU" is comparable where "from 3 s to 40 s" is not.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from dataclasses import dataclass
from typing import IO, Any, Dict, Iterator, List, Optional, Sequence

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
from hotspan.cli.profiles import add_profile_type_option, fetch_profile, resolve_type, type_name
from hotspan.formats.folded import folded_frame
from hotspan.model.durations import SEC, format_duration
from hotspan.model.stack_profile import FunctionValue, StackProfile, function_values

FORMATS = ("table", "json", "folded", "html")
SIDES = ("baseline", "comparison")

DESCRIPTION = """\
Compares two selections of profiles (the baseline and the comparison) and lists the
functions whose share of the profile changed most: self (time in the function itself) and
total (the function and what it calls), each as a percentage of its side's total.  Shares,
not absolute values, because the two sides usually cover different durations and loads.

examples:
  hotspan diff --baseline 'my-service{commit=abc123}' \\
               --comparison 'my-service{commit=def456}' --time-range 1h
  hotspan diff --baseline my-service --comparison my-service \\
               --baseline-from now-1d --baseline-until now-23h --time-range 1h
  hotspan diff ... --fail-above 5            # CI: exit 1 when a share grew > 5 points
  hotspan diff ... --format html -o diff.html
  hotspan diff ... --format folded | flamegraph.pl > diff.svg
"""

EPILOG = """\
--fail-above PERCENT: a function fails the gate when its self share or its total share grew
by more than PERCENT percentage points (from 10% to 16% of the CPU is 6 points).  Points,
not relative growth: a function going from 0.01% to 0.05% has grown 400% and matters
to nobody, while one going from 20% to 30% is a tenth more of the whole.  Every function
is checked, not only the --top rows.  A side without samples is an error, never a pass.

exit status: 0 no function crossed --fail-above (or none given), 1 some did (they are listed
on stderr), 2 the comparison could not be made: bad arguments, an unreachable or refusing
server, a side without samples (as diff(1): 0 same, 1 different, 2 trouble).

--format json: {"profile_type", "unit", "baseline" and "comparison": {"selector", "query",
"from", "until", "duration_s", "total"}, "functions": [{"name", "baseline" and
"comparison": {"self", "total", "self_share", "total_share"}, "self_delta",
"total_delta"}], "fail_above", "regressions": [{"name", "self_delta", "total_delta"}]};
shares in percent, deltas in percentage points, values in the profile type's unit.
--format folded: "frame;frame;frame baseline_value comparison_value" per stack, as
difffolded.pl writes it and flamegraph.pl reads it (--normalize scales the baseline to the
comparison's total, as difffolded.pl -n).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "diff",
        help="the functions whose share changed most between two selections; a CI gate",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--baseline",
        required=True,
        metavar="SELECTOR",
        help='the before side: my-service{commit=abc123} or {service_name="my-service"}',
    )
    parser.add_argument("--comparison", required=True, metavar="SELECTOR", help="the after side")
    add_profile_type_option(parser)
    add_time_options(parser)
    for side in SIDES:
        group = parser.add_argument_group(
            f"the {side}'s own time range (replaces the shared one for that side)"
        )
        group.add_argument(f"--{side}-time-range", metavar="DURATION")
        group.add_argument(f"--{side}-from", dest=f"{side}_from_", metavar="TIME")
        group.add_argument(f"--{side}-until", metavar="TIME")
    parser.add_argument("--format", choices=FORMATS, default="table", help="default: table")
    parser.add_argument("-o", "--output", metavar="FILE", help="write there, not to stdout")
    parser.add_argument(
        "--top", type=int, default=20, metavar="N", help="rows shown (default 20; 0: all)"
    )
    parser.add_argument(
        "--fail-above",
        type=float,
        metavar="PERCENT",
        help="exit 1 when a function's self or total share grew by more than PERCENT points",
    )
    parser.add_argument(
        "--normalize",
        action="store_true",
        help="folded: scale the baseline's values to the comparison's total",
    )
    add_server_options(parser)
    parser.set_defaults(func=run, log_level="warning")


# --- fetching --------------------------------------------------------------------------------


@dataclass
class Side:
    name: str  # "baseline" or "comparison"
    selector: str  # as typed
    query: str  # the server's spelling
    range: TimeRange
    profile: StackProfile
    total: int
    functions: Dict[str, FunctionValue]

    def share(self, value: int) -> float:
        return 100.0 * value / self.total if self.total else 0.0

    def as_json(self) -> Dict[str, Any]:
        return {
            "selector": self.selector,
            "query": self.query,
            "from": iso(self.range.start_ms),
            "until": iso(self.range.end_ms),
            "duration_s": (self.range.end_ms - self.range.start_ms) / 1000,
            "total": self.total,
        }


def fetch_side(
    client: Client, name: str, selector: str, query: str, type_id: str, span: TimeRange
) -> Side:
    profile = fetch_profile(client, query, type_id, span, typed=f"the {name} {selector}")
    total = profile.total(0)
    return Side(name, selector, query, span, profile, total, function_values(profile, 0))


# --- comparing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    name: str
    baseline: FunctionValue
    comparison: FunctionValue
    baseline_self_share: float
    baseline_total_share: float
    comparison_self_share: float
    comparison_total_share: float

    @property
    def self_delta(self) -> float:
        return self.comparison_self_share - self.baseline_self_share

    @property
    def total_delta(self) -> float:
        return self.comparison_total_share - self.baseline_total_share

    def crosses(self, points: float) -> bool:
        return self.self_delta > points or self.total_delta > points

    def as_json(self) -> Dict[str, Any]:
        def side(value: FunctionValue, self_share: float, total_share: float) -> Dict[str, Any]:
            return {
                "self": value.self_value,
                "total": value.total_value,
                "self_share": round(self_share, 4),
                "total_share": round(total_share, 4),
            }

        return {
            "name": self.name,
            "baseline": side(self.baseline, self.baseline_self_share, self.baseline_total_share),
            "comparison": side(
                self.comparison, self.comparison_self_share, self.comparison_total_share
            ),
            "self_delta": round(self.self_delta, 4),
            "total_delta": round(self.total_delta, 4),
        }


def compare(baseline: Side, comparison: Side) -> List[Row]:
    """Every function of either side, the largest change in share (self or total) first;
    between equal changes the larger self change first, so that the function that got slower
    comes before its callers, whose totals grew with it."""
    rows = []
    for name in set(baseline.functions) | set(comparison.functions):
        b = baseline.functions.get(name) or FunctionValue(name, 0, 0)
        c = comparison.functions.get(name) or FunctionValue(name, 0, 0)
        rows.append(
            Row(
                name,
                b,
                c,
                baseline.share(b.self_value),
                baseline.share(b.total_value),
                comparison.share(c.self_value),
                comparison.share(c.total_value),
            )
        )
    rows.sort(
        key=lambda r: (
            -round(max(abs(r.self_delta), abs(r.total_delta)), 9),
            -round(abs(r.self_delta), 9),
            r.name,
        )
    )
    return rows


# --- output ----------------------------------------------------------------------------------


def _human_duration(seconds: float) -> str:
    """A range's length to the second, spaced for reading (``1d 2h 3m``)."""
    return format_duration(int(seconds) * SEC, units=("d", "h", "m", "s"), sep=" ")


def left_truncate(text: str, width: int) -> str:
    """``…ule.Class.method`` rather than ``package.mod…``: the end of a name is the function."""
    if len(text) <= width:
        return text
    return "\u2026" + text[-max(width - 1, 1) :]


def _points(delta: float) -> str:
    return f"{delta:+.2f}"


def write_table(
    out: IO[str],
    baseline: Side,
    comparison: Side,
    rows: Sequence[Row],
    type_id: str,
    unit: str,
    terminal: bool,
    fail_above: Optional[float],
) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    longest = max((len(r.name) for r in rows), default=8)
    if terminal:
        console = Console(file=out, highlight=False)
    else:
        console, buffer = plain_console()
    for side in (baseline, comparison):
        seconds = (side.range.end_ms - side.range.start_ms) / 1000
        console.print(
            Text(
                f"{side.name:<10}  {side.selector}  {iso(side.range.start_ms)} .. "
                f"{iso(side.range.end_ms)} ({_human_duration(seconds)})  "
                f"total {format_value(side.total, unit)}",
            ),
            soft_wrap=True,
        )
    console.print(
        Text(
            f"{type_name(type_id)} ({type_id}): share of each side's total in %, change in "
            "percentage points, largest change first"
        ),
        soft_wrap=True,
    )
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    headers = ["self\nbefore", "self\nafter", "self\n\u0394", "total\nbefore", "total\nafter"]
    headers.append("total\n\u0394")
    for title in headers:
        table.add_column(title, justify="right", no_wrap=True)
    table.add_column("\nfunction", no_wrap=True, overflow="ignore")
    cells = [_number_cells(r) for r in rows]
    if terminal:
        # The function gets what the numbers leave of the terminal's width, cut on the left.
        widths = [
            max([len(header.split("\n")[-1])] + [len(c[i]) for c in cells])
            for i, header in enumerate(headers)
        ]
        name_width = max(8, console.width - sum(widths) - 2 * len(widths) - 1)
    else:
        name_width = longest
    for r, numbers in zip(rows, cells):
        flagged = fail_above is not None and r.crosses(fail_above)
        row: List[Any] = list(numbers[:2]) + [_delta_cell(r.self_delta)]
        row += list(numbers[3:5]) + [_delta_cell(r.total_delta)]
        row.append(Text(left_truncate(r.name, name_width), style="bold" if flagged else ""))
        table.add_row(*row)
    console.print(table)
    if not terminal:
        out.write(plain_text(buffer))


def _number_cells(r: Row) -> List[str]:
    return [
        f"{r.baseline_self_share:.2f}",
        f"{r.comparison_self_share:.2f}",
        _points(r.self_delta),
        f"{r.baseline_total_share:.2f}",
        f"{r.comparison_total_share:.2f}",
        _points(r.total_delta),
    ]


def _delta_cell(delta: float) -> Any:
    from rich.text import Text

    style = "red" if delta > 0.005 else "green" if delta < -0.005 else ""
    return Text(_points(delta), style=style)


def folded_lines(baseline: Side, comparison: Side, normalize: bool) -> Iterator[str]:
    """``a;b;c 10 25`` per stack of either side (difffolded.pl's output)."""
    stacks: Dict[str, List[int]] = {}
    for index, side in enumerate((baseline, comparison)):
        for stack, value in side.profile.values(0):
            key = ";".join(folded_frame(f.name) for f in stack)
            stacks.setdefault(key, [0, 0])[index] += value
    scale = comparison.total / baseline.total if normalize and baseline.total else 1.0
    for key in sorted(stacks):
        before, after = stacks[key]
        yield f"{key} {int(round(before * scale))} {after}"


def diff_json(
    baseline: Side,
    comparison: Side,
    rows: Sequence[Row],
    type_id: str,
    unit: str,
    fail_above: Optional[float],
    regressions: Sequence[Row],
) -> Dict[str, Any]:
    doc: Dict[str, Any] = {
        "profile_type": type_id,
        "unit": unit,
        "baseline": baseline.as_json(),
        "comparison": comparison.as_json(),
        "functions": [r.as_json() for r in rows],
        "fail_above": fail_above,
    }
    if fail_above is not None:
        doc["regressions"] = [
            {
                "name": r.name,
                "self_delta": round(r.self_delta, 4),
                "total_delta": round(r.total_delta, 4),
            }
            for r in regressions
        ]
    return doc


def diff_html(baseline: Side, comparison: Side, type_id: str, unit: str) -> str:
    from hotspan.ui.standalone import diff_flamegraph_data, standalone_html

    data = diff_flamegraph_data(baseline.profile, 0, comparison.profile, 0)
    title = f"{type_name(type_id)}: {baseline.selector} vs {comparison.selector}"
    return standalone_html(data, title=title, unit=unit)


# --- the command -----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except CLIError as exc:
        # 2 for every failure to compare (diff(1)'s "trouble"), so that a CI job can tell a
        # regression (1) from a comparison that could not be made.
        raise CLIError(str(exc), 2) from None


def _run(args: argparse.Namespace) -> int:
    if args.top < 0:
        raise CLIError(f"--top must be 0 (all) or more, got {args.top}", 2)
    if args.fail_above is not None and not args.fail_above >= 0:
        raise CLIError(
            f"--fail-above must be 0 or more percentage points, got {args.fail_above}", 2
        )
    type_id = profile_type_id(args.profile_type)
    queries = {side: selector_query(getattr(args, side)) for side in SIDES}
    ranges = {side: args_time_range(args, prefix=f"{side}_") for side in SIDES}
    client = Client.from_args(args)
    first = SIDES[0]
    type_id = resolve_type(client, args.profile_type, type_id, queries[first], ranges[first])
    unit = type_id.split(":")[2]
    baseline, comparison = (
        fetch_side(client, side, getattr(args, side), queries[side], type_id, ranges[side])
        for side in SIDES
    )
    rows = compare(baseline, comparison)
    shown = rows[: args.top] if args.top else rows
    regressions = (
        [r for r in rows if r.crosses(args.fail_above)] if args.fail_above is not None else []
    )

    # To a file: written whole once the data is in, or not at all.
    to_file = bool(args.output) and args.output != "-"
    buffer = io.StringIO()
    out: IO[str] = buffer if to_file else sys.stdout
    terminal = not to_file and sys.stdout.isatty()
    try:
        if args.format == "table":
            write_table(out, baseline, comparison, shown, type_id, unit, terminal, args.fail_above)
        elif args.format == "json":
            doc = diff_json(
                baseline, comparison, shown, type_id, unit, args.fail_above, regressions
            )
            out.write(json.dumps(doc, indent=2) + "\n")
        elif args.format == "folded":
            for line in folded_lines(baseline, comparison, args.normalize):
                out.write(line + "\n")
        else:
            out.write(diff_html(baseline, comparison, type_id, unit))
        out.flush()
    except BrokenPipeError:
        # The reader stopped early (`| head`): the gate's verdict stands all the same (a CI
        # job piping the table must not pass a regression).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if to_file:
        write_output(args.output, buffer.getvalue().encode())

    if regressions:
        print(
            f"hotspan diff: {len(regressions)} function(s) grew by more than "
            f"{args.fail_above:g} percentage points of {type_name(type_id)}:",
            file=sys.stderr,
        )
        for r in regressions:
            print(
                f"  {r.name}: self {_points(r.self_delta)}, total {_points(r.total_delta)}",
                file=sys.stderr,
            )
        return 1
    return 0
