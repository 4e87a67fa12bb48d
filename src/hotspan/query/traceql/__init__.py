"""TraceQL, Tempo's query language, and its legacy ``tags`` search: what the rest of hotspan
imports of it.

``parse_query`` reads any query hotspan runs (spanset filters with every operator, ``&&`` and
``||`` between spansets, structural operators, pipelines, a metrics function at the end, and
hints) into a :class:`Query`: its syntax tree with the compiled plan, the conditions every
span it starts from meets (``pushdown``, for ``store.span_records``), and ``simple`` when it
is only conjunctive spanset filters, which ``parse_traceql`` turns into one SQL search
(``store.find_traces``).  ``evaluate`` runs a query on one trace's spans; ``run_metrics``
answers a metrics query from a store (``run_metrics_expression`` also arithmetic between
them, ``metrics_math``); ``narrowing_conditions``, ``tag_names`` and
``tag_values`` serve the tag autocomplete.  ``legacy_query``/``parse_logfmt`` read Tempo's
tags search and ``parse_duration`` Go's durations, as Tempo reads them.

Inside, each stage is a module: ``lexer`` and ``parser`` read the text into the tree of
``ast`` (``names`` holds the vocabulary both use), ``plan`` checks and plans it (with
``conditions``, what a field expression is as a store condition), ``search`` reads the
conjunctive form, ``trace_view``, ``fields`` and ``pipeline`` evaluate it on a trace, and
``series``, ``candidates``, ``metrics`` and ``metrics_compare`` run metrics queries.
"""

from __future__ import annotations

from hotspan.query.traceql.ast import (
    Attribute,
    Binary,
    Duration,
    Kind,
    Nil,
    Static,
    Status,
    Text,
    go_duration,
)
from hotspan.query.traceql.autocomplete import narrowing_conditions, tag_names, tag_values
from hotspan.query.traceql.fields import (
    compare,
    compile_field,
    in_selection,
    matches,
    plain,
    span_value,
)
from hotspan.query.traceql.lexer import parse_duration
from hotspan.query.traceql.metrics import run_metrics
from hotspan.query.traceql.metrics_math import parse_metrics_expression, run_metrics_expression
from hotspan.query.traceql.parser import MetricsStage
from hotspan.query.traceql.pipeline import Spanset, evaluate
from hotspan.query.traceql.plan import Query, parse_query
from hotspan.query.traceql.search import legacy_query, parse_logfmt, parse_traceql
from hotspan.query.traceql.series import (
    MAX_EXEMPLARS,
    MAX_INTERVALS,
    MAX_SERIES,
    Labels,
    LabelValue,
    MetricsRequest,
    MetricsResult,
    default_step,
)
from hotspan.query.traceql.trace_view import nested_set

__all__ = [
    "MAX_EXEMPLARS",
    "MAX_INTERVALS",
    "MAX_SERIES",
    "Attribute",
    "Binary",
    "Duration",
    "Kind",
    "LabelValue",
    "Labels",
    "MetricsRequest",
    "MetricsResult",
    "MetricsStage",
    "Nil",
    "Query",
    "Spanset",
    "Static",
    "Status",
    "Text",
    "compare",
    "compile_field",
    "default_step",
    "evaluate",
    "go_duration",
    "in_selection",
    "legacy_query",
    "matches",
    "narrowing_conditions",
    "nested_set",
    "parse_duration",
    "parse_logfmt",
    "parse_metrics_expression",
    "parse_query",
    "parse_traceql",
    "plain",
    "run_metrics",
    "run_metrics_expression",
    "span_value",
    "tag_names",
    "tag_values",
]
