"""The worker's batch pipeline without Kafka: real store (chdb), real detection."""

from __future__ import annotations

import asyncio
import json

from detector.alerts import AlertManager
from detector.delivery import Outbox
from detector.engine import Engine
from streams.pipeline import Message, Pipeline
from tests.helpers import MIN, T0, at


def gpu_message(offset: int, t: float, util: float, host: str = "h1") -> Message:
    value = [{"ts": at(t).isoformat(), "resource_id": host, "gpu_index": i, "util_pct": util} for i in range(2)]
    return Message("gpu-metrics", 0, offset, host.encode(), json.dumps(value).encode())


def usage_message(offset: int, t: float, host: str = "h1") -> Message:
    value = {"ts": at(t).isoformat(), "resource_id": host, "resource_type": "gpu_instance", "cost_usd": 0.5,
             "interval_s": 60, "tags": {"team": "nlp", "project": "llm"}}  # fmt: skip
    return Message("resource-usage", 0, offset, host.encode(), json.dumps(value).encode())


def make(store, ruleset, caught_up):
    dead: list[bytes] = []

    async def send_dead_letter(key, value):
        dead.append(value)

    pipeline = Pipeline(
        engine=Engine(ruleset), store=store, outbox=Outbox(store, None), manager=AlertManager(),
        send_dead_letter=send_dead_letter, caught_up=caught_up,
    )  # fmt: skip
    return pipeline, dead


def test_acks_follow_detection_and_everything_is_stored(store, ruleset):
    """The usage topic is hours ahead and the gpu topic not caught up: usage messages are
    held (not acknowledged) until the gpu topic passes their time; every event is stored
    at once; a bad message is dead-lettered with its reason and acknowledged."""
    behind = {"gpu-metrics": True}
    pipeline, dead = make(store, ruleset, lambda topic, p, offset: not behind.get(topic, False))
    acked: list[tuple[str, int]] = []

    async def ack(message):
        acked.append((message.topic, message.offset))

    async def run():
        first = [usage_message(i, T0 + i * 30 * MIN) for i in range(4)]  # up to T0 + 90m
        first += [gpu_message(i, T0 + i * 60, 1.0) for i in range(10)]  # up to T0 + 9m
        first.append(Message("gpu-metrics", 0, 10, b"h1", b"{not json"))
        await pipeline.process(first, ack)
        await pipeline.drain()
        held_after_first = len(pipeline.aligner)
        acked_after_first = list(acked)
        second = [gpu_message(11 + i, T0 + (10 + i) * 60, 1.0) for i in range(90)]  # to T0 + 99m
        behind["gpu-metrics"] = False
        await pipeline.process(second, ack)
        await pipeline.drain()
        return held_after_first, acked_after_first

    held_after_first, acked_after_first = asyncio.run(run())
    assert held_after_first > 0
    assert ("resource-usage", 3) not in acked_after_first  # T0+90m: beyond what gpu had shown
    assert ("gpu-metrics", 10) in acked_after_first  # the dead letter is acknowledged
    assert len(acked) == 4 + 10 + 1 + 90 and len(pipeline.aligner) == 0
    assert len(dead) == 1 and "not JSON" in json.loads(dead[0])["reason"]
    assert store.count("gpu_metrics") == 200 and store.count("resource_usage") == 4
    (alert,) = store.alerts()
    assert alert["resource_id"] == "h1" and alert["tags"] == {"team": "nlp", "project": "llm"}
    assert store.load_states([0]).keys() == {"h1"}
