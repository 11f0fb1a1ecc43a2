"""The worker's bulk consumer (streams/bulk.py) and its flow control (streams/pipeline.py), on
real parts: the embedded broker, the Faust worker in its own process, embedded ClickHouse.

Exporters that send one event per message are the case the bulk path is for; a tiny
``BURNWATCH_MAX_HELD_PER_PARTITION`` makes the worker pause and resume partitions all
the time, the case where records fetched for a partition paused meanwhile must still
be delivered (they once were not, and the worker stalled with 5,000 messages unread).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiokafka
import pytest

from detector.backtest import backtest
from detector.events import TOPICS
from detector.replay import one_event_per_message, write_replay
from detector.simulate import SimConfig, simulate
from streams.bulk import Fetches
from streams.embedded import EmbeddedBroker
from streams.kafka import count_events, ensure_topics, file_records, publish_records
from streams.pipeline import Message
from streams.process import WorkerProcess, worker_env
from tests.conftest import ROOT

PARTITIONS = 4


def message(offset: int, partition: int = 0) -> Message:
    return Message("gpu-metrics", partition, offset, None, b"{}")


def test_a_batch_closes_full_at_once_or_within_its_time_with_what_is_there():
    async def go() -> None:
        fetches = Fetches(max_messages=5, within_s=0.05)
        await fetches.put([message(0), message(1), message(2)])
        await fetches.put([message(3), message(4)])
        await fetches.put([message(5)])
        assert len(fetches) == 6
        assert [m.offset for m in await fetches.take()] == [0, 1, 2, 3, 4]  # full: two fetches joined, not the third
        assert [m.offset for m in await fetches.take()] == [5]  # what is there once its time is up
        assert len(fetches) == 0
        waiting = asyncio.create_task(fetches.take())  # nothing queued: waits for the next fetch
        await asyncio.sleep(0)
        assert not waiting.done()
        await fetches.put([message(6)])
        await fetches.put([message(7)])  # arrives within the batch's time: joins it
        assert [m.offset for m in await asyncio.wait_for(waiting, 5)] == [6, 7]
        big = [message(i) for i in range(8, 20)]  # one fetch larger than a batch stays whole
        await fetches.put(big)
        assert await fetches.take() == big

    asyncio.run(go())


def test_a_batch_of_large_messages_closes_at_its_bytes():
    async def go() -> None:
        fetches = Fetches(max_messages=1000, max_bytes=10, within_s=60)
        await fetches.put([Message("gpu-metrics", 0, 0, None, b"x" * 6)])
        await fetches.put([Message("gpu-metrics", 0, 1, None, b"x" * 6)])  # 12 bytes queued: full, no wait
        assert [m.offset for m in await asyncio.wait_for(fetches.take(), 5)] == [0]  # 6 + 6 > 10: not joined
        await fetches.put([Message("gpu-metrics", 0, 2, None, b"x" * 4)])  # 10 bytes queued: full again
        assert [m.offset for m in await asyncio.wait_for(fetches.take(), 5)] == [1, 2]

    asyncio.run(go())


def test_a_pipeline_that_falls_behind_slows_the_fetching():
    async def go() -> None:
        fetches = Fetches(max_messages=3, within_s=0.01)
        await fetches.put([message(i) for i in range(6)])  # two batches' worth queued
        blocked = asyncio.create_task(fetches.put([message(6)]))
        await asyncio.sleep(0)
        assert not blocked.done()
        assert len(await fetches.take()) == 6
        await asyncio.wait_for(blocked, 5)  # room again
        assert len(fetches) == 1

    asyncio.run(go())


def sql(env: dict[str, str], query: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "streams.cli", "sql", query, "--format", "json"],
                         env=env, check=True, capture_output=True, text=True, timeout=120)  # fmt: skip
    return [json.loads(line) for line in out.stdout.splitlines()]


async def committed_and_ends(bootstrap: str, group: str, published: int) -> dict[tuple[str, int], tuple[int | None, int]]:
    """Per input partition: the group's committed offset, and the offset after its last message
    (read back, since the embedded broker lists end offsets short of the end)."""
    tps = [aiokafka.TopicPartition(t, p) for t in TOPICS for p in range(PARTITIONS)]
    reader = aiokafka.AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await reader.start()
    ends = dict.fromkeys(tps, 0)
    try:
        reader.assign(tps)
        await reader.seek_to_beginning(*tps)
        read = 0
        while read < published:
            for tp, got in (await reader.getmany(timeout_ms=10_000)).items():
                read += len(got)
                ends[tp] = got[-1].offset + 1
    finally:
        await reader.stop()
    group_view = aiokafka.AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await group_view.start()
    try:
        return {(tp.topic, tp.partition): (await group_view.committed(tp), ends[tp]) for tp in tps}
    finally:
        await group_view.stop()


@pytest.mark.integration
def test_one_event_per_message_with_constant_pausing_stores_and_alerts_everything_once(tmp_path: Path, ruleset):
    records, labels = simulate(SimConfig(hours=8, training_hosts=4, notebooks=2, inference_endpoints=1, seed=7),
                               ruleset.pricing)  # fmt: skip
    records = list(records)
    batched, fleet = tmp_path / "batched.jsonl", tmp_path / "fleet.jsonl"
    with open(batched, "wb") as out:
        write_replay(records, out)
    with open(fleet, "wb") as out:
        write_replay(one_event_per_message(records), out)
    messages = list(file_records(fleet))
    n_events = count_events(messages)
    assert n_events == len(messages) > 20_000
    expected = {a.alert_id for a in backtest(fleet, ruleset).alerts}
    assert expected == {a.alert_id for a in backtest(batched, ruleset).alerts} and len(expected) >= len(labels) > 0

    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        asyncio.run(ensure_topics(broker.bootstrap, PARTITIONS))
        asyncio.run(publish_records(broker.bootstrap, messages))
        env = worker_env(broker.bootstrap, tmp_path / "data", ROOT / "rules", PARTITIONS,
                         BURNWATCH_MAX_HELD_PER_PARTITION="20", BURNWATCH_BATCH_MAX_MESSAGES="500")  # fmt: skip
        worker = WorkerProcess(env, tmp_path / "worker.log").start()
        try:
            health = worker.wait_until(lambda h: h["events"] >= n_events and h["held"] == 0, timeout=300)
        finally:
            assert worker.stop() == 0, worker.tail()
        assert health["fetch_pauses"] > 0 and health["messages"] == n_events and health["dead_letters"] == 0
        assert health["batches"] > n_events // 500  # batches close at the limit
        # Everything read was acknowledged and committed: a restart reads nothing again.
        offsets = asyncio.run(committed_and_ends(broker.bootstrap, env.get("BURNWATCH_APP_ID", "burnwatch"),
                                                   len(messages)))  # fmt: skip
        assert all(committed == end for committed, end in offsets.values() if end), offsets

    stored = sql(env, "SELECT (SELECT count() FROM burnwatch.gpu_metrics) AS gpu, "
                      "(SELECT count() FROM burnwatch.resource_usage) AS usage, "
                      "(SELECT count() FROM burnwatch.run_events) AS runs")[0]  # fmt: skip
    assert int(stored["gpu"]) + int(stored["usage"]) + int(stored["runs"]) == n_events  # each once
    alerts = {r["alert_id"] for r in sql(env, "SELECT alert_id FROM burnwatch.alerts FINAL")}
    assert alerts == expected  # the same alerts as backtest of the same file
