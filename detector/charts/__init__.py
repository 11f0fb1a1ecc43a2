"""The chart in an incident's thread: the metric that shows the problem, over the episode.

GPU detectors get utilisation per GPU; ``egress_runaway`` the egress rate against its
baseline; ``vector_db_growth`` and ``storage_growth`` the size against capacity with
the forecast. Data comes from the events stored in ClickHouse (written before the
alert is), so the chart shows exactly what detection saw. Rendering and uploading
run on their own thread (:class:`ChartWorker`): an alert is never held back by its
chart, and a chart that fails is logged, not retried forever.
"""

from __future__ import annotations

import io
import queue
import threading
from datetime import datetime, timezone
from typing import Any

import structlog

from detector.alerts import Alert
from detector.store.connection import Connection
from detector.units import rfc3339

__all__ = ["CHARTED_TYPES", "ChartWorker", "render_chart"]

log = structlog.get_logger("burnwatch.charts")

GPU_TYPES = frozenset({"idle_gpu", "partly_idle_gpu", "unallocated_gpu", "stuck_gpu", "inference_overprovisioned"})
GROWTH_TYPES = frozenset({"vector_db_growth", "storage_growth"})
CHARTED_TYPES = GPU_TYPES | GROWTH_TYPES | {"egress_runaway"}


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=timezone.utc)


def _window(alert: Alert, before_s: float) -> dict[str, str | int]:
    """The query parameters of a chart: the resource, from ``before_s`` before the episode to its end."""
    end = alert.resolved_at if alert.resolved_at is not None else alert.updated_at
    return {"rid": alert.resource_id, "lo": int((alert.episode_start - before_s) * 1000), "hi": int(end * 1000) + 1}


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.2), dpi=100, layout="constrained")
    return fig, fig.add_subplot()


def _png(fig: Any) -> bytes:
    from matplotlib.dates import DateFormatter

    for ax in fig.axes:
        ax.xaxis.set_major_formatter(DateFormatter("%m-%d %H:%M", tz=timezone.utc))
        ax.set_xlabel("UTC, event time", fontsize=8)
        ax.grid(alpha=0.3)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def _gpu_chart(alert: Alert, store: Connection) -> bytes | None:
    rows = store.named("charts/gpu", _window(alert, 1800))
    if not rows:
        return None
    fig, ax = _figure()
    series: dict[int, tuple[list, list]] = {}
    for r in rows:
        xs, ys = series.setdefault(r["gpu_index"], ([], []))
        xs.append(_utc(r["ts"]))
        ys.append(r["util_pct"])
    for gpu, (xs, ys) in sorted(series.items())[:16]:
        ax.plot(xs, ys, linewidth=1, label=f"GPU {gpu}")
    _shade_episode(ax, alert)
    ax.set_ylim(-2, 102)
    ax.set_ylabel("GPU utilisation %")
    ax.set_title(f"{alert.title}: {alert.resource_id}", fontsize=10, parse_math=False)
    if len(series) <= 8:
        ax.legend(fontsize=7, ncols=4, loc="upper right")
    return _png(fig)


def _shade_episode(ax: Any, alert: Alert) -> None:
    ax.axvspan(_utc_dt(alert.episode_start), _utc_dt(alert.resolved_at or alert.updated_at), color="tab:red", alpha=0.08)


def _egress_chart(alert: Alert, store: Connection) -> bytes | None:
    rows = store.named("charts/egress", _window(alert, 6 * 3600))
    if not rows:
        return None
    fig, ax = _figure()
    ax.plot([_utc(r["ts"]) for r in rows], [r["egress_bytes"] / 1e9 * 3600 / r["interval_s"] for r in rows],
            linewidth=1, label="egress GB/h")  # fmt: skip
    baseline = alert.details.get("baseline_gb_per_hour")
    if baseline is not None:
        ax.axhline(baseline, color="tab:green", linestyle="--", linewidth=1, label="usual (24 h median)")
    _shade_episode(ax, alert)
    ax.set_ylabel("GB per hour")
    ax.set_title(f"Egress of {alert.resource_id} to {alert.details.get('dest_region', '?')}", fontsize=10,
                 parse_math=False)
    ax.legend(fontsize=7, loc="upper left")
    return _png(fig)


def _growth_chart(alert: Alert, store: Connection) -> bytes | None:
    rows = store.named("charts/growth", _window(alert, 3 * 86_400))
    if not rows:
        return None
    fig, ax = _figure()
    xs = [_utc(r["ts"]) for r in rows]
    ax.plot(xs, [r["storage_bytes"] / 1e12 for r in rows], linewidth=1.2, label="size TB")
    capacity = rows[-1]["capacity_bytes"]
    if capacity:
        ax.axhline(capacity / 1e12, color="tab:red", linestyle="--", linewidth=1, label="capacity")
    per_day = alert.details.get("growth_gb_per_day")
    days = alert.details.get("days_to_full") or 30
    if per_day:
        last = rows[-1]["storage_bytes"] / 1e12
        end = xs[-1].timestamp() + min(float(days), 90) * 86_400
        ax.plot([xs[-1], _utc_dt(end)], [last, last + per_day / 1000 * (end - xs[-1].timestamp()) / 86_400],
                linestyle=":", color="tab:orange", label="trend")  # fmt: skip
    ax.set_ylabel("TB")
    ax.set_title(f"{alert.title}: {alert.resource_id}", fontsize=10, parse_math=False)
    ax.legend(fontsize=7, loc="upper left")
    return _png(fig)


def _utc_dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=timezone.utc)


def render_chart(alert: Alert, store: Connection) -> bytes | None:
    """A PNG for this alert, or None when its type has no chart or there is no data (the
    queries: ``detector/store/sql/charts/``)."""
    if alert.type in GPU_TYPES:
        return _gpu_chart(alert, store)
    if alert.type == "egress_runaway":
        return _egress_chart(alert, store)
    if alert.type in GROWTH_TYPES:
        return _growth_chart(alert, store)
    return None


class ChartWorker:
    """Renders and uploads charts on its own thread, after the alert is posted."""

    def __init__(self, store: Connection, notifier: Any, max_pending: int = 200) -> None:
        self.store = store
        self.notifier = notifier
        self._queue: queue.Queue[tuple[Alert, str, str] | None] = queue.Queue(maxsize=max_pending)
        self._thread = threading.Thread(target=self._run, name="burnwatch-charts", daemon=True)
        self.uploaded = 0
        self.failed = 0

    def start(self) -> ChartWorker:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def submit(self, alert: Alert, channel: str, thread_ts: str) -> None:
        """Queue a chart for a posted opening; dropped (and logged) when too many wait."""
        if alert.type not in CHARTED_TYPES or not thread_ts:
            return
        try:
            self._queue.put_nowait((alert, channel, thread_ts))
        except queue.Full:
            log.warning("chart_dropped", alert_id=alert.alert_id, reason="too many charts waiting")

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            alert, channel, thread_ts = item
            try:
                png = render_chart(alert, self.store)
                if png is not None:
                    self.notifier.upload_chart(alert, png, channel, thread_ts)
                    self.uploaded += 1
            except Exception as exc:  # a chart is a nicety: log it and go on
                self.failed += 1
                log.warning("chart_failed", alert_id=alert.alert_id, error=str(exc))


def chart_title(alert: Alert) -> str:
    return f"{alert.title} on {alert.resource_id} since {rfc3339(alert.episode_start)}"
