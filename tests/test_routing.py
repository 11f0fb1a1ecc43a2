"""Routing: a rule's route, then the team's channel, then the default, then SLACK_CHANNEL."""

from __future__ import annotations

import pytest

from detector.alerts import AlertManager
from detector.engine import Engine
from detector.rules import RulesInvalid, load_rules
from detector.slack import SlackNotifier
from detector.testing import LocalSlack
from tests.helpers import MIN, T0, scrape, usage

RULES = """\
rules:
  - name: idle-gpu
    type: idle_gpu
  - name: idle-notebook
    type: idle_gpu
    match: {resource_type: notebook}
    route: {channel: "#notebooks"}
"""
ROUTING = """\
default_channel: "#ml-cost"
by_tag: team
channels:
  nlp: "#nlp-cost"
"""


def idle(rid: str, team: str, resource_type: str = "gpu_instance", tags: dict | None = None) -> list:
    events = []
    for i in range(80):
        t = T0 + i * 30
        events.append(usage(t, rid, tags=tags or {"team": team}, resource_type=resource_type))
        events.extend(scrape(t, [0.0], rid))
    return events


def idle_host(rid: str, tags: dict) -> list:
    return idle(rid, tags["team"], tags=tags)


def test_channels(tmp_path):
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "routing.yaml").write_text(ROUTING)
    ruleset = load_rules(tmp_path)
    events = idle("a", "nlp") + idle("b", "vision") + idle("c", "nlp", "notebook")
    fired = [a for a in AlertManager(ruleset=ruleset).handle(Engine(ruleset).process(events)) if a.change == "fired"]
    channels = {(a.resource_id, a.rule): a.channel for a in fired}
    assert channels[("a", "idle-gpu")] == "#nlp-cost"
    assert channels[("b", "idle-gpu")] == "#ml-cost"
    assert channels[("c", "idle-notebook")] == "#notebooks"
    with LocalSlack() as slack:
        notifier = SlackNotifier(token="x", channel="#fallback", base_url=slack.api_url)
        for alert in fired:
            notifier.post(alert)
        posted = {p.body["channel"] for p in slack.calls("chat.postMessage")}
    assert posted == {"#nlp-cost", "#ml-cost", "#notebooks"}
    assert T0 + 30 * MIN in {a.fired_at for a in fired}


def test_bad_routing_file_is_refused(tmp_path):
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "routing.yaml").write_text("default_channel: '#x'\nchanels: {}\n")
    with pytest.raises(RulesInvalid, match=r"routing.yaml:2 chanels: unknown key"):
        load_rules(tmp_path)


def test_severity_routes_owner_mentions_and_links(tmp_path):
    from detector.slack import render_blocks

    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "routing.yaml").write_text(
        "channels: {nlp: '#nlp-cost'}\n"
        "by_severity: {critical: '#ml-oncall'}\n"
        "users: {alice: U012AB3CD}\n"
        "links:\n"
        "  - {name: Console, url: 'https://console.example/{region}/{resource_id}?from={episode_start}'}\n"
        "  - {name: Runs, url: 'https://mlflow.example/{project}', types: [failed_run_spend]}\n"
    )
    ruleset = load_rules(tmp_path)
    tags = {"team": "nlp", "owner": "alice", "project": "llm"}
    assert ruleset.channel_for("idle-gpu", tags, "warning") == "#nlp-cost"
    assert ruleset.channel_for("idle-gpu", tags, "critical") == "#ml-oncall"  # severity before team
    fired = [a for a in AlertManager(ruleset=ruleset).handle(Engine(ruleset).process(idle_host("h1", tags)))
             if a.change == "fired"]  # fmt: skip
    text = str(render_blocks(fired[0], routing=ruleset.routing))
    assert "<@U012AB3CD>" in text  # the owner, mentioned
    assert "<https://console.example/us-east-1/h1?from=2026-11-02T00%3A00%3A00Z|Console>" in text
    assert "mlflow" not in text  # a link for another type


def test_a_link_with_an_unknown_field_is_refused_with_its_line(tmp_path):
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "routing.yaml").write_text("links:\n  - {name: X, url: 'https://x.example/{hostname}'}\n")
    with pytest.raises(RulesInvalid, match=r"routing.yaml:2 links\[0\]\.url: unknown field\(s\) hostname"):
        load_rules(tmp_path)
