"""The storage_growth detector on crafted bucket sizes (one sample every 5 minutes)."""

from __future__ import annotations

import pytest

from detector.engine import Engine
from detector.events import UsageEvent
from tests.helpers import T0, at

TB, GB, DAY = 1e12, 1e9, 86_400.0
STEP = 300.0


def sample(t: float, size: float, with_cost: bool = True) -> UsageEvent:
    cost = size / GB * 0.023 / 730 * STEP / 3600 if with_cost else None
    return UsageEvent(ts=at(t), resource_id="ckpt", resource_type="storage_bucket", account="acct",
                      region="us-east-1", interval_s=STEP, cost_usd=cost, storage_bytes=int(size),
                      tags={"team": "nlp", "project": "llm"})  # fmt: skip


def series(size, days: float, **kw) -> list[UsageEvent]:
    return [sample(T0 + k * STEP, size(k * STEP / DAY), **kw) for k in range(int(days * DAY / STEP))]


def findings(ruleset, events):
    return [f for f in Engine(ruleset).process(events) if f.type == "storage_growth"]


@pytest.mark.parametrize("with_cost", [True, False], ids=["billed-cost", "price-list"])
def test_unbounded_growth_fires_once_with_the_monthly_cost_trend(ruleset, with_cost):
    # 40 TB adding 1 TB a day at $0.023/GB-month: the bill grows $690 a month, every month.
    found = findings(ruleset, series(lambda d: 40 * TB + 1 * TB * d, 3, with_cost=with_cost))
    assert [f.action for f in found].count("fire") == 1 and found[0].action == "fire"
    fire = found[0]
    assert T0 + DAY <= fire.fired_at <= T0 + DAY + 3600  # after a day of history
    assert fire.details["growth_gb_per_day"] == pytest.approx(1000, rel=0.01)
    assert fire.details["monthly_usd_now"] == pytest.approx(41_000 * 0.023, rel=0.01)
    assert fire.details["monthly_usd_in_30d"] - fire.details["monthly_usd_now"] == pytest.approx(690, rel=0.01)
    assert fire.usd_per_hour == pytest.approx(41_000 * 0.023 / 730, rel=0.01)


def sawtooth(d: float) -> float:
    """A checkpoint bucket with a lifecycle rule: 3 TB a day written, expired back nightly."""
    return 10 * TB + 3 * TB * (d % 1.0)


@pytest.mark.parametrize(
    "size, days",
    [
        (sawtooth, 3),  # deletions show: a retention policy is at work
        (lambda d: 40 * TB + 20 * GB * d, 3),  # 20 GB a day: the bill grows $14 a month, under $50
        (lambda d: 40 * TB + 1 * TB * d, 0.9),  # growing fast, but less than a day seen
    ],
    ids=["lifecycle", "slow", "short-history"],
)
def test_no_alert(ruleset, size, days):
    assert findings(ruleset, series(size, days)) == []


def test_resolves_when_deletions_start(ruleset):
    events = series(lambda d: 40 * TB + 1 * TB * d if d < 2 else 42 * TB - 5 * TB * (d - 2), 2.5)
    found = [f for f in findings(ruleset, events) if f.action != "update"]
    assert [(f.action, f.details.get("reason")) for f in found] == [("fire", None), ("resolve", "deletions_seen")]


def test_the_billed_price_saved_in_notified_before_reads_back_into_its_field():
    """The price per GB-month the bucket was billed at is a field now, and ``notified`` is None
    while empty (not a dict on every bucket): a state saved by the version before, with the price
    in ``notified`` or an empty one, restores to the same price, and round-trips."""
    import msgspec

    from detector.detectors.growth import GrowthState
    from detector.detectors.storage_growth import StorageGrowthState
    from detector.floats import dec_hook, enc_hook

    old = msgspec.msgpack.encode({"points": [1.0, 10.0], "notified": {"usd_per_gb_month": 0.0125}, "last_t": 1.0})
    restored = msgspec.msgpack.decode(old, type=StorageGrowthState, dec_hook=dec_hook)
    assert restored.usd_per_gb_month == 0.0125 and restored.notified is None and list(restored.points) == [1.0, 10.0]
    again = msgspec.msgpack.encode(restored, enc_hook=enc_hook)
    assert msgspec.msgpack.decode(again, type=StorageGrowthState, dec_hook=dec_hook) == restored
    empty = msgspec.msgpack.decode(msgspec.msgpack.encode({"notified": {}}), type=GrowthState, dec_hook=dec_hook)
    assert empty.notified is None and GrowthState().notified is None
