"""Actions end to end inside the worker's library: rules → policy → the audit table → EC2
(boto3 against moto's server) → Slack (slack-sdk against the local server), with signed
clicks through the same handler as ``/slack/actions``."""

from __future__ import annotations

import json
import textwrap
import threading
from pathlib import Path
from urllib.parse import urlencode

import pytest

from detector.actions import ActionHandler, RequestVerifier
from detector.alerts import Alert
from detector.blockkit import check
from detector.delivery import Outbox
from detector.metrics import METRICS
from detector.remediation.base import Outcome
from detector.remediation.ec2 import StopInstance
from detector.remediation.policy import Action
from detector.remediation.runner import ActionRunner
from detector.rules import load_rules
from detector.slack import SlackNotifier
from detector.store import ActionStep
from detector.testing import LocalSlack
from tests import aws
from tests.aws import Ec2Errors, run_instance, session, state
from tests.test_actions import click_body, signed

NOW = 1_800_000_000
T0 = NOW - 4 * 3600
APPROVER, STRANGER, GROUPIE = "U0NLPLEAD", "U0STRANGER", "U0GROUPIE"

moto_url = aws.moto_url  # the fixture: moto's server on 127.0.0.1


class Wall:
    """The worker's wall clock, moved by the test."""

    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def rules_dir(tmp_path: Path, mode: str, after: str = "2h") -> Path:
    (tmp_path / "rules.yaml").write_text(textwrap.dedent(f"""
        rules:
          - name: idle-gpu
            type: idle_gpu
            action: {{kind: stop_instance, after: {after}, mode: {mode}, grace: 1h}}
    """))  # fmt: skip
    (tmp_path / "routing.yaml").write_text(textwrap.dedent(f"""
        approvers:
          default: [U0PLATFORM]
          teams: {{nlp: [{APPROVER}, S0NLPLEADS]}}
    """))  # fmt: skip
    return tmp_path


@pytest.fixture
def slack():
    with LocalSlack() as server:
        server.usergroups["S0NLPLEADS"] = [GROUPIE]
        yield server


def incident(instance: str, lasted: float = 3 * 3600, change: str = "updated", **kw):
    """An idle episode on ``instance`` that started at T0 and has lasted ``lasted`` (event time)."""
    resolved = change == "resolved"
    return Alert(
        alert_id=kw.pop("alert_id", "a1"), type="idle_gpu", rule="idle-gpu", resource_id=instance,
        status="resolved" if resolved else "firing", change=change, severity="warning", episode_start=T0,
        fired_at=T0 + 1800, updated_at=T0 + lasted, resolved_at=T0 + lasted if resolved else None, waste_usd=98.31,
        usd_per_hour=32.77, resource_type="gpu_instance", account="ml-prod", region="us-east-1",
        instance_type="p4d.24xlarge", tags={"team": "nlp", "owner": "alice"}, **kw,
    )  # fmt: skip


def setup(store, slack, tmp_path, moto, mode: str, wall: Wall, **runner_kw):
    ruleset = load_rules(rules_dir(tmp_path, mode))
    notifier = SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=2)
    executors = {"stop_instance": StopInstance(endpoint_url=moto, session=session())}
    runner = ActionRunner(store, executors, lambda: ruleset, notifier, wall=wall, **runner_kw)
    handler = ActionHandler(RequestVerifier("8f742231b10e8888abcd99yyyzzz85a5", clock=lambda: NOW), store, notifier,
                            None, clock=wall, remediation=runner, response_origin=slack.api_url)  # fmt: skip
    return runner, handler


def two_workers(store, slack, tmp_path, moto, mode: str, wall: Wall):
    """The worker that acts (its runner, its click handler) and the click handler of another
    worker of the group, whose runner never runs a pass (it does not hold partition 0)."""
    acting, here = setup(store, slack, tmp_path, moto, mode, wall)
    _, elsewhere = setup(store, slack, tmp_path, moto, mode, wall)
    return acting, here, elsewhere


def click(handler, action_id: str, user: str, alert_id: str = "a1", response_url: str = "") -> int:
    """The click's outcome: 200, 403 (refused) or 409 (nothing awaits a decision). Slack
    itself always gets 200: it shows any other status as a bare error."""
    body = click_body(action_id, alert_id)
    payload = json.loads(__import__("urllib.parse").parse.parse_qs(body.decode())["payload"][0])
    payload["user"] = {"id": user, "username": user.lower()}
    payload["response_url"] = response_url
    from urllib.parse import urlencode

    body = urlencode({"payload": json.dumps(payload)}).encode()
    status, answer = handler.handle(body, signed(body))
    assert status == 200, answer
    return int(answer.get("status", status))


def events_go_on(store, instance: str, wall: Wall, version: int, alert_id: str = "a1") -> None:
    """The idle episode's events still arrive as the wall clock moves (its latest event time is now): an
    incident whose events stopped more than an hour ago is never acted on."""
    store.alerts.record([incident(instance, lasted=wall.t - T0, alert_id=alert_id)], version=version)


def posted(store, *alerts) -> None:
    """Record alerts and their Slack messages, as the worker's pipeline and outbox do."""
    store.alerts.record(list(alerts), version=1)
    for a in alerts:
        store.deliveries.record(a.alert_id, "fired", "C42", f"1700000000.{abs(hash(a.alert_id)) % 10**6:06d}")


def steps(store, alert_id: str = "a1") -> list[tuple[str, str]]:
    return [(r["step"], r["decided_by"]) for r in store.remediations.steps(alert_id)]


def test_approve_a_click_by_an_approver_stops_the_instance(store, slack, tmp_path, moto_url):
    instance, wall = run_instance(moto_url), Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, "approve", wall)
    store.alerts.record([incident(instance, lasted=1 * 3600)], version=1)
    store.deliveries.record("a1", "fired", "C42", "1700000000.000001")  # the alert's message
    assert runner.run_once() == 0  # an hour of the 2h `after`: not due yet
    store.alerts.record([incident(instance)], version=2)
    runner.run_once()
    (proposal,) = slack.calls("chat.postMessage")
    assert proposal.body["thread_ts"] == "1700000000.000001" and proposal.body["channel"] == "C42"
    buttons = [e["action_id"] for b in proposal.blocks if b["type"] == "actions" for e in b["elements"]]
    assert buttons == ["burnwatch_approve", "burnwatch_decline"]
    assert f'ec2.StopInstances {{"InstanceIds": ["{instance}"]}}' in proposal.text_of_blocks()
    wall.t += 600
    runner.run_once()
    assert state(moto_url, instance) == "running"  # nothing happens without a click

    def counted(step: str) -> float:
        return METRICS.registry.get_sample_value("burnwatch_actions_total", {"kind": "stop_instance", "step": step}) or 0.0

    refused_before, done_before = counted("refused"), counted("succeeded")
    assert click(handler, "burnwatch_approve", STRANGER, response_url=slack.response_url) == 403  # refused, recorded
    assert slack.wait_for(lambda r: any(p.method == "response_url" for p in r), timeout=10)
    (told,) = slack.calls("response_url")  # only to the clicker, in the message's place in Slack
    assert (told.body["response_type"], told.body["replace_original"]) == ("ephemeral", False)
    assert f"{STRANGER} is not an approver" in told.body["text"]
    assert f"Approvers for team `nlp`: <@{APPROVER}>, <!subteam^S0NLPLEADS>." in told.body["text"]
    runner.run_once()
    assert state(moto_url, instance) == "running"
    assert click(handler, "burnwatch_approve", APPROVER) == 200
    events_go_on(store, instance, wall, version=3)
    runner.run_once()
    assert state(moto_url, instance) in ("stopping", "stopped")
    assert (counted("refused") - refused_before, counted("succeeded") - done_before) == (1, 1)
    assert steps(store) == [("proposed", ""), ("announced", ""), ("refused", STRANGER), ("approved", APPROVER),
                            ("begun", APPROVER), ("succeeded", APPROVER)]  # fmt: skip
    rows = store.remediations.steps("a1")
    refused = next(r for r in rows if r["step"] == "refused")
    assert "not an approver" in refused["result"]
    done = rows[-1]
    assert (done["api"], json.loads(done["request"]), done["endpoint"], done["usd_per_hour"]) == (
        "ec2.StopInstances", {"InstanceIds": [instance]}, "us-east-1", 32.77)
    assert "stopping" in done["result"]
    assert store.query(f"SELECT action, user_id FROM {store.db}.alert_actions") == [{"action": "approved", "user_id": APPROVER}]
    final = slack.calls("chat.update")[-1]
    assert "Done" in final.text_of_blocks() and not any(b["type"] == "actions" for b in final.blocks)

    # Acting twice is impossible: another pass, a restarted runner, a second click.
    taken = len(rows)
    assert runner.run_once() == 0
    restarted, handler2 = setup(store, slack, tmp_path, moto_url, "approve", wall)
    assert restarted.recover() == 0 and restarted.run_once() == 0
    assert click(handler2, "burnwatch_approve", APPROVER) == 409
    assert len(store.remediations.steps("a1")) == taken


def test_a_member_of_an_approving_group_may_decline(store, slack, tmp_path, moto_url):
    instance, wall = run_instance(moto_url), Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, "approve", wall)
    posted(store, incident(instance))
    runner.run_once()
    assert click(handler, "burnwatch_decline", GROUPIE) == 200  # S0NLPLEADS's member, as Slack says
    runner.run_once()
    assert state(moto_url, instance) == "running"
    assert ("declined", GROUPIE) in steps(store) and not any(s == "begun" for s, _ in steps(store))
    assert "Declined by" in slack.calls("chat.update")[-1].text_of_blocks()


def test_dry_run_never_calls_the_api(store, slack, tmp_path, moto_url):
    instance, wall = run_instance(moto_url), Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, "dry_run", wall)
    posted(store, incident(instance))
    runner.run_once()
    wall.t += 7200
    runner.run_once()
    assert state(moto_url, instance) == "running"
    assert steps(store) == [("proposed", ""), ("dry_run", "dry_run"), ("announced", "")]
    assert f"would call ec2.StopInstances {{\"InstanceIds\": [\"{instance}\"]}}" in store.remediations.steps("a1")[1]["result"]
    (message,) = slack.calls("chat.postMessage")
    assert "Dry run" in message.text_of_blocks() and "Nothing was called" in message.text_of_blocks()
    assert click(handler, "burnwatch_approve", APPROVER) == 409  # nothing to approve in a dry run


def test_auto_unless_objected_acts_after_the_grace_on_the_wall_clock(store, slack, tmp_path, moto_url):
    instance, wall = run_instance(moto_url), Wall()
    runner, _ = setup(store, slack, tmp_path, moto_url, "auto_unless_objected", wall)
    store.alerts.record([incident(instance)], version=1)
    runner.run_once()  # proposed; the alert is not in Slack yet, so neither is the warning
    wall.t += 7200
    runner.run_once()
    assert slack.calls() == [] and state(moto_url, instance) == "running"  # never acts before the warning
    posted(store, incident(instance))
    runner.run_once()
    (announcement,) = slack.calls("chat.postMessage")
    assert "unless this incident is snoozed or declined" in announcement.text_of_blocks()
    wall.t += 3599
    events_go_on(store, instance, wall, version=2)
    runner.run_once()
    assert state(moto_url, instance) == "running"
    wall.t += 1
    runner.run_once()
    assert state(moto_url, instance) in ("stopping", "stopped")
    assert ("approved", "auto") in steps(store) and steps(store)[-1] == ("succeeded", "auto")


def test_auto_unless_objected_a_snooze_cancels(store, slack, tmp_path, moto_url):
    instance, wall = run_instance(moto_url), Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, "auto_unless_objected", wall)
    posted(store, incident(instance))
    runner.run_once()
    body = click_body("burnwatch_snooze")
    assert handler.handle(body, signed(body))[0] == 200  # anyone may snooze (it only holds back)
    wall.t += 3600
    events_go_on(store, instance, wall, version=2)
    runner.run_once()
    assert state(moto_url, instance) == "running"
    assert ("cancelled", "snoozed") in steps(store) and not any(s == "begun" for s, _ in steps(store))


def test_a_grouped_incidents_warning_offers_snooze_and_a_snooze_there_stops_the_action(store, slack, tmp_path,
                                                                                       moto_url):  # fmt: skip
    """Two idle hosts of team nlp grouped into one message, whose buttons are for both: each
    automatic action's warning in its thread offers Snooze 24h (the alert's own snooze, for
    anyone) beside Decline (approvers only), so whoever sees it can object to one. A snooze clicked
    there, by someone who is no approver, stops that action and not the other; the warning is
    not rewritten as the alert's message, and the clicker is told."""
    first, second, wall = run_instance(moto_url), run_instance(moto_url), Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, "auto_unless_objected", wall)
    alerts = [incident(first, change="fired"), incident(second, change="fired", alert_id="a2")]
    store.alerts.record(alerts, version=1)
    outbox = Outbox(store, runner.notifier, group_wait_s=0, wall=wall)
    outbox.add(alerts)
    outbox.deliver_pending()
    (group,) = slack.calls("chat.postMessage")
    assert "2 resources of team nlp" in group.text_of_blocks()
    assert [b["block_id"] for b in group.blocks if b["type"] == "actions"] == ["burnwatch-group:a1"]  # for both
    runner.run_once()
    thread = store.deliveries.thread_of("a1")
    assert thread is not None and store.deliveries.thread_of("a2") == thread  # one message for both
    warnings = {w.blocks[-1]["elements"][0]["text"]: w for w in slack.calls("chat.postMessage")[1:]}
    warnings = {alert_id: w for footer, w in warnings.items() for alert_id in ("a1", "a2") if f"`{alert_id}:" in footer}
    assert sorted(warnings) == ["a1", "a2"]
    for alert_id, warning in warnings.items():
        assert warning.body["thread_ts"] == thread[1]
        assert "unless this incident is snoozed or declined" in warning.text_of_blocks()
        (buttons,) = [b for b in warning.blocks if b["type"] == "actions"]
        assert [(e["text"]["text"], e["action_id"], e["value"], e.get("style")) for e in buttons["elements"]] == [
            ("Snooze 24h", "burnwatch_snooze", alert_id, None), ("Decline", "burnwatch_decline", alert_id, "danger")]
        assert check(warning.blocks, warning.body["text"]) == []  # within Block Kit's limits
    where = json.loads(next(r["result"] for r in store.remediations.steps("a1") if r["step"] == "announced"))
    payload = {"type": "block_actions", "user": {"id": STRANGER, "username": "someone"},
               "actions": [{"type": "button", "action_id": "burnwatch_snooze", "value": "a1",
                            "block_id": next(b for b in warnings["a1"].blocks if b["type"] == "actions")["block_id"]}],
               "channel": {"id": where["channel"]}, "message": {"ts": where["ts"]},
               "response_url": slack.response_url}  # fmt: skip
    body = urlencode({"payload": json.dumps(payload)}).encode()
    status, answer = handler.handle(body, signed(body))
    assert (status, answer) == (200, {"ok": True, "action": "snoozed", "alert_id": "a1"})
    assert slack.calls("chat.update") == []  # the warning is not replaced by the alert's message
    assert slack.wait_for(lambda r: any(c.method == "response_url" for c in r), timeout=10)
    (told,) = slack.calls("response_url")
    assert told.body["response_type"] == "ephemeral" and "Snoozed for 24 hours" in told.body["text"]
    wall.t += 3600
    events_go_on(store, first, wall, version=2)
    events_go_on(store, second, wall, version=2, alert_id="a2")
    runner.run_once()
    assert state(moto_url, first) == "running" and state(moto_url, second) in ("stopping", "stopped")
    assert ("cancelled", "snoozed") in steps(store, "a1") and ("succeeded", "auto") in steps(store, "a2")
    shown = [u for u in slack.calls("chat.update") if u.body["ts"] == where["ts"]]
    assert "Not acting (snoozed)" in shown[-1].text_of_blocks() and not any(b["type"] == "actions" for b in shown[-1].blocks)


def test_a_resolved_incident_cancels_a_pending_action(store, slack, tmp_path, moto_url):
    instance, wall = run_instance(moto_url), Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, "approve", wall)
    posted(store, incident(instance))
    runner.run_once()
    store.alerts.record([incident(instance, lasted=4 * 3600, change="resolved")], version=2)
    runner.run_once()
    assert ("cancelled", "resolved") in steps(store)
    assert click(handler, "burnwatch_approve", APPROVER) == 409
    runner.run_once()
    assert state(moto_url, instance) == "running"


def test_a_replay_of_past_events_is_never_acted_on(store, slack, tmp_path, moto_url):
    instance, wall = run_instance(moto_url), Wall(NOW + 30 * 86_400)  # the events are a month old
    runner, _ = setup(store, slack, tmp_path, moto_url, "auto_unless_objected", wall)
    posted(store, incident(instance))
    assert runner.run_once() == 0 and steps(store) == [] and slack.calls() == []


def test_a_call_begun_by_a_worker_that_died_is_checked_not_repeated(store, slack, tmp_path, moto_url):
    """The worker died after marking the call begun: on restart, the API is asked. An instance
    found stopped is recorded as done; one still running is reported, not stopped blindly."""
    wall = Wall()
    for alert_id, stopped in (("a1", True), ("a2", False)):
        instance = run_instance(moto_url)
        posted(store, incident(instance, alert_id=alert_id))
        common = dict(alert_id=alert_id, kind="stop_instance", mode="approve", rule="idle-gpu", resource_id=instance,
                      api="ec2.StopInstances", request=json.dumps({"InstanceIds": [instance]}), endpoint="us-east-1")
        store.remediations.record([ActionStep(step="proposed", at=NOW - 60, usd_per_hour=32.77, **common),
                                   ActionStep(step="approved", at=NOW - 30, decided_by=APPROVER, **common),
                                   ActionStep(step="begun", at=NOW - 29, attempt=1, **common)])  # fmt: skip
        if stopped:  # the call had landed before the worker died
            session().client("ec2", endpoint_url=moto_url).stop_instances(InstanceIds=[instance])
        else:
            running = instance
    runner, _ = setup(store, slack, tmp_path, moto_url, "approve", wall)
    assert runner.recover() == 0
    assert steps(store, "a1")[-2][0] == "succeeded" and "after a restart" in store.remediations.steps("a1")[-2]["result"]
    assert steps(store, "a2")[-2] == ("interrupted", "worker")
    runner.run_once()
    assert state(moto_url, running) == "running"


def test_a_retryable_failure_is_retried_with_backoff_then_reported(store, slack, tmp_path):
    server, wall = Ec2Errors(503, "Unavailable"), Wall()
    try:
        runner, _ = setup(store, slack, tmp_path, server.url, "auto_unless_objected", wall, max_attempts=2, backoff_s=60)
        posted(store, incident("i-0123456789abcdef0"))
        runner.run_once()
        wall.t += 3600
        events_go_on(store, "i-0123456789abcdef0", wall, version=2)
        runner.run_once()
        assert steps(store)[-2][0] == "retry" or steps(store)[-1][0] == "retry"
        calls = server.requests
        wall.t += 59
        runner.run_once()
        assert server.requests == calls  # not before its backoff
        wall.t += 1
        runner.run_once()
        assert server.requests > calls
    finally:
        server.close()
    rows = store.remediations.steps("a1")
    final = [r for r in rows if r["step"] != "announced"][-1]
    assert (final["step"], final["attempt"]) == ("gave_up", 2) and final["result"].startswith("Unavailable")
    assert "Could not stop" in slack.calls("chat.update")[-1].text_of_blocks()


def test_a_worker_told_to_stop_acting_starts_no_pass(store, slack, tmp_path, moto_url):
    """Partition 0 moved to another worker (the handover resets the runner and clears the
    flag the pass asks under its lock): this one proposes and does nothing more."""
    instance, wall = run_instance(moto_url), Wall()
    runner, _ = setup(store, slack, tmp_path, moto_url, "auto_unless_objected", wall)
    posted(store, incident(instance))
    assert runner.run_once(lambda: False) == 0 and steps(store) == []
    assert runner.run_once(lambda: True) > 0 and steps(store)[0] == ("proposed", "")


def test_a_refusal_is_told_only_to_slack_and_a_conflict_too(store, slack, tmp_path, moto_url):
    """A response_url elsewhere than Slack's is never called (a signed request could carry
    one); a click on an action already decided is told so, not shown as an error."""
    instance, wall = run_instance(moto_url), Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, "approve", wall)
    posted(store, incident(instance))
    runner.run_once()
    with LocalSlack() as elsewhere:
        assert click(handler, "burnwatch_approve", STRANGER, response_url=elsewhere.response_url) == 403
        for thread in handler.answers:
            thread.join(timeout=10)
        assert elsewhere.calls() == [] and slack.calls("response_url") == []
    assert click(handler, "burnwatch_decline", APPROVER) == 200
    assert click(handler, "burnwatch_approve", APPROVER, response_url=slack.response_url) == 409
    assert slack.wait_for(lambda r: any(p.method == "response_url" for p in r), timeout=10)
    (told,) = slack.calls("response_url")
    assert told.body["response_type"] == "ephemeral" and "awaits a decision" in told.body["text"]
    assert [s for s, _ in steps(store)] == ["proposed", "announced", "refused", "declined"]


def test_a_message_posted_before_a_kill_is_found_not_posted_again(store, slack, tmp_path, moto_url):
    """A worker killed after Slack took the action's message and before ``announced`` was
    stored: the next one finds the message in the incident's thread and edits it."""
    instance, wall = run_instance(moto_url), Wall()
    runner, _ = setup(store, slack, tmp_path, moto_url, "approve", wall)
    posted(store, incident(instance))
    runner.run_once()
    (proposal,) = [p for p in slack.calls("chat.postMessage") if "thread_ts" in p.body]
    # What the kill leaves: the message in Slack, its `announced` step never stored.
    store.command(f"ALTER TABLE {store.db}.remediation_actions DELETE WHERE step = 'announced' "
                  f"SETTINGS mutations_sync = 1")  # fmt: skip
    assert [s for s, _ in steps(store)] == ["proposed"]
    restarted, _ = setup(store, slack, tmp_path, moto_url, "approve", wall)
    restarted.recover()
    restarted.run_once()
    assert [p for p in slack.calls("chat.postMessage") if "thread_ts" in p.body] == [proposal]  # not posted again
    announced = next(r for r in store.remediations.steps("a1") if r["step"] == "announced")
    assert json.loads(announced["result"])["ts"] == proposal.response["ts"]
    (update,) = slack.calls("chat.update")
    assert update.body["ts"] == proposal.response["ts"] and "Proposed" in update.text_of_blocks()


def test_a_decision_taken_by_a_worker_that_does_not_act_is_carried_out_once(store, slack, tmp_path, moto_url):
    """Several workers: only the one holding partition 0 runs passes; a click may reach another."""
    instance, wall = run_instance(moto_url), Wall()
    acting, here, elsewhere = two_workers(store, slack, tmp_path, moto_url, "approve", wall)
    posted(store, incident(instance))
    acting.run_once()
    assert steps(store) == [("proposed", ""), ("announced", "")]
    updates = len(slack.calls("chat.update"))
    assert click(elsewhere, "burnwatch_approve", STRANGER) == 403  # permissions checked there too
    assert click(elsewhere, "burnwatch_approve", APPROVER, response_url=slack.response_url) == 200
    assert slack.wait_for(lambda r: any(p.method == "response_url" for p in r), timeout=10)
    (told,) = slack.calls("response_url")  # the clicker is told it is recorded, only them
    assert told.body["response_type"] == "ephemeral" and "Approved: recorded" in told.body["text"]
    assert click(elsewhere, "burnwatch_decline", GROUPIE) == 409  # the stored state, not memory
    assert len(slack.calls("chat.update")) == updates  # the acting worker owns the message
    assert state(moto_url, instance) == "running"
    acting.run_once()
    assert state(moto_url, instance) in ("stopping", "stopped")
    assert steps(store) == [("proposed", ""), ("announced", ""), ("refused", STRANGER), ("approved", APPROVER),
                            ("begun", APPROVER), ("succeeded", APPROVER)]  # fmt: skip
    assert "Done" in slack.calls("chat.update")[-1].text_of_blocks()
    taken = len(store.remediations.steps("a1"))
    assert acting.run_once() == 0 and click(here, "burnwatch_approve", APPROVER) == 409
    assert len(store.remediations.steps("a1")) == taken


def test_a_decline_taken_by_a_worker_that_does_not_act_stops_an_automatic_action(store, slack, tmp_path, moto_url):
    instance, wall = run_instance(moto_url), Wall()
    acting, _, elsewhere = two_workers(store, slack, tmp_path, moto_url, "auto_unless_objected", wall)
    posted(store, incident(instance))
    acting.run_once()
    wall.t += 1800  # half the grace
    acting.run_once()
    assert click(elsewhere, "burnwatch_decline", GROUPIE) == 200
    wall.t += 1800
    acting.run_once()
    wall.t += 3600
    acting.run_once()
    assert state(moto_url, instance) == "running"
    assert ("declined", GROUPIE) in steps(store) and not any(s in ("approved", "begun") for s, _ in steps(store))
    assert "Declined by" in slack.calls("chat.update")[-1].text_of_blocks()


def test_an_objection_stored_just_before_the_grace_ends_is_read_before_acting(store, slack, tmp_path, moto_url):
    """The decline lands after the pass began (its first read) but before the due check."""
    instance, wall = run_instance(moto_url), Wall()
    acting, _, elsewhere = two_workers(store, slack, tmp_path, moto_url, "auto_unless_objected", wall)
    posted(store, incident(instance))
    acting.run_once()
    wall.t += 3600
    first_read = acting._take_decisions

    def then_a_click(now: float, keys: list[str] | None = None) -> int:
        if keys is None:  # the pass's first read: the click comes right after it
            taken = first_read(now, keys)
            assert click(elsewhere, "burnwatch_decline", GROUPIE) == 200
            return taken
        return first_read(now, keys)

    acting._take_decisions = then_a_click  # type: ignore[method-assign]
    acting.run_once()
    assert state(moto_url, instance) == "running"
    assert ("declined", GROUPIE) in steps(store) and not any(s in ("approved", "begun") for s, _ in steps(store))


# -- what stops a pending action: the rules as loaded now, events that stopped, no Slack to warn in -----------


def _rules_now(tmp_path: Path, action: str, enabled: bool = True):
    (tmp_path / "now").mkdir(exist_ok=True)
    (tmp_path / "now" / "rules.yaml").write_text(textwrap.dedent(f"""
        rules:
          - name: idle-gpu
            type: idle_gpu
            enabled: {str(enabled).lower()}
            action: {action}
          - name: kept
            type: untagged
    """))  # fmt: skip
    (tmp_path / "now" / "routing.yaml").write_text((tmp_path / "routing.yaml").read_text())
    return load_rules(tmp_path / "now")


@pytest.mark.parametrize("mode", ["approve", "auto_unless_objected"])
@pytest.mark.parametrize(
    "action, enabled, said",
    [
        ("{kind: stop_instance, after: 2h, mode: dry_run}", True, "is now a dry run"),
        ("{kind: notify_only}", True, "no longer asks for an action"),
        ("{kind: stop_instance, after: 2h, mode: approve}", False, "no longer asks for an action"),  # disabled
        ("{kind: cull_notebook, after: 2h, mode: approve}", True, "now asks for cull_notebook"),
        ("{kind: stop_instance, after: 2h, mode: approve}", True, "now asks for an approval"),
    ],
    ids=["dry-run", "notify-only", "disabled", "another-kind", "approve-now"],
)  # fmt: skip
def test_a_rule_changed_and_reloaded_cancels_its_pending_actions(store, slack, tmp_path, moto_url, mode, action,
                                                                 enabled, said):  # fmt: skip
    """Editing the rules and reloading them is how an operator stops actions: an approved or announced
    action whose rule no longer asks for it is cancelled at the next pass, saying why, and nothing is
    called after its grace or its approval (a rule set to dry_run had the stop go ahead)."""
    instance, wall = run_instance(moto_url), Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, mode, wall)
    posted(store, incident(instance))
    runner.run_once()
    if mode == "approve":
        assert click(handler, "burnwatch_approve", APPROVER) == 200
    if mode == "auto_unless_objected" and "now asks for an approval" in said:
        pass  # from auto to approve: the automatic action goes
    elif "now asks for an approval" in said:
        action = "{kind: stop_instance, after: 2h, mode: auto_unless_objected}"  # approve to auto keeps the approval
        said = ""
    now = _rules_now(tmp_path, action, enabled)
    runner.ruleset = lambda: now
    wall.t += 3600
    events_go_on(store, instance, wall, version=2)
    runner.run_once()
    if not said:
        assert state(moto_url, instance) in ("stopping", "stopped") and steps(store)[-1][0] == "succeeded"
        return
    assert state(moto_url, instance) == "running"
    assert ("cancelled", "rules") in steps(store) and not any(s == "begun" for s, _ in steps(store))
    (row,) = [r for r in store.remediations.steps("a1") if r["step"] == "cancelled"]
    assert said in row["result"]
    assert said in slack.calls("chat.update")[-1].text_of_blocks()  # the thread says why


@pytest.mark.parametrize("mode", ["approve", "auto_unless_objected"])
def test_an_incident_whose_events_stopped_is_not_acted_on_until_they_come_again(store, slack, tmp_path, moto_url, mode):
    """Proposed while its events arrived; then none for over an hour (the exporter died, the host may be
    gone): neither the approval nor the grace's end acts on what is no longer known. The action waits, not
    cancelled (an hourly detector, a backlog caught up, leave incidents quiet a while): when the events come
    again it goes ahead."""
    instance, wall = run_instance(moto_url), Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, mode, wall)
    posted(store, incident(instance, lasted=4 * 3600))  # its latest event is now
    runner.run_once()
    wall.t += 3 * 86_400 if mode == "approve" else 2 * 3600
    if mode == "approve":
        assert click(handler, "burnwatch_approve", APPROVER) == 200
    runner.run_once()
    runner.run_once()
    assert state(moto_url, instance) == "running"
    assert not any(s in ("begun", "cancelled") for s, _ in steps(store)), steps(store)
    shown = slack.calls("chat.update")[-1].text_of_blocks()  # it said "calling" while nothing was called
    assert "waits" in shown and "no events for" in shown, shown
    assert ":gear:" not in shown and ":hourglass" not in shown, shown  # neither "calling" nor "will, at"
    if mode == "auto_unless_objected":
        assert "Snooze" in shown and "Decline" in shown  # it can still be stopped while it waits
    events_go_on(store, instance, wall, version=2)
    runner.run_once()
    assert state(moto_url, instance) in ("stopping", "stopped") and steps(store)[-1][0] == "succeeded"
    assert "Done" in slack.calls("chat.update")[-1].text_of_blocks()


def test_an_incident_stamped_hours_ahead_of_the_clock_is_not_acted_on(store, slack, tmp_path, moto_url):
    """A host whose clock runs two hours ahead (the decoder takes events up to a day ahead): its incident's age
    on the wall clock was negative, so it read as fresh for two hours after its events stopped, and was acted
    on. It waits, saying why, until its events come stamped within the hour; a few minutes ahead acts."""
    instance, wall = run_instance(moto_url), Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, "approve", wall)
    posted(store, incident(instance, lasted=6 * 3600))  # latest event stamped at NOW + 2 h
    runner.run_once()
    assert click(handler, "burnwatch_approve", APPROVER) == 200
    runner.run_once()
    assert state(moto_url, instance) == "running" and not any(s == "begun" for s, _ in steps(store)), steps(store)
    shown = slack.calls("chat.update")[-1].text_of_blocks()
    assert "waits" in shown and "ahead of this worker's clock" in shown, shown
    store.alerts.record([incident(instance, lasted=wall.t + 600 - T0)], version=2)  # 10 minutes ahead: fresh
    runner.run_once()
    assert state(moto_url, instance) in ("stopping", "stopped") and steps(store)[-1][0] == "succeeded"


def test_without_slack_an_automatic_action_is_not_applicable(store, slack, tmp_path, moto_url):
    """auto_unless_objected acts only after a warning people can see; with no Slack it would act unseen."""
    instance, wall = run_instance(moto_url), Wall()
    ruleset = load_rules(rules_dir(tmp_path, "auto_unless_objected"))
    executors = {"stop_instance": StopInstance(endpoint_url=moto_url, session=session())}
    runner = ActionRunner(store, executors, lambda: ruleset, None, wall=wall)
    store.alerts.record([incident(instance, lasted=4 * 3600)], version=1)
    runner.run_once()
    wall.t += 2 * 3600
    events_go_on(store, instance, wall, version=2)
    runner.run_once()
    assert state(moto_url, instance) == "running"
    assert steps(store) == [("proposed", ""), ("not_applicable", "worker")]
    assert "no Slack is configured" in store.remediations.steps("a1")[-1]["result"]


class _AnswerLost:
    """The real stop, whose answer never comes back (a read timeout): the call took, the runner retries."""

    def __init__(self, real):
        self.real = real

    def plan(self, target):
        return self.real.plan(target)

    def execute(self, call):
        self.real.execute(call)
        return Outcome(False, "ReadTimeoutError: the answer timed out", retryable=True)

    def observe(self, call):
        return self.real.observe(call)


def _stopped_answer_lost(store, slack, tmp_path, moto_url):
    """An approved stop whose call took and whose answer was lost: (runner, the real executor, instance, wall)."""
    instance, wall = run_instance(moto_url), Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, "approve", wall)
    posted(store, incident(instance))
    runner.run_once()
    assert click(handler, "burnwatch_approve", APPROVER) == 200
    real = runner.executors["stop_instance"]
    runner.executors = {"stop_instance": _AnswerLost(real)}
    events_go_on(store, instance, wall, version=2)
    runner.run_once()
    assert steps(store)[-1][0] == "retry" and state(moto_url, instance) in ("stopping", "stopped")
    return runner, real, instance, wall


def test_a_stop_whose_answer_timed_out_is_looked_up_before_a_resolution_cancels_it(store, slack, tmp_path, moto_url):
    """The call took but its answer was lost (a retry is due); the instance stops, the incident resolves:
    the action is recorded done, with its saving, not 'not acting (resolved)'."""
    runner, _, instance, wall = _stopped_answer_lost(store, slack, tmp_path, moto_url)
    store.alerts.record([incident(instance, lasted=wall.t - T0, change="resolved")], version=3)
    runner.run_once()
    assert steps(store)[-1] == ("succeeded", APPROVER) and ("cancelled", "resolved") not in steps(store)


class _SlowLookup:
    """The real executor, whose lookup (``observe``) waits until the test lets it answer."""

    def __init__(self, real):
        self.real, self.entered, self.release = real, threading.Semaphore(0), threading.Semaphore(0)

    def plan(self, target):
        return self.real.plan(target)

    def execute(self, call):
        return self.real.execute(call)

    def observe(self, call):
        self.entered.release()
        self.release.acquire(timeout=30)
        return self.real.observe(call)


def _b1_proposed_a1_resolved_with_a_slow_lookup(store, slack, tmp_path, moto_url):
    """a1's stop took and its answer was lost (a retry), a second incident b1 proposed and announced, then a1
    resolved: the next pass looks a1's call up through a lookup that waits for the test. (runner, lookup, wall)"""
    runner, real, instance, wall = _stopped_answer_lost(store, slack, tmp_path, moto_url)
    other = run_instance(moto_url)
    posted(store, incident(other, lasted=4 * 3600, alert_id="b1"))
    events_go_on(store, other, wall, version=3, alert_id="b1")
    slow = _SlowLookup(real)
    runner.executors = {"stop_instance": slow}
    runner.run_once()  # b1 proposed and announced; a1's retry not due yet
    store.alerts.record([incident(instance, lasted=wall.t - T0, change="resolved")], version=4)
    return runner, slow, wall


def test_a_click_is_answered_while_a_lookup_before_a_cancellation_hangs(store, slack, tmp_path, moto_url):
    """A resolution cancels a retry only after the API is asked whether its call took; that lookup ran under
    the clicks' lock, so a cloud API hanging for a minute held every Approve and Decline with it."""
    runner, slow, wall = _b1_proposed_a1_resolved_with_a_slow_lookup(store, slack, tmp_path, moto_url)
    passing = threading.Thread(target=runner.run_once, daemon=True)
    passing.start()
    try:
        assert slow.entered.acquire(timeout=30), "the resolution did not look the call up"
        answered: list[int] = []
        handler = ActionHandler(RequestVerifier("8f742231b10e8888abcd99yyyzzz85a5", clock=lambda: NOW), store,
                                runner.notifier, None, clock=wall, remediation=runner, response_origin=slack.api_url)  # fmt: skip
        clicking = threading.Thread(target=lambda: answered.append(click(handler, "burnwatch_decline", APPROVER,
                                                                         alert_id="b1")), daemon=True)  # fmt: skip
        clicking.start()
        clicking.join(timeout=20)
        assert answered == [200] and passing.is_alive()  # answered while the lookup still hangs
    finally:
        slow.release.release()
        passing.join(timeout=30)
    assert steps(store)[-1] == ("succeeded", APPROVER)  # found stopped: done, not cancelled
    assert steps(store, "b1")[-1] == ("declined", APPROVER)


def test_a_worker_whose_partitions_moved_during_the_lookup_before_a_cancellation_writes_nothing(
        store, slack, tmp_path, moto_url):  # fmt: skip
    """The clicks' lock is released while the API is asked whether a retry's call took, so the worker's partitions
    can move meanwhile (reset): the action is then the new holder's, and the old pass wrote its cancel or its
    result all the same, beside (or against) what the new holder does with it."""
    runner, real, instance, wall = _stopped_answer_lost(store, slack, tmp_path, moto_url)
    slow = _SlowLookup(real)
    runner.executors = {"stop_instance": slow}
    store.alerts.record([incident(instance, lasted=wall.t - T0, change="resolved")], version=3)
    passing = threading.Thread(target=runner.run_once, daemon=True)
    passing.start()
    try:
        assert slow.entered.acquire(timeout=30), "the resolution did not look the call up"
        runner.reset()  # the partitions moved while the lookup hangs
    finally:
        slow.release.release()
        passing.join(timeout=30)
    assert not passing.is_alive() and steps(store)[-1][0] == "retry"  # nothing written by the worker that moved
    slow.release.release()  # the next holder's own lookup answers at once
    runner.run_once()  # acting again (given partition 0 back): recovered from the audit, looked up, done once
    assert [s for s in steps(store) if s[0] == "succeeded"] == [("succeeded", APPROVER)]


def test_a_pass_whose_partitions_moved_during_a_lookup_proposes_nothing_again(store, slack, tmp_path, moto_url):
    """reset() empties the actions while a pass waits on the API with the lock released; the pass went on
    through its rows, found every later action missing from its emptied memory, and proposed and announced
    each again (a second message with buttons), from a worker that no longer acts."""
    runner, slow, _ = _b1_proposed_a1_resolved_with_a_slow_lookup(store, slack, tmp_path, moto_url)
    before = steps(store, "b1")
    assert [s for s, _ in before] == ["proposed", "announced"]
    passing = threading.Thread(target=runner.run_once, daemon=True)
    passing.start()
    try:
        assert slow.entered.acquire(timeout=30), "the resolution did not look a1's call up"
        runner.reset()
    finally:
        slow.release.release()
        passing.join(timeout=30)
    assert not passing.is_alive() and steps(store, "b1") == before


def test_a_retry_that_finds_the_instance_stopped_credits_the_saving(store, slack, tmp_path, moto_url):
    """The first call stopped the instance but its answer was lost; the retry reads it stopped. That is the
    first call's doing: the saving is credited (a stop found already made before any call of ours is not)."""
    runner, real, instance, wall = _stopped_answer_lost(store, slack, tmp_path, moto_url)
    runner.executors = {"stop_instance": real}  # the network is back
    wall.t += 60
    events_go_on(store, instance, wall, version=3)
    runner.run_once()
    (done,) = [r for r in store.remediations.steps("a1") if r["step"] == "succeeded"]
    assert done["usd_per_hour"] == 32.77 and "already stopped" in done["result"]


def test_an_approval_stored_before_the_store_failed_is_answered_as_taken(store, slack, tmp_path, moto_url):
    """The store stops answering between the decision (stored) and the click's own row: the clicker is not
    told 'not recorded, try again' (a retry would be refused as decided, and the stop goes ahead)."""
    from clickhouse_connect.driver.exceptions import OperationalError

    instance, wall = run_instance(moto_url), Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, "approve", wall)
    posted(store, incident(instance, lasted=4 * 3600))
    runner.run_once()

    def down(*args, **kwargs):
        raise OperationalError("Connection refused")

    handler.store.actions.record = down  # the store fails after the decision was stored
    assert click(handler, "burnwatch_approve", APPROVER) == 200
    runner.run_once()
    assert state(moto_url, instance) in ("stopping", "stopped") and steps(store)[-1][0] == "succeeded"


def test_a_click_is_answered_while_a_call_hangs(store, slack, tmp_path, moto_url):
    """The pass does not hold the clicks' lock while a cloud's API takes its time (a minute a call, four
    tries): a Decline on another incident is answered at once."""
    import socket
    import time

    wall = Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, "approve", wall)
    listener = socket.create_server(("127.0.0.1", 0))  # accepts, reads nothing, never answers
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True).start()
    hanging = f"http://127.0.0.1:{listener.getsockname()[1]}"
    runner.executors = {"stop_instance": StopInstance(endpoint_url=hanging, session=session())}
    posted(store, incident("i-0aaaaaaaaaaaaaaaa", alert_id="a1"), incident("i-0bbbbbbbbbbbbbbbb", alert_id="b1"))
    runner.run_once()
    assert click(handler, "burnwatch_approve", APPROVER, alert_id="a1") == 200
    passing = threading.Thread(target=runner.run_once, daemon=True)
    passing.start()
    deadline = time.monotonic() + 30
    while not (accepted and ("begun", APPROVER) in steps(store, "a1")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert accepted, "the call never reached the endpoint"
    answered: list[int] = []
    clicking = threading.Thread(target=lambda: answered.append(click(handler, "burnwatch_decline", APPROVER,
                                                                     alert_id="b1")), daemon=True)  # fmt: skip
    clicking.start()
    clicking.join(timeout=20)
    try:
        assert answered == [200] and passing.is_alive()  # answered while the call still hangs
        assert steps(store, "b1")[-1] == ("declined", APPROVER)
    finally:
        for conn in accepted:
            conn.close()  # the call fails (retried later): the pass ends
        listener.close()
        passing.join(timeout=60)


def test_a_snooze_clicked_while_the_pass_runs_stops_the_automatic_action(store, slack, tmp_path, moto_url):
    """The pass reads the snoozes once; one clicked after that read, before the grace's end is acted on,
    is read again just before the automatic approval, as a decline stored elsewhere is."""
    instance, wall = run_instance(moto_url), Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, "auto_unless_objected", wall)
    posted(store, incident(instance))
    runner.run_once()
    wall.t += 3600
    events_go_on(store, instance, wall, version=2)
    took = runner._take_decisions

    def snoozed_meanwhile(now: float, keys: list[str] | None = None) -> int:
        if keys:  # the check just before acting: the click lands now, after the pass read the snoozes
            body = click_body("burnwatch_snooze")
            assert handler.handle(body, signed(body))[0] == 200
        return took(now, keys)

    runner._take_decisions = snoozed_meanwhile
    runner.run_once()
    assert state(moto_url, instance) == "running"
    assert ("cancelled", "snoozed") in steps(store) and not any(s in ("approved", "begun") for s, _ in steps(store))


class _Blocking:
    """The real executor's plan; each call waits until the test lets it return."""

    def __init__(self, real):
        self.real, self.calls, self.release = real, [], threading.Semaphore(0)
        self.entered = threading.Semaphore(0)

    def plan(self, target):
        return self.real.plan(target)

    def execute(self, call):
        self.calls.append(call.request)
        self.entered.release()
        self.release.acquire(timeout=30)
        return Outcome(True, "stopped")

    def observe(self, call):
        return None  # cannot tell


def test_a_decision_taken_during_a_call_is_stored_before_the_begun_that_follows_it(store, slack, tmp_path, moto_url):
    """The pass releases the clicks' lock during a call; an approval taken meanwhile is stamped at its real time.
    The pass's next steps come after it in the audit (they were stamped with the time the pass began: b1 read
    back as approved, not begun, and a worker restarted during its call called it again, blindly)."""
    first, second, wall = run_instance(moto_url), run_instance(moto_url), Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, "approve", wall)
    blocking = _Blocking(runner.executors["stop_instance"])
    runner.executors = {"stop_instance": blocking}
    posted(store, incident(first, lasted=4 * 3600, alert_id="a1"), incident(second, lasted=4 * 3600, alert_id="b1"))
    runner.run_once()
    assert click(handler, "burnwatch_approve", APPROVER, alert_id="a1") == 200
    passing = threading.Thread(target=runner.run_once, daemon=True)
    passing.start()
    assert blocking.entered.acquire(timeout=30)
    wall.t += 40  # the call takes 40 s
    assert click(handler, "burnwatch_approve", APPROVER, alert_id="b1") == 200
    blocking.release.release()  # a1's call returns
    assert blocking.entered.acquire(timeout=10), "b1 was not carried out after a1 in the same pass"
    rebuilt = Action.from_steps(store.remediations.steps("b1"))["b1:stop_instance"]
    restarted = _Blocking(blocking.real)  # a worker restarted now rebuilds from the audit; its calls return at once
    for _ in range(3):
        restarted.release.release()
    ActionRunner(store, {"stop_instance": restarted}, runner.ruleset, runner.notifier, wall=wall).run_once()
    blocking.release.release()  # b1's first call returns
    passing.join(timeout=30)
    assert rebuilt.state == "begun", f"audit order: {steps(store, 'b1')}; rebuilt state {rebuilt.state}"
    assert restarted.calls == [], "b1 called again, blindly, by a worker restarted during its call"


def test_a_snooze_on_the_warning_while_the_automatic_stop_is_under_way_says_it_came_too_late(store, slack, tmp_path,
                                                                                               moto_url):  # fmt: skip
    """The grace ended and the call is under way (the clicks' lock is free meanwhile): a snooze clicked on the
    warning is recorded, and the clicker is told it stops nothing now, not that the action is not taken."""
    instance, wall = run_instance(moto_url), Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, "auto_unless_objected", wall)
    posted(store, incident(instance, lasted=4 * 3600))
    runner.run_once()  # proposed, warned
    blocking = _Blocking(runner.executors["stop_instance"])
    runner.executors = {"stop_instance": blocking}
    wall.t += 3600
    events_go_on(store, instance, wall, version=2)
    passing = threading.Thread(target=runner.run_once, daemon=True)
    passing.start()
    try:
        assert blocking.entered.acquire(timeout=30)  # the stop is under way
        payload = {"type": "block_actions", "user": {"id": STRANGER, "username": "someone"},
                   "actions": [{"type": "button", "action_id": "burnwatch_snooze", "value": "a1",
                                "block_id": "burnwatch-action:a1"}],
                   "channel": {"id": "C42"}, "message": {"ts": "1.1"}, "response_url": slack.response_url}  # fmt: skip
        body = urlencode({"payload": json.dumps(payload)}).encode()
        assert handler.handle(body, signed(body))[0] == 200
        assert slack.wait_for(lambda r: any(c.method == "response_url" for c in r), timeout=10)
        (told,) = slack.calls("response_url")
        assert "too late for the automatic action: it is begun already" in told.body["text"], told.body["text"]
    finally:
        blocking.release.release()
        passing.join(timeout=30)


def test_a_decision_stored_after_the_action_was_carried_out_changes_nothing(store, slack, tmp_path, moto_url):
    """Two approvers click at once on two workers. The click on the worker that does not act reads the action
    pending, then waits on Slack (its user group's members) while the acting worker takes the other click and
    stops the instance: its approval is stored after the stop. It changes nothing: the first decision stored wins,
    and a restarted worker does not read the late approval as the action's state and act a second time."""
    instance, wall = run_instance(moto_url), Wall()
    with LocalSlack() as slow:
        slow.usergroups["S0NLPLEADS"] = [GROUPIE]
        gate = slow.hold("usergroups.users.list")
        acting, here = setup(store, slack, tmp_path, moto_url, "approve", wall)
        _, elsewhere = setup(store, slow, tmp_path, moto_url, "approve", wall)
        posted(store, incident(instance))
        acting.run_once()
        late: list[int] = []
        clicking = threading.Thread(target=lambda: late.append(click(elsewhere, "burnwatch_approve", GROUPIE)))
        clicking.start()
        try:
            assert slow.wait_held(timeout=10)  # it read the action pending and asks Slack who is in the group
            assert click(here, "burnwatch_approve", APPROVER) == 200
            acting.run_once()
            assert state(moto_url, instance) in ("stopping", "stopped")
        finally:
            gate.set()
            clicking.join(timeout=30)
    assert late and not clicking.is_alive()
    (action,) = Action.from_steps(store.remediations.steps("a1")).values()
    assert (action.state, action.decided_by) == ("succeeded", APPROVER)
    restarted, _ = setup(store, slack, tmp_path, moto_url, "approve", wall)
    restarted.recover()
    restarted.run_once()
    assert [s for s, _ in steps(store)].count("begun") == 1
    assert restarted.run_once() == 0


def test_a_decision_after_another_is_read_back_as_the_first():
    """The stored steps of a race between two workers' clicks: the first decision is the action's, wherever
    the later ones land (before the call, or after it ended); a late decline does not undo a stop."""
    common = {"alert_id": "a1", "kind": "stop_instance", "mode": "approve", "rule": "idle-gpu", "resource_id": "i-1",
              "team": "nlp", "api": "ec2.StopInstances", "request": '{"InstanceIds": ["i-1"]}', "endpoint": "us-east-1",
              "usd_per_hour": 32.77, "attempt": 0, "due_at": None, "decided_by": "", "result": "", "at": 1.0}
    proposed, approved = {**common, "step": "proposed"}, {**common, "step": "approved", "decided_by": APPROVER}
    declined = {**common, "step": "declined", "decided_by": GROUPIE}
    begun, done = {**common, "step": "begun", "attempt": 1}, {**common, "step": "succeeded", "attempt": 1}
    for rows, state_ in [([proposed, approved, declined], "approved"), ([proposed, declined, approved], "declined"),
                         ([proposed, approved, begun, done, declined], "succeeded"),
                         ([proposed, approved, begun, done, approved], "succeeded")]:
        (action,) = Action.from_steps(rows).values()
        assert (action.state, action.decided_by) == (state_, rows[1]["decided_by"]), rows


def test_a_rule_moved_from_dry_run_to_approve_proposes_on_the_incident_it_ran_dry_on(store, slack, tmp_path, moto_url):
    """Rolling a rule out: it runs as a dry run, people read what it would do, then it is set to approve. The
    incident its dry run was about, still burning, gets the proposal (a new message in its thread, with
    Approve): the dry run had taken the action's key (alert_id:kind), and an ended action was never proposed
    again, so nothing was ever offered on it."""
    instance, wall = run_instance(moto_url), Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, "dry_run", wall)
    posted(store, incident(instance))
    runner.run_once()
    assert steps(store) == [("proposed", ""), ("dry_run", "dry_run"), ("announced", "")]
    now = _rules_now(tmp_path, "{kind: stop_instance, after: 2h, mode: approve}")
    runner.ruleset = lambda: now
    wall.t += 600
    events_go_on(store, instance, wall, version=2)
    runner.run_once()
    dry, proposal = slack.calls("chat.postMessage")
    assert "Dry run" in dry.text_of_blocks() and "Proposed" in proposal.text_of_blocks()
    assert click(handler, "burnwatch_approve", APPROVER) == 200
    runner.run_once()
    assert state(moto_url, instance) in ("stopping", "stopped")
    assert [s for s, _ in steps(store)][3:] == ["proposed", "announced", "approved", "begun", "succeeded"]
    restarted, _ = setup(store, slack, tmp_path, moto_url, "approve", wall)
    assert restarted.recover() == 0 and restarted.run_once() == 0  # acted once; the dry run is not proposed again


def test_actions_stopped_by_setting_the_rules_to_dry_run_are_proposed_again_once_set_back(store, slack, tmp_path,
                                                                                         moto_url):  # fmt: skip
    """The documented way to stop every action at once is to set the rules' actions to dry_run: the pending proposal
    is cancelled ("rules"). Set back to approve, the incident, still burning, gets a new proposal it can be approved
    from. Before, the cancelled action kept its key (alert_id:kind) and was never proposed again in that episode."""
    instance, wall = run_instance(moto_url), Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, "approve", wall)
    posted(store, incident(instance))
    runner.run_once()
    assert steps(store)[0] == ("proposed", "")
    stopped = _rules_now(tmp_path, "{kind: stop_instance, after: 2h, mode: dry_run}")
    runner.ruleset = lambda: stopped
    wall.t += 300
    events_go_on(store, instance, wall, version=2)
    runner.run_once()
    assert ("cancelled", "rules") in steps(store)
    back = _rules_now(tmp_path, "{kind: stop_instance, after: 2h, mode: approve}")
    runner.ruleset = lambda: back
    wall.t += 300
    events_go_on(store, instance, wall, version=3)
    runner.run_once()
    assert [s for s, _ in steps(store)].count("proposed") == 2
    assert click(handler, "burnwatch_approve", APPROVER) == 200
    runner.run_once()
    assert state(moto_url, instance) in ("stopping", "stopped")
    assert [s for s, _ in steps(store)][-3:] == ["approved", "begun", "succeeded"]


def test_an_action_proposed_again_is_not_cancelled_again_by_the_rules_cancellation_before_it(store, slack, tmp_path,
                                                                                           moto_url):  # fmt: skip
    """An auto_unless_objected action whose rule is changed to approve is cancelled ("rules") and proposed again at the
    next pass. The acting worker reads, each pass, the decisions stored for its pending actions since their proposal
    (less the clock skew allowed between workers, 5 minutes): the cancellation just before the new proposal is among
    them. Taken as the new proposal's decision, it cancelled that too, which was proposed again at the next pass, a
    new message each time, for 5 minutes, and an approval clicked meanwhile was lost behind it."""
    instance, wall = run_instance(moto_url), Wall()
    runner, handler = setup(store, slack, tmp_path, moto_url, "auto_unless_objected", wall)
    posted(store, incident(instance))
    events_go_on(store, instance, wall, version=2)
    runner.run_once()
    assert steps(store)[:2] == [("proposed", ""), ("announced", "")]
    approve = _rules_now(tmp_path, "{kind: stop_instance, after: 2h, mode: approve}")
    runner.ruleset = lambda: approve
    for version in range(3, 7):  # passes 30 s apart
        wall.t += 30
        events_go_on(store, instance, wall, version=version)
        runner.run_once()
    assert [s for s, _ in steps(store)].count("cancelled") == 1
    assert [s for s, _ in steps(store)].count("proposed") == 2, steps(store)
    assert click(handler, "burnwatch_approve", APPROVER) == 200
    runner.run_once()
    assert state(moto_url, instance) in ("stopping", "stopped")
    assert [s for s, _ in steps(store)][-3:] == ["approved", "begun", "succeeded"]


def _approved_then_throttled(store, slack, tmp_path, wall: Wall):
    """Two workers; an approved stop whose first call EC2 refuses as throttled (a retry, 60 s on), approved through
    the acting worker's own handler: (acting runner, the other worker's handler, the failing EC2)."""
    server = Ec2Errors(503, "RequestLimitExceeded", failing="StopInstances")
    acting, here, elsewhere = two_workers(store, slack, tmp_path, server.url, "approve", wall)
    acting.backoff_s = 60
    posted(store, incident("i-0123456789abcdef0"))
    acting.run_once()
    assert click(here, "burnwatch_approve", APPROVER) == 200
    events_go_on(store, "i-0123456789abcdef0", wall, version=2)
    acting.run_once()
    assert steps(store)[-2:] == [("begun", APPROVER), ("retry", APPROVER)]
    return acting, elsewhere, server


def test_a_decline_stops_an_action_waiting_to_be_tried_again(store, slack, tmp_path):
    """An approved stop that EC2 throttled waits a minute to be tried again, and its message offers a Decline: clicked
    (on a worker that does not act), the action is tried no more, on the acting worker and after a restart, and the
    message says who stopped it. Before, a retry had no button and a Decline was answered 'no action awaits a
    decision': once approved, nobody could stop it but a resolution, for up to four attempts."""
    wall = Wall()
    acting, elsewhere, server = _approved_then_throttled(store, slack, tmp_path, wall)
    try:
        retrying = slack.calls("chat.update")[-1]
        assert "unless declined" in retrying.text_of_blocks()
        buttons = [e["action_id"] for b in retrying.blocks if b["type"] == "actions" for e in b["elements"]]
        assert buttons == ["burnwatch_decline"]
        assert click(elsewhere, "burnwatch_approve", APPROVER) == 409  # approved already
        assert click(elsewhere, "burnwatch_decline", STRANGER) == 403  # an approver's say alone
        assert click(elsewhere, "burnwatch_decline", GROUPIE) == 200
        assert click(elsewhere, "burnwatch_decline", APPROVER) == 409  # stopped already
        stops = server.actions.count("StopInstances")
        for _ in range(4):
            wall.t += 120
            events_go_on(store, "i-0123456789abcdef0", wall, version=3)
            acting.run_once()
        assert server.actions.count("StopInstances") == stops
        assert steps(store)[-1] == ("cancelled", GROUPIE)
        assert f"Not acting (<@{GROUPIE}>)" in slack.calls("chat.update")[-1].text_of_blocks()
        restarted, _ = setup(store, slack, tmp_path, server.url, "approve", wall)
        wall.t += 600
        restarted.run_once()
        assert server.actions.count("StopInstances") == stops
    finally:
        server.close()


def test_a_decline_of_a_retry_on_the_acting_worker_is_taken_at_once(store, slack, tmp_path):
    """Clicked through the acting worker itself: its memory takes the stop, and its next pass tries nothing."""
    wall = Wall()
    acting, _, server = _approved_then_throttled(store, slack, tmp_path, wall)
    _, here = setup(store, slack, tmp_path, server.url, "approve", wall)
    here.remediation = acting
    try:
        assert click(here, "burnwatch_decline", APPROVER) == 200
        assert "declined by" in slack.calls("chat.update")[-1].text_of_blocks()
        stops = server.actions.count("StopInstances")
        wall.t += 120
        events_go_on(store, "i-0123456789abcdef0", wall, version=3)
        acting.run_once()
        assert server.actions.count("StopInstances") == stops and steps(store)[-1] == ("cancelled", APPROVER)
    finally:
        server.close()


def test_a_declined_retry_whose_last_call_took_is_recorded_done(store, slack, tmp_path, moto_url):
    """The stop took but its answer was lost (a retry), then someone declines: the lookup the Decline waits for finds
    the instance stopped, and the action is recorded done, not 'will not stop' over a stopped instance."""
    runner, _, instance, wall = _stopped_answer_lost(store, slack, tmp_path, moto_url)
    _, elsewhere = setup(store, slack, tmp_path, moto_url, "approve", wall)
    assert click(elsewhere, "burnwatch_decline", GROUPIE) == 200
    wall.t += 1
    runner.run_once()
    assert steps(store)[-2:] == [("declined", GROUPIE), ("succeeded", APPROVER)]
    assert "Done" in slack.calls("chat.update")[-1].text_of_blocks()
    assert state(moto_url, instance) in ("stopping", "stopped")


def _proposed_on_a_throttling_ec2(store, slack, tmp_path, wall: Wall):
    """An approve-mode stop proposed on one worker, against an EC2 that throttles every StopInstances (a retry 60 s
    on): (the EC2, to close; the runner; its click handler)."""
    server = Ec2Errors(503, "RequestLimitExceeded", failing="StopInstances")
    runner, handler = setup(store, slack, tmp_path, server.url, "approve", wall, backoff_s=60)
    posted(store, incident("i-0123456789abcdef0"))
    runner.run_once()
    return server, runner, handler


def test_a_late_decline_of_an_approved_action_is_no_stop_of_its_retry(store, slack, tmp_path):
    """A Decline stored before the approved call was first tried (two approvers clicking at once: the approval won)
    is the approval's late twin, not a stop: its retry goes ahead, on the acting worker and after a restart alike."""
    wall = Wall()
    server, runner, handler = _proposed_on_a_throttling_ec2(store, slack, tmp_path, wall)
    try:
        assert click(handler, "burnwatch_approve", APPROVER) == 200
        (action,) = Action.from_steps(store.remediations.steps("a1")).values()
        row = ActionStep(alert_id="a1", kind="stop_instance", step="declined", at=wall.t, mode="approve",
                         decided_by=GROUPIE, rule="idle-gpu", resource_id=action.resource_id, team="nlp")  # fmt: skip
        store.remediations.record([row])  # another worker's, which read the action pending
        events_go_on(store, "i-0123456789abcdef0", wall, version=2)
        wall.t += 1
        runner.run_once()
        assert steps(store)[-1] == ("retry", APPROVER)
        wall.t += 61
        events_go_on(store, "i-0123456789abcdef0", wall, version=3)
        runner.run_once()
        assert [s for s, _ in steps(store)].count("begun") == 2  # (each attempt is boto's few calls)
        (action,) = Action.from_steps(store.remediations.steps("a1")).values()
        assert action.stoppable and not action.stop_asked_by
    finally:
        server.close()


class _ThrottledAgain:
    """The real plan and lookup; EC2 throttles every call, the second one answering only when the test lets it."""

    def __init__(self, real):
        self.real, self.calls = real, 0
        self.entered, self.release = threading.Semaphore(0), threading.Semaphore(0)

    def plan(self, target):
        return self.real.plan(target)

    def execute(self, call):
        self.calls += 1
        if self.calls == 2:
            self.entered.release()
            self.release.acquire(timeout=30)
        return Outcome(False, "ClientError: RequestLimitExceeded (throttled)", retryable=True)

    def observe(self, call):
        return self.real.observe(call)


@pytest.mark.parametrize("where", ["acting", "elsewhere"])
def test_a_decline_clicked_while_a_retry_is_under_way_stops_the_retries_after_it(store, slack, tmp_path, moto_url,
                                                                                 where):  # fmt: skip
    """The retry's message offers Decline, and keeps it while the retry's call is under way (a throttled EC2 may take
    a minute): a Decline clicked then, on the acting worker or another, is taken, and once that attempt fails the
    action is tried no more, on the acting worker or after a restart. Before, it was answered 'no action awaits a
    decision' and the retries went on."""
    instance, wall = run_instance(moto_url), Wall()
    acting, here, elsewhere = two_workers(store, slack, tmp_path, moto_url, "approve", wall)
    throttled = _ThrottledAgain(acting.executors["stop_instance"])
    acting.executors = {"stop_instance": throttled}
    posted(store, incident(instance))
    acting.run_once()
    assert click(here, "burnwatch_approve", APPROVER) == 200
    events_go_on(store, instance, wall, version=2)
    acting.run_once()
    assert steps(store)[-1] == ("retry", APPROVER)
    wall.t += 31
    events_go_on(store, instance, wall, version=3)
    passing = threading.Thread(target=acting.run_once, daemon=True)
    passing.start()
    try:
        assert throttled.entered.acquire(timeout=30)
        buttons = [e["action_id"] for b in slack.calls("chat.update")[-1].blocks if b["type"] == "actions"
                   for e in b["elements"]]  # fmt: skip
        assert buttons == ["burnwatch_decline"]  # the message people see while the retry's call is made
        wall.t += 5
        assert click(here if where == "acting" else elsewhere, "burnwatch_decline", APPROVER) == 200
    finally:
        throttled.release.release()
        passing.join(timeout=30)
    assert steps(store)[-1] == ("retry", APPROVER)
    for version in (4, 5, 6):
        wall.t += 300
        events_go_on(store, instance, wall, version=version)
        acting.run_once()
    assert throttled.calls == 2 and steps(store)[-1] == ("cancelled", APPROVER)
    restarted, _ = setup(store, slack, tmp_path, moto_url, "approve", wall)
    restarted.executors = {"stop_instance": throttled}
    wall.t += 300
    events_go_on(store, instance, wall, version=7)
    restarted.run_once()
    assert throttled.calls == 2 and state(moto_url, instance) == "running"


def test_a_late_decline_stamped_by_a_clock_ahead_is_no_stop_of_the_retry(store, slack, tmp_path):
    """Two approvers click at once on two workers: the approval is stored first, the Decline is its late twin, read
    with the action pending. The declining worker's clock runs two minutes ahead (within the 5 minutes allowed), so
    its Decline is stamped after the retry that followed the approval at once (EC2 throttled the call): it was taken
    as a stop of that retry, by the acting worker and by any worker rebuilding from the audit, though nobody
    declined the retry (docs/actions.md: a Decline that raced the approval changes nothing)."""
    wall = Wall()
    server, runner, handler = _proposed_on_a_throttling_ec2(store, slack, tmp_path, wall)
    try:
        (pending,) = Action.from_steps(store.remediations.steps("a1")).values()  # what the other worker read
        assert click(handler, "burnwatch_approve", APPROVER) == 200
        events_go_on(store, "i-0123456789abcdef0", wall, version=2)
        wall.t += 1
        runner.run_once()
        assert steps(store)[-1] == ("retry", APPROVER)
        row = ActionStep(alert_id="a1", kind="stop_instance", step="declined", at=wall.t + 120, mode="approve",
                         decided_by=GROUPIE, rule="idle-gpu", resource_id=pending.resource_id, team="nlp",
                         attempt=pending.attempts)  # fmt: skip
        store.remediations.record([row])  # as decide() on the other worker stores it, on its clock
        (rebuilt,) = Action.from_steps(store.remediations.steps("a1")).values()
        assert rebuilt.stoppable and not rebuilt.stop_asked_by
        wall.t += 61
        events_go_on(store, "i-0123456789abcdef0", wall, version=3)
        runner.run_once()
        assert [s for s, _ in steps(store)].count("begun") == 2 and ("cancelled", GROUPIE) not in steps(store)
    finally:
        server.close()
