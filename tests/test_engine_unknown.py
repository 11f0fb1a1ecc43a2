"""A key no usage event has described yet (a host seen only by its GPU metrics, a run's project) runs
every rule that takes its events, as written; its plan is made once, not at every event, and its
first usage event, or a reload of the rules, makes it again for what the key is."""

from __future__ import annotations

import dataclasses
import shutil

from detector.engine import Engine
from detector.events import GpuMetric, RunEvent
from detector.rules import RuleSet, load_rules
from tests.conftest import ROOT
from tests.helpers import MIN, T0, at, scrape, timeline, usage


def _gpu_rules(ruleset: RuleSet) -> set[str]:
    return {r.detector.name for r in ruleset.rules if GpuMetric in r.consumes}


def _planned(plan) -> list[tuple[str, object]]:
    """Each planned rule's name and params (a rule's overrides give a resource its own)."""
    return [(detector.name, detector.params) for _, _, detector, _ in plan]


def test_an_unknown_host_runs_every_gpu_rule_until_its_first_usage_event_then_its_own(ruleset):
    engine = Engine(ruleset)
    engine.process(timeline(T0, T0 + 10 * MIN, [90.0, 1.0], with_usage=False))
    state = engine._keys["host-1"]
    assert not state.info.known
    assert set(state.names) == _gpu_rules(ruleset)  # the endpoints' rules among them: it may be one
    plan = state.gpu_route
    assert plan is not None
    engine.process(scrape(T0 + 10 * MIN, [90.0, 1.0]))
    assert state.gpu_route is plan  # made once for the unknown key, not at every scrape

    t = T0 + 11 * MIN
    engine.process([usage(t), *scrape(t, [90.0, 1.0])])
    assert state.info.known and state.info.resource_type == "gpu_instance"
    known = Engine(ruleset)  # the same host, described from its first event
    known.process([usage(T0), *scrape(T0, [90.0, 1.0])])
    assert _planned(state.gpu_route) == _planned(known._keys["host-1"].gpu_route)
    assert set(state.names) == set(known._keys["host-1"].names)
    assert not {n for n in state.names if "inference" in n}


def test_a_reload_makes_an_unknown_keys_plan_again(ruleset, tmp_path):
    """New params of a rule it runs, and a rule gone: the unknown key's next scrape runs the rules in force."""
    engine = Engine(ruleset)
    engine.process(timeline(T0, T0 + 5 * MIN, [90.0, 1.0], with_usage=False))
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    text, idle_for = (rules / "rules.yaml").read_text(), "for: 30m           # sustained idle time"
    assert text.count(idle_for) == 1
    (rules / "rules.yaml").write_text(text.replace(idle_for, idle_for.replace("30m", "45m")))
    slower = load_rules(rules)
    engine.set_ruleset(slower)
    engine.process(scrape(T0 + 5 * MIN, [90.0, 1.0]))
    state = engine._keys["host-1"]
    assert dict(_planned(state.gpu_route))["idle-gpu"] == slower.by_name("idle-gpu").detector.params
    assert dict(_planned(state.gpu_route))["idle-gpu"] != ruleset.by_name("idle-gpu").detector.params

    fewer = dataclasses.replace(slower, rules=tuple(r for r in slower.rules if r.detector.name != "idle-gpu"))
    engine.set_ruleset(fewer)
    engine.process(scrape(T0 + 6 * MIN, [90.0, 1.0]))
    assert "idle-gpu" not in state.names
    assert {name for name, _ in _planned(state.gpu_route)} == _gpu_rules(fewer)


def test_a_projects_run_plan_is_made_once(ruleset):
    """A run's project never sends a usage event: its plan stays the one made at its first run event."""
    engine = Engine(ruleset)
    runs = [RunEvent(ts=at(T0 + i * MIN), run_id=f"run-{i}", status="started", resource_ids=["host-1"], project="llm")
            for i in range(3)]  # fmt: skip
    engine.process(runs[:1])
    state = engine._keys[runs[0].key]
    plan = state.run_route
    assert plan is not None and {name for name, _ in _planned(plan)} == {
        r.detector.name for r in ruleset.rules if RunEvent in r.consumes}
    engine.process(runs[1:])
    assert state.run_route is plan


OVERRIDDEN = """\
rules:
  - name: idle-gpu
    type: idle_gpu
    match: {resource_type: [gpu_instance, notebook]}
    params: {for: 30m}
    overrides:
      - match: {tags: {team: research}}
        params: {for: 2h}
"""


def test_an_unknown_hosts_first_usage_event_gives_it_its_overrides(tmp_path):
    """Its rules stay the same ones (no rule drops out to make the plan again): only the first usage
    event's change makes the override that its tags select apply."""
    (tmp_path / "rules.yaml").write_text(OVERRIDDEN)
    ruleset = load_rules(tmp_path)
    engine = Engine(ruleset)
    engine.process(timeline(T0, T0 + 5 * MIN, [0.0, 0.0], with_usage=False))
    state = engine._keys["host-1"]
    assert dict(_planned(state.gpu_route))["idle-gpu"].for_ == 30 * MIN
    t = T0 + 5 * MIN
    engine.process([usage(t, tags={"team": "research"}), *scrape(t, [0.0, 0.0])])
    assert dict(_planned(state.gpu_route))["idle-gpu"].for_ == 2 * 3600
