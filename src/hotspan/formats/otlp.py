"""What OTLP traces and OTLP profiles share: decoding a request body, attribute values.

OTLP/HTTP bodies are protobuf or JSON.  OTLP's JSON is protobuf's JSON mapping with one
difference: trace and span ids are hex, not base64 (opentelemetry.io/docs/specs/otlp/#json-
protobuf-encoding), so ids are rewritten before the generic parser sees them.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, List, Tuple, Type, TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from hotspan.formats.errors import FormatError
from hotspan.model.profile import MAX_TIME_NS

M = TypeVar("M", bound=Message)

# Keys whose JSON value is an id in hex (OTLP) rather than base64 (protobuf's JSON).
_ID_KEYS = frozenset(
    {"traceId", "spanId", "parentSpanId", "profileId"}
    | {"trace_id", "span_id", "parent_span_id", "profile_id"}
)
_HEX = frozenset("0123456789abcdefABCDEF")

# Containers one request may hold: past these a request is refused whole (413), because every
# one of them costs Python work even when empty.
MAX_RESOURCES = 10_000
MAX_SCOPES = 10_000
MAX_ITEMS = 200_000  # spans, or profile samples


class TooLarge(FormatError):
    """A request with more in it than one request may hold."""


def check_count(count: int, limit: int, what: str) -> None:
    if count > limit:
        raise TooLarge(f"{count} {what} in one request; at most {limit} (split the batch)")


# Earliest accepted span or sample time: anything before 2000 is a clock or encoding bug.
MIN_TIME_NS = 946_684_800 * 10**9


# Reasons kept per request: enough to see what is wrong without echoing a whole batch back.
MAX_REASONS = 3


@dataclass
class Rejections:
    """Items of a request refused on their own (OTLP's partial success), with a few reasons."""

    count: int = 0
    reasons: List[str] = field(default_factory=list)

    def add(self, reason: str) -> None:
        self.count += 1
        if len(self.reasons) < MAX_REASONS:
            self.reasons.append(reason)

    def message(self) -> str:
        more = self.count - len(self.reasons)
        return "; ".join(self.reasons) + (f" (and {more} more)" if more > 0 else "")


def decode_request(body: bytes, is_json: bool, cls: Type[M]) -> M:
    """An OTLP export request from an OTLP/HTTP body (already decompressed)."""
    msg = cls()
    if is_json:
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise FormatError(f"body is not JSON: {exc}") from None
        except RecursionError:
            raise FormatError("body is JSON nested too deeply") from None
        if not isinstance(doc, dict):
            raise FormatError("body must be a JSON object")
        try:
            _hex_ids_to_base64(doc)
            json_format.ParseDict(doc, msg, ignore_unknown_fields=True)
        except (json_format.ParseError, ValueError, TypeError) as exc:
            raise FormatError(f"not an OTLP {cls.DESCRIPTOR.name}: {exc}") from None
        except RecursionError:
            raise FormatError(f"not an OTLP {cls.DESCRIPTOR.name}: nested too deeply") from None
        return msg
    try:
        msg.ParseFromString(body)
    except (DecodeError, ValueError) as exc:
        raise FormatError(f"cannot decode protobuf {cls.DESCRIPTOR.name}: {exc}") from None
    return msg


def encode_json(msg: Message) -> dict:
    """A message as OTLP JSON: camelCase names, enums as numbers, ids in hex."""
    doc = json_format.MessageToDict(msg, use_integers_for_enums=True)
    return _base64_ids_to_hex(doc)


def _hex_ids_to_base64(doc: Any) -> None:
    """Rewrite hex ids as base64, in place (iteratively: the nesting is the client's)."""
    todo = [doc]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _ID_KEYS and isinstance(value, str) and value and set(value) <= _HEX:
                    if len(value) % 2:
                        raise FormatError(f"{key} {value!r} has an odd number of hex digits")
                    node[key] = base64.b64encode(bytes.fromhex(value)).decode()
                elif isinstance(value, (dict, list)):
                    todo.append(value)
        elif isinstance(node, list):
            todo.extend(v for v in node if isinstance(v, (dict, list)))


def _base64_ids_to_hex(node: Any) -> Any:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _base64_ids_to_hex(value)
    elif isinstance(node, list):
        for v in node:
            _base64_ids_to_hex(v)
    return node


# An array or kvlist value's text, at most: each level of nesting escapes the quotes and
# backslashes of the level below, so that a few bytes nested 30 deep would write terabytes.
MAX_VALUE_TEXT = 1 << 20


def any_value_text(value: Any) -> str:
    """An ``AnyValue`` as text: what search matches and label values hold."""
    kind = value.WhichOneof("value")
    if kind is None:
        return ""
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind == "int_value":
        return str(value.int_value)
    if kind == "double_value":
        d = value.double_value
        return str(int(d)) if math.isfinite(d) and d == int(d) else repr(d)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    if kind == "array_value":
        text = json.dumps([any_value_text(v) for v in value.array_value.values])
    else:
        text = json.dumps({kv.key: any_value_text(kv.value) for kv in value.kvlist_value.values})
    if len(text) > MAX_VALUE_TEXT:
        raise FormatError(f"an attribute value is over {MAX_VALUE_TEXT} characters as text")
    return text


def label_value(value: Any) -> str:
    """An ``AnyValue`` as a label value, by Pyroscope's rule: strings and integers (also as a
    one-element array); anything else is not a label ("")."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "int_value":
        return str(value.int_value)
    if kind == "array_value" and len(value.array_value.values) == 1:
        return label_value(value.array_value.values[0])
    return ""


_VALUE_TYPES = {"int_value": "int", "double_value": "float", "bool_value": "bool"}


class ArrayBudget:
    """What the array attributes of one request may write: one record per element, each
    repeating the key, could turn a small request into gigabytes of flattened text and index
    rows (a long key, many empty elements).  At most MAX_VALUE_TEXT characters for one array,
    and twice the request's size (plus MAX_VALUE_TEXT) for all of them; past that the request
    is refused."""

    def __init__(self, request_bytes: int) -> None:
        self.left = MAX_VALUE_TEXT + 2 * request_bytes

    def take(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise FormatError("the request's array attributes are too large as text")


def attribute_pairs(attributes: Iterable[Any], budget: ArrayBudget) -> List[Tuple[str, str, str]]:
    """(key, value as text, TraceQL type: string, int, float or bool) of each attribute; an
    array's elements each as an attribute of its key (see :func:`add_array_pairs`)."""
    out: List[Tuple[str, str, str]] = []
    for kv in attributes:
        kind = kv.value.WhichOneof("value")
        if kind == "array_value":
            add_array_pairs(out, kv.key, kv.value.array_value, budget)
        else:
            out.append((kv.key, any_value_text(kv.value), _VALUE_TYPES.get(kind, "string")))
    return out


def add_array_pairs(
    out: List[Tuple[str, str, str]], key: str, array: Any, budget: ArrayBudget
) -> None:
    """An array attribute's elements, each as ``(key, text, type)``: TraceQL compares an
    array element by element (``=`` holds when one element is equal, ``!=`` when none is), and
    search finds a value of ``http.request.header.accept`` as it finds a plain one.  An element
    that is itself an array or a map is its JSON text; an empty array adds nothing.  The
    records (key and text of each element) count against ``budget``."""
    size = 0
    for element in array.values:
        kind = element.WhichOneof("value")
        text = any_value_text(element)
        record = len(key) + len(text) + 2
        size += record
        if size > MAX_VALUE_TEXT:
            raise FormatError(f"an array attribute is over {MAX_VALUE_TEXT} characters as text")
        budget.take(record)
        out.append((key, text, _VALUE_TYPES.get(kind, "string")))


def check_time(ns: int, what: str) -> None:
    if ns < MIN_TIME_NS or ns >= MAX_TIME_NS:  # as everywhere: times end before MAX_TIME_NS
        raise FormatError(f"{what} {ns} ns is not a time between the years 2000 and 2116")
