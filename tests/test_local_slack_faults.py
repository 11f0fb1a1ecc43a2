"""The local Slack server's fault windows (detector/testing.py), which the chaos test relies on."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import msgspec

from detector.testing import LocalSlack


def _post(slack: LocalSlack, timeout: float = 5.0) -> int:
    request = urllib.request.Request(slack.api_url + "chat.postMessage", data=b"channel=C1&text=hi", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_window_fails_requests_while_open_and_counts_them():
    with LocalSlack() as slack:
        window = slack.fail_window(0, 60, status=429, retry_after=1)
        assert _post(slack) == 429 and _post(slack) == 429
        assert window.hits == 2 and not slack.calls("chat.postMessage")
        window.end = time.monotonic()  # the outage is over
        assert _post(slack) == 200 and len(slack.calls("chat.postMessage")) == 1


def test_a_hanging_window_holds_requests_past_the_clients_timeout():
    with LocalSlack() as slack:
        window = slack.fail_window(0, 60, hang_s=1.5)
        try:
            _post(slack, timeout=0.5)
            raise AssertionError("answered inside the client's timeout")
        except (TimeoutError, urllib.error.URLError):
            pass
        assert window.hits == 1
        assert slack.wait_for(lambda reqs: len(reqs) == 1, timeout=10)  # Slack still posted it, as Slack would


def test_a_rate_per_channel_is_held_with_retry_after_and_other_channels_are_not_held():
    """Slack takes about one chat.postMessage a second per channel: past it, 429 with the seconds to wait."""
    with LocalSlack() as slack:
        slack.limit_rate(per_s=0.01, burst=2)
        assert [_post(slack) for _ in range(3)] == [200, 200, 429]
        assert slack.throttled == 1 and len(slack.calls("chat.postMessage")) == 2  # a refused post is not a post
        other = urllib.request.Request(slack.api_url + "chat.postMessage", data=b"channel=C2&text=hi", method="POST")
        with urllib.request.urlopen(other, timeout=5) as response:
            assert response.status == 200


def test_a_storm_of_resolutions_through_a_rate_limited_channel_is_posted_once_each(store):
    """The real outbox against a channel that takes a few posts a second: every 429 is waited out (slack-sdk's
    Retry-After, then the outbox's own retry of the pass), and no reply is lost or posted twice."""
    from detector.delivery import Outbox
    from detector.slack import SlackError, SlackNotifier
    from tests.test_outbox_crash import idle

    with LocalSlack() as slack:
        notifier = SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=5)
        outbox = Outbox(store, notifier, group_wait_s=0)
        ids = [f"a{i}" for i in range(12)]
        store.alerts.record([idle(alert_id=a) for a in ids], version=1)
        outbox.add([idle(alert_id=a) for a in ids])
        outbox.deliver_pending()
        slack.limit_rate(per_s=8, burst=4)
        store.alerts.record([idle("resolved", alert_id=a) for a in ids], version=2)
        outbox.add([idle("resolved", alert_id=a) for a in ids])
        deadline = time.monotonic() + 60
        while outbox.has_work and time.monotonic() < deadline:
            try:
                outbox.deliver_pending()
            except SlackError:
                continue  # the worker's task backs off and passes again
        replies = [r for r in slack.calls("chat.postMessage") if "thread_ts" in r.body]
        assert slack.throttled > 0
        assert sorted(r.text_of_blocks().split("alert `")[1][:3].rstrip("`") for r in replies) == sorted(ids)


def test_a_throttled_channel_waits_and_the_other_channels_alerts_go_on(store):
    """One team's channel throttled (Slack's one post a second per channel, here one in 3 s): its next changes
    wait for Retry-After while another team's opening, queued behind them, is posted in the same pass; then
    the waiting ones go, each once, each incident's in order. Before, the pass slept in slack-sdk's retry and
    every channel waited."""
    from detector.delivery import Outbox
    from detector.slack import SlackNotifier
    from tests.test_outbox_crash import idle

    def routed(alert, channel):
        return msgspec.structs.replace(alert, channel=channel)

    with LocalSlack() as slack:
        notifier = SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=5)
        outbox = Outbox(store, notifier, group_wait_s=0)
        slack.limit_rate(per_s=1 / 3, burst=1)
        nlp = [routed(idle(alert_id=f"n{i}"), "#nlp-cost") for i in range(3)]
        vision = routed(idle(alert_id="v0"), "#vision-cost")
        store.alerts.record([*nlp, vision], version=1)
        outbox.add(nlp)
        outbox.add([routed(idle("resolved", alert_id="n0"), "#nlp-cost")])
        outbox.add([vision])
        assert outbox.deliver_pending() == 2  # n0's opening and vision's; n0's resolution waits behind n1, n2
        posted = [r.body["channel"] for r in slack.calls("chat.postMessage")]
        assert posted == ["#nlp-cost", "#vision-cost"] and slack.throttled == 1
        assert 0 < outbox.hold_s <= 3  # come back when Slack said
        deadline = time.monotonic() + 30
        while outbox.has_work and time.monotonic() < deadline:
            outbox.deliver_pending()
            time.sleep(min(outbox.hold_s, 0.5))
        calls = [r for r in slack.calls("chat.postMessage") if r.body["channel"] == "#nlp-cost"]
        said = [("reply " if "thread_ts" in r.body else "") + r.text_of_blocks().split("alert `")[1][:2] for r in calls]
        assert said == ["n0", "n1", "n2", "reply n0"] or said == ["n0", "n1", "reply n0", "n2"], said


class IdSlack(LocalSlack):
    """Slack as it is: a post to a channel by name is answered with the channel's id."""

    IDS = {"#ml-cost": "CML", "#nlp-cost": "CNLP", "#vision-cost": "CVIS"}

    def _reply(self, method, body):
        answer = json.loads(super()._reply(method, body))
        if method == "chat.postMessage" and answer.get("ok"):
            answer["channel"] = self.IDS.get(answer["channel"], answer["channel"])
        return json.dumps(answer).encode()


NOT_IN_CHANNEL = b'{"ok": false, "error": "not_in_channel"}'


def test_a_fallback_post_does_not_map_the_routed_channel_to_slack_channels_id(store):
    """A routed channel that refused the app has its opening posted to SLACK_CHANNEL (answered with SLACK_CHANNEL's
    id); once invited, it takes posts again. A 429 to it then holds its own alerts only: SLACK_CHANNEL's, queued
    behind, are posted in the same pass (the outbox had taken the fallback's answer for the routed channel's id,
    and paced the two channels as one)."""
    from detector.delivery import Outbox
    from detector.slack import SlackNotifier
    from tests.test_outbox_crash import idle

    def routed(alert, channel):
        return msgspec.structs.replace(alert, channel=channel)

    with IdSlack() as slack:
        notifier = SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=5)
        outbox = Outbox(store, notifier, group_wait_s=0)
        d0, d1 = (routed(idle(alert_id=f"d{i}"), "#ml-cost") for i in range(2))
        n0, n1, n2 = (routed(idle(alert_id=f"n{i}"), "#nlp-cost") for i in range(3))
        store.alerts.record([d0, d1, n0, n1, n2], version=1)
        outbox.add([d0])
        assert outbox.deliver_pending() == 1  # SLACK_CHANNEL's own: "#ml-cost" is CML
        slack.fail_next(1, status=200, body=NOT_IN_CHANNEL, method="chat.postMessage")
        outbox.add([n0])
        assert outbox.deliver_pending() == 1  # posted to #ml-cost meanwhile, with a note
        assert [r.body["channel"] for r in slack.calls("chat.postMessage")] == ["#ml-cost", "#ml-cost"]
        outbox.add([n1])
        assert outbox.deliver_pending() == 1  # the app invited: #nlp-cost takes it
        assert slack.calls("chat.postMessage")[-1].body["channel"] == "#nlp-cost"
        slack.fail_next(1, status=429, retry_after=30, method="chat.postMessage")
        outbox.add([n2, d1])
        assert outbox.deliver_pending() == 1  # n2 waits for #nlp-cost's Retry-After; d1 goes on
        assert slack.calls("chat.postMessage")[-1].body["channel"] == "#ml-cost"
