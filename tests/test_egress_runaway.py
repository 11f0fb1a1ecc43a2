"""The egress_runaway detector on crafted usage sequences (one event per minute)."""

from __future__ import annotations

import math

import pytest

from detector.engine import Engine
from detector.events import UsageEvent
from tests.helpers import MIN, T0, at

GB = 1e9
HOUR = 3600.0


def egress(t: float, gb_per_hour: float, rid: str = "etl-1", dest_region: str = "") -> UsageEvent:
    return UsageEvent(ts=at(t), resource_id=rid, resource_type="cpu_instance", instance_type="m6i.2xlarge",
                      account="acct", region="us-east-1", interval_s=60.0, cost_usd=0.0064,
                      egress_bytes=int(gb_per_hour * GB / 60), dest_region=dest_region,
                      tags={"team": "data", "project": "etl"})  # fmt: skip


def series(rate, minutes: int, start: float = T0, **kw) -> list[UsageEvent]:
    """One usage event a minute for ``minutes``, at ``rate(minute)`` GB/h."""
    return [egress(start + i * MIN, rate(i), **kw) for i in range(minutes)]


def findings(ruleset, events):
    return [f for f in Engine(ruleset).process(events) if f.type == "egress_runaway"]


def runaway_at(hour: float, length_min: int, factor: float, base: float = 20.0):
    start, end = hour * 60, hour * 60 + length_min
    return lambda i: base * factor if start <= i < end else base


def test_runaway_fires_once_with_excess_dollars_and_resolves_when_back(ruleset):
    # 8 h at 20 GB/h to the internet, then 60 minutes at 20x, then normal again.
    events = series(runaway_at(8, 60, 20), 10 * 60)
    found = findings(ruleset, events)
    fire = [f for f in found if f.action == "fire"]
    resolve = [f for f in found if f.action == "resolve"]
    assert len(fire) == 1 and len(resolve) == 1
    start = T0 + 8 * HOUR
    assert fire[0].episode_start == start
    assert start < fire[0].fired_at <= start + 5 * MIN  # the 15-minute rate passes 5x within minutes
    assert start + 60 * MIN <= resolve[0].at <= start + 66 * MIN  # back under 2x over the last 5 minutes
    excess_gb = 60 * (400 - 20) / 60
    assert resolve[0].details["excess_gb"] == pytest.approx(excess_gb, rel=0.01)
    assert resolve[0].waste_usd == pytest.approx(excess_gb * 0.09, rel=0.01)  # internet price
    assert fire[0].details["destination"] == "internet"
    assert fire[0].usd_per_hour > 1.0


@pytest.mark.parametrize(
    "rate",
    [
        # steady traffic: nothing to say
        lambda i: 20.0,
        # a diurnal cycle between 10 and 40 GB/h over 30 hours: the peak is 2x the median
        lambda i: 25 + 15 * math.sin(2 * math.pi * i / (24 * 60)),
        # a slow drift: traffic doubles every 10 hours
        lambda i: 20 * 2 ** (i / 600),
        # a 3-minute checkpoint upload at 10x: under 5x over a 15-minute window
        runaway_at(10, 3, 10),
        # a runaway of a resource that sends little: 0.05 -> 1 GB/h costs $0.09/h, under the $1/h floor
        runaway_at(10, 60, 20, base=0.05),
        # a runaway two hours in: no 6 h of baseline yet, so no judgement
        runaway_at(2, 60, 20),
    ],
    ids=["steady", "diurnal", "drift", "short-burst", "cheap", "no-history"],
)
def test_no_alert(ruleset, rate):
    assert findings(ruleset, series(rate, 30 * 60)) == []


def test_each_destination_has_its_own_baseline_and_price(ruleset):
    # Steady 200 GB/h to the same region; then 100 GB/h to another region for an hour.
    # The same-region baseline says nothing about the new destination, which is new traffic.
    same = series(lambda i: 200.0, 10 * 60, dest_region="us-east-1")
    other = series(runaway_at(8, 60, 20, base=5.0), 10 * 60, dest_region="eu-west-1")
    events = sorted(same + other, key=lambda e: e.ts)
    found = findings(ruleset, events)
    assert [f.action for f in found if f.action != "update"] == ["fire", "resolve"]
    assert {f.details["destination"] for f in found} == {"inter_region"}
    assert found[-1].details["usd_per_gb"] == 0.02
    assert found[-1].waste_usd == pytest.approx(60 * 95 / 60 * 0.02, rel=0.01)


def test_a_long_runaway_does_not_become_the_baseline(ruleset):
    # 14 hours at 20x after 8 hours of normal traffic: still one open episode at the end.
    engine = Engine(ruleset)
    engine.process(series(runaway_at(8, 14 * 60, 20), 22 * 60))
    (open_episode,) = [f for f in engine.open_episodes() if f.type == "egress_runaway"]
    assert open_episode.details["baseline_gb_per_hour"] == pytest.approx(20.0, rel=0.01)


def test_reread_intervals_are_not_counted_twice(ruleset):
    events = series(runaway_at(8, 120, 20), 9 * 60)
    engine = Engine(ruleset)
    engine.process(events)
    engine.process(events[-90:])
    (open_episode,) = [f for f in engine.open_episodes() if f.type == "egress_runaway"]
    assert open_episode.details["excess_gb"] == pytest.approx(60 * 380 / 60, rel=0.01)


def test_intervals_longer_than_the_window_are_judged_not_a_crash(ruleset):
    """An hourly exporter (interval_s 3600 > the 15-minute window) once emptied the window
    and divided by zero, which stopped the worker."""
    hourly = [UsageEvent(ts=at(T0 + h * HOUR), resource_id="etl-1", resource_type="cpu_instance", region="us-east-1",
                         interval_s=HOUR, egress_bytes=int((20 if h < 10 else 400) * GB), tags={"team": "data"})
              for h in range(14)]  # fmt: skip
    fired = [f for f in findings(ruleset, hourly) if f.action == "fire"]
    assert [f.fired_at for f in fired] == [T0 + 10 * HOUR]  # 400 GB/h after 20: the hour it starts


def test_a_baseline_saved_as_pairs_before_restores_to_the_same_alerts(ruleset):
    """The baseline's buckets are their rates and runs of consecutive starts now, not a (start,
    rate) pair each: a snapshot saved by the version before, with its pairs, restores to the same
    buckets (a gap in the egress breaks a run), so the alerts after the restart are a run's without one."""
    import msgspec

    from detector.detectors.egress_runaway import DestinationState
    from detector.floats import dec_hook

    events = [e for e in series(runaway_at(27, 60, 20), 30 * 60) if not 600 <= (e.ts.timestamp() - T0) / MIN < 640]
    split = next(i for i, e in enumerate(events) if e.ts.timestamp() >= T0 + 26.5 * HOUR)
    whole = findings(ruleset, events)
    first = Engine(ruleset)
    before = [f for f in first.process(events[:split]) if f.type == "egress_runaway"]
    snap = msgspec.msgpack.decode(first.snapshot("etl-1"))
    state = snap["rules"]["egress-runaway"]["destinations"]["internet"]
    now = dict(state)
    state.pop("rates")  # held and saved as whole bytes now (tests/test_bucket_rates.py): the doubles they are
    rates, spans = list(first._keys["etl-1"].rule("egress-runaway").destinations["internet"].rates), state.pop("spans")
    assert state.pop("history") is None and len(rates) == 24 * 12 - 8 and len(spans) == 4  # 40 min gap: two runs
    starts = [spans[i] + k * 300.0 for i in range(0, len(spans), 2) for k in range(int(spans[i + 1]))]
    state["history"] = [[start, rate] for start, rate in zip(starts, rates, strict=True)]
    read = [msgspec.msgpack.decode(msgspec.msgpack.encode(s), type=DestinationState, dec_hook=dec_hook)
            for s in (state, now)]  # fmt: skip
    assert read[0] == read[1] and read[0].history is None
    restarted = Engine(ruleset, loader={"etl-1": msgspec.msgpack.encode(snap)}.get)
    after = [f for f in restarted.process(events[split:]) if f.type == "egress_runaway"]
    assert not before and [f.action for f in after][:1] == ["fire"] and after == whole


@pytest.mark.parametrize(
    "saved",
    [{"rates": [5.0], "spans": [300.0, 2.0]}, {"rates": [5.0]}, {"rates": [5.0], "spans": [300.0]}],
    ids=["a-bucket-short", "no-starts", "half-a-run"],
)
def test_a_baseline_whose_rates_and_starts_disagree_is_refused(saved):
    """Saved rates that the runs of starts do not count one for one are refused (the engine then
    starts the rule afresh), not read so that a bucket leaves the baseline at another's time."""
    import msgspec

    from detector.detectors.egress_runaway import DestinationState
    from detector.floats import dec_hook

    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(msgspec.msgpack.encode(saved), type=DestinationState, dec_hook=dec_hook)


# -- the baseline's buckets against the (start, rate) pairs held before ---------------------------


def _old_baseline(pairs: list[float], bucket: dict, t: float, size: float, interval: float, counted: bool,
                  baseline_s: float) -> float | None:  # fmt: skip
    """``_add_to_baseline`` as it was at fadd2c8 (pairs ``t0, r0, t1, r1...``), on plain lists."""
    import statistics

    median = None
    start = t - t % 300.0
    if start != bucket["start"]:
        if bucket["s"] > 0 and counted:
            pairs.extend((bucket["start"], bucket["bytes"] / bucket["s"]))
        old = 0
        while old < len(pairs) and pairs[old] < t - baseline_s:
            old += 2
        del pairs[:old]
        if pairs:
            median = statistics.median(pairs[1::2])
        bucket.update(start=start, bytes=0.0, s=0.0)
    bucket["bytes"] += size
    bucket["s"] += interval
    return median


def _starts(spans) -> list[float]:
    out = []
    for i in range(0, len(spans or ()), 2):
        s = spans[i]
        for _ in range(int(spans[i + 1])):
            out.append(s)
            s += 300.0  # as forget_before steps a run's first start
    return out


def _steps():
    from hypothesis import strategies as hs

    gap = hs.one_of(hs.sampled_from([60.0, 300.0, 0.5, 299.999, 3600.0]), hs.floats(1e-3, 400.0), hs.floats(400.0, 3 * 86_400.0))
    return hs.lists(hs.tuples(gap, hs.floats(0.0, 1e15, allow_subnormal=False), hs.floats(1e-3, 7200.0),
                              hs.booleans(), hs.booleans()), min_size=1, max_size=120)  # fmt: skip


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as hs  # noqa: E402


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(start=hs.one_of(hs.sampled_from([T0 - T0 % 300.0, T0 + 0.25, T0 + 299.9]), hs.floats(-1e9, 2.5e11)), steps=_steps(),
       baseline_s=hs.sampled_from([300.0, 900.0, 6 * 3600.0, 86_400.0, 1234.5]))  # fmt: skip
def test_the_buckets_and_median_are_the_pairs_held_before(start, steps, baseline_s):
    """For any increasing event times (sub-second, odd intervals, gaps of days, far before or after
    now), sizes, buckets left out inside a runaway, and a snapshot saved and read back at any step,
    the buckets held (their starts and rates, in order) and the median are those of the version
    that held (start, rate) pairs."""
    import types

    import msgspec

    from detector.detectors.egress_runaway import DestinationState, EgressRunaway
    from detector.floats import dec_hook, enc_hook

    me = types.SimpleNamespace(params=types.SimpleNamespace(baseline=baseline_s))
    st, pairs, bucket, t = DestinationState(), [], {"start": 0.0, "bytes": 0.0, "s": 0.0}, start
    for gap, size, interval, in_runaway, save in steps:
        t += gap
        st.above_since = t if in_runaway else None
        old = _old_baseline(pairs, bucket, t, size, interval, not in_runaway, baseline_s)
        before = st.baseline
        EgressRunaway._add_to_baseline(me, st, t, size, interval)
        assert list(st.rates or ()) == pairs[1::2]
        assert _starts(st.spans) == pairs[0::2]
        assert st.baseline == (old if old is not None else before)
        assert (st.bucket, st.bucket_bytes, st.bucket_s) == (bucket["start"], bucket["bytes"], bucket["s"])
        if save:
            st = msgspec.msgpack.decode(msgspec.msgpack.encode(st, enc_hook=enc_hook), type=DestinationState,
                                        dec_hook=dec_hook)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(start=hs.floats(0.0, 2.5e11), steps=_steps(), later=hs.floats(0.0, 2 * 86_400.0))
def test_pairs_saved_before_restore_to_the_same_buckets_and_leave_at_the_same_time(start, steps, later):
    """A snapshot of the version before (its pairs, as that version built them) reads back to the
    same buckets, which leave the baseline at the same event time as the pairs would have."""
    import types

    import msgspec

    from detector.detectors.egress_runaway import DestinationState, EgressRunaway
    from detector.floats import dec_hook

    pairs, bucket, t = [], {"start": 0.0, "bytes": 0.0, "s": 0.0}, start
    for gap, size, interval, in_runaway, _ in steps:
        t += gap
        _old_baseline(pairs, bucket, t, size, interval, not in_runaway, 86_400.0)
    saved = {"history": pairs, "bucket": bucket["start"], "bucket_bytes": bucket["bytes"], "bucket_s": bucket["s"],
             "last_t": t}  # fmt: skip
    st = msgspec.msgpack.decode(msgspec.msgpack.encode(saved), type=DestinationState, dec_hook=dec_hook)
    assert st.history is None and list(st.rates or ()) == pairs[1::2] and _starts(st.spans) == pairs[0::2]
    t += later + 1e-3
    old = _old_baseline(pairs, bucket, t, 1.0, 60.0, True, 86_400.0)
    EgressRunaway._add_to_baseline(types.SimpleNamespace(params=types.SimpleNamespace(baseline=86_400.0)), st, t,
                                   1.0, 60.0)  # fmt: skip
    assert list(st.rates or ()) == pairs[1::2] and _starts(st.spans) == pairs[0::2]
    assert old is None or st.baseline == old


@pytest.mark.parametrize(
    "saved",
    [
        {"rates": [5.0], "spans": [0.0, 2.0, 300.0, -1.0]},  # a negative run, summing right
        {"rates": [5.0, 6.0], "spans": [0.0, 0.5, 300.0, 1.5]},  # half buckets
        {"rates": [5.0], "spans": [0.0, 0.0, 300.0, 1.0]},  # an empty run
        {"rates": [], "spans": [-1e300, 1e300, 0.0, -1e300]},  # huge runs cancelling: forget_before never ends
        {"history": [T0, 5.0, T0 + 300.0]},  # a start without its rate
    ],
    ids=["negative-run", "half-buckets", "empty-run", "cancelling-huge-runs", "odd-pairs"],
)
def test_runs_that_are_not_whole_bucket_counts_are_refused(saved):
    """Each run counts a whole number (at least one) of buckets, and pairs come in pairs: anything
    else is refused (the engine starts the rule afresh), not read so that ``forget_before`` drops
    another run's rates, or steps a start that adding 300 s to never moves (a worker that never
    returns from the key's next event)."""
    import msgspec

    from detector.detectors.egress_runaway import DestinationState
    from detector.floats import dec_hook

    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(msgspec.msgpack.encode(saved), type=DestinationState, dec_hook=dec_hook)


@pytest.mark.parametrize("gap", [60.0, 300.0, 299.5, 301.0, 7.0])
@pytest.mark.parametrize("baseline_s", [900.0, 86_400.0])
def test_a_day_and_more_of_regular_intervals_holds_the_pairs_held_before(gap, baseline_s):
    """The table case of the property above: intervals every ``gap`` seconds from a whole 5 minutes,
    for 30 hours, so the horizon lands on a held bucket's start exactly (a bucket starting at the
    horizon stays, as before), a runaway hour leaves its buckets out, and the window slides."""
    import types

    from detector.detectors.egress_runaway import DestinationState, EgressRunaway

    me = types.SimpleNamespace(params=types.SimpleNamespace(baseline=baseline_s))
    st, pairs, bucket = DestinationState(), [], {"start": 0.0, "bytes": 0.0, "s": 0.0}
    t0 = T0 - T0 % 300.0
    for i in range(int(30 * 3600 / gap)):
        t = t0 + i * gap
        in_runaway = 10 * 3600 <= t - t0 < 11 * 3600
        st.above_since = t if in_runaway else None
        old = _old_baseline(pairs, bucket, t, 1e6 + (i * 7919) % 1000, 60.0, not in_runaway, baseline_s)
        EgressRunaway._add_to_baseline(me, st, t, 1e6 + (i * 7919) % 1000, 60.0)
        assert list(st.rates or ()) == pairs[1::2] and _starts(st.spans) == pairs[0::2]
        assert old is None or st.baseline == old
    if gap in (60.0, 300.0):  # every bucket has egress: a day's starts are a run or two, not a pair per bucket
        assert len(st.spans or ()) <= 4


DAY = 24 * HOUR


def nightly(minutes_of_day: int, length_min: int, factor: float, base: float = 20.0, shift=lambda day: 0):
    """``base`` GB/h, and ``factor`` times it for ``length_min`` from ``minutes_of_day`` each day (moved
    by ``shift(day)`` minutes): a scheduled backup or export."""
    def rate(i: int) -> float:
        day, minute = divmod(i, 24 * 60)
        start = minutes_of_day + shift(day)
        return base * factor if start <= minute < start + length_min else base
    return rate


def test_a_nightly_backup_is_not_a_runaway_every_night(ruleset):
    # 600 GB every night from 02:00 for 40 minutes (45x the usual rate), for five days, its start a few
    # minutes late some nights. The first night is before min_history; the second is told (once is not
    # yet a schedule); from the third it is a schedule, seen the two nights before, not a runaway.
    events = series(nightly(120, 40, 45, shift=lambda day: (0, 7, -4, 9, 2)[day]), 5 * 24 * 60)
    assert {(f.action, f.episode_start) for f in findings(ruleset, events)} == {
        ("fire", T0 + DAY + 2 * HOUR + 7 * MIN), ("update", T0 + DAY + 2 * HOUR + 7 * MIN),
        ("resolve", T0 + DAY + 2 * HOUR + 7 * MIN)}  # fmt: skip


def test_a_runaway_at_the_time_of_the_nightly_backup_fires_once_it_outlasts_it(ruleset):
    # The backup of the fourth night never stops: it fires once it has run well past the nights before.
    rate = nightly(120, 40, 45)
    events = series(lambda i: rate(i) if i < 3 * 24 * 60 + 120 else 20 * 45, 3 * 24 * 60 + 6 * 60)
    fire = [f for f in findings(ruleset, events) if f.action == "fire"][-1]
    start = T0 + 3 * DAY + 2 * HOUR
    assert fire.episode_start == start
    assert start + 40 * MIN < fire.fired_at <= start + 90 * MIN
    assert fire.details["excess_gb"] == pytest.approx((fire.fired_at - start + MIN) / HOUR * 20 * 44, rel=0.02)


def test_a_burst_at_another_time_than_the_nights_before_still_fires(ruleset):
    rate = nightly(120, 40, 45)
    events = series(lambda i: 20 * 45 if 3 * 24 * 60 + 14 * 60 <= i < 3 * 24 * 60 + 15 * 60 else rate(i), 4 * 24 * 60)
    _, fire = [f for f in findings(ruleset, events) if f.action == "fire"]  # the second night's, and this
    assert fire.episode_start == T0 + 3 * DAY + 14 * HOUR


def test_the_nights_before_are_kept_through_a_restart(ruleset):
    # The worker restarts from its snapshot between two nights: the next backup is still a schedule.
    events = series(nightly(120, 40, 45), 3 * 24 * 60)
    cut = 2 * 24 * 60 + 60
    first = Engine(ruleset)
    fires = [f.episode_start for f in findings(ruleset, events) if f.action == "fire"]
    assert fires == [f.episode_start for f in first.process(events[:cut]) if f.action == "fire"] == [T0 + DAY + 2 * HOUR]
    saved = first.snapshot("etl-1")
    assert saved is not None
    second = Engine(ruleset)
    second.restore("etl-1", saved)
    assert [f for f in second.process(events[cut:]) if f.type == "egress_runaway"] == []


@pytest.mark.parametrize("minutes, gb", [(1, 100.0), (2, 200.0)], ids=["one-interval", "two-intervals"])
def test_a_checkpoint_upload_of_a_minute_or_two_is_not_a_runaway(ruleset, minutes, gb):
    # 8 h at 20 GB/h, then a 100 GB checkpoint (or two) uploaded flat out: hundreds of times the usual
    # rate, but for a minute or two. A 15-minute window's rate passes 5x at once; it is no runaway.
    start = 8 * 60
    events = series(lambda i: gb / minutes * 60 if start <= i < start + minutes else 20.0, 10 * 60)
    assert findings(ruleset, events) == []


def test_a_runaway_fires_once_it_has_lasted_min_burst(ruleset):
    start = 8 * 60
    events = series(lambda i: 6000.0 if i >= start else 20.0, 9 * 60)
    (fire,) = [f for f in findings(ruleset, events) if f.action == "fire"]
    assert fire.episode_start == T0 + 8 * HOUR and fire.fired_at == T0 + 8 * HOUR + 2 * MIN  # its third minute
    assert fire.details["excess_gb"] == pytest.approx(3 * (6000 - 20) / 60, rel=0.01)


def pulsed(start: int, minutes: int, on: int = 2, off: int = 1, factor: float = 50.0, base: float = 20.0):
    """``base`` GB/h, and from minute ``start`` for ``minutes``: ``on`` minutes at ``factor`` times it, then
    ``off`` at it, over and over (a loop that downloads a shard flat out, then works on it a minute)."""
    return lambda i: base * factor if start <= i < start + minutes and (i - start) % (on + off) < on else base


def test_a_runaway_in_pulses_shorter_than_min_burst_fires_from_its_first(ruleset):
    # Three hours of 2 minutes at 50x, 1 minute at the usual rate: 33x the usual rate, 1,960 GB of excess.
    # No run of intervals over the multiple lasts min_burst (3 minutes), so it was never told: it is a
    # runaway from the first pulse, as an open episode lasts through a minute under the multiple, and it
    # fires once over the multiple min_burst after that, dated and priced from it.
    events = series(pulsed(8 * 60, 3 * 60), 12 * 60)
    found = findings(ruleset, events)
    (fire,) = [f for f in found if f.action == "fire"]
    (resolve,) = [f for f in found if f.action == "resolve"]
    assert fire.episode_start == resolve.episode_start == T0 + 8 * HOUR
    assert fire.fired_at == T0 + 8 * HOUR + 3 * MIN  # the second pulse's first minute
    assert fire.details["excess_gb"] == pytest.approx(3 * (1000 - 20) / 60, rel=0.01)  # the minutes over so far
    assert resolve.details["excess_gb"] == pytest.approx(120 * (1000 - 20) / 60, rel=0.01)
    assert resolve.waste_usd == pytest.approx(1960 * 0.09, rel=0.01)


@pytest.mark.parametrize("minutes", [1, 2], ids=["one-interval", "two-intervals"])
def test_checkpoint_uploads_apart_are_each_no_runaway(ruleset, minutes):
    # A 100 GB checkpoint every 20 minutes for two hours: each over before min_burst, and the one before
    # back under the resolve multiple by the next.
    start = 8 * 60
    events = series(lambda i: 100.0 / minutes * 60 if i >= start and (i - start) % 20 < minutes and i < start + 120
                    else 20.0, 11 * 60)  # fmt: skip
    assert findings(ruleset, events) == []


@pytest.mark.parametrize("cut", range(8 * 60 - 1, 8 * 60 + 6))
def test_a_restart_before_a_pulsed_runaway_fires_changes_no_alert(ruleset, cut):
    events = series(pulsed(8 * 60, 60), 10 * 60)
    whole = findings(ruleset, events)
    first = Engine(ruleset)
    before = [f for f in first.process(events[:cut]) if f.type == "egress_runaway"]
    saved = first.snapshot("etl-1")
    assert saved is not None
    second = Engine(ruleset)
    second.restore("etl-1", saved)
    assert before + [f for f in second.process(events[cut:]) if f.type == "egress_runaway"] == whole
