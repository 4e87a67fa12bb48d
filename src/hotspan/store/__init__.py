"""Storage backends behind one interface (:class:`hotspan.store.base.Store`)."""

from typing import Optional

from hotspan.store.base import SeriesRecord, StackValues, Store, StoreError

__all__ = ["SeriesRecord", "StackValues", "Store", "StoreError", "open_store"]


def open_store(
    url: str, retention_ns: Optional[int] = None, cluster: Optional[str] = None
) -> Store:
    """Open a store from a URL-ish string: ``clickhouse://user:password@host:8123/database``
    (``clickhouses://`` for TLS) for ClickHouse; a directory path (or ``duckdb:PATH``) for the
    embedded DuckDB store.  ``retention_ns`` (None: not given) settles ClickHouse's TTL, which
    all servers share (DuckDB deletes on ``Store.delete_before`` only); ``cluster`` creates
    ClickHouse's tables ``ON CLUSTER``."""
    if url.startswith(("clickhouse://", "clickhouses://")):
        from hotspan.store.clickhouse import ClickHouseStore

        return ClickHouseStore(url, retention_ns=retention_ns, cluster=cluster)
    if cluster:
        raise StoreError("--cluster needs a ClickHouse store (--store clickhouse://...)")
    path = url[len("duckdb:") :] if url.startswith("duckdb:") else url
    from hotspan.store.duckdb import DuckDBStore

    return DuckDBStore(path)
