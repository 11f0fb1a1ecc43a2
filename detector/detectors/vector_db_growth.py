"""``vector_db_growth``: a vector database on course to fill up, or growing unusually fast.

Example rule::

    - name: vector-db-growth
      type: vector_db_growth
      match: {resource_type: vector_db}
      params:
        horizon: 30d             # alert when the trend reaches capacity within this
        max_growth_per_day: 10%  # or when it grows faster than this, whatever the capacity
        window: 3d               # the trend is fitted over this trailing time
        min_history: 12h         # and only once the data spans this long
      severity: warning

A full vector database stops taking writes (or a managed one jumps a pricing tier),
and resizing one takes hours to days of re-indexing, so the alert comes a month ahead.
Size is ``storage_bytes`` (or ``vector_count`` × ``bytes_per_vector``) against
``capacity_bytes``; the trend is a least-squares line over the window, re-fitted
hourly, so a one-off bulk load or a compaction moves it little. One alert per
database while the trend holds: a new one only when the forecast comes closer by
``trend_change`` (half the time left, by default) on a fit of data newer than the last
alert (one ``window`` later, so the fit is not half old trend); it resolves when the forecast is well beyond the
horizon and the growth well under the rate (1.5x and 0.75x: no flapping at the edge).
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
from detector.units import Duration, Percent, rfc3339

__all__ = ["VectorDbGrowth", "VectorDbGrowthParams"]

GB = 1e9


class VectorDbGrowthParams(GrowthParams):
    horizon: Duration = Field(default=30 * DAY_S, gt=0)
    max_growth_per_day: Percent = 10.0
    bytes_per_vector: int = Field(default=6144, gt=0)
    """For databases that report only ``vector_count``: 1536 float32 dimensions."""
    trend_change: Percent = 50.0


class VectorDbGrowth(GrowthBase):
    type: ClassVar[str] = "vector_db_growth"
    title: ClassVar[str] = "Vector database filling up"
    Params: ClassVar[builtins.type[VectorDbGrowthParams]] = VectorDbGrowthParams
    consumes: ClassVar[tuple[builtins.type, ...]] = (UsageEvent,)
    suggestion: ClassVar[str] = (
        "Raise the database's capacity (or shard it) before the forecast date, or prune stale "
        "vectors; re-indexing into a bigger size takes time, so start now."
    )

    dollars: ClassVar[str] = ""
    burning: ClassVar[bool | str] = False
    """the database's running cost, not waste: a forecast's news is the date it fills,
    and its dollars per hour are no burn (the incidents list counted them)"""

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        facts = [
            ("Full by", f"{details.get('forecast_full') or 'not forecast'} ({details.get('days_to_full')} days)"),
            ("Fill", f"{details.get('fill_pct')} % of {details.get('capacity_gb')} GB"),
            ("Growth", f"{details.get('growth_gb_per_day', 0):,.1f} GB/day ({details.get('growth_pct_per_day', 0):.1f} %/day)"),
        ]
        tier = details.get("next_tier")
        if tier:
            facts.append(("Next size", f"{tier['name']}: ${tier['usd_per_month']:,.0f}/month"))
        return facts

    def step(self, state: GrowthState, ctx: Context, event: Event, t: float) -> list[Finding]:
        resource = ctx.resource
        if type(event) is not UsageEvent:
            return []
        st = state
        if event.capacity_bytes:
            st.capacity = float(event.capacity_bytes)
        if event.state == "terminated" and st.fired_at is not None and t > st.last_t:
            return end(st, partial(self._finding, "resolve", st, resource, t, self.current(st), reason="terminated"))
        if event.storage_bytes is not None:
            size = float(event.storage_bytes)
        elif event.vector_count is not None:
            size = float(event.vector_count * self.params.bytes_per_vector)
        else:
            return []
        trend = self.observe(st, t, size)
        if trend is None:
            return []
        days = self._days_to_full(st, trend)
        horizon_days = self.params.horizon / DAY_S
        at_risk = (days is not None and days <= horizon_days) or trend.pct_per_day >= self.params.max_growth_per_day
        if st.fired_at is None:
            if not at_risk:
                return []
            return [self._fire(st, resource, t, trend, days)]
        eased = (days is None or days > 1.5 * horizon_days) and trend.pct_per_day < 0.75 * self.params.max_growth_per_day
        if eased:
            return end(st, partial(self._finding, "resolve", st, resource, t, trend, reason="trend_eased"))
        if t - st.fired_at >= self.params.window and self._sooner((st.notified or {}).get("days"), days):
            resolved = end(st, partial(self._finding, "resolve", st, resource, t, trend, reason="trend_changed"))
            return [*resolved, self._fire(st, resource, t, trend, days)]  # a new episode, its own alert
        st.last_report = t  # every evaluation of an open episode reports its trend
        return [self._finding("update", st, resource, t, trend)]

    def open_episode(self, state: GrowthState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return self._finding("update", state, resource, state.last_t, self.current(state))

    def _fire(self, st: GrowthState, res: ResourceInfo, t: float, trend: Trend, days: float | None) -> Finding:
        action = fire(st, since=t, fired_at=t, at=t)
        st.notified = {"days": days}
        return self._finding(action, st, res, t, trend)

    def _sooner(self, before: float | None, now: float | None) -> bool:
        """Whether the forecast moved closer by ``trend_change`` of the time that was left."""
        if now is None:
            return False
        if before is None:
            return True
        return before - now > self.params.trend_change / 100.0 * max(before, 1.0)

    def _days_to_full(self, st: GrowthState, trend: Trend) -> float | None:
        if not st.capacity:
            return None
        if trend.size >= st.capacity:
            return 0.0
        return (st.capacity - trend.size) / trend.per_day if trend.per_day > 0 else None

    def _finding(self, action: str, st: GrowthState, res: ResourceInfo, at: float, trend: Trend,
                 **extra: object) -> Finding:  # fmt: skip
        assert st.since is not None and st.fired_at is not None
        days = self._days_to_full(st, trend)
        details: dict[str, Any] = {
            "size_gb": round(trend.size / GB, 3),
            "growth_gb_per_day": round(trend.per_day / GB, 3),
            "growth_pct_per_day": round(trend.pct_per_day, 3),
            "capacity_gb": round(st.capacity / GB, 3) if st.capacity else None,
            "fill_pct": round(100 * trend.size / st.capacity, 2) if st.capacity else None,
            "days_to_full": round(days, 2) if days is not None else None,
            "forecast_full": rfc3339(at + days * DAY_S) if days is not None else None,
            **extra,
        }
        tier = self.pricing.next_tier(res.resource_type or "vector_db", st.capacity) if st.capacity else None
        if tier is not None:
            details["next_tier"] = {"name": tier.name, "capacity_gb": tier.capacity_gb, "usd_per_month": tier.usd_per_month}
        return make_finding(self, action, res, episode_start=st.since, fired_at=st.fired_at, at=at, usd=0.0,
                            details=details)  # fmt: skip
