"""The notification text (a message's top-level ``text``: what a phone's notification and
Slack's channel list show) says on its own what, whose and how much, for an alert, its
resolution, a group and the digest; read from what slack-sdk delivered to the local Slack."""

from __future__ import annotations

import pytest

from detector.alerts import Alert
from detector.digest import send_due_digests
from detector.store import EventBatch
from detector.testing import LocalSlack
from tests.helpers import T0, slack_bot, usage

HOUR = 3600.0


def alert(rule_type: str = "idle_gpu", resolved: bool = False, **kw) -> Alert:
    fields = dict(alert_id="a1", type=rule_type, rule=rule_type, resource_id="gpu-host-7",
                  status="resolved" if resolved else "firing", change="resolved" if resolved else "fired",
                  severity="warning", episode_start=T0, fired_at=T0 + 1800, updated_at=T0 + 2 * HOUR,
                  resolved_at=T0 + 2 * HOUR if resolved else None, waste_usd=412.4, usd_per_hour=32.2,
                  tags={"team": "nlp"}, details={"reason": "gpu_busy"} if resolved else {})  # fmt: skip
    return Alert(**{**fields, **kw})


bot = slack_bot


def texts(slack: LocalSlack, method: str = "chat.postMessage") -> list[str]:
    return [r.body["text"] for r in slack.calls(method)]


CASES = [
    # (what, the alert, the text a phone shows)
    ("an idle host", alert(), "Idle GPUs on gpu-host-7 (team nlp): $412 so far, $32.20/h"),
    ("under $100 the cents stay (an hourly rate as priced)", alert(waste_usd=4.2, usd_per_hour=0.5),
     "Idle GPUs on gpu-host-7 (team nlp): $4.20 so far, $0.50/h"),
    ("untagged: whose is the missing tag", alert("untagged", tags={}, resource_id="i-0abc"),
     "Untagged spend on i-0abc (no team tag): $412 spent untagged so far, $32.20/h"),
    ("a failed run has ended: spent, no rate", alert("failed_run_spend", resource_id="run-42",
                                                      details={"run_id": "run-42", "status": "failed"}),
     "Failed run spend on run-42 (team nlp): $412 wasted, ended"),
    ("a forecast says when, not dollars", alert("vector_db_growth", resource_id="vdb-1", waste_usd=0.0,
                                                 details={"forecast_full": "2026-11-20", "days_to_full": 18,
                                                          "fill_pct": 80, "capacity_gb": 1000}),
     "Vector database filling up on vdb-1 (team nlp): full by 2026-11-20 (18 days); fill 80 % of 1000 GB"),
    ("a risk says what is at risk and what the fix costs", alert(
        "spot_without_redundancy", resource_id="chat-prod", waste_usd=0.0, usd_per_hour=0.0,
        details={"replicas": 1, "zones": 1, "min_replicas": 2, "min_zones": 2, "extra_replica_usd_per_hour": 0.4,
                 "on_demand_premium_usd_per_hour": 0.606}),
     "User-facing endpoint on spot without redundancy on chat-prod (team nlp): replicas 1 in 1 zone(s), all on spot "
     "(the rule wants at least 2 in 2 zones); fix costs one more spot replica $0.400/h, or on-demand $0.606/h more"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "opened", "expected"), CASES, ids=[c[0] for c in CASES])
def test_an_alerts_notification_says_what_whose_and_how_much(slack, what, opened, expected):
    bot(slack).post(opened)
    assert texts(slack) == [expected]


def test_a_risk_without_dollars_shows_no_rate_in_its_header(slack):
    bot(slack).post(alert("spot_without_redundancy", waste_usd=0.0, usd_per_hour=0.0, details={"replicas": 1}))
    (header,) = [b["text"]["text"] for b in slack.calls("chat.postMessage")[0].body["blocks"] if b["type"] == "header"]
    assert header.endswith("User-facing endpoint on spot without redundancy on gpu-host-7") and "$" not in header


def test_a_resolution_says_so_and_the_total_in_the_reply_and_the_edit(slack):
    notifier = bot(slack)
    channel, ts = notifier.post(alert())
    notifier.post(alert(resolved=True, change="resolved"), thread=(channel, ts))
    expected = "Resolved: Idle GPUs on gpu-host-7 (team nlp) after 2h: $412 wasted in total"
    assert texts(slack)[1:] == [expected] and texts(slack, "chat.update") == [expected]
    assert slack.calls("chat.postMessage")[1].body["thread_ts"] == ts


def test_a_huge_id_still_leaves_the_dollars_in_view(slack):
    """A 10 kB resource id and team are cut, so the dollars stay within what a phone shows."""
    bot(slack).post(alert(resource_id="h" * 10_000, tags={"team": "<!channel> " * 1000}))
    (text,) = texts(slack)
    assert len(text) < 200 and text.endswith("…): $412 so far, $32.20/h")
    assert "<!channel>" not in text and "(team &lt;!channel&gt;" in text


def test_a_group_says_how_many_whose_and_how_much(slack):
    alerts = [alert("untagged", alert_id=f"u{i}", resource_id=f"i-{i}", account="ml-prod", tags={},
                    waste_usd=20.0, usd_per_hour=10.0) for i in range(3)]  # fmt: skip
    bot(slack).post_group(alerts)
    assert texts(slack) == ["Untagged spend: 3 resources in ml-prod: $60.00 so far, $30.00/h"]


def test_the_digest_says_the_total_the_biggest_team_and_what_still_burns(store, slack):
    batch = EventBatch()
    batch.extend([usage(T0 + k * HOUR, rid, usd_per_hour=50.0, interval_s=HOUR) for rid in ("h1", "h2")
                  for k in range(30)])  # fmt: skip
    store.events.insert(batch)
    store.alerts.record([
        alert(alert_id="a", resource_id="h1", change="fired", updated_at=T0 + 5 * HOUR, waste_usd=25.0, usd_per_hour=10.0),
        alert(alert_id="b", resource_id="h2", change="fired", updated_at=T0 + 6 * HOUR, waste_usd=7.0,
              usd_per_hour=10.0, tags={"team": "vision"}),
        alert(alert_id="b", resource_id="h2", resolved=True, change="resolved", updated_at=T0 + 7 * HOUR,
              resolved_at=T0 + 7 * HOUR, waste_usd=9.0, usd_per_hour=10.0, tags={"team": "vision"}),
    ], version=1)  # fmt: skip
    notifier = bot(slack)
    send_due_digests(store.digests, notifier, watermark=T0 + HOUR)  # the first day seen starts here
    send_due_digests(store.digests, notifier, watermark=T0 + 86400 + 900)
    assert texts(slack) == ["Cost waste on 2026-11-02: $34.00; most: team nlp $25.00; 1 still open, $10.00/h; 1 fixed"]
