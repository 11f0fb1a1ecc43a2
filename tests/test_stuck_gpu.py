"""The stuck-GPU detector: busy by util_pct, dead by SM activity or power."""

from __future__ import annotations

import pytest

from detector.engine import Engine
from detector.events import GpuMetric
from tests.helpers import MIN, T0, at, usage


def samples(start: float, minutes: int, util: float, sm: float | None, power: float, gpus: int = 4) -> list:
    events = []
    for i in range(minutes * 2):
        t = start + i * 30
        if i % 2 == 0:
            events.append(usage(t))
        events += [GpuMetric(ts=at(t), resource_id="host-1", gpu_index=g, model="A100", util_pct=util,
                             sm_active=sm, power_w=power) for g in range(gpus)]  # fmt: skip
    return events


def stuck(ruleset, events):
    return [f for f in Engine(ruleset).process(events) if f.type == "stuck_gpu" and f.action != "update"]


def test_hung_collective_fires_and_resolves_when_killed(ruleset):
    events = samples(T0, 20, 95, 0.7, 380) + samples(T0 + 20 * MIN, 45, 100, 0.0, 70)
    events += samples(T0 + 65 * MIN, 5, 0, 0.0, 55)  # the job is killed: GPUs idle
    found = stuck(ruleset, events)
    assert [f.action for f in found] == ["fire", "resolve"]
    assert found[0].episode_start == T0 + 20 * MIN and found[0].fired_at == T0 + 40 * MIN
    assert found[0].severity == "critical"
    assert found[1].details["reason"] == "gpu_active" and found[1].waste_usd == pytest.approx(32.0 * 45 / 60)


def test_without_sm_active_power_against_the_gpus_own_peak_decides(ruleset):
    healthy = samples(T0, 10, 98, None, 390)
    assert stuck(ruleset, healthy + samples(T0 + 10 * MIN, 40, 100, None, 350)) == []  # 90 % of peak: working
    assert [f.action for f in stuck(ruleset, healthy + samples(T0 + 10 * MIN, 40, 100, None, 60))] == ["fire"]


@pytest.mark.parametrize(
    "events",
    [
        samples(T0, 60, 97, 0.8, 380),  # a healthy training run
        samples(T0, 60, 0, 0.0, 50),  # idle, not stuck (idle_gpu's business)
        samples(T0, 15, 100, 0.0, 60) + samples(T0 + 15 * MIN, 1, 100, 0.6, 300) + samples(T0 + 16 * MIN, 15, 100, 0.0, 60),
    ],
    ids=["healthy", "idle", "stalls-under-20m"],
)
def test_not_stuck(ruleset, events):
    assert stuck(ruleset, events) == []
