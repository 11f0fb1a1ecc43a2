"""Detection does not depend on how a consumer reads. A worker's consumer fetches runs of
messages from whichever partitions answer, its batches end wherever the batch limit or a fetch
falls, and a restart after a kill starts them again elsewhere; backtest reads a file in order.
The aligner releases events by time, but a message spans minutes of event time (an exporter's
flush) while the allowed lateness is a minute, so events of equal or nearby times from two topics
can reach detection in either order. The alerts must be backtest's whatever the order: a worker
catching up the waves backlog with kills invented a ``telemetry_stale`` alert that way (the
host's first usage interval back after hours away reached detection before its first sample).

This drives the same aligner, engine and alert manager as the worker, in process, with the fetches
drawn at random (seeded by Hypothesis): no broker, so many orders are cheap to try."""

from __future__ import annotations

import random
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detector.alerts import Alert, AlertManager
from detector.align import EventTimeAligner
from detector.engine import Engine
from detector.events import EventDecoder
from tests.reliability import compare_alerts, reported_alerts, waves_backlog, write_records

LATENESS_S = 60.0  # the worker's default


@pytest.fixture(scope="module")
def waves(tmp_path_factory, ruleset) -> tuple[list, list[Alert]]:
    """The waves backlog (hosts gone for hours and back: the order of their first usage and first
    sample back decides detection if anything does) and backtest's alerts over it."""
    records = waves_backlog(hosts_per_wave=6)
    path = write_records(tmp_path_factory.mktemp("waves") / "waves.jsonl", records)
    return records, reported_alerts(path, ruleset, lateness_s=LATENESS_S)


def consumed(records: list, ruleset, partitions: int, max_batch: int, rng: random.Random) -> dict[str, dict]:
    """The records published keyed to ``partitions`` partitions per topic, then read as a consumer
    reads them: each batch takes runs of up to ``max_batch`` messages from a random choice of the
    partitions with something left, then detects what the aligner releases. Returns the alerts as
    last reported, as rows compare_alerts reads."""
    decoder = EventDecoder()
    queues: dict[tuple[str, int], list] = {}
    for topic, key, value in records:
        queues.setdefault((topic, zlib.crc32(key.encode()) % partitions), []).append(decoder.decode(topic, value))
    position = dict.fromkeys(queues, 0)
    aligner: EventTimeAligner[None] = EventTimeAligner(LATENESS_S)
    engine, manager = Engine(ruleset), AlertManager(ruleset=ruleset)
    latest: dict[str, Alert] = {}
    for source in queues:
        aligner.expect(source)

    def detect(everything: bool = False) -> None:
        for alert in manager.handle(engine.process_timed(aligner.release(everything)[0])):
            latest[alert.alert_id] = alert

    while left := [s for s in queues if position[s] < len(queues[s])]:
        for source in rng.sample(left, rng.randint(1, len(left))):
            start = position[source]
            end = min(start + rng.randint(1, max_batch), len(queues[source]))
            for events in queues[source][start:end]:
                aligner.push(source, events)
            position[source] = end
        for source in queues:
            aligner.caught_up(source, position[source] == len(queues[source]))
        detect()
    detect(everything=True)
    return {alert_id: _row(alert) for alert_id, alert in latest.items()}


def _row(alert: Alert) -> dict:
    return {"type": alert.type, "resource_id": alert.resource_id, "status": alert.status,
            "waste_usd": alert.waste_usd, "fired_ms": round(alert.fired_at * 1000),
            "resolved_ms": None if alert.resolved_at is None else round(alert.resolved_at * 1000)}  # fmt: skip


@settings(max_examples=12, suppress_health_check=[HealthCheck.too_slow])
@given(partitions=st.integers(1, 6), max_batch=st.sampled_from([1, 8, 40]), seed=st.integers(0, 2**32))
def test_the_alerts_are_backtests_however_fetches_interleave_partitions(waves, ruleset, partitions, max_batch, seed):
    """(The fetches are drawn from a seed, not from Hypothesis's own random: each batch draws a few
    numbers, thousands in all, more than it can shrink.)"""
    records, expected = waves
    assert expected
    diff = compare_alerts(expected, consumed(records, ruleset, partitions, max_batch, random.Random(seed)))
    assert diff.ok, diff
