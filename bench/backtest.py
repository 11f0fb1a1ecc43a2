"""A/B of ``backtest``'s speed: past commits against the working tree, in-process and whole-process.

    .venv/bin/python bench/backtest.py HEAD~1 [--runs 3] [--file FLEET.jsonl] [--whole FILE]

Each side runs in its own fresh interpreter (the past commit from a git worktree put first on
``PYTHONPATH``), alternating, so that drift on the machine falls on both sides. In-process:
events/s of ``backtest(path, rules)`` after :func:`detector.runtime.tune_gc`, by wall and by
CPU time (CPU time moves less on a machine others share). ``--whole FILE``: ``burnwatch
backtest FILE`` as a command, its CPU time (user + sys) against a bare read-and-decode of the
same file with msgspec. ``--startup``: instead, what a start costs: the CPU seconds of
``burnwatch backtest`` on the bench fleet's first 100 lines, of importing the event writer's
child (``streams.event_writer``, started with every worker) and of building a worker's action
executors. ``--instructions``: instead, the CPU instructions an event of each side's in-process
``backtest`` (valgrind's callgrind on the file's first 1,000 and 6,000 lines, differenced), the
same on every run where the clock on this VM moves by a fifth, and each side's alerts digest;
``--topic resource-usage`` (or ``gpu-metrics``, ``run-events``) counts one topic's messages only: GPU
messages alone are of hosts no usage event describes, which run every GPU rule (an endpoint's too).
``--model DIR``: both sides judge windows with the model in DIR, as a worker with one does (the
bench fleet's: ``bench/out/mdl``, ``burnwatch model train``), in-process and with ``--instructions``.
Every run is printed, not only the means.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import mean
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.run import bench_fleet  # noqa: E402

_RULES = """
from detector.rules import load_rules
from detector.runtime import tune_gc
tune_gc()
rules, models = load_rules(sys.argv[2]), None
if sys.argv[3]:  # a model: the anomaly rule judges windows, as a worker with one does
    from detector.model.forest import ModelSet
    from detector.model.train import anomaly_ruleset
    rules, models = anomaly_ruleset(rules), ModelSet.load(sys.argv[3])
"""
"""The rules of a run (``argv[2]``) and, with a model directory (``argv[3]``, '' for none), its model."""

_IN_PROCESS = """
import json, sys, time
from detector.backtest import backtest
""" + _RULES + """
wall, cpu = time.perf_counter(), time.process_time()
result = backtest(sys.argv[1], rules, models=models)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({"events": result.events, "alerts": len(result.alerts), "wall_s": wall, "cpu_s": cpu}))
"""

_COUNTED = """
import hashlib, json, sys
import msgspec
from detector.backtest import backtest
""" + _RULES + """
result = backtest(sys.argv[1], rules, models=models)
digest = hashlib.sha256(msgspec.json.encode([msgspec.to_builtins(a) for a in result.alerts])).hexdigest()[:8]
print(json.dumps({"events": result.events, "alerts": len(result.alerts), "hash": digest}))
"""

_DECODE = """
import sys, msgspec
decoder = msgspec.json.Decoder()
n = 0
with open(sys.argv[1], "rb") as handle:
    for line in handle:
        n += 1 if decoder.decode(line) else 0
print(n)
"""


_EXECUTORS = "from detector.remediation.executors import executors\nexecutors()"
"""What every worker builds at its start, with its imports."""


def _env(tree: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    else:
        env.pop("PYTHONPATH", None)
    return env


def in_process(tree: Path | None, path: str, model: str = "") -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _IN_PROCESS, path, str((tree or ROOT) / "rules"), model], env=_env(tree),
                         cwd=tree or ROOT, capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cpu_of(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def head(path: str | Path, lines: int, into: Path, topic: str | None = None) -> str:
    """The first ``lines`` lines of ``path`` (of one ``topic``'s messages, when given), as a file in ``into``."""
    out = into / f"head{lines}{'-' + topic if topic else ''}.jsonl"
    with open(path, "rb") as src, open(out, "wb") as dst:
        chosen = (line for line in src if topic is None or json.loads(line).get("topic") == topic)
        for _, line in zip(range(lines), chosen, strict=False):
            dst.write(line)
    return str(out)


def instructions_per_event(tree: Path | None, short: str, long: str, model: str = "") -> tuple[float, dict[str, Any]]:
    """CPU instructions an event of in-process ``backtest`` (callgrind), counted on two heads of one file
    and differenced, so that the interpreter's start and imports cancel; ``PYTHONHASHSEED=0``, so that
    the count is the same on every run where the clock on a shared VM is not. Also the longer run's
    alerts and their digest, which an optimisation must leave as they were."""
    counts = []
    for path in (short, long):
        done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c",
                               _COUNTED, path, str((tree or ROOT) / "rules"), model],
                              env=dict(_env(tree), PYTHONHASHSEED="0"), cwd=tree or ROOT, capture_output=True, text=True,
                              check=True)  # fmt: skip
        found = re.search(r"Collected : (\d+)", done.stderr)
        assert found is not None, done.stderr[-500:]
        counts.append((json.loads(done.stdout.strip().splitlines()[-1]), int(found.group(1))))
    (short_run, i1), (long_run, i2) = counts
    return (i2 - i1) / (long_run["events"] - short_run["events"]), long_run


def whole_process(tree: Path | None, path: str) -> float:
    """CPU seconds of ``burnwatch backtest path`` (the CLI of that tree)."""
    cmd = [sys.executable, "-c", "from streams.cli import main; main()", "backtest", path]
    return _cpu_of(cmd, _env(tree), tree or ROOT)


def startup(tree: Path | None, runs: int, rev: str) -> None:
    """Each side's start, alternating: ``burnwatch backtest`` of 100 events, and the child's imports."""
    sides: dict[str, Path | None] = {rev: tree, "working tree": None}
    with tempfile.TemporaryDirectory(prefix="burnwatch-start-") as tmp:
        small = Path(tmp) / "100.jsonl"
        with open(bench_fleet(None), "rb") as source:
            small.write_bytes(b"".join(next(source) for _ in range(100)))
        cpu: dict[tuple[str, str], list[float]] = {}
        for _ in range(runs):
            for side, where in sides.items():
                rules = str((where or ROOT) / "rules")
                for what, cmd in (("backtest of 100 events", ["-m", "streams.cli", "backtest", "--rules", rules, str(small)]),
                                  ("event writer child's import", ["-c", "import streams.event_writer"]),
                                  ("worker's action executors", ["-c", _EXECUTORS])):  # fmt: skip
                    cpu.setdefault((side, what), []).append(_cpu_of([sys.executable, *cmd], _env(where), Path(tmp)))
        for (side, what), runs_s in cpu.items():
            print(f"{side}: {what}: mean {mean(runs_s):.2f} CPU s ({', '.join(f'{r:.2f}' for r in runs_s)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rev", help="the commit to compare the working tree with")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--file", type=Path, help="replay file (default: the bench fleet, bench/out/fleet.jsonl)")
    parser.add_argument("--whole", default=None, help="also time `burnwatch backtest` on this file (CPU s)")
    parser.add_argument("--startup", action="store_true", help="only what a start costs (CPU s), not the backtest")
    parser.add_argument("--instructions", action="store_true",
                        help="only CPU instructions an event (callgrind, lines 1,001-6,000 of the file) and the alerts")
    parser.add_argument("--topic", choices=["gpu-metrics", "resource-usage", "run-events"],
                        help="with --instructions: the file's messages of this topic only (their lines 1,001-6,000; "
                             "gpu-metrics alone: hosts no usage event describes)")
    parser.add_argument("--model", type=Path, default=None,
                        help="a model directory (`burnwatch model train`): the anomaly rule judges windows with it, "
                             "on both sides (in-process and --instructions)")
    args = parser.parse_args()
    model = str(args.model.resolve()) if args.model else ""  # (each side runs in its own tree)
    with tempfile.TemporaryDirectory(prefix="burnwatch-bt-ab-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), args.rev], check=True)
        try:
            if args.startup:
                startup(tree, args.runs, args.rev)
                return 0
            if args.instructions:
                fleet = bench_fleet(args.file)
                short, long = head(fleet, 1000, Path(tmp), args.topic), head(fleet, 6000, Path(tmp), args.topic)
                lines = f"{args.topic} lines" if args.topic else "lines"
                for side, where in ((args.rev, tree), ("working tree", None)):
                    per_event, run = instructions_per_event(where, short, long, model)
                    print(f"{side}: {per_event:,.0f} instructions an event ({lines} 1,001-6,000), {run['alerts']} alerts "
                          f"{run['hash']}", flush=True)  # fmt: skip
                return 0
            sides: dict[str, Path | None] = {args.rev: tree, "working tree": None}
            wall: dict[str, list[float]] = {s: [] for s in sides}
            cpu: dict[str, list[float]] = {s: [] for s in sides}
            whole: dict[str, list[float]] = {s: [] for s in sides}
            for _ in range(args.runs):
                for side, where in sides.items():
                    r = in_process(where, str(bench_fleet(args.file)), model)
                    wall[side].append(r["events"] / r["wall_s"])
                    cpu[side].append(r["events"] / r["cpu_s"])
                    print(f"{side}: {wall[side][-1]:,.0f} events/s wall, {cpu[side][-1]:,.0f} events/s CPU "
                          f"({r['alerts']} alerts)", flush=True)  # fmt: skip
                    if args.whole:
                        whole[side].append(whole_process(where, args.whole))
                        print(f"{side}: burnwatch backtest {args.whole}: {whole[side][-1]:.2f} CPU s", flush=True)
            for side in sides:
                print(f"{side}: in-process mean {mean(wall[side]):,.0f} events/s wall "
                      f"({', '.join(f'{r:,.0f}' for r in wall[side])}), {mean(cpu[side]):,.0f} events/s CPU "
                      f"({', '.join(f'{r:,.0f}' for r in cpu[side])})")  # fmt: skip
                if args.whole:
                    print(f"{side}: whole-process mean {mean(whole[side]):.2f} CPU s "
                          f"({', '.join(f'{r:.2f}' for r in whole[side])})")  # fmt: skip
            if args.whole:
                decode = _cpu_of([sys.executable, "-c", _DECODE, args.whole], _env(None), ROOT)
                print(f"bare msgspec read + decode of {args.whole}: {decode:.2f} CPU s")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
