"""The vector_db_growth detector on crafted size series (one sample every 5 minutes)."""

from __future__ import annotations

import pytest

from detector.engine import Engine
from detector.events import UsageEvent
from tests.helpers import T0, at

TB, GB, DAY = 1e12, 1e9, 86_400.0
STEP = 300.0


def sample(t: float, size: float, capacity: float | None = 10 * TB, vectors: bool = False) -> UsageEvent:
    return UsageEvent(ts=at(t), resource_id="vdb-1", resource_type="vector_db", account="acct", region="us-east-1",
                      interval_s=STEP, cost_usd=0.5, capacity_bytes=int(capacity) if capacity else None,
                      storage_bytes=None if vectors else int(size), vector_count=int(size / 6144) if vectors else None,
                      tags={"team": "search", "project": "rag"})  # fmt: skip


def series(size, days: float, **kw) -> list[UsageEvent]:
    """``size(elapsed_days)`` in bytes, sampled every 5 minutes for ``days``."""
    return [sample(T0 + k * STEP, size(k * STEP / DAY), **kw) for k in range(int(days * DAY / STEP))]


def findings(ruleset, events):
    return [f for f in Engine(ruleset).process(events) if f.type == "vector_db_growth"]


def test_forecast_within_horizon_fires_once_with_date_fill_and_next_tier(ruleset):
    # 7 TB of 10 TB, adding 150 GB a day: full in 20 days.
    found = findings(ruleset, series(lambda d: 7 * TB + 150 * GB * d, 3))
    fires = [f for f in found if f.action == "fire"]
    assert len(fires) == 1 and all(f.action == "update" for f in found[1:])  # one alert while the trend holds
    fire = fires[0]
    assert T0 + 12 * 3600 <= fire.fired_at <= T0 + 13.5 * 3600  # as soon as 12 h of history exist
    assert fire.details["days_to_full"] == pytest.approx((3 * TB - 0.5 * 150 * GB) / (150 * GB), rel=0.03)
    assert fire.details["growth_gb_per_day"] == pytest.approx(150, rel=0.02)
    assert fire.details["fill_pct"] == pytest.approx(70.75, abs=0.2)
    assert fire.details["next_tier"] == {"name": "20TB", "capacity_gb": 20000, "usd_per_month": 9200}
    assert fire.details["forecast_full"].startswith("2026-11-2")


def test_fast_growth_fires_even_far_from_capacity(ruleset):
    # 0.5 TB growing 100 GB a day (20 % a day): capacity is 95 days away, the rate is the news.
    (fire,) = [f for f in findings(ruleset, series(lambda d: 0.5 * TB + 100 * GB * d, 1)) if f.action == "fire"]
    assert fire.details["growth_pct_per_day"] >= 10 and fire.details["days_to_full"] > 30


@pytest.mark.parametrize(
    "size, days, kw",
    [
        # 5 TB adding 20 GB a day: full in 250 days
        (lambda d: 5 * TB + 20 * GB * d, 3, {}),
        # flat, with compactions taking 1 % away now and then
        (lambda d: 6 * TB * (0.99 if int(d * 24) % 7 == 0 else 1.0), 3, {}),
        # fast growth, but only 10 hours of data: no trend yet
        (lambda d: 7 * TB + 500 * GB * d, 10 / 24, {}),
        # no capacity reported and a modest rate: nothing to forecast against
        (lambda d: 7 * TB + 150 * GB * d, 3, {"capacity": None}),
    ],
    ids=["slow", "flat-with-compactions", "short-history", "no-capacity"],
)
def test_no_alert(ruleset, size, days, kw):
    assert findings(ruleset, series(size, days, **kw)) == []


def test_vector_count_stands_in_for_bytes(ruleset):
    found = findings(ruleset, series(lambda d: 7 * TB + 150 * GB * d, 1, vectors=True))
    assert [f.action for f in found][:1] == ["fire"]


def test_a_changed_trend_is_a_new_alert_and_an_eased_one_resolves(ruleset):
    # 20 days to full for a day and a half, then four times the ingestion, then it stops.
    def size(d: float) -> float:
        if d < 1.5:
            return 6 * TB + 150 * GB * d
        if d < 4:
            return 6 * TB + 225 * GB + 600 * GB * (d - 1.5)
        return 6 * TB + 225 * GB + 1500 * GB

    found = [f for f in findings(ruleset, series(size, 8)) if f.action != "update"]
    assert [(f.action, f.details.get("reason")) for f in found] == [
        ("fire", None), ("resolve", "trend_changed"), ("fire", None), ("resolve", "trend_eased"),
    ]  # fmt: skip
    assert found[2].details["days_to_full"] < found[0].details["days_to_full"] / 2
    assert found[2].episode_start > found[0].episode_start
