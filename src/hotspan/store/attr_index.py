"""The embedded store's span attribute index: the sort key that makes an attribute's rows
one range of a sorted run (the ClickHouse store keys its ``span_attrs`` table by key and value
instead).

Each row of the index is one attribute of one span.  Its sort key ``h`` is 24 bits of a hash
of the key, then 40 bits of a hash of the value: the rows of one attribute, and those of one
key, are each one range of ``h``.  Commits append to ``span_attrs_recent``; once it holds
:data:`RUN_ROWS` rows they move to ``span_attrs`` as one run sorted by ``h``, whose row groups'
``h`` bounds (DuckDB's zone maps) then let a lookup read one row group per run.

The hash is DuckDB's own ``hash()`` (tens of nanoseconds a value, where MD5 costs a
microsecond on every attribute written), computed for lookups by the DuckDB library of this
process.  DuckDB does not promise it across versions: ``span_attrs_meta`` keeps the hash of a
fixed text, and a DuckDB that hashes it otherwise reads the spans indexed so far as without
the index (``duckdb_schema``).
"""

from __future__ import annotations

import threading
from typing import Any, List, Optional, Sequence, Tuple

import duckdb
import numpy as np

from hotspan._speedups import load_module
from hotspan.model.trace import RS, STRING_US, US

KEY_BITS = 24
VALUE_BITS = 64 - KEY_BITS
# Rows of the recent part moved as one sorted run: at ~9 attributes a span, ~220,000 spans.
# Larger runs mean fewer row groups per lookup, and a longer sort on the commit that moves it.
RUN_ROWS = 2_000_000
# The index keeps a trace id (32 hex digits in ``spans``) as the number they spell: 16 bytes
# where the text takes 32 and a length, on every attribute of every span, a fifth of what a
# span costs the writer (the insert, the WAL, the checkpoint).  Lookups spell the ids found.
TRACE_ID_NUMBER = "('0x' || trace_id)::UHUGEINT"
TRACE_ID_TEXT = "lower(lpad(hex(trace_id), 32, '0'))"
# What span_attrs_meta.hash_check holds the hash of.
HASH_CHECK_TEXT = "hotspan span attribute index"

_native = load_module("_attrs")

_lock = threading.Lock()
_con: Optional[duckdb.DuckDBPyConnection] = None


def attr_hash_sql(key: str, value: str) -> str:
    """The SQL of ``h`` for the SQL expressions (VARCHAR) of an attribute's key and value."""
    return f"(((hash({key}) >> {VALUE_BITS}) << {VALUE_BITS}) | (hash({value}) >> {KEY_BITS}))"


def _scalar(sql: str, params: List[Any]) -> int:
    global _con
    with _lock:  # one private in-memory database, for its hash function
        if _con is None:
            _con = duckdb.connect()
        row = _con.execute(sql, params).fetchone()
    return int(row[0]) if row else 0


def attr_hash(key: str, value: str) -> int:
    """``h`` of an attribute, as :func:`attr_hash_sql` computes it in the store."""
    return _scalar(f"SELECT {attr_hash_sql('$1::VARCHAR', '$2::VARCHAR')}", [key, value])


def key_hash_range(key: str) -> Tuple[int, int]:
    """The range of ``h`` (both ends included) that holds every value of a key."""
    low = _scalar(f"SELECT (hash($1::VARCHAR) >> {VALUE_BITS}) << {VALUE_BITS}", [key])
    return low, low | ((1 << VALUE_BITS) - 1)


def py_split_attributes(texts: Sequence[str]) -> Tuple[bytes, List[str], List[str]]:
    """The index rows of flattened attribute texts (model.trace), as
    ``duckdb_schema.span_attr_rows`` reads them in SQL: the native int64 number of rows of
    each text (bytes), then the rows' keys and values.  A record's key ends at its US or
    STRING_US (the later of the two first ones); its value keeps that mark."""
    counts = np.zeros(len(texts), dtype=np.int64)
    keys: List[str] = []
    values: List[str] = []
    for i, text in enumerate(texts):
        before = len(keys)
        for record in text.split(RS):
            if not record:
                continue
            mark = max(record.find(US), record.find(STRING_US))
            keys.append(record if mark < 0 else record[:mark])
            values.append("" if mark < 0 else record[mark:])
        counts[i] = len(keys) - before
    return counts.tobytes(), keys, values


# The C twin costs ~0.2 us a span where this Python one costs several.
split_attributes = _native.split_attributes if _native is not None else py_split_attributes


def trace_id_halves(trace_ids: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
    """The high and low 64 bits of trace ids of 32 hex digits (as ``spans`` holds them), for
    the index's number (``(hi::UHUGEINT << 64) | lo``): parsing the text in SQL, once a row,
    cost more than the rest of the row."""
    if any(len(t) != 32 for t in trace_ids):
        raise ValueError("a trace id is not 32 hex digits")
    both = np.frombuffer(bytes.fromhex("".join(trace_ids)), dtype=">u8")
    return both[0::2].astype(np.uint64), both[1::2].astype(np.uint64)
