"""Three hashes of a tree's alerts, which an optimisation must leave unchanged.

    .venv/bin/python bench/alert_hashes.py                    # this tree
    .venv/bin/python bench/alert_hashes.py --tree ../other    # another checkout, same inputs
    .venv/bin/python bench/alert_hashes.py --jobs 3           # the same hashes, detected in 3 processes

Each is the first 8 hex digits of the sha256 of ``burnwatch backtest FILE --json`` run by the
tree's own ``.venv/bin/burnwatch`` (a subprocess, so the tree's code and not this one's decides):

- ``fleet``: the bench fleet (``bench/run.py: BIG``, bench/out/fleet.jsonl);
- ``fleet+mdl``: the same, judged by a model trained on it (bench/out/mdl);
- ``serving48``: 48 h of the default fleet plus serving endpoints, shared Kubernetes nodes,
  training jobs and regional choices (:data:`SERVING48`, bench/out/serving48.jsonl), the rules
  the bench fleet does not reach.

The inputs are built once, by this checkout, under bench/out (ignored by git), and then
shared by every tree compared: a hash that moves is the tree's behaviour, not its input.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run import bench_fleet  # noqa: E402

OUT = ROOT / "bench" / "out"
MODEL_DIR = OUT / "mdl"
SERVING48 = ["--hours", "48", "--k8s-nodes", "4", "--choices", "2", "--serving", "20",
             "--training-jobs", "6", "--seed", "7"]  # fmt: skip
"""``burnwatch simulate`` options of the serving48 fleet (what ``burnwatch eval`` adds, for 48 h)."""


def burnwatch(tree: Path) -> str:
    """The tree's own CLI (its virtual environment's, as ``make install`` builds it)."""
    return str(tree / ".venv" / "bin" / "burnwatch")


def model_dir(fleet: Path) -> Path:
    """bench/out/mdl: a model trained on ``fleet`` by this checkout, built once."""
    if not MODEL_DIR.exists():
        partial = MODEL_DIR.with_name(MODEL_DIR.name + ".partial")
        subprocess.run([burnwatch(ROOT), "model", "train", "--from", str(fleet), "--dir", str(partial)],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        partial.rename(MODEL_DIR)
    return MODEL_DIR


def serving_fleet() -> Path:
    """bench/out/serving48.jsonl (:data:`SERVING48`), written once by this checkout."""
    path = OUT / "serving48.jsonl"
    if not path.exists():
        partial = path.with_suffix(".partial")
        subprocess.run([burnwatch(ROOT), "simulate", *SERVING48, "--out", str(partial)],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        partial.rename(path)
    return path


def alert_hash(tree: Path, path: Path, *options: str) -> str:
    """The first 8 hex digits of the sha256 of the tree's ``backtest path --json`` output."""
    done = subprocess.run([burnwatch(tree), "backtest", str(path), "--json", *options],
                          check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
    return hashlib.sha256(done.stdout).hexdigest()[:8]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=ROOT, help="checkout whose .venv/bin/burnwatch runs (default: this one)")
    parser.add_argument("--jobs", type=int, help="backtest --jobs N (detection sharded over N processes)")
    args = parser.parse_args()
    jobs = ["--jobs", str(args.jobs)] if args.jobs is not None else []
    tree = args.tree.resolve()
    fleet = bench_fleet()
    runs: dict[str, tuple[Path, list[str]]] = {
        "fleet": (fleet, []),
        "fleet+mdl": (fleet, ["--model-dir", str(model_dir(fleet))]),
        "serving48": (serving_fleet(), []),
    }
    for name, (path, options) in runs.items():
        print(f"{name:<10} {alert_hash(tree, path, *options, *jobs)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
