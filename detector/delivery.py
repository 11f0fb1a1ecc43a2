"""The outbox: every opening and resolution reaches Slack once, in order.

Alerts are written to ClickHouse before they are queued here, and every
delivery is recorded there too, so after a crash or a rebalance the outbox is
rebuilt from the store (:meth:`Outbox.recover`) and what was already posted is
not posted again: the alert id is the idempotency key.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import structlog

from detector.alerts import Alert
from detector.slack import SlackError, SlackNotifier
from detector.store import Store, alert_from_row

__all__ = ["Outbox"]

log = structlog.get_logger("burnwatch.delivery")


class Outbox:
    def __init__(self, store: Store, notifier: SlackNotifier | None) -> None:
        self.store = store
        self.notifier = notifier
        self._queue: deque[Alert] = deque()
        self._done: dict[tuple[str, str], tuple[str, str]] = {}
        self.delivered = 0
        self.failed = 0

    def __len__(self) -> int:
        return len(self._queue)

    def recover(self) -> int:
        """Load past deliveries and queue what was stored but never delivered; return how many."""
        if self.notifier is None:
            return 0
        self._done = self.store.deliveries()
        pending = self.store.undelivered()
        ids = [alert_id for alert_id, _ in pending]
        rows = {r["alert_id"]: r for r in self.store.alerts("alert_id IN %(ids)s", {"ids": ids})} if pending else {}
        for alert_id, change in pending:
            if alert_id in rows:
                self._queue.append(alert_from_row(rows[alert_id], change))
        return len(pending)

    def add(self, alerts: Iterable[Alert]) -> None:
        if self.notifier is None:
            return
        for alert in alerts:
            if alert.change != "updated" and not alert.silenced and (alert.alert_id, alert.change) not in self._done:
                self._queue.append(alert)

    def deliver_pending(self) -> int:
        """Deliver queued changes in order. A retryable failure stops the pass and leaves the
        rest queued (raise :class:`SlackError`); a permanent one is logged and skipped."""
        sent = 0
        while self._queue and self.notifier is not None:
            alert = self._queue[0]
            key = (alert.alert_id, alert.change)
            if key in self._done:
                self._queue.popleft()
                continue
            thread = self._done.get((alert.alert_id, "fired"))
            try:
                channel, ts = self.notifier.post(alert, thread=thread)
            except SlackError as exc:
                self.failed += 1
                if exc.retryable:
                    raise
                log.error("slack_delivery_refused", alert_id=alert.alert_id, change=alert.change, reason=str(exc))
                self._queue.popleft()
                continue
            self.store.record_delivery(alert.alert_id, alert.change, channel, ts)
            self._done[key] = (channel, ts)
            self._queue.popleft()
            sent += 1
            self.delivered += 1
        return sent
