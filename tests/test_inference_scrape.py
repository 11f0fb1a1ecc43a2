"""The endpoint rules that read GPU samples take a scrape in one call (``step_scrape``), with what a
step per sample gives: the same findings, tagged with the same sample, and the same state after."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detector.detectors.base import Context, DetectorBase, ResourceInfo
from detector.detectors.scrape import Scrape
from detector.events import GpuMetric, UsageEvent
from detector.floats import enc_hook
from detector.rules import RuleSet

T0 = datetime(2026, 11, 2, tzinfo=timezone.utc).timestamp()
TYPES = ("inference_overprovisioned", "inference_unbatched")

sample = st.tuples(
    st.integers(0, 9),  # GPU index: repeats in one scrape (a message read twice), out of order, new GPUs
    st.sampled_from([0.0, 3.0, 12.5, 35.0, 60.0, 99.0]),  # util_pct
    st.sampled_from([0.0, 8_000.0, 30_000.0]),  # mem_used_mib
    st.sampled_from([None, 0.1, 0.45, 0.9]),  # sm_active
    st.sampled_from([None, 0.2, 0.7]),  # gr_engine_active
)
usage = st.tuples(st.sampled_from(["running", "running", "running", "stopped"]), st.sampled_from([None, 0, 40, 90_000]),
                  st.sampled_from([{}, {"replicas": 2.0}]))  # fmt: skip
step = st.tuples(
    st.sampled_from([0.0, 30.0, 30.0, 600.0, 1800.0, 3600.0, -45.0]),  # time since the previous step (0: the same time)
    st.one_of(st.lists(sample, min_size=1, max_size=10), usage),
)


def _short(ruleset: RuleSet, rule_type: str) -> Any:
    """The shipped rule with a window of 3 hours, so that a few dozen steps close hours and judge."""
    d = next(r.detector for r in ruleset.rules if r.detector.type == rule_type)
    return type(d)(d.name, d.severity, d.params.model_copy(update={"window": 3 * 3600.0}), d.pricing)


def _info() -> ResourceInfo:
    return ResourceInfo(resource_id="ep-1", resource_type="inference_endpoint", instance_type="p4d.24xlarge",
                        region="us-east-1", state="running", usd_per_hour=32.77, gpus=8,
                        interval_usd=32.77 / 60)  # fmt: skip


def _run(detector: Any, steps: list[tuple[float, Any]], per_sample: bool) -> list[Any]:
    """Each step's findings and the state after it, encoded; scrapes by the rule's ``step_scrape`` or,
    ``per_sample``, by the base class's (a ``step`` per sample)."""
    state, info, t, out = detector.new_state(), _info(), T0, []
    ctx = Context(info)
    for dt, what in steps:
        t += dt
        if isinstance(what, list):
            samples = [GpuMetric(ts=datetime.fromtimestamp(t, timezone.utc), resource_id="ep-1", gpu_index=g, model="A100",
                                 util_pct=u, mem_used_mib=m, sm_active=sm, gr_engine_active=gr)
                       for g, u, m, sm, gr in what]  # fmt: skip
            take = DetectorBase.step_scrape if per_sample else type(detector).step_scrape
            found = take(detector, state, ctx, Scrape(samples), t)
        else:
            running, requests, metrics = what
            info.state = running
            event = UsageEvent(ts=datetime.fromtimestamp(t, timezone.utc), resource_id="ep-1",
                               resource_type="inference_endpoint", instance_type="p4d.24xlarge", region="us-east-1",
                               state=running, requests=requests, metrics=metrics)  # fmt: skip
            found = [(None, f) for f in detector.step(state, ctx, event, t)]
        out.append((found, msgspec.msgpack.encode(state, enc_hook=enc_hook)))
    return out


@pytest.mark.parametrize("rule_type", TYPES)
@settings(max_examples=150, deadline=None)
@given(steps=st.lists(step, min_size=1, max_size=60))
def test_a_scrape_in_one_call_is_a_step_per_sample(ruleset, rule_type, steps):
    detector = _short(ruleset, rule_type)
    assert type(detector).step_scrape is not DetectorBase.step_scrape
    assert _run(detector, steps, per_sample=False) == _run(detector, steps, per_sample=True)


def test_an_idle_endpoint_fires_as_sample_by_sample(ruleset):
    """Not a vacuous equality: an endpoint idle for six hours on two GPUs (scrapes of one GPU, then of
    both, the first of them at a new time) fires, in one call as sample by sample."""
    detector = _short(ruleset, "inference_overprovisioned")
    idle = [(1, 2.0, 8_000.0, 0.1, 0.2), (0, 2.0, 8_000.0, 0.1, 0.2)]
    steps: list[tuple[float, Any]] = [(0.0, ("running", 0, {"replicas": 2.0}))]
    for minute in range(1, 6 * 60):
        steps += [(30.0, [(0, 2.0, 8_000.0, 0.1, 0.2)]), (30.0, idle)]
        if minute % 5 == 0:
            steps.append((0.0, ("running", 0, {"replicas": 2.0})))
    one = _run(detector, steps, per_sample=False)
    assert one == _run(detector, steps, per_sample=True)
    assert [f.action for found, _ in one for _, f in found][:1] == ["fire"]
