"""Profile files on disk: pprof, folded text, speedscope JSON and the standalone HTML flame
graph.  What ``hotspan convert``, ``view`` and ``export`` read and write."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple, Union

from hotspan.formats import folded, pprof, speedscope
from hotspan.formats.errors import FormatError
from hotspan.model.profile import Frame
from hotspan.model.stack_profile import ProfileSelectError, SampleType, StackProfile

FORMATS = ("pprof", "folded", "speedscope", "html")

# Longest suffix first: ".speedscope.json" before ".json", ".pb.gz" before ".gz".
_SUFFIXES: Tuple[Tuple[str, str], ...] = (
    (".speedscope.json", "speedscope"),
    (".folded.txt", "folded"),
    (".pb.gz", "pprof"),
    (".pprof.gz", "pprof"),
    (".pprof", "pprof"),
    (".pb", "pprof"),
    (".gz", "pprof"),
    (".folded", "folded"),
    (".collapsed", "folded"),
    (".txt", "folded"),
    (".json", "speedscope"),
    (".html", "html"),
    (".htm", "html"),
)

FOLDED_TYPE = SampleType("samples", "count")

PathLike = Union[str, Path]


def format_for_path(path: PathLike) -> str:
    """The format a file name asks for, by its extension; FormatError when it says none."""
    name = str(path).lower()
    for suffix, fmt in _SUFFIXES:
        if name.endswith(suffix):
            return fmt
    raise FormatError(
        f"{path}: cannot tell the format from the file name "
        f"(use .pb.gz, .folded, .speedscope.json or .html)"
    )


def detect_format(path: PathLike, data: bytes) -> str:
    """A file's format by its content first (the extension only breaks ties)."""
    if data[:2] == b"\x1f\x8b":
        return "pprof"  # gzip: pprof is the only compressed format we read
    head = data[:4096].lstrip()
    lowered = head[:512].lower()
    if lowered.startswith(b"<!doctype html") or lowered.startswith(b"<html"):
        return "html"
    if head.startswith(b"{"):
        if b"speedscope.app/file-format" in data or b'"shared"' in data:
            return "speedscope"
        raise FormatError(f"{path}: JSON, but not a speedscope file (no $schema or shared.frames)")
    try:
        hint: Optional[str] = format_for_path(path)
    except FormatError:
        hint = None
    if _looks_like_text(head) and (hint in ("folded", None) or b";" in head or _folded_line(head)):
        return "folded"
    if hint == "pprof" or not _looks_like_text(head):
        return "pprof"
    return hint or "folded"


def _looks_like_text(head: bytes) -> bool:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        # A cut in the middle of a multi-byte character at the end is still text.
        try:
            text = head[:-3].decode("utf-8")
        except UnicodeDecodeError:
            return False
    return all(c.isprintable() or c in "\t\r\n" for c in text)


def _folded_line(head: bytes) -> bool:
    first = head.split(b"\n", 1)[0].strip()
    _, sep, value = first.rpartition(b" ")
    return bool(sep) and value.isdigit()


def read_profile(path: PathLike, fmt: Optional[str] = None) -> StackProfile:
    """A profile file, whatever its format (``fmt`` to insist on one)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise FormatError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if not data.strip():
        raise FormatError(f"{path}: the file is empty")
    fmt = fmt or detect_format(path, data)
    if fmt not in FORMATS:
        raise FormatError(f"{fmt!r} is not a profile format (one of {', '.join(FORMATS)})")
    try:
        if fmt == "pprof":
            profile = pprof.read_stack_profile(data)
        elif fmt == "folded":
            profile = read_folded(data)
        elif fmt == "speedscope":
            profile = speedscope.read_speedscope(data)
        else:
            profile = read_html(data)
    except FormatError as exc:
        raise FormatError(f"{path}: not a valid {fmt} file: {exc}") from None
    if not profile.stacks:
        raise FormatError(f"{path}: the {fmt} file has no samples")
    return profile


def read_folded(data: bytes, sample_type: SampleType = FOLDED_TYPE) -> StackProfile:
    profile = StackProfile([sample_type])
    for names, value in folded.parse_folded(data):
        profile.add([Frame(n) for n in names], [value])
    return profile


def read_html(data: bytes) -> StackProfile:
    """The flame graph a standalone page carries, back as stacks (diff pages: the comparison
    side).  Node names are all it keeps, and nodes folded into "other" stay "other"."""
    from hotspan.ui.standalone import embedded_data

    try:
        doc = embedded_data(data.decode("utf-8", "replace"))
    except ValueError as exc:
        raise FormatError(
            f"HTML is an output format; only pages hotspan wrote can be read back ({exc})"
        ) from None
    unit = str(doc.get("unit") or "count")
    st = {
        "nanoseconds": SampleType("cpu", unit),
        "bytes": SampleType("space", unit),
    }.get(unit, SampleType("samples", unit))
    profile = StackProfile([st])
    for stack, value in _flamegraph_stacks(doc["flamegraph"]):
        profile.add([Frame(n) for n in stack], [value])
    return profile


def _flamegraph_stacks(fg: dict) -> List[Tuple[List[str], int]]:
    """Pyroscope's level encoding back to (root-first names, self value) pairs."""
    names = [str(n) for n in fg.get("names", [])]
    levels = [[int(v) for v in (lv or {}).get("values", [])] for lv in fg.get("levels", [])]
    diff = "leftTicks" in fg or "rightTicks" in fg
    stride = 7 if diff else 4
    out: List[Tuple[List[str], int]] = []
    previous: List[Tuple[int, int, List[str]]] = []  # (x, total, path) of the level above
    try:
        for depth, values in enumerate(levels):
            current: List[Tuple[int, int, List[str]]] = []
            end = 0
            p = 0
            for i in range(0, len(values) - stride + 1, stride):
                if diff:  # the comparison side: right x delta, total, self
                    x, total, self_value = end + values[i + 3], values[i + 4], values[i + 5]
                else:
                    x, total, self_value = end + values[i], values[i + 1], values[i + 2]
                end = x + total
                name = names[values[i + stride - 1]]
                if depth == 0:
                    path: List[str] = []
                else:
                    while p < len(previous) - 1 and previous[p][0] + previous[p][1] <= x:
                        p += 1
                    path = previous[p][2] + [name]
                current.append((x, total, path))
                if path and self_value:
                    out.append((path, self_value))
            previous = current
    except (IndexError, ValueError, TypeError) as exc:
        raise FormatError(f"malformed flame graph levels: {exc!r}") from None
    return out


def write_profile(
    profile: StackProfile, fmt: str, profile_type: Optional[str] = None, title: str = ""
) -> bytes:
    """``profile`` in ``fmt``: pprof and speedscope keep every sample type; folded and html
    hold one, ``profile_type`` (by default, CPU time or else the last type)."""
    if fmt == "pprof":
        return pprof.write_stack_profile(profile)
    if fmt == "speedscope":
        return speedscope.write_speedscope(profile, name=title)
    if fmt not in FORMATS:
        raise FormatError(f"{fmt!r} is not a profile format (one of {', '.join(FORMATS)})")
    try:
        position = profile.select(profile_type)
    except ProfileSelectError as exc:
        raise FormatError(str(exc)) from None
    if fmt == "folded":
        return folded.write_folded(profile, position)
    from hotspan.ui.standalone import flamegraph_data, standalone_html

    st = profile.sample_types[position]
    page = standalone_html(
        flamegraph_data(profile, position),
        title=title or f"hotspan flame graph · {st.type}",
        unit=st.unit,
    )
    return page.encode("utf-8")
