"""Prometheus metrics of the worker, served at ``/metrics`` (``prometheus_client``).

One registry for the process, filled where the work happens: the batch pipeline
(events and messages per topic, dead letters, batch latency, alerts), the store
(ClickHouse insert latency and size), the outbox (Slack deliveries, failures, retries)
and the anomaly model (scores). Consumer lag and event-time freshness are read when
Prometheus scrapes, from callbacks the worker registers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["METRICS", "Metrics"]

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.messages = Counter("burnwatch_messages", "Kafka messages consumed", ["topic"], registry=r)
        self.events = Counter("burnwatch_events", "Events decoded", ["topic"], registry=r)
        self.dead_letters = Counter("burnwatch_dead_letters", "Messages sent to the dead-letter topic", registry=r)
        self.batch_seconds = Histogram("burnwatch_batch_seconds", "Time from a batch's arrival to its acknowledgement",
                                       buckets=_LATENCY, registry=r)  # fmt: skip
        self.alerts = Counter("burnwatch_alerts", "Alert changes", ["type", "change"], registry=r)
        self.insert_seconds = Histogram("burnwatch_clickhouse_insert_seconds", "ClickHouse insert of a batch's events",
                                        buckets=_LATENCY, registry=r)  # fmt: skip
        self.cpu_seconds = Counter("burnwatch_cpu_seconds", "CPU seconds of the worker's own threads by stage: read "
                                   "(decoding a batch), detect (aligning, the rules, the alert stages), write (the "
                                   "writer thread: events, alert changes and state to the store; an insert child's "
                                   "own CPU is not counted)", ["stage"], registry=r)  # fmt: skip
        self.insert_rows = Histogram("burnwatch_clickhouse_insert_rows", "Rows per ClickHouse insert",
                                     buckets=(10, 100, 1_000, 10_000, 100_000, 1_000_000), registry=r)  # fmt: skip
        self.duplicates_skipped = Counter("burnwatch_duplicate_events_skipped",
                                          "Events already stored (the same content read again or re-sent), not inserted twice",
                                          registry=r)  # fmt: skip
        self.holding_partitions = Gauge("burnwatch_partitions_holding_watermark",
                                        "Assigned input partitions that cannot yet show they have nothing to read, "
                                        "holding event time back", registry=r)  # fmt: skip
        self.sweeps = Counter("burnwatch_state_sweeps", "Sweeps of per-resource state (expiry of keys quiet for "
                              "two days, eviction of keys quiet for BURNWATCH_EVICT_AFTER_S) by what ran them: "
                              "event_time (the watermark moved an eighth of the window), wall_clock (the timer)",
                              ["trigger"], registry=r)  # fmt: skip
        self.keys_held = Gauge("burnwatch_keys_held", "Resources whose state is in memory", registry=r)
        self.keys_evicted = Gauge("burnwatch_keys_evicted", "Resources quiet past BURNWATCH_EVICT_AFTER_S: state "
                                  "saved in the store, out of memory", registry=r)  # fmt: skip
        self.stalled_seconds = Gauge("burnwatch_store_stalled_seconds",
                                     "Seconds the worker has been unable to write to ClickHouse (0: writing)",
                                     registry=r)  # fmt: skip
        self.outputs = Counter("burnwatch_output_requests", "Deliveries to outputs besides Slack by outcome "
                               "(ok, retry, refused, unknown)", ["output", "outcome"], registry=r)  # fmt: skip
        self.slack = Counter("burnwatch_slack_requests", "Slack deliveries by outcome (ok, retry, refused)",
                             ["outcome"], registry=r)  # fmt: skip
        self.slack_channels_refusing = Gauge("burnwatch_slack_channels_refusing", "Slack channels whose last post "
                                             "Slack refused for good (the app not invited, the channel archived or "
                                             "not found): which and why on /healthz (slack_refusing)", registry=r)  # fmt: skip
        self.actions = Counter("burnwatch_actions", "Steps of actions on incidents by kind and step (proposed, approved, "
                               "succeeded, failed, refused...; docs/actions.md)", ["kind", "step"], registry=r)  # fmt: skip
        self.anomaly_scores = Histogram("burnwatch_anomaly_score", "Anomaly scores of closed windows (higher = odder)",
                                        ["group"], buckets=(0.4, 0.5, 0.6, 0.7, 0.8, 1.0, 1.5, 2.0, 5.0), registry=r)  # fmt: skip
        self.anomaly_unscored = Counter("burnwatch_anomaly_unscored", "Closed windows not scored because the group's "
                                        "model was trained on other features (retrain)", ["group"], registry=r)  # fmt: skip
        self.rules_refused = Gauge("burnwatch_rules_refused", "1 while the rule files on disk are refused (the "
                                   "worker detects with the last valid ones; a worker started now would not "
                                   "start): the errors are on /healthz and in the rules_refused log line",
                                   registry=r)  # fmt: skip
        self.partitions = Gauge("burnwatch_partitions_assigned", "Partitions this worker holds (each a partition "
                                "number of every input topic, keyed alike); 0 until the group has settled: summed "
                                "over the group, BURNWATCH_PARTITIONS when every partition is read", registry=r)  # fmt: skip
        self._lag: Callable[[], Iterable[tuple[str, int, int]]] | None = None
        self._watermark: Callable[[], float] | None = None
        self._clock: Callable[[], float] = time.time
        self._detector_errors: Callable[[], Mapping[str, int]] | None = None
        r.register(self)  # the gauges read at scrape time

    def watch(self, lag: Callable[[], Iterable[tuple[str, int, int]]], watermark: Callable[[], float],
              detector_errors: Callable[[], Mapping[str, int]] | None = None,
              clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        """``lag()`` gives (topic, partition, messages behind); ``watermark()`` the newest event time
        detected (epoch seconds, 0 before any); ``detector_errors()`` rule name → events its rule
        raised on (skipped for that rule) since the start."""
        self._lag, self._watermark, self._detector_errors, self._clock = lag, watermark, detector_errors, clock

    def collect(self) -> Iterable[Metric]:
        lag = GaugeMetricFamily("burnwatch_consumer_lag", "Messages not yet consumed, per input partition",
                                labels=["topic", "partition"])  # fmt: skip
        for topic, partition, behind in self._lag() if self._lag else ():
            lag.add_metric([topic, str(partition)], behind)
        yield lag
        # Before any event is detected there is no lag to say: 0 claimed a worker restarted while nothing
        # flowed was fresh, clearing the staleness alert. The event time itself reads 0 then, which an alert
        # on time() - max(burnwatch_event_time_seconds) catches.
        watermark = self._watermark() if self._watermark else 0.0
        yield GaugeMetricFamily("burnwatch_event_time_seconds", "The newest event time detected (epoch seconds; "
                                "0 before any, since the start or the last rebalance)", value=watermark)  # fmt: skip
        fresh = GaugeMetricFamily("burnwatch_event_time_lag_seconds", "Wall clock minus the newest event time "
                                  "detected; no sample before any is detected")  # fmt: skip
        if watermark:
            fresh.add_metric([], self._clock() - watermark)
        yield fresh
        errors = CounterMetricFamily("burnwatch_detector_errors", "Events a rule raised on, skipped for that rule "
                                     "(logged once per rule and error type: detector_error)", labels=["rule"])  # fmt: skip
        for rule, n in sorted((self._detector_errors() if self._detector_errors else {}).items()):
            errors.add_metric([rule], n)
        yield errors

    def render(self) -> bytes:
        return generate_latest(self.registry)


METRICS = Metrics()
"""The process's metrics (one worker per process)."""
