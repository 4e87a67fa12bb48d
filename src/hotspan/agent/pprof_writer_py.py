"""The pure-Python pprof encoder: the twin of the C one (``_speedups/pprof_writer.c``), with its
interface and its bytes, wherever the extension is not built.

Imported only where it runs (through :mod:`hotspan.agent.pprof_writer`): a program encoding
with the C writer does not keep this module's functions and classes for its GC to walk.  It
writes with :mod:`hotspan.agent.pprof_encoding`, as the C writer's Python side finishes with it.
"""

from __future__ import annotations

from hotspan.agent.pprof_encoding import field_key, finish, int_field, varint

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Dict, Hashable, Iterable, List, Optional, Sequence, Tuple, Union

    from hotspan.agent.symbols import FrameInfo

    Labels = Sequence[Tuple[str, str]]


def _bytes(field: int, payload: Union[bytes, bytearray], out: bytearray) -> None:
    field_key(field, 2, out)
    varint(len(payload), out)
    out += payload


def _packed(field: int, values: Iterable[int], out: bytearray) -> None:
    body = bytearray()
    for v in values:
        varint(v, body)
    if body:
        _bytes(field, bytes(body), out)


# The varint of every id below 2^12: a sample's location ids are nearly all that small, and
# a lookup beats the loop of varint (4,096 short bytes objects, ~150 KiB).
_SMALL_IDS = [
    bytes([v]) if v < 0x80 else bytes([(v & 0x7F) | 0x80, v >> 7]) for v in range(1 << 12)
]


def _packed_ids(field: int, ids: Sequence[int], out: bytearray) -> None:
    """``_packed`` for ids, which are never negative (a negative index would not fail)."""
    try:
        body = b"".join([_SMALL_IDS[i] for i in ids])
    except IndexError:
        _packed(field, ids, out)
        return
    if body:
        _bytes(field, body, out)


class PyProfileWriter:
    """One profile: add samples, then :meth:`encode`.

    ``sample_type`` is one ``(type, unit)`` pair, or a sequence of them for a profile whose
    samples carry several values (Go's heap profile has four); :meth:`add` then takes one value
    per type, in order.
    """

    def __init__(
        self,
        sample_type: Union[Tuple[str, str], Sequence[Tuple[str, str]]],
        period_type: Tuple[str, str],
        period: int,
    ) -> None:
        self._strings: Dict[str, int] = {"": 0}
        self._functions: Dict[Tuple[str, str, int], int] = {}
        self._locations: Dict[Tuple[int, int], int] = {}
        self._stacks: Dict[Hashable, Tuple[int, ...]] = {}
        self._samples: Dict[Tuple[Tuple[int, ...], Tuple[Tuple[int, int], ...]], List[int]] = {}
        self._label_ids: Dict[Labels, Tuple[Tuple[int, int], ...]] = {}
        if isinstance(sample_type[0], str):
            self.sample_types: Tuple[Tuple[str, str], ...] = (sample_type,)  # type: ignore[assignment]
        else:
            self.sample_types = tuple(sample_type)  # type: ignore[arg-type]
        self.period_type = period_type
        self.period = period

    def _string(self, text: str) -> int:
        index = self._strings.get(text)
        if index is None:
            index = self._strings[text] = len(self._strings)
        return index

    def _location(self, frame: FrameInfo) -> int:
        name, filename, line, first_line = frame
        fkey = (name, filename, first_line)
        function = self._functions.get(fkey)
        if function is None:
            function = self._functions[fkey] = len(self._functions) + 1
        lkey = (function, line)
        location = self._locations.get(lkey)
        if location is None:
            location = self._locations[lkey] = len(self._locations) + 1
        return location

    def add(
        self,
        stack: Sequence[FrameInfo],
        value: Union[int, Sequence[int]],
        labels: Labels = (),
        stack_key: Optional[Hashable] = None,
    ) -> None:
        """``stack`` leaf first; ``value`` in the sample type's unit (one per sample type when
        there are several).  A sample whose values are all zero records nothing.

        ``stack_key`` stands for ``stack`` in this writer, cheaper to hash than the stack
        (``id(stack)`` of a stack the caller keeps alive until :meth:`encode`); without it a
        tuple stack is its own key."""
        if type(value) is int:
            if value <= 0:
                return
            values: Tuple[int, ...] = (value,)
        else:
            values = tuple(value)  # type: ignore[arg-type]
            if not any(v > 0 for v in values):
                return
        if len(values) != len(self.sample_types):
            raise ValueError(f"{len(values)} values for {len(self.sample_types)} sample types")
        # A stack is resolved once per writer: the same stack comes back with every span or
        # tag set that was current there.
        if stack_key is None and isinstance(stack, tuple):
            stack_key = stack
        locations = self._stacks.get(stack_key) if stack_key is not None else None
        if locations is None:
            locations = tuple(self._location(f) for f in stack)
            if stack_key is not None:
                self._stacks[stack_key] = locations
        # Labels given as a tuple are interned once per writer (CPU and wall rows, and every
        # stack a span was seen on, share them).
        label_ids = self._label_ids.get(labels) if isinstance(labels, tuple) else None
        if label_ids is None:
            label_ids = tuple((self._string(k), self._string(v)) for k, v in labels)
            if isinstance(labels, tuple):
                self._label_ids[labels] = label_ids
        key = (locations, label_ids)
        total = self._samples.get(key)
        if total is None:
            self._samples[key] = list(values)
        else:
            for i, v in enumerate(values):
                total[i] += v

    def __len__(self) -> int:
        return len(self._samples)

    def encode(self, time_ns: int, duration_ns: int, default_sample_type: str = "") -> bytes:
        """The profile, gzipped, as pprof is sent (``default_sample_type``: the one pprof's
        tools show first, when not the last)."""
        return finish(self.encode_raw(time_ns, duration_ns), default_sample_type)

    def encode_raw(self, time_ns: int, duration_ns: int) -> bytes:
        """The profile as protobuf bytes, not compressed."""
        out = bytearray()
        for type_name, unit in self.sample_types:
            value_type = bytearray()
            int_field(1, self._string(type_name), value_type)
            int_field(2, self._string(unit), value_type)
            _bytes(1, bytes(value_type), out)
        # A sample's label messages are encoded once per label set, not once per sample.
        encoded_labels: Dict[Tuple[Tuple[int, int], ...], bytes] = {}
        for (locations, labels), values in self._samples.items():
            sample = bytearray()
            _packed_ids(1, locations, sample)
            _packed(2, values, sample)
            label_bytes = encoded_labels.get(labels)
            if label_bytes is None:
                buffer = bytearray()
                for key, text in labels:
                    label = bytearray()
                    int_field(1, key, label)
                    int_field(2, text, label)
                    _bytes(3, bytes(label), buffer)
                label_bytes = encoded_labels[labels] = bytes(buffer)
            sample += label_bytes
            _bytes(2, sample, out)
        function_ids = {v: k for k, v in self._functions.items()}
        for (function, line), location in self._locations.items():
            line_msg = bytearray()
            int_field(1, function, line_msg)
            int_field(2, line, line_msg)
            loc = bytearray()
            int_field(1, location, loc)
            _bytes(4, bytes(line_msg), loc)
            _bytes(4, bytes(loc), out)
        for function in sorted(function_ids):
            name, filename, first_line = function_ids[function]
            fn = bytearray()
            int_field(1, function, fn)
            int_field(2, self._string(name), fn)
            int_field(3, self._string(name), fn)
            int_field(4, self._string(filename), fn)
            int_field(5, first_line, fn)
            _bytes(5, bytes(fn), out)
        period_type = bytearray()
        int_field(1, self._string(self.period_type[0]), period_type)
        int_field(2, self._string(self.period_type[1]), period_type)
        strings: List[str] = list(self._strings)  # insertion order is index order
        for string in strings:
            _bytes(6, string.encode("utf-8", "replace"), out)
        int_field(9, time_ns, out)
        int_field(10, duration_ns, out)
        _bytes(11, bytes(period_type), out)
        int_field(12, self.period, out)
        return bytes(out)
