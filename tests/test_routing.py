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


def idle(rid: str, team: str, resource_type: str = "gpu_instance") -> list:
    events = []
    for i in range(80):
        t = T0 + i * 30
        events.append(usage(t, rid, tags={"team": team}, resource_type=resource_type))
        events.extend(scrape(t, [0.0], rid))
    return events


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
