"""The schema: the migrations of ``detector/migrations`` and the raw events' expiry."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from detector.store.connection import Connection

__all__ = ["MIGRATIONS_DIR", "RAW_TABLES", "Migration", "Schema", "migrations"]

log = structlog.get_logger("burnwatch.store")

MIGRATIONS_DIR = Path(__file__).parent.parent / "migrations"
RAW_TABLES = ("resource_usage", "gpu_metrics", "run_events")


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


class Schema:
    """Applies the migrations and sets how long raw events are kept."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def migrate(self) -> list[str]:
        """Apply the migrations not yet recorded in ``schema_migrations``, in order; returns
        their names. Safe on every start (and by ``burnwatch db migrate``)."""
        db, client = self.conn.db, self.conn.client
        applied_now = []
        with self.conn.lock:
            client.command(f"CREATE DATABASE IF NOT EXISTS {db}")
            client.command(
                f"""CREATE TABLE IF NOT EXISTS {db}.schema_migrations (
                    version UInt32, name String, checksum String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)
                ) ENGINE = ReplacingMergeTree ORDER BY version"""
            )
            result = client.query(f"SELECT version, checksum FROM {db}.schema_migrations FINAL")
            applied = {int(v): c for v, c in result.result_rows}
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
            log.info("migrations_applied", database=db, migrations=applied_now)
        return applied_now

    def applied(self) -> list[dict[str, Any]]:
        """The migrations recorded as applied, in version order."""
        return self.conn.query(f"SELECT version, name, checksum, applied_at FROM {self.conn.db}.schema_migrations FINAL "
                               "ORDER BY version")  # fmt: skip

    def set_event_ttl(self, days: int) -> None:
        """Keep raw events ``days`` days of event time (0: forever); rollups are kept. A change
        applies to existing data as ClickHouse merges it, not in one rewrite at start."""
        db = self.conn.db
        for table in RAW_TABLES:
            ddl = self.conn.query("SELECT create_table_query AS ddl FROM system.tables WHERE database = %(db)s "
                                  "AND name = %(table)s", {"db": db, "table": table})[0]["ddl"]  # fmt: skip
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
