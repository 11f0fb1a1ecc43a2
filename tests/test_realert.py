"""realert: a problem that comes back within the rule's interval is recorded, not posted."""

from __future__ import annotations

from detector.alerts import AlertManager, AlertMemory
from detector.engine import Engine
from detector.rules import load_rules
from detector.suppression import Hold
from tests.helpers import MIN, T0, timeline, usage

RULES = """\
rules:
  - name: idle-gpu
    type: idle_gpu
    realert: 2h
"""


def episodes(starts: list[float]) -> list:
    """40 idle minutes from each start, then 10 busy ones."""
    events: list = []
    for start in starts:
        events += timeline(start, start + 40 * MIN, [0.0] * 4)
        events += timeline(start + 40 * MIN, start + 50 * MIN, [95.0] * 4)
    return events


def changes(alerts):
    return [(a.change, a.fired_at, bool(a.silenced)) for a in alerts if a.change != "updated"]


def test_a_relapse_inside_realert_is_held_back_with_its_resolution(tmp_path):
    (tmp_path / "rules.yaml").write_text(RULES)
    ruleset = load_rules(tmp_path / "rules.yaml")
    findings = Engine(ruleset).process(episodes([T0, T0 + 50 * MIN, T0 + 3 * 60 * MIN]))
    alerts = AlertManager(ruleset=ruleset).handle(findings)
    assert changes(alerts) == [
        ("fired", T0 + 30 * MIN, False), ("resolved", T0 + 30 * MIN, False),
        ("fired", T0 + 80 * MIN, True), ("resolved", T0 + 80 * MIN, True),  # 50 minutes after the first: held
        ("fired", T0 + 210 * MIN, False), ("resolved", T0 + 210 * MIN, False),  # 3 h after: posted
    ]  # fmt: skip
    held = [a for a in alerts if a.silenced]
    assert {a.held for a in held} == {Hold(kind="realert", by="idle-gpu", reason=held[0].silenced)}
    assert held[0].silenced == "realert: rule idle-gpu alerted on this resource within its realert interval"
    assert held[0].details["realert_after"] == "2026-11-02T02:30:00Z"


def test_without_realert_every_episode_is_posted(ruleset):
    findings = Engine(ruleset).process(episodes([T0, T0 + 50 * MIN]))
    assert [s for *_, s in changes(AlertManager(ruleset=ruleset).handle(findings))] == [False] * 4


def test_realert_survives_a_restart(tmp_path, store):
    (tmp_path / "rules.yaml").write_text(RULES)
    ruleset = load_rules(tmp_path / "rules.yaml")
    engine = Engine(ruleset)
    first = AlertManager(ruleset=ruleset).handle(engine.process(episodes([T0])))
    store.alerts.record(first, version=1)
    restarted = AlertManager(AlertMemory.load(store.memory), ruleset=ruleset)
    again = restarted.handle(engine.process(episodes([T0 + 50 * MIN])))
    assert changes(again) == [("fired", T0 + 80 * MIN, True), ("resolved", T0 + 80 * MIN, True)]
    store.alerts.record(again, version=2)
    last, held = store.memory.suppression()
    assert last == {("idle-gpu", "host-1"): T0 + 30 * MIN} and held == {again[0].alert_id: again[0].held}


def test_a_withdrawn_fire_holds_back_no_later_opening_nor_after_a_restart(tmp_path, store):
    """A fire taken back (the stop, read after the samples that seemed to complete the half hour, was
    dated before them) never stood: the host's next episode inside the interval is posted, as in
    event-time order, where the first never fired; and so after a restart, from the store."""
    (tmp_path / "rules.yaml").write_text(RULES)
    ruleset = load_rules(tmp_path / "rules.yaml")
    engine = Engine(ruleset)
    early = engine.process(timeline(T0, T0 + 31 * MIN, [0.0] * 4))  # fires at the half hour
    early += engine.process([usage(T0 + 29.5 * MIN, state="stopped")])  # the stop, read late
    manager = AlertManager(ruleset=ruleset)
    first = manager.handle(early)
    assert changes(first) == [("fired", T0 + 30 * MIN, False), ("resolved", T0 + 30 * MIN, False)]
    assert first[-1].withdrawn and first[-1].waste_usd == 0.0
    store.alerts.record(first, version=1)
    assert store.memory.suppression()[0] == {}
    again = episodes([T0 + 40 * MIN])
    assert changes(manager.handle(engine.process(again))) == [("fired", T0 + 70 * MIN, False),
                                                              ("resolved", T0 + 70 * MIN, False)]  # fmt: skip
    restarted = AlertManager(AlertMemory.load(store.memory), ruleset=ruleset)
    assert changes(restarted.handle(Engine(ruleset).process(again))) == [("fired", T0 + 70 * MIN, False),
                                                                        ("resolved", T0 + 70 * MIN, False)]  # fmt: skip
