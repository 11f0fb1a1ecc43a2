"""Memory and time of a partition assignment's state load: every saved key with its bytes
against only the keys saved within the eviction horizon (the rest read when they speak).

    .venv/bin/python bench/assignment.py [--keys 100000] [--live 1000] [--snapshot-bytes 3500]

In-process, on a fresh embedded ClickHouse in a temporary folder; tracemalloc measures what
the loaded dict holds (and, as the worker loads, the keys' latest times its sweeps go by:
:class:`~detector.store.states.SavedTimes`). Prints one line per way of loading, the time of one
key's read, and of reading a batch's quiet keys together (``States.get_many``, what the worker
does before a batch).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from detector.store import Store, connect  # noqa: E402
from detector.store.states import SavedTimes  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=100_000, help="keys saved two hours ago")
    parser.add_argument("--live", type=int, default=1_000, help="keys saved just now")
    parser.add_argument("--snapshot-bytes", type=int, default=3_500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        store = Store(connect(f"chdb://{folder}/ch"), database="bench")
        store.migrate()
        blob = os.urandom(args.snapshot_bytes)
        old = time.time_ns() - 2 * 3600 * 10**9
        for i in range(0, args.keys, 20_000):
            store.states.save([(f"key-{k:07d}", k % 4, blob, 1.7e9 + k) for k in range(i, min(i + 20_000, args.keys))],
                              version=old)  # fmt: skip
        store.states.save([(f"live-{k:05d}", k % 4, blob, 1.8e9 + k) for k in range(args.live)], version=time.time_ns())
        for horizon, with_times in ((None, False), (3600.0, False), (3600.0, True)):
            tracemalloc.start()
            started = time.monotonic()
            latest: dict[str, float] | None = {} if with_times else None
            loaded = store.states.load([0, 1, 2, 3], horizon, latest)
            times = SavedTimes(latest) if latest is not None else None
            latest = None
            took = time.monotonic() - started
            held, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            with_bytes = sum(data is not None for data in loaded.values())
            print(f"saved within {horizon or 'any'} s with bytes{', and latest times' if times else ''}: "
                  f"{len(loaded):,} keys, {with_bytes:,} with bytes; held {held / 1e6:.1f} MB "
                  f"({held / len(loaded):.0f} B a key), peak {peak / 1e6:.1f} MB, {took:.2f} s")
            del loaded, times
        started, n = time.monotonic(), 200
        for k in range(n):
            store.states.get(f"key-{k * 97 % args.keys:07d}")
        print(f"one quiet key read when it speaks: {(time.monotonic() - started) / n * 1000:.1f} ms")
        for n in (10, 100, 1_000, 10_000):
            keys = [f"key-{k * 97 % args.keys:07d}" for k in range(n)]
            started = time.monotonic()
            found = store.states.get_many(keys)
            took = time.monotonic() - started
            assert len(found) == len(set(keys))
            print(f"{n:,} quiet keys read together before their batch: {took * 1000:.0f} ms "
                  f"({took / n * 1000:.2f} ms a key)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
