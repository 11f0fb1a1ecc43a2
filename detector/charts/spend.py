"""The spend charts: untagged spend by day (or hour), and a failed run's spend over its hours
(a crash loop's over its runs). Dollars are the stored intervals' (``resource_usage.usd``)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from detector.alerts import Alert
from detector.charts import style
from detector.charts.window import number, stored_time, window
from detector.events import DAY_S
from detector.store.connection import Connection
from detector.units import money

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["failed_run_chart", "untagged_chart"]


def untagged_chart(alert: Alert, store: Connection) -> Figure | None:
    """The resource's spend per UTC day (per hour for an episode under two days), the days
    since it went untagged in vermillion, those before in grey."""
    span = (alert.resolved_at or alert.updated_at) - alert.episode_start
    step = int(DAY_S) if span >= 2 * DAY_S else 3600
    w = window(alert, before_s=3 * step, before_share=0.15)
    params = {**w.params(alert.resource_id), "rids": [alert.resource_id], "step": step}
    rows = store.named("charts/spend", params)
    if not rows:
        return None
    w = w.fitted(stored_time(rows[0]["t"]))
    fig, (ax,) = style.figure()
    starts = [stored_time(r["t"]) for r in rows]
    untagged = [t + step > alert.episode_start for t in starts]
    colours = [style.INK["problem"] if u else style.INK["muted"] for u in untagged]
    ax.bar([style.utc(t) for t in starts], [r["usd"] for r in rows], width=step / DAY_S * 0.85, align="edge",
           color=colours, gid="spend")  # fmt: skip
    ax.set_ylim(0, max(r["usd"] for r in rows) * 1.2 or 1)
    ax.set_ylabel("$ per day" if step == DAY_S else "$ per hour")
    ax.yaxis.set_major_formatter(style.dollar_ticks())
    style.episode_marks(ax, w.start, w.fired_at, w.end, w.resolved)
    style.time_axis(ax, w.lo, w.hi)
    missing = alert.details.get("missing_tags") or []
    note = "missing " + ", ".join(style.clip(t, 20) for t in missing[:4]) if isinstance(missing, list) and missing else ""
    style.headline(ax, f"{alert.title}: {style.clip(alert.resource_id, 40)}", alert.waste_usd, alert.usd_per_hour,
                   alert.burning, what=alert.dollars, note=note)  # fmt: skip
    from matplotlib.patches import Patch

    keys = [Patch(color=style.INK["problem"], label=f"spend untagged, per {'day' if step == DAY_S else 'hour'}")]
    if not all(untagged):
        keys.append(Patch(color=style.INK["muted"], label="before (tagged or stopped)"))
    legend = fig.legend(handles=keys, loc="outside lower center", ncols=len(keys), fontsize=9, frameon=False)
    for text in legend.get_texts():
        text.set_parse_math(False)
    return fig


def failed_run_chart(alert: Alert, store: Connection) -> Figure | None:
    """A failed run: its share of its hosts' spend added up from its start to its failure, with
    the rule's floor. A crash loop: the failed runs, each as a bar of its hours, and their total."""
    d = alert.details
    if d.get("crash_loop"):
        return _crash_loop(alert, d.get("runs") or [])
    rids = [str(r) for r in d.get("resource_ids") or []][:64]
    w = window(alert, before_s=600, before_share=0.1, min_sample_s=60)
    rows = store.named("charts/spend", {**w.params(alert.resource_id), "rids": rids}) if rids else []
    rows = [r for r in rows if w.start - w.step_s < stored_time(r["t"]) <= alert.fired_at]
    if not rows:
        return None
    total = sum(r["usd"] for r in rows)
    # the run's share of its hosts (by GPU count); a dollar figure that is no number (a bad
    # price) or below zero draws its hosts' whole spend rather than an axis matplotlib refuses
    usd = alert.waste_usd
    share = usd / total if total > 0 and math.isfinite(usd) and usd >= 0 else 1.0
    times, spent, run = [style.utc(w.start)], [0.0], 0.0
    for r in rows:
        run += r["usd"] * share
        times.append(style.utc(min(stored_time(r["t"]) + w.step_s, alert.fired_at)))
        spent.append(run)
    fig, (ax,) = style.figure()
    ax.plot(times, spent, color=style.INK["problem"], linewidth=2, label="spent by the run", gid="series")
    ax.fill_between(times, 0, spent, color=style.INK["problem"], alpha=0.12, linewidth=0)
    floor = number(d.get("min_usd"))
    if floor is not None:
        style.level_line(ax, floor, f"alerts from\n{money(floor)}", "threshold")
    ax.set_ylim(bottom=0, top=max(spent[-1], floor or 0) * 1.15 or 1)
    ax.set_ylabel("$ spent")
    ax.yaxis.set_major_formatter(style.dollar_ticks())
    style.episode_marks(ax, w.start, w.fired_at, w.fired_at, resolved=False)
    style.time_axis(ax, w.lo, w.hi)
    error = style.clip(d.get("error") or "no error reported", 50)
    gpu_hours = number(d.get("gpu_hours"))
    note = f"{d.get('status', 'failed')}: {error}" + (f" · {gpu_hours:,.0f} GPU-hours" if gpu_hours else "")
    style.headline(ax, f"Failed run: {style.clip(d.get('run_id') or alert.resource_id, 40)}", alert.waste_usd,
                   alert.usd_per_hour, alert.burning, what=alert.dollars, note=note)  # fmt: skip
    style.legend(ax)
    return fig


def _crash_loop(alert: Alert, runs: list[Any]) -> Figure | None:
    spans: list[tuple[float, float, float]] = []
    for r in runs:
        start, end, usd = (number(r.get(k)) for k in ("start", "end", "usd")) if isinstance(r, dict) else (None,) * 3
        if start is not None and end is not None and end >= start:
            spans.append((start, end, usd or 0.0))
    spans.sort()
    if not spans:
        return None
    fig, (ax,) = style.figure()
    total, xs, ys, fails = 0.0, [], [], []
    for start, end, usd in spans:  # spent while each run ran, flat between runs
        xs += [style.utc(start), style.utc(end)]
        ys += [total, total + usd]
        total += usd
        fails.append((style.utc(end), total))
        ax.axvspan(style.utc(start), style.utc(end), color=style.INK["problem"], alpha=0.12, linewidth=0, gid="run")
    ax.plot(xs, ys, color=style.INK["problem"], linewidth=2, label="spent by the failed runs", gid="series")
    ax.plot([f[0] for f in fails], [f[1] for f in fails], "x", color=style.INK["threshold"], markersize=9,
            markeredgewidth=2, label="a run failed", gid="failures")  # fmt: skip
    ax.set_ylim(bottom=0, top=total * 1.15 or 1)
    ax.set_ylabel("$ spent")
    ax.yaxis.set_major_formatter(style.dollar_ticks())
    end = alert.resolved_at if alert.resolved_at is not None else max(alert.updated_at, spans[-1][1])
    style.episode_marks(ax, alert.episode_start, alert.fired_at, end, alert.resolved_at is not None)
    lo, hi = min(spans[0][0], alert.episode_start), max(end, spans[-1][1])
    style.time_axis(ax, lo - (hi - lo) * 0.05, hi + (hi - lo) * 0.05)
    errors = alert.details.get("errors") or []
    note = f"{len(spans)} failed runs" + (f" · {style.clip(', '.join(map(str, errors[:3])), 50)}" if errors else "")
    style.headline(ax, f"Crash loop: {style.clip(alert.details.get('project') or alert.resource_id, 40)}",
                   alert.waste_usd, alert.usd_per_hour, alert.burning, what=alert.dollars, note=note)  # fmt: skip
    style.legend(ax)
    return fig
