"""What the worker's per-message parts cost, each alone: decoding, the aligner, event ids.

    .venv/bin/python bench/per_message.py [FILE] [--messages 150000] [--repeat 5]
    PYTHONPATH=<a worktree of an older commit> .venv/bin/python bench/per_message.py ...  # its figures

FILE is a replay file (default: the bench fleet with one event per message,
``bench/out/fleet-single.jsonl``, written from ``bench/out/fleet.jsonl`` when missing); its first ``--messages`` are
decoded once, then each part runs over them ``--repeat`` times and the best is printed, in µs
per message (one event each): the best of several, because on a shared VM the rest only
measures the neighbours. These are parts, not the worker: docs/performance.md ("Where a worker's time goes") says how
little of the end-to-end figure they are.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after PYTHONPATH: an older tree given there is the one measured

from detector.align import EventTimeAligner  # noqa: E402
from detector.events import EventDecoder, GpuMetric  # noqa: E402
from detector.replay import read_replay  # noqa: E402
from detector.runtime import tune_gc  # noqa: E402
from detector.store.batch import event_ids  # noqa: E402

SINGLE = ROOT / "bench/out/fleet-single.jsonl"


def write_single(path: Path) -> None:
    """The bench fleet with each message's array split into one message per event."""
    from bench.run import bench_fleet
    from detector.replay import one_event_per_message, write_replay

    records = ((0, r.topic, r.key, msgspec.json.decode(r.value)) for _, r in read_replay(bench_fleet()))
    partial = path.with_suffix(".partial")
    with open(partial, "wb") as out:
        write_replay(one_event_per_message(records), out)
    partial.rename(path)


def best(run: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` runs, in seconds (a full collection before each)."""
    times = []
    for _ in range(repeat):
        gc.collect()
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", nargs="?", type=Path, default=SINGLE)
    parser.add_argument("--messages", type=int, default=150_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if args.file == SINGLE and not SINGLE.exists():
        write_single(SINGLE)
    tune_gc()  # as the worker does
    decoder = EventDecoder()
    records = [(r.topic, bytes(r.value)) for _, r in itertools.islice(read_replay(args.file), args.messages)]
    decoded = [decoder.decode(topic, value) for topic, value in records]
    n = len(records)
    gpu = [e for events in decoded for e in events if type(e) is GpuMetric]

    def align() -> None:
        aligner: EventTimeAligner[int] = EventTimeAligner(60.0)
        for i, (events, (topic, _)) in enumerate(zip(decoded, records, strict=True)):
            aligner.push((topic, i % 4), events, i)
        aligner.release(everything=True)

    figures = {
        "decode": best(lambda: [decoder.decode(topic, value) for topic, value in records], args.repeat) / n,
        "aligner push + release": best(align, args.repeat) / n,
        "event ids (GPU samples)": best(lambda: event_ids(b"gpu", gpu), args.repeat) / max(1, len(gpu)),
    }
    print(f"{n:,} messages of {args.file} ({len(gpu):,} GPU samples), best of {args.repeat}:")
    for name, seconds in figures.items():
        print(f"  {name:<26} {seconds * 1e6:6.2f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
