"""What an action says in the incident's Slack thread: the proposal (with its buttons),
the decision and the result. Everything from the alert or the API is escaped."""

from __future__ import annotations

import json
from typing import Any

from detector.actions import ACTION_BLOCK, BUTTONS
from detector.blockkit import MAX_NOTIFICATION_TEXT, MAX_TEXT, clip, fit
from detector.remediation.policy import Action
from detector.slack import code, escape
from detector.units import format_duration, money, rfc3339

__all__ = ["APPROVE", "DECLINE", "action_blocks", "describe_call"]

APPROVE = "burnwatch_approve"
DECLINE = "burnwatch_decline"
SNOOZE_LABEL, SNOOZE = next(b for b in BUTTONS if b[1] == "burnwatch_snooze")
"""The alert's own Snooze 24h (same action id, the alert id as value): on an automatic action's warning."""
_VERBS = {"stop_instance": "stop", "cull_notebook": "cull the notebook", "scale_to_zero": "scale to zero"}


def describe_call(action: Action) -> str:
    """``ec2.StopInstances {"InstanceIds": [...]} (us-east-1)``: what is or would be called."""
    call = action.call
    if call is None:
        return "(no call)"
    where = f" ({call.endpoint})" if call.endpoint else ""
    return f"{call.api} {json.dumps(dict(call.request), sort_keys=True)}{where}"


def _who(user: str) -> str:
    if user.startswith(("U", "W")) and user.isalnum():
        return f"<@{user}>"
    return escape(user, 80)


def action_blocks(action: Action, now: float, waiting: str | None = None) -> tuple[str, list[dict[str, Any]]]:
    """(notification text, blocks) for the action's message in its current state; the text is
    the message's first words, short enough for a phone's notification. ``waiting``: why an action
    that would act now is held instead (its incident's events stopped)."""
    what = f"{_VERBS.get(action.kind, action.kind)} {escape(action.resource_id, 120)}"
    call = code(describe_call(action), 1000)
    saves = f" ({money(action.usd_per_hour)}/h)" if action.usd_per_hour else ""
    state = action.state
    buttons: list[tuple[str, str, str | None]] = []  # label, action id, style
    if state == "dry_run":
        text = f":test_tube: Dry run: burnwatch would {what}{saves} by calling {call}. Nothing was called (mode dry_run)."
    elif state == "not_applicable":
        text = f":information_source: Cannot {what}: {escape(action.result, 1000)}"
    elif state == "proposed" and action.mode == "approve":
        text = f":raised_hand: Proposed: {what}{saves} by calling {call}. An approver decides."
        buttons = [("Approve", APPROVE, "primary"), ("Decline", DECLINE, "danger")]
    elif state == "proposed" and waiting:
        text = (f":double_vertical_bar: Would {what}{saves} now by calling {call}, but waits: {escape(waiting, 500)}. "
                "Snooze or Decline still stop it.")  # fmt: skip
        buttons = [(SNOOZE_LABEL, SNOOZE, None), ("Decline", DECLINE, "danger")]
    elif state == "proposed":
        due = action.due_at or now
        text = (f":hourglass_flowing_sand: Will {what}{saves} at {rfc3339(due)} (in {format_duration(max(0.0, due - now))}) "
                f"by calling {call}, unless this incident is snoozed or declined.")  # fmt: skip
        # Snooze here too: anyone may object to this one action (a group's message snoozes all its alerts).
        buttons = [(SNOOZE_LABEL, SNOOZE, None), ("Decline", DECLINE, "danger")]
    elif state == "retry" and action.stop_asked_by:
        text = (f":no_entry_sign: {what.capitalize()}: declined by {_who(action.stop_asked_by)} after attempt "
                f"{action.attempts} failed ({escape(action.result, 1000)}); tried no more once burnwatch has looked up "
                "whether that attempt took.")  # fmt: skip
    elif state in ("approved", "retry") and waiting:
        text = (f":double_vertical_bar: {what.capitalize()}: approved by {_who(action.decided_by)}; waits before calling "
                f"{call}: {escape(waiting, 500)}.")  # fmt: skip
        if state == "retry":
            text += f" Attempt {action.attempts} failed ({escape(action.result, 1000)}). Decline stops it."
            buttons = [("Decline", DECLINE, "danger")]
    elif state in ("approved", "begun", "retry"):
        text = f":gear: {what.capitalize()}: approved by {_who(action.decided_by)}; calling {call}."
        if state == "retry":
            due = action.due_at or now
            text += (f" Attempt {action.attempts} failed ({escape(action.result, 1000)}); trying again at {rfc3339(due)} "
                     f"(in {format_duration(max(0.0, due - now))}) unless declined.")  # fmt: skip
            buttons = [("Decline", DECLINE, "danger")]
    elif state == "succeeded":
        text = f":white_check_mark: Done: {what} ({call} by {_who(action.decided_by)}): {escape(action.result, 1000)}."
        if saves:  # none where it was already stopped (the result says so) or its price is unknown
            text += f" Saves{saves}."
    elif state in ("failed", "gave_up", "interrupted"):
        why = {"failed": "refused", "gave_up": f"failed {action.attempts} times", "interrupted": "interrupted"}[state]
        text = f":x: Could not {what}: {call} {why}: {escape(action.result, 1000)}. Nothing more is tried; act by hand."
    elif state == "declined":
        text = f":no_entry_sign: Declined by {_who(action.decided_by)}: burnwatch will not {what}."
    elif state == "cancelled":
        text = f":heavy_minus_sign: Not acting ({_who(action.decided_by)}): burnwatch will not {what}."
        if action.result and action.decided_by != "resolved":  # the snooze's reason, the rule's change, the silence of events
            text += f" {escape(action.result, 1000)}."
    else:
        text = f"{what}: {escape(state, 40)}"
    text = clip(text, MAX_TEXT)  # an API's error can be long: cut whole, never half an entity or a link
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]
    if buttons:
        blocks.append({
            "type": "actions", "block_id": f"{ACTION_BLOCK}{action.alert_id}",
            "elements": [{"type": "button", "text": {"type": "plain_text", "text": label}, "action_id": action_id,
                          "value": action.alert_id, **({"style": style} if style else {})}
                         for label, action_id, style in buttons],
        })  # fmt: skip
    footer = f"action {code(action.key)} · mode {action.mode}"
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": footer}]})
    return clip(text, MAX_NOTIFICATION_TEXT), fit(blocks)
