"""Java Flight Recorder (JFR) recordings, read to the format's specification.

A recording is one or more chunks.  A chunk starts with a 68-byte big-endian header: the magic
``FLR\\0``, the version (2.x), the chunk size, the offsets of its constant pool and metadata
events, start time, duration, start ticks, ticks per second, and feature flags (bit 0: integers
are LEB128 varints, as async-profiler and the JDK always write them).  Events follow, each
starting with its size and type id.  Type 0 is the metadata event: a string table and an
element tree that declares every type (``<class id name>`` with ``<field name class
constantPool dimension>`` children).  Type 1 is a constant-pool event: values other events refer
to by id (stack traces, methods, classes, symbols, thread states...), chained backwards from the
header's offset through relative offsets.  Every other event is laid out field by field as the
metadata declares; a ``constantPool`` field holds an id into that type's pool instead of the
value.  Each chunk is self-contained: its own metadata and pools.

Only the events a profile needs are decoded (see :data:`PROFILE_EVENTS`); the rest are skipped
by their size.  Work is bounded by the input: every loop consumes input bytes, counts are checked
against the bytes left, constant-pool events together span no more than their chunk (so none
is decoded again inside another), and a recording holds at most :data:`MAX_VALUES` pool
values, array elements and profile events (memory: each costs far more than the byte or two it
may take).  Any inconsistency raises :class:`JfrError` naming the problem and where it is,
never anything else.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from hotspan.formats.errors import FormatError

MAGIC = b"FLR\x00"
HEADER_SIZE = 68
_COMPRESSED_INTS = 1  # header feature flag

# Event type -> the fields of it that profiles use (absent fields read as None).
PROFILE_EVENTS: Dict[str, Tuple[str, ...]] = {
    "jdk.ExecutionSample": ("stackTrace", "state", "contextId", "spanId", "spanName"),
    "profiler.WallClockSample": (
        "stackTrace",
        "state",
        "samples",
        "contextId",
        "spanId",
        "spanName",
    ),
    "jdk.ObjectAllocationInNewTLAB": (
        "stackTrace",
        "tlabSize",
        "contextId",
        "spanId",
        "spanName",
    ),
    "jdk.ObjectAllocationOutsideTLAB": (
        "stackTrace",
        "allocationSize",
        "contextId",
        "spanId",
        "spanName",
    ),
    "jdk.ObjectAllocationSample": ("stackTrace", "weight"),
    "jdk.JavaMonitorEnter": ("stackTrace", "duration", "contextId", "spanId", "spanName"),
    "jdk.ThreadPark": ("stackTrace", "duration"),
    "profiler.LiveObject": ("stackTrace",),
    "profiler.Malloc": ("stackTrace", "size"),
    "jdk.ActiveSetting": ("name", "value"),
}

# A type whose inline value costs this many reads per byte it must occupy is refused, so no
# metadata can make a small input expensive (legitimate types cost about one read per byte).
_MAX_READS_PER_BYTE = 16
_MAX_ELEMENT_DEPTH = 64  # metadata element tree
_MAX_TYPE_DEPTH = 32  # types inline in types (real recordings nest 2 or 3 deep)
# Constant-pool values, array elements and profile events one recording may hold.  Each costs
# ~50-300 bytes of memory (decoded, or summed into a sample) however few bytes it took (a pool
# entry can be 2 bytes), so without a cap a recording of the largest size accepted would take
# gigabytes.  The Pyroscope fixture with cpu, alloc and lock events (10 s of a Kafka broker,
# every lock and allocation recorded) holds 62 000 in 685 KB: the cap is ~40 MB of that.
MAX_VALUES = 4_000_000


class JfrError(FormatError):
    """The payload is not a JFR recording we can read; the message says what and where."""


class _Budget:
    """What is left of a recording's :data:`MAX_VALUES`."""

    def __init__(self, max_values: int) -> None:
        self.max_values = max_values
        self.left = max_values

    def charge(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise JfrError(
                f"the recording holds more than {self.max_values} constant-pool values, array "
                "elements and profile events (the most hotspan reads of one upload)"
            )


class _StringRef(int):
    """A string stored as an id into the chunk's ``java.lang.String`` pool."""


@dataclass(frozen=True)
class Field:
    name: str
    type_id: int
    constant_pool: bool
    array: bool


@dataclass
class TypeInfo:
    id: int
    name: str
    fields: List[Field]

    def index(self, name: str) -> int:
        """Position of field ``name`` in this type's values, or -1."""
        for i, f in enumerate(self.fields):
            if f.name == name:
                return i
        return -1


@dataclass(frozen=True)
class Event:
    type_name: str
    values: Dict[str, Any]  # the requested fields; a constantPool field is its pool id
    chunk: Chunk


# -- primitive readers --------------------------------------------------------------------------
# Each reads from ``buf`` at ``pos`` and returns (value, next position).  Reading past the end
# raises IndexError or struct.error, turned into a JfrError by the caller.


def _varint(buf: bytes, pos: int) -> Tuple[int, int]:
    """Unsigned LEB128, at most 9 bytes (the 9th contributes all 8 bits), as JFR writes it."""
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        if shift == 56:
            return result | (b << 56), pos
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _fixed(fmt: str) -> Callable[[bytes, int], Tuple[Any, int]]:
    s = struct.Struct(fmt)
    size = s.size
    unpack = s.unpack_from

    def read(buf: bytes, pos: int) -> Tuple[Any, int]:
        return unpack(buf, pos)[0], pos + size

    return read


def _byte(buf: bytes, pos: int) -> Tuple[int, int]:
    return buf[pos], pos + 1


def _boolean(buf: bytes, pos: int) -> Tuple[bool, int]:
    return buf[pos] != 0, pos + 1


_FLOAT = _fixed(">f")
_DOUBLE = _fixed(">d")


class _Codec:
    """The integer encoding of one chunk (compressed varints or fixed big-endian)."""

    def __init__(self, compressed: bool) -> None:
        self.compressed = compressed
        self.short: Callable[[bytes, int], Tuple[int, int]]
        self.int: Callable[[bytes, int], Tuple[int, int]]
        self.long: Callable[[bytes, int], Tuple[int, int]]
        if compressed:
            self.short = self.int = self.long = _varint
        else:
            self.short = _fixed(">H")
            self.int = _fixed(">I")
            self.long = _fixed(">Q")

    def string(self, buf: bytes, pos: int) -> Tuple[Union[str, _StringRef, None], int]:
        enc = buf[pos]
        pos += 1
        if enc == 3 or enc == 5:  # UTF-8 / Latin-1 bytes
            n, pos = self.int(buf, pos)
            end = pos + n
            if end > len(buf):
                raise IndexError("string runs past the end")
            raw = buf[pos:end]
            return raw.decode("utf-8" if enc == 3 else "latin-1", "replace"), end
        if enc == 0:
            return None, pos
        if enc == 1:
            return "", pos
        if enc == 2:
            ref, pos = self.long(buf, pos)
            return _StringRef(ref), pos
        if enc == 4:  # UTF-16 code units, one integer each
            n, pos = self.int(buf, pos)
            if n > len(buf) - pos:
                raise IndexError("char array runs past the end")
            units = []
            for _ in range(n):
                c, pos = self.short(buf, pos)
                units.append(c if c <= 0xFFFF else 0xFFFD)
            data = b"".join(u.to_bytes(2, "big") for u in units)
            return data.decode("utf-16-be", "replace"), pos
        raise JfrError(f"unknown string encoding {enc} at offset {pos - 1}")


_PRIMITIVE_SIZE = {"byte": 1, "boolean": 1, "float": 4, "double": 8}
_VARINT_TYPES = ("short", "char", "int", "long")


class _Types:
    """A chunk's metadata: its types, and value readers built from them on demand."""

    def __init__(self, types: Dict[int, TypeInfo], codec: _Codec, budget: _Budget) -> None:
        self.by_id = types
        self.by_name = {t.name: t for t in types.values()}
        self.codec = codec
        self._readers: Dict[int, Callable[[bytes, int], Tuple[Any, int]]] = {}
        self._shape: Dict[int, Tuple[int, int]] = {}  # type id -> (min bytes, reads)
        self._building: set = set()
        self._height: Dict[int, int] = {}
        self._varint_width: Dict[int, int] = {}  # all-varint struct type -> its field count
        self.charge = budget.charge  # pool values and array elements count against it

    def type_named(self, name: str) -> Optional[TypeInfo]:
        return self.by_name.get(name)

    def _primitive(self, name: str) -> Optional[Callable[[bytes, int], Tuple[Any, int]]]:
        codec = self.codec
        if name in _VARINT_TYPES:
            return codec.long if name == "long" else (codec.int if name == "int" else codec.short)
        return {
            "byte": _byte,
            "boolean": _boolean,
            "float": _FLOAT,
            "double": _DOUBLE,
            "java.lang.String": codec.string,
        }.get(name)

    def check(self, type_id: int) -> None:
        """Refuses a type whose values cannot be read in work bounded by their bytes: an
        undeclared type among its fields, a type that contains itself (inline or through an
        array), types nested more than :data:`_MAX_TYPE_DEPTH` deep, or a struct that costs
        far more reads than the bytes it must occupy.  The verdict depends on the types
        alone, not on the order they are met in (the C reader gives the same)."""
        self._check(type_id, 0)

    def _check(self, type_id: int, depth: int) -> int:
        """The type's height (0 for a primitive, 1 + its tallest non-pool field otherwise)."""
        known = self._height.get(type_id)
        if known is not None:
            return known
        t = self._type(type_id)
        if self._primitive(t.name) is not None:
            self._shape[type_id] = (_PRIMITIVE_SIZE.get(t.name, 1), 1)
            self._height[type_id] = 0
            return 0
        if type_id in self._building:
            raise JfrError(f"type {t.name} contains itself")
        if depth >= _MAX_TYPE_DEPTH:
            raise JfrError(f"types nest more than {_MAX_TYPE_DEPTH} deep (type {t.name})")
        self._building.add(type_id)
        height, size, reads = 0, 0, 1
        for f in t.fields:
            if f.constant_pool:
                size, reads = size + 1, reads + 1
                continue
            height = max(height, self._check(f.type_id, depth + 1))
            if f.array:
                size, reads = size + 1, reads + 1
            else:
                fs, fr = self._shape[f.type_id]
                size, reads = size + fs, reads + fr
        self._building.discard(type_id)
        if reads > _MAX_READS_PER_BYTE * (size + 1):
            raise JfrError(f"type {t.name} has too many empty fields")
        self._shape[type_id] = (size, reads)
        self._height[type_id] = height + 1
        return height + 1

    def shape(self, type_id: int) -> Tuple[int, int]:
        """(fewest bytes an inline value occupies, reads it costs), of a checked type."""
        self.check(type_id)
        return self._shape[type_id]

    def _type(self, type_id: int) -> TypeInfo:
        t = self.by_id.get(type_id)
        if t is None:
            raise JfrError(f"reference to undeclared type id {type_id}")
        return t

    def reader(self, type_id: int) -> Callable[[bytes, int], Tuple[Any, int]]:
        """Reads one inline value of the type: a primitive, or a tuple of field values."""
        r = self._readers.get(type_id)
        if r is not None:
            return r
        t = self._type(type_id)
        prim = self._primitive(t.name)
        if prim is not None:
            self._readers[type_id] = prim
            return prim
        self.check(type_id)  # refuses what cannot be read in bounded work before recursing
        field_readers = [self.field_reader(f) for f in t.fields]
        if field_readers and all(fr is _varint for fr in field_readers):
            # Stack frames and most pool entries: only varints, decoded inline (no call per
            # single-byte value), the bulk of a recording's constant pools.
            n = len(field_readers)

            def read_varints(buf: bytes, pos: int) -> Tuple[Any, int]:
                out = []
                for _ in range(n):
                    b = buf[pos]
                    if b < 0x80:
                        out.append(b)
                        pos += 1
                    else:
                        v, pos = _varint(buf, pos)
                        out.append(v)
                return tuple(out), pos

            self._readers[type_id] = read_varints
            self._varint_width[type_id] = n
            return read_varints

        def read_struct(buf: bytes, pos: int) -> Tuple[Any, int]:
            out = []
            for fr in field_readers:
                v, pos = fr(buf, pos)
                out.append(v)
            return tuple(out), pos

        self._readers[type_id] = read_struct
        return read_struct

    def field_reader(self, f: Field) -> Callable[[bytes, int], Tuple[Any, int]]:
        one = self.codec.long if f.constant_pool else self.reader(f.type_id)
        if not f.array:
            return one
        min_size = 1 if f.constant_pool else self.shape(f.type_id)[0]
        count_reader = self.codec.int
        charge = self.charge
        name = f.name
        width = 0 if f.constant_pool else self._varint_width.get(f.type_id, 0)
        if width:
            # An array of all-varint structs (a stack trace's frames): one flat loop over
            # every varint, then cut into tuples at C speed.

            def read_flat(buf: bytes, pos: int) -> Tuple[Any, int]:
                n, pos = count_reader(buf, pos)
                if n * width > len(buf) - pos:
                    raise JfrError(f"array {name!r} of {n} values runs past the end of its chunk")
                charge(n)
                flat: List[int] = []
                append = flat.append
                for _ in range(n * width):
                    b = buf[pos]
                    if b < 0x80:
                        append(b)
                        pos += 1
                    else:
                        v, pos = _varint(buf, pos)
                        append(v)
                return list(zip(*[iter(flat)] * width)), pos

            return read_flat

        def read_array(buf: bytes, pos: int) -> Tuple[Any, int]:
            n, pos = count_reader(buf, pos)
            if n and min_size == 0:
                raise JfrError(f"array {name!r} of a type that occupies no bytes")
            if n * min_size > len(buf) - pos:
                raise JfrError(f"array {name!r} of {n} values runs past the end of its chunk")
            charge(n)
            out = []
            for _ in range(n):
                v, pos = one(buf, pos)
                out.append(v)
            return out, pos

        return read_array

    def event_reader(
        self, t: TypeInfo, wanted: Sequence[str]
    ) -> Callable[[bytes, int], Tuple[Dict[str, Any], int]]:
        """Reads an event's fields up to the last wanted one; returns the wanted ones."""
        self.check(t.id)
        names = set(wanted)
        last = max((i for i, f in enumerate(t.fields) if f.name in names), default=-1)
        steps = [(f.name if f.name in names else None, self.field_reader(f)) for f in t.fields]
        steps = steps[: last + 1]
        empty = dict.fromkeys(wanted)

        def read_event(buf: bytes, pos: int) -> Tuple[Dict[str, Any], int]:
            out = dict(empty)
            for name, fr in steps:
                v, pos = fr(buf, pos)
                if name is not None:
                    out[name] = v
            return out, pos

        return read_event


# -- symbols: Pyroscope merges the names of JVM-generated classes so they aggregate -------------
_SYMBOL_MERGES = (
    # jdk/internal/reflect/GeneratedMethodAccessor31
    (re.compile(r"^(jdk/internal/reflect/GeneratedMethodAccessor)(\d+)$"), r"\1_"),
    # Enclosing$$Lambda$669.0x0000000800fd7318, Fib$$Lambda.0x00007ffa600c4da0, X$$Lambda$4/12
    (re.compile(r"^(.+\$\$Lambda)(\$?\d*[./](0x)?[\da-f]+|\d+)$"), r"\1_"),
    (
        re.compile(r"^(\.?/tmp/)?(libzstd-jni-\d+\.\d+\.\d+-)(\d+)(\.so)( \(deleted\))?$"),
        "libzstd-jni-_.so",
    ),
    (
        re.compile(
            r"^(\.?/tmp/)?(lib)?(amazonCorrettoCryptoProvider)(NativeLibraries\.)?([0-9a-f]{16})"
            r"(/libcrypto|/libamazonCorrettoCryptoProvider)?(\.so)( \(deleted\))?$"
        ),
        "libamazonCorrettoCryptoProvider_.so",
    ),
    (
        re.compile(
            r"^(\.?/tmp/)?(libasyncProfiler)-(linux-arm64|linux-musl-x64|linux-x64|macos)-"
            r"(17b9a1d8156277a98ccc871afa9a8f69215f92)(\.so)( \(deleted\))?$"
        ),
        "libasyncProfiler-_.so",
    ),
    (re.compile(r"^(.+\$\$EnhancerBySpringCGLIB\$\$)(.*)$"), r"\1_"),
)


_MAX_MERGED_SYMBOL = 4096  # longer ones are no generated class; keeps the expressions cheap


def merge_generated_names(symbol: str) -> str:
    """``Foo$$Lambda$12/0x0000000800c01220`` -> ``Foo$$Lambda_`` and the like."""
    if len(symbol) > _MAX_MERGED_SYMBOL or (
        "$$" not in symbol and "GeneratedMethodAccessor" not in symbol and ".so" not in symbol
    ):
        return symbol  # the common case, without running six expressions
    for pattern, repl in _SYMBOL_MERGES:
        symbol = pattern.sub(repl, symbol)
    return symbol


StackFrames = Tuple[Tuple[str, int], ...]  # (``class.method``, line), leaf first


class Chunk:
    """One chunk's metadata and constant pools, and the lookups profiles need."""

    def __init__(self, offset: int, buf: bytes, types: _Types) -> None:
        self.offset = offset
        self.buf = buf
        self.types = types
        self.pools: Dict[int, Dict[int, Any]] = {}
        self._stacks: Dict[int, Optional[StackFrames]] = {}
        self._frame_names: Dict[int, Optional[str]] = {}
        self._symbols: Dict[int, str] = {}
        self._index: Dict[Tuple[str, str], int] = {}

    def _field(self, type_name: str, field: str) -> int:
        key = (type_name, field)
        i = self._index.get(key)
        if i is None:
            t = self.types.type_named(type_name)
            i = self._index[key] = t.index(field) if t is not None else -1
        return i

    def _pool(self, type_name: str) -> Dict[int, Any]:
        t = self.types.type_named(type_name)
        return self.pools.get(t.id, {}) if t is not None else {}

    def _get(self, value: Any, type_name: str, field: str) -> Any:
        i = self._field(type_name, field)
        if i < 0 or not isinstance(value, tuple) or i >= len(value):
            return None
        return value[i]

    def text(self, value: Any) -> Optional[str]:
        """A string field's text (resolving pool references); None when absent."""
        if isinstance(value, _StringRef):
            value = self._pool("java.lang.String").get(int(value))
        return value if isinstance(value, str) else None

    def thread_state(self, ref: Any) -> Optional[str]:
        """The name of a ``jdk.types.ThreadState`` (``STATE_RUNNABLE``...), None if unknown."""
        if not isinstance(ref, int):
            return None
        entry = self._pool("jdk.types.ThreadState").get(ref)
        if entry is None:
            return None
        return self.text(self._get(entry, "jdk.types.ThreadState", "name")) or ""

    def symbol(self, ref: Any) -> str:
        """A ``jdk.types.Symbol``'s text, generated class names merged; "" if unknown."""
        if not isinstance(ref, int):
            return ""
        s = self._symbols.get(ref)
        if s is None:
            entry = self._pool("jdk.types.Symbol").get(ref)
            raw = self.text(self._get(entry, "jdk.types.Symbol", "string")) if entry else None
            s = self._symbols[ref] = merge_generated_names(raw or "")
        return s

    def frame_name(self, method_ref: Any) -> Optional[str]:
        """``class.method`` as Pyroscope names a frame; None if the method or class is unknown."""
        if not isinstance(method_ref, int):
            return None
        if method_ref in self._frame_names:
            return self._frame_names[method_ref]
        name = None
        method = self._pool("jdk.types.Method").get(method_ref)
        if method is not None:
            cls_ref = self._get(method, "jdk.types.Method", "type")
            cls = self._pool("java.lang.Class").get(cls_ref) if isinstance(cls_ref, int) else None
            if cls is not None:
                cls_name = self.symbol(self._get(cls, "java.lang.Class", "name"))
                name = cls_name + "." + self.symbol(self._get(method, "jdk.types.Method", "name"))
        self._frame_names[method_ref] = name
        return name

    def stack(self, ref: Any) -> Optional[StackFrames]:
        """The frames of a ``jdk.types.StackTrace``, leaf first; None if there is no such
        stack.  Frames whose method or class is unknown are left out, as Pyroscope does."""
        if not isinstance(ref, int):
            return None
        if ref in self._stacks:
            return self._stacks[ref]
        out: Optional[StackFrames] = None
        entry = self._pool("jdk.types.StackTrace").get(ref)
        if entry is not None:
            frames = self._get(entry, "jdk.types.StackTrace", "frames")
            if not isinstance(frames, list):
                frames = []
            mi = self._field("jdk.types.StackFrame", "method")
            li = self._field("jdk.types.StackFrame", "lineNumber")
            resolved = []
            names = self._frame_names
            if mi >= 0:
                for frame in frames:
                    if type(frame) is not tuple or len(frame) <= mi:
                        continue
                    method = frame[mi]
                    if not isinstance(method, int):
                        continue  # a float equal to an id is no id, a list no key
                    name = names[method] if method in names else self.frame_name(method)
                    if name is None:
                        continue
                    line = frame[li] if 0 <= li < len(frame) else 0
                    # JFR's line number is an int: -1 (no line) arrives as 2^32 - 1, or from
                    # other writers as the int64's bits; pprof's "unknown" is 0.
                    if type(line) is not int or not 0 <= line <= 0x7FFFFFFF:
                        line = 0
                    resolved.append((name, line))
            out = tuple(resolved)
        self._stacks[ref] = out
        return out


# -- chunk structure ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkHeader:
    size: int
    constant_pool_offset: int
    metadata_offset: int
    start_nanos: int
    duration_nanos: int
    ticks_per_second: int
    compressed_ints: bool


def _header(data: bytes, offset: int) -> ChunkHeader:
    left = len(data) - offset
    if left < HEADER_SIZE:
        raise JfrError(
            f"chunk at offset {offset}: {left} bytes left, a chunk header needs {HEADER_SIZE}"
        )
    if data[offset : offset + 4] != MAGIC:
        what = "not a JFR recording" if offset == 0 else f"chunk at offset {offset}"
        raise JfrError(f"{what}: no 'FLR' magic")
    major, _minor, size, cp, meta, start, duration, _ticks, tps, features = struct.unpack_from(
        ">HHqqqqqqqI", data, offset + 4
    )
    if major != 2:
        raise JfrError(f"chunk at offset {offset}: JFR version {major} is not supported (2.x is)")
    if size < HEADER_SIZE or size > left:
        raise JfrError(
            f"chunk at offset {offset} claims {size} bytes but {left} are left "
            "(truncated recording?)"
        )
    for name, value in (("constant pool", cp), ("metadata", meta)):
        if not HEADER_SIZE <= value < size:
            raise JfrError(f"chunk at offset {offset}: {name} offset {value} is outside the chunk")
    return ChunkHeader(size, cp, meta, start, duration, tps, bool(features & _COMPRESSED_INTS))


def _metadata(buf: bytes, pos: int, codec: _Codec) -> Dict[int, TypeInfo]:
    """The metadata event at ``pos``: its string table and element tree, as types."""
    start = pos
    size, pos = codec.int(buf, pos)
    if size <= 0 or start + size > len(buf):
        raise JfrError(f"metadata event of {size} bytes does not fit its chunk")
    buf = buf[: start + size]  # nothing of it may be read past its end
    kind, pos = codec.long(buf, pos)
    if kind != 0:
        raise JfrError(f"metadata offset points at an event of type {kind}, not 0")
    for _ in range(3):  # start time, duration, metadata id
        _, pos = codec.long(buf, pos)
    n, pos = codec.int(buf, pos)
    if n > len(buf) - pos:
        raise JfrError(f"metadata claims {n} strings, more than its bytes")
    strings: List[str] = []
    for _ in range(n):
        s, pos = codec.string(buf, pos)
        strings.append(s if isinstance(s, str) and not isinstance(s, _StringRef) else "")

    def string(index: int) -> str:
        if index >= len(strings):
            raise JfrError(f"metadata refers to string {index} of {len(strings)}")
        return strings[index]

    types: Dict[int, TypeInfo] = {}

    def element(pos: int, depth: int, parent: Optional[TypeInfo]) -> int:
        if depth > _MAX_ELEMENT_DEPTH:
            raise JfrError("metadata elements nest too deeply")
        name_i, pos = codec.int(buf, pos)
        name = string(name_i)
        count, pos = codec.int(buf, pos)
        if 2 * count > len(buf) - pos:
            raise JfrError("metadata element has more attributes than bytes")
        attrs: Dict[str, str] = {}
        for _ in range(count):
            k, pos = codec.int(buf, pos)
            v, pos = codec.int(buf, pos)
            attrs[string(k)] = string(v)
        children, pos = codec.int(buf, pos)
        if 3 * children > len(buf) - pos:
            raise JfrError("metadata element has more children than bytes")
        current = None
        if name == "class" and depth == 2:
            current = TypeInfo(_int_attr(attrs, "id"), attrs.get("name", ""), [])
            if not current.name:
                raise JfrError("metadata class without a name")
            types[current.id] = current
        elif name == "field" and parent is not None:
            dim = attrs.get("dimension", "")
            if dim not in ("", "0", "1"):
                raise JfrError(f"field {attrs.get('name')!r}: {dim}-dimensional arrays")
            parent.fields.append(
                Field(
                    attrs.get("name", ""),
                    _int_attr(attrs, "class"),
                    attrs.get("constantPool") == "true",
                    dim == "1",
                )
            )
        for _ in range(children):
            pos = element(pos, depth + 1, current)
        return pos

    element(pos, 0, None)
    return types


def _int_attr(attrs: Mapping[str, str], key: str) -> int:
    """A type id: decimal ASCII digits below 2^64 (ids are written so), nothing else."""
    value = attrs.get(key, "")
    if not (value.isascii() and value.isdigit() and len(value) <= 20 and int(value) < 1 << 64):
        raise JfrError(f"metadata element lacks a numeric {key!r}: {dict(attrs)!r}")
    return int(value)


def _constant_pools(chunk: Chunk, first: int, codec: _Codec) -> None:
    """Every constant-pool event of the chunk, following the chain from ``first``."""
    buf = chunk.buf
    types = chunk.types
    seen = set()
    pos = first
    # Pool events are distinct events of the chunk, so their sizes add up to less than it.
    # Checked because a chain may lead into the middle of an event already read: pools nested
    # in pools would have each byte decoded once per pool around it (quadratic work).
    total = 0
    while True:
        if pos in seen:
            raise JfrError(f"constant pools chain back to offset {pos}")
        seen.add(pos)
        if not HEADER_SIZE <= pos < len(buf):
            raise JfrError(f"constant pool offset {pos} is outside the chunk")
        here = pos
        size, pos = codec.int(buf, pos)
        if size <= 0 or here + size > len(buf):
            raise JfrError(f"constant pool event at {here} of {size} bytes does not fit its chunk")
        total += size
        if total > len(buf) - HEADER_SIZE:
            raise JfrError(f"constant pool event at {here} overlaps another pool event")
        end = here + size  # checked, not sliced: a chunk may hold many pools
        kind, pos = codec.long(buf, pos)
        if kind != 1:
            raise JfrError(f"constant pool offset {here} points at an event of type {kind}")
        _, pos = codec.long(buf, pos)  # start time
        _, pos = codec.long(buf, pos)  # duration
        delta, pos = codec.long(buf, pos)
        if delta >= 1 << 63:
            delta -= 1 << 64
        pos += 1  # flush flag
        pools, pos = codec.int(buf, pos)
        for _ in range(pools):
            type_id, pos = codec.long(buf, pos)
            read = types.reader(type_id)
            min_size = types.shape(type_id)[0]
            count, pos = codec.int(buf, pos)
            if count * (1 + min_size) > end - pos:
                raise JfrError(f"constant pool of {count} values runs past its event at {here}")
            types.charge(count)
            pool = chunk.pools.setdefault(type_id, {})
            for _ in range(count):
                key, pos = codec.long(buf, pos)
                pool[key], pos = read(buf, pos)
            if pos > end:
                raise JfrError(f"constant pool event at {here} overruns its size {size}")
        if delta == 0:
            return
        pos = here + delta


class Recording:
    """A JFR recording: iterate :meth:`events` for the profile events of every chunk."""

    def __init__(self, data: bytes, max_values: int = MAX_VALUES) -> None:
        """``max_values``: constant-pool values, array elements and profile events the
        recording may hold (each :meth:`events` call counts afresh)."""
        if data[:4] != MAGIC:
            raise JfrError("not a JFR recording: no 'FLR' magic at the start")
        if len(data) < HEADER_SIZE:
            raise JfrError(
                f"a truncated JFR recording: {len(data)} bytes, shorter than a chunk's header"
            )
        self.data = data
        self.max_values = max_values

    def events(self, wanted: Mapping[str, Sequence[str]] = PROFILE_EVENTS) -> Iterator[Event]:
        offset = 0
        data = self.data
        budget = _Budget(self.max_values)
        while offset < len(data):
            header = _header(data, offset)
            try:
                yield from self._chunk_events(offset, header, wanted, budget)
            except (IndexError, struct.error):
                raise JfrError(
                    f"chunk at offset {offset}: a value runs past the end of its chunk "
                    "(truncated or corrupt recording)"
                ) from None
            except RecursionError:
                raise JfrError(f"chunk at offset {offset}: types nest too deeply") from None
            offset += header.size

    def _chunk_events(
        self,
        offset: int,
        header: ChunkHeader,
        wanted: Mapping[str, Sequence[str]],
        budget: _Budget,
    ) -> Iterator[Event]:
        buf = self.data[offset : offset + header.size]
        codec = _Codec(header.compressed_ints)
        types = _Types(_metadata(buf, header.metadata_offset, codec), codec, budget)
        chunk = Chunk(offset, buf, types)
        _constant_pools(chunk, header.constant_pool_offset, codec)
        readers = {}
        for type_name, fields in wanted.items():
            t = types.type_named(type_name)
            if t is not None:
                readers[t.id] = (type_name, types.event_reader(t, fields))
        read_int, read_long = codec.int, codec.long
        charge = budget.charge
        end = len(buf)
        pos = HEADER_SIZE
        while pos < end:
            start = pos
            size, pos = read_int(buf, pos)
            if size <= 0 or start + size > end:
                raise JfrError(
                    f"event at offset {offset + start} of {size} bytes does not fit its chunk"
                )
            kind, pos = read_long(buf, pos)
            reader = readers.get(kind)
            if reader is not None:
                values, read_to = reader[1](buf, pos)
                if read_to > start + size:
                    raise JfrError(f"event at offset {offset + start} overruns its size {size}")
                charge(1)  # each may become a sample of its own (a context or span of its own)
                yield Event(reader[0], values, chunk)
            pos = start + size
