"""The outbox of the outputs besides Slack: every opening and resolution an alert's routing
names reaches each of its outputs once (docs/outputs.md).

The same guarantees as Slack's outbox (:mod:`detector.delivery`), per output:

- **stored before sent**: the alert change is in ClickHouse before it is handed here, and
  each send is marked begun in ``output_deliveries`` before the request leaves;
- **retried with backoff**: a receiver that is down or answers 5xx/429 is tried again (1 s,
  doubling to ``max_backoff_s``, or its ``Retry-After`` if longer, up to that), its queue
  kept in order; one output's outage holds up the others (one thread) at most one
  ``timeout_s`` per backoff: after a send with no answer the rest of its queue waits for
  its next try;
- **never twice**: (alert id, output, change) is the idempotency key; a change recorded
  ``sent``, ``refused`` or ``unknown`` is not sent again, after a restart either
  (:meth:`OutputOutbox.recover`). A send begun and never recorded (a kill, a timeout) may
  have reached the receiver: it is sent again only to a receiver that dedupes
  (Alertmanager, by labels; a webhook whose receiver honours ``Idempotency-Key``, said by
  ``receiver_dedupes``); otherwise it is recorded ``unknown`` and logged, not sent twice.

A restart recovers only changes stored since the output was first configured, so adding
an output does not replay the history to it. Alertmanager's firing alerts are posted again
every ``resend_s`` (:mod:`detector.outputs.alertmanager`).

The record of changes finished is bounded: an alert's leave memory once it has been closed for
``forget_after_s`` of event time, and a recovery loads only those of the alerts it recovers. A
change of an alert that memory may lack (:mod:`detector.closed_alerts`: one that started before the
latest close forgotten, or before the recovery) is looked up in the store before it is sent: a replay
of old events sends nothing twice.

Threads, as in Slack's outbox: :meth:`OutputOutbox.add` and :meth:`OutputOutbox.configure`
run on the worker's event loop and only hand over under a lock; the delivery passes, and
:meth:`assign` / :meth:`revoke` (partitions moving between workers), run on other threads
one at a time.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec
import structlog

from detector.alerts import Alert
from detector.closed_alerts import CLOSING, DELIVERY_HORIZON_S, TOLD, ClosedAlerts, closed_at
from detector.delivery import MAY_POST_AGAIN_S
from detector.logs import redact
from detector.metrics import METRICS
from detector.outputs.alertmanager import AlertmanagerOutput
from detector.outputs.base import Output, OutputError
from detector.outputs.config import AlertmanagerSpec, EmailSpec, WebhookSpec
from detector.outputs.email import EmailOutput
from detector.outputs.webhook import WebhookOutput
from detector.rules import Routing
from detector.store import Store, alert_from_row

__all__ = ["OutputOutbox", "build_outputs"]

log = structlog.get_logger("burnwatch.outputs")

Key = tuple[str, str]
"""(alert_id, change)."""


def build_outputs(routing: Routing, current: Callable[[], Routing]) -> dict[str, Output]:
    """The outputs ``routing`` defines besides Slack; ``current`` gives them the routing in force
    (links, owner tag) at each send."""
    built: dict[str, Output] = {}
    for name, spec in routing.outputs.items():
        if isinstance(spec, WebhookSpec):
            built[name] = WebhookOutput(name, spec, current)
        elif isinstance(spec, AlertmanagerSpec):
            built[name] = AlertmanagerOutput(name, spec, current)
        elif isinstance(spec, EmailSpec):
            built[name] = EmailOutput(name, spec, current)
    return built


def _labelled_as(sent: Alert, alert: Alert) -> Alert:
    """``alert``'s figures with what labels are made of (severity, tags, account, region) as
    in ``sent``, the change an output keeps open: Alertmanager tells alerts apart by labels,
    so a severity changed by a rules reload or a re-tagged team mid-episode would open a
    second alert there and leave the first to expire."""
    return msgspec.structs.replace(alert, severity=sent.severity, tags=sent.tags, account=sent.account,
                                   region=sent.region)  # fmt: skip


@dataclass
class _Lane:
    """One output's queue and record, the delivery thread's own."""

    output: Output
    queue: deque[Alert] = field(default_factory=deque)
    queued: set[Key] = field(default_factory=set)
    finished: set[Key] = field(default_factory=set)
    """Changes sent, refused or unknown: never sent again."""
    unrecorded: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    """Outcomes known here whose write to the store failed: written before the next send."""
    firing: dict[str, Alert] = field(default_factory=dict)
    """Alerts opened there and not resolved, re-sent every ``resend_s`` (Alertmanager)."""
    next_try: float = 0.0
    backoff: float = 0.0
    stalled: bool = False
    """A send of the last pass got no answer (recorded ``unknown``): back off before the next."""
    next_refresh: float = 0.0


class OutputOutbox:
    def __init__(
        self,
        store: Store,
        routing: Routing | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_backoff_s: float = 60.0,
        forget_after_s: float = DELIVERY_HORIZON_S,
    ) -> None:
        self.store = store
        self._clock = clock
        self.max_backoff_s = max_backoff_s
        # Shared with other threads, under the lock.
        self._lock = threading.Lock()
        self._inbox: deque[Alert] = deque()
        self._next: Routing | None = None
        """A routing handed over by :meth:`configure`, applied by the next pass."""
        self._counts = (0, 0)
        """(changes queued, delivered) as of the delivery thread's last step."""
        self._pass = threading.RLock()
        self._owned: set[int] | None = None
        # The delivery thread's own.
        self.routing = Routing()
        self._lanes: dict[str, _Lane] = {}
        self._closed = ClosedAlerts(forget_after_s)
        """When the alerts whose changes the lanes finished closed: their records are forgotten past the horizon."""
        self.hold_s = 0.0
        """After a pass: seconds until a retry or a re-send is due (0: nothing waits)."""
        self.may_post: Callable[[], bool] = lambda: True
        """Whether this worker may send for its partitions now (as :attr:`detector.delivery.Outbox.may_post`):
        asked before each send and re-send."""
        self.failed = 0
        self._delivered = 0
        self._apply(routing or Routing())

    # -- any thread ---------------------------------------------------------------------

    @property
    def outputs(self) -> list[str]:
        """Names of the outputs configured (besides Slack)."""
        with self._lock:
            return list(self._lanes)

    def __len__(self) -> int:
        with self._lock:
            return len(self._inbox) + self._counts[0]

    @property
    def delivered(self) -> int:
        with self._lock:
            return self._counts[1]

    @property
    def has_work(self) -> bool:
        with self._lock:
            return bool(self._inbox) or self._counts[0] > 0 or self._next is not None

    def configure(self, routing: Routing) -> None:
        """A new routing (a rules reload): the next pass builds its outputs (no I/O here)."""
        with self._lock:
            self._next = routing

    def add(self, alerts: Iterable[Alert]) -> None:
        """Hand stored changes over (no I/O: this runs on the worker's event loop). Held-back
        (silenced) changes are not sent anywhere, except the resolution of an alert an
        output keeps open (a silence added since its opening was sent: without it, it would
        be re-sent as firing for good)."""
        items = [alert for alert in alerts if not alert.silenced or alert.closes]
        if items:
            with self._lock:
                self._inbox.extend(items)

    def remembers(self, alert_id: str) -> bool:
        """Whether an output's record of a change of ``alert_id`` finished is in memory (tests, inspection)."""
        with self._pass:
            return any(key[0] == alert_id for lane in self._lanes.values() for key in lane.finished)

    # -- the delivery thread ------------------------------------------------------------

    def assign(self, partitions: Iterable[int]) -> int:
        """This worker now holds these input partitions: deliver their alerts, and recover what
        is stored and not delivered. Returns how many changes were recovered."""
        with self._pass:
            self._owned = set(partitions)
            return self.recover()

    def revoke(self) -> None:
        """The partitions go to other workers: after any send in progress, drop what is queued
        (stored: the next holder recovers it) and deliver nothing until :meth:`assign`."""
        with self._pass:
            self._owned = set()
            with self._lock:
                self._inbox.clear()
            for lane in self._lanes.values():
                lane.queue.clear()
                lane.queued.clear()
                lane.firing.clear()
            self._publish()

    def recover(self) -> int:
        """Queue the changes stored and not delivered to each output (of the partitions held, and
        stored since the output was first configured); load the alerts still firing there."""
        with self._pass:
            self._take_config()
            newest = self.store.alerts.newest()
            if newest is not None:  # what finished before this is not loaded, unless still owed (nor by a lane added later)
                self._closed.forgot(newest)
            if not self._lanes:
                return 0
            since = self.store.outputs.enabled_since(list(self._lanes))
            found = 0
            for name, lane in self._lanes.items():
                found += self._recover(name, lane, since[name])
            self._publish()
            return found

    def _recover(self, name: str, lane: _Lane, since: float) -> int:
        owned = sorted(self._owned) if self._owned is not None else None
        rows = self.store.outputs.owed(name, since, owned, firing=bool(lane.output.resend_s))
        rows = [r for r in rows if name in self.routing.outputs_for(dict(r["tags"]), r["severity"])]
        if not rows:
            return 0
        finished = self.store.outputs.finished(name, [r["alert_id"] for r in rows])
        sent = {key for key, state in finished.items() if state == "sent"}
        lane.finished.update(finished)
        begun = self.store.outputs.begun(name)
        pending: list[tuple[float, int, Alert]] = []
        for row in rows:
            changes = ["fired", "resolved"] if row["status"] == "resolved" else ["fired"]
            if row["taken_back"]:
                changes.append("withdrawn")
            if row["correction"]:
                changes.append("corrected")
            for order, change in enumerate(changes):
                alert = alert_from_row(row, change)
                self._closed.saw(alert)
                key = (alert.alert_id, change)
                if key in lane.finished:
                    continue
                if change == "resolved" and row["taken_back"] and key in begun:  # its content may be the resolution's:
                    self._finish(name, lane, alert, "unknown", "begun before a restart; taken back since: its withdrawal is sent",
                                 said=False)  # (sent again, now withdrawn, a deduping receiver would drop it)  # fmt: skip
                    continue
                if change == "resolved" and row["correction"] and key in begun:  # its figures may be the first ones:
                    self._finish(name, lane, alert, "unknown", "begun before a restart; corrected since: its correction is sent",
                                 said=False)  # (sent again, now corrected, a deduping receiver would drop it)  # fmt: skip
                    continue
                if key in begun and not lane.output.dedupes:
                    self._finish(name, lane, alert, "unknown", "begun before a restart; the receiver does not dedupe")
                    log.error("output_send_unknown", output=name, alert_id=alert.alert_id, change=change,
                              reason="a send begun before the restart may have arrived; not sent twice")  # fmt: skip
                    continue
                at = alert.resolved_at if alert.closes and alert.resolved_at is not None else alert.fired_at
                pending.append((at, order, alert))
            if lane.output.resend_s and row["status"] == "firing" and (row["alert_id"], "fired") in sent:
                lane.firing[row["alert_id"]] = alert_from_row(row, "fired")
        for _, _, alert in sorted(pending, key=lambda p: (p[1], p[0], p[2].alert_id)):  # openings first: a withdrawal
            # is dated by its stop, before its opening (sent after, the opening would open it again)
            self._enqueue(lane, alert)
        lane.next_refresh = self._clock()  # the receiver may have expired them while no one held them
        self._flush(name, lane)
        return len(pending)

    def deliver_pending(self) -> int:
        """One pass over every output whose retry is due: send what is queued, in order; re-send
        what is firing where due. Returns the changes delivered. Failures are retried later
        (:attr:`hold_s` says when), never raised."""
        with self._pass:
            try:
                return self._deliver()
            finally:
                self._forget_closed()
                self._publish()

    def _deliver(self) -> int:
        self._take_config()
        self._take_inbox()
        sent = 0
        waits: list[float] = []
        for name, lane in self._lanes.items():
            if not self.may_post():  # (below)
                break
            now = self._clock()
            if now < lane.next_try:
                waits.append(lane.next_try - now)
                continue
            try:
                self._flush(name, lane)
                sent += self._drain(name, lane)
                if lane.stalled:  # the rest waits: a receiver that hangs holds up the others once a backoff
                    lane.stalled = False
                    waits.append(self._back_off(lane))
                    continue
                if lane.output.resend_s and lane.firing and now >= lane.next_refresh and self.may_post():
                    self._refresh(name, lane, now)
                lane.backoff = 0.0
            except Exception as exc:  # noqa: BLE001 - the receiver's (OutputError) or the store's
                self.failed += 1
                wait = self._back_off(lane, exc.retry_after_s if isinstance(exc, OutputError) else None)
                waits.append(wait)
                METRICS.outputs.labels(name, "retry").inc()
                event = "output_delivery_retry" if isinstance(exc, OutputError) else "output_store_error"
                log.warning(event, output=name, error=str(exc)[:500], retry_in_s=round(wait, 3), pending=len(lane.queue))
                continue
            if lane.output.resend_s and lane.firing:
                waits.append(max(0.01, lane.next_refresh - self._clock()))
        if not self.may_post():  # asked again shortly: the revocation that may follow drops the queues
            waits.append(MAY_POST_AGAIN_S)
        self.hold_s = min(waits) if waits else 0.0
        return sent

    def _back_off(self, lane: _Lane, asked_s: float | None = None) -> float:
        """The wait before the lane's next try: the backoff, or as long as the receiver asked
        (``Retry-After``) up to ``max_backoff_s``, so a rate-limited receiver is not hammered
        and an absurd ask (a year) does not hold its alerts for good."""
        lane.backoff = min(max(1.0, lane.backoff * 2), self.max_backoff_s)
        wait = max(lane.backoff, min(asked_s or 0.0, self.max_backoff_s))
        lane.next_try = self._clock() + wait
        return wait

    def _refresh(self, name: str, lane: _Lane, now: float) -> None:
        """Send the firing alerts again; a refusal is logged (the next re-send is due as usual),
        a retryable failure retried on the lane's backoff."""
        try:
            lane.output.refresh(list(lane.firing.values()))
        except OutputError as exc:
            if exc.retryable:
                raise
            log.error("output_refresh_refused", output=name, alerts=len(lane.firing), reason=str(exc)[:500])
        lane.next_refresh = now + lane.output.resend_s

    def _drain(self, name: str, lane: _Lane) -> int:
        sent = 0
        output = lane.output
        while lane.queue:
            alert = lane.queue[0]
            key = (alert.alert_id, alert.change)
            if key in lane.finished:
                self._pop(lane)
                continue
            if not self.may_post():
                return sent
            # Before sending (every try): a kill from here on leaves the mark for the next worker.
            self.store.outputs.record([(alert.alert_id, name, alert.change, "sending", "")])
            try:
                try:
                    detail = output.send(alert)
                except OutputError:
                    raise
                except Exception as exc:  # noqa: BLE001 - unforeseen (a malformed answer, a bug): it may have left
                    raise OutputError(f"{name}: {type(exc).__name__}: {redact(str(exc))}", retryable=True,
                                      maybe_sent=True) from exc  # fmt: skip
            except OutputError as exc:
                if exc.retryable and not exc.maybe_sent:  # certainly not received: a kill now must not leave it begun
                    self._not_sent(name, alert, exc)
                if exc.retryable and (not exc.maybe_sent or output.dedupes):
                    raise
                state = "unknown" if exc.maybe_sent else "refused"
                METRICS.outputs.labels(name, state).inc()
                log.error("output_delivery_" + state, output=name, alert_id=alert.alert_id, change=alert.change,
                          reason=str(exc)[:500])  # fmt: skip
                self._finish(name, lane, alert, state, str(exc)[:500])
                if exc.maybe_sent:  # no answer in time (or a cut): the next change would likely wait as long
                    lane.stalled = True
                    return sent
                continue
            METRICS.outputs.labels(name, "ok").inc()
            self._finish(name, lane, alert, "sent", detail)
            if output.resend_s:
                if alert.change == "fired":
                    if not lane.firing:  # the first open there: its re-send is due in resend_s, not in this pass
                        lane.next_refresh = self._clock() + output.resend_s
                    lane.firing[alert.alert_id] = alert
                else:
                    lane.firing.pop(alert.alert_id, None)
            sent += 1
            self._delivered += 1
        return sent

    def _not_sent(self, name: str, alert: Alert, exc: OutputError) -> None:
        try:
            self.store.outputs.record([(alert.alert_id, name, alert.change, "not_sent", redact(str(exc))[:500])])
        except Exception as error:  # noqa: BLE001 - left begun: after a kill, taken as maybe sent (never twice)
            log.warning("output_store_error", output=name, error=str(error)[:300])

    def _finish(self, name: str, lane: _Lane, alert: Alert, state: str, detail: str, said: bool = True) -> None:
        """Known here at once (so nothing is sent twice), then written to the store; a failed
        write is retried before the output's next send. ``said``: what was sent (or may have been)
        is ``alert`` as it stands, not a send begun before a restart with what it said then."""
        key = (alert.alert_id, alert.change)
        changes = alert.told if said else (alert.change,)
        lane.finished.update((alert.alert_id, change) for change in changes)
        if alert.closes:  # sent, refused or unknown: never re-sent as firing again
            lane.firing.pop(alert.alert_id, None)
        if lane.queue and (lane.queue[0].alert_id, lane.queue[0].change) == key:
            self._pop(lane)
        lane.unrecorded.extend((alert.alert_id, name, change, state, redact(detail)) for change in changes)
        self._flush(name, lane)

    def _flush(self, name: str, lane: _Lane) -> None:
        if lane.unrecorded:
            self.store.outputs.record(lane.unrecorded)  # type: ignore[arg-type]
            lane.unrecorded.clear()

    def _pop(self, lane: _Lane) -> None:
        alert = lane.queue.popleft()
        lane.queued.discard((alert.alert_id, alert.change))

    def _enqueue(self, lane: _Lane, alert: Alert) -> None:
        key = (alert.alert_id, alert.change)
        if key not in lane.finished and key not in lane.queued:
            lane.queue.append(alert)
            lane.queued.add(key)

    def _take_inbox(self) -> None:
        with self._lock:
            taken = list(self._inbox)
            self._inbox.clear()
        try:
            self._recall(taken)
        except BaseException:  # the store's: taken again at the next pass
            with self._lock:
                self._inbox.extendleft(reversed(taken))
            raise
        for alert in taken:
            self._closed.saw(alert)
            if self._owned is not None and max(alert.partition, 0) not in self._owned:
                continue  # its partition moved on: the new holder recovers it
            names = self.routing.outputs_for(alert.tags, alert.severity) if not alert.silenced else []
            for name, lane in self._lanes.items():
                firing = lane.firing.get(alert.alert_id)
                if name not in names and firing is None:
                    continue  # an alert open there hears of its changes whatever its routing says now
                # Labels as first sent there: another severity or team would be another alert.
                change = alert if firing is None else _labelled_as(firing, alert)
                if change.change == "updated":  # newer figures for the next re-send only
                    if firing is not None:
                        lane.firing[change.alert_id] = msgspec.structs.replace(change, change="fired")
                    continue
                self._enqueue(lane, change)

    def _recall(self, alerts: list[Alert]) -> None:
        """Read back from the store, for each output, what it finished of those of ``alerts`` that
        memory may have forgotten and lacks: one query an output, none when none is."""
        maybe = [a for a in alerts if a.change != "updated" and self._closed.may_be_forgotten(a)]  # (an update sends nothing)
        for name, lane in self._lanes.items():
            wanted = {a.alert_id: a for a in maybe if (a.alert_id, a.change) not in lane.finished}
            if not wanted:
                continue
            finished = self.store.outputs.finished(name, sorted(wanted))
            lane.finished.update(finished)
            for alert_id, change in finished:
                if change in CLOSING:  # closed there: forgotten again in time
                    self._closed.closed(alert_id, closed_at(wanted[alert_id]))

    def _forget_closed(self) -> None:
        """Forget what the outputs finished of alerts closed past the horizon (:mod:`detector.closed_alerts`),
        once every outcome is in the store, so that whatever is forgotten can be read back."""
        if any(lane.unrecorded for lane in self._lanes.values()):
            return
        gone = self._closed.due(self._busy)
        for lane in self._lanes.values() if gone else ():
            lane.finished = {key for key in lane.finished if key[0] not in gone}

    def _busy(self, alert_id: str) -> bool:
        """Whether an output has a change of ``alert_id`` queued, or keeps it open: its records stay."""
        return any(alert_id in lane.firing or any((alert_id, change) in lane.queued for change in TOLD)
                   for lane in self._lanes.values())  # fmt: skip

    def _take_config(self) -> None:
        with self._lock:
            routing, self._next = self._next, None
        if routing is not None:
            self._apply(routing)

    def _apply(self, routing: Routing) -> None:
        """Use ``routing``'s outputs: lanes of outputs kept keep their queues; a new output
        starts empty (recovery covers changes stored from now on); a removed one is dropped."""
        self.routing = routing
        built = build_outputs(routing, lambda: self.routing)
        lanes = {}
        for name, output in built.items():
            lane = self._lanes.get(name) or _Lane(output)
            lane.output = output
            lanes[name] = lane
        added = [name for name in lanes if name not in self._lanes]
        with self._lock:
            self._lanes = lanes
        if added:
            # A new lane knows nothing it may have finished before (a removed output back): looked up
            # (what came before the last assignment: recover's mark).
            self._closed.forgot(self._closed.newest)
            try:
                self.store.outputs.enabled_since(added)
            except Exception as exc:  # noqa: BLE001 - marked at the next recovery
                log.warning("output_enable_unrecorded", outputs=added, error=str(exc)[:300])
        for name in added:
            log.info("output_configured", output=name, kind=routing.outputs[name].kind)

    def _publish(self) -> None:
        with self._lock:
            self._counts = (sum(len(lane.queue) for lane in self._lanes.values()), self._delivered)
