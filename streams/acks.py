"""Acknowledge a partition's messages in offset order, and only once they are done.

Faust commits, per partition, the first run of consecutive acknowledged offsets. A
message the event-time aligner still holds, or one whose write failed, is a gap: had a
later message been acknowledged, a commit would reach past the gap and a crash would
lose it. So a message is acknowledged only when it is done (stored or dead-lettered,
and seen by detection) and every earlier message of its partition is too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

__all__ = ["InOrderAcks"]


class _Offset(Protocol):
    topic: str
    partition: int
    offset: int


M = TypeVar("M", bound=_Offset)


class _Partition(Generic[M]):
    """One partition's messages received and not yet acknowledged, in offset order, and the
    offsets among them that are done."""

    __slots__ = ("done", "pending")

    def __init__(self) -> None:
        self.pending: deque[M] = deque()
        self.done: set[int] = set()


class InOrderAcks(Generic[M]):
    """Messages received per partition, and which are done: :meth:`done` hands back those that
    may be acknowledged now (each partition's done messages before its first not done)."""

    def __init__(self) -> None:
        self._partitions: dict[tuple[str, int], _Partition[M]] = {}

    def received(self, tp: tuple[str, int], messages: Iterable[M]) -> None:
        """Messages read from Kafka, all of partition ``tp`` (the caller groups them: a fetch hands
        each partition's messages over together), in offset order."""
        partition = self._partitions.get(tp)
        if partition is None:
            partition = self._partitions[tp] = _Partition()
        partition.pending.extend(messages)

    def done(self, messages: Iterable[M]) -> list[M]:
        """Mark ``messages`` done; return the messages that may now be acknowledged, in offset
        order per partition. Called once per batch: a partition's queue is walked once."""
        touched: dict[tuple[str, int], _Partition[M]] = {}
        partitions = self._partitions
        for message in messages:
            tp = (message.topic, message.partition)
            partition = partitions.get(tp)
            if partition is None:
                continue  # received before a clear(): its partition was handed over
            partition.done.add(message.offset)
            touched[tp] = partition
        ready: list[M] = []
        for partition in touched.values():
            queue, done = partition.pending, partition.done
            while queue and queue[0].offset in done:
                head = queue.popleft()
                done.discard(head.offset)
                ready.append(head)
        return ready

    def clear(self) -> None:
        """Partitions moved: what was not acknowledged is read again by their new owner."""
        self._partitions.clear()
