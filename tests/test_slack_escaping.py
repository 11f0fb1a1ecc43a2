"""Slack injection: what came from events reaches Slack as text, never as mentions or links.

Anyone who can write to ``resource-usage`` chooses tag values, resource ids and run
errors. Each test posts through slack-sdk to the local Slack server and reads what it
received: the only markup (``<...>``) in it must be ours (a mapped owner's mention,
a configured link), and every hostile value must arrive escaped.
"""

from __future__ import annotations

import json
import re

import pytest

from detector.alerts import Alert
from detector.charts.digest import digest_chart
from detector.digest import Digest, render_digest
from detector.rules import Link, Routing
from detector.slack import SlackNotifier, block_objects
from detector.testing import LocalSlack, SlackRequest
from tests.helpers import T0, at

CHANNEL = "<!channel>"
EVERYONE_LINK = "<!everyone> <https://evil.example|click here>"
ROUTING = Routing(
    users={"alice": "U012AB3CD"},
    links=[Link(name="Console", url="https://console.example/{region}/{resource_id}?team={team}&owner={owner}")],
)
CONSOLE = re.compile(r"^https://console\.example/[^<>|\s]*\|Console$")
"""Our configured link: its event fields URL-encoded, so none can close it or add a label."""


def alert(change: str = "fired", **kw) -> Alert:
    resolved = change == "resolved"
    kw.setdefault("tags", {"team": CHANNEL, "owner": EVERYONE_LINK, "project": "a & b"})
    kw.setdefault("resource_id", "host-<!here>")
    kw.setdefault("type", "idle_gpu")
    kw.setdefault("episode_start", T0)
    kw.setdefault("fired_at", T0 + 1800)
    kw.setdefault("updated_at", T0 + (5400 if resolved else 1800))
    kw.setdefault("rule", "idle-gpu")
    kw.setdefault("details", {"gpu_count": 8, "gpu_model": "A100 <https://evil.example|x>",
                              **({"reason": "<!here> & gone"} if resolved else {})})  # fmt: skip
    return Alert(
        alert_id="a1", status="resolved" if resolved else "firing",
        change=change, severity="warning", resolved_at=T0 + 5400 if resolved else None,
        waste_usd=16.39, usd_per_hour=32.77, resource_type="gpu_<!subteam^S1>", account="acct<@U999>",
        region="us-east-1/<https://evil.example|x>", instance_type="p4d\n*Owner*\n<!channel>", **kw,
    )  # fmt: skip


def markup(request: SlackRequest) -> list[str]:
    """Every ``<...>`` Slack would parse in a request: its blocks and its notification text."""
    texts = [request.text_of_blocks(), str(request.body.get("text", ""))]
    return [m for text in texts for m in re.findall(r"<([^>]*)>", text)]


def assert_inert(request: SlackRequest, allowed: tuple[str, ...] = ("@U012AB3CD",)) -> None:
    found = markup(request)
    foreign = [m for m in found if m not in allowed and not CONSOLE.match(m)]
    assert foreign == [], f"markup from events reached Slack: {foreign}"
    raw = request.text_of_blocks() + str(request.body.get("text", ""))
    assert "<!" not in raw and "<https://evil" not in raw


def all_mrkdwn(request: SlackRequest) -> list[dict]:
    return [obj for obj in block_objects(request.blocks) if obj.get("type") == "mrkdwn"]


@pytest.fixture
def slack():
    with LocalSlack() as server:
        yield server


def bot(slack: LocalSlack) -> SlackNotifier:
    notifier = SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=2)
    notifier.routing = ROUTING
    return notifier


def test_tags_ids_and_names_arrive_as_text_and_the_owner_is_still_mentioned(slack):
    a = alert()
    a.tags["owner"] = "alice"  # mapped in routing.yaml: our own mention, which must keep working
    bot(slack).post(a)
    (post,) = slack.calls("chat.postMessage")
    assert_inert(post)
    text = post.text_of_blocks()
    assert "<@U012AB3CD>" in text  # the owner, mentioned
    assert "&lt;!channel&gt;" in text and "a &amp; b" in text  # the team and project, as text
    assert "&lt;@U999&gt;" in text  # a mention smuggled in the account name is not one
    assert "&lt;!here&gt;" in post.body["text"]  # the notification text too
    links = [m for m in markup(post) if CONSOLE.match(m)]
    assert links == ["https://console.example/us-east-1%2F%3Chttps%3A%2F%2Fevil.example%7Cx%3E/host-%3C%21here%3E"
                     "?team=%3C%21channel%3E&amp;owner=alice|Console"]  # fmt: skip
    assert all(m.get("verbatim") is True for m in all_mrkdwn(post))  # bare @here or #channel stay text too


def test_an_unmapped_hostile_owner_is_neither_a_ping_nor_a_link(slack):
    bot(slack).post(alert())
    (post,) = slack.calls("chat.postMessage")
    assert_inert(post, allowed=())
    assert "&lt;!everyone&gt; &lt;https://evil.example|click here&gt;" in post.text_of_blocks()


def test_a_line_break_in_a_value_cannot_fake_a_field(slack):
    bot(slack).post(alert())
    (post,) = slack.calls("chat.postMessage")
    instance = next(f["text"] for f in post.blocks[1]["fields"] if f["text"].startswith("*Instance*"))
    assert instance == "*Instance*\np4d *Owner* &lt;!channel&gt;"


def test_a_right_to_left_override_cannot_turn_the_dollars_around(slack):
    """U+202E in an id would show what follows it on its line reversed ("$412 so far" as
    "raf os 214$"); bidi controls from events never reach Slack."""
    bot(slack).post(alert(resource_id="i-\u202eevil\u2066x\u2069", tags={"team": "nlp\u202b", "owner": "alice"}))
    (post,) = slack.calls("chat.postMessage")
    sent = post.text_of_blocks() + post.body["text"]
    assert not re.search("[\u202a-\u202e\u2066-\u2069]", sent)
    assert "i-evilx" in post.body["text"] and "$16.39 so far, $32.77/h" in post.body["text"]


def test_a_backtick_in_an_id_cannot_close_our_code_span(slack):
    bot(slack).post(alert(resource_id="h1` *bold* `x"))
    (post,) = slack.calls("chat.postMessage")
    resource = next(f["text"] for f in post.blocks[1]["fields"] if f["text"].startswith("*Resource*"))
    assert resource.split("\n", 1)[1].startswith("`h1\u02cb *bold* \u02cbx`")
    assert resource.count("`") == 2


def test_resolution_reply_and_parent_edit_are_inert(slack):
    notifier = bot(slack)
    channel, ts = notifier.post(alert())
    notifier.post(alert("resolved"), thread=(channel, ts))
    reply = slack.calls("chat.postMessage")[1]
    (update,) = slack.calls("chat.update")
    for request in (reply, update):
        assert_inert(request, allowed=())
    assert "&lt;!here&gt; &amp; gone" in reply.text_of_blocks()  # the reason, from details


def test_button_clicks_shown_on_the_message_are_inert(slack):
    notifier = bot(slack)
    channel, ts = notifier.post(alert())
    clicks = [{"action": "acknowledged", "user_id": "<!channel>", "user_name": "<!everyone>", "at": at(T0)}]
    notifier.show_actions(alert(), clicks, channel, ts)
    (update,) = slack.calls("chat.update")
    assert_inert(update, allowed=())
    assert "by &lt;!everyone&gt;" in update.text_of_blocks()


def test_a_failed_runs_error_is_text(slack):
    a = alert(type="failed_run_spend", rule="failed-run",
              details={"run_id": "r<!here>", "status": "failed", "error": "OOM <https://evil.example|logs>",
                       "gpu_hours": 3.0})  # fmt: skip
    bot(slack).post(a)
    (post,) = slack.calls("chat.postMessage")
    assert_inert(post, allowed=())
    assert "OOM &lt;https://evil.example|logs&gt;" in post.text_of_blocks()


def test_a_backtick_in_a_run_id_cannot_close_the_facts_code_span(slack):
    a = alert(type="failed_run_spend", rule="failed-run",
              details={"run_id": "r`1", "status": "failed", "error": "", "gpu_hours": 3.0})  # fmt: skip
    bot(slack).post(a)
    (post,) = slack.calls("chat.postMessage")
    run = next(f["text"] for f in post.blocks[2]["fields"] if f["text"].startswith("*Run*"))
    assert run == "*Run*\n`r\u02cb1` (failed)"


def test_webhook_payload_is_inert(slack):
    notifier = SlackNotifier(webhook_url=slack.webhook_url, timeout=2)
    notifier.routing = ROUTING
    notifier.post(alert())
    (hook,) = slack.calls("webhook")
    assert_inert(hook, allowed=())
    assert "&lt;!channel&gt;" in hook.text_of_blocks()


def test_a_group_message_is_inert(slack):
    alerts = [alert(type="untagged", rule="untagged", resource_id=f"nb-<!here>-{i}", tags={},
                    details={"missing_tags": ["team<!channel>"]}) for i in range(2)]  # fmt: skip
    bot(slack).post_group(alerts)
    (post,) = slack.calls("chat.postMessage")
    assert_inert(post, allowed=())
    assert "acct&lt;@U999&gt;" in post.text_of_blocks() + post.body["text"]  # grouped by account


def test_the_digest_is_inert_and_its_chart_survives_a_dollar_in_a_team(slack):
    digest = Digest(channel="", day=T0, by_type={"idle_gpu": 5.0}, by_team={"<!channel> $x^$": 5.0},
                    by_team_type={("<!channel> $x^$", "idle_gpu"): 5.0}, incidents=1,
                    top=[{"resource_id": "h`<!here>", "type": "idle_gpu", "team": "<!channel> $x^$", "usd": 5.0}])  # fmt: skip
    png = digest_chart(digest)  # matplotlib would read "$x^$" as math, and fail on it
    assert png.startswith(b"\x89PNG")
    bot(slack).post_digest(digest, render_digest(digest), None)
    (post,) = slack.calls("chat.postMessage")
    assert_inert(post, allowed=())
    assert "&lt;!channel&gt; $x^$" in post.text_of_blocks()
    assert json.dumps(post.blocks).count("&lt;!here&gt;") == 1


def test_an_incident_chart_survives_a_dollar_in_its_resource_id(store):
    """Titles are images (nothing to escape), but matplotlib reads ``$...$`` as math and
    fails on bad math: a hostile id would cost the incident its chart."""
    from detector.charts import render_chart
    from detector.store import EventBatch
    from tests.helpers import MIN, timeline

    rid = "h$x^$"
    batch = EventBatch()
    batch.extend(timeline(T0, T0 + 60 * MIN, [0.0, 0.0], rid=rid))
    store.events.insert(batch)
    a = alert(resource_id=rid, episode_start=T0 + 20 * MIN, fired_at=T0 + 50 * MIN, updated_at=T0 + 50 * MIN)
    png = render_chart(a, store)
    assert png is not None and png.startswith(b"\x89PNG")
