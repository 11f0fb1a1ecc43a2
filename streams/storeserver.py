"""``burnwatch store serve``: one process owns the embedded ClickHouse engine and serves it
over ClickHouse's HTTP interface, so several workers (and ``burnwatch sql``, reports,
``backtest --since``) share one store.

chdb is one engine per process: a second process cannot open the same data directory,
and no ClickHouse server can be installed here. This server speaks enough of the HTTP
interface for the unmodified clickhouse-connect HTTP client
(``BURNWATCH_CLICKHOUSE_DSN=http://127.0.0.1:8123``): the query in the ``query``
parameter and/or the body, ``param_*`` server-side parameters (as URL parameters or a
multipart form), ``database``, ``default_format``, any other parameter as a ClickHouse
setting for that request, request bodies compressed with ``Content-Encoding`` (lz4, zstd,
gzip, deflate), ``INSERT ... FORMAT F`` followed by its data (run as ``INSERT ... FROM
INFILE``, as clickhouse-connect's chdb backend does), errors as ``Code: N.
DB::Exception: ...`` with ``X-ClickHouse-Exception-Code``, and ``GET /ping``.

One engine, one lock: requests are read, decompressed and answered in parallel threads,
but the engine runs one statement at a time. A body is read whole before anything runs,
so an insert cut short (its client killed mid-send) is refused, never stored in part;
results are built whole too (no streaming). It is not a ClickHouse server: no sessions
(a ``SET`` or ``USE`` statement is refused; settings are request parameters; ``readonly`` lets only
a statement that reads run), no users
or authentication (it binds to loopback unless told otherwise), no replication.

chdb is clickhouse-local, which confines nothing to the store: ``file()``, ``url()``, ``INTO OUTFILE``,
``SYSTEM SHUTDOWN`` and the like act as the server's user. A client may do anything to the store
(workers create, alter and drop its tables), but a statement that reaches outside it is refused
(:meth:`StoreEngine._check_inside`).
"""

from __future__ import annotations

import email.parser
import email.policy
import errno
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlparse, urlunparse

import structlog

from detector.settings import bind_host
from detector.units import string_literal

__all__ = ["StoreEngine", "StoreError", "StoreRequest", "StoreResponse", "make_server", "redact_dsn", "serve"]

log = structlog.get_logger("burnwatch.storeserver")

MAX_BODY_BYTES = 1 << 30
"""A request body (decompressed) larger than this is refused: the server holds it in memory."""
MAX_EXECUTION_S = 300
"""A statement that sets no ``max_execution_time`` of its own is stopped after this long. The engine runs one
statement at a time and nothing stops one whose client went away, so an endless query (a cross join typed
by hand, its ``burnwatch sql`` interrupted) held every worker, and a SIGTERM, until the server was killed.
clickhouse-connect gives up on a reply after 300 s by default (``send_receive_timeout``)."""

_TRANSPORT_PARAMS = frozenset({
    "query", "database", "default_format", "session_id", "session_timeout", "session_check", "query_id",
    "quota_key", "compress", "buffer_size", "wait_end_of_query", "role", "user", "password",
    "client_protocol_version", "enable_http_compression", "send_progress_in_http_headers",
    "http_headers_progress_interval_ms", "cancel_http_readonly_queries_on_client_close",
    "http_response_buffer_size", "http_wait_end_of_query", "http_zlib_compression_level",
    "add_http_cors_header", "stacktrace",
})  # fmt: skip
"""URL parameters of the HTTP interface that are not engine settings (some are, on a server,
but only shape the HTTP response, which this server does not do)."""

_REFUSED_SETTINGS = {
    "decompress": "ClickHouse's own compressed block format is not supported; use Content-Encoding",
}
_SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INSERT = re.compile(rb"\A\s*INSERT\s+INTO\s+(?P<target>[^'\"`;]*?(?:`[^`]*`[^'\"`;]*?)*?)\s+FORMAT\s+(?P<fmt>[A-Za-z0-9_]+)",
                     re.IGNORECASE | re.DOTALL)  # fmt: skip
_INSERT_HEADER_MAX = 1 << 20
_SETTINGS_CLAUSE = re.compile(rb"\s+SETTINGS\s+", re.IGNORECASE)
_SESSION_STATEMENT = re.compile(rb"\A\s*(SET|USE)\b", re.IGNORECASE)
_TRAILING_FORMAT = re.compile(rb"\bFORMAT\s+([A-Za-z0-9_]+)\s*;?\s*\Z", re.IGNORECASE)
_RESULT_STATEMENT = re.compile(rb"\A\s*(SELECT|WITH|SHOW|DESC|DESCRIBE|EXISTS|EXPLAIN|\()", re.IGNORECASE)
_INTO_OUTFILE = re.compile(rb"\bINTO\s+OUTFILE\b", re.IGNORECASE)
_OUTSIDE_CLAUSE = re.compile(rb"\bINTO\s+OUTFILE\b|\bFROM\s+INFILE\b|\bdisk\s*\(", re.IGNORECASE)
"""Clauses (in the engine's single-line form of a statement, outside its literals) that read or write a path of
the server's choosing."""
_OUTSIDE_STATEMENTS = {"Set": "SET", "UseQuery": "USE", "SYSTEM": "SYSTEM", "BackupQuery": "BACKUP",
                       "RestoreQuery": "RESTORE", "AttachQuery": "ATTACH"}  # fmt: skip
"""Statements (the root of ``EXPLAIN AST``) refused: SET and USE would change the session every client
shares; SYSTEM stops or kills the server (SHUTDOWN, KILL); BACKUP, RESTORE and ATTACH name paths."""
_INSIDE_TABLE_FUNCTIONS = frozenset({
    "numbers", "numbers_mt", "zeros", "zeros_mt", "values", "view", "viewifpermitted", "viewexplain", "null", "merge",
    "input", "format", "loop", "generaterandom", "generateseries", "generate_series", "primes", "dictionary",
    "sqlstandardvalues", "fuzzjson", "fuzzquery", "mergetreeindex", "mergetreeprojection", "mergetreeanalyzeindexes",
    "mergetreeanalyzeindexesuuid", "mergetreecodecblockcounts", "mergetreetextindex",
})  # fmt: skip
_INSIDE_ENGINES = frozenset({
    "memory", "null", "view", "materializedview", "log", "tinylog", "stripelog", "set", "join", "buffer",
    "dictionary", "merge", "generaterandom", "alias", "loop",
})  # fmt: skip
"""Table functions and engines (lower case) that stay inside the engine; with the ``*MergeTree`` engines (not
``Replicated*``), the only ones a client may name. Every other one the engine knows (``file``, ``url``, ``s3``,
``remote``, ``executable``, ``python``, ``File``, ``URL``, ``EmbeddedRocksDB``, ...) reads or writes the server's
files, reaches the network or reads the server process's memory: refused, and so is one a later chdb adds."""
READONLY = 164
_CODE = re.compile(r"Code: (\d+)\.")

# ClickHouse error codes this server reports itself.
NOT_IMPLEMENTED = 48
UNKNOWN_SETTING = 115
CANNOT_DECOMPRESS = 271
CANNOT_PARSE_INPUT = 27
TOO_LARGE_REQUEST = 241  # MEMORY_LIMIT_EXCEEDED: the nearest ClickHouse has
UNKNOWN_EXCEPTION = 1002
ACCESS_DENIED = 497


class StoreError(Exception):
    """A refusal with a ClickHouse error code, answered like ClickHouse answers one."""

    def __init__(self, code: int, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.code = code
        self.status = status

    @property
    def text(self) -> str:
        message = str(self)
        return message if message.startswith("Code: ") else f"Code: {self.code}. DB::Exception: {message}"


@dataclass
class StoreRequest:
    """One statement as the HTTP interface received it, decompressed and split."""

    sql: bytes
    """The statement; for an insert with inline data, only its ``INSERT ... FORMAT F`` part."""
    data: bytes | None = None
    """An insert's data (what followed ``FORMAT F``), or None for any other statement."""
    params: dict[str, str] = field(default_factory=dict)
    """Server-side parameters, without the ``param_`` prefix."""
    settings: dict[str, str] = field(default_factory=dict)
    database: str = "default"
    default_format: str = "TabSeparated"
    query_id: str = ""
    readonly: bool = False
    """The request's ``readonly`` setting (1 or 2): only a statement that reads (``SELECT``, ``SHOW``, ...)
    runs (:meth:`StoreEngine.check_reads`). Not set on the engine: chdb keeps a ``SET readonly`` for the
    session every client shares, and cannot take it back."""


@dataclass
class StoreResponse:
    body: bytes
    fmt: str | None
    """The output format (``X-ClickHouse-Format``), None for a statement without a result."""
    summary: dict[str, str]


def split_request(query_param: str, body: bytes, url_params: dict[str, str]) -> StoreRequest:
    """Build the statement the way ClickHouse's HTTP handler does: the ``query`` parameter,
    a newline, then the body; an ``INSERT ... FORMAT F`` has its data after the format name
    (after the first newline there, or after the spaces if there is none)."""
    text = (query_param.encode() + b"\n" + body) if query_param else body
    params: dict[str, str] = {}
    settings: dict[str, str] = {}
    for key, value in url_params.items():
        if key.startswith("param_"):
            params[key[6:]] = value
        elif key == "readonly":
            if value not in ("0", "1", "2"):
                raise StoreError(UNKNOWN_SETTING, f"readonly: {value[:20]!r} is not 0, 1 or 2", status=400)
        elif key in _REFUSED_SETTINGS:
            raise StoreError(NOT_IMPLEMENTED, f"{key}: {_REFUSED_SETTINGS[key]}", status=400)
        elif key not in _TRANSPORT_PARAMS:
            if not _SETTING_NAME.match(key):
                raise StoreError(UNKNOWN_SETTING, f"Setting {key!r} is not a setting name", status=400)
            settings[key] = value
    request = StoreRequest(sql=text, params=params, settings=settings,
                           database=url_params.get("database") or "default",
                           default_format=url_params.get("default_format") or "TabSeparated",
                           query_id=url_params.get("query_id") or str(uuid.uuid4()),
                           readonly=url_params.get("readonly", "0") != "0")  # fmt: skip
    if not text.strip():
        raise StoreError(CANNOT_PARSE_INPUT, "Empty query", status=400)
    if _SESSION_STATEMENT.match(text):
        raise StoreError(NOT_IMPLEMENTED, "SET and USE would change the engine every client shares: pass settings and "
                         "the database as request parameters (clickhouse-connect: settings=, database=)", status=400)  # fmt: skip
    insert = _INSERT.match(text[:_INSERT_HEADER_MAX])
    if insert is None:
        return request
    start = insert.end()
    end = start
    while end < len(text) and text[end] in b" \t\r\n":
        end += 1
        if text[end - 1] == 0x0A:
            break
    request.sql = text[: insert.end()]
    request.data = text[end:]
    return request


class StoreEngine:
    """The one chdb engine, its lock, and the session state it runs requests under.

    chdb keeps ``SET`` settings and the current database per connection; each request
    brings its own. The engine remembers what it set and changes only what differs, so
    clients sending the same settings cost no extra statement, and a setting one request
    sent never applies to the next."""

    def __init__(self, dsn: str, max_execution_s: int = MAX_EXECUTION_S) -> None:
        import chdb

        self.dsn = dsn
        self.max_execution_s = max_execution_s
        """``max_execution_time`` for a request that sets none (0: none)."""
        self._conn = chdb.connect(engine_path(dsn))
        self._lock = threading.Lock()
        self._closed = False
        self._tmp = tempfile.mkdtemp(prefix="burnwatch-store-")
        self._settings: dict[str, str] = {}
        """Settings this server SET on the session (chdb's own start-up settings are the baseline)."""
        found = self._conn.query("SELECT version(), timezone(), currentDatabase()", "TabSeparated").bytes()
        self.version, self.timezone, self._database = found.decode().rstrip("\n").split("\t")
        names = self._conn.query("SELECT name FROM system.table_functions UNION ALL "
                                 "SELECT name FROM system.table_engines", "TabSeparatedRaw").bytes().decode().split()  # fmt: skip
        self._outside = frozenset(
            n.lower()
            for n in names
            if n.lower() not in _INSIDE_TABLE_FUNCTIONS | _INSIDE_ENGINES
            and not (n.lower().endswith("mergetree") and not n.lower().startswith("replicated"))
        ) | {"file"}
        """Function and engine names (lower case) a statement may not name (:meth:`_check_inside`)."""
        words = sorted({*self._outside, "set", "use", "system", "backup", "restore", "attach", "outfile", "infile",
                        "disk", "dictionary"})  # fmt: skip
        self._suspect = re.compile(rb"\\|\b(?:" + b"|".join(re.escape(w.encode()) for w in words) + rb")\b", re.IGNORECASE)
        """A statement with none of these words anywhere (and no backslash, which can spell one in a quoted
        name) cannot name what :meth:`_check_inside` refuses, so it is not asked of the engine: inserts and
        the workers' queries run without the extra parse."""
        self._inside: dict[bytes, None] = {}
        """Statements judged to stay inside the engine (bounded): a worker sends the same ones again and again."""

    def execute(self, request: StoreRequest) -> StoreResponse:
        """Run one statement; raise :class:`StoreError` with ClickHouse's code and message."""
        path = None
        sql = request.sql
        if request.data is not None:
            insert = _INSERT.match(sql)
            assert insert is not None
            fd, path = tempfile.mkstemp(dir=self._tmp, suffix=".in")
            with os.fdopen(fd, "wb") as out:
                out.write(request.data)
            target, *settings = _SETTINGS_CLAUSE.split(insert["target"], maxsplit=1)
            sql = (b"INSERT INTO " + target + b" FROM INFILE '" + path.encode() + b"'"
                   + (b" SETTINGS " + settings[0] if settings else b"") + b" FORMAT " + insert["fmt"])  # fmt: skip
        try:
            with self._lock:
                if self._closed:
                    raise StoreError(UNKNOWN_EXCEPTION, "the store is shutting down", status=503)
                normal = self._check_reads(request) if request.readonly else None
                self._check_inside(request, normal)
                self._use(request.database)
                self._apply({"max_execution_time": str(self.max_execution_s), **request.settings})
                started = time.perf_counter_ns()
                result = self._run(_text(sql), request.default_format, request.params)
                elapsed = time.perf_counter_ns() - started
        finally:
            if path is not None:
                os.unlink(path)
        body = result.bytes() or b""
        fmt = None
        if request.data is None:
            trailing = _TRAILING_FORMAT.search(request.sql[-200:])
            if trailing is not None:
                fmt = trailing[1].decode()
            elif body or _RESULT_STATEMENT.match(request.sql):
                fmt = request.default_format
        summary = {
            "read_rows": str(result.rows_read()), "read_bytes": str(result.bytes_read()),
            "written_rows": str(result.rows_written()), "written_bytes": str(result.bytes_written()),
            "total_rows_to_read": "0", "result_rows": "0", "result_bytes": str(len(body)), "elapsed_ns": str(elapsed),
        }  # fmt: skip
        return StoreResponse(body, fmt, summary)

    def _single_line(self, sql: bytes) -> bytes:
        """The engine's own reading of a statement (``formatQuerySingleLine``): one statement (chdb would run
        each of ``SELECT 1; TRUNCATE t``), comments gone, quoted names unescaped, ``INTO/**/OUTFILE`` spaced."""
        text = sql.decode(errors="replace")  # a statement not in UTF-8 is judged as read, and runs as sent
        return self._run(f"SELECT formatQuerySingleLine({string_literal(text)})", "TabSeparatedRaw", {}).bytes().strip()

    def _check_reads(self, request: StoreRequest) -> bytes:
        """A ``readonly`` request runs only a statement that reads, judged on the engine's reading of it
        (:meth:`_single_line`: ``WITH ... INSERT`` is the ``INSERT`` it is); returns that reading."""
        if request.data is not None:
            raise StoreError(READONLY, "Cannot execute query in readonly mode: an insert", status=403)
        normal = self._single_line(request.sql)
        if not _RESULT_STATEMENT.match(normal) or _INTO_OUTFILE.search(normal):
            raise StoreError(READONLY, "Cannot execute query in readonly mode: only a statement that reads (SELECT, "
                             "SHOW, DESCRIBE, EXISTS, EXPLAIN) runs", status=403)  # fmt: skip
        return normal

    def _check_inside(self, request: StoreRequest, normal: bytes | None = None) -> None:
        """Refuse a statement that reaches outside the store: reads or writes the server's files (``file()``,
        ``INTO OUTFILE``, ``FROM INFILE``, a ``File`` table, ``BACKUP``), the network (``url()``, ``s3()``,
        ``remote()``, a dictionary's source), or stops the server (``SYSTEM SHUTDOWN``), or changes the session
        every client shares (``SET``, ``USE``, however a comment or a second statement hides them). chdb is
        clickhouse-local: it confines none of these, and anyone who reaches the port would act as the server's
        user. Judged on the engine's own reading (:meth:`_single_line`; ``normal``: made already by
        :meth:`_check_reads`)."""
        if request.sql in self._inside or not self._suspect.search(request.sql):
            return
        normal = normal if normal is not None else self._single_line(request.sql)
        refused = _OUTSIDE_CLAUSE.search(normal)
        if refused:  # on the statement without its literals: a value that only says "disk (" or "into outfile" runs
            bare = self._run(f"SELECT normalizeQuery({string_literal(normal.decode(errors='replace'))})", "TabSeparatedRaw", {})
            refused = _OUTSIDE_CLAUSE.search(bare.bytes().strip())
        what = " ".join(refused[0].decode().upper().rstrip("(").split()) if refused else None
        what = "disk()" if what == "DISK" else what
        if what is None:
            tree = self._run(b"EXPLAIN AST " + normal, "TabSeparatedRaw", request.params).bytes().decode(errors="replace")
            lines = tree.splitlines()
            root = lines[0].split(" ", 1)[0] if lines else ""
            what = _OUTSIDE_STATEMENTS.get(root)
            for line in lines:
                kind, name = (line.split() + ["", ""])[:2]
                if what is None and kind == "FunctionWithKeyValueArguments":
                    what = f"a dictionary source ({name})"
                elif what is None and kind == "Function" and name.lower() in self._outside:
                    what = f"{name}()"
        if what is not None:
            raise StoreError(ACCESS_DENIED, f"{what} is refused: burnwatch store serve keeps its clients inside the "
                             "store (no files or network of the server's, no stopping it, no session every client "
                             "shares)", status=403)  # fmt: skip
        if len(self._inside) >= 4096:
            self._inside.clear()
        self._inside[request.sql] = None

    def _run(self, sql: str | bytes, fmt: str, params: dict[str, str]) -> Any:
        try:
            return self._conn.query(sql, fmt, params=params)
        except Exception as exc:  # chdb raises its own error type with ClickHouse's text
            message = str(exc)
            at = message.find("Code: ")
            message = message[at:].strip() if at >= 0 else message.strip()
            code = _CODE.match(message)
            raise StoreError(int(code[1]) if code else UNKNOWN_EXCEPTION, message) from None

    def _use(self, database: str) -> None:
        if database != self._database:
            quoted = database.replace("\\", "\\\\").replace("`", "\\`")
            self._run(f"USE `{quoted}`", "TabSeparated", {})
            self._database = database

    def _apply(self, settings: dict[str, str]) -> None:
        for name in [n for n in self._settings if n not in settings]:
            self._run(f"SET {name} = DEFAULT", "TabSeparated", {})
            del self._settings[name]
        for name, value in settings.items():
            if self._settings.get(name) != value:
                self._run(f"SET {name} = {string_literal(value)}", "TabSeparated", {})
                self._settings[name] = value

    def close(self) -> None:
        """Wait for the statement running, then close the engine (later requests get 503)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()
                shutil.rmtree(self._tmp, ignore_errors=True)


def engine_path(dsn: str) -> str:
    """What chdb opens for ``chdb:///dir`` (the directory, created if missing) or ``chdb://memory``."""
    url = urlparse(dsn)
    if url.scheme != "chdb":
        raise ValueError(f"store serve needs a chdb:// DSN (the engine it owns), not {redact_dsn(dsn)}")
    location = url.netloc.rpartition("@")[2] if url.netloc else url.path
    if location in ("", "memory", ":memory:"):
        return ":memory:"
    from detector.store.connection import holder

    held_by = holder(Path(location))
    if held_by is not None:  # chdb would say "Cannot lock file .../status", then "Error initializing EmbeddedServer: ."
        raise ValueError(f"the store {location} is held by {held_by}: one process at a time opens it (stop that "
                         "one, or point it at this server instead)")  # fmt: skip
    os.makedirs(location, exist_ok=True)
    return os.path.realpath(location)


def _text(sql: bytes) -> str | bytes:
    try:
        return sql.decode()
    except UnicodeDecodeError:
        return sql  # binary parameters bound into the statement: chdb takes bytes


def decompress(body: bytes, encoding: str, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body of a request sent with ``Content-Encoding``, refused (413) as soon as it passes ``limit``
    bytes: a small body can expand a thousandfold (a 4 MB gzip body of zeros took the server to 8.8 GB before
    its size was checked). clickhouse-connect compresses each block as its own lz4 or zstd frame: every frame
    (every gzip member) is read."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    try:
        if encoding == "lz4":
            import lz4.frame

            return _inflate(body, lz4.frame.LZ4FrameDecompressor, limit)
        if encoding == "zstd":
            if sys.version_info >= (3, 14):
                from compression import zstd
            else:
                from backports import zstd  # what clickhouse-connect depends on (Python < 3.14)
            return _inflate(body, zstd.ZstdDecompressor, limit)
        if encoding in ("gzip", "x-gzip"):
            return _inflate(body, lambda: zlib.decompressobj(16 + zlib.MAX_WBITS), limit)
        if encoding == "deflate":
            return _inflate(body, zlib.decompressobj, limit)
    except StoreError:
        raise
    except Exception as exc:  # noqa: BLE001 - any codec failure is the client's body
        raise StoreError(CANNOT_DECOMPRESS, f"Cannot decompress the request body ({encoding}): {exc}", 400) from None
    raise StoreError(CANNOT_DECOMPRESS, f"Unsupported Content-Encoding {encoding!r} (lz4, zstd, gzip or deflate)", 400)


def _inflate(body: bytes, new: Callable[[], Any], limit: int) -> bytes:
    """Every frame of ``body`` decompressed by a fresh ``new()`` each (zlib's, lz4's and zstd's streaming
    decompressors), asking each call for no more than what is left under ``limit``."""
    parts: list[bytes] = []
    total = 0
    while body:
        codec = new()
        pending = body
        while True:
            out = codec.decompress(pending, limit + 1 - total)
            total += len(out)
            if total > limit:
                raise StoreError(TOO_LARGE_REQUEST, f"request body over {limit} bytes once decompressed", status=413)
            parts.append(out)
            if codec.eof:
                break
            pending = getattr(codec, "unconsumed_tail", b"")  # zlib hands back what it did not read; the others keep it
            if not out and not pending:
                raise ValueError("the body ends inside a frame")
        body = codec.unused_data
    return b"".join(parts)


def form_fields(body: bytes, content_type: str) -> dict[str, str]:
    """The text fields of a ``multipart/form-data`` body (clickhouse-connect sends the query
    and long server-side parameters this way); a file field (external data) is refused."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body
    )
    fields: dict[str, str] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if part.get_filename() is not None:
            raise StoreError(NOT_IMPLEMENTED, f"external data ({name}) is not supported", status=400)
        if name:
            payload = part.get_payload(decode=True)  # bytes for a part that is not itself multipart
            fields[str(name)] = payload.decode() if isinstance(payload, bytes) else ""
    return fields


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "burnwatch-store"
    timeout = 300  # an idle kept-alive connection is closed after this long
    wbufsize = 1 << 16  # headers and body leave in one write, not two
    engine: StoreEngine  # set on the subclass make_server builds
    loopback: bool  # whether the server is bound to loopback only (set likewise)

    def setup(self) -> None:
        super().setup()
        # Without this, a small reply waits for the client's delayed ACK: ~40 ms a request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        """No line per request: errors are logged once each, in :meth:`_fail`."""

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        url = urlparse(self.path)
        if url.path == "/ping" or (url.path == "/" and "query=" not in url.query):
            self._reply(200, b"Ok.\n", {"Content-Type": "text/plain; charset=UTF-8"})
            return
        if url.path != "/":
            self._reply(404, b"Not found\n", {"Content-Type": "text/plain; charset=UTF-8"})
            return
        self._handle(url.query, b"", reading=True)

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        url = urlparse(self.path)
        try:
            body = self._read_body()
        except StoreError as exc:
            self.close_connection = True
            self._fail(exc, "")
            return
        if url.path != "/":
            self._reply(404, b"Not found\n", {"Content-Type": "text/plain; charset=UTF-8"})
            return
        self._handle(url.query, body)

    def _handle(self, query: str, body: bytes, reading: bool = False) -> None:
        """Answer one statement; ``reading`` (a GET) lets only a statement that reads run, as ClickHouse does:
        a link or an image on a web page is a GET, and must not drop the store."""
        url_params = dict(parse_qsl(query, keep_blank_values=True))
        query_id = url_params.get("query_id", "")
        try:
            self._check_caller()
            if reading:
                url_params["readonly"] = "2"
            body = decompress(body, self.headers.get("Content-Encoding", ""))
            if len(body) > MAX_BODY_BYTES:
                raise StoreError(TOO_LARGE_REQUEST, f"request body over {MAX_BODY_BYTES} bytes", status=413)
            content_type = self.headers.get("Content-Type", "")
            if content_type.lower().startswith("multipart/form-data"):
                url_params.update(form_fields(body, content_type))
                body = b""
            request = split_request(url_params.pop("query", ""), body, url_params)
            query_id = request.query_id
            response = self.engine.execute(request)
        except StoreError as exc:
            self._fail(exc, query_id)
            return
        except Exception as exc:  # noqa: BLE001 - a bug here must answer, not drop the connection
            self._fail(StoreError(UNKNOWN_EXCEPTION, f"{type(exc).__name__}: {exc}"), query_id)
            return
        headers = {
            "Content-Type": _content_type(response.fmt),
            "X-ClickHouse-Query-Id": request.query_id,
            "X-ClickHouse-Timezone": self.engine.timezone,
            "X-ClickHouse-Summary": json.dumps(response.summary, separators=(",", ":")),
            "X-ClickHouse-Server-Display-Name": "burnwatch-store",
        }
        if response.fmt is not None:
            headers["X-ClickHouse-Format"] = response.fmt
        self._reply(200, response.body, headers)

    def _check_caller(self) -> None:
        """Refuse a web page's request. With no users or passwords, the port's only guard is who can reach it,
        and a browser on this machine reaches loopback for any page it shows: a page's POST carries
        ``Origin`` (no client of the store sends one), and a page that rebinds its own DNS name to 127.0.0.1 sends
        that name as ``Host``, which a server bound to loopback answers only for a loopback address."""
        if self.headers.get("Origin"):
            raise StoreError(ACCESS_DENIED, "a web browser's request (it sent Origin) is refused: the store has no "
                             "users or passwords", status=403)  # fmt: skip
        host = urlparse("//" + (self.headers.get("Host") or "")).hostname or ""
        if self.loopback and host and not _is_loopback(host):
            raise StoreError(ACCESS_DENIED, f"Host {host[:100]!r} is refused: this server, bound to loopback, answers "
                             "requests for 127.0.0.1, ::1 or localhost only", status=403)  # fmt: skip

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts: list[bytes] = []
            total = 0
            while True:
                line = self.rfile.readline(1024)
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise StoreError(CANNOT_PARSE_INPUT, f"bad chunk size line {line[:40]!r}", status=400) from None
                if size < 0:
                    raise StoreError(CANNOT_PARSE_INPUT, f"bad chunk size line {line[:40]!r}", status=400)
                if size == 0:
                    while self.rfile.readline(1024).strip():  # trailers, then the blank line
                        pass
                    return b"".join(parts)
                total += size
                if total > MAX_BODY_BYTES:
                    raise StoreError(TOO_LARGE_REQUEST, f"request body over {MAX_BODY_BYTES} bytes", status=413)
                parts.append(self._read_exactly(size))
                self.rfile.readline(8)  # the CRLF after the chunk
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            raise StoreError(CANNOT_PARSE_INPUT, f"bad Content-Length {self.headers.get('Content-Length')!r}", status=400)
        if length > MAX_BODY_BYTES:
            raise StoreError(TOO_LARGE_REQUEST, f"request body over {MAX_BODY_BYTES} bytes", status=413)
        return self._read_exactly(length) if length else b""

    def _read_exactly(self, size: int) -> bytes:
        """``size`` bytes, or an error: a client that went away mid-body (killed while sending
        an insert) must not have the part that arrived inserted."""
        data = self.rfile.read(size)
        if len(data) < size:
            self.close_connection = True
            raise StoreError(CANNOT_PARSE_INPUT, f"the request body ended after {len(data)} of {size} bytes", 400)
        return data

    def _fail(self, exc: StoreError, query_id: str) -> None:
        text = exc.text
        log.warning("store_request_failed", code=exc.code, status=exc.status, error=" ".join(text.split())[:500],
                    client=self.client_address[0])  # fmt: skip
        headers = {"Content-Type": "text/plain; charset=UTF-8", "X-ClickHouse-Exception-Code": str(exc.code)}
        if query_id:
            headers["X-ClickHouse-Query-Id"] = query_id
        self._reply(exc.status, (text + "\n").encode(), headers)

    def _reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)


def _content_type(fmt: str | None) -> str:
    if fmt is None or fmt.startswith(("TabSeparated", "TSV")):
        return "text/tab-separated-values; charset=UTF-8"
    if fmt.startswith("JSON"):
        return "application/json; charset=UTF-8"
    if fmt.startswith("CSV"):
        return "text/csv; charset=UTF-8"
    return "application/octet-stream"


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that broke outside a request's own handling (reset, timed out while
        sending): one line, not the standard library's traceback on stderr."""
        exc = sys.exc_info()[1]
        log.warning("store_connection_failed", client=client_address[0], error=f"{type(exc).__name__}: {exc}"[:300])


class _Server6(_Server):
    """An IPv6 address (``::1``); ``::`` is every interface of both families (detector.settings.bind_host)."""

    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        if self.server_address[0] == "::":
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def make_server(engine: StoreEngine, host: str = "127.0.0.1", port: int = 8123) -> ThreadingHTTPServer:
    """An HTTP server (not started) answering for ``engine``; ``port`` 0 picks a free one. An IPv6 host was
    refused ("Address family for hostname not supported"), and ``0.0.0.0`` bound IPv4 alone."""
    handler = type("StoreHandler", (_Handler,), {"engine": engine, "loopback": _is_loopback(host)})
    every = bind_host(host) == "" and socket.has_ipv6
    if every or ":" in host:
        try:
            return _Server6(("::" if every else host, port), handler)
        except OSError as exc:
            if not every or exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                raise
            host = "0.0.0.0"  # a kernel without IPv6: IPv4's every interface
    return _Server((host, port), handler)


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def redact_dsn(dsn: str) -> str:
    """The DSN without its password, for logs and messages."""
    url = urlparse(dsn)
    if url.password is None:
        return dsn
    netloc = f"{url.username or ''}:***@{url.hostname or ''}" + (f":{url.port}" if url.port else "")
    return urlunparse(url._replace(netloc=netloc))


def serve(dsn: str, host: str = "127.0.0.1", port: int = 8123, max_execution_s: int = MAX_EXECUTION_S) -> int:
    """Own the engine at ``dsn`` and serve it until SIGTERM or SIGINT; returns the exit status."""
    engine = StoreEngine(dsn, max_execution_s)
    server = make_server(engine, host, port)
    bound = server.server_address[1]

    def stop(signum: int, _frame: Any) -> None:
        threading.Thread(target=server.shutdown, name="store-shutdown", daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if not _is_loopback(host):
        log.warning("store_not_on_loopback", host=host,
                    hint="anyone who reaches this port can run any SQL on the store: no users, no TLS")  # fmt: skip
    log.info("store_serving", dsn=redact_dsn(dsn), url=f"http://{host}:{bound}", engine=engine.version)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        engine.close()
        log.info("store_stopped", dsn=redact_dsn(dsn))
    return 0
