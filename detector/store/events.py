"""Writing events: columnar batch inserts that leave out what is stored already.

An event's id is its content's hash (:func:`~detector.store.batch.event_ids`): an event read
again after a crash or a rebalance, re-sent by its producer, or read from a recreated topic
has the same id, and an insert leaves out the ids stored in the batch's time span
(docs/reliability.md).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from detector.events import Event, RunEvent
from detector.metrics import METRICS
from detector.pricing import Pricer, Pricing
from detector.store.batch import KIND, SOURCE_COLS, EventBatch, event_ids
from detector.store.connection import Connection

__all__ = ["Events", "InsertMetrics", "PreparedBlock", "PreparedInsert", "native"]

_KEY_COLUMN = {"resource_usage": "resource_id", "gpu_metrics": "resource_id", "run_events": "run_id"}
_DAY_MS = 86_400_000
_MAX_SPANS = 16
_MAX_KEYS = 2_000
"""Keys in one look-up's text; with more, the look-up reads the span's rows of every key."""
_INSERT_SETTINGS = {"max_partitions_per_insert_block": 0}
"""A message may carry events of any age: an insert touching many monthly partitions is valid."""
_LOW_CARDINALITY = re.compile(r"LowCardinality\(([^()]*(?:\([^()]*\))?)\)")


def wire_type(column_type: str) -> str:
    """The type a column's values are sent as: its own, less ``LowCardinality``, which
    ClickHouse applies as it stores them. Sending plain strings spares building each
    block's dictionary in Python (the client's slowest step, holding the GIL)."""
    return _LOW_CARDINALITY.sub(r"\1", column_type)


def native(context: Any) -> bytes:
    """The insert context's rows in ClickHouse's Native format, as clickhouse-connect sends them,
    less the statement it puts before the first block (a raw insert names its table and columns)."""
    from clickhouse_connect.driver.transform import NativeTransform

    chunks = list(NativeTransform.build_insert(context))
    if context.insert_exception is not None:  # a column that cannot be encoded (raised as the client raises it)
        failed, context.insert_exception = context.insert_exception, None
        raise failed
    if chunks:
        statement_end = b" FORMAT Native\n"
        chunks[0] = chunks[0][chunks[0].index(statement_end) + len(statement_end) :]
    return b"".join(chunks)


@dataclass(frozen=True)
class PreparedBlock:
    """One table's rows of a prepared insert, Native-encoded."""

    table: str
    names: list[str]
    ids: list[int]
    """The rows' event ids, to tell whether any is stored already."""
    body: bytes
    settings: dict[str, Any]


@dataclass(frozen=True)
class PreparedInsert:
    """A batch's insert made ready without reading the store (:meth:`Events.prepare`): the look-up
    of its ids to run, and each table's rows Native-encoded. Bytes, strings and numbers only: it
    crosses a pipe from the process that made it."""

    lookup: str | None
    """The look-up's SQL (None: nothing to look up)."""
    parameters: dict[str, Any]
    asked: list[str]
    """The table of each select of the look-up."""
    blocks: list[PreparedBlock]
    repeats: int
    """Rows left out as repeats of an event within the batch (counted as duplicates once stored)."""


class InsertMetrics:
    """Where an insert's figures go: the process's metrics (a writer in a child process hands
    them to the worker's instead, :mod:`streams.event_writer`)."""

    def insert(self, seconds: float, rows: int) -> None:
        METRICS.insert_seconds.observe(seconds)
        METRICS.insert_rows.observe(rows)

    def duplicates(self, n: int) -> None:
        METRICS.duplicates_skipped.inc(n)


class Events:
    """The raw event tables (``resource_usage``, ``gpu_metrics``, ``run_events``), written."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.observe = InsertMetrics()

    def stored(self, events: Sequence[Event]) -> list[bool]:
        """For each event, whether one with its content is stored already (read again after a
        restart, or re-sent): the ids :meth:`insert` deduplicates by."""
        flags = [False] * len(events)
        by_type: dict[type, list[int]] = {}
        for i, event in enumerate(events):
            by_type.setdefault(type(event), []).append(i)
        groups = {etype: [events[i] for i in indexes] for etype, indexes in by_type.items()}
        asked = [(KIND[etype][1], [e.run_id if isinstance(e, RunEvent) else e.resource_id for e in group],
                  [round(e.ts.timestamp() * 1000) for e in group]) for etype, group in groups.items()]  # fmt: skip
        with self.conn.lock:
            found = self._stored_ids(asked)
        for etype, indexes in by_type.items():
            kind, table = KIND[etype]
            ids = found[table][0]
            for i, event_id in zip(indexes, event_ids(kind, groups[etype]), strict=True):
                flags[i] = event_id in ids
        return flags

    def insert(self, batch: EventBatch, pricing: Pricing | Pricer | None = None,
               before_insert: Callable[[], None] | None = None) -> int:  # fmt: skip
        """Insert a batch: one columnar insert per non-empty table. Events already stored
        (the same content: read again after a crash or a rebalance, re-sent by a producer,
        or read from a recreated topic) and repeats within the batch are left out, so
        nothing counts twice. Returns rows written. Raises whatever the client raises: the
        caller tells a store that cannot be written from rows it refuses
        (:meth:`~detector.store.connection.Connection.writable`). ``before_insert`` is called
        after the look-up, just before the first insert: what it raises stops the insert."""
        written = 0
        client = self.conn.client
        with self.conn.lock:
            tables = list(batch.tables(pricing))
            stored = self._stored_ids(self._asked(tables))
            for table, names, cols in tables:
                keep = self._new_rows(names, cols, *stored[table])
                if keep is not None:
                    self.observe.duplicates(len(cols[0]) - len(keep))
                    cols = [[col[i] for i in keep] for col in cols]
                if not cols[0]:
                    continue
                if before_insert is not None and not written:
                    before_insert()
                started = time.perf_counter()
                context = self._context(table, names)
                context.data = cols
                try:
                    client.insert(context=context)
                except BaseException:
                    self.conn.forget_types()  # the table may have changed: ask its types again
                    raise
                self.observe.insert(time.perf_counter() - started, len(cols[0]))
                written += len(cols[0])
        return written

    def prepare(self, batch: EventBatch, pricing: Pricing | Pricer | None = None) -> PreparedInsert:
        """What :meth:`insert` does that needs no answer from the store (the columns, the ids, the
        look-up's text, the Native encoding: most of an insert's Python), done ahead: a writer child
        prepares a batch while the worker inserts the one before (:mod:`streams.event_writer`), and
        :meth:`insert_prepared` then only looks up and sends. Repeats within the batch are left out
        here; the column types are asked of the store once (:meth:`_context`)."""
        blocks: list[PreparedBlock] = []
        repeats = 0
        with self.conn.lock:
            tables = list(batch.tables(pricing))
            lookup, parameters, asked = self._lookup(self._asked(tables))
            for table, names, cols in tables:
                keep = self._new_rows(names, cols, set(), set())
                if keep is not None:
                    repeats += len(cols[0]) - len(keep)
                    cols = [[col[i] for i in keep] for col in cols]
                if not cols[0]:
                    continue
                context = self._context(table, names)
                context.data = cols
                try:
                    body = native(context)
                except BaseException:
                    self.conn.forget_types()  # the table may have changed: ask its types again
                    raise
                blocks.append(PreparedBlock(table, names, cols[names.index("event_id")], body, dict(context.settings)))
        return PreparedInsert(lookup, parameters, asked, blocks, repeats)

    def insert_prepared(self, prepared: PreparedInsert, before_insert: Callable[[], None] | None = None) -> int | None:
        """Store a batch :meth:`prepare` made ready: its look-up, then, when none of its rows is stored
        (new data, the common case), its blocks as they are; when all are (a batch read again after
        a restart), nothing. None, having sent nothing: some are stored already (re-sent, or a write
        that failed midway), and the caller inserts the batch with :meth:`insert`, which leaves them
        out. Raises what the client raises, as :meth:`insert` does; ``before_insert`` as there."""
        client = self.conn.client
        rows = sum(len(block.ids) for block in prepared.blocks)
        with self.conn.lock:
            if prepared.lookup is not None:
                answer = client.query(prepared.lookup, parameters=prepared.parameters).result_rows
                found = self._found({block.table: (set(), set()) for block in prepared.blocks}, prepared.asked, answer)
                stored = 0
                for block in prepared.blocks:
                    seen, legacy = found[block.table]
                    if legacy:
                        return None
                    stored += len(seen.intersection(block.ids))  # (a block's ids are distinct: repeats left out)
                if stored == rows:
                    self.observe.duplicates(rows + prepared.repeats)
                    return 0
                if stored:
                    return None
            written = 0
            if before_insert is not None and prepared.blocks:
                before_insert()
            for block in prepared.blocks:
                started = time.perf_counter()
                client.raw_insert(f"{self.conn.db}.{block.table}", block.names, insert_block=block.body,
                                  settings=block.settings, fmt="Native")  # fmt: skip
                self.observe.insert(time.perf_counter() - started, len(block.ids))
                written += len(block.ids)
        if prepared.repeats:
            self.observe.duplicates(prepared.repeats)
        return written

    def _context(self, table: str, names: list[str]) -> Any:
        """A new insert context of these columns of ``table``, their types kept from the store's answer
        (:meth:`~detector.store.connection.Connection.insert_context`), sent as :func:`wire_type`.
        The caller holds the lock."""
        return self.conn.insert_context(table, names, column_oriented=True, wire=wire_type, settings=_INSERT_SETTINGS)

    def _new_rows(self, names: list[str], cols: list[list[Any]], seen: set[int],
                  legacy: set[tuple[Any, ...]]) -> list[int] | None:  # fmt: skip
        """Indexes of the rows to insert (the first of each event id, not stored yet: ``seen``, which
        this adds to); None: all. Rows stored before events had ids (``event_id`` 0) are matched
        by their Kafka source (``legacy``)."""
        ids = cols[names.index("event_id")]
        keep = []
        if legacy:
            sources = zip(*(cols[names.index(c)] for c in SOURCE_COLS[1:]), strict=True)
            for i, (event_id, source) in enumerate(zip(ids, sources, strict=True)):
                if event_id not in seen and source not in legacy:
                    seen.add(event_id)
                    keep.append(i)
        elif not seen and len(set(ids)) == len(ids):  # new data, no repeat: the common case, at C speed
            return None
        else:
            for i, event_id in enumerate(ids):
                if event_id not in seen:
                    seen.add(event_id)
                    keep.append(i)
        return None if len(keep) == len(ids) else keep

    def _stored_ids(self, asked: Sequence[tuple[str, list[str], list[int]]]) -> dict[str, tuple[set[int], set[tuple[Any, ...]]]]:
        """For each ``(table, keys, ts in ms)`` asked: the event ids already stored for these keys
        within the batch's time span, looked up per day the batch touches (through the table's
        (key, ts) order, so the cost follows what is stored there, which is nothing for new data);
        and the Kafka sources of rows stored there without an id (before migration 0005). One
        query for every table (a query into the embedded engine costs a few ms whatever it
        reads). The caller holds the lock."""
        lookup, parameters, tables = self._lookup(asked)
        rows = self.conn.client.query(lookup, parameters=parameters).result_rows if lookup is not None else []
        return self._found({table: (set(), set()) for table, _, _ in asked}, tables, rows)

    @staticmethod
    def _asked(tables: Sequence[tuple[str, list[str], list[list[Any]]]]) -> list[tuple[str, list[str], list[int]]]:
        """The look-up's question for a batch's columns: each table's keys and times (ms)."""
        return [(table, cols[names.index(_KEY_COLUMN[table])], cols[0]) for table, names, cols in tables]

    def _lookup(self, asked: Sequence[tuple[str, list[str], list[int]]]) -> tuple[str | None, dict[str, Any], list[str]]:
        """:meth:`_stored_ids`'s query: its SQL (None: nothing asked), its parameters, and the table
        of each of its selects."""
        selects: list[str] = []
        tables: list[str] = []
        parameters: dict[str, Any] = {}
        for table, keys, ts_ms in asked:
            if not ts_ms:
                continue
            n = len(selects)
            tables.append(table)
            clauses = self._within(_KEY_COLUMN[table], keys, ts_ms, f"t{n}_", parameters)
            selects.append(f"SELECT {n} AS asked, event_id, src_topic, src_partition, src_offset "
                           f"FROM {self.conn.db}.{table} WHERE {clauses}")  # fmt: skip
        return (" UNION ALL ".join(selects) if selects else None), parameters, tables

    @staticmethod
    def _found(found: dict[str, tuple[set[int], set[tuple[Any, ...]]]], tables: list[str],
               rows: Sequence[tuple[Any, ...]]) -> dict[str, tuple[set[int], set[tuple[Any, ...]]]]:  # fmt: skip
        """The look-up's rows read into ``found`` (table → (event ids, Kafka sources of rows without an id))."""
        for n, event_id, topic, partition, offset in rows:
            ids, legacy = found[tables[n]]
            if event_id:
                ids.add(event_id)
            elif topic:
                legacy.add((topic, partition, offset))
        return found

    @staticmethod
    def _within(column: str, keys: list[str], ts_ms: list[int], prefix: str, parameters: dict[str, Any]) -> str:
        """The WHERE of one table's look-up: its keys per day the batch touches (one wider span past
        :data:`_MAX_SPANS` days, no keys in the text past :data:`_MAX_KEYS`)."""
        first, last = min(ts_ms), max(ts_ms)
        spans: dict[int, tuple[int, int, set[str]]] = {}
        if first // _DAY_MS == last // _DAY_MS:  # within one day (most batches): no loop per event
            spans[0] = (first, last, set(keys))
        else:
            for key, t in zip(keys, ts_ms, strict=True):
                span = spans.get(t // _DAY_MS)
                if span is None:
                    spans[t // _DAY_MS] = (t, t, {key})
                else:
                    span[2].add(key)
                    spans[t // _DAY_MS] = (min(span[0], t), max(span[1], t), span[2])
        if len(spans) > _MAX_SPANS:  # events over many days in one batch (a replay): one wider look-up
            spans = {0: (first, last, set(keys))}
        clauses: list[str] = []
        for n, (lo, hi, span_keys) in enumerate(spans.values()):
            within = (f"ts BETWEEN fromUnixTimestamp64Milli(%({prefix}lo{n})s, 'UTC') "
                      f"AND fromUnixTimestamp64Milli(%({prefix}hi{n})s, 'UTC')")  # fmt: skip
            if len(span_keys) <= _MAX_KEYS:  # the keys go into the query's text: bounded
                within = f"{column} IN %({prefix}k{n})s AND {within}"
                parameters[f"{prefix}k{n}"] = list(span_keys)
            clauses.append(f"({within})")
            parameters.update({f"{prefix}lo{n}": lo, f"{prefix}hi{n}": hi})
        return " OR ".join(clauses)
