"""The untagged detector on crafted usage sequences."""

from __future__ import annotations

import shutil

import pytest

from detector.engine import Engine
from detector.rules import load_rules
from tests.conftest import ROOT
from tests.helpers import MIN, T0, usage

TAGGED = {"team": "nlp", "project": "llm", "owner": "alice"}


def untagged_findings(ruleset, events):
    return [f for f in Engine(ruleset).process(events) if f.type == "untagged"]


def run_for(minutes: int, tags: dict, start: float = T0, state: str = "running") -> list:
    return [usage(start + i * MIN, "r1", tags=tags, state=state, usd_per_hour=6.0) for i in range(minutes)]


def test_fires_after_grace_with_spend_and_resolves_when_tagged(ruleset):
    events = run_for(90, {"team": "nlp"}) + run_for(5, TAGGED, start=T0 + 90 * MIN)
    found = [f for f in untagged_findings(ruleset, events) if f.action != "update"]
    assert [f.action for f in found] == ["fire", "resolve"]
    fire, resolve = found
    assert fire.fired_at == T0 + 3600 and fire.details["missing_tags"] == ["project"]
    assert resolve.at == T0 + 90 * MIN and resolve.details["reason"] == "tags_added"
    assert resolve.waste_usd == pytest.approx(6.0 * 90 / 60)  # 90 running minutes at $6/h


@pytest.mark.parametrize(
    "events",
    [
        run_for(120, TAGGED),  # tagged: nothing to say
        run_for(50, {}),  # untagged for 50 minutes: still inside the grace period
        run_for(50, {"team": "nlp"}) + run_for(30, TAGGED, start=T0 + 50 * MIN),  # tagged in time
        run_for(180, {}, state="stopped"),  # stopped all along: no spend to attribute
        run_for(120, {}, state="stopped") + run_for(50, {}, start=T0 + 120 * MIN),  # runs, still inside the grace
    ],
    ids=["tagged", "under-grace", "tagged-in-time", "stopped", "grace-from-first-run"],
)
def test_no_alert(ruleset, events):
    assert untagged_findings(ruleset, events) == []


def test_stopped_time_costs_nothing_and_termination_resolves(ruleset):
    events = run_for(70, {}) + run_for(60, {}, start=T0 + 70 * MIN, state="stopped")
    events.append(usage(T0 + 130 * MIN, "r1", tags={}, state="terminated"))
    found = [f for f in untagged_findings(ruleset, events) if f.action != "update"]
    assert [f.action for f in found] == ["fire", "resolve"]
    assert found[-1].details["reason"] == "terminated"
    assert found[-1].waste_usd == pytest.approx(6.0 * 70 / 60)


def test_reread_intervals_are_not_counted_twice(ruleset):
    events = run_for(90, {})
    engine = Engine(ruleset)
    engine.process(events)
    engine.process(events[40:])
    (open_episode,) = [f for f in engine.open_episodes() if f.type == "untagged"]
    assert open_episode.waste_usd == pytest.approx(6.0 * 90 / 60)


def test_unattributed_spend_per_account_is_a_view(ruleset, store):
    from detector.alerts import AlertManager

    events = sorted(run_for(90, {}) + [usage(T0 + i * MIN, "r2", tags={"team": "nlp"}, usd_per_hour=3.0)
                                       for i in range(120)], key=lambda e: e.ts)  # fmt: skip
    engine = Engine(ruleset)
    alerts = AlertManager(ruleset=ruleset).handle(engine.process(events))
    store.alerts.record(alerts, version=1)
    (row,) = store.query(f"SELECT * FROM {store.db}.unattributed_spend")
    assert row["account"] == "acct" and row["resources"] == 2 and row["still_untagged"] == 2
    last = {a.alert_id: a for a in alerts}.values()
    assert row["usd"] == pytest.approx(round(sum(a.waste_usd for a in last), 2))
    assert row["usd_per_hour_now"] == pytest.approx(6.0 + 3.0)


@pytest.mark.parametrize("tags", [{"Team": "nlp", "Project": "llm", "Owner": "alice"},
                                  {"TEAM": "nlp", "user:Project": "llm"}])  # fmt: skip
def test_tags_in_another_case_are_the_tags_the_rules_name(ruleset, tags):
    """A fleet tagging as AWS's examples do (``Team``, ``Project``; ``user:Project`` from a Cost and Usage Report):
    tagged, not untagged; its alerts carry ``team`` for routing, the digest and the store's reports, beside the keys
    as written. Before, every resource of such a fleet was untagged (an alert each on day one), its alerts went to
    the default channel and its waste to no team."""
    assert untagged_findings(ruleset, run_for(120, tags)) == []
    idle = [usage(T0 + i * MIN, "r1", tags=tags, usd_per_hour=6.0) for i in range(120)]
    engine = Engine(ruleset)
    engine.process(idle)
    info = engine.resource("r1")
    assert info is not None and info.tags["team"] == "nlp" and info.tags["project"] == "llm"
    assert all(info.tags[k] == v for k, v in tags.items())  # as written, too
    assert info.tags[ruleset.routing.by_tag] == "nlp"  # what routing reads


def test_the_key_as_the_rules_spell_it_wins_over_another_case(ruleset):
    """Both written (``team`` and ``Team``): the rules' own spelling is read; one empty is filled by the other."""
    engine = Engine(ruleset)
    engine.process([usage(T0, "r1", tags={"Team": "vision", "team": "nlp", "project": "", "PROJECT": "llm"})])
    info = engine.resource("r1")
    assert info is not None and (info.tags["team"], info.tags["project"]) == ("nlp", "llm")


def _rules_copy(tmp_path):
    for path in (ROOT / "rules").iterdir():
        shutil.copy(path, tmp_path / path.name)
    return tmp_path


def test_a_reload_that_names_a_tag_completes_the_tags_held(tmp_path):
    """A reload adds ``costcenter`` to ``required_tags``; the fleet writes ``CostCenter``. The resources held read
    it as the rules spell it from the reload on, as an engine started with the new rules does. Before, a key whose
    tags had gained nothing (``team``, ``project`` as written) was never completed again (its tags compared equal
    at each usage event): an untagged alert for each such resource, until a restart."""
    rules = _rules_copy(tmp_path)
    tags = {"team": "nlp", "project": "llm", "CostCenter": "cc1"}

    def running(start: int, minutes: int) -> list:
        return [usage(T0 + (start + i) * MIN, "r1", tags=tags, usd_per_hour=6.0) for i in range(minutes)]

    engine = Engine(load_rules(rules))
    engine.process(running(0, 30))
    text = (rules / "rules.yaml").read_text().replace("required_tags: [team, project]",
                                                      "required_tags: [team, project, costcenter]")
    (rules / "rules.yaml").write_text(text)
    reloaded = load_rules(rules)
    engine.set_ruleset(reloaded)
    info = engine.resource("r1")
    assert info is not None and info.tags["costcenter"] == "cc1"
    assert [f for f in engine.process(running(30, 120)) if f.type == "untagged"] == []
    assert [f for f in Engine(reloaded).process(running(0, 150)) if f.type == "untagged"] == []


@pytest.mark.parametrize("written", ["team", "Team", "TEAM"])
def test_a_key_the_routing_spells_in_another_case_is_the_team_too(tmp_path, written):
    """``routing.yaml`` names ``by_tag: Team`` (as a fleet tagging ``Team`` wrote it before tags were read in any
    case), and the store's reports read ``team``: a resource tagged either way, or ``TEAM``, carries both, routed
    to its team's channel and counted as its team's. Before, one key folding to another the rules name (``Team``,
    ``team``) was left alone: ``team`` went to the default channel, ``Team``'s waste to no team."""
    rules = _rules_copy(tmp_path)
    text = (rules / "routing.yaml").read_text()
    (rules / "routing.yaml").write_text(text.replace("by_tag: team", "by_tag: Team")
                                        .replace("channels: {}", 'channels: {nlp: "#nlp-cost"}'))  # fmt: skip
    ruleset = load_rules(rules)
    engine = Engine(ruleset)
    engine.process([usage(T0, "r1", tags={written: "nlp", "project": "llm"})])
    info = engine.resource("r1")
    assert info is not None and (info.tags["team"], info.tags["Team"]) == ("nlp", "nlp")
    assert ruleset.channel_for("untagged", info.tags) == "#nlp-cost"


def test_a_key_the_rules_spell_is_read_before_another_spelling_of_it(tmp_path):
    """``by_tag: Team`` and the store's ``team`` both named: a resource writing ``team`` and ``TEAM`` differently
    gets ``Team`` from ``team``, the rules' own spelling, wherever ``TEAM`` stands among its tags."""
    rules = _rules_copy(tmp_path)
    (rules / "routing.yaml").write_text((rules / "routing.yaml").read_text().replace("by_tag: team", "by_tag: Team"))
    engine = Engine(load_rules(rules))
    engine.process([usage(T0, "r1", tags={"TEAM": "vision", "team": "nlp"})])
    info = engine.resource("r1")
    assert info is not None and (info.tags["Team"], info.tags["team"]) == ("nlp", "nlp")
