"""The embedded store's tables, and the transactions that write them."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional

import duckdb

from hotspan.store.attr_index import HASH_CHECK_TEXT, TRACE_ID_NUMBER, attr_hash_sql


def span_attr_rows(source: str) -> str:
    """The rows of the attribute index from the spans of ``source``: the flattened
    attributes (model.trace) split at RS, each record's key before its US or STRING_US, the
    value with that mark first."""
    return (
        f"SELECT tenant_id, key, value, {attr_hash_sql('key', 'value')} AS h, start_ns, "
        f"end_ns, {TRACE_ID_NUMBER} AS trace_id, span_id FROM (SELECT tenant_id, "
        "CASE WHEN p = 0 THEN rec ELSE rec[:p - 1] END AS key, "
        "CASE WHEN p = 0 THEN '' ELSE rec[p:] END AS value, start_ns, end_ns, trace_id, "
        "span_id FROM (SELECT *, greatest(strpos(rec, chr(31)), strpos(rec, chr(28))) AS p "
        "FROM (SELECT tenant_id, start_ns, end_ns, trace_id, span_id, "
        f"unnest(string_split(attrs, chr(30))) AS rec FROM {source})) WHERE rec <> '')"
    )


# A span's OTLP message is written once and read only whole (a trace by id), so it is packed
# as ZSTD: DuckDB's default (dictionary and FSST) took ~3x the space, and a checkpoint spent
# most of its time choosing and building it, a third of the span writer's time.  DuckDB
# before 2.0 writes a column forced to ZSTD uncompressed, so there the default stays.
RAW_COMPRESSION = " USING COMPRESSION zstd" if int(duckdb.__version__.split(".")[0]) >= 2 else ""

SCHEMA = """
CREATE TABLE IF NOT EXISTS series (
    tenant VARCHAR NOT NULL,
    series_id BIGINT NOT NULL,
    profile_type VARCHAR NOT NULL,
    labels VARCHAR NOT NULL,          -- JSON object
    PRIMARY KEY (tenant, series_id)
);
CREATE TABLE IF NOT EXISTS frames (
    frame_id BIGINT PRIMARY KEY,
    name VARCHAR NOT NULL,
    filename VARCHAR NOT NULL,
    line BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS stacks (
    stack_id BIGINT PRIMARY KEY,
    frame_ids BLOB NOT NULL           -- little-endian int64 frame ids, root first
);
CREATE TABLE IF NOT EXISTS tenants (
    tenant_id INTEGER PRIMARY KEY,
    tenant VARCHAR NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS samples (
    tenant_id INTEGER NOT NULL,       -- tenants.tenant_id: a number per row, not a string
    series_id BIGINT NOT NULL,
    ts BIGINT NOT NULL,               -- nanoseconds since the epoch
    stack_id BIGINT NOT NULL,
    value BIGINT NOT NULL,
    span_id UBIGINT NOT NULL,         -- 0: no span
    trace_id VARCHAR                  -- 32 hex digits or NULL
);
CREATE TABLE IF NOT EXISTS span_groups (
    group_id BIGINT PRIMARY KEY,      -- content hash of resource and scope
    service VARCHAR NOT NULL,
    resource BLOB NOT NULL,           -- OTLP Resource message
    resource_schema_url VARCHAR NOT NULL,
    scope BLOB NOT NULL,              -- OTLP InstrumentationScope message
    scope_schema_url VARCHAR NOT NULL,
    attrs VARCHAR NOT NULL            -- resource attributes, flattened (model.trace)
);
CREATE TABLE IF NOT EXISTS spans (
    tenant_id INTEGER NOT NULL,
    trace_id VARCHAR NOT NULL,        -- 32 hex digits
    span_id UBIGINT NOT NULL,
    parent_span_id UBIGINT NOT NULL,  -- 0: a root span
    name VARCHAR NOT NULL,
    kind TINYINT NOT NULL,
    service VARCHAR NOT NULL,
    start_ns BIGINT NOT NULL,
    end_ns BIGINT NOT NULL,
    status_code TINYINT NOT NULL,
    attrs VARCHAR NOT NULL,           -- span attributes, flattened (model.trace)
    group_id BIGINT NOT NULL,
    raw BLOB NOT NULL{raw_compression}  -- the OTLP Span message as received
);
-- One row per span attribute (store.attr_index): search on an attribute finds its traces
-- here.  Commits append to span_attrs_recent; every RUN_ROWS rows move to span_attrs as one
-- run sorted by h.  Columns: tenant_id, key, value with its type mark first, h, start_ns,
-- end_ns, trace_id, span_id.  Spans a database held before it had the index are not in it
-- (indexing them all at once would hold up the opening for minutes): indexed_from is one
-- past their latest start, and search reads the spans that started before it as it did
-- without the index (0: every span is indexed; retention sets it once they are gone).
CREATE TABLE IF NOT EXISTS span_attrs_meta AS
    SELECT coalesce(max(start_ns) + 1, 0)::BIGINT AS indexed_from,
           hash('{hash_check}') AS hash_check FROM spans;
-- A DuckDB that hashes otherwise than the one that wrote the index (attr_index) finds none of
-- its rows: the spans so far are read as without the index.
UPDATE span_attrs_meta SET hash_check = hash('{hash_check}'),
    indexed_from = (SELECT coalesce(max(start_ns) + 1, 0) FROM spans)
    WHERE hash_check <> hash('{hash_check}');
CREATE TABLE IF NOT EXISTS span_attrs AS SELECT * FROM ({span_attrs}) LIMIT 0;
CREATE TABLE IF NOT EXISTS span_attrs_recent AS SELECT * FROM span_attrs LIMIT 0;
CREATE TABLE IF NOT EXISTS span_tags (
    tenant_id INTEGER NOT NULL,
    scope VARCHAR NOT NULL,           -- one of model.trace.TAG_SCOPES
    key VARCHAR NOT NULL,
    value VARCHAR NOT NULL,
    type VARCHAR NOT NULL,            -- TraceQL's: string, int, float, bool or keyword
    last_seen BIGINT NOT NULL,        -- end of a recent span with it (rewritten hourly)
    PRIMARY KEY (tenant_id, scope, key, value, type)
);
CREATE TABLE IF NOT EXISTS settings_rules (
    tenant VARCHAR NOT NULL,
    service VARCHAR NOT NULL,
    selector VARCHAR NOT NULL,
    settings VARCHAR NOT NULL,        -- JSON object
    version BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,       -- unix nanoseconds
    PRIMARY KEY (tenant, service, selector)
);
CREATE TABLE IF NOT EXISTS documents (
    tenant VARCHAR NOT NULL,
    kind VARCHAR NOT NULL,            -- alert_rule, alert_state, recording_rule...
    name VARCHAR NOT NULL,
    body VARCHAR NOT NULL,            -- JSON
    updated_at BIGINT NOT NULL,       -- unix nanoseconds
    PRIMARY KEY (tenant, kind, name)
);
CREATE TABLE IF NOT EXISTS settings_versions (
    tenant VARCHAR PRIMARY KEY,
    version BIGINT NOT NULL           -- also counts deletes, which leave no rule behind
);
"""
SCHEMA = (
    SCHEMA.replace("{span_attrs}", span_attr_rows("spans"))
    .replace("{hash_check}", HASH_CHECK_TEXT)
    .replace("{raw_compression}", RAW_COMPRESSION)
)


def upgrade(con: Any) -> None:
    """Before :data:`SCHEMA`: an attribute index from before its trace ids were numbers is
    dropped (SCHEMA makes it anew) and the spans it held are read as without it, as when the
    hash changes, rather than rewritten while the store opens."""
    found = con.execute(
        "SELECT data_type FROM information_schema.columns "
        "WHERE table_name = 'span_attrs' AND column_name = 'trace_id'"
    ).fetchone()
    if found is None or found[0] == "UHUGEINT":
        return
    with transaction(con):
        con.execute("DROP TABLE span_attrs")
        con.execute("DROP TABLE IF EXISTS span_attrs_recent")
        con.execute(
            "UPDATE span_attrs_meta SET indexed_from = "
            "(SELECT coalesce(max(start_ns) + 1, 0) FROM spans)"
        )


@contextlib.contextmanager
def transaction(con: Any, undo: Optional[Callable[[], None]] = None) -> Iterator[None]:
    """What the block writes, all or nothing; ``undo`` forgets what the block cached of a
    transaction that failed."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
        con.execute("COMMIT")
    except Exception:
        with contextlib.suppress(duckdb.Error):  # a failed COMMIT has already rolled back
            con.execute("ROLLBACK")
        if undo is not None:
            undo()
        raise
