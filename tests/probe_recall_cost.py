"""Probe (review): the cost of the new store reads as history grows."""
# ruff: noqa: E501
import time

import pytest


@pytest.mark.parametrize("n", [10_000, 200_000, 1_000_000])
def test_recall_cost(store, n):
    db = store.deliveries.conn.db
    store.deliveries.conn.command(f"""INSERT INTO {db}.alerts (alert_id, type, rule, resource_id, status, severity, episode_start,
        fired_at, updated_at, resolved_at, waste_usd, usd_per_hour, resource_type, account, region, instance_type,
        tags, details, version, partition, change, silenced)
        SELECT concat('a', toString(number)), 'idle_gpu', 'idle-gpu', concat('h', toString(number)), 'resolved', 'warning',
        toDateTime64(1700000000 + number * 60, 3), toDateTime64(1700000000 + number * 60 + 1800, 3),
        toDateTime64(1700000000 + number * 60 + 3600, 3), toDateTime64(1700000000 + number * 60 + 3600, 3),
        1, 1, 'gpu', 'acct', 'r', 'p4d', map('team', 'nlp'), '{{}}', 1, 0, 'resolved', ''
        FROM numbers({n})""")
    store.deliveries.conn.command(f"""INSERT INTO {db}.alert_deliveries (alert_id, kind, channel, message_ts)
        SELECT concat('a', toString(number % {n})), if(number < {n}, 'fired', 'resolved'), '#c',
               toString(1700000000 + (number % {n})) FROM numbers({2 * n})""")
    for label, call in [("alerts.newest", lambda: store.alerts.newest()),
                        ("recall(1 id)", lambda: store.deliveries.recall(["a5"])),
                        ("thread_of (for scale)", lambda: store.deliveries.thread_of("a5")),
                        ("remembered(recent)", lambda: store.deliveries.remembered(1700000000 + n * 60 - 86400)),
                        ("old made() query", lambda: store.deliveries.conn.query(f"SELECT alert_id, kind, channel, message_ts FROM {db}.alert_deliveries FINAL WHERE NOT startsWith(kind, 'posting:')")),
                        ("outputs.finished(1 id)", lambda: store.outputs.finished("hook", ["a5"]))]:
        call()
        t = time.perf_counter()
        for _ in range(3):
            call()
        print(f"n={n} {label}: {(time.perf_counter() - t) / 3 * 1000:.1f} ms")


@pytest.mark.parametrize("n", [1_000_000])
def test_recall_variants(store, n):
    test_recall_cost.__wrapped__ if hasattr(test_recall_cost, "__wrapped__") else None
    db = store.deliveries.conn.db
    conn = store.deliveries.conn
    conn.command(f"""INSERT INTO {db}.alerts (alert_id, type, rule, resource_id, status, severity, episode_start,
        fired_at, updated_at, resolved_at, waste_usd, usd_per_hour, resource_type, account, region, instance_type,
        tags, details, version, partition, change, silenced)
        SELECT concat('a', toString(number)), 'idle_gpu', 'idle-gpu', concat('h', toString(number)), 'resolved', 'warning',
        toDateTime64(1700000000 + number * 60, 3), toDateTime64(1700000000 + number * 60 + 1800, 3),
        toDateTime64(1700000000 + number * 60 + 3600, 3), toDateTime64(1700000000 + number * 60 + 3600, 3),
        1, 1, 'gpu', 'acct', 'r', 'p4d', map('team', 'nlp'), '{{}}', 1, 0, 'resolved', ''
        FROM numbers({n})""")
    conn.command(f"""INSERT INTO {db}.alert_deliveries (alert_id, kind, channel, message_ts)
        SELECT concat('a', toString(number % {n})), if(number < {n}, 'fired', 'resolved'), '#c',
               toString(1700000000 + (number % {n})) FROM numbers({2 * n})""")
    ids = {"ids": ["a5", "a77"]}
    variants = {
        "join filtered by ids, grouped unfiltered": f"""SELECT d.alert_id, d.kind, d.message_ts,
            d.kind = 'fired' AND d.message_ts IN (SELECT message_ts FROM {db}.alert_deliveries FINAL WHERE kind = 'fired'
              AND message_ts != '' GROUP BY message_ts HAVING uniqExact(alert_id) > 1) AS grouped, a.closed
            FROM {db}.alert_deliveries AS d FINAL LEFT JOIN (SELECT alert_id, toUnixTimestamp64Milli(episode_start) AS closed
              FROM {db}.alerts FINAL WHERE alert_id IN %(ids)s) AS a ON a.alert_id = d.alert_id WHERE d.alert_id IN %(ids)s""",
        "both filtered (grouped by the ids' ts)": f"""SELECT d.alert_id, d.kind, d.message_ts,
            d.kind = 'fired' AND d.message_ts IN (SELECT message_ts FROM {db}.alert_deliveries FINAL WHERE kind = 'fired'
              AND message_ts IN (SELECT message_ts FROM {db}.alert_deliveries WHERE alert_id IN %(ids)s AND kind = 'fired' AND message_ts != '')
              GROUP BY message_ts HAVING uniqExact(alert_id) > 1) AS grouped, a.closed
            FROM {db}.alert_deliveries AS d FINAL LEFT JOIN (SELECT alert_id, toUnixTimestamp64Milli(episode_start) AS closed
              FROM {db}.alerts FINAL WHERE alert_id IN %(ids)s) AS a ON a.alert_id = d.alert_id WHERE d.alert_id IN %(ids)s""",
    }
    for label, sql in variants.items():
        conn.query(sql, ids)
        t = time.perf_counter()
        for _ in range(3):
            conn.query(sql, ids)
        print(f"n={n} {label}: {(time.perf_counter() - t) / 3 * 1000:.1f} ms")


def test_recall_with_skip_index(store):
    n = 1_000_000
    conn = store.deliveries.conn
    db = conn.db
    conn.command(f"ALTER TABLE {db}.alert_deliveries ADD INDEX IF NOT EXISTS ts_bf message_ts TYPE bloom_filter GRANULARITY 1")
    conn.command(f"""INSERT INTO {db}.alert_deliveries (alert_id, kind, channel, message_ts)
        SELECT concat('a', toString(number % {n})), if(number < {n}, 'fired', 'resolved'), '#c',
               toString(1700000000 + (number % {n})) FROM numbers({2 * n})""")
    ids = {"ids": ["a5", "a77"]}
    sql = f"""SELECT message_ts FROM {db}.alert_deliveries FINAL WHERE kind = 'fired'
              AND message_ts IN (SELECT message_ts FROM {db}.alert_deliveries WHERE alert_id IN %(ids)s AND kind = 'fired' AND message_ts != '')
              GROUP BY message_ts HAVING uniqExact(alert_id) > 1"""
    conn.query(sql, ids)
    t = time.perf_counter()
    for _ in range(3):
        conn.query(sql, ids)
    print(f"grouped with bloom index: {(time.perf_counter() - t) / 3 * 1000:.1f} ms")
