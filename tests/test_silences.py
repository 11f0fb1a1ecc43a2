"""Silences: matching findings are recorded but not posted, until their expiry in event time."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest

from detector.alerts import AlertManager
from detector.delivery import Outbox
from detector.engine import Engine
from detector.rules import RulesInvalid, load_rules
from detector.slack import SlackNotifier
from detector.testing import LocalSlack
from tests.conftest import ROOT
from tests.helpers import MIN, T0, at, timeline

RULES = """\
rules:
  - name: idle-gpu
    type: idle_gpu
    match: {resource_type: [gpu_instance, notebook]}
silences:
  - match: {tags: {team: nlp}}
    types: [idle_gpu]
    until: {until}
    reason: cluster drained for the driver upgrade
"""


def alerts_for(tmp_path, until: float):
    (tmp_path / "rules.yaml").write_text(RULES.replace("{until}", at(until).isoformat()))
    ruleset = load_rules(tmp_path)
    events = timeline(T0, T0 + 60 * MIN, [0.0] * 4) + timeline(T0 + 60 * MIN, T0 + 65 * MIN, [90.0] * 4)
    findings = Engine(ruleset).process(events)
    return AlertManager(ruleset=ruleset).handle(findings)


def test_silenced_alerts_are_recorded_not_posted(tmp_path, store):
    alerts = alerts_for(tmp_path, until=T0 + 2 * 3600)  # the episode fires at T0+30m, inside the silence
    assert [(a.change, a.silenced) for a in alerts if a.change != "updated"] == [
        ("fired", "cluster drained for the driver upgrade"), ("resolved", "cluster drained for the driver upgrade")]
    store.record_alerts(alerts, version=1)
    assert store.alerts()[0]["silenced"] == "cluster drained for the driver upgrade"
    with LocalSlack() as slack:
        outbox = Outbox(store, SlackNotifier(token="x", channel="#c", base_url=slack.api_url))
        outbox.add(alerts)
        assert outbox.deliver_pending() == 0 and slack.calls() == []


def test_expired_silence_does_not_apply(tmp_path):
    alerts = alerts_for(tmp_path, until=T0 + 10 * MIN)  # expired before the episode fired
    assert [a.silenced for a in alerts if a.change == "fired"] == [""]


@pytest.mark.parametrize(
    "silence, message",
    [
        ("  - {types: [idle_gpus], until: 2026-12-01T00:00:00Z, reason: x}", "unknown rule type(s) 'idle_gpus'"),
        ("  - {rules: [nope], until: 2026-12-01T00:00:00Z, reason: x}", "silences[0].rules: no rule named 'nope'"),
        ("  - {until: 2026-12-01T00:00:00, reason: x}", "silences[0].until: Input should have timezone info"),
        ("  - {until: 2026-12-01T00:00:00Z}", "silences[0].reason: Field required"),
    ],
)
def test_bad_silences_are_refused_with_their_place(tmp_path, silence, message):
    (tmp_path / "rules.yaml").write_text("rules:\n  - {name: idle-gpu, type: idle_gpu}\nsilences:\n" + silence + "\n")
    with pytest.raises(RulesInvalid) as info:
        load_rules(tmp_path)
    assert message in str(info.value)


def cli(*args: str, rules) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streams.cli", "silence", *args, "--rules", str(rules)],
                          capture_output=True, text=True)  # fmt: skip


def test_silence_cli_adds_lists_and_expires(tmp_path):
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    out = cli("add", "--match", "team=nlp", "--match", "resource_type=notebook", "--type", "idle_gpu",
              "--for", "8h", "--reason", "offsite", "--by", "alice", rules=rules)  # fmt: skip
    assert out.returncode == 0, out.stderr
    silence_id = out.stdout.split()[1]
    ruleset = load_rules(rules)  # the worker's reload sees exactly this
    (silence,) = ruleset.silences
    assert silence.types == frozenset({"idle_gpu"}) and silence.reason == "offsite"
    assert silence.until - time.time() == pytest.approx(8 * 3600, abs=60)
    listed = cli("list", "--json", rules=rules)
    (row,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert row["id"] == silence_id and row["active"] and row["match"] == {"resource_type": "notebook", "tags": {"team": "nlp"}}
    assert cli("expire", silence_id, rules=rules).returncode == 0
    assert cli("list", "--json", rules=rules).stdout == ""  # ended: not in force
    assert json.loads(cli("list", "--all", "--json", rules=rules).stdout)["active"] is False


@pytest.mark.parametrize(
    "args, error",
    [
        (["--match", "team", "--for", "1h", "--reason", "x"], "expected KEY=VALUE"),
        (["--type", "idle_gpus", "--for", "1h", "--reason", "x"], "unknown rule type(s) 'idle_gpus'"),
        (["--for", "soon", "--reason", "x"], "invalid duration 'soon'"),
        (["--rule", "no-such-rule", "--for", "1h", "--reason", "x"], "no rule named 'no-such-rule'"),
    ],
    ids=["bad-match", "unknown-type", "bad-duration", "unknown-rule"],
)
def test_a_bad_silence_is_refused_and_nothing_is_written(tmp_path, args, error):
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    out = cli("add", *args, rules=rules)
    assert out.returncode == 1 and error in out.stderr
    assert not (rules / "silences.yaml").exists()
    assert cli("expire", "deadbeef", rules=rules).returncode == 1
