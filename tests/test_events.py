"""The event contract: what is accepted, what is kept, and what the dead-letter reason says."""

from __future__ import annotations

import json

import pytest

from detector.events import EventDecoder, GpuMetric, InvalidMessage, RunEvent, UsageEvent

NOW = 1_800_000_000.0  # a fixed "now" (2027-01-15) so the future-timestamp check is deterministic
decoder = EventDecoder(clock=lambda: NOW)

GPU = {"ts": "2026-11-02T00:00:00Z", "resource_id": "h1", "gpu_index": 0, "util_pct": 3.5, "power_w": 61.0}
USAGE = {"ts": "2026-11-02T00:00:00+00:00", "resource_id": "h1", "resource_type": "gpu_instance", "cost_usd": 0.5,
         "tags": {"team": "nlp"}}  # fmt: skip
RUN = {"ts": "2026-11-02T00:00:00Z", "run_id": "r1", "status": "failed", "resource_ids": ["h1"], "error": "OOM"}


def test_single_event_and_batch():
    (one,) = decoder.decode("gpu-metrics", json.dumps(GPU).encode())
    assert isinstance(one, GpuMetric) and one.util_pct == 3.5 and one.t == 1_793_577_600.0
    batch = decoder.decode("gpu-metrics", json.dumps([GPU, {**GPU, "gpu_index": 1}]).encode())
    assert [e.gpu_index for e in batch] == [0, 1]
    assert isinstance(decoder.decode("resource-usage", json.dumps(USAGE).encode())[0], UsageEvent)
    assert isinstance(decoder.decode("run-events", json.dumps(RUN).encode())[0], RunEvent)


def test_unknown_fields_are_kept_not_rejected():
    (event,) = decoder.decode("resource-usage", json.dumps({**USAGE, "sku": "X1", "labels": {"a": 1}}).encode())
    assert event.extra == {"sku": "X1", "labels": {"a": 1}}
    assert event.cost_usd == 0.5


@pytest.mark.parametrize(
    "topic, value, reason",
    [
        ("gpu-metrics", b"{not json", "not JSON"),
        ("gpu-metrics", json.dumps({k: v for k, v in GPU.items() if k != "resource_id"}).encode(),
         "missing required field `resource_id`"),
        ("gpu-metrics", json.dumps([GPU, {**GPU, "util_pct": "high"}]).encode(), "`$[1].util_pct`"),
        ("gpu-metrics", json.dumps({**GPU, "util_pct": 140}).encode(), "`$.util_pct`"),
        ("gpu-metrics", json.dumps({**GPU, "ts": "2026-11-02 00:00"}).encode(), "`$.ts`"),
        ("gpu-metrics", json.dumps({**GPU, "ts": "2026-11-02T00:00:00"}).encode(), "timezone"),
        ("gpu-metrics", json.dumps({**GPU, "ts": "2027-01-17T00:00:00Z"}).encode(), "in the future"),
        ("resource-usage", json.dumps({**USAGE, "state": "paused"}).encode(), "`$.state`"),
        ("run-events", json.dumps([]).encode(), "empty batch"),
        ("run-events", b"[42]", "expected an event object"),
        ("billing", json.dumps(USAGE).encode(), "unknown topic"),
    ],
    ids=["not-json", "missing-field", "wrong-type-in-batch", "out-of-range", "not-rfc3339", "no-zone",
         "future", "bad-enum", "empty-batch", "not-object", "unknown-topic"],  # fmt: skip
)
def test_bad_messages_name_the_problem(topic, value, reason):
    with pytest.raises(InvalidMessage) as info:
        decoder.decode(topic, value)
    assert reason in info.value.reason
