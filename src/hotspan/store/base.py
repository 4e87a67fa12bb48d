"""The storage interface.  Every backend passes ``tests/store_contract.py``.

A backend stores four things for profiles: series (profile type + labels), frames, stacks
(frame ids, root first) and samples (time, series, stack, value, span id, trace id); and spans
for traces, with the resource and scope groups they belong to.  Tenants are a column of series,
samples and spans, never of frames, stacks and span groups: those are content-addressed and
only reachable through a tenant's own rows.  It also keeps the agent settings rules operators
set per tenant and service (:class:`SettingsRule`), with a per-tenant version counter, JSON
documents (:class:`Document`: alert and recording rules) and the API tokens of tenants
(:class:`StoredToken`, kept as documents: only their hash, never the token).
"""

from __future__ import annotations

import abc
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from hotspan.model.profile import Frame, IngestBatch, ProfileType
from hotspan.model.trace import (
    Condition,
    SpanBatch,
    SpanRecord,
    StoredSpan,
    TraceQuery,
    TraceSummary,
)
from hotspan.store.compare_sql import ComparePlan, CompareRow
from hotspan.store.metrics_sql import MetricsPlan, MetricsRow

# How long data is kept when the server is not told (``--retention``).
DEFAULT_RETENTION_NS = 7 * 86400 * 10**9
# How far before a span its parent is looked for (count_local_roots): a request longer than
# this whose child starts in the range counts that child as a request of its own.
PARENT_LOOKBACK_NS = 3600 * 10**9


class StoreError(RuntimeError):
    """The store could not complete an operation (disk full, closed, ...)."""


class StoreClosed(StoreError):
    """The store was closed: the server is stopping."""


class StoreUnavailable(StoreError):
    """The store could not be reached (a database server away, a timeout): trying again
    later may work, and whether the failed write landed is unknown."""


@dataclass(frozen=True)
class SeriesRecord:
    series_id: int
    profile_type: ProfileType
    labels: Mapping[str, str]
    first_ts: int
    last_ts: int

    def overlaps(self, start_ns: int, end_ns: int) -> bool:
        return self.first_ts < end_ns and self.last_ts >= start_ns


class StackValues(NamedTuple):
    """Per-stack sums: ``stack_ids[i]`` had ``values[i]`` in total (both int64 arrays)."""

    stack_ids: np.ndarray
    values: np.ndarray

    @classmethod
    def empty(cls) -> StackValues:
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


class SpanValues(NamedTuple):
    """Per-span sums: span ``span_ids[i]`` (unsigned, 0: no span) had ``values[i]``."""

    span_ids: np.ndarray
    values: np.ndarray


class TraceValues(NamedTuple):
    """Per-trace sums: trace ``trace_ids[i]`` (32 lowercase hex digits) had ``values[i]``."""

    trace_ids: List[str]
    values: np.ndarray


class ProfileValues(NamedTuple):
    """Per-profile sums.  A profile is the samples of one series at one time (one upload's
    samples share its time): row i is series ``series_ids[i]`` at ``times[i]`` (ns), within
    it span ``span_ids[i]`` of trace ``trace_ids[i]`` when summed per span (else 0 / None),
    with ``values[i]`` in total."""

    series_ids: np.ndarray  # int64
    times: np.ndarray  # int64 nanoseconds
    span_ids: np.ndarray  # uint64
    trace_ids: List[Optional[str]]
    values: np.ndarray  # int64


class SpanBaseline(NamedTuple):
    """The spans like one (:meth:`Store.baseline_spans`): the median duration of every
    candidate (None without any), how many there were, and the chosen ones."""

    spans: List[SpanRecord]
    median_ns: Optional[float]
    candidates: int

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[Any]], limit: int) -> SpanBaseline:
        """From the stores' statement: a span outline (SpanRecord.outlines' fields but the
        status), then the median and the number of candidates, on every row; no row, no
        candidate.
        The statement returns one row even for ``limit`` 0, for the median."""
        if not rows:
            return cls([], None, 0)
        # The baseline's spans are compared by duration: their status is not read (0).
        spans = SpanRecord.outlines([(*r[:7], 0) for r in rows]) if limit > 0 else []
        return cls(spans, float(rows[0][7]), int(rows[0][8]))


class RequestSides(NamedTuple):
    """A service's requests split between two sets of series (:meth:`Store.request_sides`):
    per set, the requests it holds and the sum of their traces' samples; then the requests
    whose traces hold no sample of either."""

    requests: Tuple[int, int]
    totals: Tuple[int, int]
    without: int


@dataclass(frozen=True)
class RetentionReport:
    samples: int = 0
    spans: int = 0
    series: int = 0

    def __add__(self, other: RetentionReport) -> RetentionReport:
        return RetentionReport(
            self.samples + other.samples, self.spans + other.spans, self.series + other.series
        )


@dataclass(frozen=True)
class SettingsRule:
    """Live agent settings for the instances of a service that match ``selector``.

    ``selector`` is a label selector without a metric name (``{env="prod"}``; ``""`` matches
    every instance); the store keeps it as given, the server normalises it first.
    ``version`` is the tenant's settings version at the rule's last change.
    """

    service: str
    selector: str
    settings: Mapping[str, Any]
    version: int
    updated_at: int  # unix nanoseconds

    def to_json(self) -> Dict[str, Any]:
        return {
            "service": self.service,
            "selector": self.selector,
            "settings": dict(self.settings),
            "version": self.version,
            "updated_at": self.updated_at,
        }


@dataclass(frozen=True)
class Document:
    """A JSON document the server keeps for a tenant: an alert rule, an alert's state, a
    recording rule.  ``kind`` says which; ``name`` is unique per (tenant, kind).  The store
    keeps the body as given and knows nothing of its shape, so a new kind needs no schema
    change (and every server over a shared store sees the same documents)."""

    tenant: str
    kind: str
    name: str
    body: Mapping[str, Any]
    updated_at: int  # unix nanoseconds of the last put


TOKEN_KIND = "token"
TOKEN_ROLES = ("ingest", "query", "admin")


@dataclass(frozen=True)
class StoredToken:
    """An API token of a tenant, as the store keeps it: ``sha256`` is the hex SHA-256 of the
    token, which only its holder knows.  ``token_id`` names it (unique per tenant) for
    listing and revoking; ``role`` is one of :data:`TOKEN_ROLES`."""

    tenant: str
    token_id: str
    role: str
    sha256: str
    name: str = ""
    created_at: int = 0  # unix nanoseconds

    def to_json(self) -> Dict[str, Any]:
        """What may be shown of it: everything but the hash."""
        return {
            "id": self.token_id,
            "tenant": self.tenant,
            "role": self.role,
            "name": self.name,
            "created_at": self.created_at,
        }


def _token_of(doc: Document) -> Optional[StoredToken]:
    body = doc.body
    role, digest = body.get("role"), body.get("sha256")
    if role not in TOKEN_ROLES or not isinstance(digest, str) or len(digest) != 64:
        return None
    name = body.get("name")
    created = body.get("created_at")
    return StoredToken(
        doc.tenant,
        doc.name,
        role,
        digest,
        name if isinstance(name, str) else "",
        created if isinstance(created, int) else doc.updated_at,
    )


class SampleFilter(NamedTuple):
    """Which samples of the chosen series count: a time range and optionally spans, traces
    or stacks.  With ``trace_ids``, ``trace_span_ids`` (the stored spans of those traces)
    adds the samples that carry a span id but no trace id, as Pyroscope's SDKs label them."""

    start_ns: int
    end_ns: int
    span_ids: Optional[Sequence[int]] = None  # unsigned 64-bit span ids
    trace_ids: Optional[Sequence[str]] = None  # 32 lowercase hex digits each
    stack_ids: Optional[Sequence[int]] = None  # the store's stack ids
    trace_span_ids: Optional[Sequence[int]] = None


class Store(abc.ABC):
    @abc.abstractmethod
    def write(self, tenant: str, batch: IngestBatch) -> Future[None]:
        """Queue a batch; the future resolves once the batch is durable (or fails)."""

    @abc.abstractmethod
    def series(self, tenant: str) -> List[SeriesRecord]:
        """Every series of the tenant."""

    @abc.abstractmethod
    def stack_values(
        self, tenant: str, series_ids: Sequence[int], where: SampleFilter
    ) -> StackValues:
        """Sum of sample values per stack over the given series and filter."""

    @abc.abstractmethod
    def time_series(
        self, tenant: str, series_ids: Sequence[int], where: SampleFilter, step_ns: int
    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per series and step: (series_id, point time, sum of values, number of distinct
        sample times).  The point at T covers (T - step, T] with T = start + k * step."""

    @abc.abstractmethod
    def stacks(self, stack_ids: Sequence[int]) -> Dict[int, Tuple[int, ...]]:
        """Root-first frame ids of each known stack id."""

    @abc.abstractmethod
    def frames(self, frame_ids: Sequence[int]) -> Dict[int, Frame]:
        """The frame of each known frame id."""

    @abc.abstractmethod
    def span_values(
        self, tenant: str, series_ids: Sequence[int], where: SampleFilter
    ) -> SpanValues:
        """Sum of sample values per span id over the given series and filter."""

    @abc.abstractmethod
    def trace_values(
        self, tenant: str, series_ids: Sequence[int], where: SampleFilter
    ) -> TraceValues:
        """Sum of sample values per trace id over the given series and filter; samples
        without a trace id are left out."""

    @abc.abstractmethod
    def profile_values(
        self,
        tenant: str,
        series_ids: Sequence[int],
        where: SampleFilter,
        by_span: bool = False,
        limit: int = 1_000_000,
    ) -> ProfileValues:
        """Sum of sample values per profile (series and sample time) over the given series
        and filter, or with ``by_span`` per (profile, span id, trace id), leaving out samples
        without a span; ordered by time, series id, span id, trace id; the first ``limit``."""

    # -- traces ------------------------------------------------------------------------------

    @abc.abstractmethod
    def write_spans(self, tenant: str, spans: SpanBatch) -> Future[None]:
        """Queue spans; the future resolves once they are durable (or fails)."""

    @abc.abstractmethod
    def trace(self, tenant: str, trace_id: str) -> List[StoredSpan]:
        """Every stored span of one trace (32 lowercase hex digits), in no particular order."""

    @abc.abstractmethod
    def find_traces(self, tenant: str, query: TraceQuery) -> List[TraceSummary]:
        """Traces with a span that started in the range and meets every condition, whose
        duration is within the bounds; the most recent first."""

    @abc.abstractmethod
    def span_traces(self, tenant: str, span_ids: Sequence[int]) -> Dict[int, str]:
        """The trace id of each known span id."""

    @abc.abstractmethod
    def span_infos(
        self,
        tenant: str,
        start_ns: int,
        end_ns: int,
        service: Optional[str] = None,
        trace_ids: Optional[Sequence[str]] = None,
        limit: int = 100_000,
        name: Optional[str] = None,
    ) -> List[SpanRecord]:
        """Spans that started in [start_ns, end_ns), of one service, of the given traces and
        with one name if asked; the latest ``limit`` (by start), the latest first.  Only the
        columns aggregations read (:meth:`SpanRecord.outlines`): no kind or attributes.
        """

    @abc.abstractmethod
    def span_records(
        self,
        tenant: str,
        start_ns: int,
        end_ns: int,
        conditions: Sequence[Condition] = (),
        trace_ids: Optional[Sequence[str]] = None,
        limit: int = 100_000,
    ) -> List[SpanRecord]:
        """Spans overlapping [start_ns, end_ns) (ending at or after the start, starting before
        the end: as search) that meet every span-level condition (as a spanset of
        :meth:`find_traces`), of the given traces if any; the latest ``limit`` by start, the
        latest first (ties by span id).  A span stored twice (an export retried) comes once."""

    def metrics_rows(self, tenant: str, plan: MetricsPlan) -> Optional[List[MetricsRow]]:
        """A TraceQL metrics query aggregated by the store, one row per group
        (:mod:`hotspan.store.metrics_sql`); None when this store cannot (the caller reads the
        spans instead)."""
        return None

    def compare_rows(
        self, tenant: str, plan: ComparePlan
    ) -> Optional[Tuple[List[CompareRow], int, Optional[int]]]:
        """A TraceQL ``compare()`` aggregated by the store (:mod:`hotspan.store.compare_sql`):
        its rows, the spans read and their traces (None past ``EXACT_TRACES`` spans); None
        when this store cannot (the caller reads the spans instead)."""
        return None

    @abc.abstractmethod
    def count_local_roots(self, tenant: str, service: str, start_ns: int, end_ns: int) -> int:
        """How many spans of the service that started in [start_ns, end_ns) are its local
        roots, i.e. its requests: spans without a parent, or whose parent is no span of the
        same service in their trace (a call from another service or a client).  Parents are
        looked for from PARENT_LOOKBACK_NS before the range.  A span stored twice (an export
        retried) counts once."""

    @abc.abstractmethod
    def baseline_spans(
        self,
        tenant: str,
        service: str,
        name: str,
        start_ns: int,
        end_ns: int,
        limit: int,
        exclude_trace: str = "",
        exclude_span_ids: Sequence[int] = (),
    ) -> SpanBaseline:
        """The spans of ``service`` named ``name`` that started in [start_ns, end_ns), but
        for ``exclude_span_ids`` of trace ``exclude_trace``, every one of them read in the
        database (a span stored twice counts once): the median of their durations (the mean
        of the middle two for an even count) and the ``limit`` nearest it (ties: the latest
        start first, then the lower span id), nearest first, as :meth:`span_infos` gives."""

    @abc.abstractmethod
    def request_sides(
        self,
        tenant: str,
        service: str,
        start_ns: int,
        end_ns: int,
        sides: Tuple[Sequence[int], Sequence[int]],
        samples: SampleFilter,
    ) -> RequestSides:
        """The requests of ``service`` that started in [start_ns, end_ns) (its local roots,
        as :meth:`count_local_roots` counts them) split between two sets of series by the
        samples in ``samples``' range of their traces: a request goes to the set whose
        samples in its trace sum higher (the first on a tie), to neither when its trace has
        no sample of either; a set's total sums its requests' traces, each trace once."""

    @abc.abstractmethod
    def tag_names(self, tenant: str, since_ns: int = 0) -> Dict[str, List[str]]:
        """Attribute names seen since the given time, per scope (of model.trace.TAG_SCOPES)."""

    @abc.abstractmethod
    def tag_values(
        self, tenant: str, scope: Optional[str], name: str, since_ns: int = 0
    ) -> List[Tuple[str, str]]:
        """(value, TraceQL type) seen for an attribute (in one scope, or with None in any of
        model.trace.UNSCOPED_TAG_SCOPES), sorted by value."""

    # -- agent settings ------------------------------------------------------------------------

    @abc.abstractmethod
    def put_settings_rule(
        self, tenant: str, service: str, selector: str, settings: Mapping[str, Any]
    ) -> SettingsRule:
        """Store the rule for (service, selector), replacing the settings of one already
        there, under a new tenant version (one more than the tenant's current one); returns
        the stored rule once it is durable.  ``settings`` must be JSON-serialisable."""

    @abc.abstractmethod
    def settings_rules(self, tenant: str, service: Optional[str] = None) -> List[SettingsRule]:
        """The tenant's rules (of one service, or all), sorted by service then selector.
        Called on every upload that carries an agent's status: it must be cheap."""

    @abc.abstractmethod
    def delete_settings_rule(self, tenant: str, service: str, selector: str) -> bool:
        """Delete the rule for (service, selector); True if it existed, in which case the
        tenant's version grows by one (agents that followed it must learn of the change)."""

    @abc.abstractmethod
    def settings_version(self, tenant: str) -> int:
        """The tenant's settings version: 0 before any change, then one more per put or
        delete, never smaller after a restart."""

    # -- documents (alert rules and states, recording rules) ---------------------------------

    @abc.abstractmethod
    def put_document(self, tenant: str, kind: str, name: str, body: Mapping[str, Any]) -> Document:
        """Store ``body`` (JSON-serialisable) as the document (tenant, kind, name), replacing
        one already there; returns it once it is durable."""

    @abc.abstractmethod
    def documents(self, kind: str, tenant: Optional[str] = None) -> List[Document]:
        """The documents of one kind, of one tenant or (None) of every tenant, sorted by
        tenant then name.  A put is seen by the next call, from any server of the store."""

    @abc.abstractmethod
    def delete_document(self, tenant: str, kind: str, name: str) -> bool:
        """Delete the document; True if it existed."""

    # -- API tokens (documents of kind TOKEN_KIND) --------------------------------------------

    def put_token(self, token: StoredToken) -> None:
        """Store the token (replacing one of the same tenant and id); returns once durable."""
        if token.role not in TOKEN_ROLES:
            raise ValueError(f"role {token.role!r} is not one of {', '.join(TOKEN_ROLES)}")
        body = {
            "role": token.role,
            "sha256": token.sha256,
            "name": token.name,
            "created_at": token.created_at,
        }
        self.put_document(token.tenant, TOKEN_KIND, token.token_id, body)

    def tokens(self, tenant: Optional[str] = None) -> List[StoredToken]:
        """The tokens of one tenant or (None) of every tenant, sorted by tenant then id.  A
        put or delete is seen by the next call, from any server of the store."""
        found = (_token_of(doc) for doc in self.documents(TOKEN_KIND, tenant))
        return [t for t in found if t is not None]

    def delete_token(self, tenant: str, token_id: str) -> bool:
        """Revoke the token; True if it existed."""
        return self.delete_document(tenant, TOKEN_KIND, token_id)

    # -- lifecycle ---------------------------------------------------------------------------

    def size_bytes(self) -> Optional[int]:
        """Bytes the store's data takes on disk (what /metrics shows), None when unknown."""
        return None

    def kept_retention_ns(self, configured_ns: Optional[int]) -> int:
        """How long data is kept (0: forever), given the server's ``--retention`` (None when
        not given).  A store that several servers share keeps its own."""
        return DEFAULT_RETENTION_NS if configured_ns is None else configured_ns

    @abc.abstractmethod
    def delete_before(
        self, cutoff_ns: int, should_stop: Callable[[], bool] = lambda: False
    ) -> RetentionReport:
        """Delete the samples and spans older than ``cutoff_ns`` (spans by their end), and
        what only they referenced, without holding ingest up for long.  Blocks until done,
        or until ``should_stop()`` says so between two steps."""

    @abc.abstractmethod
    def close(self) -> None:
        """Finish queued writes, then release the store."""
