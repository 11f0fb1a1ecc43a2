"""Acknowledge a partition's messages in offset order, and only once they are done.

Faust commits, per partition, the first run of consecutive acknowledged offsets. A
message the event-time aligner still holds, or one whose write failed, is a gap: had a
later message been acknowledged, a commit would reach past the gap and a crash would
lose it. So a message is acknowledged only when it is done (stored or dead-lettered,
and seen by detection) and every earlier message of its partition is too.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol, TypeVar

__all__ = ["InOrderAcks"]


class _Offset(Protocol):
    topic: str
    partition: int
    offset: int


M = TypeVar("M", bound=_Offset)


class InOrderAcks:
    def __init__(self) -> None:
        self._pending: dict[tuple[str, int], deque] = {}
        """(topic, partition) → messages received and not yet acknowledged, in offset order."""
        self._done: set[tuple[str, int, int]] = set()

    def received(self, message: M) -> None:
        """A message read from Kafka (in offset order within its partition)."""
        self._pending.setdefault((message.topic, message.partition), deque()).append(message)

    def done(self, message: M) -> list[M]:
        """Mark ``message`` done; return the messages that may now be acknowledged, in order."""
        tp = (message.topic, message.partition)
        self._done.add((message.topic, message.partition, message.offset))
        queue = self._pending.get(tp)
        ready: list[M] = []
        while queue and (tp[0], tp[1], queue[0].offset) in self._done:
            head = queue.popleft()
            self._done.discard((tp[0], tp[1], head.offset))
            ready.append(head)
        return ready

    def clear(self) -> None:
        """Partitions moved: what was not acknowledged is read again by their new owner."""
        self._pending.clear()
        self._done.clear()
