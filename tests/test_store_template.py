"""The ``store`` fixture's databases are copies of one migrated once (tests/store_template.py):
a copy must be what the migrations make. Its tables and views, their DDL, engines, keys and
columns (types, defaults, codecs, positions), the migrations it records, the store's state
after ``migrate()``, and what its materialized views and views compute from the same writes."""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

import msgspec
import pytest

import tests.store_template as store_template
from detector.actions import Click
from detector.alerts import Alert
from detector.store import EventBatch, Store, migrations
from detector.store.schema import _MADE
from tests.helpers import T0, timeline, usage
from tests.store_template import migrated_copy

_OBJECT = ("engine, engine_full, create_table_query, as_select, partition_key, sorting_key, primary_key, sampling_key, "
           "skipping_indices_types, storage_policy, comment, has_own_data, target_database, target_table, "
           "arraySort(dependencies_table) AS dependencies, arraySort(loading_dependencies_table) AS reads")  # fmt: skip
_COLUMN = ("type, position, default_kind, default_expression, compression_codec, comment, is_in_partition_key, "
           "is_in_sorting_key, is_in_primary_key, is_in_sampling_key")  # fmt: skip


def _named(client: Any, db: str, sql: str) -> list[dict[str, Any]]:
    result = client.query(sql, parameters={"db": db})
    rows = [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]
    return [{k: re.sub(rf"\b{db}\b", "{db}", v) if isinstance(v, str) else v for k, v in row.items()} for row in rows]


def schema(store: Store) -> dict[str, Any]:
    """What the database is made of, its own name written ``{db}``."""
    client, db = store.client, store.db
    return {
        "tables": {r.pop("name"): r for r in _named(client, db, f"SELECT name, {_OBJECT} FROM system.tables "
                                                                "WHERE database = %(db)s ORDER BY name")},  # fmt: skip
        "columns": _named(client, db, f"SELECT table, name, {_COLUMN} FROM system.columns WHERE database = %(db)s "
                                      "ORDER BY table, position"),  # fmt: skip
        "indices": _named(client, db, "SELECT * EXCEPT database FROM system.data_skipping_indices "
                                      "WHERE database = %(db)s ORDER BY ALL"),  # fmt: skip
        "projections": _named(client, db, "SELECT * EXCEPT database FROM system.projections WHERE database = %(db)s "
                                          "ORDER BY ALL"),  # fmt: skip
        "migrations": [(r["version"], r["name"], r["checksum"]) for r in store.schema.applied()],
        "event_ttl": store.schema.event_ttl(),
    }


def contents(store: Store) -> dict[str, list[tuple]]:
    """Every table's and view's rows (merged as a read with FINAL merges them), but for the
    columns stamped with the time of the insert."""
    client, db = store.client, store.db
    columns: dict[str, list[str]] = {}
    for table, name, default in client.query("SELECT table, name, default_expression FROM system.columns "
                                             "WHERE database = %(db)s ORDER BY table, position",
                                             parameters={"db": db}).result_rows:  # fmt: skip
        if not default.startswith("now"):
            columns.setdefault(table, []).append(f"`{name}`")
    engines = client.query("SELECT name, engine FROM system.tables WHERE database = %(db)s", parameters={"db": db})
    found = {}
    for name, engine in sorted(engines.result_rows):
        final = " FINAL" if engine.endswith("MergeTree") and engine != "MergeTree" else ""
        found[name] = client.query(f"SELECT {', '.join(columns[name])} FROM {db}.`{name}`{final} ORDER BY ALL").result_rows
    return found


@pytest.fixture
def migrated(chdb_client) -> Store:
    """A database the migrations made (what ``Store.open`` makes on a first start)."""
    chdb_client.command("DROP DATABASE IF EXISTS t_tpl_migrated")
    made = Store(chdb_client, "t_tpl_migrated")
    assert made.migrate() == [f"{m.version:04d}_{m.name}" for m in migrations()]
    return made


def test_a_copy_is_the_schema_the_migrations_make(chdb_client, migrated):
    before = time.time()
    copy = migrated_copy(chdb_client, "t_tpl_copy")
    made = schema(migrated)
    assert schema(copy) == made
    assert {n for m in migrations() for n in _MADE.findall(m.sql)} <= set(made["tables"])
    assert {"MaterializedView", "View"} <= {t["engine"] for t in made["tables"].values()}
    applied = copy.schema.applied()
    assert len(applied) == len(migrations()) and all(r["applied_at"].timestamp() >= before - 1 for r in applied)
    assert copy.schema.created and migrated.schema.created  # migrate() made the tables: the default expiry applies
    copy.schema.check()
    assert copy.schema.missing_tables() == [] and copy.migrate() == [] and copy.schema.applied() == applied


def _written(store: Store) -> None:
    """Events (with the Kafka messages they came in), alerts changing, a click: through the
    store's own write paths, which the materialized views follow."""
    batch = EventBatch()
    events = timeline(T0, T0 + 90 * 60, [90.0, 2.0], rid="h1") + timeline(T0, T0 + 30 * 60, [0.5] * 4, rid="h2")
    batch.extend([e for e in events if type(e).__name__ == "UsageEvent"], ("usage", 0, 41))
    batch.extend([e for e in events if type(e).__name__ == "GpuMetric"], ("gpu", 2, 17))
    batch.extend([usage(T0 + 3600, rid="bucket-1", resource_type="bucket", usd_per_hour=0.5)], ("usage", 1, 3))
    assert store.events.insert(batch) == len(batch)
    fired = Alert(alert_id="a1", type="idle_gpu", rule="idle-gpu", resource_id="h2", status="firing", change="fired",
                  severity="warning", episode_start=T0, fired_at=T0 + 1200, updated_at=T0 + 1200, resolved_at=None,
                  waste_usd=3.5, usd_per_hour=32.0, tags={"team": "nlp"}, details={})  # fmt: skip
    resolved = msgspec.structs.replace(fired, status="resolved", change="resolved", updated_at=T0 + 90000,
                                       resolved_at=T0 + 90000, waste_usd=9.25)  # fmt: skip
    store.alerts.record([fired], version=1)
    store.alerts.record([resolved], version=2)
    store.actions.record(Click(action="acknowledged", alert_id="a1", user_id="U1", user_name="bob", channel="C1",
                               message_ts="1.2"), at=T0 + 1300)  # fmt: skip


def test_a_copys_views_compute_what_a_migrated_stores_compute(chdb_client, migrated):
    copy = migrated_copy(chdb_client, "t_tpl_fed")
    for store in (migrated, copy):
        _written(store)
    made = contents(migrated)
    for fed in ("usage_hourly", "gpu_hourly", "ingest_positions", "alert_changes", "waste_daily", "cost_hourly",
                "waste_by_day", "alert_history", "waste_ledger", "rule_feedback"):  # fmt: skip
        assert made[fed], f"{fed}: nothing to compare"
    assert contents(copy) == made


def test_a_copy_without_its_materialized_views_is_told_apart(chdb_client, migrated, monkeypatch):
    """The checks above see a copy that drops something: here, the materialized views."""
    whole = store_template.template(chdb_client)
    without = dataclasses.replace(whole, views=[v for v in whole.views if "MATERIALIZED VIEW" not in v])
    monkeypatch.setattr(store_template, "template", lambda client: without)
    broken = migrated_copy(chdb_client, "t_tpl_broken")
    assert schema(broken)["tables"].keys() < schema(migrated)["tables"].keys()
    for store in (migrated, broken):
        _written(store)
    assert not contents(broken)["usage_hourly"] and contents(migrated)["usage_hourly"]
