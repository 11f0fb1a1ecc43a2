"""Inserts through ``burnwatch store serve`` against the same inserts into chdb in-process.

    .venv/bin/python bench/storeserver.py [--rows 100000] [--runs 3]

Three measures per side: ``client.insert`` of usage-like columns (the wire and the
engine), ``Store.events.insert`` (what the worker calls: the deduplication look-up, then
the insert), and the time of one small query (what a request costs by itself). The server
runs in its own process, as an operator runs it; medians of ``--runs``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from detector.store import EventBatch, Store, connect  # noqa: E402
from streams.children import die_with_parent  # noqa: E402
from streams.embedded import free_port  # noqa: E402
from tests.helpers import T0, usage  # noqa: E402


def measure(store: Store, rows: int, runs: int) -> tuple[float, float, float]:
    """(rows/s of a raw columnar insert, rows/s of Store.events.insert, ms per small query), medians."""
    store.client.command(f"CREATE OR REPLACE TABLE {store.db}.raw (ts DateTime64(3, 'UTC'), resource_id String, "
                         "cost_usd Float64, tags Map(String, String)) ENGINE = MergeTree ORDER BY (resource_id, ts)")  # fmt: skip
    cols = [[int(T0 * 1000) + i * 60_000 for i in range(rows)], [f"host-{i % 500}" for i in range(rows)],
            [i * 0.01 for i in range(rows)], [{"team": "nlp", "owner": "alice"}] * rows]  # fmt: skip
    raw, events = [], []
    for run in range(runs):
        started = time.perf_counter()
        store.client.insert(f"{store.db}.raw", cols, column_names=["ts", "resource_id", "cost_usd", "tags"],
                            column_oriented=True)  # fmt: skip
        raw.append(rows / (time.perf_counter() - started))
        batch = EventBatch()
        batch.extend([usage(T0 + (run * rows + i) * 60, rid=f"host-{i % 500}") for i in range(rows)])
        started = time.perf_counter()
        assert store.events.insert(batch) == rows
        events.append(rows / (time.perf_counter() - started))
    small = []
    for _ in range(runs):
        started = time.perf_counter()
        for _ in range(100):
            store.query("SELECT 1 AS one")
        small.append((time.perf_counter() - started) * 10)
    return median(raw), median(events), median(small)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        local = Store(connect(f"chdb://{tmp}/local"), "bench")
        local.migrate()
        in_process = measure(local, args.rows, args.runs)
        local.close()
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "streams.cli", "store", "serve", "--dsn", f"chdb://{tmp}/served",
                                   "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True, preexec_fn=die_with_parent())  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2).read()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            remote = Store(connect(f"http://127.0.0.1:{port}"), "bench")
            remote.migrate()
            served = measure(remote, args.rows, args.runs)
            remote.close()
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
    print(f"{args.rows:,} rows, median of {args.runs}:")
    print(f"  raw columnar insert:  in-process {in_process[0]:>10,.0f} rows/s   through the server {served[0]:>10,.0f} rows/s")
    print(f"  Store.events.insert:  in-process {in_process[1]:>10,.0f} rows/s   through the server {served[1]:>10,.0f} rows/s")
    print(f"  one small query:      in-process {in_process[2]:>10.2f} ms       through the server {served[2]:>10.2f} ms")


if __name__ == "__main__":
    main()
