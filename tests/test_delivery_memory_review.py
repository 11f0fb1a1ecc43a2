"""Review probes of the outboxes' bounded delivery records (031c365): what moves the horizon, and a
resolution by silence of an incident older than the horizon (72134cf)."""

from __future__ import annotations

import pytest

from detector.closed_alerts import SWEEP_AFTER_CLOSES
from detector.detectors.episode import SILENT, WITHDRAWN
from detector.outputs.outbox import OutputOutbox
from detector.rules import Routing
from tests.helpers import T0
from tests.test_delivery_memory import DAY, Worker, episode, finding, hook, opening_ts, slack  # noqa: F401

__all__ = ["hook", "slack"]


def test_one_future_dated_change_does_not_stop_the_outboxes_forgetting(store, slack, hook):
    """One alert dated a year ahead (an exporter's clock): the sweep ran once there, forgetting what was
    closed, and then never again until event time got an eighth of the horizon past that date, so every
    alert closed from then on stayed in both outboxes' memory for good, the growth the change set out to
    end (closed_alerts says a future-dated change makes *more* be forgotten). Now a sweep also comes after
    SWEEP_AFTER_CLOSES closes: 80 incidents opened and closed over 10 passes leave fewer than that held."""
    worker = Worker(store, slack, hook.url, forget_after_s=DAY)
    worker.handle(episode("h-future", T0 + 365 * DAY, hours=None))
    ids: list[str] = []
    for n in range(10):
        findings = [f for d in range(8) for f in episode(f"h{n}-{d}", T0 + (8 * n + d) * 3600, team=f"t{d}")]
        ids += [a.alert_id for a in worker.handle(findings) if a.change == "fired"]
    assert len(ids) == 80
    kept = [i for i in ids if worker.slack.remembers(i)]
    kept_outputs = [i for i in ids if worker.outputs.remembers(i)]
    assert len(kept) < SWEEP_AFTER_CLOSES and len(kept_outputs) < SWEEP_AFTER_CLOSES, (len(kept), len(kept_outputs))
    assert not worker.slack.remembers(ids[0]) and not worker.outputs.remembers(ids[0])


@pytest.mark.parametrize("restart", [False, True])
@pytest.mark.parametrize("grouped", [False, True])
def test_a_went_silent_resolution_of_an_incident_older_than_the_horizon_replies_in_its_thread(
    store, slack, hook, restart, grouped
):
    """An idle host opens on day 0 (alone, or in a group message with a host that resolves within the hour),
    stays idle and reporting until day 9 while other incidents come and go (event time moves, the outboxes
    forget), then goes quiet: 2 days on, the sweep resolves it where its events stopped (went_silent). The
    resolution replies once in its opening's thread (the group's, without rewriting it) and reaches the
    webhook once; by the same worker or one restarted just before."""
    worker = Worker(store, slack, hook.url)
    fired = [finding("fire", "h-long", T0, T0 + 1800)]
    if grouped:
        fired.append(finding("fire", "h-mate", T0, T0 + 1800))
    opened = worker.handle(fired)
    long_id = opened[0].alert_id
    if grouped:
        worker.handle([finding("resolve", "h-mate", T0, T0 + 3600)])
    for d in range(1, 10):
        worker.handle([finding("update", "h-long", T0, T0 + d * DAY)])
        worker.handle(episode(f"h-other{d}", T0 + d * DAY + 600))
    if grouped:
        assert not worker.slack.remembers(opened[1].alert_id)  # the mate is forgotten by now
    edits = len(slack.calls("chat.update"))
    on = Worker(store, slack, hook.url) if restart else worker
    on.handle(episode("h-later", T0 + 11 * DAY, hours=None))  # event time: 2 days past its last event
    (resolved,) = on.handle([finding("resolve", "h-long", T0, T0 + 9 * DAY, reason=SILENT, silent_s=2 * DAY)])
    assert resolved.alert_id == long_id and resolved.change == "resolved"
    replies = [
        p for p in slack.calls("chat.postMessage") if f"alert `{long_id}`" in p.text_of_blocks() and p.body.get("thread_ts")
    ]
    assert len(replies) == 1 and replies[0].body["thread_ts"] == opening_ts(slack, long_id)
    if grouped:
        assert len(slack.calls("chat.update")) == edits  # the group's message is not rewritten as its own
    assert [r.json["status"] for r in hook.delivered if r.json["id"] == long_id] == ["firing", "resolved"]


def test_a_withdrawal_of_a_forgotten_group_member_replies_in_the_groups_thread_without_rewriting_it(store, slack, hook):
    """Two hosts of one team open one message and both resolve on day 0; with a one-day horizon both are
    forgotten by day 2. The first's fire taken back then (read back from the store: deliveries.recall) replies
    in the group's thread and leaves the group's message alone: the records read back say it is a group's."""
    worker = Worker(store, slack, hook.url, forget_after_s=DAY)
    opened = worker.handle([finding("fire", "g1", T0, T0 + 1800), finding("fire", "g2", T0, T0 + 1800)])
    (group_ts,) = {p.response["ts"] for p in slack.calls("chat.postMessage")}
    worker.handle([finding("resolve", "g1", T0, T0 + 5400), finding("resolve", "g2", T0, T0 + 5400)])
    worker.handle(episode("h-new", T0 + 2 * DAY, hours=None))
    assert not worker.slack.remembers(opened[0].alert_id) and not worker.slack.remembers(opened[1].alert_id)
    edits = len(slack.calls("chat.update"))
    (withdrawn,) = worker.handle([finding("resolve", "g1", T0, T0 + 1700, reason=WITHDRAWN)])
    assert withdrawn.change == "withdrawn"
    reply = slack.calls("chat.postMessage")[-1]
    assert "*Withdrawn*" in reply.text_of_blocks() and reply.body["thread_ts"] == group_ts
    assert len(slack.calls("chat.update")) == edits


def test_an_output_added_by_a_reload_after_the_assignment_sends_a_replayed_old_alert_once(store, slack, hook):
    """A worker assigned its partitions with no output besides Slack in its routing (the webhook taken out of
    routing.yaml for a while) gets the webhook back by a reload; the topic is then replayed past the alert
    manager's horizon. The webhook had day 0's episode already (output_deliveries says so): its lane, added
    by the reload, was never recovered, and the outbox's recovery, which returns before marking what it did
    not load when there is no lane, left nothing counted as forgotten, so nothing is looked up: sent again."""
    worker = Worker(store, slack, hook.url)
    old = worker.handle(episode("h-old", T0))[0].alert_id
    worker.handle(episode("h-new", T0 + 9 * DAY, hours=None))
    sent = len(hook.delivered)
    later = Worker(store, slack, hook.url)
    routing = later.outputs.routing
    later.outputs = OutputOutbox(store, Routing.model_validate({"send": {"default": ["slack"]}}))
    later.outputs.assign([0])
    later.outputs.configure(routing)  # the reload
    again = later.handle(episode("h-old", T0))
    assert [(a.alert_id, a.change) for a in again] == [(old, "fired"), (old, "resolved")]
    assert len(hook.delivered) == sent
