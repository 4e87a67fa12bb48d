"""What the commands print and write: values in their unit, times, and files written whole
or not at all."""

from __future__ import annotations

import io
import os
import sys
from contextlib import suppress
from datetime import datetime, timezone
from typing import Any, Optional, Tuple

from hotspan.cli.client import CLIError

_DURATIONS = ((3600e9, "h"), (60e9, "min"), (1e9, "s"), (1e6, "ms"), (1e3, "µs"))
_BYTES = ((1024**4, "TiB"), (1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB"))
_TIME_SCALE = {"nanoseconds": 1, "microseconds": 1e3, "milliseconds": 1e6, "seconds": 1e9}


def format_value(value: float, unit: str) -> str:
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
        return f"{value:g} B"
    for above, size, name in ((1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if abs(value) >= above:
            return f"{_trim(value / size)} {name}"
    return f"{value:g}"


def _trim(x: float) -> str:
    digits = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2
    return f"{round(x, digits):.{digits}f}".rstrip("0").rstrip(".") if digits else f"{x:.0f}"


def iso(ms: int) -> str:
    """``2026-11-25T10:00:00Z`` for a time in unix milliseconds."""
    return (
        datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
        .isoformat(timespec="seconds")
        .replace("+00:00", "Z")
    )


def write_output(path: Optional[str], data: bytes) -> None:
    """``data`` to stdout (``path`` None or ``-``) or to ``path``, written beside it and
    renamed, so that a failure leaves no half file."""
    if path is None or path == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        with suppress(OSError):
            os.unlink(tmp)
        raise CLIError(f"cannot write {path}: {exc.strerror or exc}") from None


def plain_console() -> Tuple[Any, io.StringIO]:
    """A rich Console for output that is not a terminal, and the buffer it writes: no colour,
    and a width no line reaches, so nothing is cut or wrapped (a pipe has no width: grep and
    awk want whole lines).  Read it back with :func:`plain_text`."""
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=100_000,
        color_system=None,
        force_terminal=False,
        highlight=False,
        emoji=False,
    )
    return console, buffer


def plain_text(buffer: io.StringIO) -> str:
    """What :func:`plain_console` wrote, without the padding rich puts at lines' ends."""
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())
