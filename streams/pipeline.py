"""What the worker does with one batch of messages, apart from Faust.

Per batch: decode (bad messages to the dead-letter topic), align on event
time, detect; then, in a writer thread while the next batch is detected, write
the events, alert changes and the state of the keys the batch touched to
ClickHouse; then queue alert changes for Slack and acknowledge, in offset order,
the messages whose events are stored and detected. A crash re-reads what was
not acknowledged. Re-reading is safe: detector steps ignore samples they have
already seen and alert ids are deterministic, so nothing is alerted twice; the
store leaves out events it already holds (by content), so nothing is stored twice.

Failures are told apart: a message the store refuses is isolated (the batch is
split until the refused message is alone), dead-lettered with the reason, and the
partition goes on; a store that cannot be written at all is retried, never
dropped from, and reported as a stall (``/healthz``), which the worker turns into
an exit after a while so that an orchestrator restarts it.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import math
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import groupby
from operator import attrgetter
from typing import Any, Protocol, TypeVar, cast

import msgspec
import structlog

from detector.alerts import Alert, AlertManager
from detector.align import EventTimeAligner, HeldKeys, message_start
from detector.delivery import Outbox
from detector.engine import RULE_REMOVED, Engine
from detector.events import Event, InvalidMessage, RunEvent
from detector.metrics import METRICS
from detector.orphaned_alerts import known_rules, loaded_rules, resolutions, state_keys
from detector.outputs.outbox import OutputOutbox
from detector.pricing import Pricing
from detector.store import Store
from detector.store import states as _states
from detector.store.states import SavedTimes, States
from detector.units import one_line
from streams.acks import InOrderAcks
from streams.config import Config, LiveConfig
from streams.event_writer import MAX_REASON as _MAX_REASON
from streams.event_writer import EventWriter, NotMember, Prepared, StoreUnavailable, ThreadEventWriter
from streams.membership import Membership
from streams.progress import GroupProgress

__all__ = ["DEAD_LETTER_MAX_VALUE", "Dropped", "Message", "Pipeline", "PipelineStopped", "Stats", "StoreUnavailable",
           "dead_letter"]  # fmt: skip

log = structlog.get_logger("burnwatch.worker")
_json = msgspec.json.Encoder()

TP = tuple[str, int]
_INF = float("inf")
CAPPED_ALLOWANCE = 10
"""Times its share (``max_held_per_partition``) the partition holding a capped worker's watermark may hold
before it is paused for being far past the cap (:meth:`Pipeline._flow_control`): 20,000 messages by default
(some 160,000 events at the bench fleet's 8 a message), so that a worker stores ahead while another is
slower, and only a lead that would grow without bound is paused."""
DEAD_LETTER_MAX_VALUE = 512 << 10
"""Bytes of a refused message kept in its dead-letter record; a larger one is kept truncated
(with its size and SHA-256), so the record (base64) fits a broker's default 1 MB message limit."""


class Message(msgspec.Struct):
    """One Kafka message as the pipeline needs it, independent of the consumer library."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    """None: a tombstone (a record with no value), dead-lettered like any other non-event."""
    token: Any = None
    """What a consumer may need to acknowledge this message (the bulk consumer needs only the offset)."""
    generation: int | None = None
    """The consumer group generation it was fetched in (None: unknown, always current)."""


_topic_partition = attrgetter("topic", "partition")
_CPU_READ, _CPU_DETECT, _CPU_WRITE = (METRICS.cpu_seconds.labels(stage) for stage in ("read", "detect", "write"))
"""Where the worker's own CPU goes per batch (``/metrics``): the threads' CPU time, not the wall's."""
_LOOKUP_TIMEOUT_S = 30.0
"""How long a look-up in the store (the replay check, the state read) may take before it
counts as failed (and is retried)."""
_RESENT_STALL = 3
"""Tries of one batch refused for the membership's end (:class:`NotMember`), renewed each time, after which the
pipeline counts as stalled (/healthz): its inserts come later than a session after they are asked for."""
_A = TypeVar("_A")
_R = TypeVar("_R")
_STORE = "store"
"""A stall's cause: the store takes no write or answers no look-up."""
_MEMBERSHIP = "membership"
"""A stall's cause: a write has waited a session timeout for the group to answer a heartbeat."""
_DEAD_LETTER_TOPIC = "dead-letter topic"
"""A stall's cause: the dead-letter topic takes no record."""
_WORKER = f"{socket.gethostname()}/{os.getpid()}"
"""This worker, as the rule sets it records name it (for people reading ``rule_sets``)."""


class FetchQueue(Protocol):
    """What flow control reads of the consumer's queue of fetched messages (:class:`streams.bulk.Fetches`)."""

    on_queued: Callable[[], None] | None

    @property
    def queued(self) -> Mapping[TP, int]:
        """Messages fetched and not yet taken into a batch, by partition."""

    def holds_a_batch(self, tp: TP) -> bool:
        """Whether a batch's worth (messages or bytes) of ``tp`` is queued."""


class PipelineStopped(Exception):
    """The worker is stopping while a write waits for the store: nothing is acknowledged. Also raised
    to a look-up's caller that gave it up while the store failed (:meth:`Pipeline.ask_store`)."""


class Dropped(PipelineStopped):
    """The group dropped this worker (frozen past the session timeout) before a write: it is not made,
    and nothing is acknowledged. The partitions' holder reads the batch again (:mod:`streams.membership`)."""


async def _unless_given_up(asked: asyncio.Future[_R], given_up: Callable[[], bool], timeout_s: float | None) -> _R:
    """A read's answer, within ``timeout_s``; :class:`PipelineStopped` as soon as ``given_up()`` (checked
    every 0.1 s), the read left to finish unused (a store that hangs holds no revocation up)."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    while not (await asyncio.wait({asked}, timeout=0.1))[0]:
        if given_up():
            left: Exception = PipelineStopped()
        elif deadline is not None and loop.time() >= deadline:
            left = TimeoutError(f"no answer within {timeout_s:g} s")
        else:
            continue
        asked.add_done_callback(lambda f: f.cancelled() or f.exception())  # its error, if any, unused
        raise left
    return asked.result()


@dataclass
class Stats:
    messages: int = 0
    events: int = 0
    """Events decoded and stored."""
    detected: int = 0
    """Events released by the aligner to the detectors."""
    replayed: int = 0
    """Events read again that the loaded state already held: not detected twice."""
    read_ahead: int = 0
    """Quiet keys whose saved state was read back before their batch, together."""
    dead_letters: int = 0
    alerts_fired: int = 0
    alerts_resolved: int = 0
    batches: int = 0
    insert_s: float = 0.0
    partitions: int = 0
    """Input partitions assigned to this worker (0 until the group has settled)."""
    fetch_pauses: int = 0
    """Times a partition's fetching was paused for running ahead (flow control)."""
    started: float = field(default_factory=time.monotonic)


def dead_letter(message: Message, reason: str) -> bytes:
    """The dead-letter record: where the message came from, why it was refused, its bytes
    (the first :data:`DEAD_LETTER_MAX_VALUE` of them, with the size and hash of the whole)."""
    value = message.value or b""
    kept = value[:DEAD_LETTER_MAX_VALUE]
    return _json.encode(
        {
            "topic": message.topic,
            "partition": message.partition,
            "offset": message.offset,
            "key": message.key[:1024].decode("utf-8", "replace") if message.key else None,
            "reason": reason if len(reason) <= _MAX_REASON else reason[:_MAX_REASON] + "…",
            "size": len(value),
            "sha256": hashlib.sha256(value).hexdigest(),
            "truncated": len(kept) < len(value),
            "value_base64": base64.b64encode(kept).decode(),
            "value_preview": value[:500].decode("utf-8", "replace"),
        }
    )


@dataclass
class _Step:
    """One batch between detection and acknowledgement."""

    stored: list[tuple[Message, list[Event]]] = field(default_factory=list)
    """Each decoded message with its events: what the write stores."""
    keys: dict[str, int] = field(default_factory=dict)
    """The key of each event in :attr:`stored` → the partition it came on (the latest, as
    :attr:`Pipeline._partition_of` keeps it): the batch's keys, each once."""
    runs: list[tuple[TP, int, int]] = field(default_factory=list)
    """(partition, start, end) of each run of one partition's messages in :attr:`stored`: what
    the aligner takes in one call (:meth:`EventTimeAligner.push_many`)."""
    dead: list[tuple[Message, str]] = field(default_factory=list)
    """Messages that are not events (decoder's reason): dead-lettered, then done."""
    refused: list[tuple[Message, str]] = field(default_factory=list)
    """Messages whose events the store refused (filled by the write): dead-lettered; done
    once detection has seen them, like any other."""
    done: list[Message] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    states: list[tuple[str, int, bytes, float, bool]] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    """Keys whose state expired at this batch's sweep (:meth:`Pipeline._sweep`): their saved
    state is deleted by the batch's write, after its states are saved."""
    events: int = 0
    detected: int = 0
    messages: int = 0
    elsewhere: int = 0
    """Messages of partitions this worker no longer holds: left alone."""
    replayed: int = 0
    """Events read again after a restart or a handover that the loaded state already holds:
    stored (a no-op, by content) but not detected twice."""
    read_ahead: int = 0
    """Keys whose saved state was read before detection, together (:meth:`Pipeline._read_ahead`)."""
    stale: int = 0
    """Messages fetched before the last rebalance: left alone (read again from the committed offset)."""
    started: float = field(default_factory=time.perf_counter)
    decided_at: float = 0.0
    """Wall time detection decided the batch's alert changes (before they are stored): logged
    with each change, so the delay to a decision can be told from the delay to storing it."""
    per_topic: dict[str, list[int]] = field(default_factory=dict)
    """topic → [messages, events], for the metrics."""
    pricing: Pricing | None = None
    """The price list the batch was detected with: its stored rows are priced with it too."""
    prepared: Prepared | None = None
    """The event writer's preparation of :attr:`stored`'s insert, started once the batch is read."""
    progress: list[tuple[int, float, bool]] = field(default_factory=list)
    """The usage partitions' progress to record after the batch's events (:mod:`streams.progress`)."""
    generation: int | None = None
    """The group generation the progress was taken in."""


class Pipeline:
    def __init__(
        self,
        *,
        engine: Engine,
        store: Store,
        outbox: Outbox,
        manager: AlertManager,
        send_dead_letter: Callable[[bytes | None, bytes], Awaitable[None]],
        caught_up: Callable[[str, int, int], bool] = lambda topic, partition, offset: True,
        end_positions: Callable[[list[TP]], Awaitable[dict[TP, tuple[int | None, int | None]]]] | None = None,
        lateness_s: float = 60.0,
        config: LiveConfig | None = None,
        retry_max_s: float = 30.0,
        generation: Callable[[], int | None] = lambda: None,
        flow: Callable[[list[TP], list[TP]], None] | None = None,
        max_held_per_partition: int = 2000,
        outputs: OutputOutbox | None = None,
        saved_states: dict[str, bytes | None] | None = None,
        event_writer: EventWriter | None = None,
        partition_count: Callable[[str], int] | None = None,
        membership: Membership | None = None,
        event_expiry_days: int = 0,
    ) -> None:
        self.engine = engine
        self.event_expiry_days = event_expiry_days
        """The store's expiry of raw events, in days of event time (0: kept forever): what :meth:`_store_events`
        says of a batch older than it."""
        self._expiry_said_at = -math.inf
        self.membership = membership
        """This worker's hold on its partitions in the group: a batch is written only while it is held
        (:mod:`streams.membership`; None: always)."""
        self.event_writer = event_writer if event_writer is not None else ThreadEventWriter(store)
        """Where the events' insert runs: the writer thread, or a child process (:mod:`streams.event_writer`)."""
        self.saved_states = saved_states if saved_states is not None else {}
        """The states loaded at assignment that no key has taken yet (:meth:`States.load`): those
        loaded without their bytes are read before the batch that needs them (:meth:`_read_ahead`)."""
        self.saved_times: SavedTimes | None = None
        """The latest event time of the keys loaded at assignment (:meth:`States.load`): the sweeps
        reclaim those past the TTL still in :attr:`saved_states` (:meth:`_sweep`)."""
        self.store = store
        self.outbox = outbox
        self.outputs = outputs
        """The outputs besides Slack (webhook, Alertmanager, email), when configured."""
        self.manager = manager
        self.config = config or LiveConfig(Config.of(engine.ruleset))
        """The configuration in force: read at the start of each batch (:meth:`configure`)."""
        self._send_dead_letter = send_dead_letter
        self._caught_up = caught_up
        self._end_positions = end_positions
        self._generation = generation
        """The group generation now: a message fetched in an earlier one is stale (below)."""
        self.aligner: EventTimeAligner[Message] = EventTimeAligner(lateness_s)
        self.group = GroupProgress(store.progress, partition_count, lateness_s) if partition_count else None
        """With several workers (``partition_count``: a topic's, as the cluster has it), what this one records
        of its usage partitions and how far the others' let it release (:mod:`streams.progress`). None: not
        tracked."""
        self._partition_of: dict[str, int] = {}
        """Key → partition it arrived on, so its state is filed under that partition."""
        self.stats = Stats()
        self.outbox_ready = asyncio.Event()
        self.outputs_ready = asyncio.Event()
        self._outputs_routing: object = outputs.routing if outputs is not None else None
        """The routing last handed to the outputs (a reload hands over the new one)."""
        self._positions: dict[TP, int] = {}
        """Next expected offset per topic-partition: a jump or a rewind is logged."""
        self.ready = asyncio.Event()
        """Open while the pipeline may process: the worker closes it from a revocation until the
        new assignment's state is loaded, so no batch runs on state that is being replaced."""
        self.ready.set()
        self._assigned: set[TP] | None = None
        """Input partitions this worker holds (None: all, when nothing assigns them). A message
        of another, handed over before a rebalance, is left unacknowledged for its new holder."""
        self._expected: set[TP] = set()
        """Assigned partitions that have delivered nothing yet: they hold the watermark until
        they deliver or their position reaches their end offset (a condition, never a timeout)."""
        self._check_soon = asyncio.Event()
        """Set by :meth:`expect`: the release timer asks about the new partitions without waiting
        out its second (:meth:`tick_due`)."""
        self._moves = 0
        """Times the partitions moved (:meth:`reset`): an end-offset answer asked for before is stale."""
        self.holding: dict[TP, str] = {}
        """Partitions holding the watermark back, and why (for /healthz and the metrics)."""
        self._holding_logged: dict[TP, float] = {}
        self._acks: InOrderAcks[Message] = InOrderAcks()
        self._retry_max_s = retry_max_s
        self._stopping = threading.Event()
        self._orphans_due = True
        """The alerts left open by rules no longer loaded are to be resolved with the next batch
        (:meth:`_resolve_orphans`): at the start, after each assignment and after each reload."""
        self._rules_recorded: object = None
        """The rule set last recorded in the store as this worker's (``rule_sets``)."""
        self._stalls: dict[str, tuple[float, str]] = {}
        """What stalls the pipeline now, by cause (:data:`_STORE`, :data:`_MEMBERSHIP`, :data:`_DEAD_LETTER_TOPIC`):
        since when (monotonic) and why. Each cause's stall begins and ends on its own, from the event loop or the
        writer thread."""
        self._stalls_lock = threading.Lock()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clickhouse-writer")
        self._gave_up = False
        """A write gave up (the worker stopping while the store took none) or failed: the writes queued
        behind it are not made (:meth:`_write`). Read and set in the writer thread only."""
        self._dropped = False
        """The group dropped this worker while a write waited for its membership (:class:`Dropped`): the
        writes queued behind it, for the same partitions, are not made either, until :meth:`reset`."""
        self._inflight: asyncio.Future | None = None
        """The latest batch's write and what follows it (:meth:`_finish`)."""
        self._previous: asyncio.Future | None = None
        """The same of the batch before it, which may still be landing (:meth:`_drain_previous`)."""
        self._ack: Callable[[list[Message]], Awaitable[Any]] | None = None
        self._serial = asyncio.Lock()
        """The agent and the release timer both call :meth:`process`; one batch at a time."""
        self._flow = flow
        """``flow(pause, resume)``: stop and restart fetching from partitions (the consumer's)."""
        self.max_held_per_partition = max_held_per_partition
        self._capped_margin_s = max(3 * lateness_s, 60.0)
        """How far past the cap (event time) a capped worker's slowest partition is fetched beyond its share
        of messages (:meth:`_flow_control`): more than twice the lateness, which the argument that the group
        cannot stall needs."""
        self.paused: set[TP] = set()
        """Partitions not fetched from for now: far ahead in event time of the one that holds
        the watermark, with more than ``max_held_per_partition`` messages held by the aligner or on
        their way to it, or, capped by the other workers' progress, far past the cap (:meth:`_flow_control`)."""
        self._queue: FetchQueue | None = None
        """The consumer's queue of fetched messages (:meth:`watch`): flow control counts what it holds as held."""

    async def process(self, messages: Sequence[Message], ack: Callable[[list[Message]], Awaitable[Any]]) -> None:
        """Handle one batch. Detection runs now; the ClickHouse write runs in a writer
        thread while the next batch is detected. Once written, alert changes are queued
        for Slack and ``ack`` is called once with the messages that are now stored and fully
        seen by detection (the aligner may hold some back), in offset order per partition,
        each after every earlier message of its partition. At most two writes are in flight, in
        order: a batch is detected while the previous batch's write lands, and its own write
        starts once the one before that has landed, so a decision never waits behind a write."""
        while True:
            await self.ready.wait()
            async with self._serial:
                if not self.ready.is_set():
                    continue  # paused (a revocation) while this batch waited for its turn
                self._ack = ack
                cpu = time.thread_time()
                step = self._read(messages)
                step.pricing = self.engine.ruleset.pricing
                step.prepared = self.event_writer.prepare(step.stored, step.pricing)
                _CPU_READ.inc(time.thread_time() - cpu)
                await self._read_ahead(step)
                replays = self._maybe_replayed(step)
                held = await self._already_held(replays) if replays else set()
                cpu = time.thread_time()
                self._push(step, held)
                if self.group is not None and self.group.wanted(self.aligner.watermark):
                    _CPU_DETECT.inc(time.thread_time() - cpu)
                    await self._read_cap(self.group)
                    cpu = time.thread_time()
                self._detect(step)
                _CPU_DETECT.inc(time.thread_time() - cpu)
                if self._orphans_due:  # after the engine's own (a reload's, exact): the alert manager lets one through
                    await self._resolve_orphans(step)
                if self.engine.sweep_due:
                    await self.drain()  # every earlier batch's states have landed (eviction takes them as saved)
                    await self._sweep(step, "event_time")
                else:
                    await self._drain_previous()
                loop = asyncio.get_running_loop()
                write = loop.run_in_executor(self._writer, self._write, step)  # one writer thread: in order
                before = self._inflight
                self._previous, self._inflight = before, asyncio.ensure_future(self._finish(write, step, ack, before))
                return

    async def pause(self) -> None:
        """Take no batch until :attr:`ready` is set again, and wait for the batch being
        detected and the write in flight to land (a revocation: nothing may be written for
        partitions once their new holder may read them)."""
        self.ready.clear()
        async with self._serial:
            try:
                await self.drain()
            except PipelineStopped:
                pass  # a write or dead letter gave up as the worker stops: what it held is read again

    @property
    def positions(self) -> dict[TP, int]:
        """(topic, partition) → the next offset this worker will read (for consumer lag)."""
        return self._positions

    @property
    def stalled_since(self) -> float | None:
        """Monotonic time since which the pipeline has made no progress (None: it is not stalled): the
        earliest of the stalls now on (a store that takes no write, a write waiting for the group, a dead-letter
        topic that takes no record)."""
        with self._stalls_lock:
            stalls = list(self._stalls.values())
        return min(since for since, _ in stalls) if stalls else None

    @property
    def stall_reason(self) -> str:
        """Why, each stall now on, the earliest first ("" when none)."""
        with self._stalls_lock:
            stalls = sorted(self._stalls.values())
        return "; ".join(reason for _, reason in stalls)

    def stalled_for(self) -> float:
        """Seconds the pipeline has been unable to write (0: it is not stalled)."""
        since = self.stalled_since
        return 0.0 if since is None else time.monotonic() - since

    async def tick(self) -> None:
        """Re-check what holds the watermark and what the aligner holds when no batch comes
        (a quiet stream): partitions may have caught up since the last batch. A reload reaches
        the parts here too when no batch comes. Nothing once the worker is stopping (the
        consumer, stopping too, answers no more)."""
        if self._stopping.is_set():
            return
        if not self._serial.locked():
            self.configure()
        await self.check_expected()
        if len(self.aligner) and self._ack is not None and self.ready.is_set() and not self._serial.locked():
            await self.process([], self._ack)
        elif self.group is not None and self.group.held and self.ready.is_set() and not self._serial.locked():
            await self._record_progress(self.group)

    async def _record_progress(self, group: GroupProgress) -> None:
        """With nothing held to release, record what changed of the usage partitions held (one found
        to have nothing to read, or caught up since its last batch), in the writer thread: after the
        writes queued before it, so what it says is stored is. The others' release waits on it."""
        async with self._serial:
            if not self.ready.is_set():
                return
            self._mark_caught_up()
            step = _Step(progress=group.to_record(self.aligner), generation=self._generation())
            if step.progress:
                try:
                    await asyncio.get_running_loop().run_in_executor(self._writer, self._write, step)
                except PipelineStopped:
                    return

    async def _read_cap(self, group: GroupProgress) -> None:
        """Read how far the other workers' usage partitions are stored (off the event loop, as the
        other look-ups are): what this batch releases up to."""
        generation = self._generation()
        cap = await self._ask_store(lambda _: group.read(generation), None, "progress read",
                                    "reading the other workers' progress; retrying")  # fmt: skip
        group.update(cap, self.aligner.watermark)

    async def tick_due(self, interval_s: float) -> None:
        """Wait until the next :meth:`tick` is due: ``interval_s``, or less when partitions were
        just assigned. Until each new partition delivers or is found to have nothing to read, no
        event is decided: waiting out the second, one with nothing to read held the others' first
        events ~0.8 s longer (``bench/first_release.py``)."""
        try:
            await asyncio.wait_for(self._check_soon.wait(), interval_s)
        except asyncio.TimeoutError:
            pass
        self._check_soon.clear()

    async def check_expected(self) -> None:
        """Assigned partitions that have delivered nothing: each stops holding the watermark
        once where its reading starts (committed offset, else earliest) is its end offset (there
        is nothing to read). One that cannot report both keeps holding it, and says so. An answer
        that comes after the partitions moved (:meth:`reset`) is not used: it may be about a
        partition's previous assignment, before another worker read and committed it."""
        waiting = sorted(self._expected - self._positions.keys())
        self._expected.difference_update(self._positions.keys())
        self.holding = {tp: why for tp, why in self.holding.items() if tp in self._expected}  # delivered since
        if not waiting:
            METRICS.holding_partitions.set(len(self.holding))
            return
        moves = self._moves
        try:  # bounded: a broker that does not answer leaves the partitions holding, and says so
            found = await asyncio.wait_for(self._end_positions(waiting), 10.0) if self._end_positions else {}
        except Exception as exc:  # noqa: BLE001 - the broker may be unreachable for a while
            found = {}
            error = one_line(exc)
        else:
            error = ""
        if moves != self._moves:  # the partitions moved meanwhile: the next tick asks again
            return
        for tp in waiting:
            position, end = found.get(tp, (None, None))
            if tp in self._positions or tp not in self._expected:
                continue
            if position is not None and end is not None and position >= end:
                self._expected.discard(tp)
                self.holding.pop(tp, None)
                self.aligner.caught_up(tp)
                continue
            why = (f"reading starts at {position} < end offset {end}: not delivered yet"
                   if position is not None and end is not None
                   else f"start or end offset unknown{' (' + error + ')' if error else ''}")  # fmt: skip
            self.holding[tp] = why
            now = time.monotonic()
            if now - self._holding_logged.get(tp, -1e9) >= 30.0:  # logging only: alignment never reads the clock
                self._holding_logged[tp] = now
                log.warning("partition_holding_watermark", topic=tp[0], partition=tp[1], reason=why)
        METRICS.holding_partitions.set(len(self.holding))

    async def drain(self) -> None:
        """Wait for the writes in flight, if any, and their acknowledgements; then raise the first
        one's error, if one failed (both are awaited whatever the first did)."""
        futures = [f for f in (self._previous, self._inflight) if f is not None]
        self._previous = self._inflight = None
        for outcome in await asyncio.gather(*futures, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome

    async def _drain_previous(self) -> None:
        """Wait for the write before the latest, if any: once the next batch's write starts, two are
        in flight at most (with the batch being detected, three batches' events in memory)."""
        previous, self._previous = self._previous, None
        if previous is not None:
            await previous

    async def sweep(self) -> None:
        """The sweep on the wall clock, for a stream too quiet to move event time: between
        batches (none detected, none in flight), never while partitions move. Batches sweep by
        event time themselves (:meth:`process`). The expired keys' saved states are deleted by a
        write of their own, retried as a batch's is (:meth:`_write`) until the store takes it:
        a delete lost would leave the state in the store, loaded again at the next assignment."""
        if self._stopping.is_set():
            return
        async with self._serial:
            if not self.ready.is_set():
                return
            await self.drain()
            step = _Step()
            try:
                await self._sweep(step, "wall_clock")
                if step.expired or step.alerts:
                    # no write is queued behind this one (drained, under the lock): a failure here stops none
                    await asyncio.get_running_loop().run_in_executor(self._writer, self._write_until_stored, step)
            except PipelineStopped:
                return
            self._to_deliveries(step.alerts)
            self._count(step)

    async def _sweep(self, step: _Step, trigger: str) -> None:
        """Expire and evict (:meth:`Engine.expire`) once every state the engine holds is saved or in
        the write about to start: a key evicted now whose latest state that write carries is
        held as it left (:meth:`Engine.evict`) until the next sweep, which comes after the
        write has landed. A key whose next event the aligner holds is neither: expired, it would
        lose the partition it came on (its state saved under partition 0). The expired keys go in
        ``step.expired``, their saved state to be deleted: with the keys loaded at assignment that have
        not spoken and whose latest event is as far back (:attr:`saved_times`), which no engine holds.
        A key that is not reclaimed here, or whose delete a kill loses, is reclaimed by the sweeps
        of the worker that loads it next.

        An episode left open on an expired key is resolved (:meth:`~detector.engine.Engine.silent_resolutions`):
        the resolutions go in ``step.alerts``, stored by the same write that deletes the states, so a kill
        between loses neither (a state read again is resolved again, and the alert manager, which knows
        the stored resolution, drops the repeat). The states only in the store (evicted keys, keys loaded
        at assignment) that may hold an open episode (:meth:`Engine.may_be_open`, saved beside each state:
        a key that went quiet with nothing open is deleted unread) are read for it, with the partition each
        was saved under (its holder, this worker, delivers the resolution), in chunks (:meth:`_placed_states`):
        many keys may go quiet together."""
        engine = self.engine
        coming = HeldKeys(self.aligner)  # gathered only if a key has gone quiet
        expired = engine.expire(coming)  # their next event is read: not quiet
        ended = list(engine.last_ended)
        unread = list(engine.last_unread)
        if (times := self.saved_times) is not None:
            saved = self.saved_states
            for key in times.before(engine.watermark - engine.state_ttl_s, saved):
                if key not in coming:  # still loaded, not taken by the engine: never spoke
                    expired.append(key)
                    if times.may_be_open(key):  # (its bytes, if loaded with them, are read again for its partition)
                        unread.append(key)
                    del saved[key]
        why = "the states of keys reclaimed past their TTL, for the episodes left open on them"
        async for found in self._placed_states(unread, why):
            for key, (partition, data) in found.items():
                ended += engine.ended_in(key, data)
                self._partition_of.setdefault(key, partition)
        if ended:
            if not step.decided_at:  # (the wall clock's sweep: no batch decided before it)
                step.decided_at = time.time()
            alerts = self.manager.handle(ended)
            for alert in alerts:
                alert.partition = self._partition_of.get(alert.key, -1)
            step.alerts += alerts
            log.info("silent_episodes_resolved", alerts=len(alerts), keys=len({a.key for a in alerts}),
                     note="no events for the state TTL: resolved where their events stopped")  # fmt: skip
        self.forget(expired)
        step.expired = expired
        METRICS.sweeps.labels(trigger).inc()
        if expired or engine.last_evicted:
            log.info("state_swept", trigger=trigger, watermark=round(engine.watermark, 3), held=len(engine),
                     evicted=engine.last_evicted, expired=len(expired), out_of_memory=engine.evicted)  # fmt: skip

    async def _resolve_orphans(self, step: _Step) -> None:
        """Resolve the alerts still open in the store, of the partitions this worker holds, whose rule is no
        longer loaded (:mod:`detector.orphaned_alerts`: a rule removed while the worker was down, or by a
        reload while the key was evicted or not yet heard from), with the figures each last recorded. They
        go in ``step.alerts``, stored by the batch's write; one that a kill loses before is found open again
        at the next start. One the engine resolved in this batch, or one an earlier batch resolved whose
        write is still landing, is let through once by the alert manager."""
        partitions = None if self._assigned is None else {partition for _, partition in self._assigned}
        ruleset = self.engine.ruleset
        loaded, record = loaded_rules(ruleset), self._rules_recorded is not ruleset

        def look_up(_: None) -> tuple[list[Alert], dict[str, str] | None]:
            rule_sets = self.store.rule_sets
            if record:  # first: an alert of a rule only this worker loads is stored after it
                rule_sets.record(loaded, time.time(), _WORKER)
            newest = rule_sets.newest()
            return self.store.alerts.open_orphans(known_rules(loaded, newest), partitions), newest

        orphans, newest = await self._ask_store(look_up, None, "orphaned alerts read",
                                                "open alerts of rules no longer loaded; retrying")  # fmt: skip
        self._orphans_due, self._rules_recorded = False, ruleset
        uncarried = set(self.engine.settle_carried({n: t for n, t in (newest or {}).items() if n not in loaded}))
        if uncarried:  # saved again without the states of removed rules, carried till now (one row a key: a version each)
            step.states = [row for row in step.states if row[0] not in uncarried] + self._dirty_states()
        if not orphans:
            return
        alerts = self.manager.take(resolutions(orphans, RULE_REMOVED))  # (each keeps its partition: its holder posts)
        step.alerts += alerts
        dropped: dict[str, set[str]] = {}  # (a rule of the orphan's name, if loaded, is of another type: its state goes)
        for orphan in orphans:
            for key in state_keys(orphan):
                dropped.setdefault(key, set()).add(orphan.rule)
        await self._rewrite_states(dropped)
        step.states += self._dirty_states()  # (after the batch's: these keys were not held, so not among them)
        log.info("orphaned_alerts_resolved", alerts=len(alerts), rules=sorted({a.rule for a in alerts}),
                 note="open alerts of rules no longer loaded: resolved with the figures each last recorded")  # fmt: skip

    async def _rewrite_states(self, keys: Mapping[str, set[str]]) -> None:
        """Save again, under the rules in force, the states of the orphans' keys that this worker does not hold
        (evicted, or loaded at its assignment and not heard from): they still hold the removed rule's open
        episode, which a rule put back would resume under the alert id just resolved (:meth:`Engine.rewrite`).
        ``keys``: key → the orphaned alerts' rules, whose states are dropped though a rule of the name is loaded
        (of another type). Read with the partition each was saved under, which it is saved under again, in
        chunks (:meth:`_placed_states`): a rule removed with many incidents open reads many keys."""
        engine, saved = self.engine, self.saved_states
        wanted = sorted({*engine.evicted_among(keys), *(key for key in keys if key in saved)})
        async for found in self._placed_states(wanted, "the states of keys whose rule was removed; retrying"):
            snapshots = {}
            for key, (partition, data) in found.items():
                self._partition_of.setdefault(key, partition)
                saved.pop(key, None)
                snapshots[key] = data
            engine.rewrite(snapshots, keys)

    async def _placed_states(self, keys: Sequence[str], why: str) -> AsyncIterator[dict[str, tuple[int, bytes]]]:
        """The saved states of ``keys`` with the partition each was saved under (``States.get_many_placed``), read
        off the event loop a look-up of its own for each :data:`GET_MANY_CHUNK` keys: many keys read in one would
        pass the look-up's bound at every try, and stall the pipeline under the batch lock."""
        for i in range(0, len(keys), _states.GET_MANY_CHUNK):
            yield await self._ask_store(self.store.states.get_many_placed, keys[i : i + _states.GET_MANY_CHUNK],
                                        "state read", why)  # fmt: skip

    def forget(self, keys: Iterable[str]) -> None:
        """Keys whose state expired: what the pipeline keeps per key goes too."""
        for key in keys:
            self._partition_of.pop(key, None)

    def stop(self) -> None:
        """The worker is stopping: a write waiting for the store gives up (unacknowledged), and
        no batch is taken again (:meth:`resume` is refused)."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        """The worker is stopping (:meth:`stop`): an assignment finishing now hands nothing on."""
        return self._stopping.is_set()

    def resume(self) -> bool:
        """Take batches again (the new assignment's state is loaded), unless the worker is
        stopping: an assignment that finishes during a stop must not undo its pause."""
        if self._stopping.is_set():
            return False
        self.ready.set()
        return True

    def configure(self) -> Config:
        """The snapshot in force, handed to the parts that keep their own reference to it (each
        only when it has another): the engine (its rules; state moves to changed rules), the
        alert manager (routes, silences, realert) and Slack's notifier (mentions, links)."""
        config = self.config.current
        if self.engine.ruleset is not config.ruleset:
            self.engine.set_ruleset(config.ruleset)
            self._orphans_due = True  # (recorded with the next batch, for the other workers to know it)
        if self.manager.ruleset is not config.ruleset:
            self.manager.ruleset = config.ruleset
        notifier = self.outbox.notifier
        if notifier is not None and notifier.routing is not config.routing:
            notifier.routing = config.routing
            notifier.routed_to(config.ruleset.channels)
        if self.outputs is not None and self._outputs_routing is not config.routing:
            self._outputs_routing = config.routing
            self.outputs.configure(config.routing)
            self.outputs_ready.set()
        return config

    def _read(self, messages: Sequence[Message]) -> _Step:
        """Decode a batch and track positions; messages of partitions held elsewhere, or fetched
        before the last rebalance, are left alone."""
        step = _Step()
        decode = self.configure().decoder.decode
        positions = self._positions
        keys = step.keys  # into _partition_of once the batch is read
        per_topic = step.per_topic
        assigned = self._assigned
        generation = self._generation()
        stored, dead = step.stored, step.dead
        # A fetch hands over each partition's messages together: what is the same for a
        # partition is looked up once per run of its messages, not once per message.
        for tp, run in groupby(messages, key=_topic_partition):
            if assigned is not None and tp not in assigned:
                step.elsewhere += sum(1 for _ in run)  # its partition moved on: its new holder reads it
                continue
            topic, partition = tp
            counts = per_topic.get(topic)
            if counts is None:
                counts = per_topic[topic] = [0, 0]
            expected = positions.get(tp)
            taken: list[Message] = []
            start = len(stored)
            events = 0
            for message in run:
                fetched_in = message.generation
                if fetched_in != generation and fetched_in is not None and generation is not None:
                    # Fetched before the last rebalance (a batch being gathered, or waiting for the
                    # pause to end): the consumer reads the partition again from its committed
                    # offset, so taking it now would run detection ahead of that and then rewind.
                    step.stale += 1
                    continue
                offset = message.offset
                if expected != offset:
                    log.info("partition_position", topic=topic, partition=partition, offset=offset, expected=expected)
                expected = offset + 1
                taken.append(message)
                try:
                    decoded = decode(topic, message.value)
                except InvalidMessage as exc:
                    dead.append((message, exc.reason))
                    continue
                if len(decoded) == 1:  # the message of one event that many exporters send
                    keys[decoded[0].key] = partition
                    events += 1
                else:
                    for event in decoded:
                        keys[event.key] = partition
                    events += len(decoded)
                stored.append((message, decoded))
            counts[1] += events  # the run's, counted once
            step.events += events
            if len(stored) > start:
                step.runs.append((tp, start, len(stored)))
            if taken:
                counts[0] += len(taken)
                positions[tp] = taken[-1].offset + 1
                self._acks.received(tp, taken)
        self._partition_of.update(keys)
        step.messages = len(messages) - step.elsewhere - step.stale
        if step.elsewhere:
            log.info("messages_left_to_new_holder", messages=step.elsewhere)
        if step.stale:
            log.info("stale_messages_left", messages=step.stale, generation=generation,
                     note="fetched before the last rebalance; read again from the committed offset")  # fmt: skip
        return step

    def _maybe_replayed(self, step: _Step) -> list[Event]:
        """Events no later than their key's restored state: read again after a restart or a
        handover (or re-sent). Which of them that state holds is asked of the store. No event is
        looked at when every key of the batch is held and none was restored (nothing can be)."""
        if not self.engine.may_have_seen(step.keys):
            return []
        seen = self.engine.already_seen
        return [e for _, decoded in step.stored for e in decoded if seen(e.ts.timestamp(), e)]

    async def _read_ahead(self, step: _Step) -> None:
        """Read in one query, off the event loop, the saved states the batch's keys will need
        from the store: keys evicted while quiet, and keys loaded at assignment without their
        bytes. Otherwise each would be one look-up on the event loop at its first event (after
        an outage, thousands of keys waking in one batch)."""
        engine, saved = self.engine, self.saved_states
        if not (engine.evicted or saved) or not step.stored:
            return
        keys = set(step.keys)
        for _, decoded in step.stored:  # a run's hosts are looked up by its detectors
            keys.update(rid for event in decoded if type(event) is RunEvent for rid in event.resource_ids)
        evicted, lazy = engine.unread(keys), States.unread(saved, keys)
        if not evicted and not lazy:
            return
        found = await self._ask_store(self.store.states.get_many, evicted + lazy, "state read",
                                      "reading quiet keys' saved states; retrying")  # fmt: skip
        engine.read_ahead({key: found.get(key) for key in evicted})
        States.fill(saved, lazy, found)
        step.read_ahead = len(evicted) + len(lazy)

    async def _already_held(self, events: list[Event]) -> set[int]:
        """The ``id()`` of each of these events the store holds, asked off the event loop."""
        stored = await self._ask_store(self.store.events.stored, events, "replay check",
                                       "looking up events read again; retrying")  # fmt: skip
        return {id(event) for event, held in zip(events, stored, strict=True) if held}

    async def _ask_store(self, look_up: Callable[[_A], _R], arg: _A, what: str, note: str) -> _R:
        """``look_up(arg)`` off the event loop, as :meth:`ask_store` asks, bounded: a look-up that
        hangs must not hold the batch lock through a revocation."""
        return await self.ask_store(functools.partial(look_up, arg), what, note, timeout_s=_LOOKUP_TIMEOUT_S)

    async def ask_store(self, look_up: Callable[[], _R], what: str, note: str, *, timeout_s: float | None = None,
                        given_up: Callable[[], bool] = lambda: False, read_only: bool = False) -> _R:  # fmt: skip
        """``look_up()`` off the event loop. A store that cannot answer (or not within ``timeout_s``)
        stalls the pipeline as a failed write does (retried with backoff, /healthz says stalled, the
        worker exits past ``BURNWATCH_STALL_EXIT_S``), until it answers, or the worker stops or the
        caller gives the look-up up (:class:`PipelineStopped`; a stall this look-up began ends): between
        two tries, or, ``read_only``, at once, the try in progress left to finish unused."""
        backoff = 0.5
        loop = asyncio.get_running_loop()
        began: float | None = None
        """When the stall this look-up began began (None: it began none)."""
        while True:
            try:
                asked = loop.run_in_executor(None, look_up)
                if read_only:
                    answer = await _unless_given_up(asked, given_up, timeout_s)
                else:
                    answer = await asyncio.wait_for(asked, timeout_s)
            except Exception as exc:  # noqa: BLE001 - a client, a driver or the server may raise
                if self._stopping.is_set() or given_up():
                    self._give_up_stall(began, what)
                    raise PipelineStopped from exc
                error = one_line(exc)
                began = self._store_stalled(error, f"{what}: {error}", note=note) or began
                try:
                    await self._wait_or_stop(backoff, given_up)
                except PipelineStopped:
                    self._give_up_stall(began, what)
                    raise
                backoff = min(backoff * 2, self._retry_max_s)
                continue
            self._store_available()
            return answer

    def _give_up_stall(self, began: float | None, what: str) -> None:
        """A look-up given up while the store failed: the stall it began at ``began`` is no longer waited on (a
        revocation: nothing asks the store until the next assignment, and the stall exit must not
        fire for a question nobody asks)."""
        if began is not None and self._stall_began(_STORE) == began and not self._stopping.is_set():
            log.info("store_stall_given_up", what=what, stalled_s=round(self.stalled_for(), 1))
            self._end_stall(_STORE, began)

    def _stall_began(self, cause: str) -> float | None:
        """When ``cause``'s stall now on began (None: none is on)."""
        stall = self._stalls.get(cause)
        return None if stall is None else stall[0]

    def _end_stall(self, cause: str, began: float | None) -> None:
        """``cause``'s stall begun at ``began`` (:meth:`_begin_stall`'s answer) is over, unless another began since."""
        with self._stalls_lock:
            if began is not None and self._stall_began(cause) == began:
                del self._stalls[cause]

    def _store_stalled(self, error: str, reason: str, note: str) -> float | None:
        """The store took no write or answered no look-up: /healthz and the stall exit apply from the first
        failure (logged once per stall). Returns when the stall began if this call began it (for
        :meth:`_end_stall`), else None."""
        return self._stalled(_STORE, reason, "store_unavailable", error=error, note=note)

    def _stalled(self, cause: str, reason: str, event: str, error: str, note: str) -> float | None:
        """:meth:`_begin_stall`, logging ``event`` at error when this call began the stall (once per stall)."""
        began = self._begin_stall(cause, reason)
        if began is not None:
            log.error(event, error=error, note=note)
        return began

    def _begin_stall(self, cause: str, reason: str) -> float | None:
        """No progress until ``cause`` clears (for ``reason``, which replaces the one it had): /healthz and the
        stall exit apply from its first moment. Returns when the stall began if this call began it (for
        :meth:`_end_stall`), else None."""
        with self._stalls_lock:
            stall = self._stalls.get(cause)
            if stall is None:
                began = time.monotonic()
                self._stalls[cause] = (began, reason)
                return began
            self._stalls[cause] = (stall[0], reason)
            return None

    def _store_available(self) -> None:
        """The store answered again: its stall, if one is on, is over (another cause's is not)."""
        with self._stalls_lock:
            stall = self._stalls.pop(_STORE, None)
        if stall is not None:
            log.info("store_available", stalled_s=round(time.monotonic() - stall[0], 1))

    async def _wait_or_stop(self, seconds: float, given_up: Callable[[], bool] = lambda: False) -> None:
        """Back off for ``seconds``, or less if the worker stops or the caller gives up (:class:`PipelineStopped`)."""
        deadline = time.monotonic() + seconds
        while not self._stopping.is_set() and not given_up():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, 0.1))
        raise PipelineStopped

    def _push(self, step: _Step, held: set[int]) -> None:
        """Hand the batch's events to the aligner, except those the restored state already holds (no
        later than it, and stored: ``held`` has their ``id()``): those are done (:attr:`_Step.done`)."""
        aligner = self.aligner
        already_done = step.done
        stored = step.stored
        if not held:  # nothing read again: each partition's run of messages is pushed whole
            for tp, start, end in step.runs:
                aligner.push_many(tp, stored[start:end])
        else:
            for message, decoded in stored:
                tp = (message.topic, message.partition)
                fresh = [e for e in decoded if id(e) not in held]
                step.replayed += len(decoded) - len(fresh)
                begins = message_start(decoded)  # the whole message's start moves its source
                if not fresh:  # every event read again: done, and its time still counts
                    aligner.advance(tp, begins)
                    already_done.append(message)
                    continue
                aligner.push(tp, fresh, message, start=begins)
        self._mark_caught_up()

    def _mark_caught_up(self) -> None:
        """Tell the aligner which partitions that have delivered have nothing more to read now."""
        aligner = self.aligner
        for (topic, partition), next_offset in self._positions.items():
            aligner.caught_up((topic, partition), self._caught_up(topic, partition, next_offset - 1))

    def _detect(self, step: _Step) -> None:
        """Run detection on what the aligner releases (up to the other workers' progress, where
        :attr:`group` caps it); hold what is ahead of event time."""
        aligner = self.aligner
        group = self.group
        if group is not None:
            step.progress, step.generation = group.to_record(aligner), self._generation()
        before = len(aligner)  # events, not items (a message's samples of a host at a time are one item)
        events, released = aligner.release() if group is None else aligner.release(cap=group.cap)
        self._flow_control()
        step.done += released
        step.detected = before - len(aligner)  # (counted once, by the release)
        step.alerts = self.manager.handle(self.engine.process_timed(events))
        step.decided_at = time.time()
        partition_of = self._partition_of
        for alert in step.alerts:  # whoever holds this partition delivers it
            alert.partition = partition_of.get(alert.key, -1)
        step.states = self._dirty_states()
        if step.replayed:
            log.info("replayed_events_skipped", events=step.replayed,
                     note="read again after a restart or handover; the restored state holds them")  # fmt: skip

    async def _finish(self, write: Awaitable[float], step: _Step, ack: Callable[[list[Message]], Awaitable[Any]],
                      before: Awaitable[None] | None = None) -> None:  # fmt: skip
        """Once the batch is stored (and the batch ``before`` it is done), queue its alert changes
        for delivery, dead-letter what it refused and acknowledge what is done: in batch order."""
        stats = self.stats
        try:
            stats.insert_s += await write
        except PipelineStopped:
            return  # nothing acknowledged: read again after the restart
        if before is not None:
            try:
                await before  # its alerts queued and its messages acknowledged first
            except BaseException:  # noqa: BLE001 - raised where it is drained; this batch is not done either
                return
        self._to_deliveries(step.alerts)
        for message, reason in step.dead + step.refused:
            await self._dead_letter(message, reason)
        finished = self._acks.done([message for message, _ in step.dead] + step.done)
        if finished:
            await ack(finished)
        for topic, (n_messages, n_events) in step.per_topic.items():
            METRICS.messages.labels(topic).inc(n_messages)
            METRICS.events.labels(topic).inc(n_events)
        METRICS.dead_letters.inc(len(step.dead) + len(step.refused))
        if step.messages:
            METRICS.batch_seconds.observe(time.perf_counter() - step.started)
        stats.batches += 1
        stats.messages += step.messages
        stats.events += step.events
        if step.refused:
            refused = {id(message) for message, _ in step.refused}
            stats.events -= sum(len(events) for message, events in step.stored if id(message) in refused)
        stats.detected += step.detected
        stats.replayed += step.replayed
        stats.read_ahead += step.read_ahead
        stats.dead_letters += len(step.dead) + len(step.refused)
        self._count(step)

    def _to_deliveries(self, alerts: list[Alert]) -> None:
        """Stored alert changes to their deliveries: Slack's outbox and the other outputs."""
        self.outbox.add(alerts)
        if self.outbox.has_work:
            self.outbox_ready.set()
        if self.outputs is not None:
            self.outputs.add(alerts)
            if self.outputs.has_work:
                self.outputs_ready.set()

    def _count(self, step: _Step) -> None:
        """The alert changes of a stored step in the metrics, the stats and the log."""
        stats = self.stats
        for alert in step.alerts:
            METRICS.alerts.labels(alert.type, alert.change).inc()
            if alert.change == "fired":
                stats.alerts_fired += 1
            elif alert.change == "resolved":  # (a withdrawal or correction after it is the same alert's: not counted again)
                stats.alerts_resolved += 1
            if alert.change != "updated":  # alert_fired, alert_resolved, alert_withdrawn, alert_corrected
                log.info(f"alert_{alert.change}", alert_id=alert.alert_id, summary=alert.summary(),
                         silenced=alert.silenced or None, decided_at=round(step.decided_at, 3))  # fmt: skip

    async def _dead_letter(self, message: Message, reason: str) -> None:
        """Send the dead-letter record; a failed send is retried (the message stays unacknowledged)."""
        record = dead_letter(message, reason)
        backoff = 0.5
        began: float | None = None
        while True:
            try:
                await self._send_dead_letter(message.key, record)
                break
            except Exception as exc:  # noqa: BLE001 - the broker's errors are many; all mean "not sent"
                log.error("dead_letter_send_failed", topic=message.topic, partition=message.partition,
                          offset=message.offset, error=one_line(exc), retry_in_s=backoff)  # fmt: skip
                if self._stopping.is_set():
                    raise PipelineStopped from exc
                # No progress past this message: /healthz and the exit apply.
                began = self._begin_stall(_DEAD_LETTER_TOPIC, f"dead-letter topic: {one_line(exc)}") or began
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._retry_max_s)
        self._end_stall(_DEAD_LETTER_TOPIC, began)  # a store stall on meanwhile is not this one's to end
        log.warning("dead_letter", topic=message.topic, partition=message.partition, offset=message.offset,
                    reason=reason[:_MAX_REASON])  # fmt: skip

    def expect(self, partitions: Iterable[TP]) -> None:
        """Newly assigned input partitions: each holds the watermark until it delivers or is
        found to have nothing to read (:meth:`check_expected`)."""
        if self._assigned is None:
            self._assigned = set()
        for tp in partitions:
            self._assigned.add(tp)
            self._expected.add(tp)
            self.aligner.expect(tp)
        if self.group is not None:
            self.group.assign(self._assigned)
        self._check_soon.set()

    def reset(self) -> None:
        """Partitions moved: drop every key's cached state (it reloads from the store) and
        whatever the aligner holds (unacknowledged, so it is read again by the new owner)."""
        self._moves += 1
        self._orphans_due = True  # (the partitions taken over may hold alerts of rules removed meanwhile)
        self._dropped = False  # (the writes of the partitions dropped have all given up: drained before this)
        self.engine.forget_all()
        self.saved_times = None
        self._partition_of.clear()
        self._positions.clear()
        self._expected.clear()
        if self._assigned is not None:
            self._assigned.clear()
        self.holding.clear()
        self.aligner.clear()
        if self.group is not None:
            self.group.assign(set())
        self._acks.clear()
        if self.paused and self._flow is not None:
            self._flow([], sorted(self.paused))
        self.paused.clear()

    def watch(self, queue: FetchQueue) -> None:
        """Count what ``queue`` holds, fetched and not yet taken into a batch, as held, and decide as
        each fetch is queued (:meth:`fetched`)."""
        self._queue = queue
        queue.on_queued = self.fetched

    def fetched(self) -> None:
        """A fetch was queued: pause the partitions that now have more than their share held or coming,
        before the consumer fetches again. Deciding only once a batch, after its push, let a partition
        take in the queue's two batches' worth first: a worker alone catching up held several times its
        partitions' shares (docs/performance.md, Memory). Nothing is resumed here: what a batch has taken
        and not yet pushed is counted nowhere until its push, after which :meth:`_detect` decides."""
        if self.ready.is_set():  # not between a revocation and the next assignment's state
            self._flow_control(may_resume=False)

    def _flow_control(self, may_resume: bool = True) -> None:
        """Stop fetching from partitions far ahead of the one that holds the watermark, and fetch
        from them again once they are not: a consumer catching up reads partitions unevenly (a
        fetch may bring thousands of messages of one), and what runs ahead only waits in the
        aligner, re-sorted with every batch, while the partition behind waits for its turn
        (Kafka Streams pauses a partition past 1,000 buffered records for the same reason).
        What a partition has fetched and not yet taken into a batch (:meth:`watch`) counts as held: the
        consumer fetches on while a batch is processed. The partition that holds the watermark is not
        paused for what it holds, so the watermark always moves; uncapped, it is paused once a batch's worth
        of it is queued (:meth:`FetchQueue.holds_a_batch`), until those messages are pushed: once they are, either it
        holds the watermark still, and is fetched again, or it has passed another, which now holds it and
        is fetched. What it takes in while behind, it holds once it has passed the others: unpaused, it
        took in up to the consumer's whole queue (two batches). Paused at four times its share of messages
        instead, a stream of one-event messages ran 25 % slower (docs/performance.md, Memory). A partition
        no longer assigned is not paused: what was fetched of it before it moved may still be queued.

        Capped by the other workers' progress (:mod:`streams.progress`), what runs ahead waits however far
        the watermark goes, so the slowest partition too is paused once it holds more than
        :data:`CAPPED_ALLOWANCE` times its share and is more than :attr:`_capped_margin_s` of event time
        past the cap, and fetched again once within half of it: what a capped worker holds is bounded (a
        partition's share, the slowest's allowance, or the margin's span, whichever is more), not growing
        with the other workers' lag. The allowance lets a worker store ahead while another is slower:
        paused at its share, it made a catch-up with a slow partner slower (docs/performance-log.md, "What a
        capped worker holds"). It cannot stall the group: the cap is at least the least time of the other
        workers' slowest partitions, as last recorded, less the lateness, and half the margin is more
        than the lateness, so the partition furthest behind of all is fetched by whoever holds it
        (docs/architecture.md)."""
        if self._flow is None:
            return
        aligner, limit, queue, assigned = self.aligner, self.max_held_per_partition, self._queue, self._assigned
        coming = cast(dict[TP, int], dict(aligner.held_by_source))  # held, and fetched on its way
        if queue is not None:
            for tp, n in queue.queued.items():
                coming[tp] = coming.get(tp, 0) + n
        slowest = aligner.slowest()
        # Uncapped (cap inf), the slowest is never far past it: paused for what it has queued, never for its time.
        cap = self.group.cap if self.group is not None else _INF
        margin, allowance = self._capped_margin_s, CAPPED_ALLOWANCE * limit
        pause: list[TP] = []
        for tp, n in coming.items():
            if n <= limit or tp in self.paused or (assigned is not None and tp not in assigned):
                continue  # within its share, paused already, or fetched before its partition moved away
            if (tp != slowest or (cap == _INF and queue is not None and queue.holds_a_batch(tp))
                    or (n > allowance and aligner.progress(tp)[0] > cap + margin)):  # fmt: skip
                pause.append(tp)
        resume = [tp for tp in self.paused if coming.get(tp, 0) <= limit // 2
                  or (tp == slowest and aligner.progress(tp)[0] <= cap + margin / 2)] if may_resume else []  # fmt: skip
        if pause or resume:
            self.paused.difference_update(resume)
            self.paused.update(pause)
            self.stats.fetch_pauses += len(pause)
            self._flow(pause, resume)

    def _dirty_states(self) -> list[tuple[str, int, bytes, float, bool]]:
        engine, states = self.engine, []
        for key in engine.dirty:
            snapshot = engine.snapshot(key)
            if snapshot is not None:
                states.append((key, self._partition_of.get(key, 0), snapshot, engine.latest_time(key),
                               engine.may_be_open(key)))  # fmt: skip
        engine.dirty.clear()
        return states

    def _write(self, step: _Step) -> float:
        """Events, then alert changes (an alert is stored before it can be delivered), then
        the state that reflects them: all before the batch's messages are acknowledged.
        Runs in the writer thread; returns the seconds it took. A store that takes no write
        is retried with backoff until it does or the worker stops (:class:`PipelineStopped`). Once one
        has given up so, or failed (an error the worker stops on), no later one is written: the batch
        queued behind it was detected on the state the lost one left, and storing it (its events, its
        state) would have a restart skip or fold in twice what the lost one held."""
        if self._gave_up:
            raise PipelineStopped
        if self._dropped:
            raise Dropped
        try:
            return self._write_until_stored(step)
        except Dropped:
            self._dropped = True
            log.warning("write_dropped", messages=step.messages, events=step.events, alerts=len(step.alerts),
                        note="the group dropped this worker: neither this batch nor those behind it are written "
                             "or acknowledged; the partitions' holder reads them again")  # fmt: skip
            raise
        except BaseException:
            self._gave_up = True
            raise

    def _while_member(self) -> None:
        """Return once this worker holds its membership of the group (at once, but after a freeze longer
        than the session timeout); raise :class:`Dropped` if a revocation finds it dropped meanwhile, or
        :class:`PipelineStopped` if it stops (:mod:`streams.membership`)."""
        membership = self.membership
        if membership is None or membership.held():
            return
        if not membership.lost:
            # (at info while within the session timeout: a join longer than the session less the margin, before
            # the first heartbeat's answer, or heartbeats a little late; at warning past it, a freeze)
            unconfirmed = membership.unconfirmed_s()
            (log.warning if unconfirmed >= membership.session_timeout_s else log.info)(
                "write_awaiting_membership", unconfirmed_s=round(unconfirmed, 3),
                note="no heartbeat answered within the session timeout less a margin: written once the group is "
                     "known to hold this worker still")  # fmt: skip
            # A wait past a session is a stall (/healthz 503, the stall exit), as a store that takes no write is,
            # of its own cause: the wait's end (held, dropped or stopping) ends it, not the store answering.
            began: float | None = None
            try:
                while (held := membership.wait_held(self._stopping, timeout_s=membership.session_timeout_s)) is None:
                    began = self._stalled(_MEMBERSHIP, "membership unconfirmed: no heartbeat answered",
                                          "membership_unconfirmed",
                                          error=f"no heartbeat answered for {membership.unconfirmed_s():.1f} s",
                                          note="the broker or its group coordinator unreachable, or the worker starved") \
                        or began  # fmt: skip
            finally:
                self._end_stall(_MEMBERSHIP, began)
            if held:
                log.info("membership_confirmed", unconfirmed_s=round(membership.unconfirmed_s(), 3))
                return
        if membership.lost:
            raise Dropped
        raise PipelineStopped

    def _write_until_stored(self, step: _Step) -> float:
        """The batch's write, retried until the store takes it (:meth:`_write`; the sweep's too). Dropped (the
        group moved on): a store stall it began is over with it (the partitions' holder writes the batch)."""
        started, cpu = time.perf_counter(), time.thread_time()
        backoff = 0.5
        resent = 0
        version = time.time_ns()
        began: float | None = None
        """When the store stall this write began began (None: it began none)."""
        try:
            while True:
                try:
                    self._while_member()  # (before each part: a freeze may come between two)
                    step.refused = self._store_events(step)
                    step.prepared = None  # stored: its encoded rows are not held until the batch is done
                    if step.alerts:
                        self._while_member()
                        self._write_own(lambda: self.store.alerts.record(step.alerts, version=version))
                    self._while_member()
                    self._write_own(lambda: self.store.states.save(step.states, version=version))
                    if step.expired:
                        self._write_own(lambda: self.store.states.delete(step.expired))
                    if step.progress and (group := self.group) is not None:  # after the events it says are stored
                        self._while_member()
                        self._write_own(lambda: group.record(step.progress, version, step.generation))
                except NotMember:  # frozen while the write was under way: sent again once the group holds it still
                    self._while_member()
                    resent += 1
                    log.info("write_sent_again", times=resent,
                             note="the membership ran out before an insert was sent, and was renewed since")  # fmt: skip
                    if resent >= _RESENT_STALL:  # renewed each time, yet the insert comes later still: a store that slow
                        began = self._store_stalled("inserts sent after the membership's end",
                                                    "store too slow for the membership",
                                                    note="retrying; nothing is acknowledged until stored") or began  # fmt: skip
                    continue
                except StoreUnavailable as exc:
                    began = self._store_stalled(str(exc), str(exc), note="retrying; nothing is acknowledged until stored") \
                        or began  # fmt: skip
                    if self._stopping.wait(backoff):
                        raise PipelineStopped from exc
                    backoff = min(backoff * 2, self._retry_max_s)
                    continue
                self._store_available()
                _CPU_WRITE.inc(time.thread_time() - cpu)
                return time.perf_counter() - started
        except Dropped:
            self._end_stall(_STORE, began)
            raise

    def _write_own(self, write: Callable[[], Any]) -> None:
        """Write rows burnwatch made (alerts, state): a failure is the store's, never the data's. A store
        found writable after the failure may have just come back (a failure, then the probe): the write is
        tried once more before its error is taken for what it says."""
        try:
            write()
        except Exception as exc:
            if not self.store.writable():
                raise StoreUnavailable(one_line(exc)) from exc
            try:
                write()
            except Exception as again:
                if not self.store.writable():
                    raise StoreUnavailable(one_line(again)) from again
                raise

    def _say_past_expiry(self, items: Sequence[tuple[Any, Sequence[Any]]]) -> None:
        """Say, at most hourly, that the events being stored are older than the store keeps raw events: a
        replay of last quarter into a store with the default 30 days was detected and alerted on, and its
        events were gone at the next merge, with nothing said. One event a batch is looked at."""
        if not self.event_expiry_days:
            return
        now = time.time()
        events = items[0][1]
        if not events or now - self._expiry_said_at < 3600.0:
            return
        oldest_kept = now - self.event_expiry_days * 86_400.0
        if events[0].ts.timestamp() < oldest_kept:
            self._expiry_said_at = now
            log.warning("events_past_expiry", event_time=events[0].ts.isoformat(), expiry_days=self.event_expiry_days,
                        note="the store deletes raw events this many days after their event time, so these go at its "
                             "next merge (alerts, rollups and the waste ledger stay); to keep a replay of older events, "
                             "set BURNWATCH_EVENT_TTL_DAYS=0 (burnwatch db migrate applies it)")  # fmt: skip

    def _store_events(self, step: _Step) -> list[tuple[Message, str]]:
        """Store the batch's events; return the messages the store refused, each with the
        reason. A failed insert is split in halves until the refused message is alone (what
        was stored meanwhile is not stored again: the store leaves out what it holds)."""
        items = step.stored
        if not items:
            return []
        self._say_past_expiry(items)
        membership = self.membership
        refused = self.event_writer.write(items, step.pricing, step.prepared,
                                          membership.held_until if membership is not None else None)  # fmt: skip
        out: list[tuple[Message, str]] = []
        for index, reason in refused:
            message = items[index][0]
            log.error("store_refused_message", topic=message.topic, partition=message.partition,
                      offset=message.offset, error=reason[:_MAX_REASON])  # fmt: skip
            out.append((message, reason))
        return out
