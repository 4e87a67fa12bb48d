"""An alert rule: its JSON form, checked field by field.

A rule is what ``PUT /api/v1/alerts/rules/{name}`` takes::

    {"selector": "{service_name=\\"checkout\\"}", "profileType": "<id>" (default CPU),
     "condition": {...}, "for": "0s", "labels": {}, "annotations": {}, "webhooks": [url]}

with one of four conditions:

- ``{"kind": "function_share", "function": regex, "above": percent, "window": "5m"}``: the
  share of the selected profile held by stacks with a frame matching ``function``;
- ``{"kind": "per_request", "increase": percent, "window": "10m", "against": ...}``: the
  profile total per root span of the selector's service, up more than ``increase`` percent
  against ``{"offset": "24h"}`` (the same window earlier) or against another label value
  ``{"label": "version", "baseline": "1.2", "comparison": "1.3"}``;
- ``{"kind": "share_growth", "function": regex, "points": pp, "window": "1h", "label": ...,
  "baseline": ..., "comparison": ...}``: the function's share grown by more than ``points``
  percentage points from the baseline label value to the comparison one;
- ``{"kind": "gil_wait_share", "above": percent, "window": "5m"}``: the selected threads'
  time waiting for the GIL as a share of their time running or waiting for it (the
  ``gil_wait`` profile over itself plus CPU); the rule's profile type is not used.

Every string (keys included) must be valid UTF-8 text: JSON's ``"\\ud800"`` (a lone surrogate)
is refused.  ``uid`` is the server's id of the rule (16 hex digits), set when the rule is
created and kept when it is replaced; a body may carry it back (as GET returned it) or leave
it out.

Function regexes are RE2 (linear time: no rule can stall the evaluator) and match anywhere in
a frame's name (``slow_query`` matches ``app.db.slow_query``); anchor with ``^...$``.
Every problem raises :class:`RuleError` with a message naming the field.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from hotspan.model.durations import DurationError, format_duration, parse_ns
from hotspan.model.labels import (
    SERVICE_NAME,
    Matcher,
    RegexError,
    Selector,
    SelectorError,
    compile_regex,
    is_valid_label_name,
    parse_selector,
)
from hotspan.model.profile import ProfileType, ProfileTypeError

CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
SEC = 10**9

MAX_NAME_CHARS = 128
MAX_KEY_CHARS = 128
MAX_REGEX_CHARS = 1000
MAX_WEBHOOKS = 10
MAX_LABELS = 32
MAX_TEXT_CHARS = 4096
MIN_WINDOW_NS = 1 * SEC
MAX_WINDOW_NS = 7 * 86400 * SEC
MAX_OFFSET_NS = 30 * 86400 * SEC

# A rule's name is its alertname and a path segment: keep it to what needs no quoting.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]*")
_UID = re.compile(r"[0-9a-f]{16}")
# Stands for a webhook URL's password and query values wherever a URL is shown or logged.
REDACTED = "REDACTED"

KINDS = ("function_share", "per_request", "share_growth", "gil_wait_share")
_RULE_FIELDS = (
    "name",
    "selector",
    "profileType",
    "condition",
    "for",
    "labels",
    "annotations",
    "webhooks",
    "uid",
)


class RuleError(ValueError):
    """A rule that cannot be kept as given; the message names the field and the problem."""


def parse_duration(text: Any, what: str) -> int:
    """Nanoseconds of a Prometheus duration (``90s``, ``1h30m``, ``0s``)."""
    if not isinstance(text, str) or not text.strip():
        raise RuleError(f"{what} must be a duration such as 30s, 5m or 1h, not {text!r}")
    try:
        return parse_ns(text)
    except DurationError as exc:
        raise RuleError(f"{what} {exc}") from None


def compile_function(pattern: Any, what: str = "condition.function") -> Any:
    """The compiled RE2 pattern of a function regex."""
    if not isinstance(pattern, str) or not pattern:
        raise RuleError(f"{what} must be a non-empty regular expression, not {pattern!r}")
    if len(pattern) > MAX_REGEX_CHARS:
        raise RuleError(f"{what} is longer than {MAX_REGEX_CHARS} characters")
    try:
        return compile_regex(pattern)
    except UnicodeError:
        raise RuleError(f"{what} is not valid UTF-8 text") from None
    except RegexError as exc:
        raise RuleError(f"{what} {pattern!r} is not a regular expression: {exc}") from None


@dataclass(frozen=True)
class LabelPair:
    """Two values of one label: ``label="baseline"`` against ``label="comparison"``."""

    label: str
    baseline: str
    comparison: str


@dataclass(frozen=True)
class FunctionShare:
    function: str
    above: float
    window_ns: int
    kind: str = "function_share"


@dataclass(frozen=True)
class PerRequest:
    increase: float
    window_ns: int
    # One of the two: the same window this much earlier, or two values of a label.
    offset_ns: Optional[int] = None
    labels: Optional[LabelPair] = None
    kind: str = "per_request"


@dataclass(frozen=True)
class ShareGrowth:
    function: str
    points: float
    window_ns: int
    labels: LabelPair
    kind: str = "share_growth"


@dataclass(frozen=True)
class GilWaitShare:
    above: float
    window_ns: int
    kind: str = "gil_wait_share"


Condition = Union[FunctionShare, PerRequest, ShareGrowth, GilWaitShare]


@dataclass(frozen=True)
class AlertRule:
    name: str
    selector: Selector
    selector_text: str
    profile_type: ProfileType
    condition: Condition
    for_ns: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    webhooks: Tuple[str, ...] = ()
    uid: str = ""  # set by the server: the stored rule's id, which its alert state follows

    @property
    def service(self) -> Optional[str]:
        """The service the selector pins with ``service_name="..."``, if it does."""
        for m in self.selector.matchers:
            if m.name == SERVICE_NAME and m.op == "=":
                return m.value
        return None

    def to_json(self) -> Dict[str, Any]:
        """The rule as stored (webhook URLs in full: see :func:`redact_rule` for showing)."""
        out = {
            "name": self.name,
            "selector": self.selector_text,
            "profileType": self.profile_type.id,
            "condition": condition_json(self.condition),
            "for": format_duration(self.for_ns),
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "webhooks": list(self.webhooks),
        }
        if self.uid:
            out["uid"] = self.uid
        return out


def selector_text(selector: Selector, extra: Optional[Matcher] = None) -> str:
    """The canonical text of a selector, optionally with one more matcher."""
    matchers = [str(m) for m in selector.matchers]
    if extra is not None:
        matchers.append(str(extra))
    return selector.metric + "{" + ", ".join(matchers) + "}"


def condition_json(cond: Condition) -> Dict[str, Any]:
    window = format_duration(cond.window_ns)
    if isinstance(cond, FunctionShare):
        return {"kind": cond.kind, "function": cond.function, "above": cond.above, "window": window}
    if isinstance(cond, GilWaitShare):
        return {"kind": cond.kind, "above": cond.above, "window": window}
    if isinstance(cond, PerRequest):
        against: Dict[str, Any]
        if cond.labels is not None:
            against = {
                "label": cond.labels.label,
                "baseline": cond.labels.baseline,
                "comparison": cond.labels.comparison,
            }
        else:
            against = {"offset": format_duration(cond.offset_ns or 0)}
        return {"kind": cond.kind, "increase": cond.increase, "window": window, "against": against}
    return {
        "kind": cond.kind,
        "function": cond.function,
        "points": cond.points,
        "window": window,
        "label": cond.labels.label,
        "baseline": cond.labels.baseline,
        "comparison": cond.labels.comparison,
    }


# -- parsing --------------------------------------------------------------------------------


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise RuleError("the rule needs a name")
    if len(name) > MAX_NAME_CHARS or not _NAME.fullmatch(name):
        raise RuleError(
            f"rule name {name[:60]!r} must be 1 to {MAX_NAME_CHARS} letters, digits, "
            "'_', '.', ':' or '-' (not starting with '.', ':' or '-')"
        )
    return name


def check_text(value: Any, where: str = "rule") -> None:
    """RuleError unless every string in ``value`` (keys too, at any depth) is UTF-8 text.

    JSON can spell a lone surrogate (``"\\ud800"``) that Python decodes but no UTF-8 writer
    takes: kept, it would break every answer that shows the rule.  Iterative, so that a
    deeply nested body cannot exhaust the stack."""
    todo: List[Tuple[str, Any]] = [(where, value)]
    while todo:
        path, item = todo.pop()
        if isinstance(item, str):
            if not _is_utf8(item):
                raise RuleError(f"{path} is not valid UTF-8 text (a lone surrogate?)")
        elif isinstance(item, dict):
            for key, sub in item.items():
                if isinstance(key, str) and not _is_utf8(key):
                    raise RuleError(f"a key in {path} is not valid UTF-8 text (a lone surrogate?)")
                todo.append((f"{path}.{key}" if path != "rule" else str(key), sub))
        elif isinstance(item, list):
            todo.extend((f"{path}[{i}]", sub) for i, sub in enumerate(item))


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeError:
        return False
    return True


def parse_rule(name: str, body: Any) -> AlertRule:
    """The rule ``name`` from its JSON body; RuleError naming the first problem."""
    check_name(name)
    if not isinstance(body, dict):
        raise RuleError("the rule must be a JSON object")
    check_text(body)
    _no_unknown(body, _RULE_FIELDS, "rule")
    uid = body.get("uid", "")
    if not isinstance(uid, str) or (uid and not _UID.fullmatch(uid)):
        raise RuleError("uid is the server's id of the rule (16 hex digits): leave it out")
    if "name" in body and body["name"] != name:
        raise RuleError(f"field name {body['name']!r} is not the path's {name!r}")
    text = body.get("selector")
    if not isinstance(text, str) or not text.strip():
        raise RuleError('field selector is required: a label selector such as {service_name="x"}')
    try:
        selector = parse_selector(text)
    except SelectorError as exc:
        raise RuleError(f"selector {text[:200]!r}: {exc}") from None
    if not selector.matchers:
        # It would watch every service of the tenant at once, which no condition means.
        raise RuleError('selector {} selects everything: name a service: {service_name="..."}')
    ptype_text = body.get("profileType")
    if ptype_text is None:
        ptype_text = CPU
    elif not isinstance(ptype_text, str) or not ptype_text.strip():
        raise RuleError(f"profileType must be a profile type id, not {ptype_text!r}")
    try:
        ptype = ProfileType.parse(ptype_text)
    except ProfileTypeError as exc:
        raise RuleError(f"profileType: {exc}") from None
    cond = parse_condition(body.get("condition"))
    for_ns = parse_duration(body.get("for", "0s"), "for")
    if for_ns > MAX_WINDOW_NS:
        raise RuleError(f"for must be at most {format_duration(MAX_WINDOW_NS)}")
    rule = AlertRule(
        name=name,
        selector=selector,
        selector_text=selector_text(selector),
        profile_type=ptype,
        condition=cond,
        for_ns=for_ns,
        labels=_string_map(body.get("labels"), "labels", label_names=True),
        annotations=_string_map(body.get("annotations"), "annotations"),
        webhooks=_webhooks(body.get("webhooks")),
        uid=uid,
    )
    if isinstance(cond, PerRequest) and rule.service is None:
        raise RuleError(
            "a per_request condition counts the requests of one service: the selector needs "
            'service_name="<service>"'
        )
    if "alertname" in rule.labels:
        raise RuleError("labels.alertname is the rule's name; leave it out")
    return rule


def parse_condition(body: Any) -> Condition:
    if not isinstance(body, dict):
        raise RuleError(
            "field condition is required: an object with kind "
            f"{', '.join(KINDS)} (see the documentation for their fields)"
        )
    kind = body.get("kind")
    if kind not in KINDS:
        raise RuleError(f"condition.kind must be one of {', '.join(KINDS)}, not {kind!r}")
    window = _window(body.get("window"), "condition.window")
    if kind == "function_share":
        _no_unknown(body, ("kind", "function", "above", "window"), "condition")
        function: Any = body.get("function")  # compile_function checks it is a string
        compile_function(function)
        return FunctionShare(function, _percent(body.get("above"), "condition.above"), window)
    if kind == "gil_wait_share":
        _no_unknown(body, ("kind", "above", "window"), "condition")
        return GilWaitShare(_percent(body.get("above"), "condition.above"), window)
    if kind == "per_request":
        _no_unknown(body, ("kind", "increase", "window", "against"), "condition")
        increase = _number(body.get("increase"), "condition.increase", 0, 1e6)
        against = body.get("against")
        if not isinstance(against, dict):
            raise RuleError(
                'condition.against is required: {"offset": "24h"} or '
                '{"label": "version", "baseline": "1.2", "comparison": "1.3"}'
            )
        if "offset" in against:
            _no_unknown(against, ("offset",), "condition.against")
            offset = parse_duration(against["offset"], "condition.against.offset")
            if not MIN_WINDOW_NS <= offset <= MAX_OFFSET_NS:
                raise RuleError(
                    f"condition.against.offset must be from 1s to {format_duration(MAX_OFFSET_NS)}"
                )
            return PerRequest(increase, window, offset_ns=offset)
        _no_unknown(against, ("label", "baseline", "comparison"), "condition.against")
        return PerRequest(increase, window, labels=_label_pair(against, "condition.against"))
    _no_unknown(
        body,
        ("kind", "function", "points", "window", "label", "baseline", "comparison"),
        "condition",
    )
    function = body.get("function")
    compile_function(function)
    points = _percent(body.get("points"), "condition.points")
    return ShareGrowth(function, points, window, _label_pair(body, "condition"))


def _label_pair(body: Mapping[str, Any], where: str) -> LabelPair:
    label = body.get("label")
    if not isinstance(label, str) or not is_valid_label_name(label):
        raise RuleError(f"{where}.label must be a label name such as version, not {label!r}")
    values = []
    for side in ("baseline", "comparison"):
        value = body.get(side)
        if not isinstance(value, str) or not value:
            raise RuleError(f"{where}.{side} must be a value of label {label}, not {value!r}")
        values.append(value)
    if values[0] == values[1]:
        raise RuleError(f"{where}.baseline and comparison are the same value {values[0]!r}")
    return LabelPair(label, values[0], values[1])


def _window(text: Any, what: str) -> int:
    ns = parse_duration(text, what)
    if not MIN_WINDOW_NS <= ns <= MAX_WINDOW_NS:
        raise RuleError(f"{what} must be from 1s to {format_duration(MAX_WINDOW_NS)}, not {text!r}")
    return ns


def _number(value: Any, what: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RuleError(f"{what} must be a number, not {value!r}")
    if not low <= value <= high:
        raise RuleError(f"{what} must be from {low:g} to {high:g}, not {value!r}")
    return float(value)


def _percent(value: Any, what: str) -> float:
    return _number(value, what, 0, 100)


def _no_unknown(body: Mapping[str, Any], known: Tuple[str, ...], where: str) -> None:
    unknown = sorted(k for k in body if k not in known)
    if unknown:
        raise RuleError(
            f"unknown field(s) {', '.join(map(repr, unknown))} in {where} "
            f"(known: {', '.join(known)})"
        )


def _string_map(value: Any, what: str, label_names: bool = False) -> Dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RuleError(f"{what} must be an object of strings, not {value!r}")
    if len(value) > MAX_LABELS:
        raise RuleError(f"{what} has more than {MAX_LABELS} entries")
    out = {}
    for key, item in value.items():
        if not key or len(key) > MAX_KEY_CHARS:
            raise RuleError(f"{what}: keys must be 1 to {MAX_KEY_CHARS} characters long")
        if label_names and not is_valid_label_name(key):
            raise RuleError(f"{what}: {key!r} is not a label name")
        if not isinstance(item, str):
            raise RuleError(f"{what}.{key} must be a string, not {item!r}")
        if len(item) > MAX_TEXT_CHARS:
            raise RuleError(f"{what}.{key} is longer than {MAX_TEXT_CHARS} characters")
        out[key] = item
    return out


def _webhooks(value: Any) -> Tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise RuleError("webhooks must be a list of http(s) URLs")
    if len(value) > MAX_WEBHOOKS:
        raise RuleError(f"webhooks: at most {MAX_WEBHOOKS} URLs")
    out: List[str] = []
    for url in value:
        if not isinstance(url, str):
            raise RuleError(f"webhooks: {url!r} is not a URL")
        shown = redact_url(url)[:200]
        try:
            parsed = urllib.parse.urlsplit(url)
            parsed.port  # noqa: B018 - raises ValueError for a port out of range
        except ValueError as exc:
            raise RuleError(f"webhooks: {shown!r} is not a URL: {exc}") from None
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise RuleError(f"webhooks: {shown!r} is not an http:// or https:// URL")
        if any(c.isspace() or not c.isprintable() for c in url):
            raise RuleError(f"webhooks: {shown!r} holds spaces or control characters")
        if url not in out:
            out.append(url)
    return tuple(out)


# -- secrets in webhook URLs --------------------------------------------------------------------


def redact_url(url: str) -> str:
    """``url`` with its password, query values and the path segments that look like keys
    replaced by REDACTED, for showing and logging (``http://u:REDACTED@h/x?token=REDACTED``,
    ``https://hooks.slack.com/services/REDACTED/REDACTED/REDACTED``).  Works on text that does
    not parse as a URL too, so that error messages can show what they refuse."""
    rest, hash_, fragment = url.partition("#")
    rest, qmark, query = rest.partition("?")
    scheme, sep, after = rest.partition("://")
    if sep:
        cut = after.find("/")
        netloc, path = (after, "") if cut < 0 else (after[:cut], after[cut:])
        userinfo, at, host = netloc.rpartition("@")
        if at and ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":" + REDACTED
        path = "/".join(REDACTED if _looks_like_a_key(part) else part for part in path.split("/"))
        rest = scheme + sep + (userinfo + at if at else "") + host + path
    if qmark:
        query = "&".join(_redact_param(part) for part in query.split("&"))
    return rest + qmark + query + hash_ + fragment


def _looks_like_a_key(segment: str) -> bool:
    """A path segment that is a receiver's key (Slack's, Discord's, Teams' webhooks put theirs
    in the path): long, or mixing letters and digits the way ids and tokens do, unlike the
    words and versions of an API's path (``api``, ``v2``, ``alerts``)."""
    if len(segment) >= 20:
        return True
    return (
        len(segment) >= 8
        and any(c.isdigit() for c in segment)
        and any(c.isalpha() for c in segment)
    ) or (len(segment) >= 12 and segment.isdigit())


def _redact_param(part: str) -> str:
    key, eq, value = part.partition("=")
    return key + eq + REDACTED if value else part


def redact_rule(body: Mapping[str, Any]) -> Dict[str, Any]:
    """A stored rule's JSON as shown by the API and the CLI: webhook URLs redacted."""
    out = dict(body)
    hooks = out.get("webhooks")
    if isinstance(hooks, list):
        out["webhooks"] = [redact_url(u) if isinstance(u, str) else u for u in hooks]
    return out


def keep_secrets(rule: AlertRule, stored: Optional[Mapping[str, Any]]) -> AlertRule:
    """``rule`` with each webhook given in the redacted form of one of the stored rule's URLs
    replaced by that URL: a rule read back from the API and saved again keeps its secrets."""
    if not stored or not isinstance(stored.get("webhooks"), list):
        return rule
    # Several stored URLs may redact alike (two channels of one relay): each comes back.
    originals: Dict[str, List[str]] = {}
    for url in stored["webhooks"]:
        if isinstance(url, str):
            originals.setdefault(redact_url(url), []).append(url)
    hooks: List[str] = []
    for url in rule.webhooks:
        for original in originals.get(url, [url]):
            if original not in hooks:
                hooks.append(original)
    return replace(rule, webhooks=tuple(hooks[:MAX_WEBHOOKS]))
