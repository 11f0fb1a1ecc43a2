"""The unused commitment chart: each UTC day's commitment, the part used and the part paid
for unused, with the unused share written on each day."""

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

__all__ = ["commitment_chart"]


def commitment_chart(alert: Alert, store: Connection) -> Figure | None:
    """Used and unused dollars per day, stacked, the days of the episode marked."""
    w = window(alert, before_s=5 * DAY_S, min_sample_s=DAY_S)
    rows = [r for r in store.named("charts/commitment", w.params(alert.resource_id)) if r["unused_usd"] or r["used_usd"]]
    if not rows:
        return None
    days = [style.utc(stored_time(r["t"])) for r in rows]
    used = [float(r["used_usd"] or 0.0) for r in rows]
    unused = [float(r["unused_usd"] or 0.0) for r in rows]
    fig, (ax,) = style.figure()
    ax.bar(days, used, width=0.8, align="edge", color=style.INK["ok"], label="used", gid="used")
    ax.bar(days, unused, width=0.8, align="edge", bottom=used, color=style.INK["problem"], label="paid for, unused",
           gid="unused")  # fmt: skip
    top = max(u + v for u, v in zip(used, unused, strict=True))
    if len(days) <= 20:
        for day, u, v in zip(days, used, unused, strict=True):
            if u + v > 0:
                ax.annotate(f"{100 * v / (u + v):.0f}%", xy=(day, u + v), xytext=(14, 2), textcoords="offset points",
                            ha="center", va="bottom", fontsize=8, color=style.INK["problem"], gid="unused-share",
                            parse_math=False)  # fmt: skip
    ax.set_ylim(0, top * 1.18 or 1)
    ax.set_ylabel("$ per day")
    ax.yaxis.set_major_formatter(style.dollar_ticks())
    style.episode_marks(ax, w.start, w.fired_at, w.end + DAY_S if not w.resolved else w.end, w.resolved)
    style.time_axis(ax, min(w.lo, stored_time(rows[0]["t"]) - DAY_S / 4), max(w.hi, stored_time(rows[-1]["t"]) + 1.1 * DAY_S))
    d = alert.details
    name = style.clip(d.get("commitment_name") or alert.resource_id, 40)
    share = d.get("unused_share")
    note = f"{100 * share:.0f}% unused on {d.get('day')}" if isinstance(share, int | float) else ""
    floor_pct, floor_usd = number(d.get("min_unused_share")), number(d.get("min_unused_usd"))
    if note and floor_pct is not None and floor_usd is not None:  # the rule's line, in words
        note += f" (alerts from {floor_pct:g}% and {money(floor_usd)}/day)"
    style.headline(ax, f"{alert.title}: {name}", alert.waste_usd, alert.usd_per_hour, alert.burning,
                   what=alert.dollars, note=note)  # fmt: skip
    style.legend(ax)
    return fig
