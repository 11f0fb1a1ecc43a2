"""How soon a worker that has just been given its partitions decides its first events.

    .venv/bin/python bench/first_release.py [--runs 5] [--messages 200]

Each run starts a fresh embedded broker and one worker on empty topics, waits until the worker
holds its partitions, then publishes the bench fleet's first ``--messages`` messages at once and
times, by polling /healthz every 10 ms, when the aligner first holds some of them (``held``, read
live) or a batch has detected some (``detected``, counted once the batch is written), and when the
first are detected. Until every assigned partition has delivered or been found to have nothing to
read, the aligner holds the watermark (a partition not yet heard from may still hold earlier
events): the second time minus the first is how long that start-up check keeps decisions waiting
(zero when the first batch releases its events). It is what the first alerts of
``bench/latency.py`` wait for when its publishing starts right after an assignment.
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

from bench.run import PARTITIONS, bench_fleet, env  # noqa: E402
from streams.embedded import EmbeddedBroker  # noqa: E402
from streams.kafka import ensure_topics, file_records, publish_records  # noqa: E402
from streams.process import WorkerProcess  # noqa: E402


def one_run(messages: list[tuple[str, str, bytes]], workdir: Path, name: str) -> tuple[float, float]:
    """(seconds from publishing to the first event held or detected, to the first detected)."""
    with EmbeddedBroker(log_path=workdir / f"broker-{name}.log") as broker:
        asyncio.run(ensure_topics(broker.bootstrap, PARTITIONS))
        worker = WorkerProcess(env(broker.bootstrap, workdir / name), workdir / f"worker-{name}.log").start()
        try:
            worker.wait_until(lambda h: h["partitions"] > 0, timeout=120, poll_s=0.01)
            started = time.perf_counter()
            asyncio.run(publish_records(broker.bootstrap, messages))
            first = worker.wait_until(lambda h: h["held"] + h["detected"] > 0, timeout=60, poll_s=0.01)
            first_s = time.perf_counter() - started
            if not first["detected"]:
                worker.wait_until(lambda h: h["detected"] > 0, timeout=60, poll_s=0.01)
            return first_s, time.perf_counter() - started
        finally:
            worker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--messages", type=int, default=200, help="the bench fleet's first N messages")
    parser.add_argument("--fleet", type=Path, help="replay file (default: the bench fleet)")
    args = parser.parse_args()
    messages = []
    for record in file_records(bench_fleet(args.fleet)):
        messages.append(record)
        if len(messages) >= args.messages:
            break
    rows = []
    with tempfile.TemporaryDirectory(prefix="first-release-") as tmp:
        for i in range(args.runs):
            first, detected = one_run(messages, Path(tmp), f"run{i}")
            rows.append((first, detected))
            print(f"run {i + 1}: first held or detected after {first * 1000:6.0f} ms, detected after {detected * 1000:6.0f} ms",
                  flush=True)  # fmt: skip
    waits = [d - f for f, d in rows]
    print(f"held at the start: median {statistics.median(waits) * 1000:.0f} ms, most {max(waits) * 1000:.0f} ms "
          f"over {len(rows)} runs")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
