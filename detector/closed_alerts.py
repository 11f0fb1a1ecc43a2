"""Which alerts' delivery records an outbox may forget, so that its memory does not grow with every
alert ever posted (:class:`detector.delivery.Outbox`, :class:`detector.outputs.outbox.OutputOutbox`).

What can still touch an alert after it closed, and why the horizon is the alert manager's
(:data:`~detector.suppression.memory.HORIZON_S`, 7 days of event time):

- the one change that may follow a resolution, its withdrawal or correction (a stop read late): the
  alert manager lets it through while it remembers the alert, up to its horizon, and it replies in the
  thread of the opening's record;
- a replay (a restart re-reading, a consumer group reset, a topic read from the start): within the
  horizon the alert manager drops what it has seen; past it an old episode is detected again, with
  the same alert id, and only the delivery records tell it was posted;
- a group's message: its members' resolutions reply there without editing it, as long as any member
  is open (so a message stays a group's while one of its members' records is kept);
- the records that stand for a post not made (``UNROUTED``, ``REFUSED``, ``WITHDRAWN_UNPOSTED``, ``snoozed``): a
  later change of the alert follows them (an unrouted opening's resolution is unrouted too), so they are
  kept and forgotten with the alert's others, and read back like them;
- what does not need these records: an ack, snooze or feedback click and the actions runner read the
  store (``deliveries.opened_in`` / ``thread_of``); a snooze is kept apart, on the wall clock; re-pricing
  by a late bill writes ``alert_billing`` and posts nothing; an ``updated`` change edits open alerts only.

So the records of an alert closed (resolved, withdrawn or corrected), whose episode start and close are
both more than the horizon before the newest change seen, go; an open incident's, and one with a change
still queued, in doubt or not yet recorded, stay. What is forgotten is not lost: it is in the store, and
any later change of an alert that may have been forgotten (:meth:`ClosedAlerts.may_be_forgotten`: its
episode started no later than the latest close forgotten) is looked up there before it is judged new.
That look-up, not the horizon, is what keeps a replay from posting twice; the horizon only makes it rare.
Detection is left alone (old events are detected again, as ``backtest`` would): the outboxes alone decide
what was sent.

Event time, not the wall clock: the newest change's time, as the alert manager's horizon goes by its
newest episode. A replay at 3,000x, a backlog caught up after an outage and live data then forget
alike, and a worker stopped for a week forgets nothing on its return until event time has moved. A
future-dated change moves the horizon ahead: more is forgotten, which costs look-ups, never a post; and
since event time then stands still until it gets there, a sweep also comes once enough alerts have closed
since the last (:data:`SWEEP_AFTER_CLOSES`, or an eighth of those held), not only when event time moves.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from detector.alerts import Alert
from detector.suppression.memory import HORIZON_S

__all__ = ["CLOSING", "DELIVERY_HORIZON_S", "SWEEP_AFTER_CLOSES", "TOLD", "ClosedAlerts", "closed_at"]

TOLD = ("fired", "resolved", "withdrawn", "corrected")
"""The changes of an alert an outbox delivers, and keeps a record of."""
CLOSING = TOLD[1:]
"""Those that close it (:attr:`~detector.alerts.Alert.closes`)."""

DELIVERY_HORIZON_S = HORIZON_S
"""Event time a closed alert's delivery records stay in an outbox's memory (the alert manager's horizon)."""
SWEEP_AFTER_CLOSES = 64
"""Closes since the last sweep (or an eighth of the alerts held, if more) that make a sweep due whatever
event time did: a future-dated change holds event time still, and the forgetting must not stop with it."""


def closed_at(alert: Alert) -> float:
    """The time a closing change's alert counts as closed from: its close, or its episode start if
    later (a withdrawal is dated by a stop that may precede it), so a forgotten alert's start is
    always before the latest close forgotten."""
    return max(alert.episode_start, alert.resolved_at if alert.resolved_at is not None else alert.updated_at)


class ClosedAlerts:
    """The closed alerts an outbox holds records of, by when they closed (event time); which of
    them to forget, and which changes to look up in the store first. The delivery thread's own."""

    def __init__(self, horizon_s: float = DELIVERY_HORIZON_S) -> None:
        self.horizon_s = horizon_s
        self.newest = -math.inf
        """Event time of the newest change seen (or stored, after a recovery)."""
        self.forgotten_before = -math.inf
        """An alert whose episode started after this has had nothing forgotten."""
        self._closed: dict[str, float] = {}
        """Alert id → when it closed: the alerts whose records may be forgotten once old enough."""
        self._heap: list[tuple[float, str]] = []
        """Their (closed at, alert id), in order; an entry whose time is no longer the alert's is skipped."""
        self._swept_at = -math.inf
        self._closes_since = 0
        """Closes told since the last sweep."""

    def saw(self, alert: Alert) -> None:
        """A change handed to the outbox: event time moves; a closing one's alert may be forgotten later."""
        self.newest = max(self.newest, alert.updated_at)
        if alert.closes:
            self.closed(alert.alert_id, closed_at(alert))

    def closed(self, alert_id: str, at: float) -> None:
        """``alert_id`` is closed since ``at`` (:func:`closed_at`); told again (a recovery, a withdrawal
        after the resolution), the latest time counts."""
        if at > self._closed.get(alert_id, -math.inf):
            self._closed[alert_id] = at
            heapq.heappush(self._heap, (at, alert_id))
            self._closes_since += 1

    def recovered(self, newest: float | None) -> float:
        """A recovery read the store, whose newest alert change is at ``newest`` (None: no alert): event
        time has got there. Returns the horizon: records of alerts closed before it are not loaded, and
        count as forgotten."""
        if newest is not None:
            self.newest = max(self.newest, newest)
        before = self.newest - self.horizon_s
        self.forgot(before)
        return before

    def forgot(self, before: float) -> None:
        """Records of alerts that started up to ``before`` may be missing from memory (not loaded)."""
        self.forgotten_before = max(self.forgotten_before, before)

    def may_be_forgotten(self, alert: Alert) -> bool:
        """Whether the outbox may have forgotten ``alert``'s records: look them up before judging a change new."""
        return alert.episode_start <= self.forgotten_before

    def due(self, busy: Callable[[str], bool]) -> set[str]:
        """The alerts whose records to forget now: closed more than ``horizon_s`` before the newest
        change and not ``busy`` (a change queued or in doubt: asked again at the next sweep). A sweep
        runs once event time has moved an eighth of the horizon since the last, or once
        :data:`SWEEP_AFTER_CLOSES` alerts (an eighth of those held, if more) have closed since, so the
        caller's own clean-up (a scan of what it keeps) is rare."""
        if (self.newest - self._swept_at < self.horizon_s / 8
                and self._closes_since < max(SWEEP_AFTER_CLOSES, len(self._closed) // 8)):  # fmt: skip
            return set()
        self._swept_at = self.newest
        self._closes_since = 0
        horizon = self.newest - self.horizon_s
        gone: set[str] = set()
        kept: list[tuple[float, str]] = []
        while self._heap and self._heap[0][0] < horizon:
            at, alert_id = heapq.heappop(self._heap)
            if self._closed.get(alert_id) != at:
                continue  # closed again later: its later entry counts
            if busy(alert_id):
                kept.append((at, alert_id))
            else:
                del self._closed[alert_id]
                gone.add(alert_id)
                self.forgot(at)
        for entry in kept:
            heapq.heappush(self._heap, entry)
        return gone
