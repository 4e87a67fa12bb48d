"""``max_profile_size``: an upload over it keeps its largest stacks and folds the rest into one
``other`` frame, so every total (per sample type) stays what was measured."""

from __future__ import annotations

from hotspan.agent.pprof_writer import ProfileWriter

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Hashable, List, Optional, Sequence, Tuple, Union

    from hotspan.agent.symbols import FrameInfo

OTHER: Tuple[FrameInfo, ...] = (("other", "", 0, 0),)


class BoundedProfile:
    """A :class:`ProfileWriter` that remembers what it was given, to fold it if need be."""

    def __init__(
        self,
        sample_types: Any,
        period_type: Tuple[str, str],
        period: int,
        max_bytes: int,
        make: Any = ProfileWriter,
    ) -> None:
        """``make``: the encoder, called with ``(sample_types, period_type, period)``
        (ProfileWriter's pprof, or the OTLP writer)."""
        self._args = (sample_types, period_type, period)
        self._make = make
        self._writer = make(*self._args)
        self._rows: List[Tuple[Any, Any, Any, Any]] = []
        self.max_bytes = max_bytes
        self.folded_stacks = 0  # by the last encode

    def add(
        self,
        stack: Sequence[FrameInfo],
        value: Union[int, Sequence[int]],
        labels: Tuple[Tuple[str, str], ...] = (),
        stack_key: Optional[Hashable] = None,
    ) -> None:
        self._writer.add(stack, value, labels, stack_key=stack_key)
        self._rows.append((stack, value, labels, stack_key))

    def __len__(self) -> int:
        return len(self._writer)

    def encode(self, time_ns: int, duration_ns: int) -> bytes:
        body = self._writer.encode(time_ns, duration_ns)
        self.folded_stacks = 0
        if len(body) <= self.max_bytes or not self._rows:
            return body
        rows = sorted(self._rows, key=_total, reverse=True)
        # The most rows that fit: fewer rows never make a larger profile (the other frame is
        # one sample), so a binary search finds it in log2(rows) encodes.
        low, high = 0, len(rows) - 1
        best: Optional[bytes] = None
        all_folded = b""  # keep = 0: the search always tries it when nothing larger fits
        while low <= high:
            middle = (low + high) // 2
            candidate = self._folded(rows, middle, time_ns, duration_ns)
            if len(candidate) <= self.max_bytes:
                best, low = candidate, middle + 1
                self.folded_stacks = len(rows) - middle
            else:
                if middle == 0:
                    all_folded = candidate
                high = middle - 1
        if best is None:  # not even everything folded fits: that is the smallest there is
            self.folded_stacks = len(rows)
            return all_folded
        return best

    def _folded(self, rows: List[Any], keep: int, time_ns: int, duration_ns: int) -> bytes:
        writer = self._make(*self._args)
        for stack, value, labels, key in rows[:keep]:
            writer.add(stack, value, labels, stack_key=key)
        rest: Optional[List[int]] = None
        for _, value, _, _ in rows[keep:]:
            values = (value,) if type(value) is int else value
            if rest is None:
                rest = [0] * len(values)
            for i, v in enumerate(values):
                rest[i] += v
        if rest is not None:
            writer.add(OTHER, rest[0] if len(rest) == 1 else rest, ())
        return writer.encode(time_ns, duration_ns)


def _total(row: Tuple[Any, Any, Any, Any]) -> int:
    value = row[1]
    return value if type(value) is int else sum(value)
