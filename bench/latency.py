"""Decision delay at half capacity: publish → the worker has decided the alert.

    .venv/bin/python bench/latency.py [--fleet FLEET.jsonl] [--capacity EVENTS_PER_S]
                                      [--fraction 0.5] [--env BURNWATCH_BATCH_WITHIN_S=0.05 ...]
                                      [--keep DIR] [--fetch-watch]
    .venv/bin/python bench/latency.py --capacity 18622 --hours 4 --speed 48     # a slice, slowly
    .venv/bin/python bench/latency.py --capacity 18622 --simulate 16 --hours 4 --speed 48
    .venv/bin/python bench/latency.py --fetch-probe

1. Capacity: the fleet file replayed into the embedded broker as fast as it goes, then one
   worker consumes it into its embedded ClickHouse (``bench.run.bench_streaming``): events/s
   from its first to its last event. ``--capacity`` skips this and takes the figure given.
2. The same fleet published live, paced by event time so that events arrive at ``--fraction``
   of that capacity, into a fresh broker and a caught-up worker (with the local Slack server).
3. For each alert of a resource (run and project alerts are not timed: no one message completes
   them), the message that completes its threshold is the first of that resource, on the topic
   its detector reads, whose events reach the alert's fire time (as in ``bench_latency``). The
   delay is from the moment the producer has taken that message (``time.time()`` in this
   process, right after ``send`` returns; the producer lingers up to 5 ms) to the
   ``alert_fired`` line of the worker's JSON log (its ``timestamp``, the same wall clock).
   That line is written once the batch's events, alert changes and key states are in
   ClickHouse and its messages are acknowledged, when the change is queued for Slack: before
   the outbox's deliberate grouping wait (``group_wait_s``, 2 s).
4. With ``--fetch-watch``, a bare aiokafka consumer in this process (its own group-less
   assignment) notes when each completing message can first be fetched: the broker's share of
   the delay. Off by default: it reads every message a second time (the bench fleet's 246 MB),
   and on a machine of two cores the CPU it and the broker spend on that is the worker's (the
   decision's p99 1.7-3.1 s with it against 0.7-1.5 s without, 2026-12-02 on the Xeon).

5. /healthz every 0.1 s (events held by the event-time aligner: by Little's law, mean held /
   event rate is the mean wait there) and /metrics at the end (batch and insert histograms).
6. Where the machine's CPU went while the live fleet was published and caught up (``cpu``): the
   CPU seconds of the worker's process (every thread: ClickHouse's too, which the worker's
   per-stage figures leave out), of its child processes (the insert child), of the broker and of
   this process (the publisher), from ``/proc``; and the machine's busy and stolen time (a
   virtual machine's host taking its cores: the same work then takes longer), and the worker's
   CPU by thread name (``worker_threads``: ClickHouse names its threads, ``MergeMutate`` and the
   like; Python's threads carry the process's name). Half of a capacity measured minutes earlier
   is half only if the machine did not slow meanwhile: these say whether the run was past what
   the cores could give.

``--simulate K`` streams a fleet with K times the bench fleet's hosts instead, so that a low
``--speed`` (where the aligner's allowed lateness, 60 s of event time, is long in wall time)
still offers a high event rate. ``--fetch-probe`` only measures publish → fetch of a bare
consumer on the embedded broker by ``fetch_max_wait_ms`` (Faust 0.15 hard-codes 1500; the
worker sets :data:`streams.bulk.FETCH_MAX_WAIT_MS`).

Prints every alert's delay by type, p50 / p99 / max, and writes bench/out/latency-NAME.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402

from bench.run import PARTITIONS, bench_fleet, bench_streaming, cpu_seconds, env, proc_stat  # noqa: E402
from detector.alerts import Alert  # noqa: E402
from detector.backtest import backtest  # noqa: E402
from detector.events import TOPICS  # noqa: E402
from detector.model.forest import ModelSet  # noqa: E402
from detector.rules import load_rules  # noqa: E402
from detector.runtime import tune_gc  # noqa: E402
from detector.testing import LocalSlack  # noqa: E402
from streams.bulk import FETCH_MAX_WAIT_MS  # noqa: E402
from streams.embedded import EmbeddedBroker  # noqa: E402
from streams.kafka import count_events, ensure_topics, file_records, publish_records, value_end_time  # noqa: E402
from streams.process import WorkerProcess  # noqa: E402

GPU_TYPES = {"idle_gpu", "partly_idle_gpu", "unallocated_gpu", "stuck_gpu", "inference_overprovisioned"}


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest rank, as bench/run.py reports it."""
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


def completing_messages(messages: list[tuple[str, str, bytes]], alerts: list[Alert]) -> tuple[dict[int, str], dict[str, str]]:
    """Message index → alert id, for each resource alert; and alert id → its type."""
    by_key: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for i, (topic, key, value) in enumerate(messages):
        by_key[(topic, key)].append((i, value_end_time(value) or 0.0))
    completing: dict[int, str] = {}
    types: dict[str, str] = {}
    for alert in alerts:
        if alert.resource_type in ("run", "project"):
            continue
        wanted = "gpu-metrics" if alert.type in GPU_TYPES else "resource-usage"
        for i, end in by_key.get((wanted, alert.resource_id), []):
            if end >= alert.fired_at:
                completing.setdefault(i, alert.alert_id)
                types[alert.alert_id] = alert.type
                break
    return completing, types


class FetchWatch(threading.Thread):
    """A bare consumer reading every input partition from the start: when each message can
    first be fetched (wall clock), for the messages asked about."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.seen: dict[tuple[str, bytes, int], float] = {}
        self.watch: set[tuple[str, bytes]] = set()
        """(topic, key) of interest: their every message's fetch time is kept, by its per-key ordinal."""
        self._count: dict[tuple[str, bytes], int] = defaultdict(int)
        self._halt = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                    auto_offset_reset="earliest", fetch_max_wait_ms=100)  # fmt: skip
        await consumer.start()
        try:
            consumer.assign([TopicPartition(t, p) for t in TOPICS for p in range(PARTITIONS)])
            self.ready.set()
            while not self._halt.is_set():
                batches = await consumer.getmany(timeout_ms=100)
                now = time.time()
                for tp, records in batches.items():
                    for r in records:
                        k = (tp.topic, r.key)
                        if k in self.watch:
                            self.seen[(tp.topic, r.key, self._count[k])] = now
                            self._count[k] += 1
        finally:
            await consumer.stop()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


class HealthSampler(threading.Thread):
    """/healthz every 0.1 s while the fleet streams in: events held by the aligner over time
    (by Little's law, mean held / event rate is the mean time an event waits in it)."""

    def __init__(self, worker: WorkerProcess) -> None:
        super().__init__(daemon=True)
        self.worker = worker
        self.samples: list[tuple[float, int, int, int]] = []
        """(wall time, events stored, events detected, events held)."""
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.1):
            h = self.worker.health()
            if h is not None:
                self.samples.append((time.time(), h["events"], h["detected"], h["held"]))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


def scrape(port: int) -> dict[str, float]:
    """Sums and counts of the worker's batch and insert histograms, and its CPU seconds by stage
    (``cpu_read_s``, ``cpu_detect_s``, ``cpu_write_s``) (/metrics)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("burnwatch_batch_seconds", "burnwatch_clickhouse_insert_seconds"):
            for suffix in ("_sum", "_count"):
                if line.startswith(name + suffix + " "):
                    out[name + suffix] = float(line.split()[1])
        if line.startswith('burnwatch_cpu_seconds_total{stage="'):
            stage = line.split('"')[1]
            out[f"cpu_{stage}_s"] = float(line.split()[-1])
    return out


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def machine_cpu_s() -> dict[str, float]:
    """The machine's CPU seconds so far, all cores together: busy (not idle nor waiting for I/O) and
    stolen by a virtual machine's host (``/proc/stat``)."""
    user, nice, system, idle, iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    return {"busy": (user + nice + system + irq + softirq) * _TICK_S, "steal": steal * _TICK_S}


class CpuWatch:
    """CPU seconds of the live run's processes and of the machine, between :meth:`start` and :meth:`stop`."""

    def __init__(self, worker_pid: int, broker_pid: int) -> None:
        self.worker_pid, self.broker_pid = worker_pid, broker_pid

    def _threads(self) -> dict[str, float]:
        """The worker's CPU seconds by thread name (ClickHouse names its threads; Python's are the
        process's name): which part of the process the time went to."""
        out: dict[str, float] = defaultdict(float)
        for task in Path(f"/proc/{self.worker_pid}/task").glob("*"):
            fields = proc_stat(task / "stat")
            try:
                name = (task / "comm").read_text().strip()
            except OSError:
                continue  # gone meanwhile
            if fields is not None:
                out[name] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return out

    def _read(self) -> dict[str, float]:
        worker = cpu_seconds(self.worker_pid, children=False)
        return {"worker": worker, "worker_children": cpu_seconds(self.worker_pid) - worker,  # (reaped ones too)
                "broker": cpu_seconds(self.broker_pid, children=False), "publisher": time.process_time(),
                **{f"machine_{k}": v for k, v in machine_cpu_s().items()}}  # fmt: skip

    def start(self) -> None:
        self._wall, self._before, self._threads_before = time.perf_counter(), self._read(), self._threads()

    def stop(self) -> dict[str, Any]:
        """CPU seconds of each over the run, and the machine's busy and stolen shares of its cores."""
        wall, after = time.perf_counter() - self._wall, self._read()
        out: dict[str, Any] = {k: round(after[k] - self._before[k], 2) for k in after}
        threads = self._threads()
        used = {k: round(v - self._threads_before.get(k, 0.0), 2) for k, v in threads.items()}
        out["worker_threads"] = dict(sorted(((k, v) for k, v in used.items() if v >= 0.05), key=lambda kv: -kv[1]))
        cores = os.cpu_count() or 1
        out.update(wall_s=round(wall, 2), cores=cores, machine_busy_share=round(out["machine_busy"] / (wall * cores), 3),
                   machine_steal_share=round(out["machine_steal"] / (wall * cores), 3))  # fmt: skip
        return out


def log_decisions(log_path: Path, event: str = "alert_fired", field: str = "timestamp") -> dict[str, float]:
    """alert id → wall time of its first ``event`` line in the worker's JSON log: the line's
    ``timestamp`` (stored and acknowledged), or its ``decided_at`` (detection decided it)."""
    out: dict[str, float] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        if f'"{event}"' not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == event and "alert_id" in entry and field in entry:
            value = entry[field]
            ts = value if isinstance(value, float) else datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            out.setdefault(entry["alert_id"], ts)
    return out


def live_run(path: Path, workdir: Path, speed: float, extra_env: dict[str, str], name: str,
             fetch_watch: bool = False) -> dict:  # fmt: skip
    ruleset = load_rules(ROOT / "rules")
    messages = list(file_records(path))
    n_events = count_events(messages)
    model_dir = extra_env.get("BURNWATCH_MODEL_DIR")  # the worker scores with it: so does the backtest it is held to
    expected = backtest(path, ruleset, models=ModelSet.load(model_dir) if model_dir else None).alerts
    completing, types = completing_messages(messages, expected)
    ordinal: dict[int, int] = {}  # message index → its ordinal among its (topic, key)'s messages
    counts: dict[tuple[str, str], int] = defaultdict(int)
    wanted_keys = {(messages[i][0], messages[i][1]) for i in completing}
    for i, (topic, key, _) in enumerate(messages):
        if (topic, key) in wanted_keys:
            ordinal[i] = counts[(topic, key)]
            counts[(topic, key)] += 1
    sent_at: dict[str, float] = {}

    def on_sent(sent: int) -> None:  # called right after the producer took message sent - 1
        alert_id = completing.get(sent - 1)
        if alert_id is not None:
            sent_at[alert_id] = time.time()

    # on_sent is called after producer.send() returns, which is a few µs after the hand-over:
    # publish time is taken there (what an exporter would call "sent").
    log_path = workdir / f"worker-{name}.log"
    with EmbeddedBroker(log_path=workdir / f"broker-{name}.log") as broker, LocalSlack() as slack:
        slack_env = {
            "SLACK_BOT_TOKEN": "xoxb-bench",
            "SLACK_CHANNEL": "#bench",
            "SLACK_BASE_URL": slack.api_url,
            "BURNWATCH_SLACK_CHARTS": "false",
        }  # (--env may override them: SLACK_BOT_TOKEN= posts nothing)
        live_env = env(broker.bootstrap, workdir / name, **{**slack_env, **extra_env})
        asyncio.run(ensure_topics(broker.bootstrap, PARTITIONS))
        watch = FetchWatch(broker.bootstrap)
        watch.watch = {(t, k.encode()) for t, k in wanted_keys}
        if fetch_watch:
            watch.start()
            watch.ready.wait(30)
        worker = WorkerProcess(live_env, log_path).start()
        try:
            worker.wait_until(lambda h: h["partitions"] > 0, timeout=120)
            load_before = os.getloadavg()
            sampler = HealthSampler(worker)
            sampler.start()
            cpu_watch = CpuWatch(worker.pid, broker.pid)
            cpu_watch.start()
            started, started_wall, harness_cpu = time.perf_counter(), time.time(), time.process_time()
            asyncio.run(publish_records(broker.bootstrap, messages, speed=speed, on_sent=on_sent))
            publish_s = time.perf_counter() - started
            health = worker.wait_until(lambda h: h["events"] >= n_events, timeout=600, poll_s=0.2)
            caught_up_s = time.perf_counter() - started
            harness_cpu = time.process_time() - harness_cpu
            cpu = cpu_watch.stop()
            sampler.stop()
            metrics = scrape(worker.port)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not set(sent_at) <= set(log_decisions(log_path)):
                time.sleep(0.5)
            load_after = os.getloadavg()
        finally:
            worker.stop()
            if fetch_watch:
                watch.stop()
    decided = log_decisions(log_path)
    detected = log_decisions(log_path, field="decided_at")
    fetchable: dict[str, float] = {}
    for i, alert_id in completing.items():
        topic, key, _ = messages[i]
        t = watch.seen.get((topic, key.encode(), ordinal[i]))
        if t is not None:
            fetchable[alert_id] = t
    fired_ids = set(decided)
    expected_fired = {a.alert_id for a in expected}
    rows: list[dict[str, Any]] = []
    for alert_id, sent in sent_at.items():
        if alert_id in decided:
            rows.append({"alert_id": alert_id, "type": types[alert_id], "sent": sent,
                         "delay_ms": (decided[alert_id] - sent) * 1000,
                         "decided_ms": (detected[alert_id] - sent) * 1000 if alert_id in detected else None,
                         "fetchable_ms": (fetchable[alert_id] - sent) * 1000 if alert_id in fetchable else None})  # fmt: skip
    delays = sorted(r["delay_ms"] for r in rows)
    fetch = sorted(r["fetchable_ms"] for r in rows if r["fetchable_ms"] is not None)
    result = {
        "speed": speed, "events": n_events, "messages": len(messages), "publish_s": publish_s,
        "offered_events_per_s": n_events / publish_s, "caught_up_s": caught_up_s,
        "harness_cpu_s": harness_cpu, "fetch_watch": fetch_watch, "cpu": cpu,
        "alerts_expected": len(expected_fired), "alerts_fired_by_worker": len(fired_ids),
        "alerts_missing": sorted(expected_fired - fired_ids)[:10], "alerts_invented": sorted(fired_ids - expected_fired)[:10],
        "alerts_timed": len(delays), "env": extra_env, "load_before": load_before, "load_after": load_after,
        "worker_events": health["events"], "fetch_max_wait_ms": FETCH_MAX_WAIT_MS,
        "metrics": metrics, "rows": rows, "health_samples": sampler.samples,
    }  # fmt: skip
    if delays:
        result.update(p50_ms=statistics.median(delays), p99_ms=percentile(delays, 0.99), max_ms=delays[-1],
                      min_ms=delays[0])  # fmt: skip
    decisions = sorted(r["decided_ms"] for r in rows if r["decided_ms"] is not None)
    if decisions:
        result.update(decided_p50_ms=statistics.median(decisions), decided_p99_ms=percentile(decisions, 0.99),
                      decided_max_ms=decisions[-1])  # fmt: skip
    samples = [x for x in sampler.samples if x[0] <= started_wall + publish_s]
    if len(samples) > 10:
        rate = (samples[-1][2] - samples[0][2]) / (samples[-1][0] - samples[0][0])
        mean_held = statistics.mean(x[3] for x in samples)
        result.update(aligner_mean_held_events=mean_held, detected_events_per_s=rate,
                      aligner_mean_wait_ms=1000 * mean_held / rate if rate else None,
                      aligner_max_held_events=max(x[3] for x in samples))  # fmt: skip
    if metrics.get("burnwatch_batch_seconds_count"):
        result["batch_mean_ms"] = 1000 * metrics["burnwatch_batch_seconds_sum"] / metrics["burnwatch_batch_seconds_count"]
        result["batches"] = metrics["burnwatch_batch_seconds_count"]
    if metrics.get("burnwatch_clickhouse_insert_seconds_count"):
        result["insert_mean_ms"] = (1000 * metrics["burnwatch_clickhouse_insert_seconds_sum"]
                                    / metrics["burnwatch_clickhouse_insert_seconds_count"])  # fmt: skip
    if fetch:
        result.update(fetch_p50_ms=statistics.median(fetch), fetch_p99_ms=percentile(fetch, 0.99), fetch_max_ms=fetch[-1])
    return result


def span_s(path: Path) -> float:
    ends = [t for t in (value_end_time(v) for _, _, v in file_records(path)) if t is not None]
    return max(ends) - min(ends)


def simulated(k: int, hours: float, out: Path) -> Path:
    """The bench fleet (``bench.run.BIG``) with ``k`` times its hosts, over ``hours``."""
    from bench.run import BIG
    from detector.replay import write_replay
    from detector.simulate import SimConfig, simulate

    cfg = SimConfig(hours=hours, training_hosts=BIG.training_hosts * k, notebooks=BIG.notebooks * k,
                    inference_endpoints=BIG.inference_endpoints * k, seed=BIG.seed)  # fmt: skip
    records, _ = simulate(cfg, load_rules(ROOT / "rules").pricing)
    with open(out, "wb") as f:
        write_replay(records, f)
    return out


def first_hours(path: Path, hours: float, out: Path) -> Path:
    """The messages of ``path`` that end within its first ``hours`` of event time, as a replay file."""
    from tests.reliability import write_records

    records = list(file_records(path))
    start = min(t for t in (value_end_time(v) for _, _, v in records) if t is not None)
    return write_records(out, [r for r in records if (value_end_time(r[2]) or start) < start + hours * 3600])


async def _probe(bootstrap: str, wait_ms: int, gap_s: float, n: int) -> list[float]:
    topic = f"probe-{wait_ms}-{int(gap_s * 1000)}"
    await ensure_topics(bootstrap, PARTITIONS, names=[topic])
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=wait_ms)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks=1)
    await consumer.start()
    await producer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        await consumer.seek_to_end()
        sent: dict[int, float] = {}
        delays: list[float] = []

        async def consume() -> None:
            while len(delays) < n:
                for records in (await consumer.getmany(timeout_ms=100)).values():
                    now = time.time()
                    delays.extend((now - sent[int(r.value)]) * 1000 for r in records)

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.5)
        for i in range(n):
            sent[i] = time.time()
            await producer.send(topic, value=str(i).encode(), key=str(i % 7).encode())
            await asyncio.sleep(gap_s)
        await asyncio.wait_for(task, 60)
        return sorted(delays)
    finally:
        await producer.stop()
        await consumer.stop()


def fetch_probe() -> None:
    """Publish → a bare consumer's getmany on the embedded broker, by the consumer's
    ``fetch_max_wait_ms`` (Faust's is 1500) and the gap between messages."""
    with EmbeddedBroker() as broker:
        for wait_ms in (1500, 500, 100):
            for gap_s in (1.0, 0.1, 0.01):
                d = asyncio.run(_probe(broker.bootstrap, wait_ms, gap_s, 15 if gap_s >= 1 else 60))
                print(
                    f"fetch_max_wait_ms={wait_ms}, a message every {gap_s:g} s: p50 {statistics.median(d):,.0f} ms, "
                    f"p90 {percentile(d, 0.9):,.0f} ms, max {d[-1]:,.0f} ms (load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", type=Path, help="replay file (default: the bench fleet, bench/out/fleet.jsonl)")
    parser.add_argument("--capacity", type=float, help="events/s of one worker; measured when left out")
    parser.add_argument("--fraction", type=float, default=0.5, help="offered load, as a share of capacity")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the live worker")
    parser.add_argument("--speed", type=float, help="event seconds per wall second (instead of --fraction)")
    parser.add_argument("--hours", type=float, help="publish only the fleet's first HOURS of event time")
    parser.add_argument(
        "--simulate",
        type=int,
        metavar="K",
        help="instead of --fleet, simulate the bench fleet with K times its hosts over --hours "
        "(so that a low speed, where the aligner's 60 s lateness is long in wall time, "
        "still offers a high event rate)",
    )
    parser.add_argument(
        "--fetch-probe", action="store_true", help="only measure publish → fetch on the embedded broker by fetch_max_wait_ms"
    )
    parser.add_argument(
        "--fetch-watch", action="store_true",
        help="also time when each completing message can first be fetched, by a bare consumer in this "
        "process (the broker's share of the delay); it reads every message again, taking CPU from the "
        "worker on a machine of few cores",
    )  # fmt: skip
    parser.add_argument("--name", default="live")
    parser.add_argument("--keep", type=Path, help="work here and keep the logs (default: a temporary directory)")
    args = parser.parse_args(argv)
    tune_gc()
    if args.fetch_probe:
        fetch_probe()
        return 0
    args.fleet = bench_fleet(args.fleet)
    extra = dict(item.split("=", 1) for item in args.env)
    out_dir = ROOT / "bench" / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="burnwatch-latency-") as tmp:
        workdir = args.keep or Path(tmp)
        results: dict = {"fleet": str(args.fleet), "load_start": os.getloadavg()}
        if args.capacity is None and args.speed is None:
            capacity = bench_streaming(args.fleet, workdir, "capacity")
            results["capacity"] = {k: v for k, v in capacity.items()}
            args.capacity = capacity["events_per_s"]
            print(f"capacity: {args.capacity:,.0f} events/s (load {os.getloadavg()[0]:.2f})", flush=True)
        fleet = args.fleet
        if args.simulate:
            fleet = simulated(args.simulate, args.hours or 4.0, workdir / "simulated.jsonl")
        elif args.hours:
            fleet = first_hours(args.fleet, args.hours, workdir / "slice.jsonl")
        n_events = count_events(list(file_records(fleet)))
        speed = args.speed or args.fraction * args.capacity * span_s(fleet) / n_events
        print(
            f"live: {n_events:,} events at {speed:,.0f}× event time ({n_events / span_s(fleet) * speed:,.0f} events/s; "
            f"capacity {args.capacity or 0:,.0f} events/s)",
            flush=True,
        )
        live = live_run(fleet, workdir, speed, extra, args.name, fetch_watch=args.fetch_watch)
        results["capacity_events_per_s"] = args.capacity
        results["speed"] = speed
        results["live"] = live
    by_type: dict[str, list[float]] = defaultdict(list)
    for r in live["rows"]:
        by_type[r["type"]].append(r["delay_ms"])
    for t, ds in sorted(by_type.items()):
        ds.sort()
        print(f"  {t}: n={len(ds)} p50 {statistics.median(ds):,.0f} ms, max {ds[-1]:,.0f} ms")
    summary = {k: v for k, v in live.items() if k not in ("rows", "health_samples")}
    print(json.dumps(summary, indent=1, default=str))
    (out_dir / f"latency-{args.name}.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
