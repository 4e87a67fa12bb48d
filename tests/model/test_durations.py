"""hotspan.model.durations: the flag grammar (command line, scrape configuration), the
Prometheus grammar (alert rules) and the one formatter, each where people meet them, and
the differences between the two grammars pinned in one table."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from hotspan.alerts.rules import RuleError, parse_duration
from hotspan.cli.client import duration_s, time_ms
from hotspan.cli.diff import _human_duration
from hotspan.model.durations import (
    PROMETHEUS_UNITS,
    SEC,
    DurationError,
    format_duration,
    parse_ns,
    parse_seconds,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("90m", 5400.0),
        ("12h", 43200.0),
        ("7d", 604800.0),
        ("1d12h", 129600.0),
        ("250ms", 0.25),
        ("1.5h", 5400.0),
        ("1m30s500ms", 90.5),
        (" 2H ", 7200.0),
        ("0", 0.0),
        ("off", 0.0),
        ("None", 0.0),
    ],
)
def test_flag_durations(text: str, seconds: float) -> None:
    assert parse_seconds(text) == seconds
    assert duration_s(text) == seconds


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("90s", 90 * SEC),
        ("1h30m", 5400 * SEC),
        ("2w", 14 * 86400 * SEC),
        ("1d1ms", 86400 * SEC + 10**6),
        ("0s", 0),
        ("0", 0),
        (" 5m ", 300 * SEC),
        # Exact, far past what a float holds to the nanosecond.
        ("99999999999w", 99999999999 * 7 * 86400 * SEC),
    ],
)
def test_prometheus_durations(text: str, ns: int) -> None:
    assert parse_ns(text) == ns
    assert parse_duration(text, "for") == ns


# Where the two grammars part: each row is read by one and refused by the other.
GRAMMAR_DIFFERENCES = [
    # (text, flag seconds or None when refused, Prometheus ns or None when refused)
    ("1.5h", 5400.0, None),  # decimals: flags only
    ("2H", 7200.0, None),  # upper case: flags only
    ("off", 0.0, None),  # off/none: flags only
    ("none", 0.0, None),
    ("1w", None, 7 * 86400 * SEC),  # weeks: Prometheus only
    ("2d1w", None, 9 * 86400 * SEC),
]


@pytest.mark.parametrize(("text", "seconds", "ns"), GRAMMAR_DIFFERENCES)
def test_where_the_grammars_differ(text: str, seconds: object, ns: object) -> None:
    if seconds is None:
        with pytest.raises(DurationError):
            parse_seconds(text)
    else:
        assert parse_seconds(text) == seconds
    if ns is None:
        with pytest.raises(DurationError):
            parse_ns(text)
    else:
        assert parse_ns(text) == ns


@pytest.mark.parametrize("text", ["", "s", "1", "10", "1x", "1s 2m", "-1s", "1µs", "1ns", "s1"])
def test_neither_grammar_reads(text: str) -> None:
    with pytest.raises(DurationError):
        parse_seconds(text)
    with pytest.raises(DurationError):
        parse_ns(text)


def test_errors_name_the_text_and_an_example() -> None:
    with pytest.raises(argparse.ArgumentTypeError) as flag:
        duration_s(" 5 Minutes")
    assert str(flag.value) == "'5 minutes' is not a duration such as 7d, 12h or 30m"
    with pytest.raises(RuleError) as rule:
        parse_duration("5 minutes", "condition.window")
    assert str(rule.value) == "condition.window '5 minutes' is not a duration such as 30s, 5m or 1h"
    with pytest.raises(RuleError) as empty:
        parse_duration(" ", "for")
    assert str(empty.value) == "for must be a duration such as 30s, 5m or 1h, not ' '"


def test_now_minus_a_flag_duration() -> None:
    now = 1_700_000_000_000
    assert time_ms("now-1.5h", now) == now - 5_400_000
    assert time_ms("now-250ms", now) == now - 250


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0s"),
        (90 * SEC, "1m30s"),
        (5400 * SEC, "1h30m"),
        (8 * 86400 * SEC + 10**6, "1w1d1ms"),
        (1500 * 10**6, "1s500ms"),
    ],
)
def test_format_reads_back(ns: int, text: str) -> None:
    assert format_duration(ns) == text
    assert parse_ns(text) == ns


def test_format_round_trips_whole_milliseconds() -> None:
    for ns in [k * 10**6 for k in range(0, 10**7, 7919)]:
        assert parse_ns(format_duration(ns)) == ns


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.4, "0s"), (59.9, "59s"), (90, "1m 30s"), (3600.5, "1h"), (8 * 86400 + 1, "8d 1s")],
)
def test_the_diff_header_spells_ranges_to_the_second(seconds: float, text: str) -> None:
    assert _human_duration(seconds) == text
    units = tuple(u for u in PROMETHEUS_UNITS if u not in ("w", "ms"))
    assert format_duration(int(seconds) * SEC, units=units, sep=" ") == text


def test_the_agent_does_not_load_it() -> None:
    # Starting the agent must not pay for the server's parsing (regular expressions included).
    code = (
        "import sys, hotspan, hotspan.agent.core, hotspan.agent.run\n"
        "print('hotspan.model.durations' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "False"
