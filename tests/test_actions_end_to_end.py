"""Actions through the real worker: an idle GPU episode on an EC2 instance (moto's server)
goes through the embedded broker and the Faust worker into the embedded store; the worker
posts the alert and, in its thread, the proposal with Approve and Decline (the local Slack
server); a signed click from someone who is not an approver is refused and recorded, one
from an approver stops the instance; a dry-run rule's instance is never called; a
restarted worker acts on nothing twice. Once the stopped instance is reported, the incident
resolves (the worker's incident list and the alert's thread say so)."""

from __future__ import annotations

import json
import shutil
import textwrap
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

import msgspec
import pytest

from detector.events import TOPIC_GPU_METRICS, TOPIC_RESOURCE_USAGE, GpuMetric
from detector.testing import LocalSlack
from streams.embedded import EmbeddedBroker
from streams.kafka import count_events
from streams.process import WorkerProcess, worker_env
from tests import aws
from tests.aws import run_instance, state
from tests.conftest import ROOT
from tests.helpers import at, usage
from tests.test_actions import signed
from tests.test_end_to_end import post_click, publish, sql

pytestmark = pytest.mark.integration
moto_url = aws.moto_url  # the fixture: moto's server on 127.0.0.1

SECRET = "e2e-actions-secret"
APPROVER, STRANGER = "U0NLPLEAD", "U0STRANGER"
_json = msgspec.json.Encoder()


def idle_host(instance: str, start: float, end: float) -> list[tuple[str, str, bytes]]:
    """A one-GPU host billed and idle from ``start`` to ``end``: a scrape and a usage event a minute."""
    records = []
    t = start
    while t < end:
        records.append((TOPIC_RESOURCE_USAGE, instance, _json.encode(usage(t, instance, usd_per_hour=32.77))))
        metric = GpuMetric(ts=at(t), resource_id=instance, gpu_index=0, model="A100", util_pct=0.0)
        records.append((TOPIC_GPU_METRICS, instance, _json.encode([metric])))
        t += 60.0
    return records


def rules_for(tmp_path: Path, approve: str, dry: list[str]) -> Path:
    rules = tmp_path / "rules"
    rules.mkdir()
    for name in ("pricing.yaml", "limits.yaml"):
        shutil.copy(ROOT / "rules" / name, rules / name)
    (rules / "rules.yaml").write_text(textwrap.dedent(f"""
        rules:
          - name: idle-approve
            type: idle_gpu
            match: {{resource_id: {approve}}}
            params: {{for: 30m}}
            action: {{kind: stop_instance, after: 1h, mode: approve}}
          - name: idle-dry-run
            type: idle_gpu
            match: {{resource_id: [{', '.join(dry)}]}}
            params: {{for: 30m}}
            action: {{kind: stop_instance, after: 1h}}
    """))  # fmt: skip
    (rules / "routing.yaml").write_text(f"approvers:\n  teams: {{nlp: [{APPROVER}]}}\n")
    return rules


def click(alert_id: str, user: str, action_id: str = "burnwatch_approve") -> tuple[bytes, dict[str, str]]:
    payload = {"type": "block_actions", "user": {"id": user, "username": user.lower()},
               "actions": [{"action_id": action_id, "value": alert_id}], "channel": {"id": "C0CHANNEL"},
               "message": {"ts": "1700000000.000009"}}  # fmt: skip
    body = urlencode({"payload": json.dumps(payload)}).encode()
    return body, signed(body, at=int(time.time()), secret=SECRET)


def incident(port: int, alert_id: str) -> dict:
    """The incident of ``alert_id`` as the worker's ``/api/incidents`` lists it ({} if not listed)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/incidents?limit=1000", timeout=10) as response:
        listed = json.loads(response.read())["incidents"]
    return next((i for i in listed if i["alert_id"] == alert_id), {})


def wait_for_incident(port: int, alert_id: str, predicate, timeout: float) -> dict:
    """Poll the worker's incident list until ``alert_id``'s incident satisfies ``predicate``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = incident(port, alert_id)
        if found and predicate(found):
            return found
        time.sleep(0.2)
    raise AssertionError(f"incident {alert_id} never satisfied the condition; last: {incident(port, alert_id)}")


def proposal_of(requests, instance: str):
    """The action's message about ``instance`` among Slack requests, if posted (in a thread)."""
    return next((p for p in requests if p.method == "chat.postMessage" and "thread_ts" in p.body
                 and instance in p.text_of_blocks()
                 and ("Proposed" in p.text_of_blocks() or "Dry run" in p.text_of_blocks())), None)  # fmt: skip


def test_idle_episode_to_approved_click_to_stopped_instance(tmp_path: Path, moto_url):
    approve, dry, later = run_instance(moto_url), run_instance(moto_url), run_instance(moto_url)
    now = time.time()
    first = idle_host(approve, now - 3 * 3600, now - 60) + idle_host(dry, now - 3 * 3600, now - 60)
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker, LocalSlack() as slack:
        env = worker_env(broker.bootstrap, tmp_path / "data", rules_for(tmp_path, approve, [dry, later]), 1,
                         SLACK_BOT_TOKEN="xoxb-local", SLACK_CHANNEL="#ml-cost", SLACK_BASE_URL=slack.api_url,
                         SLACK_SIGNING_SECRET=SECRET, AWS_ENDPOINT_URL_EC2=moto_url, AWS_ACCESS_KEY_ID="testing",
                         AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")  # fmt: skip
        publish(broker.bootstrap, first)
        worker = WorkerProcess(env, tmp_path / "worker-1.log").start()
        try:
            worker.wait_until(lambda h: h["events"] >= count_events(first), timeout=180)
            assert slack.wait_for(lambda r: proposal_of(r, approve) and proposal_of(r, dry), timeout=60), worker.tail()
            proposal = proposal_of(slack.requests, approve)
            buttons = [e["action_id"] for b in proposal.blocks if b["type"] == "actions" for e in b["elements"]]
            assert buttons == ["burnwatch_approve", "burnwatch_decline"]
            alert_id = next(e["value"] for b in proposal.blocks if b["type"] == "actions" for e in b["elements"])
            opening = next(p for p in slack.calls("chat.postMessage") if p.response["ts"] == proposal.body["thread_ts"])
            assert approve in opening.text_of_blocks()  # in the alert's own thread

            assert post_click(worker.port, *click(alert_id, STRANGER)) == 403
            assert state(moto_url, approve) == "running"
            assert post_click(worker.port, *click(alert_id, APPROVER)) == 200
            worker.wait_for_log('"action_succeeded"', timeout=60)
            assert state(moto_url, approve) in ("stopping", "stopped")

            # The exporter then reports the instance stopped: the incident resolves, in the
            # worker's incident list and in the alert's thread.
            assert incident(worker.port, alert_id)["state"] == "firing"
            stopped = usage(time.time() - 30, approve, state="stopped", usd_per_hour=32.77)
            publish(broker.bootstrap, [(TOPIC_RESOURCE_USAGE, approve, _json.encode(stopped))])
            resolved = wait_for_incident(worker.port, alert_id, lambda i: i["state"] == "resolved", timeout=120)
            assert resolved["alert_id"] == alert_id, worker.tail()
            assert slack.wait_for(lambda r: any(p.method == "chat.postMessage" and p.body.get("thread_ts") ==
                                                opening.response["ts"] and "esolved" in p.text_of_blocks()
                                                for p in r), timeout=60), worker.tail()  # fmt: skip
        finally:
            assert worker.stop() == 0, worker.tail()

        # Restarted: nothing is proposed or done again; a new incident still is (a pass ran).
        second = idle_host(later, now - 3 * 3600, time.time() - 60)
        publish(broker.bootstrap, second)
        worker = WorkerProcess(env, tmp_path / "worker-2.log").start()
        try:
            assert slack.wait_for(lambda r: proposal_of(r, later) is not None, timeout=180), worker.tail()
        finally:
            assert worker.stop() == 0, worker.tail()

    assert state(moto_url, dry) == "running" and state(moto_url, later) == "running"  # dry run: never called
    rows = sql(env, "SELECT resource_id, step, decided_by, api, request, usd_per_hour FROM burnwatch.remediation_actions "
                    "ORDER BY action_key, at, seq")  # fmt: skip
    steps = {}
    for r in rows:
        steps.setdefault(r["resource_id"], []).append((r["step"], r["decided_by"]))
    assert steps[approve] == [("proposed", ""), ("announced", ""), ("refused", STRANGER), ("approved", APPROVER),
                              ("begun", APPROVER), ("succeeded", APPROVER)]  # fmt: skip
    assert steps[dry] == steps[later] == [("proposed", ""), ("dry_run", "dry_run"), ("announced", "")]
    done = next(r for r in rows if r["step"] == "succeeded")
    assert (done["api"], json.loads(done["request"]), done["usd_per_hour"]) == (
        "ec2.StopInstances", {"InstanceIds": [approve]}, pytest.approx(32.77))
