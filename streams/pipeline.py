"""What the worker does with one batch of messages, apart from Faust.

Per batch, in this order: decode (bad messages to the dead-letter topic),
detect, write events and alert changes to ClickHouse, queue alert changes for
Slack, persist the state of the keys the batch touched. Only then does the
agent ask for the next batch, and only then are the batch's offsets acked, so
a crash re-reads at most the batch in flight. Re-reading is safe: detector
steps ignore samples they have already seen and alert ids are deterministic,
so nothing is alerted twice.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import structlog

from detector.align import EventTimeAligner
from detector.alerts import Alert, AlertManager
from detector.delivery import Outbox
from detector.engine import Engine
from detector.events import EventDecoder, InvalidMessage
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

    async def process(self, messages: Sequence[Message]) -> list[Message]:
        """Handle one batch; return the messages whose every event detection has now seen,
        which are the ones to acknowledge (the aligner may still hold others)."""
        stats = self.stats
        batch = EventBatch()
        dead: list[Message] = []
        reasons: list[str] = []
        done: list[Message] = []
        decode = self.decoder.decode
        positions = self._positions
        aligner = self.aligner
        partition_of = self._partition_of
        n_events = 0
        for message in messages:
            tp = (message.topic, message.partition)
            expected = positions.get(tp)
            if expected != message.offset:
                log.info("partition_position", topic=tp[0], partition=tp[1], offset=message.offset, expected=expected)
            positions[tp] = message.offset + 1
            try:
                decoded = decode(message.topic, message.value)
            except InvalidMessage as exc:
                dead.append(message)
                reasons.append(exc.reason)
                continue
            for event in decoded:
                partition_of[event.key] = message.partition
            batch.extend(decoded)
            aligner.push(tp, decoded, message)
            n_events += len(decoded)
        for (topic, partition), next_offset in positions.items():
            aligner.caught_up((topic, partition), self._caught_up(topic, partition, next_offset - 1))
        events, done = aligner.release()
        alerts = self.manager.handle(self.engine.process_timed(events))
        states = self._dirty_states()

        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        await loop.run_in_executor(None, self._write, batch, alerts, states)
        stats.insert_s += time.perf_counter() - started

        self.outbox.add(alerts)
        if len(self.outbox):
            self.outbox_ready.set()
        for message, reason in zip(dead, reasons):
            await self._send_dead_letter(message.key, dead_letter(message, reason))
            log.warning("dead_letter", topic=message.topic, partition=message.partition, offset=message.offset, reason=reason)
        done.extend(dead)

        stats.batches += 1
        stats.messages += len(messages)
        stats.events += n_events
        stats.detected += len(events)
        stats.dead_letters += len(dead)
        for alert in alerts:
            if alert.change == "fired":
                stats.alerts_fired += 1
            elif alert.change == "resolved":
                stats.alerts_resolved += 1
            if alert.change != "updated":
                log.info(f"alert_{alert.change}", alert_id=alert.alert_id, summary=alert.summary())
        return done

    def reset(self) -> None:
        """Partitions moved: drop every key's cached state (it reloads from the store) and
        whatever the aligner holds (unacknowledged, so it is read again by the new owner)."""
        self.engine.forget_all()
        self._partition_of.clear()
        self._positions.clear()
        self.aligner.clear()

    def _dirty_states(self) -> list[tuple[str, int, bytes]]:
        engine, states = self.engine, []
        for key in engine.dirty:
            snapshot = engine.snapshot(key)
            if snapshot is not None:
                states.append((key, self._partition_of.get(key, 0), snapshot))
        engine.dirty.clear()
        return states

    def _write(self, batch: EventBatch, alerts: list[Alert], states: list[tuple[str, int, bytes]]) -> None:
        """Events, then alert changes (an alert is stored before it can be delivered), then
        the state that reflects them. All before the batch's offsets are acked."""
        version = time.time_ns()
        if len(batch):
            self.store.insert_events(batch)
        if alerts:
            self.store.record_alerts(alerts, version=version)
        self.store.save_states(states, version=version)
