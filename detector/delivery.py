"""The outbox: every opening and resolution reaches Slack once, each incident's in order.

Alerts are written to ClickHouse before they are queued here, and every
delivery is recorded there too, so after a crash or a rebalance the outbox is
rebuilt from the store (:meth:`Outbox.recover`) and what was already posted is
not posted again: the alert id is the idempotency key. A post is marked begun in
the store before it is sent; after a kill, one begun and never recorded as
delivered may be in Slack already, so it is looked for there before it is sent
again. A post's record as delivered goes into the store with the next post's mark
(or at the end of the pass): one insert a post, not two.

Threads: :meth:`Outbox.add` runs on the worker's event loop, :meth:`Outbox.snooze`
on a web request's thread, the delivery passes on the delivery thread. ``add`` only
appends to an inbox, which the delivery pass drains; the inbox, the snoozes and the
counts other threads read are guarded by one lock, and everything else belongs to
the delivery thread alone.

With several workers, each delivers the alerts of the keys on the input partitions it
holds (:meth:`Outbox.assign`); at a rebalance the old holder stops and drops what it had
queued (:meth:`Outbox.revoke`, after any post in progress), the new one recovers what is
stored and not posted, so no post is made by two workers.

Openings wait ``group_wait_s`` in the queue for company: those of one type and one
group (the team; the account for ``untagged``) that fired within ``group_window_s``
of event time go out as one message, every alert id recorded against it; their
resolutions reply in its thread without editing it. The wait holds up only the opening
and the later changes of its incident: the rest of the queue goes on past it.

The record of deliveries made is bounded: an alert's records leave memory once it has been closed for
``forget_after_s`` of event time (:mod:`detector.closed_alerts` says why that is safe, and when a change
is looked up in the store instead), and a recovery loads only those of open and recently closed alerts.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

import structlog

from detector.alerts import Alert
from detector.closed_alerts import DELIVERY_HORIZON_S, TOLD, ClosedAlerts
from detector.metrics import METRICS
from detector.slack import MAX_GROUP, SlackError, SlackNotifier
from detector.store import Store, alert_from_row
from detector.store.deliveries import Made
from detector.suppression import Silence
from detector.units import one_line

__all__ = ["REFUSED", "UNROUTED", "WITHDRAWN_UNPOSTED", "Outbox"]

UNROUTED = ("", "unrouted")
"""The (channel, ts) recorded for a change that is not Slack's: one ``routing.yaml`` sends elsewhere, or one of an
alert closed before Slack was set up (:meth:`Deliveries.start_slack`)."""
REFUSED = ("", "refused")
"""The (channel, ts) recorded for a post Slack refused for good (SLACK_CHANNEL itself ``not_in_channel`` or
``is_archived``, ``invalid_blocks``, ``msg_too_long``): kept, so a restart or a rebalance does not try it again, nor
every such post of the store's history at each one; a later change of its alert follows it."""
WITHDRAWN_UNPOSTED = ("", "withdrawn")
"""The (channel, ts) recorded for the opening and the withdrawal of a fire withdrawn before it was posted."""
MAX_CHANNEL_IDS = 10_000
"""Channel names whose ids are kept (:attr:`Outbox._channel_ids`): more than a workspace routes to."""
PACED_S = 60.0
"""How long after a channel's latest 429 its posts go out at most one a second (:attr:`Outbox._paced`)."""
MAY_POST_AGAIN_S = 0.5
"""How soon a pass that found :attr:`Outbox.may_post` false comes back."""

_ORDER = {"fired": 0, "resolved": 1, "withdrawn": 2, "corrected": 3}
"""The order an alert's changes are queued in after a restart."""

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
        landing_s: float = 30.0,
        forget_after_s: float = DELIVERY_HORIZON_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.notifier = notifier
        self.group_wait_s = group_wait_s
        self.group_window_s = group_window_s
        self.edit_every_s = edit_every_s
        self._clock = clock
        self._wall = wall
        """The wall clock snoozes are judged on."""
        self.snooze_refresh_s = 30.0
        self.on_opened: Callable[[Alert, str, str], None] | None = None
        """Called with (alert, channel, message ts) after an opening is posted alone (charts)."""
        self.wants: Callable[[Alert], bool] | None = None
        """Whether an alert goes to Slack (``routing.yaml`` ``send``; None: every alert). One that
        does not is recorded as handled (``unrouted``), so no restart posts it."""
        # Shared with other threads, under the lock.
        self._lock = threading.Lock()
        self._inbox: deque[tuple[Alert, float]] = deque()
        """Changes added (with the clock when added) that the next delivery pass takes in."""
        self._snoozed: dict[str, Silence] = {}
        """Alert id → its snooze (Slack's button: a silence of that one alert, on the wall clock):
        its changes are not posted while it is in force."""
        self._counts = (0, 0, 0)
        """(changes queued, edits waiting, delivered) as of the delivery thread's last step."""
        self._pass = threading.RLock()
        """Held by a delivery pass, and by :meth:`assign` / :meth:`revoke`, which change what it works on."""
        self._owned: set[int] | None = None
        """Input partitions whose alerts this outbox delivers (None: all, a single worker)."""
        self._started = False
        """Whether this outbox has marked the store as posting to Slack (:meth:`Deliveries.start_slack`)."""
        self._refused_again = True
        """Whether openings recorded refused may wait to be posted again (:meth:`_post_refused_again`): at the start
        and each assignment (refused before, by this worker or another), and once SLACK_CHANNEL has refused one."""
        # The delivery thread's own.
        self._queue: deque[Alert] = deque()
        self._queued: set[tuple[str, str]] = set()
        self._queued_at: dict[str, float] = {}
        self._done: dict[tuple[str, str], tuple[str, str]] = {}
        """(alert id, change) → (channel, ts) of what was delivered (or recorded as handled): of open
        alerts and those closed within ``forget_after_s`` (:attr:`_closed`); the store holds them all."""
        self._closed = ClosedAlerts(forget_after_s)
        self._group_ts: set[str] = set()
        """Message ts of group posts: resolutions reply there but do not edit them."""
        self._edits: dict[str, Alert] = {}
        """Alert id → its latest cost update not yet shown on its message."""
        self._edited_at: dict[str, float] = {}
        self._unedited: set[str] = set()
        """Alert ids whose message Slack refused to edit for good (deleted): their cost updates are not tried
        again (one refusal a minute each, logged, until they close)."""
        self._unrecorded: list[tuple[str, str, str, str, float]] = []
        """Deliveries made and not yet in the store (alert id, change, channel, ts, wall time of the
        post): written with the next post's mark, before that post, or at the end of the pass: one
        insert a post, not two; stamped with the post's time, not the insert's."""
        self._maybe_posted: dict[tuple[str, str], float] = {}
        """Posts that timed out, or were begun by a worker that died → wall time after which they
        are looked for in Slack (a request cut off may still land until then), then sent if absent."""
        self.landing_s = landing_s
        self._throttled: dict[str, float] = {}
        """Channel → the clock until which its posts wait (a 429's Retry-After; then, while it is :attr:`_paced`, a
        second after each post): its changes wait, the other channels' go on, so one team's storm does not hold up
        another team's alerts."""
        self._channel_ids: dict[str, str] = {}
        """A channel's name as routed (``#nlp-cost``) → its id, as Slack answered a post to it: the replies in its
        threads name it by id, and it is paced as one channel."""
        self._paced: dict[str, float] = {}
        """Channel → the clock until which it is posted to at most once a second (Slack's rate for a channel): a
        minute after its latest 429, so that a storm goes out at the rate Slack takes rather than one 429 a post."""
        self._snoozes_read = clock()
        self.failed = 0
        self.hold_s = 0.0
        """After a pass: seconds until a group waiting for company is due (0: none waits)."""
        self.may_post: Callable[[], bool] = lambda: True
        """Whether this worker may post for its partitions now: a worker frozen past its group's session
        posts nothing until the group is known to hold it still (its partitions may be another's; the
        worker's :class:`~streams.membership.Membership`). Asked before each post and edit."""

    def __len__(self) -> int:
        """Changes waiting to be posted."""
        with self._lock:
            return len(self._inbox) + self._counts[0]

    @property
    def has_work(self) -> bool:
        """Changes to post, or messages to edit with newer figures."""
        with self._lock:
            return bool(self._inbox) or self._counts[0] > 0 or self._counts[1] > 0

    @property
    def delivered(self) -> int:
        """Changes delivered since start."""
        with self._lock:
            return self._counts[2]

    def assign(self, partitions: Iterable[int]) -> int:
        """This worker now holds these input partitions: deliver the alerts of their keys, and
        recover those stored and not yet delivered (posted meanwhile by no one else, since the
        previous holder revoked first). Returns how many were recovered."""
        with self._pass:
            self._owned = set(partitions)
            return self.recover()

    def revoke(self) -> None:
        """The partitions are going to other workers: once any post in progress is done, drop
        what is queued (stored, so the next holder recovers it) and deliver nothing until
        :meth:`assign`."""
        with self._pass:
            self._record_delivered_or_leave()  # else the next holder looks for them in Slack
            self._owned = set()
            with self._lock:
                self._inbox.clear()
            self._queue.clear()
            self._queued.clear()
            self._queued_at.clear()
            self._edits.clear()
            self._unedited.clear()
            self._publish()

    def remembers(self, alert_id: str) -> bool:
        """Whether records of ``alert_id``'s deliveries are in memory (tests, inspection)."""
        return any((alert_id, change) in self._done for change in TOLD)

    def _owns(self, alert: Alert) -> bool:
        return self._owned is None or max(alert.partition, 0) in self._owned

    def recover(self) -> int:
        """Load past deliveries and queue what was stored but never delivered (of the partitions
        held); return how many. Posts begun and never recorded as delivered are looked for in
        Slack before posting."""
        if self.notifier is None:
            return 0
        if not self._started:
            marked = self.store.deliveries.start_slack(UNROUTED)
            if marked:
                log.info("slack_started", history_not_posted=marked,
                         note="changes of alerts closed before Slack was set up; the open ones are posted")  # fmt: skip
            self._started = True
        self._record_delivered_or_leave()
        self._refused_again = True
        made = self.store.deliveries.remembered(self._closed.recovered(self.store.alerts.newest()))
        self._done = {}
        self._remember(made)
        self._done.update(((a, c), (channel, ts)) for a, c, channel, ts, _ in self._unrecorded)  # made, whatever the store says
        snoozed = self.store.actions.snoozed(self._wall())
        with self._lock:
            self._snoozed.update(snoozed)
        pending = self.store.deliveries.undelivered(sorted(self._owned) if self._owned is not None else None)
        pending_keys = set(pending)
        for key, at in self.store.deliveries.attempted().items():
            if key in pending_keys:
                self._maybe_posted[key] = max(self._maybe_posted.get(key, 0.0), at + self.landing_s)
        ids = [alert_id for alert_id, _ in pending]
        rows = {r["alert_id"]: r for r in self.store.alerts.latest("alert_id IN %(ids)s", {"ids": ids})} if pending else {}
        now = self._clock()
        # Openings first: a withdrawal is dated by its stop, before its opening (and resolution), and drops it only once queued.
        recovered = [alert_from_row(rows[a], change) for a, change in sorted(pending, key=lambda p: _ORDER[p[1]]) if a in rows]
        self._recall(recovered)  # the thread of a change whose alert's records were not loaded
        for alert in recovered:
            self._closed.saw(alert)
            self._enqueue(alert, now - self.group_wait_s)
        self._publish()
        return len(pending)

    def _remember(self, made: Made) -> None:
        """Take records read from the store into memory, with when their alerts closed."""
        self._done.update(made.done)
        self._group_ts |= made.grouped
        for alert_id, at in made.closed.items():
            self._closed.closed(alert_id, at)

    def _recall(self, alerts: list[Alert]) -> None:
        """Read back from the store the records of those of ``alerts`` that memory may have forgotten
        and lacks (a replay of old events, a withdrawal after a long time): one query, none when none is."""
        wanted = {a.alert_id for a in alerts if self._closed.may_be_forgotten(a) and ((a.alert_id, "fired") not in self._done
                  or (a.change != "updated" and (a.alert_id, a.change) not in self._done))}  # fmt: skip
        if wanted:
            self._remember(self.store.deliveries.recall(sorted(wanted)))

    def _forget_closed(self) -> None:
        """Forget the records of alerts closed past the horizon (:mod:`detector.closed_alerts`): only
        once every delivery made is in the store, so that whatever is forgotten can be read back."""
        if self._unrecorded:
            return
        gone = self._closed.due(self._busy)
        if not gone:
            return
        self._done = {key: done for key, done in self._done.items() if key[0] not in gone}
        self._group_ts &= {ts for (_, kind), (_, ts) in self._done.items() if kind == "fired"}

    def _busy(self, alert_id: str) -> bool:
        """Whether a change of ``alert_id`` is queued, in doubt or has an edit waiting: its records stay."""
        return alert_id in self._edits or any((alert_id, change) in self._queued or (alert_id, change) in self._maybe_posted
                                              for change in TOLD)  # fmt: skip

    def snooze(self, silence: Silence) -> None:
        """Keep the incident a snooze names out of Slack while it is in force (any thread)."""
        with self._lock:
            for alert_id in silence.alert_ids:
                self._snoozed[alert_id] = silence

    def add(self, alerts: Iterable[Alert]) -> None:
        """Hand changes to the outbox (any thread; no I/O: this runs on the worker's event loop).
        Silenced changes are recorded in the store only."""
        if self.notifier is None:
            return
        now = self._clock()
        items = [(alert, now) for alert in alerts if not alert.silenced]
        if items:
            with self._lock:
                self._inbox.extend(items)

    def deliver_pending(self) -> int:
        """Deliver queued changes, each incident's in order (the delivery thread). A retryable failure stops
        the pass and leaves the rest queued (raise :class:`SlackError`); a permanent one is
        logged and skipped."""
        with self._pass:
            try:
                return self._deliver()
            finally:
                try:
                    self._record_delivered()  # kept for the next pass if the store refuses
                    self._forget_closed()
                finally:
                    self._publish()

    def _record_delivered(self) -> None:
        if self._unrecorded:
            self.store.deliveries.record_made(self._unrecorded)
            self._unrecorded = []

    def _record_delivered_or_leave(self) -> None:
        """:meth:`_record_delivered` where a failure must not stop the caller: a post begun and not
        recorded as delivered is looked for in Slack by whoever delivers its alert next."""
        try:
            self._record_delivered()
        except Exception as exc:  # noqa: BLE001 - the store's: logged, the marks are the fallback
            log.warning("delivery_records_left", deliveries=len(self._unrecorded), error=one_line(exc),
                        note="their posts will be looked for in Slack before being posted again")  # fmt: skip

    def _deliver(self) -> int:
        sent = 0
        self.hold_s = 0.0
        self._take_inbox()
        self._refresh_snoozes()
        self._post_refused_again()
        now = self._clock()
        self._throttled = {channel: until for channel, until in self._throttled.items() if until > now}
        self._paced = {channel: until for channel, until in self._paced.items() if until > now}
        held: set[str] = set()  # incidents whose opening collects its group: it and their later changes wait
        paced: set[str] = set()  # incidents whose channel Slack throttled: their changes wait for it (all in that channel)
        at, size = 0, len(self._queue)
        while self.notifier is not None:
            if len(self._queue) != size:  # posted or dropped: look again from the start (a group takes held openings too)
                held = {alert_id for alert_id in held if (alert_id, "fired") in self._queued}
                at, size = 0, len(self._queue)
            while at < size and (self._queue[at].alert_id in held or self._queue[at].alert_id in paced):
                at += 1
            if at == size:
                break
            alert = self._queue[at]
            key = (alert.alert_id, alert.change)
            if key in self._done:
                self._drop([alert])
                continue
            if self._is_snoozed(alert.alert_id):  # recorded as handled, so a restart does not post it late
                self.store.deliveries.record(alert.alert_id, alert.change, "", "snoozed")
                self._done[key] = ("", "snoozed")
                self._drop([alert])
                continue
            group = self._group_of(alert)
            if group is None:  # waiting for the rest of its group: the rest of the queue goes on, then the edits
                held.add(alert.alert_id)
                continue
            if self._follows_refused(alert):  # queued before its opening was refused
                self._drop([alert])
                continue
            thread = self._done.get((alert.alert_id, "fired"))
            doubtful = [a for a in group if (a.alert_id, a.change) in self._maybe_posted]
            if doubtful:  # any member of the message, not only its first: a group may form anew after a restart
                wait = max(self._maybe_posted[(a.alert_id, a.change)] for a in doubtful) - self._wall()
                if wait > 0:  # a post cut off by a timeout or a kill may still land: look after it could
                    self.hold_s = min(self.hold_s or wait, wait)  # (or sooner, a group held before it due)
                    return sent
                opened = self._openings_posted(doubtful)
                found = [a for a in doubtful if self._found(a, [a], self._done.get((a.alert_id, "fired")), opened)]
                if found:
                    continue  # those are delivered; the rest forms its message again
            to = self.notifier.destination(alert, thread)  # a name it is routed by, or the id a thread is in
            to = self._channel_ids.get(to, to)  # (one key a channel: Slack answers a post by name with its id)
            wait = self._throttled.get(to, 0.0) - self._clock()
            if wait > 0:  # the channel's posts wait for Slack's Retry-After; the next channel's go on
                paced.update(a.alert_id for a in group)
                self.hold_s = min(self.hold_s or wait, wait)
                continue
            if not self.may_post():  # asked again shortly: the revocation that may follow drops the queue
                self.hold_s = MAY_POST_AGAIN_S
                return sent
            # Before sending (every try): a kill from here on leaves the mark, and its time, for the next worker.
            self.store.deliveries.record_attempt([a.alert_id for a in group], alert.change, self._unrecorded)
            self._unrecorded = []
            try:
                if len(group) > 1:
                    channel, ts = self.notifier.post_group(group)
                else:
                    edit = thread is None or thread[1] not in self._group_ts
                    acted = self.store.actions.of(alert.alert_id) if thread is not None and edit else None
                    channel, ts = self.notifier.post(alert, thread=thread, edit_parent=edit, actions=acted)
            except SlackError as exc:
                self.failed += 1
                METRICS.slack.labels("retry" if exc.retryable else "refused").inc()
                if exc.maybe_posted:
                    landed_by = self._wall() + self.landing_s
                    self._maybe_posted.update(((a.alert_id, a.change), landed_by) for a in group)
                if exc.throttled is not None:  # Slack took none of it: that channel waits, the others go on
                    throttled = self._channel_ids.get(exc.throttled, exc.throttled)
                    self._throttled[throttled] = self._clock() + exc.retry_after_s
                    self._paced[throttled] = self._clock() + PACED_S
                    paced.update(a.alert_id for a in group)
                    self.hold_s = min(self.hold_s or exc.retry_after_s, exc.retry_after_s)
                    log.debug("slack_channel_throttled", channel=exc.throttled, retry_after_s=exc.retry_after_s)
                    continue
                if exc.retryable:
                    raise
                log.error("slack_delivery_refused", alert_ids=[a.alert_id for a in group], change=alert.change,
                          reason=str(exc))  # fmt: skip
                refused = [(a.alert_id, a.change) for a in group]
                # Stamped on this clock, as its attempt was: a post of the opening begun after it is one made again.
                self.store.deliveries.record_made([(*key, *REFUSED, time.time()) for key in refused])
                self._done.update(dict.fromkeys(refused, REFUSED))
                self._drop(group)
                self._refused_again = self._refused_again or self.notifier.channel in self.notifier.refusing
                continue
            self._delivered(group, channel, ts)
            # The name it went to, known now: SLACK_CHANNEL's if its own refused it just now, its own if it took it
            # again (``to`` was the other one then: Slack's answer is that one's id, not ``to``'s).
            went = self.notifier.destination(alert, thread)
            if channel and went != channel != self._channel_ids.get(went) and len(self._channel_ids) < MAX_CHANNEL_IDS:
                self._channel_ids[went] = channel
                for table in (self._throttled, self._paced):  # (kept by its id from now on)
                    if went in table:
                        table[channel] = max(table.pop(went), table.get(channel, 0.0))
            to = channel or to
            if self._paced.get(to, 0.0) > self._clock():  # (one a second, while Slack throttles the channel)
                self._throttled[to] = self._clock() + 1.0
            METRICS.slack.labels("ok").inc()
            if self.on_opened is not None and len(group) == 1 and alert.change == "fired" and ts:
                self.on_opened(alert, channel, ts)
            sent += 1
            self._post_refused_again()
        if self._edits and self.notifier is not None and self.notifier.threads and not self.may_post():
            self.hold_s = MAY_POST_AGAIN_S  # the edits, asked again shortly (the queue may be empty: nothing else wakes it)
        elif self._edits and self.notifier is not None and self.notifier.threads:
            self._record_delivered()  # before the edits' Slack calls: the pass's end write, made sooner
            self._edit_messages()
        return sent

    def _take_inbox(self) -> None:
        """Move what :meth:`add` handed over into the delivery thread's own queue and edits. A store
        error part way (reading back forgotten records, recording a change that goes nowhere) leaves
        the rest in the inbox, in order, for the next pass."""
        with self._lock:
            taken = list(self._inbox)
            self._inbox.clear()
        done = 0
        try:
            self._recall([alert for alert, _ in taken if self._owns(alert)])
            for alert, added_at in taken:
                self._take(alert, added_at)
                done += 1
        except BaseException:
            with self._lock:
                self._inbox.extendleft(reversed(taken[done:]))
            raise

    def _take(self, alert: Alert, added_at: float) -> None:
        """One change handed over: into the queue, the edits, or recorded as going nowhere."""
        self._closed.saw(alert)
        if not self._owns(alert):
            return  # its partition moved on: the new holder recovers it from the store
        if alert.change == "updated":
            if alert.alert_id not in self._unedited:
                self._edits[alert.alert_id] = alert  # only the latest matters
            return
        if alert.closes:
            self._edits.pop(alert.alert_id, None)  # the resolution rewrites the message anyway
            self._edited_at.pop(alert.alert_id, None)
            self._unedited.discard(alert.alert_id)
        self._enqueue(alert, added_at)

    def _withdrawn_unposted(self, alert_id: str) -> bool:
        """Whether the fire withdrawn (:attr:`~detector.alerts.Alert.withdrawn`) was still waiting in the
        queue, not posted nor perhaps posted: then neither its opening nor its withdrawal goes out (a
        backlog read fast brings both in one batch), nor a resolution queued behind the opening, and
        each is recorded as handled, so that a restart posts none."""
        opening = (alert_id, "fired")
        if opening not in self._queued or opening in self._done or opening in self._maybe_posted:
            return False
        changes = ("fired", "resolved", "withdrawn")
        self.store.deliveries.record_many([(alert_id, change, *WITHDRAWN_UNPOSTED) for change in changes])
        self._drop([a for a in self._queue if a.alert_id == alert_id])
        self._done.update(((alert_id, change), WITHDRAWN_UNPOSTED) for change in changes)
        return True

    def _enqueue(self, alert: Alert, added_at: float) -> None:
        key = (alert.alert_id, alert.change)
        if key in self._done or key in self._queued:
            return
        if alert.change != "fired" and alert.withdrawn and self._withdrawn_unposted(alert.alert_id):
            return  # (live, and after a restart: recover queues the opening, then this)
        if self._follows_refused(alert):
            return
        if self.wants is not None and (not self.wants(alert) or self._done.get((alert.alert_id, "fired")) == UNROUTED):
            self.store.deliveries.record(alert.alert_id, alert.change, *UNROUTED)  # its resolution follows its opening
            self._done[key] = UNROUTED
            return
        self._queue.append(alert)
        self._queued.add(key)
        self._queued_at.setdefault(alert.alert_id, added_at)

    def _post_refused_again(self) -> None:
        """SLACK_CHANNEL takes posts (the app invited at last, the channel unarchived): queue the openings recorded
        refused of incidents still open, of the partitions held, to be posted as they stand now. Before, each stayed
        out of Slack for good, however long it burned on. Done once SLACK_CHANNEL has taken a post (an alert's, a
        digest's), once a start or an assignment and once after each refusal of SLACK_CHANNEL itself: a message
        Slack refuses for what it says (``invalid_blocks``) is tried once more a start, not at every post."""
        if not self._refused_again or self.notifier is None or not self.notifier.default_took_post:
            return
        refused = self.store.deliveries.refused_openings(REFUSED, sorted(self._owned) if self._owned is not None else None)
        attempted = {a: at for a, at in refused if (a, "fired") not in self._queued}
        ids = list(attempted)
        rows = self.store.alerts.latest("alert_id IN %(ids)s", {"ids": ids}) if ids else []
        self._refused_again = False  # once read: a store error above leaves it for the next pass
        if not ids:
            return
        now = self._clock()
        for alert in sorted((alert_from_row(row, "fired") for row in rows), key=lambda a: (a.fired_at, a.alert_id)):
            key = (alert.alert_id, "fired")
            if self._done.get(key) in (REFUSED, None):
                self._done.pop(key, None)
                if attempted[alert.alert_id]:  # posted again before, never recorded: looked for in Slack first
                    self._maybe_posted[key] = max(self._maybe_posted.get(key, 0.0), attempted[alert.alert_id] + self.landing_s)
                self._enqueue(alert, now - self.group_wait_s)
        log.info("slack_refused_openings_posted_again", alerts=len(ids))

    def _follows_refused(self, alert: Alert) -> bool:
        """Whether ``alert``'s change follows its opening, which Slack refused for good: then it is recorded so too
        (no thread to reply in), as it comes or where it waits queued."""
        if alert.change == "fired" or self._done.get((alert.alert_id, "fired")) != REFUSED:
            return False
        self.store.deliveries.record(alert.alert_id, alert.change, *REFUSED)
        self._done[(alert.alert_id, alert.change)] = REFUSED
        return True

    def _openings_posted(self, doubtful: list[Alert]) -> dict[str, tuple[str, str]]:
        """Which of the openings in ``doubtful`` are in their channel: one read of each channel's history. Those
        routed elsewhere and not found there are looked for in SLACK_CHANNEL too, in one more read: a routed
        channel that refuses the app (``not_in_channel``...) has its openings posted there instead
        (:meth:`~detector.slack.SlackNotifier._send`), and one not found would be posted again."""
        assert self.notifier is not None
        default = self.notifier.channel
        by_channel: dict[str, list[str]] = {}
        for a in doubtful:
            if a.change == "fired":
                by_channel.setdefault(a.channel or default, []).append(a.alert_id)
        found: dict[str, tuple[str, str]] = {}
        for channel, ids in by_channel.items():
            found.update(self.notifier.find_openings(ids, channel))
        elsewhere = [i for channel, ids in by_channel.items() if channel != default for i in ids if i not in found]
        if elsewhere:
            found.update(self.notifier.find_openings(elsewhere, default))
        return found

    def _found(self, alert: Alert, group: list[Alert], thread: tuple[str, str] | None,
               opened: dict[str, tuple[str, str]] | None = None) -> bool:  # fmt: skip
        """Whether a post that may have landed is in Slack: if so it is recorded as delivered (an opening's
        message looked up in ``opened`` when given: :meth:`_openings_posted`)."""
        assert self.notifier is not None
        for member in group:
            self._maybe_posted.pop((member.alert_id, member.change), None)
        closing, said = alert.closes, False
        if closing:
            if thread is None or not thread[1]:
                return False
            found = None
            if alert.withdrawn:  # a reply saying withdrawn: the withdrawal too, if one follows a resolution
                found = self.notifier.find_posted(alert.alert_id, thread[0], thread_ts=thread[1], withdrawal=True)
                said = found is not None
            elif alert.corrected:  # a reply saying corrected: the correction too, if one follows a resolution
                found = self.notifier.find_posted(alert.alert_id, thread[0], thread_ts=thread[1], correction=True)
                said = found is not None
            if found is None and alert.change == "resolved":  # a resolution said before it was taken back or corrected
                found = self.notifier.find_posted(alert.alert_id, thread[0], thread_ts=thread[1])
        elif opened is not None:
            found = opened.get(alert.alert_id)
        else:
            found = self.notifier.find_posted(alert.alert_id, alert.channel or self.notifier.channel)
        if found is None:
            return False
        log.info("slack_post_found", alert_id=alert.alert_id, change=alert.change)
        self._delivered(group, *(thread if closing and thread else found), said=said)
        ts = found[1]
        if alert.change == "fired" and ts and any(kind == "fired" and other != alert.alert_id and done[1] == ts
                                                  for (other, kind), done in self._done.items()):  # fmt: skip
            self._group_ts.add(ts)  # a group's message, found member by member: not edited for one of them
        if closing and thread is not None and thread[1] not in self._group_ts:
            try:  # the parent's edit may not have followed the reply
                self.notifier.edit(alert, thread, self.store.actions.of(alert.alert_id))
            except SlackError as exc:
                log.warning("slack_edit_failed", alert_id=alert.alert_id, error=str(exc))
        return True

    def _is_snoozed(self, alert_id: str) -> bool:
        with self._lock:
            snoozed = self._snoozed.get(alert_id)
        return snoozed is not None and snoozed.active_at(self._wall())

    def _refresh_snoozes(self) -> None:
        """Snoozes end on the wall clock; a click may have reached another worker, so the
        store is re-read every ``snooze_refresh_s``."""
        now, wall = self._clock(), self._wall()
        read = None
        if now - self._snoozes_read >= self.snooze_refresh_s:
            read = self.store.actions.snoozed(wall)
            self._snoozes_read = now
        with self._lock:
            if read:
                self._snoozed.update(read)
            for alert_id in [k for k, silence in self._snoozed.items() if silence.ends <= wall]:
                del self._snoozed[alert_id]

    def _publish(self) -> None:
        """Let other threads see how much is queued (``len``, ``has_work``)."""
        with self._lock:
            self._counts = (len(self._queue), len(self._edits), self._counts[2])

    def _delivered(self, group: list[Alert], channel: str, ts: str, said: bool = True) -> None:
        """Record ``group``'s posts as made; ``said``: posted now with what the alerts say (not found in
        Slack after a timeout or a kill, posted before with what they said then)."""
        now = time.time()  # when Slack took it (or it was found there): its record's delivered_at
        for member in group:
            for change in member.told if said else (member.change,):
                self._unrecorded.append((member.alert_id, change, channel, ts, now))
                self._done[(member.alert_id, change)] = (channel, ts)
        if len(group) > 1 and ts:
            self._group_ts.add(ts)
        self._drop(group)
        with self._lock:
            queued, edits, delivered = self._counts
            self._counts = (queued, edits, delivered + len(group))

    def _edit_messages(self) -> None:
        """Show open incidents' growing dollars on their message, at most once per ``edit_every_s``
        per incident (Slack limits chat.update to about one a second per channel)."""
        now = self._clock()
        due_in = []
        for alert_id, alert in list(self._edits.items()):
            if self._is_snoozed(alert_id):
                del self._edits[alert_id]
                continue
            thread = self._done.get((alert_id, "fired"))
            if thread is None or not thread[1] or thread[1] in self._group_ts or thread in (UNROUTED, REFUSED):
                if thread is not None:  # a group's message, a webhook's, or none (routed elsewhere): nothing to edit
                    del self._edits[alert_id]
                continue  # not posted yet: wait for the opening
            wait = self._edited_at.get(alert_id, -1e18) + self.edit_every_s - now
            if wait > 0:
                due_in.append(wait)
                continue
            assert self.notifier is not None
            try:
                self.notifier.edit(alert, thread, self.store.actions.of(alert_id))
            except SlackError as exc:
                if exc.retryable:
                    raise  # Slack down or busy: the pass is retried with backoff, the edit kept
                # Refused for good (the message was deleted in Slack: message_not_found): it was raised as a
                # retry, every pass, forever, holding up the other incidents' edits and, backed off, every post.
                log.warning("slack_edit_refused", alert_id=alert_id, error=one_line(exc),
                            note="the message cannot be edited; its resolution still replies in its thread")  # fmt: skip
                self._unedited.add(alert_id)
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
            due_in = self.group_wait_s - waited
            self.hold_s = min(self.hold_s or due_in, due_in)  # the soonest of the groups collecting
            return None
        return [a for a in self._queue
                if a.change == "fired" and a.type == alert.type and a.group == group
                and a.channel == alert.channel and abs(a.fired_at - alert.fired_at) <= self.group_window_s
                and (a.alert_id, a.change) not in self._done][:MAX_GROUP]  # fmt: skip

    def _drop(self, group: list[Alert]) -> None:
        ids = {(a.alert_id, a.change) for a in group}
        self._queue = deque(a for a in self._queue if (a.alert_id, a.change) not in ids)
        self._queued -= ids
        for a in group:
            self._queued_at.pop(a.alert_id, None)
