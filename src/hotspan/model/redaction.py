"""Redaction: a name that matches a pattern becomes ``[REDACTED]``.

Shared by the agent (function names, file names and label values, before anything leaves the
process) and the server (``hotspan server --redact``, for what other SDKs send): the same
patterns mean the same thing on both sides.  Standard library only: the agent imports it.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Iterable, Tuple

REDACTED = "[REDACTED]"


class RedactError(ValueError):
    """A pattern that is not a valid regular expression; the message names it."""

    def __init__(self, pattern: str, reason: str) -> None:
        super().__init__(f"redact pattern {pattern!r} is not a regex: {reason}")
        self.pattern = pattern
        self.reason = reason


class Redactor:
    """``redactor(text)`` is ``text``, or ``[REDACTED]`` when a pattern (a regex, matched
    case-insensitively anywhere in it) finds something there."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = tuple(p for p in patterns if p)
        # Each compiled alone: joined into one, patterns with inline flags or the same group
        # names would not compile.  A name is checked once where it is first seen (callers
        # cache), so N searches cost little.
        self._searches = []
        for pattern in self.patterns:
            try:
                self._searches.append(re.compile(pattern, re.IGNORECASE).search)
            except re.error as exc:
                raise RedactError(pattern, str(exc)) from None

    def __bool__(self) -> bool:
        return bool(self._searches)

    def __call__(self, text: str) -> str:
        if text and any(search(text) for search in self._searches):
            return REDACTED
        return text

    def labels(self, labels: Tuple[Tuple[str, str], ...]) -> Tuple[Tuple[str, str], ...]:
        if not self._searches:
            return labels
        return tuple((k, self(v)) for k, v in labels)
