"""Nothing lost, nothing invented (issue 11): the real worker through crashes, a flaky
Slack, a reset topic, producer duplicates, a read-only store, a future-dated event,
an emptied rules file and a busy machine. Each ends with the same comparison: the
stored alerts equal backtest's, every event is stored once, every post sent once.
The harness is ``tests/reliability.py``; ``docs/reliability.md`` says what each checks.
"""

from __future__ import annotations

import base64
import os
import random
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

import msgspec
import pytest

from detector.simulate import SimConfig
from detector.testing import LocalSlack
from streams.embedded import EmbeddedBroker
from streams.kafka import count_events
from streams.process import StoreServerProcess as ServerProcess
from tests.conftest import ROOT
from tests.reliability import (
    PARTITIONS,
    CpuLoad,
    Fleet,
    Worker,
    chaos,
    compare_alerts,
    expected_counts,
    fleet,
    idle_host,
    publish,
    read_dead_letters,
    read_store,
    reported_alerts,
    resource_times,
    rfc,
    set_immutable,
    sql,
    stored_alerts,
    wait_acknowledged,
    waves_backlog,
    worker_env,
    write_records,
)  # fmt: skip

pytestmark = pytest.mark.integration


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    return rules


CHAOS = SimConfig(hours=10, training_hosts=4, notebooks=3, inference_endpoints=1, buckets=1, vector_dbs=1,
                  cpu_instances=2, seed=3)  # fmt: skip


@pytest.fixture(scope="module")
def chaos_fleet(tmp_path_factory, ruleset) -> Fleet:
    """CHAOS simulated and backtested once per module (in each test process) for both runs (3 s of CPU)."""
    return fleet(tmp_path_factory.mktemp("chaos") / "fleet.jsonl", CHAOS, ruleset)


@pytest.mark.parametrize("evict_s", [None, "600"])
def test_chaos_kills_and_flaky_slack_change_nothing(tmp_path: Path, ruleset, rules_dir: Path, evict_s: str | None,
                                                    chaos_fleet: Fleet):  # fmt: skip
    """SIGKILL at seeded points (one while a Slack post hangs), Slack answering 429, 500 and
    hanging past the client's timeout in seeded windows, a second worker joining and leaving
    (the two share one store through `burnwatch store serve`): same alerts, same events,
    same posts. Again with keys evicted after 10 minutes of quiet (swept each 75 s of event
    time): kills and handovers land between an eviction and the key's next event."""
    server = ServerProcess(f"chdb://{tmp_path / 'ch'}", tmp_path / "store.log").wait_ready()  # shared by two workers
    try:
        with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker, LocalSlack() as slack:
            report = chaos(tmp_path, ruleset, broker.bootstrap, slack, seed=11, cfg=CHAOS, kills=3, speed=900,
                           rules_dir=rules_dir, store_url=server.url, log=print, fl=chaos_fleet,
                           extra_env={"BURNWATCH_EVICT_AFTER_S": evict_s} if evict_s else None)  # fmt: skip
    finally:
        server.stop()
    print(report)
    assert report.kills == 3
    assert report.events_lost == 0 and report.events_doubled == 0, report
    assert report.alerts.ok, report
    assert report.posts.ok, report


def _usage(resource_id: str, t: float, **fields) -> dict:
    event = {"ts": rfc(t), "resource_id": resource_id, "resource_type": "gpu_instance", "account": "ml",
             "region": "us-east-1", "instance_type": "p4d.24xlarge", "state": "running", "interval_s": 60,
             "cost_usd": 0.53, "tags": {"team": "nlp", "project": "llm"}}  # fmt: skip
    return {**event, **fields}


def _gpu(resource_id: str, t: float, **fields) -> dict:
    return {"ts": rfc(t), "resource_id": resource_id, "gpu_index": 0, "util_pct": 1.0, **fields}


def _nested(rid: str, t: float) -> bytes:
    head = b'{"ts": "%s", "resource_id": "%s", "gpu_index": 0, "util_pct": 1, "x": ' % (rfc(t).encode(), rid.encode())
    return head + b"[" * 5000 + b"]" * 5000 + b"}"


def _months(rid: str, t: float) -> bytes:
    first = [datetime(2018 + m // 12, m % 12 + 1, 1, tzinfo=timezone.utc).timestamp() for m in range(101)]
    return _enc([_usage(rid, ts) for ts in first])


def _big(rid: str, t: float) -> bytes:
    return _enc([_gpu(rid, t, util_pct="high")] + [_gpu(rid, t + i, gpu_uuid="x" * 64) for i in range(37_000)])


def _run(rid: str, t: float) -> bytes:
    return _enc({"ts": rfc(t), "run_id": f"run-{rid}", "status": "failed", "resource_ids": [rid], "gpu_count": 70000})


_enc = msgspec.json.encode
POISON = [  # name, topic, value(resource_id, t), words one of which the dead-letter reason must contain
    ("gpu_index 300", "gpu-metrics", lambda r, t: _enc(_gpu(r, t, gpu_index=300)), ("gpu_index",)),
    ("gpu_count 70000", "run-events", _run, ("gpu_count",)),
    ("interval_s 1e308", "resource-usage", lambda r, t: _enc(_usage(r, t, interval_s=1e308)), ("interval_s",)),
    ("egress_bytes 2**64", "resource-usage", lambda r, t: _enc(_usage(r, t, egress_bytes=2**64)), ("egress_bytes",)),
    ("invalid UTF-8 in a string", "resource-usage",
     lambda r, t: _enc(_usage(r, t, region="REGION")).replace(b"REGION", b"us-\xff\xfe-1"), ("region", "utf-8", "UTF-8")),
    ("JSON nested 5000 deep", "gpu-metrics", _nested, ("nest", "deep", "depth", "recursion")),
    ("invalid message over 6 MB", "gpu-metrics", _big, ("util_pct", "size", "large", "bytes")),
    ("cost_usd 1e6 a minute", "resource-usage", lambda r, t: _enc(_usage(r, t, cost_usd=1e6)), ("cost_usd",)),
    ("interval_s 1e9", "resource-usage", lambda r, t: _enc(_usage(r, t, interval_s=1e9)), ("interval_s",)),
    ("egress_bytes 2**64-1", "resource-usage", lambda r, t: _enc(_usage(r, t, egress_bytes=2**64 - 1)), ("egress_bytes",)),
    ("cost_usd 1e308", "resource-usage", lambda r, t: _enc(_usage(r, t, cost_usd=1e308)), ("cost_usd",)),
]  # fmt: skip


def test_poison_messages_are_dead_lettered_and_the_partition_goes_on(tmp_path: Path, ruleset, rules_dir: Path):
    """Each poison case, then an hour of a good idle host on the same key (so the same
    partition) after it: the poison is on dead-letter with a reason naming the field, the
    good events are all stored and their alert fires, /healthz answers, SIGTERM stops it.
    One message of valid events spanning 101 calendar months (more partitions than one
    ClickHouse insert takes by default) is no poison: it is stored, and what follows too."""
    t0 = SimConfig().start
    records: list[tuple[str, str, bytes]] = []
    good: list[tuple[str, str, bytes]] = []
    poison: dict[str, tuple[str, tuple[str, ...], int]] = {}
    for i, (name, topic, make, words) in enumerate(POISON):
        rid, start = f"poison-{i:02d}", t0 + i * 3 * 3600
        value = make(rid, start)
        host = idle_host(rid, start + 60)
        records += [(topic, rid, value)] + host
        good += host
        poison[rid] = (name, words, len(value))
    months = ("resource-usage", "months-ago", _months("months-ago", t0))
    records.insert(len(records) // 2, months)
    clean = [r for r in records if r is months or r in set(good)]  # what the worker should store, in order
    expected = reported_alerts(write_records(tmp_path / "good.jsonl", clean), ruleset)
    assert {a.resource_id for a in expected} >= set(poison)  # every case's good hour makes an alert
    want = expected_counts(clean)

    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        env = worker_env(broker.bootstrap, tmp_path / "data", rules_dir, PARTITIONS)
        publish(broker.bootstrap, records)
        worker = Worker(env, tmp_path / "worker.log").start()
        try:
            try:
                wait_acknowledged(broker.bootstrap, worker, timeout=120,
                                  extra=lambda h: h["dead_letters"] >= len(poison))  # fmt: skip
                stalled = ""
            except (TimeoutError, RuntimeError) as exc:
                stalled = str(exc)
            status, _ = worker.http_health()
        finally:
            code, took = worker.stop_timed(timeout=30)
        dead = {d["key"]: d for d in read_dead_letters(broker.bootstrap, len(poison))}

    rows, alerts, (resources,) = read_store(env, "SELECT resource_id, count() AS n FROM (SELECT resource_id FROM "
                                            "burnwatch.resource_usage UNION ALL SELECT resource_id FROM "
                                            "burnwatch.gpu_metrics) GROUP BY resource_id")  # fmt: skip
    per_resource = {r["resource_id"]: int(r["n"]) for r in resources}
    good_per_resource = {rid: count_events([r for r in good if r[1] == rid]) for rid in poison}
    problems = []
    for rid, (name, words, size) in poison.items():
        record = dead.get(rid)
        if record is None:
            problems.append(f"{name}: not on dead-letter")
        elif not any(w in record["reason"] for w in words):
            problems.append(f"{name}: reason {record['reason'][:200]!r} names none of {words}")
        elif size > 1 << 20 and len(base64.b64decode(record.get("value_base64") or "")) >= size:
            problems.append(f"{name}: dead-letter copy not truncated")
        if per_resource.get(rid, 0) != good_per_resource[rid]:
            problems.append(f"{name}: {per_resource.get(rid, 0)} events of the good {good_per_resource[rid]} after it stored")
    diff = compare_alerts(expected, alerts)
    problems += ["101 months: dead-lettered"] if "months-ago" in dead else []
    problems += [f"101 months: {per_resource.get('months-ago', 0)} of 101 events stored"] \
        if per_resource.get("months-ago", 0) != 101 else []  # fmt: skip
    problems += [f"stalled: {stalled[:1500]}"] if stalled else []
    problems += [f"stored {rows.rows} ({rows.doubled} doubled), want {want}"] if rows.rows != want or rows.doubled else []
    problems += [str(diff)] if not diff.ok else []
    problems += ["/healthz did not answer"] if status is None else []
    problems += [f"SIGTERM: exit {code} after {took:.0f}s"] if code != 0 else []
    assert not problems, "\n".join(problems)


SMALL = SimConfig(hours=6, training_hosts=3, notebooks=2, inference_endpoints=1, buckets=1, vector_dbs=1,
                  cpu_instances=1, seed=5)  # fmt: skip


@pytest.fixture(scope="module")
def _small(tmp_path_factory, ruleset) -> Fleet:
    """SMALL simulated and backtested once per module (per xdist worker): six tests replay it,
    and each used to simulate it and replay it twice (``fleet`` checks its alerts against
    backtest's) for itself, about 1.3 s of CPU each time."""
    return fleet(tmp_path_factory.mktemp("small") / "fleet.jsonl", SMALL, ruleset)


@pytest.fixture
def small_fleet(_small: Fleet) -> Fleet:
    """The shared SMALL fleet, its lists copied so that no test sees what another did to them."""
    return Fleet(_small.path, list(_small.records), list(_small.expected))


def _halves(records: list, at: float = 0.5) -> tuple[list, list]:
    split = int(len(records) * at)
    return records[:split], records[split:]


def _run_until_acknowledged(env: dict[str, str], bootstrap: str, log: Path, timeout: float = 180) -> None:
    worker = Worker(env, log).start()
    try:
        wait_acknowledged(bootstrap, worker, timeout=timeout)
    finally:
        assert worker.stop() == 0, worker.tail()


def test_topic_reset_keeps_every_event(tmp_path: Path, ruleset, rules_dir: Path, small_fleet: Fleet):
    """The broker restarts empty (a recreated topic: offsets start at 0 again); what is
    sent afterwards is stored, all of it, not skipped as already stored."""
    fl = small_fleet
    before, after = _halves(fl.records)
    broker = EmbeddedBroker(log_path=tmp_path / "broker.log").start()
    try:
        env = worker_env(broker.bootstrap, tmp_path / "data", rules_dir, PARTITIONS)
        publish(broker.bootstrap, before)
        _run_until_acknowledged(env, broker.bootstrap, tmp_path / "worker-1.log")
        broker.stop()
        broker.start()  # same port, no topics, no offsets
        publish(broker.bootstrap, after)
        _run_until_acknowledged(env, broker.bootstrap, tmp_path / "worker-2.log")
    finally:
        broker.stop()
    rows, alerts, _ = read_store(env)
    assert rows.total == fl.events and rows.doubled == 0, (rows, fl.events)
    diff = compare_alerts(fl.expected, alerts)
    assert diff.ok, diff


def test_producer_duplicates_are_stored_once(tmp_path: Path, ruleset, rules_dir: Path, small_fleet: Fleet):
    """Messages re-sent by an at-least-once producer (same events, new offsets) are stored
    once: row counts and the cost totals stay those of one copy."""
    fl = small_fleet
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        env = worker_env(broker.bootstrap, tmp_path / "data", rules_dir, PARTITIONS)
        publish(broker.bootstrap, fl.records)
        _run_until_acknowledged(env, broker.bootstrap, tmp_path / "worker-1.log")
        (once,) = sql(env, "SELECT count() AS n, round(sum(usd), 2) AS usd FROM burnwatch.resource_usage")
        resent = random.Random(7).sample(fl.records, len(fl.records) // 3)
        publish(broker.bootstrap, resent)
        _run_until_acknowledged(env, broker.bootstrap, tmp_path / "worker-2.log")
    rows, alerts, ((twice,),) = read_store(env, "SELECT count() AS n, round(sum(usd), 2) AS usd FROM "
                                                "burnwatch.resource_usage")  # fmt: skip
    assert int(once["n"]) == expected_counts(fl.records)["resource_usage"]
    assert (int(twice["n"]), twice["usd"]) == (int(once["n"]), once["usd"])
    assert rows.total == fl.events and rows.doubled == 0, (rows, fl.events)
    diff = compare_alerts(fl.expected, alerts)
    assert diff.ok, diff


def test_an_empty_rules_file_is_refused_and_detection_goes_on(tmp_path: Path, ruleset, rules_dir: Path, small_fleet: Fleet):
    fl = small_fleet
    before, after = _halves(fl.records)
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        env = worker_env(broker.bootstrap, tmp_path / "data", rules_dir, PARTITIONS)
        publish(broker.bootstrap, before)
        worker = Worker(env, tmp_path / "worker.log").start()
        try:
            wait_acknowledged(broker.bootstrap, worker, timeout=180)
            (rules_dir / "rules.yaml").write_text("")
            line = worker.wait_for_log('"rules_re', timeout=60)  # reloaded or refused: the watcher has looked
            publish(broker.bootstrap, after)
            wait_acknowledged(broker.bootstrap, worker, timeout=180)
        finally:
            assert worker.stop() == 0, worker.tail()
    diff = compare_alerts(fl.expected, stored_alerts(env))
    assert '"rules_refused"' in line and '"level": "error"' in line and diff.ok, f"{line}\n{diff}"


def test_one_future_dated_event_loses_no_state(tmp_path: Path, ruleset, rules_dir: Path, small_fleet: Fleet):
    """A replay weeks old with one event dated 20 h ahead of the wall clock (the contract
    accepts up to a day) in its middle: the other resources' alerts equal backtest's
    without that event, and all their events are stored. State is swept (expiry, eviction)
    each time event time moves an eighth of the eviction window, so the second half's
    batches sweep after the future event was detected (asserted: it used to wait for the
    60 s wall-clock timer); a watermark the event had moved would sweep at once."""
    fl = small_fleet
    before, after = _halves(fl.records)
    ahead = time.time() + 20 * 3600
    future = ("resource-usage", "future-host", msgspec.json.encode(
        {"ts": rfc(ahead), "resource_id": "future-host", "resource_type": "cpu_instance", "state": "running",
         "interval_s": 60, "cost_usd": 0.01, "tags": {"team": "a", "project": "b"}}))  # fmt: skip
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        env = worker_env(broker.bootstrap, tmp_path / "data", rules_dir, PARTITIONS)
        publish(broker.bootstrap, before + [future])
        worker = Worker(env, tmp_path / "worker.log").start()
        try:
            wait_acknowledged(broker.bootstrap, worker, timeout=180)
            swept = worker.metric("burnwatch_state_sweeps_total", 'trigger="event_time"')
            publish(broker.bootstrap, after)
            wait_acknowledged(broker.bootstrap, worker, timeout=180)
            swept_after = worker.metric("burnwatch_state_sweeps_total", 'trigger="event_time"')
        finally:
            assert worker.stop() == 0, worker.tail()
    assert swept_after > swept, (swept, swept_after)
    rows, alerts, _ = read_store(env, where="resource_id != 'future-host'")
    assert rows.total == fl.events and rows.doubled == 0, (rows, fl.events)
    got = {k: v for k, v in alerts.items() if v["resource_id"] != "future-host"}
    diff = compare_alerts(fl.expected, got)
    assert diff.ok, diff


@pytest.fixture(scope="module")
def waves(tmp_path_factory, ruleset) -> Fleet:
    """The backlog of waves and backtest's alerts over it, once per module (in each test process) for
    the two tests that catch it up (2 s of CPU)."""
    records = waves_backlog()
    path = write_records(tmp_path_factory.mktemp("waves") / "waves.jsonl", records)
    return Fleet(path, records, reported_alerts(path, ruleset))


def test_catch_up_evicts_by_event_time(tmp_path: Path, ruleset, rules_dir: Path, waves: Fleet):
    """A 12 h backlog of GPU hosts in eight waves (each idle an hour, quiet three, idle an
    hour again), caught up with ``BURNWATCH_EVICT_AFTER_S`` at 20 minutes in small batches:
    keys leave memory as event time passes, not on the 60 s wall-clock timer (the catch-up
    takes seconds), and come back from the store when they speak again. Once acknowledged,
    memory holds only the keys that spoke within the window and the eighth of it between
    two sweeps; the alerts equal backtest's."""
    evict_s, records, expected = 1200.0, waves.records, waves.expected
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        env = worker_env(broker.bootstrap, tmp_path / "data", rules_dir, PARTITIONS, BURNWATCH_EVICT_AFTER_S=str(evict_s),
                         BURNWATCH_BATCH_MAX_MESSAGES="40", BURNWATCH_MAX_HELD_PER_PARTITION="40")  # fmt: skip
        publish(broker.bootstrap, records)
        worker = Worker(env, tmp_path / "worker.log").start()
        try:
            health = wait_acknowledged(broker.bootstrap, worker, timeout=180)
        finally:
            assert worker.stop() == 0, worker.tail()
    last = resource_times(records)
    spoke = {rid for rid, t in last.items() if t >= health["watermark"] - evict_s * 9 / 8}
    problems = [f"{health['keys_held']} keys in memory, {len(spoke)} spoke within the window"] \
        if health["keys_held"] > len(spoke) else []  # fmt: skip
    problems += [f"{health['keys_held']} held + {health['keys_evicted']} evicted, {len(last)} resources"] \
        if health["keys_held"] + health["keys_evicted"] != len(last) else []  # fmt: skip
    problems += ["no key came back from the store during the catch-up"] if not health["read_ahead"] else []
    diff = compare_alerts(expected, stored_alerts(env))
    problems += [str(diff)] if not diff.ok else []
    assert expected and not problems, "\n".join(problems)


def test_catch_up_evicting_by_event_time_survives_kills(tmp_path: Path, ruleset, rules_dir: Path, waves: Fleet):
    """The backlog of waves of the test above, caught up with a 20 min eviction window in small
    batches, the worker SIGKILLed three times at seeded points of its reading once it has
    evicted keys (between an eviction and the write that carries the key's last state, or the
    key's next event): once caught up, every event is stored once and the alerts equal backtest's."""
    evict_s, records, expected = 1200.0, waves.records, waves.expected
    total = count_events(records)
    rng = random.Random(5)
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        env = worker_env(broker.bootstrap, tmp_path / "data", rules_dir, PARTITIONS, BURNWATCH_EVICT_AFTER_S=str(evict_s),
                         BURNWATCH_BATCH_MAX_MESSAGES="40", BURNWATCH_MAX_HELD_PER_PARTITION="40")  # fmt: skip
        publish(broker.bootstrap, records)
        kills = 0
        for generation in range(4):
            worker = Worker(env, tmp_path / f"worker-{generation}.log").start()
            try:
                if generation == 3:
                    wait_acknowledged(broker.bootstrap, worker, timeout=180)
                    break
                read = rng.randrange(total // 20, total // 4)  # events this worker reads before it dies
                worker.wait_until(lambda h, read=read: h["keys_evicted"] > 0 and h["events"] >= read, timeout=180,
                                  poll_s=0.02)  # fmt: skip
                worker.kill()
                kills += 1
            finally:
                if generation == 3:
                    assert worker.stop() == 0, worker.tail()
                else:
                    worker.kill()
    rows, alerts, _ = read_store(env)
    diff = compare_alerts(expected, alerts)
    assert kills == 3 and rows.total == total and rows.doubled == 0, (kills, rows, total)
    assert expected and diff.ok, diff


@pytest.mark.parametrize("then", ["wait", "stop"])
def test_a_read_only_store_loses_nothing(tmp_path: Path, ruleset, rules_dir: Path, small_fleet: Fleet,
                                          then: str):  # fmt: skip
    """The ClickHouse directory made immutable (``chattr +i`` on every file: we run as root, so a
    chmod would not stop the writes) while events flow: /healthz says not ready, or the
    worker exits non-zero; once writable again every event is stored, by the same
    worker or by a restarted one. ``stop``: the worker is stopped (SIGTERM) while its writes
    fail, so what it read and could not store must not be committed (Faust's ``take_events``
    acknowledged a batch as soon as it was handed over, and a restart skipped it)."""
    fl = small_fleet
    before, after = _halves(fl.records)
    chdb_dir = tmp_path / "data" / "clickhouse"
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        env = worker_env(broker.bootstrap, tmp_path / "data", rules_dir, PARTITIONS)
        publish(broker.bootstrap, before)
        worker = Worker(env, tmp_path / "worker-1.log").start()
        try:
            wait_acknowledged(broker.bootstrap, worker, timeout=180)
            set_immutable(chdb_dir, True)
            try:
                publish(broker.bootstrap, after)
                deadline, seen = time.monotonic() + 90, None
                while time.monotonic() < deadline and worker.running:
                    status, body = worker.http_health()
                    if status is not None and (status != 200 or (body or {}).get("status") != "ok"):
                        seen = (status, body)
                        break
                    time.sleep(0.5)
                said = seen if seen is not None else f"exit {worker.returncode}" if not worker.running else None
                stopped = worker.stop() if then == "stop" and worker.running else None
                assert stopped in (0, None), f"SIGTERM while the store is read-only: exit {stopped}\n{worker.tail()}"
            finally:
                set_immutable(chdb_dir, False)
            if stopped == 0:
                worker = Worker(env, tmp_path / "worker-2.log").start()
            elif not worker.running:
                assert worker.returncode not in (0, None), worker.tail()
                worker = Worker(env, tmp_path / "worker-2.log").start()
            wait_acknowledged(broker.bootstrap, worker, timeout=180)
        finally:
            code = worker.stop()
    rows, alerts, _ = read_store(env)
    diff = compare_alerts(fl.expected, alerts)
    problems = ["/healthz said ok all along while the store could not be written"] if said is None else []
    problems += [f"stored {rows}, want {fl.events}"] if rows.total != fl.events or rows.doubled else []
    problems += [f"SIGTERM: exit {code}"] if code != 0 else []
    problems += [str(diff)] if not diff.ok else []
    assert not problems, "\n".join(problems)


def test_backlog_replay_under_cpu_load_equals_backtest(tmp_path: Path, ruleset, rules_dir: Path):
    """One event per message (73k messages), a backlog in 4 partitions, three processes spinning per core
    while the worker catches up: the same alerts as backtest, to the millisecond and cent. Twelve hours of
    a fleet whose seed gives 26 alerts of eight rules (24 hours of seed 9 gave 43 of nine and took twice as
    long; the spinners take most of the machine while they spin, so this test's length is the whole suite's)."""
    cfg = SimConfig(hours=12, training_hosts=6, notebooks=4, inference_endpoints=2, buckets=1, vector_dbs=1,
                    cpu_instances=2, seed=11)  # fmt: skip
    fl = fleet(tmp_path / "fleet.jsonl", cfg, ruleset, single_events=True)
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        env = worker_env(broker.bootstrap, tmp_path / "data", rules_dir, PARTITIONS)
        publish(broker.bootstrap, fl.records)
        with CpuLoad(3 * (os.cpu_count() or 2)):
            _run_until_acknowledged(env, broker.bootstrap, tmp_path / "worker.log", timeout=400)
    rows, alerts, _ = read_store(env)
    assert rows.total == fl.events and rows.doubled == 0, (rows, fl.events)
    diff = compare_alerts(fl.expected, alerts)
    assert diff.ok, diff
