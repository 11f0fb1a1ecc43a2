"""The spot_eligible detector on crafted runs over priced hosts."""

from __future__ import annotations

import msgspec
import pytest

from detector.engine import Engine
from detector.events import RunEvent, UsageEvent
from tests.helpers import MIN, T0, at

HOUR = 3600.0
CKPT = {"team": "nlp", "owner": "alice", "checkpoint": "s3://ckpt/r1"}


def host(t: float, pricing: str = "on_demand") -> UsageEvent:
    usd = 32.77 if pricing == "on_demand" else 13.11
    return UsageEvent(ts=at(t), resource_id="host-1", resource_type="gpu_instance", instance_type="p4d.24xlarge",
                      account="acct", region="us-east-1", pricing=pricing, interval_s=60.0, cost_usd=usd / 60,
                      tags={"team": "nlp"})  # fmt: skip


def run(t: float, status: str, tags=CKPT, gpus: int = 8) -> RunEvent:
    return RunEvent(ts=at(t), run_id="r1", status=status, resource_ids=["host-1"], gpu_count=gpus,
                    project="llm", tags=tags)  # fmt: skip


def life(hours: float, tags=CKPT, pricing: str = "on_demand", gpus: int = 8) -> list:
    """A run from T0 + 1h lasting ``hours``, heartbeats every 30 minutes, on a billed host."""
    start = T0 + HOUR
    events = [host(T0 + i * MIN, pricing) for i in range(int((hours + 2) * 60))]
    events += [run(start, "started", tags, gpus)]
    events += [run(start + k * 30 * MIN, "running", tags, gpus) for k in range(1, int(hours * 2))]
    events += [run(start + hours * HOUR, "succeeded", tags, gpus)]
    return sorted(events, key=lambda e: e.ts)


def findings(ruleset, events):
    return [f for f in Engine(ruleset).process(events) if f.type == "spot_eligible"]


def test_long_checkpointing_run_on_demand_fires_at_four_hours_with_the_saving(ruleset):
    fire, resolve = findings(ruleset, life(6))
    assert fire.action == "fire" and fire.resource_id == "r1"
    assert fire.fired_at == T0 + HOUR + 4 * HOUR  # the heartbeat at four hours
    assert fire.details["saving_usd_per_hour"] == pytest.approx(32.77 - 13.11, rel=1e-4)
    assert fire.waste_usd == pytest.approx((32.77 - 13.11) * 4, rel=1e-4)
    assert resolve.action == "resolve" and resolve.details["reason"] == "run_succeeded"
    assert resolve.waste_usd == pytest.approx((32.77 - 13.11) * 6, rel=1e-4)  # what spot saves over the whole run


@pytest.mark.parametrize(
    "events",
    [
        life(3),  # three hours: not long-running
        life(6, tags={"team": "nlp"}),  # does not checkpoint: an interruption loses the run
        life(6, tags={**CKPT, "checkpoint": "false"}),  # says so explicitly
        life(6, pricing="spot"),  # already on spot
    ],
    ids=["short", "no-checkpoint", "checkpoint-false", "already-spot"],
)
def test_no_alert(ruleset, events):
    assert findings(ruleset, events) == []


def test_a_run_using_part_of_a_host_saves_its_share(ruleset):
    fire, _ = findings(ruleset, life(6, gpus=4))
    assert fire.details["saving_usd_per_hour"] == pytest.approx((32.77 - 13.11) / 2, rel=1e-4)


def test_reread_events_do_not_reopen_the_run(ruleset):
    events = life(6)
    engine = Engine(ruleset)
    assert len([f for f in engine.process(events) if f.type == "spot_eligible"]) == 2
    assert [f for f in engine.process(events[-100:]) if f.type == "spot_eligible"] == []


def test_a_run_id_used_again_the_next_night_is_judged_again(ruleset):
    # A nightly job of a fixed name (an Airflow task, a CronJob's Job): six hours each night, on demand.
    night = 24 * HOUR
    events = life(6) + [msgspec.structs.replace(e, ts=at(e.ts.timestamp() + night)) for e in life(6)]
    found = findings(ruleset, events)
    assert [(f.action, f.at) for f in found] == [
        ("fire", T0 + 5 * HOUR), ("resolve", T0 + 7 * HOUR),
        ("fire", T0 + night + 5 * HOUR), ("resolve", T0 + night + 7 * HOUR)]  # fmt: skip


def test_a_heartbeat_sent_just_after_the_run_ended_opens_no_run(ruleset):
    """A run tracker's heartbeat thread beats once more after the run reported its end (or its clock runs a little
    ahead): the run's straggler, not a new run with that id. Taken as one (as a reused id is), it opened a run that
    never ends: a spot alert four hours on for a run that no longer existed, never resolved."""
    events = life(6)
    end = T0 + 7 * HOUR
    events += [host(end + 120 * MIN + i * MIN) for i in range(300)]
    events += [run(end + 30, "running")]
    other = [msgspec.structs.replace(run(end + 5 * HOUR, status), run_id="r2", resource_ids=["host-2"])
             for status in ("started", "succeeded")]  # another run of the project: its events judge r1 too
    found = findings(ruleset, sorted(events + other, key=lambda e: e.ts))
    assert [(f.action, f.at) for f in found] == [("fire", T0 + 5 * HOUR), ("resolve", end)]
