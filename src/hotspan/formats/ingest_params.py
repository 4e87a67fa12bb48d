"""The conventions of Pyroscope's ``/ingest`` endpoint: the ``name`` parameter, time
parameters, and how a non-pprof upload's app-name suffix picks its profile type."""

from __future__ import annotations

import calendar
import datetime
import re
import time
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from hotspan.formats.errors import FormatError
from hotspan.model.profile import MAX_TIME_NS

_NAME = re.compile(r"^\s*([^{}]*?)\s*(?:\{(.*)\})?\s*$", re.S)
# now, now-1h, now+30s, now-1h30m: Pyroscope's (Graphite's) relative times.
_RELATIVE = re.compile(r"^now(?:([+-])(\d[0-9A-Za-z]*))?$")
# Longer is no time anyone writes (and int() of thousands of digits is slow).
MAX_TIME_TEXT = 64
_OFFSET = re.compile(r"(\d+)([a-zA-Z]*)")
# A unit by how it starts, in Pyroscope's order (mon and M before m); no unit counts nothing.
_UNIT_SECONDS = (
    ("s", 1),
    ("mon", 30 * 86400),
    ("M", 30 * 86400),
    ("m", 60),
    ("h", 3600),
    ("d", 86400),
    ("w", 7 * 86400),
    ("y", 365 * 86400),
)


@dataclass(frozen=True)
class AppName:
    name: str  # with any ``.cpu``-like suffix
    tags: Dict[str, str]


def parse_app_name(text: str) -> AppName:
    """``app.cpu{env=prod,region=us}`` (values may be quoted)."""
    m = _NAME.match(text or "")
    if not m or not m.group(1):
        raise FormatError(f"name {text!r} is not of the form app{{key=value,...}}")
    tags: Dict[str, str] = {}
    body = m.group(2)
    if body:
        for part in body.split(","):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            key, value = key.strip(), value.strip().strip('"')
            if not sep or not key:
                raise FormatError(f"tag {part!r} in name {text!r} is not key=value")
            tags[key] = value
    return AppName(m.group(1), tags)


def parse_time(value: Optional[str], default_ns: int) -> int:
    """Seconds, milliseconds, microseconds or nanoseconds since the epoch, told apart by digit
    count as Pyroscope does; also ``now`` and ``now-1h``.  Returns nanoseconds."""
    if value is None or value == "":
        return default_ns
    ns = _parse_time(value.strip())
    if not 0 <= ns < MAX_TIME_NS:
        raise FormatError(f"time {value!r} is outside the years 1970 to 2116")
    return ns


def _unit_seconds(unit: str) -> int:
    return next((seconds for prefix, seconds in _UNIT_SECONDS if unit.startswith(prefix)), 0)


def _parse_time(value: str) -> int:
    if len(value) > MAX_TIME_TEXT:
        raise FormatError(f"time {value[:20]!r}... is over {MAX_TIME_TEXT} characters")
    # As Pyroscope reads them: blanks, "_" and "," left out; YYYYMMDD is a day.
    value = value.replace("_", "").replace(",", "").replace(" ", "")
    if value.isdigit() and len(value) == 8:
        try:
            day = datetime.datetime.strptime(value, "%Y%m%d")
        except ValueError:
            day = None
        if day is not None and day.year > 1900:
            return calendar.timegm(day.timetuple()) * 1_000_000_000
    if value.isdigit():
        digits = len(value.lstrip("0")) or 1
        n = int(value)
        if digits <= 10:
            return n * 1_000_000_000
        if digits <= 13:
            return n * 1_000_000
        if digits <= 16:
            return n * 1_000
        if digits <= 19:
            return n
        raise FormatError(f"time {value!r} has too many digits")
    m = _RELATIVE.match(value)
    if m:
        now = time.time_ns()
        if m.group(1):
            seconds = sum(int(n) * _unit_seconds(unit) for n, unit in _OFFSET.findall(m.group(2)))
            now += (-seconds if m.group(1) == "-" else seconds) * 1_000_000_000
        return now
    raise FormatError(f"time {value!r} is not a unix timestamp, YYYYMMDD or now[-Nu]")


# suffix -> (metric name, sample type, sample unit), as Pyroscope's ingest adapter maps them.
_SUFFIXES: Dict[str, Tuple[str, str, str]] = {
    "cpu": ("process_cpu", "samples", "count"),
    "itimer": ("process_cpu", "samples", "count"),
    "wall": ("wall", "samples", "count"),
    "seconds": ("wall", "samples", "count"),
    "nanoseconds": ("wall", "samples", "count"),
    "microseconds": ("wall", "samples", "count"),
    "milliseconds": ("wall", "samples", "count"),
    "inuse_objects": ("memory", "inuse_objects", "count"),
    "inuse_space": ("memory", "inuse_space", "bytes"),
    "alloc_objects": ("memory", "alloc_objects", "count"),
    "alloc_space": ("memory", "alloc_space", "bytes"),
    "bytes": ("memory", "samples", "bytes"),
    "live": ("memory", "live", "count"),
    "goroutines": ("goroutine", "goroutines", "count"),
    "mutex_count": ("mutex", "contentions", "count"),
    "mutex_duration": ("mutex", "delay", "nanoseconds"),
    "block_count": ("block", "contentions", "count"),
    "block_duration": ("block", "delay", "nanoseconds"),
    "lock_count": ("block", "contentions", "count"),
    "lock_duration": ("block", "delay", "nanoseconds"),
    "exceptions": ("exceptions", "samples", "count"),
    "alloc_in_new_tlab_objects": ("memory", "alloc_in_new_tlab_objects", "count"),
    "alloc_in_new_tlab_bytes": ("memory", "alloc_in_new_tlab_bytes", "bytes"),
    "alloc_outside_tlab_objects": ("memory", "alloc_outside_tlab_objects", "count"),
    "alloc_outside_tlab_bytes": ("memory", "alloc_outside_tlab_bytes", "bytes"),
}


def split_suffix(app: str) -> Tuple[str, str]:
    """``app.cpu`` -> (``app``, ``cpu``); no known suffix -> (app, ``cpu``)."""
    base, dot, suffix = app.rpartition(".")
    if dot and suffix in _SUFFIXES:
        return base, suffix
    return app, "cpu"


@dataclass(frozen=True)
class LegacyType:
    metric: str
    sample_type: str
    sample_unit: str
    period_type: str
    period_unit: str
    scale: int  # multiply sample values by this


def legacy_type(suffix: str, sample_rate: int) -> LegacyType:
    """Profile type of a non-pprof upload.  CPU and wall samples counted at ``sample_rate`` Hz
    become nanoseconds, each sample worth one period."""
    metric, stype, sunit = _SUFFIXES[suffix]
    if sample_rate > 0 and metric in ("process_cpu", "wall"):
        period = 1_000_000_000 // sample_rate
        stype = "wall" if metric == "wall" else "cpu"
        return LegacyType(metric, stype, "nanoseconds", "cpu", "nanoseconds", max(period, 1))
    return LegacyType(metric, stype, sunit, "", "", 1)
