"""The times Pyroscope's ``/ingest`` and ``/pyroscope/render`` take (``from``, ``until``), as
Pyroscope reads them (``formats.ingest_params.parse_time``)."""

from __future__ import annotations

import calendar
import time

import pytest

from hotspan.formats.errors import FormatError
from hotspan.formats.ingest_params import parse_time

SEC = 10**9
DAY = 86400


@pytest.mark.parametrize(
    "text, offset_s",
    [
        ("now", 0),
        ("now-1h", -3600),
        ("now+1s", 1),
        ("now-1min", -60),
        ("now-2m", -120),
        ("now-1mon", -30 * DAY),
        ("now-1M", -30 * DAY),
        ("now-1y", -365 * DAY),
        ("now-1w", -7 * DAY),
        ("now-1h30m", -5400),
        ("now - 1d", -DAY),
        ("now-1", 0),  # no unit: nothing, as Pyroscope counts it
    ],
)
def test_relative_times(text: str, offset_s: int) -> None:
    before = time.time_ns()
    got = parse_time(text, 0)
    after = time.time_ns()
    assert before + offset_s * SEC <= got <= after + offset_s * SEC


def test_numbers_and_days() -> None:
    assert parse_time("1700000000", 0) == 1_700_000_000 * SEC
    assert parse_time("1700000000123", 0) == 1_700_000_000_123 * 10**6
    assert parse_time("1_700_000_000", 0) == 1_700_000_000 * SEC
    # Eight digits that make a date are that day (UTC); others are seconds.
    assert parse_time("20200101", 0) == calendar.timegm((2020, 1, 1, 0, 0, 0)) * SEC
    assert parse_time("20201399", 0) == 20_201_399 * SEC


@pytest.mark.parametrize("text", ["yesterday", "now-", "now-h", "1h", "now*2"])
def test_what_is_no_time(text: str) -> None:
    with pytest.raises(FormatError, match="not a unix timestamp"):
        parse_time(text, 0)


def test_a_long_or_hostile_time_is_refused_at_once() -> None:
    started = time.perf_counter()
    for text in ("now-" + "1" * 60 + "!", "now-" + "1a" * 40, "9" * 5000):
        with pytest.raises(FormatError):
            parse_time(text, 0)
    assert time.perf_counter() - started < 1
