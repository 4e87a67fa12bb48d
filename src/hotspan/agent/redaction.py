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
        patterns = [p for p in patterns if p]
        self._search = (
            re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE).search
            if patterns
            else None
        )

    def __bool__(self) -> bool:
        return self._search is not None

    def __call__(self, text: str) -> str:
        if self._search is not None and text and self._search(text):
            return REDACTED
        return text

    def labels(self, labels: Tuple[Tuple[str, str], ...]) -> Tuple[Tuple[str, str], ...]:
        if self._search is None:
            return labels
        return tuple((k, self(v)) for k, v in labels)
