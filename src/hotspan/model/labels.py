"""Series labels and Prometheus-style label selectors.

A selector is what Pyroscope and Grafana send: ``{service_name="api", env!="dev", pod=~"web-.*"}``,
optionally preceded by a metric name (``process_cpu:cpu:nanoseconds:cpu:nanoseconds{...}`` or the
legacy ``app.cpu{...}``).  Regular expressions are anchored on both ends and use RE2, as in
Prometheus: matching time is linear, so no selector can stall the server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Mapping, Optional, Tuple

import re2

LabelSet = Tuple[Tuple[str, str], ...]

SERVICE_NAME = "service_name"
METRIC_NAME = "__name__"
PROFILE_TYPE = "__profile_type__"
SPY_NAME = "pyroscope_spy"

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_.]*")


class SelectorError(ValueError):
    """A label selector that cannot be parsed."""


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern is the client's error, reported to the client


def normalize(labels: Mapping[str, str]) -> LabelSet:
    """Sorted, deduplicated label pairs without empty values (Prometheus drops those too)."""
    return tuple(sorted((k, v) for k, v in labels.items() if v != ""))


def is_valid_label_name(name: str) -> bool:
    return bool(_LABEL_NAME.fullmatch(name))


class RegexError(ValueError):
    """A pattern RE2 refuses; the message is RE2's reason."""


def compile_regex(pattern: str):
    """``pattern`` compiled by RE2: linear time, so no user's pattern can stall the server.
    RegexError when RE2 refuses it."""
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise RegexError(str(reason)) from None


def _compile(pattern: str):
    try:
        return compile_regex(pattern)
    except RegexError as exc:
        raise SelectorError(f"invalid regular expression {pattern!r}: {exc}") from None


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str  # one of = != =~ !~
    value: str

    def __post_init__(self) -> None:
        if self.op in ("=~", "!~"):
            object.__setattr__(self, "_regex", _compile(self.value))

    def matches(self, value: Optional[str]) -> bool:
        actual = value or ""
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        hit = self._regex.fullmatch(actual) is not None  # type: ignore[attr-defined]
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.name}{self.op}"{escaped}"'


@dataclass(frozen=True)
class Selector:
    """A metric name (possibly empty) and the matchers between the braces."""

    metric: str
    matchers: Tuple[Matcher, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(m.matches(labels.get(m.name)) for m in self.matchers)


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "`": "`"}


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        self.skip_space()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expect(self, char: str) -> None:
        if self.peek() != char:
            found = self.text[self.pos] if self.pos < len(self.text) else "end of input"
            raise SelectorError(f"expected {char!r} at position {self.pos}, found {found!r}")
        self.pos += 1

    def name(self, pattern: re.Pattern[str], what: str) -> str:
        self.skip_space()
        m = pattern.match(self.text, self.pos)
        if not m or not m.group(0):
            raise SelectorError(f"expected a {what} at position {self.pos}")
        self.pos = m.end()
        return m.group(0)

    def operator(self) -> str:
        self.skip_space()
        for op in ("=~", "!~", "!=", "="):
            if self.text.startswith(op, self.pos):
                self.pos += len(op)
                return op
        raise SelectorError(f"expected one of = != =~ !~ at position {self.pos}")

    def string(self) -> str:
        self.skip_space()
        if self.pos >= len(self.text) or self.text[self.pos] not in "\"'`":
            raise SelectorError(f"expected a quoted value at position {self.pos}")
        quote = self.text[self.pos]
        self.pos += 1
        out: List[str] = []
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            self.pos += 1
            if ch == quote:
                return "".join(out)
            if ch == "\\" and quote != "`" and self.pos < len(self.text):
                nxt = self.text[self.pos]
                self.pos += 1
                out.append(_ESCAPES.get(nxt, "\\" + nxt))
            else:
                out.append(ch)
        raise SelectorError("unterminated quoted value")


_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:.\-]*")


def parse_selector(text: str) -> Selector:
    """Parse ``metric{a="b", c=~"d"}``; both parts are optional, ``""`` and ``{}`` match all.
    Names may be quoted, as Prometheus 3 writes those outside its old character set:
    ``{"otel.scope.name"="x"}``, ``{"app.cpu", env="prod"}``."""
    scanner = _Scanner(text or "")
    metric = ""
    if scanner.peek() not in ("{", ""):
        metric = scanner.name(_METRIC, "metric name")
    matchers: list[Matcher] = []
    if scanner.peek() == "{":
        scanner.expect("{")
        while scanner.peek() != "}":
            if scanner.peek() in "\"'`":
                # Prometheus 3's quoted names: a label's ({"otel.scope.name"="x"}), or the
                # metric's alone ({"app.cpu", env="x"}).
                name = scanner.string()
                if scanner.peek() in (",", "}"):
                    if metric:
                        raise SelectorError(f"a second metric name, {name!r}")
                    metric = name
                    if scanner.peek() == ",":
                        scanner.pos += 1
                    continue
            else:
                name = scanner.name(_LABEL_NAME, "label name")
            op = scanner.operator()
            matchers.append(Matcher(name, op, scanner.string()))
            if scanner.peek() == ",":
                scanner.pos += 1
            elif scanner.peek() != "}":
                raise SelectorError(f"expected ',' or '}}' at position {scanner.pos}")
        scanner.expect("}")
    if scanner.peek():
        raise SelectorError(f"unexpected {scanner.peek()!r} at position {scanner.pos}")
    return Selector(metric, tuple(matchers))
