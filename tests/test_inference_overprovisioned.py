"""The inference_overprovisioned detector on crafted endpoint days (one sample a minute)."""

from __future__ import annotations

import math

import pytest

from detector.engine import Engine
from detector.events import GpuMetric, UsageEvent
from tests.helpers import MIN, T0, at

HOUR = 3600.0


def minute(t: float, util: float, mem_gib: float, rps: float) -> list:
    return [
        UsageEvent(ts=at(t), resource_id="ep-1", resource_type="inference_endpoint", instance_type="g5.2xlarge",
                   account="acct", region="eu-west-1", interval_s=60.0, cost_usd=1.212 / 60,
                   requests=int(rps * 60), tags={"team": "search", "project": "rag"}),
        GpuMetric(ts=at(t), resource_id="ep-1", gpu_index=0, model="A10G", util_pct=util,
                  mem_used_mib=mem_gib * 1024, mem_total_mib=24 * 1024),
    ]  # fmt: skip


def day(hours: float, util=lambda h: 10.0, mem_gib: float = 6.0, rps=lambda h: 2.0) -> list:
    events: list = []
    for i in range(int(hours * 60)):
        h = i / 60
        events += minute(T0 + i * MIN, util(h), mem_gib, rps(h))
    return events


def findings(ruleset, events):
    return [f for f in Engine(ruleset).process(events) if f.type == "inference_overprovisioned"]


def test_quiet_endpoint_fires_after_a_day_with_the_cheaper_type_and_saving(ruleset):
    # A g5.2xlarge (A10G, $1.212/h) serving 2 req/s at 5-15 % with a 6 GiB model.
    found = findings(ruleset, day(30, util=lambda h: 10 + 5 * math.sin(h)))
    fires = [f for f in found if f.action == "fire"]
    assert len(fires) == 1 and all(f.action == "update" for f in found[1:])
    fire = fires[0]
    assert T0 + 24 * HOUR <= fire.fired_at <= T0 + 25 * HOUR
    assert fire.details["suggested_instance_type"] == "g4dn.xlarge"  # a T4's 16 GiB holds 6 GiB + 20 %
    assert fire.details["saving_usd_per_hour"] == pytest.approx(1.212 - 0.526, abs=1e-3)
    assert fire.usd_per_hour == pytest.approx(0.686, abs=1e-3)
    assert fire.waste_usd == pytest.approx(0.686 * 24, rel=0.05)  # the saving over the day it covers
    assert fire.details["util_p95_pct"] <= 30


def test_a_model_needing_more_memory_gets_a_bigger_gpu_suggestion(ruleset):
    # 18 GiB + 20 % needs a 24 GiB GPU: the L4 (g6.xlarge, $0.805) rather than the T4.
    (fire,) = [f for f in findings(ruleset, day(26, mem_gib=18)) if f.action == "fire"]
    assert fire.details["suggested_instance_type"] == "g6.xlarge"


@pytest.mark.parametrize(
    "events",
    [
        day(30, util=lambda h: 55.0),  # busy enough
        day(30, util=lambda h: 70.0 if 9 <= h % 24 < 18 else 5.0),  # quiet at night, busy by day: p95 is high
        day(30, mem_gib=22),  # the model fills the GPU: nothing cheaper holds it
        day(30, rps=lambda h: 50.0),  # low utilisation but heavy traffic (batching well)
        day(20),  # less than a day seen
    ],
    ids=["busy", "diurnal-peaks", "memory-bound", "heavy-traffic", "short-history"],
)
def test_no_alert(ruleset, events):
    assert findings(ruleset, events) == []


def test_resolves_when_traffic_grows(ruleset):
    events = day(60, util=lambda h: 10.0 if h < 30 else 60.0)
    found = [f for f in findings(ruleset, events) if f.action != "update"]
    assert [(f.action, f.details.get("reason")) for f in found] == [("fire", None), ("resolve", "load_grew")]


def test_a_window_without_gpu_samples_judges_nothing_and_the_episode_stays_open(ruleset):
    # A day quiet enough to fire, then 26 h in which the GPU exporter sends nothing (usage still
    # comes: the endpoint runs): no utilisation to judge is no news, neither a resolve nor an update.
    events = day(30)
    blind_from = T0 + 30 * HOUR
    events += [e for i in range(26 * 60) for e in minute(blind_from + i * MIN, 10.0, 6.0, 2.0)
               if isinstance(e, UsageEvent)]  # fmt: skip
    found = findings(ruleset, events)
    assert [f.action for f in found if f.action != "update"] == ["fire"]
    assert not [f for f in found if f.at > blind_from + 24 * HOUR]  # the window holds no sample by then


def test_hours_without_any_request_are_left_to_scale_to_zero(ruleset):
    # Quiet by day, no request at all from 00:00 to 06:00: those hours are the full price of an
    # unused endpoint (inference_scale_to_zero's), not the difference to a smaller GPU.
    (fire,) = [f for f in findings(ruleset, day(26, rps=lambda h: 0.0 if h % 24 < 6 else 2.0)) if f.action == "fire"]
    assert fire.waste_usd == pytest.approx(0.686 * 18, rel=0.05)
    # Eight hours later (the second night, then 06:00 and 07:00 with traffic) only those two count.
    last = findings(ruleset, day(33, rps=lambda h: 0.0 if h % 24 < 6 else 2.0))[-1]
    assert last.at == pytest.approx(fire.at + 8 * HOUR, abs=60)
    assert last.waste_usd == pytest.approx(0.686 * 20, rel=0.02)


def test_a_window_saved_as_a_struct_per_hour_before_restores_to_the_same_alerts(ruleset):
    """The hours are rows of flat arrays now (doubles, and the histogram's counts a byte each while
    under 256), not a struct per hour: a snapshot saved by the version before, with its list of
    hours, restores to the same window, so the alerts after the restart are a run's without one."""
    import msgspec

    from detector.detectors.inference_overprovisioned import InferenceOverprovisionedState
    from detector.floats import dec_hook

    events = day(30, util=lambda h: 10 + 5 * math.sin(h))
    split = next(i for i, e in enumerate(events) if e.ts.timestamp() >= T0 + 26.5 * HOUR)
    whole = findings(ruleset, events)
    first = Engine(ruleset)
    before = [f for f in first.process(events[:split]) if f.type == "inference_overprovisioned"]
    snap = msgspec.msgpack.decode(first.snapshot("ep-1"))
    state = snap["rules"]["inference-overprovisioned"]
    figures, hist = state.pop("figures"), state.pop("hist")
    assert len(figures) == 24 * 4 and len(hist) == 24 * 20 and state.pop("hours") is None
    state["hours"] = [[figures[i], hist[5 * i : 5 * i + 20], figures[i + 3], figures[i + 1], figures[i + 2]]
                      for i in range(0, len(figures), 4)]  # (start, hist, mem_peak_mib, requests, request_s)  # fmt: skip
    now = msgspec.msgpack.decode(first.snapshot("ep-1"))["rules"]["inference-overprovisioned"]
    read = [msgspec.msgpack.decode(msgspec.msgpack.encode(s), type=InferenceOverprovisionedState, dec_hook=dec_hook)
            for s in (state, now)]  # fmt: skip
    assert read[0] == read[1] and read[0].hist.typecode == "B" and read[0].hours is None
    restarted = Engine(ruleset, loader={"ep-1": msgspec.msgpack.encode(snap)}.get)
    after = [f for f in restarted.process(events[split:]) if f.type == "inference_overprovisioned"]
    assert before and after and before + after == whole


def test_a_bin_past_255_samples_in_an_hour_widens_the_histogram():
    """Counts are held a byte each until one outgrows it; then the histogram widens, nothing lost,
    and a snapshot of the wider one reads back as it was."""
    import msgspec

    from detector.detectors.inference_overprovisioned import InferenceOverprovisionedState
    from detector.floats import dec_hook, enc_hook

    st = InferenceOverprovisionedState()
    st.open_hour(T0)
    st.open_hour(T0 + HOUR)
    for _ in range(300):
        st.count(3)
    st.count(19)
    assert st.hist.typecode == "H" and st.hist[20 + 3] == 300 and st.hist[39] == 1 and sum(st.hist) == 301
    st.drop_hours(1)
    assert list(st.hist) == [0, 0, 0, 300] + [0] * 15 + [1] and st.figures[0] == T0 + HOUR
    again = msgspec.msgpack.decode(msgspec.msgpack.encode(st, enc_hook=enc_hook), type=InferenceOverprovisionedState,
                                   dec_hook=dec_hook)  # fmt: skip
    assert again == st and again.hist.typecode == "H"


@pytest.mark.parametrize(
    "saved",
    [
        {"figures": [T0, 0.0, 0.0]},  # a row short of its four figures
        {"figures": [T0, 0.0, 0.0, 0.0], "hist": [1] * 19},  # a bin short
        {"figures": [T0, 0.0, 0.0, 0.0], "hist": [-1] + [0] * 19},  # not a count
    ],
    ids=["short-row", "short-histogram", "negative-count"],
)
def test_a_window_that_does_not_line_up_is_refused_not_misread(saved):
    """A saved window whose rows and histogram do not line up is refused (the engine then starts
    the rule afresh), not read so that a sample counts in another hour's bins."""
    import msgspec

    from detector.detectors.inference_overprovisioned import InferenceOverprovisionedState
    from detector.floats import dec_hook

    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(msgspec.msgpack.encode(saved), type=InferenceOverprovisionedState, dec_hook=dec_hook)


# -- the histogram's rows against a list per hour ----------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as hs  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(hs.lists(hs.one_of(hs.tuples(hs.just("open")), hs.tuples(hs.just("drop"), hs.integers(0, 4)),
                          hs.tuples(hs.just("count"), hs.integers(0, 19), hs.sampled_from([1, 200, 255, 256, 70_000])),
                          hs.tuples(hs.just("save"))), max_size=40))  # fmt: skip
def test_the_histogram_rows_are_a_list_of_counts_per_hour(ops):
    """Hours opened, counted into (past 255 and 65,535: the widening, twice), dropped from the old end
    and saved and read back in any order hold the counts that a list of 20 counts per hour holds,
    row for row, and each hour's start stays with its row."""
    import msgspec

    from detector.detectors.inference_overprovisioned import BINS, InferenceOverprovisionedState
    from detector.floats import dec_hook, enc_hook

    st, model, n = InferenceOverprovisionedState(), [], 0
    for op in ops:
        if op[0] == "open":
            n += 1
            st.open_hour(T0 + n * HOUR)
            model.append([T0 + n * HOUR, [0] * BINS])
        elif op[0] == "drop":
            k = min(op[1], len(model))
            st.drop_hours(k)
            del model[:k]
        elif op[0] == "count" and model:
            for _ in range(op[2]):
                st.count(op[1])
            model[-1][1][op[1]] += op[2]
        elif op[0] == "save":
            st = msgspec.msgpack.decode(msgspec.msgpack.encode(st, enc_hook=enc_hook),
                                        type=InferenceOverprovisionedState, dec_hook=dec_hook)  # fmt: skip
        assert list(st.column(0)) == [h[0] for h in model]
        assert [list(st.hist[i : i + BINS]) for i in range(0, len(st.hist), BINS)] == [h[1] for h in model]


@pytest.mark.parametrize("bad", [1.5, math.inf, 1e300], ids=["a-fraction", "infinity", "huge"])
def test_a_count_that_is_not_a_whole_number_is_refused(bad):
    """Snapshots saved the histogram as whole counts (and before, as ``list[int]``, which msgspec
    refused anything else for): a fraction is refused, not cut to a whole count, and infinity is
    refused as well, not an OverflowError out of the engine's ``restore`` (which turns only a
    ValidationError into a rule started afresh)."""
    import msgspec

    from detector.detectors.inference_overprovisioned import InferenceOverprovisionedState
    from detector.floats import dec_hook

    saved = {"figures": [T0, 0.0, 0.0, 0.0], "hist": [bad] + [0] * 19}
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(msgspec.msgpack.encode(saved), type=InferenceOverprovisionedState, dec_hook=dec_hook)


def test_an_hour_saved_before_with_a_histogram_not_of_20_bins_is_refused():
    """An hour of the version before whose histogram is not 20 counts (that version raised an
    IndexError on the hour's next sample in a missing bin) is refused, not padded with zeros or cut."""
    import msgspec

    from detector.detectors.inference_overprovisioned import InferenceOverprovisionedState
    from detector.floats import dec_hook

    for hist in ([1] * 19, [1] * 21):
        saved = {"hours": [[T0, hist, 0.0, 0.0, 0.0]]}
        with pytest.raises(msgspec.ValidationError):
            msgspec.msgpack.decode(msgspec.msgpack.encode(saved), type=InferenceOverprovisionedState, dec_hook=dec_hook)


def test_the_first_sample_reaching_detection_before_the_first_interval_changes_nothing(ruleset):
    """The endpoint's first usage interval (at T0) reaches detection after its first GPU sample (a
    second later), as a consumer that read the GPU topic first hands them over: the window is
    whole from the earliest time seen, not the first to arrive, so it fires when it does in time
    order (it fired an hour later, with other dollars: a messy fleet read with other fetches)."""
    usage, sample = minute(T0, 10.0, 6.0, 2.0)
    sample.ts = at(T0 + 1)
    rest = day(30)[2:]
    in_order = findings(ruleset, [usage, sample, *rest])
    sample_first = findings(ruleset, [sample, usage, *rest])
    assert in_order and [(f.action, f.fired_at, f.episode_start, f.waste_usd) for f in sample_first] == [
        (f.action, f.fired_at, f.episode_start, f.waste_usd) for f in in_order]


def test_the_event_that_closes_an_hour_does_not_date_the_episode(ruleset):
    """Each minute's sample 20 s after its interval, handed over before it (the GPU topic read
    ahead, within the allowed lateness): every hour is closed by a sample at :00:20 instead of the
    interval at :00:00. The window is judged as of the hour's end either way: the same fire, start
    (the alert's id), updates and dollars (it fired 20 s later, another alert)."""
    pairs = [minute(T0 + i * MIN, 10.0, 6.0, 2.0) for i in range(30 * 60)]
    for _, sample in pairs:
        sample.ts = at(sample.ts.timestamp() + 20)
    in_order = findings(ruleset, [e for usage, sample in pairs for e in (usage, sample)])
    sample_first = findings(ruleset, [e for usage, sample in pairs for e in (sample, usage)])

    def seen(found):
        return [(f.action, f.fired_at, f.episode_start, f.at, round(f.waste_usd, 6)) for f in found]

    assert in_order and seen(sample_first) == seen(in_order)
