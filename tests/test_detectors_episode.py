"""The shared episode lifecycle (:mod:`detector.detectors.episode`): fire once, update on a
cadence, resolve only what fired, and fire again as a new episode after a resolve; and the
detectors that use it keep those rules end to end."""

from __future__ import annotations

import pytest

from detector.alerts import from_finding
from detector.detectors.base import ResourceInfo, make_finding
from detector.detectors.episode import Episode, advance, due, end, fire
from detector.detectors.untagged import Untagged, UntaggedParams
from detector.engine import Engine
from tests.helpers import MIN, T0, usage


class Held(Episode, kw_only=True):
    usd: float = 0.0

    def clear(self) -> None:
        super().clear()
        self.usd = 0.0


def resolved(ep: Held, at: float):
    detector = Untagged("r", "info", UntaggedParams())
    assert ep.since is not None and ep.fired_at is not None  # made before anything is cleared
    return make_finding(detector, "resolve", ResourceInfo(resource_id="x"), episode_start=ep.since,
                        fired_at=ep.fired_at, at=at, usd=ep.usd, details={})  # fmt: skip


def test_fire_update_resolve_and_fire_again():
    ep = Held()
    # rows: (time, held since, expected action) for a condition that needs 10 s, updates every 5 s
    steps = [
        (0.0, 0.0, None),       # just started
        (9.0, 0.0, None),       # not held long enough
        (10.0, 0.0, "fire"),    # held 10 s: fires, dated since + 10
        (12.0, 0.0, None),      # open: no second fire, no update before 5 s
        (15.0, 0.0, "update"),  # 5 s after the fire
        (19.0, 0.0, None),
        (20.0, 0.0, "update"),
    ]
    for at, start, expected in steps:
        assert advance(ep, at, start=start, held_s=at - start, need_s=10.0, every_s=5.0) == expected, at
    assert (ep.since, ep.fired_at, ep.open) == (0.0, 10.0, True)
    ep.usd = 3.0
    (finding,) = end(ep, lambda: resolved(ep, 21.0))
    assert finding.action == "resolve" and finding.episode_start == 0.0 and finding.waste_usd == 3.0
    assert (ep.since, ep.fired_at, ep.last_report, ep.usd, ep.open) == (None, None, 0.0, 0.0, False)
    assert end(ep, lambda: resolved(ep, 22.0)) == []  # nothing open: nothing to resolve
    # The condition comes back: a new episode, its own start, so its own alert.
    assert advance(ep, 40.0, start=30.0, held_s=10.0, need_s=10.0, every_s=5.0) == "fire"
    assert (ep.since, ep.fired_at) == (30.0, 40.0)


def test_an_open_episode_does_not_fire_again_and_a_candidate_ends_silently():
    ep = Held()
    fire(ep, since=1.0, fired_at=2.0, at=2.0)
    with pytest.raises(ValueError):
        fire(ep, since=5.0, fired_at=6.0, at=6.0)
    assert not due(ep, 6.9, every_s=5.0) and due(ep, 7.0, every_s=5.0) and ep.last_report == 7.0
    candidate = Held(since=1.0)  # counted, never fired
    assert end(candidate, lambda: pytest.fail("a candidate has nothing to resolve")) == []
    assert candidate.since is None
    assert not due(Held(), 100.0, every_s=1.0)  # nothing open: no update


def test_a_detector_on_the_lifecycle_re_fires_as_a_new_alert():
    """untagged through the engine: an episode fires after the grace, reports every 15 min,
    resolves when tagged, and a later untagged spell is a new alert with its own id."""
    from detector.rules import compile_rules, parse_rule

    ruleset = compile_rules([parse_rule({"name": "untagged", "type": "untagged", "params": {"grace": "30m"}})])
    engine = Engine(ruleset)
    bare = {"team": "nlp"}
    tagged = {"team": "nlp", "project": "llm"}
    events = ([usage(T0 + i * MIN, tags=bare) for i in range(60)]
              + [usage(T0 + i * MIN, tags=tagged) for i in range(60, 70)]
              + [usage(T0 + i * MIN, tags=bare) for i in range(70, 120)])  # fmt: skip
    found = engine.process(events)
    assert [(f.action, f.at - T0) for f in found] == [
        ("fire", 30 * MIN), ("update", 45 * MIN), ("resolve", 60 * MIN),
        ("fire", 100 * MIN), ("update", 115 * MIN),
    ]
    first, second = from_finding(found[0]), from_finding(found[3])
    assert first.alert_id != second.alert_id
    assert found[3].episode_start == T0 + 70 * MIN
    assert found[2].waste_usd == pytest.approx(32.0, abs=1e-3)  # an hour untagged at $32/h, counted once
    assert found[4].waste_usd == pytest.approx(32.0 * 46 / 60, abs=1e-3)  # the second spell from zero


def _holds_episodes(state_cls: type) -> bool:
    """The state is an Episode, or keeps Episodes by key (per destination, per run), maybe not
    until it has one (``dict[str, DestinationState] | None``)."""
    import typing

    def episodes_in(hint: object) -> bool:
        if isinstance(hint, type) and issubclass(hint, Episode):
            return True
        return any(episodes_in(arg) for arg in typing.get_args(hint))

    return issubclass(state_cls, Episode) or any(map(episodes_in, typing.get_type_hints(state_cls).values()))


def test_every_registered_detector_keeps_its_episodes_on_the_lifecycle():
    """A new detector's episodes go through the one lifecycle (docs/detectors.md)."""
    from detector.detectors import REGISTRY

    assert [t for t, cls in sorted(REGISTRY.items()) if not _holds_episodes(cls.State)] == []
