"""The inference_scale_to_zero detector on crafted endpoint weeks (one usage interval per 5 minutes)."""

from __future__ import annotations

import bisect
from datetime import datetime, timezone

import pytest

from detector.alerts import AlertManager
from detector.detectors import REGISTRY
from detector.detectors.inference_scale_to_zero import schedule_text
from detector.engine import Engine
from detector.events import UsageEvent
from detector.rules import RuleSet
from detector.series import read_series
from tests.conftest import DATASET, needs_dataset
from tests.helpers import T0, at

HOUR = 3600.0
DAY = 86_400.0
STEP = 300.0
PRICE = 1.006  # g5.xlarge on demand


def office(t: float) -> bool:
    """Weekdays 07:00-20:00 UTC (T0 is a Monday)."""
    d = datetime.fromtimestamp(t, tz=timezone.utc)
    return d.weekday() < 5 and 7 <= d.hour < 20


def endpoint(days: float, rps=lambda t: 3.0 if office(t) else 0.0, instance_type: str = "g5.xlarge",
             state=lambda t: "running", requests_known=lambda t: True, start: float = T0) -> list[UsageEvent]:
    events = []
    for i in range(int(days * DAY / STEP)):
        t = start + i * STEP
        s = state(t)
        if s is None:  # scaled to zero: no usage at all
            continue
        events.append(UsageEvent(
            ts=at(t), resource_id="ep-1", resource_type="inference_endpoint", instance_type=instance_type,
            account="acct", region="eu-west-1", interval_s=STEP, state=s,
            cost_usd=PRICE * STEP / HOUR if s == "running" else 0.0,
            requests=int(rps(t) * STEP) if requests_known(t) else None, tags={"team": "search", "project": "rag"},
        ))  # fmt: skip
    return events


def findings(ruleset: RuleSet, events: list) -> list:
    return [f for f in Engine(ruleset).process(events) if f.type == "inference_scale_to_zero"]


# Idle per week: Mon 00-07 (the first week's only), four nights of 11 h, Fri 20:00-Mon 07:00 (59 h).
WEEK_IDLE_H = 4 * 11 + 59


def test_nights_and_weekends_fire_after_a_week_with_the_schedule_and_weekly_saving(ruleset):
    found = findings(ruleset, endpoint(9))
    fire = found[0]
    assert fire.action == "fire" and all(f.action == "update" for f in found[1:])
    assert fire.fired_at == T0 + 7 * DAY  # the first hour closed after a whole week
    assert fire.episode_start == T0
    assert fire.details["schedule_text"] == "Mon-Thu 20:00-07:00, Fri 20:00-Mon 07:00"
    assert fire.details["idle_hours_per_week"] == WEEK_IDLE_H
    assert fire.details["saving_usd_per_week"] == pytest.approx(WEEK_IDLE_H * PRICE, abs=0.01)
    assert fire.details["usd_per_idle_hour"] == pytest.approx(PRICE)
    # Dollars: the week's idle runs as billed (Mon 00-07 of the first week included: 7 h >= 4 h).
    assert fire.waste_usd == pytest.approx((7 + WEEK_IDLE_H - 7) * PRICE, rel=1e-3)
    assert fire.usd_per_hour == pytest.approx(WEEK_IDLE_H * PRICE / 168, abs=1e-3)
    # The open night run counts once it is 4 h long; the last update carries Tuesday night's 11 h too.
    assert found[-1].waste_usd == pytest.approx((WEEK_IDLE_H + 7 + 11) * PRICE, rel=1e-3)
    assert REGISTRY["inference_scale_to_zero"].suggest(fire.details).startswith(
        "Scale to zero Mon-Thu 20:00-07:00, Fri 20:00-Mon 07:00 (UTC): saves $103.62/week.")


@pytest.mark.parametrize(
    "events",
    [
        # busy at night: a trickle of requests every hour is not idle (the hard negative)
        endpoint(10, rps=lambda t: 3.0 if office(t) else 0.05),
        # less than a week of data: no schedule yet
        endpoint(6.9),
        # only a 2 h lunch gap each day: idle runs under min_idle_run (4 h)
        endpoint(10, rps=lambda t: 0.0 if 12 <= datetime.fromtimestamp(t, tz=timezone.utc).hour < 14 else 2.0),
        # no request counts reported: idleness is unknown, never assumed
        endpoint(10, requests_known=lambda t: False),
        # already scales to zero at night and weekends: no usage then, nothing billed
        endpoint(10, state=lambda t: "running" if office(t) else None),
        # a CPU endpoint: no GPUs to give back
        endpoint(10, instance_type="m6i.2xlarge"),
    ],
    ids=["busy-at-night", "short-history", "short-gaps", "no-request-counts", "scales-already", "cpu-endpoint"],
)
def test_no_alert(ruleset, events):
    assert findings(ruleset, events) == []


def test_short_idle_runs_and_unbilled_hours_add_no_dollars(ruleset):
    # The nights and weekends as above, plus a 2 h lunch without requests each weekday (under
    # min_idle_run: neither scheduled nor counted) and Tuesday night's 23:00-01:00 not billed at
    # all (no usage): it splits that night into 3 h (not counted) and 6 h (counted).
    def hour(t: float) -> int:
        return datetime.fromtimestamp(t, tz=timezone.utc).hour

    def gap(t: float) -> bool:
        return T0 + DAY + 23 * HOUR <= t < T0 + 2 * DAY + HOUR

    events = endpoint(7.5, rps=lambda t: 0.0 if 12 <= hour(t) < 14 else 3.0 if office(t) else 0.0,
                      state=lambda t: None if gap(t) else "running")  # fmt: skip
    fire = findings(ruleset, events)[0]
    assert fire.waste_usd == pytest.approx((WEEK_IDLE_H - 11 + 6) * PRICE, rel=1e-3)
    assert "12:00" not in fire.details["schedule_text"]


def test_resolves_when_traffic_comes_back_to_every_hour(ruleset):
    events = endpoint(21, rps=lambda t: 3.0 if office(t) or t >= T0 + 9 * DAY else 0.0)
    found = [f for f in findings(ruleset, events) if f.action != "update"]
    assert [(f.action, f.details.get("reason")) for f in found] == [("fire", None), ("resolve", "traffic_in_idle_hours")]
    # Resolved once a week of busy hours has replaced every idle slot of the schedule.
    assert T0 + 9 * DAY < found[1].at <= T0 + 16 * DAY + HOUR


def test_a_stopped_endpoint_resolves(ruleset):
    events = endpoint(8) + endpoint(0.1, state=lambda t: "stopped", start=T0 + 8 * DAY)
    found = [f for f in findings(ruleset, events) if f.action != "update"]
    assert [(f.action, f.details.get("reason")) for f in found] == [("fire", None), ("resolve", "instance_stopped")]


def test_the_schedule_is_read_in_the_rules_time_zone(ruleset):
    from detector.detectors.base import Context, ResourceInfo
    from detector.detectors.inference_scale_to_zero import InferenceScaleToZero, InferenceScaleToZeroParams

    det = InferenceScaleToZero("s2z", "info", InferenceScaleToZeroParams(timezone="Europe/Berlin"), ruleset.pricing)
    st = det.new_state()
    res = ResourceInfo(resource_id="ep-1", resource_type="inference_endpoint", instance_type="g5.xlarge",
                       state="running", usd_per_hour=PRICE, gpus=1, interval_usd=PRICE * STEP / HOUR)  # fmt: skip
    ctx = Context(res)
    out = []
    for ev in endpoint(8):
        out += det.step(st, ctx, ev, ev.t)
    # 20:00-07:00 UTC is 21:00-08:00 in Berlin in November (UTC+1).
    assert out[0].details["schedule_text"] == "Mon-Thu 21:00-08:00, Fri 21:00-Mon 08:00"
    assert out[0].details["timezone"] == "Europe/Berlin"


def test_a_half_hour_zone_schedules_its_own_whole_hours(ruleset):
    # India is UTC+5:30: the endpoint's nights (20:00-07:00 UTC) are 01:30-12:30 there. The
    # schedule is of whole local hours inside them (02:00-12:00), never the UTC hours relabelled
    # ("01:00-12:00" would scale to zero half an hour before the traffic stops).
    from detector.detectors.base import Context, ResourceInfo
    from detector.detectors.inference_scale_to_zero import InferenceScaleToZero, InferenceScaleToZeroParams

    det = InferenceScaleToZero("s2z", "info", InferenceScaleToZeroParams(timezone="Asia/Kolkata"), ruleset.pricing)
    st = det.new_state()
    res = ResourceInfo(resource_id="ep-1", resource_type="inference_endpoint", instance_type="g5.xlarge",
                       state="running", usd_per_hour=PRICE, gpus=1, interval_usd=PRICE * STEP / HOUR)  # fmt: skip
    out = []
    for ev in endpoint(8):
        out += det.step(st, Context(res), ev, ev.t)
    assert out[0].details["schedule_text"] == "Tue-Fri 02:00-12:00, Sat 02:00-Mon 12:00"
    assert out[0].details["idle_hours_per_week"] == 4 * 10 + 58


def test_an_unknown_time_zone_is_refused():
    from pydantic import ValidationError

    from detector.detectors.inference_scale_to_zero import InferenceScaleToZeroParams

    with pytest.raises(ValidationError, match="unknown time zone"):
        InferenceScaleToZeroParams(timezone="Mars/Olympus")


@pytest.mark.parametrize(
    ("runs", "text"),
    [
        ([(0, 168)], "all week"),  # never a request
        ([(20, 11)], "Mon 20:00-07:00"),  # one night
        ([(20, 11), (44, 11), (68, 11)], "Mon-Wed 20:00-07:00"),  # consecutive nights with the same hours
        ([(20, 11), (68, 11)], "Mon 20:00-07:00, Wed 20:00-07:00"),  # not consecutive: written apart
        ([(116, 59)], "Fri 20:00-Mon 07:00"),  # a weekend run wraps into Monday
        ([(120, 48)], "Sat 00:00-Mon 00:00"),  # the whole weekend
    ],
)
def test_schedule_text(runs, text):
    assert schedule_text(runs) == text


# -- real request traces ---------------------------------------------------------------------

TRACES = ["ecommerce-api-incoming-rps/api-01.csv", *(f"mongodb-application-rps/mongo-0{i}.csv" for i in range(1, 5))]


@needs_dataset
@pytest.mark.parametrize("trace", TRACES)
def test_real_production_request_traces_never_idle_give_no_schedule(ruleset, trace):
    """Microsoft's Cloud Monitoring Dataset (real API and MongoDB request rates, diurnal and
    weekly, from 1.6 requests/s at their quietest): an endpoint serving one of them has no hour
    without a request, so however deep its nights dip there is nothing to scale to zero. Each
    five-minute interval carries the requests of the trace's sample it falls in, over 10 days
    (a week to learn, then three days judged). The shipped rule, and one that calls an hour
    with at most 100 requests idle (the quietest hour of any trace holds about 5,900; 99 % of
    hours over 100,000), stay silent."""
    series = read_series(DATASET / trace)
    start = series.times[0]
    samples = [(t, v) for t, v in zip(series.times, series.values, strict=True) if v is not None]

    def rps(t: float) -> float:
        at_or_before = bisect.bisect_right([s for s, _ in samples], t) - 1
        return samples[max(0, at_or_before)][1]

    events = endpoint(10, rps=rps, start=start)
    assert min(e.requests or 0 for e in events) > 0
    assert findings(ruleset, events) == []
    from detector.detectors.base import Context, ResourceInfo
    from detector.detectors.inference_scale_to_zero import InferenceScaleToZero, InferenceScaleToZeroParams

    lenient = InferenceScaleToZero("s2z", "info", InferenceScaleToZeroParams(max_requests_per_hour=100), ruleset.pricing)
    st = lenient.new_state()
    ctx = Context(ResourceInfo(resource_id="ep-1", resource_type="inference_endpoint", instance_type="g5.xlarge",
                               state="running", usd_per_hour=PRICE, gpus=1, interval_usd=PRICE * STEP / HOUR))
    assert [f for ev in events for f in lenient.step(st, ctx, ev, ev.t)] == []
    # The control: the same rule on the same trace with its nights (22:00-06:00 UTC) silenced
    # does find them, so the silence above is the trace's, not a rule that cannot fire.
    quiet = endpoint(10, rps=lambda t: 0.0 if not 6 <= datetime.fromtimestamp(t, tz=timezone.utc).hour < 22 else rps(t),
                     start=start)  # fmt: skip
    st = lenient.new_state()
    fired = [f for ev in quiet for f in lenient.step(st, ctx, ev, ev.t) if f.action == "fire"]
    assert len(fired) == 1 and "22:00-06:00" in fired[0].details["schedule_text"]


def test_a_state_saved_before_with_every_slot_and_an_empty_schedule_reads_back_the_same():
    """The week's slots and the schedule are None until an hour closes or a schedule is judged (not
    168 bytes and a list on every endpoint): what the version before saved, with both always
    there, restores to what it said, and a fresh state round-trips as nothing yet."""
    import msgspec

    from detector.detectors.inference_scale_to_zero import BUSY, InferenceScaleToZeroState
    from detector.floats import dec_hook, enc_hook

    slots = bytearray(168)
    slots[20:31] = bytes([BUSY + 2] * 11)
    old = msgspec.msgpack.encode({"slots": bytes(slots), "runs": [[20, 11]], "idle_hours": 11, "first_t": T0})
    restored = msgspec.msgpack.decode(old, type=InferenceScaleToZeroState, dec_hook=dec_hook)
    assert restored.slots == slots and restored.runs == [(20, 11)] and restored.idle_hours == 11
    fresh = InferenceScaleToZeroState()
    assert fresh.slots is None and fresh.runs is None
    for state in (restored, fresh):
        again = msgspec.msgpack.encode(state, enc_hook=enc_hook)
        assert msgspec.msgpack.decode(again, type=InferenceScaleToZeroState, dec_hook=dec_hook) == state


def test_an_endpoint_started_again_after_its_episode_resolved_on_a_stop_fires_a_new_alert(ruleset):
    """Stopped, its episode resolves; started again and idle on the same schedule, it fires again: a new
    episode with its own start, so its own alert id (the resolved one's changes after its resolution
    the alert manager drops as a replay's: the same start made the new episode's alerts vanish)."""
    events = (endpoint(8) + endpoint(0.1, state=lambda t: "stopped", start=T0 + 8 * DAY)
              + endpoint(8, start=T0 + 8.2 * DAY))  # fmt: skip
    found = findings(ruleset, events)
    assert [f.action for f in found if f.action != "update"] == ["fire", "resolve", "fire"]
    alerts = AlertManager(ruleset=ruleset).handle(found)
    assert [a.change for a in alerts if a.change != "updated"] == ["fired", "resolved", "fired"]
    assert alerts[-1].status == "firing" and alerts[-1].alert_id != alerts[0].alert_id
