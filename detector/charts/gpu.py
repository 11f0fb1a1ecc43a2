"""The GPU charts (idle, partly idle, unallocated, stuck, an overprovisioned endpoint).

A host of eight GPUs drawn as eight lines is a tangle nobody reads. So the GPUs are split
into the ones the alert is about (idle, stuck) and the others (busy), each group drawn as
its median with a band from its lowest to its highest GPU, and counted in the legend
("idle: 7 of 8 GPUs"). Under it, one row per GPU coloured by its activity shows which GPUs
they were (the alert's GPUs' labels in vermillion). A host of up to four GPUs gets a line
per GPU instead, coloured by its group. The rule's threshold and the host's usual level
before the episode are labelled lines.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from detector.alerts import Alert
from detector.charts import style
from detector.charts.window import Window, number, stored_time, window
from detector.detectors.gpu_share import gpu_names
from detector.store.connection import Connection

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["GPU_TYPES", "gpu_chart"]

GPU_TYPES = frozenset({"idle_gpu", "partly_idle_gpu", "unallocated_gpu", "stuck_gpu", "inference_overprovisioned"})
LINES_UP_TO = 4
"""Hosts with at most this many GPUs get a line per GPU; more are drawn as groups."""


@dataclass
class Grid:
    """Each GPU's values on one time grid (NaN where a GPU sent nothing in a step)."""

    times: list[float]
    gpus: list[int]
    activity: dict[int, list[float]]
    util: dict[int, list[float]]
    work: dict[int, list[float]]

    @property
    def dates(self) -> list[datetime]:
        return [style.utc(t) for t in self.times]


def _grid(rows: list[dict[str, Any]]) -> Grid:
    times = sorted({stored_time(r["t"]) for r in rows})
    pos = {t: i for i, t in enumerate(times)}
    gpus = sorted({int(r["gpu_index"]) for r in rows})
    nan = float("nan")
    grid = Grid(times, gpus, {}, {}, {})
    for g in gpus:
        grid.activity[g], grid.util[g], grid.work[g] = [nan] * len(times), [nan] * len(times), [nan] * len(times)
    for r in rows:
        g, i = int(r["gpu_index"]), pos[stored_time(r["t"])]
        grid.activity[g][i] = float(r["activity_pct"])
        grid.util[g][i] = float(r["util_mean"])
        grid.work[g][i] = nan if r["work_pct"] is None else float(r["work_pct"])
    return grid


def _finite(values: list[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


def _usual(grid: Grid, values: dict[int, list[float]], before: float) -> float | None:
    """The host's median before the episode (None: no sample before it)."""
    seen = [v for g in grid.gpus for t, v in zip(grid.times, values[g], strict=True) if t < before and not math.isnan(v)]
    return statistics.median(seen) if seen else None


def _flagged(alert: Alert, grid: Grid, w: Window, threshold: float | None) -> list[int]:
    """The GPUs the alert is about: those it lists, all of an idle or stuck host, else those
    under the threshold over the episode."""
    listed = alert.details.get("gpus_idle")
    if isinstance(listed, list) and listed:
        return [g for g in grid.gpus if g in {int(x) for x in listed if isinstance(x, int | float)}]
    if alert.type in ("idle_gpu", "stuck_gpu"):
        return list(grid.gpus)
    if threshold is None:
        return []
    out = []
    for g in grid.gpus:
        during = _finite([v for t, v in zip(grid.times, grid.activity[g], strict=True) if w.start <= t <= w.end])
        if during and statistics.mean(during) < threshold:
            out.append(g)
    return out


def _band(ax: Any, grid: Grid, values: dict[int, list[float]], gpus: list[int], colour: str, label: str,
          gid: str, lines: bool) -> None:  # fmt: skip
    """A group of GPUs: a line each (``lines``), or the median and the low-high band."""
    if not gpus:
        return
    dates = grid.dates
    if lines:
        for k, g in enumerate(gpus):
            ax.plot(dates, values[g], color=colour, linewidth=1.6, alpha=0.9, gid=f"{gid}-gpu{g}",
                    label=label if k == 0 else None, linestyle=("-", "--", "-.", ":")[k % 4])  # fmt: skip
        return
    lows, mids, highs = [], [], []
    for i in range(len(grid.times)):
        col = _finite([values[g][i] for g in gpus])
        lows.append(min(col) if col else float("nan"))
        mids.append(statistics.median(col) if col else float("nan"))
        highs.append(max(col) if col else float("nan"))
    ax.fill_between(dates, lows, highs, color=colour, alpha=0.2, linewidth=0, gid=f"{gid}-band")
    ax.plot(dates, mids, color=colour, linewidth=2, label=label, gid=gid)


def _count(k: int, n: int) -> str:
    """``"5 of 8 GPUs"``, ``"all 8 GPUs"``, ``"its GPU"``."""
    if n == 1:
        return "its GPU" if k else "no GPU"
    return f"all {n} GPUs" if k == n else f"{k} of {n} GPUs"


def _heatmap(ax: Any, grid: Grid, values: dict[int, list[float]], flagged: list[int], what: str) -> Any:
    """One row per GPU, coloured by ``values`` (cividis: dark is idle, bright busy)."""
    from matplotlib.dates import date2num

    nums = [date2num(d) for d in grid.dates]
    step = min((b - a for a, b in zip(nums, nums[1:], strict=False)), default=1 / 1440)
    columns = max(1, round((nums[-1] - nums[0]) / step) + 1)
    nan = float("nan")
    rows = [[nan] * columns for _ in grid.gpus]  # on a regular grid: a step no GPU reported stays blank
    for k, g in enumerate(grid.gpus):
        for x, v in zip(nums, values[g], strict=True):
            rows[k][min(columns - 1, round((x - nums[0]) / step))] = v
        for i in range(1, columns):  # a step between two samples' steps: the earlier one's value
            if math.isnan(rows[k][i]) and i + 1 < columns and not math.isnan(rows[k][i + 1]):
                rows[k][i] = rows[k][i - 1]
    mesh = ax.imshow(rows, cmap="cividis", vmin=0, vmax=100, aspect="auto", interpolation="nearest", gid="gpu-heatmap",
                     extent=(nums[0], nums[0] + columns * step, len(grid.gpus), 0))  # fmt: skip
    every = max(1, math.ceil(len(grid.gpus) / 8))
    ticks = list(range(0, len(grid.gpus), every))
    ax.set_yticks([i + 0.5 for i in ticks], [f"GPU {grid.gpus[i]}" for i in ticks])
    for label, i in zip(ax.get_yticklabels(), ticks, strict=True):
        if grid.gpus[i] in flagged:
            label.set_color(style.INK["problem"])
            label.set_fontweight("bold")
    ax.grid(False)
    ax.tick_params(axis="y", labelsize=8 if len(ticks) > 4 else 9)
    bar = ax.figure.colorbar(mesh, ax=ax.figure.axes, pad=0.01, fraction=0.025, shrink=0.3, anchor=(0.0, 0.0))
    bar.set_label(what, fontsize=8)
    bar.ax.tick_params(labelsize=8)
    return mesh


def gpu_chart(alert: Alert, store: Connection) -> Figure | None:
    """Activity of the host's GPUs over the episode, grouped, with the rule's threshold."""
    w = window(alert, before_s=1800)
    rows = store.named("charts/gpu", w.params(alert.resource_id))
    if not rows:
        return None
    grid = _grid(rows)
    w = w.fitted(grid.times[0])
    d = alert.details
    stuck = alert.type == "stuck_gpu"
    inference = alert.type == "inference_overprovisioned"
    threshold = number(d.get("util_above_pct" if stuck else "util_p95_below_pct" if inference else "util_below_pct"))
    flagged = [] if inference else _flagged(alert, grid, w, threshold)
    others = [g for g in grid.gpus if g not in flagged]
    many = len(grid.gpus) > LINES_UP_TO
    fig, axes = style.figure(rows=2 if len(grid.gpus) > 1 else 1, height_ratios=[3, 1.4] if len(grid.gpus) > 1 else None)
    ax = axes[0]
    n = len(grid.gpus)
    what = "stuck" if stuck else "idle"
    if stuck:
        _band(ax, grid, grid.util, grid.gpus, style.INK["problem"], f"utilisation (says busy): {n} GPUs", "stuck", not many)
        if any(_finite(grid.work[g]) for g in grid.gpus):
            _band(ax, grid, grid.work, grid.gpus, style.INK["ok"], "SM / tensor / DRAM activity (what runs)", "work",
                  not many)  # fmt: skip
        usual = _usual(grid, grid.work, w.start)
        usual_label = "work before"
    elif inference:
        _band(ax, grid, grid.activity, grid.gpus, style.INK["ok"], f"utilisation: {n} GPU{'s' * (n != 1)}", "gpus", not many)
        usual = number(d.get("util_p95_pct"))
        usual_label = "p95 (24 h)"
    else:
        _band(ax, grid, grid.activity, flagged, style.INK["problem"], f"{what}: {_count(len(flagged), n)}", "idle", not many)
        _band(ax, grid, grid.activity, others, style.INK["ok"], f"busy: {_count(len(others), n)}", "busy", not many)
        usual = _usual(grid, grid.activity, w.start)
        usual_label = "usual before"
    if threshold is not None:
        rule = {"stuck_gpu": f"stuck\n> {threshold:g}%", "inference_overprovisioned": f"too big if\np95 < {threshold:g}%"}
        style.level_line(ax, threshold, rule.get(alert.type, f"idle\n< {threshold:g}%"), "threshold")
    if usual is not None and (threshold is None or abs(usual - threshold) > 6):
        style.level_line(ax, usual, f"{usual_label}\n{usual:.0f}%", "usual")
    ax.set_ylim(-3, 108)
    ax.set_ylabel("GPU activity %")
    style.episode_marks(ax, w.start, w.fired_at, w.end, w.resolved)
    if len(grid.gpus) > 1:
        has_work = stuck and any(_finite(grid.work[g]) for g in grid.gpus)
        heat = grid.work if has_work else grid.util if stuck else grid.activity
        _heatmap(axes[1], grid, heat, flagged, "work %" if has_work else "util %" if stuck else "activity %")
        style.episode_marks(axes[1], w.start, w.fired_at, w.end, w.resolved, labels=False)
        bar_ax = axes[1]
    else:
        bar_ax = ax
    style.time_axis(bar_ax, w.lo, w.hi)
    note = ""
    if flagged and not inference:
        note = f"{_count(len(flagged), n)} {what}" + (f" (GPU {gpu_names(flagged)})" if len(flagged) < n else "")
    elif inference and d.get("suggested_instance_type"):
        note = f"fits on {style.clip(d['suggested_instance_type'], 30)}"
    style.headline(ax, f"{alert.title}: {style.clip(alert.resource_id, 40)}", alert.waste_usd, alert.usd_per_hour,
                   alert.burning, what=alert.dollars or "so far", note=note)  # fmt: skip
    style.legend(ax)
    return fig
