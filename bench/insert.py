"""The worker's event write alone: ``Store.events.insert`` into an embedded chdb store.

    .venv/bin/python bench/insert.py [--file FLEET.jsonl] [--messages 1250]
        [--runs 1] [--profile] [--gil] [--again] [--digest]

Decodes the fleet file up front (as the worker's decoder does, not timed), cuts it into
batches of ``--messages`` consecutive messages (each message's events with its (topic,
partition, offset), as ``streams/pipeline.py: _store_events`` builds its
:class:`~detector.store.EventBatch`), and inserts each batch into a freshly migrated store
(``Store.open("chdb://<tmp>/clickhouse")``, as the worker opens it) with the rules' price
list. Prints events/s of the inserts, and the CPU time they took (less sensitive than the wall
clock to other processes on a shared machine): the writing thread's, and chdb's own threads'.

- ``--profile``: cProfile of the insert loop: where the time goes (columns, ids, the look-up
  of stored ids, chdb's own insert);
- ``--gil``: whether chdb lets go of the GIL while it inserts: a pure-Python spin loop runs in
  another thread, and its rate while the writer thread is inside chdb is compared with its
  rate alone; odd runs put the loop in another process instead (same load, no shared GIL):
  the control;
- ``--again``: insert the whole file a second time into the same store (a re-read after a
  crash): every event is a duplicate, nothing may be written;
- ``--digest``: rows and an order-independent hash of every stored row per table, to show
  that two versions of the code store the same rows.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from statistics import mean
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.run import bench_fleet  # noqa: E402
from detector.events import Event, EventDecoder  # noqa: E402
from detector.replay import read_replay  # noqa: E402
from detector.rules import load_rules  # noqa: E402
from detector.store import EventBatch, Store  # noqa: E402

PARTITIONS = 4
Source = tuple[str, int, int]
Batch = list[tuple[Source, list[Event]]]


def load(path: Path, messages: int) -> tuple[list[Batch], int]:
    """The file's messages decoded, cut into batches; each message keyed to a partition as
    a producer's hash would, with offsets counted per topic-partition."""
    decoder = EventDecoder(clock=lambda: 4e9)
    offsets: dict[tuple[str, int], int] = {}
    batches: list[Batch] = []
    current: Batch = []
    events = 0
    for _, record in read_replay(path):
        partition = zlib.crc32(record.key.encode()) % PARTITIONS
        offset = offsets.get((record.topic, partition), 0)
        offsets[(record.topic, partition)] = offset + 1
        decoded = decoder.decode(record.topic, bytes(record.value))
        current.append(((record.topic, partition, offset), decoded))
        events += len(decoded)
        if len(current) == messages:
            batches.append(current)
            current = []
    if current:
        batches.append(current)
    return batches, events


class EngineClock:
    """CPU time the calling thread spends inside chdb's engine calls (wall time too): the rest
    of the writing thread's CPU time is Python's, holding the GIL."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.wall = 0.0
        self.calls = 0

    def __enter__(self) -> EngineClock:
        from chdb.state import sqlitelike

        self._inner = inner = sqlitelike.Connection.query

        def query(conn: Any, *args: Any, **kwargs: Any) -> Any:
            cpu, wall = time.thread_time(), time.perf_counter()
            try:
                return inner(conn, *args, **kwargs)
            finally:
                self.cpu += time.thread_time() - cpu
                self.wall += time.perf_counter() - wall
                self.calls += 1

        sqlitelike.Connection.query = query  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        from chdb.state import sqlitelike

        sqlitelike.Connection.query = self._inner  # type: ignore[method-assign]


def insert_all(store: Store, batches: list[Batch], pricing) -> int:
    """What the worker's writer thread does per batch, for every batch; returns rows written."""
    written = 0
    for items in batches:
        batch = EventBatch()
        for source, events in items:
            batch.extend(events, source)
        written += store.events.insert(batch, pricing)
    return written


def digest(store: Store) -> dict[str, tuple[int, int]]:
    """Per raw table: (rows, an order-independent hash of all rows' values)."""
    out = {}
    for table in ("gpu_metrics", "resource_usage", "run_events"):
        rows = store.query(f"SELECT count() AS n, sum(cityHash64(formatRowNoNewline('TSV', *))) AS h "
                           f"FROM {store.db}.{table}")[0]  # fmt: skip
        out[table] = (rows["n"], rows["h"] % 2**64)
    return out


class Spinner:
    """A pure-Python loop in its own thread, counting iterations, so that its rate while
    another thread is inside chdb shows whether chdb holds the GIL meanwhile. ``process``:
    the same loop in another process instead (the same load on the cores, no GIL shared),
    the control."""

    def __init__(self, process: bool = False) -> None:
        self._process = process
        if process:
            import multiprocessing

            self._shared = multiprocessing.Value("q", 0, lock=False)
            self._stopped = multiprocessing.Event()
            self._runner: Any = multiprocessing.Process(target=_spin_shared, args=(self._shared, self._stopped))
        else:
            self._count = 0
            self._stopped = threading.Event()  # type: ignore[assignment]
            self._runner = threading.Thread(target=self._spin, daemon=True)

    @property
    def count(self) -> int:
        return self._shared.value if self._process else self._count

    def _spin(self) -> None:
        stop = self._stopped
        while not stop.is_set():
            for _ in range(1000):
                self._count += 1

    def __enter__(self) -> Spinner:
        self._runner.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self._runner.join()


def _spin_shared(shared: Any, stopped: Any) -> None:
    while not stopped.is_set():
        n = 0
        for _ in range(1000):
            n += 1
        shared.value += n


def gil_probe(store: Store, batches: list[Batch], pricing, process: bool = False) -> None:
    """Spin rate alone, then while the writer inserts; the time inside chdb's engine (every
    ``chdb`` query: inserts and look-ups) counted on its own."""
    from chdb.state import sqlitelike

    inner = sqlitelike.Connection.query
    inside = {"s": 0.0, "spins": 0}
    writer: list[threading.Thread] = []

    def timed_query(self, *args, **kwargs):  # chdb's engine call only: no Python work of ours
        if threading.current_thread() not in writer:
            return inner(self, *args, **kwargs)
        with_spins = spinner.count
        started = time.perf_counter()
        try:
            return inner(self, *args, **kwargs)
        finally:
            inside["s"] += time.perf_counter() - started
            inside["spins"] += spinner.count - with_spins

    with Spinner(process) as spinner:
        time.sleep(0.2)
        start_count, started = spinner.count, time.perf_counter()
        time.sleep(2.0)
        alone = (spinner.count - start_count) / (time.perf_counter() - started)
        sqlitelike.Connection.query = timed_query  # type: ignore[method-assign]
        try:
            start_count, started = spinner.count, time.perf_counter()
            events = sum(len(e) for items in batches for _, e in items)
            writer.append(threading.Thread(target=insert_all, args=(store, batches, pricing)))
            writer[0].start()
            writer[0].join()
            elapsed = time.perf_counter() - started
            during = (spinner.count - start_count) / elapsed
        finally:
            sqlitelike.Connection.query = inner  # type: ignore[method-assign]
    in_chdb = inside["spins"] / inside["s"] if inside["s"] else 0.0
    print(f"spin loop in another {'process' if process else 'thread'}, alone: {alone:,.0f} iterations/s")
    print(f"spin loop while the writer thread runs the whole insert path ({elapsed:.2f} s, "
          f"{events / elapsed:,.0f} events/s): {during:,.0f}/s = {during / alone:.0%} of alone")  # fmt: skip
    print(f"spin loop while the writer thread is inside chdb's engine ({inside['s']:.2f} s of it): "
          f"{in_chdb:,.0f}/s = {in_chdb / alone:.0%} of alone")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file", type=Path, help="replay file (default: the bench fleet, bench/out/fleet.jsonl)")
    parser.add_argument("--messages", type=int, default=1250, help="messages per batch (1250: ~10k events)")
    parser.add_argument("--runs", type=int, default=1, help="fresh stores, one after the other")
    parser.add_argument("--limit", type=int, default=0, help="only the first N batches")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--gil", action="store_true")
    parser.add_argument("--again", action="store_true", help="then insert everything again (all duplicates)")
    parser.add_argument("--digest", action="store_true")
    args = parser.parse_args()
    batches, events = load(bench_fleet(args.file), args.messages)
    if args.limit:
        batches = batches[: args.limit]
        events = sum(len(e) for items in batches for _, e in items)
    pricing = load_rules(ROOT / "rules").pricing
    print(f"{events:,} events in {sum(map(len, batches)):,} messages, {len(batches)} batches", flush=True)
    figures = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="burnwatch-insert-") as tmp:
            store = Store.open(f"chdb://{tmp}/clickhouse")
            try:
                if args.gil:
                    gil_probe(store, batches, pricing, process=run % 2 == 1)
                    continue
                profiler = cProfile.Profile() if args.profile else None
                started, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
                if profiler:
                    profiler.enable()
                with EngineClock() as engine:
                    written = insert_all(store, batches, pricing)
                if profiler:
                    profiler.disable()
                elapsed = time.perf_counter() - started
                cpu, own = time.process_time() - cpu, time.thread_time() - own
                figures.append(events / elapsed)
                print(f"run {run}: {written:,} rows in {elapsed:.2f} s: {events / elapsed:,.0f} events/s; "
                      f"CPU {cpu:.2f} s ({events / cpu:,.0f} events per CPU-second) = Python {own - engine.cpu:.2f} s "
                      f"+ chdb {engine.cpu:.2f} s in the writing thread ({engine.calls} calls, {engine.wall:.2f} s "
                      f"wall) + chdb's own threads {cpu - own:.2f} s", flush=True)  # fmt: skip
                if args.again:
                    started = time.perf_counter()
                    again = insert_all(store, batches, pricing)
                    elapsed = time.perf_counter() - started
                    print(f"  again: {again:,} rows written in {elapsed:.2f} s: {events / elapsed:,.0f} events/s")
                if args.digest:
                    for table, (n, h) in digest(store).items():
                        print(f"  {table}: {n:,} rows, digest {h:016x}")
                if profiler:
                    stats = pstats.Stats(profiler)
                    stats.sort_stats("tottime").print_stats(25)
                    stats.sort_stats("cumulative").print_stats(30)
            finally:
                store.close()
    if len(figures) > 1:
        print(f"mean {mean(figures):,.0f} events/s over {len(figures)} runs ({', '.join(f'{f:,.0f}' for f in figures)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
