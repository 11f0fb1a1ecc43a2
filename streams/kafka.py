"""Kafka plumbing outside Faust: topic creation and the fast replay publisher (aiokafka)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path

import msgspec
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from detector.events import TOPICS
from detector.replay import read_replay

__all__ = ["DEAD_LETTER_TOPIC", "count_events", "ensure_topics", "file_records", "publish_file", "publish_records"]

DEAD_LETTER_TOPIC = "dead-letter"


async def ensure_topics(bootstrap: str, partitions: int, names: Iterable[str] = (*TOPICS, DEAD_LETTER_TOPIC)) -> None:
    """Create the topics if missing, with one partition count for all three inputs.

    The inputs are co-partitioned by key (resource id), so a resource's usage and
    metrics land on the same partition number and so on the same worker.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names if n not in existing]
        if missing:
            try:
                await admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass
    finally:
        await admin.close()


async def publish_records(
    bootstrap: str,
    records: Iterable[tuple[str, str, bytes]],
    *,
    speed: float | None = None,
    on_sent: Callable[[int], None] | None = None,
) -> int:
    """Publish ``(topic, key, value)`` records with aiokafka's batching; return the count.

    With ``speed`` the records are paced by their event time (600: ten event-minutes
    per wall-clock second), as a live fleet would send them; without, as fast as possible.
    """
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=1 << 20, max_request_size=8 << 20, acks=1
    )
    await producer.start()
    sent = 0
    origin: tuple[float, float] | None = None
    try:
        pending = []
        for topic, key, value in records:
            if speed:
                end = value_end_time(value)
                if end is not None:
                    if origin is None:
                        origin = (end, time.monotonic())
                    delay = origin[1] + (end - origin[0]) / speed - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
            pending.append(await producer.send(topic, value=value, key=key.encode()))
            sent += 1
            if len(pending) >= 5000 or speed:
                if len(pending) >= 5000:
                    await asyncio.gather(*pending)
                    pending.clear()
                if on_sent:
                    on_sent(sent)
        await asyncio.gather(*pending)
        await producer.flush()
    finally:
        await producer.stop()
    return sent


def value_end_time(value: bytes) -> float | None:
    """Latest ``ts`` in a message value: when an exporter would have sent it."""
    try:
        decoded = msgspec.json.decode(value)
    except msgspec.DecodeError:
        return None
    latest = None
    for item in decoded if isinstance(decoded, list) else [decoded]:
        ts = item.get("ts") if isinstance(item, dict) else None
        if isinstance(ts, str):
            try:
                t = datetime.fromisoformat(ts).timestamp()
            except ValueError:
                continue
            latest = t if latest is None or t > latest else latest
    return latest


def count_events(records: Iterable[tuple[str, str, bytes]]) -> int:
    """Events in ``(topic, key, value)`` records (a value is one event or an array)."""
    return sum(len(v) if isinstance(v, list) else 1 for v in (msgspec.json.decode(r[2]) for r in records))


def file_records(path: str | Path) -> Iterator[tuple[str, str, bytes]]:
    """``(topic, key, value bytes)`` of each line of a replay file."""
    for _, record in read_replay(path):
        yield record.topic, record.key, bytes(record.value)


async def publish_file(bootstrap: str, path: str | Path, partitions: int, speed: float | None = None) -> int:
    await ensure_topics(bootstrap, partitions)
    return await publish_records(bootstrap, file_records(path), speed=speed)
