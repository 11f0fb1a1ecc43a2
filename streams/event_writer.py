"""Where the worker's event inserts run: in its writer thread, or in a child process.

Storing an event costs Python: its content id (an encoding and a BLAKE2b), its columns and
clickhouse-connect's Native encoding of them, about a third of the worker's CPU time. In the
writer thread all of it holds the GIL that the event loop's decoding and detection need, so a
worker is bound to about one core (docs/performance.md). With a ClickHouse server (an
``http(s)://`` DSN) that work runs in a child process instead: the batch's message values,
which the worker holds already, cross a pipe (one msgspec call, no Python per event), the
child decodes them again (the same function of the bytes: the same events) and writes them
with its own client, by the same code the thread runs (:func:`store_events`). The embedded
engine (chdb) is one per process and its directory is one process's, so with it the child
reaches the store through the worker (:class:`RelayClient`): the child does the Python (ids,
columns, the Native encoding), and each of its queries and inserts, already encoded, is run
by the worker's writer thread on the worker's engine, which lets go of the GIL while it works.
There the child prepares a batch as soon as the worker has read it (:meth:`ProcessEventWriter.prepare`),
while the writer thread still inserts the batch before, so that the write itself is only the
look-up of stored ids and the inserts.

Either way the outcome is the same: the store leaves out what it holds (by content), a batch
the store refuses is split until the refused message is alone, and a store that cannot be
written raises :class:`StoreUnavailable`, which the pipeline retries, dropping nothing. A
child that dies (killed, out of memory) is a store unavailable for that try; the next try
starts a new one, and what the dead one stored is left out again by content.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import msgspec
import structlog

from detector.events import DAY_S, TS_MAX, Event, EventDecoder, InvalidMessage
from detector.limits import Limits
from detector.pricing import Pricing
from detector.store.batch import EventBatch
from detector.store.connection import Connection, connect, no_dataframes
from detector.store.events import Events, InsertMetrics, PreparedInsert, native
from detector.units import one_line
from streams.children import ask_parent_death_signal
from streams.membership import now as membership_clock

if TYPE_CHECKING:
    from detector.store import Store

__all__ = [
    "EventWriter",
    "HeldUntil",
    "NotMember",
    "ProcessEventWriter",
    "RelayClient",
    "RelayedError",
    "StoreUnavailable",
    "ThreadEventWriter",
    "store_events",
    "usable_cpus",
    "writer_for",
]

Prepared = Future[PreparedInsert | None]
"""A batch's insert being made ready ahead (:meth:`EventWriter.prepare`): None when it could not be."""

log = structlog.get_logger("burnwatch.worker")


class Sourced(Protocol):
    """A message as the writer needs it: where it came from, and its value."""

    topic: str
    partition: int
    offset: int
    value: bytes | None


Item = tuple[Sourced, Sequence[Event]]
"""A message and the events the worker decoded from it."""
Refused = list[tuple[int, str]]
"""Indexes of the items the store refused, each with the reason."""

MAX_REASON = 2_000
"""Characters of a refusal's reason kept (in the dead-letter record and the log)."""
ANSWER_WITHIN_S = 900.0
"""How long an exchange with the child (a write, or a batch's preparation) waits for its answer before
killing it (a hung or stopped child): past
the ClickHouse client's own 300 s timeout and a retry, so a slow store is not taken for a hung child.
With the embedded engine it counts the worker's own runs of the child's calls too (the engine has no
client timeout): a call past it ends the write as a store unavailable once the call returns, retried,
and what it stored is left out again by content."""


class NotMember(Exception):
    """An insert was about to be sent after the worker's membership of its group ran out (a freeze:
    :mod:`streams.membership`): nothing more of the batch was sent. The pipeline waits for the group
    to say whether it holds the worker still, then writes the batch again or drops it."""


HeldUntil = Callable[[], float]
"""When (:func:`streams.membership.now`) the worker's membership runs out unless renewed (:meth:`Membership.held_until`)."""


def _within(held_until: float, ask_again: Callable[[], float] | None = None) -> Callable[[], None]:
    """A ``before_insert`` that raises :class:`NotMember` once the memberships' clock reaches ``held_until``,
    unless ``ask_again()`` (the worker's end now: a heartbeat may have renewed it since) is later."""
    end = [held_until]

    def check() -> None:
        if membership_clock() >= end[0] and ask_again is not None:
            end[0] = ask_again()
        if membership_clock() >= end[0]:
            raise NotMember

    return check


def _while_held(held_until: HeldUntil | None) -> Callable[[], None] | None:
    return None if held_until is None else lambda: _within(held_until())()


class StoreUnavailable(Exception):
    """The store takes no write at all (down, read-only, full): retry, drop nothing."""


class RelayedError(Exception):
    """What the worker's store raised for a call the child relayed to it, with its ClickHouse
    code (None when it has none), so that :meth:`~detector.store.connection.Connection.refused`
    tells refused rows from a store unavailable as it does in the writer thread."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


_REFUSED_HERE = (OverflowError, struct.error, ValueError, TypeError, UnicodeError)
"""Errors a client raises for the rows themselves, before ClickHouse sees them (as
:meth:`~detector.store.connection.Connection.refused` reads them)."""


class _Rows:
    """A relayed query's answer: as much of clickhouse-connect's ``QueryResult`` as
    :class:`~detector.store.events.Events` reads."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.result_rows = rows


class RelayClient:
    """The worker's embedded store as the child reaches it: through the worker. Each query and
    insert :class:`~detector.store.events.Events` makes is a request down the pipe that the
    worker runs on its own client (:meth:`ProcessEventWriter._run`: in the thread of the exchange,
    the writer thread's or the preparing one's), an insert
    already encoded here (clickhouse-connect's Native encoding, the client's slowest Python);
    the worker answers with the rows, or the error."""

    def __init__(self, pipe: Pipe) -> None:
        self._pipe = pipe
        no_dataframes()  # the child makes its insert contexts without connect(), which says so

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> _Rows:
        return _Rows(self._call("query", sql, parameters or {}))

    def create_insert_context(
        self,
        table: str,
        column_names: Sequence[str],
        column_oriented: bool = False,
        column_type_names: Sequence[str] = (),
        settings: dict[str, Any] | None = None,
    ) -> Any:
        """The client's insert context, made here: the types are named (the connection asked the
        worker once, :meth:`~detector.store.connection.Connection.insert_context`)."""
        from clickhouse_connect.datatypes.registry import get_from_name
        from clickhouse_connect.driver.insert import InsertContext

        return InsertContext(table, list(column_names), [get_from_name(name) for name in column_type_names],
                             column_oriented=column_oriented, settings=settings)  # fmt: skip

    def insert(self, context: Any) -> None:
        """An insert of ``context``'s rows, encoded here."""
        self._call("insert_native", context.table, list(context.column_names), native(context), dict(context.settings))

    def close(self) -> None:
        """The worker's client is the worker's to close."""

    def _call(self, op: str, *args: Any) -> Any:
        self._pipe.send(("call", op, args))
        ok, answer = self._pipe.recv()
        if ok:
            return answer
        message, code, refused_here = answer
        raise ValueError(message) if refused_here else RelayedError(message, code)


class EventStore(Connection):
    """The store as the child needs it: the connection and the events' repository. Not
    :class:`~detector.store.Store`, whose other repositories import the alerts, the rules and the
    detectors: half a second at every start of the child, which writes events only."""

    def __init__(self, client: Any, database: str) -> None:
        super().__init__(client, database)
        self.events = Events(self)


def store_events(store: Store | EventStore, items: Sequence[Item], pricing: Pricing | None,
                 before_insert: Callable[[], None] | None = None) -> Refused:  # fmt: skip
    """Store the items' events; return the items the store refused, each with the reason. A
    failed insert is split in halves until the refused item is alone (what was stored
    meanwhile is not stored again: the store leaves out what it holds). Raises
    :class:`StoreUnavailable` when the store, not the data, is at fault, and what
    ``before_insert`` raises (called before each insert, after its look-up)."""
    return _store(store, items, 0, pricing, before_insert)


def _batch(items: Sequence[Item]) -> EventBatch:
    batch = EventBatch()
    for message, events in items:
        batch.extend(events, (message.topic, message.partition, message.offset))
    return batch


def _store(store: Store | EventStore, items: Sequence[Item], first: int, pricing: Pricing | None,
           before_insert: Callable[[], None] | None) -> Refused:  # fmt: skip
    if not items:
        return []
    try:
        store.events.insert(_batch(items), pricing, before_insert)
        return []
    except NotMember:
        raise
    except Exception as exc:  # noqa: BLE001 - a client, a driver or the server may raise
        if not store.refused(exc) or not store.writable():  # not the rows: retry, drop nothing
            raise StoreUnavailable(one_line(exc)) from exc
        if len(items) == 1:
            return [(first, f"the store refused this message's events: {one_line(exc, MAX_REASON)}")]
    half = len(items) // 2
    return (_store(store, items[:half], first, pricing, before_insert)
            + _store(store, items[half:], first + half, pricing, before_insert))  # fmt: skip


class EventWriter:
    """Writes a batch's events (:func:`store_events`), here or elsewhere."""

    def prepare(self, items: Sequence[Item], pricing: Pricing | None) -> Prepared | None:
        """Start making the batch's insert ready now, elsewhere, for its :meth:`write` later (None:
        this writer does not)."""
        return None

    def write(self, items: Sequence[Item], pricing: Pricing | None, prepared: Prepared | None = None,
              held_until: HeldUntil | None = None) -> Refused:  # fmt: skip
        """Store the batch (:func:`store_events`). ``held_until``: no insert is sent at or after the time it
        gives, asked just before (the worker's membership of its group: :class:`NotMember` then)."""
        raise NotImplementedError

    def close(self) -> None:
        """Nothing is written after this."""


class ThreadEventWriter(EventWriter):
    """In the calling thread (the pipeline's writer thread), on the worker's own store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def write(self, items: Sequence[Item], pricing: Pricing | None, prepared: Prepared | None = None,
              held_until: HeldUntil | None = None) -> Refused:  # fmt: skip
        return store_events(self.store, items, pricing, _while_held(held_until))


class Received(msgspec.Struct, array_like=True):
    """A message as the child reads it from the pipe."""

    topic: str
    partition: int
    offset: int
    value: bytes | None


_WIRE = msgspec.msgpack.Decoder(list[Received])
_ANY_TIME = TS_MAX.timestamp() - DAY_S
"""The child decoder's clock: a day before the contract's last time, so it accepts any time."""


def encode_items(items: Sequence[Item]) -> bytes:
    """The items as they came: each message's value, not its decoded events (the worker
    decoded it already; sending the bytes it holds costs it nothing per event)."""
    return msgspec.msgpack.encode([(m.topic, m.partition, m.offset, m.value) for m, _ in items])


def child_decoder() -> EventDecoder:
    """The child's decoder: the worker's, with no bound that depends on when or where it runs
    (its clock, ``limits.yaml``). Decoding is the same function of the bytes whatever those
    are; they only decide whether a message is refused, and the worker sends none it refused."""
    return EventDecoder(clock=lambda: _ANY_TIME, limits=Limits.none())


def decode_items(payload: bytes, decoder: EventDecoder) -> list[Item]:
    """:func:`encode_items` read back, each message decoded again (:class:`InvalidMessage` if one
    is not events: a worker and a child that disagree, which is a bug)."""
    return [(m, decoder.decode(m.topic, m.value)) for m in _WIRE.decode(payload)]


class ProcessEventWriter(EventWriter):
    """In a child process with its own client to the ClickHouse server at ``dsn``; with no
    ``dsn``, on ``store`` (the worker's embedded engine), which the child reaches through this
    writer (:class:`RelayClient`). Blocking calls from the pipeline's single writer thread; the
    pipe's wait and the engine's work release the GIL, which is the point.

    On the embedded engine a batch's insert is prepared ahead (:meth:`prepare`): as soon as the
    worker has read it, the child decodes it and makes its ids, columns and Native blocks, while
    the worker's writer thread is still inserting the batch before; the write then only looks up
    its ids and sends the blocks (:meth:`~detector.store.events.Events.insert_prepared`), so the
    writer thread is not left waiting on the child's Python. A batch whose ids are partly stored,
    which the store refuses, or which could not be prepared is written the usual way, the child
    doing it all (:meth:`write`). Only the writer thread starts a child (its parent-death signal
    follows the thread that started it, :func:`_die_with`): a batch read while there is none, the
    first or after one died, is not prepared. With a server the child does its inserts itself, and
    a batch is not prepared ahead (the child would do both in turn: nothing overlaps)."""

    def __init__(self, dsn: str | None, database: str, store: Store | None = None) -> None:
        if dsn is None and store is None:
            raise ValueError("an event writer process needs a ClickHouse server's DSN or the worker's store to relay to")
        self.dsn = dsn
        self.database = database
        self.relay = store if dsn is None else None
        """The store the child's queries and inserts run on, here (None: the child has its own client)."""
        self.fallback = ThreadEventWriter(store) if store is not None else None
        """Writes a batch the child could not read (a bug: logged) in the writer thread instead."""
        self._child: subprocess.Popen[bytes] | None = None
        self._pipe: Pipe | None = None
        self._pricing: Pricing | None = None
        self._lock = threading.Lock()
        """One exchange with the child at a time: a write's (the writer thread) or a preparation's."""
        self._exchanging: str | None = None
        """The kind of the exchange in progress (None: none)."""
        self._held_until: HeldUntil | None = None
        """The membership's end of the write being exchanged, which the child may ask again (:meth:`_run`)."""
        self._closed = False
        self.answer_within_s = ANSWER_WITHIN_S
        self._killed = False
        self._preparer: ThreadPoolExecutor | None = None
        """The thread that hands batches to the child to prepare, and waits for them, in order."""

    def prepare(self, items: Sequence[Item], pricing: Pricing | None) -> Prepared | None:
        if self.relay is None or not items or self._closed:
            return None
        if self._preparer is None:
            self._preparer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="event-prepare")
        return self._preparer.submit(self._prepare, items, pricing)

    def _prepare(self, items: Sequence[Item], pricing: Pricing | None) -> PreparedInsert | None:
        try:
            status, answer = self._exchange("prepare", items, pricing)
        except Exception as exc:  # noqa: BLE001 - the child died or hung (killed): the write starts another
            status, answer = "unavailable", one_line(exc)
        if status == "ok":
            prepared: PreparedInsert = answer
            return prepared
        if status != "no child":
            log.warning("event_prepare_failed", status=status, error=answer, note="the batch is written the usual way")
        return None

    def write(self, items: Sequence[Item], pricing: Pricing | None, prepared: Prepared | None = None,
              held_until: HeldUntil | None = None) -> Refused:  # fmt: skip
        if not items:
            return []
        if prepared is not None and self._write_prepared(prepared, held_until):
            return []
        status, answer = self._exchange("write", items, pricing, held_until)
        if status == "unreadable" and self.fallback is not None:
            log.error("event_writer_unreadable", error=answer, note="the batch is written in the worker's writer thread")
            return self.fallback.write(items, pricing, held_until=held_until)
        if status == "not member":
            raise NotMember
        if status == "unavailable":
            raise StoreUnavailable(answer)
        if status != "ok":
            raise StoreUnavailable(f"the event writer process failed: {answer}")
        return [(index, reason) for index, reason in answer]

    def _write_prepared(self, prepared: Prepared, held_until: HeldUntil | None = None) -> bool:
        """The prepared batch inserted on the worker's store, in this (the writer) thread. False,
        having stored nothing the usual write would not leave out: the batch could not be prepared
        (the child failed, died or hung: its watchdog killed it), some of its ids are stored, or
        the store refused its rows (the usual write splits the batch to name the message)."""
        store = self.relay
        if store is None:
            return False
        try:
            ready = prepared.result()
        except CancelledError:  # at close, before it was prepared
            ready = None
        if self._closed:
            raise StoreUnavailable("the event writer is closed (the worker is stopping)")
        if ready is None:
            return False
        try:
            return store.events.insert_prepared(ready, _while_held(held_until)) is not None
        except NotMember:
            raise
        except Exception as exc:  # noqa: BLE001 - a client, a driver or the engine may raise
            if not store.refused(exc) or not store.writable():  # not the rows: retry, drop nothing
                raise StoreUnavailable(one_line(exc)) from exc
            return False

    def _exchange(self, kind: str, items: Sequence[Item], pricing: Pricing | None,
                  held_until: HeldUntil | None = None) -> tuple[str, Any]:  # fmt: skip
        """Send the child a batch to ``write`` or ``prepare`` and return its answer (a status and
        what goes with it), running the calls it relays meanwhile; its insert figures go to this
        process's metrics. A child that dies, or gives no answer within :attr:`answer_within_s`
        (killed then), is a store unavailable, and the next write starts another."""
        with self._lock:
            if self._closed:
                raise StoreUnavailable("the event writer is closed (the worker is stopping)")
            pipe = self._pipe
            if pipe is None and kind == "prepare":
                return "no child", ""
            if pipe is None:
                try:
                    pipe = self._start()
                except OSError as exc:  # a fork refused (a pids or memory limit): a failed try, as a store down is
                    self._reap()
                    raise StoreUnavailable(f"cannot start the event writer process: {one_line(exc)}") from exc
            watchdog = threading.Timer(self.answer_within_s, self._kill, args=(self._child,))
            watchdog.daemon = True
            watchdog.start()
            self._exchanging = kind
            try:
                changed = pricing is not self._pricing
                # The price list when it changed (a reload), and when the worker's membership runs out: asked
                # now, so that a batch sent after a freeze (or while the worker froze) is not inserted late.
                until = held_until() if held_until is not None else math.inf
                self._held_until = held_until  # (asked again by the child once that end has passed: _run)
                pipe.send((kind, changed, pricing if changed else None, until))
                pipe.send_bytes(encode_items(items))  # (not pickled: a batch's values are megabytes)
                self._pricing = pricing
                status, answer, observed = self._answer(pipe)
            except (EOFError, OSError) as exc:
                hung = self._killed
                code = self._reap()
                if hung:
                    raise StoreUnavailable(f"the event writer process gave no answer within {self.answer_within_s:g} s "
                                           "and was killed; starting another") from exc  # fmt: skip
                raise StoreUnavailable(f"the event writer process exited ({code}); starting another") from exc
            except BaseException:  # anything else mid-exchange (a relayed answer too large to send): the pipe may
                self._reap()  # be out of step with the child, which must not read the next batch as an answer
                raise
            finally:
                watchdog.cancel()
                self._exchanging = None
        metrics = InsertMetrics()  # the child's figures, in this process's metrics
        for seconds, rows in observed.get("inserts", ()):
            metrics.insert(seconds, rows)
        if observed.get("duplicates"):
            metrics.duplicates(observed["duplicates"])
        return status, answer

    def _answer(self, pipe: Pipe) -> tuple[str, Any, dict[str, Any]]:
        """The child's answer to the batch, running the calls it relays meanwhile."""
        while True:
            message = pipe.recv()
            if message[0] != "call":
                return message
            pipe.send(self._run(message[1], message[2]))

    def _run(self, op: str, args: tuple[Any, ...]) -> tuple[bool, Any]:
        """One call the child relays, on the worker's store: (True, its answer) or (False, (the
        error's message, its ClickHouse code, whether the client refused the rows before sending)).
        ``held_until``: when the worker's membership ends now (the write's :data:`HeldUntil`)."""
        if op == "held_until":
            held_until = self._held_until
            return True, held_until() if held_until is not None else math.inf
        store = self.relay
        try:
            if store is None:
                raise RuntimeError("the event writer process relayed a call, but it has a store of its own")
            with store.lock:
                if op == "query":
                    sql, parameters = args
                    return True, store.client.query(sql, parameters=parameters).result_rows
                if op == "insert_native":
                    table, names, body, settings = args
                    store.client.raw_insert(table, names, insert_block=body, settings=settings, fmt="Native")
                    return True, None
            raise RuntimeError(f"the event writer process relayed an unknown call {op!r}")
        except Exception as exc:  # noqa: BLE001 - the child decides what it means (refused rows or a store down)
            return False, (str(exc)[: 10 * MAX_REASON], getattr(exc, "code", None), isinstance(exc, _REFUSED_HERE))

    def _start(self) -> Pipe:
        ours, theirs = socket.socketpair()
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "streams.event_writer", str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, close_fds=True,
            )  # fmt: skip
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._pipe = pipe = Pipe(ours.detach())
        pipe.send((self.dsn, self.database))  # not on the command line: a DSN may hold a password
        return pipe

    def _kill(self, child: subprocess.Popen[bytes] | None) -> None:
        """The watchdog: a child with no answer in time (hung, stopped) is killed, which ends the
        write waiting on it (the pipe breaks) as a store unavailable, retried with a new child."""
        if child is not None and child.poll() is None:
            self._killed = True
            child.kill()

    def _reap(self) -> int | None:
        """The child is gone or its pipe is broken: close both, so the next write starts anew."""
        pipe, child, self._pipe, self._child = self._pipe, self._child, None, None
        self._pricing, self._killed = None, False
        if pipe is not None:
            pipe.close()
        if child is None:
            return None
        try:
            return child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            return child.wait()

    def close(self) -> None:
        """Stop the child after the write in progress, if any (its pipe closed: it exits); a batch
        being prepared is not waited for (it will not be written): the child is killed."""
        self._closed = True
        if self._preparer is not None:
            self._preparer.shutdown(wait=False, cancel_futures=True)
        if self._exchanging == "prepare":
            self._kill(self._child)
        with self._lock:
            self._reap()


def writer_for(store: Store, dsn: str, database: str, mode: str = "auto", cpus: float | None = None) -> EventWriter:
    """The event writer a worker uses (``BURNWATCH_EVENT_WRITER``): a child process (``process``;
    ``auto`` when the worker may use two CPUs or more, ``cpus``, default :func:`usable_cpus`: the
    child decodes each event again, so on one CPU it only adds work), with its own client to a
    ClickHouse server, or reaching the worker's embedded engine through the worker; with
    ``thread``, the writer thread."""
    usable = cpus if cpus is not None else usable_cpus()
    if mode == "thread" or (mode == "auto" and usable < 2):
        log.info("event_writer", writer="thread", mode=mode, usable_cpus=usable)
        return ThreadEventWriter(store)
    server = urlsplit(dsn).scheme in ("http", "https")
    log.info("event_writer", writer="child, own client" if server else "child, through the worker", mode=mode,
             usable_cpus=usable)  # fmt: skip
    return ProcessEventWriter(dsn if server else None, database, store)


def usable_cpus(cgroup: Path = Path("/sys/fs/cgroup")) -> float:
    """CPUs this process may run on: its affinity, capped by its cgroup's CPU quota (a container's
    ``limits.cpu``), which ``os.cpu_count`` does not see: ``cpu.max`` under cgroup v2, and
    ``cpu/cpu.cfs_quota_us`` over ``cpu.cfs_period_us`` under v1 (nodes still on it, such as
    Amazon Linux 2's)."""
    cpus: float = len(os.sched_getaffinity(0))
    quota = _cgroup_quota(cgroup)
    return cpus if quota is None else min(cpus, quota)


def _cgroup_quota(cgroup: Path) -> float | None:
    """The CPU quota in CPUs (None: none, or none readable)."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass  # not cgroup v2
    try:
        quota_us = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        return None if quota_us < 0 else quota_us / int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _serve(pipe: Pipe, worker: int) -> None:
    """The child: write what comes down the pipe until it closes. A stop signal sent to the
    worker's process group is the worker's to handle: it lets its last write land, then closes
    the pipe, and the child ends there (or with the worker, killed: :func:`_die_with`)."""
    _die_with(worker)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    dsn, database = pipe.recv()
    observed: dict[str, Any] = {"inserts": [], "duplicates": 0}
    decoder = child_decoder()
    pricing: Pricing | None = None
    store: EventStore | None = None
    try:
        while True:
            try:
                kind, changed, sent_pricing, held_until = pipe.recv()
                payload = pipe.recv_bytes()
            except EOFError:
                return  # the worker closed the pipe
            if changed:
                pricing = sent_pricing  # (kept even when the store is out of reach: the worker sends it once)
            observed["inserts"], observed["duplicates"] = [], 0
            if store is None and dsn is None:  # the worker's embedded engine, through the worker
                store = EventStore(RelayClient(pipe), database)
                store.events.observe = _Observer(observed)
            if store is None:  # not reached yet: asked again at each try, as the writer thread's client is
                try:
                    store = EventStore(connect(dsn, create=False), database)
                except Exception as exc:  # noqa: BLE001 - no client: said to the worker, which retries
                    pipe.send(("unavailable", f"the event writer process cannot reach the store: {one_line(exc)}", {}))
                    continue
                store.events.observe = _Observer(observed)
            pipe.send((*_answer(kind, store, payload, decoder, pricing, held_until, _asker(pipe)), observed))
            del payload  # a batch is megabytes: not held while the child waits for the next
    finally:
        if store is not None:
            store.close()


def _asker(pipe: Pipe) -> Callable[[], float]:
    """Asks the worker, over the pipe as a relayed call, when its membership ends now."""

    def ask() -> float:
        pipe.send(("call", "held_until", ()))
        ok, answer = pipe.recv()
        return float(answer) if ok else -math.inf

    return ask


def _answer(kind: str, store: EventStore, payload: bytes, decoder: EventDecoder, pricing: Pricing | None,
            held_until: float = math.inf, ask_again: Callable[[], float] | None = None) -> tuple[str, Any]:  # fmt: skip
    """One batch decoded again, then stored (``write``: no insert sent at or after ``held_until``, the
    worker's membership, unless ``ask_again`` says it was renewed since; ``not member`` then) or its insert
    made ready for the worker to run (``prepare``: :meth:`Events.prepare`): the child's answer (a status and
    what goes with it)."""
    try:
        items = decode_items(payload, decoder)
    except InvalidMessage as exc:
        return "unreadable", one_line(exc, MAX_REASON)
    try:
        if kind == "prepare":
            return "ok", store.events.prepare(_batch(items), pricing)
        return "ok", store_events(store, items, pricing, _within(held_until, ask_again))
    except NotMember:
        return "not member", ""
    except StoreUnavailable as exc:
        return "unavailable", str(exc)
    except Exception as exc:  # noqa: BLE001 - told to the worker, which retries (or writes a batch it could not prepare)
        return "failed", one_line(exc, MAX_REASON)


def _die_with(worker: int) -> None:
    """Be killed when the worker dies (Linux's parent-death signal). A worker killed -9 takes its
    writer thread's insert with it; the child's batch must not be stored after it either: the
    next holder of the partitions reads those messages again and checks what is stored before
    it inserts, so an insert landing meanwhile could store the same events twice. (The signal
    comes when the thread that started the child ends: the pipeline's writer thread, which
    lives as long as the worker, and the only one that starts a child.)"""
    ask_parent_death_signal(signal.SIGKILL)  # not Linux: the child ends at the pipe's end-of-file, after its batch
    if os.getppid() != worker:  # the worker died before the signal was asked for
        os._exit(0)


class _Observer(InsertMetrics):
    """Records the child's insert metrics, which the worker's registry reports."""

    def __init__(self, into: dict[str, Any]) -> None:
        self.into = into

    def insert(self, seconds: float, rows: int) -> None:
        self.into["inserts"].append((seconds, rows))

    def duplicates(self, n: int) -> None:
        self.into["duplicates"] += n


if __name__ == "__main__":
    _serve(Pipe(int(sys.argv[1])), int(sys.argv[2]))
