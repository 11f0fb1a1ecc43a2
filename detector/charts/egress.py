"""The egress chart: the rate to the alert's destination against its usual level and the
rule's multiple of it, over the runaway and the hours before."""

from __future__ import annotations

from typing import TYPE_CHECKING

from detector.alerts import Alert
from detector.charts import style
from detector.charts.window import number, stored_time, window
from detector.store.connection import Connection

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["egress_chart"]


def egress_chart(alert: Alert, store: Connection) -> Figure | None:
    """Egress GB/h with the usual (24 h median) and the runaway line (``multiple`` × usual)."""
    d = alert.details
    dest = str(d.get("dest_region") or "")
    w = window(alert, before_s=6 * 3600, min_sample_s=60)
    rows = store.named("charts/egress", w.params(alert.resource_id, dest="" if dest == "internet" else dest))
    if not rows:
        return None
    fig, (ax,) = style.figure()
    times = [style.utc(stored_time(r["t"])) for r in rows]
    ax.plot(times, [r["gb_per_hour"] for r in rows], color=style.INK["ok"], label="egress GB/h", gid="series")
    baseline = number(d.get("baseline_gb_per_hour"))
    multiple = number(d.get("multiple"))
    if baseline is not None:
        style.level_line(ax, baseline, f"usual (24 h)\n{baseline:,.1f} GB/h", "usual")
        if multiple is not None:
            style.level_line(ax, baseline * multiple, f"runaway\n> {multiple:g}× usual", "threshold")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("GB per hour")
    style.episode_marks(ax, w.start, w.fired_at, w.end, w.resolved)
    style.time_axis(ax, w.lo, w.hi)
    excess = number(d.get("excess_gb"))
    note = f"{excess:,.0f} GB over usual" if excess is not None else ""
    style.headline(ax, f"Egress runaway: {style.clip(alert.resource_id, 36)} → {style.clip(dest or '?', 20)}",
                   alert.waste_usd, alert.usd_per_hour, alert.burning, what=alert.dollars, note=note)  # fmt: skip
    return fig
