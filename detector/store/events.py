"""Writing events: columnar batch inserts that leave out what is stored already.

An event's id is its content's hash (:func:`~detector.store.batch.event_ids`): an event read
again after a crash or a rebalance, re-sent by its producer, or read from a recreated topic
has the same id, and an insert leaves out the ids stored in the batch's time span
(docs/reliability.md).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

from detector.events import Event, RunEvent
from detector.metrics import METRICS
from detector.pricing import Pricer, Pricing
from detector.store.batch import KIND, SOURCE_COLS, EventBatch, event_ids
from detector.store.connection import Connection

__all__ = ["Events", "InsertMetrics"]

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
        self._contexts: dict[tuple[str, tuple[str, ...]], Any] = {}
        """(table, columns) → the client's insert context, kept: asking the table's column
        types on every insert costs a query each."""

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

    def insert(self, batch: EventBatch, pricing: Pricing | Pricer | None = None) -> int:
        """Insert a batch: one columnar insert per non-empty table. Events already stored
        (the same content: read again after a crash or a rebalance, re-sent by a producer,
        or read from a recreated topic) and repeats within the batch are left out, so
        nothing counts twice. Returns rows written. Raises whatever the client raises: the
        caller tells a store that cannot be written from rows it refuses
        (:meth:`~detector.store.connection.Connection.writable`)."""
        written = 0
        client = self.conn.client
        with self.conn.lock:
            tables = list(batch.tables(pricing))
            stored = self._stored_ids([(table, cols[names.index(_KEY_COLUMN[table])], cols[0])
                                       for table, names, cols in tables])  # fmt: skip
            for table, names, cols in tables:
                keep = self._new_rows(names, cols, *stored[table])
                if keep is not None:
                    cols = [[col[i] for i in keep] for col in cols]
                if not cols[0]:
                    continue
                started = time.perf_counter()
                context = self._context(table, names)
                context.data = cols
                try:
                    client.insert(context=context)
                except BaseException:
                    self._contexts.clear()  # the table may have changed: ask its types again
                    raise
                finally:
                    context.data = None  # the batch's rows are not kept alive
                self.observe.insert(time.perf_counter() - started, len(cols[0]))
                written += len(cols[0])
        return written

    def _context(self, table: str, names: list[str]) -> Any:
        """The insert context of these columns of ``table``, their types asked of the store
        once (sent as :func:`wire_type`). The caller holds the lock."""
        key = (table, tuple(names))
        context = self._contexts.get(key)
        if context is None:
            client = self.conn.client
            described = client.query(f"DESCRIBE TABLE {self.conn.db}.{table}").result_rows
            types = {row[0]: row[1] for row in described}
            context = client.create_insert_context(f"{self.conn.db}.{table}", names, column_oriented=True,
                                                   column_type_names=[wire_type(types[n]) for n in names],
                                                   settings=_INSERT_SETTINGS)  # fmt: skip
            self._contexts[key] = context
        return context

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
        if len(keep) == len(ids):
            return None
        self.observe.duplicates(len(ids) - len(keep))
        return keep

    def _stored_ids(self, asked: Sequence[tuple[str, list[str], list[int]]]) -> dict[str, tuple[set[int], set[tuple[Any, ...]]]]:
        """For each ``(table, keys, ts in ms)`` asked: the event ids already stored for these keys
        within the batch's time span, looked up per day the batch touches (through the table's
        (key, ts) order, so the cost follows what is stored there, which is nothing for new data);
        and the Kafka sources of rows stored there without an id (before migration 0005). One
        query for every table (a query into the embedded engine costs a few ms whatever it
        reads). The caller holds the lock."""
        found: dict[str, tuple[set[int], set[tuple[Any, ...]]]] = {}
        selects: list[str] = []
        tables: list[str] = []
        """The table of each select, by its ``asked`` column."""
        parameters: dict[str, Any] = {}
        for table, keys, ts_ms in asked:
            found.setdefault(table, (set(), set()))
            if not ts_ms:
                continue
            n = len(selects)
            tables.append(table)
            clauses = self._within(_KEY_COLUMN[table], keys, ts_ms, f"t{n}_", parameters)
            selects.append(f"SELECT {n} AS asked, event_id, src_topic, src_partition, src_offset "
                           f"FROM {self.conn.db}.{table} WHERE {clauses}")  # fmt: skip
        if not selects:
            return found
        result = self.conn.client.query(" UNION ALL ".join(selects), parameters=parameters)
        for n, event_id, topic, partition, offset in result.result_rows:
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
