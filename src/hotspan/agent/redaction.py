"""Redaction: names that match a pattern never leave the process.

Function names, file names and label values are checked where they are first named (once per
code object, once per label set an upload carries), so the cost does not grow with samples.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Iterable, Tuple

REDACTED = "[REDACTED]"


class Redactor:
    """``redactor(text)`` is ``text``, or ``[REDACTED]`` when a pattern (a regex, matched
    case-insensitively anywhere in it) finds something there."""

    def __init__(self, patterns: Iterable[str]) -> None:
        # Each compiled alone: joined into one, patterns with inline flags or the same group
        # names would not compile.  Names are checked once each, so N searches cost little.
        self._searches = [re.compile(p, re.IGNORECASE).search for p in patterns if p]

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
