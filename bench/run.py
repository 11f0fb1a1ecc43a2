"""``make bench``: throughput and alert latency on real parts. Not part of ``make test``.

1. backtest: events/s of the detection code in-process over a simulated fleet
   of at least one million events, and the same in 2 processes (``--jobs 2``);
2. streaming: the same file replayed into the embedded broker, then one worker
   process consumes it into ClickHouse; events/s from its first to its last
   event (also the replay producer's rate); the same with one event per message,
   next to aiokafka alone reading those messages (the ceiling of any consumer);
3. latency: a live, paced fleet into a caught-up worker; for each alert, wall
   time from publishing the message that completes the idle threshold to the
   local Slack server receiving the post; p50 / p99.

Prints a Markdown table of the figures (docs/performance.md quotes them) and writes bench/out/results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiokafka

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from detector.backtest import backtest  # noqa: E402
from detector.replay import one_event_per_message, write_replay  # noqa: E402
from detector.rules import RuleSet, load_rules  # noqa: E402
from detector.runtime import tune_gc  # noqa: E402
from detector.simulate import SimConfig, simulate  # noqa: E402
from detector.testing import LocalSlack  # noqa: E402
from streams.embedded import EmbeddedBroker  # noqa: E402
from streams.kafka import count_events, ensure_topics, file_records, publish_records, value_end_time  # noqa: E402
from streams.process import StoreServerProcess, WorkerProcess, worker_env  # noqa: E402

PARTITIONS = 4
BIG = SimConfig(hours=24, training_hosts=46, notebooks=24, inference_endpoints=8, seed=21)
# The same fleet with exporters that send every 5 minutes (GPU) and 15 minutes (usage):
# the same events in a fifth of the messages.
BIG_BATCHED = SimConfig(hours=24, training_hosts=46, notebooks=24, inference_endpoints=8, seed=21,
                        flush_s=300, usage_flush_s=900)  # fmt: skip
LIVE = SimConfig(hours=10, training_hosts=16, notebooks=8, inference_endpoints=2, seed=22)
LIVE_SPEED = 1200.0


def bench_fleet(path: Path | None = None) -> Path:
    """``path``, or the bench fleet (:data:`BIG`) written once to bench/out/fleet.jsonl, so that
    every bench script reads the same file without one being given."""
    if path is not None:
        return path
    fleet = ROOT / "bench" / "out" / "fleet.jsonl"
    if not fleet.exists():
        fleet.parent.mkdir(parents=True, exist_ok=True)
        records, _ = simulate(BIG, load_rules(ROOT / "rules").pricing)
        partial = fleet.with_suffix(".partial")
        with open(partial, "wb") as out:
            write_replay(records, out)
        partial.rename(fleet)
    return fleet


def env(bootstrap: str, workdir: Path, **extra: str) -> dict[str, str]:
    return worker_env(bootstrap, workdir, ROOT / "rules", PARTITIONS, **extra)


def bench_backtest(path: Path, ruleset, jobs: int = 1) -> dict:
    started = time.perf_counter()
    result = backtest(path, ruleset, jobs=jobs)
    elapsed = time.perf_counter() - started
    return {"events": result.events, "messages": result.messages, "seconds": elapsed,
            "events_per_s": result.events / elapsed, "alerts": len(result.alerts)}  # fmt: skip


def proc_stat(path: Path) -> list[str] | None:
    """The fields of a ``/proc/<pid>/stat`` or ``/proc/<pid>/task/<tid>/stat`` after the name
    (index 11 and 12: user and system ticks; 13 and 14: those of reaped children), None if gone."""
    try:
        return path.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None  # gone meanwhile


def cpu_seconds(pid: int, children: bool = True) -> float:
    """CPU seconds (user + system, every thread) a process and (``children``) its live children,
    a worker's event writer, have used, from /proc: on a machine shared with other work, events
    per CPU second move far less than events per second."""
    total = 0.0
    for p in [pid, *(_children(pid) if children else ())]:
        fields = proc_stat(Path(f"/proc/{p}/stat"))
        if fields is None:
            continue
        total += int(fields[11]) + int(fields[12])
        if children and p == pid:
            total += int(fields[13]) + int(fields[14])  # children it has reaped (a writer child replaced)
    return total / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def bench_streaming(path: Path, workdir: Path, name: str, store_server: str | None = None, **extra_env: str) -> dict:
    """One worker consuming the file, published first. ``store_server``: into a ``burnwatch
    store serve`` (chdb in its own process, as a ClickHouse server would be), its inserts in its
    writer thread (``thread``) or a child process (``process``); else into its embedded engine."""
    messages = list(file_records(path))
    n_events = count_events(messages)
    with EmbeddedBroker(log_path=workdir / "broker-stream.log") as broker, contextlib.ExitStack() as stack:
        if store_server:
            server = StoreServerProcess(f"chdb://{workdir / name / 'ch'}", workdir / f"store-{name}.log").wait_ready()
            stack.callback(server.stop)
            extra_env |= {"BURNWATCH_CLICKHOUSE_DSN": server.url, "BURNWATCH_EVENT_WRITER": store_server}

        async def publish() -> float:
            await ensure_topics(broker.bootstrap, PARTITIONS)
            started = time.perf_counter()
            await publish_records(broker.bootstrap, messages)
            return time.perf_counter() - started

        publish_s = asyncio.run(publish())
        worker = WorkerProcess(env(broker.bootstrap, workdir / name, **extra_env), workdir / f"worker-{name}.log").start()
        try:
            worker.wait_until(lambda h: h["events"] > 0, timeout=120, poll_s=0.02)
            first, first_cpu = time.perf_counter(), cpu_seconds(worker.pid)
            health = worker.wait_until(lambda h: h["events"] >= n_events, timeout=900, poll_s=0.05)
            elapsed, cpu = time.perf_counter() - first, cpu_seconds(worker.pid) - first_cpu
        finally:
            worker.stop()
    return {"events": n_events, "messages": len(messages), "seconds": elapsed,
            "events_per_s": n_events / elapsed, "messages_per_s": len(messages) / elapsed,
            "cpu_seconds": cpu, "events_per_cpu_s": n_events / cpu if cpu > 0 else 0.0,
            "replay_messages_per_s": len(messages) / publish_s, "replay_events_per_s": n_events / publish_s,
            "alerts_fired": health["alerts_fired"]}  # fmt: skip


def bench_bare_consumer(path: Path, workdir: Path) -> dict:
    """aiokafka alone reading the file's messages from the embedded broker (no group, no
    decoding, nothing done with them): the ceiling for any consumer on this machine."""
    messages = list(file_records(path))
    with EmbeddedBroker(log_path=workdir / "broker-bare.log") as broker:

        async def run() -> float:
            await ensure_topics(broker.bootstrap, PARTITIONS)
            await publish_records(broker.bootstrap, messages)
            consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                                                 max_partition_fetch_bytes=8 << 20)  # fmt: skip
            await consumer.start()
            try:
                tps = [aiokafka.TopicPartition(t, p) for t in {m[0] for m in messages} for p in range(PARTITIONS)]
                consumer.assign(tps)
                await consumer.seek_to_beginning(*tps)
                read, started = 0, time.perf_counter()
                while read < len(messages):
                    read += sum(len(v) for v in (await consumer.getmany(timeout_ms=10_000, max_records=5000)).values())
                return time.perf_counter() - started
            finally:
                await consumer.stop()

        seconds = asyncio.run(run())
    return {"messages": len(messages), "seconds": seconds, "messages_per_s": len(messages) / seconds}


def bench_latency(workdir: Path, ruleset) -> dict:
    records, labels = simulate(LIVE, ruleset.pricing)
    path = workdir / "live.jsonl"
    with open(path, "wb") as out:
        write_replay(records, out)
    messages = list(file_records(path))
    # The message that completes each alert's threshold: the first of that resource, on the
    # topic its detector reads (GPU samples for GPU detectors, usage for the others), whose
    # events reach the alert's fire time. Run alerts (keyed by project) are not timed.
    expected = backtest(path, ruleset).alerts
    completing: dict[int, str] = {}
    gpu_types = {"idle_gpu", "partly_idle_gpu", "unallocated_gpu", "stuck_gpu", "inference_overprovisioned"}
    for alert in expected:
        if alert.resource_type in ("run", "project"):
            continue
        wanted = "gpu-metrics" if alert.type in gpu_types else "resource-usage"
        for i, (topic, key, value) in enumerate(messages):
            if topic == wanted and key == alert.resource_id and (value_end_time(value) or 0) >= alert.fired_at:
                completing[i] = alert.alert_id
                break
    sent_at: dict[str, float] = {}

    def on_sent(index: int) -> None:
        alert_id = completing.get(index - 1)
        if alert_id is not None:
            sent_at[alert_id] = time.monotonic()

    with EmbeddedBroker(log_path=workdir / "broker-live.log") as broker, LocalSlack() as slack:
        live_env = env(broker.bootstrap, workdir / "live", SLACK_BOT_TOKEN="xoxb-bench",
                       SLACK_CHANNEL="#bench", SLACK_BASE_URL=slack.api_url)  # fmt: skip
        asyncio.run(ensure_topics(broker.bootstrap, PARTITIONS))
        worker = WorkerProcess(live_env, workdir / "worker-live.log").start()
        try:
            worker.wait_until(lambda h: h["partitions"] > 0, timeout=120)
            asyncio.run(publish_records(broker.bootstrap, messages, speed=LIVE_SPEED, on_sent=on_sent))
            pattern = re.compile(r"alert `([0-9a-f]{16})`")

            def opened(reqs: list) -> set[str]:  # a grouped message opens several alerts
                return {m for r in reqs if "thread_ts" not in r.body for m in pattern.findall(r.text_of_blocks())}

            slack.wait_for(lambda reqs: len(opened(reqs)) >= len(expected), timeout=60)
        finally:
            worker.stop()
    received = {}
    for request in slack.calls("chat.postMessage"):
        if "thread_ts" not in request.body:
            for alert_id in pattern.findall(request.text_of_blocks()):
                received.setdefault(alert_id, request.received_at)
    delays = sorted((received[a] - sent_at[a]) * 1000 for a in sent_at if a in received)
    if not delays:
        return {"alerts": 0}
    p99 = delays[min(len(delays) - 1, round(0.99 * (len(delays) - 1)))]
    return {"alerts": len(delays), "p50_ms": statistics.median(delays), "p99_ms": p99, "max_ms": delays[-1],
            "speed": LIVE_SPEED}  # fmt: skip


def main() -> int:
    # No options: parsed anyway, so that ``--help`` (or a typo) says so instead of running the whole bench.
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    tune_gc()  # as `burnwatch backtest` and `burnwatch worker` do
    ruleset = load_rules(ROOT / "rules")
    out_dir = ROOT / "bench" / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="burnwatch-bench-") as tmp:
        workdir = Path(tmp)
        records, labels = simulate(BIG, ruleset.pricing)
        path = workdir / "fleet.jsonl"
        with open(path, "wb") as out:
            write_replay(records, out)
        print(f"fleet: {path.stat().st_size / 1e6:.0f} MB replay file", flush=True)
        results = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"}
        results["backtest"] = bench_backtest(path, ruleset)
        print("backtest", results["backtest"], flush=True)
        results["backtest_jobs"] = bench_backtest(path, ruleset, jobs=2)
        print("backtest --jobs 2", results["backtest_jobs"], flush=True)
        idle_only = RuleSet(tuple(r for r in ruleset.rules if r.detector.type == "idle_gpu"), ruleset.pricing)
        results["backtest_idle_only"] = bench_backtest(path, idle_only)
        print("backtest, idle-gpu rule only", results["backtest_idle_only"], flush=True)
        results["streaming"] = bench_streaming(path, workdir, "stream")
        print("streaming", results["streaming"], flush=True)
        results["streaming_thread"] = bench_streaming(path, workdir, "stream-thread", BURNWATCH_EVENT_WRITER="thread")
        print("streaming, the embedded engine's inserts in the writer thread", results["streaming_thread"], flush=True)
        for writer in ("thread", "process"):  # a ClickHouse server's setting: inserts in the thread or a child
            results[f"streaming_server_{writer}"] = bench_streaming(path, workdir, f"stream-server-{writer}", writer)
            print(f"streaming to a store server, inserts in a {writer}", results[f"streaming_server_{writer}"], flush=True)
        single_path = workdir / "fleet-single.jsonl"
        with open(single_path, "wb") as out:  # the same fleet again (the first write consumed it)
            write_replay(one_event_per_message(simulate(BIG, ruleset.pricing)[0]), out)
        results["streaming_single"] = bench_streaming(single_path, workdir, "stream-single")
        print("streaming, one event per message", results["streaming_single"], flush=True)
        results["bare_consumer"] = bench_bare_consumer(single_path, workdir)
        print("aiokafka alone, one event per message", results["bare_consumer"], flush=True)
        records, _ = simulate(BIG_BATCHED, ruleset.pricing)
        batched_path = workdir / "fleet-batched.jsonl"
        with open(batched_path, "wb") as out:
            write_replay(records, out)
        results["streaming_batched"] = bench_streaming(batched_path, workdir, "stream-batched")
        print("streaming, batched exporters", results["streaming_batched"], flush=True)
        results["latency"] = bench_latency(workdir, ruleset)
        print("latency", results["latency"], flush=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2))
    b, s, sb, lat = results["backtest"], results["streaming"], results["streaming_batched"], results["latency"]
    ss, bare = results["streaming_single"], results["bare_consumer"]
    print()
    print("| measure | figure |\n|---|---|")
    rows = [
        ("fleet", f"{b['events']:,} events in {b['messages']:,} messages ({b['events'] / b['messages']:.1f} events/message)"),
        (f"backtest, the {len(ruleset.rules)} shipped rules", f"{b['events_per_s']:,.0f} events/s"),
        ("the same in 2 processes (`backtest --jobs 2`)", f"{results['backtest_jobs']['events_per_s']:,.0f} events/s, "
         f"{results['backtest_jobs']['alerts']} alerts"),
        ("backtest, the idle-gpu rule alone", f"{results['backtest_idle_only']['events_per_s']:,.0f} events/s"),
        ("replay (aiokafka producer)",
         f"{s['replay_messages_per_s']:,.0f} messages/s, {s['replay_events_per_s']:,.0f} events/s"),
        ("streaming, one worker, into ClickHouse (embedded; inserts in a child process where two CPUs are usable)",
         f"{s['events_per_s']:,.0f} events/s ({s['messages_per_s']:,.0f} messages/s)"),
        ("same, the inserts in the worker's writer thread (`BURNWATCH_EVENT_WRITER=thread`)",
         f"{results['streaming_thread']['events_per_s']:,.0f} events/s, "
         f"{results['streaming_thread']['cpu_seconds']:.1f} worker CPU s against {s['cpu_seconds']:.1f}"),
        ("same, one event per message", f"{ss['events_per_s']:,.0f} events/s "
         f"({100 * ss['messages_per_s'] / bare['messages_per_s']:.0f} % of aiokafka alone reading the same messages, "
         f"{bare['messages_per_s']:,.0f} messages/s)"),
        *((f"same, into a store server (`burnwatch store serve`), inserts in the worker's {w}",
           f"{results[f'streaming_server_{w}']['events_per_s']:,.0f} events/s, "
           f"{results[f'streaming_server_{w}']['cpu_seconds']:.1f} worker CPU s") for w in ("thread", "process")),
        (f"same, exporters batching 5 min ({sb['events'] / sb['messages']:.0f} events/message)",
         f"{sb['events_per_s']:,.0f} events/s ({sb['messages_per_s']:,.0f} messages/s)"),
    ]  # fmt: skip
    if lat.get("alerts"):
        rows.append((f"publish → Slack post, {lat['alerts']} alerts at {lat['speed']:g}x",
                     f"p50 {lat['p50_ms']:,.0f} ms, p99 {lat['p99_ms']:,.0f} ms"))  # fmt: skip
    for name, figure in rows:
        print(f"| {name} | {figure} |")
    print(f"| machine | {results['machine']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
