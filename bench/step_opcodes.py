"""What a GPU rule's step costs per sample, counted, not timed: Python opcodes executed.

    .venv/bin/python bench/step_opcodes.py [RULE_TYPE ...]            # default: partly_idle_gpu unallocated_gpu
    PYTHONPATH=<a worktree of an older commit> .venv/bin/python bench/step_opcodes.py ...  # its figures

An 8-GPU host's 2 hours of scrapes (every 30 s: GPU 0 busy, GPU 1 busy every other 20 minutes,
the rest idle) go through the rule's ``step_scrape``, once off Kubernetes (``allocated``
absent) and once on it (GPUs 0-3 held, 4-7 free); printed: opcodes per sample (the step and
everything it calls) and the findings made. The count is the same on every run, where a
timing on a shared VM swings with the neighbours: an A/B of two trees is a difference of
counts. Opcodes are not equal in cost (a call is dearer than an add), so a small difference
says "about the same", not which is faster.
``bench/engine_opcodes.py`` counts the engine with every rule over a replay.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after PYTHONPATH: an older tree given there is the one measured

from bench.opcodes import Opcodes  # noqa: E402
from detector.detectors.base import Context, ResourceInfo  # noqa: E402
from detector.events import GpuMetric  # noqa: E402
from detector.rules import load_rules  # noqa: E402

try:
    from detector.detectors.scrape import Scrape as view
except ImportError:  # a tree from before the Scrape view: its rules took the list of samples
    view = list  # type: ignore[assignment]

T0 = 1_700_000_000.0
SCRAPES, GPUS = 240, 8


def scrapes(kubernetes: bool) -> list[tuple[float, list[GpuMetric]]]:
    out = []
    for s in range(SCRAPES):
        t = T0 + 30 * s
        ts = datetime.fromtimestamp(t, UTC)
        out.append((t, [GpuMetric(ts=ts, resource_id="h", model="A100", gpu_index=g,
                                  util_pct=95.0 if g == 0 or (s // 40 % 2 and g == 1) else 1.0,
                                  allocated=(g < GPUS // 2) if kubernetes else None) for g in range(GPUS)]))  # fmt: skip
    return out


def count(detector: Any, data: list[tuple[float, list[GpuMetric]]]) -> tuple[int, int]:
    """Opcodes executed and findings made by ``detector.step_scrape`` over ``data`` from a new state."""
    ctx = Context(ResourceInfo(resource_id="h", resource_type="gpu_instance", state="running", usd_per_hour=32.0,
                               gpus=GPUS))  # fmt: skip
    state, found = detector.new_state(), 0
    views = [(t, view(events)) for t, events in data]  # the engine's, shared by the rules: not counted here
    with Opcodes() as counted:
        for t, scrape in views:
            found += len(detector.step_scrape(state, ctx, scrape, t))
    return counted.executed, found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="*", default=["partly_idle_gpu", "unallocated_gpu"])
    args = parser.parse_args()
    rules = load_rules(ROOT / "rules")
    for rule_type in args.types:
        detector = next(r.detector for r in rules.rules if r.detector.type == rule_type)
        for kubernetes in (False, True):
            executed, found = count(detector, scrapes(kubernetes))
            where = "on Kubernetes " if kubernetes else "off Kubernetes"
            print(f"{rule_type:>18} {where}: {executed / (SCRAPES * GPUS):7.1f} opcodes a sample, {found} findings")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
