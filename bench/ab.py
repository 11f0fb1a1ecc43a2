"""A/B of the worker's streaming throughput: a past commit against the working tree.

    .venv/bin/python bench/ab.py e0a0a47 --runs 2 [--batched | --file fleet.jsonl] [--env KEY=VALUE ...]

Both workers read the same fleet file from a fresh embedded broker into a fresh embedded
ClickHouse (``bench.run.bench_streaming``), alternating so that drift on the machine
falls on both sides; the past commit's worker runs from a git worktree, from its directory
and put first on ``PYTHONPATH`` (before 2026-12-01 it ran from this tree's directory, which
comes first on ``python -m``'s path: the A/Bs in docs/performance-log.md before issue 16 compared
the working tree with itself). On a small shared VM one commit's figure spans ±15 % and more, so
compare means over several runs, never one pair. Each run also prints events per CPU second of
the worker process (user + system, every thread, from /proc): it moves less than events per
second when other work shares the machine, though a busy neighbour still slows the CPU itself.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.run import BIG, BIG_BATCHED, bench_streaming  # noqa: E402
from detector.replay import write_replay  # noqa: E402
from detector.rules import load_rules  # noqa: E402
from detector.simulate import simulate  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rev", help="the commit to compare the working tree with")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--batched", action="store_true", help="exporters batching 5 minutes (32 events/message)")
    parser.add_argument("--file", type=Path, help="a replay file to read instead of the simulated bench fleet "
                        "(e.g. one event per message)")  # fmt: skip
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="for both sides' workers (e.g. BURNWATCH_MODEL_DIR=DIR: with a model)")  # fmt: skip
    args = parser.parse_args()
    extra_env = dict(item.split("=", 1) for item in args.env)
    for key, value in extra_env.items():  # the old side runs from its worktree: a relative path would miss there
        if value and not Path(value).is_absolute() and Path(value).exists():
            extra_env[key] = str(Path(value).resolve())
    with tempfile.TemporaryDirectory(prefix="burnwatch-ab-") as tmp:
        workdir = Path(tmp)
        tree = workdir / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), args.rev], check=True)
        try:
            fleet = args.file.resolve() if args.file else workdir / "fleet.jsonl"  # (the old side runs from its worktree)
            if args.file is None:
                records, _ = simulate(BIG_BATCHED if args.batched else BIG, load_rules(ROOT / "rules").pricing)
                with open(fleet, "wb") as out:
                    write_replay(records, out)
            figures: dict[str, list[float]] = {args.rev: [], "working tree": []}
            per_cpu: dict[str, list[float]] = {args.rev: [], "working tree": []}
            for i in range(args.runs):
                for side in figures:
                    # The worker subprocess runs ``python -m streams.cli`` from the current directory,
                    # which comes first on its path: run the old side from the old tree.
                    if side == args.rev:
                        os.environ["PYTHONPATH"] = str(tree)
                        os.chdir(tree)
                    else:
                        os.environ.pop("PYTHONPATH", None)
                        os.chdir(ROOT)
                    result = bench_streaming(fleet, workdir, f"run-{i}-{len(figures[side])}-{side[:7]}", **extra_env)
                    figures[side].append(result["events_per_s"])
                    per_cpu[side].append(result["events_per_cpu_s"])
                    print(f"{side}: {result['events_per_s']:,.0f} events/s, "
                          f"{result['events_per_cpu_s']:,.0f} per CPU second", flush=True)  # fmt: skip
            for side, runs in figures.items():
                print(f"{side}: mean {mean(runs):,.0f} events/s over {len(runs)} runs "
                      f"({', '.join(f'{r:,.0f}' for r in runs)}); "
                      f"{mean(per_cpu[side]):,.0f} per CPU second ({', '.join(f'{r:,.0f}' for r in per_cpu[side])})")  # fmt: skip
        finally:
            os.environ.pop("PYTHONPATH", None)
            os.chdir(ROOT)
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
