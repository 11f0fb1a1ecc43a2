"""The size trend shared by ``vector_db_growth`` and ``storage_growth``.

Both watch a resource's ``storage_bytes`` over days: they keep one point per
15 minutes of event time over a trailing window, fit a least-squares line through
them once per ``evaluate_every``, and judge the slope. Fitting on a schedule keeps
the per-sample cost at an append.
"""

from __future__ import annotations

from typing import Any

import msgspec
from pydantic import Field

from detector.detectors.base import DetectorBase, Params
from detector.detectors.episode import Episode
from detector.detectors.growth_points import Points
from detector.events import DAY_S
from detector.units import Duration

__all__ = ["GrowthBase", "GrowthParams", "GrowthState", "Trend", "fit"]

POINT_S = 900.0


class GrowthParams(Params):
    window: Duration = Field(default=3 * DAY_S, gt=0)
    """The trend is fitted over this much trailing event time."""
    min_history: Duration = Field(default=12 * 3600.0, ge=0)
    """No judgement before the points span this long."""
    evaluate_every: Duration = Field(default=3600.0, gt=0)


class GrowthState(Episode, kw_only=True):
    points: Points = msgspec.field(default_factory=Points)
    """(t, bytes): the latest sample of each 15-minute slot inside the window (:class:`Points`:
    6 bytes a point while times and sizes are whole, 16 as doubles; saved as pairs flattened,
    ``t0, b0, t1, b1...``)."""
    last_t: float = 0.0
    evaluated_at: float = 0.0
    capacity: float | None = None
    notified: dict[str, Any] | None = None
    """The trend as last alerted, to tell a changed trend from noise (None: none, not an empty
    dict on every resource; an empty one saved before reads back as None)."""

    def __post_init__(self) -> None:
        if not self.notified:
            self.notified = None


class Trend(msgspec.Struct, kw_only=True, frozen=True):
    size: float
    """Latest size, bytes."""
    per_day: float
    """Fitted growth, bytes per day."""
    span_s: float
    drop: float
    """Largest fall from a previous high (drawdown), as a fraction of that high."""

    @property
    def pct_per_day(self) -> float:
        return 100.0 * self.per_day / self.size if self.size > 0 else 0.0


def fit(history: Points) -> Trend | None:
    """Least-squares slope through the (t, bytes) points of ``history``; None with fewer than four."""
    points = history.pairs()
    n = len(points)
    if n < 4:
        return None
    t0 = points[0][0]
    mean_t = sum(t - t0 for t, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((t - t0 - mean_t) ** 2 for t, _ in points)
    if var <= 0:
        return None
    slope = sum((t - t0 - mean_t) * (y - mean_y) for t, y in points) / var
    drop, peak = 0.0, 0.0
    for _, y in points:
        peak = max(peak, y)
        if peak > 0:
            drop = max(drop, (peak - y) / peak)
    return Trend(size=points[-1][1], per_day=slope * DAY_S, span_s=points[-1][0] - t0, drop=drop)


class GrowthBase(DetectorBase):
    """Keeps the points; subclasses judge a :class:`Trend` when one is due."""

    State = GrowthState

    def current(self, st: GrowthState) -> Trend:
        """The trend through the points held now (for reports at the end of data)."""
        trend = fit(st.points)
        if trend is not None:
            return trend
        size = st.points.last()[1] if st.points else 0.0
        return Trend(size=size, per_day=0.0, span_s=0.0, drop=0.0)

    def observe(self, st: GrowthState, t: float, size: float) -> Trend | None:
        """Record one sample; return a fresh trend when an evaluation is due, else None."""
        if t <= st.last_t:
            return None  # a re-read or late sample
        st.last_t = t
        points = st.points
        last_t = points.last()[0] if points else 0.0
        if points and t - last_t < POINT_S and int(t // POINT_S) == int(last_t // POINT_S):
            points.replace_last(t, size)
        else:
            points.add(t, size)
        points.forget_before(t - self.params.window)
        if t - st.evaluated_at < self.params.evaluate_every:
            return None
        trend = fit(st.points)
        if trend is None or trend.span_s < self.params.min_history:
            return None
        st.evaluated_at = t
        return trend
