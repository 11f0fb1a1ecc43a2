"""One worker against two in one consumer group, on one shared store, over the bench fleet.

    .venv/bin/python bench/workers.py [--fleet FLEET.jsonl] [--runs 2] [--order 1,2 | 1:thread,1:process] [--partitions 4]

Each run: a fresh embedded broker (4 partitions per input topic, or --partitions) and a fresh
``burnwatch store serve`` (chdb in its own process: the one store that several workers can
share here); the whole fleet is published as fast as the producer goes, then N workers start
together and join one group (a backlog to catch up); events/s is the sum of the workers'
stored events over the time from the first stored event to the last, the group's forming
included (how many assignments each worker went through is reported); "decided" is the same
count over the time until every event is also decided (no worker holds any: several workers
catching up a backlog decide no faster than the slowest stores, streams/progress.py), and "most
held" the most events each worker's aligner held at a poll (up to 20 a second); with the CPU seconds
each worker and the store server used until every event is decided (until the last was stored,
before 2026-12-04's fourth session): on a shared machine two processes get a
larger share of the cores than one, so events per worker CPU second is the steadier figure. Then every
worker drains (nothing held, all acknowledged), stops, and the store is compared with
backtest: every event stored once, and the alerts (ids, status, event times, dollars) equal
backtest's as last reported (``tests.reliability.compare_alerts``, as the end-to-end tests do).

The one-worker side runs the same way (on the store server too), so the two differ only in
the number of workers. The runs alternate 1, 2, 1, 2, ... so drift on a shared machine
falls on both sides.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.catch_up import _status  # noqa: E402
from bench.latency import scrape  # noqa: E402
from bench.run import bench_fleet, cpu_seconds  # noqa: E402
from detector.alerts import Alert  # noqa: E402
from detector.rules import load_rules  # noqa: E402
from detector.runtime import tune_gc  # noqa: E402
from streams.embedded import EmbeddedBroker  # noqa: E402
from streams.kafka import count_events, ensure_topics, file_records, publish_records  # noqa: E402
from streams.process import StoreServerProcess, WorkerProcess, worker_env  # noqa: E402
from tests.reliability import compare_alerts, expected_counts, reported_alerts, stored, stored_alerts  # noqa: E402

PARTITIONS = 4


def tenths(polls: list[tuple[float, int]], n_events: int) -> list[int]:
    """Events/s over each tenth of the backlog, from the polls' (when, events stored): whether the pace
    holds as the store and the keys' state grow, or falls (a look-up or a merge that grows with them)."""
    rates: list[int] = []
    first_stored = next((t for t, n in polls if n > 0), None)
    done_at = [first_stored, *(next((t for t, n in polls if n >= n_events * k / 10), None) for k in range(1, 11))]
    for k in range(10):
        start, end = done_at[k], done_at[k + 1]
        if start is not None and end is not None and end > start:
            rates.append(round(n_events / 10 / (end - start)))
    return rates


def all_stored(env: dict[str, str], want_rows: dict[str, int]) -> bool:
    """Whether the store holds every event (at least as many rows of each table as the fleet has)."""
    rows = stored(env).rows
    return all(rows.get(table, 0) >= n for table, n in want_rows.items())


def run_once(n_workers: int, messages: list, n_events: int, workdir: Path, name: str, expected: list[Alert],
             event_writer: str = "auto", stall_s: float = 0.0, stalls: int = 1,
             partitions: int = PARTITIONS, want_rows: dict[str, int] | None = None) -> dict:  # fmt: skip
    want_rows = want_rows if want_rows is not None else expected_counts(messages)
    server = StoreServerProcess(f"chdb://{workdir / name / 'ch'}", workdir / f"store-{name}.log").wait_ready()
    workers: list[WorkerProcess] = []
    try:
        with EmbeddedBroker(log_path=workdir / f"broker-{name}.log") as broker:
            asyncio.run(ensure_topics(broker.bootstrap, partitions))
            # The backlog is published first: a worker reading while a producer writes 8 hours of
            # event time per second can see one input partition caught up (nothing there yet)
            # while the others run ahead of it, and then receive that partition's older events late.
            started = time.perf_counter()
            asyncio.run(publish_records(broker.bootstrap, messages))
            publish_s = time.perf_counter() - started
            envs = []
            for i in range(n_workers):
                e = worker_env(broker.bootstrap, workdir / name / f"w{i}", ROOT / "rules", partitions,
                               BURNWATCH_CLICKHOUSE_DSN=server.url, BURNWATCH_EVENT_WRITER=event_writer)  # fmt: skip
                envs.append(e)
                workers.append(WorkerProcess(e, workdir / f"worker-{name}-{i}.log").start())
            load_before = os.getloadavg()
            first = None
            per_worker = [0] * n_workers
            most_held = [0] * n_workers
            """The most events each worker held in its aligner at a poll (read, not yet decided)."""
            stored_at: float | None = None
            deadline = time.monotonic() + 900
            stall_end: float | None = None
            """While the last worker is stopped (``stall_s``): when it is continued."""
            next_stall: float | None = None
            """When to stop it again (``stalls`` more than one: stopped ``stall_s``, then running 1 s)."""
            stalled_most_held = 0
            """The most events the first worker held while the last was stopped."""
            peak_held = (0, 0)
            """(the most events the workers held together at a poll, the events stored then): when the peak came."""
            polls: list[tuple[float, int]] = []
            """(when, events stored by every worker) at each poll: the pace through the backlog."""
            while time.monotonic() < deadline:
                polled = workers[:-1] if stall_end is not None else workers  # a stopped worker does not answer
                hs = [w.health() for w in polled] + [None] * (len(workers) - len(polled))
                per_worker = [h["events"] if h else per_worker[i] for i, h in enumerate(hs)]
                most_held = [max(m, h["held"]) if h else m for m, h in zip(most_held, hs, strict=True)]
                total = sum(per_worker)
                held_now = sum(h["held"] for h in hs if h)
                if held_now > peak_held[0]:
                    peak_held = (held_now, total)
                polls.append((time.perf_counter(), total))
                due = total >= n_events // 4 if next_stall is None else time.monotonic() >= next_stall
                if stalls and stall_s and n_workers > 1 and first is not None and stall_end is None and due:
                    os.kill(workers[-1]._proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
                    stall_end, stalls, next_stall = time.monotonic() + stall_s, stalls - 1, None
                    continue
                if stall_end is not None:
                    stalled_most_held = max(stalled_most_held, hs[0]["held"] if hs[0] else 0)
                    if not workers[0].running:
                        raise RuntimeError(f"a worker exited:\n{workers[0].tail()}")
                    if time.monotonic() >= stall_end:
                        os.kill(workers[-1]._proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
                        stall_end, next_stall = None, time.monotonic() + 1.0
                    time.sleep(0.05)
                    continue
                if first is None and total > 0:
                    first = time.perf_counter()
                    cpu_first = [cpu_seconds(w._proc.pid) for w in workers] + [cpu_seconds(server.proc.pid)]  # type: ignore[union-attr]
                    main_first = [cpu_seconds(w._proc.pid, children=False) for w in workers]  # type: ignore[union-attr]
                # A stall past the session timeout has the group read some messages again, which the workers
                # count again: then the store says when every event is in.
                if total >= n_events and stored_at is None and (not stall_s or all_stored(envs[0], want_rows)):
                    stored_at = time.perf_counter()
                if stored_at is not None and all(h is not None and h["held"] == 0 for h in hs) \
                        and sum(h["partitions"] for h in hs if h) == partitions:  # fmt: skip
                    break  # every event stored and decided, and the group settled (a stall past the session moves it)
                for w in workers:
                    if not w.running:
                        raise RuntimeError(f"a worker exited:\n{w.tail()}")
                time.sleep(0.05)
            decided = time.perf_counter() - (first or started)
            elapsed = (stored_at or time.perf_counter()) - (first or started)
            cpu_end = [cpu_seconds(w._proc.pid) for w in workers] + [cpu_seconds(server.proc.pid)]  # type: ignore[union-attr]
            main_end = [cpu_seconds(w._proc.pid, children=False) for w in workers]  # type: ignore[union-attr]
            cpu_main = [round(b - a, 1) for a, b in zip(main_first, main_end, strict=True)]
            cpu = [round(b - a, 1) for a, b in zip(cpu_first, cpu_end, strict=True)]
            load_after = os.getloadavg()
            # Drain: nothing held back, then stop (each commits what it acknowledged).
            for w in workers:
                w.wait_until(lambda h: h["held"] == 0, timeout=120)
            parts = [w.health()["partitions"] for w in workers]  # type: ignore[index]
            peak_rss_mb = [round(_status(w._proc.pid)["VmHWM"] / 1024) for w in workers]  # type: ignore[union-attr]
            stages = [scrape(w.port) for w in workers]
            codes = [w.stop() for w in workers]
            # Assignments each worker went through (a second join while the first reads: a rebalance).
            assignments = [sum('"state_loaded"' in line for line in w.log_path.read_text(errors="replace").splitlines())
                           for w in workers]  # fmt: skip
        env0 = envs[0]
        counts = stored(env0)
        alerts = compare_alerts(expected, stored_alerts(env0))
    finally:
        for w in workers:
            if w.running:
                os.kill(w._proc.pid, signal.SIGCONT)  # type: ignore[union-attr]  # one stopped by --stall, if the run broke off
            w.stop()
        server.stop()
    return {
        "workers": n_workers, "event_writer": event_writer, "partitions_each": parts, "events": n_events, "seconds": elapsed,
        "events_per_s": n_events / elapsed, "decided_s": decided, "decided_events_per_s": n_events / decided,
        "most_held": most_held, "stalled_most_held": stalled_most_held, "events_per_worker": per_worker,
        "publish_s": publish_s, "assignments": assignments, "tenths": tenths(polls, n_events),
        "cpu_s_workers": cpu[:-1], "cpu_s_workers_main": cpu_main,
        "cpu_s_stages": [{k: round(v, 1) for k, v in m.items() if k.startswith("cpu_")} for m in stages],
        "cpu_s_store": cpu[-1], "events_per_worker_cpu_s": n_events / sum(cpu[:-1]),
        "peak_rss_mb": peak_rss_mb, "peak_held_at_stored": peak_held[1] / n_events,
        "exit_codes": codes, "stored_rows": counts.rows, "doubled": counts.doubled,
        "alerts_ok": alerts.ok, "alerts": str(alerts), "load_before": load_before, "load_after": load_after,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", type=Path, help="replay file (default: the bench fleet, bench/out/fleet.jsonl)")
    parser.add_argument("--runs", type=int, default=2, help="runs per side")
    parser.add_argument("--stall", type=float, default=0.0, metavar="S",
                        help="stop the last worker (SIGSTOP) for S seconds once a quarter of the events are stored: "
                             "the others, capped by its progress, must not hold more for it; past the group's "
                             "session timeout (6 s here) the group moves its partitions, and the run then ends once "
                             "the store holds every event and the group has settled (a frozen worker's writes: "
                             "streams/membership.py)")
    parser.add_argument("--stalls", type=int, default=1, metavar="N",
                        help="with --stall: stop it N times, running 1 s between (a worker several times slower)")
    parser.add_argument("--partitions", type=int, default=PARTITIONS,
                        help=f"partitions of each input topic (default {PARTITIONS}; a worker alone holds them all)")
    parser.add_argument("--order", default="1,2",
                        help="worker counts, in the order each round runs them; N:MODE also sets where their "
                             "inserts run (BURNWATCH_EVENT_WRITER: auto, process, thread), e.g. 1:thread,1:process")  # fmt: skip
    args = parser.parse_args(argv)
    tune_gc()
    ruleset = load_rules(ROOT / "rules")
    args.fleet = bench_fleet(args.fleet)
    messages = list(file_records(args.fleet))
    n_events = count_events(messages)
    want_rows = expected_counts(messages)
    expected = reported_alerts(args.fleet, ruleset)
    print(f"fleet: {n_events:,} events in {len(messages):,} messages; backtest: {len(expected)} alerts", flush=True)
    sides = [(int(n), mode or "auto") for n, _, mode in (x.partition(":") for x in args.order.split(","))]
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="burnwatch-workers-") as tmp:
        for run in range(args.runs):
            for n, mode in sides:
                r = run_once(n, messages, n_events, Path(tmp), f"r{run}-w{n}-{mode}", expected, mode, args.stall, args.stalls,
                             args.partitions, want_rows)  # fmt: skip
                r["rows_ok"] = r["stored_rows"] == want_rows and r["doubled"] == 0
                results.append(r)
                stalled = f", the first while the last was stopped {r['stalled_most_held']}" if args.stall and n > 1 else ""
                print(f"{n} worker(s), inserts {mode}: {r['events_per_s']:,.0f} events/s in {r['seconds']:.1f} s "
                      f"(all decided in {r['decided_s']:.1f} s: {r['decided_events_per_s']:,.0f} events/s; most held "
                      f"{r['most_held']}{stalled}; per worker {r['events_per_worker']}, partitions {r['partitions_each']}, "
                      f"assignments {r['assignments']}; events/s by tenth of the backlog {r['tenths']}; "
                      f"peak RSS MB {r['peak_rss_mb']}, the most held when {r['peak_held_at_stored']:.0%} were stored); "
                      f"CPU s: workers {r['cpu_s_workers']} (of which their own process "
                      f"{r['cpu_s_workers_main']}; by stage {r['cpu_s_stages']}), store {r['cpu_s_store']} "
                      f"({r['events_per_worker_cpu_s']:,.0f} events per worker CPU second); "
                      f"rows ok {r['rows_ok']} (doubled {r['doubled']}), alerts ok {r['alerts_ok']} ({r['alerts']}); "
                      f"load {r['load_before'][0]:.2f} → {r['load_after'][0]:.2f}", flush=True)  # fmt: skip
    for n, mode in sorted(set(sides)):
        side = [r for r in results if r["workers"] == n and r["event_writer"] == mode]
        for what, key in (("stored", "events_per_s"), ("decided", "decided_events_per_s")):
            figures = [r[key] for r in side]
            print(f"{n} worker(s), inserts {mode}, {what}: mean {statistics.mean(figures):,.0f} events/s over "
                  f"{len(figures)} runs ({', '.join(f'{f:,.0f}' for f in figures)})")  # fmt: skip
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "workers.json").write_text(json.dumps(results, indent=1, default=str))
    return 0 if all(r["alerts_ok"] and r["rows_ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
