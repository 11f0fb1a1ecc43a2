"""Charts in the incident's thread: drawn from the stored events, uploaded after the alert."""

from __future__ import annotations

import json

import pytest

from detector.alerts import Alert
from detector.charts import ChartWorker, render_chart
from detector.delivery import Outbox
from detector.events import UsageEvent
from detector.slack import SlackNotifier
from detector.store import EventBatch
from detector.testing import LocalSlack
from tests.helpers import MIN, T0, at, timeline

PNG = b"\x89PNG\r\n\x1a\n"


def incident(rule_type: str, rid: str, **details) -> Alert:
    return Alert(alert_id="c0ffee0000000001", type=rule_type, rule=rule_type.replace("_", "-"), resource_id=rid,
                 status="firing", change="fired", severity="warning", episode_start=T0 + 20 * MIN,
                 fired_at=T0 + 50 * MIN, updated_at=T0 + 50 * MIN, waste_usd=16.0, usd_per_hour=32.0,
                 tags={"team": "nlp"}, details=details)  # fmt: skip


@pytest.fixture
def slack():
    with LocalSlack() as server:
        yield server


def stored(store, events) -> None:
    batch = EventBatch()
    batch.extend(events)
    store.events.insert(batch)


def test_idle_gpu_chart_is_uploaded_in_the_thread_after_the_alert_is_posted(store, slack):
    stored(store, timeline(T0, T0 + 20 * MIN, [90.0] * 4, rid="h1") + timeline(T0 + 20 * MIN, T0 + 60 * MIN, [0.5] * 4, rid="h1"))
    notifier = SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=2)
    outbox = Outbox(store, notifier, group_wait_s=0)
    charts = ChartWorker(store, notifier)  # not started yet: the alert must not wait for it
    outbox.on_opened = charts.submit
    alert = incident("idle_gpu", "h1")
    outbox.add([alert])
    assert outbox.deliver_pending() == 1
    assert [r.method for r in slack.requests] == ["chat.postMessage"]  # posted; the chart is still queued
    parent = slack.requests[0].response["ts"]
    charts.start()
    assert slack.wait_for(lambda reqs: any(r.method == "files.completeUploadExternal" for r in reqs), timeout=30)
    charts.stop()
    (complete,) = slack.calls("files.completeUploadExternal")
    assert complete.body["thread_ts"] == parent and complete.body["channel_id"] == "#ml-cost"
    (file_id,) = slack.uploads
    assert slack.uploads[file_id].startswith(PNG) and json.loads(complete.body["files"])[0]["id"] == file_id


def test_egress_and_growth_charts_are_drawn_from_stored_usage(store):
    def usage(t: float, **kw) -> UsageEvent:
        return UsageEvent(ts=at(t), resource_id="r", resource_type="x", interval_s=300.0, **kw)

    stored(store, [usage(T0 + k * 300, egress_bytes=(50 if 30 <= k < 40 else 2) * 10**9 // 12, dest_region="eu-west-1")
                   for k in range(48)])  # fmt: skip
    egress = render_chart(incident("egress_runaway", "r", baseline_gb_per_hour=2.0, dest_region="eu-west-1"), store)
    assert egress is not None and egress.startswith(PNG)
    store.client.command(f"TRUNCATE TABLE {store.db}.resource_usage")
    stored(store, [usage(T0 + k * 300, storage_bytes=int(7e12 + k * 1e9), capacity_bytes=int(10e12)) for k in range(48)])
    growth = render_chart(incident("vector_db_growth", "r", growth_gb_per_day=288.0, days_to_full=10.0), store)
    assert growth is not None and growth.startswith(PNG)


def test_types_without_a_chart_or_data_get_none(store):
    assert render_chart(incident("spot_eligible", "h9"), store) is None
    assert render_chart(incident("untagged", "h9"), store) is None  # charted, but nothing stored for h9
    assert render_chart(incident("idle_gpu", "no-such-host"), store) is None
