"""What the worker does with one batch of messages, apart from Faust.

Per batch: decode (bad messages to the dead-letter topic), align on event
time, detect; then, in a writer thread while the next batch is detected, write
the events, alert changes and the state of the keys the batch touched to
ClickHouse; then queue alert changes for Slack and acknowledge the messages
whose events detection has seen. A crash re-reads what was not acknowledged.
Re-reading is safe: detector steps ignore samples they have already seen and
alert ids are deterministic, so nothing is alerted twice; the store leaves out the
events of messages it already holds, so nothing is stored twice.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgspec
import structlog

from detector.alerts import Alert, AlertManager
from detector.align import EventTimeAligner
from detector.delivery import Outbox
from detector.engine import Engine
from detector.events import EventDecoder, InvalidMessage
from detector.metrics import METRICS
from detector.store import EventBatch, Store

__all__ = ["Message", "Pipeline", "Stats"]

log = structlog.get_logger("burnwatch.worker")
_json = msgspec.json.Encoder()


class Message(msgspec.Struct):
    """One Kafka message as the pipeline needs it, independent of the consumer library."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    token: Any = None
    """What the consumer needs to acknowledge this message (the Faust event)."""


@dataclass
class Stats:
    messages: int = 0
    events: int = 0
    """Events decoded and stored."""
    detected: int = 0
    """Events released by the aligner to the detectors."""
    dead_letters: int = 0
    alerts_fired: int = 0
    alerts_resolved: int = 0
    batches: int = 0
    insert_s: float = 0.0
    partitions: int = 0
    """Input partitions assigned to this worker (0 until the group has settled)."""
    started: float = field(default_factory=time.monotonic)


def dead_letter(message: Message, reason: str) -> bytes:
    """The dead-letter record: where the message came from, why it was refused, its exact bytes."""
    return _json.encode(
        {
            "topic": message.topic,
            "partition": message.partition,
            "offset": message.offset,
            "key": message.key.decode("utf-8", "replace") if message.key else None,
            "reason": reason,
            "value_base64": base64.b64encode(message.value).decode(),
            "value_preview": message.value[:500].decode("utf-8", "replace"),
        }
    )


@dataclass
class _Step:
    """One batch between detection and acknowledgement."""

    batch: EventBatch = field(default_factory=EventBatch)
    dead: list[tuple[Message, str]] = field(default_factory=list)
    done: list[Message] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    states: list[tuple[str, int, bytes]] = field(default_factory=list)
    detected: int = 0
    messages: int = 0
    started: float = field(default_factory=time.perf_counter)
    per_topic: dict[str, list[int]] = field(default_factory=dict)
    """topic → [messages, events], for the metrics."""


class Pipeline:
    def __init__(
        self,
        *,
        engine: Engine,
        store: Store,
        outbox: Outbox,
        manager: AlertManager,
        send_dead_letter: Callable[[bytes | None, bytes], Awaitable[None]],
        caught_up: Callable[[str, int, int | None], bool] = lambda topic, partition, offset: True,
        startup_grace_s: float = 10.0,
        lateness_s: float = 60.0,
        decoder: EventDecoder | None = None,
    ) -> None:
        self.engine = engine
        self.store = store
        self.outbox = outbox
        self.manager = manager
        self.decoder = decoder or EventDecoder()
        self._send_dead_letter = send_dead_letter
        self._caught_up = caught_up
        self.aligner: EventTimeAligner[Message] = EventTimeAligner(lateness_s)
        self._partition_of: dict[str, int] = {}
        """Key → partition it arrived on, so its state is filed under that partition."""
        self.stats = Stats()
        self.outbox_ready = asyncio.Event()
        self._positions: dict[tuple[str, int], int] = {}
        """Next expected offset per topic-partition: a jump or a rewind is logged."""
        self._expected: dict[tuple[str, int], float] = {}
        """Assigned partitions not seen yet → wall-clock deadline after which they stop holding
        the others back (flow control only: detection itself never reads the clock)."""
        self._startup_grace_s = startup_grace_s
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clickhouse-writer")
        self._inflight: asyncio.Future | None = None
        self._ack: Callable[[Message], Awaitable[Any]] | None = None
        self._serial = asyncio.Lock()
        """The agent and the release timer both call :meth:`process`; one batch at a time."""

    async def process(self, messages: Sequence[Message], ack: Callable[[Message], Awaitable[Any]]) -> None:
        """Handle one batch. Detection runs now; the ClickHouse write runs in a writer
        thread while the next batch is detected. Once written, alert changes are queued
        for Slack and ``ack`` is called for each message detection has fully seen (the
        aligner may hold some back). At most one write is in flight."""
        async with self._serial:
            self._ack = ack
            step = self._detect(messages)
            await self.drain()
            loop = asyncio.get_running_loop()
            write = loop.run_in_executor(self._writer, self._write, step)
            self._inflight = asyncio.ensure_future(self._finish(write, step, ack))

    @property
    def positions(self) -> dict[tuple[str, int], int]:
        """(topic, partition) → the next offset this worker will read (for consumer lag)."""
        return self._positions

    async def tick(self) -> None:
        """Re-check what the aligner holds when no batch comes (a quiet stream): partitions
        may have caught up or passed their startup grace since the last batch."""
        if len(self.aligner) and self._ack is not None and not self._serial.locked():
            await self.process([], self._ack)

    async def drain(self) -> None:
        """Wait for the write in flight, if any, and its acknowledgements."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            await inflight

    def _detect(self, messages: Sequence[Message]) -> _Step:
        step = _Step()
        decode = self.decoder.decode
        positions = self._positions
        aligner = self.aligner
        partition_of = self._partition_of
        per_topic = step.per_topic
        for message in messages:
            tp = (message.topic, message.partition)
            counts = per_topic.get(message.topic)
            if counts is None:
                counts = per_topic[message.topic] = [0, 0]
            counts[0] += 1
            expected = positions.get(tp)
            if expected != message.offset:
                log.info("partition_position", topic=tp[0], partition=tp[1], offset=message.offset, expected=expected)
            positions[tp] = message.offset + 1
            try:
                decoded = decode(message.topic, message.value)
            except InvalidMessage as exc:
                step.dead.append((message, exc.reason))
                continue
            counts[1] += len(decoded)
            for event in decoded:
                partition_of[event.key] = message.partition
            step.batch.extend(decoded, (message.topic, message.partition, message.offset))
            aligner.push(tp, decoded, message)
        for (topic, partition), next_offset in positions.items():
            aligner.caught_up((topic, partition), self._caught_up(topic, partition, next_offset - 1))
        if self._expected:
            now = time.monotonic()
            for tp, deadline in list(self._expected.items()):
                if tp in positions:
                    del self._expected[tp]
                elif now > deadline or self._caught_up(tp[0], tp[1], None):
                    aligner.caught_up(tp)
                    del self._expected[tp]
        events, step.done = aligner.release()
        step.detected = len(events)
        step.alerts = self.manager.handle(self.engine.process_timed(events))
        step.states = self._dirty_states()
        step.messages = len(messages)
        return step

    async def _finish(self, write: Awaitable[float], step: _Step, ack: Callable[[Message], Awaitable[Any]]) -> None:
        stats = self.stats
        stats.insert_s += await write
        self.outbox.add(step.alerts)
        if self.outbox.has_work:
            self.outbox_ready.set()
        for message, reason in step.dead:
            await self._send_dead_letter(message.key, dead_letter(message, reason))
            log.warning("dead_letter", topic=message.topic, partition=message.partition, offset=message.offset, reason=reason)
        for message in step.done:
            await ack(message)
        for message, _ in step.dead:
            await ack(message)
        for topic, (n_messages, n_events) in step.per_topic.items():
            METRICS.messages.labels(topic).inc(n_messages)
            METRICS.events.labels(topic).inc(n_events)
        METRICS.dead_letters.inc(len(step.dead))
        if step.messages:
            METRICS.batch_seconds.observe(time.perf_counter() - step.started)
        stats.batches += 1
        stats.messages += step.messages
        stats.events += len(step.batch)
        stats.detected += step.detected
        stats.dead_letters += len(step.dead)
        for alert in step.alerts:
            METRICS.alerts.labels(alert.type, alert.change).inc()
            if alert.change == "fired":
                stats.alerts_fired += 1
            elif alert.change == "resolved":
                stats.alerts_resolved += 1
            if alert.change != "updated":
                log.info(f"alert_{alert.change}", alert_id=alert.alert_id, summary=alert.summary(),
                         silenced=alert.silenced or None)  # fmt: skip

    def expect(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Newly assigned input partitions: align on them as soon as they deliver."""
        deadline = time.monotonic() + self._startup_grace_s
        for tp in partitions:
            self._expected[tp] = deadline
            self.aligner.expect(tp)

    def reset(self) -> None:
        """Partitions moved: drop every key's cached state (it reloads from the store) and
        whatever the aligner holds (unacknowledged, so it is read again by the new owner)."""
        self.engine.forget_all()
        self.store.forget_positions()
        self._partition_of.clear()
        self._positions.clear()
        self._expected.clear()
        self.aligner.clear()

    def _dirty_states(self) -> list[tuple[str, int, bytes]]:
        engine, states = self.engine, []
        for key in engine.dirty:
            snapshot = engine.snapshot(key)
            if snapshot is not None:
                states.append((key, self._partition_of.get(key, 0), snapshot))
        engine.dirty.clear()
        return states

    def _write(self, step: _Step) -> float:
        """Events, then alert changes (an alert is stored before it can be delivered), then
        the state that reflects them: all before the batch's messages are acknowledged.
        Runs in the writer thread; returns the seconds it took."""
        started = time.perf_counter()
        version = time.time_ns()
        if len(step.batch):
            self.store.insert_events(step.batch, self.engine.ruleset.pricing)
        if step.alerts:
            self.store.record_alerts(step.alerts, version=version)
        self.store.save_states(step.states, version=version)
        return time.perf_counter() - started
