"""The worker's bulk consumer (streams/bulk.py) and its flow control (streams/pipeline.py), on
real parts: the embedded broker, the Faust worker in its own process, embedded ClickHouse.

Exporters that send one event per message are the case the bulk path is for; a tiny
``BURNWATCH_MAX_HELD_PER_PARTITION`` makes the worker pause and resume partitions all
the time, the case where records fetched for a partition paused meanwhile must still
be delivered (they once were not, and the worker stalled with 5,000 messages unread).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import aiokafka
import pytest
from aiokafka.consumer.group_coordinator import CoordinatorGroupRebalance, GroupCoordinator
from faust.transport.consumer import Consumer as FaustConsumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.types import TP
from intervaltree import IntervalTree

from detector.alerts import AlertManager
from detector.backtest import backtest
from detector.engine import Engine
from detector.events import TOPICS
from detector.replay import one_event_per_message, write_replay
from detector.settings import Settings
from detector.simulate import SimConfig, simulate
from streams.bulk import BulkConsumer, Fetches
from streams.embedded import EmbeddedBroker
from streams.kafka import count_events, ensure_topics, file_records, publish_records
from streams.pipeline import Message, Pipeline, dead_letter
from streams.process import WorkerProcess, worker_env
from streams.topology import make_app
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


def test_a_batch_waits_from_when_its_oldest_fetch_arrived_not_from_when_it_is_asked_for():
    async def go() -> None:
        loop = asyncio.get_running_loop()
        fetches = Fetches(max_messages=100, within_s=0.05)
        await fetches.put([message(0)])
        arrived = loop.time()
        while loop.time() < arrived + 0.06:  # the batch's time passes while the last batch is processed
            await asyncio.sleep(0.01)
        taking = asyncio.create_task(fetches.take())
        await asyncio.sleep(0)
        assert taking.done() and [m.offset for m in taking.result()] == [0]  # no second wait

    asyncio.run(go())


def test_a_tombstone_passes_through_to_the_dead_letter_topic():
    async def go() -> None:
        fetches = Fetches(max_messages=1, within_s=0.01)
        await fetches.put([Message("gpu-metrics", 0, 7, b"host-1", None)])  # a record with no value
        (taken,) = await fetches.take()
        record = json.loads(dead_letter(taken, "no value (a tombstone)"))
        assert record["offset"] == 7 and record["size"] == 0 and record["value_base64"] == ""

    asyncio.run(go())


def test_a_revocation_drops_what_is_queued_and_makes_room():
    async def go() -> None:
        fetches = Fetches(max_messages=1, within_s=0.01)
        await fetches.put([message(0), message(1)])  # two batches' worth: the next put waits
        blocked = asyncio.create_task(fetches.put([message(2)]))
        await asyncio.sleep(0)
        assert not blocked.done()
        fetches.clear()
        await asyncio.wait_for(blocked, 5)
        assert [m.offset for m in await fetches.take()] == [2]

    asyncio.run(go())


def test_a_revocation_while_the_agent_waits_for_a_batch_to_fill_leaves_it_waiting_for_the_next():
    async def go() -> None:
        loop = asyncio.get_running_loop()
        fetches = Fetches(max_messages=10, within_s=0.05)
        await fetches.put([message(0)])
        arrived = loop.time()
        taking = asyncio.create_task(fetches.take())  # waits for more within the batch's time
        await asyncio.sleep(0)
        fetches.clear()  # the partitions move meanwhile
        while loop.time() < arrived + 0.06:  # the batch's time runs out with nothing queued
            await asyncio.sleep(0.01)
        assert not taking.done()  # still waiting: no batch of nothing, no error
        await fetches.put([message(1)])
        assert [m.offset for m in await asyncio.wait_for(taking, 5)] == [1]

    asyncio.run(go())


def bookkeeping_consumer() -> BulkConsumer:
    """A bulk consumer with only the acknowledgement bookkeeping Faust's ``Consumer.__init__``
    sets up (no broker): what ``acknowledge`` fills and ``_new_offset`` commits from."""
    consumer = object.__new__(BulkConsumer)
    consumer._acked = defaultdict(list)
    consumer._acked_index = defaultdict(set)
    consumer._committed_offset = defaultdict(lambda: None)
    consumer._gap = defaultdict(IntervalTree)
    consumer._n_acked = 0
    consumer._waiting_for_ack = None
    consumer.app = SimpleNamespace(monitor=SimpleNamespace(stream_inbound_time={}))  # type: ignore[assignment]
    return consumer


def test_acknowledged_offsets_commit_up_to_the_first_gap_once_each():
    consumer = bookkeeping_consumer()
    tp = TP("gpu-metrics", 0)
    consumer._committed_offset[tp] = 5
    other = TP("gpu-metrics", 1)
    # 6 twice, 3 below what is committed; partition 1 in the same call has nothing committed yet
    consumer.acknowledge([message(offset) for offset in (5, 6, 8, 6, 3)] + [message(0, partition=1)])
    assert consumer._n_acked == 4 and sorted(consumer._acked[tp]) == [5, 6, 8] and consumer._acked[other] == [0]
    assert consumer.app.monitor.stream_inbound_time.keys() == {tp, other}  # progress seen on both
    consumer._committed_offset[tp] = consumer._new_offset(tp)  # what a commit does with it
    assert consumer._committed_offset[tp] == 7  # 8 waits for 7
    consumer.acknowledge([message(7)])
    assert consumer._new_offset(tp) == 9


@pytest.mark.parametrize(
    ("read_offset", "fetched", "fresh", "gaps"),
    [
        (None, [0, 1, 2], [0, 1, 2], []),  # nothing read yet: all of it
        (4, [4, 5, 6], [4, 5, 6], []),  # consecutive from the read offset
        # The broker skipped 5-6 (markers, compaction): a gap, [5, 8) as Faust's _add_gap records it,
        # its end taken in (7 is acknowledged in order before anything above it, so no commit passes it)
        (4, [7, 8], [7, 8], [(5, 8)]),
        (4, [2, 3, 4, 5], [4, 5], []),  # fetched again after a seek: what was read is left out
        (4, [5, 7, 8], [5, 7, 8], [(6, 8)]),  # a hole inside the fetch
        (4, [2, 6], [6], [(5, 7)]),  # behind, then ahead
        (4, [], [], []),
    ],
)
def test_a_fetch_hands_over_what_is_past_the_read_offset_and_notes_what_the_broker_skipped(
        read_offset, fetched, fresh, gaps):  # fmt: skip
    consumer = bookkeeping_consumer()
    tp = TP("gpu-metrics", 0)
    consumer._read_offset = defaultdict(lambda: None, {tp: read_offset})
    consumer.app.topics = SimpleNamespace(acks_enabled_for=lambda topic: True)  # type: ignore[attr-defined]
    records = [SimpleNamespace(offset=offset) for offset in fetched]
    handed = asyncio.run(consumer._fresh(tp, records))
    assert [r.offset for r in handed] == fresh
    assert consumer._read_offset[tp] == (fresh[-1] if fresh else read_offset)
    assert sorted((i.begin, i.end) for i in consumer._gap[tp]) == gaps


def test_a_partition_assigned_again_is_not_read_from_where_a_late_fetch_left_it(monkeypatch):
    """A fetch of the generation before, handed over after the revocation (a worker frozen past the
    session wakes with one), sets the partition's read offset again after Faust forgot it; Faust's seek
    at the next assignment leaves it where nothing is committed. Every record below it was then left
    out as read already, and the partition was never read again. The assignment starts it afresh."""
    consumer = bookkeeping_consumer()
    consumer.app.topics = SimpleNamespace(acks_enabled_for=lambda topic: True)  # type: ignore[attr-defined]
    again, kept = TP("gpu-metrics", 0), TP("gpu-metrics", 1)
    consumer._read_offset = defaultdict(lambda: None, {again: 500, kept: 40})  # 500: the late fetch's
    assigned: list[set[TP]] = []

    async def faust_assigns(self, tps, generation_id=0):  # Faust's own: nothing committed, so no seek sets it
        assigned.append(set(tps))

    monkeypatch.setattr(FaustConsumer, "on_partitions_assigned", faust_assigns)
    asyncio.run(consumer.on_partitions_assigned({again}, 3))
    assert assigned == [{again}]  # Faust's handler still runs
    handed = asyncio.run(consumer._fresh(again, [SimpleNamespace(offset=offset) for offset in (0, 1, 2)]))
    assert [r.offset for r in handed] == [0, 1, 2]
    assert consumer._read_offset[kept] == 40  # a partition not assigned again keeps its own


def test_a_partition_assigned_again_commits_what_is_read_again_after_a_commit_lost_in_the_revocation(monkeypatch):
    """A commit that fails because the group moved on (a worker frozen past the session commits as it
    wakes: aiokafka's "already rebalanced") is recorded by Faust as made, after its revocation forgot the
    partition. Given the partition back with nothing committed in Kafka, the worker read it again from 0
    and acknowledged every offset, each below that offset and so dropped: nothing was committed (the
    frozen-worker test of tests/test_several_workers.py waited 240 s for it)."""
    consumer = bookkeeping_consumer()
    tp, kept = TP("gpu-metrics", 1), TP("gpu-metrics", 2)
    consumer.acknowledge([message(offset, partition=1) for offset in range(10)])
    consumer._committed_offset[kept] = 40
    # Faust's _commit_offsets: the acknowledged run taken, the commit fails, the offset recorded anyway
    # (here after the revocation had forgotten the partition: on_partitions_revoked pops these four)
    for bookkeeping in (consumer._committed_offset, consumer._acked, consumer._acked_index, consumer._gap):
        bookkeeping.pop(tp, None)
    consumer._committed_offset[tp] = 10

    async def faust_assigns(self, tps, generation_id=0):  # Faust's own: nothing committed, so no seek sets it
        pass

    monkeypatch.setattr(FaustConsumer, "on_partitions_assigned", faust_assigns)
    consumer._read_offset = defaultdict(lambda: None)
    asyncio.run(consumer.on_partitions_assigned({tp}, 3))
    consumer.acknowledge([message(offset, partition=1) for offset in range(10)])  # read again from 0
    assert consumer._new_offset(tp) == 10 and consumer._should_commit(tp, 10)
    assert consumer._committed_offset[kept] == 40  # a partition not assigned again keeps its own


def test_the_private_parts_of_faust_and_aiokafka_the_bulk_consumer_uses_still_exist():
    consumer_init = inspect.getsource(FaustConsumer.__init__)
    for name in ("_acked", "_acked_index", "_committed_offset", "_gap", "_read_offset", "_commit_every"):
        assert f"self.{name} =" in consumer_init, name
    assert FaustConsumer._n_acked == 0
    for method in ("_wait_next_records", "_add_gap", "_new_offset", "perform_seek", "_to_message"):
        assert callable(getattr(BulkConsumer, method)), method
    assert "_fetch_max_wait_ms" in inspect.getsource(aiokafka.AIOKafkaConsumer.__init__)
    start = inspect.getsource(aiokafka.AIOKafkaConsumer.start)  # where both reach its fetcher
    assert "fetch_max_wait_ms=self._fetch_max_wait_ms" in start and "fetch_max_bytes=self._fetch_max_bytes" in start
    assert "fetch_max_wait_ms=1500" in inspect.getsource(AIOKafkaConsumerThread._create_worker_consumer)
    # streams.membership: the coordinator made at the consumer's start, whose heartbeats renew the membership
    assert "self._coordinator = GroupCoordinator(" in start
    assert "success = await self._do_heartbeat()" in inspect.getsource(GroupCoordinator._heartbeat_routine)
    assert "self._send_req(" in inspect.getsource(GroupCoordinator._do_heartbeat)
    assert "await self._coordinator._send_req(request)" in inspect.getsource(CoordinatorGroupRebalance._send_sync_group_request)


class Gpu:
    """What the aligner needs of an event: its time."""

    def __init__(self, t: float) -> None:
        self.ts = SimpleNamespace(timestamp=lambda: t)


def flow_pipeline(ruleset, limit: int, lateness_s: float = 0.0) -> tuple[Pipeline, list[tuple[list, list]]]:
    calls: list[tuple[list, list]] = []
    pipeline = Pipeline(engine=Engine(ruleset), store=None, outbox=None, manager=AlertManager(),  # type: ignore[arg-type]
                        send_dead_letter=lambda key, value: asyncio.sleep(0), lateness_s=lateness_s,
                        flow=lambda pause, resume: calls.append((sorted(pause), sorted(resume))),
                        max_held_per_partition=limit)  # fmt: skip
    return pipeline, calls


def test_a_partition_far_ahead_is_paused_and_the_one_holding_the_watermark_never_is(ruleset):
    pipeline, calls = flow_pipeline(ruleset, limit=4, lateness_s=60.0)
    aligner, ahead, behind = pipeline.aligner, ("gpu-metrics", 0), ("gpu-metrics", 1)
    for i in range(6):  # partition 0 runs an hour ahead with 6 messages; partition 1 holds the watermark
        aligner.push(ahead, [Gpu(3600.0 + i)], object())
    for i in range(6):
        aligner.push(behind, [Gpu(float(i))], object())
    aligner.release()
    assert aligner.slowest() == behind and aligner.held_by_source == {ahead: 6, behind: 6}
    pipeline._flow_control()
    # both over 4 held; the one holding the watermark is not paused, or nothing would move
    assert calls == [([ahead], [])] and pipeline.paused == {ahead}
    pipeline._flow_control()
    assert len(calls) == 1  # nothing new to say
    aligner.push(behind, [Gpu(3700.0)], object())  # partition 1 passes it: 0 now holds the watermark
    aligner.release()
    assert aligner.slowest() == ahead and aligner.held_by_source == {ahead: 6, behind: 1}
    pipeline._flow_control()
    assert calls[-1] == ([], [ahead]) and not pipeline.paused  # resumed: it holds the watermark


def test_a_paused_partition_resumes_once_half_of_what_it_held_is_released(ruleset):
    pipeline, calls = flow_pipeline(ruleset, limit=4)
    aligner, ahead, behind = pipeline.aligner, ("gpu-metrics", 0), ("gpu-metrics", 1)
    for i in range(6):
        aligner.push(ahead, [Gpu(100.0 + 10 * i)], object())  # 100 … 150
    aligner.push(behind, [Gpu(0.0)], object())
    pipeline._flow_control()
    assert pipeline.paused == {ahead}
    aligner.push(behind, [Gpu(125.0)], object())  # watermark 125: three of its six released
    aligner.release()
    pipeline._flow_control()
    assert aligner.slowest() == behind and aligner.held_by_source[ahead] == 3 and pipeline.paused == {ahead}
    aligner.push(behind, [Gpu(135.0)], object())  # a fourth: 2 held, half of the limit
    aligner.release()
    pipeline._flow_control()
    assert calls[-1] == ([], [ahead]) and not pipeline.paused
    for i in range(5):
        aligner.push(ahead, [Gpu(2000.0 + i)], object())
    pipeline._flow_control()
    assert pipeline.paused == {ahead}
    pipeline.reset()  # partitions moved: what was paused is resumed, the counts start again
    assert calls[-1] == ([], [ahead]) and not pipeline.paused and aligner.held_by_source == {}


def test_a_partition_with_more_than_its_share_fetched_is_paused_before_the_next_fetch(ruleset):
    """The pause is decided as a fetch is queued, counting what is queued with what the aligner holds:
    decided only after a batch's push, a partition took in the queue's two batches' worth first, and a
    worker alone catching up held several times its partitions' shares."""

    async def go() -> None:
        pipeline, calls = flow_pipeline(ruleset, limit=4)
        fetches = Fetches(max_messages=100, within_s=0.01)
        pipeline.watch(fetches)
        aligner, ahead, behind = pipeline.aligner, ("gpu-metrics", 0), ("gpu-metrics", 1)
        aligner.push(behind, [Gpu(0.0)], object())  # holds the watermark
        for i in range(2):
            aligner.push(ahead, [Gpu(100.0 + i)], object())
        await fetches.put([message(i, partition=0) for i in range(2, 4)])  # 2 held + 2 queued: its share
        assert calls == [] and fetches.queued == {ahead: 2}
        await fetches.put([message(4, partition=0)])  # one more: paused now, no batch in between
        assert calls == [([ahead], [])] and pipeline.paused == {ahead}
        await fetches.put([message(i, partition=1) for i in range(1, 16)])  # the watermark's, within its allowance
        assert pipeline.paused == {ahead} and fetches.queued == {ahead: 3, behind: 15}
        batch = await fetches.take()
        assert len(batch) == 18 and fetches.queued == {}  # taken: counted again once pushed
        pipeline.fetched()  # what a batch took and has not pushed is counted nowhere: nothing is resumed meanwhile
        assert pipeline.paused == {ahead}
        for m in batch:
            aligner.push((m.topic, m.partition), [Gpu(100.0 + m.offset if m.partition == 0 else 200.0)], m)
        aligner.release()  # partition 1 passed partition 0, which now holds the watermark: their roles swap
        pipeline._flow_control()
        assert calls[-1] == ([behind], [ahead]) and pipeline.paused == {behind}  # 16 held
        await fetches.put([message(5, partition=0)])
        fetches.clear()  # partitions moved: nothing queued counts
        assert fetches.queued == {}

    asyncio.run(go())


def test_the_partition_holding_the_watermark_is_paused_with_a_batch_of_it_queued_and_fetched_again_once_pushed(ruleset):
    """Never for what it holds (the watermark must move), but what it takes in while behind it holds once it
    has passed the others: unpaused, it filled the consumer's queue (two batches)."""

    async def go() -> None:
        pipeline, calls = flow_pipeline(ruleset, limit=4)
        fetches = Fetches(max_messages=16, within_s=0.01)
        pipeline.watch(fetches)
        aligner, ahead, behind = pipeline.aligner, ("gpu-metrics", 0), ("gpu-metrics", 1)
        aligner.push(ahead, [Gpu(500.0)], object())
        for i in range(10):  # far over its share, but it holds the watermark: not paused for it
            aligner.push(behind, [Gpu(float(i))], object())
        pipeline._flow_control()
        assert aligner.slowest() == behind and calls == []
        await fetches.put([message(i, partition=1) for i in range(10, 25)])
        assert calls == []  # less than a batch of it queued
        await fetches.put([message(100, partition=1)])  # a batch's worth: paused until these are pushed
        assert calls == [([behind], [])]
        batch = await fetches.take()
        for m in batch[:-1]:
            aligner.push(behind, [Gpu(float(m.offset))], m)  # still behind partition 0
        aligner.release()
        pipeline._flow_control()
        assert aligner.slowest() == behind and calls[-1] == ([], [behind])  # still holds it: fetched again
        aligner.push(behind, [Gpu(1000.0)], batch[-1])  # passes partition 0, with what it fetched since
        for i in range(5):
            aligner.push(behind, [Gpu(1001.0 + i)], object())
        aligner.release()
        pipeline._flow_control()
        # partition 0 holds the watermark now; partition 1, past its share, is paused as any other
        assert aligner.slowest() == ahead and aligner.held_by_source[behind] == 6
        assert calls[-1] == ([behind], []) and pipeline.paused == {behind}

    asyncio.run(go())


def test_no_partition_is_paused_for_what_is_queued_before_the_next_assignment_or_after_it_moved(ruleset):
    """A pause of a partition no longer assigned would stay in Faust's consumer, and a later assignment of
    it here would never fetch it; what the queue holds of it was fetched before it moved."""

    async def go() -> None:
        pipeline, calls = flow_pipeline(ruleset, limit=4)
        fetches = Fetches(max_messages=100, within_s=0.01)
        pipeline.watch(fetches)
        mine, moved, behind = ("gpu-metrics", 0), ("gpu-metrics", 1), ("gpu-metrics", 2)
        pipeline.aligner.push(mine, [Gpu(0.0)], object())
        pipeline.aligner.push(behind, [Gpu(-10.0)], object())  # holds the watermark: partition 0 could be paused
        pipeline.ready.clear()  # between a revocation and the next assignment's state
        await fetches.put([message(i, partition=0) for i in range(10)])
        assert calls == [] and fetches.queued == {mine: 10}
        pipeline.ready.set()
        pipeline.expect([mine, behind])  # assigned: partitions 0 and 2, not 1
        await fetches.put([message(i, partition=1) for i in range(10)])
        # partition 0 (not holding the watermark), not partition 1, queued as much
        assert calls == [([mine], [])] and fetches.queued[moved] == 10

    asyncio.run(go())


def test_a_batch_of_a_partition_is_queued_at_a_batchs_messages_or_bytes():
    async def go() -> None:
        fetches = Fetches(max_messages=100, max_bytes=10, within_s=0.01)
        tp = ("gpu-metrics", 0)
        await fetches.put([message(i) for i in range(4)] + [message(0, partition=1)])  # 8 bytes of partition 0
        assert not fetches.holds_a_batch(tp) and fetches.queued == {tp: 4, ("gpu-metrics", 1): 1}
        await fetches.put([message(4)])  # 10 bytes
        assert fetches.holds_a_batch(tp) and not fetches.holds_a_batch(("gpu-metrics", 1))
        await fetches.take()
        assert not fetches.holds_a_batch(tp) and fetches.queued == {tp: 1}  # the first fetch taken, 10 bytes

    asyncio.run(go())


async def fetched_bytes(bootstrap: str, data_dir: Path, fetch_max_bytes: int | None, total: int) -> list[int]:
    """The value bytes of each ``getmany`` of the consumer the worker's app makes (its settings, its
    consumer thread), reading every partition of gpu-metrics from the start until ``total`` bytes.
    ``fetch_max_bytes`` None: the worker's default."""
    update: dict[str, object] = {"kafka_bootstrap": bootstrap, "data_dir": data_dir, "partitions": PARTITIONS}
    if fetch_max_bytes is not None:
        update["fetch_max_bytes"] = fetch_max_bytes
    app = make_app(Settings().model_copy(update=update))
    consumer = app.consumer._thread._create_worker_consumer(app.transport)  # type: ignore[attr-defined]
    await consumer.start()
    try:
        consumer.assign([aiokafka.TopicPartition("gpu-metrics", p) for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        sizes: list[int] = []
        while sum(sizes) < total:
            got = await consumer.getmany(timeout_ms=10_000)
            assert got, f"nothing more fetched after {sum(sizes)} of {total} bytes"
            sizes.append(sum(len(r.value) for records in got.values() for r in records))
        return sizes
    finally:
        await consumer.stop()


def test_a_fetch_brings_at_most_its_bytes_of_all_partitions_together(tmp_path: Path):
    """``BURNWATCH_FETCH_MAX_BYTES`` bounds what one fetch brings over all partitions (Kafka's
    ``fetch.max.bytes``): what lands between two decisions of flow control, and what the consumer
    buffers of each partition: the embedded broker ignores the per-partition limit and honours this
    one, and by default (Kafka's 50 MiB) gives all it has of every partition at once
    (docs/performance.md, Memory). aiokafka fetches no partition whose last fetch waits to be taken,
    so one ``getmany`` holds at most one fetch of each partition: each the limit and the rest of the
    record batch that crosses it (one fetch alone when taken at once, as here)."""
    limit, record_batch, value = 64 << 10, 16 << 10, b"x" * 1000

    async def publish(bootstrap: str) -> int:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, max_batch_size=record_batch, linger_ms=5)
        await producer.start()
        try:
            sent = [await producer.send("gpu-metrics", value, partition=i % PARTITIONS) for i in range(1024)]
            await asyncio.gather(*sent)
        finally:
            await producer.stop()
        return len(sent) * len(value)

    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        asyncio.run(ensure_topics(broker.bootstrap, PARTITIONS, ["gpu-metrics"]))
        total = asyncio.run(publish(broker.bootstrap))
        bounded = asyncio.run(fetched_bytes(broker.bootstrap, tmp_path / "a", limit, total))
        unbounded = asyncio.run(fetched_bytes(broker.bootstrap, tmp_path / "b", None, total))
    assert sum(bounded) == total and max(bounded) <= PARTITIONS * (limit + record_batch), bounded
    assert max(unbounded) > PARTITIONS * (limit + record_batch)  # the worker's default: everything in one fetch
