"""What :class:`~detector.store.states.SavedTimes` holds at a million loaded keys that all speak
(each taken from the loaded dict, as ``States.take`` does), before and after a sweep's look-up,
and the time to build it at assignment and of that look-up.

    .venv/bin/python bench/saved_times.py [--keys 1000000]

tracemalloc for the bytes (Python's memory only); the times from a second run without it.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from detector.store.states import SavedTimes  # noqa: E402


def run(n: int, traced: bool) -> tuple[float, float, float, float]:
    """(build s, look-up s, B a key held before the look-up, after it)."""
    if traced:
        tracemalloc.start()
    memory = (lambda: tracemalloc.get_traced_memory()[0]) if traced else (lambda: 0)
    loaded: dict[str, bytes | None] = {json.loads(f'"i-{i:017x}"'): None for i in range(n)}  # strings as decoded
    latest = {key: 1.7e9 + random.random() * 86_400 for key in loaded}
    started = time.perf_counter()
    times = SavedTimes(latest)
    build = time.perf_counter() - started
    latest = {}
    for key in list(loaded):
        del loaded[key]  # every key spoke
    loaded = {}
    gc.collect()
    before = memory()
    started = time.perf_counter()
    assert times.before(0.0, loaded) == []
    look_up = time.perf_counter() - started
    gc.collect()
    after = memory()
    del times
    gc.collect()
    none = memory()
    if traced:
        tracemalloc.stop()
    return build, look_up, (before - none) / n, (after - none) / n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1_000_000)
    args = parser.parse_args()
    _, _, held, left = run(args.keys, traced=True)
    build, look_up, _, _ = run(args.keys, traced=False)
    print(f"{args.keys:,} keys, all taken: SavedTimes holds {held:.1f} B a key before a sweep's look-up, "
          f"{left:.1f} after; build {build:.2f} s, look-up {look_up * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
