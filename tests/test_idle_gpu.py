"""The idle-GPU detector on crafted sequences: the edges real fleets produce."""

from __future__ import annotations

import random

import msgspec
import pytest

from detector.alerts import AlertManager
from detector.engine import Engine
from tests.helpers import MIN, T0, scrape, timeline, usage

IDLE8 = [1.0] * 8
BUSY8 = [90.0] * 8


def run(ruleset, events):
    """The shipped rules over ``events``; the idle-GPU findings (other rules see silences too)."""
    engine = Engine(ruleset)
    findings = [f for f in engine.process(events) if f.type == "idle_gpu"]
    return engine, findings


def actions(findings):
    return [f.action for f in findings if f.action != "update"]


def test_sustained_idle_fires_once_then_resolves_when_busy(ruleset):
    """Busy 10m, idle 60m, busy again: one alert at idle start + 30m, resolved at the first busy sample."""
    events = timeline(T0, T0 + 10 * MIN, BUSY8) + timeline(T0 + 10 * MIN, T0 + 70 * MIN, IDLE8)
    events += timeline(T0 + 70 * MIN, T0 + 80 * MIN, BUSY8)
    _, findings = run(ruleset, events)
    assert actions(findings) == ["fire", "resolve"]
    fire, resolve = (f for f in findings if f.action != "update")
    assert fire.episode_start == T0 + 10 * MIN
    assert fire.fired_at == T0 + 40 * MIN
    assert fire.resource_id == "host-1"
    assert fire.details["gpu_count"] == 8 and fire.details["gpu_model"] == "A100"
    assert fire.resource is not None and fire.resource.tags["team"] == "nlp"
    assert resolve.at == T0 + 70 * MIN
    assert resolve.details["reason"] == "gpu_busy"
    assert resolve.waste_usd == pytest.approx(32.0, rel=1e-6)  # 60 idle minutes at $32/h
    assert resolve.usd_per_hour == pytest.approx(32.0)


@pytest.mark.parametrize(
    "segments",
    [
        # epochs with 5-minute dips between them (evaluation, checkpointing)
        [(30, BUSY8), (5, IDLE8), (30, BUSY8), (5, IDLE8), (30, BUSY8)],
        # one busy GPU among eight for an hour: a single-GPU job, not waste of the host
        [(60, [95.0] + [0.0] * 7)],
        # idle for 29 minutes: under the threshold
        [(10, BUSY8), (29, IDLE8), (10, BUSY8)],
        # util_pct reads low but sm_active says the SMs are busy
        [(60, "sm_busy")],
    ],
    ids=["dips-between-epochs", "one-busy-gpu-of-eight", "idle-29-minutes", "sm-active-busy"],
)
def test_not_idle_episodes(ruleset, segments):
    events, t = [], T0
    for minutes, utils in segments:
        end = t + minutes * MIN
        if utils == "sm_busy":
            while t < end:
                events.append(usage(t))
                events.extend(scrape(t, [2.0] * 8, sm=[0.7] * 8))
                t += 30
        else:
            events += timeline(t, end, utils)
        t = end
    _, findings = run(ruleset, events)
    assert findings == []


def test_stopped_instance_is_not_idle_and_stopping_resolves(ruleset):
    """Idle 45m then stopped: resolved at the stop; no usage-reported stop, no alert while stopped."""
    events = timeline(T0, T0 + 45 * MIN, IDLE8)
    events.append(usage(T0 + 45 * MIN, state="stopped", usd_per_hour=0.0))
    events.append(usage(T0 + 100 * MIN, state="stopped", usd_per_hour=0.0))
    _, findings = run(ruleset, events)
    assert actions(findings) == ["fire", "resolve"]
    resolve = findings[-1]
    assert resolve.at == T0 + 45 * MIN
    assert resolve.details["reason"] == "instance_stopped"
    assert resolve.waste_usd == pytest.approx(32.0 * 45 / 60, rel=1e-6)


def test_stopped_before_threshold_never_fires(ruleset):
    events = timeline(T0, T0 + 20 * MIN, IDLE8) + [usage(T0 + 20 * MIN, state="stopped")]
    events += [usage(T0 + 20 * MIN + i * MIN, state="stopped") for i in range(60)]
    _, findings = run(ruleset, events)
    assert findings == []


def test_silence_is_not_idle(ruleset):
    """Idle 10m, then GPU metrics stop while billing continues for 2h: no alert on silence alone."""
    events = timeline(T0, T0 + 10 * MIN, IDLE8)
    events += [usage(T0 + 10 * MIN + i * MIN) for i in range(120)]
    _, findings = run(ruleset, events)
    assert findings == []


def test_telemetry_gap_restarts_the_count(ruleset):
    """Idle 20m, an hour with no samples, idle 15m: 35 observed minutes but never 30 in a row."""
    events = timeline(T0, T0 + 20 * MIN, IDLE8)
    events += [usage(T0 + 20 * MIN + i * MIN) for i in range(60)]
    events += timeline(T0 + 80 * MIN, T0 + 95 * MIN, IDLE8)
    _, findings = run(ruleset, events)
    assert findings == []


def test_late_and_reordered_samples_give_the_same_alerts(ruleset):
    """Samples shuffled within a few seconds of lateness change nothing."""
    events = timeline(T0, T0 + 10 * MIN, BUSY8) + timeline(T0 + 10 * MIN, T0 + 70 * MIN, IDLE8)
    events += timeline(T0 + 70 * MIN, T0 + 75 * MIN, BUSY8)
    rng = random.Random(3)
    jittered = sorted(events, key=lambda e: e.t + rng.uniform(0, 8))  # up to 8 s out of order
    _, in_order = run(ruleset, events)
    _, shuffled = run(ruleset, jittered)
    assert actions(shuffled) == actions(in_order) == ["fire", "resolve"]
    opened_closed = ([f for f in in_order if f.action != "update"], [f for f in shuffled if f.action != "update"])
    for a, b in zip(*opened_closed, strict=True):
        assert (a.episode_start, a.fired_at, a.at) == (b.episode_start, b.fired_at, b.at)
        assert b.waste_usd == pytest.approx(a.waste_usd, rel=0.02)


def test_replayed_input_does_not_fire_twice(ruleset):
    """At-least-once delivery: the same samples seen twice (a re-read batch) alert once."""
    events = timeline(T0, T0 + 50 * MIN, IDLE8)
    engine, first = run(ruleset, events)
    again = [f for f in engine.process(events[len(events) // 2 :]) if f.type == "idle_gpu"]
    assert actions(first) == ["fire"]
    assert actions(again) == []


def test_price_known_late_still_counts_all_idle_time(ruleset):
    """Metrics before the first usage event: idle time is priced once the price arrives."""
    events = timeline(T0, T0 + 45 * MIN, IDLE8, with_usage=False) + [usage(T0 + 45 * MIN)]
    events += timeline(T0 + 45 * MIN, T0 + 50 * MIN, BUSY8, with_usage=False)
    _, findings = run(ruleset, events)
    assert actions(findings) == ["fire", "resolve"]
    assert findings[0].fired_at == T0 + 30 * MIN  # fired when billing was known, dated when idle passed 30m
    assert findings[-1].waste_usd == pytest.approx(32.0 * 45 / 60, rel=1e-6)


def test_only_matching_resources(ruleset):
    """The shipped rule matches gpu_instance and notebook, not inference endpoints."""
    events = [usage(T0, resource_type="inference_endpoint")]
    events += [e for e in timeline(T0, T0 + 60 * MIN, IDLE8) if type(e).__name__ == "GpuMetric"]
    _, findings = run(ruleset, events)
    assert findings == []


def test_open_episode_reports_dollars_to_end_of_data(ruleset):
    engine, _ = run(ruleset, timeline(T0, T0 + 90 * MIN, IDLE8))
    (open_ep,) = [f for f in engine.open_episodes() if f.type == "idle_gpu"]
    assert open_ep.action == "update"
    assert open_ep.waste_usd == pytest.approx(32.0 * (90 * MIN - 30) / 3600, rel=1e-6)


def test_a_late_sample_from_before_a_stop_starts_no_episode_with_the_resolved_ones_start(ruleset):
    """Idle 45m, stopped (resolved), one GPU's sample of the first scrape arriving late, then started
    again two minutes later and idle: the new episode starts when it runs again. The late sample
    (before the stop, which breaks the episode as a busy sample does) started one at its own time,
    here the resolved episode's start: the same alert id, whose fire and updates the alert manager
    drops as a replay's."""
    late = [s for s in scrape(T0, IDLE8) if s.gpu_index == 7]
    events = timeline(T0, T0 + 45 * MIN, IDLE8) + [usage(T0 + 45 * MIN, state="stopped", usd_per_hour=0.0), *late]
    events += timeline(T0 + 47 * MIN, T0 + 110 * MIN, IDLE8)
    _, found = run(ruleset, events)
    assert actions(found) == ["fire", "resolve", "fire"]
    assert [f.episode_start for f in found if f.action == "fire"] == [T0, T0 + 47 * MIN]
    alerts = AlertManager(ruleset=ruleset).handle(found)
    assert [a.change for a in alerts if a.change != "updated"] == ["fired", "resolved", "fired"]
    assert alerts[-1].status == "firing" and alerts[-1].alert_id != alerts[0].alert_id


def _read(events, usage_behind_s: float = 0.0):
    """``events`` in time order as one consumer reads them with the usage topic ``usage_behind_s``
    behind the samples (an exporter flushing minutes at once, a backlog)."""

    def when(e):
        t = e.ts.timestamp()
        return (t + usage_behind_s, 1) if type(e).__name__ == "UsageEvent" else (t, 0)

    return sorted(events, key=when)


def _summary(findings):
    return [(f.action, f.episode_start, f.fired_at, f.at, round(f.waste_usd, 6)) for f in findings]


@pytest.mark.parametrize("behind_min", [1, 5, 9])
def test_usage_read_behind_the_samples_gives_time_orders_findings(ruleset, behind_min):
    """Idle 45 minutes, stopped at 45:00 (scrapes a minute past it): fired at 30:00 and resolved at the
    stop, with the dollars of 45 minutes, however far behind the samples usage is read. Read behind,
    samples past the stop were counted before it came: taken back."""
    events = timeline(T0, T0 + 46 * MIN, IDLE8)
    events = [e for e in events if not (type(e).__name__ == "UsageEvent" and e.ts.timestamp() >= T0 + 45 * MIN)]
    events = sorted(events + [usage(T0 + 45 * MIN, state="stopped", usd_per_hour=0.0)], key=lambda e: e.ts)
    _, in_order = run(ruleset, events)
    _, behind = run(ruleset, _read(events, usage_behind_s=behind_min * MIN))
    assert actions(in_order) == ["fire", "resolve"]
    assert _summary(behind) == _summary(in_order)
    assert in_order[-1].waste_usd == pytest.approx(32.0 * 45 / 60, rel=1e-6)


@pytest.mark.parametrize(("rule_type", "utils", "sm", "for_min"), [
    ("idle_gpu", [0.0] * 8, None, 30), ("stuck_gpu", [100.0] * 8, [0.0] * 8, 20),
    ("partly_idle_gpu", [90.0] * 4 + [0.0] * 4, None, 30)])  # fmt: skip
@pytest.mark.parametrize(("dark_min", "back_min", "behind_min"),
                         [(45, 55, 11), (45, 55, 15), (41, 49, 11), (41, 47, 3), (45, 49, 11), (45, 47, 6)])  # fmt: skip
def test_a_stop_read_after_a_restarted_hosts_samples_ends_the_episode_at_the_stop(ruleset, rule_type, utils, sm, for_min,
                                                                                  dark_min, back_min, behind_min):  # fmt: skip
    """Stopped at 45:00 and started again at 55:00 (or dark from 41:00, stopped at 45:00 and back at
    49:00 or 47:00; or a reboot of 4 or 2 minutes, no longer than ``stale_after``, bridged as idle),
    idle (stuck, half idle) throughout, the stop read after the samples that came back (usage read
    minutes behind). The stop lies in the gap: the
    episode resolves at the stop with time order's dollars ($24.00 for the whole host's 45 minutes;
    before, the minutes after the restart read before the stop were claimed too, $25.33 to $26.13,
    and by the next episode again, which began only after the stop was read; or, back within
    ``stale_after`` of the stop and read before it, minutes never counted were taken back, $20.53),
    and the samples after the gap are an episode of their own, which fires ``for`` later as in time
    order. ``partly_idle_gpu`` counts its four idle GPUs to their latest scrape before the stop."""

    def spell(start: float, end: float) -> list:
        minutes = int((end - start) // MIN)
        return [e for i in range(2 * minutes) for e in scrape(start + 30 * i, utils, sm=sm)] + [
            usage(start + i * MIN) for i in range(minutes)]  # fmt: skip

    events = spell(T0, T0 + dark_min * MIN) + [usage(T0 + i * MIN) for i in range(dark_min, 45)]
    events += [usage(T0 + i * MIN, state="stopped", usd_per_hour=0.0) for i in range(45, back_min)]
    events = sorted(events + spell(T0 + back_min * MIN, T0 + 100 * MIN), key=lambda e: e.ts)
    found = lambda evs: [f for f in Engine(ruleset).process(evs) if f.type == rule_type and f.action != "update"]  # noqa: E731
    in_order = found(events)
    back = T0 + back_min * MIN
    assert [(f.action, f.episode_start, f.at) for f in in_order] == [
        ("fire", T0, T0 + for_min * MIN), ("resolve", T0, T0 + 45 * MIN), ("fire", back, back + for_min * MIN)]  # fmt: skip
    half_to_last_scrape = 16.0 * (min(dark_min, 45) - 0.5) / 60
    assert in_order[1].waste_usd == pytest.approx(half_to_last_scrape if rule_type == "partly_idle_gpu" else 24.0, abs=1e-3)
    assert _summary(found(_read(events, usage_behind_s=behind_min * MIN))) == _summary(in_order)


def test_a_stop_at_the_first_sample_after_a_gap_is_read_after_it_in_time_order(ruleset):
    """Idle from 0:00, the exporter dark 40:00-50:00 while billed, a scrape and a one-minute stop both
    at 50:00, running again from 51:00. In time order the sample comes first at a tie (``align``): the
    open episode resolves at the stop and the next starts at 51:00, the first sample after it. A stop at
    the gap's end taken as within the gap started it at 50:00 and counted the stopped minute (a review's
    reproduction, red before)."""
    events = [e for i in range(80) for e in scrape(T0 + 30 * i, IDLE8)] + [usage(T0 + i * MIN) for i in range(50)]
    events += scrape(T0 + 50 * MIN, IDLE8) + [usage(T0 + 50 * MIN, state="stopped")]
    events += [e for i in range(51 * 2, 100 * 2) for e in scrape(T0 + 30 * i, IDLE8)]
    events += [usage(T0 + i * MIN) for i in range(51, 100)]
    _, found = run(ruleset, _read(events))
    fires = [f for f in found if f.action == "fire"]
    assert [(f.episode_start, f.fired_at) for f in fires[1:]] == [(T0 + 51 * MIN, T0 + 81 * MIN)]


def test_a_fire_made_by_the_first_usage_read_behind_its_samples_is_kept_by_a_stop_after_that_usage(ruleset):
    """A host idle from its first sample, its usage starting at 30:30 (the host not known before, so not
    billed) and stopped at 33:00. In time order it fires at that first usage and resolves at the stop.
    Read with usage 5 minutes behind, the fire comes at that usage too, after samples to 35:30: the stop
    precedes those samples but not the usage that made the fire, so it resolves the alert (time order's
    dollars), and does not withdraw it, which a fire dated by its newest sample would."""
    events = timeline(T0, T0 + 36 * MIN, IDLE8, with_usage=False)
    events += [usage(T0 + (30.5 + k) * MIN) for k in range(2)] + [usage(T0 + 33 * MIN, state="stopped")]
    events.sort(key=lambda e: e.ts)
    _, in_order = run(ruleset, events)
    _, behind = run(ruleset, _read(events, usage_behind_s=5 * MIN))
    assert [(f.action, f.fired_at, f.details.get("reason")) for f in in_order] == [
        ("fire", T0 + 30 * MIN, None), ("resolve", T0 + 30 * MIN, "instance_stopped")]  # fmt: skip
    assert [(f.action, f.fired_at, f.details.get("reason")) for f in behind] == [
        (f.action, f.fired_at, f.details.get("reason")) for f in in_order]  # fmt: skip
    assert behind[-1].waste_usd == pytest.approx(in_order[-1].waste_usd, abs=0.005)


def test_a_stop_before_the_fire_withdraws_it_however_many_samples_were_read_past_the_stop(ruleset):
    """Stopped at 28:00 and started again at 29:30, idle throughout, the usage from 25:00 read after
    the samples to 36:00 (a review's case). In time order the stop ends the spell before its half hour
    and nothing fires (the restarted host's spell is 6.5 minutes). Read so, the spell fired at 30:00 on
    samples from both sides of the stop; the stop, dated before that, withdraws it with no dollars,
    though more than ``stale_after`` of samples came past it (a bound that holds only the dollars'
    take-back: it had left this alert standing at $19.20)."""
    samples = [e for t in [*range(0, 28 * 60 + 1, 30), *range(29 * 60 + 30, 36 * 60 + 1, 30)]
               for e in scrape(T0 + t, IDLE8)]  # fmt: skip
    usages = [usage(T0 + m * MIN, state="stopped" if m == 28 else "running") for m in range(37)]
    events = sorted(samples + usages, key=lambda e: e.ts)
    _, in_order = run(ruleset, events)
    cut = T0 + 25 * MIN
    late = [e for e in events if e.ts.timestamp() < cut] + [e for e in samples if e.ts.timestamp() >= cut]
    _, live = run(ruleset, late + [u for u in usages if u.ts.timestamp() >= cut])
    assert in_order == []
    assert [(f.action, f.fired_at, f.details.get("reason"), f.waste_usd) for f in live] == [
        ("fire", T0 + 30 * MIN, None, pytest.approx(16.0)), ("resolve", T0 + 30 * MIN, "withdrawn", 0.0)]  # fmt: skip


@pytest.mark.parametrize("rule_type", ["idle_gpu", "partly_idle_gpu"])
def test_a_stop_from_before_the_episode_began_read_late_or_sent_again_leaves_it_alone(ruleset, rule_type):
    """Busy, stopped at 20:00, running again at 21:00 and idle (all GPUs, or half) to 70:00: in time
    order one alert fires at 51:00 and stays open. The stop read after the idle samples (usage 5 or
    35 minutes behind, a backlog), or sent again at 55:00 (an exporter's retry), came before the
    episode began: it neither ends nor withdraws it (a review found it withdrawn, $0, once a
    withdrawal had no lower bound, and before that resolved, $18.13; 5 minutes behind, it restarted
    the count under another alert id)."""
    idle = IDLE8 if rule_type == "idle_gpu" else [90.0] * 4 + [1.0] * 4
    samples = [e for t in range(0, 20 * 60, 30) for e in scrape(T0 + t, BUSY8)]
    samples += [e for t in range(21 * 60, 70 * 60, 30) for e in scrape(T0 + t, idle)]
    usages = [usage(T0 + m * MIN, state="stopped" if m == 20 else "running") for m in range(70)]
    in_order = sorted(samples + usages, key=lambda e: e.ts)
    again = [e for e in in_order if e.ts.timestamp() <= T0 + 55 * MIN]
    again += [usage(T0 + 20 * MIN, state="stopped")] + [e for e in in_order if e.ts.timestamp() > T0 + 55 * MIN]

    def found(events):
        return [(f.action, f.episode_start, f.fired_at, f.details.get("reason"), round(f.waste_usd, 2))
                for f in Engine(ruleset).process(events) if f.type == rule_type and f.action != "update"]  # fmt: skip

    want = found(in_order)
    assert [(a, start - T0, fired - T0) for a, start, fired, *_ in want] == [("fire", 21 * MIN, 51 * MIN)]
    for events in (_read(in_order, 5 * MIN), _read(in_order, 35 * MIN), again):
        assert found(events) == want


@pytest.mark.parametrize("rule_type", ["idle_gpu", "partly_idle_gpu"])
def test_a_stop_read_after_the_sample_that_resolved_the_episode_withdraws_that_too(ruleset, rule_type):
    """Stopped at 28:00 and started again at 29:30, idle (all GPUs, or half) to 33:00 and busy after, the
    usage from 25:00 read after the samples to 36:00. In time order the stop ends the spell short of its
    half hour, and nothing fires. Read so, the spell fired at 30:00 and a busy sample resolved it at
    33:00 before the stop came: the stop, dated before the fire, takes it back all the same (the
    episode is kept for it until a usage event after its fire), and the alert manager lets that through
    once after the resolution, as change ``withdrawn`` (before, it stood with its dollars)."""
    idle = IDLE8 if rule_type == "idle_gpu" else [90.0] * 4 + [1.0] * 4
    samples = [e for t in [*range(0, 28 * 60 + 1, 30), *range(29 * 60 + 30, 33 * 60, 30)] for e in scrape(T0 + t, idle)]
    samples += [e for t in range(33 * 60, 36 * 60 + 1, 30) for e in scrape(T0 + t, BUSY8)]
    usages = [usage(T0 + m * MIN, state="stopped" if m == 28 else "running") for m in range(37)]
    events = sorted(samples + usages, key=lambda e: e.ts)
    cut = T0 + 25 * MIN
    late = [e for e in events if e.ts.timestamp() < cut] + [e for e in samples if e.ts.timestamp() >= cut]
    late += [u for u in usages if u.ts.timestamp() >= cut]

    def found(events):
        return [f for f in Engine(ruleset).process(events) if f.type == rule_type]

    assert found(events) == []
    live = [f for f in found(late) if f.action != "update"]
    assert [(f.action, f.episode_start, f.fired_at, f.details.get("reason"), f.waste_usd > 0) for f in live] == [
        ("fire", T0, T0 + 30 * MIN, None, True), ("resolve", T0, T0 + 30 * MIN, "gpu_busy", True),
        ("resolve", T0, T0 + 30 * MIN, "withdrawn", False)]  # fmt: skip
    assert live[-1].at == T0 + 28 * MIN
    manager = AlertManager(ruleset=ruleset)
    changes = manager.handle(found(late))
    assert [(a.change, a.status, a.withdrawn, a.waste_usd) for a in changes if a.change != "updated"][-2:] == [
        ("resolved", "resolved", False, pytest.approx(live[1].waste_usd)), ("withdrawn", "resolved", True, 0.0)]  # fmt: skip
    assert manager.handle(found(late)) == []  # read again (a restart): nothing goes through twice


def test_a_usage_event_after_the_fire_lets_the_resolved_episode_go(ruleset):
    """The resolved episode is kept only until a usage event dated after its fire: a stop after that
    (here at 34:00, the host busy since 33:00) resolves nothing and takes nothing back, in time order or
    read behind."""
    samples = [e for t in range(0, 33 * 60, 30) for e in scrape(T0 + t, IDLE8)]
    samples += [e for t in range(33 * 60, 36 * 60 + 1, 30) for e in scrape(T0 + t, BUSY8)]
    usages = [usage(T0 + m * MIN, state="stopped" if m == 34 else "running") for m in range(35)]
    events = sorted(samples + usages, key=lambda e: e.ts)
    _, in_order = run(ruleset, events)
    _, behind = run(ruleset, _read(events, usage_behind_s=5 * MIN))
    assert actions(in_order) == ["fire", "resolve"] and in_order[-1].details["reason"] == "gpu_busy"
    assert _summary(behind) == _summary(in_order)


@pytest.mark.parametrize("rule_type", ["idle_gpu", "partly_idle_gpu"])
def test_a_stop_sent_again_after_the_host_ran_again_neither_hides_nor_delays_the_fire(ruleset, rule_type):
    """Hourly usage: stopped the hour before T0, running from T0, idle (all GPUs, or half) for 40
    minutes, then busy. In time order the rule fires at 30:00 and resolves at 40:00. The stop sent
    again (an at-least-once producer's retry) and read after the samples to 29:30 is older than the
    usage of T0 already read: the host's billing state stays what that usage said. It used to take
    the stop's (the host not billed until the next hourly interval): the fire at 30:00 was not
    made, and the episode ended at 40:00 unseen."""
    idle = IDLE8 if rule_type == "idle_gpu" else [90.0] * 4 + [1.0] * 4
    stop = usage(T0 - 60 * MIN, state="stopped", usd_per_hour=0.0, interval_s=3600.0)
    usages = [usage(T0 - 120 * MIN, interval_s=3600.0), stop, usage(T0, interval_s=3600.0)]
    samples = [e for t in range(0, 40 * 60, 30) for e in scrape(T0 + t, idle)]
    samples += [e for t in range(40 * 60, 50 * 60, 30) for e in scrape(T0 + t, BUSY8)]
    read = sorted(usages + samples, key=lambda e: e.ts)
    cut = next(i for i, e in enumerate(read) if e.ts.timestamp() > T0 + 29.5 * MIN)
    again = [*read[:cut], stop, *read[cut:]]

    def found(events):
        return [(f.action, f.episode_start, f.fired_at, f.at, f.details.get("reason"), round(f.waste_usd, 2))
                for f in Engine(ruleset).process(events) if f.type == rule_type and f.action != "update"]  # fmt: skip

    want = found(sorted(again, key=lambda e: e.ts))  # backtest's order: the copy beside the stop
    assert [(a, start - T0, fired - T0, at - T0) for a, start, fired, at, *_ in want] == [
        ("fire", 0.0, 30 * MIN, 30 * MIN), ("resolve", 0.0, 30 * MIN, 40 * MIN)]  # fmt: skip
    assert found(again) == want


@pytest.mark.parametrize("rule_type", ["idle_gpu", "partly_idle_gpu"])
def test_a_stop_read_after_newer_usage_is_still_a_stop_to_the_rules(ruleset, rule_type):
    """Idle (all GPUs, or half) from 0:00, stopped for the interval of 35:00 and running again from
    36:00. The stop's interval read after the usage of 36:00 and 37:00 (a producer's retry, out of order)
    is older than the key's newest usage, which the key keeps, but the rules read the stop's own word:
    the episode resolves at 35:00 with time order's dollars."""
    idle = IDLE8 if rule_type == "idle_gpu" else [90.0] * 4 + [1.0] * 4
    stop = usage(T0 + 35 * MIN, state="stopped", usd_per_hour=0.0)
    usages = [stop if m == 35 else usage(T0 + m * MIN) for m in range(40)]
    samples = [e for t in [*range(0, 35 * 60, 30), *range(36 * 60, 40 * 60, 30)] for e in scrape(T0 + t, idle)]
    in_order = sorted(usages + samples, key=lambda e: e.ts)
    cut = next(i for i, e in enumerate(in_order) if e.ts.timestamp() > T0 + 37 * MIN)
    late = [e for e in in_order[:cut] if e is not stop] + [stop] + in_order[cut:]

    def first(events):
        return [(f.action, f.fired_at, f.at, f.details.get("reason"), round(f.waste_usd, 2))
                for f in Engine(ruleset).process(events)
                if f.type == rule_type and f.action != "update" and f.episode_start == T0]  # fmt: skip

    want = first(in_order)
    assert [(a, fired - T0, at - T0, reason) for a, fired, at, reason, _ in want] == [
        ("fire", 30 * MIN, 30 * MIN, None), ("resolve", 30 * MIN, 35 * MIN, "instance_stopped")]  # fmt: skip
    assert first(late) == want


def test_a_running_interval_sent_again_after_the_stop_fires_nothing(ruleset):
    """The host's usage said stopped at 10:00 while idle samples kept coming (its usage is what bills it:
    no alert); its running interval of 5:00, sent again, is read at 45:00. It says how the host was
    billed then, not now: in time order nothing fires, and read late it fires nothing either (it fired,
    an alert time order never makes, dated 30 minutes into samples of a stopped host)."""
    events = timeline(T0, T0 + 45 * MIN, IDLE8, with_usage=False)
    events += [usage(T0 + m * MIN) for m in range(10)] + [usage(T0 + 10 * MIN, state="stopped")]
    events.sort(key=lambda e: e.ts)
    _, in_order = run(ruleset, events)
    _, resent = run(ruleset, [*events, usage(T0 + 5 * MIN)])
    assert in_order == [] and resent == []


def test_a_gap_saved_as_four_figures_reads_as_six_and_a_gap_of_other_lengths_is_refused():
    """``GpuEpisodeState.resumed`` as a snapshot of 2026-12-05 saved it, before bridged gaps were kept:
    a gap not counted (the dollars after it the same as before). Any other length is not a gap."""
    from detector.detectors.gpu_episode import GpuEpisodeState

    def decode(resumed):
        saved = msgspec.msgpack.encode({"since": 1.0, "fired_at": 2.0, "resumed": resumed})
        return msgspec.msgpack.decode(saved, type=GpuEpisodeState)

    assert decode([10.0, 400.0, 5.0, 0.0]).resumed == (10.0, 400.0, 5.0, 0.0, 5.0, 0.0)
    assert decode([10.0, 100.0, 5.0, 0.0, 6.0, 0.0]).resumed == (10.0, 100.0, 5.0, 0.0, 6.0, 0.0)
    with pytest.raises(msgspec.ValidationError):
        decode([10.0, 100.0, 5.0])


GAP_RULES = [("idle_gpu", [0.0] * 8, None), ("stuck_gpu", [100.0] * 8, [0.0] * 8),
             ("partly_idle_gpu", [90.0] * 4 + [0.0] * 4, None)]  # fmt: skip


def _rebooted(utils, sm, step: float, jitter: float, missed: tuple[float, float] | None) -> list:
    """Running (idle, stuck, half idle) 0:00-45:00, stopped 45:00-55:00, running again to 100:00: scrapes
    every ``step`` seconds, every other one ``jitter`` late, none in ``missed`` (minutes)."""
    events, k = [], 0
    while k * step < 100 * MIN:
        t = k * step + (jitter if k % 2 else 0.0)
        if not (45 * MIN <= t < 55 * MIN or (missed is not None and missed[0] < t < missed[1])):
            events += scrape(T0 + t, utils, sm=sm)
        k += 1
    return events + [usage(T0 + m * MIN, state="stopped" if 45 <= m < 55 else "running") for m in range(100)]


def _of(ruleset, rule: str, events: list, behind_s: float = 0.0) -> list:
    return [(f.action, f.episode_start, f.at, round(f.waste_usd, 3))
            for f in Engine(ruleset).process(_read(events, usage_behind_s=behind_s))
            if f.type == rule and f.action != "update"]  # fmt: skip


@pytest.mark.parametrize(("rule", "utils", "sm"), GAP_RULES)
def test_a_missed_scrape_after_a_reboot_does_not_hide_the_stop_in_its_gap(ruleset, rule, utils, sm):
    """Scrapes every 30 s, two minutes of them missed at 60:00-62:00, usage read 20 minutes behind: time
    order resolves at 45:00 ($24.00; $11.87 half idle) and starts the next episode at 55:00. Keeping only
    the latest gap over a minute, the missed scrapes hid the reboot's ($29.07, next from 65:30; a
    review's reproduction, red before): a shorter bridged gap does not replace the one kept."""
    events = _rebooted(utils, sm, 30.0, 0.0, (60 * MIN, 62 * MIN))
    assert _of(ruleset, rule, events, 20 * MIN) == _of(ruleset, rule, events)


@pytest.mark.parametrize(("rule", "utils", "sm"), GAP_RULES)
def test_a_jittered_minute_scrape_after_a_reboot_does_not_hide_the_stop_in_its_gap(ruleset, rule, utils, sm):
    """Scrapes every 60 s, every other one 0.5 s late (intervals of 60.5 s: each a gap over a minute), none
    missed, usage read 15 minutes behind: time order's $24.00 ($11.73 half idle), next from 55:00 (a
    review's reproduction: $26.13, next from 61:00, red before)."""
    events = _rebooted(utils, sm, 60.0, 0.5, None)
    assert _of(ruleset, rule, events, 15 * MIN) == _of(ruleset, rule, events)


@pytest.mark.parametrize(("rule", "utils", "sm"), GAP_RULES)
@pytest.mark.parametrize("behind_min", [5, 9])
def test_a_stop_in_a_bridged_gap_before_the_fire_starts_the_next_candidate_at_the_gap_s_end(ruleset, rule, utils, sm,
                                                                                              behind_min):  # fmt: skip
    """Idle (stuck, half idle) from 0:00, a reboot before ``for``: dark 11:30-15:00, stopped 12:00-15:00 (a
    gap no longer than ``stale_after``, bridged). In time order the stop ends the candidate, and the next
    starts at the first sample after the gap (15:00). Live, the usage topic minutes behind, the gap was
    kept only once an episode had fired: the candidate ran across it, ended at the stop's reading, and the
    next started at the first sample after that (17:30 or 21:30: its alert id and fire minutes late; a
    fuzz's find, red before). ``stuck_gpu`` (``for`` 20 minutes), its usage 9 minutes behind, fires
    before the stop is read and takes that fire back: what stood is compared."""
    events = [e for k in range(200) if not 11.5 * MIN < 30 * k < 15 * MIN for e in scrape(T0 + 30 * k, utils, sm=sm)]
    events += [usage(T0 + m * MIN, state="stopped" if 12 <= m < 15 else "running") for m in range(100)]
    in_order = _of(ruleset, rule, events)
    assert [x[:2] for x in in_order] == [("fire", T0 + 15 * MIN)]
    live = _of(ruleset, rule, events, behind_min * MIN)
    withdrawn = {since for action, since, _, usd in live if action == "resolve" and usd == 0.0}
    assert [x for x in live if x[1] not in withdrawn] == in_order


@pytest.mark.parametrize(("rule", "utils", "sm"), GAP_RULES[:2])
@pytest.mark.parametrize(("stopped", "dark"), [((45, 55), (56, 63)), ((45, 47), (50, 54))])
def test_a_later_dark_spell_does_not_hide_the_reboot_s_gap(ruleset, rule, utils, sm, stopped, dark):
    """Stopped 45:00-55:00 (the reboot's gap), then dark again while running, 56:00-63:00 (longer than
    ``stale_after``); or a reboot of 2 minutes, then dark 50:00-54:00 (both bridged, the later longer:
    it replaced the reboot's). Usage read 20 minutes behind. Only one gap was kept: the stop at 45:00
    fell in none, and the episode resolved with the dollars of samples after the restart ($25.33 or
    $34.67 for time order's $24.00), the next one from 65:30 (for 63:00 or 47:00; a review's
    reproduction and a fuzz's, red before). Up to four gaps are kept now: the stop cuts at its own,
    and the samples after it are a candidate, which a later dark spell longer than ``stale_after``
    starts again, as in time order."""
    def scraped(m: float) -> bool:
        return not (stopped[0] <= m < stopped[1] or dark[0] < m < dark[1])

    events = [e for k in range(200) if scraped(k / 2) for e in scrape(T0 + 30 * k, utils, sm=sm)]
    events += [usage(T0 + m * MIN, state="stopped" if stopped[0] <= m < stopped[1] else "running") for m in range(100)]
    in_order = _of(ruleset, rule, events)
    assert in_order[1][:2] == ("resolve", T0) and in_order[1][3] == pytest.approx(24.0, abs=1e-3)
    assert _of(ruleset, rule, events, 20 * MIN) == in_order


@pytest.mark.parametrize(("rule", "utils", "sm"), GAP_RULES[:2])
def test_a_fifth_gap_as_short_as_the_stop_s_does_not_push_it_out(ruleset, rule, utils, sm):
    """A one-minute stop at 50:00 (a gap of 1.5 minutes in scrapes every 30 s), then four missed pairs of
    scrapes as long, usage read 15 minutes behind: past four gaps the shortest goes, and of equal ones
    the oldest went, the stop's: $34.67 for time order's $26.67, the next episode from 65:30 for 51:00
    (a review's reproduction, red before). Of equal ones the newest goes now: usage is read in order."""
    darks = [(52.5, 54), (55.5, 57), (58.5, 60), (61.5, 63)]

    def scraped(m: float) -> bool:
        return not (50 <= m < 51 or any(a < m < b for a, b in darks))

    events = [e for k in range(200) if scraped(k / 2) for e in scrape(T0 + 30 * k, utils, sm=sm)]
    events += [usage(T0 + m * MIN, state="stopped" if m == 50 else "running") for m in range(100)]
    assert _of(ruleset, rule, events, 15 * MIN) == _of(ruleset, rule, events)


def test_a_saved_state_with_an_empty_gap_list_is_refused(ruleset):
    """A snapshot whose ``resumed`` is empty (none is written so: a corrupt one) is refused and the rule
    starts afresh, rather than failing on every running usage event after (a review's find, red before)."""
    events = sorted([e for k in range(80) for e in scrape(T0 + 30 * k, [0.0] * 8)]
                    + [usage(T0 + m * MIN) for m in range(40)], key=lambda e: e.ts)  # fmt: skip
    first = Engine(ruleset)
    list(first.process(events))
    first._keys["host-1"].rules["idle-gpu"].resumed = ()
    again = Engine(ruleset)
    again.restore("host-1", first.snapshot("host-1"))
    state = again._keys["host-1"].rules.get("idle-gpu")
    assert state is None or state.resumed is None


def _resolved(ruleset, rule: str, events: list, behind_s: float = 0.0) -> list:
    """What stood: a corrected resolution in place of the one it corrects (``details['corrected']``); a fire's
    dollars left out (live, those as of when the price was known)."""
    found = [f for f in Engine(ruleset).process(_read(events, usage_behind_s=behind_s))
             if f.type == rule and f.action != "update"]  # fmt: skip
    corrected = {f.episode_start for f in found if f.details.get("corrected")}
    stood = [f for f in found if f.action == "fire" or f.details.get("corrected") or f.episode_start not in corrected]
    return sorted((f.action, f.episode_start, f.at, round(f.waste_usd, 3) if f.action == "resolve" else None,
                   f.details.get("reason")) for f in stood)  # fmt: skip


def _restarted(utils, sm, busy_from_min: float) -> list:
    """Idle (stuck, half idle) from 0:00, stopped 45:00-55:00 and dark, idle again from 55:00 and busy from
    ``busy_from_min``, scrapes every 30 s and usage every minute, to 100:00."""
    busy = [90.0] * 8

    def at(k: int) -> list:
        m = k / 2
        if 45 <= m < 55:
            return []
        return scrape(T0 + 30 * k, busy, sm=None) if m >= busy_from_min else scrape(T0 + 30 * k, utils, sm=sm)

    events = [e for k in range(200) for e in at(k)]
    return events + [usage(T0 + m * MIN, state="stopped" if 45 <= m < 55 else "running") for m in range(100)]


@pytest.mark.parametrize(("rule", "utils", "sm"), GAP_RULES)
@pytest.mark.parametrize("behind_min", [20, 40])
def test_a_stop_read_after_the_sample_that_resolved_the_episode_corrects_the_resolution(ruleset, rule, utils, sm,
                                                                                        behind_min):  # fmt: skip
    """Stopped 45:00-55:00, idle again after the restart to 60:00, busy after; usage read 20 or 40 minutes
    behind. In time order the stop resolves the episode at 45:00 ($24.00; $11.73 half idle) and the five
    idle minutes after the restart fire nothing. Read live, the busy sample at 60:00 resolved it before
    the stop came, with the minutes after the restart ($26.67; $12.80 half idle), and nothing changed once
    the stop was read (red before). Now the stop, in a gap before that resolution, corrects it: a second
    resolution of the same episode, ``corrected``, with time order's time and dollars, saying what it
    replaces."""
    events = _restarted(utils, sm, 60)
    in_order = _resolved(ruleset, rule, events)
    assert [x[:3] + x[4:] for x in in_order] == [("fire", T0, T0 + (20 if rule == "stuck_gpu" else 30) * MIN, None),
                                                 ("resolve", T0, T0 + 45 * MIN, "instance_stopped")]  # fmt: skip
    assert _resolved(ruleset, rule, events, behind_min * MIN) == in_order
    live = [f for f in Engine(ruleset).process(_read(events, usage_behind_s=behind_min * MIN))
            if f.type == rule and f.action == "resolve"]  # fmt: skip
    first, correction = live
    assert first.at == T0 + 60 * MIN and first.details["reason"] in ("gpu_busy", "gpu_active")
    assert correction.details["corrected"] is True and correction.episode_start == first.episode_start
    assert correction.details["was_resolved_at"] == first.at
    assert correction.details["was_usd"] == round(first.waste_usd, 2) > round(correction.waste_usd, 2)
    found = [f for f in Engine(ruleset).process(_read(events, usage_behind_s=behind_min * MIN)) if f.type == rule]
    manager = AlertManager(ruleset=ruleset)
    changes = [(a.change, a.resolved_at, a.waste_usd) for a in manager.handle(found) if a.change != "updated"]
    assert changes[-2:] == [("resolved", first.at, pytest.approx(first.waste_usd)),
                            ("corrected", correction.at, pytest.approx(correction.waste_usd))]  # fmt: skip
    assert manager.handle(found) == []  # read again (a restart): nothing goes through twice


@pytest.mark.parametrize(("rule", "utils", "sm"), GAP_RULES[:2])
def test_a_corrected_resolution_brings_the_episode_after_the_restart_that_time_order_fired(ruleset, rule, utils, sm):
    """The same restart, idle after it to 90:00 (35 minutes, past ``for``), usage read 50 minutes behind, so
    the busy sample at 90:00 resolved the one episode before the stop was read. Time order resolves at
    the stop, and the samples after the gap are an episode of their own, fired at 55:00 + ``for`` and
    resolved at 90:00: with the correction come that episode's fire and resolution, with time order's
    dates and dollars (before, one episode from 0:00 to 90:00)."""
    events = _restarted(utils, sm, 90)
    in_order = _resolved(ruleset, rule, events)
    assert [x[:2] for x in in_order] == [("fire", T0), ("fire", T0 + 55 * MIN), ("resolve", T0),
                                         ("resolve", T0 + 55 * MIN)]  # fmt: skip
    assert _resolved(ruleset, rule, events, 50 * MIN) == in_order


@pytest.mark.parametrize(("rule", "utils", "sm", "stop_min"), [(*r, None) for r in GAP_RULES[:2]] + [(*GAP_RULES[0], 10)])
@pytest.mark.parametrize("behind_min", [40, 60])
def test_a_candidate_broken_before_its_first_usage_is_read_fires_as_in_time_order(ruleset, rule, utils, sm, stop_min,
                                                                                   behind_min):  # fmt: skip
    """A new host idle (stuck) from 0:00 to 36:30 and busy after, its usage read 40 or 60 minutes behind
    (an exporter flushing an hour at once). In time order it fires at ``for`` and resolves at 36:30.
    Live, the candidate lasted ``for`` before any usage was read and broke before the first came, and
    nothing ever fired (red before): the usage read later, billed before the break, now fires and
    resolves it, dated and priced as time order did. With a stop at 10:00 (usage saying stopped while
    the samples go on: hostile input), time order fires nothing, and live the stop read after takes the
    fire back. (``stuck_gpu``'s 20 minutes would fire in time order from 10:30, after the stop, which a
    live worker, having withdrawn the first, does not: docs/reliability.md.)"""
    busy = [90.0] * 8
    events = [e for k in range(160) for e in (scrape(T0 + 30 * k, utils, sm=sm) if k < 73 else scrape(T0 + 30 * k, busy))]
    events += [usage(T0 + m * MIN, state="stopped" if m == stop_min else "running") for m in range(80)]
    in_order = _resolved(ruleset, rule, events)
    if stop_min is None:
        assert [x[:3] for x in in_order] == [("fire", T0, T0 + (20 if rule == "stuck_gpu" else 30) * MIN),
                                             ("resolve", T0, T0 + 36.5 * MIN)]  # fmt: skip
    else:
        assert in_order == []
    live = _resolved(ruleset, rule, events, behind_min * MIN)
    withdrawn = {x[1] for x in live if x[4] == "withdrawn"}
    assert [x for x in live if x[1] not in withdrawn] == in_order


def _stops(utils, sm, stops, darks, busy_min: float, end_min: int = 100) -> list:
    """Idle (stuck, half idle) from an hour before 0:00 to ``busy_min``, busy after; no samples in ``darks``,
    usage stopped in ``stops``."""
    events = []
    for k in range(-120, 2 * end_min):
        m = k / 2
        if any(a <= m < b for a, b in darks):
            continue
        events += scrape(T0 + 30 * k, [90.0] * 8) if m >= busy_min or m < 0 else scrape(T0 + 30 * k, utils, sm=sm)
    return events + [usage(T0 + m * MIN, state="stopped" if any(a <= m < b for a, b in stops) else "running")
                     for m in range(-60, end_min)]  # fmt: skip


@pytest.mark.parametrize(("rule", "utils", "sm", "busy_min"), [(*GAP_RULES[0], 85), (*GAP_RULES[1], 75)])
def test_the_samples_after_the_gap_that_reach_for_only_at_the_busy_one_fire_nothing(ruleset, rule, utils, sm, busy_min):
    """Stopped 45:00-55:00, idle again from 55:00, busy at exactly 55:00 + ``for``, usage 45 minutes behind.
    The busy sample does not count as idle: in time order the samples after the gap never covered
    ``for``, and nothing fires after the stop. A correction that measured them to the busy sample fired
    an episode time order never made (a review's reproduction: $16.00, $10.67)."""
    events = _stops(utils, sm, [(45, 55)], [(45, 55)], busy_min)
    in_order = _resolved(ruleset, rule, events)
    assert [x[:2] for x in in_order] == [("fire", T0), ("resolve", T0)]
    assert _resolved(ruleset, rule, events, 45 * MIN) == in_order


@pytest.mark.parametrize(("rule", "utils", "sm"), GAP_RULES[:2])
def test_a_second_stop_in_the_episode_a_correction_brought_takes_it_back_or_cuts_it(ruleset, rule, utils, sm):
    """Stopped 45:00-50:00 and 55:00-57:00 (dark to 58:00), busy from 90:00, usage 50 minutes behind. Time
    order: the first stop resolves at 45:00, the second ends the candidate from 50:00 short of ``for``, and
    the samples from 58:00 fire one of their own, resolved at 90:00 ($17.07). Live, the correction brought
    the episode from 50:00 (fired, resolved at 90:00, $21.33), which the second stop, read later, never
    touched (a review's reproduction): it is kept, so that stop takes it back, and brings the one from
    58:00."""
    events = _stops(utils, sm, [(45, 50), (55, 57)], [(45, 50), (55, 58)], 90)
    in_order = _resolved(ruleset, rule, events)
    assert [x[:2] for x in in_order if x[0] == "resolve"] == [("resolve", T0), ("resolve", T0 + 58 * MIN)]
    live = _resolved(ruleset, rule, events, 50 * MIN)
    withdrawn = {x[1] for x in live if x[4] == "withdrawn"}
    assert [x for x in live if x[1] not in withdrawn] == in_order


@pytest.mark.parametrize(("rule", "utils", "sm"), GAP_RULES[:2])
def test_a_candidate_billed_late_keeps_its_gaps_for_a_stop_read_after(ruleset, rule, utils, sm):
    """A new host idle (stuck) from 0:00, stopped and dark 40:00-50:00, busy from 50:00, its usage read an
    hour behind. Time order fires at ``for`` and the stop resolves it at 40:00. Live, the candidate broke
    at 50:00 before any usage came, the usage read later fired and resolved it there, and the stop, read
    after, corrected nothing (a review's reproduction, red before: the gaps were not kept with it)."""
    events = [e for k in range(200) if not 40 <= k / 2 < 50
              for e in (scrape(T0 + 30 * k, [90.0] * 8) if k >= 100 else scrape(T0 + 30 * k, utils, sm=sm))]  # fmt: skip
    events += [usage(T0 + m * MIN, state="stopped" if 40 <= m < 50 else "running") for m in range(100)]
    in_order = _resolved(ruleset, rule, events)
    assert [x[0] for x in in_order] == ["fire", "resolve"] and in_order[1][2:] == (T0 + 40 * MIN, in_order[1][3],
                                                                                     "instance_stopped")  # fmt: skip
    assert _resolved(ruleset, rule, events, 60 * MIN) == in_order


@pytest.mark.parametrize(("rule_type", "utils", "sm", "for_min"), [
    ("idle_gpu", [0.0] * 8, None, 30), ("stuck_gpu", [100.0] * 8, [0.0] * 8, 20)])  # fmt: skip
def test_a_fire_that_waited_minutes_for_the_first_usage_says_the_dollars_of_its_date(ruleset, rule_type, utils, sm,
                                                                                   for_min):  # fmt: skip
    """Idle (stuck) from 0, usage from 0 read ``for`` and 3 minutes behind: the fire waits for the host's billing,
    and the first usage, read 3 minutes of samples past the fire's date, makes it. Time order made it at its date
    with the dollars of ``for``; live said every dollar counted to the sample before that usage (a fire caught up
    less than ``stale_after`` past its date was not capped: $17.60 for $16.00, $12.27 for $10.67, red before)."""
    events = [e for k in range(2 * 120) for e in scrape(T0 + 30 * k, utils, sm=sm)]
    events += [usage(T0 + m * MIN) for m in range(120)]
    found = lambda evs: [(f.action, f.episode_start, f.at, round(f.waste_usd, 3))  # noqa: E731
                         for f in Engine(ruleset).process(evs) if f.type == rule_type and f.action != "update"]
    in_order = found(_read(events))
    assert in_order == [("fire", T0, T0 + for_min * MIN, round(32.0 * for_min / 60, 3))]
    assert found(_read(events, usage_behind_s=(for_min + 3) * MIN)) == in_order


@pytest.mark.parametrize(("rule_type", "utils", "sm", "for_min"), [
    ("idle_gpu", [0.0] * 8, None, 30), ("stuck_gpu", [100.0] * 8, [0.0] * 8, 20)])  # fmt: skip
@pytest.mark.parametrize("behind_min", [40, 50])
def test_fires_caught_up_after_stops_read_late_say_the_dollars_of_their_date(ruleset, rule_type, utils, sm, for_min,
                                                                           behind_min):  # fmt: skip
    """Idle (stuck) throughout, dark 60-65 (stopped 61-65) and 100-103 (stopped 101-103), usage from 0 read 40 or
    50 minutes behind: the first fire waits for the host's billing, the next two for the stop before them, and
    each is made samples after its date. Time order made each at its date, with the dollars of ``for``; live said
    every dollar counted to the sample that made it ($21.33 or $26.67 for $16.00: red before)."""
    stopped = lambda m: 61 <= m < 65 or 101 <= m < 103  # noqa: E731
    events = [e for k in range(2 * 220) if not (60 < k / 2 < 65 or 100 < k / 2 < 103)
              for e in scrape(T0 + 30 * k, utils, sm=sm)]  # fmt: skip
    events += [usage(T0 + m * MIN, state="stopped" if stopped(m) else "running") for m in range(220)]
    found = lambda evs: [f for f in Engine(ruleset).process(evs) if f.type == rule_type and f.action != "update"]  # noqa: E731
    in_order = found(_read(events))
    starts = [0, 65, 103]
    assert [(f.action, f.episode_start) for f in in_order if f.action == "fire"] == [("fire", T0 + m * MIN) for m in starts]
    assert {round(f.waste_usd, 3) for f in in_order if f.action == "fire"} == {round(32.0 * for_min / 60, 3)}
    assert _summary(found(_read(events, usage_behind_s=behind_min * MIN))) == _summary(in_order)
