"""Recording rules, as Grafana Pyroscope has them (``settings.v1.RecordingRule``).

A rule names a metric and picks series with matchers (label selectors, all of which must
match, one of them an equality on ``__profile_type__``); the values of the samples those
series receive are summed per value of the ``groupBy`` labels, optionally only over the
stacks that contain a function whose name matches ``functionName`` (a regular expression,
anchored at both ends; the Connect form's ``stacktraceFilter.functionName`` is an exact name,
as in Pyroscope, kept as the pattern that matches it).  The sums are
exported on ``/metrics`` with the rule's ``externalLabels``, ``profiles_rule_id`` and
``tenant``.

Two JSON spellings are read and written: hotspan's REST form (``externalLabels`` an object,
``functionName`` a string, ``profileType`` optional) and Pyroscope's Connect form
(``externalLabels`` a list of ``{name, value}``, ``stacktraceFilter.functionName``), which
protojson also accepts in snake_case.  The store keeps the REST form as the document body.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from hotspan.model.labels import (
    METRIC_NAME,
    PROFILE_TYPE,
    Matcher,
    Selector,
    SelectorError,
    parse_selector,
)
from hotspan.model.profile import ProfileType, ProfileTypeError

KIND = "recording_rule"
CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
# Pyroscope's namespace for recorded metrics: no rule can shadow another exporter's series
# (hotspan's own are hotspan_*), and rules written for Pyroscope keep their names.
METRIC_PREFIX = "profiles_recorded_"
RULE_ID_LABEL = "profiles_rule_id"
TENANT_LABEL = "tenant"
# Labels every recorded series carries; a rule may not set or group by them.
RESERVED_LABELS = frozenset({METRIC_NAME, RULE_ID_LABEL, TENANT_LABEL})
MAX_RULES_PER_TENANT = 200
MAX_MATCHERS = 20
MAX_GROUP_BY = 10
MAX_EXTERNAL_LABELS = 20
MAX_TEXT_CHARS = 1000
# functionName is matched (RE2, linear time) against every new frame name of the tenant.
MAX_PATTERN_CHARS = 500
MAX_GENERATION = 2**63 - 1  # int64, as protojson carries it
# Suffixes OpenMetrics gives a meaning (a histogram's _bucket, a counter's _created...): a
# family with such a name, or whose samples end so, does not parse.
RESERVED_SUFFIXES = ("_created", "_bucket", "_count", "_sum", "_info", "_total")
# The server's own families; a recorded family may not take or shadow one.
RESERVED_PREFIXES = ("hotspan_",)

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# Prometheus label names: no dots (hotspan's series labels may have them, /metrics may not).
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_DIGITS = re.compile(r"[0-9]{1,19}")

REST_FIELDS = (
    "id",
    "metricName",
    "profileType",
    "selector",
    "matchers",
    "groupBy",
    "externalLabels",
    "functionName",
    "generation",
)


class RuleError(ValueError):
    """A rule that cannot be kept: the message names the field and the problem."""


@dataclass(frozen=True)
class RecordingRule:
    id: str
    metric_name: str
    profile_type: ProfileType
    # Selectors as given; a __profile_type__ matcher among them, if any, equals profile_type.
    matchers: Tuple[str, ...]
    group_by: Tuple[str, ...] = ()
    external_labels: Tuple[Tuple[str, str], ...] = ()
    function_name: str = ""  # "": every stack counts
    generation: int = 1

    def definition(self) -> Tuple[Any, ...]:
        """What decides the rule's values: a rule whose definition changed starts over."""
        return (
            self.metric_name,
            self.profile_type,
            self.matchers,
            self.group_by,
            self.external_labels,
            self.function_name,
        )

    def selectors(self) -> List[Selector]:
        return [parse_selector(m) for m in self.matchers]

    def function_matcher(self) -> Optional[Matcher]:
        return Matcher("function", "=~", self.function_name) if self.function_name else None

    def with_generation(self, generation: int) -> RecordingRule:
        return replace(self, generation=generation)

    # -- JSON ----------------------------------------------------------------------------------

    def to_json(self) -> Dict[str, Any]:
        """hotspan's REST form, also the stored document body."""
        return {
            "id": self.id,
            "metricName": self.metric_name,
            "profileType": self.profile_type.id,
            "matchers": list(self.matchers),
            "groupBy": list(self.group_by),
            "externalLabels": dict(self.external_labels),
            "functionName": self.function_name,
            "generation": self.generation,
        }

    def to_connect(self) -> Dict[str, Any]:
        """Pyroscope's ``settings.v1.RecordingRule`` in protojson (int64 as a string, default
        values left out)."""
        matchers = list(self.matchers)
        if not any(_profile_type_matchers(parse_selector(m)) for m in matchers):
            # Pyroscope's clients read the profile type from the matchers.
            matchers.insert(0, f'{{{PROFILE_TYPE}="{self.profile_type.id}"}}')
        out: Dict[str, Any] = {
            "id": self.id,
            "metricName": self.metric_name,
            "profileType": self.profile_type.id,
            "matchers": matchers,
            "generation": str(self.generation),
        }
        if self.group_by:
            out["groupBy"] = list(self.group_by)
        if self.external_labels:
            out["externalLabels"] = [{"name": k, "value": v} for k, v in self.external_labels]
        if self.function_name:
            name = literal_of(self.function_name)
            out["stacktraceFilter"] = {"functionName": {"functionName": name}}
        return out


def literal_of(pattern: str) -> str:
    """The name a pattern matches exactly, where it is one escaped (as the Connect form's
    exact names are kept), else the pattern itself."""
    name = re.sub(r"\\(.)", r"\1", pattern, flags=re.S)
    return name if re.escape(name) == pattern else pattern


def _profile_type_matchers(selector: Selector) -> List[Matcher]:
    return [m for m in selector.matchers if m.name == PROFILE_TYPE]


def _field(body: Mapping[str, Any], *names: str) -> Any:
    """The value of the first of ``names`` present (protojson takes camelCase and the proto
    field name alike)."""
    for name in names:
        if name in body:
            return body[name]
    return None


def _string(value: Any, what: str, default: str = "") -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise RuleError(f"{what} must be a string, not {type(value).__name__}")
    if len(value) > MAX_TEXT_CHARS:
        raise RuleError(f"{what} is longer than {MAX_TEXT_CHARS} characters")
    return value.strip()


def _strings(value: Any, what: str, limit: int) -> List[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RuleError(f"{what} must be a list of strings")
    if len(value) > limit:
        raise RuleError(f"{what} has {len(value)} entries; at most {limit} are allowed")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise RuleError(f"{what}[{i}] must be a string, not {type(item).__name__}")
        text = _string(item, f"{what}[{i}]")
        if not text:
            raise RuleError(f"{what}[{i}] is empty")
        out.append(text)
    return out


def _generation(value: Any) -> int:
    if value is None or value == "":
        return 0
    # An integer, or its digits (protojson writes int64 as a string); not a float, which
    # JSON may spell 1e400 (infinity) or 1.5.
    if isinstance(value, int) and not isinstance(value, bool):
        generation = value
    elif isinstance(value, str) and _DIGITS.fullmatch(value):
        generation = int(value)
    else:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise RuleError(f"generation must be a non-negative integer, not {shown}")
    if not 0 <= generation <= MAX_GENERATION:
        raise RuleError(f"generation must be between 0 and {MAX_GENERATION}")
    return generation


def _label_pairs(value: Any) -> List[Tuple[str, str]]:
    """externalLabels as an object (REST) or a list of {name, value} (Connect)."""
    if value is None:
        return []
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, list):
        items = []
        for i, pair in enumerate(value):
            if not isinstance(pair, Mapping) or "name" not in pair:
                raise RuleError(f'externalLabels[{i}] must be {{"name": ..., "value": ...}}')
            items.append((pair["name"], pair.get("value", "")))
    else:
        raise RuleError("externalLabels must be an object of label names to values")
    if len(items) > MAX_EXTERNAL_LABELS:
        raise RuleError(f"externalLabels has more than {MAX_EXTERNAL_LABELS} labels")
    out = []
    for name, val in items:
        name = _string(name, "an externalLabels name")
        _check_label_name(name, "externalLabels")
        out.append((name, _string(val, f"externalLabels value of {name!r}")))
    if len({n for n, _ in out}) != len(out):
        raise RuleError("externalLabels names a label twice")
    return sorted(out)


def _check_label_name(name: str, what: str) -> None:
    if not _LABEL.fullmatch(name) or name.startswith("__"):
        raise RuleError(
            f"{what} label {name!r} is not a Prometheus label name "
            "([a-zA-Z_][a-zA-Z0-9_]*, not starting with __)"
        )
    if name in RESERVED_LABELS:
        raise RuleError(f"{what} label {name!r} is reserved: every recorded series has it")


def family_of(metric_name: str) -> Tuple[str, str]:
    """The exposition family of a recorded metric: (base name, type).  A name ending in
    ``_total`` is a counter named without it (OpenMetrics appends ``_total`` to a counter's
    samples); any other is untyped, with the same values, which ``rate()`` takes all the same.
    prometheus_client would append ``_total`` to any counter: this keeps the rule's name."""
    if metric_name.endswith("_total"):
        return metric_name[: -len("_total")], "counter"
    return metric_name, "unknown"


def _check_metric_name(metric_name: str) -> None:
    if not metric_name:
        raise RuleError("metricName is required")
    if not _METRIC.fullmatch(metric_name) or not metric_name.startswith(METRIC_PREFIX):
        raise RuleError(
            f"metricName {metric_name!r} must be a Prometheus metric name starting with "
            f"{METRIC_PREFIX!r} (as in Pyroscope), e.g. {METRIC_PREFIX}checkout_cpu"
        )
    base, _ = family_of(metric_name)
    if len(base) <= len(METRIC_PREFIX):
        raise RuleError(f"metricName {metric_name!r} needs a name after {METRIC_PREFIX!r}")
    for suffix in RESERVED_SUFFIXES:
        if base.endswith(suffix):
            raise RuleError(
                f"metricName {metric_name!r} may not end in {suffix!r} (before an optional "
                "_total): OpenMetrics reserves it for histograms, summaries, infos and counters"
            )
    if base.startswith(RESERVED_PREFIXES):
        raise RuleError(f"metricName {metric_name!r} is reserved for hotspan's own metrics")


def check_family(
    rule: RecordingRule, tenant: str, existing: Iterable[Tuple[str, RecordingRule]]
) -> None:
    """Refuse a rule whose family (base name) another rule, of any tenant, exports with
    another type (``x`` beside ``x_total``): /metrics shows every tenant's rules, and a
    family has one type.  ``existing``: (tenant, rule) pairs."""
    base, kind = family_of(rule.metric_name)
    for other_tenant, other in existing:
        if other_tenant == tenant and other.id == rule.id:
            continue  # the rule being replaced
        other_base, other_kind = family_of(other.metric_name)
        if other_base == base and other_kind != kind:
            # Another tenant's rule is not this tenant's to see: not named.
            existing_name = (
                repr(other.metric_name) if other_tenant == tenant else "of another tenant"
            )
            raise RuleError(
                f"metricName {rule.metric_name!r} clashes with an existing metric "
                f"{existing_name}: one is a counter (_total), the other not, and both would be "
                f"the family {base!r}; use the same name or another base name"
            )


def check_id(rule_id: str) -> str:
    if not _ID.fullmatch(rule_id or ""):
        raise RuleError(
            f"id {rule_id[:60]!r} must be 1 to 128 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return rule_id


def build(
    rule_id: str,
    metric_name: str,
    matchers: Sequence[str],
    profile_type: Optional[str],
    group_by: Sequence[str],
    external_labels: Sequence[Tuple[str, str]],
    function_name: str,
    generation: int = 1,
) -> RecordingRule:
    """A checked rule.  ``profile_type`` None: the one a ``__profile_type__`` matcher names,
    or on-CPU time when none does."""
    check_id(rule_id)
    _check_metric_name(metric_name)
    named: List[str] = []
    for text in matchers:
        try:
            selector = parse_selector(text)
        except SelectorError as exc:
            raise RuleError(f"matcher {text!r} is not a label selector: {exc}") from None
        if selector.metric:
            raise RuleError(
                f'matcher {text!r} has a metric name; write {{{PROFILE_TYPE}="..."}} instead'
            )
        for m in _profile_type_matchers(selector):
            if m.op != "=":
                raise RuleError(f"the {PROFILE_TYPE} matcher in {text!r} must use =")
            named.append(m.value)
    if len(set(named)) > 1:
        raise RuleError(f"matchers name several profile types: {sorted(set(named))}")
    if profile_type is not None and named and named[0] != profile_type:
        raise RuleError(f"profileType {profile_type!r} differs from the matchers' {named[0]!r}")
    type_id = profile_type or (named[0] if named else CPU)
    try:
        ptype = ProfileType.parse(type_id)
    except ProfileTypeError as exc:
        raise RuleError(f"profileType {type_id!r}: {exc}") from None
    if len(set(group_by)) != len(group_by):
        raise RuleError(f"groupBy repeats a label: {list(group_by)}")
    for name in group_by:
        _check_label_name(name, "groupBy")
    clash = set(group_by) & {n for n, _ in external_labels}
    if clash:
        raise RuleError(f"labels {sorted(clash)} are both in groupBy and in externalLabels")
    if function_name:
        if len(function_name) > MAX_PATTERN_CHARS:
            raise RuleError(f"functionName is longer than {MAX_PATTERN_CHARS} characters")
        try:
            Matcher("function", "=~", function_name)
        except SelectorError as exc:
            raise RuleError(f"functionName: {exc}") from None
    return RecordingRule(
        id=rule_id,
        metric_name=metric_name,
        profile_type=ptype,
        matchers=tuple(matchers),
        group_by=tuple(group_by),
        external_labels=tuple(external_labels),
        function_name=function_name,
        generation=generation,
    )


def from_json(body: Any, rule_id: str) -> Tuple[RecordingRule, int]:
    """A rule from hotspan's REST form, and the generation the client last saw (0: none,
    replace whatever is stored)."""
    if not isinstance(body, Mapping):
        raise RuleError("the body must be a JSON object (a recording rule)")
    unknown = sorted(set(body) - set(REST_FIELDS))
    if unknown:
        raise RuleError(f"unknown field(s) {unknown} (known: {', '.join(REST_FIELDS)})")
    if body.get("id") not in (None, rule_id):
        raise RuleError(f"field id {body['id']!r} is not the path's {rule_id!r}")
    selector = _string(body.get("selector"), "selector")
    matchers = _strings(body.get("matchers"), "matchers", MAX_MATCHERS)
    if selector:
        matchers.append(selector)
    profile_type = body.get("profileType")
    if profile_type is not None:
        profile_type = _string(profile_type, "profileType")
        if not profile_type:
            raise RuleError("profileType is empty (leave it out for on-CPU time)")
    rule = build(
        rule_id,
        _string(body.get("metricName"), "metricName"),
        matchers,
        profile_type,
        _strings(body.get("groupBy"), "groupBy", MAX_GROUP_BY),
        _label_pairs(body.get("externalLabels")),
        _string(body.get("functionName"), "functionName"),
    )
    return rule, _generation(body.get("generation"))


def from_connect(body: Any, rule_id: str) -> Tuple[RecordingRule, int]:
    """A rule from an ``UpsertRecordingRuleRequest`` in protojson, and its generation.  As in
    Pyroscope, a ``__profile_type__`` matcher is required."""
    if not isinstance(body, Mapping):
        raise RuleError("the request must be a JSON object")
    matchers = _strings(body.get("matchers"), "matchers", MAX_MATCHERS)
    if not any(_profile_type_matchers(_parsed(m)) for m in matchers):
        raise RuleError(f'matchers must contain a {PROFILE_TYPE}="..." matcher')
    function = ""
    flt = _field(body, "stacktraceFilter", "stacktrace_filter")
    if flt is not None:
        if not isinstance(flt, Mapping):
            raise RuleError("stacktraceFilter must be an object")
        fn = _field(flt, "functionName", "function_name")
        if fn is not None:
            if not isinstance(fn, Mapping):
                raise RuleError("stacktraceFilter.functionName must be an object")
            metric_type = _field(fn, "metricType", "metric_type")
            if metric_type not in (None, "TOTAL", 0):
                raise RuleError(f"metricType {metric_type!r} is not supported (only TOTAL)")
            # Pyroscope matches the name exactly; kept as the pattern that does (a Go method's
            # name, main.(*T).M, is no regular expression).
            function = re.escape(
                _string(
                    _field(fn, "functionName", "function_name"), "stacktraceFilter function name"
                )
            )
    rule = build(
        rule_id,
        _string(_field(body, "metricName", "metric_name"), "metricName"),
        matchers,
        None,
        _strings(_field(body, "groupBy", "group_by"), "groupBy", MAX_GROUP_BY),
        _label_pairs(_field(body, "externalLabels", "external_labels")),
        function,
    )
    return rule, _generation(body.get("generation"))


def _parsed(text: str) -> Selector:
    try:
        return parse_selector(text)
    except SelectorError as exc:
        raise RuleError(f"matcher {text!r} is not a label selector: {exc}") from None


def from_document(body: Mapping[str, Any]) -> RecordingRule:
    """A stored rule (RuleError if the document is not one, which the caller logs)."""
    rule, _ = from_json({k: v for k, v in body.items() if k != "generation"}, body.get("id", ""))
    return rule.with_generation(_generation(body.get("generation")) or 1)
