"""Several workers: each records how far the usage partitions it holds are stored, and one that looks
up another's hosts releases nothing past what that one has stored (streams/progress.py). The store
round trip, the aligner's cap, and two pipelines on one store (no Kafka); the worker processes
catching up a backlog are in tests/test_several_workers.py."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import pytest
from aiokafka.partitioner import murmur2
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from detector.alerts import AlertManager
from detector.align import EventTimeAligner
from detector.delivery import Outbox
from detector.engine import Engine
from detector.simulate import SimConfig
from detector.store import Store
from streams.app import HostDirectory
from streams.handover import _Marks
from streams.kafka import count_events
from streams.pipeline import CAPPED_ALLOWANCE, TP, Message, Pipeline
from tests.helpers import MIN, T0, at
from tests.reliability import _ALERTS_QUERY, compare_alerts, fleet
from tests.test_align import Ev, times
from tests.test_pipeline import make

INF = float("inf")
PARTITIONS = 2


def test_handover_marks_say_who_is_still_giving_a_partition_up(store: Store):
    """A holder's latest mark wins (its end after its begin, within one millisecond of the store's clock
    too); a worker is not told of its own marks; another partition's marks say nothing; each handover
    not ended comes with its age on the store's clock."""
    marks = store.handovers

    def releasing(holder: str, partitions: list[int]) -> dict[int, list[str]]:
        return {p: sorted(holders) for p, holders in marks.releasing(holder, partitions).items()}

    marks.mark("a", [0, 4], releasing=True)
    marks.mark("b", [1], releasing=True)
    assert releasing("c", [0, 1, 4]) == {0: ["a"], 1: ["b"], 4: ["a"]}
    assert releasing("a", [0, 4]) == {}  # its own
    assert releasing("c", [2, 3]) == {}
    marks.mark("a", [0, 4], releasing=False)
    assert releasing("c", [0, 1, 4]) == {1: ["b"]}
    marks.mark("a", [4], releasing=True)  # a later handover of one of them
    assert releasing("c", [0, 4]) == {4: ["a"]}
    store.command(f"ALTER TABLE {store.db}.partition_handovers UPDATE at = at - INTERVAL 2 MINUTE WHERE holder = 'b' "
                  "SETTINGS mutations_sync = 1")  # fmt: skip
    assert 120 <= marks.releasing("c", [1])[1]["b"] < 180  # begun two minutes ago, never ended
    assert marks.releasing("c", [4])[4]["a"] < 60
    marks.mark("d", [], releasing=True)  # nothing held: nothing marked
    assert int(store.command(f"SELECT count() FROM {store.db}.partition_handovers WHERE holder = 'd'")) == 0


def test_an_assignment_waits_for_the_handover_until_it_ends_its_bounds_or_a_stop(store: Store):
    """The next holder's wait (streams.handover) ends when the other holder's handover ends; when the
    wait itself reaches its bound; when the handover was marked last longer ago than a living worker
    marks it again (one killed during it neither marks it again nor ends it), saying so each time; and
    at once when the worker stops. A mark's age is set in the store, not waited out."""
    marks = store.handovers
    waiting = _Marks(marks)

    def wait(alive_s: float = 600, wait_s: float = 60, stopping: bool = False) -> tuple[float, list[dict]]:
        started = time.monotonic()
        with capture_logs() as logs:
            asyncio.run(waiting.wait([1, 3], alive_s=alive_s, wait_s=wait_s, stopping=lambda: stopping))
        said = [e for e in logs if e["event"].startswith("handover_") and e["event"] != "handover_read_failed"]
        return time.monotonic() - started, said  # (a read slower than its share of a short bound: asked again)

    def age(holder: str, seconds: int) -> None:
        store.command(f"ALTER TABLE {store.db}.partition_handovers UPDATE at = now64(3) - INTERVAL {seconds} SECOND "
                      f"WHERE holder = '{holder}' SETTINGS mutations_sync = 1")  # fmt: skip

    marks.mark("gone", [3], releasing=True)
    seconds, logs = wait(wait_s=0.5)
    assert 0.5 <= seconds < 30 and [e["event"] for e in logs] == ["handover_awaiting", "handover_not_ended"]
    assert logs[1]["partitions"] == {3: ["gone"]} and "waited 0.5 s" in logs[1]["reason"]
    age("gone", 595)  # marked last 595 s ago: waited for until 600 s after
    seconds, logs = wait()
    assert seconds < 30 and [e["event"] for e in logs] == ["handover_awaiting", "handover_not_ended"]
    assert logs[1]["partitions"] == {3: ["gone"]} and "its worker died" in logs[1]["reason"]
    assert wait()[1] == []  # marked last more than 600 s ago: not waited for, nothing said
    marks.mark("gone", [3], releasing=True)  # marked again (its worker alive, the handover going on): waited for
    seconds, logs = wait(wait_s=0.5)
    assert [e["event"] for e in logs] == ["handover_awaiting", "handover_not_ended"] and "waited" in logs[1]["reason"]
    age("gone", 0)
    assert wait(stopping=True) == (pytest.approx(0, abs=5), [])
    marks.mark("gone", [3], releasing=False)
    marks.mark("slow", [1], releasing=True)
    ending = threading.Timer(0.5, marks.mark, ("slow", [1], False))
    ending.start()
    seconds, logs = wait()
    ending.join()
    assert 0.5 <= seconds < 30 and [e["event"] for e in logs] == ["handover_awaiting", "handover_awaited"]
    assert logs[1]["partitions"] == {1: ["slow"]}


def test_progress_round_trip(store: Store):
    """The newest generation's row of each partition wins, then the newest version within it (a holder
    of an earlier generation whose clock is ahead does not win); nothing stored yet reads as the epoch's start."""
    store.progress.record("resource-usage", [(0, T0, False), (1, float("-inf"), False)], version=1, generation=4)
    store.progress.record("resource-usage", [(0, T0 + 90.5, True)], version=2, generation=4)
    store.progress.record("resource-usage", [(0, T0 - 1, False)], version=0, generation=4)  # older: loses
    store.progress.record("resource-usage", [(1, T0 + 5, True)], version=99, generation=3)  # an earlier generation: loses
    store.progress.record("gpu-metrics", [(0, T0 + 999, False)], version=3, generation=4)  # another topic
    assert store.progress.read("resource-usage") == {0: (T0 + 90.5, True, 4), 1: (0.0, False, 4)}


@given(st.lists(st.tuples(st.sampled_from("ab"), st.lists(st.integers(0, 50), min_size=1, max_size=4)), max_size=12),
       st.integers(-5, 60))  # fmt: skip
def test_a_capped_release_then_the_rest_is_the_uncapped_release(messages, cap):
    """Released with a cap: nothing past it, and then (the cap lifted) what an uncapped release gives
    follows, so a cap delays events without reordering them or losing a token."""
    capped, free = EventTimeAligner(lateness_s=2), EventTimeAligner(lateness_s=2)
    for i, (source, ts) in enumerate(messages):
        for aligner in (capped, free):
            aligner.push(source, [Ev(float(t)) for t in ts], token=i)
    first, first_tokens = capped.release(cap=cap)
    assert all(t <= cap for t in times(first))
    rest, rest_tokens = capped.release()
    expected, expected_tokens = free.release()
    assert times(first) + times(rest) == times(expected)
    assert sorted(first_tokens + rest_tokens) == sorted(expected_tokens)


def usage(partition: int, offset: int, t: float, host: str) -> Message:
    value = {"ts": at(t).isoformat(), "resource_id": host, "resource_type": "gpu_instance", "cost_usd": 0.5,
             "interval_s": 60, "tags": {"team": "nlp", "project": "llm"}}  # fmt: skip
    return Message("resource-usage", partition, offset, host.encode(), json.dumps(value).encode())


def gpu(partition: int, offset: int, t: float, host: str) -> Message:
    value = [{"ts": at(t).isoformat(), "resource_id": host, "gpu_index": 0, "util_pct": 50.0}]
    return Message("gpu-metrics", partition, offset, host.encode(), json.dumps(value).encode())


def run(partition: int, offset: int, t: float, host: str) -> Message:
    value = {"ts": at(t).isoformat(), "run_id": "r1", "status": "running", "resource_ids": [host], "project": "llm"}
    return Message("run-events", partition, offset, b"llm", json.dumps(value).encode())


def worker(store: Store, ruleset, partitions: list[int], end_positions=None, count: int = PARTITIONS,
           generation: int | None = None, caught_up=lambda topic, p, offset: False, **options) -> Pipeline:  # fmt: skip
    """A pipeline as a worker of the group holds it, wired as the worker wires it (a run's hosts held
    elsewhere read from the store): ``partitions`` of each input topic of ``count`` partitions, in the
    group's ``generation``, catching up unless ``caught_up`` says so (by default nothing is: a backlog);
    ``options``: the pipeline's other settings (flow control)."""
    engine = Engine(ruleset)
    engine.directory = HostDirectory(store.history)
    pipeline = Pipeline(engine=engine, store=store, outbox=Outbox(store, None), manager=AlertManager(ruleset=ruleset),
                        send_dead_letter=lambda key, value: asyncio.sleep(0), caught_up=caught_up,
                        end_positions=end_positions, partition_count=lambda topic: count,
                        generation=lambda: generation, **options)  # fmt: skip
    pipeline.expect((topic, p) for topic in ("resource-usage", "gpu-metrics", "run-events") for p in partitions)
    return pipeline


async def ack(messages: list[Message]) -> None:
    pass


async def batch(pipeline: Pipeline, messages: list[Message]) -> None:
    await pipeline.process(messages, ack)
    await pipeline.drain()


def own_hour(partition: int, host: str, first: int = 0) -> list[Message]:
    """An hour of a host's usage and samples, every 10 minutes, on ``partition`` from offset ``first``."""
    times = [T0 + i * 10 * MIN for i in range(7)]
    return [m for i, t in enumerate(times) for m in (usage(partition, first + i, t, host), gpu(partition, first + i, t, host))]


def test_a_run_whose_host_another_worker_holds_waits_until_that_worker_has_stored_its_time(store: Store, ruleset):
    """Worker A holds a run (at 30 min) whose host B holds: A's own partitions are past it, but
    nothing is released until B has stored its usage partition through it (its progress, written
    after its events), and then only up to that; a worker's progress moves with what it stores,
    not with what it releases, so neither waits on the other."""
    a, b = worker(store, ruleset, [0]), worker(store, ruleset, [1])
    assert (a.group.held, a.group.others) == ([0], [1])  # type: ignore[union-attr]

    async def scenario() -> None:
        await batch(a, [*own_hour(0, "a1"), run(0, 0, T0 + 30 * MIN, "b1"), run(0, 1, T0 + 60 * MIN, "b1")])
        assert a.aligner.watermark > T0 + 30 * MIN  # A's own partitions would release the run at 30 min
        assert a.stats.detected == 0 and len(a.aligner) == 16  # no progress of B's partition yet: all held
        assert a.group.held_s() > 0  # type: ignore[union-attr]  # what /healthz shows an operator
        assert store.progress.read("resource-usage")[0] == (T0 + 60 * MIN, False, -1)  # A's own, though
        await batch(b, [usage(1, i, T0 + i * 10 * MIN, "b1") for i in range(4)])  # B stored to 30 min
        await batch(a, [])  # the release timer's batch
        assert a.group.cap == T0 + 30 * MIN - 60  # type: ignore[union-attr]  # less the lateness
        assert a.stats.detected > 0 and "llm" in a.aligner.held_keys()  # the run (30 min) still waits
        await batch(b, [usage(1, 4 + i, T0 + (4 + i) * 10 * MIN, "b1") for i in range(3)])
        await batch(a, [])
        assert a.group.cap == T0 + 60 * MIN - 60  # type: ignore[union-attr]
        assert [t for t, e in a.aligner._held[2]] == [T0 + 60 * MIN]  # the run at 30 min released: B is past it

    asyncio.run(scenario())


def test_a_partition_with_nothing_to_read_is_recorded_caught_up(store: Store, ruleset):
    """A worker whose usage partition never delivers (empty) records it caught up from its release
    timer, with nothing held to release: the others' release is not held by it."""
    async def empty(tps):
        return {tp: (0, 0) for tp in tps}

    a, b = worker(store, ruleset, [0]), worker(store, ruleset, [1], end_positions=empty)

    async def scenario() -> None:
        await batch(a, [*own_hour(0, "a1"), run(0, 0, T0 + 30 * MIN, "a1")])
        assert a.stats.detected == 0
        await b.tick()  # finds partition 1 empty, records it caught up
        assert store.progress.read("resource-usage")[1] == (0.0, True, -1)
        await batch(a, [])
        assert a.group.cap == INF and a.stats.detected > 0  # type: ignore[union-attr]
        assert a.group.held_s() == 0  # type: ignore[union-attr]

    asyncio.run(scenario())


@pytest.mark.parametrize("count", [PARTITIONS, 1])
def test_a_worker_holding_every_partition_records_and_reads_nothing(store: Store, ruleset, count):
    """One worker alone (every partition): no progress written or read, and it releases what a
    pipeline with no group does. Every partition is every one the topics have (``count``), however
    many ``BURNWATCH_PARTITIONS`` would make: topics of one partition each, made beforehand, hold it alone."""
    alone = worker(store, ruleset, list(range(count)), count=count)
    plain, _ = make(store, ruleset, caught_up=lambda topic, p, offset: False)
    plain.expect((topic, p) for topic in ("resource-usage", "gpu-metrics", "run-events") for p in range(count))
    alone_on_one = count == 1  # both hosts and both runs on partition 0, one after the other
    messages = [*own_hour(0, "a1"), *own_hour(1 % count, "b1", first=7 if alone_on_one else 0), run(0, 0, T0 + 30 * MIN, "b1"),
                run(1 % count, 1 if alone_on_one else 0, T0 + 60 * MIN, "a1")]  # fmt: skip

    async def scenario() -> None:
        for pipeline in (alone, plain):
            await batch(pipeline, messages)

    asyncio.run(scenario())
    assert alone.group is not None and (alone.group.held, alone.group.others, alone.group.cap) == ([], [], INF)
    assert alone.stats.detected == plain.stats.detected > 0
    assert store.count("partition_progress") == 0


def test_a_partition_caught_up_in_an_earlier_generation_holds_until_its_holder_says_so_again(store: Store, ruleset):
    """Restarted into a backlog (or rebalanced), the group is in a new generation: a row saying a
    partition was caught up in an earlier one says nothing of the backlog since, so it holds the
    release at what it stored, until the partition's holder in this generation records it."""
    async def empty(tps):
        return {tp: (0, 0) for tp in tps}

    before = worker(store, ruleset, [1], end_positions=empty, generation=1)
    a = worker(store, ruleset, [0], generation=2)
    b = worker(store, ruleset, [1], end_positions=empty, generation=2)

    async def scenario() -> None:
        await before.tick()  # generation 1: partition 1 found empty, recorded caught up
        assert store.progress.read("resource-usage")[1] == (0.0, True, 1)
        await batch(a, [*own_hour(0, "a1"), run(0, 0, T0 + 30 * MIN, "a1")])
        assert a.stats.detected == 0 and a.group.cap < T0  # type: ignore[union-attr]  # held: not said in generation 2
        await b.tick()  # generation 2: its holder finds it empty again
        await batch(a, [])
        assert a.group.cap == INF and a.stats.detected > 0  # type: ignore[union-attr]

    asyncio.run(scenario())


def _partition_of(key: str, partitions: int) -> int:
    """The partition a Kafka producer's default partitioner gives ``key`` (murmur2, as Java's)."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


@pytest.mark.parametrize(("seed", "limit"), [(1, 3), (2, 3), (3, 3), (4, 2)])
def test_two_workers_fetching_unevenly_bound_what_they_hold_never_stall_and_alert_as_backtest(
        tmp_path, store: Store, ruleset, seed, limit):  # fmt: skip
    """Two workers catch up a backlog fetching as a consumer does: a run of each partition not paused
    at a time, in a seeded random order with one worker fetching four times as often as the other.
    The faster one is capped by the other's progress: no partition it fetches more than the margin past
    the cap holds more than its share of messages (the one holding its watermark, its allowance: 10
    shares); before, that one ran on, and the faster worker held 53-79 % of its events. Neither worker
    waits on the other for good (every message is acknowledged; without the rule that fetches the
    slowest partition again within half the margin, every partition of both stays paused), and the
    alerts are backtest's to the cent and the millisecond. Shares of 2-3 messages keep the allowance
    small against this 6-hour fleet (720 messages a GPU partition)."""
    cfg = SimConfig(hours=6, training_hosts=4, notebooks=0, inference_endpoints=0, buckets=0, vector_dbs=0,
                    cpu_instances=0, seed=11)  # fmt: skip
    fl = fleet(tmp_path / "fleet.jsonl", cfg, ruleset)
    assert {a.type for a in fl.expected} >= {"failed_run_spend", "spot_eligible"}  # run alerts: hosts priced from the store
    logs: dict[TP, list[Message]] = {}
    for topic, key, value in fl.records:
        p = _partition_of(key, PARTITIONS)
        log = logs.setdefault((topic, p), [])
        log.append(Message(topic, p, len(log), key.encode(), value))
    read = dict.fromkeys(logs, 0)
    acked: set[tuple[TP, int]] = set()
    rng = random.Random(seed)
    fast = seed % 2  # either worker the faster

    async def ack(messages: list[Message]) -> None:
        acked.update(((m.topic, m.partition), m.offset) for m in messages)

    async def end_positions(tps):
        return {tp: (read.get(tp, 0), len(logs.get(tp, []))) for tp in tps}

    paused: list[set[TP]] = [set(), set()]

    def flow_of(i: int):
        def flow(pause: list[TP], resume: list[TP]) -> None:  # the consumer's pause and resume
            paused[i].update(pause)
            paused[i].difference_update(resume)
        return flow

    def at_end(topic: str, p: int, offset: int) -> bool:
        return offset + 1 >= len(logs.get((topic, p), []))

    workers = [worker(store, ruleset, [i], end_positions=end_positions, generation=1, caught_up=at_end, flow=flow_of(i),
                      max_held_per_partition=limit) for i in range(2)]  # fmt: skip
    margin = workers[0]._capped_margin_s
    most_held, capped, steps = [0, 0], [0, 0], 0

    async def scenario() -> None:
        nonlocal steps
        while len(acked) < len(fl.records):
            steps += 1
            assert steps < 20_000, f"stalled: {len(acked)} of {len(fl.records)} acknowledged"
            i = fast if rng.random() < 0.8 else 1 - fast
            w = workers[i]
            batch_ = []
            for tp in sorted(tp for tp in logs if tp[1] == i and tp not in paused[i]):
                n = rng.randint(1, 30)
                batch_ += logs[tp][read[tp]:read[tp] + n]
                read[tp] = min(read[tp] + n, len(logs[tp]))
            if batch_:
                await w.process(batch_, ack)
                await w.drain()
            else:
                await w.tick()  # the release timer's
                await w.drain()
            group = w.group
            assert group is not None
            if group.cap != INF and group.cap < w.aligner.watermark:
                capped[i] += 1
                fetching = [tp for tp in logs if tp[1] == i and tp not in paused[i]]
                slowest = w.aligner.slowest()
                most = {tp: CAPPED_ALLOWANCE * limit if tp == slowest else limit for tp in fetching}
                ahead = [tp for tp in fetching if w.aligner.progress(tp)[0] > group.cap + margin
                         and w.aligner.held_by_source.get(tp, 0) > most[tp]]  # fmt: skip
                assert not ahead, f"fetching {ahead}, each holding more than its share or allowance, {margin} s past the cap"
            most_held[i] = max(most_held[i], len(w.aligner))

    asyncio.run(scenario())
    assert capped[fast] > 0  # the cap engaged, and with it the bound
    own = count_events((topic, "", m.value) for (topic, p), log in logs.items() if p == fast for m in log)  # type: ignore[misc]
    assert most_held[fast] < own / 8, (most_held, own)  # 6.5-8.1 % of its events; without the bound 53-79 %
    query = _ALERTS_QUERY.replace("burnwatch.", f"{store.alerts.conn.db}.")
    alerts = compare_alerts(fl.expected, {r["alert_id"]: r for r in store.alerts.conn.query(query)})
    assert alerts.ok, str(alerts)
