"""How soon a worker that has just been given its partitions releases its first events to detection.

    .venv/bin/python bench/first_release.py [--runs 5] [--messages 200]
    .venv/bin/python bench/first_release.py --alerts [--messages 2745]

Each run starts a fresh embedded broker and one worker on empty topics, waits until the worker
holds its partitions (/healthz polled every 10 ms), then publishes the bench fleet's first
``--messages`` messages at once.

Until every assigned partition has delivered or been found to have nothing to read, the aligner
holds the watermark (a partition not yet heard from may still hold earlier events); finding a
partition with nothing to read is the release timer's. The fleet's first 200 messages are GPU
samples and run events: the resource-usage partitions have nothing to read. Timed by /healthz:
when the aligner first holds some of the events (``held``, read live) or a batch has detected some
(``detected``, counted once its write is done), and when the first are detected; the difference is
how long the start-up check kept them (zero when the first batch releases its events).

``--alerts``: instead, the first alert's decision and its storing, from the worker's JSON log
(``alert_fired``'s ``decided_at`` and ``timestamp``). The first 2,745 messages end with those that
complete the fleet's first 14 alerts (``idle_gpu``, messages 2,732-2,745); every partition has
messages among them, so no partition waits for the timer there.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.latency import log_decisions  # noqa: E402
from bench.run import PARTITIONS, bench_fleet, env  # noqa: E402
from streams.embedded import EmbeddedBroker  # noqa: E402
from streams.kafka import ensure_topics, file_records, publish_records  # noqa: E402
from streams.process import WorkerProcess  # noqa: E402


def one_run(messages: list[tuple[str, str, bytes]], workdir: Path, name: str, alerts: bool) -> tuple[float, float]:
    """Seconds from publishing to (the first event held or detected, the first detected), or with
    ``alerts`` to (the first alert decided, the first alert stored)."""
    log_path = workdir / f"worker-{name}.log"
    with EmbeddedBroker(log_path=workdir / f"broker-{name}.log") as broker:
        asyncio.run(ensure_topics(broker.bootstrap, PARTITIONS))
        worker = WorkerProcess(env(broker.bootstrap, workdir / name), log_path).start()
        try:
            worker.wait_until(lambda h: h["partitions"] > 0, timeout=120, poll_s=0.01)
            started, clock = time.time(), time.perf_counter()
            asyncio.run(publish_records(broker.bootstrap, messages))
            if alerts:
                worker.wait_until(lambda h: h["alerts_fired"] > 0, timeout=60, poll_s=0.05)
            else:
                first = worker.wait_until(lambda h: h["held"] + h["detected"] > 0, timeout=60, poll_s=0.01)
                first_s = time.perf_counter() - clock
                if not first["detected"]:
                    worker.wait_until(lambda h: h["detected"] > 0, timeout=60, poll_s=0.01)
                return first_s, time.perf_counter() - clock
        finally:
            worker.stop()
    decided, stored = log_decisions(log_path, field="decided_at"), log_decisions(log_path)
    return min(decided.values()) - started, min(stored.values()) - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--messages", type=int, help="the fleet's first N messages (default 200; with --alerts 2745)")
    parser.add_argument("--alerts", action="store_true", help="time the first alert's decision instead")
    parser.add_argument("--fleet", type=Path, help="replay file (default: the bench fleet)")
    args = parser.parse_args()
    n = args.messages or (2745 if args.alerts else 200)
    messages = []
    for record in file_records(bench_fleet(args.fleet)):
        messages.append(record)
        if len(messages) >= n:
            break
    what = ("first alert decided", "stored") if args.alerts else ("first events held or detected", "detected")
    rows = []
    with tempfile.TemporaryDirectory(prefix="first-release-") as tmp:
        for i in range(args.runs):
            rows.append(one_run(messages, Path(tmp), f"run{i}", args.alerts))
            print(f"run {i + 1}: {what[0]} after {rows[-1][0] * 1000:5.0f} ms, {what[1]} after {rows[-1][1] * 1000:5.0f} ms",
                  flush=True)  # fmt: skip
    print(f"{what[0]}: median {statistics.median(r[0] for r in rows) * 1000:.0f} ms; {what[1]}: median "
          f"{statistics.median(r[1] for r in rows) * 1000:.0f} ms; over {len(rows)} runs")  # fmt: skip
    if not args.alerts:
        waits = [d - f for f, d in rows]
        print(f"held at the start: median {statistics.median(waits) * 1000:.0f} ms, most {max(waits) * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
