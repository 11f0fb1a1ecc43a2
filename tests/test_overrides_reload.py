"""Overrides change params per team without copying rules; edited rules are picked up,
and a bad edit is refused with the rules in force kept."""

from __future__ import annotations

import os

import pytest
import yaml

from detector.engine import Engine
from detector.reload import RulesWatcher
from detector.rules import RulesInvalid, explain, load_rules
from tests.helpers import MIN, T0, idle_host

RULES = """\
rules:
  - name: idle-gpu
    type: idle_gpu
    match: {resource_type: [gpu_instance, notebook]}
    params: {for: 30m}
    overrides:
      - match: {tags: {team: research}}
        params: {for: 2h}
        severity: info
"""


@pytest.fixture
def rules_dir(tmp_path):
    (tmp_path / "rules.yaml").write_text(RULES)
    return tmp_path


def test_override_applies_to_the_team_it_selects(rules_dir):
    engine = Engine(load_rules(rules_dir))
    fired = [f for f in engine.process(idle_host("nlp-host", "nlp", 90) + idle_host("res-host", "research", 90))
             if f.action == "fire"]  # fmt: skip
    assert [(f.resource_id, f.severity) for f in fired] == [("nlp-host", "warning")]  # research waits 2h
    more = engine.process([e for e in idle_host("res-host", "research", 130) if e.t > T0 + 90 * MIN])
    assert [(f.resource_id, f.severity, f.fired_at) for f in more if f.action == "fire"] == [
        ("res-host", "info", T0 + 2 * 3600)
    ]


def test_explain_shows_effective_params(rules_dir):
    doc = yaml.safe_load(explain(load_rules(rules_dir), "idle-gpu"))
    assert doc["params"]["for"] == "30m" and doc["params"]["util_below"] == "5%"
    assert doc["overrides"][0]["params"]["for"] == "2h" and doc["overrides"][0]["severity"] == "info"
    with pytest.raises(KeyError, match="did you mean 'idle-gpu'"):
        explain(load_rules(rules_dir), "idle")


def test_edit_is_picked_up_and_open_episodes_continue(rules_dir):
    watcher = RulesWatcher(rules_dir, load_rules(rules_dir))
    engine = Engine(watcher.current)
    events = idle_host("h", "nlp", 50)
    assert [f.action for f in engine.process(events[: len(events) // 2])] == []  # 25 idle minutes
    assert watcher.poll() == (None, None)
    path = rules_dir / "rules.yaml"
    path.write_text(RULES.replace("for: 30m", "for: 20m"))
    os.utime(path, ns=(1, 10**18))  # a distinct mtime even within the filesystem's resolution
    ruleset, refused = watcher.poll()
    assert refused is None and ruleset is not None
    engine.set_ruleset(ruleset)
    fired = [f for f in engine.process(events[len(events) // 2 :]) if f.action == "fire"]
    assert [f.fired_at for f in fired] == [T0 + 20 * 60]  # same episode, new threshold


def test_bad_edit_is_refused_and_the_rules_in_force_stay(rules_dir):
    watcher = RulesWatcher(rules_dir, load_rules(rules_dir))
    before = watcher.current
    path = rules_dir / "rules.yaml"
    path.write_text(RULES.replace("for: 2h", "for: two hours"))
    os.utime(path, ns=(1, 10**18))
    ruleset, refused = watcher.poll()
    assert ruleset is None and isinstance(refused, RulesInvalid)
    assert str(refused) == f"{path}:8 rules[0].overrides[0].params.for: invalid duration 'two hours'; expected e.g. 30m, 6h, 7d"
    assert watcher.current is before
    assert watcher.poll() == (None, None)  # refused once, not on every poll


@pytest.mark.parametrize("change", ["empty", "all-disabled", "deleted"])
def test_a_reload_that_leaves_no_rule_enabled_is_refused(rules_dir, change):
    watcher = RulesWatcher(rules_dir, load_rules(rules_dir))
    before = watcher.current
    path = rules_dir / "rules.yaml"
    if change == "deleted":
        path.unlink()
    else:
        path.write_text("" if change == "empty" else RULES.replace("type: idle_gpu", "type: idle_gpu\n    enabled: false"))
        os.utime(path, ns=(1, 10**18))
    ruleset, refused = watcher.poll()
    assert ruleset is None and "no rule is enabled" in str(refused)
    assert watcher.current is before and watcher.current.names == ["idle-gpu"]
    path.write_text("allow_no_rules: true\n")  # meant: taken up
    os.utime(path, ns=(2, 2 * 10**18))
    ruleset, refused = watcher.poll()
    assert refused is None and ruleset is not None and ruleset.rules == ()


def test_a_deleted_rules_file_is_refused_on_reload(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    watcher = RulesWatcher(path, load_rules(path))
    path.unlink()
    ruleset, refused = watcher.poll()
    assert ruleset is None and "no such file or directory" in str(refused)
    assert watcher.current.names == ["idle-gpu"]
