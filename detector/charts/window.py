"""The stretch of event time a chart shows, and the time step its query groups samples by.

A chart shows the episode with context on either side: some time before its start (the
usual level, what changed) and a little after its end. Its query groups samples into about
:data:`POINTS` steps, so a 30-day episode is as quick to draw (and as readable) as a
30-minute one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from detector.alerts import Alert

__all__ = ["POINTS", "STEPS", "Window", "number", "stored_time", "window"]

POINTS = 360
"""About this many time steps across a chart: more than the eye resolves at Slack's width."""
STEPS = (30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
"""The steps a chart groups by: whole multiples of the usual sampling intervals (30 s, 1 min,
5 min), so every step holds samples and a series shows no gaps that are not in the data."""


@dataclass(frozen=True)
class Window:
    """A chart's span (``lo``..``hi``, epoch s) and its alert's moments."""

    lo: float
    hi: float
    start: float
    fired_at: float
    end: float
    resolved: bool
    step_s: int

    def fitted(self, first: float) -> Window:
        """The span starting with the data (``first``: its earliest time) when there is none
        for part of the time before the episode: a blank stretch at the left says nothing. So
        too when the data starts well into the episode (a host idle for 60 days whose events
        have aged out after 30): the chart shows what is stored, and its start, off the left,
        is written at the left edge (:func:`detector.charts.style.finish`)."""
        late = first > self.start + (self.hi - self.lo) / 10
        lo = max(self.lo, (first if late else min(first, self.start)) - 2 * self.step_s)
        hi = min(self.hi, self.end + (self.end - lo) / 20) if late else self.hi  # a twentieth of what is shown
        return Window(lo=lo, hi=hi, start=self.start, fired_at=self.fired_at, end=self.end, resolved=self.resolved,
                      step_s=self.step_s)  # fmt: skip

    def params(self, rid: str, **extra: object) -> dict[str, object]:
        """Query parameters: the resource, the span in epoch milliseconds, the step in seconds."""
        return {"rid": rid, "lo": int(self.lo * 1000), "hi": int(self.hi * 1000) + 1, "step": self.step_s, **extra}


def window(alert: Alert, before_s: float, min_sample_s: float = 30.0, before_share: float = 0.3) -> Window:
    """The chart of ``alert``: from ``before_s`` (or ``before_share`` of the episode, the longer)
    before its start to its end (its resolution, or its latest update) plus a twentieth."""
    end = alert.resolved_at if alert.resolved_at is not None else max(alert.updated_at, alert.fired_at)
    span = max(end - alert.episode_start, 60.0)
    lo = alert.episode_start - max(before_s, before_share * span)
    hi = end + span / 20
    step = next((s for s in STEPS if s >= max(min_sample_s, (hi - lo) / POINTS)), STEPS[-1])
    return Window(lo=lo, hi=hi, start=alert.episode_start, fired_at=alert.fired_at, end=end,
                  resolved=alert.resolved_at is not None, step_s=step)  # fmt: skip


def stored_time(t: datetime) -> float:
    """A time read from the store (naive UTC, or aware) as epoch seconds."""
    return t.timestamp() if t.tzinfo else t.replace(tzinfo=timezone.utc).timestamp()


def number(value: Any) -> float | None:
    """A detail that should be a finite number, or None (details come from stored JSON)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None
