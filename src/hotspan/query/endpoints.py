"""Per-endpoint profiles: a service's profile split by the requests it served.

An endpoint is the name of a service's local root spans: spans whose parent is absent or in
another service (the server span of a request, a consumer's span, a batch job's root). A
request's cost is the samples of its local root and of every span below it in the same
service (its handler's child spans, the spans of the threads it handed work to); a span the
service runs for a call from another service (A calls B calls A) is a request of its own.
Samples reach an endpoint through the span id they carry, and spans through the store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from hotspan.model.labels import Matcher, Selector
from hotspan.model.profile import ProfileType
from hotspan.model.trace import STATUS_CODES, SpanRecord
from hotspan.query.engine import QueryEngine, all_labels
from hotspan.store.base import SampleFilter, StackValues, Store

# The spans of a service looked at per question: the latest of the range past it (the answer
# says it was cut). A million spans is ~100 MB of Python objects; this is a tenth of it.
MAX_SPANS = 100_000
# Samples carry the start of their agent's upload window (10 s by default, a minute at most
# for the SDKs people run), so a request's first samples can be stamped before the request
# began, before the range. They are picked by span id, so looking this far back adds no
# other request's samples.
STAMP_SLACK_NS = 5 * 60 * 10**9
SERVICE_LABEL = "service_name"
ERROR_CODE = STATUS_CODES.index("error")


@dataclass(frozen=True)
class Endpoint:
    name: str
    requests: int  # local root spans with this name that started in the range
    total: int  # the profile value of those requests (local roots and their descendants)
    beside: int = 0  # their value in the profile asked for beside (ServiceEndpoints.beside)
    errors: int = 0  # those requests whose local root span's status is error
    # Their durations (of the local root spans), nearest-rank: p50, p95, p99.
    latency_ns: Tuple[int, int, int] = (0, 0, 0)


@dataclass(frozen=True)
class ServiceEndpoints:
    service: str
    profile_type: ProfileType
    endpoints: Tuple[Endpoint, ...]  # the costliest first
    total: int  # every sample of the service in the range
    truncated: bool  # more spans started in the range than were looked at
    # A second profile type the same requests were measured in (the time they waited for the
    # GIL beside their CPU), when the service has samples of it in the range.
    beside: Optional[ProfileType] = None
    # More profile types the requests were measured in (CPU, allocations), by type id: each
    # endpoint's total in it.  Only types the service has samples of in the range.
    also: Dict[str, Dict[str, int]] = field(default_factory=dict)

    @property
    def unattributed(self) -> int:
        """Samples of no request of the range: no span, a span not stored (yet), or a
        request that started before the range."""
        return self.total - sum(e.total for e in self.endpoints)


def service_selector(service: str) -> Selector:
    return Selector("", (Matcher(SERVICE_LABEL, "=", service),))


def local_roots(spans: Iterable[SpanRecord], service: str) -> Dict[int, int]:
    """The local root of each span of ``service`` (span id to span id), following parents
    through the given spans; a span whose parent is not given, or of another service, is a
    local root."""
    of_service = {s.span_id: s for s in spans if s.service == service}
    root_of: Dict[int, int] = {}
    for span in of_service.values():
        path: List[int] = []
        seen: Set[int] = set()
        sid = span.span_id
        while sid not in root_of:
            if sid in seen:  # a parent cycle in bad data: its first span is the root
                root_of[sid] = sid
                break
            seen.add(sid)
            path.append(sid)
            parent = of_service.get(of_service[sid].parent_span_id)
            if parent is None or parent.span_id == sid:
                root_of[sid] = sid
                break
            sid = parent.span_id
        root = root_of[sid]
        for p in path:
            root_of[p] = root
    return root_of


@dataclass(frozen=True)
class EndpointGroup:
    """The endpoints of the requests whose samples carry one value of a label (None: the
    requests without samples)."""

    value: Optional[str]
    endpoints: Tuple[Endpoint, ...]  # the costliest first


def _ranked(
    roots: Dict[int, SpanRecord], per_root: Dict[int, int], beside_per_root: Dict[int, int]
) -> List[Endpoint]:
    """The endpoints of these requests (local root spans), the costliest first."""
    requests: Dict[str, int] = {}
    values: Dict[str, int] = {}
    besides: Dict[str, int] = {}
    errors: Dict[str, int] = {}
    durations: Dict[str, List[int]] = {}
    for sid, span in roots.items():
        durations.setdefault(span.name, []).append(span.end_ns - span.start_ns)
        requests[span.name] = requests.get(span.name, 0) + 1
        errors[span.name] = errors.get(span.name, 0) + (span.status_code == ERROR_CODE)
        values[span.name] = values.get(span.name, 0) + per_root.get(sid, 0)
        besides[span.name] = besides.get(span.name, 0) + beside_per_root.get(sid, 0)
    return sorted(
        (
            Endpoint(
                name,
                requests[name],
                values[name],
                besides[name],
                errors[name],
                latency_percentiles(durations[name]),
            )
            for name in requests
        ),
        key=lambda e: (-e.total, -e.requests, e.name),
    )


def latency_percentiles(durations: List[int]) -> Tuple[int, int, int]:
    """p50, p95 and p99 of ``durations`` (nearest rank: each is a duration that was seen)."""
    ordered = sorted(durations)
    n = len(ordered)
    if not n:
        return (0, 0, 0)
    return tuple(ordered[max(math.ceil(q * n) - 1, 0)] for q in (0.5, 0.95, 0.99))  # type: ignore[return-value]


class EndpointEngine:
    def __init__(self, store: Store, engine: QueryEngine) -> None:
        self.store = store
        self.engine = engine

    def _requests(
        self, tenant: str, service: str, start_ns: int, end_ns: int
    ) -> Tuple[Dict[int, SpanRecord], Dict[int, int], bool]:
        """The local roots that started in the range (by span id), the local root of every
        span of the service in the range, and whether the spans were cut at MAX_SPANS."""
        spans = self.store.span_infos(
            tenant, start_ns, end_ns, service=service, limit=MAX_SPANS + 1
        )
        truncated = len(spans) > MAX_SPANS
        # The latest come first: when cut, what is looked at starts at the last one kept, and
        # parents before it (in the range or not) are only looked up, never counted.
        spans = spans[:MAX_SPANS]
        looked_from = spans[-1].start_ns if truncated else start_ns
        ids = {s.span_id for s in spans}
        orphans = {s.trace_id for s in spans if s.parent_span_id and s.parent_span_id not in ids}
        extra: List[SpanRecord] = []
        if orphans:
            # A parent not looked at is of another service (then its child is a request) or of
            # this one, started earlier (then it is not): only the latter are fetched, which
            # keeps this cheap where every request's parent is another service's span.
            extra = self.store.span_infos(
                tenant,
                0,
                looked_from + 1,  # spans that started with the last one kept may have been cut
                service=service,
                trace_ids=sorted(orphans),
                limit=MAX_SPANS + 1,
            )
            # Parents not found would make their children requests: say the answer is cut.
            truncated = truncated or len(extra) > MAX_SPANS
        in_range = {s.span_id: s for s in spans}
        known = {s.span_id: s for s in extra}
        known.update(in_range)
        root_of = local_roots(known.values(), service)
        roots = {sid: s for sid, s in in_range.items() if root_of.get(sid) == sid}
        members = {sid: root for sid, root in root_of.items() if root in roots}
        return roots, members, truncated

    def requests(
        self, tenant: str, service: str, start_ns: int, end_ns: int
    ) -> Tuple[List[SpanRecord], bool]:
        """The requests of ``service`` that started in the range (its local root spans) and
        whether the spans looked at were cut at MAX_SPANS (then the requests are a lower
        bound: those of the latest spans)."""
        roots, _, truncated = self._requests(tenant, service, start_ns, end_ns)
        return list(roots.values()), truncated

    @staticmethod
    def _request_filter(start_ns: int, end_ns: int, span_ids: Iterable[int]) -> SampleFilter:
        """The samples of the given requests' spans, including those stamped before the range
        with the start of the upload window they were taken in."""
        return SampleFilter(start_ns - STAMP_SLACK_NS, end_ns, span_ids=sorted(span_ids))

    def _per_request(
        self,
        tenant: str,
        service: str,
        profile_type: ProfileType,
        start_ns: int,
        end_ns: int,
        members: Dict[int, int],
    ) -> Tuple[Optional[int], Dict[int, int]]:
        """The service's total of one profile type in the range (None: it has no such
        series), and each request's value (by local root)."""
        series = self.engine.find_series(
            tenant, [service_selector(service)], start_ns - STAMP_SLACK_NS, end_ns, profile_type
        )
        if not series:
            return None, {}
        series_ids = [s.series_id for s in series]
        everything = self.store.span_values(tenant, series_ids, SampleFilter(start_ns, end_ns))
        per_root = self._per_root(tenant, series_ids, start_ns, end_ns, members)
        return int(everything.values.sum()), per_root

    def _per_root(
        self,
        tenant: str,
        series_ids: Sequence[int],
        start_ns: int,
        end_ns: int,
        members: Dict[int, int],
    ) -> Dict[int, int]:
        """Each request's value in these series (by local root)."""
        per_root: Dict[int, int] = {}
        if members:
            sums = self.store.span_values(
                tenant, series_ids, self._request_filter(start_ns, end_ns, members)
            )
            for sid, value in zip(sums.span_ids.tolist(), sums.values.tolist()):
                root = members.get(sid)
                if root is not None:
                    per_root[root] = per_root.get(root, 0) + value
        return per_root

    def endpoints(
        self,
        tenant: str,
        service: str,
        profile_type: ProfileType,
        start_ns: int,
        end_ns: int,
        beside: Optional[ProfileType] = None,
        also: Sequence[ProfileType] = (),
    ) -> ServiceEndpoints:
        """The service's endpoints by their value in ``profile_type``, and in ``beside`` too
        when given and the service has samples of it; and their totals in the ``also`` types
        the service has samples of (:attr:`ServiceEndpoints.also`)."""
        roots, members, truncated = self._requests(tenant, service, start_ns, end_ns)
        total, per_root = self._per_request(
            tenant, service, profile_type, start_ns, end_ns, members
        )
        beside_total, beside_per_root = (
            self._per_request(tenant, service, beside, start_ns, end_ns, members)
            if beside is not None and beside != profile_type
            else (None, {})
        )
        endpoints = _ranked(roots, per_root, beside_per_root)
        totals: Dict[str, Dict[str, int]] = {}
        for other in also:
            if other == profile_type:
                other_per_root: Dict[int, int] = per_root
            elif other == beside and beside_total is not None:
                other_per_root = beside_per_root
            else:
                found, other_per_root = self._per_request(
                    tenant, service, other, start_ns, end_ns, members
                )
                if found is None:
                    continue
            by_name = totals[other.id] = {}
            for sid, span in roots.items():
                by_name[span.name] = by_name.get(span.name, 0) + other_per_root.get(sid, 0)
        # The requests' samples reach a little before the range (STAMP_SLACK_NS): the total
        # is at least what they hold, so that shares stay within 100%.
        total = max(total or 0, sum(e.total for e in endpoints))
        return ServiceEndpoints(
            service,
            profile_type,
            tuple(endpoints),
            total,
            truncated,
            beside if beside_total is not None else None,
            totals,
        )

    def split(
        self,
        tenant: str,
        service: str,
        profile_type: ProfileType,
        start_ns: int,
        end_ns: int,
        label: str,
    ) -> Tuple[EndpointGroup, ...]:
        """The service's endpoints per value of a label of its profiles (``version``, say).

        A request belongs to the value whose series hold most of its samples (they are one
        process's, so all of them as a rule); requests without samples form a group of their
        own (value None), where only their count, errors and latency say something."""
        roots, members, _ = self._requests(tenant, service, start_ns, end_ns)
        series = self.engine.find_series(
            tenant, [service_selector(service)], start_ns - STAMP_SLACK_NS, end_ns, profile_type
        )
        by_value: Dict[str, List[int]] = {}
        for record in series:
            by_value.setdefault(all_labels(record).get(label, ""), []).append(record.series_id)
        per_value: Dict[str, Dict[int, int]] = {}
        owner: Dict[int, str] = {}
        most: Dict[int, int] = {}
        for value, series_ids in sorted(by_value.items()):
            per_root = per_value[value] = self._per_root(
                tenant, series_ids, start_ns, end_ns, members
            )
            for root, v in per_root.items():
                if v > most.get(root, -1):
                    most[root], owner[root] = v, value
        groups = []
        for value in sorted(by_value):
            mine = {sid: span for sid, span in roots.items() if owner.get(sid) == value}
            if mine:
                groups.append(EndpointGroup(value, tuple(_ranked(mine, per_value[value], {}))))
        unsampled = {sid: span for sid, span in roots.items() if sid not in owner}
        if unsampled:
            groups.append(EndpointGroup(None, tuple(_ranked(unsampled, {}, {}))))
        return tuple(groups)

    def endpoint_values(
        self,
        tenant: str,
        service: str,
        name: str,
        profile_type: ProfileType,
        start_ns: int,
        end_ns: int,
    ) -> Tuple[StackValues, int]:
        """The stacks of the requests of one endpoint, and how many requests there were."""
        roots, members, _ = self._requests(tenant, service, start_ns, end_ns)
        mine = {sid for sid, s in roots.items() if s.name == name}
        if not mine:
            return StackValues.empty(), 0
        span_ids = (sid for sid, root in members.items() if root in mine)
        where = self._request_filter(start_ns, end_ns, span_ids)
        values = self.engine.stack_values(tenant, profile_type, service_selector(service), where)
        return values, len(mine)
