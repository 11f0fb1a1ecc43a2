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
