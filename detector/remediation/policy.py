"""When an action is due, who may decide it, and the state each action is in.

An action is one incident (alert id) and one kind: ``alert_id:kind`` is its idempotency
key, so an incident is acted on at most once per kind, across restarts. Its state is
rebuilt from its audit steps (``remediation_actions``), in the order they were taken:

- ``proposed``: the incident lasted the rule's ``after`` (event time) and still fires;
  the call is planned (what will be called is what was shown). Then, by mode:
  ``dry_run`` → ``dry_run`` (ended, never called; ``proposed`` again, with a new message,
  if its rule is later set to another mode while the incident fires); ``approve`` → waits for a click;
  ``auto_unless_objected`` → acts at ``due_at`` (wall clock) unless snoozed or declined.
- ``approved`` (a Slack user id, or ``auto``) → ``begun`` (stored before the call) →
  ``succeeded`` | ``retry`` (a retryable failure; tried again at ``due_at``) |
  ``failed`` | ``gave_up`` (retries spent).
- ``declined``, ``cancelled`` (resolved, snoozed), ``not_applicable``, ``interrupted``
  (begun by a worker that died, and not found done: left for a person) end it.
- ``refused`` (a click by someone not allowed) and ``announced`` (its Slack message)
  change nothing, nor does an ``approved`` or ``declined`` stored after the first decision
  (two workers' clicks at once: the first stored wins, wherever the later one lands).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from detector.remediation.base import Call
from detector.rules import Routing

__all__ = ["ENDED", "WAITING", "Action", "action_key", "may_approve"]

ENDED = frozenset({"dry_run", "not_applicable", "declined", "cancelled", "succeeded", "failed", "gave_up", "interrupted"})
WAITING = frozenset({"proposed", "approved", "retry", "begun"})
_PASSIVE = frozenset({"refused", "announced"})


def action_key(alert_id: str, kind: str) -> str:
    """The idempotency key of one action on one incident."""
    return f"{alert_id}:{kind}"


@dataclass
class Action:
    """One action's state, as its steps say."""

    alert_id: str
    kind: str
    mode: str = ""
    state: str = ""
    decided_by: str = ""
    rule: str = ""
    resource_id: str = ""
    team: str = ""
    call: Call | None = None
    usd_per_hour: float = 0.0
    """The incident's burn rate when proposed; once ``succeeded``, what the action saves."""
    due_at: float | None = None
    """``auto_unless_objected``: when it acts; ``retry``: when it is tried again (wall clock)."""
    attempts: int = 0
    message: tuple[str, str] | None = None
    """(channel, ts) of its Slack message, once announced."""
    result: str = ""
    proposed_at: float = 0.0
    grace: float = 0.0
    """``auto_unless_objected``: wall time from the warning to the call (counted from the
    announcement: nobody is warned before the message is in Slack)."""
    retried_at: float | None = None
    """When its first attempt failed and it was set to be tried again (wall clock); None before."""
    stop_asked_by: str = ""
    """Who declined it after that (:meth:`stoppable`): no attempt more, once the last one is looked up."""
    attempts_before: int = 0
    """Its attempts when last proposed: a Decline stored with no more (``attempt``) was clicked with it pending,
    the late twin of its approval, whatever clock stamped it after the retry: no stop (:meth:`stops`)."""

    @property
    def key(self) -> str:
        return action_key(self.alert_id, self.kind)

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def awaits_decision(self) -> bool:
        return self.state == "proposed" and self.mode in ("approve", "auto_unless_objected")

    @property
    def stoppable(self) -> bool:
        """Approved, tried, and waiting to be tried again: a Decline still stops it (the retries, not the attempt
        made, which is looked up first)."""
        return self.state == "retry" and not self.stop_asked_by

    def stops(self, row: dict[str, Any]) -> bool:
        """Whether the stored ``declined`` ``row`` stops its retries: clicked once an attempt was made (its
        ``attempt``, what the clicking worker read), not with the action pending. Ordered by the clicking worker's
        clock, a pending one's Decline (two approvers at once, the approval stored first) lands after the retry
        where that clock runs ahead of the acting worker's by more than the call took."""
        return row["step"] == "declined" and int(row.get("attempt") or 0) > self.attempts_before

    def apply(self, row: dict[str, Any]) -> None:
        """Take one stored step (a row of ``remediation_actions``) into account."""
        step = row["step"]
        if step == "announced":
            where = json.loads(row["result"] or "{}")
            self.message = (str(where.get("channel", "")), str(where.get("ts", "")))
            if row.get("due_at") is not None:
                self.due_at = _epoch(row["due_at"])
            return
        if step in _PASSIVE:
            return
        if self.stops(row) and self.retried_at is not None and self.state in ("retry", "begun"):
            # A Decline while it waits to be tried again (or while an attempt after that is made): it is tried no
            # more. Its state stays until the attempt made is looked up, as a resolution's cancellation does.
            self.stop_asked_by = self.stop_asked_by or row["decided_by"]
            return
        if step in ("approved", "declined") and not self.awaits_decision:
            # A second decision, stored by another worker that read the action pending before the first was taken
            # (or the call made): the first decision stored is the action's. Taken as its state, a late approval
            # would have a restarted worker carry the action out again, and a late decline undo a stop's record.
            return
        if step == "proposed":  # the first step; again after a dry run, when its rule now asks for it in earnest
            self.mode, self.rule, self.resource_id, self.team = row["mode"], row["rule"], row["resource_id"], row["team"]
            self.message, self.decided_by, self.retried_at, self.stop_asked_by = None, "", None, ""
            self.attempts_before = self.attempts
            self.usd_per_hour = float(row["usd_per_hour"])
            if row["api"]:
                self.call = Call(api=row["api"], request=json.loads(row["request"] or "{}"), endpoint=row["endpoint"])
        if step in ("proposed", "retry"):
            self.due_at = _epoch(row.get("due_at"))
        if step == "retry" and self.retried_at is None:
            self.retried_at = _epoch(row["at"])
        if step == "proposed":
            self.proposed_at = _epoch(row["at"]) or 0.0
            self.grace = self.due_at - self.proposed_at if self.due_at is not None else 0.0
        if step == "begun":
            self.attempts = max(self.attempts, int(row["attempt"]))
        if step == "succeeded":  # what it saves: 0 where the instance was not running any more
            self.usd_per_hour = float(row["usd_per_hour"])
        if step in ("approved", "declined", "cancelled", "dry_run"):
            self.decided_by = row["decided_by"]
        self.state = step
        self.result = row.get("result", "")

    @classmethod
    def from_steps(cls, rows: Iterable[dict[str, Any]]) -> dict[str, Action]:
        """Key → state, from steps in the order they were taken."""
        actions: dict[str, Action] = {}
        for row in rows:
            key = action_key(row["alert_id"], row["kind"])
            action = actions.setdefault(key, cls(row["alert_id"], row["kind"]))
            action.apply(row)
        return actions


def _epoch(value: Any) -> float | None:
    """A time as stored (a naive UTC datetime) or as just recorded (epoch seconds)."""
    if value is None or isinstance(value, (int, float)):
        return value
    from detector.units import epoch

    return epoch(value)


def may_approve(routing: Routing, tags: dict[str, str], user_id: str,
                members: Callable[[str], set[str]] | None) -> tuple[bool, str]:  # fmt: skip
    """Whether ``user_id`` may approve or decline an action on a resource with ``tags``, and
    why not. ``members``: a user group's members (Slack's ``usergroups.users.list``); a
    group that cannot be read lets nobody through it (refused, not guessed)."""
    ids, owner = routing.approvers_for(tags)
    if not ids and not owner:
        return False, "no approvers are set for this team in routing.yaml (approvers)"
    if user_id and (user_id in ids or user_id == owner):
        return True, ""
    unread = []
    for group in (g for g in ids if g.startswith("S")):
        if members is None:
            unread.append(group)
            continue
        try:
            if user_id in members(group):
                return True, ""
        except Exception as exc:  # noqa: BLE001 - Slack's errors: the group is not read, nobody passes through it
            response = getattr(exc, "response", None)
            code = response.get("error") if response is not None and hasattr(response, "get") else None
            unread.append(f"{group} ({code or ' '.join(str(exc).split())[:100]})")
    why = f"{user_id or 'an unknown user'} is not an approver for this team"
    return False, why + (f"; could not read user group(s) {', '.join(unread)}" if unread else "")
