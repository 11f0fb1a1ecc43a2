"""The idle-GPU detector on crafted sequences: the edges real fleets produce."""

from __future__ import annotations

import random

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


def _read(events, usage_behind_s: float = 0.0, samples_first_at: set[float] = frozenset()):
    """``events`` in time order as one consumer reads them: usage read once the samples are
    ``usage_behind_s`` past it (the usage topic read behind: an exporter flushing minutes at once, a
    backlog), and at the times in ``samples_first_at`` the samples read before usage of an earlier time."""

    def when(e):
        t = e.ts.timestamp()
        if type(e).__name__ != "UsageEvent":
            return (t, 0)
        return (t + usage_behind_s, 1) if not any(t <= s <= t + 60 for s in samples_first_at) else (t + 60, 1)

    return sorted(events, key=when)


def _summary(findings):
    return [(f.action, f.episode_start, f.fired_at, f.at, round(f.waste_usd, 6)) for f in findings]


def _stopped_at_30m(scrape_past_s: float) -> list:
    """Idle from T0 + 15 s, billed every minute, stopped at 30:00; scrapes go on a minute past it."""
    events = [e for i in range(62) for e in scrape(T0 + scrape_past_s + i * 30, IDLE8)]
    events += [usage(T0 + i * MIN) for i in range(30)] + [usage(T0 + 30 * MIN, state="stopped", usd_per_hour=0.0)]
    return sorted(events, key=lambda e: e.ts)


@pytest.mark.parametrize("past_s", [15.0, 29.0])
@pytest.mark.parametrize("order", ["time", "scrape-first", "usage-behind"])
def test_a_host_stopped_before_its_threshold_fires_nothing_whichever_topic_is_read_first(ruleset, past_s, order):
    """Stopped at 30:00; the scrape at 30:15 (or 30:29) completes the half hour counted from the first
    at 00:15. In time order the stop comes first and nothing fires. Read before the stop (its topic
    behind), that scrape found the host billed and fired, then the stop resolved it, dated before its
    fire: the fire waits for usage to reach the threshold's time, which says stopped."""
    events = _stopped_at_30m(past_s)
    read = {"time": events, "scrape-first": _read(events, samples_first_at={T0 + 30 * MIN + past_s}),
            "usage-behind": _read(events, usage_behind_s=5 * MIN)}[order]
    assert read != events or order == "time"
    _, found = run(ruleset, read)
    assert found == []


@pytest.mark.parametrize("behind_min", [1, 5, 9])
def test_usage_read_behind_the_samples_gives_time_orders_findings(ruleset, behind_min):
    """Idle 45 minutes, stopped at 45:00 (scrapes a minute past it): fired at 30:00 and resolved at the
    stop, with the dollars of 45 minutes, however far behind the samples (up to the wait) usage is read.
    Read behind, samples past the stop were counted before it came: taken back."""
    events = timeline(T0, T0 + 46 * MIN, IDLE8)
    events = [e for e in events if not (type(e).__name__ == "UsageEvent" and e.ts.timestamp() >= T0 + 45 * MIN)]
    events = sorted(events + [usage(T0 + 45 * MIN, state="stopped", usd_per_hour=0.0)], key=lambda e: e.ts)
    _, in_order = run(ruleset, events)
    _, behind = run(ruleset, _read(events, usage_behind_s=behind_min * MIN))
    assert actions(in_order) == ["fire", "resolve"]
    assert _summary(behind) == _summary(in_order)
    assert in_order[-1].waste_usd == pytest.approx(32.0 * 45 / 60, rel=1e-6)


def test_a_fire_waits_for_usage_at_most_usage_wait_past_the_threshold(ruleset):
    """Usage stops coming at 20:00 (its exporter down) while the host sits idle: the fire waits for
    billing at the threshold (30:00), then past ``usage_wait`` (10 min) fires on the billing known,
    dated as it would have been."""
    events = [e for e in timeline(T0, T0 + 60 * MIN, IDLE8)
              if type(e).__name__ != "UsageEvent" or e.ts.timestamp() < T0 + 20 * MIN]  # fmt: skip
    before_wait = [e for e in events if e.ts.timestamp() < T0 + 40 * MIN]
    assert run(ruleset, before_wait)[1] == []
    _, found = run(ruleset, events)
    fire = found[0]
    assert fire.action == "fire" and fire.episode_start == T0 and fire.fired_at == T0 + 30 * MIN
    assert fire.at == T0 + 30 * MIN
