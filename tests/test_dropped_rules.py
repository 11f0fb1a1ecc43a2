"""An episode open in the state of a rule a key loses is resolved, not dropped with the state: the
resource changed so that the rule's match no longer takes it, or a reload removed the rule."""

from __future__ import annotations

from detector.backtest import backtest
from detector.engine import RULE_NO_LONGER_APPLIES, RULE_REMOVED, Engine
from detector.replay import write_replay
from detector.rules import load_rules
from tests.helpers import MIN, T0, idle_host

RULES = """\
rules:
  - name: idle-gpu
    type: idle_gpu
    match: {resource_type: [gpu_instance, notebook]}
    params: {for: 30m}
  - name: idle-gpu-nlp
    type: idle_gpu
    match: {resource_type: [gpu_instance, notebook], tags: {team: nlp}}
    params: {for: 20m}
"""


def test_an_episode_of_a_rule_that_no_longer_matches_its_resource_is_resolved(tmp_path):
    """A host of team nlp idles 40 minutes (both rules fire), then is handed to team vision: idle-gpu-nlp no
    longer takes it, and its open episode is resolved where it stood (``rule_no_longer_applies``), in the
    engine and in backtest alike; idle-gpu's goes on. Before, the state was dropped and the alert stayed
    firing for ever (the incident page, Slack)."""
    (tmp_path / "rules.yaml").write_text(RULES)
    ruleset = load_rules(tmp_path)
    events = idle_host("h", "nlp", 40, T0) + idle_host("h", "vision", 20, T0 + 40 * MIN)
    found = Engine(ruleset).process(events)
    nlp = [f for f in found if f.rule == "idle-gpu-nlp"]
    assert [f.action for f in nlp][0] == "fire" and nlp[-1].action == "resolve"
    assert nlp[-1].details["reason"] == RULE_NO_LONGER_APPLIES and nlp[-1].at < T0 + 40 * MIN
    assert [f.action for f in found if f.rule == "idle-gpu" and f.action != "update"] == ["fire"]

    path = tmp_path / "retagged.jsonl"
    with open(path, "wb") as out:
        topics = {"UsageEvent": "resource-usage", "GpuMetric": "gpu-metrics"}
        write_replay(((0, topics[type(e).__name__], e.resource_id, e) for e in events), out)
    alerts = {a.rule: a for a in backtest(path, ruleset).alerts}
    assert (alerts["idle-gpu-nlp"].status, alerts["idle-gpu-nlp"].details["reason"]) == ("resolved", RULE_NO_LONGER_APPLIES)
    assert alerts["idle-gpu"].status == "firing"


def test_a_reload_that_removes_a_rule_resolves_its_open_episodes(tmp_path):
    """idle-gpu-nlp is removed by a reload while its episode on h is open: the next batch's findings
    resolve it (``rule_removed``), once; idle-gpu's episode goes on."""
    (tmp_path / "rules.yaml").write_text(RULES)
    engine = Engine(load_rules(tmp_path))
    engine.process(idle_host("h", "nlp", 40, T0))
    (tmp_path / "rules.yaml").write_text(RULES.split("  - name: idle-gpu-nlp")[0])
    engine.set_ruleset(load_rules(tmp_path))
    found = engine.process(idle_host("h", "nlp", 5, T0 + 40 * MIN))
    ended = [f for f in found if f.action == "resolve"]
    assert [(f.rule, f.details["reason"]) for f in ended] == [("idle-gpu-nlp", RULE_REMOVED)]
    assert not [f for f in engine.process(idle_host("h", "nlp", 5, T0 + 45 * MIN)) if f.action == "resolve"]


def test_a_reloads_resolutions_go_with_the_keys_when_partitions_move(tmp_path):
    """A reload queues rule_removed resolutions for the keys held, then the partitions move (forget_all):
    those keys are another worker's now, and this one must not post their resolutions with its next batch
    (unplaced: partition -1). Review of 53dbe56: they went out with the next partitions' batch."""
    (tmp_path / "rules.yaml").write_text(RULES)
    engine = Engine(load_rules(tmp_path))
    engine.process(idle_host("h", "nlp", 40, T0))
    (tmp_path / "rules.yaml").write_text(RULES.split("  - name: idle-gpu-nlp")[0])
    engine.set_ruleset(load_rules(tmp_path))
    engine.forget_all()
    assert [f for f in engine.process(idle_host("other", "vision", 2, T0 + 40 * MIN)) if f.action == "resolve"] == []


def test_a_reload_marks_the_keys_whose_rules_it_dropped_dirty(tmp_path):
    """The batch that stores a reload's resolution saves the key's state without the removed rule's: left
    clean, the saved state kept the open episode until the key's next event, and a rollback of the rule
    brought it back under an alert id already resolved (review of 53dbe56)."""
    (tmp_path / "rules.yaml").write_text(RULES)
    engine = Engine(load_rules(tmp_path))
    engine.process(idle_host("h", "nlp", 40, T0))
    engine.dirty.clear()  # saved
    (tmp_path / "rules.yaml").write_text(RULES.split("  - name: idle-gpu-nlp")[0])
    engine.set_ruleset(load_rules(tmp_path))
    assert [f.key for f in engine.process_timed([]) if f.action == "resolve"] == ["h"] and "h" in engine.dirty


def test_a_reload_that_changes_a_rules_type_drops_its_state_on_a_held_key_of_one_class_too(tmp_path):
    """Review of 2ddb96e. A reload makes idle-gpu-nlp a stuck_gpu rule while its idle episode on h is open: the episode
    is resolved (``rule_removed``) and its state dropped, though stuck_gpu's state is of the same class (GpuEpisodeState).
    h's GPUs then look hung for half an hour: the rule opens an episode of its own. (The state was kept, its idle
    episode open: the stuck rule went on with it, under the alert id just resolved, every change of it dropped as
    closed, and the hung GPUs had no incident.)"""
    from detector.events import GpuMetric
    from tests.helpers import at, usage

    (tmp_path / "rules.yaml").write_text(RULES)
    engine = Engine(load_rules(tmp_path))
    engine.process(idle_host("h", "nlp", 40, T0))
    (tmp_path / "rules.yaml").write_text(RULES.replace("  - name: idle-gpu-nlp\n    type: idle_gpu",
                                                       "  - name: idle-gpu-nlp\n    type: stuck_gpu"))  # fmt: skip
    engine.set_ruleset(load_rules(tmp_path))
    assert [f.rule for f in engine.open_episodes()] == ["idle-gpu"]
    hung = [e for i in range(60)
            for e in ([usage(T0 + 40 * MIN + i * 30, "h", tags={"team": "nlp"})] if i % 2 == 0 else [])
            + [GpuMetric(ts=at(T0 + 40 * MIN + i * 30), resource_id="h", gpu_index=g, model="A100", util_pct=100.0,
                         sm_active=0.0, power_w=70.0) for g in range(4)]]  # fmt: skip
    nlp = [f for f in engine.process(hung) if f.rule == "idle-gpu-nlp" and f.action != "update"]
    assert [(f.action, f.details.get("reason")) for f in nlp] == [("resolve", RULE_REMOVED), ("fire", None)]
    assert nlp[1].type == "stuck_gpu" and nlp[1].episode_start == T0 + 40 * MIN
