"""Event ids (the store's de-duplication key) are a contract with every store already written:
an upgrade that changed them would store again, and count again, whatever is read twice
across it (a worker's uncommitted tail, a producer's re-send, a replay file).

The ids pinned here were computed by the release before the gpu-metrics fields of issue 13
(commit 3cebb2d) for the same messages."""

from __future__ import annotations

import pytest

from detector.events import TOPIC_GPU_METRICS, TOPIC_RESOURCE_USAGE, TOPIC_RUN_EVENTS, EventDecoder
from detector.store.batch import KIND, event_ids

MESSAGES = {
    TOPIC_RESOURCE_USAGE: (
        b'{"ts":"2026-11-02T08:00:00Z","resource_id":"i-0a1b2c3d4e5f","resource_type":"gpu_instance","provider":"aws",'
        b'"instance_type":"p4d.24xlarge","interval_s":60,"cost_usd":0.546167,"tags":{"team":"nlp"}}',
        16955094648588119172,
    ),
    TOPIC_GPU_METRICS: (
        b'{"ts":"2026-11-02T08:00:30Z","resource_id":"i-0a1b2c3d4e5f","gpu_index":0,"model":"A100-SXM4-40GB",'
        b'"util_pct":0.0,"power_w":58.2,"sm_active":0.0}',
        2353917306863611503,
    ),
    TOPIC_RUN_EVENTS: (
        b'{"ts":"2026-11-02T09:00:00Z","run_id":"run-42","status":"failed","resource_ids":["i-0a1b2c3d4e5f"],'
        b'"gpu_count":8,"project":"llm","error":"CUDA out of memory"}',
        14610646211010264632,
    ),
}


def ids(topic: str, value: bytes) -> list[int]:
    events = EventDecoder(clock=lambda: 1.9e9).decode(topic, value)
    return event_ids(KIND[type(events[0])][0], events)


@pytest.mark.parametrize("topic", list(MESSAGES))
def test_an_event_keeps_the_id_earlier_releases_gave_it(topic):
    value, pinned = MESSAGES[topic]
    assert ids(topic, value) == [pinned]


@pytest.mark.parametrize(
    "added",
    [b'"pod":"train-0"', b'"allocated":false', b'"tags":{"team":"nlp"}', b'"gr_engine_active":0.5', b'"mig_instance":"1"'],
)
def test_a_field_added_since_is_part_of_the_id_when_it_is_carried(added):
    value, pinned = MESSAGES[TOPIC_GPU_METRICS]
    with_field = ids(TOPIC_GPU_METRICS, value[:-1] + b"," + added + b"}")
    assert with_field != [pinned]
    assert ids(TOPIC_GPU_METRICS, value[:-1] + b"," + added + b"}") == with_field  # and stable


def test_an_added_field_at_its_default_is_not():
    value, pinned = MESSAGES[TOPIC_GPU_METRICS]
    assert ids(TOPIC_GPU_METRICS, value[:-1] + b',"pod":"","allocated":null,"tags":{}}') == [pinned]


def test_a_usage_event_with_metrics_has_its_own_id_and_one_without_keeps_its_own():
    """``metrics`` came after ids were released (ADDED_FIELDS): absent or empty, the id is the pinned one."""
    value, pinned = MESSAGES[TOPIC_RESOURCE_USAGE]
    assert ids(TOPIC_RESOURCE_USAGE, value[:-1] + b',"metrics":{}}') == [pinned]
    with_metric = ids(TOPIC_RESOURCE_USAGE, value[:-1] + b',"metrics":{"cpu_pct":12.5}}')
    assert with_metric != [pinned]
    assert ids(TOPIC_RESOURCE_USAGE, value[:-1] + b',"metrics":{"cpu_pct":12.5}}') == with_metric
