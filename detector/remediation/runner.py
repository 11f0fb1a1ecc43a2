"""The worker's side of actions: propose those due, carry out those decided, on the wall clock.

Detection runs on event time; an API call is a real-world side effect, so it happens
here, on the worker's clock, one pass at a time (:meth:`ActionRunner.run_once`, from a
timer of the worker that holds input partition 0: one worker of a group acts). Each step
is stored in ``remediation_actions`` before what it announces is done: a call is marked
``begun`` before it is made, so a worker killed mid-call finds the mark after its restart
(:meth:`ActionRunner.recover`) and asks the API whether the call took
(``observe``) instead of calling again blindly; if it cannot tell, the action ends
``interrupted`` and is reported for a person to check.

An incident whose latest event time is older than ``fresh_s`` on the wall clock is never
acted on: that is a replay of past events or a backlog, not waste happening now
(``burnwatch backtest`` runs no worker at all, so it never acts). That is checked when an
action is proposed and again when it would be carried out (its grace ended, an approval, a
retry): the events may have stopped in between, and what they said is no longer known. Then the
action waits for them (it is not cancelled: a detector that judges hourly, a backlog being caught
up or an exporter restarting leave an incident quiet a while), and is cancelled if it resolves.

The rules as loaded now decide whether a pending action still goes ahead: one whose rule was
removed, disabled, set to ``dry_run`` or ``notify_only``, or changed to another kind (or from
``auto_unless_objected`` to ``approve``) is cancelled at the next pass, so editing the rules
and reloading them is how an operator stops every action at once. An ``auto_unless_objected``
action is never carried out without its warning in Slack: without a Slack notifier it is not
applicable.

A call to a cloud's API may take a minute; the pass does not hold the lock a click takes
(:meth:`decide`) while an action's call waits, so an Approve or Decline on another incident is
answered at once. (The look-ups before a cancellation and after a restart, ``observe``, still hold it.)

With several workers, a decision (a Slack click, the incidents page) may reach a worker that
does not act. :meth:`ActionRunner.decide` checks it against the stored steps, not memory, and
only records it there; the acting worker reads, each pass, the decisions stored for the
actions it holds pending (:meth:`ActionRunner._take_decisions`), and once more just before an
automatic action is carried out, so an objection recorded anywhere before the grace ends
stops it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import structlog

from detector.alerts import Alert
from detector.metrics import METRICS
from detector.remediation.base import Call, Executor, NotApplicable, Outcome, Target
from detector.remediation.messages import action_blocks, describe_call
from detector.remediation.policy import Action, may_approve
from detector.remediation.spec import ActionSpec
from detector.rules import RuleSet
from detector.store import ActionStep, Store, alert_from_row
from detector.units import epoch, format_duration, rfc3339

__all__ = ["ActionRunner"]

log = structlog.get_logger("burnwatch.actions")


class ActionRunner:
    """Proposes, decides (auto), executes and records actions; takes Slack decisions."""

    def __init__(
        self,
        store: Store,
        executors: Mapping[str, Executor],
        ruleset: Callable[[], RuleSet],
        notifier: Any = None,
        *,
        wall: Callable[[], float] = time.time,
        max_attempts: int = 4,
        backoff_s: float = 30.0,
        fresh_s: float = 3600.0,
    ) -> None:
        self.store = store
        self.executors = executors
        self.ruleset = ruleset
        self.notifier = notifier
        self._wall = wall
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.fresh_s = fresh_s
        self._lock = threading.RLock()
        """Held by a pass and by a decision (a click on a web request's thread)."""
        self._actions: dict[str, Action] = {}
        self._unannounced: set[str] = set()
        self._doubtful: set[str] = set()
        """Actions whose message may be in Slack unrecorded (a post that failed or timed out, or
        one a killed worker made before storing ``announced``): looked for before posting."""
        self._recovered = False
        self._acting = False
        """A pass ran here since the last :meth:`reset`: this worker holds the actions in memory."""
        self._stale_logged: set[str] = set()
        """Alerts whose events were too old to propose on (logged once)."""
        self._waiting: dict[str, str] = {}
        """Actions held because their incident's events stopped, and why: said in their message until they act."""
        self._count = 0
        """Steps taken since start."""
        self._resets = 0
        """Times :meth:`reset` ran: a pass that finds it moved while it waited on an API stops there."""
        self.wake = threading.Event()
        """Set by a decision: the worker's timer runs a pass without waiting for its interval."""

    @property
    def acting(self) -> bool:
        """Whether this worker runs the passes (holds partition 0); elsewhere a decision is
        only recorded, and the acting worker carries it out."""
        return self._acting

    # -- recovery ---------------------------------------------------------------------

    def recover(self) -> int:
        """Rebuild every action's state from the audit; an action begun and never finished
        (the worker died mid-call) is looked up in the API before anything else. Returns how
        many actions are still open."""
        with self._lock:
            self._actions = Action.from_steps(self.store.remediations.steps())
            self._unannounced = {k for k, a in self._actions.items() if a.message is None and a.state in _SHOWN}
            self._doubtful = set(self._unannounced)
            self._recovered = True
            for action in [a for a in self._actions.values() if a.state == "begun"]:
                self._resume_begun(action)
            return sum(1 for a in self._actions.values() if not a.ended)

    def reset(self) -> None:
        """This worker no longer acts (its partitions moved): forget, recover when it acts again. It can land
        while a pass waits on a cloud API with the lock released (:meth:`_unlocked`): that pass then ends."""
        with self._lock:
            self._resets += 1
            self._actions.clear()
            self._waiting.clear()
            self._recovered = False
            self._acting = False

    def _resume_begun(self, action: Action) -> None:
        executor = self.executors.get(action.kind)
        observe = getattr(executor, "observe", None)
        found: Outcome | None = observe(action.call) if observe is not None and action.call is not None else None
        now = self._wall()
        if found is not None and found.ok:
            self._finish(action, found, now)
            return
        why = "the worker stopped during the call and the result could not be confirmed; check by hand"
        self._step(action, "interrupted", now, decided_by="worker", result=why)
        log.error("action_interrupted", action=action.key, call=describe_call(action))
        self._show(action, now)

    # -- the pass ---------------------------------------------------------------------

    def run_once(self, allowed: Callable[[], bool] | None = None) -> int:
        """One pass: propose what is due, cancel what resolved, act on what is decided.
        Returns the number of steps taken. ``allowed``: asked under the pass's lock, so a
        worker told to stop acting (its partitions moved) starts no pass after that."""
        with self._lock:
            if allowed is not None and not allowed():
                return 0
            self._acting = True
            if not self._recovered:
                self.recover()
            before, resets = self._count, self._resets
            self._take_decisions(self._wall())
            ruleset = self.ruleset()
            specs = {r.detector.name: r.source.action for r in ruleset.rules
                     if r.source is not None and r.source.action.acts}  # fmt: skip
            open_kinds: dict[str, set[str]] = {}
            for a in self._actions.values():
                if not a.ended:
                    open_kinds.setdefault(a.alert_id, set()).add(a.kind)
            open_ids = sorted(open_kinds)
            if not specs and not open_ids:
                return 0
            now = self._wall()
            rows = self.store.alerts.latest(  # firing and recent (older ones are never acted on), or acted on
                "(rule IN %(rules)s AND status = 'firing' AND held = '' "
                "AND updated_at >= fromUnixTimestamp64Milli(%(since)s, 'UTC')) OR alert_id IN %(open)s",
                {"rules": sorted(specs) or [""], "open": open_ids or [""], "since": int((now - self.fresh_s) * 1000)},
            )
            snoozed: dict[str, Any] | None = None
            for row in rows:
                alert = alert_from_row(row)
                spec = specs.get(alert.rule)
                kinds = set(open_kinds.get(alert.alert_id, ()))
                if spec is not None:
                    kinds.add(spec.kind)
                for kind in sorted(kinds):
                    action = self._actions.get(f"{alert.alert_id}:{kind}")
                    if action is None or self._asked_again(action, spec):
                        if spec is not None and alert.status == "firing":
                            self._maybe_propose(alert, spec, now)
                        continue
                    if action.ended:
                        self._waiting.pop(action.key, None)
                        continue
                    if action.state == "begun":
                        continue  # its call is under way, or recover() looks it up
                    if action.stoppable and now >= (action.due_at or 0.0):
                        self._take_decisions(now, [action.key])  # a Decline stored elsewhere since the pass began
                    if action.state == "retry" and action.stop_asked_by:
                        self._cancel(action, now, action.stop_asked_by, "declined while it waited to be tried again")
                        if self._resets != resets:
                            return self._moved(before)
                        continue
                    stop = ("resolved", "the incident resolved") if alert.status == "resolved" else self._withdrawn(action, specs)
                    if stop is not None:
                        self._cancel(action, now, *stop)
                        if self._resets != resets:
                            return self._moved(before)
                        continue
                    if self._acts_now(action, now) and self._held_stale(action, alert, now):
                        continue  # acted on once its events come again (or cancelled when it resolves)
                    if action.state == "proposed" and action.mode == "auto_unless_objected":
                        if snoozed is None:
                            snoozed = self.store.actions.snoozed(now)
                        if alert.alert_id not in snoozed and action.due_at is not None and now >= action.due_at and (
                            action.message is not None  # never before the warning
                        ) and not self._take_decisions(now, [action.key]):  # an objection just stored elsewhere
                            snoozed = self.store.actions.snoozed(now)  # and a snooze clicked since this pass read them
                            if alert.alert_id not in snoozed:
                                self._step(action, "approved", now, decided_by="auto")
                        if alert.alert_id in snoozed and action.state == "proposed":
                            self._step(action, "cancelled", now, decided_by="snoozed", result=snoozed[alert.alert_id].reason)
                            self._show(action, now)
                    if action.state == "approved" or (action.state == "retry" and now >= (action.due_at or 0.0)):
                        self._execute(action, now)
                        if self._resets != resets:
                            return self._moved(before)
                        now = self._wall()  # the call took time, and a click on another thread may have stored
                        # a step meanwhile: later steps of this pass are stamped after it, so the audit reads in order
            for key in sorted(self._unannounced):
                if key in self._actions:
                    self._announce(self._actions[key], now)
            return self._count - before

    def _moved(self, before: int) -> int:
        """End a pass whose worker stopped acting (:meth:`reset`) while it waited on an API: every action it
        would go on to read is the new holder's, and to this worker's emptied memory each looked unproposed
        (it proposed and announced them all again, a second message with buttons)."""
        log.info("actions_pass_ended_moved", steps=self._count - before)
        return self._count - before

    @staticmethod
    def _asked_again(action: Action, spec: ActionSpec | None) -> bool:
        """Whether ``action`` ended without acting because of the rules, and its rule now asks for it in earnest: a dry
        run (a rule rolled out after watching its dry runs), or one the rules withdrew (every action set to dry_run to
        stop them all, then set back; a mode changed from auto_unless_objected to approve). Proposed again (same key,
        a new message): or the incident, still burning, would never be offered the action again."""
        if spec is None or spec.kind != action.kind or spec.mode == "dry_run":
            return False
        return action.state == "dry_run" or (action.state == "cancelled" and action.decided_by == "rules")

    def _withdrawn(self, action: Action, specs: Mapping[str, ActionSpec]) -> tuple[str, str] | None:
        """(who, why) if the rules as loaded now no longer ask for this pending action; None if they do."""
        spec = specs.get(action.rule)
        if spec is None:
            return "rules", f"rule {action.rule} no longer asks for an action (removed, disabled or notify_only)"
        if spec.kind != action.kind:
            return "rules", f"rule {action.rule} now asks for {spec.kind}, not {action.kind}"
        if spec.mode == "dry_run":
            return "rules", f"rule {action.rule} is now a dry run"
        if action.mode == "auto_unless_objected" and spec.mode != action.mode:
            return "rules", f"rule {action.rule} now asks for an approval ({spec.mode}), not to act unless objected"
        if action.mode == "auto_unless_objected" and self.notifier is None:
            return "no Slack", "nobody would see its warning (no Slack is configured): use mode approve"
        return None

    def _acts_now(self, action: Action, now: float) -> bool:
        """Whether this pass would carry the action out (or auto-approve it) were nothing to stop it."""
        due = action.due_at is not None and now >= action.due_at
        warned = action.message is not None
        return (action.state == "approved" or (action.state == "retry" and due)
                or (action.state == "proposed" and action.mode == "auto_unless_objected" and due and warned))  # fmt: skip

    def _held_stale(self, action: Action, alert: Alert, now: float) -> bool:
        """Whether the incident's latest event time is older than ``fresh_s`` on the wall clock: then what its
        events said is no longer known, and the action waits (logged once) instead of acting. It is not
        cancelled: a detector that judges hourly, a worker catching up a backlog or an exporter restarting
        leave an incident quiet for a while, and the action goes ahead once its events come again. An incident
        stamped more than ``fresh_s`` ahead of the wall clock waits too: its host's clock runs ahead (the decoder
        takes events up to a day ahead), so how long ago its events stopped cannot be told from their times."""
        age = now - alert.updated_at
        if -self.fresh_s <= age <= self.fresh_s:
            self._waiting.pop(action.key, None)  # it acts in this pass, and its message says so
            return False
        if action.key not in self._waiting:
            why = (f"no events for {format_duration(age)} (latest at {rfc3339(alert.updated_at)}): whether the waste "
                   "goes on is not known; it waits for them") if age > 0 else (
                   f"its latest event is stamped {format_duration(-age)} ahead of this worker's clock (at "
                   f"{rfc3339(alert.updated_at)}): the host's clock runs ahead, so whether its events go on cannot "
                   "be told; it waits for events stamped within the hour (fix the host's clock: NTP)")  # fmt: skip
            self._waiting[action.key] = why
            log.warning("action_held", action=action.key, state=action.state, reason=why)
            self._show(action, now)  # its message said "calling" while nothing was called
        return True

    def _cancel(self, action: Action, now: float, who: str, why: str) -> None:
        """Cancel a pending action; one whose call may have taken before (``retry``: an answer timed out) is
        looked up first, and recorded as done if it took."""
        if action.state == "retry":
            found = self._observe_unlocked(action)
            if self._actions.get(action.key) is not action:
                # The worker's partitions moved during the lookup (reset): the action is the new holder's, which
                # looks it up itself before deciding; a cancel written from here would contradict what it does.
                log.info("action_moved_during_lookup", action=action.key)
                return
            now = self._wall()  # the lookup took time: later steps are stamped after what clicks stored meanwhile
            if found is not None and found.ok:
                self._finish(action, found, now)
                return
        self._step(action, "cancelled", now, decided_by=who, result=why)
        log.info("action_cancelled", action=action.key, by=who, reason=why)
        self._show(action, now)

    def _take_decisions(self, now: float, keys: list[str] | None = None) -> int:
        """Take in the decisions another worker stored for actions held here pending (one
        query, bounded by their keys and proposal times); returns how many were taken. The
        first decision stored wins, as :meth:`decide` refuses any after it."""
        pending = {k: a for k, a in self._actions.items()
                   if (a.awaits_decision or a.stoppable) and (keys is None or k in keys)}  # fmt: skip
        if not pending:
            return 0
        since = min(a.proposed_at if a.awaits_decision else a.retried_at or 0.0 for a in pending.values()) - _SKEW_S
        taken = 0
        for row in self.store.remediations.decisions(sorted(pending), since):
            action = pending.get(row["action_key"])
            if action is None or not (action.awaits_decision or action.stoppable and action.stops(row)
                                      and epoch(row["at"]) >= (action.retried_at or 0.0)):  # fmt: skip
                continue  # decided already (a later decision changes nothing); a retry is stopped by a Decline alone
            if row["step"] == "cancelled" and epoch(row["at"]) < action.proposed_at:
                # An earlier proposal's end (the rules withdrew it: proposed again since, _asked_again). A cancellation
                # is the acting worker's, on the clock its proposals are stamped by, never a lagging worker's click:
                # taken, it cancelled each new proposal at the next pass, for as long as the skew allowance reaches.
                continue
            action.apply(row)
            taken += 1
            log.info("action_decided_elsewhere", action=action.key, step=row["step"], user=row["decided_by"])
            self._show(action, now)
        return taken

    def _maybe_propose(self, alert: Alert, spec: ActionSpec, now: float) -> None:
        lasted = alert.updated_at - alert.episode_start
        if lasted < spec.after:
            return
        age = now - alert.updated_at
        if age > self.fresh_s:  # a replay of past events, or a backlog: never act on those
            if alert.alert_id not in self._stale_logged:
                self._stale_logged.add(alert.alert_id)
                log.info("action_not_proposed", alert_id=alert.alert_id, kind=spec.kind,
                         reason=f"latest event time is {age:.0f} s old (replay or backlog)")  # fmt: skip
            return
        action = Action(alert.alert_id, spec.kind, mode=spec.mode, rule=alert.rule, resource_id=alert.resource_id,
                        team=alert.tags.get(self.ruleset().routing.by_tag, ""),  # the team approvals go by
                        usd_per_hour=alert.usd_per_hour)  # fmt: skip
        self._actions[action.key] = action
        executor = self.executors.get(spec.kind)
        try:
            if executor is None:
                raise NotApplicable(f"no executor for {spec.kind} is configured in this worker")
            action.call = executor.plan(Target.from_alert(alert))
        except NotApplicable as exc:
            self._step(action, "proposed", now, event_time=alert.updated_at)
            self._step(action, "not_applicable", now, decided_by="worker", result=exc.reason)
            self._show(action, now)
            return
        if spec.mode == "auto_unless_objected" and self.notifier is None:
            self._step(action, "proposed", now, event_time=alert.updated_at)
            self._step(action, "not_applicable", now, decided_by="worker",
                       result="mode auto_unless_objected warns in Slack before it acts, and no Slack is configured "
                              "(SLACK_BOT_TOKEN and SLACK_CHANNEL, or SLACK_WEBHOOK_URL): use mode approve (the "
                              "incidents page decides)")  # fmt: skip
            return
        due = now + spec.grace if spec.mode == "auto_unless_objected" else None
        self._step(action, "proposed", now, event_time=alert.updated_at, due_at=due)
        log.info("action_proposed", action=action.key, mode=spec.mode, call=describe_call(action))
        if spec.mode == "dry_run":
            self._step(action, "dry_run", now, decided_by="dry_run", result=f"would call {describe_call(action)}")
        self._show(action, now)

    # -- decisions (a click) ------------------------------------------------------------

    def decide(self, alert_id: str, user_id: str, approve: bool, tags: dict[str, str]) -> tuple[int, str]:
        """An Approve or Decline click by ``user_id`` on ``alert_id``'s action: (HTTP status,
        what happened). Anyone not an approver for the resource's team is refused (403),
        and the refusal recorded. Checked against the stored steps, not memory: the click may
        reach a worker that does not act (then it is only recorded, and the acting worker
        takes it at its next pass) or follow a decision another worker recorded (409)."""
        with self._lock:
            stored = Action.from_steps(self.store.remediations.steps(alert_id))
            held = self._acting and self._recovered
            if held:  # the acting worker: its memory takes in what others stored meanwhile
                for key, action in stored.items():
                    mine = self._actions.get(key)
                    if mine is not None and (mine.awaits_decision and not action.awaits_decision
                                             or mine.stoppable and action.stop_asked_by):  # fmt: skip
                        self._actions[key] = action
                stored = {k: self._actions.setdefault(k, a) for k, a in stored.items()}
            waiting = [a for a in stored.values() if a.awaits_decision]
            # Declined while it waits to try again (an API throttled or down): tried no more. Not approved again: it is.
            # Or while a retry's call is under way (begun after a retry: its message still offers Decline, and an
            # EC2 throttling it may take a minute): that attempt goes on, none after it (Action.apply).
            stopping = [] if approve else [a for a in stored.values() if a.stoppable or (
                a.state == "begun" and a.retried_at is not None and not a.stop_asked_by)]  # fmt: skip
            if not waiting and not stopping:
                return 409, f"no action on alert {alert_id} awaits a decision"
            members = getattr(self.notifier, "group_members", None)
            allowed, why = may_approve(self.ruleset().routing, tags, user_id, members)
            now = self._wall()
            for action, stop in [*((a, False) for a in waiting), *((a, True) for a in stopping)]:
                if not allowed:
                    self._step(action, "refused", now, decided_by=user_id, result=why)
                    log.warning("action_click_refused", action=action.key, user=user_id, reason=why)
                    continue
                if stop:
                    # Stamped after the retry it stops, whatever this worker's clock says: every worker orders the
                    # steps by time, and one read before the retry is an approval's late twin, not a stop (Action.apply).
                    self._step(action, "declined", max(now, (action.retried_at or now) + 0.001), decided_by=user_id)
                    log.info("action_stop_asked", action=action.key, user=user_id, attempts=action.attempts, acting=held)
                else:
                    self._step(action, "approved" if approve else "declined", now, decided_by=user_id)
                    log.info("action_decided", action=action.key, user=user_id, approved=approve, acting=held)
                if held:  # elsewhere the acting worker updates the message when it takes the decision
                    self._show(action, now)
            if not allowed:
                return 403, why
            self.wake.set()
            return 200, "approved" if approve else "declined"

    # -- acting -------------------------------------------------------------------------

    def _execute(self, action: Action, now: float) -> None:
        executor = self.executors.get(action.kind)
        call = action.call
        if executor is None or call is None:
            self._step(action, "failed", now, decided_by="worker", result=f"no executor for {action.kind} in this worker")
            self._show(action, now)
            return
        attempt = action.attempts + 1
        self._step(action, "begun", now, attempt=attempt)  # stored before the call: see recover()
        with self._unlocked():  # a click (decide) is answered while the API takes its time: this action is begun
            try:
                outcome = executor.execute(call)
            except Exception as exc:  # noqa: BLE001 - an executor's bug: reported, never retried blindly
                outcome = Outcome(False, f"{type(exc).__name__}: {exc}"[:500], retryable=False)
        self._finish(action, outcome, self._wall())

    @contextmanager
    def _unlocked(self) -> Iterator[None]:
        """The clicks' lock released while a cloud API takes its time (a call, a lookup), taken again after."""
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()

    def _observe_unlocked(self, action: Action) -> Outcome | None:
        """Whether the action's call took, as the API says now (None: it cannot tell), the clicks' lock released
        while the API takes its time, as during a call (:meth:`_execute`): a lookup hanging for a minute held
        every Approve and Decline. The action is a ``retry``, which no click decides."""
        observe = getattr(self.executors.get(action.kind), "observe", None)
        if observe is None or action.call is None:
            return None
        with self._unlocked():
            try:
                found: Outcome | None = observe(action.call)
                return found
            except Exception as exc:  # noqa: BLE001 - an executor's bug: then it cannot tell
                log.warning("action_lookup_failed", action=action.key, error=f"{type(exc).__name__}: {exc}"[:300])
                return None

    def _finish(self, action: Action, outcome: Outcome, now: float) -> None:
        if outcome.ok:
            # 0: it was not running, nothing saved; unless an earlier attempt of ours may have stopped it (its answer
            # lost: a retry), which is then the likelier story
            saved = action.usd_per_hour if outcome.saves or action.attempts > 1 else 0.0
            self._step(action, "succeeded", now, result=outcome.detail, usd_per_hour=saved)
            log.info("action_succeeded", action=action.key, call=describe_call(action), result=outcome.detail,
                     usd_per_hour=saved)  # fmt: skip
        elif outcome.retryable and action.attempts < self.max_attempts:
            wait = self.backoff_s * 2 ** (action.attempts - 1)
            self._step(action, "retry", now, result=outcome.detail, due_at=now + wait)
            log.warning("action_retry", action=action.key, error=outcome.detail, attempt=action.attempts, retry_in_s=wait)
        else:
            step = "gave_up" if outcome.retryable else "failed"
            self._step(action, step, now, result=outcome.detail)
            log.error("action_failed", action=action.key, call=describe_call(action), error=outcome.detail,
                      attempts=action.attempts)  # fmt: skip
        self._show(action, now)

    # -- records and messages -------------------------------------------------------------

    def _step(self, action: Action, step: str, now: float, *, decided_by: str = "", result: str = "",
              usd_per_hour: float | None = None, attempt: int | None = None, due_at: float | None = None,
              event_time: float | None = None) -> None:  # fmt: skip
        """Store one step, then take it into the action's state (a failed insert raises:
        nothing is done that was not recorded first)."""
        call = action.call or Call("", {})
        row = ActionStep(
            alert_id=action.alert_id, kind=action.kind, step=step, at=now, mode=action.mode,
            decided_by=decided_by or (action.decided_by if step in ("begun", "succeeded", "retry", "failed", "gave_up") else ""),
            rule=action.rule, resource_id=action.resource_id, team=action.team, api=call.api,
            request=json.dumps(dict(call.request), sort_keys=True) if call.api else "", endpoint=call.endpoint,
            result=result, usd_per_hour=action.usd_per_hour if usd_per_hour is None else usd_per_hour,
            attempt=attempt if attempt is not None else action.attempts, due_at=due_at, event_time=event_time,
        )  # fmt: skip
        self.store.remediations.record([row])
        METRICS.actions.labels(action.kind, step).inc()
        action.apply({**row.__dict__, "step": step})
        self._count += 1

    def _show(self, action: Action, now: float) -> None:
        """Post or update the action's message in the incident's thread (Slack failures are
        logged and tried again next pass: the audit has the step already)."""
        if action.state in _SHOWN:
            self._unannounced.add(action.key)
            self._announce(action, now)

    def _announce(self, action: Action, now: float) -> None:
        if self.notifier is None:
            self._unannounced.discard(action.key)
            return
        try:
            if action.message is not None:
                self.notifier.update_action(*action.message, *action_blocks(action, now, self._waiting.get(action.key)))
            else:
                thread = self.store.deliveries.thread_of(action.alert_id)
                if thread is None and self.notifier.threads:
                    return  # the alert is not in Slack yet: its thread comes first (next pass)
                channel, parent = thread or ("", "")
                warned = action.state == "proposed" and action.mode == "auto_unless_objected"
                if warned:  # the grace runs from the warning people can see
                    action.due_at = max(action.due_at or now, now + action.grace)
                text, blocks = action_blocks(action, now, self._waiting.get(action.key))
                thread_ts = parent if "." in parent else ""
                find = getattr(self.notifier, "find_action", None)
                found = (find(channel, thread_ts, action.key)
                         if action.key in self._doubtful and thread_ts and find is not None else None)  # fmt: skip
                self._doubtful.add(action.key)  # until announced: a post cut off may still land
                if found is not None:  # posted before a kill or a timeout: recorded, brought up to date
                    log.info("action_message_found", action=action.key)
                    channel, ts = found
                    self.notifier.update_action(channel, ts, text, blocks)
                else:
                    channel, ts = self.notifier.post_action(channel, text, blocks, thread_ts=thread_ts)
                self._step(action, "announced", now, result=json.dumps({"channel": channel, "ts": ts}),
                           due_at=action.due_at if warned else None)  # fmt: skip
                self._doubtful.discard(action.key)
        except Exception as exc:  # noqa: BLE001 - Slack's errors: the step is stored, the message follows later
            log.warning("action_message_failed", action=action.key, error=str(exc)[:300])
            return
        self._unannounced.discard(action.key)


_SKEW_S = 300.0
"""How far another worker's wall clock may lag this one's: decisions stored up to this long
before an action's proposal are still read."""

_SHOWN = frozenset({"proposed", "dry_run", "not_applicable", "approved", "declined", "cancelled", "retry", "succeeded",
                    "failed", "gave_up", "interrupted"})  # fmt: skip
"""States with something to say in Slack (``begun`` is followed at once by its result)."""
