"""Partitions moving between workers, and what moves with them: per-resource state, the
alert manager's memory and the Slack posts still to make (docs/reliability.md).

- **revoked**: the write in flight lands and what is done is committed, then the cached
  state and held messages are dropped (unacknowledged: the next holder reads them again),
  and Slack posts still queued are left to the next holder.
- **assigned**: batches stay paused, and a task takes the partitions over beside the consumer
  (which sends no heartbeat until the handler returns): it waits for the previous holders'
  handovers, loads the state of the new partitions and the alerts every worker made from the
  store, recovers the posts left undelivered, then resumes batches. A revocation or a stop that
  comes meanwhile ends it at its next step, before its own handover begins. Nothing here asks
  the broker: a stop cancels the consumer thread's calls (the release timer asks which new
  partitions have nothing to read, :meth:`Pipeline.tick`).
- **stopping** (Faust does not call the revocation handler at a stop): the same handover as
  a revocation, before the consumer commits and leaves the group.

A revocation and a stop mark the partitions given up in the store when they begin, every second
while they last, and when they end; an assignment's taking over first waits for every other
worker still giving up one of its partitions (marked within the session timeout and a mark's
bound: one marked last before that died or froze during it; at most the rebalance timeout, after
which a worker has left the group), so that nothing the previous holder writes or posts lands after the next holder began.
Kafka promises as much (no member is assigned anything before every member has rejoined, its
revocation done); the embedded broker forms the group when its leader rejoins, and a slower
revocation overlapped the next holder (docs/architecture.md, "Several workers: what moves at a
rebalance").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import urlsplit

import faust
import structlog

from detector.events import TOPICS
from detector.store import Store
from detector.store.connection import Connection, connect
from detector.store.handovers import PartitionHandovers
from detector.store.states import SavedTimes
from detector.units import one_line
from streams.membership import Membership
from streams.parts import WorkerParts, fail
from streams.pipeline import Pipeline, PipelineStopped

__all__ = ["Handover", "alive_for", "install_handover"]

HANDOVER_POLL_S = 0.2
"""How often an assignment asks whether the previous holders' handovers have ended."""
MARK_WITHIN_S = 5.0
"""How long a handover mark may take before it is given up (logged): a store that hangs holds no stop up."""
REFRESH_S = 1.0
"""How often a handover in progress marks its partitions again (at most a quarter of the session timeout):
the next holder waits while the latest mark is recent (:func:`alive_for`), so for a live worker's handover
however long it lasts, and for a dead one's a few seconds longer than the group takes to find it gone."""


def refresh_every(session_timeout_s: float) -> float:
    """How often a handover in progress is marked again."""
    return min(REFRESH_S, session_timeout_s / 4)


def alive_for(session_timeout_s: float) -> float:
    """How recent the latest mark of a handover must be for the next holder to wait for it: the session
    timeout (as long as the group takes to find a silent member gone), plus a mark that took its whole
    bound and the refreshes around it (a slow store at a rebalance must not pass a live worker over)."""
    return session_timeout_s + MARK_WITHIN_S + 2 * refresh_every(session_timeout_s)


T = TypeVar("T")

log = structlog.get_logger("burnwatch.worker")


class _Taking:
    """An assignment's taking over of its partitions: a task beside the consumer's rebalance, so
    that heartbeats go on while it waits for the previous holders (the consumer sends none until
    the assignment's handler returns)."""

    def __init__(self) -> None:
        self.task: asyncio.Future[None] | None = None
        self.given_up = False
        """A revocation or a stop came: the taking over ends at its next step, taking nothing more."""


class Handover:
    """The hooks' shared part: the taking over in progress, which a handover ends first."""

    def __init__(self) -> None:
        self.taking: _Taking | None = None

    def give_up(self) -> None:
        """Tell the taking over in progress to end at its next step, taking nothing more."""
        if self.taking is not None:
            self.taking.given_up = True

    async def taken(self) -> None:
        """Until the assignment's taking over has ended, however it ends. A caller cancelled meanwhile
        leaves it to end, never half done (a recovery of posts in a thread of its own would land after
        the next handover)."""
        taking = self.taking
        if taking is not None and taking.task is not None and not taking.task.done():
            await asyncio.wait({taking.task})


def install_handover(parts: WorkerParts) -> Handover:
    app, store, pipeline, outbox = parts.app, parts.store, parts.pipeline, parts.outbox
    alive_s, rebalance_s = alive_for(parts.settings.session_timeout_s), float(app.conf.broker_rebalance_timeout)
    """How recent a handover's latest mark must be for the next holder to wait for it, and how long it waits at most."""
    membership = pipeline.membership
    if membership is not None:  # a live handover holds it while the next holder would wait for its marks
        membership.handover_alive_s, membership.handover_within_s = alive_s, rebalance_s
    marks = _Marks(_handovers(parts.settings.dsn, parts.settings.clickhouse_database, store), membership)
    handover = Handover()
    held: set[int] = set()
    """The input partitions of the assignment in force (given up at the next revocation or stop)."""

    async def handing_over(hand_over: Callable[[], Awaitable[None]]) -> None:
        """Run a revocation's or a stop's ``hand_over`` between its two marks in the store, once the
        assignment's taking over, told to give up at once, has ended its step in progress (a read, or
        posts recovered and not delivered): the begin mark first, so that the next holder waits for it."""
        handover.give_up()
        partitions = sorted(held)
        held.clear()
        started = time.monotonic()
        await marks.mark(partitions, releasing=True)
        if partitions:
            log.info("handing_over", partitions=partitions, holder=marks.holder)
        ended = asyncio.Event()
        refreshing = asyncio.ensure_future(marks.refresh(partitions, refresh_every(parts.settings.session_timeout_s), ended))
        try:
            await handover.taken()
            await hand_over()
        finally:
            ended.set()
            try:
                await asyncio.wait({refreshing})  # (its mark in progress lands before the end mark)
            finally:
                await marks.mark(partitions, releasing=False)
            if partitions:
                log.info("handed_over", partitions=partitions, holder=marks.holder, seconds=round(time.monotonic() - started, 3))

    # Faust's signal types say a receiver takes any positional arguments; Faust passes these.
    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
        if membership is not None:  # dropped while frozen: the writes waiting for it give up first
            membership.revoking()
        await handing_over(revoke)

    async def revoke() -> None:
        # State moves with partitions: what this worker holds may now belong to another. The
        # write in flight lands and what is done is committed before the group reassigns.
        await pipeline.pause()  # no batch until the next assignment's state is loaded
        parts.posts_recovered = False
        pipeline.stats.partitions = 0  # (/healthz) none until the next assignment's are taken over
        await _commit(app, pipeline)
        parts.fetches.clear()  # fetched in this generation: read again from the committed offsets
        pipeline.reset()
        parts.assigned_states.clear()
        # Slack posts move with partitions too: after any post in progress, drop what is queued
        # (stored: the next holder recovers it), so no alert is posted by two workers.
        await asyncio.get_running_loop().run_in_executor(None, outbox.revoke)
        if parts.outputs is not None:
            await asyncio.get_running_loop().run_in_executor(None, parts.outputs.revoke)
        await _stop_acting(parts)

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
        """Pause, and leave the taking over to a task: the consumer sends no heartbeat until this
        returns, and the wait for the previous holders may last as long as their revocation does."""
        partitions = sorted({tp.partition for tp in assigned if tp.topic in TOPICS})
        if membership is not None:  # the group has just formed with this worker in it
            membership.assigned()
        parts.posts_recovered = False  # (an assignment without a revocation before it: the first)
        held.update(partitions)
        handover.give_up()  # (a revocation ended the one before; this is a guard)
        await handover.taken()
        await pipeline.pause()  # no batch before this assignment's state is loaded (the first: none in flight)
        taking = _Taking()
        taking.task = asyncio.ensure_future(take_over(assigned, partitions, taking))
        handover.taking = taking

    async def take_over(assigned: Any, partitions: list[int], taking: _Taking) -> None:
        def given_up() -> bool:
            return taking.given_up or pipeline.stopping

        try:
            await _take_over(assigned, partitions, given_up)
        except PipelineStopped:  # given up while the store failed: the partitions are handed over
            return
        except Exception as exc:  # noqa: BLE001 - a bug (the store's failures are retried): a restart takes them over again
            if given_up():  # the partitions are handed over anyway
                log.warning("assignment_given_up", partitions=partitions, error=one_line(exc))
                return
            fail("assignment_failed", partitions=partitions, error=one_line(exc))

    async def _take_over(assigned: Any, partitions: list[int], given_up: Callable[[], bool]) -> None:
        """Wait for the previous holders, load the state and the alerts, recover the posts, then
        resume; at each step, nothing more once a revocation or a stop has come. A store that fails
        is asked again, as a batch's look-up is (/healthz says stalled; the stall exit applies)."""

        async def from_store(what: str, look_up: Callable[[], T], read_only: bool = False) -> T:
            return await pipeline.ask_store(look_up, what, "taking partitions over; retrying", given_up=given_up,
                                            read_only=read_only)  # fmt: skip

        # Nothing is read, loaded or posted before the previous holders' last writes have landed.
        await marks.wait(partitions, alive_s=alive_s, wait_s=rebalance_s, stopping=given_up)
        if given_up():
            return

        # Keys saved within the eviction horizon (of the newest save) come with their bytes, held
        # until each speaks; older ones come as names and are read from the store when they speak.
        def load() -> tuple[dict[str, bytes | None], SavedTimes]:
            """Off the event loop: a million keys' rows and their times sorted take seconds."""
            latest: dict[str, float] = {}  # each key's latest event time: the sweeps reclaim those that never speak
            maybe_open: set[str] = set()  # and read those whose state may hold an open episode, to resolve it
            loaded = store.states.load(partitions, parts.settings.evict_after_s or None, latest, maybe_open)
            return loaded, SavedTimes(latest, maybe_open)

        states, saved_times = await from_store("state load", load, read_only=True)
        if given_up():  # a revocation or a stop came meanwhile: its hook hands everything over
            return
        # What another worker alerted on these keys until now is in the store: the alert manager
        # learns it again, so re-read input neither re-opens nor re-closes those alerts.
        manager = await from_store("alerts' load", parts.alert_manager, read_only=True)
        if given_up():
            return
        pipeline.manager = manager
        pipeline.reset()
        # Each holds the watermark until it delivers or the release timer, woken here, finds it
        # has nothing to read: asking the broker here held a stop up until the worker was killed.
        pipeline.expect((tp.topic, tp.partition) for tp in assigned if tp.topic in TOPICS)
        parts.assigned_states.clear()
        parts.assigned_states.update(states)
        pipeline.saved_times = saved_times
        pipeline.stats.partitions = len(partitions)
        parts.holds_partition_0 = 0 in partitions  # one worker of the group posts the digests: partition 0's
        log.info("state_loaded", partitions=partitions, keys=len(states),
                 read_when_they_speak=sum(1 for data in states.values() if data is None))  # fmt: skip
        recovered = await from_store("posts' recovery", functools.partial(outbox.assign, partitions))
        if recovered:
            log.info("outbox_recovered", pending=recovered)
        if given_up():  # not delivered: its hook revokes the outbox next, the posts are the next holder's
            return
        pipeline.outbox_ready.set()
        if parts.outputs is not None:
            recovered = await from_store("outputs' recovery", functools.partial(parts.outputs.assign, partitions))
            if recovered:
                log.info("outputs_recovered", pending=recovered)
            if given_up():
                return
            pipeline.outputs_ready.set()
        # Refused during a stop (its hook has revoked the outboxes): the posts are the next holder's.
        parts.posts_recovered = pipeline.resume()

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def stopping(sender: Any, **kwargs: Any) -> None:
        """A clean stop hands the partitions over as a revocation does (Faust does not call the
        revocation handler at a stop): the write in flight lands (or, for a store that takes
        none, gives up unacknowledged) and any Slack post in progress finishes, before the
        consumer commits what is acknowledged and leaves the group."""
        if membership is not None:  # (as a revocation: a write waiting for it gives up or goes ahead)
            membership.revoking()
        pipeline.stop()
        parts.posts_recovered = False
        await handing_over(stop)

    async def stop() -> None:
        await pipeline.pause()
        await asyncio.get_running_loop().run_in_executor(None, pipeline.event_writer.close)
        await asyncio.get_running_loop().run_in_executor(None, outbox.revoke)
        if parts.outputs is not None:
            await asyncio.get_running_loop().run_in_executor(None, parts.outputs.revoke)
        await _stop_acting(parts)

    return handover


def _handovers(dsn: str, database: str, store: Store) -> PartitionHandovers:
    """The handover marks, on a client of their own where the store is a server: a mark must not wait
    behind the write in flight (the writer thread's insert holds the store connection's lock), the very
    thing the next holder is to wait for. An embedded store is one process's: one worker, no other."""
    if urlsplit(dsn).scheme not in ("http", "https"):
        return store.handovers
    try:
        return PartitionHandovers(Connection(connect(dsn, send_receive_timeout=MARK_WITHIN_S), database))
    except Exception as exc:  # noqa: BLE001 - the server, reached a moment ago for the store: logged, the store's client then
        log.warning("handover_client_failed", error=one_line(exc), note="the marks share the store's client")
        return store.handovers


class _Marks:
    """This worker's handover marks: made, and the other workers' read, on a thread of their own (a
    thread of the loop's default pool may be parked on the store connection's lock behind the very
    write a mark announces), each call bounded (a store that hangs must not hold a stop up)."""

    def __init__(self, handovers: PartitionHandovers, membership: Membership | None = None) -> None:
        self.handovers = handovers
        self.membership = membership
        """Told when each mark of a handover in progress landed: its writes go ahead while the marks are recent."""
        self.holder = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        """This worker in the marks: a process of its own (a restarted worker is another)."""
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="handover-marks")

    async def _call(self, within_s: float, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the marks' thread, awaited for ``within_s`` at most. Shielded: one given up
        still runs once the thread is free (a mark queued behind a slow one lands late, in order, rather
        than never; the client's own timeout, as long, frees the thread)."""
        future = asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)
        return await asyncio.wait_for(asyncio.shield(future), within_s)

    async def mark(self, partitions: Collection[int], releasing: bool) -> None:
        """Mark in the store that this worker begins (``releasing``) or has ended giving up
        ``partitions``. A store that refuses, or does not answer within ``MARK_WITHIN_S``, is logged
        and the handover goes on: the next holder then does not wait (the begin lost) or waits to its
        bound (the end lost)."""
        if not partitions:
            return
        membership = self.membership
        sent_at = membership.now() if membership is not None else 0.0
        try:
            await self._call(MARK_WITHIN_S, self.handovers.mark, self.holder, partitions, releasing)
        except Exception as exc:  # noqa: BLE001 - the store's: logged, the handover itself goes on
            log.warning("handover_mark_failed", partitions=list(partitions), releasing=releasing,
                        error=one_line(exc))  # fmt: skip
            return
        if membership is not None and releasing:
            membership.marked(sent_at)

    async def refresh(self, partitions: Collection[int], every_s: float, ended: asyncio.Event) -> None:
        """Mark ``partitions`` as still being given up every ``every_s`` until ``ended`` (:data:`REFRESH_S`).
        Ended by an event, not cancelled: Python 3.11's ``wait_for`` loses a cancellation that comes as the
        call it waits for ends."""
        while partitions and not ended.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ended.wait(), every_s)
            if not ended.is_set():
                await self.mark(partitions, releasing=True)

    async def wait(self, partitions: Collection[int], *, alive_s: float, wait_s: float,
                   stopping: Callable[[], bool]) -> None:  # fmt: skip
        """Until no other worker is giving up one of ``partitions``, or ``stopping()``. A handover whose
        latest mark is more than ``alive_s`` old is not waited for (its worker, which marks it again every
        :data:`REFRESH_S`, died or froze during it); none is waited for longer than ``wait_s`` (a store that
        cannot be read is asked again meanwhile)."""
        started = time.monotonic()
        waited_for: dict[int, list[str]] = {}
        pending: dict[int, list[str]] = {}
        while not stopping():
            releasing: dict[int, dict[str, float]] | None = None
            try:
                left = max(HANDOVER_POLL_S, wait_s - (time.monotonic() - started))
                releasing = await self._call(min(MARK_WITHIN_S, left), self.handovers.releasing, self.holder,
                                             partitions)  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - the store's: asked again until the wait is over
                log.warning("handover_read_failed", error=one_line(exc))
            seconds = round(time.monotonic() - started, 3)
            if releasing is not None:
                pending = {p: alive for p, holders in releasing.items()
                           if (alive := sorted(h for h, age in holders.items() if age < alive_s))}  # fmt: skip
                if not pending:  # each ended, or was marked last more than alive_s ago: those are still releasing
                    died = {p: unended for p, holders in waited_for.items()
                            if (unended := [h for h in holders if h in releasing.get(p, {})])}  # fmt: skip
                    if died:
                        log.warning("handover_not_ended", seconds=seconds, partitions=died,
                                    reason=f"marked last over {alive_s:g} s ago: its worker died or froze during it")  # fmt: skip
                    elif waited_for:
                        log.info("handover_awaited", seconds=seconds, partitions=waited_for)
                    return
                if not waited_for:
                    log.info("handover_awaiting", partitions=pending, holder=self.holder)
                for p, holders in pending.items():
                    waited_for[p] = sorted({*waited_for.get(p, []), *holders})
            if seconds >= wait_s:
                log.warning("handover_not_ended", seconds=seconds, partitions=pending,
                            reason=f"waited {wait_s:g} s: reading the partitions anyway, "
                                   "their previous holder may still write")  # fmt: skip
                return
            await asyncio.sleep(HANDOVER_POLL_S)
        if waited_for:
            log.info("handover_wait_given_up", seconds=round(time.monotonic() - started, 3), partitions=waited_for,
                     reason="a revocation or a stop")  # fmt: skip


async def _commit(app: faust.App, pipeline: Pipeline) -> None:
    """Commit what is acknowledged, unless the worker is stopping: the consumer commits at its
    stop, and its thread, stopping, cancels a commit in progress or never answers a new one
    (the revocation, which its stop waits for, would never end)."""
    if pipeline.stopping:
        return
    try:
        await app.consumer.commit()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if not pipeline.stopping or (task is not None and task.cancelling()):
            raise  # this handler's own cancellation, not the consumer thread's stop


async def _stop_acting(parts: WorkerParts) -> None:
    """Actions on incidents move with partition 0: stop acting, so no action is taken by two workers. A
    pass in progress is waited for, except while it waits on a cloud API with its lock released: the reset
    lands then, and the pass ends when the API answers, writing nothing more than that answer (a call's
    outcome: only this worker knows it; ``ActionRunner._moved``)."""
    parts.holds_partition_0 = False
    if parts.actions is not None:
        await asyncio.get_running_loop().run_in_executor(None, parts.actions.reset)
