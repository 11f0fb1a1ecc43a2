"""stuck_gpu's order of signals on real H200 readings of the workloads that could fool it.

``tests/data/h200_stuck_edges.jsonl`` was taken by ``bench/nvml_stuck_edges.py`` on the
device machine: once a second, NVML's utilisation and power and its GPU performance
monitoring ratios (the counters DCGM's profiling fields read) while the GPU ran a small
FP32 MLP training loop, the same in bf16, an FP32 loop over 4 MB (in L2), and 32 blocks
polling a flag that never changes (a collective hung on 32 channels). Each phase's ~10
readings are replayed in turn, one scrape every 30 s, for 40 minutes.

What the capture showed: the polling hang reads util 100 %, GR_ENGINE 100 %, SM 24 % (32
of 132 SMs), tensor 0, DRAM 0.0004 % (as idle); the small models are launch-bound (util
11-50 %) with DRAM as idle too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from detector.engine import Engine
from detector.events import GpuMetric
from tests.helpers import T0, at, usage

CAPTURE = Path(__file__).parent / "data" / "h200_stuck_edges.jsonl"
STOCK = ("gr_engine", "tensor", "dram")
FIELDS = {"gr_engine": "gr_engine_active", "sm": "sm_active", "tensor": "tensor_active", "dram": "dram_active"}


def _phases() -> dict[str, list[dict]]:
    phases: dict[str, list[dict]] = {}
    for line in CAPTURE.read_text().splitlines()[1:]:
        sample = json.loads(line)
        if "gpm" in sample:
            phases.setdefault(sample["phase"], []).append(sample)
    return phases


PHASES = _phases()


def events_of(phase: str, minutes: int, profiling: tuple[str, ...]) -> list:
    readings, events = PHASES[phase], []
    for i in range(minutes * 2):
        t = T0 + i * 30
        if i % 2 == 0:
            events.append(usage(t))
        r = readings[i % len(readings)]
        ratios = {FIELDS[name]: min(1.0, r["gpm"][name] / 100) for name in profiling}  # GPM: 0-100
        events.append(GpuMetric(ts=at(t), resource_id="host-1", gpu_index=0, model="NVIDIA H200",
                                util_pct=float(r["gpu_util"]), power_w=r["power_w"], **ratios))  # fmt: skip
    return events


def fired(ruleset, events) -> set[str]:
    return {f.type for f in Engine(ruleset).process(events) if f.action == "fire" and f.type in ("idle_gpu", "stuck_gpu")}


def test_the_capture_holds_every_phase():
    assert {p: len(s) >= 8 for p, s in PHASES.items() if p != "between"} == {
        "mlp_fp32_small": True, "mlp_bf16_small": True, "fp32_l2_loop": True, "poll_32_blocks": True}  # fmt: skip


@pytest.mark.parametrize(
    ("phase", "profiling", "expected"),
    [
        # a collective hung on 32 channels, stock dcgm-exporter: DRAM as idle -> stuck
        ("poll_32_blocks", STOCK, {"stuck_gpu"}),
        # ...with SM_ACTIVE exported too: 24 % of the SMs is not "working" (under 60 %), DRAM decides -> stuck
        ("poll_32_blocks", (*STOCK, "sm"), {"stuck_gpu"}),
        # ...with SM_ACTIVE and no DRAM: 24 % is over sm_below (5 %), taken as working: the known limit
        ("poll_32_blocks", ("sm",), set()),
        # small models and an FP32 loop in L2: launch-bound (util under 90 %), busy by every signal
        ("mlp_fp32_small", STOCK, set()),
        ("mlp_fp32_small", (*STOCK, "sm"), set()),
        ("mlp_fp32_small", (), set()),
        ("mlp_bf16_small", STOCK, set()),
        ("mlp_bf16_small", (), set()),
        ("fp32_l2_loop", STOCK, set()),
        ("fp32_l2_loop", (), set()),
    ],
    ids=["hang-stock", "hang-with-sm", "hang-sm-only", "mlp-fp32-stock", "mlp-fp32-with-sm", "mlp-fp32-util-only",
         "mlp-bf16-stock", "mlp-bf16-util-only", "l2-loop-stock", "l2-loop-util-only"],
)
def test_real_readings(ruleset, phase, profiling, expected):
    assert fired(ruleset, events_of(phase, 40, profiling)) == expected
