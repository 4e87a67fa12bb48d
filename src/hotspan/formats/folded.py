"""Collapsed stacks: ``a;b;c 10`` (Pyroscope's default ``/ingest`` format, Brendan Gregg's
folded output) and ``lines`` (one stack per line, each worth one sample)."""

from __future__ import annotations

from typing import Dict, Iterator, List, Tuple

from hotspan.formats.errors import FormatError
from hotspan.formats.pyroscope_nodes import MAX_FRAMES, StackBudget
from hotspan.model.profile import MAX_SAMPLE_VALUE
from hotspan.model.stack_profile import StackProfile

Stack = Tuple[List[str], int]  # root-first frame names, value


def _lines(text: str, what: str) -> List[str]:
    """The lines of a body's text, which may stand for no more than MAX_FRAMES stacks (as a
    trie's or a tree's nodes): each line costs far more to read than its bytes, and a few
    kilobytes gzipped hold millions of them.  Lines end at \n (and \r\n) only: str.splitlines
    would also end them inside names, at \x0b, \x1c or U+2028."""
    if text.count("\n") >= MAX_FRAMES:
        raise FormatError(f"{what}: more than {MAX_FRAMES} lines")
    return text.split("\n")


def parse_folded(data: bytes) -> Iterator[Stack]:
    """The stacks of folded text, at most MAX_FRAMES frames in all (StackBudget)."""
    text = data.decode("utf-8", "replace").removeprefix("\ufeff")
    budget = StackBudget("folded", len(text))
    for number, raw in enumerate(_lines(text, "folded"), 1):
        line = raw.strip()
        if not line:
            continue
        stack, sep, value = line.rpartition(" ")
        if not sep:
            raise FormatError(f"line {number}: expected 'frame;frame;... value', got {raw[:80]!r}")
        try:
            count = int(value)
        except ValueError:
            try:
                count = int(float(value))
            except (ValueError, OverflowError):
                raise FormatError(f"line {number}: value {value[:40]!r} is not a number") from None
        if not 0 <= count <= MAX_SAMPLE_VALUE:
            raise FormatError(f"line {number}: value {value[:40]!r} is out of range")
        frames = [f for f in stack.split(";") if f]
        if frames and count:
            budget.charge(0, len(frames))
            yield frames, count


def parse_lines(data: bytes) -> Iterator[Stack]:
    """The stacks of ``lines`` text, at most MAX_FRAMES frames in all (StackBudget)."""
    # Any text is a stack here, so a binary body (a pprof or JFR sent with the wrong format)
    # would be stored as frames of garbage: text or nothing.
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise FormatError(f"not text: the byte at {exc.start} is not UTF-8") from None
    if "\x00" in text:
        raise FormatError(f"not text: a NUL byte at {text.index(chr(0))}")
    budget = StackBudget("lines", len(text))
    for raw in _lines(text, "lines"):
        frames = [f for f in raw.strip().split(";") if f]
        if frames:
            budget.charge(0, len(frames))
            yield frames, 1


def folded_frame(name: str) -> str:
    """A frame name as folded text can hold it: ';' separates frames and a line ends a stack,
    so neither may stay in a name (a line break is written as ``\\n``)."""
    if ";" in name or "\n" in name or "\r" in name:
        name = name.replace(";", ":").replace("\r", "\\r").replace("\n", "\\n")
    return name


def write_folded(profile: StackProfile, position: int = 0) -> bytes:
    """One sample type as ``root;...;leaf value`` lines.  Frame names only (folded text has no
    place for files or lines), so stacks that differ only there are summed; lines are sorted so
    the same profile always gives the same bytes."""
    totals: Dict[str, int] = {}
    for stack, value in profile.values(position):
        key = ";".join(folded_frame(frame.name) for frame in stack)
        totals[key] = totals.get(key, 0) + value
    return "".join(f"{key} {totals[key]}\n" for key in sorted(totals)).encode("utf-8")
