"""The chart in an incident's thread: the metric that shows the problem, over the episode.

One module per kind of chart, all drawn in one look (:mod:`detector.charts.style`): the GPU
types get their GPUs' activity, grouped busy against idle (:mod:`.gpu`); ``egress_runaway``
the rate against its usual level (:mod:`.egress`); the growth types the size, its forecast
and the capacity (:mod:`.growth`); ``failed_run_spend`` the run's spend over its hours and
``untagged`` the spend by day (:mod:`.spend`); ``unused_commitment`` each day's used and
unused commitment (:mod:`.commitment`); ``anomaly`` the features that drove the model
(:mod:`.anomaly`); the daily digest gets its last days' waste (:mod:`.digest`).
``spot_eligible`` and ``telemetry_stale`` have none on purpose (see docs/charts.md). Data
comes from the events stored in ClickHouse (written before the alert is), so the chart shows
exactly what detection saw. Rendering and uploading run on their own thread
(:class:`ChartWorker`): an alert is never held back by its chart, and a chart that fails is
logged, not retried forever.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from detector.alerts import Alert
from detector.charts import style
from detector.charts.anomaly import anomaly_chart
from detector.charts.commitment import commitment_chart
from detector.charts.egress import egress_chart
from detector.charts.gpu import GPU_TYPES, gpu_chart
from detector.charts.growth import GROWTH_TYPES, growth_chart
from detector.charts.spend import failed_run_chart, untagged_chart
from detector.store.connection import Connection
from detector.units import rfc3339

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["CHARTED_TYPES", "CHARTS", "NOT_CHARTED", "ChartWorker", "chart_title", "draw_chart", "render_chart"]

log = structlog.get_logger("burnwatch.charts")

Chart = Callable[[Alert, Connection], "Figure | None"]
CHARTS: dict[str, Chart] = {
    **dict.fromkeys(GPU_TYPES, gpu_chart),
    **dict.fromkeys(GROWTH_TYPES, growth_chart),
    "egress_runaway": egress_chart,
    "failed_run_spend": failed_run_chart,
    "untagged": untagged_chart,
    "unused_commitment": commitment_chart,
    "anomaly": anomaly_chart,
}
"""Alert type → what draws its chart."""
CHARTED_TYPES = frozenset(CHARTS)
NOT_CHARTED = {
    "spot_eligible": "advice about a run's pricing: the saving is one figure, and no series over time shows it",
    "telemetry_stale": "the news is that there is no data: a chart of it would be empty",
    "inference_scale_to_zero": "the news is a weekly schedule, which the alert writes out (a week's chart is a follow-up)",
    "inference_unbatched": "an estimate from a few means (batch, SM activity, repeats): the message gives them and how",
    "spot_without_redundancy": "a risk in two counts (replicas, zones), no series over time",
    "wrong_region": "a comparison of two price lists and a one-off move: the message gives the saving and the break-even",
    "build_or_call": "a comparison of two costs per 1,000 requests: the message gives both and the traffic; "
                     "`burnwatch query build-or-call` lists every model-serving resource",
    "data_starved_training": "not yet: the GPU chart's hourly utilisation averages a sawtooth away (a chart of "
                             "the scrapes beside the host gauges is to do)",
    "plateaued_run": "not yet: run metrics are stored in the run events' extra column, not a series the "
                     "chart queries read",
    "idle_notebook": "the news is one time, the last activity, which the alert gives with the hours since; a "
                     "chart of a flat line of no activity would add nothing",
}
"""Types without a chart, and why (docs/charts.md says the same)."""


def draw_chart(alert: Alert, store: Connection) -> Figure | None:
    """The figure of this alert's chart, finished as it will be saved, or None when its type
    has no chart or there is no data (the queries: ``detector/store/sql/charts/``)."""
    draw = CHARTS.get(alert.type)
    fig = draw(alert, store) if draw is not None else None
    if fig is not None:
        style.finish(fig)
    return fig


def render_chart(alert: Alert, store: Connection) -> bytes | None:
    """A PNG for this alert (:func:`draw_chart`), or None."""
    fig = draw_chart(alert, store)
    return style.png(fig) if fig is not None else None


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
    """The uploaded file's title in Slack."""
    return f"{alert.title} on {alert.resource_id} since {rfc3339(alert.episode_start)}"
