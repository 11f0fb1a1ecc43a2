"""The outbox: every opening and resolution reaches Slack once, in order.

Alerts are written to ClickHouse before they are queued here, and every
delivery is recorded there too, so after a crash or a rebalance the outbox is
rebuilt from the store (:meth:`Outbox.recover`) and what was already posted is
not posted again: the alert id is the idempotency key.

Openings wait ``group_wait_s`` in the queue for company: those of one type and one
group (the team; the account for ``untagged``) that fired within ``group_window_s``
of event time go out as one message, every alert id recorded against it; their
resolutions reply in its thread without editing it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable

import structlog

from detector.alerts import Alert
from detector.metrics import METRICS
from detector.slack import SlackError, SlackNotifier
from detector.store import Store, alert_from_row

__all__ = ["Outbox"]

log = structlog.get_logger("burnwatch.delivery")


class Outbox:
    def __init__(
        self,
        store: Store,
        notifier: SlackNotifier | None,
        *,
        group_wait_s: float = 2.0,
        group_window_s: float = 120.0,
        edit_every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.notifier = notifier
        self.group_wait_s = group_wait_s
        self.group_window_s = group_window_s
        self.edit_every_s = edit_every_s
        self._edits: dict[str, Alert] = {}
        """Alert id → its latest cost update not yet shown on its message."""
        self._edited_at: dict[str, float] = {}
        self._clock = clock
        self._queue: deque[Alert] = deque()
        self._queued_at: dict[str, float] = {}
        self._done: dict[tuple[str, str], tuple[str, str]] = {}
        self._group_ts: set[str] = set()
        """Message ts of group posts: resolutions reply there but do not edit them."""
        self.delivered = 0
        self.failed = 0
        self.hold_s = 0.0
        """After a pass: seconds until a group waiting for company is due (0: none waits)."""
        self._snoozed: dict[str, float] = {}
        """Alert id → wall time its snooze (a button) ends: its changes are not posted until then."""
        self._wall = time.time
        self.snooze_refresh_s = 30.0
        self._snoozes_read = clock()
        self._maybe_posted: set[str] = set()
        """Openings whose post timed out: looked for in the channel before posting again."""
        self.on_opened: Callable[[Alert, str, str], None] | None = None
        """Called with (alert, channel, message ts) after an opening is posted alone (charts)."""

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def has_work(self) -> bool:
        """Changes to post, or messages to edit with newer figures."""
        return bool(self._queue or self._edits)

    def recover(self) -> int:
        """Load past deliveries and queue what was stored but never delivered; return how many."""
        if self.notifier is None:
            return 0
        self._done = self.store.deliveries()
        self._snoozed = self.store.snoozed(self._wall())
        seen: set[str] = set()
        for (_, kind), (_, ts) in self._done.items():
            if kind == "fired" and ts:
                (self._group_ts.add if ts in seen else seen.add)(ts)
        pending = self.store.undelivered()
        ids = [alert_id for alert_id, _ in pending]
        rows = {r["alert_id"]: r for r in self.store.alerts("alert_id IN %(ids)s", {"ids": ids})} if pending else {}
        for alert_id, change in pending:
            if alert_id in rows:
                self._queue.append(alert_from_row(rows[alert_id], change))
        return len(pending)

    def snooze(self, alert_id: str, until: float) -> None:
        """Keep this incident's changes out of Slack until wall time ``until``."""
        self._snoozed[alert_id] = until

    def add(self, alerts: Iterable[Alert]) -> None:
        if self.notifier is None:
            return
        now = self._clock()
        for alert in alerts:  # no I/O here: this runs on the worker's event loop
            if alert.change == "updated":
                if not alert.silenced:
                    self._edits[alert.alert_id] = alert  # only the latest matters
                continue
            if alert.change == "resolved":
                self._edits.pop(alert.alert_id, None)  # the resolution rewrites the message anyway
                self._edited_at.pop(alert.alert_id, None)
            if not alert.silenced and (alert.alert_id, alert.change) not in self._done:
                self._queue.append(alert)
                self._queued_at.setdefault(alert.alert_id, now)

    def deliver_pending(self) -> int:
        """Deliver queued changes in order. A retryable failure stops the pass and leaves the
        rest queued (raise :class:`SlackError`); a permanent one is logged and skipped."""
        sent = 0
        self.hold_s = 0.0
        self._refresh_snoozes()
        while self._queue and self.notifier is not None:
            alert = self._queue[0]
            key = (alert.alert_id, alert.change)
            if key in self._done:
                self._queue.popleft()
                continue
            if alert.alert_id in self._snoozed:  # recorded as handled, so a restart does not post it late
                self.store.record_delivery(alert.alert_id, alert.change, "", "snoozed")
                self._done[key] = ("", "snoozed")
                self._queue.popleft()
                continue
            group = self._group_of(alert)
            if group is None:
                return sent  # waiting for the rest of its group
            if alert.alert_id in self._maybe_posted:
                found = self.notifier.find_posted(alert.alert_id, alert.channel or self.notifier.channel)
                self._maybe_posted.discard(alert.alert_id)
                if found is not None:  # the timed-out post did land: record it, do not post twice
                    log.info("slack_post_found_after_timeout", alert_id=alert.alert_id)
                    self._delivered(group, *found)
                    continue
            try:
                if len(group) > 1:
                    channel, ts = self.notifier.post_group(group)
                else:
                    thread = self._done.get((alert.alert_id, "fired"))
                    edit = thread is None or thread[1] not in self._group_ts
                    acted = self.store.actions(alert.alert_id) if thread is not None and edit else None
                    channel, ts = self.notifier.post(alert, thread=thread, edit_parent=edit, actions=acted)
            except SlackError as exc:
                self.failed += 1
                METRICS.slack.labels("retry" if exc.retryable else "refused").inc()
                if exc.maybe_posted and alert.change == "fired":
                    self._maybe_posted.add(alert.alert_id)
                if exc.retryable:
                    raise
                log.error("slack_delivery_refused", alert_ids=[a.alert_id for a in group], change=alert.change,
                          reason=str(exc))  # fmt: skip
                self._drop(group)
                continue
            self._delivered(group, channel, ts)
            METRICS.slack.labels("ok").inc()
            if self.on_opened is not None and len(group) == 1 and alert.change == "fired" and ts:
                self.on_opened(alert, channel, ts)
            sent += 1
        if self._edits and self.notifier is not None and self.notifier.threads:
            self._edit_messages()
        return sent

    def _refresh_snoozes(self) -> None:
        """Snoozes end on the wall clock; a click may have reached another worker, so the
        store is re-read every ``snooze_refresh_s``."""
        now, wall = self._clock(), self._wall()
        if now - self._snoozes_read >= self.snooze_refresh_s:
            self._snoozed = {**self._snoozed, **self.store.snoozed(wall)}
            self._snoozes_read = now
        self._snoozed = {k: until for k, until in self._snoozed.items() if until > wall}

    def _delivered(self, group: list[Alert], channel: str, ts: str) -> None:
        for member in group:
            self.store.record_delivery(member.alert_id, member.change, channel, ts)
            self._done[(member.alert_id, member.change)] = (channel, ts)
        if len(group) > 1 and ts:
            self._group_ts.add(ts)
        self._drop(group)
        self.delivered += len(group)

    def _edit_messages(self) -> None:
        """Show open incidents' growing dollars on their message, at most once per ``edit_every_s``
        per incident (Slack limits chat.update to about one a second per channel)."""
        now = self._clock()
        due_in = []
        for alert_id, alert in list(self._edits.items()):
            if alert_id in self._snoozed:
                del self._edits[alert_id]
                continue
            thread = self._done.get((alert_id, "fired"))
            if thread is None or not thread[1] or thread[1] in self._group_ts:
                if thread is not None:  # a group's message, or a webhook's: nothing to edit
                    del self._edits[alert_id]
                continue  # not posted yet: wait for the opening
            wait = self._edited_at.get(alert_id, -1e18) + self.edit_every_s - now
            if wait > 0:
                due_in.append(wait)
                continue
            assert self.notifier is not None
            self.notifier.edit(alert, thread, self.store.actions(alert_id))  # SlackError propagates: retried
            self._edited_at[alert_id] = now
            del self._edits[alert_id]
        if due_in:
            self.hold_s = min([self.hold_s or min(due_in), *due_in])

    def _group_of(self, alert: Alert) -> list[Alert] | None:
        """The openings to post with ``alert`` (just it, for types that do not group), or None
        while its group is still collecting."""
        group = alert.group
        if alert.change != "fired" or group is None:
            return [alert]
        waited = self._clock() - self._queued_at.get(alert.alert_id, 0.0)
        if waited < self.group_wait_s:
            self.hold_s = self.group_wait_s - waited
            return None
        return [a for a in self._queue
                if a.change == "fired" and a.type == alert.type and a.group == group
                and a.channel == alert.channel and abs(a.fired_at - alert.fired_at) <= self.group_window_s
                and (a.alert_id, a.change) not in self._done]  # fmt: skip

    def _drop(self, group: list[Alert]) -> None:
        ids = {(a.alert_id, a.change) for a in group}
        self._queue = deque(a for a in self._queue if (a.alert_id, a.change) not in ids)
        for a in group:
            self._queued_at.pop(a.alert_id, None)
