"""``storage_growth``: a checkpoint or dataset bucket that only ever grows.

Example rule::

    - name: storage-growth
      type: storage_growth
      match: {resource_type: storage_bucket}
      params:
        min_monthly_growth_usd: 50   # the bill must grow at least this much a month
        max_drop: 1%                 # a fall bigger than this is a retention policy at work
        window: 7d                   # the trend is fitted over this trailing time
        min_history: 1d              # and judged once it spans a day (a daily lifecycle shows)
      severity: info

Checkpoints and dataset copies accumulate because nobody set a lifecycle rule; each
month's bill is bigger than the last and nothing ever says so. A bucket is "growing
without bound" when its size has not fallen by more than ``max_drop`` anywhere in the
window (a retention or lifecycle policy deletes, which shows as a fall) and the trend
adds at least ``min_monthly_growth_usd`` to the monthly bill every month. A day of
history first, so a daily lifecycle job has had the chance to run. The alert gives
the monthly cost now and in 30 and 90 days if the trend continues; it resolves when a
deletion shows up or the growth slows under three quarters of the floor.
"""

from __future__ import annotations

import builtins
from functools import partial
from typing import Any, ClassVar

from pydantic import Field

from detector.detectors.base import Context, Finding, ResourceInfo, make_finding
from detector.detectors.episode import end, fire
from detector.detectors.growth import GrowthBase, GrowthParams, GrowthState, Trend
from detector.events import DAY_S, Event, UsageEvent
from detector.pricing import HOURS_PER_MONTH
from detector.units import Duration, Money, Percent

__all__ = ["StorageGrowth", "StorageGrowthParams", "StorageGrowthState"]

GB = 1e9


class StorageGrowthParams(GrowthParams):
    window: Duration = Field(default=7 * DAY_S, gt=0)
    min_history: Duration = Field(default=DAY_S, ge=0)
    min_monthly_growth_usd: Money = 50.0
    max_drop: Percent = 1.0


class StorageGrowthState(GrowthState, kw_only=True):
    usd_per_gb_month: float | None = None
    """The price per GB-month the bucket's usage was last billed at (None: none known: the
    pricing file's); snapshots saved before kept it in ``notified``, read into it."""

    def __post_init__(self) -> None:
        if self.notified and "usd_per_gb_month" in self.notified:
            self.usd_per_gb_month = float(self.notified.pop("usd_per_gb_month"))
        super().__post_init__()


class StorageGrowth(GrowthBase):
    type: ClassVar[str] = "storage_growth"
    title: ClassVar[str] = "Storage growing without bound"
    Params: ClassVar[builtins.type[StorageGrowthParams]] = StorageGrowthParams
    State = StorageGrowthState
    consumes: ClassVar[tuple[builtins.type, ...]] = (UsageEvent,)
    suggestion: ClassVar[str] = (
        "Add a lifecycle rule (expire old checkpoints, keep the last N; move cold datasets to an "
        "infrequent-access class) or delete what no run reads any more."
    )

    dollars: ClassVar[str] = ""
    burning: ClassVar[bool | str] = False
    """the bucket's whole storage bill, not waste: its news is the growth,
    and its dollars per hour are no burn (the incidents list counted them)"""

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        return [
            ("Size", f"{details.get('size_gb', 0):,.0f} GB, +{details.get('growth_gb_per_day', 0):,.0f} GB/day"),
            ("Monthly bill", f"${details.get('monthly_usd_now', 0):,.0f} now, ${details.get('monthly_usd_in_30d', 0):,.0f} "
                             f"in 30 days, ${details.get('monthly_usd_in_90d', 0):,.0f} in 90"),
        ]  # fmt: skip

    def step(self, state: StorageGrowthState, ctx: Context, event: Event, t: float) -> list[Finding]:
        resource = ctx.resource
        if type(event) is not UsageEvent or event.storage_bytes is None:
            return []
        st = state
        billed = self.pricer.storage_usd_per_gb_month(event)
        if billed is not None:
            st.usd_per_gb_month = billed
        trend = self.observe(st, t, float(event.storage_bytes))
        if trend is None:
            return []
        growth_usd = self._monthly_growth_usd(st, trend)
        unbounded = trend.drop * 100 <= self.params.max_drop
        if st.fired_at is None:
            if unbounded and growth_usd >= self.params.min_monthly_growth_usd:
                return [self._finding(fire(st, since=t, fired_at=t, at=t), st, resource, t, trend)]
            return []
        if not unbounded or growth_usd < 0.75 * self.params.min_monthly_growth_usd:
            reason = "deletions_seen" if not unbounded else "growth_slowed"
            return end(st, partial(self._finding, "resolve", st, resource, t, trend, reason=reason))
        st.last_report = t  # every evaluation of an open episode reports its trend
        return [self._finding("update", st, resource, t, trend)]

    def open_episode(self, state: StorageGrowthState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return self._finding("update", state, resource, state.last_t, self.current(state))

    def _price(self, st: StorageGrowthState) -> float:
        price = st.usd_per_gb_month
        return float(price if price is not None else self.pricing.storage_usd_per_gb_month)

    def _monthly_growth_usd(self, st: StorageGrowthState, trend: Trend) -> float:
        """How much the monthly bill grows each month on this trend."""
        return trend.per_day * 30 / GB * self._price(st)

    def _finding(self, action: str, st: StorageGrowthState, res: ResourceInfo, at: float, trend: Trend,
                 **extra: object) -> Finding:  # fmt: skip
        assert st.since is not None and st.fired_at is not None
        price = self._price(st)
        monthly = trend.size / GB * price
        details = {
            "size_gb": round(trend.size / GB, 3),
            "growth_gb_per_day": round(trend.per_day / GB, 3),
            "usd_per_gb_month": round(price, 5),
            "monthly_usd_now": round(monthly, 2),
            "monthly_usd_in_30d": round((trend.size + 30 * trend.per_day) / GB * price, 2),
            "monthly_usd_in_90d": round((trend.size + 90 * trend.per_day) / GB * price, 2),
            **extra,
        }
        return make_finding(self, action, res, episode_start=st.since, fired_at=st.fired_at, at=at, usd=0.0,
                            details=details, usd_per_hour=monthly / HOURS_PER_MONTH)  # fmt: skip
