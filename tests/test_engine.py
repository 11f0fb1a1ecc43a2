"""Engine state survives a restart: snapshot + restore mid-stream changes no finding."""

from __future__ import annotations

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
    real_step = idle.step

    def brittle(state, info, event, t, **kwargs):
        if event.resource_id == "bad-host":
            raise ZeroDivisionError("float division by zero")
        return real_step(state, info, event, t, **kwargs)

    idle.step = brittle  # the detector's step, broken for one resource: the engine is what is tested
    bad = timeline(T0, T0 + 60 * MIN, [0.0] * 4, rid="bad-host")
    good = timeline(T0, T0 + 60 * MIN, [0.0] * 4, rid="good-host")
    events = sorted(bad + good, key=lambda e: e.ts)
    engine = Engine(rules)
    fired = {(f.rule, f.resource_id) for f in engine.process(events) if f.action == "fire"}
    expected = {(f.rule, f.resource_id) for f in Engine(ruleset).process(good) if f.action == "fire"}
    assert ("idle-gpu", "good-host") in fired and ("idle-gpu", "bad-host") not in fired
    assert {f for f in fired if f[1] == "good-host"} == expected
    assert engine.errors == {"idle-gpu": len(bad)}  # its samples and its usage intervals
