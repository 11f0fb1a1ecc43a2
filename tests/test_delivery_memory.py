"""The outboxes' records of deliveries made stay bounded (:mod:`detector.closed_alerts`): a closed
alert's leave memory past the horizon of event time and an assignment does not load them, while an
open incident's and a recent one's stay; whatever is forgotten is read back from the store when its
alert comes again, so a replay of old events, a withdrawal after the horizon or a group member's
resolution posts nothing twice and threads where it did.

The real parts: the alert manager, the store on chdb, Slack's outbox against the local Slack server
and the webhook output's against a local receiver, driven as the worker drives them (findings → the
alert manager → the store → both outboxes)."""

from __future__ import annotations

import time

import pytest

from detector.alerts import Alert, AlertManager, AlertMemory
from detector.closed_alerts import DELIVERY_HORIZON_S
from detector.delivery import Outbox
from detector.detectors import Finding, ResourceInfo
from detector.detectors.episode import WITHDRAWN
from detector.outputs.outbox import OutputOutbox
from detector.rules import Routing
from detector.settings import Settings
from detector.store import Store
from detector.testing import LocalSlack
from tests.helpers import T0, slack_bot
from tests.receivers import LocalReceiver

DAY = 86_400.0
SECRET = "s3cret-for-tests-only"


def finding(action: str, rid: str, start: float, at: float, team: str = "nlp", **details: object) -> Finding:
    """An idle GPU episode of ``rid`` that started at ``start`` (fired 30 minutes in): one change of it at ``at``."""
    return Finding(action=action, rule="idle-gpu", type="idle_gpu", resource_id=rid, episode_start=start,  # type: ignore[arg-type]
                   fired_at=start + 1800, at=at, waste_usd=(at - start) / 100, usd_per_hour=32.77, severity="warning",
                   details={"reason": "gpu_busy", **details} if action == "resolve" else dict(details),
                   resource=ResourceInfo(resource_id=rid, account="ml-prod", tags={"team": team, "owner": rid}))  # fmt: skip


def episode(rid: str, start: float, hours: float | None = 1.0, team: str = "nlp") -> list[Finding]:
    """Its opening, and (``hours``) its resolution that long after it fired."""
    fired = [finding("fire", rid, start, start + 1800, team)]
    return fired if hours is None else [*fired, finding("resolve", rid, start, start + 1800 + hours * 3600, team)]


class Worker:
    """The worker's alert path over one store: alert manager → store → Slack and webhook outboxes."""

    def __init__(self, store: Store, slack: LocalSlack, hook_url: str, forget_after_s: float = DELIVERY_HORIZON_S) -> None:
        self.store = store
        self.manager = AlertManager(AlertMemory.load(store.memory))
        self.slack = Outbox(store, slack_bot(slack), group_wait_s=0, forget_after_s=forget_after_s)
        routing = Routing.model_validate({"outputs": {"hook": {"kind": "webhook", "url": hook_url,
                                                               "secret_env": "BW_HOOK_SECRET"}},
                                          "send": {"default": ["slack", "hook"]}})  # fmt: skip
        self.outputs = OutputOutbox(store, routing, forget_after_s=forget_after_s)
        self.slack.assign([0])
        self.outputs.assign([0])

    def handle(self, findings: list[Finding]) -> list[Alert]:
        """What the alert manager lets through, stored and delivered; returned."""
        changes = self.manager.handle(findings)
        self.store.alerts.record(changes, version=time.time_ns())
        self.slack.add(changes)
        self.outputs.add(changes)
        self.slack.deliver_pending()
        self.outputs.deliver_pending()
        assert len(self.slack) == 0 and len(self.outputs) == 0
        return changes


def opening_ts(slack: LocalSlack, alert_id: str) -> str:
    """The ts of the message that opened ``alert_id``."""
    (post,) = [p for p in slack.calls("chat.postMessage")
               if f"alert `{alert_id}`" in p.text_of_blocks() and not p.body.get("thread_ts")]  # fmt: skip
    return post.response["ts"]


@pytest.fixture
def hook(monkeypatch):
    monkeypatch.setenv("BW_HOOK_SECRET", SECRET)
    with LocalReceiver() as receiver:
        yield receiver


@pytest.fixture
def slack():
    with LocalSlack() as server:
        yield server


def test_the_default_horizon_is_the_alert_managers():
    """The worker's setting defaults to the horizon the module argues for (the alert manager's)."""
    assert Settings.model_fields["delivery_memory_s"].default == DELIVERY_HORIZON_S == 7 * DAY


def _old_open_recent(worker: Worker) -> tuple[str, str, str]:
    """Day 0: an incident opened and resolved (old), one opened and never resolved (open); day 9: one opened
    and resolved, and a later one opened, which moves event time 9 days on. Their alert ids."""
    old = worker.handle(episode("h-old", T0))[0].alert_id
    open_ = worker.handle(episode("h-open", T0 + 600, hours=None))[0].alert_id
    recent = worker.handle(episode("h-recent", T0 + 9 * DAY))[0].alert_id
    worker.handle(episode("h-new", T0 + 9 * DAY + 7200, hours=None))
    return old, open_, recent


def test_old_closed_alerts_leave_memory_and_an_assignment_does_not_load_them(store, slack, hook):
    """Past the horizon (7 days of event time) the records of an alert resolved on day 0 leave both
    outboxes' memory; an incident still open since day 0 and one resolved on day 9 keep theirs. They
    stay in the store. A new worker's assignment loads Slack's records of the open and the recent one,
    not the old one's (the webhook's outbox loads only what it still owes: none of them)."""
    worker = Worker(store, slack, hook.url)
    old, open_, recent = _old_open_recent(worker)
    assert not worker.slack.remembers(old) and not worker.outputs.remembers(old)
    assert worker.slack.remembers(open_) and worker.outputs.remembers(open_)
    assert worker.slack.remembers(recent) and worker.outputs.remembers(recent)
    assert (old, "resolved") in store.deliveries.made() and store.outputs.states(old)[("hook", "resolved")] >= {"sent"}

    restarted = Worker(store, slack, hook.url)
    assert not restarted.slack.remembers(old) and not restarted.outputs.remembers(old)
    assert restarted.slack.remembers(open_) and restarted.slack.remembers(recent)


def test_a_replay_of_events_older_than_the_horizon_posts_and_sends_nothing_twice(store, slack, hook):
    """The topic read again from the start (a consumer group reset), by the same worker and by a new one:
    the alert manager no longer remembers day 0's closed episode and lets it through again, with the same
    id (the episode still open it remembers, however old, and lets nothing of it through); both outboxes,
    which forgot it, read its records back and post and send nothing."""
    worker = Worker(store, slack, hook.url)
    old, open_, _ = _old_open_recent(worker)
    posts, sent = len(slack.calls("chat.postMessage")), len(hook.delivered)
    for replaying in (worker, Worker(store, slack, hook.url)):
        replaying.manager = AlertManager(AlertMemory.load(store.memory))  # its memory: 7 days before day 9
        again = replaying.handle(episode("h-old", T0) + episode("h-open", T0 + 600, hours=None))
        assert [(a.alert_id, a.change) for a in again] == [(old, "fired"), (old, "resolved")]
        assert open_ not in {a.alert_id for a in again}
        assert len(slack.calls("chat.postMessage")) == posts and len(hook.delivered) == sent


def test_a_withdrawal_after_the_outbox_forgot_its_alert_replies_in_its_thread_once(store, slack, hook):
    """With a horizon of one day, an alert resolved on day 0 is forgotten by day 2; its fire taken back
    then (a stop read late, which the alert manager still admits) replies in the opening's thread and
    reaches the webhook once, and a restart sends it to neither again."""
    worker = Worker(store, slack, hook.url, forget_after_s=DAY)
    old = worker.handle(episode("h-old", T0))[0].alert_id
    worker.handle(episode("h-new", T0 + 2 * DAY, hours=None))
    assert not worker.slack.remembers(old) and not worker.outputs.remembers(old)
    (withdrawn,) = worker.handle([finding("resolve", "h-old", T0, T0 + 1700, reason=WITHDRAWN)])
    assert withdrawn.change == "withdrawn"
    reply = slack.calls("chat.postMessage")[-1]
    assert "*Withdrawn*" in reply.text_of_blocks() and reply.body["thread_ts"] == opening_ts(slack, old)
    assert [r.json["status"] for r in hook.delivered if r.json["id"] == old] == ["firing", "resolved", "resolved"]
    posts, sent = len(slack.calls("chat.postMessage")), len(hook.delivered)
    Worker(store, slack, hook.url, forget_after_s=DAY)
    assert len(slack.calls("chat.postMessage")) == posts and len(hook.delivered) == sent


@pytest.mark.parametrize("restart", [False, True])
def test_a_group_message_stays_a_groups_while_one_member_is_open(store, slack, hook, restart):
    """Two idle hosts of one team open one message; one resolves on day 0, the other stays open. Past the
    horizon the first's records go, and the second's resolution (by the same worker, or after a restart)
    still replies in the group's thread without rewriting the group's message as its own."""
    worker = Worker(store, slack, hook.url)
    opened = worker.handle([finding("fire", "g1", T0, T0 + 1800), finding("fire", "g2", T0, T0 + 1800)])
    group_ts = {p.response["ts"] for p in slack.calls("chat.postMessage")}
    assert len(group_ts) == 1 and len(opened) == 2
    worker.handle([finding("resolve", "g1", T0, T0 + 5400)])
    worker.handle(episode("h-new", T0 + 9 * DAY, hours=None))
    assert not worker.slack.remembers(opened[0].alert_id) and worker.slack.remembers(opened[1].alert_id)
    (Worker(store, slack, hook.url) if restart else worker).handle([finding("resolve", "g2", T0, T0 + 9 * DAY + 3600)])
    reply = slack.calls("chat.postMessage")[-1]
    assert reply.body["thread_ts"] in group_ts and "g2" in reply.text_of_blocks()
    assert slack.calls("chat.update") == []
