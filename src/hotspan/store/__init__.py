"""Storage backends behind one interface (:class:`hotspan.store.base.Store`)."""

from hotspan.store.base import SeriesRecord, StackValues, Store, StoreError

__all__ = ["SeriesRecord", "StackValues", "Store", "StoreError", "open_store"]


def open_store(url: str) -> Store:
    """Open a store from a URL-ish string: a directory path (or ``duckdb:PATH``) for the
    embedded DuckDB store."""
    path = url[len("duckdb:") :] if url.startswith("duckdb:") else url
    from hotspan.store.duckdb import DuckDBStore

    return DuckDBStore(path)
