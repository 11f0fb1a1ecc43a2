"""The period of ``burnwatch query REPORT --since D``: whole hours ending at the newest event time.

The demo's fleet ends with runs resolved exactly at midnight; the period used to end one
second later and so start one second past the first hour, leaving that hour's rollup out:
``untagged --since 1d`` read 23 hours, ``egress --since 1d`` did not give docs/postmortem.md's
figures."""

from __future__ import annotations

from datetime import datetime, timezone

from detector.events import UsageEvent
from detector.reports import newest_event_time, period, run_report
from detector.store import EventBatch
from tests.helpers import MIN, T0, at, usage

HOUR = 3600.0
DAY = 86_400.0


def _fill(store, hours: int) -> None:
    """``hours`` of an untagged host at $10/h and a sender of 1 GB a minute, then a run's
    alert resolved exactly at the end, on the hour (as the demo's last run events are)."""
    batch = EventBatch()
    minutes = range(int(hours * 60))
    batch.extend([usage(T0 + i * MIN, rid="untagged-host", usd_per_hour=10.0, tags={}) for i in minutes])
    batch.extend([
        UsageEvent(ts=at(T0 + i * MIN), resource_id="sender", resource_type="cpu_instance", region="us-east-1",
                   interval_s=60.0, cost_usd=0.01, egress_bytes=1_000_000_000, dest_region="eu-west-1",
                   tags={"team": "research"})
        for i in minutes
    ])  # fmt: skip
    store.events.insert(batch)
    end = datetime.fromtimestamp(T0 + hours * HOUR, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    store.client.command(
        f"INSERT INTO {store.db}.alerts (alert_id, type, rule, resource_id, status, episode_start, fired_at, "
        f"updated_at, resolved_at) VALUES ('run-alert', 'failed_run_spend', 'failed-run-spend', 'run-1', "
        f"'resolved', '{end}', '{end}', '{end}', '{end}')"
    )


def test_since_1d_reads_24_whole_hours_when_the_newest_change_is_on_the_hour(store):
    _fill(store, hours=48)
    (untagged,) = run_report(store, "untagged", DAY)
    assert untagged["usd"] == 240.0 and untagged["usd_per_hour"] == 10.0  # 24 hours of $10, not 23
    (egress,) = run_report(store, "egress", DAY)
    assert egress["gb"] == 24 * 60.0  # 1 GB a minute for 24 hours
    assert newest_event_time(store) == T0 + 48 * HOUR
    since, until = period(store, DAY)
    assert (since.timestamp(), until.timestamp()) == (T0 + 24 * HOUR, T0 + 48 * HOUR)


def test_the_period_ends_at_the_end_of_the_newest_hour(store):
    _fill(store, hours=3)
    batch = EventBatch()
    batch.extend([usage(T0 + 3 * HOUR + 10 * MIN, rid="untagged-host", usd_per_hour=10.0, tags={})])
    store.events.insert(batch)
    since, until = period(store, 2 * HOUR)
    assert (since.timestamp(), until.timestamp()) == (T0 + 2 * HOUR, T0 + 4 * HOUR)
    (untagged,) = run_report(store, "untagged", 2 * HOUR)
    assert untagged["usd"] == round(10.0 + 10.0 / 60, 2)  # hour 2 whole, and the one minute of hour 3


def test_an_empty_store_has_no_newest_event_time(store):
    assert newest_event_time(store) is None
    assert run_report(store, "untagged", DAY) == []


def test_a_since_of_part_of_an_hour_reaches_back_to_the_whole_hour(store):
    """The reports read hourly rollups keyed by the hour's start: a period starting at 22:30 left the
    22:00 rollup out, so ``--since 90m`` read one hour (and ``untagged`` said half the burn rate, over the
    two hours dateDiff counts) and ``--since 30m`` read none. It now starts on the hour before."""
    _fill(store, hours=3)
    since, until = period(store, 1.5 * HOUR)
    assert (since.timestamp(), until.timestamp()) == (T0 + 1 * HOUR, T0 + 3 * HOUR)
    (untagged,) = run_report(store, "untagged", 1.5 * HOUR)
    assert untagged["usd"] == 20.0 and untagged["usd_per_hour"] == 10.0
    (untagged,) = run_report(store, "untagged", 30 * MIN)
    assert untagged["usd"] == 10.0 and untagged["usd_per_hour"] == 10.0
