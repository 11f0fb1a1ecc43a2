"""Slack buttons: signed requests only, and a click is recorded, shown and (snooze) obeyed."""

from __future__ import annotations

import json
import threading
import time
from urllib.parse import urlencode

import pytest
from slack_sdk.signature import SignatureVerifier

from detector.actions import ActionHandler, RequestVerifier, Unauthorized, parse_click
from detector.delivery import Outbox
from detector.slack import SlackNotifier
from detector.testing import LocalSlack
from tests.test_slack import alert

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
NOW = 1_800_000_000


def click_body(action_id: str = "burnwatch_ack", alert_id: str = "a1", ts: str = "1700000000.000001") -> bytes:
    payload = {"type": "block_actions", "user": {"id": "U123", "username": "alice"},
               "actions": [{"action_id": action_id, "value": alert_id}],
               "channel": {"id": "C42"}, "message": {"ts": ts}}  # fmt: skip
    return urlencode({"payload": json.dumps(payload)}).encode()


def signed(body: bytes, at: int = NOW, secret: str = SECRET) -> dict[str, str]:
    signature = SignatureVerifier(secret).generate_signature(timestamp=str(at), body=body)
    return {"X-Slack-Request-Timestamp": str(at), "X-Slack-Signature": signature}


def verifier() -> RequestVerifier:
    return RequestVerifier(SECRET, clock=lambda: NOW)


def test_a_signed_fresh_request_passes_once():
    v, body = verifier(), click_body()
    v.verify(body, signed(body))
    with pytest.raises(Unauthorized, match="replayed"):
        v.verify(body, signed(body))  # the same signed request again, inside the 5 minutes


class Unlucky(str):
    """A signature header whose hash takes 0.2 s: the thread looking it up among the signatures
    seen yields there, as a thread switch at the worst moment would."""

    def __hash__(self) -> int:
        time.sleep(0.2)
        return str.__hash__(self)


def test_two_copies_of_a_signed_request_at_once_pass_once():
    """The worker verifies clicks on executor threads: two copies of one signed request
    arriving together are one click, the other refused as a replay (without the verifier's
    lock both passed the check before either was remembered)."""
    v, body = verifier(), click_body()
    headers = signed(body)
    headers["X-Slack-Signature"] = Unlucky(headers["X-Slack-Signature"])
    together = threading.Barrier(2)
    outcomes: list[str] = []

    def send() -> None:
        together.wait()
        try:
            v.verify(body, headers)
            outcomes.append("passed")
        except Unauthorized as exc:
            outcomes.append(exc.reason)

    threads = [threading.Thread(target=send) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(outcomes) == ["passed", "replayed request: this signed request was already handled"]


@pytest.mark.parametrize(
    "headers, reason",
    [
        (signed(click_body(), at=NOW - 301), "stale"),  # signed over five minutes ago
        (signed(click_body(), at=NOW + 400), "stale"),  # or claims to come from the future
        (signed(click_body(), secret="not-the-secret"), "does not match"),  # forged
        (signed(click_body(alert_id="other")), "does not match"),  # a signature for another body
        ({}, "missing"),  # no signature at all
        ({"X-Slack-Request-Timestamp": "soon", "X-Slack-Signature": "v0=00"}, "bad timestamp"),
        ({"X-Slack-Request-Timestamp": "\u0661\u0662", "X-Slack-Signature": "v0=00"}, "bad timestamp"),  # int() takes these
        ({"X-Slack-Request-Timestamp": str(NOW), "X-Slack-Signature": "v0=\xe9"}, "not ASCII"),  # compare_digest raised
    ],
    ids=["stale", "future", "forged", "other-body", "unsigned", "bad-timestamp", "arabic-digits", "non-ascii-signature"],
)
def test_refused(headers, reason):
    with pytest.raises(Unauthorized, match=reason):
        verifier().verify(click_body(), headers)


def test_parse_click_names_what_is_wrong():
    assert parse_click(click_body("burnwatch_snooze")).action == "snoozed"
    with pytest.raises(ValueError, match="unknown action"):
        parse_click(click_body("delete_everything"))
    with pytest.raises(ValueError, match="block_actions"):
        parse_click(b"payload=not-json")


@pytest.fixture
def slack():
    with LocalSlack() as server:
        yield server


def handler_for(store, slack):
    notifier = SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=2)
    outbox = Outbox(store, notifier, group_wait_s=0, wall=lambda: NOW)
    return ActionHandler(verifier(), store, notifier, outbox, clock=lambda: NOW), outbox


def test_acknowledge_is_recorded_and_shown_on_the_message(store, slack):
    store.alerts.record([alert()], version=1)
    handler, _ = handler_for(store, slack)
    body = click_body("burnwatch_ack")
    status, answer = handler.handle(body, signed(body))
    assert status == 200 and answer["action"] == "acknowledged"
    (row,) = store.query(f"SELECT * FROM {store.db}.alert_actions")
    assert (row["alert_id"], row["action"], row["user_id"], row["user_name"]) == ("a1", "acknowledged", "U123", "alice")
    (update,) = slack.calls("chat.update")
    assert update.body["channel"] == "C42" and update.body["ts"] == "1700000000.000001"
    assert "Acknowledged by <@U123>" in update.text_of_blocks()
    assert any(b["type"] == "actions" for b in update.blocks)  # still open: the buttons stay


def test_snooze_keeps_the_incident_quiet_and_survives_a_restart(store, slack):
    store.alerts.record([alert()], version=1)
    store.deliveries.record("a1", "fired", "C42", "1700000000.000001")  # the message the button is on
    handler, outbox = handler_for(store, slack)
    body = click_body("burnwatch_snooze")
    assert handler.handle(body, signed(body))[0] == 200
    (row,) = store.query(f"SELECT until, at FROM {store.db}.alert_actions")
    assert (row["until"] - row["at"]).total_seconds() == 86_400
    store.alerts.record([alert("resolved")], version=2)  # stored first, as the worker does
    outbox.add([alert("resolved")])  # resolved while snoozed: recorded, not posted
    outbox.deliver_pending()
    assert slack.calls("chat.postMessage") == []
    restarted = Outbox(store, handler.notifier, wall=lambda: NOW + 60)
    restarted.recover()
    assert len(restarted) == 0  # not posted late after a restart either


def test_unknown_alert_and_bad_payload(store, slack):
    handler, _ = handler_for(store, slack)
    body = click_body(alert_id="nope")
    assert handler.handle(body, signed(body))[0] == 404
    body = b"payload=%7B%7D"
    assert handler.handle(body, signed(body))[0] == 400
    assert handler.handle(body, {})[0] == 401


def test_expected_is_kept_as_feedback_per_rule(store, slack):
    store.alerts.record([alert(), alert(alert_id="a2")], version=1)
    handler, _ = handler_for(store, slack)
    for action_id, alert_id in (("burnwatch_expected", "a1"), ("burnwatch_ack", "a2")):
        body = click_body(action_id, alert_id)
        assert handler.handle(body, signed(body))[0] == 200
    (row,) = store.query(f"SELECT * FROM {store.db}.rule_feedback")
    assert (row["rule"], row["alerts"], row["acknowledged"], row["expected"], row["expected_share"]) == (
        "idle-gpu", 2, 1, 1, 0.5)


def _group_click(action_id: str, block: dict, channel: str, ts: str) -> bytes:
    """A click on a group's button, as Slack sends it: the button's block id and value."""
    button = next(e for e in block["elements"] if e["action_id"] == action_id)
    payload = {"type": "block_actions", "user": {"id": "U123", "username": "alice"},
               "actions": [{"action_id": action_id, "value": button["value"], "block_id": block["block_id"]}],
               "channel": {"id": channel}, "message": {"ts": ts}}  # fmt: skip
    return urlencode({"payload": json.dumps(payload)}).encode()


def _posted_group(store, slack, alert_ids: list[str]):
    """Alerts opened together, posted as one group's message: (handler, outbox, the post, its buttons block)."""
    from tests.test_slack import T0

    members = [alert(alert_id=a, fired_at=T0 + 1800 + 30 * n) for n, a in enumerate(alert_ids)]
    store.alerts.record(members, version=1)
    handler, outbox = handler_for(store, slack)
    outbox.add(members)
    outbox.deliver_pending()
    (group,) = slack.calls("chat.postMessage")
    (buttons,) = [b for b in group.blocks if b["type"] == "actions"]
    return handler, outbox, group, buttons


def test_a_groups_buttons_act_on_every_alert_it_lists(store, slack):
    """A group's message (a team's untagged resources, several idle GPUs opened together) had no buttons:
    nobody could acknowledge or snooze it from Slack. Its buttons act on every alert the message opened,
    and the message, still the group's, shows who did it; a snoozed member's resolution is not posted."""
    from tests.test_slack import T0

    handler, outbox, group, buttons = _posted_group(store, slack, ["g0", "g1", "g2"])
    assert [e["text"]["text"] for e in buttons["elements"]] == ["Acknowledge all", "Snooze all 24h", "Mark all as expected"]
    channel, ts = group.response["channel"], group.response["ts"]
    body = _group_click("burnwatch_snooze", buttons, channel, ts)
    status, answer = handler.handle(body, signed(body))
    assert status == 200 and answer["alerts"] == 3
    rows = store.query(f"SELECT alert_id, action, user_id FROM {store.db}.alert_actions ORDER BY alert_id")
    assert [(r["alert_id"], r["action"], r["user_id"]) for r in rows] == [(f"g{i}", "snoozed", "U123") for i in range(3)]
    (update,) = slack.calls("chat.update")
    shown = update.text_of_blocks()
    assert (update.body["channel"], update.body["ts"]) == (channel, ts)
    assert "Snoozed by <@U123>" in shown and all(f"alert `g{i}`" in shown for i in range(3))  # still the group's
    resolved = alert("resolved", alert_id="g1", fired_at=T0 + 1830)
    store.alerts.record([resolved], version=2)
    outbox.add([resolved])
    outbox.deliver_pending()
    assert len(slack.calls("chat.postMessage")) == 1  # snoozed: its resolution is recorded, not posted


def test_a_groups_message_keeps_its_head_when_a_click_redraws_it(store, slack):
    """The redrawn message is the one posted: its head (whose title, rule and buttons it shows) stays the
    alert the buttons name, not whichever member sorts first by id."""
    handler, _, group, buttons = _posted_group(store, slack, ["z0", "a1", "m2"])
    body = _group_click("burnwatch_ack", buttons, group.response["channel"], group.response["ts"])
    assert handler.handle(body, signed(body))[0] == 200
    (update,) = slack.calls("chat.update")
    (redrawn,) = [b for b in update.blocks if b["type"] == "actions"]
    assert redrawn["block_id"] == buttons["block_id"] == "burnwatch-group:z0"
    ids = [b for b in group.blocks if b["type"] == "context"][-1]["elements"][0]["text"]
    assert [b for b in update.blocks if b["type"] == "context"][-1]["elements"][0]["text"] == ids
