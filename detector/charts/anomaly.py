"""The anomaly chart: the features that made the model call a resource's windows unusual,
over the episode, each against the resource's usual range.

The model's score is not stored window by window (``backtest --scores`` records it offline),
so the chart draws what is: each feature the alert names (``stands_out``, furthest from the
usual first) recomputed per step from the stored events, with the usual range the model had
learnt shaded, and the score against its threshold in the headline. It says so under the title.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from detector.alerts import Alert
from detector.charts import style
from detector.charts.window import number, stored_time, window
from detector.store.connection import Connection

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["anomaly_chart"]

USAGE = ("cost_usd_per_hour", "egress_gb_per_hour", "requests_per_s", "storage_delta_gb")
GPU = ("gpu_util_mean", "gpu_util_p95", "gpu_mem_frac", "power_w_per_gpu", "power_per_util")
LABELS = {
    "cost_usd_per_hour": "$ per hour", "egress_gb_per_hour": "egress GB/h", "requests_per_s": "requests/s",
    "storage_delta_gb": "size change GB", "gpu_util_mean": "GPU util % (mean)", "gpu_util_p95": "GPU util % (p95)",
    "gpu_mem_frac": "GPU memory used", "power_w_per_gpu": "power W per GPU", "power_per_util": "power per util",
}  # fmt: skip
PANELS = 3


def anomaly_chart(alert: Alert, store: Connection) -> Figure | None:
    """Up to three of the features that stood out, per step, against their usual range."""
    d = alert.details
    named = [f for f in d.get("stands_out") or [] if isinstance(f, dict) and f.get("feature") in LABELS]
    w = window(alert, before_s=6 * 3600, min_sample_s=300)
    series: dict[str, tuple[list[float], list[float]]] = {}
    for query, names in (("charts/anomaly-usage", USAGE), ("charts/anomaly-gpu", GPU)):
        wanted = [f["feature"] for f in named if f["feature"] in names]
        if not wanted:
            continue
        for r in store.named(query, w.params(alert.resource_id)):
            for name in wanted:
                value = number(r.get(name))
                if value is not None:
                    xs, ys = series.setdefault(name, ([], []))
                    xs.append(stored_time(r["t"]))
                    ys.append(value)
    drawn = [f for f in named if f["feature"] in series]
    far = [f for f in drawn if (number(f.get("deviation")) or 0.0) >= 1.0]  # a feature within its usual range says little
    shown = (far or drawn)[:PANELS]
    if not shown:
        return None
    fig, axes = style.figure(rows=len(shown))
    for ax, feature in zip(axes, shown, strict=True):
        _panel(ax, feature, *series[feature["feature"]])
        style.episode_marks(ax, w.start, w.fired_at, w.end, w.resolved, labels=ax is axes[0], band=True)
    style.time_axis(axes[-1], w.lo, w.hi)
    score, threshold = number(d.get("score")), number(d.get("threshold"))
    note = f"score {score:.2f} (alone alerts above {threshold:.2f})" if score is not None and threshold is not None else ""
    style.headline(axes[0], f"{alert.title}: {style.clip(alert.resource_id, 40)}", alert.waste_usd, alert.usd_per_hour,
                   alert.burning, what=alert.dollars, note=note)  # fmt: skip
    axes[-1].set_xlabel("UTC, event time\nThe score is not stored per window: these are the features that drove it.",
                        fontsize=9, color=style.INK["muted"], gid="anomaly-caveat")  # fmt: skip
    style.legend(axes[-1])
    return fig


def _panel(ax: Any, feature: dict[str, Any], times: list[float], values: list[float]) -> None:
    """One feature: its values, the usual range shaded and the usual level labelled."""
    name = feature["feature"]
    ax.plot([style.utc(t) for t in times], values, color=style.INK["ok"], gid=f"feature-{name}")
    usual = number(feature.get("usual"))
    span = feature.get("usual_range") or []
    lo, hi = (number(span[0]), number(span[1])) if isinstance(span, list) and len(span) == 2 else (None, None)
    if lo is not None and hi is not None:
        ax.axhspan(lo, hi, color=style.INK["usual"], alpha=0.12, gid="usual-range")
    if usual is not None:
        style.level_line(ax, usual, f"usual\n{usual:,.3g}", "usual")
    deviation = number(feature.get("deviation"))
    ax.set_ylabel(LABELS[name], fontsize=9)
    if deviation is not None:
        ax.annotate(f"{deviation:.1f} deviations from usual", xy=(0.005, 0.96), xycoords="axes fraction", ha="left", va="top",
                    fontsize=9, color=style.INK["problem"], gid="deviation", parse_math=False)  # fmt: skip
