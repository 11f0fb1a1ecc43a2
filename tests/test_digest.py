"""The daily digest: each incident's dollars split by day, per channel, sent once."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from detector.alerts import Alert
from detector.charts.digest import digest_chart, digest_figure
from detector.detectors import REGISTRY
from detector.digest import DAY_S, Digest, build_digests, render_digest, send_due_digests
from detector.slack import SlackError, SlackNotifier
from detector.store import EventBatch
from detector.store.remediation import ActionStep
from detector.testing import LocalSlack
from detector.units import epoch
from tests.conftest import ROOT
from tests.helpers import T0, usage

HOUR = 3600.0


def change(alert_id: str, at: float, usd: float, *, rule_type: str = "idle_gpu", team: str = "nlp", rid: str = "h1",
           channel: str = "", change: str = "updated", resolved: bool = False, silenced: str = "",
           details: dict | None = None) -> Alert:  # fmt: skip
    return Alert(alert_id=alert_id, type=rule_type, rule=rule_type, resource_id=rid,
                 status="resolved" if resolved else "firing", change=change, severity="warning",
                 episode_start=T0, fired_at=T0, updated_at=at, resolved_at=at if resolved else None,
                 waste_usd=usd, usd_per_hour=10.0, tags={"team": team} if team else {}, channel=channel,
                 silenced=silenced, details=details or {})  # fmt: skip


@pytest.fixture
def history(store):
    """Day 1 (T0) and day 2: an episode across midnight, others within a day, two channels.
    Every host runs at $50/h for both days, a bill above every alert (the ledger's cap)."""
    batch = EventBatch()
    batch.extend([usage(T0 + k * HOUR, rid, usd_per_hour=50.0, interval_s=HOUR)
                  for rid in ("h1", "h2", "h3", "h4", "nb1") for k in range(48)])  # fmt: skip
    store.events.insert(batch)
    store.alerts.record([
        change("a", T0 + 22 * HOUR, 0.0, change="fired"), change("a", T0 + 23 * HOUR, 10.0),
        change("a", T0 + DAY_S + 2 * HOUR, 40.0, resolved=True, change="resolved"),  # $20 on day 1, $20 on day 2
        change("b", T0 + 5 * HOUR, 25.0, rid="h2", team="vision", change="fired"),  # $25 on day 1
        change("c", T0 + 6 * HOUR, 7.0, rule_type="untagged", team="", rid="nb1", change="fired"),  # $7, untagged
        change("d", T0 + 7 * HOUR, 99.0, rid="h3", channel="#oncall", change="fired"),  # its own channel
        change("e", T0 + 8 * HOUR, 50.0, rid="h4", change="fired", silenced="offsite"),  # silenced: not in the digest
        change("f", T0 + 9 * HOUR, 0.0, rule_type="vector_db_growth", rid="v1", change="fired"),  # a forecast: no $
    ], version=1)  # fmt: skip
    return store


def test_a_day_counts_what_each_incident_burned_that_day(history):
    """A change's added dollars are spread over the hours since the change before: "a" added
    $30 over the three hours across midnight, one of them on day 1."""
    default, oncall = build_digests(history.digests, T0)
    assert (default.channel, oncall.channel) == ("", "#oncall")
    assert default.by_type == pytest.approx({"idle_gpu": 45.0, "untagged": 7.0})
    assert default.by_team == pytest.approx({"nlp": 20.0, "vision": 25.0, "(untagged)": 7.0})
    assert [o["resource_id"] for o in default.top] == ["h2", "h1", "nb1"]
    assert default.open_incidents == 3  # a (resolved the next day), b, c
    assert default.open_usd_per_hour == pytest.approx(30.0)  # three resources at $10/h
    (second,) = build_digests(history.digests, T0 + DAY_S)
    assert second.by_type == pytest.approx({"idle_gpu": 20.0}) and second.open_incidents == 0


def test_due_digests_are_posted_once_with_a_chart(history):
    with LocalSlack() as slack:
        notifier = SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=2)
        assert send_due_digests(history.digests, notifier, watermark=T0 + 3 * HOUR) == []  # the first day seen starts here
        assert send_due_digests(history.digests, notifier, watermark=T0 + DAY_S + 300) == []  # not settled yet
        sent = send_due_digests(history.digests, notifier, watermark=T0 + DAY_S + 900)
        assert [d.channel for d in sent] == ["", "#oncall"]
        posts = slack.calls("chat.postMessage")
        assert [p.body["channel"] for p in posts] == ["#ml-cost", "#oncall"]
        assert "Cost waste on 2026-11-02: $52.00" in posts[0].text_of_blocks()
        assert len(slack.calls("files.completeUploadExternal")) == 2  # the bar chart, in each digest's thread
        assert send_due_digests(history.digests, notifier, watermark=T0 + DAY_S + 3600) == []  # never twice


def test_open_burn_rate_counts_a_host_once(store):
    """An untagged host whose GPUs sit idle burns its price once, not once per incident on it."""
    batch = EventBatch()
    batch.extend([usage(T0 + k * HOUR, "h9", usd_per_hour=10.0, interval_s=HOUR) for k in range(3)])
    store.events.insert(batch)
    store.alerts.record([change("idle", T0 + HOUR, 10.0, rid="h9", change="fired"),
                         change("untag", T0 + 2 * HOUR, 20.0, rule_type="untagged", team="", rid="h9",
                                change="fired")], version=1)  # fmt: skip
    (digest,) = build_digests(store.digests, T0)
    assert digest.open_incidents == 2
    assert digest.open_usd_per_hour == pytest.approx(10.0)
    assert digest.by_type == pytest.approx({"idle_gpu": 10.0, "untagged": 10.0})  # the idle hour is not untagged too


def test_a_failed_run_is_open_but_burns_nothing_now(store):
    """A failed run's alert has no resolution, but the run has ended: its dollars count that
    day, its rate is not burning at the day's end."""
    batch = EventBatch()
    batch.extend([usage(T0 + k * HOUR, rid, usd_per_hour=10.0, interval_s=HOUR) for k in range(3) for rid in ("h8", "h9")])
    store.events.insert(batch)
    store.alerts.record([change("idle", T0 + HOUR, 10.0, rid="h9", change="fired"),
                         change("run", T0 + 2 * HOUR, 20.0, rule_type="failed_run_spend", rid="r1", change="fired",
                                details={"run_id": "r1", "status": "failed", "resource_ids": ["h8"]})],
                        version=1)  # fmt: skip
    (digest,) = build_digests(store.digests, T0)
    assert digest.open_incidents == 2 and digest.by_type == pytest.approx({"idle_gpu": 10.0, "failed_run_spend": 20.0})
    assert digest.open_usd_per_hour == pytest.approx(10.0)  # the idle host only


# -- the digest as a picture of the day ------------------------------------------------------

DAY2 = T0 + DAY_S


@pytest.fixture
def fortnight(store):
    """Five days of one channel's waste, the digest's day (DAY2 + 3 days) last: an idle host an
    approved action stopped that day, one that went busy again, one left open, an untagged one."""
    day = T0 + 4 * DAY_S
    batch = EventBatch()
    batch.extend([usage(T0 + k * HOUR, rid, usd_per_hour=50.0, interval_s=HOUR)
                  for rid in ("h1", "h2", "h3", "nb1") for k in range(5 * 24)])  # fmt: skip
    store.events.insert(batch)
    store.alerts.record([
        *[c for k in range(4) for c in (  # one a day before: $10, $20, $30, $40
            change(f"old{k}", T0 + k * DAY_S + HOUR, 0.0, rid="h3", change="fired"),
            change(f"old{k}", T0 + k * DAY_S + 10 * HOUR, 10.0 * (k + 1), rid="h3", change="resolved", resolved=True))],
        change("x", day + 1 * HOUR, 0.0, rid="h1", change="fired"), change("x", day + 3 * HOUR, 20.0),
        change("x", day + 4 * HOUR, 30.0, rid="h1", resolved=True, change="resolved"),
        change("y", day + 1 * HOUR, 0.0, rid="h2", team="vision", change="fired"),
        change("y", day + 5 * HOUR, 40.0, rid="h2", team="vision", resolved=True, change="resolved",
               details={"reason": "gpu_busy"}),
        change("z", day + 2 * HOUR, 0.0, rid="h3", change="fired"), change("z", day + 8 * HOUR, 60.0, rid="h3"),
        change("u", day + 5 * HOUR, 0.0, rule_type="untagged", team="", rid="nb1", change="fired"),
        change("u", day + 6 * HOUR, 12.0, rule_type="untagged", team="", rid="nb1"),
    ], version=1)  # fmt: skip
    store.remediations.record([ActionStep(alert_id="x", kind="stop_instance", step="succeeded", at=day + 4 * HOUR,
                                          mode="approve", decided_by="U0APPROVER", resource_id="h1", usd_per_hour=10.0),
                               # h2's owner stopped it first: the action found it stopped, saving nothing (not its fix)
                               ActionStep(alert_id="y", kind="stop_instance", step="succeeded", at=day + 5 * HOUR,
                                          mode="approve", decided_by="U0APPROVER", resource_id="h2",
                                          usd_per_hour=0.0)])  # fmt: skip
    return store, day


def test_the_day_shows_what_was_fixed_by_whom_and_what_stayed_open(fortnight):
    store, day = fortnight
    (d,) = build_digests(store.digests, day)
    assert [(o["resource_id"], o["how"]) for o in d.fixed] == [
        ("h2", "gpu busy"),  # $40 that day, the costlier first
        ("h1", "stopped by burnwatch, approved by <@U0APPROVER>"),
    ]
    assert [(o["resource_id"], o["usd_per_hour"]) for o in d.still_open] == [("h3", 10.0), ("nb1", 10.0)]
    text = "\n".join(b["text"]["text"] for b in render_digest(d) if "text" in b and b["type"] == "section")
    assert "*Fixed that day*\n• `h2` (Idle GPUs, vision): resolved 05:00 UTC, gpu busy; $40.00 that day" in text
    assert "`h1` (Idle GPUs, nlp): resolved 04:00 UTC, stopped by burnwatch, approved by <@U0APPROVER>" in text
    assert "*Still open*, fastest burning first\n• `h3` (Idle GPUs, nlp): *$10.00/h*; $60.00 that day" in text
    assert "*2 fixed*; *2 still open* at the day's end, *$20.00/h*" in text


def test_the_trend_is_the_ledger_of_the_days_before(fortnight):
    """Each day's bar is what that day's digest counts (its total), the average the days before."""
    store, day = fortnight
    (d,) = build_digests(store.digests, day)
    days = {k: sum(by_type.values()) for k, by_type in d.trend.items()}
    assert days == pytest.approx({T0: 10.0, T0 + DAY_S: 20.0, T0 + 2 * DAY_S: 30.0, T0 + 3 * DAY_S: 40.0,
                                  day: d.total})  # fmt: skip
    for k in range(4):
        (before,) = build_digests(store.digests, T0 + k * DAY_S)
        assert before.total == pytest.approx(days[T0 + k * DAY_S])
    assert d.usual == pytest.approx(25.0) and d.usual_days == 4
    assert "(the 4 days before: $25.00/day on average)" in render_digest(d)[1]["text"]["text"]


def _boxes(fig, texts):
    renderer = fig.canvas.get_renderer()
    return [(t.get_text(), t.get_window_extent(renderer)) for t in texts if t.get_visible() and t.get_text()]


def _overlaps(boxes):
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]


def test_the_chart_reads_as_a_picture(fortnight):
    """Rendered from the store: no tick labels run into each other, the dollars are in the title,
    the day stands out (outlined on a band, its total above it, its date on the axis) while every
    day keeps its colours, the average of the days before is a labelled line, and the stacked
    bars add up to the days' totals."""
    store, day = fortnight
    (d,) = build_digests(store.digests, day)
    fig = digest_figure(d)
    fig.canvas.draw()
    (ax,) = fig.axes
    for axis in (ax.xaxis, ax.yaxis):
        boxes = _boxes(fig, axis.get_ticklabels())
        assert len(boxes) >= 3 and _overlaps(boxes) == []
    assert ax.get_title(loc="left") == f"Cost waste $142.00 on {day_label(day)}"  # to the cent, as the bill
    texts = {t.get_gid(): t.get_text() for t in ax.texts}
    assert texts["today-total"] == "$142.00"
    assert texts["dollars"].startswith("$20.00/h still burning")
    assert "$25.00/day" in texts["usual-label"] and any(line.get_gid() == "usual" for line in ax.lines)
    today = [p for p in ax.patches if p.get_gid() == "today"]
    others = [p for p in ax.patches if p.get_gid() not in ("today", "today-band") and p.get_height() > 0]
    assert sum(p.get_height() for p in today) == pytest.approx(d.total)
    assert {p.get_edgecolor() for p in today} == {(0.0, 0.0, 0.0, 1.0)}  # outlined
    assert {p.get_edgecolor()[3] for p in others} == {0.0}
    assert {p.get_alpha() for p in ax.patches if p.get_gid() != "today-band"} == {None}  # faded, a colour reads as another
    assert any(p.get_gid() == "today-band" for p in ax.patches)
    assert ax.xaxis.get_ticklabels()[0].get_text() == "Nov 06"  # the day's date is on the axis
    assert sum(p.get_height() for p in others) == pytest.approx(100.0)  # $10 + $20 + $30 + $40
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["Idle GPUs", "Untagged spend"]
    assert _overlaps(_boxes(fig, [*legend.get_texts(), ax.xaxis.label, *ax.xaxis.get_ticklabels()])) == []
    assert digest_chart(d).startswith(b"\x89PNG")


def day_label(day: float) -> str:
    return datetime.fromtimestamp(day, tz=timezone.utc).strftime("%Y-%m-%d")


def test_a_big_teams_chart_keeps_six_types_apart_and_hostile_names_inert():
    """Twenty types: five colours and one grey "other"; a "$" in a name is text, not mathtext;
    labels still do not overlap."""
    types = [*sorted(REGISTRY), *[f"custom_$x^$_{i}" for i in range(6)]]
    trend = {T0 - k * DAY_S: {t: float(i + k) for i, t in enumerate(types)} for k in range(1, 14)}
    d = Digest(channel="<!channel> $ch$", day=T0, by_type={t: float(i) for i, t in enumerate(types)}, trend=trend)
    fig = digest_figure(d)
    fig.canvas.draw()
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(labels) == 6 and labels[-1] == f"other ({len(types) - 5} types)"
    assert labels[0] == "Custom $x^$ 5"  # the costliest first, its "$" as written
    for axis in (fig.axes[0].xaxis, fig.axes[0].yaxis):
        assert _overlaps(_boxes(fig, axis.get_ticklabels())) == []
    assert _overlaps(_boxes(fig, fig.legends[0].get_texts())) == []
    assert digest_chart(d).startswith(b"\x89PNG")


def test_a_day_read_back_on_a_machine_outside_utc_is_the_day_recorded():
    """clickhouse-connect returns a ``DateTime('UTC')`` column (the digests' day, the ledger's hour) in the
    machine's zone, aware; read as naive UTC, a worker in New York took the day it last sent for 19:00 the
    day before, and sent no digest again."""
    assert epoch(datetime(2026, 11, 1, 19, tzinfo=ZoneInfo("America/New_York"))) == T0
    assert epoch(datetime(2026, 11, 2)) == T0  # a DateTime64: naive, UTC
    script = ("from detector.store import Store\n"
              "s = Store.open('chdb://memory')\n"
              f"s.digests.record({T0}, '', '')\n"
              "print(s.digests.last_day())\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "TZ": "America/New_York"},
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert float(out.stdout.split()[-1]) == T0


def test_a_429_to_one_channels_digest_does_not_lose_it(history):
    """Slack answers 429 once to the second channel's digest of a day: slack-sdk waits its Retry-After and posts it
    (the outbox paces only the alerts' posts). Raised instead, the day is recorded by the first channel's digest
    and the second's is never posted."""
    with LocalSlack() as slack:
        notifier = SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=2)
        assert send_due_digests(history.digests, notifier, watermark=T0 + 3 * HOUR) == []
        post_digest = notifier.post_digest

        def busy_second(d, *args):
            if d.channel == "#oncall":
                slack.fail_next(1, status=429, retry_after=1, method="chat.postMessage")
            return post_digest(d, *args)

        notifier.post_digest = busy_second  # type: ignore[method-assign]
        with contextlib.suppress(SlackError):  # (the timer logs it and calls again, 15 s later)
            send_due_digests(history.digests, notifier, watermark=T0 + DAY_S + 900)
        send_due_digests(history.digests, notifier, watermark=T0 + DAY_S + 1800)
        assert [p.body["channel"] for p in slack.calls("chat.postMessage")] == ["#ml-cost", "#oncall"]


def test_a_channels_digest_that_failed_is_posted_at_the_next_call_and_none_twice(history):
    """Slack answers 500 past slack-sdk's retries to the second channel's digest of a day: the call fails after
    the first channel's was posted and recorded. The next call posts the second channel's, not the first's again,
    and goes on to the next day. Before, the first channel's record made the day done: the second's was lost."""
    with LocalSlack() as slack:
        notifier = SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=2)
        assert send_due_digests(history.digests, notifier, watermark=T0 + 3 * HOUR) == []
        post_digest = notifier.post_digest

        def failing_second(d, *args):
            if d.channel == "#oncall":
                slack.fail_next(3, status=500, method="chat.postMessage")  # (slack-sdk tries three times)
            return post_digest(d, *args)

        notifier.post_digest = failing_second  # type: ignore[method-assign]
        with pytest.raises(SlackError):
            send_due_digests(history.digests, notifier, watermark=T0 + DAY_S + 900)
        assert [p.body["channel"] for p in slack.calls("chat.postMessage")] == ["#ml-cost"]
        notifier.post_digest = post_digest  # type: ignore[method-assign]
        again = send_due_digests(history.digests, notifier, watermark=T0 + DAY_S + 1800)
        assert [d.channel for d in again] == ["#oncall"]
        assert [p.body["channel"] for p in slack.calls("chat.postMessage")] == ["#ml-cost", "#oncall"]
        assert send_due_digests(history.digests, notifier, watermark=T0 + 2 * DAY_S + 1800) == []  # (nothing burned)
        assert [p.body["channel"] for p in slack.calls("chat.postMessage")] == ["#ml-cost", "#oncall"]
