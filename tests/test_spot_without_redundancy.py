"""The spot_without_redundancy detector on crafted endpoint usage (one interval a minute)."""

from __future__ import annotations

import pytest

from detector.engine import Engine
from detector.events import UsageEvent
from tests.helpers import MIN, T0, at

SPOT, ON_DEMAND = 0.40, 1.006  # g5.xlarge


def endpoint(minutes: int, *, pricing: str = "spot", metrics: dict | None = None, tags: dict | None = None,
             state: str = "running", start: float = T0) -> list[UsageEvent]:  # fmt: skip
    base = {"team": "search", "project": "rag"}
    metrics = {"replicas": 1, "zones": 1} if metrics is None else metrics
    return [
        UsageEvent(ts=at(start + i * MIN), resource_id="ep-1", resource_type="inference_endpoint",
                   instance_type="g5.xlarge", account="acct", region="eu-west-1", pricing=pricing,  # type: ignore[arg-type]
                   state=state, interval_s=60.0, requests=600, metrics=metrics, tags={**base, **(tags or {})})  # type: ignore[arg-type]
        for i in range(minutes)
    ]  # fmt: skip


def findings(ruleset, events):
    return [f for f in Engine(ruleset).process(events) if f.type == "spot_without_redundancy"]


def test_one_spot_replica_fires_after_15_minutes_as_info_with_no_dollars(ruleset):
    found = findings(ruleset, endpoint(60))
    (fire,) = found
    assert fire.action == "fire" and fire.severity == "info"
    assert fire.fired_at == T0 + 15 * MIN and fire.episode_start == T0
    assert fire.waste_usd == 0 and fire.usd_per_hour == 0
    assert (fire.details["replicas"], fire.details["zones"], fire.details["spot_replicas"]) == (1, 1, 1)
    assert fire.details["extra_replica_usd_per_hour"] == pytest.approx(SPOT)
    assert fire.details["on_demand_premium_usd_per_hour"] == pytest.approx(ON_DEMAND - SPOT)


@pytest.mark.parametrize(
    ("metrics", "tags", "pricing"),
    [
        ({"replicas": 3, "zones": 1}, {}, "spot"),  # three replicas, one zone: a zone's reclaim takes them all
        ({"replicas": 1}, {"karpenter.sh/capacity-type": "spot"}, "on_demand"),  # spot by its node label
        ({}, {"cloud.google.com/gke-spot": "TRUE"}, "on_demand"),  # GKE's label; no metrics: one replica
        ({"replicas": 1, "zones": 3}, {}, "spot"),  # zones above the replicas are capped: one replica, one zone
    ],
    ids=["one-zone", "karpenter-label", "gke-label", "zones-capped"],
)
def test_fires(ruleset, metrics, tags, pricing):
    found = findings(ruleset, endpoint(30, metrics=metrics, tags=tags, pricing=pricing))
    assert [f.action for f in found] == ["fire"]


@pytest.mark.parametrize(
    ("metrics", "tags", "pricing"),
    [
        ({"replicas": 3, "zones": 3}, {}, "spot"),  # spread over three zones (the hard negative)
        ({"replicas": 1, "zones": 1}, {}, "on_demand"),  # an on-demand single replica: not preemptible
        ({"replicas": 2, "zones": 1, "spot_replicas": 1}, {}, "spot"),  # one replica on on-demand holds the fort
        ({"replicas": 1}, {"karpenter.sh/capacity-type": "on-demand"}, "on_demand"),  # the label says on-demand
        ({"replicas": 1e300, "zones": -4}, {}, "on_demand"),  # absurd figures on on-demand: nothing
        ({"replicas": 4}, {}, "spot"),  # four replicas whose zones are not reported: no zone is known to be shared
    ],
    ids=["three-zones", "on-demand-single", "on-demand-floor", "label-on-demand", "absurd", "zones-unknown"],
)
def test_no_alert(ruleset, metrics, tags, pricing):
    assert findings(ruleset, endpoint(60, metrics=metrics, tags=tags, pricing=pricing)) == []


def test_a_short_dip_during_a_rollout_does_not_fire(ruleset):
    # Three replicas in three zones dip to one for 10 minutes (a rolling update), then recover.
    events = (endpoint(30, metrics={"replicas": 3, "zones": 3})
              + endpoint(10, metrics={"replicas": 1, "zones": 1}, start=T0 + 30 * MIN)
              + endpoint(30, metrics={"replicas": 3, "zones": 3}, start=T0 + 40 * MIN))  # fmt: skip
    assert findings(ruleset, events) == []


@pytest.mark.parametrize(
    ("after", "reason"),
    [
        ({"metrics": {"replicas": 3, "zones": 3}}, "redundant"),
        ({"pricing": "on_demand", "metrics": {"replicas": 1, "zones": 1}}, "on_demand"),
        ({"state": "stopped"}, "instance_stopped"),
        ({"metrics": {"replicas": 0, "zones": 0}}, "no_ready_replicas"),
    ],
    ids=["scaled-out", "moved-to-on-demand", "stopped", "no-replicas"],
)
def test_resolves_with_its_reason(ruleset, after, reason):
    events = endpoint(30) + endpoint(5, start=T0 + 30 * MIN, **after)
    found = findings(ruleset, events)
    assert [(f.action, f.details.get("reason")) for f in found] == [("fire", None), ("resolve", reason)]


def test_an_unlisted_instance_type_fires_and_says_the_fix_cost_is_unknown(ruleset):
    # No price list entry and no cost on the events: the risk stands, the fix costs are "?" (not a crash).
    from detector.detectors import REGISTRY

    events = [UsageEvent(**{**{f: getattr(e, f) for f in e.__struct_fields__}, "instance_type": "custom-gpu"})
              for e in endpoint(20)]  # fmt: skip
    (fire,) = findings(ruleset, events)
    assert fire.details["extra_replica_usd_per_hour"] is None
    facts = dict(REGISTRY["spot_without_redundancy"].facts(fire.details))
    assert facts["Fix costs"] == "one more spot replica $?/h, or on-demand $?/h more"


def test_the_fix_costs_scale_with_the_replicas_and_an_unlisted_type_uses_its_billed_rate(ruleset):
    # Three spot replicas in one zone: moving them to on-demand costs three premiums; one more
    # spot replica costs one spot price. Unlisted, billed $1.50/h for three: $0.50/h a replica.
    (fire,) = findings(ruleset, endpoint(20, metrics={"replicas": 3, "zones": 1}))
    assert fire.details["on_demand_premium_usd_per_hour"] == pytest.approx(3 * (ON_DEMAND - SPOT))
    assert fire.details["extra_replica_usd_per_hour"] == pytest.approx(SPOT)
    events = [UsageEvent(**{**{f: getattr(e, f) for f in e.__struct_fields__}, "instance_type": "custom-gpu",
                            "cost_usd": 1.5 / 60}) for e in endpoint(20, metrics={"replicas": 3, "zones": 1})]  # fmt: skip
    (fire,) = findings(ruleset, events)
    assert fire.details["extra_replica_usd_per_hour"] == pytest.approx(0.5)
    assert fire.details["on_demand_premium_usd_per_hour"] is None
