"""A rule's ``action`` and routing's ``approvers``: validated with the rules, file:line errors,
a refused file keeps the old configuration, ``rules explain`` shows the action."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from detector.rules import RulesInvalid, explain, load_rules
from streams.config import LiveConfig

IDLE = """
rules:
  - name: idle-gpu
    type: idle_gpu
    params: {{for: 30m}}
{action}
"""


def write(tmp_path: Path, action: str = "", routing: str = "", rule: str = IDLE) -> Path:
    (tmp_path / "rules.yaml").write_text(textwrap.dedent(rule).format(action=action))
    if routing:
        (tmp_path / "routing.yaml").write_text(textwrap.dedent(routing))
    return tmp_path


def test_no_action_is_notify_only_and_an_action_has_safe_defaults(tmp_path):
    ruleset = load_rules(write(tmp_path))
    assert ruleset.action_for("idle-gpu").kind == "notify_only" and not ruleset.action_for("idle-gpu").acts
    assert "action: notify_only" in explain(ruleset, "idle-gpu")
    ruleset = load_rules(write(tmp_path, "    action: {kind: stop_instance, after: 2h}"))
    spec = ruleset.action_for("idle-gpu")
    assert (spec.kind, spec.after, spec.mode, spec.grace) == ("stop_instance", 7200.0, "dry_run", 3600.0)
    shown = explain(load_rules(write(tmp_path, "    action: {kind: stop_instance, after: 2h, mode: auto_unless_objected, "
                                               "grace: 30m}")), "idle-gpu")  # fmt: skip
    assert "action:\n  kind: stop_instance\n  after: 2h\n  mode: auto_unless_objected\n  grace: 30m" in shown


@pytest.mark.parametrize(
    "action, where, message",
    [
        ("    action: {kind: delete_instance}", "rules.yaml:6 rules[0].action.kind", "Input should be"),
        ("    action: {kind: stop_instance, mode: yolo}", "rules.yaml:6 rules[0].action.mode", "Input should be"),
        ("    action: {kind: stop_instance, after: soon}", "rules.yaml:6 rules[0].action.after", "invalid duration"),
        ("    action: {kind: stop_instance, credentials: AKIA}", "rules.yaml:6 rules[0].action.credentials", "unknown key"),
        # a grace or an after past 30 days: a typo (1000000w for 1000000s) whose due time could not be stored
        ("    action: {kind: stop_instance, mode: auto_unless_objected, grace: 1000000w}",
         "rules.yaml:6 rules[0].action.grace", "at most 30d (got 7000000d)"),
        ("    action: {kind: stop_instance, grace: 31d}", "rules.yaml:6 rules[0].action.grace", "at most 30d"),
        ("    action: {kind: stop_instance, after: 100000000}", "rules.yaml:6 rules[0].action.after", "at most 30d"),
        # an automatic action's warning nobody has the time to object to: acting at the pass after it
        ("    action: {kind: stop_instance, mode: auto_unless_objected, grace: 0s}", "rules.yaml:6 rules[0].action",
         "grace: at least 5m for mode auto_unless_objected (got 0m)"),
        ("    action: {kind: stop_instance, mode: auto_unless_objected, grace: 30}", "rules.yaml:6 rules[0].action",
         "(got 30s)"),
    ],
    ids=["kind", "mode", "after", "extra-key", "huge-grace", "grace-31d", "huge-after", "no-grace", "grace-30-seconds"],
)  # fmt: skip
def test_a_bad_action_is_refused_with_its_line(tmp_path, action, where, message):
    with pytest.raises(RulesInvalid) as caught:
        load_rules(write(tmp_path, action))
    (error,) = caught.value.errors
    assert str(error).startswith(str(tmp_path / where)) and message in error.message


def test_a_short_grace_is_taken_where_nothing_acts_automatically(tmp_path):
    spec = load_rules(write(tmp_path, "    action: {kind: stop_instance, mode: approve, grace: 0s}")).action_for("idle-gpu")
    assert spec.grace == 0
    spec = load_rules(write(tmp_path, "    action: {kind: stop_instance, mode: auto_unless_objected, grace: 5m}")
                      ).action_for("idle-gpu")  # fmt: skip
    assert spec.grace == 300


def test_a_grace_or_after_of_30_days_is_taken(tmp_path):
    spec = load_rules(write(tmp_path, "    action: {kind: stop_instance, after: 30d, grace: 720h}")).action_for("idle-gpu")
    assert spec.after == spec.grace == 30 * 86_400


def test_a_kind_that_cannot_end_the_rules_incidents_is_refused(tmp_path):
    rule = """
    rules:
      - name: bucket-growth
        type: storage_growth
        action:
          kind: stop_instance
          mode: approve
    {action}
    """
    with pytest.raises(RulesInvalid) as caught:
        load_rules(write(tmp_path, "", rule=rule))
    (error,) = caught.value.errors
    assert (error.line, error.path) == (6, "rules[0].action.kind")
    assert "stop_instance cannot end a storage_growth incident" in error.message and "idle_gpu" in error.message


def test_approvers_are_slack_ids_and_resolve_per_team(tmp_path):
    routing = """
    owner_tag: owner
    users: {alice: U0ALICE1}
    approvers:
      default: [U0PLATFORM]
      teams: {nlp: [U0NLPLEAD, S0NLPLEADS]}
      owner: true
    """
    ruleset = load_rules(write(tmp_path, routing=routing))
    assert ruleset.routing.approvers_for({"team": "nlp", "owner": "alice"}) == (["U0NLPLEAD", "S0NLPLEADS"], "U0ALICE1")
    assert ruleset.routing.approvers_for({"team": "vision"}) == (["U0PLATFORM"], "")
    bad = routing.replace("U0PLATFORM", "bob")
    with pytest.raises(RulesInvalid) as caught:
        load_rules(write(tmp_path, routing=bad))
    (error,) = caught.value.errors
    assert error.file.endswith("routing.yaml") and error.line == 5 and error.path == "approvers.default[0]"
    assert "'bob' is not a Slack user id" in error.message


def test_a_refused_edit_keeps_the_actions_in_force(tmp_path):
    write(tmp_path, "    action: {kind: stop_instance, mode: approve}")
    config = LiveConfig.load(tmp_path)
    (tmp_path / "rules.yaml").write_text(IDLE.format(action="    action: {kind: stop_instance, mode: sometimes}"))
    new, refused = config.reload()
    assert new is None and refused is not None
    assert config.current.ruleset.action_for("idle-gpu").mode == "approve"


STALE = """\
rules:
  - name: gpu-metrics-stale
    type: telemetry_stale
    match: {{resource_type: gpu_instance}}
{action}
"""


def test_a_telemetry_stale_rule_stops_a_machine_only_on_a_persons_approval(tmp_path):
    """telemetry_stale fires because a host's GPU metrics stopped coming (its exporter crashed): the machine may be
    training. An automatic stop is refused at the line, whatever the grace, as a bad rules file is (the old rules
    kept on a reload); approve and dry_run are taken. Before, auto_unless_objected stopped such a machine, busy or
    not, once its grace passed with nobody objecting."""
    with pytest.raises(RulesInvalid) as caught:
        load_rules(write(tmp_path, "    action: {kind: stop_instance, mode: auto_unless_objected, grace: 2h}", rule=STALE))
    (error,) = caught.value.errors
    assert str(error).startswith(str(tmp_path / "rules.yaml:5 rules[0].action.mode"))
    assert "cannot act on a telemetry_stale incident" in error.message and "use mode approve" in error.message
    for mode in ("approve", "dry_run"):
        spec = load_rules(write(tmp_path, f"    action: {{kind: stop_instance, mode: {mode}}}", rule=STALE)).action_for(
            "gpu-metrics-stale")  # fmt: skip
        assert (spec.kind, spec.mode) == ("stop_instance", mode)
    spec = load_rules(write(tmp_path, "    action: {kind: stop_instance, mode: auto_unless_objected, grace: 2h}")
                      ).action_for("idle-gpu")  # fmt: skip
    assert spec.mode == "auto_unless_objected"  # an idle GPU's samples say the machine does nothing
