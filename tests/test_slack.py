"""Slack delivery through slack-sdk against a local Slack server, with the outbox in ClickHouse."""

from __future__ import annotations

import re
import time

import msgspec
import pytest

from detector.alerts import Alert
from detector.delivery import Outbox
from detector.slack import SlackError, SlackNotifier, notification_text, render_group
from tests.helpers import T0, slack_bot


def alert(change: str = "fired", alert_id: str = "a1", **kw) -> Alert:
    resolved = change == "resolved"
    kw.setdefault("waste_usd", 49.16 if resolved else 16.39)
    kw.setdefault("updated_at", T0 + (5400 if resolved else 1800))
    kw.setdefault("tags", {"team": "nlp", "owner": "alice", "project": "llm"})
    kw.setdefault("fired_at", T0 + 1800)
    return Alert(
        alert_id=alert_id, type="idle_gpu", rule="idle-gpu", resource_id="gpu-host-007",
        status="resolved" if resolved else "firing", change=change, severity="warning",
        episode_start=T0, resolved_at=T0 + 5400 if resolved else None,
        usd_per_hour=32.77, resource_type="gpu_instance", account="ml-prod", region="us-east-1",
        instance_type="p4d.24xlarge",
        details={"gpu_count": 8, "gpu_model": "A100-SXM4-40GB", **({"reason": "gpu_busy"} if resolved else {})},
        **kw,
    )  # fmt: skip


bot = slack_bot


def test_a_resolution_of_a_resource_gone_silent_says_so_and_where_its_dollars_stop(slack):
    """A resource that sent nothing for the state TTL (``went_silent``): its reply says when its last
    event was, that none came in the two days since, and that it may be gone or unreported, not a
    bare "went silent"."""
    notifier = bot(slack)
    channel, parent = notifier.post(alert())
    gone = alert("resolved")
    gone.details.update(reason="went_silent", silent_s=172_800.0)
    notifier.post(gone, thread=(channel, parent))
    text = slack.calls("chat.postMessage")[1].text_of_blocks()
    assert "its last event; none in the 2d since: the resource is gone, or nothing reports it any more" in text
    assert "$49.16 wasted* in total" in text and "went silent" not in text


def test_opening_is_block_kit_with_dollars_owner_and_next_step(slack):
    channel, ts = bot(slack).post(alert())
    (post,) = slack.calls("chat.postMessage")
    assert post.body["channel"] == "#ml-cost" and channel == "#ml-cost" and ts
    text = post.text_of_blocks()
    for expected in ("gpu-host-007", "$32.77/h", "$16.39", "alice", "nlp", "8 × A100-SXM4-40GB", "30m",
                     "Stop the instance", "idle-gpu", "a1"):  # fmt: skip
        assert expected in text, expected
    assert post.blocks[0]["type"] == "header"


def failed_run(alert_id: str = "f1", **details) -> Alert:
    return Alert(
        alert_id=alert_id, type="failed_run_spend", rule="failed-run-spend", resource_id=f"run-{alert_id}",
        status="firing", change="fired", severity="warning", episode_start=T0, fired_at=T0 + 7200,
        updated_at=T0 + 7200, waste_usd=65.54, usd_per_hour=32.77, resource_type="run", account="ml-prod",
        region="us-east-1", tags={"team": "nlp", "owner": "alice"},
        details={"run_id": f"run-{alert_id}", "status": "failed", "error": "OOM", "gpu_hours": 16.0, **details},
    )  # fmt: skip


def test_a_failed_runs_dollars_are_spent_not_burning_by_the_month(slack):
    """A failed run has ended: its rate is what it cost while it ran, with no monthly cost
    "if left"; a crash loop retries until stopped, so it keeps its monthly burn."""
    bot(slack).post(failed_run())
    bot(slack).post(failed_run("loop", crash_loop=True, failed_runs=3, project="llm"))
    bot(slack).post(alert())
    run, loop, idle = (post.text_of_blocks() for post in slack.calls("chat.postMessage"))
    assert "$32.77/h while it ran" in run and "$65.54" in run and "if left" not in run
    assert "$32.77/h ($23,922/month if left)" in loop and "while it ran" not in loop
    assert "$32.77/h ($23,922/month if left)" in idle
    group = str(render_group([failed_run("a"), failed_run("b")]))
    assert "$131.08 spent" in group and "/month if left" not in group and group.count("/h while it ran") == 2
    mixed = str(render_group([failed_run("a"), failed_run("loop", crash_loop=True)]))
    assert "$32.77/h" in mixed and "($23,922/month if left)" in mixed


def test_resolution_replies_in_thread_and_edits_parent(slack):
    notifier = bot(slack)
    channel, parent = notifier.post(alert())
    notifier.post(alert("resolved"), thread=(channel, parent))
    reply = slack.calls("chat.postMessage")[1]
    assert reply.body["thread_ts"] == parent
    assert "$49.16 wasted" in reply.text_of_blocks() and "1h 30m" in reply.text_of_blocks()
    (update,) = slack.calls("chat.update")
    assert update.body["ts"] == parent and "Resolved" in update.text_of_blocks()


def test_a_withdrawn_fire_says_so_in_its_thread_and_message_and_counts_no_dollars(slack):
    """A stop read after the samples that seemed to complete the episode, dated before them, takes the
    fire back (``reason: withdrawn``): people read that it never met the rule, not a resolution with
    dollars wasted."""
    notifier = bot(slack)
    channel, parent = notifier.post(alert())
    withdrawn = msgspec.structs.replace(alert("resolved", waste_usd=0.0, updated_at=T0 + 1770), resolved_at=T0 + 1770,
                                        details={"gpu_count": 8, "reason": "withdrawn"})  # fmt: skip
    assert withdrawn.withdrawn and not alert("resolved").withdrawn
    notifier.post(withdrawn, thread=(channel, parent))
    reply = slack.calls("chat.postMessage")[1].text_of_blocks()
    (update,) = slack.calls("chat.update")
    for text in (reply, update.text_of_blocks()):
        assert "Withdrawn" in text and "stopped after 29m" in text and "Resolved" not in text
        assert "wasted" not in text.split("Withdrawn")[1]
    assert "Burn rate" not in update.text_of_blocks() and "$" not in update.text_of_blocks()
    assert withdrawn.summary().startswith("WITHDRAWN Idle GPU") and "nothing counted" in withdrawn.summary()
    assert notification_text(withdrawn).startswith("Withdrawn: Idle GPU") and "$" not in notification_text(withdrawn)


def test_a_fire_withdrawn_before_its_opening_went_out_posts_nothing_nor_after_a_restart(slack, store):
    """A backlog read fast brings a fire and its withdrawal in one batch: the opening, still waiting for
    company, goes out with neither; one already posted is marked withdrawn in its thread."""
    now = [1000.0]
    waiting, posted = alert(alert_id="w1"), alert(alert_id="p1", tags={"team": "vision"})
    withdrawn = [msgspec.structs.replace(alert("resolved", alert_id=a.alert_id, waste_usd=0.0, tags=a.tags),
                                         details={"gpu_count": 8, "reason": "withdrawn"})
                 for a in (waiting, posted)]  # fmt: skip
    store.alerts.record([waiting, posted], version=1)
    store.alerts.record(withdrawn, version=2)
    outbox = Outbox(store, bot(slack), group_wait_s=2.0, clock=lambda: now[0])
    outbox.add([posted])
    now[0] += 5.0
    assert outbox.deliver_pending() == 1  # p1's opening, its wait over
    outbox.add([waiting])
    outbox.deliver_pending()  # w1 waits for company
    outbox.add(withdrawn)
    outbox.deliver_pending()
    posts = slack.calls("chat.postMessage")
    assert len(posts) == 2 and "p1" in posts[0].text_of_blocks() and "Withdrawn" in posts[1].text_of_blocks()
    assert posts[1].body["thread_ts"] and len(outbox) == 0
    restarted = Outbox(store, bot(slack), group_wait_s=0.0)
    assert restarted.recover() == 0 and restarted.deliver_pending() == 0
    assert len(slack.calls("chat.postMessage")) == 2


def test_a_fire_withdrawn_before_it_was_posted_is_not_posted_after_a_restart_either(slack, store):
    """Stored, opening and withdrawal, and neither posted when the worker died: the next worker's outbox
    posts neither (the withdrawal, dated by its stop, comes before its opening in time)."""
    opened = alert(alert_id="w1")
    withdrawn = msgspec.structs.replace(alert("resolved", alert_id="w1", waste_usd=0.0), resolved_at=T0 + 1770,
                                        details={"gpu_count": 8, "reason": "withdrawn"})  # fmt: skip
    assert Outbox(store, bot(slack), group_wait_s=0.0).recover() == 0  # the worker that died started with Slack
    store.alerts.record([opened], version=1)
    store.alerts.record([withdrawn], version=2)
    outbox = Outbox(store, bot(slack), group_wait_s=0.0)
    assert outbox.recover() == 2 and outbox.deliver_pending() == 0 and len(outbox) == 0
    assert slack.calls("chat.postMessage") == []
    assert Outbox(store, bot(slack), group_wait_s=0.0).recover() == 0  # recorded as handled



def _taken_back(resolved: Alert) -> Alert:
    """``resolved``, then taken back: a stop read after the sample that resolved it (change ``withdrawn``)."""
    return msgspec.structs.replace(resolved, change="withdrawn", waste_usd=0.0, usd_per_hour=0.0,
                                   resolved_at=T0 + 1770, details={"gpu_count": 8, "reason": "withdrawn"})  # fmt: skip


def _corrected(resolved: Alert) -> Alert:
    """``resolved`` (at 01:30, $49.16), then corrected: a stop read after the sample that resolved it, dated
    within a gap in the samples before, ended it at 01:00 with $32.77 (change ``corrected``)."""
    return msgspec.structs.replace(resolved, change="corrected", waste_usd=32.77, resolved_at=T0 + 3600,
                                   updated_at=T0 + 3600, details={
                                       "gpu_count": 8, "reason": "instance_stopped", "corrected": True,
                                       "was_resolved_at": resolved.resolved_at, "was_usd": resolved.waste_usd})  # fmt: skip


AFTER_RESOLUTION = [(_taken_back, "*Withdrawn*"), (_corrected, "*Corrected*")]
"""What may follow a resolution (a withdrawal, a correction), and the mark of its reply."""


def _posted_and_resolved(slack, store) -> tuple[Outbox, Alert]:
    """Alert r1's opening and resolution, stored and posted: the outbox, and the resolution."""
    opened, resolved = alert(alert_id="r1"), alert("resolved", alert_id="r1")
    store.alerts.record([opened], version=1)
    store.alerts.record([resolved], version=2)
    outbox = Outbox(store, bot(slack), group_wait_s=0.0)
    outbox.add([opened, resolved])
    assert outbox.deliver_pending() == 2
    return outbox, resolved


def test_an_alert_taken_back_after_its_resolution_was_posted_says_so_once(slack, store):
    """Opening and resolution posted, then the fire taken back (the stop read after the sample that
    resolved it): a reply in the thread says it is withdrawn and the message is edited to say so,
    with no dollars; a restarted outbox posts nothing more."""
    outbox, resolved = _posted_and_resolved(slack, store)
    withdrawn = _taken_back(resolved)
    store.alerts.record([withdrawn], version=3)
    outbox.add([withdrawn])
    assert outbox.deliver_pending() == 1
    posts, updates = slack.calls("chat.postMessage"), slack.calls("chat.update")
    assert len(posts) == 3 and posts[2].body["thread_ts"] == posts[1].body["thread_ts"]
    assert "*Withdrawn*" in posts[2].text_of_blocks() and "taken back" in posts[2].text_of_blocks()
    assert "Withdrawn" in updates[-1].text_of_blocks() and "$" not in updates[-1].text_of_blocks()
    restarted = Outbox(store, bot(slack), group_wait_s=0.0)
    assert restarted.recover() == 0 and restarted.deliver_pending() == 0
    assert len(slack.calls("chat.postMessage")) == 3


def test_an_alert_taken_back_before_its_resolution_was_posted_is_posted_once_after_a_restart(slack, store):
    """Opening posted; the resolution and the withdrawal after it stored when the worker died: the next
    worker's outbox replies once, saying withdrawn (the alert's latest state), not a resolution with its
    dollars and then a withdrawal; and nothing after another restart."""
    opened, resolved = alert(alert_id="r1"), alert("resolved", alert_id="r1")
    store.alerts.record([opened], version=1)
    outbox = Outbox(store, bot(slack), group_wait_s=0.0)
    outbox.add([opened])
    assert outbox.deliver_pending() == 1
    store.alerts.record([resolved], version=2)
    store.alerts.record([_taken_back(resolved)], version=3)
    restarted = Outbox(store, bot(slack), group_wait_s=0.0)
    assert restarted.recover() == 2 and restarted.deliver_pending() == 1
    posts = slack.calls("chat.postMessage")
    assert len(posts) == 2 and "*Withdrawn*" in posts[1].text_of_blocks() and "Resolved" not in posts[1].text_of_blocks()
    again = Outbox(store, bot(slack), group_wait_s=0.0)
    assert again.recover() == 0 and again.deliver_pending() == 0


@pytest.mark.parametrize(("changed", "mark"), AFTER_RESOLUTION)
def test_a_change_after_the_resolution_in_doubt_is_not_taken_for_the_resolution_in_its_thread(slack, store, changed,
                                                                                               mark):  # fmt: skip
    """A withdrawal (a correction) whose post timed out, or was begun and never landed, is looked for in
    the thread before it is sent again: the resolution's reply there names the same alert, and is not it."""
    _, resolved = _posted_and_resolved(slack, store)
    store.alerts.record([changed(resolved)], version=3)
    store.deliveries.record_attempt(["r1"], changed(resolved).change)  # begun, then the worker died
    restarted = Outbox(store, bot(slack), group_wait_s=0.0, landing_s=0.0)
    assert restarted.recover() == 1 and restarted.deliver_pending() == 1
    posts = slack.calls("chat.postMessage")
    assert len(posts) == 3 and mark in posts[2].text_of_blocks()


def _posted_then_resolved_unposted(slack, store) -> tuple[tuple[str, str], Alert]:
    """Alert r1's opening stored and posted, then its resolution stored: the opening's thread, and the
    resolution."""
    opened, resolved = alert(alert_id="r1"), alert("resolved", alert_id="r1")
    store.alerts.record([opened], version=1)
    outbox = Outbox(store, bot(slack), group_wait_s=0.0)
    outbox.add([opened])
    assert outbox.deliver_pending() == 1
    thread = store.deliveries.thread_of("r1")
    assert thread is not None
    store.alerts.record([resolved], version=2)
    return thread, resolved


@pytest.mark.parametrize(("changed", "mark"), AFTER_RESOLUTION)
def test_a_resolution_found_in_slack_after_a_restart_is_not_taken_for_the_change_after_it(slack, store, changed, mark):
    """The resolution's reply landed but the worker died before recording it, and the fire was taken
    back (or the alert corrected) since: the next worker finds that reply (a resolution, with its
    dollars) and still posts the withdrawal or correction (a review found the thread left saying
    resolved, $49.16, the message edited to withdrawn)."""
    thread, resolved = _posted_then_resolved_unposted(slack, store)
    store.deliveries.record_attempt(["r1"], "resolved")  # begun...
    bot(slack).post(resolved, thread=thread)  # ...and it landed, never recorded
    store.alerts.record([changed(resolved)], version=3)
    restarted = Outbox(store, bot(slack), group_wait_s=0.0, landing_s=0.0)
    restarted.recover()
    restarted.deliver_pending()
    replies = [p.text_of_blocks() for p in slack.calls("chat.postMessage")[1:]]
    assert len(replies) == 2 and "*Resolved*" in replies[0] and mark in replies[1]


@pytest.mark.parametrize(("changed", "mark"), AFTER_RESOLUTION)
def test_a_resolution_found_in_slack_saying_the_change_after_it_is_that_change_too(slack, store, changed, mark):
    """Resolved and taken back (or corrected) while no worker held the alert; the next worker's resolution
    reply, the alert as it stands (withdrawn, corrected), landed but was never recorded: the worker after
    finds it and posts no second withdrawal (no correction after it)."""
    thread, resolved = _posted_then_resolved_unposted(slack, store)
    store.alerts.record([changed(resolved)], version=3)
    store.deliveries.record_attempt(["r1"], "resolved")  # begun...
    bot(slack).post(msgspec.structs.replace(changed(resolved), change="resolved"), thread=thread)  # ...landed
    restarted = Outbox(store, bot(slack), group_wait_s=0.0, landing_s=0.0)
    restarted.recover()
    restarted.deliver_pending()
    replies = [p.text_of_blocks() for p in slack.calls("chat.postMessage")[1:]]
    assert len(replies) == 1 and mark in replies[0]


def test_an_alert_corrected_after_its_resolution_was_posted_says_so_once(slack, store):
    """Opening and resolution posted, then corrected (the host had stopped at 01:00, read after the busy
    sample that resolved it at 01:30): one reply in the thread says when it stopped and the dollars, new
    and old, and the message is edited to the corrected figures; a restarted outbox posts nothing more."""
    outbox, resolved = _posted_and_resolved(slack, store)
    fix = _corrected(resolved)
    store.alerts.record([fix], version=3)
    outbox.add([fix])
    assert outbox.deliver_pending() == 1
    posts, updates = slack.calls("chat.postMessage"), slack.calls("chat.update")
    assert len(posts) == 3 and posts[2].body["thread_ts"] == posts[1].body["thread_ts"] == updates[-1].body["ts"]
    reply, parent = posts[2].text_of_blocks(), updates[-1].text_of_blocks()
    assert "*Corrected*" in reply and "stopped at 2026-11-02T01:00:00Z" in reply and "ended after 1h" in reply
    assert "*$32.77 wasted*" in reply and "not the $49.16 its resolution at 2026-11-02T01:30:00Z said" in reply
    assert "*Wasted so far*\n*$32.77*" in parent and "Resolved (corrected)" in parent and "1h 30m" not in parent
    assert fix.summary() == ("CORRECTED Idle GPUs on gpu-host-007 (nlp): it had stopped at 2026-11-02T01:00:00Z, read "
                             "late; ended after 1h: $32.77 wasted (not $49.16)")  # fmt: skip
    assert notification_text(fix).startswith("Corrected: Idle GPU") and "(not $49.16)" in notification_text(fix)
    restarted = Outbox(store, bot(slack), group_wait_s=0.0)
    assert restarted.recover() == 0 and restarted.deliver_pending() == 0
    assert len(slack.calls("chat.postMessage")) == 3


def test_an_alert_corrected_before_its_resolution_was_posted_is_posted_once_after_a_restart(slack, store):
    """Opening posted; the resolution and its correction stored when the worker died: the next worker's
    outbox replies once, with the corrected figures (the alert's latest state), not the first ones and
    then a correction; and nothing after another restart."""
    thread, resolved = _posted_then_resolved_unposted(slack, store)
    store.alerts.record([_corrected(resolved)], version=3)
    restarted = Outbox(store, bot(slack), group_wait_s=0.0)
    assert restarted.recover() == 2 and restarted.deliver_pending() == 1
    posts = slack.calls("chat.postMessage")
    assert len(posts) == 2 and posts[1].body["thread_ts"] == thread[1]
    assert "*Corrected*" in posts[1].text_of_blocks() and "$32.77" in posts[1].text_of_blocks()
    assert "$49.16" not in posts[1].text_of_blocks()  # (people never read it)
    again = Outbox(store, bot(slack), group_wait_s=0.0)
    assert again.recover() == 0 and again.deliver_pending() == 0


def test_a_correction_in_doubt_found_in_its_thread_is_not_posted_twice(slack, store):
    """The correction's reply landed but the worker died before recording it: the next worker finds it
    in the thread (its mark) and posts no second one."""
    _, resolved = _posted_and_resolved(slack, store)
    fix = _corrected(resolved)
    store.alerts.record([fix], version=3)
    store.deliveries.record_attempt(["r1"], "corrected")  # begun...
    thread = store.deliveries.thread_of("r1")
    assert thread is not None
    bot(slack).post(fix, thread=thread)  # ...and it landed, never recorded
    restarted = Outbox(store, bot(slack), group_wait_s=0.0, landing_s=0.0)
    assert restarted.recover() == 1 and restarted.deliver_pending() == 0
    replies = [p.text_of_blocks() for p in slack.calls("chat.postMessage")[1:]]
    assert len(replies) == 2 and "*Resolved*" in replies[0] and "*Corrected*" in replies[1]
    assert store.deliveries.undelivered() == [] and store.deliveries.made()[("r1", "corrected")] == thread


def test_a_store_error_while_a_withdrawal_is_taken_loses_nothing_behind_it(slack, store, monkeypatch):
    """The outbox takes what the worker handed over in one go; a store error part way (recording a
    withdrawn opening as handled) leaves the rest for the next pass, not dropped until a restart."""
    now = [1000.0]
    first, other = alert(alert_id="w1"), alert(alert_id="x1", tags={"team": "vision"})
    withdrawn = msgspec.structs.replace(alert("resolved", alert_id="w1", waste_usd=0.0), resolved_at=T0 + 1770,
                                        details={"gpu_count": 8, "reason": "withdrawn"})  # fmt: skip
    store.alerts.record([first, other], version=1)
    store.alerts.record([withdrawn], version=2)
    outbox = Outbox(store, bot(slack), group_wait_s=2.0, clock=lambda: now[0])
    outbox.add([first])
    outbox.deliver_pending()  # w1 waits for company
    record_many, failures = store.deliveries.record_many, [1]

    def failing(rows):
        if failures:
            failures.pop()
            raise ConnectionError("the store went away")
        record_many(rows)

    monkeypatch.setattr(store.deliveries, "record_many", failing)
    outbox.add([withdrawn, other])
    with pytest.raises(ConnectionError):
        outbox.deliver_pending()
    now[0] += 5.0
    outbox.deliver_pending()
    posts = slack.calls("chat.postMessage")
    assert len(posts) == 1 and "x1" in posts[0].text_of_blocks() and len(outbox) == 0


def test_webhook(slack):
    SlackNotifier(webhook_url=slack.webhook_url).post(alert())
    (hook,) = slack.calls("webhook")
    assert "gpu-host-007" in hook.text_of_blocks()


def test_a_webhooks_messages_carry_no_buttons(slack):
    """An incoming webhook's message is never recorded by its ts (the webhook does not say it), so no click
    on it can be matched to its alerts; its buttons (a group's acted on its head alone) are left out, as
    the README says: a webhook has no threads, buttons, edits or charts."""
    notifier = SlackNotifier(webhook_url=slack.webhook_url)
    notifier.post(alert())
    notifier.post_group([alert(alert_id="g0"), alert(alert_id="g1")])
    for hook in slack.calls("webhook"):
        assert not any(b["type"] == "actions" for b in hook.blocks), hook.blocks
    assert "alert `g1`" in slack.calls("webhook")[-1].text_of_blocks()


def test_a_throttled_post_says_its_channel_and_the_wait_for_the_outbox_to_pace_it(slack):
    """An alert's post answered 429 is not waited out in the call (that would hold every channel's alerts):
    the error names the channel and Slack's Retry-After, and nothing was posted."""
    slack.fail_next(1, status=429, retry_after=7)
    with pytest.raises(SlackError) as info:
        bot(slack).post(alert(channel="#nlp-cost"))
    assert info.value.retryable and info.value.throttled == "#nlp-cost" and info.value.retry_after_s == 7
    assert slack.calls("chat.postMessage") == []  # a refused post is not a post
    bot(slack).post(alert(channel="#nlp-cost"))
    assert len(slack.calls("chat.postMessage")) == 1


@pytest.mark.parametrize(("header", "wait"), [(None, 1.0), ("0", 1.0), ("abc", 1.0), ("nan", 1.0), ("86400", 300.0),
                                               ("2.5", 2.5)])  # fmt: skip
def test_a_retry_after_is_read_within_bounds(slack, header, wait):
    """A Retry-After that is not a number, none, or days long: a second, or at most five minutes."""
    slack.fail_next(1, status=429, retry_after=header)
    with pytest.raises(SlackError) as info:
        bot(slack).post(alert())
    assert info.value.retry_after_s == wait


def test_other_calls_still_wait_out_a_429(slack):
    """Edits, charts and look-ups keep slack-sdk's own retry after Retry-After: only the alerts' posts are paced."""
    notifier = bot(slack)
    channel, ts = notifier.post(alert())
    slack.fail_next(1, status=429, retry_after=1, method="chat.update")
    notifier.edit(alert(), (channel, ts))
    assert len(slack.calls("chat.update")) == 1


def test_server_errors_are_retryable_and_client_errors_are_not(slack):
    slack.fail_next(3, status=500)
    with pytest.raises(SlackError) as info:
        bot(slack).post(alert())
    assert info.value.retryable
    slack.fail_next(1, status=404)
    with pytest.raises(SlackError) as info:
        bot(slack).post(alert())
    assert not info.value.retryable


def test_outbox_survives_an_outage_and_a_restart_without_double_posting(slack, store):
    """Slack down: nothing is lost. Worker restart: nothing is posted twice."""
    other = alert(alert_id="a2", tags={"team": "vision", "owner": "dana", "project": "det"})  # another team's
    opened, resolved = alert(), alert("resolved")
    store.alerts.record([opened, other], version=1)
    outbox = Outbox(store, bot(slack), group_wait_s=0)
    outbox.add([opened, other])
    slack.fail_next(3, status=503)  # the first try and both of slack-sdk's retries fail
    with pytest.raises(SlackError):
        outbox.deliver_pending()
    assert len(outbox) == 2 and slack.calls("chat.postMessage") == []

    assert outbox.deliver_pending() == 2  # Slack is back
    store.alerts.record([resolved], version=2)
    # The worker dies before delivering the resolution; a new one rebuilds the outbox from the store.
    restarted = Outbox(store, bot(slack), group_wait_s=0)
    assert restarted.recover() == 1
    assert restarted.deliver_pending() == 1
    assert Outbox(store, bot(slack)).recover() == 0
    posts = slack.calls("chat.postMessage")
    assert len(posts) == 3
    assert posts[0].body.get("thread_ts") is None and posts[1].body.get("thread_ts") is None
    assert posts[2].body["thread_ts"] == "1700000000.000001"  # the resolution threads under a1's opening


def test_alert_manager_remembers_across_a_restart(store):
    """Findings re-derived after a restart neither re-open nor re-resolve an alert."""
    from detector.alerts import AlertManager, AlertMemory
    from detector.detectors import Finding, ResourceInfo

    def finding(action: str, at: float) -> Finding:
        return Finding(action=action, rule="idle-gpu", type="idle_gpu", resource_id="h1", episode_start=T0,
                       fired_at=T0 + 1800, at=at, waste_usd=1.0, usd_per_hour=2.0, severity="warning",
                       resource=ResourceInfo(resource_id="h1"))  # fmt: skip

    first = AlertManager()
    changes = first.handle([finding("fire", T0 + 1800), finding("fire", T0 + 1800), finding("resolve", T0 + 3600)])
    assert [a.change for a in changes] == ["fired", "resolved"]
    store.alerts.record(changes, version=1)
    restarted = AlertManager(AlertMemory.load(store.memory))
    assert restarted.handle([finding("fire", T0 + 1800), finding("resolve", T0 + 3600)]) == []


def untagged(alert_id: str, account: str, rid: str, fired_at: float = T0 + 3600, change: str = "fired") -> Alert:
    resolved = change == "resolved"
    return Alert(alert_id=alert_id, type="untagged", rule="untagged", resource_id=rid,
                 status="resolved" if resolved else "firing", change=change, severity="info", episode_start=T0,
                 fired_at=fired_at, updated_at=fired_at, resolved_at=fired_at + 600 if resolved else None,
                 waste_usd=12.5, usd_per_hour=6.0, resource_type="gpu_instance", account=account,
                 region="us-east-1", details={"missing_tags": ["team", "project"],
                                              **({"reason": "tags_added"} if resolved else {})})  # fmt: skip


def test_untagged_resources_of_one_account_are_one_message(slack, store):
    now = [100.0]
    outbox = Outbox(store, bot(slack), group_wait_s=2.0, clock=lambda: now[0])
    acct_a = [untagged(f"u{i}", "ml-prod", f"host-{i}") for i in range(5)]
    acct_b = [untagged(f"v{i}", "ml-dev", f"nb-{i}") for i in range(2)]
    late = untagged("u9", "ml-prod", "host-9", fired_at=T0 + 7200)  # an hour later: its own message
    outbox.add([acct_a[0], alert(), *acct_a[1:3], *acct_b, *acct_a[3:], late])
    assert outbox.deliver_pending() == 0 and outbox.hold_s == pytest.approx(2.0)  # collecting the group
    assert slack.calls("chat.postMessage") == []
    now[0] += 2.5
    assert outbox.deliver_pending() == 4  # ml-prod's five, the idle alert, ml-dev's two, the late one
    posts = slack.calls("chat.postMessage")
    texts = [p.text_of_blocks() for p in posts]
    assert "5 resources in ml-prod" in texts[0] and all(f"host-{i}" in texts[0] for i in range(5))
    assert "$30.00/h" in texts[0] and "$62.50" in texts[0]  # the group's rate and spend
    assert "gpu-host-007" in texts[1] and "2 resources in ml-dev" in texts[2] and "host-9" in texts[3]
    deliveries = store.deliveries.made()
    assert {deliveries[(f"u{i}", "fired")] for i in range(5)} == {("#ml-cost", posts[0].response["ts"])}
    # One resource gets its tags: a reply in the group's thread, and the group message is not rewritten.
    outbox.add([untagged("u2", "ml-prod", "host-2", change="resolved")])
    outbox.deliver_pending()
    reply = slack.calls("chat.postMessage")[-1]
    assert reply.body["thread_ts"] == posts[0].response["ts"] and "tags added" in reply.text_of_blocks()
    assert slack.calls("chat.update") == []
    # After a restart, the outbox still knows that message is a group's.
    restarted = Outbox(store, bot(slack))
    restarted.recover()
    restarted.add([untagged("u3", "ml-prod", "host-3", change="resolved")])
    restarted.deliver_pending()
    assert slack.calls("chat.update") == [] and slack.calls("chat.postMessage")[-1].body["thread_ts"] == posts[0].response["ts"]


def test_an_opening_waiting_for_company_holds_up_no_other_incidents_change(slack, store):
    """The wait for company (``BURNWATCH_SLACK_GROUP_WAIT_S``, 30 s in the worker) is an opening's own: another
    team's resolution queued behind it goes out now, not when the group is due (until 2026-12-08 the queue stopped
    at the first opening still collecting, so every change behind it waited up to the whole 30 s). The waiting
    opening's own resolution still follows it."""
    now = [1000.0]
    vision = {"team": "vision", "owner": "bob", "project": "cv"}
    outbox = Outbox(store, bot(slack), group_wait_s=30.0, clock=lambda: now[0])
    outbox.add([alert(alert_id="p1", tags=vision)])
    now[0] += 31.0
    assert outbox.deliver_pending() == 1  # p1's opening, its wait over
    outbox.add([alert(alert_id="w1"), alert("resolved", alert_id="p1", tags=vision), alert("resolved", alert_id="w1")])
    assert outbox.deliver_pending() == 1 and outbox.hold_s == pytest.approx(30.0)  # p1's resolution; w1 collects
    posts = slack.calls("chat.postMessage")
    assert len(posts) == 2 and posts[1].body["thread_ts"] == posts[0].response["ts"] and len(outbox) == 2
    now[0] += 10.0
    outbox.add([alert(alert_id="x1", tags={"team": "infra"})])  # another group collecting, due 10 s after w1's
    assert outbox.deliver_pending() == 0 and outbox.hold_s == pytest.approx(20.0)  # the sooner: w1's
    now[0] += 21.0
    assert outbox.deliver_pending() == 2 and outbox.hold_s == pytest.approx(9.0)  # w1's opening, its resolution
    posts = slack.calls("chat.postMessage")
    assert "thread_ts" not in posts[2].body and posts[3].body["thread_ts"] == posts[2].response["ts"]
    assert "w1" in posts[2].text_of_blocks() and len(outbox) == 1
    now[0] += 10.0
    assert outbox.deliver_pending() == 1 and "x1" in slack.calls("chat.postMessage")[4].text_of_blocks()


def test_growing_dollars_are_shown_while_an_opening_waits_for_company(slack, store):
    """An opening collecting its group for 30 s stops no incident's cost edit (until 2026-12-08 the pass
    returned before the edits, so a storm of openings, one group collecting after another, kept every open
    incident's dollars as they were for as long as it lasted)."""
    now = [1000.0]
    outbox = Outbox(store, bot(slack), group_wait_s=30.0, clock=lambda: now[0])
    outbox.add([alert(alert_id="p1", tags={"team": "vision"})])
    now[0] += 31.0
    assert outbox.deliver_pending() == 1
    outbox.add([alert(alert_id="w1"), alert("updated", alert_id="p1", tags={"team": "vision"}, waste_usd=20.0)])
    assert outbox.deliver_pending() == 0 and outbox.hold_s == pytest.approx(30.0)  # w1 collects
    (update,) = slack.calls("chat.update")
    assert "$20.00" in update.text_of_blocks()


def test_growing_dollars_edit_the_message_at_most_once_a_minute(slack, store):
    now = [0.0]
    outbox = Outbox(store, bot(slack), group_wait_s=0, edit_every_s=60.0, clock=lambda: now[0])
    outbox.add([alert()])
    outbox.deliver_pending()
    parent = slack.calls("chat.postMessage")[0].response["ts"]
    for k, usd in enumerate((20.0, 25.0, 30.0)):  # three cost updates within the minute
        outbox.add([alert("updated", waste_usd=usd, updated_at=T0 + 1800 + 900 * (k + 1))])
        outbox.deliver_pending()
        now[0] += 10
    edits = slack.calls("chat.update")
    assert len(edits) == 1 and "$20.00" in edits[0].text_of_blocks() and edits[0].body["ts"] == parent
    assert outbox.hold_s == pytest.approx(40.0)  # at the last pass (20 s in), the next edit was 40 s away
    now[0] += 30
    outbox.deliver_pending()
    edits = slack.calls("chat.update")
    assert len(edits) == 2 and "$30.00" in edits[1].text_of_blocks()  # the latest figure, not each one
    outbox.add([alert("updated", waste_usd=35.0), alert("resolved")])  # a pending edit gives way to the resolution
    now[0] += 120
    outbox.deliver_pending()
    assert len(slack.calls("chat.update")) == 3 and "Resolved" in slack.calls("chat.update")[-1].text_of_blocks()


def test_openings_of_one_type_and_team_within_two_minutes_are_one_message(slack, store):
    def idle(alert_id: str, team: str, fired_at: float) -> Alert:
        return alert(alert_id=alert_id, fired_at=fired_at, tags={"team": team, "owner": "x", "project": "p"})

    outbox = Outbox(store, bot(slack), group_wait_s=0)
    outbox.add([idle("n1", "nlp", T0 + 1800), idle("n2", "nlp", T0 + 1830), idle("v1", "vision", T0 + 1830),
                idle("n3", "nlp", T0 + 1900), idle("n4", "nlp", T0 + 1800 + 600)])  # fmt: skip
    outbox.deliver_pending()
    texts = [p.text_of_blocks() for p in slack.calls("chat.postMessage")]
    assert len(texts) == 3
    assert "3 resources of team nlp" in texts[0] and all(f"alert `n{i}`" in texts[0] for i in (1, 2, 3))
    assert "$98.31/h" in texts[0]  # the three hosts' rate together
    assert "alert `v1`" in texts[1] and "alert `n4`" in texts[2]  # another team; ten minutes later


def test_a_post_that_timed_out_but_landed_is_not_posted_again(slack, store):
    """Slack took the message but the answer never came: the outbox looks before re-posting."""
    notifier = SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=1)
    outbox = Outbox(store, notifier, group_wait_s=0, landing_s=0)  # the test waits for the landing itself
    outbox.add([alert()])
    slack.hang(1.5)
    with pytest.raises(SlackError) as info:
        outbox.deliver_pending()
    assert info.value.retryable and info.value.maybe_posted
    slack.hang(0)
    assert slack.wait_for(lambda reqs: any(r.method == "chat.postMessage" for r in reqs), timeout=10)
    outbox.deliver_pending()
    assert len(slack.calls("chat.postMessage")) == 1  # found in the channel's history, not re-posted
    assert store.deliveries.made()[("a1", "fired")] == ("#ml-cost", slack.calls("chat.postMessage")[0].response["ts"])
    outbox.add([alert("resolved")])
    outbox.deliver_pending()
    assert slack.calls("chat.postMessage")[-1].body["thread_ts"] == slack.calls("chat.postMessage")[0].response["ts"]


def _group_post_timed_out_but_landed(slack, store, members: list[Alert]) -> Outbox:
    """``members`` opened together; their post times out on the outbox's side but lands in Slack, and the next
    pass looks for them there. The outbox, for what follows."""
    notifier = SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=1)
    outbox = Outbox(store, notifier, group_wait_s=0, landing_s=0)
    store.alerts.record(members, version=1)
    outbox.add(members)
    slack.hang(1.5)
    with pytest.raises(SlackError):
        outbox.deliver_pending()
    slack.hang(0)
    assert slack.wait_for(lambda reqs: any(r.method == "chat.postMessage" for r in reqs), timeout=10)
    outbox.deliver_pending()
    return outbox


def test_a_group_message_that_timed_out_but_landed_is_not_edited_for_one_member(slack, store):
    """A group's message found in Slack after its post timed out is a group's: a member's resolution
    replies in its thread and leaves the message listing the others as it is (it was edited to show
    that member alone when the members were found one by one)."""
    members = [alert(alert_id=f"g{i}", fired_at=T0 + 1800 + 30 * i) for i in range(2)]
    outbox = _group_post_timed_out_but_landed(slack, store, members)
    (group,) = slack.calls("chat.postMessage")
    assert "alert `g0`" in group.text_of_blocks() and "alert `g1`" in group.text_of_blocks()
    outbox.add([alert("resolved", alert_id="g0", fired_at=T0 + 1800)])
    outbox.deliver_pending()
    reply = slack.calls("chat.postMessage")[-1]
    assert reply.body["thread_ts"] == group.response["ts"] and slack.calls("chat.update") == []


def test_a_large_group_whose_post_timed_out_but_landed_posts_no_member_twice(slack, store):
    """150 untagged resources of one account fire together (a first day). Their one message named the first
    ~100 alert ids (the rest cut to "48 more"), so after its post timed out but landed the other 48 were not
    found in the channel and were posted again; and each member was looked for with its own
    ``conversations.history``, 150 reads at once, a burst Slack rate-limits (a read refused counts as not
    found: posted again). A group message holds at most MAX_GROUP openings, every one named, and the
    members in doubt are looked for in one read."""
    members = [untagged(f"{i:016x}", "ml-prod", f"host-{i}") for i in range(150)]  # ids as long as real ones
    _group_post_timed_out_but_landed(slack, store, members)
    posts = slack.calls("chat.postMessage")
    opened = [int(p.body["text"].split(": ")[1].split()[0]) for p in posts]  # "Untagged spend: 100 resources in..."
    assert sum(opened) == 150, opened  # 150 and 48 before: 48 resources opened twice
    assert [sum(f"alert `{m.alert_id}`" in p.text_of_blocks() for p in posts) for m in members] == [1] * 150
    assert len(slack.calls("conversations.history")) == 1 and store.deliveries.undelivered() == []


def test_a_post_that_timed_out_and_never_landed_is_posted(slack, store):
    notifier = SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=1)
    outbox = Outbox(store, notifier, group_wait_s=0)
    outbox.add([alert()])
    slack.fail_next(3, status=503)  # not a timeout: Slack said no, so nothing landed
    with pytest.raises(SlackError) as info:
        outbox.deliver_pending()
    assert not info.value.maybe_posted
    outbox.deliver_pending()
    assert len(slack.calls("chat.postMessage")) == 1 and slack.calls("conversations.history") == []


def test_a_resolution_whose_parent_edit_fails_is_not_replied_twice(slack, store):
    """The reply in the thread is the resolution's delivery: when the edit of the parent that
    follows it fails, the delivery stands (the reply is not sent again on retry)."""
    outbox = Outbox(store, bot(slack), group_wait_s=0)
    outbox.add([alert()])
    outbox.deliver_pending()
    slack.fail_next(5, status=500, method="chat.update")  # slack-sdk's own retries included
    outbox.add([alert("resolved")])
    outbox.deliver_pending()
    outbox.deliver_pending()
    replies = [p for p in slack.calls("chat.postMessage") if "thread_ts" in p.body]
    assert len(replies) == 1 and store.deliveries.undelivered() == []


def test_an_edit_slack_refuses_for_good_holds_up_neither_the_other_edits_nor_the_posts(slack, store):
    """Someone deleted an incident's message in Slack: its cost update's ``chat.update`` is refused
    (``message_not_found``, for good). It was raised as a retry every pass, forever, so the other
    incidents' edits behind it never went out and every post waited on the backoff. The refused edit is
    dropped (its later updates with it); the rest go on, and the resolution still replies."""
    now = [0.0]
    outbox = Outbox(store, bot(slack), group_wait_s=0, edit_every_s=60.0, clock=lambda: now[0])
    vision = {"team": "vision", "owner": "dana", "project": "det"}  # another team: its own message
    outbox.add([alert(), alert(alert_id="b1", tags=vision)])
    outbox.deliver_pending()
    deleted, kept = (p.response["ts"] for p in slack.calls("chat.postMessage"))
    slack.fail_next(1, status=200, method="chat.update", body=b'{"ok": false, "error": "message_not_found"}')
    outbox.add([alert("updated", waste_usd=20.0), alert("updated", alert_id="b1", waste_usd=20.0, tags=vision)])
    outbox.deliver_pending()  # raised SlackError before
    assert [u.body["ts"] for u in slack.calls("chat.update")] == [kept]
    now[0] += 61
    outbox.add([alert("updated", waste_usd=25.0), alert(alert_id="c1", tags={"team": "infra"})])
    assert outbox.deliver_pending() == 1 and not outbox.has_work
    assert [u.body["ts"] for u in slack.calls("chat.update")] == [kept]  # the deleted message is not tried again
    outbox.add([alert("resolved")])
    outbox.deliver_pending()
    assert slack.calls("chat.postMessage")[-1].body["thread_ts"] == deleted


def test_a_group_of_forecasts_says_what_they_save_not_what_was_spent_so_far():
    """wrong_region's dollars are a month's saving to come: a group of them (a team's p4d fleet in
    Tokyo fires together) lists each with its facts, never "$8,460 so far" or "$0.00 spent"."""
    def dear(alert_id: str) -> Alert:
        return Alert(
            alert_id=alert_id, type="wrong_region", rule="wrong-region", resource_id=f"gpu-{alert_id}",
            status="firing", change="fired", severity="info", episode_start=T0, fired_at=T0 + 7 * 86_400,
            updated_at=T0 + 7 * 86_400, waste_usd=8460.74, usd_per_hour=12.138, resource_type="gpu_instance",
            account="ml-prod", region="ap-northeast-1", tags={"team": "nlp"},
            details={"region": "ap-northeast-1", "suggested_region": "us-east-1", "net_monthly_usd": 8460.74,
                     "monthly_saving_usd": 8860.74, "move_usd": 400.0},
        )  # fmt: skip

    group = str(render_group([dear("a"), dear("b")]))
    assert "so far" not in group and "spent" not in group
    assert group.count("net saving $8,461 a month after moving") == 2


@pytest.mark.parametrize("error", ["invalid_auth", "token_revoked"])
def test_a_refused_token_keeps_every_post_waiting_until_it_is_fixed(slack, store, error):
    """A revoked or rotated bot token: Slack answers ``ok: false, invalid_auth``, which was a permanent
    refusal, so every alert opened until the token was fixed was dropped. It is retried, kept in the
    outbox (and in the store across a restart), and posted once the token works."""
    outbox = Outbox(store, bot(slack), group_wait_s=0)
    store.alerts.record([alert()], version=1)
    outbox.add([alert()])
    slack.fail_next(2, status=200, method="chat.postMessage", body=f'{{"ok": false, "error": "{error}"}}'.encode())
    for _ in range(2):
        with pytest.raises(SlackError) as refused:
            outbox.deliver_pending()
        assert refused.value.retryable and f"Slack refused the token ({error})" in str(refused.value)
    assert store.deliveries.undelivered() == [("a1", "fired")]  # kept for a restart too
    outbox.deliver_pending()  # the token fixed
    assert len(slack.calls("chat.postMessage")) == 1 and store.deliveries.undelivered() == []


@pytest.mark.parametrize("refusal", ["not_in_channel", "channel_not_found", "is_archived"])
def test_an_opening_a_routed_channel_refuses_goes_to_the_default_channel_saying_why(slack, refusal):
    """A team's channel the app was never invited to (the commonest first-day mistake), misspelt, or archived: the
    opening goes to SLACK_CHANNEL with a line naming the channel, Slack's answer and the fix, and its resolution
    replies in that thread. Before, Slack's refusal was one for good: each of the team's alerts was logged and posted
    nowhere."""
    notifier = bot(slack)
    slack.fail_next(1, 200, method="chat.postMessage", body=f'{{"ok": false, "error": "{refusal}"}}'.encode())
    channel, parent = notifier.post(alert(channel="#nlp-cost"))
    (posted,) = slack.calls("chat.postMessage")  # (the local Slack records only what it took)
    assert posted.body["channel"] == "#ml-cost" == channel and parent
    text = posted.text_of_blocks()
    assert f"Meant for #nlp-cost, which Slack refused ({refusal})" in text and "Posted here meanwhile" in text
    assert "gpu-host-007" in text and "$32.77/h" in text and posted.blocks[0]["type"] == "header"
    notifier.post(alert("resolved", channel="#nlp-cost"), thread=(channel, parent))
    reply = slack.calls("chat.postMessage")[-1]
    assert (reply.body["channel"], reply.body["thread_ts"]) == ("#ml-cost", parent)
    # said on /healthz (slack_refusing) and its gauge until the channel takes a post (the app invited)
    assert list(notifier.refusing) == ["#nlp-cost"] and notifier.refusing["#nlp-cost"].startswith(refusal)
    assert notifier.post(alert(alert_id="a2", channel="#nlp-cost"))[0] == "#nlp-cost" and notifier.refusing == {}


def test_the_default_channel_refusing_is_still_a_refusal(slack):
    """SLACK_CHANNEL itself refused: nowhere else to go, a refusal for good as before (logged, not retried)."""
    slack.fail_next(1, 200, method="chat.postMessage", body=b'{"ok": false, "error": "not_in_channel"}')
    notifier = bot(slack)
    with pytest.raises(SlackError) as caught:
        notifier.post(alert())
    assert not caught.value.retryable and "not_in_channel" in str(caught.value)
    assert slack.calls("chat.postMessage") == []  # not posted again (the refusal was the one answer of its kind)
    assert list(notifier.refusing) == ["#ml-cost"] and "/invite @burnwatch" in notifier.refusing["#ml-cost"]
    notifier.post(alert(alert_id="a2"))  # the app invited
    assert notifier.refusing == {}


def test_the_default_channel_refusing_a_routed_ones_alert_is_said_of_both(slack):
    """The routed channel refused, and so did SLACK_CHANNEL, where its alert went instead: both are refusing."""
    notifier = bot(slack)
    slack.fail_next(2, 200, method="chat.postMessage", body=b'{"ok": false, "error": "is_archived"}')
    with pytest.raises(SlackError):
        notifier.post(alert(channel="#nlp-cost"))
    assert sorted(notifier.refusing) == ["#ml-cost", "#nlp-cost"]
    notifier.post(alert(alert_id="a2", channel="#vision-cost"))  # another routed channel's post says nothing of it
    assert sorted(notifier.refusing) == ["#ml-cost", "#nlp-cost"]
    notifier.post(alert(alert_id="a3"))
    assert list(notifier.refusing) == ["#nlp-cost"]  # SLACK_CHANNEL takes posts again; the routed one not known


def test_an_opening_posted_to_the_default_channel_and_in_doubt_is_found_there(slack, store):
    """The routed channel refused the app, so the opening went to SLACK_CHANNEL; the worker died before
    recording it (or the post timed out after Slack took it). The next worker looked for it in the routed
    channel alone, where it is not (and which a real Slack will not even let it read), and posted it again:
    a second message, and a second refusal note, for one alert. It is looked for in SLACK_CHANNEL too."""
    opened = alert(alert_id="r1", channel="#nlp-cost")
    store.alerts.record([opened], version=1)
    store.deliveries.record_attempt(["r1"], "fired")  # begun...
    slack.fail_next(1, 200, method="chat.postMessage", body=b'{"ok": false, "error": "not_in_channel"}')
    landed = bot(slack).post(opened)  # ...and it landed in #ml-cost, never recorded
    assert landed[0] == "#ml-cost"
    restarted = Outbox(store, bot(slack), group_wait_s=0.0, landing_s=0.0)
    restarted.recover()
    restarted.deliver_pending()
    assert len(slack.calls("chat.postMessage")) == 1, [p.body["channel"] for p in slack.calls("chat.postMessage")]
    assert store.deliveries.made()[("r1", "fired")] == landed and store.deliveries.undelivered() == []


def test_slack_set_up_on_a_store_with_history_posts_the_open_incidents_not_the_history(slack, store):
    """The worker ran without Slack for a while (its alerts in ClickHouse alone), then SLACK_BOT_TOKEN was set: the
    incidents still open are posted, and those closed before are not (their openings and resolutions, a day's
    history in a burst, stale). Before, every alert the store held was posted at that start, in order. A store that
    has posted to Slack before owes its undelivered changes as ever; the history is left alone once."""
    closed, open_ = alert("resolved", alert_id="c1"), alert(alert_id="o1")
    store.alerts.record([alert(alert_id="c1")], version=1)
    store.alerts.record([closed, open_], version=2)
    outbox = Outbox(store, bot(slack), group_wait_s=0.0)
    assert outbox.recover() == 1
    outbox.deliver_pending()
    (posted,) = slack.calls("chat.postMessage")
    assert "alert `o1`" in posted.text_of_blocks()
    store.alerts.record([alert("resolved", alert_id="o1")], version=3)  # the open one resolves: replied in its thread
    store.alerts.record([alert(alert_id="n1")], version=4)  # a new one while the worker is down: owed
    again = Outbox(store, bot(slack), group_wait_s=0.0)
    assert again.recover() == 2
    again.deliver_pending()
    later = slack.calls("chat.postMessage")[1:]
    assert sorted(p.body.get("thread_ts", "") for p in later) == ["", posted.response["ts"]]  # a reply, an opening
    assert any("alert `n1`" in p.text_of_blocks() for p in later if "thread_ts" not in p.body)


class _RowsRead:
    """The store's real ClickHouse client, counting the rows its queries bring into Python."""

    def __init__(self, client) -> None:
        self._client = client
        self.rows = 0

    def query(self, *args, **kwargs):
        result = self._client.query(*args, **kwargs)
        if not str(args[0]).startswith("DESCRIBE"):  # (an insert's column types)
            self.rows += len(result.result_rows)
        return result

    def __getattr__(self, name):
        return getattr(self._client, name)


def test_slack_set_up_on_a_store_of_many_alerts_marks_the_history_in_the_store(chdb_client, store):
    """The history is marked by the store, not read into the worker and written back: a store of millions of
    closed alerts brought every one (and its changes, two rows or three) into Python at the first recovery with
    Slack, gigabytes of rows the worker held before its first post, in the rebalance's assignment."""
    store.alerts.record([alert("resolved", alert_id=f"c{i}") for i in range(200)], version=1)
    store.alerts.record([alert(alert_id="o1")], version=1)
    from detector.delivery import UNROUTED
    from detector.store import Store

    counted = _RowsRead(chdb_client)
    assert Store(counted, store.db).deliveries.start_slack(UNROUTED) == 400
    assert counted.rows <= 3, counted.rows  # the checks and the count, not the alerts
    made = store.deliveries.made()
    assert len(made) == 400 and made[("c7", "resolved")] == UNROUTED and ("o1", "fired") not in made


def test_a_post_slack_refuses_for_good_is_not_tried_again_at_each_restart(slack, store):
    """SLACK_CHANNEL refuses the app (not invited), or a message is refused (invalid_blocks): the refusal is
    recorded, so a restart or a rebalance does not try the post again, nor every such post of the store's history at
    each one (until fixed, then all of them in a burst), and the alert's resolution, with no thread to reply in, is
    not tried either. Before, a refusal was logged and dropped: the outbox's recovery found it undelivered at every
    restart."""
    assert Outbox(store, bot(slack), group_wait_s=0.0).recover() == 0  # Slack set up on this store
    store.alerts.record([alert(alert_id="r1")], version=1)
    outbox = Outbox(store, bot(slack), group_wait_s=0.0)
    outbox.add([alert(alert_id="r1")])
    slack.fail_next(1, 200, method="chat.postMessage", body=b'{"ok": false, "error": "not_in_channel"}')
    assert outbox.deliver_pending() == 0 and slack.calls("chat.postMessage") == []
    assert store.deliveries.undelivered() == []
    restarted = Outbox(store, bot(slack), group_wait_s=0.0)
    assert restarted.recover() == 0
    store.alerts.record([alert("resolved", alert_id="r1")], version=2)
    restarted.add([alert("resolved", alert_id="r1")])
    restarted.deliver_pending()
    assert slack.calls("chat.postMessage") == [] and store.deliveries.undelivered() == []
    store.alerts.record([alert(alert_id="r2")], version=3)  # once fixed, new alerts are posted
    restarted.add([alert(alert_id="r2")])
    restarted.deliver_pending()
    (posted,) = slack.calls("chat.postMessage")
    assert "alert `r2`" in posted.text_of_blocks()


def test_a_resolution_queued_behind_its_refused_opening_is_recorded_refused_not_posted(slack, store):
    """A backlog brings an alert's opening and resolution in one batch, and Slack refuses the opening for good:
    the resolution, already queued, has no thread to reply in either, and is recorded as refused as a later one is.
    Before, it was sent with the marker for a thread: a chat.postMessage to channel '' in thread 'refused' (Slack's
    channel_not_found, one more refusal logged), and through a webhook the orphan 'resolved' message of an
    incident no one was told of."""
    assert Outbox(store, bot(slack), group_wait_s=0.0).recover() == 0
    store.alerts.record([alert(alert_id="q1"), alert("resolved", alert_id="q1")], version=1)
    outbox = Outbox(store, bot(slack), group_wait_s=0.0)
    outbox.add([alert(alert_id="q1"), alert("resolved", alert_id="q1")])
    slack.fail_next(1, 200, method="chat.postMessage", body=b'{"ok": false, "error": "invalid_blocks"}')
    assert outbox.deliver_pending() == 0
    assert slack.calls("chat.postMessage") == [] and outbox.failed == 1
    made = store.deliveries.made()
    assert made[("q1", "fired")] == made[("q1", "resolved")] == ("", "refused")
    assert store.deliveries.undelivered() == []


def test_openings_refused_while_the_app_was_not_invited_are_posted_once_it_is(slack, store):
    """SLACK_CHANNEL refused the app (not invited) while incidents opened: their openings were recorded refused, and
    once the app was invited they stayed out of Slack for good, however long they burned on (only new ones were
    posted). Now the first post SLACK_CHANNEL takes brings those of incidents still open, as they stand, oldest first;
    one that has resolved meanwhile stays out, and nothing is posted twice, at that pass or after a restart."""
    assert Outbox(store, bot(slack), group_wait_s=0.0).recover() == 0  # Slack set up on this store
    refused = [alert(alert_id=f"r{i}", fired_at=T0 + 1800 + 300 * i) for i in range(3)]  # apart: not one group
    store.alerts.record(refused, version=1)
    notifier = bot(slack)
    outbox = Outbox(store, notifier, group_wait_s=0.0)
    outbox.add(refused)
    slack.fail_next(3, 200, method="chat.postMessage", body=b'{"ok": false, "error": "not_in_channel"}')
    assert outbox.deliver_pending() == 0 and slack.calls("chat.postMessage") == []
    assert "#ml-cost" in notifier.refusing
    store.alerts.record([alert("resolved", alert_id="r1")], version=2)  # resolved before the app was invited
    outbox.add([alert("resolved", alert_id="r1")])
    outbox.deliver_pending()
    assert slack.calls("chat.postMessage") == []  # (recorded refused: no thread to reply in)

    store.alerts.record([alert(alert_id="n1", fired_at=T0 + 3600)], version=3)  # the app invited, then a new one
    outbox.add([alert(alert_id="n1", fired_at=T0 + 3600)])
    outbox.deliver_pending()
    posted = [p.text_of_blocks() for p in slack.calls("chat.postMessage")]
    assert [next(i for i in ("n1", "r0", "r2") if f"alert `{i}`" in text) for text in posted] == ["n1", "r0", "r2"]
    made = store.deliveries.made()
    assert made[("r0", "fired")][1] not in ("", "refused") and made[("r1", "fired")] == ("", "refused")
    assert notifier.refusing == {}

    restarted = Outbox(store, bot(slack), group_wait_s=0.0)  # nothing owed, nothing posted again
    restarted.recover()
    store.alerts.record([alert(alert_id="n2", fired_at=T0 + 7200)], version=4)
    restarted.add([alert(alert_id="n2", fired_at=T0 + 7200)])
    restarted.deliver_pending()
    assert len(slack.calls("chat.postMessage")) == 4


def test_a_message_slack_refuses_for_itself_is_tried_again_once_a_start_not_at_every_post(slack, store):
    """An opening refused for what it says (``invalid_blocks``), SLACK_CHANNEL taking other posts: it is tried again
    once a start (at the first pass after SLACK_CHANNEL took a post, here a digest's), never at each post after."""
    assert Outbox(store, bot(slack), group_wait_s=0.0).recover() == 0
    notifier = bot(slack)
    outbox = Outbox(store, notifier, group_wait_s=0.0)
    store.alerts.record([alert(alert_id="bad")], version=1)
    outbox.add([alert(alert_id="bad")])
    slack.fail_next(1, 200, method="chat.postMessage", body=b'{"ok": false, "error": "invalid_blocks"}')
    outbox.deliver_pending()
    assert outbox.failed == 1 and slack.calls("chat.postMessage") == []
    notifier.post(alert(alert_id="digest-stand-in", fired_at=T0))  # SLACK_CHANNEL takes a post outside the outbox
    slack.fail_next(1, 200, method="chat.postMessage", body=b'{"ok": false, "error": "invalid_blocks"}')
    outbox.deliver_pending()  # tried again: refused again
    assert outbox.failed == 2
    for i in range(3):  # then never again, however many posts follow
        store.alerts.record([alert(alert_id=f"ok{i}", fired_at=T0 + 3600 + 300 * i)], version=2 + i)
        outbox.add([alert(alert_id=f"ok{i}", fired_at=T0 + 3600 + 300 * i)])
        outbox.deliver_pending()
    assert len(slack.calls("chat.postMessage")) == 4 and outbox.failed == 2
    assert store.deliveries.made()[("bad", "fired")] == ("", "refused")


def test_an_opening_posted_again_and_killed_before_its_record_is_looked_for_not_posted_twice(slack, store):
    """A refused opening posted again once SLACK_CHANNEL took a post, and the worker killed before that post's record
    was written: the store still said refused, and its mark of the post begun was ignored (the opening was recorded,
    as refused), so the restarted worker posted it a second time at its first post. A post begun after the refusal is
    now in doubt: looked for in Slack first, found there, recorded and not posted again; its resolution replies there."""
    assert Outbox(store, bot(slack), group_wait_s=0.0).recover() == 0
    store.alerts.record([alert(alert_id="r0")], version=1)
    outbox = Outbox(store, bot(slack), group_wait_s=0.0, landing_s=0.0)
    outbox.add([alert(alert_id="r0")])
    slack.fail_next(1, 200, method="chat.postMessage", body=b'{"ok": false, "error": "not_in_channel"}')
    outbox.deliver_pending()
    assert store.deliveries.made()[("r0", "fired")] == ("", "refused")

    class Killed(Exception):
        """The worker died here."""

    real = store.deliveries.record_made

    def dies_at_the_end_of_the_pass(rows):
        if any(row[0] == "r0" and row[1] == "fired" for row in rows):
            raise Killed  # r0's re-post made, its record never written
        real(rows)

    store.deliveries.record_made = dies_at_the_end_of_the_pass  # the app invited, then a new one opens
    store.alerts.record([alert(alert_id="n1", fired_at=T0 + 3600)], version=2)
    outbox.add([alert(alert_id="n1", fired_at=T0 + 3600)])
    with pytest.raises(Killed):
        outbox.deliver_pending()
    store.deliveries.record_made = real
    assert ["n1", "r0"] == [next(i for i in ("n1", "r0") if f"alert `{i}`" in p.text_of_blocks())
                            for p in slack.calls("chat.postMessage")]
    assert store.deliveries.made()[("r0", "fired")] == ("", "refused")

    restarted = Outbox(store, bot(slack), group_wait_s=0.0, landing_s=0.0)
    restarted.recover()
    store.alerts.record([alert(alert_id="n2", fired_at=T0 + 7200)], version=3)
    restarted.add([alert(alert_id="n2", fired_at=T0 + 7200)])
    restarted.deliver_pending()
    restarted.deliver_pending()
    openings = [p for p in slack.calls("chat.postMessage") if "alert `r0`" in p.text_of_blocks()]
    assert len(openings) == 1
    assert store.deliveries.made()[("r0", "fired")][1] == openings[0].response["ts"]
    store.alerts.record([alert("resolved", alert_id="r0")], version=4)
    restarted.add([alert("resolved", alert_id="r0")])
    restarted.deliver_pending()
    reply = slack.calls("chat.postMessage")[-1]
    assert reply.body.get("thread_ts") == openings[0].response["ts"] and "alert `r0`" in reply.text_of_blocks()


def test_openings_refused_are_posted_again_after_the_store_failed_the_pass_that_would_have(slack, store):
    """The pass that was to post the refused openings again could not read them (the store down a moment): it gave
    up its turn first, so they stayed out of Slack until the next start or refusal of SLACK_CHANNEL. Now the next
    pass reads them again."""
    assert Outbox(store, bot(slack), group_wait_s=0.0).recover() == 0
    store.alerts.record([alert(alert_id="r0")], version=1)
    outbox = Outbox(store, bot(slack), group_wait_s=0.0)
    outbox.add([alert(alert_id="r0")])
    slack.fail_next(1, 200, method="chat.postMessage", body=b'{"ok": false, "error": "not_in_channel"}')
    outbox.deliver_pending()

    real = store.deliveries.refused_openings

    def down(*args, **kwargs):
        raise ConnectionError("ClickHouse unavailable")

    store.deliveries.refused_openings = down  # the app invited, a new one opens, the store down meanwhile
    store.alerts.record([alert(alert_id="n1", fired_at=T0 + 3600)], version=2)
    outbox.add([alert(alert_id="n1", fired_at=T0 + 3600)])
    with pytest.raises(ConnectionError):
        outbox.deliver_pending()
    store.deliveries.refused_openings = real
    outbox.deliver_pending()  # the delivery thread's next pass
    posted = [next(i for i in ("n1", "r0") if f"alert `{i}`" in p.text_of_blocks()) for p in slack.calls("chat.postMessage")]
    assert posted == ["n1", "r0"]


def test_openings_a_webhooks_archived_channel_refused_are_posted_once_it_takes_posts(slack, store):
    """Through an incoming webhook whose channel was archived (Slack answers 410 ``channel_is_archived``): the channel
    is on /healthz with the fix, and once it is unarchived the openings refused meanwhile of incidents still open are
    posted, as a bot's are. Before, a webhook's refusal never said so, and they waited for the next start."""
    notifier = SlackNotifier(webhook_url=slack.webhook_url)
    assert Outbox(store, notifier, group_wait_s=0.0).recover() == 0
    outbox = Outbox(store, notifier, group_wait_s=0.0)
    store.alerts.record([alert(alert_id="w1")], version=1)
    outbox.add([alert(alert_id="w1")])
    slack.fail_next(1, 410, body=b"channel_is_archived")
    outbox.deliver_pending()
    assert slack.calls("webhook") == [] and "unarchive" in notifier.refusing["webhook"]
    store.alerts.record([alert(alert_id="w2", fired_at=T0 + 3600)], version=2)  # unarchived, then a new one
    outbox.add([alert(alert_id="w2", fired_at=T0 + 3600)])
    outbox.deliver_pending()
    posted = [re.findall(r"alert `([^`]+)`", h.text_of_blocks()) for h in slack.calls("webhook")]
    assert posted == [["w2"], ["w1"]] and notifier.refusing == {}


def test_an_infinite_retry_after_waits_the_longest(slack):
    """A Retry-After past what a float holds ("inf", "1e999") asks for longer than days: five minutes, not one second."""
    for header in ("inf", "1e999"):
        slack.fail_next(1, status=429, retry_after=header)
        with pytest.raises(SlackError) as info:
            bot(slack).post(alert())
        assert info.value.retry_after_s == 300.0, header


def test_an_actions_message_posted_outside_a_thread_still_waits_out_a_429(slack):
    """Only the alerts' posts are paced by the outbox: an action's message with no thread to reply in (posted
    through the same path) keeps slack-sdk's retry after Retry-After, as before."""
    slack.fail_next(1, status=429, retry_after=1, method="chat.postMessage")
    channel, ts = bot(slack).post_action("#ml-cost", "stopping gpu-host-007", [])
    assert channel == "#ml-cost" and ts and len(slack.calls("chat.postMessage")) == 1


@pytest.mark.parametrize(("header", "waits"), [("2.5", True), ("86400", False), ("31", False)])
def test_an_edit_waits_out_a_short_retry_after_and_fails_a_long_one_at_once(slack, header, waits):
    """slack-sdk's own retry slept whatever Retry-After said, a day included, on the delivery thread every channel's
    alerts wait on, and failed on a fraction: an edit now waits up to 30 s in the call, and past it fails, retryable,
    for the delivery task's backoff."""
    notifier = bot(slack)
    channel, ts = notifier.post(alert())
    slack.fail_next(1, status=429, retry_after=header, method="chat.update")
    started = time.monotonic()
    if waits:
        notifier.edit(alert(), (channel, ts))
        assert len(slack.calls("chat.update")) == 1 and time.monotonic() - started >= 2.5
    else:
        with pytest.raises(SlackError) as info:
            notifier.edit(alert(), (channel, ts))
        assert info.value.retryable and time.monotonic() - started < 10
