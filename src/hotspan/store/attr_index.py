"""The embedded store's span attribute index: the sort key that makes an attribute's rows
one range of a sorted run (the ClickHouse store keys its ``span_attrs`` table by key and value
instead).

Each row of the index is one attribute of one span.  Its sort key ``h`` is 24 bits of a hash
of the key, then 40 bits of a hash of the value (MD5 both, as DuckDB's ``md5_number_upper``
reads it: stable across versions, unlike ``hash()``): the rows of one attribute, and those of
one key, are each one range of ``h``.  Commits append to ``span_attrs_recent``; once it holds
:data:`RUN_ROWS` rows they move to ``span_attrs`` as one run sorted by ``h``, whose row groups'
``h`` bounds (DuckDB's zone maps) then let a lookup read one row group per run.
"""

from __future__ import annotations

import hashlib
from typing import Tuple

KEY_BITS = 24
VALUE_BITS = 64 - KEY_BITS
# Rows of the recent part moved as one sorted run: at ~9 attributes a span, ~220,000 spans.
# Larger runs mean fewer row groups per lookup, and a longer sort on the commit that moves it.
RUN_ROWS = 2_000_000


def attr_hash_sql(key: str, value: str) -> str:
    """The SQL of ``h`` for the SQL expressions of an attribute's key and value."""
    return (
        f"(((md5_number_upper({key}) >> {VALUE_BITS}) << {VALUE_BITS}) "
        f"| (md5_number_upper({value}) >> {KEY_BITS}))"
    )


def _md5_upper(text: str) -> int:
    return int.from_bytes(hashlib.md5(text.encode()).digest()[:8], "little")


def attr_hash(key: str, value: str) -> int:
    """``h`` of an attribute, as :func:`attr_hash_sql` computes it."""
    return (_md5_upper(key) >> VALUE_BITS) << VALUE_BITS | _md5_upper(value) >> KEY_BITS


def key_hash_range(key: str) -> Tuple[int, int]:
    """The range of ``h`` (both ends included) that holds every value of a key."""
    low = (_md5_upper(key) >> VALUE_BITS) << VALUE_BITS
    return low, low | ((1 << VALUE_BITS) - 1)
