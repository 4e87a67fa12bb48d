"""The standalone HTML flame graph: one file that opens from file:// with no server.

It is the page the UI's export makes (``static/js/export.js``): the same template
(``static/standalone.html``), the same inlined ``format.js``, ``flametree.js``, ``search.js``
and ``flamegraph.js`` with their import/export lines stripped the same way, and the same embedded
data, the protojson ``FlameGraph``/``FlameGraphDiff`` the querier answers, which the page's
``decodeFlamegraph`` reads.
"""

from __future__ import annotations

import datetime
import html
import json
import re
from pathlib import Path
from typing import List, Tuple

import numpy as np
from google.protobuf import json_format

from hotspan.formats.errors import FormatError
from hotspan.formats.proto import querier_pb2
from hotspan.model.profile import Frame
from hotspan.model.stack_profile import SampleType, StackProfile
from hotspan.query import flamegraph

STATIC_DIR = Path(__file__).parent / "static"
INLINED_SCRIPTS = ("format.js", "flametree.js", "search.js", "flamegraph.js")

# The same expressions as stripModule in export.js.
_IMPORT = re.compile(r"""^\s*import\s[^;]*?from\s*["'][^"']+["'];?[ \t]*$""", re.M)
_EXPORT = re.compile(r"^export\s+(?=(async\s+)?(function|class|const|let|var)\b)", re.M)
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def strip_module(source: str) -> str:
    """A module's source as classic script text: no import statements, no export keywords."""
    return _EXPORT.sub("", _IMPORT.sub("", source))


def _json(msg) -> dict:
    return json_format.MessageToDict(msg, preserving_proto_field_name=False)


def flamegraph_data(profile: StackProfile, position: int = 0, max_nodes: int = 8192) -> dict:
    """One sample type of ``profile`` as the querier's protojson ``FlameGraph``."""
    graph = flamegraph.of_profile(profile, position, max_nodes)
    msg = querier_pb2.FlameGraph()
    flamegraph.to_message(graph, msg)
    return _json(msg)


def diff_flamegraph_data(
    baseline: StackProfile,
    baseline_position: int,
    comparison: StackProfile,
    comparison_position: int,
    max_nodes: int = 8192,
) -> dict:
    """Two profiles as the querier's protojson ``FlameGraphDiff`` (as ``Diff`` answers)."""
    pairs = flamegraph.profile_stacks(baseline, baseline_position)
    stacks = [(names, [value, 0]) for names, value in pairs]
    pairs = flamegraph.profile_stacks(comparison, comparison_position)
    stacks += [(names, [0, value]) for names, value in pairs]
    matrix, lengths, values, names = flamegraph.stack_matrix(stacks)
    if not stacks:
        values = np.zeros((0, 2), dtype=np.int64)
    graph = flamegraph.build(matrix, lengths, values, names, max_nodes)
    msg = querier_pb2.FlameGraphDiff()
    flamegraph.to_message(graph, msg)
    return _json(msg)


def _static(path: str) -> str:
    return (STATIC_DIR / path).read_text(encoding="utf-8")


def standalone_html(data: dict, *, title: str, unit: str, inverted: bool = False) -> str:
    """The page for ``data`` (a protojson ``FlameGraph`` or ``FlameGraphDiff``); ``unit`` is
    the sample unit ("nanoseconds", "bytes", "count") the page formats values in."""
    code = "\n".join(
        f"// --- {name}\n{strip_module(_static('js/' + name))}" for name in INLINED_SCRIPTS
    )
    doc = json.dumps(
        {"unit": unit, "inverted": bool(inverted), "flamegraph": data},
        ensure_ascii=False,
        separators=(",", ":"),
    )
    exported = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
    values = {
        "title": html.escape(title, quote=True),
        "exported": html.escape(exported.replace("+00:00", "Z")),
        "css": _static("css/flamegraph.css"),
        # "<" only occurs inside JSON strings, where \u003c is the same character.
        "data": doc.replace("<", "\\u003c"),
        # "</script" would end the element early; "<\/" means the same to JavaScript.
        "scripts": re.sub(r"</(script)", r"<\\/\1", code, flags=re.I),
    }
    return _PLACEHOLDER.sub(
        lambda m: values.get(m.group(1), m.group(0)), _static("standalone.html")
    )


def embedded_data(page: str) -> dict:
    """The ``{unit, inverted, flamegraph}`` object a standalone page carries (ValueError when
    ``page`` is not one)."""
    match = re.search(r'<script type="application/json" id="hs-data">(.*?)</script>', page, re.S)
    if not match:
        raise ValueError("no hotspan flame graph data in the page")
    doc = json.loads(match.group(1))
    if not isinstance(doc, dict) or not isinstance(doc.get("flamegraph"), dict):
        raise ValueError("the page's data has no flame graph")
    return doc


def page_profile(data: bytes) -> StackProfile:
    """The flame graph a standalone page carries, back as stacks (diff pages: the comparison
    side).  Node names are all it keeps, and nodes folded into "other" stay "other"."""
    try:
        doc = embedded_data(data.decode("utf-8", "replace"))
    except ValueError as exc:
        raise FormatError(
            f"HTML is an output format; only pages hotspan wrote can be read back ({exc})"
        ) from None
    unit = str(doc.get("unit") or "count")
    st = {
        "nanoseconds": SampleType("cpu", unit),
        "bytes": SampleType("space", unit),
    }.get(unit, SampleType("samples", unit))
    profile = StackProfile([st])
    for stack, value in _flamegraph_stacks(doc["flamegraph"]):
        profile.add([Frame(n) for n in stack], [value])
    return profile


def _flamegraph_stacks(fg: dict) -> List[Tuple[List[str], int]]:
    """Pyroscope's level encoding back to (root-first names, self value) pairs."""
    names = [str(n) for n in fg.get("names", [])]
    levels = [[int(v) for v in (lv or {}).get("values", [])] for lv in fg.get("levels", [])]
    diff = "leftTicks" in fg or "rightTicks" in fg
    stride = 7 if diff else 4
    out: List[Tuple[List[str], int]] = []
    previous: List[Tuple[int, int, List[str]]] = []  # (x, total, path) of the level above
    try:
        for depth, values in enumerate(levels):
            current: List[Tuple[int, int, List[str]]] = []
            end = 0
            p = 0
            for i in range(0, len(values) - stride + 1, stride):
                if diff:  # the comparison side: right x delta, total, self
                    x, total, self_value = end + values[i + 3], values[i + 4], values[i + 5]
                else:
                    x, total, self_value = end + values[i], values[i + 1], values[i + 2]
                end = x + total
                name = names[values[i + stride - 1]]
                if depth == 0:
                    path: List[str] = []
                else:
                    while p < len(previous) - 1 and previous[p][0] + previous[p][1] <= x:
                        p += 1
                    path = previous[p][2] + [name]
                current.append((x, total, path))
                if path and self_value:
                    out.append((path, self_value))
            previous = current
    except (IndexError, ValueError, TypeError) as exc:
        raise FormatError(f"malformed flame graph levels: {exc!r}") from None
    return out
