"""Harness for the reliability tests and ``bench/chaos.py``: the real worker in a child
process, the embedded broker, chdb and the local Slack server, driven through faults,
and the comparisons that say whether anything was lost, doubled or invented.

Helpers only, no tests. What must hold at the end of every scenario is the same:
the stored alerts equal backtest's (ids, status, event times, dollars to the cent),
every event is stored exactly once, and every incident is posted once with its
resolution in its own thread.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from detector.alerts import Alert, AlertManager
from detector.align import EventTimeAligner
from detector.backtest import backtest
from detector.engine import Engine
from detector.events import TOPICS, EventDecoder, InvalidMessage
from detector.replay import read_replay, write_replay
from detector.rules import RuleSet
from detector.simulate import SimConfig, simulate
from detector.testing import LocalSlack
from detector.units import parse_rfc3339
from streams.children import die_with_parent
from streams.kafka import DEAD_LETTER_TOPIC, count_events, ensure_topics, publish_records, value_end_time
from streams.process import WorkerProcess, worker_env

__all__ = [
    "ALERT_ID", "AlertDiff", "ChaosReport", "CpuLoad", "Fleet", "Pacer", "PostsDiff", "Stored", "Worker", "chaos",
    "compare_alerts", "compare_posts", "expected_counts", "fleet", "idle_host", "offsets", "publish",
    "read_dead_letters", "read_store", "reported_alerts", "resource_times", "rfc", "set_immutable", "single_event_messages",
    "slack_env", "sql", "sql_many", "stored", "stored_alerts", "wait_acknowledged", "worker_env", "write_records",
]  # fmt: skip

PARTITIONS = 4
GROUP = "burnwatch"
"""The worker's consumer group (its app id)."""
ALERT_ID = re.compile(r"alert `([0-9a-f]{16})`")
TABLES = ("resource_usage", "gpu_metrics", "run_events")
CONTENT_KEY = {
    "resource_usage": "resource_id, ts",
    "gpu_metrics": "resource_id, gpu_index, ts",
    "run_events": "run_id, status, ts",
}
"""What makes an event itself in each table: two rows with the same key are one event stored twice."""

Record = tuple[str, str, bytes]


# -- fleets ---------------------------------------------------------------------------


@dataclass
class Fleet:
    path: Path
    """The replay file (what backtest reads)."""
    records: list[Record]
    """``(topic, key, value)`` as published."""
    expected: list[Alert]
    """Backtest's alerts over the file, as last reported (:func:`reported_alerts`)."""

    @property
    def events(self) -> int:
        return count_events(self.records)


def reported_alerts(path: Path, ruleset: RuleSet, lateness_s: float = 60.0) -> list[Alert]:
    """Backtest's alerts as last reported: what the worker stores. An incident still open
    at the end of the data holds the dollars of its last update (backtest's own result
    extends them to the last event), so this is what the stored rows must equal."""
    engine, manager, decoder = Engine(ruleset), AlertManager(ruleset=ruleset), EventDecoder()
    aligner: EventTimeAligner[None] = EventTimeAligner(lateness_s)
    latest: dict[str, Alert] = {}

    def feed(items: list) -> None:
        for alert in manager.handle(engine.process_timed(items)):
            latest[alert.alert_id] = alert

    for n, (_, record) in enumerate(read_replay(path), start=1):  # batched as backtest batches
        try:
            aligner.push(record.topic, decoder.decode(record.topic, bytes(record.value)))
        except InvalidMessage:
            pass
        if n % 1000 == 0:
            feed(aligner.release()[0])
    feed(aligner.release(everything=True)[0])
    return sorted(latest.values(), key=lambda a: (a.fired_at, a.alert_id))


def resource_times(records: Iterable[Record]) -> dict[str, float]:
    """Resource id → the latest event time of its usage and GPU samples in ``records``."""
    out: dict[str, float] = {}
    for _, _, value in records:
        decoded = msgspec.json.decode(value)
        for item in decoded if isinstance(decoded, list) else [decoded]:
            if "resource_id" in item:
                t = parse_rfc3339(item["ts"], "ts")
                out[item["resource_id"]] = max(t, out.get(item["resource_id"], t))
    return out


def write_records(path: Path, records: Iterable[Record]) -> Path:
    """A replay file of ``(topic, key, value bytes)`` records, values kept byte for byte."""
    with open(path, "wb") as out:
        write_replay(((0.0, t, k, msgspec.Raw(v)) for t, k, v in records), out)
    return path


def single_event_messages(records: Iterable[Record]) -> list[Record]:
    """Each event as its own message, as exporters that send one event per message do."""
    out: list[Record] = []
    for topic, key, value in records:
        decoded = msgspec.json.decode(value)
        for item in decoded if isinstance(decoded, list) else [decoded]:
            out.append((topic, key, msgspec.json.encode(item)))
    return out


def fleet(path: Path, cfg: SimConfig, ruleset: RuleSet, single_events: bool = False) -> Fleet:
    """A seeded simulated fleet written to ``path``, with backtest's alerts over it."""
    raw, _ = simulate(cfg, ruleset.pricing)
    records = [(t, k, msgspec.json.encode(v)) for _, t, k, v in raw]
    if single_events:
        records = single_event_messages(records)
    write_records(path, records)
    expected = reported_alerts(path, ruleset)
    assert {a.alert_id for a in expected} == {a.alert_id for a in backtest(path, ruleset).alerts}
    return Fleet(path, records, expected)


# -- Kafka ----------------------------------------------------------------------------


def publish(bootstrap: str, records: Iterable[Record], speed: float | None = None,
            on_sent: Callable[[int], None] | None = None, partitions: int = PARTITIONS) -> int:  # fmt: skip
    async def go() -> int:
        await ensure_topics(bootstrap, partitions)
        return await publish_records(bootstrap, records, speed=speed, on_sent=on_sent)

    return asyncio.run(go())


class Pacer(threading.Thread):
    """Publishes records paced by event time in a background thread; ``sent`` counts them."""

    def __init__(self, bootstrap: str, records: Sequence[Record], speed: float) -> None:
        super().__init__(daemon=True, name="pacer")
        self.bootstrap, self.records, self.speed = bootstrap, records, speed
        self.sent = 0
        self.error: BaseException | None = None
        self.finished = threading.Event()

    def run(self) -> None:
        def on_sent(n: int) -> None:
            self.sent = n

        try:
            self.sent = publish(self.bootstrap, self.records, speed=self.speed, on_sent=on_sent)
        except BaseException as exc:  # reported by wait_sent
            self.error = exc
        finally:
            self.finished.set()

    def wait_sent(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.sent < n and not self.finished.is_set():
            if time.monotonic() > deadline:
                raise TimeoutError(f"publisher at {self.sent} of {n} messages after {timeout}s")
            time.sleep(0.05)
        if self.error is not None:
            raise RuntimeError(f"publisher failed: {self.error!r}") from self.error


def offsets(bootstrap: str, group: str = GROUP, topics: Sequence[str] = TOPICS,
            partitions: int = PARTITIONS) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:  # fmt: skip
    """(end offsets, the group's committed offsets) of the input partitions."""

    async def go() -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
        tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await consumer.start()
        await admin.start()
        try:
            ends = await true_ends(consumer, tps)
            committed = await admin.list_consumer_group_offsets(group, partitions=tps)
            return ends, {tp: (m.offset if m is not None and m.offset >= 0 else 0) for tp, m in committed.items()}
        finally:
            await consumer.stop()
            await admin.close()

    return asyncio.run(go())


async def true_ends(consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    """End offsets as a fetch reports them (its high watermark). The embedded broker's
    ListOffsets answers the last batch's base offset + 1, short of the end by the rest of
    that batch, so a wait on it would call a partition done with messages still unread."""
    listed = await consumer.end_offsets(tps)
    nonempty = [tp for tp in tps if listed[tp] > 0]
    if not nonempty:
        return dict(listed)
    consumer.assign(nonempty)
    for tp in nonempty:
        consumer.seek(tp, listed[tp] - 1)
    for _ in range(50):
        if all(consumer.highwater(tp) is not None for tp in nonempty):
            break
        await consumer.getmany(timeout_ms=100)
    return {tp: max(listed[tp], consumer.highwater(tp) or 0) if tp in nonempty else listed[tp] for tp in tps}


def wait_acknowledged(bootstrap: str, worker: Worker, timeout: float, poll_s: float = 0.25,
                      extra: Callable[[dict[str, Any]], bool] = lambda h: True) -> dict[str, Any]:  # fmt: skip
    """Until the worker's group has committed every input message (stored and detected:
    offsets are acknowledged only then), holds nothing back, has no Slack post pending
    and ``extra(health)`` holds. Raises with what was still missing."""
    deadline = time.monotonic() + timeout
    behind: dict[str, int] = {}
    health: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        if not worker.running:
            raise RuntimeError(f"worker exited ({worker.returncode}):\n{worker.tail()}")
        try:
            ends, committed = offsets(bootstrap)
        except Exception as exc:  # the broker is restarting, the group not formed yet
            behind = {"error": repr(exc)}  # type: ignore[dict-item]
        else:
            behind = {f"{tp.topic}/{tp.partition}": end - committed.get(tp, 0)
                      for tp, end in ends.items() if end > committed.get(tp, 0)}  # fmt: skip
            if not behind:
                health = worker.health()
                if health is not None and health["held"] == 0 and health["slack_pending"] == 0 and extra(health):
                    return health
        time.sleep(poll_s)
    raise TimeoutError(f"not acknowledged within {timeout}s: behind={behind} health={health or worker.health()}\n"
                       f"{worker.tail(15)}")  # fmt: skip


def read_dead_letters(bootstrap: str, expected: int, partitions: int = PARTITIONS, timeout: float = 10.0) -> list[dict]:
    """Every record on the dead-letter topic (waits up to ``timeout`` for ``expected`` of them)."""

    async def go() -> list[dict]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                    max_partition_fetch_bytes=16 << 20, fetch_max_bytes=64 << 20)  # fmt: skip
        await consumer.start()
        try:
            parts = [TopicPartition(DEAD_LETTER_TOPIC, p) for p in range(partitions)]
            consumer.assign(parts)
            await consumer.seek_to_beginning(*parts)
            out: list[dict] = []
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=200)
                out += [json.loads(m.value) for msgs in batch.values() for m in msgs]
                if len(out) >= expected:
                    break
            return out
        finally:
            await consumer.stop()

    return asyncio.run(go())


# -- the worker -----------------------------------------------------------------------


class Worker(WorkerProcess):
    """The real worker in its own process group, plus what chaos needs: SIGKILL and the HTTP status of /healthz."""

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc is not None else None

    def kill(self) -> int | None:
        """SIGKILL the worker's process group (no chance to commit, flush or say goodbye)."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        return self._proc.returncode

    def http_health(self) -> tuple[int | None, dict[str, Any] | None]:
        """(HTTP status, body) of /healthz; (None, None) when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                return exc.code, json.loads(exc.read())
            except ValueError:
                return exc.code, None
        except (urllib.error.URLError, OSError, ValueError):
            return None, None

    def metric(self, name: str, labels: str = "") -> float:
        """A sample of /metrics: the line naming ``name`` (and containing ``labels``, e.g.
        ``'trigger="event_time"'``); 0.0 when there is none yet."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as response:
            text = response.read().decode()
        for line in text.splitlines():
            if line.startswith(name) and labels in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def stop_timed(self, timeout: float = 30.0) -> tuple[int | None, float]:
        """SIGTERM; (exit status, seconds it took). SIGKILL (status -9) if it did not stop in time."""
        started = time.monotonic()
        code = self.stop(timeout=timeout)
        return code, time.monotonic() - started


def slack_env(slack: LocalSlack) -> dict[str, str]:
    return {"SLACK_BOT_TOKEN": "xoxb-local", "SLACK_CHANNEL": "#ml-cost", "SLACK_BASE_URL": slack.api_url,
            "BURNWATCH_SLACK_CHARTS": "false"}  # fmt: skip


# -- the store ------------------------------------------------------------------------


def sql(env: dict[str, str], query: str) -> list[dict]:
    """A query through ``burnwatch sql`` (the worker must be stopped: chdb is one process's)."""
    out = subprocess.run(
        [sys.executable, "-m", "streams.cli", "sql", query, "--format", "json"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"burnwatch sql failed ({out.returncode}): {out.stderr[-2000:]}")
    return [json.loads(line) for line in out.stdout.splitlines()]


_QUERIES = """
import json, sys
from detector.settings import load_settings
from detector.store import Store
settings = load_settings(None)
store = Store.open(settings.dsn, settings.clickhouse_database, create=False)
try:
    for query in json.load(sys.stdin):
        print(json.dumps(store.query(query), default=str))
finally:
    store.close()
"""


def sql_many(env: dict[str, str], *queries: str) -> list[list[dict]]:
    """Each query's rows, as :func:`sql` gives them, all read by one child process: the store
    opened as ``burnwatch sql`` opens it, once (each child costs Python's and chdb's start,
    about 2 s of CPU)."""
    out = subprocess.run([sys.executable, "-c", _QUERIES], input=json.dumps(queries), env={**os.environ, **env},
                         capture_output=True, text=True, timeout=180)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"the store's queries failed ({out.returncode}): {out.stderr[-2000:]}")
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(results) == len(queries), out.stdout[-2000:]
    return results


@dataclass
class Stored:
    rows: dict[str, int]
    """Table → rows."""
    distinct: dict[str, int]
    """Table → distinct events (by content key)."""

    @property
    def total(self) -> int:
        return sum(self.rows.values())

    @property
    def doubled(self) -> int:
        """Rows that repeat an event already stored."""
        return sum(self.rows[t] - self.distinct[t] for t in self.rows)


def _stored_query(where: str) -> str:
    parts = [f"SELECT '{t}' AS t, count() AS n, uniqExact({CONTENT_KEY[t]}) AS d FROM burnwatch.{t} WHERE "
             + (where if t != "run_events" else "1") for t in TABLES]  # fmt: skip
    return " UNION ALL ".join(parts)


def _stored(rows: list[dict]) -> Stored:
    return Stored({r["t"]: int(r["n"]) for r in rows}, {r["t"]: int(r["d"]) for r in rows})


def stored(env: dict[str, str], where: str = "1") -> Stored:
    """Rows and distinct events per event table (``where`` filters, e.g. on resource_id)."""
    return _stored(sql(env, _stored_query(where)))


def expected_counts(records: Iterable[Record]) -> dict[str, int]:
    """Events per table in ``records``."""
    table = {"resource-usage": "resource_usage", "gpu-metrics": "gpu_metrics", "run-events": "run_events"}
    out = dict.fromkeys(TABLES, 0)
    for topic, _, value in records:
        decoded = msgspec.json.decode(value)
        out[table[topic]] += len(decoded) if isinstance(decoded, list) else 1
    return out


_ALERTS_QUERY = ("SELECT alert_id, type, resource_id, status, waste_usd, toUnixTimestamp64Milli(fired_at) AS fired_ms,"
                 " toUnixTimestamp64Milli(resolved_at) AS resolved_ms FROM burnwatch.alerts FINAL")  # fmt: skip


def stored_alerts(env: dict[str, str]) -> dict[str, dict]:
    return {r["alert_id"]: r for r in sql(env, _ALERTS_QUERY)}


def read_store(env: dict[str, str], *queries: str, where: str = "1") -> tuple[Stored, dict[str, dict], list[list[dict]]]:
    """``(stored(env, where), stored_alerts(env), each query's rows)``, read by one child process."""
    counts, alerts, *rest = sql_many(env, _stored_query(where), _ALERTS_QUERY, *queries)
    return _stored(counts), {r["alert_id"]: r for r in alerts}, rest


def alert_history(env: dict[str, str], alert_ids: Iterable[str]) -> dict[str, list[str]]:
    """Every change recorded for each alert, in the order the store took them
    (``alert_changes``: ``recorded_at`` is the store's clock at the insert), so that a stored
    alert unlike backtest's says which write put it there."""
    ids = [i for i in alert_ids if re.fullmatch(r"[0-9a-f]+", i)]
    if not ids:
        return {}
    rows = sql(env, "SELECT alert_id, change, toString(at) AS at, round(waste_usd, 2) AS usd, toString(recorded_at) AS "
                    f"recorded FROM burnwatch.alert_changes WHERE alert_id IN ({', '.join(map(repr, ids))}) "
                    "ORDER BY recorded_at, at")  # fmt: skip
    out: dict[str, list[str]] = {}
    for r in rows:
        out.setdefault(r["alert_id"], []).append(f"{r['change']} at {r['at']} ${r['usd']} (written {r['recorded']})")
    return out


@dataclass
class AlertDiff:
    expected: int
    got: int
    missing: list[str] = field(default_factory=list)
    invented: list[str] = field(default_factory=list)
    different: list[str] = field(default_factory=list)
    """``id: field expected != got`` for alerts both have."""

    @property
    def ok(self) -> bool:
        return not (self.missing or self.invented or self.different)

    @property
    def different_ids(self) -> list[str]:
        return sorted({d.split(":", 1)[0] for d in self.different})

    def __str__(self) -> str:
        return (f"alerts expected {self.expected}, got {self.got}; missing {len(self.missing)} {self.missing[:8]}; "
                f"invented {len(self.invented)} {self.invented[:8]}; different {len(self.different)} "
                f"{self.different[:8]}")  # fmt: skip


def compare_alerts(expected: Iterable[Alert], rows: dict[str, dict], times: bool = True) -> AlertDiff:
    """Backtest's alerts against the stored ones: ids, status, dollars to the cent and
    (with ``times``) fired_at / resolved_at to the millisecond."""
    want = {a.alert_id: a for a in expected}
    diff = AlertDiff(len(want), len(rows))
    diff.missing = sorted(set(want) - set(rows))
    diff.invented = sorted(f"{i} ({rows[i]['type']} {rows[i]['resource_id']})" for i in set(rows) - set(want))
    for alert_id in sorted(set(want) & set(rows)):
        a, r = want[alert_id], rows[alert_id]
        checks = [("status", a.status, r["status"]), ("waste_usd", round(a.waste_usd, 2), round(float(r["waste_usd"]), 2))]
        if times:
            resolved = None if a.resolved_at is None else round(a.resolved_at * 1000)
            got_resolved = None if r["resolved_ms"] is None else int(r["resolved_ms"])
            checks += [("fired_at", round(a.fired_at * 1000), int(r["fired_ms"])), ("resolved_at", resolved, got_resolved)]
        diff.different += [f"{alert_id}: {name} {x!r} != {y!r}" for name, x, y in checks if x != y]
    return diff


# -- Slack ----------------------------------------------------------------------------


@dataclass
class PostsDiff:
    openings_missing: list[str] = field(default_factory=list)
    openings_doubled: list[str] = field(default_factory=list)
    openings_invented: list[str] = field(default_factory=list)
    resolutions_missing: list[str] = field(default_factory=list)
    resolutions_doubled: list[str] = field(default_factory=list)
    resolutions_elsewhere: list[str] = field(default_factory=list)
    """Resolutions not in their incident's thread."""

    @property
    def ok(self) -> bool:
        return not any(getattr(self, f) for f in self.__dataclass_fields__)

    def __str__(self) -> str:
        return "; ".join(f"{name} {len(v)} {v[:6]}" for name, v in vars(self).items() if v) or "posts ok"


def compare_posts(slack: LocalSlack, expected: Iterable[Alert]) -> PostsDiff:
    """One opening per incident (grouped ones may share a message), each resolution once in its thread."""
    want = {a.alert_id: a for a in expected}
    posts = slack.calls("chat.postMessage")
    openings = [(ALERT_ID.findall(p.text_of_blocks()), p.response.get("ts")) for p in posts if "thread_ts" not in p.body]
    opened = Counter(alert_id for ids, _ in openings for alert_id in ids)
    opening_ts: dict[str, set[str]] = {}
    for ids, ts in openings:
        for alert_id in ids:
            opening_ts.setdefault(alert_id, set()).add(ts)
    diff = PostsDiff()
    diff.openings_missing = sorted(set(want) - set(opened))
    diff.openings_doubled = sorted(a for a, n in opened.items() if n > 1)
    diff.openings_invented = sorted(set(opened) - set(want))
    replies = [(ALERT_ID.search(p.text_of_blocks()), p.body.get("thread_ts")) for p in posts if "thread_ts" in p.body]
    resolved = Counter(m.group(1) for m, _ in replies if m)
    should_resolve = {a for a, alert in want.items() if alert.resolved_at is not None}
    diff.resolutions_missing = sorted(should_resolve - set(resolved))
    diff.resolutions_doubled = sorted(a for a, n in resolved.items() if n > 1)
    diff.resolutions_elsewhere = sorted(m.group(1) for m, ts in replies if m and ts not in opening_ts.get(m.group(1), ()))
    return diff


# -- load -----------------------------------------------------------------------------


class CpuLoad:
    """``with CpuLoad(n):`` n processes spinning on a core each, killed on exit."""

    def __init__(self, n: int | None = None) -> None:
        self.n = n or os.cpu_count() or 2
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> CpuLoad:
        for _ in range(self.n):
            self._procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL,
                                               preexec_fn=die_with_parent()))  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self._procs:
            proc.kill()
        for proc in self._procs:
            proc.wait()
        self._procs.clear()


# -- the chaos scenario ---------------------------------------------------------------


FAULT_WINDOW_S = 15.0
"""How long Slack answers 429 or 500 once a window opens."""


@dataclass
class ChaosReport:
    seed: int
    kills: int = 0
    crashes: list[str] = field(default_factory=list)
    """Workers that died on their own (restarted, as an orchestrator would): exit status and last log line."""
    slack_faults: dict[str, int] = field(default_factory=dict)
    """Kind of failure → Slack requests it hit."""
    messages: int = 0
    events_published: int = 0
    events_stored: int = 0
    events_distinct: int = 0
    alerts: AlertDiff | None = None
    history: dict[str, list[str]] = field(default_factory=dict)
    """Each differing alert's changes as recorded (:func:`alert_history`), beside the run's
    log of kills, joins and leaves (its times are UTC wall time, as the store's)."""
    posts: PostsDiff | None = None
    wall_s: float = 0.0

    @property
    def events_lost(self) -> int:
        return self.events_published - self.events_distinct

    @property
    def events_doubled(self) -> int:
        return self.events_stored - self.events_distinct

    @property
    def ok(self) -> bool:
        return (self.events_lost == 0 and self.events_doubled == 0 and self.alerts is not None and self.alerts.ok
                and self.posts is not None and self.posts.ok)  # fmt: skip

    def figures(self) -> dict[str, Any]:
        a, p = self.alerts, self.posts
        return {
            "seed": self.seed, "kills": self.kills, "crashes": len(self.crashes), "slack_faults": self.slack_faults,
            "messages": self.messages, "events_published": self.events_published,
            "events_stored": self.events_stored, "events_lost": self.events_lost,
            "events_doubled": self.events_doubled,
            "alerts_expected": a.expected if a else None, "alerts_got": a.got if a else None,
            "alerts_missing": len(a.missing) if a else None, "alerts_invented": len(a.invented) if a else None,
            "alerts_different": len(a.different) if a else None,
            "openings_missing": len(p.openings_missing) if p else None,
            "openings_doubled": len(p.openings_doubled) if p else None,
            "resolutions_missing": len(p.resolutions_missing) if p else None,
            "resolutions_doubled": len(p.resolutions_doubled) if p else None,
            "wall_s": round(self.wall_s, 1),
        }  # fmt: skip

    def __str__(self) -> str:
        history = "".join(f"\n{alert_id}: " + "; ".join(changes) for alert_id, changes in self.history.items())
        return (f"{json.dumps(self.figures())}\n{self.alerts}{history}\n{self.posts}\n"
                f"crashes: {self.crashes}")  # fmt: skip


def chaos(workdir: Path, ruleset: RuleSet, broker_bootstrap: str, slack: LocalSlack, *, seed: int, cfg: SimConfig,
          kills: int, speed: float, rules_dir: Path, slack_faults: bool = True, timeout: float = 300.0,
          store_url: str | None = None, log: Callable[[str], None] = lambda line: None,
          extra_env: dict[str, str] | None = None, fl: Fleet | None = None) -> ChaosReport:  # fmt: skip
    """A seeded fleet replayed paced while the worker is SIGKILLed ``kills`` times at seeded
    points (one of them while a Slack post hangs) and Slack answers 429, 500 or hangs in
    seeded windows; then everything is compared. The broker and Slack are the caller's.
    With ``store_url`` (a shared store: ``burnwatch store serve``), a second worker joins
    at a seeded point and leaves cleanly at a later one. ``extra_env``: more settings for the workers.
    ``fl``: the fleet of ``cfg``, if the caller has built it already (it is only read)."""
    import random
    from datetime import datetime, timezone

    def note(line: str) -> None:  # stamped as the store stamps what it records (alert_history)
        log(f"{datetime.now(timezone.utc).strftime('%H:%M:%S.%f')[:-3]} {line}")

    started = time.monotonic()
    rng = random.Random(seed)
    report = ChaosReport(seed)
    fl = fl if fl is not None else fleet(workdir / "fleet.jsonl", cfg, ruleset)
    n = len(fl.records)
    report.messages, report.events_published = n, fl.events
    kill_at = sorted(rng.sample(range(n // 10, n * 9 // 10), kills))
    plan: list[tuple[int, str]] = [(i, "kill") for i in kill_at]
    # Slack fails where it has work: a window opens as the messages behind a seeded alert's
    # firing (or resolution) are sent.
    ends = list(itertools.accumulate((value_end_time(v) or 0.0 for _, _, v in fl.records), max))
    moments = [t for a in fl.expected for t in (a.fired_at, a.resolved_at) if t is not None] or [ends[n // 2]]
    picked = rng.sample(moments, 2) if len(moments) > 1 else moments * 2
    faults = [(min(n - 1, bisect.bisect_left(ends, t - 120)), kind) for t, kind in zip(picked, ("429", "500"), strict=True)]
    plan += faults if slack_faults else []
    if kill_at and slack_faults:  # a kill while a post hangs past the client's timeout
        hang = rng.choice(kill_at)
        plan[kill_at.index(hang)] = (hang, "hang+kill")
    if store_url:  # a second worker shares the partitions for a while
        plan += [(rng.randrange(n // 5, n * 2 // 5), "join"), (rng.randrange(n * 3 // 5, n * 4 // 5), "leave")]
    plan.sort()
    shared = {"BURNWATCH_CLICKHOUSE_DSN": store_url} if store_url else {}
    extra = extra_env or {}
    env = worker_env(broker_bootstrap, workdir / "data", rules_dir, PARTITIONS, **slack_env(slack), **shared, **extra)
    helper: Worker | None = None
    generation = [0]

    def start() -> Worker:
        generation[0] += 1
        return Worker(env, workdir / f"worker-{generation[0]}.log").start()

    def supervise(worker: Worker) -> Worker:
        if worker.running:
            return worker
        report.crashes.append(f"exit {worker.returncode}: {worker.tail(1)}")
        note(f"worker died on its own ({worker.returncode}); restarting")
        return start()

    windows = []
    publish(broker_bootstrap, [])  # topics exist before the first worker joins
    worker = start()
    worker.wait_until(lambda h: h["partitions"] > 0, timeout=120)
    pacer = Pacer(broker_bootstrap, fl.records, speed)
    pacer.start()
    try:
        for index, what in plan:
            pacer.wait_sent(index, timeout=timeout)
            worker = supervise(worker)
            if what == "join":
                helper_env = worker_env(broker_bootstrap, workdir / "data-2", rules_dir, PARTITIONS,
                                        **slack_env(slack), **shared, **extra)  # fmt: skip
                helper = Worker(helper_env, workdir / "helper.log").start()
                helper.wait_until(lambda h: h["partitions"] > 0, timeout=120)
                note(f"message {index}: a second worker joined")
                continue
            if what == "leave" and helper is not None:
                code = helper.stop()
                if code != 0:
                    report.crashes.append(f"second worker's stop: exit {code}: {helper.tail(1)}")
                helper = None
                note(f"message {index}: the second worker left")
                continue
            if what in ("429", "500"):
                window = slack.fail_window(0, FAULT_WINDOW_S, status=int(what), retry_after=1 if what == "429" else None)
                windows.append((what, window))
                note(f"message {index}: Slack answers {what} for {FAULT_WINDOW_S:g} s")
                continue
            if what == "hang+kill":
                window = slack.fail_window(0, 3.0, hang_s=12.0)
                windows.append(("hang", window))
                deadline = window.end + 15.0
                while window.hits == 0 and time.monotonic() < deadline:  # a post is hanging, or none came
                    time.sleep(0.05)
            worker.kill()
            report.kills += 1
            note(f"message {index}: SIGKILL ({what}); restarting")
            worker = start()
            worker.wait_until(lambda h: h["partitions"] > 0, timeout=120)
        pacer.wait_sent(n, timeout=timeout)
        for _ in range(4):
            try:
                wait_acknowledged(broker_bootstrap, worker, timeout=timeout)
                break
            except RuntimeError:
                worker = supervise(worker)
        code = worker.stop()
        if code != 0:
            report.crashes.append(f"stop: exit {code}: {worker.tail(1)}")
    finally:
        worker.kill()
        if helper is not None:
            helper.kill()
    for kind, window in windows:
        report.slack_faults[kind] = report.slack_faults.get(kind, 0) + window.hits
    counts, alerts, _ = read_store(env)
    report.events_stored, report.events_distinct = counts.total, sum(counts.distinct.values())
    report.alerts = compare_alerts(fl.expected, alerts)
    report.history = alert_history(env, report.alerts.different_ids)
    report.posts = compare_posts(slack, fl.expected)
    report.wall_s = time.monotonic() - started
    return report


# -- crafted traffic ------------------------------------------------------------------


def rfc(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def idle_host(resource_id: str, start: float, minutes: int = 60, gpus: int = 2, usd_per_hour: float = 32.0,
              stopped_at: float | None = None, scrape_offset: float = 0.0, busy_gpus: int = 0) -> list[Record]:  # fmt: skip
    """A tagged GPU host billed while its GPUs sit idle for ``minutes`` (an idle-gpu episode
    fires after 30), sent as exporters send it: usage every minute and scrapes every 30 s
    (``scrape_offset`` past each half minute), one message per five minutes per topic. With
    ``stopped_at`` (minutes from ``start``, a whole minute), its usage says stopped from then
    on, and its scrapes go on a minute more before they end (an agent stopped with its host). Its
    first ``busy_gpus`` GPUs work (the others partly idle a host: ``partly_idle_gpu``'s)."""
    tags = {"team": "nlp", "owner": "alice", "project": "llm"}
    out: list[Record] = []
    for block in range(0, minutes, 5):
        t0 = start + block * 60
        usage = [
            {"ts": rfc(t0 + m * 60), "resource_id": resource_id, "resource_type": "gpu_instance", "provider": "aws",
             "account": "ml", "region": "us-east-1", "instance_type": "p4d.24xlarge",
             "state": "running" if stopped_at is None or block + m < stopped_at else "stopped",
             "interval_s": 60, "cost_usd": round(usd_per_hour / 60, 6), "tags": tags}
            for m in range(5)
        ]  # fmt: skip
        scrapes = [
            {"ts": rfc(t0 + s * 30 + scrape_offset), "resource_id": resource_id, "gpu_index": g, "model": "A100",
             "util_pct": 90.0 if g < busy_gpus else 0.0, "mem_used_mib": 0.0, "mem_total_mib": 40960.0,
             "power_w": 300.0 if g < busy_gpus else 60.0}
            for s in range(10) for g in range(gpus)
            if stopped_at is None or block * 60 + s * 30 + scrape_offset < stopped_at * 60 + 60
        ]  # fmt: skip
        out += [("gpu-metrics", resource_id, msgspec.json.encode(scrapes))] * bool(scrapes)
        out += [("resource-usage", resource_id, msgspec.json.encode(usage))]
    return out


def waves_backlog(hosts_per_wave: int = 6) -> list[Record]:
    """12 h of GPU hosts in eight waves, each idle an hour, quiet three (nothing sent: gone, not
    stopped), idle an hour again: records in the order of their last event's time, as exporters
    publish them, for catching up with keys evicted and restored."""
    t0 = datetime(2026, 11, 2, tzinfo=timezone.utc).timestamp()
    hosts = [(f"wave{w}-host{h}", t0 + stint * 3600) for w in range(8) for h in range(hosts_per_wave)
             for stint in (w, w + 4)]  # fmt: skip
    return sorted((r for rid, start in hosts for r in idle_host(rid, start)), key=lambda r: value_end_time(r[2]) or 0.0)


def stopping_hosts() -> list[Record]:
    """GPU hosts idle (or one GPU of two working: partly idle) from their start and stopped around
    the half hour an episode needs (29 to 33 minutes in, scrapes at 0 to 25 s past each half minute,
    a minute past the stop), starting a minute apart: the stop and the scrape that completes the
    threshold are events a few seconds apart on two topics, each in a message of five minutes.
    Records in the order of their last event's time, as exporters publish them."""
    t0 = datetime(2026, 11, 2, tzinfo=timezone.utc).timestamp()
    hosts = [(f"stopping-{'partly-' * busy}{stop}m-{offset}s", t0 + (i * 5 + j) * 60, stop, offset, busy)
             for i, stop in enumerate(range(29, 34)) for j, offset in enumerate((0, 5, 15, 25)) for busy in (0, 1)]  # fmt: skip
    records = (r for rid, start, stop, offset, busy in hosts
               for r in idle_host(rid, start, minutes=40, stopped_at=stop, scrape_offset=offset, busy_gpus=busy))  # fmt: skip
    return sorted(records, key=lambda r: value_end_time(r[2]) or 0.0)


def set_immutable(path: Path, on: bool) -> None:
    """``chattr +i`` (or ``-i``) on every file and directory under ``path``: read-only even
    for root, where a chmod is not (links are skipped: chattr cannot flag them)."""
    subprocess.run(["find", str(path), "!", "-type", "l", "-exec", "chattr", "+i" if on else "-i", "{}", "+"],
                   check=True, capture_output=True)  # fmt: skip
