"""The growth charts (``vector_db_growth``, ``storage_growth``): the size over the fitted
window, the trend carried forward, and the capacity it runs into (with the day it is full)
or the monthly bill it grows to."""

from __future__ import annotations

from typing import TYPE_CHECKING

from detector.alerts import Alert
from detector.charts import style
from detector.charts.window import number, stored_time, window
from detector.events import DAY_S
from detector.store.connection import Connection
from detector.units import money

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["GROWTH_TYPES", "growth_chart"]

GROWTH_TYPES = frozenset({"vector_db_growth", "storage_growth"})
FORECAST_DAYS = 30.0
"""How far a trend without a day it is full is carried forward (and at most this, ×3, with one)."""


def growth_chart(alert: Alert, store: Connection) -> Figure | None:
    """Size with its trend forecast and capacity line."""
    d = alert.details
    w = window(alert, before_s=(3 if alert.type == "vector_db_growth" else 7) * DAY_S, min_sample_s=300)
    rows = store.named("charts/growth", w.params(alert.resource_id))
    if not rows:
        return None
    times = [stored_time(r["t"]) for r in rows]
    w = w.fitted(times[0])
    sizes_gb = [r["size_bytes"] / 1e9 for r in rows]
    capacity_gb = number(d.get("capacity_gb")) or (rows[-1]["capacity"] or 0) / 1e9 or None
    per_day = number(d.get("growth_gb_per_day"))
    days_to_full = number(d.get("days_to_full"))
    horizon = min(days_to_full * 1.15, 3 * FORECAST_DAYS) if days_to_full else FORECAST_DAYS
    top = max([*sizes_gb, capacity_gb or 0.0])
    last_t, last = times[-1], sizes_gb[-1]
    end_t = last_t + horizon * DAY_S if per_day else last_t
    if per_day:
        top = max(top, last + per_day * horizon)
    unit, scale = ("TB", 1e-3) if top >= 1000 else ("GB", 1.0)
    fig, (ax,) = style.figure()
    ax.plot([style.utc(t) for t in times], [s * scale for s in sizes_gb], color=style.INK["ok"], label=f"size ({unit})",
            gid="series")  # fmt: skip
    if per_day:
        ax.plot([style.utc(last_t), style.utc(end_t)], [last * scale, (last + per_day * horizon) * scale],
                color=style.INK["forecast"], linestyle="--", linewidth=1.8, gid="forecast",
                label=f"trend: +{per_day:,.0f} GB/day")  # fmt: skip
    if capacity_gb:
        style.level_line(ax, capacity_gb * scale, f"capacity\n{capacity_gb * scale:,.3g} {unit}", "capacity")
        if days_to_full and per_day:
            full_t = last_t + days_to_full * DAY_S
            ax.plot([style.utc(full_t)], [capacity_gb * scale], marker="o", color=style.INK["capacity"], gid="full")
            ax.annotate(f"full {style.utc(full_t):%b %d}", xy=(style.utc(full_t), capacity_gb * scale),
                        xytext=(-6, -14), textcoords="offset points", ha="right", va="top", fontsize=9,
                        color=style.INK["capacity"], gid="full-label", parse_math=False)  # fmt: skip
    ax.set_ylim(bottom=0, top=top * scale * 1.12)
    ax.set_ylabel(unit)
    style.episode_marks(ax, w.start, w.fired_at, w.end, w.resolved)
    style.time_axis(ax, w.lo, max(w.hi, end_t + horizon * DAY_S * 0.03))
    if alert.type == "vector_db_growth":
        fill = number(d.get("fill_pct"))
        note = f"full in {days_to_full:,.0f} days" if days_to_full else "growing fast"
        note += f" · {fill:.0f}% full now" if fill is not None else ""
        if per_day:
            note += f" · +{number(d.get('growth_pct_per_day')) or 0:.1f}%/day"
        style.headline(ax, f"{alert.title}: {style.clip(alert.resource_id, 40)}", note=note)
    else:
        price = number(d.get("usd_per_gb_month"))
        if price:
            per_unit = price / scale  # $ a month per TB (or GB) stored
            bill = ax.secondary_yaxis("right", functions=(lambda v: v * per_unit, lambda v: v / per_unit))
            bill.set_ylabel("$ per month", fontsize=9)
            bill.yaxis.set_major_formatter(style.dollar_ticks())
        now, later = number(d.get("monthly_usd_now")), number(d.get("monthly_usd_in_30d"))
        note = (f"bill {money(now)}/month now → {money(later)} in 30 days"
                if now is not None and later is not None else "")  # fmt: skip
        style.headline(ax, f"{alert.title}: {style.clip(alert.resource_id, 40)}", note=note)
    style.legend(ax)
    return fig
