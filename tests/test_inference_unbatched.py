"""The inference_unbatched detector on crafted endpoint hours (one usage interval and one GPU sample a minute)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from detector.detectors.inference_unbatched import work_left
from detector.engine import Engine
from detector.events import GpuMetric, UsageEvent
from tests.helpers import MIN, T0, at

HOUR = 3600.0
PRICE = 1.006  # g5.xlarge on demand, per replica


def endpoint(hours: float, *, replicas: int = 4, rps: float | Callable[[float], float] = 40.0,
             batch: float | None = 1.0, util: float = 60.0, sm: float | None = 0.2, dup: float | None = None,
             cache: float | None = None, gauge: bool = False, report_replicas: bool = True,
             instance_type: str = "g5.xlarge") -> list:  # fmt: skip
    events: list = []
    for i in range(int(hours * 60)):
        t = T0 + i * MIN
        requests = int((rps(i / 60) if callable(rps) else rps) * 60)
        metrics: dict[str, float] = {}
        if report_replicas:
            metrics["replicas"] = replicas
        if batch is not None:
            if gauge:
                metrics["batch_size"] = batch
            else:
                metrics["batches"] = requests / batch
        if dup is not None:
            metrics["duplicate_share"] = dup
        if cache is not None:
            metrics["cache_hit_ratio"] = cache
        events.append(UsageEvent(
            ts=at(t), resource_id="ep-1", resource_type="inference_endpoint", instance_type=instance_type,
            account="acct", region="eu-west-1", interval_s=60.0, cost_usd=replicas * PRICE / 60,
            requests=requests, metrics=metrics, tags={"team": "search", "project": "rag"},
        ))  # fmt: skip
        events += [GpuMetric(ts=at(t), resource_id="ep-1", gpu_index=r, model="A10G", util_pct=util, sm_active=sm,
                             mem_used_mib=20 * 1024, mem_total_mib=24 * 1024) for r in range(replicas)]  # fmt: skip
    return events


def findings(ruleset, events):
    return [f for f in Engine(ruleset).process(events) if f.type == "inference_unbatched"]


def test_batch_of_one_at_low_sm_activity_fires_with_the_estimate(ruleset):
    # 4 replicas (4 x $1.006/h) at batch 1, 40 req/s, kernels busy 60 % but SMs 20 % active:
    # batching counted as 2x leaves work for 2 replicas, saving 2 x $1.006/h.
    found = findings(ruleset, endpoint(8))
    fire = found[0]
    assert fire.action == "fire" and all(f.action == "update" for f in found[1:])
    assert fire.fired_at == T0 + 6 * HOUR  # a whole window of traffic
    assert fire.details["causes"] == ["unbatched"]
    assert (fire.details["replicas"], fire.details["replicas_needed"]) == (4, 2)
    assert fire.usd_per_hour == pytest.approx(2 * PRICE, abs=1e-3)
    assert fire.waste_usd == pytest.approx(2 * PRICE * 6, rel=0.01)
    assert "ceil(4 x 0.50)" in fire.details["how"]
    assert found[-1].waste_usd == pytest.approx(2 * PRICE * 7, rel=0.01)


def test_hours_without_requests_are_not_counted(ruleset):
    # The endpoint serves nothing from 06:00 to 08:00 (inference_scale_to_zero's hours): the
    # saving accrues over the hours with traffic only.
    found = findings(ruleset, endpoint(10, rps=lambda h: 0.0 if 6 <= h < 8 else 40.0))
    assert found[0].action == "fire"
    assert found[-1].at == T0 + 9 * HOUR
    assert found[-1].waste_usd == pytest.approx(2 * PRICE * 7, rel=0.01)


def test_repeated_requests_without_a_cache_fire_with_their_share(ruleset):
    # Batching well (8 per batch), but 60 % of requests repeat one served before and no cache:
    # a cache leaves 40 % of the work, ceil(4 x 0.4) = 2 replicas.
    (fire,) = [f for f in findings(ruleset, endpoint(7, batch=8.0, util=70.0, sm=0.6, dup=0.6)) if f.action == "fire"]
    assert fire.details["causes"] == ["uncached"]
    assert fire.details["duplicate_share_pct"] == 60.0 and fire.details["cache_hit_pct"] == 0.0
    assert fire.details["replicas_needed"] == 2
    assert fire.usd_per_hour == pytest.approx(2 * PRICE, abs=1e-3)


def test_both_causes_multiply(ruleset):
    # Unbatched and 50 % uncached repeats on 8 replicas: 0.5 x 0.5 of the work, 2 replicas needed.
    (fire,) = [f for f in findings(ruleset, endpoint(7, replicas=8, dup=0.5)) if f.action == "fire"]
    assert fire.details["causes"] == ["unbatched", "uncached"]
    assert fire.details["replicas_needed"] == 2
    assert fire.usd_per_hour == pytest.approx(6 * PRICE, abs=1e-3)


def test_a_batch_size_gauge_serves_as_well_as_execution_counts(ruleset):
    # TGI and vLLM report the batch as a gauge rather than executions.
    assert [f.action for f in findings(ruleset, endpoint(7, gauge=True))][:1] == ["fire"]


@pytest.mark.parametrize(
    "events",
    [
        endpoint(10, batch=6.0),  # real batching (the hard negative)
        endpoint(10, rps=2.0),  # too few requests for a batch to form
        endpoint(10, sm=0.7),  # SMs busy: batch 1 is using the GPU
        endpoint(10, util=15.0, sm=0.1),  # kernels idle: an overprovisioned endpoint, not this
        endpoint(10, replicas=1),  # one replica: nothing to scale down
        endpoint(10, batch=None),  # batching not reported: never assumed
        endpoint(10, batch=8.0, util=70.0, sm=0.6, dup=0.6, cache=0.55),  # repeats are served from a cache
        endpoint(10, batch=8.0, util=70.0, sm=0.6, dup=0.1),  # few repeats
        endpoint(5),  # less than a window of traffic
        endpoint(10, instance_type="m6i.2xlarge"),  # a CPU endpoint
        # one 4-GPU machine, replicas not reported: one model sharded over its GPUs, or four copies
        # on one VM, none of it freed by scaling replicas (a smaller instance is inference_overprovisioned's)
        endpoint(10, report_replicas=False, instance_type="g5.12xlarge"),
    ],
    ids=["batched", "low-rate", "sm-busy", "gpu-idle", "one-replica", "no-batch-metric", "cached", "few-repeats",
         "short-history", "cpu", "replicas-unreported"],
)
def test_no_alert(ruleset, events):
    assert findings(ruleset, events) == []


def test_resolves_when_batching_is_turned_on(ruleset):
    events = endpoint(8) + [e for e in endpoint(16, batch=6.0) if e.t >= T0 + 8 * HOUR]
    found = [f for f in findings(ruleset, events) if f.action != "update"]
    assert [(f.action, f.details.get("reason")) for f in found] == [("fire", None), ("resolve", "batching_or_cache")]


@pytest.mark.parametrize(
    "metrics",
    [
        {"replicas": 1e300, "batches": 1e300, "duplicate_share": 5.0, "cache_hit_ratio": -3.0},  # absurd figures
        {"replicas": -1.0, "batches": -5.0, "batch_size": 0.0},  # negative and zero
        {"replicas": 4.0, "batches": 1e300},  # more executions than requests: not a batch of ~0, nothing known
    ],
    ids=["huge", "negative", "batches-beyond-requests"],
)
def test_absurd_metrics_are_ignored_without_a_wrong_dollar(ruleset, metrics):
    events = []
    for e in endpoint(8, report_replicas=False, batch=None):
        if isinstance(e, UsageEvent):
            e = UsageEvent(**{f: getattr(e, f) for f in e.__struct_fields__ if f != "metrics"}, metrics=metrics)
        events.append(e)
    assert findings(ruleset, events) == []


def test_without_sm_activity_the_kernel_duty_bounds_it_and_the_alert_says_so(ruleset):
    # No SM (or graphics engine) activity exported: kernels busy 40 % bound it (SMs are never more
    # active than kernels run), so batch 1 still fires, but the alert does not call 40 % SM activity.
    from detector.detectors.inference_unbatched import InferenceUnbatched

    fire = findings(ruleset, endpoint(8, sm=None, util=40.0))[0]
    assert fire.action == "fire" and fire.details["sm_active_pct"] is None and fire.details["util_pct"] == 40.0
    assert "SM activity not reported" in dict(InferenceUnbatched.facts(fire.details))["Batching"]
    assert findings(ruleset, endpoint(8, sm=None, util=60.0)) == []  # 60 % kernels: SMs may be busy, unknown


@pytest.mark.parametrize(
    ("gain", "repeats", "left"),
    [
        (2.0, 0.0, 0.5),  # batching alone
        (1.0, 0.6, 0.4),  # a cache alone
        (2.0, 0.5, 0.25),  # both
        (2.0, 7.0, 0.0),  # a share beyond 1 is clamped
    ],
)
def test_work_left(gain, repeats, left):
    assert work_left(gain, repeats) == pytest.approx(left)


@pytest.mark.parametrize("causes", [None, 7, [1, None], "unbatched"], ids=["none", "number", "not-text", "text"])
def test_facts_of_stored_details_of_the_wrong_shape_never_raise(causes):
    # Details come back from the store: a causes field that is not a list of words prints "?".
    from detector.detectors.inference_unbatched import InferenceUnbatched

    facts = dict(InferenceUnbatched.facts({"causes": causes}))
    assert facts["Causes"] == "?"
    assert dict(InferenceUnbatched.facts({"causes": ["unbatched", "uncached"]}))["Causes"] == "unbatched, uncached"


def test_hours_saved_as_a_struct_each_before_read_back_as_rows_of_figures():
    """The hours are rows of one flat array of doubles now: a snapshot saved by the version before,
    with a struct per hour (its sample counts as whole numbers), restores to the same figures, in
    the order of the struct's fields, and a new snapshot round-trips."""
    import msgspec

    from detector.detectors.inference_unbatched import InferenceUnbatchedState
    from detector.floats import dec_hook, enc_hook

    hours = [[T0, 2400.0, 60.0, 2400.0, 2400.0, 0.0, 0.0, 0.0, 60.0, 20.0, 1, 1],
             [T0 + HOUR, 0.0, 120.0, 0.0, 0.0, 10.0, 2.0, 1.0, 0.0, 0.0, 0, 0]]  # fmt: skip
    old = msgspec.msgpack.encode({"hours": hours, "first_t": T0, "replicas": 4.0})
    restored = msgspec.msgpack.decode(old, type=InferenceUnbatchedState, dec_hook=dec_hook)
    assert restored.hours is None and restored.figures.tolist() == [float(x) for hour in hours for x in hour]
    assert restored.column(2).tolist() == [60.0, 120.0] and restored.latest() == 12
    again = msgspec.msgpack.encode(restored, enc_hook=enc_hook)
    assert msgspec.msgpack.decode(again, type=InferenceUnbatchedState, dec_hook=dec_hook) == restored
