"""TraceQL's vocabulary: the intrinsics hotspan computes, by every name TraceQL gives them,
and the attribute scopes it searches; ``attribute`` and ``intrinsic`` make the tree's node for
a name as the lexer and the parser read it, refusing the ones hotspan does not keep.
"""

from __future__ import annotations

import re

from hotspan.query.engine import QueryError
from hotspan.query.traceql import ast

# Intrinsics hotspan computes, by every name TraceQL gives them -> the canonical name.
INTRINSICS = {
    "name": "name",
    "span:name": "name",
    "status": "status",
    "span:status": "status",
    "kind": "kind",
    "span:kind": "kind",
    "duration": "duration",
    "span:duration": "duration",
    "childCount": "childCount",
    "span:childCount": "childCount",
    "span:id": "span:id",
    "span:parentID": "span:parentID",
    "trace:id": "trace:id",
    "traceDuration": "traceDuration",
    "trace:duration": "traceDuration",
    "rootName": "rootName",
    "trace:rootName": "rootName",
    "rootServiceName": "rootServiceName",
    "trace:rootService": "rootServiceName",
    # Tempo's nested set numbering of a trace (see trace_view.nested_set): the parent of a
    # root is -1, of a span cut off from the roots 0.
    "nestedSetParent": "nestedSetParent",
    "nestedSetLeft": "nestedSetLeft",
    "nestedSetRight": "nestedSetRight",
}
# Intrinsics of what hotspan keeps only in the stored OTLP span (status message, events,
# links) and its span group (instrumentation scope): search reads them there
# (fields.RAW_ONLY); metrics and autocomplete, which read the span index only, see nil.
UNSEARCHED = (
    "statusMessage", "event:name", "event:timeSinceStart", "link:spanID", "link:traceID",
    "instrumentation:name", "instrumentation:version",
)  # fmt: skip
INTRINSICS.update({name: name for name in UNSEARCHED})
INTRINSICS["span:statusMessage"] = "statusMessage"
# Attribute scopes of the same: event.x, link.x, instrumentation.x.
UNSEARCHED_SCOPES = ("event", "link", "instrumentation")
KNOWN_ELSEWHERE = {"parent"}
# The intrinsics that are numbers (durations, counts, positions): what avg(), sum() and the
# *_over_time functions can read; the others are strings, ids or codes.
NUMERIC_INTRINSICS = frozenset(
    (
        "duration",
        "childCount",
        "traceDuration",
        "nestedSetParent",
        "nestedSetLeft",
        "nestedSetRight",
        "event:timeSinceStart",
    )
)
_ATTRIBUTE_QUOTE = re.compile(r"[\s{}()=~!<>&|^,\"]")


def attribute(prefix: str, name: str, pos: int) -> ast.Attribute:
    scope = prefix[:-1]
    if scope not in ("span", "resource", "", *UNSEARCHED_SCOPES):
        raise QueryError(
            f"TraceQL: {scope}. attributes (column {pos + 1}) are not searchable in hotspan; "
            "use span., resource. or ."
        )
    shown = name
    if _ATTRIBUTE_QUOTE.search(name):
        shown = '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return ast.Attribute(f"{scope}.{shown}" if scope else f".{shown}", scope, name)


def intrinsic(raw: str, pos: int) -> ast.Attribute:
    canonical = INTRINSICS.get(raw)
    if canonical is None:
        if raw in KNOWN_ELSEWHERE:
            raise QueryError(
                f"TraceQL: {raw} (column {pos + 1}) is not kept by hotspan's span index"
            )
        raise QueryError(f"TraceQL: unknown intrinsic {raw!r} at column {pos + 1}")
    return ast.Attribute(raw, "intrinsic", canonical)


# The type of each intrinsic's values, for refusing what can never be true
# (parser._check_types, validate).
INTRINSIC_TYPES = {
    "name": "string",
    "rootName": "string",
    "rootServiceName": "string",
    "span:id": "string",
    "span:parentID": "string",
    "trace:id": "string",
    "status": "status",
    "kind": "kind",
    "duration": "duration",
    "traceDuration": "duration",
    "childCount": "number",
    "statusMessage": "string",
    "event:name": "string",
    "event:timeSinceStart": "duration",
    "link:spanID": "string",
    "link:traceID": "string",
    "instrumentation:name": "string",
    "instrumentation:version": "string",
    "nestedSetParent": "number",
    "nestedSetLeft": "number",
    "nestedSetRight": "number",
}
