"""The worker's batch pipeline without Kafka: real store (chdb), real detection."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
import structlog.testing

from detector.alerts import AlertManager
from detector.delivery import Outbox
from detector.engine import Engine
from detector.metrics import METRICS
from detector.store.states import SavedTimes
from streams.parts import remembering_manager
from streams.pipeline import Message, Pipeline, PipelineStopped
from tests.helpers import MIN, T0, at


def gpu_message(offset: int, t: float, util: float, host: str = "h1") -> Message:
    value = [{"ts": at(t).isoformat(), "resource_id": host, "gpu_index": i, "util_pct": util} for i in range(2)]
    return Message("gpu-metrics", 0, offset, host.encode(), json.dumps(value).encode())


def usage_message(offset: int, t: float, host: str = "h1") -> Message:
    value = {"ts": at(t).isoformat(), "resource_id": host, "resource_type": "gpu_instance", "cost_usd": 0.5,
             "interval_s": 60, "tags": {"team": "nlp", "project": "llm"}}  # fmt: skip
    return Message("resource-usage", 0, offset, host.encode(), json.dumps(value).encode())


def cpu_seconds(stage: str) -> float:
    return METRICS.registry.get_sample_value("burnwatch_cpu_seconds_total", {"stage": stage}) or 0.0


def assert_in_offset_order(acked: list[tuple[str, int]]) -> None:
    """Per topic, acknowledged offsets run 0, 1, 2, ... with no gap and no reordering."""
    for topic in {t for t, _ in acked}:
        offsets = [o for t, o in acked if t == topic]
        assert offsets == list(range(len(offsets))), (topic, offsets)


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

    async def ack(messages):
        acked.extend((message.topic, message.offset) for message in messages)

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

    cpu_before = {stage: cpu_seconds(stage) for stage in ("read", "detect", "write")}
    held_after_first, acked_after_first = asyncio.run(run())
    assert all(cpu_seconds(stage) > before for stage, before in cpu_before.items())  # /metrics says where CPU went
    assert held_after_first > 0
    assert ("resource-usage", 3) not in acked_after_first  # T0+90m: beyond what gpu had shown
    # The dead letter (offset 10) waits for the held message before it (offset 9): Faust commits
    # the first run of acknowledged offsets, so acknowledging past a held message would commit past it.
    assert ("gpu-metrics", 9) not in acked_after_first and ("gpu-metrics", 10) not in acked_after_first
    assert ("gpu-metrics", 10) in acked
    assert len(acked) == 4 + 10 + 1 + 90 and len(pipeline.aligner) == 0
    assert_in_offset_order(acked)
    assert len(dead) == 1 and "not JSON" in json.loads(dead[0])["reason"]
    assert store.count("gpu_metrics") == 200 and store.count("resource_usage") == 4
    (alert,) = store.alerts.latest()
    assert alert["resource_id"] == "h1" and alert["tags"] == {"team": "nlp", "project": "llm"}
    assert store.states.load([0]).keys() == {"h1"}


def started(store, ruleset, behind: dict[str, bool], partitions: tuple[int, ...] = (0,), **engine_options) -> Pipeline:
    """A pipeline as a worker (re)starts one holding ``partitions``: its engine loads the keys' states
    saved in the store; a topic in ``behind`` is not caught up. The keys not in the partitions' newest
    save as ones saved long ago: loaded without their bytes, read from the store when they speak
    (``saved_within_s=0``); their latest times and whether each may hold an open episode for the
    sweeps (``saved_times``), as :mod:`streams.handover` loads them."""
    latest: dict[str, float] = {}
    maybe_open: set[str] = set()
    states = store.states.load(list(partitions), saved_within_s=0, latest=latest, maybe_open=maybe_open)
    engine = Engine(ruleset, loader=lambda key: store.states.take(states, key), **engine_options)
    pipeline = Pipeline(
        engine=engine, store=store, outbox=Outbox(store, None), manager=remembering_manager(store, ruleset),
        send_dead_letter=lambda key, value: asyncio.sleep(0),
        caught_up=lambda topic, p, offset: not behind.get(topic, False), saved_states=states,
    )  # fmt: skip
    pipeline.saved_times = SavedTimes(latest, maybe_open)
    return pipeline


def run_batches(pipeline, batches, acked):
    async def ack(messages):
        acked.extend((message.topic, message.offset) for message in messages)

    async def go():
        for batch in batches:
            await pipeline.process(batch, ack)
        await pipeline.drain()

    asyncio.run(go())


def test_events_older_than_the_store_keeps_are_said_to_be_so_at_most_hourly(store, ruleset):
    """A replay of events older than the store's expiry was stored, detected and alerted on, and gone at the next
    merge with nothing said: the worker says so, once an hour at most, and stores everything all the same."""
    pipeline, _ = make(store, ruleset, lambda topic, p, offset: True)
    pipeline.event_expiry_days = 30  # T0 is 2026-11-02: over 30 days before this machine's clock
    now_ish = time.time() - 3600

    async def ack(messages):
        pass

    async def run():
        with structlog.testing.capture_logs() as logs:
            await pipeline.process([usage_message(i, T0 + i * 60) for i in range(3)], ack)
            await pipeline.drain()
            await pipeline.process([usage_message(3 + i, T0 + (3 + i) * 60) for i in range(3)], ack)
            await pipeline.drain()
            await pipeline.process([usage_message(6, now_ish, host="h2")], ack)  # within the expiry: nothing said
            await pipeline.drain()
        return [e for e in logs if e["event"] == "events_past_expiry"]

    said = asyncio.run(run())
    assert len(said) == 1 and said[0]["expiry_days"] == 30 and "BURNWATCH_EVENT_TTL_DAYS=0" in said[0]["note"]
    assert store.count("resource_usage") == 7
    pipeline, _ = make(store, ruleset, lambda topic, p, offset: True)  # events within the expiry: nothing said
    pipeline.event_expiry_days = 30

    async def recent():
        with structlog.testing.capture_logs() as logs:
            await pipeline.process([usage_message(7 + i, now_ish + i * 60, host="h3") for i in range(3)], ack)
            await pipeline.drain()
        return [e for e in logs if e["event"] == "events_past_expiry"]

    assert asyncio.run(recent()) == []


def test_a_message_the_store_refuses_is_dead_lettered_and_the_partition_goes_on(store, ruleset):
    """ClickHouse refuses one message's rows (a CHECK constraint here; in the wild a value out of
    a column's range): that message alone is dead-lettered with ClickHouse's reason, every other
    message of the batch is stored once, and acknowledgements go on past it in order."""
    store.client.command(f"ALTER TABLE {store.db}.gpu_metrics ADD CONSTRAINT no_poison CHECK resource_id != 'poison'")
    pipeline, dead = make(store, ruleset, lambda topic, p, offset: True)
    messages = [gpu_message(i, T0 + i * 60, 50.0) for i in range(20)]
    messages[7] = gpu_message(7, T0 + 7 * 60, 50.0, host="poison")
    acked: list[tuple[str, int]] = []
    run_batches(pipeline, [messages[:12], messages[12:]], acked)
    assert store.count("gpu_metrics") == 19 * 2
    (record,) = [json.loads(d) for d in dead]
    assert record["offset"] == 7 and "no_poison" in record["reason"] and "store refused" in record["reason"]
    assert acked == [("gpu-metrics", i) for i in range(20)]
    assert pipeline.stats.events == 19 * 2 and pipeline.stats.dead_letters == 1


def test_a_store_that_takes_no_write_stalls_the_pipeline_and_loses_nothing(store, ruleset):
    """Every insert fails (the store is down or read-only): nothing is dead-lettered or
    acknowledged, the pipeline reports the stall; once the store takes writes again every
    event is stored and every message acknowledged."""
    tables = ["gpu_metrics", "resource_usage", "write_probe", "alerts", "alert_changes", "detector_state"]
    for table in tables:
        store.client.command(f"ALTER TABLE {store.db}.{table} ADD CONSTRAINT down CHECK 0")
    pipeline, dead = make(store, ruleset, lambda topic, p, offset: True)
    pipeline._retry_max_s = 0.2
    acked: list[tuple[str, int]] = []

    async def ack(messages):
        acked.extend((message.topic, message.offset) for message in messages)

    async def go():
        await pipeline.process([gpu_message(i, T0 + i * 60, 1.0) for i in range(40)], ack)
        deadline = time.monotonic() + 30
        while pipeline.stalled_for() == 0.0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stalled = pipeline.stalled_for() > 0 and "down" in pipeline.stall_reason
        acked_while_down = list(acked)
        for table in tables:
            store.client.command(f"ALTER TABLE {store.db}.{table} DROP CONSTRAINT down")
        await pipeline.drain()
        return stalled, acked_while_down

    stalled, acked_while_down = asyncio.run(go())
    assert stalled and acked_while_down == [] and dead == []
    assert store.count("gpu_metrics") == 80 and pipeline.stalled_for() == 0.0
    assert acked == [("gpu-metrics", i) for i in range(40)]


def test_a_look_up_the_store_fails_is_asked_again_until_it_answers_or_is_given_up(store, ruleset):
    """An assignment takes its partitions over through ``Pipeline.ask_store``: a store that fails (its
    state table gone) stalls the pipeline (/healthz says why) and is asked again with backoff until it
    answers; a look-up given up meanwhile (a revocation) raises PipelineStopped and ends the stall it began,
    so that the stall exit does not fire for a question nobody asks any more."""
    pipeline, _ = make(store, ruleset, lambda topic, p, offset: True)
    pipeline._retry_max_s = 0.2
    asked: list[float] = []

    def load() -> dict:
        asked.append(time.monotonic())
        return store.states.load([0], None, {})

    def table(away: bool) -> None:
        names = ("detector_state", "detector_state_away")
        store.client.command(f"RENAME TABLE {store.db}.{names[not away]} TO {store.db}.{names[away]}")

    async def until(condition, what: str) -> None:
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.02)

    async def go() -> tuple[dict, bool, bool]:
        table(away=True)
        loading = asyncio.ensure_future(pipeline.ask_store(load, "state load", "taking partitions over; retrying"))
        await until(lambda: len(asked) >= 3, "asked again")
        stalled = pipeline.stalled_for() > 0 and pipeline.stall_reason.startswith("state load: ")
        table(away=False)
        loaded = await asyncio.wait_for(loading, 30)
        answered = pipeline.stalled_for() == 0.0
        table(away=True)
        given_up: list[bool] = []
        loading = asyncio.ensure_future(pipeline.ask_store(load, "state load", "retrying", given_up=lambda: bool(given_up)))
        await until(lambda: pipeline.stalled_for() > 0, "stalled again")
        given_up.append(True)
        with pytest.raises(PipelineStopped):
            await asyncio.wait_for(loading, 30)
        table(away=False)
        return loaded, stalled, answered

    loaded, stalled, answered = asyncio.run(go())
    assert loaded == {} and stalled and answered
    assert pipeline.stalled_for() == 0.0 and pipeline.stall_reason == ""


def test_a_read_the_store_does_not_answer_is_given_up_at_once_and_a_recovery_is_awaited(store, ruleset):
    """A revocation gives up the taking over's look-ups: a read (the state load) that hangs is left to
    finish unused, so a store that hangs holds no revocation up; a look-up that is not only a read (the
    posts' recovery takes the partitions) is awaited, so it never lands after the handover."""
    pipeline, _ = make(store, ruleset, lambda topic, p, offset: True)
    hanging, gave_up = threading.Event(), threading.Event()

    def hung() -> dict:
        hanging.set()
        gave_up.wait(30)  # a store that does not answer, until the test is done
        return store.states.load([0], None, {})

    async def go(read_only: bool) -> tuple[bool, object]:
        """Whether the look-up ended while the store still hung, and its outcome once the store answered."""
        given_up: list[bool] = []
        asked = asyncio.ensure_future(pipeline.ask_store(hung, "state load", "retrying", read_only=read_only,
                                                         given_up=lambda: bool(given_up)))  # fmt: skip
        assert await asyncio.get_running_loop().run_in_executor(None, hanging.wait, 30)
        given_up.append(True)
        done, _ = await asyncio.wait({asked}, timeout=30 if read_only else 0.5)  # (not given up: still waiting)
        gave_up.set()  # the store answers
        try:
            outcome: object = await asyncio.wait_for(asked, 30)
        except PipelineStopped:
            outcome = "given up"
        hanging.clear()
        gave_up.clear()
        return bool(done), outcome

    assert asyncio.run(go(read_only=True)) == (True, "given up")
    assert asyncio.run(go(read_only=False)) == (False, {})  # awaited until it answered: its answer stands


def test_events_are_stored_once_by_content_whatever_their_offsets(store, ruleset):
    """A producer re-sends messages (new offsets, same content), the topic is recreated
    (offsets start again at 0 with new content): the re-sent events are stored once, the new
    ones all, and the dollars in the rollups count each interval once."""
    first = [usage_message(i, T0 + i * MIN) for i in range(30)]
    resent = [Message(m.topic, m.partition, 30 + i, m.key, m.value) for i, m in enumerate(first[:10])]
    pipeline, _ = make(store, ruleset, lambda topic, p, offset: True)
    run_batches(pipeline, [first, resent], [])
    assert store.count("resource_usage") == 30
    reset = [usage_message(i, T0 + (30 + i) * MIN) for i in range(25)]  # offsets 0.. again, new events
    pipeline, _ = make(store, ruleset, lambda topic, p, offset: True)  # a restart
    run_batches(pipeline, [reset + reset[:5]], [])  # and duplicates within one batch
    assert store.count("resource_usage") == 55
    (hourly,) = store.query(f"SELECT sum(usd) AS usd FROM {store.db}.cost_hourly")
    assert hourly["usd"] == pytest.approx(55 * 0.5)


def test_an_assigned_partition_holds_event_time_until_it_delivers_or_has_nothing_to_read(store, ruleset):
    """Partition 1 delivers two hours of samples; partition 0, assigned too, has delivered
    nothing. However long that takes (a busy machine), partition 0 holds the watermark as
    long as its position is short of its end offset or cannot be read; it stops holding it
    only once its position reaches its end offset. No clock decides."""
    answers: list = [RuntimeError("broker unreachable"), {("gpu-metrics", 0): (5, 12)}, {("gpu-metrics", 0): (12, 12)}]

    async def end_positions(tps):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    pipeline, _ = make(store, ruleset, lambda topic, p, offset: True)
    pipeline._end_positions = end_positions
    acked: list[tuple[str, int]] = []

    async def ack(messages):
        acked.extend((message.topic, message.offset) for message in messages)

    async def go():
        pipeline.expect([("gpu-metrics", 0), ("gpu-metrics", 1)])
        messages = [Message("gpu-metrics", 1, m.offset, m.key, m.value)
                    for m in (gpu_message(i, T0 + i * MIN, 1.0) for i in range(120))]  # fmt: skip
        await pipeline.process(messages, ack)
        await pipeline.drain()
        seen = []
        for _ in range(3):
            await pipeline.tick()
            await pipeline.drain()
            seen.append((dict(pipeline.holding), len(acked), pipeline.stats.detected))
        return seen

    unreachable, behind, caught_up = asyncio.run(go())
    assert "broker unreachable" in unreachable[0][("gpu-metrics", 0)] and unreachable[1:] == (0, 0)
    assert "5 < end offset 12" in behind[0][("gpu-metrics", 0)] and behind[1:] == (0, 0)
    assert caught_up[0] == {} and caught_up[1] == 120 and caught_up[2] == 240


def test_an_end_offset_answer_from_before_the_partitions_moved_is_not_used(store, ruleset):
    """The release timer asks where an assigned partition's reading starts and ends; before the
    broker answers, the partitions move (revoked, then assigned again, while another worker may
    have read on). The answer, nothing to read, was true of the previous assignment: it is not
    used, so the partition keeps holding the watermark until the next tick's answer says so."""
    asked = asyncio.Event()
    answers = asyncio.Queue()

    async def end_positions(tps):
        asked.set()
        return await answers.get()

    pipeline, _ = make(store, ruleset, lambda topic, p, offset: True)
    pipeline._end_positions = end_positions
    acked: list[tuple[str, int]] = []

    async def ack(messages):
        acked.extend((message.topic, message.offset) for message in messages)

    messages = [Message("gpu-metrics", 1, m.offset, m.key, m.value)
                for m in (gpu_message(i, T0 + i * MIN, 1.0) for i in range(120))]  # fmt: skip

    async def go():
        pipeline.expect([("gpu-metrics", 0), ("gpu-metrics", 1)])
        tick = asyncio.create_task(pipeline.tick())
        await asyncio.wait_for(asked.wait(), 10)
        pipeline.reset()  # revoked, and assigned again while the broker had not answered
        pipeline.expect([("gpu-metrics", 0), ("gpu-metrics", 1)])
        await answers.put({("gpu-metrics", 0): (12, 12)})
        await tick
        await pipeline.process(messages, ack)
        await pipeline.drain()
        held = (len(acked), pipeline.stats.detected)
        await answers.put({("gpu-metrics", 0): (12, 20)})  # another worker's records since
        await pipeline.tick()
        return held, dict(pipeline.holding)

    (acked_while_held, detected_while_held), holding = asyncio.run(go())
    assert acked_while_held == 0 and detected_while_held == 0
    assert "12 < end offset 20" in holding[("gpu-metrics", 0)]


def test_the_release_timer_asks_about_new_partitions_at_once(store, ruleset):
    """Between ticks the release timer waits its second, except after an assignment: until each
    new partition delivers or is found to have nothing to read, no event is decided, so one with
    nothing to read held the others' first events until the next tick (``bench/first_release.py``)."""
    pipeline, _ = make(store, ruleset, lambda topic, p, offset: True)

    async def go():
        waiting = asyncio.create_task(pipeline.tick_due(3600.0))
        for _ in range(10):
            await asyncio.sleep(0)  # (a yield to the task, not a wait for time)
        before = waiting.done()
        pipeline.expect([("gpu-metrics", 0), ("gpu-metrics", 1)])
        await asyncio.wait_for(waiting, 30)  # at once, not after the hour
        again = asyncio.create_task(pipeline.tick_due(3600.0))  # and then the usual wait again
        for _ in range(10):
            await asyncio.sleep(0)
        after = again.done()
        again.cancel()
        await asyncio.wait_for(pipeline.tick_due(0.01), 30)  # nothing assigned: due once the interval is up
        return before, after

    before, after = asyncio.run(go())
    assert not before and not after


def test_a_stopping_worker_asks_the_broker_nothing_more(store, ruleset):
    """Once the worker is stopping, the release timer asks no end offsets: the consumer's
    thread, stopping too, would cancel the request or never answer it."""
    asked: list[list] = []

    async def end_positions(tps):
        asked.append(tps)
        return {}

    pipeline, _ = make(store, ruleset, lambda topic, p, offset: True)
    pipeline._end_positions = end_positions

    async def go():
        pipeline.expect([("gpu-metrics", 0)])
        await pipeline.tick()
        pipeline.stop()
        await pipeline.tick()

    asyncio.run(go())
    assert asked == [[("gpu-metrics", 0)]]


def test_a_pause_waits_for_the_batch_being_written_and_the_one_behind_it(store, ruleset):
    """A revocation pauses the pipeline while a batch's write is in flight and the next batch,
    detected, has its write queued behind it: the pause returns only once both writes have landed,
    and no batch is taken after it (a write landing later could race the partitions' new holder)."""
    import threading

    pipeline, _ = make(store, ruleset, lambda topic, p, offset: True)
    gate, written = threading.Event(), []
    real_write = pipeline._write

    def slow_write(step):
        gate.wait(30)
        result = real_write(step)
        written.append(step.messages)
        return result

    pipeline._write = slow_write

    async def ack(messages):
        pass

    async def go():
        await pipeline.process([gpu_message(i, T0 + i * 60, 50.0) for i in range(5)], ack)  # its write waits
        await pipeline.process([gpu_message(5 + i, T0 + (5 + i) * 60, 50.0) for i in range(5)], ack)  # queued
        pausing = asyncio.create_task(pipeline.pause())
        for _ in range(20):
            await asyncio.sleep(0)
        paused_early = pausing.done()
        gate.set()
        await pausing
        landed = list(written)
        third = asyncio.create_task(pipeline.process([gpu_message(10, T0 + 600, 50.0)], ack))
        for _ in range(20):
            await asyncio.sleep(0)
        taken_while_paused = third.done()
        pipeline.ready.set()
        await third
        await pipeline.drain()
        return paused_early, landed, taken_while_paused

    paused_early, landed, taken_while_paused = asyncio.run(go())
    assert not paused_early and landed == [5, 5] and not taken_while_paused
    assert store.count("gpu_metrics") == 22


def test_a_batch_is_decided_while_the_write_before_it_lands_and_acknowledged_after_it(store, ruleset):
    """The delay to a decision does not include a write: the next batch is detected (its alerts
    decided) while the previous batch's write is still landing; the batch after that waits for
    that write, so two writes at most are in flight. Whatever order they could finish in, the
    batches' messages are acknowledged, and their alert changes queued, in batch order."""
    import threading

    pipeline, _ = make(store, ruleset, lambda topic, p, offset: True)
    gates = [threading.Event() for _ in range(3)]
    writes: list[int] = []
    real_write = pipeline._write

    def gated_write(step):
        n = len(writes)
        writes.append(step.messages)
        gates[n].wait(30)
        return real_write(step)

    pipeline._write = gated_write
    acked: list[list[int]] = []

    async def ack(messages):
        acked.append([m.offset for m in messages])

    def batch(first: int) -> list[Message]:
        return [gpu_message(first + i, T0 + (first + i) * 60, 0.0) for i in range(40)]

    async def go():
        await pipeline.process(batch(0), ack)  # its write waits at gates[0]
        await asyncio.wait_for(pipeline.process(batch(40), ack), 10)  # detected while the first write waits
        third = asyncio.create_task(pipeline.process(batch(80), ack))
        for _ in range(50):
            await asyncio.sleep(0)
        third_waited = not third.done()  # two writes in flight: it waits for the first to land
        gates[1].set()  # opened first: still the first write lands first (one writer thread), then the second
        for _ in range(50):
            await asyncio.sleep(0)
        acked_before_first = list(acked)
        gates[0].set()
        await asyncio.wait_for(third, 30)
        gates[2].set()
        await pipeline.drain()
        return third_waited, acked_before_first

    third_waited, acked_before_first = asyncio.run(go())
    assert third_waited and acked_before_first == []
    assert writes == [40, 40, 40]
    offsets = [o for batch_offsets in acked for o in batch_offsets]
    assert offsets == sorted(offsets) and len(offsets) > 40
    assert store.count("gpu_metrics") == 2 * 120  # two GPUs a message

def test_messages_fetched_before_a_rebalance_are_left_for_the_reread(store, ruleset):
    """A rebalance that keeps a partition here: the consumer reads it again from the committed
    offset, but messages fetched before (prefetched past it, in a batch being gathered) still
    arrive first. They are left unacknowledged and undetected, so detection never runs ahead
    of the committed offset and rewinds, and nothing is acknowledged out of order."""
    generation = [1]
    pipeline = Pipeline(
        engine=Engine(ruleset), store=store, outbox=Outbox(store, None), manager=AlertManager(),
        send_dead_letter=lambda key, value: asyncio.sleep(0), generation=lambda: generation[0],
    )  # fmt: skip
    acked: list[tuple[str, int]] = []

    def gpu(offset: int, gen: int) -> Message:
        message = gpu_message(offset, T0 + offset * 60, 1.0)
        message.generation = gen
        return message

    run_batches(pipeline, [[gpu(i, 1) for i in range(5)]], acked)
    generation[0] = 2  # the group rebalanced; this worker keeps the partition
    pipeline.reset()
    stale = [gpu(i, 1) for i in range(7, 10)]  # fetched before, past the committed offset 5
    run_batches(pipeline, [stale + [gpu(i, 2) for i in range(5, 10)]], acked)
    assert acked == [("gpu-metrics", i) for i in range(10)]
    assert pipeline.stats.messages == 10
    assert store.count("gpu_metrics") == 20


@pytest.mark.parametrize("store_answers", [True, False], ids=["store-up", "store-down-then-up"])
def test_events_read_again_after_a_restart_are_detected_once(store, ruleset, store_answers):
    """A message detected but not acknowledged (one before it in its partition is still held)
    is read again after a crash. The state saved with it already holds its events (stored,
    and no later than the restored state), so the restarted pipeline does not fold them in
    twice (a stopped host's old busy samples opened a second, $0 stuck-GPU incident this
    way); what was held is detected, once. ``store-down-then-up``: the store cannot answer
    the look-up at first (its event tables renamed away): the batch stalls, as a failed write
    does, and goes on once it answers."""
    behind = {"gpu-metrics": True}

    held = usage_message(0, T0 + 90 * MIN)  # ahead of the gpu topic: held
    early = usage_message(1, T0 + MIN)  # detected once the gpu topic passes it; not acknowledged
    gpu = [gpu_message(i, T0 + i * 60, 1.0) for i in range(10)]
    first, acked = started(store, ruleset, behind), []
    run_batches(first, [[held, early] + gpu], acked)
    assert ("resource-usage", 0) not in acked and ("resource-usage", 1) not in acked
    assert 0 < first.stats.detected < 22 and first.stats.replayed == 0
    # The worker dies; what was not acknowledged is read again.
    behind["gpu-metrics"] = False
    again = [m for m in [held, early] + gpu if (m.topic, m.offset) not in acked]
    second, acked = started(store, ruleset, behind), []
    if store_answers:
        run_batches(second, [again], acked)
    else:
        second._retry_max_s = 0.2
        tables = ["gpu_metrics", "resource_usage"]

        async def ack(messages):
            acked.extend((message.topic, message.offset) for message in messages)

        async def go():
            for table in tables:
                store.client.command(f"RENAME TABLE {store.db}.{table} TO {store.db}.{table}_away")
            batch = asyncio.create_task(second.process(again, ack))
            deadline = time.monotonic() + 30
            while second.stalled_for() == 0.0 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            stalled = "replay check" in second.stall_reason and not batch.done()
            for table in tables:
                store.client.command(f"RENAME TABLE {store.db}.{table}_away TO {store.db}.{table}")
            await batch
            await second.drain()
            return stalled

        assert asyncio.run(go()), "the look-up's failure did not stall the batch"
        assert second.stalled_for() == 0.0
    assert sorted(acked) == sorted((m.topic, m.offset) for m in again)
    assert first.stats.detected + second.stats.detected == 22  # every event once
    assert second.stats.replayed == 1  # the early usage event


def test_an_event_read_again_after_its_key_came_back_in_an_earlier_batch_is_detected_once(store, ruleset):
    """After a restart, a key's state is restored by its first batch; an event of it read again in
    a later batch (another partition's, here the usage topic's) is still checked against the restored
    time, though the key is held by then, and is not folded in twice."""
    behind = {"gpu-metrics": True}
    held = usage_message(0, T0 + 90 * MIN)
    early = usage_message(1, T0 + MIN)
    gpu = [gpu_message(i, T0 + i * 60, 1.0) for i in range(10)]
    first, acked = started(store, ruleset, behind), []
    run_batches(first, [[held, early] + gpu], acked)
    assert ("resource-usage", 1) not in acked
    behind["gpu-metrics"] = False
    again = [m for m in [held, early] + gpu if (m.topic, m.offset) not in acked]
    gpu_again = [m for m in again if m.topic == "gpu-metrics"] + [gpu_message(10, T0 + 10 * 60, 1.0)]
    usage_again = [m for m in again if m.topic == "resource-usage"]
    second, acked = started(store, ruleset, behind), []
    run_batches(second, [gpu_again, usage_again], acked)  # h1 is restored by the first, held in the second
    assert first.stats.detected + second.stats.detected == 22 + 2  # every event once
    assert second.stats.replayed == 1  # the early usage event


def test_the_replay_check_asks_about_no_event_when_every_key_is_held_and_none_was_restored(store, ruleset):
    """Nothing restored after a restart, every key of the batch held: no event can have been seen
    by a restored state, and none is asked about (a per-event scan of every batch otherwise)."""
    pipeline, _ = make(store, ruleset, lambda topic, p, offset: True)
    asked: list[float] = []
    seen = pipeline.engine.already_seen
    pipeline.engine.already_seen = lambda t, event: asked.append(t) or seen(t, event)  # type: ignore[method-assign]
    run_batches(pipeline, [[gpu_message(0, T0, 1.0)]], [])
    assert len(asked) == 2  # h1 not held yet: asked (and loaded)
    run_batches(pipeline, [[gpu_message(1, T0 + 60, 1.0), usage_message(0, T0 + 60)]], [])
    assert len(asked) == 2 and pipeline.stats.detected == 5 and pipeline.stats.replayed == 0
    run_batches(pipeline, [[gpu_message(2, T0 + 120, 1.0), gpu_message(3, T0 + 120, 1.0, host="h2")]], [])
    assert len(asked) == 2 + 4  # h2 is new: the batch is asked about


def stopped_before_its_state_write_lands(pipeline: Pipeline, messages: list[Message], store: Any) -> list[Message]:
    """``pipeline`` processes ``messages`` while the state table (and the write's probe) refuses
    writes, stalls retrying, and is stopped there: a kill before the batch's write lands. The
    tables take writes again after; returns what it acknowledged (nothing, if it kept its word)."""
    tables, acked = ["detector_state", "write_probe"], []

    async def ack(batch: list[Message]) -> None:
        acked.extend(batch)

    async def stopped() -> None:
        for table in tables:
            store.client.command(f"ALTER TABLE {store.db}.{table} ADD CONSTRAINT down CHECK 0")
        await pipeline.process(messages, ack)
        deadline = time.monotonic() + 30
        while pipeline.stalled_for() == 0.0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        pipeline.stop()
        await pipeline.drain()
        for table in tables:
            store.client.command(f"ALTER TABLE {store.db}.{table} DROP CONSTRAINT down")

    asyncio.run(stopped())
    return acked


def test_a_write_queued_behind_one_that_gave_up_is_not_made(store, ruleset):
    """Two writes may be in flight. The first stalls (the state table refuses writes) and gives
    up as the worker stops; the store then takes writes again before the second, queued behind it,
    starts. The second is not made: its batch was detected on the state the lost one left, so its
    events and state stored (with the first's not) would have a restart fold the first batch's
    events in twice. A restarted worker then detects both batches from the start, each event once."""
    import threading

    minutes = [m for i in range(20) for m in (usage_message(i, T0 + i * MIN), gpu_message(i, T0 + i * MIN, 1.0))]
    a, b = minutes[:20], minutes[20:]
    first = started(store, ruleset, {})
    first._retry_max_s = 0.2
    gate, calls, real_write = threading.Event(), [], first._write

    def second_waits(step):
        calls.append(step.messages)
        if len(calls) == 2:
            gate.wait(30)  # starts once the store takes writes again
        return real_write(step)

    first._write = second_waits
    acked: list[Message] = []

    async def ack(batch: list[Message]) -> None:
        acked.extend(batch)

    async def go() -> None:
        store.client.command(f"ALTER TABLE {store.db}.detector_state ADD CONSTRAINT down CHECK 0")
        store.client.command(f"ALTER TABLE {store.db}.write_probe ADD CONSTRAINT down CHECK 0")
        await first.process(a, ack)
        await first.process(b, ack)  # detected; its write queued behind the stalled one
        deadline = time.monotonic() + 30
        while first.stalled_for() == 0.0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        first.stop()
        for table in ("detector_state", "write_probe"):
            store.client.command(f"ALTER TABLE {store.db}.{table} DROP CONSTRAINT down")
        gate.set()
        await first.drain()

    asyncio.run(go())
    assert calls == [20, 20] and acked == []
    assert store.count("gpu_metrics") == 2 * 10  # the first batch's events (stored before its state failed)
    assert store.states.load([0]) == {}  # neither batch's state
    second, acked_again = started(store, ruleset, {}), []
    run_batches(second, [a + b], acked_again)
    assert len(acked_again) == 40 and second.stats.detected == 60 and second.stats.replayed == 0
    assert store.count("gpu_metrics") == 2 * 20


def test_a_write_that_fails_stops_the_write_queued_behind_it_and_its_alert_comes_after_a_restart(store, ruleset):
    """A batch's write fails with an error that is not the store being down (its alert changes
    refused while the store answers, tried once more and refused again): the worker exits on it. The
    next batch, detected meanwhile
    on the state the failed batch left, has its write queued: it is not made, or its state (which
    holds the failed batch's events) would be saved and a restart would skip those events, stored
    before the failure, and never record the alert they fired (found by review)."""
    minutes = [m for i in range(45) for m in (usage_message(i, T0 + i * MIN), gpu_message(i, T0 + i * MIN, 1.0))]
    a, b, c = minutes[: 2 * 35], minutes[2 * 35 : 2 * 40], minutes[2 * 40 :]  # idle fires at 30 min: in a
    first = started(store, ruleset, {})
    real_record, writes = store.alerts.record, []

    def refused(alerts, version):
        writes.append([(x.type, x.change) for x in alerts])
        raise RuntimeError("the alert insert failed (the store answers its probe)")

    store.alerts.record = refused
    acked: list[Message] = []

    async def ack(batch: list[Message]) -> None:
        acked.extend(batch)

    async def go() -> BaseException | None:
        await first.process(a, ack)
        try:
            await first.process(b, ack)
            await first.process(c, ack)
        except RuntimeError as exc:  # the agent fails the worker on it
            return exc
        return None

    try:
        raised = asyncio.run(go())
    finally:
        first._writer.shutdown(wait=True)
        store.alerts.record = real_record
    assert raised is not None and "alert insert failed" in str(raised)
    assert writes == [[("idle_gpu", "fired")]] * 2 and acked == []  # tried twice; the queued write made nothing
    assert store.count("resource_usage") == 35 and store.states.load([0]) == {}
    second, acked_again = started(store, ruleset, {}), []
    run_batches(second, [minutes], acked_again)
    assert [(r["type"], r["status"]) for r in store.alerts.latest()] == [("idle_gpu", "firing")]


def test_a_stop_while_a_dead_letter_is_retried_lets_the_stop_hook_go_on(store, ruleset):
    """The worker stops while a batch's dead letter is being retried (the broker down) and two
    later batches wait behind it: the dead letter gives up, and the stop hook's pause returns (it
    must go on to close the writer and hand the outbox over), not raise."""
    pipeline, _ = make(store, ruleset, lambda topic, p, offset: True)
    retried = asyncio.Event()

    async def broker_down(key, value):
        retried.set()
        raise ConnectionError("broker down")

    pipeline._send_dead_letter = broker_down

    async def ack(messages):
        pass

    async def go() -> list[Any]:
        bad = Message("gpu-metrics", 0, 0, b"h1", b"{not json")
        await pipeline.process([bad] + [gpu_message(i, T0 + i * 60, 1.0) for i in range(1, 5)], ack)
        later = [asyncio.create_task(pipeline.process([gpu_message(i, T0 + i * 60, 1.0) for i in range(j, j + 5)], ack))
                 for j in (5, 10)]  # fmt: skip
        await asyncio.wait_for(retried.wait(), 30)
        pipeline.stop()
        outcomes = await asyncio.gather(*later, return_exceptions=True)
        await asyncio.wait_for(pipeline.pause(), 30)  # the stop hook's; it raised PipelineStopped
        return outcomes

    outcomes = asyncio.run(go())
    assert all(o is None or isinstance(o, PipelineStopped) for o in outcomes), outcomes


@pytest.mark.parametrize("store_stalls_at", [None, 0, 1])
def test_a_dead_letter_retried_stalls_the_pipeline_and_ends_only_its_own_stall(store, ruleset, store_stalls_at):
    """The dead-letter topic refuses two sends: the pipeline is stalled (/healthz, the stall exit) while
    the send is retried, and no longer once it lands. A store stall begun meanwhile, before the dead
    letter's or during it (``store_stalls_at``: at which refusal), is not the dead letter's to end: it
    outlives the send, with its own reason. Nor does the store answering end the dead letter's."""
    pipeline, _ = make(store, ruleset, lambda topic, p, offset: True)
    pipeline._retry_max_s = 0.05
    refused: list[tuple[float | None, str]] = []
    writers: list[float | None] = []

    async def broker_flaky(key, value):
        if len(refused) < 2:
            if len(refused) == store_stalls_at:
                writers.append(pipeline._store_stalled("insert refused", "store: insert refused", note="retrying"))
            elif store_stalls_at is None and refused:
                pipeline._store_available()  # the writer's next batch stored: the store's stall, none, ends
            refused.append((pipeline.stalled_since, pipeline.stall_reason))
            raise ConnectionError("broker down")

    pipeline._send_dead_letter = broker_flaky

    async def ack(messages):
        pass

    async def go() -> None:
        await pipeline.process([Message("gpu-metrics", 0, 0, b"h1", b"{not json")], ack)
        await pipeline.drain()

    asyncio.run(go())
    assert len(refused) == 2 and refused[1][0] is not None and "dead-letter topic" in refused[1][1], refused
    if store_stalls_at is None:
        assert pipeline.stalled_since is None and pipeline.stall_reason == ""
    else:
        assert writers[0] is not None  # the store's stall began there, not joined to the dead letter's
        assert (pipeline.stalled_since, pipeline.stall_reason) == (writers[0], "store: insert refused"), refused


def test_a_kill_between_the_alert_record_and_the_state_save_leaves_the_alert_resolved(store, ruleset):
    """A batch's alert changes are recorded, then the state that reflects them: a worker killed
    between the two restarts from the state before the batch and detects it again. The
    batch had an idle episode's 15-minute update, then its resolution: the restarted alert
    manager remembers the resolution and lets it through no more, so the replayed update
    must not pass either, or it is recorded last and the stored alert reads firing again
    while Slack was told it resolved (seen once in the chaos test under load). Here the
    kill is a state table that refuses writes; the first worker stops while it retries."""
    minutes = [m for i in range(56)
               for m in (usage_message(i, T0 + i * MIN), gpu_message(i, T0 + i * MIN, 1.0 if i < 50 else 90.0))]  # fmt: skip
    fired, replayed = minutes[: 2 * 42], minutes[2 * 42 :]  # idle fires at 30 min; update at 45, busy at 50
    first = started(store, ruleset, {})
    first._retry_max_s = 0.2
    run_batches(first, [fired], [])
    (alert,) = store.alerts.latest()
    acked_first = stopped_before_its_state_write_lands(first, replayed, store)
    recorded = [r["change"] for r in store.client.query(
        f"SELECT change FROM {store.db}.alert_changes WHERE alert_id = %(id)s ORDER BY at",
        parameters={"id": alert["alert_id"]}).named_results()]  # fmt: skip
    assert recorded[-2:] == ["updated", "resolved"] and acked_first == []  # recorded, not acknowledged
    assert store.alerts.get(alert["alert_id"])["status"] == "resolved"
    second, acked = started(store, ruleset, {}), []
    run_batches(second, [replayed], acked)
    assert len(acked) == len(replayed) and second.stats.replayed == 0  # detected again from the older state
    assert store.alerts.get(alert["alert_id"])["status"] == "resolved"


def test_a_kind_held_behind_another_is_detected_after_a_restart(store, ruleset):
    """One topic ran ahead for a key (its partition caught up, so it did not wait): the host's
    GPU samples were folded up to 9 minutes while its usage, read later as a backlog, was
    partly held. After a crash the held usage is read again: it is stored, and earlier than
    the key's latest time, but not of a kind folded that far, so it is detected, once."""
    behind = {"resource-usage": False}

    gpu = [gpu_message(i, T0 + i * 60, 1.0) for i in range(10)]  # released at once: caught up
    usage = [usage_message(i, T0 + i * MIN) for i in range(6)]  # a backlog: its last minute held
    first, acked = started(store, ruleset, behind), []
    run_batches(first, [gpu], acked)
    behind["resource-usage"] = True
    run_batches(first, [usage], acked)
    assert ("resource-usage", 5) not in acked and ("resource-usage", 4) in acked
    behind["resource-usage"] = False
    again = [m for m in gpu + usage if (m.topic, m.offset) not in acked]
    second, acked = started(store, ruleset, behind), []
    run_batches(second, [again], acked)
    assert first.stats.detected + second.stats.detected == 20 + 6  # every event once


def test_keys_loaded_without_their_bytes_are_read_together_before_their_batch(store, ruleset, monkeypatch):
    """After a restart every key saved long ago is loaded as its name only (``started``). A
    batch naming five of them reads their states in one query before detection, not one
    look-up each on the event loop at their first event; detection goes on from what was saved
    (the idle episodes the first worker opened are resolved by the second)."""
    hosts = [f"h{i}" for i in range(5)]
    idle = [usage_message(i, T0, host) for i, host in enumerate(hosts)]
    idle += [gpu_message(len(idle) + m * 5 + i, T0 + m * MIN, 1.0, host) for m in range(45) for i, host in enumerate(hosts)]
    later = [gpu_message(len(idle) + i, T0 + (45 + i) * MIN, 90.0, "other") for i in range(3)]
    first = started(store, ruleset, {})
    run_batches(first, [idle, later], [])  # the newest save has "other" alone: the five are loaded lazily
    assert {a["resource_id"] for a in store.alerts.latest() if a["resolved_at"] is None} == set(hosts)

    second = started(store, ruleset, {})
    one_by_one: list[str] = []
    together: list[list[str]] = []
    get, get_many = store.states.get, store.states.get_many
    monkeypatch.setattr(store.states, "get", lambda key: one_by_one.append(key) or get(key))
    monkeypatch.setattr(store.states, "get_many", lambda keys: together.append(list(keys)) or get_many(keys))
    busy = [gpu_message(len(idle) + len(later) + m * 5 + i, T0 + (45 + m) * MIN, 90.0, host)
            for m in range(10) for i, host in enumerate(hosts)]  # fmt: skip
    run_batches(second, [busy], [])
    assert one_by_one == [] and len(together) == 1 and sorted(together[0]) == hosts
    assert second.stats.read_ahead == 5 and second.saved_states.keys() == {"other"}
    assert all(a["resolved_at"] is not None for a in store.alerts.latest())


def test_a_key_whose_next_event_is_held_keeps_its_state_and_partition_through_a_sweep(store, ruleset):
    """A catch-up jumps event time past a quiet key's TTL in one batch, whose next event (on
    partition 3) that batch also read but the aligner still holds. That key is not quiet, its
    event is on its way: the batch's sweep neither reclaims it nor forgets the partition it came
    on (the event, past the TTL, starts it afresh, as in backtest), so the state it saves once
    the event is released is saved under partition 3, where the next holder of that partition
    loads it (under partition 0 another worker would)."""
    behind = {"gpu-metrics": True}
    pipeline = Pipeline(
        engine=Engine(ruleset, state_ttl_s=3600.0), store=store, outbox=Outbox(store, None), manager=AlertManager(),
        send_dead_letter=lambda key, value: asyncio.sleep(0),
        caught_up=lambda topic, p, offset: not behind.get(topic, False),
    )  # fmt: skip

    def old_usage(offset: int, t: float) -> Message:
        message = usage_message(offset, t, host="old")
        return Message(message.topic, 3, offset, message.key, message.value)

    hosts = ["a", "b", "c"]
    gpu = iter(range(1000))

    def scrapes(start: float, minutes: int) -> list[Message]:
        return [gpu_message(next(gpu), start + m * MIN, 50.0, host) for m in range(minutes) for host in hosts]

    run_batches(pipeline, [[old_usage(0, T0)] + scrapes(T0, 2)], [])
    swept = METRICS.registry.get_sample_value("burnwatch_state_sweeps_total", {"trigger": "event_time"}) or 0.0
    run_batches(pipeline, [[old_usage(1, T0 + 150 * MIN)] + scrapes(T0 + 120 * MIN, 3)], [])  # "old" held
    assert METRICS.registry.get_sample_value("burnwatch_state_sweeps_total", {"trigger": "event_time"}) == swept + 1
    assert pipeline.engine.watermark > T0 + 3600.0 and len(pipeline.aligner)  # past its TTL; its event held
    assert len(pipeline.engine) == 4  # "old" kept
    run_batches(pipeline, [scrapes(T0 + 151 * MIN, 3)], [])  # releases it
    result = store.client.query(f"SELECT argMax(partition, version) FROM {store.db}.detector_state WHERE key = 'old'")
    assert result.result_rows == [(3,)]


def test_a_key_evicted_while_its_last_state_is_being_written_comes_back_as_it_left(store, ruleset, monkeypatch):
    """A batch's sweep evicts a key whose latest state is in that batch's write, and the key
    speaks again in the next batch, detected while that write is still in flight (held here
    until the next batch's detection is done): the key comes back as it left, from what the
    engine kept of it, not from the store, which does not have it yet (it would start afresh)."""
    engine = Engine(ruleset, evict_after_s=600.0, fetch=store.states.get)
    pipeline = Pipeline(
        engine=engine, store=store, outbox=Outbox(store, None), manager=AlertManager(),
        send_dead_letter=lambda key, value: asyncio.sleep(0), caught_up=lambda topic, p, offset: True,
    )  # fmt: skip
    detected, batches, saves, save = threading.Event(), [], [], store.states.save
    process_timed = engine.process_timed

    def detecting(events):
        batches.append(len(events))
        out = process_timed(events)
        if len(batches) == 2:
            detected.set()
        return out

    def saving(states, version):
        saves.append(len(states))
        if len(saves) == 1:
            assert detected.wait(30), "the next batch was not detected while this write was in flight"
        return save(states, version)

    monkeypatch.setattr(engine, "process_timed", detecting)
    monkeypatch.setattr(store.states, "save", saving)
    hosts, gpu = ["a", "b", "c"], iter(range(1000))

    def scrapes(start: float, minutes: int, names=hosts) -> list[Message]:
        return [gpu_message(next(gpu), start + m * MIN, 50.0, host) for m in range(minutes) for host in names]

    run_batches(pipeline, [
        [usage_message(0, T0, host="k")] + scrapes(T0, 20),  # "k" quiet 19 min at the sweep: evicted
        scrapes(T0 + 20 * MIN, 2) + scrapes(T0 + 21 * MIN, 1, ["k"]),  # "k" speaks again
    ], [])  # fmt: skip
    info = engine.resource("k")
    assert info is not None and info.resource_type == "gpu_instance"  # what its usage said, in the first batch


def test_a_key_quiet_past_the_ttl_has_the_alerts_of_backtest_whether_the_worker_restarted_or_not(
        store, chdb_client, ruleset, tmp_path):  # fmt: skip
    """h1 is idle 90 minutes (an idle alert fires), then says nothing for three days, more than
    the state TTL (two days), while three hosts go on, then is busy. It starts afresh when it
    speaks again, in backtest (which never expires state), in a worker that ran through the
    gap (its sweep reclaimed h1), in one restarted during it that catches up in batches (its
    sweep reclaims h1, loaded with its latest time) and in one that catches up the rest in one
    batch (h1 restored from the store at its event, no sweep between): the same alerts, the idle
    one resolved at h1's last idle sample, where it went quiet (by the sweep, or by h1's next
    event). Before, a restarted worker and backtest went on from h1's old state and resolved the
    alert three days on, where the worker that ran through did not; then every one left it open."""
    from datetime import timezone

    import msgspec

    from detector.backtest import backtest
    from detector.replay import write_replay
    from detector.store import Store

    day = 86_400.0
    offsets = {"gpu-metrics": 0, "resource-usage": 0}
    timed: list[tuple[float, Message]] = []

    def seconds(at) -> float | None:
        return None if at is None else at.replace(tzinfo=timezone.utc).timestamp()

    def add(t: float, host: str, util: float) -> None:
        for make_message, topic in ((usage_message, "resource-usage"), (gpu_message, "gpu-metrics")):
            message = make_message(offsets[topic], t, host=host) if topic == "resource-usage" else \
                gpu_message(offsets[topic], t, util, host)  # fmt: skip
            offsets[topic] += 1
            timed.append((t, message))

    for m in range(90):
        add(T0 + m * MIN, "h1", 1.0)
    for m in range(30):
        add(T0 + 3 * day + m * MIN, "h1", 90.0)
    for hour in range(3 * 24 + 1):
        for host in ("a", "b", "c"):
            add(T0 + hour * 3600.0, host, 70.0)
    timed.sort(key=lambda item: item[0])
    messages = [message for _, message in timed]
    batches = [messages[i : i + 20] for i in range(0, len(messages), 20)]
    starts = [timed[messages.index(batch[0])][0] for batch in batches]
    gap = next(i for i, t in enumerate(starts) if t > T0 + 1.5 * day)  # h1 quiet, within its TTL
    late = next(i for i, t in enumerate(starts) if t > T0 + 2.9 * day)  # past it

    path = tmp_path / "gap.jsonl"
    with open(path, "wb") as out:
        write_replay(((0, m.topic, m.key.decode(), msgspec.Raw(m.value)) for m in messages), out)  # type: ignore[union-attr]
    expected = sorted((a.alert_id, a.rule, a.fired_at, a.resolved_at) for a in backtest(path, ruleset).alerts)
    assert [(rule, fired, resolved) for _, rule, fired, resolved in expected] == [("idle-gpu", T0 + 30 * MIN, T0 + 89 * MIN)]

    def alerts(s) -> list[tuple]:
        return sorted((a["alert_id"], a["rule"], seconds(a["fired_at"]), seconds(a["resolved_at"]))
                      for a in s.alerts.latest())  # fmt: skip

    through = started(store, ruleset, {})
    run_batches(through, batches[:late], [])
    assert "h1" not in store.states.load([0])  # a sweep reclaimed it
    run_batches(through, batches[late:], [])

    restarted: list[Store] = []
    for rest in (batches[gap:], [[m for batch in batches[gap:] for m in batch]]):
        restarted.append(Store(chdb_client, database=f"{store.db}_{len(restarted)}"))
        chdb_client.command(f"DROP DATABASE IF EXISTS {restarted[-1].db}")
        restarted[-1].migrate()
        run_batches(started(restarted[-1], ruleset, {}), batches[:gap], [])
        run_batches(started(restarted[-1], ruleset, {}), rest, [])

    assert alerts(store) == expected
    assert alerts(restarted[0]) == expected  # swept
    assert alerts(restarted[1]) == expected  # restored, then started afresh by the rule


def test_an_incident_on_a_key_that_never_speaks_again_is_resolved_once_by_the_holder_of_its_partition(
        store, chdb_client, ruleset, tmp_path):  # fmt: skip
    """h1 (on partition 3) is idle 90 minutes (an idle alert fires), then is never heard of again
    (terminated with no stop event), while three hosts go on for three days. Its alert is resolved
    where it went quiet, once, on its partition (whose holder posts it), as backtest says: by the
    worker that ran through (h1 held in memory till its sweep), by one that evicted h1 (its state
    then only in the store), and by one restarted during the gap, which loaded h1 without its
    bytes and never heard from it, killed after storing the resolution but before the delete of
    h1's state landed, then restarted again. Before, every one of them left the incident open
    for ever, the sweep dropping the episode with the state."""
    from datetime import timezone

    import msgspec

    from detector.backtest import backtest
    from detector.detectors.episode import SILENT
    from detector.replay import write_replay
    from detector.store import Store

    day = 86_400.0
    offsets: dict[tuple[str, int], int] = {}
    timed: list[tuple[float, Message]] = []

    def add(t: float, host: str, util: float, partition: int) -> None:
        for topic in ("resource-usage", "gpu-metrics"):
            offset = offsets[topic, partition] = offsets.get((topic, partition), -1) + 1
            made = usage_message(offset, t, host=host) if topic == "resource-usage" else gpu_message(offset, t, util, host)
            timed.append((t, msgspec.structs.replace(made, partition=partition)))

    for m in range(90):
        add(T0 + m * MIN, "h1", 1.0, 3)
    for hour in range(3 * 24 + 1):
        for host in ("a", "b", "c"):
            add(T0 + hour * 3600.0, host, 70.0, 0)
    timed.sort(key=lambda item: item[0])
    messages = [message for _, message in timed]
    batches = [messages[i : i + 20] for i in range(0, len(messages), 20)]
    starts = [timed[messages.index(batch[0])][0] for batch in batches]
    gap = next(i for i, t in enumerate(starts) if t > T0 + day)

    path = tmp_path / "vanished.jsonl"
    with open(path, "wb") as out:
        write_replay(((0, m.topic, m.key.decode(), msgspec.Raw(m.value)) for m in messages), out)  # type: ignore[union-attr]
    (expected,) = backtest(path, ruleset).alerts
    assert (expected.status, expected.resolved_at, expected.details["reason"]) == ("resolved", T0 + 89 * MIN, SILENT)

    def h1(s: Store) -> list[tuple]:
        return [(a["alert_id"], a["status"], a["resolved_at"].replace(tzinfo=timezone.utc).timestamp()
                 if a["resolved_at"] else None, round(a["waste_usd"], 6), json.loads(a["details"]).get("reason"), a["partition"])
                for a in s.alerts.latest() if a["resource_id"] == "h1"]  # fmt: skip

    want = [(expected.alert_id, "resolved", T0 + 89 * MIN, round(expected.waste_usd, 6), SILENT, 3)]
    both = (0, 3)

    def fresh(name: str) -> Store:
        made = Store(chdb_client, database=f"{store.db}_{name}")
        chdb_client.command(f"DROP DATABASE IF EXISTS {made.db}")
        made.migrate()
        return made

    run_batches(started(store, ruleset, {}, both), batches, [])
    assert h1(store) == want  # held in memory, then swept
    assert "h1" not in store.states.load(list(both))

    evicting_store = fresh("evicting")
    evicting = started(evicting_store, ruleset, {}, both, evict_after_s=3600.0, fetch=evicting_store.states.get)
    run_batches(evicting, batches[:gap], [])
    assert evicting.engine.unread(["h1"]) == ["h1"]  # out of memory, its state in the store alone
    run_batches(evicting, batches[gap:], [])
    assert h1(evicting_store) == want  # read from the store at the sweep that reclaimed it

    restarted = fresh("restarted")
    run_batches(started(restarted, ruleset, {}, both), batches[:gap], [])
    second = started(restarted, ruleset, {}, both, state_ttl_s=2 * day)
    assert second.saved_states.get("h1", b"") is None  # loaded without its bytes
    late = next(i for i, t in enumerate(starts) if t > T0 + 2.2 * day)
    run_batches(second, batches[gap:late], [])
    assert h1(restarted)[0][1] == "firing"  # not yet past its TTL
    stopped_before_its_state_write_lands(second, batches[late], restarted)
    assert h1(restarted) == want  # the resolution stored, with the batch's alerts ...
    assert "h1" in restarted.states.load(list(both))  # ... but the delete of h1's state lost with the kill
    third = started(restarted, ruleset, {}, both)
    run_batches(third, batches[late:], [])
    assert h1(restarted) == want and "h1" not in restarted.states.load(list(both))
    (resolutions,) = restarted.client.query(f"SELECT count() FROM {restarted.db}.alerts WHERE alert_id = %(id)s AND "
                                            "status = 'resolved'", parameters={"id": expected.alert_id}).result_rows[0]
    assert resolutions == 1  # the third worker resolved it again from the state the kill left: dropped as known


def test_a_wall_clock_sweep_deletes_expired_states_once_the_store_takes_writes_again(store, ruleset, monkeypatch):
    """The stream goes quiet with a key past its TTL that no batch swept (event time moved less
    than an eighth of the TTL since the last sweep: here no batch sweeps), and the store is down
    when the 60 s timer sweeps. The delete of the key's saved state stalls the pipeline and is
    retried, as a batch's write is, until the store takes it: the next worker to load the
    partition does not load that state again. Before, the delete failed once and was lost."""
    monkeypatch.setattr(Engine, "sweep_due", property(lambda self: False))
    pipeline, _ = make(store, ruleset, lambda topic, p, offset: True)
    pipeline.engine.state_ttl_s = 3600.0
    pipeline._retry_max_s = 0.2
    gpu = iter(range(1000))

    def scrapes(start: float, minutes: int) -> list[Message]:
        return [gpu_message(next(gpu), start + m * MIN, 50.0, host) for m in range(minutes) for host in ("a", "b", "c")]

    run_batches(pipeline, [[usage_message(0, T0, host="old")] + scrapes(T0, 2), scrapes(T0 + 120 * MIN, 3)], [])
    assert "old" in store.states.load([0]) and pipeline.engine.watermark > T0 + 3600.0
    tables = ["detector_state", "write_probe"]

    async def sweep_while_the_store_is_down() -> bool:
        for table in tables:
            store.client.command(f"ALTER TABLE {store.db}.{table} ADD CONSTRAINT down CHECK 0")
        sweep = asyncio.ensure_future(pipeline.sweep())
        deadline = time.monotonic() + 30
        while pipeline.stalled_for() == 0.0 and not sweep.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stalled = pipeline.stalled_for() > 0 and not sweep.done()
        for table in tables:
            store.client.command(f"ALTER TABLE {store.db}.{table} DROP CONSTRAINT down")
        await sweep
        return stalled

    assert asyncio.run(sweep_while_the_store_is_down())
    assert "old" not in store.states.load([0]) and store.states.load([0]).keys() == {"a", "b", "c"}
    assert pipeline.stalled_for() == 0.0


def test_a_delete_a_kill_lost_is_made_by_the_next_worker(store, ruleset):
    """A batch's sweep expires a key quiet past its TTL, and the worker is killed before that
    batch's write (the key's delete with it) lands. The next worker loads the key's state, saved
    with its latest event time; the key never speaks again, so no engine holds it, but that
    worker's first sweep reclaims it by that time and deletes it: nothing stale stays in the
    store to be loaded by every worker after. Before, only a key in memory was ever swept."""
    gpu = iter(range(1000))

    def scrapes(start: float, minutes: int) -> list[Message]:
        return [gpu_message(next(gpu), start + m * MIN, 50.0, host) for m in range(minutes) for host in ("a", "b", "c")]

    first = started(store, ruleset, {}, state_ttl_s=3600.0)
    first._retry_max_s = 0.2
    run_batches(first, [[usage_message(0, T0, host="old")] + scrapes(T0, 2)], [])
    assert "old" in store.states.load([0])
    later = scrapes(T0 + 120 * MIN, 3)  # past old's TTL: this batch's sweep expires it
    acked = stopped_before_its_state_write_lands(first, later, store)
    assert acked == [] and len(first.engine) == 3  # old expired in memory only
    assert "old" in store.states.load([0])  # its delete was lost with the write
    second = started(store, ruleset, {}, state_ttl_s=3600.0)
    run_batches(second, [later], [])  # read again: old is not in it
    assert store.states.load([0]).keys() == {"a", "b", "c"} and "old" not in second.saved_states


def test_events_of_a_keys_life_before_read_again_after_a_restart_are_not_folded_into_its_new_one(
        store, chdb_client, ruleset):  # fmt: skip
    """h1 is idle 90 minutes (an idle alert fires), then quiet for three days; its next usage event
    starts it afresh (the state TTL), and the worker is killed before the consumer commits: the
    next one reads it all again. The restored state (h1's new life, which has had no GPU sample
    yet) must still know the old life's GPU samples as folded, or they go into the new life as
    new: the idle episode opens again there and h1's busy samples then resolve it again, where
    the uninterrupted worker (and backtest) resolve it once, where h1 went quiet."""
    from datetime import timezone

    from detector.store import Store

    day = 86_400.0
    offsets = {"gpu-metrics": 0, "resource-usage": 0}

    def usage(t: float) -> Message:
        offsets["resource-usage"] += 1
        return usage_message(offsets["resource-usage"] - 1, t)

    def gpu(t: float, util: float) -> Message:
        offsets["gpu-metrics"] += 1
        return gpu_message(offsets["gpu-metrics"] - 1, t, util)

    old_life = [m for i in range(90) for m in (usage(T0 + i * MIN), gpu(T0 + i * MIN, 1.0))]
    renewed = [usage(T0 + 3 * day)]  # the usage topic speaks first
    busy = [m for i in range(1, 30) for m in (usage(T0 + 3 * day + i * MIN), gpu(T0 + 3 * day + i * MIN, 90.0))]

    def alerts(s) -> list[tuple]:
        return sorted((a["rule"], a["fired_at"].replace(tzinfo=timezone.utc).timestamp(), a["resolved_at"])
                      for a in s.alerts.latest())  # fmt: skip

    run_batches(started(store, ruleset, {}), [old_life, renewed, busy], [])
    ended = alerts(store)
    assert [(rule, fired) for rule, fired, _ in ended] == [("idle-gpu", T0 + 30 * MIN)]
    assert ended[0][2] is not None and ended[0][2].replace(tzinfo=timezone.utc).timestamp() == T0 + 89 * MIN  # went quiet

    killed = Store(chdb_client, database=store.db + "_k")
    chdb_client.command(f"DROP DATABASE IF EXISTS {killed.db}")
    killed.migrate()
    run_batches(started(killed, ruleset, {}), [old_life, renewed], [])  # then killed: nothing committed
    again = started(killed, ruleset, {})
    run_batches(again, [old_life + renewed, busy], [])
    assert alerts(killed) == alerts(store)
    assert again.stats.replayed == 90 + 2 * 90 + 1  # every event read again is skipped, GPU samples too


def test_a_worker_whose_partition_moved_deletes_none_of_its_keys(store, ruleset):
    """Worker A loads partition 0, with "old" quiet since T0; the partition moves to B (A pauses
    and resets as its revocation does), "old" speaks three days on and B saves its new life. A
    then sweeps past old's TTL (event time moved by what it reads next): it must not delete the
    key by the latest time it loaded before the move. A delete is by key, the newest version
    wins: one from A would erase B's fresh state in the store (lost at B's next restart)."""
    gpu = iter(range(1000))
    day = 86_400.0

    def scrapes(start: float, minutes: int) -> list[Message]:
        return [gpu_message(next(gpu), start + m * MIN, 50.0, host) for m in range(minutes) for host in ("a", "b", "c")]

    run_batches(started(store, ruleset, {}), [[usage_message(0, T0, host="old")] + scrapes(T0, 2)], [])
    a = started(store, ruleset, {})
    assert "old" in a.saved_states

    async def revoked():
        await a.pause()
        a.reset()

    asyncio.run(revoked())
    b = started(store, ruleset, {})
    run_batches(b, [[usage_message(1, T0 + 3 * day, host="old")] + scrapes(T0 + 3 * day, 2)], [])
    fresh = store.states.get("old")
    assert fresh is not None
    a.resume()
    run_batches(a, [scrapes(T0 + 3 * day + 10 * MIN, 3)], [])  # its sweep is past old's TTL
    asyncio.run(a.sweep())
    assert store.states.get("old") == fresh


def test_a_failed_delete_of_the_wall_clock_sweep_stops_no_later_batch(store, ruleset):
    """The wall clock's sweep writes its deletes alone (drained, under the batch lock): nothing is
    queued behind it, so its failing (an error, not the store being down) must not stop the writes
    of later batches, as a batch's failed write stops the one queued behind it."""
    gpu = iter(range(1000))
    day = 86_400.0

    def scrapes(start: float, minutes: int) -> list[Message]:
        return [gpu_message(next(gpu), start + m * MIN, 50.0, host) for m in range(minutes) for host in ("a", "b", "c")]

    pipeline = started(store, ruleset, {})
    run_batches(pipeline, [[usage_message(0, T0, host="old")] + scrapes(T0, 2),
                           scrapes(T0 + 2 * day - 3600, 2),  # swept here: old within its TTL still
                           scrapes(T0 + 2 * day + 3600, 2)], [])  # past it, but too soon for a batch's sweep
    assert not pipeline.engine.sweep_due and store.states.get("old") is not None
    real_delete = store.states.delete

    def refused(keys):
        raise RuntimeError("the delete failed (the store answers its probe)")

    store.states.delete = refused
    try:
        with pytest.raises(RuntimeError, match="the delete failed"):
            asyncio.run(pipeline.sweep())
    finally:
        store.states.delete = real_delete
    acked: list[tuple[str, int]] = []
    later = scrapes(T0 + 2 * day + 7200, 2)
    run_batches(pipeline, [later], acked)
    assert sorted(acked) == sorted((m.topic, m.offset) for m in later)


def test_a_partition_taken_over_behind_the_workers_event_time_keeps_its_keys(store, ruleset):
    """Worker B has read other partitions to T0 + 3 days when it takes over partition 0, whose
    keys are behind it: h1 was idle from T0 (an idle alert fired) and is busy again 40 minutes
    on, well within its TTL. B's sweeps must not reclaim h1 by the event time B reached on its
    partitions before the move: h1 speaks, goes on from its saved state and resolves the alert,
    as the worker that held the partition before would have."""
    from datetime import timezone

    day = 86_400.0
    gpu = iter(range(10_000))
    idle = [m for i in range(40) for m in (usage_message(i, T0 + i * MIN), gpu_message(next(gpu), T0 + i * MIN, 1.0))]
    busy = [m for i in range(40, 50)
            for m in (usage_message(i, T0 + i * MIN), gpu_message(next(gpu), T0 + i * MIN, 90.0))]  # fmt: skip
    ahead = [gpu_message(next(gpu), T0 + 3 * day + m * MIN, 50.0, host) for m in range(3) for host in ("a", "b", "c")]

    b = started(store, ruleset, {})
    run_batches(b, [ahead], [])  # B's partitions before the move
    run_batches(started(store, ruleset, {}), [idle], [])  # A, the partition's holder till then
    (alert,) = store.alerts.latest()
    assert alert["rule"] == "idle-gpu" and alert["resolved_at"] is None

    async def moved():  # as the worker's handover does (streams.handover)
        await b.pause()
        b.reset()
        latest: dict[str, float] = {}
        b.saved_states.clear()
        b.saved_states.update(store.states.load([0], saved_within_s=0, latest=latest))
        b.saved_times = SavedTimes(latest)
        b.resume()
        await b.sweep()  # the wall clock's, before h1 speaks

    asyncio.run(moved())
    run_batches(b, [busy], [])
    (alert,) = store.alerts.latest()
    assert alert["resolved_at"] is not None and alert["resolved_at"].replace(tzinfo=timezone.utc).timestamp() > T0


def test_a_store_that_comes_back_between_a_failed_write_and_its_probe_loses_nothing(store, ruleset):
    """The store refuses the state write, and takes writes again before the probe that follows asks (the
    race CI met at 373aabc: every table's constraint dropped between the two). A failure of our own rows
    with the store writable was taken for the rows' fault, and the pipeline gave up on the batch (red
    before): the write is tried once more, and the batch is stored and acknowledged."""
    store.client.command(f"ALTER TABLE {store.db}.detector_state ADD CONSTRAINT down CHECK 0")
    pipeline, dead = make(store, ruleset, lambda topic, p, offset: True)
    save, failed = store.states.save, []

    def save_once_refused(*args, **kwargs):
        try:
            return save(*args, **kwargs)
        except Exception:
            failed.append(True)
            store.client.command(f"ALTER TABLE {store.db}.detector_state DROP CONSTRAINT down")  # back, before the probe
            raise

    store.states.save = save_once_refused
    acked: list[tuple[str, int]] = []

    async def ack(messages):
        acked.extend((message.topic, message.offset) for message in messages)

    async def go():
        await pipeline.process([gpu_message(i, T0 + i * 60, 1.0) for i in range(10)], ack)
        await pipeline.drain()

    asyncio.run(go())
    assert failed == [True] and dead == []
    assert acked == [("gpu-metrics", i) for i in range(10)] and store.count("gpu_metrics") == 20
    assert store.query(f"SELECT count() AS n FROM {store.db}.detector_state")[0]["n"] > 0


def test_the_states_a_sweep_reads_to_resolve_are_read_in_chunks_each_within_the_look_up_bound(store, ruleset, monkeypatch):
    """Many keys loaded at assignment go quiet past the TTL together (a cluster removed, an exporter that
    renamed its resources): the sweep that reclaims them reads their states to resolve what was open on
    them. Each chunk of :data:`GET_MANY_CHUNK` keys reads within the look-up's bound here, all of them
    together do not: read as one look-up, the sweep timed out at every try and the pipeline stalled for
    ever under the batch lock, and again after every restart (review of 72134cf: at a million keys of
    2.4 KB, measured 24 us a key to read and 68 us a key to restore on the event loop, on chdb)."""
    from tests.helpers import scrape, slow_state_reads

    quiet = [f"q{i}" for i in range(40)]
    maker = Engine(ruleset)
    maker.process([e for key in quiet for e in scrape(T0, [1.0, 1.0], key)])
    store.states.save([(key, 0, maker.snapshot(key), T0) for key in quiet], version=1)
    pipeline = started(store, ruleset, {}, state_ttl_s=3600.0)
    assert set(pipeline.saved_states) == set(quiet)
    slow_state_reads(monkeypatch, store, pipeline)
    gpu = iter(range(1000))
    batch = [gpu_message(next(gpu), T0 + 150 * MIN + m * MIN, 50.0, host) for m in range(3) for host in ("a", "b", "c")]

    async def ack(messages):
        pass

    async def go() -> bool:
        try:
            await asyncio.wait_for(pipeline.process(batch, ack), 15)
            await pipeline.drain()
            return True
        except asyncio.TimeoutError:
            pipeline.stop()
            return False

    assert asyncio.run(go()), "the sweep's read never came back within the look-up's bound"
    assert not set(quiet) & store.states.load([0]).keys()


def test_a_sweep_reads_the_saved_states_of_reclaimed_keys_that_may_hold_an_open_episode_alone(store, ruleset, monkeypatch):
    """h1 idles 40 minutes (its alert fires) and "calm" is busy, then both go quiet for ever while three
    hosts go on. The worker saves beside each state whether it may hold an open episode; a worker
    restarted later loads both, and its sweep past their TTL reads h1's state alone
    (resolving its alert, went_silent) and deletes both: keys that vanish with nothing open cost a
    delete, not a read and a restore each on the event loop (review of 72134cf: a million such keys
    held the loop for over a minute)."""
    from detector.detectors.episode import SILENT

    usage_offsets, gpu_offsets = iter(range(10_000)), iter(range(10_000))

    def minutes(start: float, n: int, hosts: dict[str, float]) -> list[Message]:
        return [m for k in range(n) for host, util in hosts.items()
                for m in (usage_message(next(usage_offsets), start + k * MIN, host),
                          gpu_message(next(gpu_offsets), start + k * MIN, util, host))]  # fmt: skip

    run_batches(started(store, ruleset, {}), [minutes(T0, 40, {"h1": 1.0, "calm": 90.0, "a": 70.0, "b": 70.0, "c": 70.0})], [])
    flags = dict(store.client.query(f"SELECT key, argMax(maybe_open, version) FROM {store.db}.detector_state "
                                    "GROUP BY key").result_rows)  # fmt: skip
    assert flags == {"h1": 1, "calm": 0, "a": 0, "b": 0, "c": 0}
    restarted = started(store, ruleset, {}, state_ttl_s=3600.0)
    assert {"h1", "calm"} <= restarted.saved_states.keys()  # loaded, never to speak
    read: list[str] = []
    get_many_placed = store.states.get_many_placed
    monkeypatch.setattr(store.states, "get_many_placed", lambda keys: read.extend(keys) or get_many_placed(keys))
    run_batches(restarted, [minutes(T0 + 150 * MIN, 3, {"a": 70.0, "b": 70.0, "c": 70.0})], [])
    assert read == ["h1"]
    assert not {"h1", "calm"} & store.states.load([0]).keys()
    (alert,) = [a for a in store.alerts.latest() if a["resource_id"] == "h1"]
    assert alert["status"] == "resolved" and json.loads(alert["details"])["reason"] == SILENT


def test_a_resolution_the_wall_clock_sweep_makes_is_logged_with_when_it_was_decided(store, ruleset, monkeypatch):
    """An idle host's alert fires, the host goes quiet, and the stream moves on too little for a batch
    to sweep: the 60 s timer's sweep resolves it (went_silent). Its ``alert_resolved`` line says when
    that was decided, as a batch's do; it said ``decided_at=0.0`` (the step of a sweep had no batch to
    set it; review of 72134cf)."""
    from detector.detectors.episode import SILENT

    monkeypatch.setattr(Engine, "sweep_due", property(lambda self: False))
    pipeline, _ = make(store, ruleset, lambda topic, p, offset: True)
    pipeline.engine.state_ttl_s = 3600.0
    offsets = iter(range(10_000))
    idle = [m for k in range(40) for m in (usage_message(next(offsets), T0 + k * MIN),
                                           gpu_message(next(offsets), T0 + k * MIN, 1.0))]  # fmt: skip
    later = [gpu_message(next(offsets), T0 + 150 * MIN + k * MIN, 50.0, host) for k in range(3) for host in "abc"]
    run_batches(pipeline, [idle, later], [])
    assert [a["status"] for a in store.alerts.latest()] == ["firing"]
    with structlog.testing.capture_logs() as logs:
        asyncio.run(pipeline.sweep())
    (resolved,) = [e for e in logs if e["event"] == "alert_resolved"]
    assert [(a["status"], json.loads(a["details"])["reason"]) for a in store.alerts.latest()] == [("resolved", SILENT)]
    assert resolved["decided_at"] > T0
