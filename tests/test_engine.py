"""Engine state survives a restart: snapshot + restore mid-stream changes no finding."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from detector.engine import Engine
from tests.helpers import MIN, T0, timeline, usage

EVENTS = (
    timeline(T0, T0 + 10 * MIN, [90.0] * 4)
    + timeline(T0 + 10 * MIN, T0 + 55 * MIN, [1.0] * 4)
    + timeline(T0 + 55 * MIN, T0 + 60 * MIN, [90.0] * 4)
    + timeline(T0 + 60 * MIN, T0 + 100 * MIN, [0.0] * 4)
    + [usage(T0 + 100 * MIN, state="stopped")]
)


def _key(f):
    return (f.action, f.rule, f.resource_id, f.episode_start, f.fired_at, f.at, round(f.waste_usd, 6))


@settings(max_examples=40, deadline=None)
@given(split=st.integers(min_value=0, max_value=len(EVENTS)), replay_back=st.integers(min_value=0, max_value=40))
def test_restore_from_snapshot_matches_uninterrupted_run(ruleset, split, replay_back):
    """Crash after ``split`` events; a new engine restores the saved state and re-reads
    the last ``replay_back`` events (offsets not yet committed): same findings, none twice."""
    whole = [_key(f) for f in Engine(ruleset).process(EVENTS)]

    first = Engine(ruleset)
    before = first.process(EVENTS[:split])
    saved = {key: first.snapshot(key) for key in first.dirty}
    second = Engine(ruleset, loader=saved.get)
    after = second.process(EVENTS[max(0, split - replay_back) :])
    assert [_key(f) for f in before + after] == whole


def test_quiet_keys_expire_by_event_time(ruleset):
    engine = Engine(ruleset, state_ttl_s=3600)
    engine.process(timeline(T0, T0 + 5 * MIN, [1.0], rid="old"))
    engine.process(timeline(T0 + 3 * 3600, T0 + 3 * 3600 + 60, [1.0], rid="new"))
    assert engine.expire() == ["old"]
    assert len(engine) == 1


def test_a_detector_that_raises_on_one_event_skips_it_and_detection_goes_on(ruleset):
    """A rule's detector raises on one resource's events (a bug an event found): that rule skips
    those events, the error is counted per rule, every other rule and resource is detected as if
    nothing happened."""
    from detector.rules import load_rules
    from tests.conftest import ROOT

    rules = load_rules(ROOT / "rules")
    idle = rules.by_name("idle-gpu").detector
    real_step, real_scrape = idle.step, idle.step_scrape

    def brittle(state, info, event, t, **kwargs):
        if event.resource_id == "bad-host":
            raise ZeroDivisionError("float division by zero")
        return real_step(state, info, event, t, **kwargs)

    def brittle_scrape(state, info, scrape, t):
        if scrape.samples[0].resource_id == "bad-host":
            raise ZeroDivisionError("float division by zero")
        return real_scrape(state, info, scrape, t)

    # The detector's steps (per event, and per scrape of a host's GPUs), broken for one resource:
    # the engine is what is tested.
    idle.step, idle.step_scrape = brittle, brittle_scrape
    bad = timeline(T0, T0 + 60 * MIN, [0.0] * 4, rid="bad-host")
    good = timeline(T0, T0 + 60 * MIN, [0.0] * 4, rid="good-host")
    events = sorted(bad + good, key=lambda e: e.ts)
    engine = Engine(rules)
    fired = {(f.rule, f.resource_id) for f in engine.process(events) if f.action == "fire"}
    expected = {(f.rule, f.resource_id) for f in Engine(ruleset).process(good) if f.action == "fire"}
    assert ("idle-gpu", "good-host") in fired and ("idle-gpu", "bad-host") not in fired
    assert {f for f in fired if f[1] == "good-host"} == expected
    assert engine.errors == {"idle-gpu": len(bad)}  # its samples (a failed scrape counts its own) and its usage intervals


DAY = 86_400.0
FLEET = [f"host-{i:02d}" for i in range(32)]


def fleet_until(start: float, end: float, rids: list[str] = FLEET) -> list:
    """The fleet's scrapes in [start, end), every 10 minutes, in time order (as the aligner releases them)."""
    events = [e for rid in rids for e in timeline(start, end, [1.0], rid=rid, step=600.0)]
    return sorted(events, key=lambda e: e.ts)


def test_one_future_dated_event_does_not_move_the_watermark(ruleset):
    """A backlog replay at day D; one event dated D+1.9 days (the contract accepts a day ahead
    of the wall clock, and the replay is older than that) must not expire the fleet's state."""
    engine = Engine(ruleset)  # state TTL: two days
    engine.process(fleet_until(T0, T0 + 6 * 3600))
    reached = engine.watermark
    assert T0 + 5 * 3600 < reached < T0 + 6 * 3600
    engine.process([usage(T0 + 1.9 * DAY, rid="host-07")])  # the outlier, alone in its batch
    engine.process(fleet_until(T0 + 6 * 3600, T0 + 7 * 3600))  # the replay goes on, the outlier's host too
    assert engine.watermark < T0 + 7 * 3600
    assert engine.expire() == [] and len(engine) == 32
    engine.process([usage(T0 + 1.95 * DAY, rid="host-new")])  # an outlier on a key never seen
    assert engine.watermark < T0 + 7 * 3600 and engine.expire() == []


def test_a_burst_from_one_host_with_a_skewed_clock_does_not_move_the_watermark(ruleset):
    """A batched exporter on a host whose clock is 1.9 days ahead sends many samples at once:
    one key vouching for a future time does not move event time while others report theirs."""
    engine = Engine(ruleset)
    engine.process(fleet_until(T0, T0 + 6 * 3600))
    skewed = timeline(T0 + 1.9 * DAY, T0 + 1.9 * DAY + 300, [1.0], rid="host-07")
    engine.process(sorted(fleet_until(T0 + 6 * 3600, T0 + 7 * 3600) + skewed, key=lambda e: e.ts))
    assert engine.watermark < T0 + 7 * 3600
    assert engine.expire() == []


def test_real_progress_of_the_fleet_past_the_ttl_expires_quiet_keys(ruleset):
    engine = Engine(ruleset, state_ttl_s=DAY)
    engine.process(fleet_until(T0, T0 + 3600))
    engine.process([usage(T0 + 1.5 * DAY, rid="host-07")])  # an outlier first
    assert engine.expire() == []
    active = FLEET[:3]  # three hosts keep sending; the rest went quiet at T0 + 1 h
    for day in range(3):
        engine.process(fleet_until(T0 + 3600 + day * DAY / 2, T0 + 3600 + (day + 1) * DAY / 2, active))
    assert engine.watermark > T0 + DAY + 3600
    assert sorted(engine.expire()) == sorted(set(FLEET) - set(active) - {"host-07"})
    assert len(engine) == 4  # the three, and host-07, whose outlier is later than the watermark less a day


def test_a_single_key_stream_still_advances_the_watermark(ruleset):
    """One resource alone (or one still sending among quiet ones) moves event time on."""
    engine = Engine(ruleset, state_ttl_s=3600)
    engine.process(timeline(T0, T0 + 10 * MIN, [1.0], rid="quiet-1"))
    engine.process(timeline(T0, T0 + 10 * MIN, [1.0], rid="quiet-2"))
    for hour in range(4):
        engine.process(timeline(T0 + hour * 3600, T0 + (hour + 1) * 3600, [1.0], rid="alone"))
        assert engine.watermark >= T0 + (hour + 1) * 3600 - 60
    assert sorted(engine.expire()) == ["quiet-1", "quiet-2"]


def test_an_open_window_of_gpu_samples_survives_a_restore(ruleset):
    """The anomaly rule's open window keeps its GPU samples unboxed (an array): saved mid-window
    and restored, every window it closes has the same features as without the restart."""
    from detector.detectors.anomaly import Scoring, scoring_during

    events = timeline(T0, T0 + 12 * MIN, [90.0, 40.0, 3.0, 70.0]) + timeline(T0 + 12 * MIN, T0 + 25 * MIN, [20.0] * 4)
    split = next(i for i, e in enumerate(events) if e.ts.timestamp() >= T0 + 12 * MIN)  # mid-window

    def windows(run) -> list:
        closed: list = []
        with scoring_during(ruleset.rules, Scoring(observe=lambda items: closed.extend(w[3] for w in items))):
            run()
        return [(w.start, w.values) for w in closed]

    whole = windows(lambda: Engine(ruleset).process(events))
    saved: dict[str, bytes] = {}

    def restarted() -> None:
        first = Engine(ruleset)
        first.process(events[:split])
        saved.update({key: first.snapshot(key) for key in first.dirty})
        Engine(ruleset, loader=saved.get).process(events[split:])

    assert windows(restarted) == whole
    assert len(whole) >= 3 and any(w[1]["gpu_util_p95"] == 90.0 for w in whole)


def test_a_series_saved_as_pairs_before_is_read_back_flat():
    """Egress and growth histories are now flat arrays of (t, value) pairs: a snapshot saved by
    the version before, with a list of pairs, restores to the same series (nothing lost at the
    upgrade's restart), and a new snapshot round-trips."""
    from array import array

    import msgspec

    from detector.detectors.egress_runaway import DestinationState
    from detector.detectors.growth import GrowthState
    from detector.floats import dec_hook, enc_hook

    old = msgspec.msgpack.encode({"points": [[1.0, 10.0], [2.0, 20.0]], "last_t": 2.0})
    restored = msgspec.msgpack.decode(old, type=GrowthState, dec_hook=dec_hook)
    assert list(restored.points) == [1.0, 10.0, 2.0, 20.0]  # held as differences now (test_growth_points)
    again = msgspec.msgpack.encode(restored, enc_hook=enc_hook)
    assert msgspec.msgpack.decode(again, type=GrowthState, dec_hook=dec_hook) == restored
    old = msgspec.msgpack.encode({"history": [[300.0, 5.0]], "dest_region": "eu-west-1"})
    dest = msgspec.msgpack.decode(old, type=DestinationState, dec_hook=dec_hook)  # pairs: rates and runs of starts now
    assert list(dest.rates or ()) == [5.0] and dest.spans == array("d", [300.0, 1.0]) and dest.history is None


def test_a_per_gpu_map_saved_before_is_read_back_as_an_array_by_gpu():
    """Per-GPU values (a host's peak power, the latest sample time per GPU) are now arrays
    indexed by GPU: a snapshot saved by the version before, with a map of GPU index to value,
    restores to the same values (0.0 where a GPU had none, as the map's ``.get(i, 0.0)``), and a
    new snapshot round-trips. A map whose keys are not GPU indexes is refused, not half-read."""
    from array import array

    import msgspec
    import pytest

    from detector.detectors.gpu_episode import GpuEpisodeState
    from detector.detectors.inference_overprovisioned import InferenceOverprovisionedState
    from detector.floats import dec_hook, enc_hook
    from detector.model.features import WindowState

    old = msgspec.msgpack.encode({"peak_power_w": {0: 310.5, 3: 295.0}, "gpus": [0, 3]})
    restored = msgspec.msgpack.decode(old, type=GpuEpisodeState, dec_hook=dec_hook)
    assert restored.peak_power_w == array("d", [310.5, 0.0, 0.0, 295.0])
    again = msgspec.msgpack.encode(restored, enc_hook=enc_hook)
    assert msgspec.msgpack.decode(again, type=GpuEpisodeState, dec_hook=dec_hook) == restored
    old = msgspec.msgpack.encode({"gpu_last": {1: 1_700_000_030.0}})
    assert msgspec.msgpack.decode(old, type=InferenceOverprovisionedState, dec_hook=dec_hook).gpu_last == array(
        "d", [0.0, 1_700_000_030.0])  # fmt: skip
    old = msgspec.msgpack.encode({"gpu_last": {7: 1_700_000_030.0}, "utils": [50.0]})
    assert msgspec.msgpack.decode(old, type=WindowState, dec_hook=dec_hook).gpu_last[7] == 1_700_000_030.0
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(msgspec.msgpack.encode({"gpu_last": {"x": 1.0}}), type=WindowState, dec_hook=dec_hook)
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(msgspec.msgpack.encode({"gpu_last": {999: 1.0}}), type=WindowState, dec_hook=dec_hook)


def test_a_snapshot_keeps_the_latest_time_of_each_kind_the_key_sent(ruleset):
    """A key's latest time per event kind (three floats on the key, not a dict) is saved as the
    map by kind the snapshots have always held, only the kinds it sent; restored, a restart's
    check skips what each kind had reached, and a snapshot from before the kinds were kept
    (none saved) falls back to the key's time."""
    import msgspec

    engine = Engine(ruleset)
    engine.process(timeline(T0, T0 + 5 * MIN, [90.0], rid="h", with_usage=False) + [usage(T0 + 2 * MIN, rid="h")])
    saved = engine.snapshot("h")
    assert msgspec.msgpack.decode(saved)["kind_t"] == {"gpu": T0 + 5 * MIN - 30, "usage": T0 + 2 * MIN}
    restarted = Engine(ruleset, loader={"h": saved}.get)
    assert restarted.already_seen(T0 + 2 * MIN, usage(T0 + 2 * MIN, rid="h"))
    assert not restarted.already_seen(T0 + 3 * MIN, usage(T0 + 3 * MIN, rid="h"))
    assert restarted.already_seen(T0 + 4 * MIN, timeline(T0 + 4 * MIN, T0 + 4 * MIN + 1, [90.0], rid="h", with_usage=False)[0])
    assert restarted.snapshot("h") == saved
    old = msgspec.msgpack.decode(saved)
    del old["kind_t"]
    before = Engine(ruleset, loader={"h": msgspec.msgpack.encode(old)}.get)
    assert before.already_seen(T0 + 4 * MIN, usage(T0 + 4 * MIN, rid="h"))
    assert before.snapshot("h") is not None and msgspec.msgpack.decode(before.snapshot("h"))["kind_t"] == {}
    # may_have_seen: false only when every key is held and none was restored
    assert restarted.may_have_seen(["h"]) and restarted.may_have_seen(["other"])
    fresh = Engine(ruleset)
    fresh.process([usage(T0, rid="h")])
    assert not fresh.may_have_seen(["h"]) and fresh.may_have_seen(["h", "new"]) and not fresh.may_have_seen([])


def test_egress_intervals_saved_as_triples_before_are_read_back_flat():
    """The egress rule's short window is now a flat array of (t, bytes, seconds) triples: a snapshot
    saved before, with a list of triples, restores to the same intervals, in order."""
    from array import array

    import msgspec

    from detector.detectors.egress_runaway import DestinationState
    from detector.floats import dec_hook, enc_hook

    old = msgspec.msgpack.encode({"recent": [[60.0, 2e9, 60.0], [120.0, 3e9, 60.0]], "dest_region": "eu-west-1"})
    restored = msgspec.msgpack.decode(old, type=DestinationState, dec_hook=dec_hook)
    assert restored.recent == array("d", [60.0, 2e9, 60.0, 120.0, 3e9, 60.0])
    again = msgspec.msgpack.encode(restored, enc_hook=enc_hook)
    assert msgspec.msgpack.decode(again, type=DestinationState, dec_hook=dec_hook) == restored


def test_states_saved_with_empty_containers_before_read_back_as_nothing_yet():
    """Fields that hold nothing on most resources are None (or the one empty tuple) until they do,
    not an empty dict or list on every key: states saved before, with those empty containers or
    with contents, restore to what they said, and a new state round-trips (an anomaly run, three
    floats a window, flat)."""
    from array import array

    import msgspec
    import pytest

    from detector.detectors.anomaly import AnomalyState
    from detector.detectors.gpu_episode import GpuEpisodeState
    from detector.floats import dec_hook, enc_hook
    from detector.saved import read_state

    old = msgspec.msgpack.encode({"pods": {}, "allocated": {"0": True}, "peak_power_w": {}, "gpus": [0]})
    restored = msgspec.msgpack.decode(old, type=GpuEpisodeState, dec_hook=dec_hook)
    assert not restored.pods and restored.allocated == {"0": True} and not restored.peak_power_w
    episode = {"since": 300.0, "fired_at": 600.0, "stands_out": [{"feature": "x"}]}  # an open episode, shape before
    old = msgspec.msgpack.encode({"run": [[300.0, 1.5, 2.0], [600.0, 2.5, 2.0]], **episode})
    restored = read_state(old, AnomalyState)
    assert restored.judged is not None and restored.judged.run == array("d", [300.0, 1.5, 2.0, 600.0, 2.5, 2.0])
    assert restored.judged.figures is not None and restored.judged.figures.stands_out == [{"feature": "x"}]
    assert read_state(msgspec.msgpack.encode({"run": [], "last_seq": 3}), AnomalyState).judged.run is None
    for cut_short in ({"run": [300.0, 1.5]}, {"judged": {"run": [300.0, 1.5]}}):  # either shape: refused, not misread
        with pytest.raises(msgspec.ValidationError, match="triples"):
            read_state(msgspec.msgpack.encode(cut_short), AnomalyState)
    for fresh in (GpuEpisodeState(), AnomalyState()):
        again = msgspec.msgpack.encode(fresh, enc_hook=enc_hook)
        assert msgspec.msgpack.decode(again, type=type(fresh), dec_hook=dec_hook) == fresh


def test_lists_saved_before_read_back_as_the_tuples_now_held(ruleset):
    """``untagged``'s missing tags and ``telemetry_stale``'s intervals counted blind are tuples now
    (one shared empty tuple, and one tuple per set of missing tags, not a list per key): what the
    version before saved as lists restores to the same values, and a resource missing the same tags
    as another holds the other's tuple."""
    import msgspec

    from detector.detectors.telemetry_stale import TelemetryStaleState
    from detector.detectors.untagged import UntaggedState
    from detector.floats import dec_hook

    old = msgspec.msgpack.encode({"missing_since": 5.0, "missing": ["team", "project"], "spend_usd": 1.5})
    restored = msgspec.msgpack.decode(old, type=UntaggedState, dec_hook=dec_hook)
    assert restored.missing == ("team", "project") and restored.since == 5.0 and restored.spend_usd == 1.5
    old = msgspec.msgpack.encode({"last_sample": 10.0, "blind_usd": 0.75, "counted": [[20.0, 0.5], [80.0, 0.25]]})
    restored_stale = msgspec.msgpack.decode(old, type=TelemetryStaleState, dec_hook=dec_hook)
    assert restored_stale.counted == ((20.0, 0.5), (80.0, 0.25)) and restored_stale.blind_usd == 0.75

    engine = Engine(ruleset)
    untagged = {"team": "nlp"}
    engine.process([usage(T0 + i * MIN, rid=rid, tags=untagged) for i in range(3) for rid in ("a", "b")])
    a, b = (engine._keys[rid].rule("untagged") for rid in ("a", "b"))
    assert a.missing == ("project",) and a.missing is b.missing


def test_empty_dicts_saved_before_read_back_where_none_is_held_now(ruleset):
    """``egress_runaway``'s destinations and the inference rules' advice are None until there is one
    (not an empty dict on every resource): states saved before with an empty or a full dict restore
    as they were, and a GPU host with no egress holds no state for the rule (it is lazy)."""
    import msgspec

    from detector.detectors.egress_runaway import EgressRunawayState
    from detector.detectors.inference_overprovisioned import InferenceOverprovisionedState
    from detector.detectors.inference_unbatched import InferenceUnbatchedState
    from detector.floats import dec_hook

    def restored(kind: type, fields: dict):
        return msgspec.msgpack.decode(msgspec.msgpack.encode(fields), type=kind, dec_hook=dec_hook)

    assert not restored(EgressRunawayState, {"destinations": {}}).destinations
    full = restored(EgressRunawayState, {"destinations": {"internet": {"last_t": 5.0, "rate": 2.5}}}).destinations
    assert full is not None and full["internet"].last_t == 5.0 and full["internet"].rate == 2.5
    for kind in (InferenceOverprovisionedState, InferenceUnbatchedState):
        assert not restored(kind, {"advice": {}}).advice
        assert restored(kind, {"advice": {"saving_usd_per_hour": 1.5}}).advice == {"saving_usd_per_hour": 1.5}
    engine = Engine(ruleset)
    engine.process(timeline(T0, T0 + 5 * MIN, [90.0], rid="h"))
    assert "egress-runaway" in engine._keys["h"].names and engine._keys["h"].rule("egress-runaway") is None


def test_resources_priced_alike_share_their_price_and_keep_its_value(ruleset):
    """Each resource's interval cost and hourly rate are one float shared by every resource priced
    alike (24 bytes a key each, not a float of its own), and sharing never changes a value: a
    different price stays itself, a zero keeps its sign, a float stays a float."""
    import math

    import msgspec

    engine = Engine(ruleset)
    engine.process([usage(T0, rid="a"), usage(T0, rid="b"), usage(T0, rid="c", usd_per_hour=16.0),
                    usage(T0, rid="p", usd_per_hour=0.0), usage(T0, rid="z", usd_per_hour=-0.0)])  # fmt: skip
    a, b, c, z = (engine._keys[k].info for k in "abcz")  # z after p: a table keyed by value gives -0.0 p's 0.0
    assert a.interval_usd == 32.0 / 60 and a.interval_usd is b.interval_usd and a.usd_per_hour is b.usd_per_hour
    assert c.interval_usd == 16.0 / 60 and c.usd_per_hour == 16.0
    assert z.interval_usd == 0.0 and math.copysign(1.0, z.interval_usd) == -1.0
    # An event built in Python may carry an int: it is not handed to a resource whose price is the float.
    engine.process([msgspec.structs.replace(usage(T0 + MIN, rid="i"), cost_usd=2), usage(T0 + MIN, rid="f", usd_per_hour=120.0)])
    assert engine._keys["i"].info.interval_usd == 2 and type(engine._keys["f"].info.interval_usd) is float


def test_a_usage_event_older_than_the_keys_newest_leaves_what_the_key_says(ruleset):
    """Running at 10:00 ($32/h, team nlp), stopped at 11:00, then the 10:00 interval sent again (an
    exporter re-sending after its restart): the key still says what 11:00 said (stopped, not billed,
    its price and tags), as in time order, where the copy comes before the stop. So too for an engine
    restored from a snapshot taken before the copy is read: the usage time it saved makes the copy late."""
    running = usage(T0 + 10 * MIN, tags={"team": "nlp"})
    stopped = usage(T0 + 11 * MIN, state="stopped", usd_per_hour=16.0, tags={"team": "vision"})
    engine = Engine(ruleset)
    engine.process([running, stopped])
    newest = engine.resource("host-1")
    assert newest is not None and not newest.billed
    said = msgspec.structs.asdict(newest)
    saved = engine.snapshot("host-1")
    engine.process([running])
    assert msgspec.structs.asdict(engine.resource("host-1")) == said
    restored = Engine(ruleset, loader={"host-1": saved}.get)
    restored.process([running])
    assert msgspec.structs.asdict(restored.resource("host-1")) == said
    in_order = Engine(ruleset)
    in_order.process([running, running, stopped])
    assert msgspec.structs.asdict(in_order.resource("host-1")) == said
