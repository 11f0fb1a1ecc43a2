"""Telemetry health: a billed host whose GPU metrics stop is a data-quality finding."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detector.engine import Engine
from tests.helpers import MIN, T0, scrape, usage


def stale(ruleset, events):
    return [f for f in Engine(ruleset).process(events) if f.type == "telemetry_stale" and f.action != "update"]


def metrics(start: float, minutes: int) -> list:
    return [e for i in range(minutes * 2) for e in scrape(start + i * 30, [50.0] * 2)]


def billing(start: float, intervals: int, state: str = "running", interval_s: float = MIN) -> list:
    return [usage(start + i * interval_s, state=state, usd_per_hour=12.0, interval_s=interval_s)
            for i in range(intervals)]  # fmt: skip


def ordered(events):
    return sorted(events, key=lambda e: e.t)


def test_exporter_down_while_billed_fires_then_resolves_when_samples_return(ruleset):
    events = ordered(metrics(T0, 10) + billing(T0, 70) + metrics(T0 + 60 * MIN, 5))
    found = stale(ruleset, events)
    assert [f.action for f in found] == ["fire", "resolve"]
    last_sample = T0 + 10 * MIN - 30
    assert found[0].episode_start == last_sample and found[0].fired_at == last_sample + 600
    assert found[1].details["reason"] == "telemetry_back"
    assert found[1].waste_usd == pytest.approx(12.0 * 50 / 60, rel=0.05)  # ~50 blind minutes at $12/h


@pytest.mark.parametrize(
    "events",
    [
        ordered(metrics(T0, 60) + billing(T0, 60)),  # healthy
        ordered(metrics(T0, 10) + billing(T0, 10) + billing(T0 + 10 * MIN, 60, state="stopped")),  # stopped host
        billing(T0, 60),  # never sent GPU metrics (a CPU instance, say)
        ordered(metrics(T0, 10) + billing(T0, 17)),  # a 7-minute gap: under the threshold
    ],
    ids=["healthy", "stopped", "no-gpu-metrics-ever", "short-gap"],
)
def test_no_finding(ruleset, events):
    assert stale(ruleset, events) == []


def test_usage_reaching_detection_before_the_returning_sample_is_not_spent_blind(ruleset):
    """Live, a caught-up partition does not wait: the host's next usage intervals can reach
    detection before the GPU sample that ends the blind spell, though they come after it. The
    dollars are those of event order (backtest's): a chaos run's resolution read $2.91 for $2.80."""
    back = T0 + 60 * MIN
    before = ordered(metrics(T0, 10) + billing(T0, 61))  # usage up to `back`, samples stop at T0+10m
    after_usage = billing(back + MIN, 3)
    in_order = stale(ruleset, before + ordered(metrics(back, 5) + after_usage))
    usage_first = stale(ruleset, before + after_usage + metrics(back, 5))
    assert [f.action for f in usage_first] == [f.action for f in in_order] == ["fire", "resolve"]
    assert usage_first[1].waste_usd == pytest.approx(in_order[1].waste_usd)
    assert usage_first[1].at == in_order[1].at == back


def test_usage_reaching_detection_after_the_returning_sample_is_still_spent_blind(ruleset):
    """The other order: the sample that ends the spell reaches detection before the host's last
    blind intervals. They still count, and the resolution is dated at the sample (a baseline
    chaos run stored $60.54 where backtest has $64.21)."""
    back = T0 + 60 * MIN
    before = ordered(metrics(T0, 10) + billing(T0, 56))  # usage up to `back` - 5 minutes
    late_usage = billing(T0 + 56 * MIN, 8)  # 4 blind minutes, then 4 after the sample
    in_order = stale(ruleset, before + ordered(metrics(back, 5) + late_usage))
    samples_first = stale(ruleset, before + metrics(back, 5) + late_usage)
    assert [f.action for f in samples_first] == [f.action for f in in_order] == ["fire", "resolve"]
    assert samples_first[1].waste_usd == pytest.approx(in_order[1].waste_usd)
    assert samples_first[1].at == in_order[1].at == back


def test_samples_back_but_usage_never_again_resolves_after_settling(ruleset):
    """Samples return, but the host's usage stops coming: the spell resolves once samples have
    run `settle` (30 min) past the returning one, dated at it (it was left firing for good)."""
    back = T0 + 60 * MIN
    events = ordered(metrics(T0, 10) + billing(T0, 60)) + metrics(back, 35)  # no usage from `back` on
    found = stale(ruleset, events)
    assert [f.action for f in found] == ["fire", "resolve"]
    assert found[1].at == back and found[1].details["reason"] == "telemetry_back"


def test_a_host_stopped_as_samples_return_does_not_alert_when_it_runs_again(ruleset):
    """The first usage at or after the returning sample says the host stopped: the spell
    resolves, and the host running again days later, billed before its exporter is up, starts
    afresh (it fired at once: blind since the returning sample, three days before)."""
    back = T0 + 60 * MIN
    later = T0 + 3 * 86_400
    events = (ordered(metrics(T0, 10) + billing(T0, 60)) + metrics(back, 1) + billing(back + MIN, 1, state="stopped")
              + ordered(metrics(later + 12 * MIN, 3) + billing(later, 15)))  # its exporter starts late  # fmt: skip
    found = stale(ruleset, events)
    assert [f.action for f in found] == ["fire", "resolve"]


def _interleaved(events, usage_first: bool):
    """In time order, and at equal times usage before samples (``usage_first``) or after them."""
    return sorted(events, key=lambda e: (e.t, (type(e).__name__ == "GpuMetric") == usage_first))


@pytest.mark.parametrize("usage_first", [False, True], ids=["samples-first", "usage-first"])
def test_a_host_back_after_hours_away_does_not_fire_whichever_reaches_detection_first(ruleset, usage_first):
    """A host that sent nothing for three hours (neither usage nor samples: gone, not reported as
    stopped) comes back with both. Its first usage interval back and its first sample back can reach
    detection in either order (the two topics are read apart, and a consumer's batching decides it;
    a worker caught up a backlog with kills invented this alert that backtest did not have): the
    hours away were never billed, so they are not blind time, and nothing fires either way."""
    back = T0 + 4 * 3600
    events = metrics(T0, 60) + billing(T0, 60) + metrics(back, 60) + billing(back, 60)
    assert stale(ruleset, _interleaved(events, usage_first)) == []


def test_a_host_back_with_usage_but_no_samples_is_blind_from_its_first_interval_back(ruleset):
    """Back after three hours away with usage and no samples: blind from the start of its first
    interval back (an interval's ``ts`` is its start), so it fires ten minutes later, with the
    dollars billed since (not dated in the hours it was away, when nothing ran)."""
    back = T0 + 4 * 3600
    found = stale(ruleset, ordered(metrics(T0, 60) + billing(T0, 60)) + billing(back, 30))
    assert [f.action for f in found] == ["fire"]
    assert found[0].episode_start == back and found[0].fired_at == back + 600
    assert found[0].waste_usd == pytest.approx(12.0 * 11 / 60)  # the intervals from `back` to the one that fired


def test_a_short_gap_in_usage_does_not_restart_the_blind_time(ruleset):
    """Usage missing for less than ``after`` (an exporter's hiccup) is not a host gone away: the
    spell still counts from the last sample and fires when it did without the gap."""
    usage_with_gap = billing(T0, 14) + billing(T0 + 19 * MIN, 10)  # five minutes without usage
    found = stale(ruleset, ordered(metrics(T0, 5) + usage_with_gap))
    last_sample = T0 + 5 * MIN - 30
    assert [f.action for f in found] == ["fire"]
    assert found[0].episode_start == last_sample and found[0].fired_at == last_sample + 600


@pytest.mark.parametrize("usage_first", [False, True], ids=["samples-first", "usage-first"])
@pytest.mark.parametrize("samples_back", [0, 15 * MIN], ids=["samples-at-once", "samples-at-15m"])
def test_a_host_billed_by_the_hour_back_after_hours_away_does_not_fire(ruleset, usage_first, samples_back):
    """The same with hourly usage intervals (a billing export's, as long as ``after`` or longer): the
    gap is from the end of the latest interval to the start of the next, and the spell counts from
    the start of the first interval back. Read as the interval's end, the first interval back
    looked an hour old and the host fired dated in the hours it was away (even in time order when
    its samples came back a quarter of an hour after its usage)."""
    back = T0 + 4 * 3600
    hourly = 3600.0
    events = metrics(T0, 60) + billing(T0, 1, interval_s=hourly) + metrics(back + samples_back, 45) + billing(
        back, 1, interval_s=hourly)
    assert stale(ruleset, _interleaved(events, usage_first)) == []


@pytest.mark.parametrize("usage_first", [False, True], ids=["samples-first", "usage-first"])
def test_a_restarted_host_whose_exporter_dies_fires_the_same_alert_whichever_comes_first(ruleset, usage_first):
    """Stopped, then running again three hours later: one scrape 10 s into the run, then its
    exporter dies. The first interval back counts whether it reaches detection before the host's
    first sample back or after it: the spell starts at that sample either way (one alert id)."""
    restart = T0 + 3 * 3600
    before = ordered(metrics(T0, 10) + billing(T0, 10) + billing(T0 + 10 * MIN, 5, state="stopped"))
    sample, intervals = scrape(restart + 10, [50.0] * 2), billing(restart, 30)
    back = intervals[:1] + sample + intervals[1:] if usage_first else sample + intervals
    found = stale(ruleset, before + back)
    assert [(f.action, f.episode_start) for f in found] == [("fire", restart + 10)]


def _usage_behind(events, behind_s: float):
    """``events`` as a live worker reads them with the usage topic ``behind_s`` behind the samples (an
    exporter flushing minutes of intervals at once)."""
    return sorted(events, key=lambda e: (e.t + behind_s, 1) if type(e).__name__ == "UsageEvent" else (e.t, 0))


@pytest.mark.parametrize("dark_s", [690, 900, 1500])
@pytest.mark.parametrize("behind_min", [2, 5, 9])
def test_a_dark_spell_over_before_its_usage_is_read_fires_as_in_time_order(ruleset, dark_s, behind_min):
    """Samples stop after 10 minutes and come back ``dark_s`` later; the host is billed throughout, its
    usage read minutes behind the samples. In time order the spell fires ``after`` (10 min) past the last
    sample and resolves at the returning one. Read so, the spell had ended before the usage that fires it
    was read: the returning sample must not forget it (it did, and a spell shorter than ``after`` plus
    the usage's lag never fired live: a fuzz over the simulated fleets found it)."""
    back = T0 + 10 * MIN + dark_s
    events = ordered(metrics(T0, 10) + billing(T0, 60) + [e for e in metrics(back, 30) if e.t < T0 + 60 * MIN])
    in_order = stale(ruleset, events)
    assert [f.action for f in in_order] == ["fire", "resolve"] and in_order[1].at == back

    def summary(found):
        return [(f.action, f.episode_start, f.fired_at, f.at, round(f.waste_usd, 6)) for f in found]

    assert summary(stale(ruleset, _usage_behind(events, behind_min * MIN))) == summary(in_order)


def test_a_stop_in_a_dark_spell_read_after_the_samples_that_came_back_leaves_the_host_seen(ruleset):
    """Dark for 12 minutes, stopped in the middle and started again, the stop read after the samples
    that came back (usage 10 minutes behind): nothing fires (not billed long enough blind), and the
    spell after the restart's last sample fires as in time order (it never did: the stop left the host
    with no latest sample, and no sample came after it)."""
    back = T0 + 22 * MIN
    events = ordered(metrics(T0, 10) + billing(T0, 14) + billing(T0 + 14 * MIN, 2, state="stopped")
                     + billing(T0 + 16 * MIN, 60) + metrics(back, 2))  # dark again from 24:00  # fmt: skip
    in_order = stale(ruleset, events)
    assert [f.action for f in in_order] == ["fire"] and in_order[0].episode_start == back + 2 * MIN - 30
    assert [(f.action, f.episode_start) for f in stale(ruleset, _usage_behind(events, 10 * MIN))] == [
        (f.action, f.episode_start) for f in in_order]  # fmt: skip


def test_a_dark_spell_of_a_host_billed_by_the_hour_fires_though_its_usage_comes_an_hour_late(ruleset):
    """Usage in hourly intervals, each sent when its hour is over (a billing export): a spell of 70
    dark minutes has ended long before the interval that fires it is read, and the one that reaches the
    returning sample comes later still. Samples wait two intervals for it, not ``settle`` (30 min): by
    then the spell had been forgotten and never fired."""
    hour = 3600.0
    back = T0 + 4 * hour + 70 * MIN
    samples = [e for e in metrics(T0, 4 * 60) + metrics(back, 180) if e.t < T0 + 8 * hour]
    hourly = billing(T0, 8, interval_s=hour)
    in_order = stale(ruleset, ordered(samples + hourly))
    assert [f.action for f in in_order] == ["fire", "resolve"] and in_order[1].at == back
    sent_hourly = sorted(samples + hourly, key=lambda e: (e.t + hour, 1) if type(e).__name__ == "UsageEvent" else (e.t, 0))
    assert [(f.action, f.fired_at, f.at, round(f.waste_usd, 6)) for f in stale(ruleset, sent_hourly)] == [
        (f.action, f.fired_at, f.at, round(f.waste_usd, 6)) for f in in_order]  # fmt: skip


def test_the_usage_that_ends_a_wait_counts_for_the_spell_going_on(ruleset):
    """In time order: hourly usage; dark 5-20 min (too short to fire, though 15 minutes: samples wait
    for usage to reach the returning one), then dark from 45 to 100 min. The interval of 1 h that
    reaches the first spell's end is also the second spell's first blind hour: it fires it (a review
    found both lost: the wait took that interval for itself alone). With minute usage and a usage gap,
    the interval that ends a wait is counted blind too."""
    samples = metrics(T0, 5) + metrics(T0 + 20 * MIN, 25) + metrics(T0 + 100 * MIN, 30)
    found = stale(ruleset, ordered(samples + billing(T0, 3, interval_s=3600.0)))
    assert [f.action for f in found] == ["fire", "resolve"] and found[0].episode_start == T0 + 45 * MIN - 30
    samples = metrics(T0, 77) + metrics(T0 + 89 * MIN, 20) + metrics(T0 + 149 * MIN, 10)
    found = stale(ruleset, ordered(samples + billing(T0, 69) + billing(T0 + 109 * MIN, 50)))
    assert [f.action for f in found] == ["fire", "resolve"] and round(found[1].waste_usd, 2) == round(12.0 * 40 / 60, 2)


def _sent_late(events, lag_s: float):
    """``events`` as read live with the usage topic ``lag_s`` behind: each interval after the samples
    of its start plus ``lag_s`` (hourly usage sent when its hour is over: one hour)."""
    return sorted(events, key=lambda e: (e.t + lag_s, 1) if type(e).__name__ == "UsageEvent" else (e.t, 0))


def _summary(found):
    return [(f.action, f.episode_start, f.fired_at, f.at, round(f.waste_usd, 6)) for f in found]


def test_a_second_dark_spell_that_ends_while_samples_wait_for_the_first_fires_as_in_time_order(ruleset):
    """Hourly usage sent when its hour is over: dark 50-70 min (the first spell, fired by the 1 h interval
    read at 2 h), samples for ten minutes, dark again 80-130 min. Samples wait for usage to reach the first
    spell's end (the 2 h interval, read at 3 h) and went dark again meanwhile: that spell was forgotten
    (the latest sample overwritten), where time order fires it. A review's reproduction."""
    samples = metrics(T0, 50) + metrics(T0 + 70 * MIN, 10) + metrics(T0 + 130 * MIN, 110)
    events = ordered(samples + billing(T0, 4, interval_s=3600.0))
    in_order = stale(ruleset, events)
    assert [(f.action, f.episode_start) for f in in_order] == [
        ("fire", T0 + 50 * MIN - 30), ("resolve", T0 + 50 * MIN - 30),
        ("fire", T0 + 80 * MIN - 30), ("resolve", T0 + 80 * MIN - 30)]  # fmt: skip
    assert _summary(stale(ruleset, _sent_late(events, 3600.0))) == _summary(in_order)


@settings(max_examples=160, derandomize=True)
@given(
    spells=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 130), st.booleans()), min_size=1, max_size=12),
    interval=st.sampled_from([60.0, 300.0, 900.0, 3600.0]),
    lag=st.sampled_from([0.0, 0.5, 1.0, "10m"]),
)
def test_dark_spells_fire_and_resolve_as_in_time_order_with_usage_read_up_to_an_interval_late(
        ruleset, spells, interval, lag):  # fmt: skip
    """Any pattern of samples and dark spells of a host billed in intervals of a minute to an hour, some
    spells the host stopped (its usage says so for every interval wholly inside), its usage read up to
    one interval after it ends (or ten minutes behind): the same alerts, at the same times, with the
    same dollars as in time order. (Read later than that, samples stop waiting for usage after two
    intervals, and a spell may fire with more dollars or not at all: the bound a host whose usage
    stopped coming needs.)"""
    samples, stopped, minute = [], [], 0
    for on, dark, stops in spells:
        samples += metrics(T0 + minute * MIN, on)
        if stops:
            stopped.append((T0 + (minute + on) * MIN, T0 + (minute + on + dark) * MIN))
        minute += on + dark
    hours = 8
    samples = [e for e in samples if e.t < T0 + hours * 3600]
    starts = [T0 + i * interval for i in range(int(hours * 3600 / interval))]
    use = [usage(t, usd_per_hour=12.0, interval_s=interval,
                 state="stopped" if any(a <= t and t + interval <= b for a, b in stopped) else "running")
           for t in starts]  # fmt: skip
    events = ordered(samples + use)
    lag_s = 600.0 if lag == "10m" else lag * interval
    assert _summary(stale(ruleset, _sent_late(events, lag_s))) == _summary(stale(ruleset, events))


def test_a_spell_after_a_quick_restart_counts_its_blind_minutes_with_usage_read_ten_minutes_late(ruleset):
    """1-minute usage at $12/h, read 10 minutes behind the samples. Dark 30-44.5, one scrape at 44.5,
    stopped 45-55 (dark to 55), dark again 60-80: time order resolves the last spell at 80 with 20 blind
    minutes, $4.00. Live, the stop (read at 55) resolved the first spell and moved on to the one it was
    in, then forgot the samples but not that spell's wait: the usage of 55-74 was dropped until the
    wait ran out, and the last spell resolved with $1.00 (a review's reproduction; red before)."""
    samples = metrics(T0, 30) + scrape(T0 + 44.5 * MIN, [50.0] * 2) + metrics(T0 + 55 * MIN, 5) + metrics(T0 + 80 * MIN, 40)
    use = [usage(T0 + i * MIN, state="stopped" if 45 <= i < 55 else "running", usd_per_hour=12.0) for i in range(120)]
    events = ordered(samples + use)
    in_order = stale(ruleset, events)
    assert (in_order[-1].action, in_order[-1].episode_start, in_order[-1].at) == ("resolve", T0 + 59.5 * MIN, T0 + 80 * MIN)
    assert in_order[-1].waste_usd == pytest.approx(4.0)
    assert _summary(stale(ruleset, _sent_late(events, 10 * MIN))) == _summary(in_order)


def test_no_alert_for_a_restarted_hosts_first_minutes_with_usage_read_half_an_interval_late(ruleset):
    """15-minute usage, read 7.5 minutes behind the samples. Dark 35.5-48 (too short to fire), one scrape
    at 48, dark to 58.5, scrapes to 59.5; stopped 60-105; billed again from 105, its exporter up only at
    140. Time order: no alert (a stopped host starts afresh at its first sample back). Live, the stop
    left the wait of the spell it was in, whose end at 140 made 59.5-140 a spell fired from the billed
    restart: an alert time order never raises ($3.00; a review's reproduction, red before)."""
    samples = metrics(T0, 36) + scrape(T0 + 48 * MIN, [50.0] * 2)
    samples += [e for x in (58.5, 59.0, 59.5) for e in scrape(T0 + x * MIN, [50.0] * 2)] + metrics(T0 + 140 * MIN, 60)
    use = [usage(T0 + i * 900.0, state="stopped" if 60 <= i * 15 < 105 else "running", usd_per_hour=12.0,
                 interval_s=900.0) for i in range(14)]  # fmt: skip
    events = ordered(samples + use)
    assert stale(ruleset, events) == []
    assert stale(ruleset, _sent_late(events, 450.0)) == []
