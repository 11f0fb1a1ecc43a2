"""Who may approve an action: routing.yaml's approvers, a user group's members as Slack says
(slack-sdk against the local server), and nobody when a group cannot be read."""

from __future__ import annotations

import pytest

from detector.remediation.policy import Action, may_approve
from detector.rules import Approvers, Routing
from detector.slack import SlackNotifier
from detector.testing import LocalSlack

ROUTING = Routing(users={"alice": "U0ALICE1"},
                  approvers=Approvers(default=["U0PLATFORM"], teams={"nlp": ["U0NLPLEAD", "S0NLPLEADS"]}, owner=True))
NLP = {"team": "nlp", "owner": "alice"}


@pytest.fixture
def members():
    with LocalSlack() as slack:
        slack.usergroups["S0NLPLEADS"] = ["U0GROUPIE"]
        yield SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=2).group_members


@pytest.mark.parametrize(
    "tags, user, allowed",
    [
        (NLP, "U0NLPLEAD", True),  # named for the team
        (NLP, "U0GROUPIE", True),  # a member of the team's group, as Slack says
        (NLP, "U0ALICE1", True),  # the owner, with owner: true
        (NLP, "U0PLATFORM", False),  # the default does not apply to a team that has its own list
        ({"team": "vision"}, "U0PLATFORM", True),  # it does to a team without one
        ({"team": "vision"}, "U0NLPLEAD", False),
        (NLP, "", False),  # a click with no user id
    ],
)
def test_who_may_approve(members, tags, user, allowed):
    assert may_approve(ROUTING, tags, user, members)[0] is allowed


def test_a_group_that_cannot_be_read_lets_nobody_through(members):
    routing = Routing(approvers=Approvers(default=["S0UNKNOWN"]))
    allowed, why = may_approve(routing, {}, "U0GROUPIE", members)
    assert not allowed and "could not read user group(s) S0UNKNOWN" in why and "no_such_subteam" in why
    assert not may_approve(routing, {}, "U0GROUPIE", None)[0]  # no Slack client at all: refused too


def test_no_approvers_refuses_everyone():
    allowed, why = may_approve(Routing(), {"team": "nlp"}, "U0NLPLEAD", None)
    assert not allowed and "no approvers" in why


def test_state_is_rebuilt_from_the_steps_in_order():
    common = {"alert_id": "a1", "kind": "stop_instance", "mode": "approve", "rule": "idle-gpu", "resource_id": "i-1",
              "team": "nlp", "api": "ec2.StopInstances", "request": '{"InstanceIds": ["i-1"]}', "endpoint": "us-east-1",
              "usd_per_hour": 32.77, "attempt": 0, "due_at": None, "decided_by": "", "result": "", "at": 1.0}
    rows = [{**common, "step": "proposed"}, {**common, "step": "refused", "decided_by": "U0X"},
            {**common, "step": "approved", "decided_by": "U0NLPLEAD"}, {**common, "step": "begun", "attempt": 1}]
    (action,) = Action.from_steps(rows).values()
    assert (action.state, action.decided_by, action.attempts, action.ended) == ("begun", "U0NLPLEAD", 1, False)
    assert action.call is not None and action.call.request == {"InstanceIds": ["i-1"]}
