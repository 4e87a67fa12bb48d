"""The ClickHouse schema: tables made for hotspan's access paths, migrated by version.

- ``samples``: one row per sample, ``MergeTree`` ordered by (tenant, series, time) so that a
  flame graph of one service reads only that service's rows of the range; partitioned by day so
  that retention drops whole partitions; ``TTL`` when the server has a retention period.
- ``stacks``, ``frames``, ``span_groups``: content-addressed (the id is a hash of the content),
  written by any server without coordination, duplicates folded by ``ReplacingMergeTree``.
  Stacks and frames carry the time they were last written so that they expire with the samples
  that stopped using them: each server writes an id again once a day while it is in use.
- ``series``: one row per series and commit, folded by ``AggregatingMergeTree`` into the
  series' labels and first/last sample time.
- ``spans``: ordered by (tenant, hour, trace id), so that a trace's spans sit together and a
  time range narrows by the hour; a projection in (tenant, service, start) order serves
  search by service.  ``trace_index``, ordered by (tenant, trace id), holds each trace's time
  bounds: a trace by id is two primary-key lookups.  ``span_attrs``, one row per span
  attribute, ordered by (tenant, key, value, start) and filled by a materialized view as spans
  are inserted: search on an attribute finds its traces there, then reads only their granules
  of ``spans``.
- ``span_tags``, ``settings_rules``, ``documents`` (alert and recording rules, alert states):
  small tables folded by ``ReplacingMergeTree`` on a version.

With a cluster name every table is a ``Replicated*MergeTree`` named ``<table>_local`` created
``ON CLUSTER``, with a ``Distributed`` table of the plain name over it: servers write and read
the distributed tables and run retention on the local ones.
"""

from __future__ import annotations

import re
from typing import List, NamedTuple, Optional, Sequence, Tuple

SCHEMA_VERSION = 3


class Table(NamedTuple):
    name: str
    columns: str
    engine: str  # MergeTree, ReplacingMergeTree(ver), AggregatingMergeTree, ...
    order_by: str
    partition_by: str = ""
    ttl_column: str = ""  # unix nanoseconds; the row expires ``retention`` after it
    # Days a row outlives the retention: stacks and frames are written again once a day
    # while in use, and must outlive the samples that name them.
    ttl_slack_days: int = 0
    # Facts, not content-addressed: a retried insert (same token) must not add rows twice.
    deduplicate: bool = False
    shard_by: str = "rand()"


# Days since the epoch (UTC): a number, so retention compares partitions without time zones.
_DAY = "intDiv({}, 86400000000000)"

TABLES = (
    Table(
        "samples",
        """
    tenant LowCardinality(String),
    series_id Int64,
    ts Int64 CODEC(Delta, ZSTD(1)),
    stack_id Int64 CODEC(ZSTD(1)),
    value Int64 CODEC(T64, ZSTD(1)),
    span_id UInt64 CODEC(ZSTD(1)),
    trace_id String CODEC(ZSTD(1)),  -- 32 hex digits, '' for none
    INDEX span_idx span_id TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX trace_idx trace_id TYPE bloom_filter(0.01) GRANULARITY 4""",
        "MergeTree",
        "(tenant, series_id, ts)",
        _DAY.format("ts"),
        "ts",
        deduplicate=True,
        shard_by="cityHash64(tenant, series_id)",
    ),
    Table(
        "series",
        """
    tenant LowCardinality(String),
    series_id Int64,
    profile_type SimpleAggregateFunction(any, String),
    labels SimpleAggregateFunction(any, String),  -- JSON object
    first_ts SimpleAggregateFunction(min, Int64),
    last_ts SimpleAggregateFunction(max, Int64)""",
        "AggregatingMergeTree",
        "(tenant, series_id)",
        shard_by="cityHash64(tenant, series_id)",
    ),
    Table(
        "stacks",
        """
    stack_id Int64,
    frame_ids Array(Int64) CODEC(ZSTD(1)),  -- root first
    written DateTime""",
        "ReplacingMergeTree(written)",
        "stack_id",
        ttl_column="toInt64(toUnixTimestamp(written)) * 1000000000",
        ttl_slack_days=2,
        shard_by="stack_id",
    ),
    Table(
        "frames",
        """
    frame_id Int64,
    name String CODEC(ZSTD(1)),
    filename String CODEC(ZSTD(1)),
    line Int64,
    written DateTime""",
        "ReplacingMergeTree(written)",
        "frame_id",
        ttl_column="toInt64(toUnixTimestamp(written)) * 1000000000",
        ttl_slack_days=2,
        shard_by="frame_id",
    ),
    Table(
        "spans",
        """
    tenant LowCardinality(String),
    trace_id String,
    span_id UInt64,
    parent_span_id UInt64,  -- 0: a root span
    name LowCardinality(String),
    kind Int8,
    service LowCardinality(String),
    start_ns Int64 CODEC(Delta, ZSTD(1)),
    end_ns Int64 CODEC(Delta, ZSTD(1)),
    status_code Int8,
    attrs String CODEC(ZSTD(1)),  -- span attributes, flattened (model.trace)
    group_id Int64,
    raw String CODEC(ZSTD(1)),  -- the OTLP Span message as received
    INDEX trace_idx trace_id TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX span_idx span_id TYPE bloom_filter(0.01) GRANULARITY 4,
    -- Search keeps spans that overlap its range: ``end_ns >= start`` skips granules with it.
    INDEX end_idx end_ns TYPE minmax GRANULARITY 1,
    -- Search by service reads this copy (all but the span messages) in service order.
    PROJECTION by_service (
        SELECT tenant, trace_id, span_id, parent_span_id, name, kind, service, start_ns,
               end_ns, status_code, attrs, group_id
        ORDER BY (tenant, service, start_ns)
    )""",
        "MergeTree",
        # By hour, then trace: a trace's spans sit together (a trace by id reads a granule or
        # two, found by the primary key), and a time range still narrows by the hour.
        "(tenant, intDiv(start_ns, 3600000000000), trace_id)",
        _DAY.format("start_ns"),
        "end_ns",
        deduplicate=True,
        shard_by="cityHash64(trace_id)",
    ),
    Table(
        "span_attrs",
        """
    tenant LowCardinality(String),
    key LowCardinality(String),
    value String CODEC(ZSTD(1)),  -- the type mark (model.trace's US or STRING_US), the text
    start_ns Int64 CODEC(Delta, ZSTD(1)),
    end_ns Int64 CODEC(Delta, ZSTD(1)),
    trace_id String CODEC(ZSTD(1)),
    span_id UInt64 CODEC(ZSTD(1))""",
        "MergeTree",
        # An attribute's value is a range of the primary key: an equality reads a granule or
        # two per day, a regular expression the values of its key only.
        "(tenant, key, value, start_ns)",
        _DAY.format("start_ns"),
        "end_ns",
        shard_by="cityHash64(trace_id)",
    ),
    Table(
        "trace_index",
        """
    tenant LowCardinality(String),
    trace_id String,
    start_ns Int64,
    end_ns Int64""",
        "MergeTree",
        "(tenant, trace_id)",
        _DAY.format("start_ns"),
        "end_ns",
        deduplicate=True,
        shard_by="cityHash64(trace_id)",
    ),
    Table(
        "span_groups",
        """
    group_id Int64,
    service LowCardinality(String),
    resource String,  -- OTLP Resource message
    resource_schema_url String,
    scope String,  -- OTLP InstrumentationScope message
    scope_schema_url String,
    attrs String  -- resource attributes, flattened (model.trace)""",
        "ReplacingMergeTree",
        "group_id",
        shard_by="group_id",
    ),
    Table(
        "span_tags",
        """
    tenant LowCardinality(String),
    scope LowCardinality(String),  -- one of model.trace.TAG_SCOPES
    key String,
    value String,
    type LowCardinality(String),  -- TraceQL's: string, int, float, bool or keyword
    last_seen Int64  -- end of a recent span with it (written again hourly)""",
        "ReplacingMergeTree(last_seen)",
        "(tenant, scope, key, value, type)",
        shard_by="cityHash64(tenant)",
    ),
    Table(
        "settings_rules",
        """
    tenant String,
    service String,
    selector String,
    settings String,  -- JSON object
    deleted UInt8,  -- a delete leaves a row: it carries the tenant's version forward
    version Int64,
    updated_at Int64  -- unix nanoseconds""",
        "ReplacingMergeTree(version)",
        "(tenant, service, selector)",
        shard_by="cityHash64(tenant)",
    ),
    Table(
        "documents",
        """
    tenant String,
    kind LowCardinality(String),
    name String,
    body String,  -- JSON
    deleted UInt8,  -- a delete is a newer row that says so
    updated_at Int64  -- unix nanoseconds: the newest row of a document wins""",
        "ReplacingMergeTree(updated_at)",
        "(tenant, kind, name)",
        shard_by="cityHash64(tenant)",
    ),
)

TABLE_NAMES = tuple(t.name for t in TABLES)


class Layout(NamedTuple):
    """Where a store's tables live: one server, or a cluster."""

    database: str
    cluster: Optional[str] = None

    @property
    def on_cluster(self) -> str:
        return f" ON CLUSTER {quote_name(self.cluster)}" if self.cluster else ""

    def local(self, table: str) -> str:
        """The table that holds the rows (what retention deletes from)."""
        return f"{table}_local" if self.cluster else table


def quote_name(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _ttl(table: Table, retention_days: Optional[int]) -> str:
    if not table.ttl_column or not retention_days:
        return ""
    expr = f"toDateTime(intDiv({table.ttl_column}, 1000000000))"
    return f"\nTTL {expr} + INTERVAL {int(retention_days) + table.ttl_slack_days} DAY"


def ttl_days(engine_full: str) -> Optional[int]:
    """The retention in days of a table as ``system.tables.engine_full`` shows it (its TTL
    less the table's slack is the same for every table; samples' has none)."""
    match = re.search(r"\bTTL\b.*?toIntervalDay\((\d+)\)", engine_full)
    return int(match.group(1)) if match else None


def create_statements(
    layout: Layout, retention_days: Optional[int] = None, only: Optional[Sequence[str]] = None
) -> List[str]:
    """CREATE statements for every table, or the ``only`` ones (idempotent: IF NOT EXISTS);
    the first creates ``schema_migrations``."""
    if layout.cluster:
        # One table for the whole cluster (no {shard} in its path): every node reads the
        # version any node wrote.
        migrations_engine = (
            "ReplicatedReplacingMergeTree('/clickhouse/hotspan/{database}/schema_migrations', "
            "'{replica}')"
        )
    else:
        migrations_engine = "ReplacingMergeTree"
    out = [
        f"CREATE TABLE IF NOT EXISTS {quote_name('schema_migrations')}{layout.on_cluster} "
        f"(version UInt32, applied_at DateTime DEFAULT now()) ENGINE = {migrations_engine} "
        "ORDER BY version"
    ]
    for table in TABLES:
        if only is not None and table.name not in only:
            continue
        engine = table.engine
        if layout.cluster:
            # The default replication path and replica macros ({database}/{table}, {shard},
            # {replica}) of the nodes' configuration.
            engine = "Replicated" + engine
        if "(" not in engine:
            engine += "()"
        settings = ["index_granularity = 8192"]
        if table.partition_by:
            # TTL drops whole parts where it can, rather than rewriting them.
            settings.append("ttl_only_drop_parts = 1")
        if "PROJECTION" in table.columns:
            # Retention's row deletes (without a TTL) rebuild the projection's parts.
            settings.append("lightweight_mutation_projection_mode = 'rebuild'")
        if table.deduplicate and not layout.cluster:
            # Replicated tables deduplicate inserts by default; plain ones need a window.
            settings.append("non_replicated_deduplication_window = 1000")
        out.append(
            f"CREATE TABLE IF NOT EXISTS {quote_name(layout.local(table.name))}"
            f"{layout.on_cluster} ({table.columns}\n) ENGINE = {engine}"
            + (f"\nPARTITION BY {table.partition_by}" if table.partition_by else "")
            + f"\nORDER BY {table.order_by}"
            + _ttl(table, retention_days)
            + f"\nSETTINGS {', '.join(settings)}"
        )
        if layout.cluster:
            out.append(
                f"CREATE TABLE IF NOT EXISTS {quote_name(table.name)}{layout.on_cluster} "
                f"AS {quote_name(layout.local(table.name))} ENGINE = Distributed("
                f"{quote_name(layout.cluster)}, {quote_name(layout.database)}, "
                f"{quote_name(layout.local(table.name))}, {table.shard_by})"
            )
    return out


def ttl_statements(layout: Layout, retention_days: Optional[int]) -> List[Tuple[Table, str]]:
    """(table, ALTER statement) that set (or remove) the retention TTL of tables that
    already exist.  Run them with ``materialize_ttl_after_modify = 0``: the new TTL then
    applies to parts as they merge, rather than by rewriting every part at once."""
    out = []
    for table in TABLES:
        if not table.ttl_column:
            continue
        local = layout.local(table.name)
        name = quote_name(local)
        ttl = _ttl(table, retention_days).strip()
        action = f"MODIFY {ttl}" if ttl else "REMOVE TTL"
        out.append((table, f"ALTER TABLE {name}{layout.on_cluster} {action}"))
    return out


# Version -> statements that bring a database from the version before up to it.  Version 1 is
# the tables above; a later change appends (ALTER ... ADD COLUMN IF NOT EXISTS, ...) so that
# every server that starts brings an older database up to date, whichever starts first.
def _add_documents(layout: Layout, retention_days: Optional[int] = None) -> List[str]:
    return create_statements(layout, retention_days, only=("documents",))


def _span_attr_rows(source: str) -> str:
    """The rows of ``span_attrs`` from the spans of ``source``: the flattened attributes
    (model.trace) split at RS, each record's key before its US or STRING_US."""
    return (
        "SELECT tenant, if((greatest(position(rec, '\\x1f'), position(rec, '\\x1c')) AS p) = 0, "
        "rec, substring(rec, 1, p - 1)) AS key, "
        "if(p = 0, '', substring(rec, p)) AS value, start_ns, end_ns, trace_id, span_id "
        f"FROM {source} ARRAY JOIN splitByChar('\\x1e', attrs) AS rec "
        "WHERE rec != ''"
    )


def _add_span_attrs(layout: Layout, retention_days: Optional[int] = None) -> List[str]:
    """The attribute index: its table, the view that fills it as spans are inserted, and
    the spans already stored, copied in (once the view runs, so that none is missed; a span
    both copied and seen by the view is there twice, which lookups do not mind)."""
    out = create_statements(layout, retention_days, only=("span_attrs",))
    view = quote_name("span_attrs_view")
    rows = _span_attr_rows(quote_name(layout.local("spans")))
    out.append(
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {view}{layout.on_cluster} "
        f"TO {quote_name(layout.local('span_attrs'))} AS {rows}"
    )
    out.append(f"INSERT INTO {quote_name('span_attrs')} {_span_attr_rows(quote_name('spans'))}")
    return out


MIGRATIONS: dict = {1: create_statements, 2: _add_documents, 3: _add_span_attrs}
