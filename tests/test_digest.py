"""The daily digest: each incident's dollars split by day, per channel, sent once."""

from __future__ import annotations

import pytest

from detector.alerts import Alert
from detector.digest import DAY_S, build_digests, send_due_digests
from detector.slack import SlackNotifier
from detector.store import EventBatch
from detector.testing import LocalSlack
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
