"""One ClickHouse database and the client that reaches it, shared by the repositories.

One code path for the embedded engine (``chdb://``, via clickhouse-connect's chdb backend)
and a ClickHouse server (``http://``). Calls are serialised by one lock: the embedded
engine is one per process, and the repositories share its client.
"""

from __future__ import annotations

import os
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import structlog

from detector.units import one_line

__all__ = [
    "Connection", "StoreBusy", "StoreNotFound", "StoreOutdated", "chdb_dir", "connect", "holder", "ms", "named_sql",
    "no_dataframes",
]  # fmt: skip

log = structlog.get_logger("burnwatch.store")

SQL_DIR = Path(__file__).with_name("sql")
TYPES_KEPT_S = 60.0
"""How long a table's column types are kept before an insert asks them again (:meth:`Connection.insert_context`):
a type changed elsewhere (an operator's ``ALTER TABLE … MODIFY COLUMN``, a newer worker's migration) that
ClickHouse converts from the old one (Float32 to Float64, a Decimal's scale) fails no insert, so kept
forever the old type would round every value sent as it until a restart; a DESCRIBE a minute a table
is nothing."""
_CODE = re.compile(r"Code: (\d+)\.")
_DATA_ERRORS = {6, 26, 27, 32, 33, 36, 38, 41, 43, 53, 69, 70, 72, 117, 131, 321, 407, 469}
"""ClickHouse error codes that mean the rows themselves were refused (cannot parse or convert,
type mismatch, argument or value out of bound, incorrect data, a violated constraint)."""


def ms(t: float) -> int:
    """Epoch seconds as the integer milliseconds ``fromUnixTimestamp64Milli`` takes."""
    return int(round(t * 1000))


@cache
def named_sql(name: str) -> str:
    """The text of ``detector/store/sql/NAME.sql``: a report's, a chart's or the digest's
    query, kept as a file so that the same text runs in ``clickhouse-client --queries-file``.
    The database is the bound parameter ``{db:Identifier}``, like every other parameter."""
    return (SQL_DIR / f"{name}.sql").read_text()


class StoreNotFound(LookupError):
    """No burnwatch store where the settings point (or one whose schema is behind this
    code): commands that only read never create one, so a mistyped path is an error."""


class StoreOutdated(StoreNotFound):
    """The store's schema is behind this code: ``burnwatch db migrate`` brings it up to date."""


class StoreBusy(ConnectionError):
    """The embedded store's directory is held by another process (chdb: one per directory)."""


def chdb_dir(dsn: str) -> Path | None:
    """The directory of a ``chdb:///dir`` DSN; None for ``chdb://memory`` and servers."""
    parsed = urlparse(dsn)
    if parsed.scheme == "chdb" and parsed.path not in ("", "/memory") and parsed.netloc != "memory":
        return Path(parsed.path)
    return None


def _holding(directory: Path) -> tuple[int, list[str]] | None:
    """The pid and command line of the process holding an embedded store: the process whose pid
    ClickHouse wrote in the store's ``status`` file, if it still has that file open. None when nobody
    does, or this process does. Read from /proc, so nothing is locked to find out."""
    status = directory / "status"
    try:
        found = re.search(r"PID: (\d+)", status.read_text(errors="replace"))
    except OSError:
        return None
    pid = int(found.group(1)) if found else os.getpid()
    if pid == os.getpid():
        return None
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:  # gone (or no /proc here)
        return None
    except PermissionError:  # another user's process: alive, and most likely the holder
        fds = []
    else:
        target = str(status.resolve())
        opened = []
        for fd in fds:
            try:
                opened.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
        if target not in opened:
            return None
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        argv = []
    return pid, [a for a in argv if a]


def holder(directory: Path) -> str | None:
    """Who holds an embedded store (``a running worker (pid N: command)``); None when nobody does,
    or this process does."""
    found = _holding(directory)
    if found is None:
        return None
    pid, argv = found
    command = " ".join(" ".join(argv).split())
    what = "a running worker" if " worker" in command else "another process"
    return f"{what} (pid {pid}" + (f": {command[:120]}" if command else "") + ")"


def served_at(argv: list[str]) -> str | None:
    """The URL a ``burnwatch store serve`` command line serves its store at, as a local client reaches it;
    None when ``argv`` is no ``store serve`` or its port was picked at its start (``--port 0``)."""
    at = next((i for i in range(len(argv) - 1) if argv[i:i + 2] == ["store", "serve"]), None)
    if at is None:
        return None
    options = {"--host": "127.0.0.1", "--port": "8123"}  # store serve's defaults
    rest = argv[at + 2:]
    for i, arg in enumerate(rest):
        name, equals, value = arg.partition("=")
        if name in options:
            options[name] = value if equals else (rest[i + 1] if i + 1 < len(rest) else "")
    host, port = options["--host"], options["--port"]
    if not port.isdigit() or int(port) == 0:
        return None
    if host in ("", "0.0.0.0", "::"):  # every interface: loopback among them
        host = "127.0.0.1"
    return f"http://{f'[{host}]' if ':' in host else host}:{int(port)}"


def connect(dsn: str, create: bool = True, **settings: Any) -> Any:
    """A clickhouse-connect client for ``chdb:///dir``, ``chdb://memory`` or ``http(s)://…``.
    ``create=False``: an embedded store's directory must hold one already (:class:`StoreNotFound`).
    ``settings``: the client's own (``send_receive_timeout``, ...).
    An embedded store another process holds is :class:`StoreBusy`, saying who and what to do."""
    import clickhouse_connect  # here, not with the module: a fifth of a second that commands never connecting skip

    from detector.logs import redact, redact_dsn

    no_dataframes()

    directory = chdb_dir(dsn)
    if directory is not None:
        if not create and not (directory / "metadata").is_dir():
            raise StoreNotFound(f"no store at {directory}" + (" (the directory holds no ClickHouse data)"
                                                              if directory.exists() else ""))  # fmt: skip
        found = _holding(directory)
        url = served_at(found[1]) if found is not None else None
        if found is not None and url is not None:
            raise StoreBusy(
                f"the embedded store {directory} is held by `burnwatch store serve` (pid {found[0]}), which serves "
                f"it: run this command with BURNWATCH_CLICKHOUSE_DSN={url}"
            )
        held_by = holder(directory)
        if held_by is not None:
            raise StoreBusy(
                f"the embedded store {directory} is held by {held_by}, and one process at a time opens it. To query "
                "it, stop that process, or have one process own the store and share it: `burnwatch store serve "
                f"--dsn chdb://{directory}`, then BURNWATCH_CLICKHOUSE_DSN=http://127.0.0.1:8123 for the workers "
                "and for these commands"
            )
        directory.mkdir(parents=True, exist_ok=True)
    try:
        return clickhouse_connect.get_client(dsn=dsn, **settings)
    except Exception as exc:  # its message may quote the DSN, password included
        raise ConnectionError(f"cannot connect to ClickHouse at {redact_dsn(dsn)}: {redact(str(exc))}") from None


def no_dataframes() -> None:
    """Tell clickhouse-connect that this process inserts no pandas DataFrame, unless pandas is loaded already.
    It asks whether each insert's rows are a DataFrame, and imports pandas to ask (installed: chdb depends on
    it): 0.3-0.6 CPU s and 40-70 MB more in each process that inserts through it (the worker, a command that
    writes, the event writer's child). burnwatch inserts lists and columns, never a DataFrame, and reads no
    result as one. For the process's life: pandas imported later (scikit-learn imports it when a model
    loads) is not seen, and clickhouse-connect's DataFrame calls (``query_df``, ``insert_df``) would refuse
    (tests/test_imports.py fails if burnwatch makes one). Called by :func:`connect` and by the event
    writer's child, which makes its insert contexts without it (its ``RelayClient``)."""
    import sys

    from clickhouse_connect.driver import options

    if "pandas" not in sys.modules and "pd" not in vars(options):
        options.pd = options.pd_time_test = None


class Connection:
    """burnwatch's database on one client. Thread-safe: calls are serialised by :attr:`lock`
    (a repository that makes several calls as one, like an insert and its look-ups, holds
    it and uses :attr:`client` directly)."""

    def __init__(self, client: Any, database: str = "burnwatch", *, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.db = database
        """The database's name: tables are ``{db}.name``."""
        self.lock = threading.Lock()
        self._types: dict[tuple[str, Callable[[str], str] | None], tuple[float, dict[str, str]]] = {}
        """(table, how a type is sent) → when its columns' type names were asked, and they (:meth:`insert_context`)."""
        self._clock = clock

    def close(self) -> None:
        with self.lock:
            self.client.close()

    def query(self, sql: str, parameters: dict[str, Any] | None = None, read_only: bool = False) -> list[dict[str, Any]]:
        """Rows as dicts (column name → value); ``read_only``: ClickHouse refuses anything that writes
        (``readonly = 2``: settings may still change), for a query a person typed. A user read-only
        already is left so (the setting cannot be sent to it); on the embedded engine the setting stays
        for the rest of the process, so it is for a process that only reads after it (``burnwatch sql``)."""
        with self.lock:
            result = self.client.query(sql, parameters=parameters or {}, settings=self._reading(read_only))
        return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]

    @contextmanager
    def stream(self, sql: str, read_only: bool = False) -> Iterator[tuple[list[str], Iterator[Sequence[Any]]]]:
        """The column names and the result's blocks of rows as the engine sends them (``read_only`` as
        :meth:`query`'s): a reader that stops early (``burnwatch sql | head``) ends the query."""
        with self.lock, self.client.query_row_block_stream(sql, settings=self._reading(read_only)) as blocks:
            yield list(blocks.source.column_names), iter(blocks)

    def _reading(self, read_only: bool) -> dict[str, Any] | None:
        """The settings of a query that must only read: ``readonly = 2``, unless the user is read-only already
        (clickhouse-connect refuses to send a setting the server says is read-only)."""
        if not read_only:
            return None
        found = getattr(self.client, "server_settings", {}).get("readonly")
        return {"readonly": 2} if found is None or str(getattr(found, "value", "0")) == "0" else None

    def named(self, name: str, parameters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Rows of the named query :func:`named_sql` ``(name)``, with ``db`` bound to this database."""
        return self.query(named_sql(name), {**(parameters or {}), "db": self.db})

    def insert(self, table: str, rows: list[list[Any]], column_names: list[str], column_oriented: bool = False) -> None:
        """Insert rows (or, ``column_oriented``, columns) into ``{db}.table`` (:meth:`insert_context`)."""
        with self.lock:
            context = self.insert_context(table, column_names, column_oriented)
            context.data = rows
            if context.empty:
                return
            try:
                self.client.insert(context=context)
            except BaseException:
                self.forget_types()
                raise

    def insert_context(self, table: str, column_names: Sequence[str], column_oriented: bool = False,
                       wire: Callable[[str], str] | None = None, settings: dict[str, Any] | None = None) -> Any:  # fmt: skip
        """A new insert context for these columns of ``{db}.table``. The table's column types are asked
        of the store and kept: the client asks them (a DESCRIBE) at every insert otherwise, a round
        trip to a server and ~0.6 ms on the embedded engine, a sixth of a small insert. ``wire`` names the
        type a column's values are sent as. A new context each insert, not one kept: a context holds its
        last rows alive. The types are asked again when a column is missing from them (a migration added
        it), when :data:`TYPES_KEPT_S` have passed (a type changed elsewhere that no insert fails on), and
        after :meth:`forget_types`, which the caller, holding :attr:`lock`, calls after a failed insert."""
        key = (table, wire)
        kept = self._types.get(key)
        now = self._clock()
        if kept is None or now - kept[0] >= TYPES_KEPT_S or any(name not in kept[1] for name in column_names):
            described = self.client.query(f"DESCRIBE TABLE {self.db}.{table}").result_rows
            kept = self._types[key] = (now, {row[0]: wire(row[1]) if wire else row[1] for row in described})
        types = kept[1]
        missing = [name for name in column_names if name not in types]
        if missing:
            from clickhouse_connect.driver.exceptions import ProgrammingError

            raise ProgrammingError(f"no column {', '.join(missing)} in {self.db}.{table}")
        names = list(column_names)
        return self.client.create_insert_context(f"{self.db}.{table}", names, column_oriented=column_oriented,
                                                 column_type_names=[types[n] for n in names], settings=settings)  # fmt: skip

    def forget_types(self) -> None:
        """Ask the tables' column types again at the next insert (one failed, or the schema was migrated)."""
        self._types.clear()

    def command(self, sql: str) -> Any:
        with self.lock:
            return self.client.command(sql)

    def count(self, table: str) -> int:
        return int(self.command(f"SELECT count() FROM {self.db}.{table}"))

    @staticmethod
    def refused(exc: BaseException) -> bool:
        """Whether an insert's error says ClickHouse (or the client, building the block) refused
        these rows, as opposed to the store being unavailable, overloaded or slow: only then is a
        batch split to isolate a message, which is dead-lettered; any other error is retried."""
        if isinstance(exc, (OverflowError, struct.error, ValueError, TypeError, UnicodeError)):
            return True
        code = getattr(exc, "code", None)
        if code is None:
            found = _CODE.search(str(exc))
            code = int(found.group(1)) if found else None
        return code in _DATA_ERRORS

    def writable(self, writer: str = "worker") -> bool:
        """Whether the store takes a write now: after an insert failed, this tells a store that
        cannot be written (retry later, drop nothing) from rows it refuses (isolate them)."""
        try:
            self.insert("write_probe", [[writer, ms(time.time())]], column_names=["writer", "at"])
            return True
        except Exception as exc:  # noqa: BLE001 - any failure of the probe means "not writable now"
            log.warning("store_not_writable", error=one_line(exc))
            return False
