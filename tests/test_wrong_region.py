"""The wrong_region detector on crafted hourly usage (a billing export's granularity)."""

from __future__ import annotations

import msgspec
import pytest

from detector.alerts import AlertManager
from detector.detectors.wrong_region import WrongRegion
from detector.engine import Engine
from detector.events import UsageEvent
from detector.pricing import HOURS_PER_MONTH
from tests.helpers import T0, at

HOUR = 3600.0
DAY = 86_400.0
TAGS = {"team": "nlp", "owner": "alice", "project": "llm"}


def hours(n: float, *, rid: str = "gpu-1", itype: str = "p4d.24xlarge", region: str = "ap-northeast-1",
          start: float = T0, storage_gb: float | None = None, pricing: str = "on_demand", tags: dict | None = None,
          state=lambda h: "running") -> list[UsageEvent]:  # fmt: skip
    return [
        UsageEvent(ts=at(start + h * HOUR), resource_id=rid, resource_type="gpu_instance", instance_type=itype,
                   account="acct", region=region, pricing=pricing, state=state(h), interval_s=HOUR,
                   storage_bytes=None if storage_gb is None else int(storage_gb * 1e9),
                   tags=TAGS if tags is None else tags)
        for h in range(int(n))
    ]  # fmt: skip


def findings(ruleset, events):
    return [f for f in Engine(ruleset).process(events) if f.type == "wrong_region"]


def test_a_week_in_tokyo_fires_with_the_net_monthly_saving_and_break_even(ruleset):
    # A p4d in ap-northeast-1 ($44.911/h listed) for 8 days, 20 TB on its volumes; us-east-1 lists $32.773.
    found = findings(ruleset, hours(8 * 24, storage_gb=20_000))
    fires = [f for f in found if f.action == "fire"]
    assert len(fires) == 1
    fire = fires[0]
    assert fire.fired_at == T0 + 7 * DAY - HOUR  # the interval (dated at its start) that completes a week
    assert fire.episode_start == T0
    d = fire.details
    saving = 44.911 - 32.773
    move = 20_000 * 0.02
    assert d["suggested_region"] == "us-east-1" and d["data_source"] == "storage the resource reports"
    assert d["move_usd"] == pytest.approx(move)
    assert fire.waste_usd == pytest.approx(saving * HOURS_PER_MONTH - move, abs=0.01)
    assert fire.usd_per_hour == pytest.approx(saving, abs=1e-3)
    assert d["break_even_h"] == pytest.approx(move / saving, abs=0.1)
    # The prices compared are list prices of a date: the alert says which, so they can be checked.
    assert "list prices as of 2025-07-01" in dict(WrongRegion.facts(d))["Move"]


def test_without_reported_storage_the_configured_data_size_is_assumed(ruleset):
    (fire,) = [f for f in findings(ruleset, hours(8 * 24, itype="g5.12xlarge")) if f.action == "fire"]
    assert fire.details["data_source"] == "assumed (data_gb)" and fire.details["data_gb"] == 1000
    assert fire.waste_usd == pytest.approx((8.226 - 5.672) * HOURS_PER_MONTH - 1000 * 0.02, abs=0.01)


@pytest.mark.parametrize(
    "events",
    [
        hours(6 * 24),  # six days: not long-running yet
        hours(8 * 24, state=lambda h: "stopped" if h == 100 else "running"),  # stopped midway: the week restarts
        hours(8 * 24, region="us-west-2"),  # already at the cheapest listed price
        hours(8 * 24, itype="g5.xlarge", region="eu-west-1"),  # 10.4 % dearer, but $85/month less $20 is too little
        hours(8 * 24, storage_gb=500_000),  # 500 TB: moving it costs more than a month saves
        hours(8 * 24, pricing="spot"),  # spot is bought per region: not compared with on-demand lists
        hours(8 * 24, tags={**TAGS, "data_residency": "jp"}),  # must stay in Japan
        hours(8 * 24, itype="m6i.2xlarge"),  # not a GPU type, not in the regional list
        hours(8 * 24, region="mars-north-1"),  # a region the list does not know: not judged
    ],
    ids=["short-lived", "restarted", "cheapest-already", "gap-too-small", "data-too-large", "spot", "pinned",
         "cpu", "unknown-region"],
)
def test_no_alert(ruleset, events):
    assert findings(ruleset, events) == []


def test_resolves_when_the_workload_moves_or_stops(ruleset):
    events = hours(8 * 24) + hours(2, region="us-east-1", start=T0 + 8 * 24 * HOUR)
    found = [f for f in findings(ruleset, events) if f.action != "update"]
    assert [(f.action, f.details.get("reason")) for f in found] == [("fire", None), ("resolve", "moved")]
    stopped = hours(9 * 24, state=lambda h: "stopped" if h >= 8 * 24 else "running")
    found = [f for f in findings(ruleset, stopped) if f.action != "update"]
    assert [(f.action, f.details.get("reason")) for f in found] == [("fire", None), ("resolve", "instance_stopped")]


def test_duplicate_and_late_intervals_do_not_stretch_the_running_time(ruleset):
    # Each interval twice and the list replayed: still one fire, dated at a week.
    events = hours(8 * 24)
    doubled = [e for pair in zip(events, events, strict=True) for e in pair]
    fires = [f for f in findings(ruleset, doubled + events[:10]) if f.action == "fire"]
    assert [f.fired_at for f in fires] == [T0 + 7 * DAY - HOUR]


def test_an_interval_without_region_or_type_does_not_restart_the_week(ruleset):
    # The exporter dropped the region label for one hour and the type for another: not a move.
    events = hours(8 * 24)
    events[50] = msgspec.structs.replace(events[50], region="")
    events[60] = msgspec.structs.replace(events[60], instance_type="")
    fires = [f for f in findings(ruleset, events) if f.action == "fire"]
    assert [f.fired_at for f in fires] == [T0 + 7 * DAY - HOUR]


@pytest.mark.parametrize("split", [1, 50, 7 * 24 - 1, 7 * 24, 8 * 24 - 3])
def test_a_restore_mid_stream_gives_the_same_findings(ruleset, split):
    # A worker restarts after `split` intervals and re-reads the last three: same findings, none twice.
    events = hours(8 * 24, storage_gb=20_000) + hours(3, region="us-east-1", start=T0 + 8 * DAY)
    whole = [(f.action, f.at, f.waste_usd, f.details) for f in findings(ruleset, events)]
    first = Engine(ruleset)
    before = [f for f in first.process(events[:split]) if f.type == "wrong_region"]
    second = Engine(ruleset, loader={key: first.snapshot(key) for key in first.dirty}.get)
    after = [f for f in second.process(events[max(0, split - 3):]) if f.type == "wrong_region"]
    assert [(f.action, f.at, f.waste_usd, f.details) for f in before + after] == whole


def test_absurd_storage_never_alerts_nor_breaks(ruleset):
    # 9.2 EB reported: the move costs more than any saving; nothing fires and nothing raises.
    assert findings(ruleset, hours(8 * 24, storage_gb=9.2e9)) == []


def test_a_move_that_pays_again_after_resolving_is_a_new_alert(ruleset):
    """A week in Tokyo fires; a day with 500 TB on its volumes (the move no longer pays) resolves it;
    back at 20 TB, it pays again while the instance still runs: a new episode, with its own start and
    so its own alert id, which the alert manager lets through (the same id is dropped after its
    resolution: a replayed batch's)."""
    events = (hours(8 * 24, storage_gb=20_000) + hours(24, storage_gb=500_000, start=T0 + 8 * DAY)
              + hours(48, storage_gb=20_000, start=T0 + 9 * DAY))  # fmt: skip
    found = findings(ruleset, events)
    fires = [f for f in found if f.action == "fire"]
    assert [f.action for f in found if f.action != "update"] == ["fire", "resolve", "fire"]
    assert fires[0].episode_start == T0 and fires[1].episode_start == fires[1].fired_at == T0 + 9 * DAY
    alerts = AlertManager(ruleset=ruleset).handle(found)
    assert [a.change for a in alerts if a.change != "updated"] == ["fired", "resolved", "fired"]
    assert alerts[-1].status == "firing" and alerts[-1].alert_id != alerts[0].alert_id
