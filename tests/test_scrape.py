"""The per-scrape view the GPU rules share, and the rules' short way through the usual scrape."""

from __future__ import annotations

import msgspec
import pytest

from detector.detectors.activity import busy, resident
from detector.detectors.base import Context, ResourceInfo
from detector.detectors.scrape import FIRST, Scrape
from detector.events import GpuMetric
from detector.floats import enc_hook
from detector.rules import load_rules
from tests.conftest import ROOT
from tests.helpers import T0, at

GPUS = 8


def sample(t: float, index: int, util: float, model: str = "A100", **fields) -> GpuMetric:
    return GpuMetric(ts=at(t), resource_id="host-1", model=model, gpu_index=index, util_pct=util, **fields)


def test_a_scrape_answers_what_every_rule_asks_of_its_samples():
    samples = [sample(T0, 0, 95.0), sample(T0, 1, 1.0, gr_engine_active=0.97), sample(T0, 2, 1.0, dram_active=0.2)]
    scrape = Scrape(samples)
    assert scrape.gpus is FIRST[3]  # GPUs 0..n-1 in order: the one tuple every host holds
    assert scrape.model == "A100" and scrape.plain and scrape.holders_unknown
    assert scrape.busy(5.0) == tuple(busy(ev, 5.0) for ev in samples) == (True, True, True)
    assert scrape.busy(50.0) == (True, True, False)  # a threshold of its own
    assert scrape.busy(5.0) is scrape.busy(5.0)  # worked out once
    assert scrape.resident() == tuple(resident(ev) for ev in samples) == (95.0, 97.0, 1.0)

    other = Scrape([sample(T0, 1, 1.0), sample(T0, 0, 1.0, model="H100")])
    assert other.gpus == (1, 0) and other.model is None  # out of order; models that differ
    assert not Scrape([sample(T0, 0, 1.0, allocated=False)]).plain
    podded = Scrape([sample(T0, 0, 1.0, pod="p", namespace="ns")])
    assert podded.holders_unknown and not podded.plain  # a pod named, nobody said to hold the GPU
    assert not Scrape([sample(T0, 0, 1.0, mig_instance="1", mig_profile="1g.10gb")]).plain


def scrapes() -> list[tuple[float, list[GpuMetric]]]:
    """An 8-GPU host every 30 s, in phases (steps of 30 s) that make every GPU rule move: all busy;
    GPU 0 busy, GPU 1 busy every other 40 minutes, the rest idle (``partly_idle_gpu``); a silence
    of 6 minutes (a telemetry gap); every GPU hung, resident at low power (``stuck_gpu``); the whole
    host idle (``idle_gpu``); a silence of 70 minutes (the units forgotten); every GPU bursting
    and waiting by turns (``data_starved_training``); the partly idle host again."""
    out, t = [], T0
    for step in range(560):
        t += 30
        if step in (100, 300):
            t += 360 if step == 100 else 4200
        partly = [95.0, 95.0 if step // 80 % 2 else 1.0] + [1.0] * (GPUS - 2)
        if step < 6:
            utils = [95.0] * GPUS
        elif step < 100 or 280 <= step < 300 or step >= 440:
            utils = partly
        elif step < 200:
            utils = [100.0] * GPUS
        elif step < 280:
            utils = [1.0] * GPUS
        else:
            utils = [95.0 if step % 2 else 2.0] * GPUS
        hung = 100 <= step < 200
        out.append((t, [GpuMetric(ts=at(t), resource_id="host-1", model="A100", gpu_index=g, util_pct=u,
                                  power_w=60.0 if hung or u < 50 else 300.0) for g, u in enumerate(utils)]))  # fmt: skip
    return out


@pytest.mark.parametrize("rule_type", ["partly_idle_gpu", "idle_gpu", "stuck_gpu", "data_starved_training",
                                       "telemetry_stale"])  # fmt: skip
def test_the_usual_scrape_keeps_what_the_sample_by_sample_way_keeps(rule_type):
    """The usual scrape (GPUs 0..n-1 in order, nothing new) takes a rule's short way; the same
    samples in another order take the way of any scrape, sample by sample. Both leave the same
    state and make the same findings (only the sample a finding is credited to may differ)."""
    detector = next(r.detector for r in load_rules(ROOT / "rules").rules if r.detector.type == rule_type)
    ctx = Context(ResourceInfo(resource_id="host-1", resource_type="gpu_instance", state="running",
                               usd_per_hour=32.0, gpus=GPUS))  # fmt: skip
    usual, shuffled = detector.new_state(), detector.new_state()
    found_usual, found_shuffled = [], []
    for n, (t, samples) in enumerate(scrapes()):
        found_usual += [f for _, f in detector.step_scrape(usual, ctx, Scrape(samples), t)]
        other = samples if n == 0 else samples[3:] + samples[:3]  # (the first, in order: the same GPUs' places)
        found_shuffled += [f for _, f in detector.step_scrape(shuffled, ctx, Scrape(other), t)]
    assert found_usual == found_shuffled
    assert msgspec.msgpack.encode(usual, enc_hook=enc_hook) == msgspec.msgpack.encode(shuffled, enc_hook=enc_hook)
    if rule_type != "telemetry_stale":  # (a host that always reports never fires it)
        assert found_usual, "the sequence should make findings of this rule"
