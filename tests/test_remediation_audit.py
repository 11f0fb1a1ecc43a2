"""Reading the audit (``remediation_actions``) back: a row an older version could write must
never make the table unreadable (recovery, clicks and the incidents page all read it)."""

from __future__ import annotations

import json

from detector.incidents_actions import actions_of
from detector.remediation.base import Target
from detector.remediation.ec2 import StopInstance
from detector.remediation.runner import ActionRunner
from detector.rules import load_rules
from detector.slack import SlackNotifier
from detector.store import ActionStep
from detector.testing import LocalSlack
from detector.units import epoch
from tests import aws
from tests.aws import run_instance, session, state
from tests.test_remediation_runner import NOW, Wall, incident, posted, rules_dir

moto_url = aws.moto_url  # the fixture: moto's server on 127.0.0.1

YEAR_21192 = NOW + 1_000_000 * 604_800.0
"""The due time ``grace: 1000000w`` gave before grace was bounded: past DateTime64's 2299."""
END = 10_413_792_000.0
"""2300-01-01 00:00:00 UTC: the stored end of DateTime64(3) is 2299-12-31 23:59:59."""


def test_a_due_time_past_2299_stored_by_an_older_version_reads_as_2299(store, tmp_path, moto_url):
    """The row is read, every reader with it, and the action waits (as its grace meant) instead of acting."""
    instance, wall = run_instance(moto_url), Wall()
    posted(store, incident(instance))
    call = StopInstance().plan(Target.from_alert(incident(instance)))
    store.remediations.record([ActionStep(
        alert_id="a1", kind="stop_instance", step="proposed", at=NOW, mode="auto_unless_objected", rule="idle-gpu",
        resource_id=instance, team="nlp", api=call.api, request=json.dumps(dict(call.request)),
        endpoint=call.endpoint, usd_per_hour=32.77, due_at=YEAR_21192, event_time=NOW - 3600,
    )])  # fmt: skip
    (row,) = store.remediations.steps("a1")
    assert END - 86_400 < epoch(row["due_at"]) < END  # naive UTC: .timestamp() reads the machine's zone
    assert store.remediations.decisions(["a1:stop_instance"], NOW - 60) == []
    (shown,) = actions_of(store, ["a1"])["a1"]
    assert shown.state == "proposed" and shown.due_at is not None and shown.due_at > END - 86_400
    ruleset = load_rules(rules_dir(tmp_path, "auto_unless_objected"))
    executors = {"stop_instance": StopInstance(endpoint_url=moto_url, session=session())}
    with LocalSlack() as slack:  # an automatic action warns in Slack first (without one it is not applicable)
        notifier = SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=2)
        runner = ActionRunner(store, executors, lambda: ruleset, notifier, wall=wall)
        assert runner.recover() == 1
        wall.t += 30 * 86_400
        runner.run_once()
    assert [r["step"] for r in store.remediations.steps("a1")] == ["proposed", "announced"]  # and it waits
    assert state(moto_url, instance) == "running"


def test_a_step_without_a_due_time_reads_back_without_one(store):
    """A step stored with no due time (an approval, an announcement of an approve-mode action) reads back with none.
    ClickHouse's least() ignores a NULL since 24.12 (chdb 4 here): the cap above read every such row as due in 2299,
    so an approve-mode action rebuilt from the audit had a grace of centuries, and one approved before its Slack
    message was announced and then throttled waited till 2299 to be tried again after a restart."""
    store.remediations.record([ActionStep(alert_id="a1", kind="stop_instance", step=step, at=NOW + i, mode="approve",
                                          rule="idle-gpu", resource_id="i-0abc", team="nlp", due_at=None)
                               for i, step in enumerate(("proposed", "approved"))])  # fmt: skip
    assert [r["due_at"] for r in store.remediations.steps("a1")] == [None, None]
    (shown,) = actions_of(store, ["a1"])["a1"]
    assert shown.due_at is None and shown.grace == 0.0
