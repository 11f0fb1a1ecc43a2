"""Silences: what they match is recorded but not posted when it opens within [starts, until) of event time."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from detector.alerts import AlertManager
from detector.backtest import backtest
from detector.delivery import Outbox
from detector.detectors import ResourceInfo
from detector.engine import Engine
from detector.rules import RulesInvalid, load_rules
from detector.simulate import SimConfig
from detector.slack import SlackNotifier
from detector.store import alert_from_row
from detector.suppression import Hold, Silence, SilenceInvalid, snooze
from detector.testing import LocalSlack
from tests.conftest import ROOT
from tests.helpers import MIN, T0, at, burnwatch_in_process, fleet_file, timeline

RULES = """\
rules:
  - name: idle-gpu
    type: idle_gpu
    match: {resource_type: [gpu_instance, notebook]}
silences:
  - id: drain1
    match: {tags: {team: nlp}}
    types: [idle_gpu]
    starts: {starts}
    until: {until}
    reason: cluster drained for the driver upgrade
"""
REASON = "cluster drained for the driver upgrade"


def alerts_for(tmp_path, until: float, starts: float = T0):
    (tmp_path / "rules.yaml").write_text(RULES.replace("{until}", at(until).isoformat())
                                         .replace("{starts}", at(starts).isoformat()))  # fmt: skip
    ruleset = load_rules(tmp_path)
    events = timeline(T0, T0 + 60 * MIN, [0.0] * 4) + timeline(T0 + 60 * MIN, T0 + 65 * MIN, [90.0] * 4)
    findings = Engine(ruleset).process(events)
    return AlertManager(ruleset=ruleset).handle(findings)


def test_silenced_alerts_are_recorded_not_posted(tmp_path, store):
    alerts = alerts_for(tmp_path, until=T0 + 2 * 3600)  # the episode fires at T0+30m, inside the silence
    hold = Hold(kind="silenced", by="drain1", reason=REASON)
    assert [(a.change, a.held, a.silenced) for a in alerts if a.change != "updated"] == [
        ("fired", hold, REASON), ("resolved", hold, REASON)]
    store.alerts.record(alerts, version=1)
    (row,) = store.alerts.latest()
    assert (row["held"], row["held_by"], row["silenced"]) == ("silenced", "drain1", REASON)
    assert alert_from_row(row).held == hold
    with LocalSlack() as slack:
        outbox = Outbox(store, SlackNotifier(token="x", channel="#c", base_url=slack.api_url))
        outbox.add(alerts)
        assert outbox.deliver_pending() == 0 and slack.calls() == []


def test_expired_silence_does_not_apply(tmp_path):
    alerts = alerts_for(tmp_path, until=T0 + 10 * MIN)  # expired before the episode fired
    assert [a.held for a in alerts if a.change == "fired"] == [None]


def test_a_silence_does_not_reach_back_before_its_start(tmp_path):
    """Figure 4 of issue 12: a silence had no start, so it silenced all the past."""
    alerts = alerts_for(tmp_path, starts=T0 + 31 * MIN, until=T0 + 5 * 3600)  # the episode fired at T0+30m
    assert [(a.change, a.silenced) for a in alerts if a.change != "updated"] == [("fired", ""), ("resolved", "")]


def test_the_start_is_in_the_window_and_the_end_is_not():
    silence = Silence(starts=100.0, ends=200.0, reason="r", types=frozenset({"idle_gpu"}))
    assert [silence.active_at(t) for t in (99.9, 100.0, 199.9, 200.0)] == [False, True, True, False]


def test_a_silence_without_a_matcher_cannot_be_made():
    with pytest.raises(SilenceInvalid, match="needs at least one matcher"):
        Silence(starts=0.0, ends=1.0, reason="everything")
    assert snooze("a1", 0.0, 1.0, "alice").covers(at=0.5, rule="r", rule_type="idle_gpu",
                                                  resource=ResourceInfo(), alert_id="a1")  # fmt: skip


@pytest.mark.parametrize(
    "silence, message",
    [
        ("  - {types: [idle_gpus], starts: 2026-11-01T00:00:00Z, until: 2026-12-01T00:00:00Z, reason: x}",
         "unknown rule type(s) 'idle_gpus'"),
        ("  - {rules: [nope], starts: 2026-11-01T00:00:00Z, until: 2026-12-01T00:00:00Z, reason: x}",
         "silences[0].rules: no rule named 'nope'"),
        ("  - {types: [idle_gpu], starts: 2026-11-01T00:00:00Z, until: 2026-12-01T00:00:00, reason: x}",
         "silences[0].until: Input should have timezone info"),
        ("  - {types: [idle_gpu], starts: 2026-11-01T00:00:00Z, until: 2026-12-01T00:00:00Z}",
         "silences[0].reason: Field required"),
        ("  - {types: [idle_gpu], until: 2026-12-01T00:00:00Z, reason: x}", "silences[0].starts: Field required"),
        ("  - {types: [idle_gpu], starts: 2026-12-02T00:00:00Z, until: 2026-12-01T00:00:00Z, reason: x}",
         "silences[0]: until (2026-12-01T00:00:00+00:00) is before starts (2026-12-02T00:00:00+00:00)"),
        ("  - {starts: 2026-11-01T00:00:00Z, until: 2026-12-01T00:00:00Z, reason: everything}",
         "silences[0]: a silence needs at least one matcher (match, types or rules)"),
        ("  - {match: {}, starts: 2026-11-01T00:00:00Z, until: 2026-12-01T00:00:00Z, reason: everything}",
         "silences[0]: a silence needs at least one matcher (match, types or rules)"),
        # matchers that match every value are none
        ("  - {match: {resource_id: '*'}, starts: 2026-11-01T00:00:00Z, until: 2026-12-01T00:00:00Z, reason: x}",
         "silences[0]: a silence needs at least one matcher (match, types or rules): resource_id='*' matches every value"),
        ("  - {match: {tags: {team: '**'}, region: ['*?', us-east-1]}, starts: 2026-11-01T00:00:00Z, "
         "until: 2026-12-01T00:00:00Z, reason: x}", "would hold back every alert"),
    ],
)  # fmt: skip
def test_bad_silences_are_refused_with_their_place(tmp_path, silence, message):
    (tmp_path / "rules.yaml").write_text("rules:\n  - {name: idle-gpu, type: idle_gpu}\nsilences:\n" + silence + "\n")
    with pytest.raises(RulesInvalid) as info:
        load_rules(tmp_path)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "match",
    ["{resource_id: '*'}, types: [idle_gpu]", "{resource_id: 'i-*'}", "{tags: {team: ['*', '!nlp']}}",
     "{resource_id: '*', tags: {team: nlp}}"],
)  # fmt: skip
def test_a_silence_narrowed_by_something_is_taken(tmp_path, match):
    """A '*' beside a type, a pattern with more than stars, an exclusion or another selector narrows it."""
    (tmp_path / "rules.yaml").write_text("rules:\n  - {name: idle-gpu, type: idle_gpu}\nsilences:\n  - {match: "
                                         f"{match}, starts: 2026-11-01T00:00:00Z, until: 2026-12-01T00:00:00Z, "
                                         "reason: x}\n")  # fmt: skip
    (silence,) = load_rules(tmp_path).silences
    assert silence.reason == "x"


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
    assert silence.types == frozenset({"idle_gpu"}) and silence.reason == "offsite" and silence.id == silence_id
    assert silence.starts == pytest.approx(time.time(), abs=60)  # from now on, not over the past
    assert silence.ends - silence.starts == pytest.approx(8 * 3600, abs=1)
    listed = cli("list", "--json", rules=rules)
    (row,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert row["id"] == silence_id and row["state"] == "active"
    assert row["match"] == {"resource_type": "notebook", "tags": {"team": "nlp"}}
    assert cli("expire", silence_id, rules=rules).returncode == 0
    assert cli("list", "--json", rules=rules).stdout == ""  # ended: not in force
    assert json.loads(cli("list", "--all", "--json", rules=rules).stdout)["state"] == "expired"
    (expired,) = load_rules(rules).silences
    assert expired.starts == silence.starts and expired.ends == pytest.approx(time.time(), abs=60)


def test_a_silence_that_has_not_started_lists_as_pending_and_expires_empty(tmp_path):
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    out = cli("add", "--type", "idle_gpu", "--start", "2099-01-01T00:00:00Z", "--for", "2h", "--reason", "later",
              rules=rules)  # fmt: skip
    assert out.returncode == 0, out.stderr
    silence_id = out.stdout.split()[1]
    assert json.loads(cli("list", "--json", rules=rules).stdout)["state"] == "pending"
    assert cli("expire", silence_id, rules=rules).returncode == 0
    (silence,) = load_rules(rules).silences
    assert silence.starts == silence.ends == at_time("2099-01-01T00:00:00Z")  # covers nothing


@pytest.mark.parametrize(
    "args, error",
    [
        (["--match", "team", "--for", "1h", "--reason", "x"], "expected KEY=VALUE"),
        (["--type", "idle_gpus", "--for", "1h", "--reason", "x"], "unknown rule type(s) 'idle_gpus'"),
        (["--type", "idle_gpu", "--for", "soon", "--reason", "x"], "invalid duration 'soon'"),
        (["--rule", "no-such-rule", "--for", "1h", "--reason", "x"], "no rule named 'no-such-rule'"),
        (["--for", "1h", "--reason", "x"], "refused: a silence needs at least one matcher (--match KEY=VALUE, --type"),
        (["--match", "resource_id=*", "--for", "1h", "--reason", "x"], "--match with only '*' patterns matches every"),
        (["--match", "team=*", "--match", "account=**", "--for", "1h", "--reason", "x"], "would hold back every alert"),
        (["--type", "idle_gpu", "--start", "tomorrow", "--for", "1h", "--reason", "x"],
         "--start 'tomorrow': expected an RFC 3339 time"),
        (["--type", "idle_gpu", "--start", "2026-11-02T00:00:00", "--for", "1h", "--reason", "x"],
         "--start '2026-11-02T00:00:00': give the time zone"),
        (["--type", "idle_gpu", "--for", "99999999d", "--reason", "x"],  # "year 275817 is out of range" before
         "--for 99999999d: the silence would end after 2200"),
    ],
    ids=["bad-match", "unknown-type", "bad-duration", "unknown-rule", "no-matcher", "match-all-id", "match-all-tags",
         "bad-start", "start-without-zone", "ends-never"],
)
def test_a_bad_silence_is_refused_and_nothing_is_written(tmp_path, monkeypatch, capsys, args, error):
    """In-process (``streams.cli.main``, as the subprocess runs it): eight cases, two commands
    each, would be sixteen interpreters starting (about 1.3 s of CPU each) to check a message;
    ``test_silence_cli_adds_lists_and_expires`` runs the command as a user does."""
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    code, _, stderr = cli_in_process(monkeypatch, capsys, "add", *args, rules=rules)
    assert code == 1 and error in stderr
    assert not (rules / "silences.yaml").exists()
    assert cli_in_process(monkeypatch, capsys, "expire", "deadbeef", rules=rules)[0] == 1


def test_a_silence_on_a_tag_close_to_one_the_rules_name_is_added_with_a_warning(tmp_path, monkeypatch, capsys):
    """``--match tema=nlp``: a tag of any name may be matched, so it is added, but it silences nothing where
    every resource says ``team``, and nothing else would say so (first-day evaluation): a warning names the
    tag the routing goes by. ``team=nlp`` says nothing."""
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    code, _, stderr = cli_in_process(monkeypatch, capsys, "add", "--match", "tema=nlp", "--for", "1h",
                                          "--reason", "offsite", rules=rules)  # fmt: skip
    assert code == 0 and "--match tema=...: no rule or routing names a tag 'tema'; did you mean 'team'?" in stderr, stderr
    code, _, stderr = cli_in_process(monkeypatch, capsys, "add", "--match", "team=nlp", "--for", "1h",
                                          "--reason", "offsite", rules=rules)  # fmt: skip
    assert code == 0 and "warning" not in stderr, stderr


def test_a_silence_on_a_tag_an_override_or_a_required_tag_names_says_nothing(tmp_path, monkeypatch, capsys):
    """A tag a rule's override matches on (``owners``), or one the untagged rule requires (``projects``), is named
    by the rules: a silence on it silences what it says, and was warned of as a misspelling of ``owner`` and
    ``project``'s neighbour, 'no rule or routing names a tag' (18dc245 looked at the rules' own match alone)."""
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    (rules / "rules.yaml").write_text(
        "rules:\n"
        "  - name: idle-gpu\n"
        "    type: idle_gpu\n"
        "    overrides:\n"
        "      - match: {tags: {owners: ml-infra}}\n"
        "        params: {for: 2h}\n"
        "  - name: untagged\n"
        "    type: untagged\n"
        "    params: {required_tags: [team, owner, teams]}\n"
    )  # fmt: skip
    for tag in ("owners", "teams"):
        code, _, stderr = cli_in_process(monkeypatch, capsys, "add", "--match", f"{tag}=x", "--for", "1h",
                                         "--reason", "offsite", rules=rules)  # fmt: skip
        assert code == 0 and "warning" not in stderr, stderr
    code, _, stderr = cli_in_process(monkeypatch, capsys, "add", "--match", "ownres=x", "--for", "1h",
                                     "--reason", "offsite", rules=rules)  # fmt: skip
    assert code == 0 and "did you mean 'owner" in stderr, stderr


@pytest.mark.parametrize(
    "text, said",
    [
        ("silences:\n  - match: {tags: {team: nlp}\n", "silences.yaml:3: invalid YAML"),
        ("- a\n- b\n", "silences.yaml:1: a rule file is a mapping"),
        ("silences: {a: 1}\n", "silences.yaml:1 silences: expected a list of silences"),
    ],
    ids=["invalid-yaml", "a-list", "a-mapping"],
)  # fmt: skip
def test_a_silences_file_broken_by_hand_is_named_not_a_traceback(tmp_path, monkeypatch, capsys, text, said):
    """add and expire read the file before they write it: a hand edit that broke it is refused at its line,
    as list refuses it, and the file is left as it was."""
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    (rules / "silences.yaml").write_text(text)
    for args in (["add", "--match", "team=nlp", "--for", "8h", "--reason", "x"], ["expire", "abc"]):
        code, _, stderr = cli_in_process(monkeypatch, capsys, *args, rules=rules)
        assert code == 1 and said in stderr and "Traceback" not in stderr, stderr
    assert (rules / "silences.yaml").read_text() == text


def cli_in_process(monkeypatch, capsys, *args: str, rules) -> tuple[int, str, str]:
    """``burnwatch silence ARGS`` in-process (see :func:`tests.helpers.burnwatch_in_process`)."""
    monkeypatch.setattr("streams.cli.configure_logging", lambda *a, **k: None)
    return burnwatch_in_process(capsys, "silence", *args, "--rules", str(rules))


def at_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.fixture(scope="module")
def small_fleet(tmp_path_factory, ruleset):
    path, _ = fleet_file(tmp_path_factory.mktemp("fleet") / "fleet.jsonl",
                         SimConfig(hours=12, training_hosts=6, notebooks=4, seed=5), ruleset.pricing)  # fmt: skip
    return path


def backtest_cli(fleet, rules) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streams.cli", "backtest", str(fleet), "--json", "--rules", str(rules)],
                          capture_output=True, text=True)  # fmt: skip


def rules_with_silence(tmp_path: Path, *add: str) -> tuple[Path, str]:
    """A copy of the shipped rules with one silence over every resource (``silence add`` with
    ``add``); its id. It names every rule type the rules have: ``--match resource_type=*`` alone
    is refused (it would hold back every alert, and likely was not meant to)."""
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    types = [arg for t in sorted({r.source.type for r in load_rules(rules).rules}) for arg in ("--type", t)]
    out = cli("add", "--match", "resource_type=*", *types, *add, rules=rules)
    assert out.returncode == 0, out.stderr
    return rules, out.stdout.split()[1]


def test_an_expired_silence_does_not_silence_the_past(tmp_path, small_fleet):
    """Figure 4 of issue 12: after adding and expiring a silence, backtest still silenced most alerts."""
    rules, silence_id = rules_with_silence(tmp_path, "--for", "8h", "--reason", "oops")
    assert cli("expire", silence_id, rules=rules).returncode == 0
    result = backtest_cli(small_fleet, rules)
    assert result.returncode == 0, result.stderr
    alerts = [json.loads(line) for line in result.stdout.splitlines()]
    assert alerts and sum(bool(a["silenced"]) for a in alerts) == 0
    assert [a for a in alerts if a["held"]] == []
    assert "held back" not in result.stderr


def test_backtest_says_how_many_alerts_were_silenced_and_by_what(tmp_path, small_fleet):
    rules, silence_id = rules_with_silence(tmp_path, "--start", "2026-11-02T00:00:00Z", "--for", "6h",
                                           "--reason", "maintenance")  # fmt: skip
    result = backtest_cli(small_fleet, rules)
    alerts = [json.loads(line) for line in result.stdout.splitlines()]
    six_hours = at_time("2026-11-02T06:00:00Z")
    silenced = [a for a in alerts if at_time(a["fired_at"]) < six_hours]
    assert silenced and len(silenced) < len(alerts)  # the silence covers the first six hours only
    assert all(a["held"] == {"kind": "silenced", "by": silence_id, "reason": "maintenance"} for a in silenced)
    assert all(a["held"] is None or a["held"]["kind"] != "silenced" for a in alerts if a not in silenced)
    line = f"{len(silenced)} of {len(alerts)} alerts held back, recorded but not posted: "
    assert line + f"{len(silenced)} silenced ({len(silenced)} by silence {silence_id} 'maintenance')" in result.stderr
    text = subprocess.run([sys.executable, "-m", "streams.cli", "backtest", str(small_fleet), "--rules", str(rules)],
                          capture_output=True, text=True).stdout.splitlines()  # fmt: skip
    assert len(text) == len(alerts)
    assert sum(line.endswith("  (held back, silenced: maintenance)") for line in text) == len(silenced)


def test_episodes_still_open_at_the_end_of_a_backtest_stay_silenced(tmp_path, small_fleet):
    rules, _ = rules_with_silence(tmp_path, "--start", "2026-11-01T00:00:00Z", "--for", "30d", "--reason",
                                  "all month")  # fmt: skip
    alerts = backtest(small_fleet, load_rules(rules)).alerts
    still_open = [a for a in alerts if a.status == "firing"]
    assert still_open and len(still_open) < len(alerts)
    assert {a.silenced for a in alerts} == {"all month"}
    assert {a.held.kind if a.held else None for a in still_open} == {"silenced"}
