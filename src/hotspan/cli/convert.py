"""``hotspan convert IN OUT`` between profile file formats, and ``hotspan view FILE``: any
profile file as the standalone HTML flame graph, opened in a browser."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import webbrowser
from pathlib import Path
from typing import Optional

from hotspan.cli.client import CLIError
from hotspan.cli.output import write_output

CONVERT_EXAMPLES = """\
Converts a profile file between pprof, folded stacks, speedscope JSON and the standalone
HTML flame graph.  The input format is read from the content; the output format follows
OUT's name (.pb.gz/.pprof, .folded/.txt, .speedscope.json/.json, .html) unless --to says.
pprof and speedscope keep every sample type; folded and html hold one (--profile-type,
default CPU time, else the last type, as go tool pprof).  Folded input has one
"samples" count type.

examples:
  hotspan convert cpu.pb.gz cpu.speedscope.json          open it in speedscope.app
  hotspan convert heap.pb.gz heap.folded --profile-type inuse_space
  hotspan convert stacks.txt stacks.pb.gz                then: go tool pprof -top stacks.pb.gz
  hotspan convert cpu.pb.gz - --to folded | flamegraph.pl > cpu.svg
"""

VIEW_EXAMPLES = """\
Writes the standalone HTML flame graph of a profile file (pprof, folded or speedscope) and
opens it in a browser; without a browser (or with --no-browser) it prints the file's path.

examples:
  hotspan view cpu.pb.gz
  hotspan view heap.pb.gz --profile-type alloc_space -o alloc.html
  hotspan view profile.speedscope.json --no-browser
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Registers ``convert`` (``view`` is :func:`add_view_parser`, via ``hotspan.cli.view``)."""
    from hotspan.formats.files import FORMATS

    convert = sub.add_parser(
        "convert",
        help="convert a profile file between pprof, folded, speedscope and HTML",
        description=CONVERT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    convert.add_argument("input", metavar="IN", help="the profile file to read")
    convert.add_argument("output", metavar="OUT", help="the file to write ('-': stdout)")
    convert.add_argument("--from", dest="from_format", choices=FORMATS, help="IN's format")
    convert.add_argument("--to", dest="to_format", choices=FORMATS, help="OUT's format")
    convert.add_argument("--profile-type", metavar="TYPE", help="the sample type for folded/html")
    convert.set_defaults(func=run_convert, log_level="warning")


def add_view_parser(sub: argparse._SubParsersAction) -> None:
    view = sub.add_parser(
        "view",
        help="open a profile file as a flame graph in the browser",
        description=VIEW_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    view.add_argument("file", metavar="FILE", help="pprof, folded or speedscope file")
    view.add_argument("-o", "--output", metavar="OUT.html", help="where to write the page")
    view.add_argument("--profile-type", metavar="TYPE", help="the sample type to show")
    view.add_argument("--no-browser", action="store_true", help="print the path, open nothing")
    view.set_defaults(func=run_view, log_level="warning")


def _read(path: str, fmt: Optional[str] = None):
    from hotspan.cli.profile_files import read_profile
    from hotspan.formats.errors import FormatError

    if not os.path.exists(path):
        raise CLIError(f"{path}: no such file", 2)
    try:
        return read_profile(path, fmt)
    except FormatError as exc:
        raise CLIError(str(exc), 2 if "cannot read" not in str(exc) else 1) from None


def _write(profile, fmt: str, profile_type: Optional[str], title: str) -> bytes:
    from hotspan.cli.profile_files import write_profile
    from hotspan.formats.errors import FormatError

    try:
        return write_profile(profile, fmt, profile_type, title=title)
    except FormatError as exc:
        raise CLIError(f"--profile-type: {exc}" if profile_type else str(exc), 2) from None


def run_convert(args: argparse.Namespace) -> int:
    from hotspan.formats.errors import FormatError
    from hotspan.formats.files import format_for_path

    to = args.to_format
    if to is None:
        if args.output == "-":
            raise CLIError("writing to stdout: say which format with --to", 2)
        try:
            to = format_for_path(args.output)
        except FormatError as exc:
            raise CLIError(f"{exc}; or give --to", 2) from None
    profile = _read(args.input, args.from_format)
    data = _write(profile, to, args.profile_type, Path(args.input).name)
    write_output(args.output, data)
    return 0


def run_view(args: argparse.Namespace) -> int:
    profile = _read(args.file)
    page = _write(profile, "html", args.profile_type, Path(args.file).name)
    if args.output:
        out = Path(args.output)
    else:
        # A directory of its own: the name says what it is and nothing else is overwritten.
        stem = Path(args.file).name.split(".")[0] or "profile"
        out = Path(tempfile.mkdtemp(prefix="hotspan-view-")) / f"{stem}.html"
    write_output(str(out), page)
    browser = None if args.no_browser else _browser()
    if browser is not None and browser.open(out.resolve().as_uri()):
        print(f"opened {out}")
    else:
        print(out)
    return 0


def _browser() -> Optional[webbrowser.BaseBrowser]:
    """A graphical browser, or None.  Without a display, webbrowser would pick a text browser
    (lynx, w3m) that takes over the terminal: no browser then, unless BROWSER names one."""
    if (
        sys.platform.startswith("linux")
        and not os.environ.get("BROWSER")
        and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    ):
        return None
    try:
        return webbrowser.get()
    except webbrowser.Error:
        return None
