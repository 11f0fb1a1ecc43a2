"""``backtest --jobs N`` against one process, and what sharding could give with nothing shared.

    .venv/bin/python bench/backtest_jobs.py [--file FLEET.jsonl] [--jobs 2] [--runs 3]
    .venv/bin/python bench/backtest_jobs.py --probe [--file FLEET.jsonl] [--jobs 2] [--runs 3]

By default, ``backtest(FILE, jobs=1)`` and ``backtest(FILE, jobs=N)`` alternate ``--runs`` times
in this interpreter: events/s by the wall clock, CPU seconds of every process, and the alerts
(which must be the same).

With ``--probe``, the upper bound instead: the fleet file is split by each message's Kafka key
(``zlib.crc32(key) % N``: what a topic's partitioner does, so a resource's messages stay together)
into N files; then one ``backtest`` runs over the whole file, and N at once, one process a shard,
alternating ``--runs`` times. Prints events/s by detection time (the slowest shard's), the CPU
seconds, and the alerts by type against the whole file's. The shards share nothing: a run's hosts
priced by another shard's usage events are not looked up there, so run alerts go missing. This
is what key-sharding is worth before paying for what it must share (docs/performance-log.md, "Backtest in several processes").
"""

from __future__ import annotations

import argparse
import collections
import json
import resource
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_RUN = """
import collections, json, sys, time
sys.path.insert(0, sys.argv[2])
from detector.backtest import backtest
from detector.rules import load_rules
from detector.runtime import tune_gc
tune_gc()
rules = load_rules(sys.argv[2] + "/rules")
wall, cpu = time.perf_counter(), time.process_time()
result = backtest(sys.argv[1], rules)
print(json.dumps({"events": result.events, "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                  "alerts": collections.Counter(a.type for a in result.alerts)}))
"""


def split(path: Path, shards: int, into: Path) -> list[Path]:
    """The file's lines, each to the shard of its message key (``"key":"..."``, as replay files write it)."""
    paths = [into / f"shard-{i}.jsonl" for i in range(shards)]
    outs = [open(p, "wb") for p in paths]  # noqa: SIM115 - closed below
    try:
        with open(path, "rb") as lines:
            for line in lines:
                start = line.index(b'"key":"') + 7
                outs[zlib.crc32(line[start : line.index(b'"', start)]) % shards].write(line)
    finally:
        for out in outs:
            out.close()
    return paths


def run(paths: list[Path]) -> dict:
    """A backtest per file, all at once; their figures together."""
    procs = [subprocess.Popen([sys.executable, "-c", _RUN, str(p), str(ROOT)], stdout=subprocess.PIPE, text=True)
             for p in paths]  # fmt: skip
    results = [json.loads(p.communicate()[0]) for p in procs]
    alerts: collections.Counter[str] = collections.Counter()
    for r in results:
        alerts.update(r["alerts"])
    events = sum(r["events"] for r in results)
    slowest = max(r["wall_s"] for r in results)
    return {"events": events, "events_per_s": events / slowest, "cpu_s": sum(r["cpu_s"] for r in results),
            "alerts": alerts}  # fmt: skip


def alternate(path: Path, jobs: int, runs: int) -> int:
    """One process and ``jobs`` processes, in turn."""
    from detector.backtest import backtest
    from detector.rules import load_rules
    from detector.runtime import tune_gc

    tune_gc()
    rules = load_rules(ROOT / "rules")

    def cpu() -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    alerts = set()
    for n in range(runs):
        for j in (1, jobs):
            wall, used = time.perf_counter(), cpu()
            result = backtest(path, rules, jobs=j)
            wall, used = time.perf_counter() - wall, cpu() - used
            alerts.add(msgspec.json.encode([a.to_json() for a in result.alerts]))
            print(f"run {n}, {j} process{'es' if j > 1 else ''}: {result.events / wall:,.0f} events/s ({wall:.2f} s), "
                  f"{used:.2f} CPU s, {len(result.alerts)} alerts", flush=True)
    print("alerts the same in every run" if len(alerts) == 1 else "ALERTS DIFFER between runs")
    return 0 if len(alerts) == 1 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file", type=Path, default=ROOT / "bench/out/fleet.jsonl")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--probe", action="store_true", help="split the file and share nothing: the upper bound")
    args = parser.parse_args()
    if not args.probe:
        return alternate(args.file, args.jobs, args.runs)
    with tempfile.TemporaryDirectory(prefix="burnwatch-shards-") as tmp:
        paths = split(args.file, args.jobs, Path(tmp))
        for n in range(args.runs):
            whole, sharded = run([args.file]), run(paths)
            print(f"run {n}: one process {whole['events_per_s']:,.0f} events/s ({whole['cpu_s']:.1f} CPU s); "
                  f"{args.jobs} shards {sharded['events_per_s']:,.0f} events/s ({sharded['cpu_s']:.1f} CPU s), "
                  f"{sharded['events_per_s'] / whole['events_per_s']:.2f}x", flush=True)
        lost = {t: n - sharded["alerts"].get(t, 0) for t, n in whole["alerts"].items() if n != sharded["alerts"].get(t, 0)}
        print(f"alerts: {sum(whole['alerts'].values())} in one process, {sum(sharded['alerts'].values())} sharded; "
              f"by type, fewer (more if negative) sharded: {lost or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
