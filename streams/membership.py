"""Whether this worker still holds its partitions: the group session its heartbeats renew.

A worker frozen longer than the session timeout (SIGSTOP, swap, a paused VM, a process that
held the GIL that long) is dropped from the group, and its partitions go to another worker.
When it wakes, its writer thread and its Slack delivery run before its consumer learns, at its
next heartbeat, that it was dropped: a batch written then lands in partitions another worker
holds. Its state, saved as the newest, replaces the new holder's for keys the new holder does
not write again soon, and its alerts and posts may follow another worker's. Kafka refuses a dropped
member's commits (its generation is stale), not its writes to the store.
``bench/workers.py --stall 15`` (one of two workers stopped 15 s, past the 6 s session) ended
2 runs of 4 with alerts that were not backtest's.

So a worker writes and posts only while its membership is held: less than the session timeout
(less a margin) after it sent the latest heartbeat that the coordinator answered, or after it was
given its partitions. The coordinator drops a member only a session timeout after the latest
heartbeat it received, which was sent no earlier, so a worker that holds its membership by this
clock has not been dropped. A worker that cannot say so waits: the next heartbeat either renews
it (not dropped: it goes on) or finds it dropped, and then the revocation that follows gives up
the waiting writes (:meth:`Membership.revoking`). What they held is read again by the partitions'
holder, as after a crash. Only a write already under way when the worker froze can still land.
A revocation that finds the membership held is a live worker's handover: its writes go ahead until the
next assignment, whatever the heartbeats say meanwhile, and the next holder waits for its marks.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

__all__ = ["MARGIN_S", "Membership", "watch_heartbeats"]

log = structlog.get_logger("burnwatch.worker")

MARGIN_S = 1.0
"""How long before the session's end a worker stops counting on it (at most a sixth of the session
timeout): a write checked just before the end would land after it."""


class Membership:
    """This worker's hold on its partitions, renewed by the consumer thread's heartbeats and read by
    the writer and delivery threads. A worker outside a consumer group holds it always."""

    def __init__(self, session_timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.session_timeout_s = session_timeout_s
        self.margin_s = min(MARGIN_S, session_timeout_s / 6)
        self._clock = clock
        self._renewed_at = clock()
        """When the latest heartbeat the coordinator answered was sent, or the latest assignment came."""
        self._lost = False
        self._handing_over = False
        """A revocation or a stop began while the membership was held: the handover's writes go ahead
        whatever the heartbeats say meanwhile (the next holder waits for its marks, streams.handover)."""
        self._changed = threading.Condition()
        self.waiting = 0
        """Threads waiting for the membership now (the writer's, the deliveries'): /healthz says it."""

    def renewed(self, sent_at: float) -> None:
        """The coordinator answered a heartbeat sent at ``sent_at`` (this clock): the group holds this worker."""
        with self._changed:
            if sent_at > self._renewed_at:
                self._renewed_at = sent_at
            self._changed.notify_all()

    def assigned(self) -> None:
        """The group has just given this worker its partitions: held, whatever was lost before."""
        with self._changed:
            self._renewed_at = max(self._renewed_at, self._clock())
            self._lost = self._handing_over = False
            self._changed.notify_all()

    def revoking(self) -> bool:
        """A revocation or a stop begins. If the membership is not held now, the group dropped this
        worker and its partitions are another's: it is lost, and what waits for it gives up. If it is held,
        the handover's writes go ahead until the next assignment, whatever the heartbeats say meanwhile (a
        heartbeat during a rebalance may find the generation moved on, and none is sent after it): the
        next holder waits for the handover's marks. Returns whether it was lost."""
        with self._changed:
            if self._lost or self._handing_over:
                pass
            elif self._held():
                self._handing_over = True
            else:
                self._lost = True
                log.warning("membership_lost", unconfirmed_s=round(self.unconfirmed_s(), 3),
                            session_timeout_s=self.session_timeout_s,
                            note="dropped from the group while frozen: what it had not written is left to the "
                                 "partitions' holder, who reads it again")  # fmt: skip
            self._changed.notify_all()
            return self._lost

    @property
    def lost(self) -> bool:
        return self._lost

    def now(self) -> float:
        """This membership's clock (monotonic seconds)."""
        return self._clock()

    def unconfirmed_s(self) -> float:
        """Seconds since the membership was last confirmed."""
        return self._clock() - self._renewed_at

    def _held(self) -> bool:
        return self._clock() - self._renewed_at < self.session_timeout_s - self.margin_s

    def held(self) -> bool:
        """Whether this worker may write and post for its partitions now."""
        return not self._lost and (self._handing_over or self._held())

    def held_until(self) -> float:
        """When, by ``time.monotonic()``, the membership runs out unless a heartbeat renews it first: what a
        writer child checks just before each insert it sends (inf while a live handover lasts)."""
        with self._changed:
            if self._lost:
                return -math.inf
            if self._handing_over:
                return math.inf
            return time.monotonic() + (self._renewed_at + self.session_timeout_s - self.margin_s - self._clock())

    def status(self) -> str:
        """``held``, ``unconfirmed`` (no heartbeat answered within the session timeout: a freeze) or ``lost``
        (a revocation found it so: the group dropped this worker)."""
        return "lost" if self._lost else "held" if self.held() else "unconfirmed"

    def wait_held(self, stopping: threading.Event, poll_s: float = 0.1) -> bool:
        """Until the membership is held (True), or lost or ``stopping`` set (False). The caller's thread
        blocks: a writer or delivery thread, never the event loop."""
        with self._changed:
            self.waiting += 1
            try:
                while not self._lost and not stopping.is_set():
                    if self._handing_over or self._held():
                        return True
                    self._changed.wait(poll_s)
            finally:
                self.waiting -= 1
        return False


def watch_heartbeats(coordinator: Any, membership: Membership) -> None:
    """Renew ``membership`` with each heartbeat of aiokafka's group ``coordinator`` that the coordinator
    answered as a member's (no error, or a rebalance in progress, which keeps the member in the group
    while it rejoins): ``_do_heartbeat`` returns True for those alone. Reaches into aiokafka (the
    version pinned in pyproject.toml; tests/test_membership.py checks the method is still there)."""
    beat = coordinator._do_heartbeat

    async def _do_heartbeat() -> bool:
        sent_at = membership.now()
        answered = await beat()
        if answered:
            membership.renewed(sent_at)
        return bool(answered)

    coordinator._do_heartbeat = _do_heartbeat
