"""The store on the embedded ClickHouse engine: migrations, event TTL, deduplication of
messages read again, and the rollups the materialized views keep."""

from __future__ import annotations

import asyncio
import os
import re
import struct
import subprocess
import sys
import time

import msgspec
import pytest
from structlog.testing import capture_logs

from detector.store import EventBatch, Store, migrations
from detector.store.schema import BATCH_TABLES, MERGE_SELECTOR_BASE, ON_CHDB, PACKED_BELOW_BYTES
from tests.helpers import MIN, T0, at, scrape, usage
from tests.test_pipeline import gpu_message, make, usage_message

HOUR = 3600.0


def test_migrations_are_recorded_and_applied_once(store):
    recorded = store.schema.applied()
    assert [m["version"] for m in recorded] == [m.version for m in migrations()]
    assert [m["checksum"] for m in recorded] == [m.checksum for m in migrations()]
    assert store.migrate() == []  # nothing left to apply


def test_a_store_from_before_recorded_migrations_is_migrated_in_place(chdb_client):
    """A database made by the first release (its tables, no schema_migrations): migrating
    adds what is new and keeps the rows."""
    db = "t_pre_migrations"
    chdb_client.command(f"DROP DATABASE IF EXISTS {db}")
    first, *_ = migrations()
    for statement in first.statements(db):
        chdb_client.command(statement)
    chdb_client.command(f"INSERT INTO {db}.resource_usage (ts, resource_id, resource_type, interval_s) "
                        "VALUES (now64(3), 'old-host', 'gpu_instance', 60)")  # fmt: skip
    store = Store(chdb_client, db)
    applied = store.migrate()
    assert applied == [f"{m.version:04d}_{m.name}" for m in migrations()]
    assert store.count("resource_usage") == 1
    assert store.query(f"SELECT src_topic, usd FROM {db}.resource_usage") == [{"src_topic": "", "usd": 0.0}]



def test_an_alert_withdrawn_before_its_column_existed_reads_as_withdrawn(chdb_client, monkeypatch):
    """Migration 0022 gives ``alerts`` a ``withdrawn`` column: rows a worker wrote before it get it
    from their details' reason (a fire taken back), and only a resolution taken back is withdrawn."""
    import detector.store.schema as schema

    db = "t_before_withdrawn"
    chdb_client.command(f"DROP DATABASE IF EXISTS {db}")
    every = migrations()
    monkeypatch.setattr(schema, "migrations", lambda: [m for m in every if m.version < 22])
    store = Store(chdb_client, db)
    store.migrate()
    chdb_client.command(
        f"""INSERT INTO {db}.alerts (alert_id, type, rule, resource_id, status, change, details, version) VALUES
            ('taken', 'idle_gpu', 'idle_gpu', 'h1', 'firing', 'fired', '{{}}', 1),
            ('taken', 'idle_gpu', 'idle_gpu', 'h1', 'resolved', 'resolved', '{{"reason": "withdrawn"}}', 2),
            ('stood', 'idle_gpu', 'idle_gpu', 'h2', 'resolved', 'resolved', '{{"reason": "instance_stopped"}}', 2),
            ('open', 'idle_gpu', 'idle_gpu', 'h3', 'firing', 'updated', '{{"reason": "withdrawn"}}', 2)""")
    monkeypatch.setattr(schema, "migrations", lambda: every)
    assert store.migrate() == [f"{m.version:04d}_{m.name}" for m in every if m.version >= 22]
    rows = store.query(f"SELECT alert_id, withdrawn FROM {db}.alerts FINAL ORDER BY alert_id")
    assert {r["alert_id"]: r["withdrawn"] for r in rows} == {"open": False, "stood": False, "taken": True}


def _table_setting(store, table, setting):
    """A table's MergeTree ``setting`` as its CREATE says, None where the table leaves it default."""
    ddl = store.query("SELECT create_table_query AS q FROM system.tables WHERE database = %(d)s AND name = %(t)s",
                      {"d": store.db, "t": table})[0]["q"]  # fmt: skip
    found = re.search(rf"{setting} = (\d+)", ddl)
    return int(found.group(1)) if found else None


def _merge_base(store, table):
    return _table_setting(store, table, "merge_selector_base")


def test_a_store_made_here_merges_its_batch_tables_wider_and_an_existing_one_keeps_its_own(chdb_client):
    """The tables each batch inserts into merge at ``MERGE_SELECTOR_BASE`` in a store ``migrate`` makes;
    the others keep ClickHouse's default. A store that exists already is not changed at its next start:
    an operator who reset the setting keeps that, and so does a store whose first table was lost and made again."""
    db = "t_merge_width"
    chdb_client.command(f"DROP DATABASE IF EXISTS {db}")
    store = Store(chdb_client, db)
    store.migrate()
    assert {t: _merge_base(store, t) for t in BATCH_TABLES} == dict.fromkeys(BATCH_TABLES, MERGE_SELECTOR_BASE)
    assert _merge_base(store, "alerts") is None and _merge_base(store, "detector_state") is None
    store.command(f"ALTER TABLE {db}.gpu_metrics RESET SETTING merge_selector_base")
    again = Store(chdb_client, db)  # the next start: the tables exist
    assert again.migrate() == []
    assert _merge_base(again, "gpu_metrics") is None and _merge_base(again, "run_events") == MERGE_SELECTOR_BASE
    assert again.schema.widen_merges() == ["gpu_metrics"]  # what a fresh store would get, asked for by name
    assert _merge_base(again, "gpu_metrics") == MERGE_SELECTOR_BASE
    store.command(f"ALTER TABLE {db}.gpu_metrics RESET SETTING merge_selector_base")
    store.command(f"DROP TABLE {db}.resource_usage")  # lost by hand: made again, the store is not new
    lost = Store(chdb_client, db)
    assert lost.migrate() == [] and lost.schema.restore_missing() == ["resource_usage"]
    assert _merge_base(lost, "gpu_metrics") is None
    chdb_client.command(f"DROP DATABASE {db}")


def test_an_embedded_store_made_here_packs_its_batch_tables_small_parts(chdb_client):
    """In the embedded engine, the parts each batch leaves in the tables it inserts into are written
    packed (one file each), not as a directory of files; the other tables keep ClickHouse's default.
    The events are all there, and an operator's reset of the setting stays at the next start."""
    db = "t_packed"
    chdb_client.command(f"DROP DATABASE IF EXISTS {db}")
    store = Store(chdb_client, db)
    store.migrate()

    def packed_below(table):
        return _table_setting(store, table, "min_bytes_for_full_part_storage")

    assert int(chdb_client.command(f"SELECT {ON_CHDB}")) == 1
    assert {t: packed_below(t) for t in BATCH_TABLES} == dict.fromkeys(BATCH_TABLES, PACKED_BELOW_BYTES)
    assert packed_below("alerts") is None and packed_below("detector_state") is None
    batch = EventBatch()
    batch.extend([usage(T0 + i * MIN, rid=f"packed-{i % 3}") for i in range(30)] + scrape(T0, [0.0, 1.0, 2.0, 3.0]))
    assert store.events.insert(batch) == 34
    parts = store.query("SELECT table, groupUniqArray(part_storage_type) AS s FROM system.parts WHERE database = %(d)s "
                        "AND active AND table IN ('resource_usage', 'gpu_metrics') GROUP BY table", {"d": db})  # fmt: skip
    storage = {r["table"]: r["s"] for r in parts}
    assert storage == {"resource_usage": ["Packed"], "gpu_metrics": ["Packed"]}
    assert store.count("resource_usage") == 30 and store.count("gpu_metrics") == 4
    store.command(f"ALTER TABLE {db}.gpu_metrics RESET SETTING min_bytes_for_full_part_storage")
    again = Store(chdb_client, db)  # the next start: the tables exist, an operator's reset stays
    assert again.migrate() == [] and packed_below("gpu_metrics") is None
    chdb_client.command(f"DROP DATABASE {db}")


@pytest.mark.parametrize(("setting", "event"), [("merge_selector_base", "merge_width_not_set"),
                                              ("min_bytes_for_full_part_storage", "parts_not_packed")])
def test_an_engine_refusing_a_batch_table_setting_leaves_the_store_working_and_says_so(chdb_client, monkeypatch,
                                                                                       setting, event):
    """Each setting is only a hint for speed: ClickHouse refusing it (a user without the ``ALTER MODIFY
    SETTING`` grant: the refusal injected at the driver, as the server would send it) must not stop a
    worker's start; the store is made, warned about (by the setting's own event), keeps the other
    setting, and takes events."""
    db = "t_setting_refused"
    chdb_client.command(f"DROP DATABASE IF EXISTS {db}")
    driver = chdb_client.command

    def refuse(sql, *args, **kwargs):
        if f"MODIFY SETTING {setting}" in sql:
            raise RuntimeError("Code: 497. DB::Exception: default: Not enough privileges. (ACCESS_DENIED)")
        return driver(sql, *args, **kwargs)

    monkeypatch.setattr(chdb_client, "command", refuse)
    store = Store(chdb_client, db)
    with capture_logs() as logs:
        assert store.migrate() == [f"{m.version:04d}_{m.name}" for m in migrations()]
    (warning,) = [e for e in logs if e["event"] == event]
    assert "ACCESS_DENIED" in warning["error"] and warning["changed"] == [] and setting in warning["hint"]
    assert [e["event"] for e in logs if e.get("log_level") == "warning"] == [event]
    assert all(_table_setting(store, t, setting) is None for t in BATCH_TABLES)
    other = "min_bytes_for_full_part_storage" if setting == "merge_selector_base" else "merge_selector_base"
    assert all(_table_setting(store, t, other) is not None for t in BATCH_TABLES)
    batch = EventBatch()
    batch.extend([usage(time.time() - HOUR, rid="after-refusal")])
    assert store.events.insert(batch) == 1 and store.count("resource_usage") == 1
    monkeypatch.undo()
    chdb_client.command(f"DROP DATABASE {db}")


def test_db_migrate_applies_then_reports_up_to_date(tmp_path):
    env = {**os.environ, "BURNWATCH_CLICKHOUSE_DSN": f"chdb://{tmp_path / 'ch'}", "BURNWATCH_EVENT_TTL_DAYS": "45"}
    runs = [subprocess.run([sys.executable, "-m", "streams.cli", "db", "migrate"], env=env, capture_output=True,
                           text=True, check=True).stdout for _ in range(2)]  # fmt: skip
    names = [f"{m.version:04d}_{m.name}" for m in migrations()]
    assert f"applied {', '.join(names)}" in runs[0]
    assert "up to date" in runs[1] and "applied" not in runs[1].splitlines()[0]
    assert all(name in runs[1] for name in names)  # the history is listed
    assert "raw events kept 45 days of event time" in runs[1]


def test_event_ttl_drops_old_raw_events_and_keeps_the_rollups(store):
    now = time.time()
    batch = EventBatch()
    batch.extend([usage(now - 100 * 86_400, rid="old"), usage(now - HOUR, rid="recent")])
    store.events.insert(batch)
    store.schema.set_event_ttl(30)
    store.schema.set_event_ttl(30)  # unchanged: nothing to alter
    store.client.command(f"OPTIMIZE TABLE {store.db}.resource_usage FINAL")  # the merge that applies TTL
    raw = store.query(f"SELECT resource_id FROM {store.db}.resource_usage")
    assert raw == [{"resource_id": "recent"}]
    kept = store.query(f"SELECT DISTINCT resource_id FROM {store.db}.cost_hourly ORDER BY resource_id")
    assert kept == [{"resource_id": "old"}, {"resource_id": "recent"}]
    store.schema.set_event_ttl(0)
    ddl = store.query("SELECT create_table_query AS q FROM system.tables WHERE database = %(d)s AND name = "
                      "'resource_usage'", {"d": store.db})[0]["q"]  # fmt: skip
    assert " TTL " not in ddl


def test_messages_read_again_are_not_stored_twice(store, ruleset):
    """A worker restarts (a new pipeline, nothing in memory) and reads from an older offset:
    the messages already stored are detected again but not inserted again, so no total in
    the raw tables or the rollups counts them twice; the new ones are stored."""
    first = [usage_message(i, T0 + i * MIN) for i in range(30)]
    first += [gpu_message(i, T0 + i * MIN, 1.0) for i in range(30)]
    again = first[10:30] + first[40:60]  # from an older offset
    again += [usage_message(30 + i, T0 + (30 + i) * MIN) for i in range(10)]

    async def ack(messages):
        pass

    async def run(messages):
        pipeline, _ = make(store, ruleset, lambda topic, p, offset: True)
        await pipeline.process(messages, ack)
        await pipeline.drain()

    asyncio.run(run(first))
    assert store.count("resource_usage") == 30 and store.count("gpu_metrics") == 60
    asyncio.run(run(again))
    assert store.count("resource_usage") == 40 and store.count("gpu_metrics") == 60
    (hourly,) = store.query(f"SELECT sum(usd) AS usd, sum(running_hours) AS hours FROM {store.db}.cost_hourly")
    assert hourly["usd"] == pytest.approx(40 * 0.5)  # each usage message cost $0.50
    assert hourly["hours"] == pytest.approx(40 / 60)
    offsets = store.query(f"SELECT table, topic, max(offset) AS offset FROM {store.db}.ingest_positions "
                          "GROUP BY table, topic ORDER BY table")  # fmt: skip
    assert offsets == [{"table": "gpu_metrics", "topic": "gpu-metrics", "offset": 29},
                       {"table": "resource_usage", "topic": "resource-usage", "offset": 39}]  # fmt: skip


def test_hourly_rollups_add_up_to_the_raw_events(store, ruleset):
    """Two hours of one 4-GPU host, idle for the first 45 minutes; one priced instance
    without a cost; egress priced by destination."""
    events = []
    for m in range(120):
        t = T0 + m * MIN
        events.append(usage(t, rid="gpu-1", usd_per_hour=32.0))
        events += scrape(t, [1.0] * 4 if m < 45 else [90.0] * 4, rid="gpu-1")
        cpu = usage(t, rid="cpu-1", usd_per_hour=None, resource_type="cpu_instance",
                    tags={"team": "data", "project": "etl"})  # fmt: skip
        events.append(msgspec.structs.replace(cpu, instance_type="m6i.2xlarge", egress_bytes=10**9,
                                              dest_region="eu-west-1"))  # fmt: skip
    batch = EventBatch()
    batch.extend(events)
    store.events.insert(batch, ruleset.pricing)
    rows = store.query(f"""SELECT resource_id, team, project, round(sum(usd), 6) AS usd, sum(gpu_hours) AS gpu_hours,
                                  sum(idle_gpu_hours) AS idle, sum(egress_bytes) AS egress, sum(egress_usd) AS egress_usd
                           FROM {store.db}.cost_hourly GROUP BY resource_id, team, project ORDER BY resource_id""")
    cpu, gpu = rows
    m6i = ruleset.pricing.hourly("m6i.2xlarge")
    assert m6i and cpu["usd"] == pytest.approx(2 * m6i) and cpu["team"] == "data" and cpu["project"] == "etl"
    assert cpu["egress"] == 120 * 10**9
    assert cpu["egress_usd"] == pytest.approx(120 * ruleset.pricing.egress_per_gb.inter_region)
    assert gpu["usd"] == pytest.approx(64.0) and gpu["gpu_hours"] == pytest.approx(8.0)
    assert gpu["idle"] == pytest.approx(4 * 45 / 60)  # 4 GPUs idle for 45 minutes
    assert gpu["egress"] == 0 and gpu["team"] == "nlp"


def test_daily_waste_splits_an_incident_across_midnight(store):
    """An alert whose dollars grow from $10 before midnight to $25 after counts $10 on the
    first day and $15 on the second; a change recorded twice does not add."""
    from detector.alerts import Alert

    midnight = T0 + 86_400
    base = dict(alert_id="a1", type="idle_gpu", rule="idle-gpu", resource_id="gpu-1", status="firing",
                severity="warning", episode_start=midnight - 3 * HOUR, fired_at=midnight - 2 * HOUR,
                tags={"team": "nlp"})  # fmt: skip
    changes = [Alert(**base, change="fired", updated_at=midnight - 2 * HOUR, waste_usd=4.0),
               Alert(**base, change="updated", updated_at=midnight - 60, waste_usd=10.0),
               Alert(**base, change="updated", updated_at=midnight + HOUR, waste_usd=25.0)]  # fmt: skip
    store.alerts.record(changes, version=1)
    store.alerts.record(changes[2:], version=4)  # written again after a retry
    rows = store.query(f"SELECT day, type, team, sum(usd) AS usd FROM {store.db}.waste_by_day "
                       "GROUP BY day, type, team ORDER BY day")  # fmt: skip
    assert [(r["day"].isoformat(), r["usd"]) for r in rows] == [(at(T0).date().isoformat(), 10.0),
                                                                 (at(midnight).date().isoformat(), 15.0)]  # fmt: skip
    assert {(r["type"], r["team"]) for r in rows} == {("idle_gpu", "nlp")}
    second_day = store.query(f"SELECT usd FROM {store.db}.waste_by_day WHERE day = %(day)s",
                             {"day": at(midnight).date()})  # fmt: skip
    assert second_day == [{"usd": 15.0}]  # a filter on the day does not reach under the running difference


def test_a_batch_spanning_many_months_is_stored_once(store):
    """Events of 101 calendar months in one batch (a replay, or one hostile message): ClickHouse's
    default refuses an insert touching over 100 partitions; the store takes it, and the same
    batch written again (a retry) adds nothing."""
    events = [usage(T0 - m * 31 * 86_400, rid=f"host-{m % 7}") for m in range(101)]
    for _ in range(2):
        batch = EventBatch()
        batch.extend(events)
        store.events.insert(batch)
    (row,) = store.query(f"SELECT count() AS n, uniqExact(toYYYYMM(ts)) AS months FROM {store.db}.resource_usage")
    assert row == {"n": 101, "months": 101}


def test_the_same_event_is_stored_once_and_a_changed_one_again(store):
    """Identity is the whole content: a repeat is left out, an event that differs in any field
    (a corrected cost, an extra field) is a new event."""
    event = usage(T0, rid="gpu-1")
    corrected = msgspec.structs.replace(event, cost_usd=event.cost_usd + 1)
    tagged = msgspec.structs.replace(event, extra={"scrape": "b"})
    for events in ([event, event], [event, corrected], [tagged]):
        batch = EventBatch()
        batch.extend(events)
        store.events.insert(batch)
    assert store.count("resource_usage") == 3


def test_a_batch_of_many_chunks_stores_each_event_with_its_own_values(store, ruleset):
    """A batch is turned into columns a chunk of events at a time: over several chunks (and a
    partial last one), every event is stored once, with its own values, id and Kafka source."""
    from detector.store import event_ids

    gpu = [e for m in range(700) for e in scrape(T0 + m * MIN, [float(m % 97)] * 4, rid=f"gpu-{m % 3}")]
    runs = [usage(T0 + m * MIN, rid=f"host-{m % 5}", usd_per_hour=float(m)) for m in range(1100)]
    batch = EventBatch()
    for offset, start in enumerate(range(0, len(gpu), 4)):
        batch.extend(gpu[start : start + 4], ("gpu-metrics", 1, offset))
    batch.extend(runs, ("resource-usage", 2, 7))
    assert store.events.insert(batch, ruleset.pricing) == len(gpu) + len(runs) == 3900
    stored = store.query(f"SELECT event_id, toUnixTimestamp64Milli(ts) AS ms, resource_id, gpu_index, util_pct, "
                         f"src_offset FROM {store.db}.gpu_metrics")  # fmt: skip
    expected = {(i, round(e.ts.timestamp() * 1000), e.resource_id, e.gpu_index, e.util_pct, n // 4)
                for n, (i, e) in enumerate(zip(event_ids(b"gpu", gpu), gpu, strict=True))}  # fmt: skip
    assert {tuple(row.values()) for row in stored} == expected
    stored = store.query(f"SELECT event_id, resource_id, cost_usd, usd, src_offset FROM {store.db}.resource_usage")
    expected = {(i, e.resource_id, e.cost_usd, e.cost_usd, 7) for i, e in zip(event_ids(b"usage", runs), runs, strict=True)}
    assert {tuple(row.values()) for row in stored} == expected


def test_rows_stored_before_events_had_ids_are_not_stored_again(store):
    """After the upgrade that gave events their content ids, messages read again (not yet
    acknowledged before the upgrade) match their old rows by Kafka source, not by id."""
    events = [usage(T0 + i * MIN, rid="gpu-1") for i in range(10)]
    batch = EventBatch()
    for i, event in enumerate(events):
        batch.extend([event], ("resource-usage", 0, i))
    store.events.insert(batch)
    store.client.command(f"ALTER TABLE {store.db}.resource_usage UPDATE event_id = 0 WHERE 1 SETTINGS mutations_sync = 1")
    again = EventBatch()
    for i, event in enumerate(events[5:] + [usage(T0 + 10 * MIN, rid="gpu-1")], start=5):
        again.extend([event], ("resource-usage", 0, i))
    assert store.events.insert(again) == 1  # the five read again are left out, the new one stored
    assert store.count("resource_usage") == 11


def test_an_insert_error_is_the_rows_fault_only_when_clickhouse_says_so(store):
    """Only a refusal of the rows (a type, a range, a constraint) isolates a message; an
    unavailable, overloaded or slow store is retried, whatever its message."""
    from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

    assert store.refused(OverflowError("int too big to convert"))
    assert store.refused(DatabaseError("Code: 469. DB::Exception: Constraint `c` is violated. (VIOLATED_CONSTRAINT)"))
    assert store.refused(DatabaseError("Code: 53. DB::Exception: Type mismatch. (TYPE_MISMATCH)"))
    assert not store.refused(DatabaseError("Code: 252. DB::Exception: Too many parts (300). (TOO_MANY_PARTS)"))
    assert not store.refused(DatabaseError("Code: 241. DB::Exception: Memory limit exceeded. (MEMORY_LIMIT_EXCEEDED)"))
    assert not store.refused(OperationalError("Error HTTPConnectionPool: Read timed out"))


def test_column_types_changed_elsewhere_are_asked_again_within_a_minute(store):
    """A type changed by someone else in a way ClickHouse converts (Float32 to Float64, a Decimal's scale)
    fails no insert: types kept forever would round every value sent as the old type until a restart.
    They are asked again once :data:`TYPES_KEPT_S` have passed (a clock that only this test moves)."""
    from detector.store.connection import TYPES_KEPT_S, Connection

    now = [1000.0]
    conn = Connection(store.client, store.db, clock=lambda: now[0])
    table = f"{store.db}.scratch_widened"
    store.command(f"CREATE TABLE {table} (k String, f Float32, d Decimal(18, 2)) ENGINE = MergeTree ORDER BY k")
    conn.insert("scratch_widened", [["before", 0.1, 1.25]], column_names=["k", "f", "d"])
    store.command(f"ALTER TABLE {table} MODIFY COLUMN f Float64")  # an operator, or a newer worker's migration
    store.command(f"ALTER TABLE {table} MODIFY COLUMN d Decimal(18, 6)")
    now[0] += TYPES_KEPT_S - 1
    conn.insert("scratch_widened", [["kept", 0.1, 1.234567]], column_names=["k", "f", "d"])  # the old types, still
    now[0] += 1
    conn.insert("scratch_widened", [["asked again", 0.1, 1.234567]], column_names=["k", "f", "d"])
    rows = {r["k"]: (r["f"], str(r["d"])) for r in store.query(f"SELECT k, f, toString(d) AS d FROM {table}")}
    float32 = struct.unpack("f", struct.pack("f", 0.1))[0]
    assert rows["kept"] == (float32, "1.23")  # what a minute of the old types stores
    assert rows["asked again"] == (0.1, "1.234567")


def test_an_insert_asks_a_tables_column_types_once_and_again_after_a_failure(store):
    """The client asks a table's types (a DESCRIBE, a round trip to a server) for every insert it is not
    told them: the connection asks once a table and keeps them, and asks again after a failed insert or
    for a column it does not know (the table may have changed). It keeps no rows alive, and an empty
    insert sends nothing."""
    import gc
    import weakref

    table = f"{store.db}.scratch_types"
    store.command(f"CREATE TABLE {table} (a String, b UInt8) ENGINE = MergeTree ORDER BY a")
    described: list[str] = []
    real = store.client.query

    def counting(sql, *args, **kwargs):
        if sql.startswith("DESCRIBE"):
            described.append(sql)
        return real(sql, *args, **kwargs)

    class Rows(list):  # a list a weak reference can follow
        pass

    real_context = store.client.create_insert_context
    named: list[bool] = []

    def told_types(*args, **kwargs):  # the client asks the types itself unless told them
        named.append(bool(kwargs.get("column_type_names")))
        return real_context(*args, **kwargs)

    store.client.query = counting
    store.client.create_insert_context = told_types
    try:
        for i in range(3):
            store.insert("scratch_types", Rows([[f"r{i}", i]]), column_names=["a", "b"])
        store.insert("scratch_types", [["c0", "c1"], [7, 8]], column_names=["a", "b"], column_oriented=True)
        store.insert("scratch_types", [], column_names=["a", "b"])
        assert described == [f"DESCRIBE TABLE {table}"]
        last = Rows([["r3", 3]])
        gone = weakref.ref(last)
        store.insert("scratch_types", last, column_names=["a", "b"])
        del last
        gc.collect()
        assert gone() is None
        store.command(f"DROP TABLE {table}")
        store.command(f"CREATE TABLE {table} (a String, b String) ENGINE = MergeTree ORDER BY a")
        with pytest.raises(Exception):  # noqa: B017 - the client's, building the block with the old types
            store.insert("scratch_types", [["x", "not a number"]], column_names=["a", "b"])
        store.insert("scratch_types", [["x", "now a string"]], column_names=["a", "b"])
        assert len(described) == 2
        store.command(f"ALTER TABLE {table} ADD COLUMN c UInt16")  # a migration elsewhere: a column the types lack
        store.insert("scratch_types", [["y", "with c", 300]], column_names=["a", "b", "c"])
        assert len(described) == 3 and named and all(named)
    finally:
        del store.client.query, store.client.create_insert_context
    assert store.query(f"SELECT a, b, c FROM {table} ORDER BY a") == [{"a": "x", "b": "now a string", "c": 0},
                                                                      {"a": "y", "b": "with c", "c": 300}]  # fmt: skip



_READ_ONLY_PROBE = """
import sys
from clickhouse_connect.driver.models import SettingDef
from detector.store.connection import Connection, connect

conn = Connection(connect("chdb://memory"), "default")
assert conn.query("SELECT 1 AS x", read_only=True) == [{"x": 1}]
try:
    conn.query("CREATE TABLE default.t (x UInt8) ENGINE = Memory", read_only=True)
    sys.exit("a statement that writes ran")
except Exception as exc:
    assert "readonly" in str(exc).lower(), exc
conn.client.server_settings["readonly"] = SettingDef(name="readonly", value="1", readonly=1)  # a read-only user
assert conn.query("SELECT 2 AS x", read_only=True) == [{"x": 2}]
print("ok")
"""


def test_a_query_a_person_typed_only_reads_and_a_read_only_user_stays_so():
    """`burnwatch sql` asks ClickHouse for readonly = 2; a user whose profile is read-only already cannot be sent
    the setting at all (clickhouse-connect refuses a setting the server says is read-only), so it is not. In a
    process of its own: on the embedded engine the setting stays for the process, and this one's engine is shared."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _READ_ONLY_PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
