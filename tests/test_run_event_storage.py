"""Run events' ``metrics`` and ``step`` (added to the contract after the run_events table) are
stored in its extra column and read back typed: rows stored before they were fields may hold
anything under those names."""

from __future__ import annotations

import pytest

from detector.events import RunEvent
from detector.store.batch import EventBatch
from tests.helpers import T0, at


@pytest.mark.parametrize(
    "sent, read",
    [
        # Sent by the current contract: typed fields, read back as sent.
        (RunEvent(ts=at(T0), run_id="r1", status="running", metrics={"val_loss": 1.5}, step=7),
         RunEvent(ts=at(T0), run_id="r1", status="running", metrics={"val_loss": 1.5}, step=7)),
        # Stored before the fields existed, an exporter's own "step" label: not a step, stays in extra.
        (RunEvent(ts=at(T0), run_id="r1", status="running", extra={"step": "epoch-3"}),
         RunEvent(ts=at(T0), run_id="r1", status="running", extra={"step": "epoch-3"})),
        # Stored before, "metrics" holding strings and a negative "step": neither is the contract's.
        (RunEvent(ts=at(T0), run_id="r1", status="running", extra={"metrics": {"loss": "nan"}, "step": -1}),
         RunEvent(ts=at(T0), run_id="r1", status="running", extra={"metrics": {"loss": "nan"}, "step": -1})),
        # Stored before with values the contract accepts: read as the fields the contract now names.
        (RunEvent(ts=at(T0), run_id="r1", status="running", extra={"metrics": {"loss": 2.0}, "step": 3, "x": 1}),
         RunEvent(ts=at(T0), run_id="r1", status="running", extra={"x": 1}, metrics={"loss": 2.0}, step=3)),
    ],
    ids=["typed", "old-string-step", "old-bad-values", "old-good-values"],
)
def test_run_metrics_and_step_read_back_typed(store, sent, read):
    batch = EventBatch()
    batch.extend([sent])
    assert store.events.insert(batch) == 1
    (back,) = [event for _, event in store.history.between(0, 2e9)]
    assert back == read
    assert back.step is None or isinstance(back.step, int)


@pytest.mark.parametrize(
    "tail, metrics, step, extra",
    [
        # A diverged run's last event: a JS bridge writes NaN as null. Its failure must still count.
        # Its step is the contract's and stays typed.
        (',"metrics":{"val_loss":null},"step":900}', {}, 900, {"metrics": {"val_loss": None}}),
        # An exporter's own step label, not a training step: kept as sent, no evaluation.
        (',"step":"epoch-3"}', {}, None, {"step": "epoch-3"}),
        # A fractional step: not the contract's integer.
        (',"step":1.5}', {}, None, {"step": 1.5}),
        # What the contract holds stays typed.
        (',"metrics":{"val_loss":2.5},"step":900}', {"val_loss": 2.5}, 900, {}),
    ],
    ids=["null-metric", "string-step", "float-step", "typed"],
)
def test_a_run_event_is_not_refused_for_metrics_the_contract_cannot_hold(store, tail, metrics, step, extra):
    from detector.events import TOPIC_RUN_EVENTS, EventDecoder

    value = ('{"ts":"2026-01-01T00:00:00Z","run_id":"r1","status":"failed","resource_ids":["h1"],"gpu_count":8'
             + tail).encode()  # fmt: skip
    (event,) = EventDecoder(clock=lambda: T0 + 86_400 * 365).decode(TOPIC_RUN_EVENTS, value)
    assert (event.status, event.metrics, event.step, event.extra) == ("failed", metrics, step, extra)
    batch = EventBatch()
    batch.extend([event])
    store.events.insert(batch)
    assert [e for _, e in store.history.between(0, 2e9)] == [event]
