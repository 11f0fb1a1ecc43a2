"""A worker writes and posts only while the group holds it (streams/membership.py): after a freeze
past the session timeout its writes and posts wait for a heartbeat to say the group holds it still,
and give up if a revocation finds it dropped. The lease on a clock the tests move, the pipeline on
the real store (chdb), the outbox against the local Slack server, and the heartbeat hook on aiokafka's
real group coordinator against the embedded broker."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer

from detector.alerts import AlertManager
from detector.delivery import MAY_POST_AGAIN_S, Outbox
from detector.detectors import Finding, ResourceInfo
from detector.engine import Engine
from detector.slack import SlackNotifier
from detector.testing import LocalSlack
from streams.embedded import EmbeddedBroker
from streams.membership import Membership, watch_heartbeats
from streams.pipeline import Message, Pipeline
from tests.helpers import MIN, T0
from tests.test_outbox_partitions import posted_ids
from tests.test_pipeline import gpu_message, usage_message

SESSION_S = 6.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_the_membership_is_held_for_the_session_less_a_margin_after_a_heartbeat_sent_or_an_assignment():
    clock = Clock()
    membership = Membership(SESSION_S, clock=clock)
    assert membership.margin_s == 1.0 and Membership(3.0).margin_s == 0.5
    assert membership.held() and membership.status() == "held"
    clock.now += SESSION_S - 1.0 - 0.01
    assert membership.held()
    clock.now += 0.02  # past the session less the margin: the coordinator may drop it a moment later
    assert not membership.held() and membership.status() == "unconfirmed"
    membership.renewed(clock.now - 4.0)  # answered now, sent 4 s ago: the coordinator's clock began then
    assert membership.held()
    clock.now += 1.01
    assert not membership.held()
    membership.renewed(clock.now - 30.0)  # an answer to a heartbeat older than the latest counted changes nothing
    assert not membership.held()
    membership.assigned()  # the handler runs within the join; the join's own renewal (its request's time) follows
    assert not membership.held()
    membership.renewed(clock.now - 0.5)
    assert membership.held() and membership.unconfirmed_s() == 0.5


def test_a_revocation_drops_the_membership_only_if_it_is_not_held():
    clock = Clock()
    membership = Membership(SESSION_S, clock=clock)
    clock.now += 10.0
    assert membership.revoking() is False  # the first join's revocation, before any assignment: nothing to hand over
    membership.renewed(clock.now)
    membership.assigned()
    clock.now += 2.0
    assert membership.revoking() is False and membership.held()  # a rebalance of a live worker: it writes on,
    membership.marked(clock.now)  # once its first mark landed, whatever the heartbeats say (no bound given here)
    clock.now += 60.0
    assert membership.held() and membership.revoking() is False
    membership.assigned()
    clock.now += 10.0  # frozen: no heartbeat answered
    assert membership.revoking() is True and membership.status() == "lost"
    membership.renewed(clock.now)  # (a heartbeat answered after it was dropped would be the next generation's)
    assert not membership.held()
    membership.assigned()  # the next assignment: held again
    assert membership.held() and not membership.lost


def test_a_handover_holds_the_membership_while_its_marks_land_and_loses_it_once_they_lapse():
    """The next holder waits for a handover while its latest mark is younger than ``handover_alive_s``: the
    handover's writes go ahead that long after each mark, and a handover whose marks stopped (a freeze
    during it) is lost, a mark landing after the lapse notwithstanding."""
    clock = Clock()
    membership = Membership(SESSION_S, clock=clock, handover_alive_s=13.0)
    membership.assigned()
    assert membership.revoking() is False
    for _ in range(20):  # a slow handover, marked every second: held throughout, heartbeats or none
        clock.now += 1.0
        membership.marked(clock.now)
        assert membership.held()
    clock.now += 11.99  # the latest mark 11.99 s ago: 12 s (13 less the margin) is the bound
    assert membership.held()
    clock.now += 0.01
    assert not membership.held() and membership.status() == "lost"
    membership.marked(clock.now)  # the refresh, run again once the worker woke: too late
    assert not membership.held()
    membership.assigned()
    membership.renewed(clock.now)
    assert membership.revoking() is False
    clock.now += 20.0  # frozen during the handover, woken: its refresh's mark comes first, yet the marks lapsed
    membership.marked(clock.now)
    assert membership.lost


def test_a_handover_before_its_first_mark_goes_by_the_heartbeats_and_one_mark_landing_late_is_judged_when_it_lands():
    clock = Clock()
    membership = Membership(SESSION_S, clock=clock, handover_alive_s=13.0, handover_within_s=60.0)
    membership.assigned()
    assert membership.revoking() is False
    clock.now += 5.0  # no mark yet, and no heartbeat answered for the session less the margin: not held, not lost
    assert membership.status() == "unconfirmed"
    membership.marked(clock.now - 0.5)  # the begin mark lands: the next holder waits for it
    assert membership.held()
    sent = clock.now + 11.0
    clock.now += 13.0  # a mark sent 11 s after the last, landing 2 s later: the next holder stopped waiting at 12
    membership.marked(sent)
    assert membership.lost


def test_a_handover_holds_the_membership_for_the_rebalance_timeout_at_most():
    clock = Clock()
    membership = Membership(SESSION_S, clock=clock, handover_alive_s=13.0, handover_within_s=60.0)
    membership.assigned()
    membership.revoking()
    for _ in range(58):
        clock.now += 1.0
        membership.marked(clock.now)
    assert membership.held()  # 58 s in, marked every second
    clock.now += 1.0
    assert not membership.held() and membership.lost  # 59 s: the rebalance timeout less the margin


def test_a_wait_for_the_membership_ends_when_a_heartbeat_renews_it_or_a_revocation_finds_it_lost():
    clock = Clock()
    membership = Membership(SESSION_S, clock=clock)
    stopping = threading.Event()
    outcomes: list[bool] = []

    def waiter() -> threading.Thread:
        thread = threading.Thread(target=lambda: outcomes.append(membership.wait_held(stopping)))
        thread.start()
        wait_until(lambda: membership.waiting == 1)
        return thread

    assert membership.wait_held(stopping) is True  # held: at once
    membership.assigned()
    clock.now += 20.0
    assert membership.wait_held(stopping, timeout_s=0.05) is None  # not yet: the caller counts it a stall
    thread = waiter()
    membership.renewed(clock.now)
    thread.join(5)
    clock.now += 20.0
    thread = waiter()
    membership.revoking()
    thread.join(5)
    membership.assigned()
    clock.now += 20.0
    thread = waiter()
    stopping.set()
    thread.join(5)
    assert not thread.is_alive() and outcomes == [True, False, False] and membership.waiting == 0


def batch(start: int, hosts: int = 2) -> list[Message]:
    """A minute of usage and GPU samples of ``hosts`` hosts, offsets from ``start``."""
    return [m for h in range(hosts) for m in (usage_message(start + h, T0 + start * MIN, f"h{h}"),
                                              gpu_message(start + h, T0 + start * MIN, 1.0, f"h{h}"))]  # fmt: skip


def test_a_batch_written_after_a_freeze_waits_for_the_group_and_is_not_written_if_dropped(store, ruleset):
    """A worker frozen past the session: its next batch's write waits (nothing stored, nothing
    acknowledged). A heartbeat answered: it is written. Frozen again and then revoked as dropped: that
    batch and the one queued behind it are not written or acknowledged (their partitions' holder reads
    them again); after the next assignment the worker writes again."""
    clock = Clock()
    membership = Membership(SESSION_S, clock=clock)
    membership.assigned()
    pipeline = Pipeline(engine=Engine(ruleset), store=store, outbox=Outbox(store, None), manager=AlertManager(),
                        send_dead_letter=lambda key, value: asyncio.sleep(0), membership=membership)  # fmt: skip
    acked: list[Message] = []

    async def ack(messages: list[Message]) -> None:
        acked.extend(messages)

    async def until(condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline, "condition not met in time"
            await asyncio.sleep(0.01)

    seen: dict[str, object] = {}

    async def go() -> None:
        await pipeline.process(batch(0), ack)
        await pipeline.drain()
        seen["first"] = (store.count("resource_usage"), len(acked))
        clock.now += SESSION_S  # frozen
        await pipeline.process(batch(1), ack)
        await until(lambda: membership.waiting == 1)
        seen["waiting"] = (store.count("resource_usage"), len(acked))
        membership.renewed(clock.now)  # the next heartbeat: still a member
        await pipeline.drain()
        seen["renewed"] = (store.count("resource_usage"), len(acked))
        clock.now += 60.0  # frozen again, and the group moved on
        await pipeline.process(batch(2), ack)
        await until(lambda: membership.waiting == 1)
        await pipeline.process(batch(3), ack)  # detected; its write queued behind the waiting one
        membership.revoking()  # the revocation that follows the heartbeat which found it dropped
        await pipeline.drain()
        seen["dropped"] = (store.count("resource_usage"), len(acked))
        pipeline.reset()
        membership.assigned()
        membership.renewed(clock.now)  # the join's
        await pipeline.process(batch(4), ack)
        await pipeline.drain()
        seen["again"] = (store.count("resource_usage"), len(acked))

    asyncio.run(go())
    assert seen == {"first": (2, 4), "waiting": (2, 4), "renewed": (4, 8), "dropped": (4, 8), "again": (6, 12)}
    assert store.states.load([0]).keys() == {"h0", "h1"}


def test_a_write_waiting_for_the_group_longer_than_a_session_is_a_stall_until_the_group_answers(store, ruleset):
    """/healthz says stalled (and the stall exit applies) once a write has waited a session timeout for a
    heartbeat's answer; the answer ends the stall, and the batch is written. The store answering a look-up
    meanwhile does not end it: the store was never what it waited for."""
    clock = Clock()
    membership = Membership(0.6, clock=clock)  # (a short session: the wait is real time)
    membership.assigned()
    pipeline = Pipeline(engine=Engine(ruleset), store=store, outbox=Outbox(store, None), manager=AlertManager(),
                        send_dead_letter=lambda key, value: asyncio.sleep(0), membership=membership)  # fmt: skip
    acked: list[Message] = []
    seen: dict[str, object] = {}

    async def ack(messages: list[Message]) -> None:
        acked.extend(messages)

    async def go() -> None:
        clock.now += 10.0  # frozen
        await pipeline.process(batch(0), ack)
        deadline = time.monotonic() + 30
        while pipeline.stalled_since is None:
            assert time.monotonic() < deadline, "no stall"
            await asyncio.sleep(0.01)
        seen["stalled"] = (pipeline.stall_reason, store.count("resource_usage"))
        await pipeline.ask_store(lambda: store.count("resource_usage"), what="a look-up", note="")  # answered
        seen["answered"] = pipeline.stall_reason
        membership.renewed(clock.now)
        await pipeline.drain()
        seen["renewed"] = (pipeline.stalled_since, store.count("resource_usage"), len(acked))

    asyncio.run(go())
    assert seen == {"stalled": ("membership unconfirmed: no heartbeat answered", 0),
                    "answered": "membership unconfirmed: no heartbeat answered", "renewed": (None, 2, 4)}  # fmt: skip


def test_a_write_dropped_while_it_waited_for_the_group_leaves_no_stall(store, ruleset):
    """A write (a batch's, or the wall-clock sweep's, which calls the same method) waits past a session for a
    heartbeat's answer, and the revocation finds the worker dropped: the write gives up (``Dropped``) and the
    stall it was ends with it. Left on, a worker given no partitions at its rejoin (so writing and asking
    nothing more) would exit for a stall nothing waits on."""
    from streams.pipeline import Dropped, _Step

    clock = Clock()
    membership = Membership(0.6, clock=clock)
    membership.assigned()
    pipeline = Pipeline(engine=Engine(ruleset), store=store, outbox=Outbox(store, None), manager=AlertManager(),
                        send_dead_letter=lambda key, value: asyncio.sleep(0), membership=membership)  # fmt: skip
    clock.now += 10.0  # frozen
    outcome: list[BaseException | None] = []

    def write() -> None:
        try:
            pipeline._write_until_stored(_Step(expired=["gone"]))  # the sweep's kind of write
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - what it raised is the assertion
            outcome.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    deadline = time.monotonic() + 30
    while pipeline.stalled_since is None:
        assert time.monotonic() < deadline, "no stall"
        time.sleep(0.01)
    membership.revoking()  # not heard from within the session: lost
    writer.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], Dropped), outcome
    assert pipeline.stalled_since is None and pipeline.stall_reason == ""


def opening(rid: str):
    found = Finding(action="fire", rule="idle-gpu", type="idle_gpu", resource_id=rid, episode_start=T0,
                    fired_at=T0 + 1800, at=T0 + 1800, waste_usd=16.0, usd_per_hour=32.0, severity="warning",
                    resource=ResourceInfo(resource_id=rid, tags={"owner": rid}), key=rid)  # fmt: skip
    (alert,) = AlertManager().handle([found])
    alert.partition = 0
    return alert


def test_an_alert_is_not_posted_while_the_membership_is_unconfirmed(store):
    alerts = [opening("h1"), opening("h2")]
    store.alerts.record(alerts, version=1)
    held = [False]
    with LocalSlack() as slack:
        outbox = Outbox(store, SlackNotifier(token="xoxb-test", channel="#c", base_url=slack.api_url), group_wait_s=0)
        outbox.may_post = lambda: held[0]
        outbox.add(alerts)
        assert outbox.deliver_pending() == 0 and outbox.hold_s == MAY_POST_AGAIN_S  # asked again shortly
        assert slack.calls("chat.postMessage") == [] and len(outbox) == 2
        held[0] = True
        assert outbox.deliver_pending() >= 1
        assert sorted(posted_ids(slack)) == sorted(a.alert_id for a in alerts) and len(outbox) == 0


def test_heartbeats_of_aiokafkas_coordinator_renew_the_membership(tmp_path):
    """The hook on the coordinator aiokafka makes (a private method: the pinned version's), against the
    embedded broker: a member's heartbeats move the membership's renewal on."""
    membership = Membership(SESSION_S)
    membership._renewed_at = membership.now() - 100.0  # as if frozen: only a heartbeat can make it held

    beats: list[bool] = []

    async def go() -> tuple[int, float]:
        with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
            consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="membership",
                                        session_timeout_ms=int(SESSION_S * 1000), heartbeat_interval_ms=1900)  # fmt: skip
            await consumer.start()
            try:
                coordinator = consumer._coordinator
                watch_heartbeats(coordinator, membership)
                watched = coordinator._do_heartbeat

                async def counted() -> bool:  # (counts the answered heartbeats the hook sees)
                    beats.append(await watched())
                    return beats[-1]

                coordinator._do_heartbeat = counted
                consumer.subscribe(["membership-topic"])  # the join, after the hook: it renews the membership
                deadline = time.monotonic() + 60
                while not membership.held():
                    assert time.monotonic() < deadline, "neither the join nor a heartbeat renewed the membership"
                    await asyncio.sleep(0.05)
                joined_with = sum(beats)
                while sum(beats) < 2:  # and the heartbeats go on renewing it
                    assert time.monotonic() < deadline, "no heartbeat answered"
                    await asyncio.sleep(0.05)
                return joined_with, membership.unconfirmed_s()
            finally:
                await consumer.stop()

    joined_with, unconfirmed = asyncio.run(go())
    assert joined_with == 0  # held by the join's renewal, before any heartbeat was answered
    assert unconfirmed < SESSION_S
