"""A test-only ClickHouse HTTP interface served over ``chdb`` (in-process ClickHouse).

No real clickhouse-server can be installed on the test machines, but ClickHouse itself ships on
PyPI as ``chdb``. This module puts the part of ClickHouse's HTTP protocol that
``clickhouse-connect`` uses in front of it, so the product's ClickHouse store talks to a real
ClickHouse engine (its SQL, its MergeTree, its Native parser and writer) through the real client,
unchanged::

    python3 -m tests.clickhouse_http --path DIR --port PORT [--user U --password P]
                                     [--ready-file F] [--connections N]

What is served (the ClickHouse HTTP interface is the spec):

* ``GET|HEAD /ping`` and ``/replicas_status`` -> ``Ok.``.
* ``GET /?query=...`` and ``POST /``: the statement is the ``query`` URL parameter followed by the
  body (or the ``query`` field of a multipart form); ``database`` parameter or
  ``X-ClickHouse-Database``; ``default_format`` or ``X-ClickHouse-Format``; every other parameter
  that is not an HTTP transport parameter is a setting, applied with ``SET`` for that request only
  (an unknown one fails with ClickHouse's ``UNKNOWN_SETTING``); ``param_<name>`` values fill
  ``{name:Type}`` placeholders. GET (and ``readonly``) only runs reading statements, as ClickHouse.
* ``INSERT ... FORMAT <fmt>`` followed by data: the data bytes go through ClickHouse's own input
  format parser (chdb's streaming insert), never decoded here.
* Request bodies compressed with ``Content-Encoding`` lz4 (concatenated frames, as
  clickhouse-connect sends one frame per block), zstd, br (when their modules are installed),
  gzip and deflate; responses compressed as ClickHouse does when ``enable_http_compression`` is on
  and ``Accept-Encoding`` names a method this module can write.
* Response headers ``X-ClickHouse-Query-Id``, ``-Format`` (for statements that return a result),
  ``-Summary`` (read/written rows and bytes: clickhouse-connect returns it from inserts),
  ``-Timezone``, ``-Server-Display-Name``; errors as ClickHouse sends them: the HTTP status
  ClickHouse maps the error code to, ``X-ClickHouse-Exception-Code`` and the body
  ``Code: N. DB::Exception: ...``.
* Basic auth, ``X-ClickHouse-User``/``X-ClickHouse-Key`` or ``user``/``password`` parameters
  checked against ``--user``/``--password`` (none configured: everyone is let in).
* ``session_id``: a ``SET``/``USE`` sent in a session holds for that session's later requests,
  and a second request while one of the same session runs fails with ``SESSION_IS_LOCKED``.

Concurrency: measured with chdb 4.4 (ClickHouse 26.9), one ``chdb`` connection is thread-safe but
runs one statement at a time (a second query waits for the first; a streaming insert refuses any
other statement on its connection), and chdb releases the GIL while a statement runs. Several
connections opened on the same path in one process share one embedded server (the same
databases and tables) and do run in parallel, each with its own settings and current database,
which is what a ClickHouse HTTP request has too. So the server keeps a small pool of connections
(``--connections``, default: the number of CPUs, at least 2) and each request takes one for the
whole statement; requests beyond the pool size wait for a free connection. A request's settings
are applied to its connection with one ``SET`` only when they differ from what that connection
already has, so a client that sends the same settings every time (clickhouse-connect does) costs
no extra statement.

Not served: external data tables, ``compress``/``decompress`` (ClickHouse's own block
compression), progress headers, temporary tables that outlive a request, multiple users or roles.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import email.parser
import email.policy
import gzip
import json
import os
import queue
import re
import signal
import socket
import sys
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple
from urllib.parse import parse_qsl, urlsplit

try:  # clickhouse-connect brings lz4, the compression it uses for inserts by default
    import lz4.frame as _lz4_frame
except ImportError:  # pragma: no cover - depends on the environment
    _lz4_frame = None

_zstd: Any = None
for _name in ("compression.zstd", "backports.zstd"):  # the modules clickhouse-connect uses
    try:
        _zstd = __import__(_name, fromlist=["decompress"])
        break
    except ImportError:
        continue

try:
    import brotli as _brotli
except ImportError:
    _brotli = None


# HTTP parameters that steer the request rather than name a setting (ClickHouse's HTTPHandler
# reserves the same names); they are never passed to SET.
_TRANSPORT_PARAMS = frozenset(
    {
        "query",
        "database",
        "default_format",
        "user",
        "password",
        "quota_key",
        "query_id",
        "session_id",
        "session_timeout",
        "session_check",
        "close_session",
        "stacktrace",
        "role",
        "wait_end_of_query",
        "buffer_size",
        "client_protocol_version",
        "compress",
        "decompress",
        "readonly",
    }
)

# Statements that return a result set: ClickHouse names their output format in
# X-ClickHouse-Format, and clickhouse-connect's command() relies on that to tell "" from a summary.
_RESULT_STATEMENTS = frozenset(
    {"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS", "CHECK"}
)
# What GET (readonly) may run, as ClickHouse's readonly=2 allows.
_READ_STATEMENTS = _RESULT_STATEMENTS | {"SET", "USE"}

# ClickHouse's exceptionCodeToHTTPStatus, by error name.
_STATUS_BY_ERROR = {
    401: {"REQUIRED_PASSWORD"},
    403: {
        "UNKNOWN_USER",
        "WRONG_PASSWORD",
        "AUTHENTICATION_FAILED",
        "SET_NON_GRANTED_ROLE",
        "ACCESS_DENIED",
    },
    400: {
        "BAD_ARGUMENTS",
        "CANNOT_COMPILE_REGEXP",
        "CANNOT_PARSE_TEXT",
        "CANNOT_PARSE_ESCAPE_SEQUENCE",
        "CANNOT_PARSE_QUOTED_STRING",
        "CANNOT_PARSE_DATE",
        "CANNOT_PARSE_DATETIME",
        "CANNOT_PARSE_NUMBER",
        "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING",
        "CANNOT_PARSE_IPV4",
        "CANNOT_PARSE_IPV6",
        "CANNOT_PARSE_INPUT_ASSERTION_FAILED",
        "CANNOT_PARSE_UUID",
        "DUPLICATE_COLUMN",
        "ILLEGAL_COLUMN",
        "UNKNOWN_ELEMENT_IN_AST",
        "UNKNOWN_TYPE_OF_AST_NODE",
        "THERE_IS_NO_COLUMN",
        "TOO_DEEP_AST",
        "TOO_BIG_AST",
        "UNEXPECTED_AST_STRUCTURE",
        "SYNTAX_ERROR",
        "INCORRECT_DATA",
        "TYPE_MISMATCH",
        "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",
    },
    404: {
        "UNKNOWN_TABLE",
        "UNKNOWN_FUNCTION",
        "UNKNOWN_IDENTIFIER",
        "UNKNOWN_TYPE",
        "UNKNOWN_STORAGE",
        "UNKNOWN_DATABASE",
        "UNKNOWN_SETTING",
        "UNKNOWN_DIRECTION_OF_SORTING",
        "UNKNOWN_AGGREGATE_FUNCTION",
        "UNKNOWN_FORMAT",
        "UNKNOWN_DATABASE_ENGINE",
        "UNKNOWN_TYPE_OF_QUERY",
        "UNKNOWN_ROLE",
    },
    413: {"QUERY_IS_TOO_LARGE"},
    501: {"NOT_IMPLEMENTED"},
    # SOCKET_TIMEOUT, CANNOT_OPEN_FILE and CANNOT_SCHEDULE_TASK map to 503, which
    # clickhouse-connect retries; kept so the fixture behaves like the server there too.
    503: {"SOCKET_TIMEOUT", "CANNOT_OPEN_FILE", "CANNOT_SCHEDULE_TASK"},
    411: {"HTTP_LENGTH_REQUIRED"},
    408: {"TIMEOUT_EXCEEDED"},
    415: {"UNSUPPORTED_MEDIA_TYPE"},
}
_HTTP_STATUS = {name: status for status, names in _STATUS_BY_ERROR.items() for name in names}

_CONTENT_TYPES = {
    "TABSEPARATED": "text/tab-separated-values; charset=UTF-8",
    "TSV": "text/tab-separated-values; charset=UTF-8",
    "CSV": "text/csv; charset=UTF-8; header=absent",
    "CSVWITHNAMES": "text/csv; charset=UTF-8; header=present",
    "JSON": "application/json; charset=UTF-8",
    "JSONCOMPACT": "application/json; charset=UTF-8",
}

_CHDB_ERROR = re.compile(r"Code: (\d+)\. (DB::Exception: .*)", re.S)
_ERROR_NAME = re.compile(r"\(([A-Z][A-Z0-9_]+)\)\s*$")
_TOKENS = re.compile(
    r"""(?P<space>\s+)
      | (?P<comment>--[^\n]*|/\*.*?\*/)
      | (?P<string>'(?:[^'\\]|\\.|'')*')
      | (?P<ident>"(?:[^"\\]|\\.|"")*"|`(?:[^`\\]|\\.|``)*`)
      | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<other>.)""",
    re.S | re.X,
)
_MAX_QUERY_SIZE = 262144
_SET_ITEM = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$", re.S)


class ClickHouseError(Exception):
    """An error in the shape ClickHouse reports it: numeric code, symbolic name, message."""

    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.name = name
        self.message = message

    @classmethod
    def from_chdb(cls, exc: BaseException) -> ClickHouseError:
        text = str(exc)
        match = _CHDB_ERROR.search(text)
        if not match:
            return cls(1001, "STD_EXCEPTION", f"DB::Exception: {text}. (STD_EXCEPTION)")
        # chdb's streaming insert already appends the version that body() adds
        body = re.sub(r"\s*\(version [^()]*\)\s*$", "", match.group(2).strip())
        name = _ERROR_NAME.search(body)
        return cls(int(match.group(1)), name.group(1) if name else "", body)

    @classmethod
    def make(cls, code: int, name: str, text: str) -> ClickHouseError:
        return cls(code, name, f"DB::Exception: {text}. ({name})")

    def body(self, version: str) -> bytes:
        return f"Code: {self.code}. {self.message} (version {version})\n".encode()

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS.get(self.name, 500)


@dataclass
class _Statement:
    """One request's statement, split the way ClickHouse's parser splits it."""

    kind: str  # first keyword, upper case ("" when there is none)
    text: str  # the SQL without inline insert data
    output_format: Optional[str] = None  # FORMAT clause of a result statement
    insert_format: Optional[str] = None  # INSERT ... FORMAT <fmt>: data follows
    data: bytes = b""


def _words(text: str, start: int = 0):  # type: ignore[no-untyped-def]
    """(kind, value, start, end, depth) for each token, skipping spaces and comments."""
    depth = 0
    for match in _TOKENS.finditer(text, start):
        kind = match.lastgroup
        if kind in ("space", "comment"):
            continue
        value = match.group()
        if kind == "other":
            if value in "([{":
                depth += 1
            elif value in ")]}":
                depth -= 1
        yield kind, value, match.start(), match.end(), depth


def parse_statement(raw: bytes) -> _Statement:
    """Classify the statement and split off INSERT data, without decoding the data."""
    # latin-1 maps byte offsets to character offsets one to one, so the split below is exact
    # for the binary data that follows an INSERT's FORMAT clause. The statement itself is within
    # ClickHouse's max_query_size (256 KiB); only that much of a large body is looked at.
    text = raw[:_MAX_QUERY_SIZE].decode("latin-1")
    tokens = _words(text)
    kind = ""
    for token_kind, value, _start, _end, _depth in tokens:
        if token_kind == "word":
            kind = value.upper()
            break
        if value != "(":
            break
    if kind == "INSERT":
        previous = ""
        for token_kind, value, start, end, depth in tokens:
            if depth != 0 or token_kind != "word":
                previous = ""
                continue
            word = value.upper()
            if word in ("VALUES", "SELECT", "WITH"):
                break
            if previous == "FORMAT":
                data_start = end
                # ClickHouse: the data starts after the spaces and one line break that follow
                # the format name.
                while data_start < len(raw) and raw[data_start] in b" \t\f":
                    data_start += 1
                if raw[data_start : data_start + 1] == b"\r":
                    data_start += 1
                if raw[data_start : data_start + 1] == b"\n":
                    data_start += 1
                sql = raw[:start].decode("utf-8", "replace")
                sql = re.sub(r"(?is)\s*\bFORMAT\s*$", "", sql)
                return _Statement(kind, sql, insert_format=value, data=raw[data_start:])
            previous = word
    sql = _decode_sql(raw)
    statement = _Statement(kind, sql)
    if ";" in sql:
        _reject_multi_statements(sql)
    if kind in _RESULT_STATEMENTS and re.search(r"(?i)\bformat\b", sql):
        statement.output_format = _output_format(sql)
    return statement


def _decode_sql(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ClickHouseError.make(
            36, "BAD_ARGUMENTS", f"Query is not valid UTF-8 at byte {exc.start}"
        ) from None


def _reject_multi_statements(sql: str) -> None:
    seen_semicolon = False
    for _kind, value, start, _end, depth in _words(sql):
        if seen_semicolon and value != ";":
            raise ClickHouseError.make(
                62,
                "SYNTAX_ERROR",
                f"Syntax error (Multi-statements are not allowed): failed at position {start + 1}",
            )
        if value == ";" and depth == 0:
            seen_semicolon = True


def _output_format(sql: str) -> Optional[str]:
    """The format of a top-level FORMAT clause (it ends the query, SETTINGS aside)."""
    tokens = list(_words(sql))
    found = None
    for index, (kind, value, _start, _end, depth) in enumerate(tokens[:-1]):
        if depth != 0 or kind != "word" or value.upper() != "FORMAT":
            continue
        name_kind, name, _s, _e, _d = tokens[index + 1]
        after = tokens[index + 2] if index + 2 < len(tokens) else None
        if name_kind == "word" and (
            after is None or after[1] == ";" or after[1].upper() == "SETTINGS"
        ):
            found = name
    return found


def _quote_ident(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _quote_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _split_top_level(text: str) -> List[str]:
    """Split a SET list on the commas outside brackets and strings."""
    items: List[str] = []
    begin = 0
    for _kind, value, start, _end, depth in _words(text):
        if value == "," and depth == 0:
            items.append(text[begin:start])
            begin = start + 1
    items.append(text[begin:])
    return items


def _set_assignments(sql: str) -> Dict[str, Optional[str]]:
    """name -> SQL value (None for DEFAULT) of a ``SET a = 1, b = 'x'`` statement."""
    body = re.sub(r"(?is)^\s*SET\b", "", sql, count=1).rstrip().rstrip(";")
    result: Dict[str, Optional[str]] = {}
    for item in _split_top_level(body):
        match = _SET_ITEM.match(item)
        if match:  # SET ROLE and the like assign no setting
            value = match.group(2)
            result[match.group(1)] = None if value.upper() == "DEFAULT" else value
    return result


def _use_database(sql: str) -> Optional[str]:
    match = re.match(r"(?is)\s*USE\s+(`(?:[^`\\]|\\.)*`|\"(?:[^\"\\]|\\.)*\"|[\w.]+)", sql)
    if not match:
        return None
    name = match.group(1)
    if name[0] in '`"':
        name = re.sub(r"\\(.)", r"\1", name[1:-1])
    return name


# ---------------------------------------------------------------------------------------------
# chdb side


_DIRTY = object()  # a setting whose value on a connection is unknown (a SET that may have run)


class _Connection:
    def __init__(self, session: Any) -> None:
        self.session = session
        # name -> SQL value that this connection has been SET to (absent: the default)
        self.settings: Dict[str, object] = {}
        self.database: Optional[str] = "default"


@dataclass
class _Result:
    body: Any = b""  # bytes or a memoryview kept alive by ``owner``
    owner: Any = None
    summary: Dict[str, str] = field(default_factory=dict)
    output_format: Optional[str] = None


@dataclass
class _Request:
    statement: _Statement
    database: str
    settings: Dict[str, str]  # name -> SQL literal
    params: Dict[str, str]
    default_format: str
    readonly: bool
    session_id: Optional[str]


class ChdbServer:
    """The ClickHouse engine behind the HTTP front: a pool of chdb connections on one path."""

    def __init__(self, path: str, connections: int = 0) -> None:
        from chdb.session import Session

        Path(path).mkdir(parents=True, exist_ok=True)
        count = connections or max(2, os.cpu_count() or 2)
        self._all = [_Connection(Session(path)) for _ in range(count)]
        self._free: queue.LifoQueue[_Connection] = queue.LifoQueue()
        for connection in self._all:
            self._free.put(connection)
        first = self._all[0].session
        version, timezone = _tsv_row(first.query("SELECT version(), timezone()", "TabSeparated"))
        self.version = version
        self.timezone = timezone
        rows = first.query("SELECT name, value FROM system.settings", "TabSeparated")
        self.defaults = dict(
            line.split("\t", 1) for line in rows.bytes().decode().splitlines() if "\t" in line
        )
        self._sessions_lock = threading.Lock()
        # session_id -> (settings set in the session, database used in the session)
        self._sessions: Dict[str, Tuple[Dict[str, str], Optional[str]]] = {}
        self._busy_sessions: Set[str] = set()

    def close(self, timeout: float = 30.0) -> None:
        """Close every connection once the statements running on them have finished."""
        deadline = time.monotonic() + timeout
        for _ in self._all:
            with contextlib.suppress(queue.Empty):
                self._free.get(timeout=max(0.0, deadline - time.monotonic()))
        for connection in self._all:
            with contextlib.suppress(Exception):  # closing at exit: nothing left to report to
                connection.session.close()

    def session_state(self, session_id: Optional[str]) -> Tuple[Dict[str, str], Optional[str]]:
        if not session_id:
            return {}, None
        with self._sessions_lock:
            settings, database = self._sessions.get(session_id, ({}, None))
            return dict(settings), database

    def _remember(self, request: _Request) -> None:
        statement = request.statement
        if not request.session_id or statement.kind not in ("SET", "USE"):
            return
        with self._sessions_lock:
            settings, database = self._sessions.get(request.session_id, ({}, None))
            settings = dict(settings)
            if statement.kind == "SET":
                for name, value in _set_assignments(statement.text).items():
                    if value is None:
                        settings.pop(name, None)
                    else:
                        settings[name] = value
            else:
                database = _use_database(statement.text) or database
            self._sessions[request.session_id] = (settings, database)
            if len(self._sessions) > 10000:  # sessions expire on a server; bound them here
                self._sessions.pop(next(iter(self._sessions)))

    def execute(self, request: _Request) -> _Result:
        statement = request.statement
        if request.readonly and statement.kind not in _READ_STATEMENTS:
            raise ClickHouseError.make(
                164,
                "READONLY",
                "Cannot execute query in readonly mode. For queries over HTTP, method GET "
                "implies readonly. You should use method POST for modifying queries",
            )
        for name in request.settings:
            if name not in self.defaults:
                raise ClickHouseError.make(115, "UNKNOWN_SETTING", f"Unknown setting '{name}'")
        if statement.kind == "SET" and "readonly" in _set_assignments(statement.text):
            # it would lock the pooled connection for every later request
            raise ClickHouseError.make(
                48, "NOT_IMPLEMENTED", "SET readonly is not served here; pass ?readonly=1 instead"
            )
        session_id = request.session_id
        if session_id:
            with self._sessions_lock:
                # ClickHouse runs one request per session at a time and refuses the others.
                if session_id in self._busy_sessions:
                    raise ClickHouseError.make(
                        373,
                        "SESSION_IS_LOCKED",
                        f"Session {session_id} is locked by a concurrent client",
                    )
                self._busy_sessions.add(session_id)
        connection = self._free.get()
        try:
            self._prepare(connection, request)
            if statement.insert_format is not None:
                result = self._insert(connection, statement)
            else:
                result = self._query(connection, request)
            self._remember(request)
            return result
        finally:
            self._free.put(connection)
            if session_id:
                with self._sessions_lock:
                    self._busy_sessions.discard(session_id)

    def _prepare(self, connection: _Connection, request: _Request) -> None:
        changes: Dict[str, Optional[str]] = {}
        for name in connection.settings:
            if name not in request.settings:
                changes[name] = None
        for name, value in request.settings.items():
            if connection.settings.get(name) != value:
                changes[name] = value
        if changes:
            sql = "SET " + ", ".join(
                f"{name} = {'DEFAULT' if value is None else value}"
                for name, value in changes.items()
            )
            try:
                connection.session.query(sql, "TabSeparated")
            except Exception as exc:
                for name in changes:
                    connection.settings[name] = _DIRTY
                raise ClickHouseError.from_chdb(exc) from None
            for name, value in changes.items():
                if value is None:
                    connection.settings.pop(name, None)
                else:
                    connection.settings[name] = value
        if connection.database != request.database:
            try:
                connection.session.query(f"USE {_quote_ident(request.database)}", "TabSeparated")
            except Exception as exc:
                raise ClickHouseError.from_chdb(exc) from None
            connection.database = request.database

    def _query(self, connection: _Connection, request: _Request) -> _Result:
        statement = request.statement
        try:
            result = connection.session.query(
                statement.text, request.default_format, params=request.params or None
            )
        except Exception as exc:
            raise ClickHouseError.from_chdb(exc) from None
        finally:
            # A SET or USE of the request's own changes the connection in ways only it knows.
            if statement.kind == "SET":
                for name in _set_assignments(statement.text):
                    if name in self.defaults:  # an unknown name was refused, nothing changed
                        connection.settings[name] = _DIRTY
            elif statement.kind == "USE":
                connection.database = None
        summary = _summary(
            result.rows_read(),
            result.bytes_read(),
            result.rows_written(),
            result.bytes_written(),
            result.elapsed(),
        )
        output_format = None
        if statement.kind in _RESULT_STATEMENTS:
            output_format = statement.output_format or request.default_format
        memview = result.get_memview()
        return _Result(memview.view(), (result, memview), summary, output_format)

    def _insert(self, connection: _Connection, statement: _Statement) -> _Result:
        assert statement.insert_format is not None
        try:
            inserter = connection.session.send_insert(statement.text, statement.insert_format)
        except Exception as exc:
            raise ClickHouseError.from_chdb(exc) from None
        try:
            if statement.data:
                inserter.append(statement.data)
            done = inserter.finish()
        except Exception as exc:
            with contextlib.suppress(Exception):  # the insert's own error is the one to report
                inserter.cancel()
            raise ClickHouseError.from_chdb(exc) from None
        summary = _summary(0, 0, done.rows_written, done.bytes_written, done.elapsed)
        summary["result_rows"] = str(done.rows_written)
        summary["result_bytes"] = str(done.bytes_written)
        return _Result(b"", None, summary, None)


def _tsv_row(result: Any) -> List[str]:
    return result.bytes().decode().rstrip("\n").split("\t")


def _summary(
    read_rows: int, read_bytes: int, written_rows: int, written_bytes: int, elapsed: float
) -> Dict[str, str]:
    # ClickHouse sends every summary value as a string.
    return {
        "read_rows": str(read_rows),
        "read_bytes": str(read_bytes),
        "written_rows": str(written_rows),
        "written_bytes": str(written_bytes),
        "total_rows_to_read": str(read_rows),
        "result_rows": "0",
        "result_bytes": "0",
        "elapsed_ns": str(int(elapsed * 1e9)),
    }


# ---------------------------------------------------------------------------------------------
# HTTP side


def decompress_body(data: bytes, encoding: str) -> bytes:
    """Undo a request's Content-Encoding (several frames or members one after another)."""
    encoding = encoding.strip().lower()
    if not data or encoding in ("", "identity", "none"):
        return data
    try:
        if encoding == "lz4" and _lz4_frame is not None:
            parts = []
            rest = data
            while rest:
                decompressor = _lz4_frame.LZ4FrameDecompressor()
                parts.append(decompressor.decompress(rest))
                if not decompressor.eof:
                    raise ValueError("truncated lz4 frame")
                rest = decompressor.unused_data
            return b"".join(parts)
        if encoding == "gzip":
            return gzip.decompress(data)
        if encoding == "deflate":
            return zlib.decompress(data)
        if encoding == "zstd" and _zstd is not None:
            return _zstd.decompress(data)  # reads every frame, one per block
        if encoding == "br" and _brotli is not None:
            return _brotli.decompress(data)
    except Exception as exc:
        raise ClickHouseError.make(
            271, "CANNOT_DECOMPRESS", f"Cannot decompress {encoding} request body: {exc}"
        ) from None
    raise ClickHouseError.make(36, "BAD_ARGUMENTS", f"Unknown HTTP content encoding {encoding!r}")


def _compressor(accept_encoding: str):  # type: ignore[no-untyped-def]
    """The first method in Accept-Encoding that can be written: (name, function) or None."""
    methods = {
        "gzip": lambda body: gzip.compress(body, compresslevel=3),
        "deflate": lambda body: zlib.compress(body, 3),
    }
    if _lz4_frame is not None:
        methods["lz4"] = lambda body: _lz4_frame.compress(body)
    if _zstd is not None:
        methods["zstd"] = lambda body: _zstd.compress(body)
    if _brotli is not None:
        methods["br"] = lambda body: _brotli.compress(body, quality=3)
    for item in accept_encoding.split(","):
        name = item.split(";", 1)[0].strip().lower()
        if name in methods:
            return name, methods[name]
    return None


class ClickHouseHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(
        self,
        address: Tuple[str, int],
        chdb_server: ChdbServer,
        user: Optional[str] = None,
        password: Optional[str] = None,
        display_name: Optional[str] = None,
        verbose: bool = False,
    ) -> None:
        super().__init__(address, _Handler)
        self.chdb = chdb_server
        self.user = user
        self.password = password or ""
        self.display_name = display_name or socket.gethostname()
        self.verbose = verbose


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ClickHouseHTTPServer
    server_version = "chdb-http-fixture"

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes; without this, small responses on a
        # kept-alive connection wait out the peer's delayed ACK.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    def do_HEAD(self) -> None:
        self._handle("HEAD")

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    # -- request ------------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                line = self.rfile.readline(65537)
                if not line:
                    raise ConnectionError("connection closed inside a chunked body")
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline(65537)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _credentials(self, params: Dict[str, str]) -> Tuple[str, str]:
        user = self.headers.get("X-ClickHouse-User")
        if user is not None:
            return user, self.headers.get("X-ClickHouse-Key", "")
        authorization = self.headers.get("Authorization", "")
        if authorization.lower().startswith("basic "):
            try:
                decoded = base64.b64decode(authorization[6:].strip()).decode()
            except Exception:
                decoded = ""
            name, _, secret = decoded.partition(":")
            return name or "default", secret
        return params.get("user", "default"), params.get("password", "")

    def _handle(self, method: str) -> None:
        url = urlsplit(self.path)
        if url.path in ("/ping", "/replicas_status"):
            self._read_body()
            self._respond(200, b"Ok.\n", {"Content-Type": "text/html; charset=UTF-8"}, method)
            return
        query_id = str(uuid.uuid4())
        try:
            body = self._read_body()
        except (ConnectionError, ValueError):
            self.close_connection = True
            return
        if url.path == "/" and method != "POST" and not url.query:
            # ClickHouse answers a bare GET / like a ping
            self._respond(200, b"Ok.\n", {"Content-Type": "text/html; charset=UTF-8"}, method)
            return
        try:
            if url.path not in ("/", "/query"):
                missing = f"There is no handle {url.path}\n\nUse / or /ping for health checks.\n"
                self._respond(
                    404,
                    missing.encode(),
                    {"Content-Type": "text/plain; charset=UTF-8"},
                    method,
                )
                return
            params = dict(parse_qsl(url.query, keep_blank_values=True))
            query_id = params.get("query_id") or query_id
            self._authenticate(params)
            content_encoding = self.headers.get("Content-Encoding", "")
            if content_encoding:
                body = decompress_body(body, content_encoding)
            raw_query = params.get("query", "").encode()
            content_type = self.headers.get("Content-Type", "")
            if content_type.lower().startswith("multipart/form-data"):
                form = _parse_form(content_type, body)
                params.update({k: v for k, v in form.items() if k != "query"})
                raw_query = (raw_query + b"\n" if raw_query else b"") + form.get(
                    "query", ""
                ).encode()
            elif body:
                raw_query = raw_query + b"\n" + body if raw_query else body
            if params.get("compress") == "1" or params.get("decompress") == "1":
                raise ClickHouseError.make(
                    48, "NOT_IMPLEMENTED", "compress/decompress=1 is not served by this fixture"
                )
            if not raw_query.strip():
                raise ClickHouseError.make(62, "SYNTAX_ERROR", "Empty query")
            request = self._build_request(method, params, parse_statement(raw_query))
            result = self.server.chdb.execute(request)
            self._send_result(method, query_id, params, request, result)
        except ClickHouseError as exc:
            self._send_error(method, query_id, exc)
        except Exception as exc:  # anything else is still an answer, never a dropped connection
            self._send_error(method, query_id, ClickHouseError.from_chdb(exc))

    def _authenticate(self, params: Dict[str, str]) -> None:
        user, secret = self._credentials(params)
        expected = self.server.user
        if expected is None:
            return
        if user != expected or secret != self.server.password:
            raise ClickHouseError.make(
                516,
                "AUTHENTICATION_FAILED",
                f"{user}: Authentication failed: password is incorrect, or there is no user "
                "with such name",
            )

    def _build_request(
        self, method: str, params: Dict[str, str], statement: _Statement
    ) -> _Request:
        session_id = params.get("session_id") or None
        session_settings, session_database = self.server.chdb.session_state(session_id)
        settings = dict(session_settings)
        query_params = {}
        for name, value in params.items():
            if name.startswith("param_"):
                query_params[name[len("param_") :]] = value
            elif name not in _TRANSPORT_PARAMS:
                settings[name] = _quote_string(value)
        database = (
            params.get("database")
            or self.headers.get("X-ClickHouse-Database")
            or session_database
            or "default"
        )
        default_format = (
            params.get("default_format")
            or self.headers.get("X-ClickHouse-Format")
            or "TabSeparated"
        )
        readonly = method != "POST" or params.get("readonly", "0") not in ("", "0")
        return _Request(
            statement, database, settings, query_params, default_format, readonly, session_id
        )

    # -- response -----------------------------------------------------------------------------

    def _common_headers(self, query_id: str) -> Dict[str, str]:
        return {
            "X-ClickHouse-Server-Display-Name": self.server.display_name,
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Timezone": self.server.chdb.timezone,
        }

    def _send_result(
        self, method: str, query_id: str, params: Dict[str, str], request: _Request, result: _Result
    ) -> None:
        headers = self._common_headers(query_id)
        body = result.body
        if result.output_format is not None:
            headers["X-ClickHouse-Format"] = result.output_format
            headers["Content-Type"] = _CONTENT_TYPES.get(
                result.output_format.upper(),
                "application/octet-stream"
                if result.output_format.upper().startswith(
                    ("NATIVE", "ROWBINARY", "ARROW", "PARQUET", "ORC", "AVRO")
                )
                else "text/plain; charset=UTF-8",
            )
        else:
            headers["Content-Type"] = "text/plain; charset=UTF-8"
        headers["X-ClickHouse-Summary"] = json.dumps(result.summary, separators=(",", ":"))
        compression = params.get(
            "enable_http_compression", self.server.chdb.defaults.get("enable_http_compression", "0")
        )
        accept = self.headers.get("Accept-Encoding", "")
        if len(body) and compression not in ("0", "") and accept:
            chosen = _compressor(accept)
            if chosen is not None:
                headers["Content-Encoding"] = chosen[0]
                body = chosen[1](body)
        self._respond(200, body, headers, method)

    def _send_error(self, method: str, query_id: str, error: ClickHouseError) -> None:
        headers = self._common_headers(query_id)
        headers["Content-Type"] = "text/plain; charset=UTF-8"
        headers["X-ClickHouse-Exception-Code"] = str(error.code)
        self._respond(error.http_status, error.body(self.server.chdb.version), headers, method)

    def _respond(self, status: int, body: Any, headers: Dict[str, str], method: str) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if method != "HEAD" and len(body):
            self.wfile.write(body)


def _parse_form(content_type: str, body: bytes) -> Dict[str, str]:
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    fields: Dict[str, str] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if part.get_filename() is not None:
            raise ClickHouseError.make(
                48, "NOT_IMPLEMENTED", "external data tables are not served by this fixture"
            )
        if name:
            payload = part.get_payload(decode=True) or b""
            fields[str(name)] = payload.decode("utf-8")
    return fields


# ---------------------------------------------------------------------------------------------
# entry point


def serve(
    path: str,
    port: int = 0,
    host: str = "127.0.0.1",
    user: Optional[str] = None,
    password: Optional[str] = None,
    ready_file: Optional[str] = None,
    connections: int = 0,
    verbose: bool = False,
) -> None:
    """Serve until SIGTERM/SIGINT, then close chdb cleanly (its parts are flushed to ``path``)."""
    engine = ChdbServer(path, connections)
    httpd = ClickHouseHTTPServer((host, port), engine, user, password, verbose=verbose)
    bound_port = httpd.server_address[1]

    def stop(_signum: int, _frame: Any) -> None:
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if ready_file:
        temporary = f"{ready_file}.tmp"
        Path(temporary).write_text(str(bound_port))
        os.replace(temporary, ready_file)
    print(
        f"ClickHouse {engine.version} (chdb) on http://{host}:{bound_port}/ over {path}",
        file=sys.stderr,
        flush=True,
    )
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        httpd.server_close()
        engine.close()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--path", required=True, help="data directory (kept across restarts)")
    parser.add_argument("--port", type=int, default=8123, help="0 picks a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--user", default=None, help="the only user let in (default: anyone)")
    parser.add_argument("--password", default=None)
    parser.add_argument("--ready-file", default=None, help="gets the port once listening")
    parser.add_argument(
        "--connections",
        type=int,
        default=0,
        help="chdb connections, i.e. statements run at once (default: CPUs)",
    )
    parser.add_argument("--timezone", default="UTC", help="the server's time zone")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    # The server's time zone is part of what clients see (X-ClickHouse-Timezone, DateTime
    # rendering); pin it so runs do not depend on the machine's.
    os.environ["TZ"] = args.timezone
    time.tzset()
    serve(
        args.path,
        args.port,
        args.host,
        args.user,
        args.password,
        args.ready_file,
        args.connections,
        args.verbose,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
