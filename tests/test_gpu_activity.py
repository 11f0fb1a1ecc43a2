"""Which activity signals the GPU detectors read, per combination a real exporter sends
(stock dcgm-exporter: util_pct + GR_ENGINE + TENSOR + DRAM, no SM_ACTIVE; MIG: no util_pct)."""

from __future__ import annotations

import pytest

from detector.engine import Engine
from detector.events import GpuMetric
from tests.helpers import MIN, T0, at, usage


def host(minutes: int, gpus: int = 4, start: float = T0, peak_first: bool = False, **fields) -> list:
    """``minutes`` of 30 s scrapes of ``gpus`` GPUs all reading ``fields``, with usage every minute;
    ``peak_first``: ten minutes of a healthy job at full power first (so a peak is known)."""
    events: list = []
    if peak_first:
        events += host(10, gpus, start, util_pct=98.0, sm_active=None, power_w=390.0)
        start += 10 * MIN
    fields = {"util_pct": 0.0, "power_w": 60.0, **fields}
    for i in range(minutes * 2):
        t = start + i * 30
        if i % 2 == 0:
            events.append(usage(t))
        events += [GpuMetric(ts=at(t), resource_id="host-1", gpu_index=g, model="H100", **fields) for g in range(gpus)]
    return events


def fired(ruleset, events, rule_type: str) -> bool:
    return any(f.type == rule_type and f.action == "fire" for f in Engine(ruleset).process(events))


@pytest.mark.parametrize(
    ("fields", "idle"),
    [
        # util_pct alone, under 5 %: idle (the signal every exporter sends)
        ({"util_pct": 1.0}, True),
        # stock dcgm-exporter, all ratios near zero: idle
        ({"util_pct": 1.0, "gr_engine_active": 0.01, "tensor_active": 0.0, "dram_active": 0.01}, True),
        # GR_ENGINE at the threshold (5 %) while util_pct reads low: busy
        ({"util_pct": 1.0, "gr_engine_active": 0.05}, False),
        # just under the threshold on every signal: idle
        ({"util_pct": 4.9, "gr_engine_active": 0.049, "dram_active": 0.049}, True),
        # SM activity says busy whatever util_pct says
        ({"util_pct": 2.0, "sm_active": 0.7}, False),
        # tensor pipes active: busy
        ({"util_pct": 2.0, "tensor_active": 0.3}, False),
        # only the copy engines move data (DRAM active, no kernel): work, not idle
        ({"util_pct": 0.0, "gr_engine_active": 0.0, "dram_active": 0.3}, False),
        # MIG: util_pct unsupported (0), GR_ENGINE says the instance works
        ({"util_pct": 0.0, "gr_engine_active": 0.8, "mig_profile": "1g.10gb", "mig_instance": "1"}, False),
        # MIG with every ratio at zero: idle
        ({"util_pct": 0.0, "gr_engine_active": 0.0, "dram_active": 0.0, "mig_profile": "1g.10gb", "mig_instance": "1"}, True),
    ],
    ids=["util-only", "stock-all-low", "gr-engine-busy", "just-under", "sm-busy", "tensor-busy", "dram-only-busy",
         "mig-gr-busy", "mig-idle"],
)
def test_idle_gpu_busy_wins_on_any_signal(ruleset, fields, idle):
    assert fired(ruleset, host(45, **fields), "idle_gpu") is idle


@pytest.mark.parametrize(
    ("fields", "peak_first", "stuck"),
    [
        # SM_ACTIVE without DRAM: resident kernel, SMs idle -> stuck
        ({"util_pct": 100.0, "sm_active": 0.01}, False, True),
        # ...and SMs active -> working
        ({"util_pct": 100.0, "sm_active": 0.3}, False, False),
        # a hung collective as measured on an H200: 32 polling blocks hold 24 % of the SMs, DRAM as idle -> stuck
        ({"util_pct": 100.0, "gr_engine_active": 1.0, "sm_active": 0.24, "tensor_active": 0.0, "dram_active": 0.000004},
         False, True),
        # DRAM quiet but most SMs computing (a kernel working out of cache) -> working
        ({"util_pct": 100.0, "sm_active": 0.9, "dram_active": 0.0}, False, False),
        # DRAM moving decides over quiet SMs (the copy engines streaming a checkpoint in) -> working
        ({"util_pct": 100.0, "sm_active": 0.0, "dram_active": 0.5}, False, False),
        # stock install (no SM_ACTIVE): DRAM and tensor near zero -> stuck, even with no known peak power
        ({"util_pct": 100.0, "gr_engine_active": 1.0, "tensor_active": 0.0, "dram_active": 0.0}, False, True),
        # stock install, a working job: DRAM moving -> not stuck
        ({"util_pct": 100.0, "gr_engine_active": 1.0, "tensor_active": 0.0, "dram_active": 0.3}, False, False),
        # stock install, DRAM quiet but tensor pipes busy (a job working out of cache) -> not stuck
        ({"util_pct": 100.0, "gr_engine_active": 1.0, "tensor_active": 0.4, "dram_active": 0.01}, False, False),
        # DRAM just at its threshold (2 %) -> not stuck
        ({"util_pct": 100.0, "dram_active": 0.02}, False, False),
        # tensor present but idle proves nothing (an FP32 job): power decides; low power after a peak -> stuck
        ({"util_pct": 100.0, "tensor_active": 0.0, "power_w": 60.0}, True, True),
        # ...and power near the peak -> working
        ({"util_pct": 100.0, "tensor_active": 0.0, "power_w": 350.0}, True, False),
        # no profiling ratios at all and no peak seen yet: cannot judge, not flagged
        ({"util_pct": 100.0, "power_w": 60.0}, False, False),
        # MIG: util_pct unsupported (0) but GR_ENGINE says resident, DRAM quiet -> stuck
        ({"util_pct": 0.0, "gr_engine_active": 1.0, "dram_active": 0.0, "mig_instance": "2"}, False, True),
        # nothing resident: idle, not stuck (idle_gpu's business)
        ({"util_pct": 0.0, "gr_engine_active": 0.0, "dram_active": 0.0}, False, False),
    ],
    ids=["sm-only-idle", "sm-only-busy", "hung-collective-32-channels", "sm-working-out-of-cache", "dram-over-sm",
         "stock-dram-quiet", "stock-dram-busy", "stock-tensor-busy",
         "dram-at-threshold", "tensor-idle-power-low", "tensor-idle-power-high", "no-ratios-no-peak", "mig-gr-resident",
         "nothing-resident"],
)
def test_stuck_gpu_signal_preference(ruleset, fields, peak_first, stuck):
    assert fired(ruleset, host(45, peak_first=peak_first, **fields), "stuck_gpu") is stuck
