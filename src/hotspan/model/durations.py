"""Durations as people write them (``30s``, ``1h30m``) and as hotspan writes them back.

Every duration hotspan reads is a run of ``<number><unit>`` parts with nothing between them.
Two grammars share that shape and this module, and differ on purpose:

- the *flag* grammar (:func:`parse_seconds`): command-line options, the scrape configuration
  and ``now-1h`` times.  Decimals are allowed (``1.5h``), case does not matter, the units
  run from ``ms`` to ``d``, and ``0``, ``off`` and ``none`` mean no time at all.
- the *Prometheus* grammar (:func:`parse_ns`): alert rules' ``for``, ``window`` and
  ``offset``, as Prometheus and Grafana spell them.  Whole numbers only, units ``ms`` to
  ``w``, lower case, and ``0`` as the one bare number.

TraceQL's durations and Tempo's ``minDuration`` follow Go's ``time.ParseDuration`` (signs,
``µs``, ``ns``) and stay with the TraceQL parser, which reads them as Tempo does.

The agent does not import this module: its intervals are plain numbers of seconds.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Tuple

SEC = 10**9

UNIT_NS: Dict[str, int] = {
    "ms": 10**6,
    "s": SEC,
    "m": 60 * SEC,
    "h": 3600 * SEC,
    "d": 86400 * SEC,
    "w": 7 * 86400 * SEC,
}

# Longest unit first where one is a prefix of another ("ms" before "m").
_FLAG_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|d|h|m|s)")
_PROMETHEUS_PART = re.compile(r"(\d+)(ms|s|m|h|d|w)")

# What format_duration writes, largest first; the flag grammar reads all but "w".
PROMETHEUS_UNITS: Tuple[str, ...] = ("w", "d", "h", "m", "s", "ms")


class DurationError(ValueError):
    """Text that is not a duration in the grammar asked for; the message says so."""


def _parts(pattern: re.Pattern[str], text: str) -> Optional[List[Tuple[str, str]]]:
    """``text`` cut into (number, unit) parts, or None unless the parts cover all of it."""
    out: List[Tuple[str, str]] = []
    pos = 0
    for m in pattern.finditer(text):
        if m.start() != pos:
            break
        out.append((m.group(1), m.group(2)))
        pos = m.end()
    if pos == 0 or pos != len(text):
        return None
    return out


def parse_seconds(text: str) -> float:
    """Seconds of a flag duration: ``7d``, ``12h``, ``90m``, ``30s``, ``250ms``, ``1.5h`` or
    combinations (``1d12h``); ``0``, ``off`` or ``none``: 0.  DurationError otherwise."""
    text = text.strip().lower()
    if text in ("0", "off", "none"):
        return 0.0
    parts = _parts(_FLAG_PART, text)
    if parts is None:
        raise DurationError(f"{text!r} is not a duration such as 7d, 12h or 30m")
    total = 0.0
    for number, unit in parts:
        total += float(number) * (UNIT_NS[unit] / SEC)
    return total


def parse_ns(text: str) -> int:
    """Nanoseconds of a Prometheus duration (``90s``, ``1h30m``, ``0s``, ``0``), exact:
    whole numbers of whole units.  DurationError otherwise."""
    text = text.strip()
    if text == "0":
        return 0
    parts = _parts(_PROMETHEUS_PART, text)
    if parts is None:
        raise DurationError(f"{text!r} is not a duration such as 30s, 5m or 1h")
    return sum(int(number) * UNIT_NS[unit] for number, unit in parts)


def format_duration(ns: int, units: Sequence[str] = PROMETHEUS_UNITS, sep: str = "") -> str:
    """``ns`` in the largest ``units`` first, each whole (``1h30m``; with ``sep=" "``,
    ``1h 30m``), what is left below the smallest unit dropped; ``0s`` for no time at all.
    With the default units, what :func:`parse_ns` reads back to the same value."""
    if ns == 0:
        return "0s"
    out = []
    for unit in units:
        size = UNIT_NS[unit]
        if ns >= size:
            out.append(f"{ns // size}{unit}")
            ns %= size
    return sep.join(out)
