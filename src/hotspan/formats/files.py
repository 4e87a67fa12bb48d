"""Profile files on disk: which format a file is in, by its name or its content, and folded
text read into a profile.  The formats hotspan reads and writes are pprof, folded text,
speedscope JSON and the standalone HTML flame graph; the command line puts the readers and
writers together (``hotspan.cli.profile_files``), the HTML page being the UI's."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple, Union

from hotspan.formats import folded, pprof, speedscope
from hotspan.formats.errors import FormatError
from hotspan.model.profile import Frame
from hotspan.model.stack_profile import SampleType, StackProfile

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
    head = data[:4096].removeprefix(b"\xef\xbb\xbf").lstrip()  # a UTF-8 byte order mark
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
    # Control characters tell binary (protobuf's field tags are 0x08, 0x10, 0x12...); bytes that
    # are not UTF-8 do not: a folded file written in Latin-1 is still text.
    text = head.decode("utf-8", "replace")
    return all(c.isprintable() or c in "\t\r\n\ufeff" for c in text)


def _folded_line(head: bytes) -> bool:
    first = head.split(b"\n", 1)[0].strip()
    _, sep, value = first.rpartition(b" ")
    return bool(sep) and value.isdigit()


def read_folded(data: bytes, sample_type: SampleType = FOLDED_TYPE) -> StackProfile:
    profile = StackProfile([sample_type])
    for names, value in folded.parse_folded(data):
        profile.add([Frame(n) for n in names], [value])
    return profile


def read_stacks(
    name: PathLike, data: bytes, fmt: Optional[str] = None, max_size: int = 1 << 31
) -> StackProfile:
    """A pprof, folded or speedscope file's bytes as a profile (its format by ``fmt``, else by
    its content and name), or FormatError saying why not; a gzipped pprof may inflate to
    ``max_size`` bytes.  The HTML page is the UI's to read."""
    if not data.strip():
        raise FormatError(f"{name}: the file is empty")
    fmt = fmt or detect_format(name, data)
    if fmt not in ("pprof", "folded", "speedscope"):
        raise FormatError(f"{name}: {fmt} is not a format of profiles to read here")
    try:
        if fmt == "pprof":
            profile = pprof.read_stack_profile(data, max_size)
        elif fmt == "folded":
            profile = read_folded(data)
        else:
            profile = speedscope.read_speedscope(data)
    except FormatError as exc:
        raise FormatError(f"{name}: not a valid {fmt} file: {exc}") from None
    if not profile.stacks:
        raise FormatError(f"{name}: the {fmt} file has no samples")
    return profile
