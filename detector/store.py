"""The ClickHouse store: schema, columnar batch inserts, alert records.

One code path for the embedded engine (``chdb://``, via clickhouse-connect's
chdb backend) and a ClickHouse server (``http://``). Events are buffered as
columns and inserted in large batches; a chdb insert costs ~5 ms per call, so
one insert per event would cap the whole worker at ~200 events/s.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import clickhouse_connect
import msgspec
import structlog

from detector.alerts import Alert
from detector.detectors import REGISTRY, ResourceInfo
from detector.events import Event, GpuMetric, RunEvent, UsageEvent
from detector.metrics import METRICS
from detector.pricing import Pricer, Pricing
from detector.suppression import Hold, Silence, snooze
from detector.units import epoch, one_line

__all__ = [
    "EventBatch", "Migration", "Store", "StoreBusy", "StoreNotFound", "StoreOutdated", "alert_from_row", "chdb_dir",
    "connect", "epoch", "migrations",
]  # fmt: skip

log = structlog.get_logger("burnwatch.store")

_json = msgspec.json.Encoder()


MIGRATIONS_DIR = Path(__file__).with_name("migrations")
RAW_TABLES = ("resource_usage", "gpu_metrics", "run_events")
_MADE = re.compile(r"CREATE\s+(?:TABLE|(?:MATERIALIZED\s+)?VIEW)\s+IF\s+NOT\s+EXISTS\s+\{db\}\.(\w+)", re.IGNORECASE)
"""The name of each table or view a migration makes."""


@dataclass(frozen=True)
class Migration:
    """One file of ``detector/migrations``: ``NNNN_name.sql``, statements separated by ``;``
    at a line's end, ``{db}`` standing for the database. Forward-only: a released
    migration is never edited; a change is a new file. Every statement is idempotent (``IF
    NOT EXISTS``), so two workers starting together, or a store made before migrations
    were recorded, apply them safely."""

    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()[:16]

    def statements(self, db: str) -> list[str]:
        body = "\n".join(line for line in self.sql.splitlines() if not line.lstrip().startswith("--"))
        return [part.strip().replace("{db}", db) for part in re.split(r";\s*(?:\n|$)", body) if part.strip()]


def migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migrations in version order."""
    found = []
    for path in sorted(directory.glob("*.sql")):
        version, _, name = path.stem.partition("_")
        found.append(Migration(int(version), name, path.read_text()))
    return found


_USAGE_COLS = [
    "ts", "resource_id", "resource_type", "provider", "account", "region", "instance_type", "pricing",
    "state", "interval_s", "cost_usd", "egress_bytes", "dest_region", "storage_bytes", "capacity_bytes",
    "vector_count", "requests", "tags", "extra",
]  # fmt: skip
_GPU_COLS = [
    "ts", "resource_id", "gpu_index", "gpu_uuid", "model", "util_pct", "mem_used_mib", "mem_total_mib",
    "power_w", "sm_active", "extra",
]  # fmt: skip
_RUN_COLS = ["ts", "run_id", "status", "resource_ids", "gpu_count", "project", "tags", "error", "extra"]
_STATE_COLS = ["key", "partition", "snapshot", "deleted", "version"]
_ACTION_COLS = ["alert_id", "action", "user_id", "user_name", "channel", "message_ts", "at", "until"]
_ALERT_COLS = [
    "alert_id", "type", "rule", "resource_id", "status", "change", "severity", "episode_start", "fired_at",
    "updated_at", "resolved_at", "waste_usd", "usd_per_hour", "resource_type", "account", "region",
    "instance_type", "tags", "details", "silenced", "held", "held_by", "channel", "partition", "version",
]  # fmt: skip
_ATTEMPT = "posting:"
"""Prefix of an ``alert_deliveries`` kind that marks a post begun (``posting:fired``)."""


def alert_from_row(row: dict[str, Any], change: str | None = None) -> Alert:
    """Rebuild an :class:`Alert` from a row of :meth:`Store.alerts`."""
    t = epoch
    return Alert(
        alert_id=row["alert_id"],
        type=row["type"],
        rule=row["rule"],
        resource_id=row["resource_id"],
        status=row["status"],
        change=change or ("resolved" if row["status"] == "resolved" else "fired"),  # type: ignore[arg-type]
        severity=row["severity"],
        episode_start=t(row["episode_start"]),
        fired_at=t(row["fired_at"]),
        updated_at=t(row["updated_at"]),
        resolved_at=t(row["resolved_at"]) if row["resolved_at"] is not None else None,
        waste_usd=row["waste_usd"],
        usd_per_hour=row["usd_per_hour"],
        resource_type=row["resource_type"],
        account=row["account"],
        region=row["region"],
        instance_type=row["instance_type"],
        tags=dict(row["tags"]),
        details=msgspec.json.decode(row["details"]) if row["details"] else {},
        held=Hold(kind=row["held"], by=row.get("held_by", ""), reason=row.get("silenced", "")) if row.get("held") else None,
        silenced=row.get("silenced", ""),
        channel=row.get("channel", ""),
        partition=row.get("partition", -1),
    )


def _ms(t: float) -> int:
    return int(round(t * 1000))


def _extra(event: Any) -> str:
    return _json.encode(event.extra).decode()


_NO_SOURCE = ("", 0, 0)
_KEY_COLUMN = {"resource_usage": "resource_id", "gpu_metrics": "resource_id", "run_events": "run_id"}
_KIND: dict[type, tuple[bytes, str]] = {GpuMetric: (b"gpu", "gpu_metrics"), UsageEvent: (b"usage", "resource_usage"),
                                        RunEvent: (b"run", "run_events")}  # fmt: skip
"""Event type → (the id's personalisation, its table)."""
_DAY_MS = 86_400_000
_MAX_SPANS = 16
_MAX_KEYS = 2_000
"""Keys in one look-up's text; with more, the look-up reads the span's rows of every key."""
_CODE = re.compile(r"Code: (\d+)\.")
_DATA_ERRORS = {6, 26, 27, 32, 33, 36, 38, 41, 43, 53, 69, 70, 72, 117, 131, 321, 407, 469}
"""ClickHouse error codes that mean the rows themselves were refused (cannot parse or convert,
type mismatch, argument or value out of bound, incorrect data, a violated constraint)."""
_INSERT_SETTINGS = {"max_partitions_per_insert_block": 0}
"""A message may carry events of any age: an insert touching many monthly partitions is valid."""
_SOURCE_COLS = ["event_id", "src_topic", "src_partition", "src_offset"]


class EventBatch:
    """Events buffered per table, with the Kafka message each came from, turned into columns
    at insert time.

    Building columns with one comprehension per column costs a fraction of
    appending each event's values one by one.
    """

    def __init__(self) -> None:
        self.usage: list[UsageEvent] = []
        self.gpu: list[GpuMetric] = []
        self.runs: list[RunEvent] = []
        self._runs: dict[type, list[tuple[tuple[str, int, int], int]]] = {UsageEvent: [], GpuMetric: [], RunEvent: []}
        """Per type: (source, number of events) in the order added (a message's events are one run)."""
        self._lists: dict[type, list] = {UsageEvent: self.usage, GpuMetric: self.gpu, RunEvent: self.runs}

    def __len__(self) -> int:
        return len(self.usage) + len(self.gpu) + len(self.runs)

    def extend(self, events: Sequence[Any], source: tuple[str, int, int] = _NO_SOURCE) -> None:
        """Add events; ``source``: (topic, partition, offset) of the message they came in. A
        message holds events of one type (its topic's), kept as one run, not per event."""
        if not events:
            return
        kinds = set(map(type, events))
        if len(kinds) == 1:
            kind = kinds.pop()
            self._lists[kind].extend(events)
            self._runs[kind].append((source, len(events)))
            return
        for event in events:  # mixed types (built by hand, not decoded from one message)
            kind = type(event)
            self._lists[kind].append(event)
            self._runs[kind].append((source, 1))

    def tables(self, pricing: Pricing | Pricer | None = None) -> Iterator[tuple[str, list[str], list[list]]]:
        """(table, column names, columns) for each table with rows; the last four columns are
        the event id (from its content) and the source topic, partition and offset.
        ``pricing`` prices usage intervals (the ``usd`` and ``egress_usd`` columns) with the
        same :class:`~detector.pricing.Pricer` the engine hands the detectors."""
        pricer = pricing if isinstance(pricing, Pricer) else Pricer(pricing)
        if self.gpu:
            ev = self.gpu
            yield "gpu_metrics", [*_GPU_COLS, *_SOURCE_COLS], [
                [round(e.ts.timestamp() * 1000) for e in ev], [e.resource_id for e in ev], [e.gpu_index for e in ev],
                [e.gpu_uuid for e in ev], [e.model for e in ev], [e.util_pct for e in ev],
                [e.mem_used_mib for e in ev], [e.mem_total_mib for e in ev], [e.power_w for e in ev],
                [e.sm_active for e in ev], [_extra(e) if e.extra else "" for e in ev],
                event_ids(b"gpu", ev), *_source_columns(self._runs[GpuMetric]),
            ]  # fmt: skip
        if self.usage:
            ev = self.usage
            priced = [pricer.cost(e) for e in ev]
            yield "resource_usage", [*_USAGE_COLS, "usd", "egress_usd", *_SOURCE_COLS], [
                [round(e.ts.timestamp() * 1000) for e in ev], [e.resource_id for e in ev], [e.resource_type for e in ev],
                [e.provider for e in ev], [e.account for e in ev], [e.region for e in ev],
                [e.instance_type for e in ev], [e.pricing for e in ev], [e.state for e in ev],
                [e.interval_s for e in ev], [e.cost_usd for e in ev], [e.egress_bytes for e in ev],
                [e.dest_region for e in ev], [e.storage_bytes for e in ev], [e.capacity_bytes for e in ev],
                [e.vector_count for e in ev], [e.requests for e in ev], [e.tags for e in ev],
                [_extra(e) if e.extra else "" for e in ev], [p.usd for p in priced], [p.egress_usd for p in priced],
                event_ids(b"usage", ev), *_source_columns(self._runs[UsageEvent]),
            ]  # fmt: skip
        if self.runs:
            ev = self.runs
            yield "run_events", [*_RUN_COLS, *_SOURCE_COLS], [
                [round(e.ts.timestamp() * 1000) for e in ev], [e.run_id for e in ev], [e.status for e in ev],
                [e.resource_ids for e in ev], [e.gpu_count for e in ev], [e.project for e in ev],
                [e.tags for e in ev], [e.error for e in ev], [_extra(e) if e.extra else "" for e in ev],
                event_ids(b"run", ev), *_source_columns(self._runs[RunEvent]),
            ]  # fmt: skip


def event_ids(kind: bytes, events: Sequence[Any]) -> list[int]:
    """A 64-bit id per event from its content (every field, ``extra`` included): the same
    event read twice, re-sent by its producer, or read again from a recreated topic has the
    same id, so the store keeps it once."""
    encode, blake2b = _json.encode, hashlib.blake2b
    return [int.from_bytes(blake2b(encode(e), digest_size=8, person=kind).digest(), "little") for e in events]


def _source_columns(runs: list[tuple[tuple[str, int, int], int]]) -> list[list]:
    topics: list[str] = []
    partitions: list[int] = []
    offsets: list[int] = []
    for (topic, partition, offset), n in runs:
        topics += [topic] * n
        partitions += [partition] * n
        offsets += [offset] * n
    return [topics, partitions, offsets]


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


def _holder(directory: Path) -> str | None:
    """Who holds an embedded store (``a running worker (pid N: command)``): the process whose
    pid ClickHouse wrote in the store's ``status`` file, if it still has that file open. None
    when nobody does, or this process does. Read from /proc, so nothing is locked to find out."""
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
        command = " ".join(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split())
    except OSError:
        command = ""
    what = "a running worker" if " worker" in command else "another process"
    return f"{what} (pid {pid}" + (f": {command[:120]}" if command else "") + ")"


def connect(dsn: str, create: bool = True) -> Any:
    """A clickhouse-connect client for ``chdb:///dir``, ``chdb://memory`` or ``http(s)://…``.
    ``create=False``: an embedded store's directory must hold one already (:class:`StoreNotFound`).
    An embedded store another process holds is :class:`StoreBusy`, saying who and what to do."""
    from detector.logs import redact, redact_dsn

    directory = chdb_dir(dsn)
    if directory is not None:
        if not create and not (directory / "metadata").is_dir():
            raise StoreNotFound(f"no store at {directory}" + (" (the directory holds no ClickHouse data)"
                                                              if directory.exists() else ""))  # fmt: skip
        holder = _holder(directory)
        if holder is not None:
            raise StoreBusy(
                f"the embedded store {directory} is held by {holder}, and one process at a time opens it. To query "
                "it, stop that process, or have one process own the store and share it: `burnwatch store serve "
                f"--dsn chdb://{directory}`, then BURNWATCH_CLICKHOUSE_DSN=http://127.0.0.1:8123 for the workers "
                "and for these commands"
            )
        directory.mkdir(parents=True, exist_ok=True)
    try:
        return clickhouse_connect.get_client(dsn=dsn)
    except Exception as exc:  # its message may quote the DSN, password included
        raise ConnectionError(f"cannot connect to ClickHouse at {redact_dsn(dsn)}: {redact(str(exc))}") from None


class Store:
    """burnwatch's tables in one ClickHouse database. Thread-safe: calls are serialised."""

    def __init__(self, client: Any, database: str = "burnwatch") -> None:
        self.client = client
        self.db = database
        self._lock = threading.Lock()
        self.created = False
        """Whether :meth:`migrate` made this store's tables (it found none)."""

    @classmethod
    def open(cls, dsn: str, database: str = "burnwatch", *, create: bool = True) -> Store:
        """The store at ``dsn``. ``create``: make it, or migrate it, as needed (the worker,
        ``db migrate``); otherwise it must exist with its schema up to date (the commands
        that only read: a mistyped path or database is :class:`StoreNotFound`, not a new
        empty store)."""
        store = cls(connect(dsn, create=create), database)
        try:
            if create:
                store.migrate()
            else:
                store.check_schema()
        except BaseException:
            store.close()
            raise
        return store

    def check_schema(self) -> None:
        """Raise :class:`StoreNotFound` unless the database exists with every migration applied."""
        if not int(self.client.command(f"EXISTS DATABASE {self.db}")):
            raise StoreNotFound(f"the store has no database {self.db!r}")
        applied = set()
        if int(self.client.command(f"EXISTS TABLE {self.db}.schema_migrations")):
            applied = {int(r[0]) for r in self.client.query(f"SELECT version FROM {self.db}.schema_migrations").result_rows}
        pending = [f"{m.version:04d}_{m.name}" for m in migrations() if m.version not in applied]
        if pending:
            raise StoreOutdated(f"the store's schema is behind this burnwatch ({', '.join(pending)} not applied): "
                                "run `burnwatch db migrate`")  # fmt: skip

    def close(self) -> None:
        with self._lock:
            self.client.close()

    def migrate(self) -> list[str]:
        """Apply the migrations not yet recorded in ``schema_migrations``, in order; returns
        their names. Safe on every start (and by ``burnwatch db migrate``)."""
        applied_now = []
        with self._lock:
            self.created = self.created or not int(self.client.command(f"EXISTS TABLE {self.db}.resource_usage"))
            self.client.command(f"CREATE DATABASE IF NOT EXISTS {self.db}")
            self.client.command(
                f"""CREATE TABLE IF NOT EXISTS {self.db}.schema_migrations (
                    version UInt32, name String, checksum String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)
                ) ENGINE = ReplacingMergeTree ORDER BY version"""
            )
            result = self.client.query(f"SELECT version, checksum FROM {self.db}.schema_migrations FINAL")
            applied = {int(v): c for v, c in result.result_rows}
            for migration in migrations():
                if migration.version in applied:
                    if applied[migration.version] != migration.checksum:
                        log.warning("migration_edited", version=migration.version, name=migration.name,
                                    hint="released migrations are never edited: add a new one")  # fmt: skip
                    continue
                for statement in migration.statements(self.db):
                    self.client.command(statement)
                self.client.insert(f"{self.db}.schema_migrations",
                                   [[migration.version, migration.name, migration.checksum]],
                                   column_names=["version", "name", "checksum"])  # fmt: skip
                applied_now.append(f"{migration.version:04d}_{migration.name}")
        if applied_now:
            log.info("migrations_applied", database=self.db, migrations=applied_now)
        return applied_now

    def applied_migrations(self) -> list[dict[str, Any]]:
        return self.query(f"SELECT version, name, checksum, applied_at FROM {self.db}.schema_migrations FINAL "
                          "ORDER BY version")  # fmt: skip

    def missing_tables(self) -> list[str]:
        """Tables and views the migrations make that the database lacks (dropped by hand, or
        lost): a store missing one is not up to date, whatever ``schema_migrations`` says."""
        made = dict.fromkeys(name for m in migrations() for name in _MADE.findall(m.sql))
        present = {r["name"] for r in self.query("SELECT name FROM system.tables WHERE database = %(db)s",
                                                 {"db": self.db})}  # fmt: skip
        return [name for name in made if name not in present]

    def restore_missing(self) -> list[str]:
        """Make the tables :meth:`missing_tables` names again, by running every migration's
        statements again in order (each is idempotent); returns those it made."""
        missing = self.missing_tables()
        if missing:
            with self._lock:
                for migration in migrations():
                    for statement in migration.statements(self.db):
                        self.client.command(statement)
            log.warning("tables_restored", database=self.db, tables=missing)
        return [name for name in missing if name not in self.missing_tables()]

    def event_ttl(self) -> int:
        """Days of event time the raw tables keep (0: forever), as the store says."""
        ddl = self.query("SELECT create_table_query AS ddl FROM system.tables WHERE database = %(db)s "
                         "AND name = 'resource_usage'", {"db": self.db})  # fmt: skip
        found = re.search(r"TTL toDateTime\(ts\) \+ toIntervalDay\((\d+)\)", ddl[0]["ddl"]) if ddl else None
        return int(found.group(1)) if found else 0

    def set_event_ttl(self, days: int, *, explicit: bool = True) -> int:
        """Keep raw events ``days`` days of event time (0: forever); rollups are kept. A change
        applies to existing data as ClickHouse merges it, not in one rewrite at start. Returns
        the days in force.

        ``explicit=False`` says ``days`` is only the default, which nobody set: it applies to
        a store this process created, and a store that exists keeps its own, so that a store
        kept forever (the demo's, a replay dated in the past) does not start deleting its
        events because a command ran with the environment's default."""
        if not explicit and not self.created:
            return self.event_ttl()
        for table in RAW_TABLES:
            ddl = self.query("SELECT create_table_query AS ddl FROM system.tables WHERE database = %(db)s "
                             "AND name = %(table)s", {"db": self.db, "table": table})[0]["ddl"]  # fmt: skip
            ttl = f"toDateTime(ts) + toIntervalDay({days})"
            has_ttl = " TTL " in ddl
            if days > 0 and ttl not in ddl:
                statement = f"ALTER TABLE {self.db}.{table} MODIFY TTL {ttl} SETTINGS materialize_ttl_after_modify = 0"
            elif days <= 0 and has_ttl:
                statement = f"ALTER TABLE {self.db}.{table} REMOVE TTL"
            else:
                continue
            with self._lock:
                self.client.command(statement)
            log.info("event_ttl_set", table=table, days=days)
        return max(days, 0)

    # -- events ------------------------------------------------------------------

    @staticmethod
    def event_ids(events: Sequence[Event]) -> list[int]:
        """The content id :meth:`insert_events` gives each event (its deduplication key)."""
        return [event_ids(_KIND[type(e)][0], [e])[0] for e in events]

    def stored_ids(self, events: Sequence[Event]) -> set[int]:
        """Ids of these events already stored (events read again after a restart, or re-sent)."""
        found: set[int] = set()
        by_type: dict[type, list[Event]] = {}
        for event in events:
            by_type.setdefault(type(event), []).append(event)
        for etype, group in by_type.items():
            kind, table = _KIND[etype]
            keys = [e.run_id if etype is RunEvent else e.resource_id for e in group]  # type: ignore[union-attr]
            with self._lock:
                ids, _ = self._stored_ids(table, keys, [round(e.ts.timestamp() * 1000) for e in group])
            found.update(ids.intersection(event_ids(kind, group)))
        return found

    def insert_events(self, batch: EventBatch, pricing: Pricing | None = None) -> int:
        """Insert a batch: one columnar insert per non-empty table. Events already stored
        (the same content: read again after a crash or a rebalance, re-sent by a producer,
        or read from a recreated topic) and repeats within the batch are left out, so
        nothing counts twice. Returns rows written. Raises whatever the client raises: the
        caller tells a store that cannot be written from rows it refuses (:meth:`writable`)."""
        written = 0
        with self._lock:
            for table, names, cols in batch.tables(pricing):
                keep = self._new_rows(table, names, cols)
                if keep is not None:
                    cols = [[col[i] for i in keep] for col in cols]
                if not cols[0]:
                    continue
                started = time.perf_counter()
                self.client.insert(f"{self.db}.{table}", cols, column_names=names, column_oriented=True,
                                   settings=_INSERT_SETTINGS)  # fmt: skip
                METRICS.insert_seconds.observe(time.perf_counter() - started)
                METRICS.insert_rows.observe(len(cols[0]))
                written += len(cols[0])
        return written

    def _new_rows(self, table: str, names: list[str], cols: list[list]) -> list[int] | None:
        """Indexes of the rows to insert (the first of each event id, not stored yet); None: all.
        Rows stored before events had ids (``event_id`` 0) are matched by their Kafka source."""
        ids = cols[names.index("event_id")]
        seen, legacy = self._stored_ids(table, cols[names.index(_KEY_COLUMN[table])], cols[0])
        sources = zip(*(cols[names.index(c)] for c in _SOURCE_COLS[1:]), strict=True) if legacy else None
        keep = []
        for i, event_id in enumerate(ids):
            source = next(sources) if sources is not None else None
            if event_id not in seen and source not in legacy:
                seen.add(event_id)
                keep.append(i)
        if len(keep) == len(ids):
            return None
        METRICS.duplicates_skipped.inc(len(ids) - len(keep))
        return keep

    def _stored_ids(self, table: str, keys: list[str], ts_ms: list[int]) -> tuple[set[int], set[tuple]]:
        """Event ids already stored for these keys within the batch's time span, looked up
        per day the batch touches (through the table's (key, ts) order, so the cost follows
        what is stored there, which is nothing for new data); and the Kafka sources of rows
        stored there without an id (before migration 0005)."""
        spans: dict[int, list] = {}
        for key, t in zip(keys, ts_ms, strict=True):
            span = spans.get(t // _DAY_MS)
            if span is None:
                spans[t // _DAY_MS] = [t, t, {key}]
            else:
                span[0], span[1] = min(span[0], t), max(span[1], t)
                span[2].add(key)
        if len(spans) > _MAX_SPANS:  # events over many days in one batch (a replay): one wider look-up
            spans = {0: [min(ts_ms), max(ts_ms), set(keys)]}
        column = _KEY_COLUMN[table]
        clauses, parameters = [], {}
        for n, (lo, hi, span_keys) in enumerate(spans.values()):
            within = (f"ts BETWEEN fromUnixTimestamp64Milli(%(lo{n})s, 'UTC') "
                      f"AND fromUnixTimestamp64Milli(%(hi{n})s, 'UTC')")  # fmt: skip
            if len(span_keys) <= _MAX_KEYS:  # the keys go into the query's text: bounded
                within = f"{column} IN %(k{n})s AND {within}"
                parameters[f"k{n}"] = list(span_keys)
            clauses.append(f"({within})")
            parameters.update({f"lo{n}": lo, f"hi{n}": hi})
        result = self.client.query(
            f"SELECT event_id, src_topic, src_partition, src_offset FROM {self.db}.{table} WHERE {' OR '.join(clauses)}",
            parameters=parameters,
        )  # fmt: skip
        ids, legacy = set(), set()
        for event_id, topic, partition, offset in result.result_rows:
            if event_id:
                ids.add(event_id)
            elif topic:
                legacy.add((topic, partition, offset))
        return ids, legacy

    def refused(self, exc: BaseException) -> bool:
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
            with self._lock:
                self.client.insert(f"{self.db}.write_probe", [[writer, _ms(time.time())]], column_names=["writer", "at"])
            return True
        except Exception as exc:  # noqa: BLE001 - any failure of the probe means "not writable now"
            log.warning("store_not_writable", error=one_line(exc))
            return False

    def resource_info(self, resource_id: str, at: float) -> ResourceInfo | None:
        """What the usage events stored for a resource up to event time ``at`` say of it, as
        the engine that holds it knows it (state, tags, price per hour while running): how a
        worker sees a run's host that another worker holds. None when nothing is stored."""
        rows = self.query(
            f"""SELECT argMax(resource_type, ts) AS r_type, argMax(provider, ts) AS r_provider,
                       argMax(account, ts) AS r_account, argMax(region, ts) AS r_region,
                       argMax(instance_type, ts) AS r_instance, argMax(pricing, ts) AS r_pricing,
                       argMax(state, ts) AS r_state, argMax(tags, ts) AS r_tags,
                       argMaxIf(usd * 3600 / interval_s, ts, state = 'running') AS r_usd_per_hour,
                       countIf(state = 'running') AS running, count() AS n
                FROM {self.db}.resource_usage
                WHERE resource_id = %(rid)s AND ts <= fromUnixTimestamp64Milli(%(at)s, 'UTC')""",
            {"rid": resource_id, "at": _ms(at)},
        )
        if not rows or not rows[0]["n"]:
            return None
        r = rows[0]
        return ResourceInfo(resource_id=resource_id, resource_type=r["r_type"], provider=r["r_provider"],
                            account=r["r_account"], region=r["r_region"], instance_type=r["r_instance"],
                            pricing=r["r_pricing"], state=r["r_state"], tags=dict(r["r_tags"]),
                            usd_per_hour=r["r_usd_per_hour"] if r["running"] else None)  # fmt: skip

    def event_span(self) -> tuple[float, float] | None:
        """(earliest, latest) event time stored across the three tables, or None when empty."""
        sql = " UNION ALL ".join(
            f"SELECT min(ts) AS lo, max(ts) AS hi, count() AS n FROM {self.db}.{table}"
            for table in RAW_TABLES
        )
        rows = [r for r in self.query(sql) if r["n"]]
        if not rows:
            return None
        return min(epoch(r["lo"]) for r in rows), max(epoch(r["hi"]) for r in rows)

    def events(self, start: float, end: float) -> list[tuple[float, Any]]:
        """Stored events with ``start <= ts < end`` as typed events, in event-time order
        (ties: GPU samples, then usage, then run events, as the worker's aligner ranks them)."""
        bounds = {"lo": _ms(start), "hi": _ms(end)}
        where = "ts >= fromUnixTimestamp64Milli(%(lo)s, 'UTC') AND ts < fromUnixTimestamp64Milli(%(hi)s, 'UTC')"
        out: list[tuple[float, int, Any]] = []
        for rank, (table, cls, cols) in enumerate(
            (("gpu_metrics", GpuMetric, _GPU_COLS), ("resource_usage", UsageEvent, _USAGE_COLS),
             ("run_events", RunEvent, _RUN_COLS))
        ):  # fmt: skip
            with self._lock:
                result = self.client.query(
                    f"SELECT {', '.join(cols)} FROM {self.db}.{table} WHERE {where} ORDER BY ts", parameters=bounds
                )
            for row in result.result_rows:
                fields = dict(zip(cols, row, strict=True))
                ts = fields["ts"].replace(tzinfo=timezone.utc)
                fields["ts"] = ts
                fields["extra"] = msgspec.json.decode(fields["extra"]) if fields["extra"] else {}
                fields = {k: v for k, v in fields.items() if v is not None}
                out.append((ts.timestamp(), rank, cls(**fields)))
        out.sort(key=lambda item: (item[0], item[1]))
        return [(t, event) for t, _, event in out]

    # -- detector state ------------------------------------------------------------

    def save_states(self, states: Sequence[tuple[str, int, bytes]], version: int) -> None:
        """Write (key, partition, snapshot) rows; the newest version of a key wins."""
        if not states:
            return
        cols = [[k for k, _, _ in states], [p for _, p, _ in states], [s for _, _, s in states],
                [0] * len(states), [version] * len(states)]  # fmt: skip
        with self._lock:
            self.client.insert(
                f"{self.db}.detector_state", cols, column_oriented=True, column_names=_STATE_COLS
            )

    def load_states(self, partitions: Sequence[int]) -> dict[str, bytes]:
        """Latest snapshot of every live key on these partitions."""
        if not partitions:
            return {}
        with self._lock:
            result = self.client.query(
                f"SELECT key, snapshot FROM {self.db}.detector_state FINAL "
                "WHERE partition IN %(partitions)s AND deleted = 0",
                parameters={"partitions": list(partitions)},
                column_formats={"snapshot": "bytes"},
            )
        return {row[0]: row[1] for row in result.result_rows}

    def delete_states(self, keys: Sequence[str]) -> None:
        """Tombstone keys whose state expired, so a restart does not bring them back."""
        if not keys:
            return
        with self._lock:
            self.client.insert(
                f"{self.db}.detector_state",
                [[k, 0, b"", 1, time.time_ns()] for k in keys],
                column_names=_STATE_COLS,
            )

    # -- alerts ------------------------------------------------------------------

    def record_alerts(self, alerts: Sequence[Alert], version: int) -> None:
        """Write alert state changes; ``version`` orders them (a counter or ns timestamp).

        One insert into ``alerts`` is the whole record of a change: the alert manager's
        memory and the outbox's recovery read it alone, and ``alert_changes`` (history,
        reports) follows from it by a materialized view. A kill cannot land between two
        records of one change and leave them disagreeing."""
        if not alerts:
            return
        rows = [
            [a.alert_id, a.type, a.rule, a.resource_id, a.status, a.change, a.severity, _ms(a.episode_start),
             _ms(a.fired_at), _ms(a.updated_at), _ms(a.resolved_at) if a.resolved_at is not None else None,
             a.waste_usd, a.usd_per_hour, a.resource_type, a.account, a.region, a.instance_type, a.tags,
             _json.encode(a.details).decode(), a.silenced, a.held.kind if a.held else "", a.held.by if a.held else "",
             a.channel, a.partition, version + i]
            for i, a in enumerate(alerts)
        ]  # fmt: skip
        with self._lock:
            self.client.insert(f"{self.db}.alerts", rows, column_names=_ALERT_COLS)

    def alerts(self, where: str = "1", parameters: dict | None = None) -> list[dict[str, Any]]:
        """Latest state of each alert, as dicts."""
        return self.query(
            f"SELECT * EXCEPT (version, change) FROM {self.db}.alerts FINAL WHERE {where} ORDER BY fired_at, alert_id",
            parameters,
        )

    def recent_alerts(self, horizon_s: float = 7 * 86_400.0) -> dict[str, tuple[float, bool]]:
        """alert id → (episode start, resolved) for alerts whose episode started within
        ``horizon_s`` of event time before the newest: what the alert manager must remember."""
        rows = self.query(
            f"""SELECT alert_id, episode_start, status = 'resolved' AS resolved FROM {self.db}.alerts FINAL
                WHERE episode_start >= (SELECT max(episode_start) FROM {self.db}.alerts)
                                       - toIntervalSecond(%(horizon)s)""",
            {"horizon": int(horizon_s)},
        )
        return {r["alert_id"]: (epoch(r["episode_start"]), bool(r["resolved"])) for r in rows}

    def open_incidents(self) -> dict[str, str]:
        """Resource → an open rule incident on it (what an anomaly joins), for a restart."""
        rows = self.query(f"SELECT resource_id, any(alert_id) AS alert_id FROM {self.db}.alerts FINAL "
                          "WHERE status = 'firing' AND type IN %(types)s GROUP BY resource_id",
                          {"types": [t for t, cls in REGISTRY.items() if cls.behaviour and t != "anomaly"]})  # fmt: skip
        return {r["resource_id"]: r["alert_id"] for r in rows}

    def suppression_memory(self, horizon_s: float = 7 * 86_400.0) -> tuple[dict[tuple[str, str], float], dict[str, Hold]]:
        """For :class:`detector.suppression.AlertMemory`: the fire time of the latest posted
        opening per (rule, resource), for ``realert``; and why each held-back alert was held
        back, whose later changes stay held back. Within ``horizon_s`` of the newest alert."""
        rows = self.query(
            f"""SELECT rule, resource_id, alert_id, fired_at, held, held_by, silenced
                FROM {self.db}.alerts FINAL
                WHERE fired_at >= (SELECT max(fired_at) FROM {self.db}.alerts) - toIntervalSecond(%(horizon)s)""",
            {"horizon": int(horizon_s)},
        )
        last: dict[tuple[str, str], float] = {}
        held: dict[str, Hold] = {}
        for r in rows:
            if r["held"]:
                held[r["alert_id"]] = Hold(kind=r["held"], by=r["held_by"], reason=r["silenced"])
            else:
                key = (r["rule"], r["resource_id"])
                last[key] = max(last.get(key, 0.0), epoch(r["fired_at"]))
        return last, held

    def record_action(self, click: Any, at: float, until: float | None = None) -> None:
        """Record a button click (a :class:`detector.actions.Click`) at wall time ``at``."""
        row = [click.alert_id, click.action, click.user_id, click.user_name, click.channel, click.message_ts,
               _ms(at), _ms(until) if until is not None else None]  # fmt: skip
        with self._lock:
            self.client.insert(f"{self.db}.alert_actions", [row], column_names=_ACTION_COLS)

    def actions(self, alert_id: str) -> list[dict[str, Any]]:
        """Clicks on one alert, oldest first."""
        return self.query(
            f"SELECT action, user_id, user_name, at, until FROM {self.db}.alert_actions "
            "WHERE alert_id = %(id)s ORDER BY at",
            {"id": alert_id},
        )

    def snoozed(self, now: float) -> dict[str, Silence]:
        """Alert id → its snooze (a silence of that one alert, from the click to its end, wall
        time), for snoozes still running at ``now``."""
        rows = self.query(
            f"SELECT alert_id, max(until) AS ends, argMax(at, until) AS starts, argMax(user_name, until) AS by "
            f"FROM {self.db}.alert_actions WHERE action = 'snoozed' "
            "GROUP BY alert_id HAVING ends > fromUnixTimestamp64Milli(%(now)s, 'UTC')",
            {"now": _ms(now)},
        )
        return {r["alert_id"]: snooze(r["alert_id"], epoch(r["starts"]), epoch(r["ends"]), r["by"]) for r in rows}

    def last_digest_day(self) -> float | None:
        rows = self.query(f"SELECT max(day) AS day, count() AS n FROM {self.db}.digests")
        return epoch(rows[0]["day"]) if rows and rows[0]["n"] else None

    def record_digest(self, day: float, channel: str, message_ts: str) -> None:
        with self._lock:
            self.client.insert(f"{self.db}.digests", [[int(day), channel, message_ts]],
                               column_names=["day", "channel", "message_ts"])  # fmt: skip

    def record_delivery(self, alert_id: str, kind: str, channel: str, message_ts: str) -> None:
        self.record_deliveries([(alert_id, kind, channel, message_ts)])

    def record_deliveries(self, rows: Sequence[tuple[str, str, str, str]]) -> None:
        """Record (alert_id, kind, channel, message ts) rows in one insert: a group's members together."""
        if not rows:
            return
        with self._lock:
            self.client.insert(f"{self.db}.alert_deliveries", [list(r) for r in rows],
                               column_names=["alert_id", "kind", "channel", "message_ts"])  # fmt: skip

    def record_attempt(self, alert_ids: Sequence[str], change: str) -> None:
        """Mark a post as about to be sent, before it is: if the worker dies before the post is
        recorded as delivered, the next one looks for it in Slack before posting again."""
        self.record_deliveries([(alert_id, _ATTEMPT + change, "", "") for alert_id in alert_ids])

    def deliveries(self) -> dict[tuple[str, str], tuple[str, str]]:
        """(alert_id, kind) → (channel, message ts) of every delivery made."""
        with self._lock:
            result = self.client.query(
                f"SELECT alert_id, kind, channel, message_ts FROM {self.db}.alert_deliveries FINAL "
                "WHERE NOT startsWith(kind, %(attempt)s)", parameters={"attempt": _ATTEMPT},
            )  # fmt: skip
        return {(r[0], r[1]): (r[2], r[3]) for r in result.result_rows}

    def attempted(self) -> dict[tuple[str, str], float]:
        """(alert_id, change) of posts begun but not recorded as delivered (maybe in Slack
        already, or about to land there) → wall time of the latest attempt."""
        rows = self.query(
            f"""SELECT alert_id, substring(kind, %(n)s) AS change, max(delivered_at) AS at
                FROM {self.db}.alert_deliveries
                WHERE startsWith(kind, %(attempt)s)
                  AND (alert_id, change) NOT IN (SELECT alert_id, kind FROM {self.db}.alert_deliveries)
                GROUP BY alert_id, change""",
            {"attempt": _ATTEMPT, "n": len(_ATTEMPT) + 1},
        )
        return {(r["alert_id"], r["change"]): epoch(r["at"]) for r in rows}

    def undelivered(self, partitions: Sequence[int] | None = None) -> list[tuple[str, str]]:
        """(alert_id, change) pairs people should have heard of but have not, oldest first: the
        outbox after a restart or a rebalance. Read from the alerts' latest state alone (every
        posted alert opened; a resolved one also closed), so it agrees with the alert manager's
        memory. ``partitions``: only the alerts of keys on these input partitions (those of
        unknown partition count as partition 0's)."""
        owned = "1"
        if partitions is not None:
            owned = "if(partition < 0, 0, partition) IN %(partitions)s" if partitions else "0"
        rows = self.query(
            f"""SELECT alert_id, change FROM (
                    SELECT alert_id, 'fired' AS change, fired_at AS at, 0 AS o FROM {self.db}.alerts FINAL
                    WHERE silenced = '' AND {owned}
                    UNION ALL
                    SELECT alert_id, 'resolved' AS change, assumeNotNull(resolved_at) AS at, 1 AS o
                    FROM {self.db}.alerts FINAL WHERE silenced = '' AND status = 'resolved' AND {owned})
                WHERE (alert_id, change) NOT IN (SELECT alert_id, kind FROM {self.db}.alert_deliveries)
                ORDER BY at, o, alert_id""",
            {"partitions": list(partitions or [])},
        )
        return [(r["alert_id"], r["change"]) for r in rows]

    # -- ad hoc --------------------------------------------------------------------

    def query(self, sql: str, parameters: dict | None = None) -> list[dict[str, Any]]:
        with self._lock:
            result = self.client.query(sql, parameters=parameters or {})
        return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]

    def count(self, table: str) -> int:
        with self._lock:
            return int(self.client.command(f"SELECT count() FROM {self.db}.{table}"))
