"""The schema: the migrations of ``detector/migrations`` and the raw events' expiry."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from detector.store.connection import Connection, StoreNotFound, StoreOutdated
from detector.units import one_line

__all__ = ["BATCH_TABLES", "MERGE_SELECTOR_BASE", "MIGRATIONS_DIR", "ON_CHDB", "PACKED_BELOW_BYTES", "RAW_TABLES", "Migration",
           "Schema", "migrations"]

log = structlog.get_logger("burnwatch.store")

MIGRATIONS_DIR = Path(__file__).parent.parent / "migrations"
RAW_TABLES = ("resource_usage", "gpu_metrics", "run_events")
_MADE = re.compile(r"CREATE\s+(?:TABLE|(?:MATERIALIZED\s+)?VIEW)\s+IF\s+NOT\s+EXISTS\s+\{db\}\.(\w+)", re.IGNORECASE)
"""The name of each table or view a migration makes."""
BATCH_TABLES = (*RAW_TABLES, "gpu_hourly", "usage_hourly", "ingest_positions")
"""The tables every batch inserts into: the raw events and the rollups their materialized views fill."""
MERGE_SELECTOR_BASE = 10
"""``merge_selector_base`` of :data:`BATCH_TABLES` in a store burnwatch creates (ClickHouse's default:
5). A worker leaves a small part in each of them every fraction of a second, and the default merges
such parts so soon and so often that, in the embedded engine, merging took as much of the worker's CPU
as detection; at 10 a merge waits for about twice as many parts of a size, so each row is rewritten
fewer times (docs/performance-log.md, "Merging the parts each batch leaves"). Queries read the same rows."""


PACKED_BELOW_BYTES = 10 << 20
"""``min_bytes_for_full_part_storage`` of :data:`BATCH_TABLES` in an embedded store burnwatch creates: a
part smaller than this is written packed (a directory holding one file), not as a directory of ~10
files. Each batch leaves a small part in each of those tables and each merge makes one and deletes
several; on the worker's own disk, allocating those files' inodes was most of the kernel time of the
embedded engine's writes, and packed, the engine's CPU for the same inserts fell by about 40 %
(docs/performance-log.md, "Fewer files a part"). The same bound as ClickHouse's ``min_bytes_for_wide_part``:
larger parts are stored as before. Queries read the same rows."""

ON_CHDB = "(SELECT count() FROM system.functions WHERE name = 'chdb') > 0"
"""True where the engine is chdb, the embedded engine, whether in this process or served by ``burnwatch
store serve`` over HTTP: chdb has a ``chdb()`` function (its version), which a ClickHouse server has not."""


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


def _ahead(applied: dict[int, str], db: str, said: set[str]) -> None:
    """Say so when the store holds migrations this release does not know: a later release migrated it (a
    rollback, or an older worker in a rolling deploy). Not refused: migrations only add, and a rollback
    must be able to run; but what the later release's tables and views hold, this one neither writes nor
    reads as that release does, and the releases before 2026-12-07 said nothing."""
    known = {m.version for m in migrations()}
    later = [f"{v:04d}_{name}" for v, name in sorted(applied.items()) if v not in known]
    if later and not set(later) <= said:  # (once a store: a start migrates it and checks it)
        said.update(later)
        log.warning("store_ahead_of_release", database=db, unknown_migrations=later,
                    note="a later burnwatch migrated this store: this release runs on it as it is; "
                         "upgrade again rather than run two releases on one store for long")  # fmt: skip


class Schema:
    """Applies the migrations, checks a store is up to date, and sets how long raw events are kept."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.created = False
        """Whether :meth:`migrate` made this store's tables (it found none)."""
        self._said_ahead: set[str] = set()
        """The migrations of a later release this store was said to hold (``store_ahead_of_release``, once)."""

    def check(self) -> None:
        """Raise :class:`StoreNotFound` unless the database exists with every migration applied."""
        db, client = self.conn.db, self.conn.client
        with self.conn.lock:
            if not int(client.command(f"EXISTS DATABASE {db}")):
                raise StoreNotFound(f"the store has no database {db!r}")
            applied = set()
            if int(client.command(f"EXISTS TABLE {db}.schema_migrations")):
                rows = client.query(f"SELECT version, name FROM {db}.schema_migrations").result_rows
                applied = {int(v) for v, _ in rows}
                _ahead({int(v): name for v, name in rows}, db, self._said_ahead)
        pending = [f"{m.version:04d}_{m.name}" for m in migrations() if m.version not in applied]
        if pending:
            raise StoreOutdated(f"the store's schema is behind this burnwatch ({', '.join(pending)} not applied): "
                                "run `burnwatch db migrate`")  # fmt: skip

    def migrate(self) -> list[str]:
        """Apply the migrations not yet recorded in ``schema_migrations``, in order; returns
        their names. Safe on every start (and by ``burnwatch db migrate``)."""
        db, client = self.conn.db, self.conn.client
        applied_now = []
        with self.conn.lock:
            self.created = self.created or not int(client.command(f"EXISTS TABLE {db}.resource_usage"))
            client.command(f"CREATE DATABASE IF NOT EXISTS {db}")
            client.command(
                f"""CREATE TABLE IF NOT EXISTS {db}.schema_migrations (
                    version UInt32, name String, checksum String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)
                ) ENGINE = ReplacingMergeTree ORDER BY version"""
            )
            result = client.query(f"SELECT version, checksum, name FROM {db}.schema_migrations FINAL")
            applied = {int(v): c for v, c, _ in result.result_rows}
            _ahead({int(v): name for v, _, name in result.result_rows}, db, self._said_ahead)
            for migration in migrations():
                if migration.version in applied:
                    if applied[migration.version] != migration.checksum:
                        log.warning("migration_edited", version=migration.version, name=migration.name,
                                    hint="released migrations are never edited: add a new one")  # fmt: skip
                    continue
                for statement in migration.statements(db):
                    client.command(statement)
                client.insert(f"{db}.schema_migrations", [[migration.version, migration.name, migration.checksum]],
                              column_names=["version", "name", "checksum"])  # fmt: skip
                applied_now.append(f"{migration.version:04d}_{migration.name}")
            if applied_now:
                self.conn.forget_types()  # a migration may have changed a table this connection inserts into
        if applied_now:
            log.info("migrations_applied", database=db, migrations=applied_now)
        first = migrations()[0]
        if self.created and f"{first.version:04d}_{first.name}" in applied_now:  # its tables made just now
            self.widen_merges()
            self.pack_small_parts()
        return applied_now

    def widen_merges(self) -> list[str]:
        """Set :data:`MERGE_SELECTOR_BASE` on :data:`BATCH_TABLES`, where the engine knows the setting
        (its ``system.merge_tree_settings``: ClickHouse added it late in 2024) and a table does not set
        it. :meth:`migrate` does it once, for a store it creates: like a table's order or codecs, a choice
        made with the table, which a server's operator may undo (``ALTER TABLE … RESET SETTING
        merge_selector_base``) and which an existing store does not have forced on it at the next start
        (nor a store whose first table was lost and made again). Only a hint for speed: an engine that
        refuses it (a user without the ``ALTER MODIFY SETTING`` grant, a settings constraint) leaves the
        tables as they are, with a warning, and the start goes on. Returns the tables changed."""
        return self._set_on_batch_tables("merge_selector_base", MERGE_SELECTOR_BASE, "merge_width_not_set",
                                         "the tables merge as ClickHouse's default does, which costs more CPU")  # fmt: skip

    def pack_small_parts(self) -> list[str]:
        """On the embedded engine (:data:`ON_CHDB`: in the worker's process or served by ``burnwatch store
        serve``), set :data:`PACKED_BELOW_BYTES` on :data:`BATCH_TABLES`, as :meth:`widen_merges` sets its
        setting (once, for a store :meth:`migrate` creates; a hint, refused with a warning). Not on a
        ClickHouse server: its reference calls the setting ClickHouse Cloud's, and a server's disk is its
        operator's to tune. Returns the tables changed."""
        return self._set_on_batch_tables("min_bytes_for_full_part_storage", PACKED_BELOW_BYTES, "parts_not_packed",
                                         "each small part stays a directory of files, which costs more CPU",
                                         only_where=ON_CHDB)  # fmt: skip

    def _set_on_batch_tables(self, setting: str, value: int, event: str, cost: str, only_where: str = "1") -> list[str]:
        """``setting = value`` on each of :data:`BATCH_TABLES` that does not set it, where the engine
        knows it and ``only_where`` (a condition on the engine) holds; an engine that refuses logs
        ``event`` (saying ``cost``) and the start goes on."""
        db, changed = self.conn.db, []
        try:
            known = f"SELECT count() FROM system.merge_tree_settings WHERE name = '{setting}' AND {only_where}"
            if not int(self.conn.command(known)):
                return []
            ddl = self._ddl()
            for table in [t for t in BATCH_TABLES if t in ddl and setting not in ddl[t]]:
                self.conn.command(f"ALTER TABLE {db}.{table} MODIFY SETTING {setting} = {value}")
                changed.append(table)
        except Exception as exc:  # noqa: BLE001 - a driver or the server may raise; the store works without it
            log.warning(event, database=db, changed=changed, error=one_line(exc),
                        hint=f"{cost}; to set it by hand: ALTER TABLE {db}.<table> MODIFY SETTING {setting} = "
                             f"{value}, for {', '.join(BATCH_TABLES)}")  # fmt: skip
        return changed

    def applied(self) -> list[dict[str, Any]]:
        """The migrations recorded as applied, in version order."""
        return self.conn.query(f"SELECT version, name, checksum, applied_at FROM {self.conn.db}.schema_migrations FINAL "
                               "ORDER BY version")  # fmt: skip

    def missing_tables(self) -> list[str]:
        """Tables and views the migrations make that the database lacks (dropped by hand, or
        lost): a store missing one is not up to date, whatever ``schema_migrations`` says."""
        made = dict.fromkeys(name for m in migrations() for name in _MADE.findall(m.sql))
        present = {r["name"] for r in self.conn.query("SELECT name FROM system.tables WHERE database = %(db)s",
                                                      {"db": self.conn.db})}  # fmt: skip
        return [name for name in made if name not in present]

    def restore_missing(self) -> list[str]:
        """Make the tables :meth:`missing_tables` names again, by running every migration's
        statements again in order (each is idempotent); returns those it made."""
        missing = self.missing_tables()
        if missing:
            with self.conn.lock:
                for migration in migrations():
                    for statement in migration.statements(self.conn.db):
                        self.conn.client.command(statement)
                self.conn.forget_types()
            log.warning("tables_restored", database=self.conn.db, tables=missing)
        return [name for name in missing if name not in self.missing_tables()]

    def event_ttl(self) -> int:
        """Days of event time the raw tables keep (0: forever), as the store says."""
        ddl = self._ddl().get("resource_usage")
        found = re.search(r"TTL toDateTime\(ts\) \+ toIntervalDay\((\d+)\)", ddl) if ddl else None
        return int(found.group(1)) if found else 0

    def _ddl(self) -> dict[str, str]:
        """Each table's and view's ``CREATE`` in this database, as the engine holds it now (its TTL and settings)."""
        rows = self.conn.query("SELECT name, create_table_query AS ddl FROM system.tables WHERE database = %(db)s",
                               {"db": self.conn.db})  # fmt: skip
        return {r["name"]: r["ddl"] for r in rows}

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
        db, tables = self.conn.db, self._ddl()
        for table in RAW_TABLES:
            ddl = tables[table]
            ttl = f"toDateTime(ts) + toIntervalDay({days})"
            has_ttl = " TTL " in ddl
            if days > 0 and ttl not in ddl:
                statement = f"ALTER TABLE {db}.{table} MODIFY TTL {ttl} SETTINGS materialize_ttl_after_modify = 0"
            elif days <= 0 and has_ttl:
                statement = f"ALTER TABLE {db}.{table} REMOVE TTL"
            else:
                continue
            self.conn.command(statement)
            log.info("event_ttl_set", table=table, days=days)
        return max(days, 0)
