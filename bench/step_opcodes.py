"""What a GPU rule's step costs per sample, counted, not timed: Python opcodes executed.

    .venv/bin/python bench/step_opcodes.py [RULE_TYPE ...]            # default: partly_idle_gpu unallocated_gpu
    .venv/bin/python bench/step_opcodes.py --kubernetes idle_gpu ...   # + hosts as dcgm-exporter labels them
    PYTHONPATH=<a worktree of an older commit> .venv/bin/python bench/step_opcodes.py ...  # its figures

An 8-GPU host's 2 hours of scrapes (every 30 s: GPU 0 busy, GPU 1 busy every other 20 minutes,
the rest idle) go through the rule's ``step_scrape``, once off Kubernetes (``allocated``
absent) and once on it (GPUs 0-3 held, 4-7 free); printed: opcodes per sample (the step and
everything it calls) and the findings made. With ``--kubernetes``, twice more as dcgm-exporter's
Kubernetes mode labels the samples (namespace, pod, container, the bridge's workload, owner tags):
``pods``, GPUs 0-3 held by a training pod, 4-5 by a notebook pod (replaced by another after an
hour), 6-7 free; ``mig``, the same with every GPU split into two MIG instances (a sample each, the
pods holding instances). The count is the same on every run, where a
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


MODES = {"off": "off Kubernetes", "allocated": "on Kubernetes ", "pods": "pods          ", "mig": "pods and MIG  "}


def _holder(g: int, s: int) -> dict[str, Any]:
    """The Kubernetes labels of GPU ``g``'s samples at scrape ``s`` (``pods`` / ``mig``)."""
    if g < 4:
        return {"namespace": "nlp", "pod": "llm-train-0cv5-zf6zj", "container": "trainer",
                "workload": "Job/llm-train-0cv5", "allocated": True,
                "tags": {"team": "nlp", "owner": "chen", "project": "llm", "app.kubernetes.io/name": "llm"}}  # fmt: skip
    if g < 6:
        name = f"notebook-{s // 120}"
        return {"namespace": "research", "pod": f"{name}-0", "container": "notebook", "workload": f"StatefulSet/{name}",
                "allocated": True, "tags": {"team": "research", "owner": "ana", "notebook-name": name}}  # fmt: skip
    return {"allocated": False}


def scrapes(mode: str) -> list[tuple[float, list[GpuMetric]]]:
    out = []
    for s in range(SCRAPES):
        t = T0 + 30 * s
        ts = datetime.fromtimestamp(t, UTC)
        samples = []
        for g in range(GPUS):
            util = 95.0 if g == 0 or (s // 40 % 2 and g == 1) else 1.0
            if mode in ("off", "allocated"):
                samples.append(GpuMetric(ts=ts, resource_id="h", model="A100", gpu_index=g, util_pct=util,
                                         allocated=(g < GPUS // 2) if mode == "allocated" else None))  # fmt: skip
                continue
            for instance in ("1", "2") if mode == "mig" else ("",):
                mig = {"mig_instance": instance, "mig_profile": "3g.20gb"} if instance else {}
                samples.append(GpuMetric(ts=ts, resource_id="h", model="A100", gpu_index=g, util_pct=0.0 if mig else util,
                                         gr_engine_active=util / 100 if mig else None, hostname="node-1",
                                         **mig, **_holder(g, s)))  # fmt: skip
        out.append((t, samples))
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
    parser.add_argument("--kubernetes", action="store_true",
                        help="also hosts as dcgm-exporter's Kubernetes mode labels them (pods; pods and MIG)")
    args = parser.parse_args()
    modes = ["off", "allocated", *(["pods", "mig"] if args.kubernetes else [])]
    rules = load_rules(ROOT / "rules")
    for rule_type in args.types:
        detector = next(r.detector for r in rules.rules if r.detector.type == rule_type)
        for mode in modes:
            data = scrapes(mode)
            executed, found = count(detector, data)
            samples = sum(len(events) for _, events in data)
            print(f"{rule_type:>18} {MODES[mode]}: {executed / samples:7.1f} opcodes a sample, {found} findings")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
