"""Whether this worker still holds its partitions: the group session its heartbeats renew.

A worker frozen longer than the session timeout (SIGSTOP, swap, a suspended host, a process that
held the GIL that long) is dropped from the group, and its partitions go to another worker.
When it wakes, its writer thread and its Slack delivery run before its consumer learns, at its
next heartbeat, that it was dropped: a batch written then lands in partitions another worker
holds. Its state, saved as the newest, replaces the new holder's for keys the new holder does
not write again soon, and its alerts and posts may follow another worker's. Kafka refuses a dropped
member's commits (its generation is stale), not its writes to the store.
``bench/workers.py --stall 15`` (one of two workers stopped 15 s, past the 6 s session) ended
4 runs of 4 with alerts that were not backtest's.

So a worker writes and posts only while its membership is held: less than the session timeout
(less a margin) after it sent the latest heartbeat that the coordinator answered as a member's,
or the SyncGroup request of its latest assignment. Kafka's coordinator drops a member a session timeout
after the latest heartbeat it received, which was sent no earlier, so a worker that holds its
membership by this clock has not been dropped for silence (removal at the end of a rebalance's
join phase, for a member that did not rejoin within the rebalance timeout, is the handover's
matter: below). A worker that cannot say so waits: the next heartbeat either renews it (not
dropped: it goes on) or finds it dropped, and then the revocation that follows gives up the waiting
writes (:meth:`Membership.revoking`). What they held is read again by the partitions' holder, as
after a crash. Only a write already under way when the worker froze can still land.

A revocation that finds the membership held is a live worker's handover: the next holder waits for
its marks in the store (:mod:`streams.handover`), for as long as the latest is younger than
``handover_alive_s`` and for the rebalance timeout at most. So once its first mark has landed its
writes go ahead while its latest mark is that recent and the rebalance timeout has not passed,
whatever the heartbeats say (one during a rebalance may find the generation moved on, and none
follows it); before that the heartbeats say. A handover that lapsed (the worker froze during it, the
store refused its marks, or it outlasted the rebalance timeout) is lost, and stays lost even if a
later mark lands.

The clock is ``CLOCK_BOOTTIME`` where there is one (Linux: it counts a suspended host's sleep,
which ``CLOCK_MONOTONIC`` does not). A paused virtual machine's guest clocks may not count the pause
either; such a worker counts on a membership it may have lost until its next heartbeat's answer.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

__all__ = ["MARGIN_S", "Membership", "now", "watch_heartbeats"]

log = structlog.get_logger("burnwatch.worker")

MARGIN_S = 1.0
"""How long before the session's end a worker stops counting on it (at most a sixth of the session
timeout): a write checked just before the end would land after it."""

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def now() -> float:
    """Seconds on the memberships' clock: ``CLOCK_BOOTTIME`` where there is one, else monotonic. The same
    in every process of the machine, so a writer child checks a deadline the worker gave it."""
    return time.clock_gettime(_BOOTTIME) if _BOOTTIME is not None else time.monotonic()


class Membership:
    """This worker's hold on its partitions, renewed by the consumer thread's heartbeats and read by
    the writer and delivery threads. A worker outside a consumer group holds it always."""

    def __init__(self, session_timeout_s: float, clock: Callable[[], float] = now,
                 handover_alive_s: float | None = None, handover_within_s: float | None = None) -> None:  # fmt: skip
        self.session_timeout_s = session_timeout_s
        self.margin_s = min(MARGIN_S, session_timeout_s / 6)
        self.handover_alive_s = handover_alive_s
        """How recent the latest mark of a handover must be for the next holder to wait for it (None: a
        handover holds the membership until the next assignment)."""
        self.handover_within_s = handover_within_s
        """How long the next holder waits for a handover at most, and the group for a member to rejoin (the
        rebalance timeout; None: no bound)."""
        self._clock = clock
        self._renewed_at = clock()
        """When the latest heartbeat the coordinator answered was sent, or the latest SyncGroup request."""
        self._lost = False
        self._assigned = False
        """An assignment has come since the last revocation: a revocation has something to hand over."""
        self._handing_over = False
        """A revocation or a stop began while the membership was held: the handover's writes go ahead while
        its marks are recent (:attr:`handover_alive_s`)."""
        self._revoked_at = 0.0
        """When the handover in progress began."""
        self._marked_at: float | None = None
        """When the handover's latest mark that landed was sent (None: none has landed yet)."""
        self._changed = threading.Condition()
        self.waiting = 0
        """Threads waiting for the membership now (the writer's, the deliveries'): /healthz says it."""

    def now(self) -> float:
        """This membership's clock."""
        return self._clock()

    def renewed(self, sent_at: float) -> None:
        """The coordinator answered a heartbeat (or a join's SyncGroup) sent at ``sent_at`` (this clock): the
        group holds this worker."""
        with self._changed:
            if sent_at > self._renewed_at:
                self._renewed_at = sent_at
            self._changed.notify_all()

    def assigned(self) -> None:
        """The group has just given this worker its partitions (renewed from its SyncGroup request's time by
        :func:`watch_heartbeats`, just before): whatever was lost before, it is held again."""
        with self._changed:
            self._lost = self._handing_over = False
            self._assigned = True
            self._changed.notify_all()

    def revoking(self) -> bool:
        """A revocation or a stop begins. If the membership is not held now, the group dropped this
        worker and its partitions are another's: it is lost, and what waits for it gives up. If it is held,
        the handover's writes go ahead while its marks are recent (:meth:`marked`). Before any assignment
        (the first join's revocation) there is nothing to hand over. Returns whether it was lost."""
        with self._changed:
            if not self._assigned or self._lost or self._handing_over:
                pass
            elif self._heard():
                self._handing_over, self._revoked_at, self._marked_at = True, self._clock(), None
            else:
                self._lose("membership_lost", unconfirmed_s=round(self._clock() - self._renewed_at, 3),
                           note="dropped from the group while frozen: what it had not written is left to the "
                                "partitions' holder, who reads it again")  # fmt: skip
            self._assigned = False
            self._changed.notify_all()
            return self._lost

    def marked(self, sent_at: float) -> None:
        """A mark of the handover in progress, sent at ``sent_at``, landed. One that lands after the marks
        lapsed (judged when it lands, whenever it was sent) does not bring the handover back: the next
        holder may have gone ahead meanwhile."""
        with self._changed:
            if self._handing_over and not self._lost and not self._lost_handover():
                if self._marked_at is None or sent_at > self._marked_at:
                    self._marked_at = sent_at
            self._changed.notify_all()

    @property
    def lost(self) -> bool:
        return self._lost

    def unconfirmed_s(self) -> float:
        """Seconds since the membership was last confirmed."""
        return self._clock() - self._renewed_at

    def _heard(self) -> bool:
        return self._clock() - self._renewed_at < self.session_timeout_s - self.margin_s

    def _lapsed(self, at: float) -> str | None:
        """Why the handover in progress can no longer count on the next holder's wait at ``at`` (None: it can):
        its latest mark too old, none landed in as long since it began, or it began a rebalance timeout ago."""
        within, alive = self.handover_within_s, self.handover_alive_s
        if within is not None and at - self._revoked_at >= within - self.margin_s:
            return "it began a rebalance timeout ago: the group and the next holder wait no longer"
        since = self._revoked_at if self._marked_at is None else self._marked_at
        if alive is not None and at - since >= alive - self.margin_s:
            return "its marks stopped landing (a freeze, or the store): the next holder may have gone ahead"
        return None

    def _lose(self, event: str, **fields: Any) -> None:
        self._lost = True
        log.warning(event, session_timeout_s=self.session_timeout_s, **fields)

    def _check(self) -> bool:
        """Whether held now (under the lock). A handover holds it while the next holder would wait for it,
        once its first mark has landed (before that, the next holder sees no mark: heartbeats say); one
        that lapsed is lost here."""
        if self._lost:
            return False
        if self._handing_over:
            return not self._lost_handover() and (self._marked_at is not None or self._heard())
        return self._heard()

    def _lost_handover(self) -> bool:
        """Whether the handover in progress lapsed (lost here if so), under the lock."""
        at = self._clock()
        why = self._lapsed(at)
        if why is None:
            return False
        self._lose("handover_lapsed", began_s_ago=round(at - self._revoked_at, 3), reason=why,
                   note="what the handover had not written is left to the partitions' next holder")  # fmt: skip
        self._changed.notify_all()
        return True

    def held(self) -> bool:
        """Whether this worker may write and post for its partitions now."""
        with self._changed:
            return self._check()

    def held_until(self) -> float:
        """When, on :func:`now`'s clock, the membership runs out unless renewed first: what the event writer
        checks just before each insert it sends (-inf once lost)."""
        with self._changed:
            if not self._check():
                return -math.inf
            if self._handing_over and self._marked_at is not None:
                ends = [math.inf]
                if self.handover_alive_s is not None:
                    ends.append(self._marked_at + self.handover_alive_s - self.margin_s)
                if self.handover_within_s is not None:
                    ends.append(self._revoked_at + self.handover_within_s - self.margin_s)
                end = min(ends)
            else:
                end = self._renewed_at + self.session_timeout_s - self.margin_s
            return now() + (end - self._clock())

    def status(self) -> str:
        """``held``, ``unconfirmed`` (no heartbeat answered within the session timeout less the margin: a
        freeze, or heartbeats starved) or ``lost`` (the group dropped this worker, or its handover lapsed)."""
        with self._changed:
            return "held" if self._check() else "lost" if self._lost else "unconfirmed"

    def wait_held(self, stopping: threading.Event, timeout_s: float | None = None, poll_s: float = 0.1) -> bool | None:
        """Until the membership is held (True), or lost or ``stopping`` set (False), or ``timeout_s`` passed
        (None). The caller's thread blocks: a writer or delivery thread, never the event loop."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._changed:
            self.waiting += 1
            try:
                while not self._lost and not stopping.is_set():
                    if self._check():
                        return True
                    if deadline is not None and time.monotonic() >= deadline:
                        return None
                    self._changed.wait(poll_s)
            finally:
                self.waiting -= 1
        return False


def watch_heartbeats(coordinator: Any, membership: Membership) -> None:
    """Renew ``membership`` with each heartbeat of aiokafka's group ``coordinator`` that the coordinator
    answered as a member's (no error, or a rebalance in progress, which keeps the member in the group
    while it rejoins: ``_do_heartbeat`` returns True for those alone), and with each join's SyncGroup
    request the coordinator answered without error, from when it was sent (the coordinator restarts the
    member's session when it answers it, no earlier; the JoinGroup before it may wait seconds for the
    other members). Reaches into aiokafka (the version pinned in pyproject.toml; tests/test_bulk.py
    checks these methods are still there and called so)."""
    beat, send = coordinator._do_heartbeat, coordinator._send_req

    async def _do_heartbeat() -> bool:
        sent_at = membership.now()
        answered = await beat()
        if answered:
            membership.renewed(sent_at)
        return bool(answered)

    async def _send_req(request: Any) -> Any:
        sent_at = membership.now()
        response = await send(request)
        if type(request).__name__ == "SyncGroupRequest" and getattr(response, "error_code", None) == 0:
            membership.renewed(sent_at)
        return response

    coordinator._do_heartbeat = _do_heartbeat
    coordinator._send_req = _send_req
