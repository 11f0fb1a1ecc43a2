"""Slack buttons: who may click (request signatures), what a click says, and what it does.

Slack posts a click to the worker's ``/slack/actions`` as a form with a JSON
``payload``, signed with the app's signing secret. A request is refused (401) when its
signature does not match, when its timestamp is more than five minutes from now
(Slack's own rule against replays), or when the same signed request was seen before (by this
process: README, Slack).
A click is recorded in ClickHouse (``alert_actions``: who, what, when) and shown on
the incident's message; a snooze also keeps that incident's later changes out of the
channel for 24 hours, and "expected" is kept as feedback for the model and for rule
tuning. Approve and Decline decide an action on the incident (docs/actions.md): only an
approver named in ``routing.yaml`` may click them; anyone else is refused, the refusal is
recorded in ``remediation_actions``, and the clicker is told why and who may approve
(an ephemeral message through the click's ``response_url``: Slack ignores the body of the
answer to a ``block_actions`` request and shows any status but 200 as a bare error).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import msgspec
import structlog
from slack_sdk.signature import Clock, SignatureVerifier
from slack_sdk.webhook import WebhookClient

from detector.suppression import snooze
from detector.units import one_line

if TYPE_CHECKING:
    from detector.store import Store

__all__ = ["ACTIONS", "BUTTONS", "DECISIONS", "GROUP_BLOCK", "ActionHandler", "Click", "RequestVerifier", "Unauthorized",
           "parse_click"]  # fmt: skip

log = structlog.get_logger("burnwatch.actions")

ACTIONS = {"burnwatch_ack": "acknowledged", "burnwatch_snooze": "snoozed", "burnwatch_expected": "expected",
           "burnwatch_approve": "approved", "burnwatch_decline": "declined"}
"""Button action id → what is recorded. Approve and Decline are on an action's message
(:mod:`detector.remediation.messages`), not on the alert's."""
DECISIONS = ("approved", "declined")
ACTION_BLOCK = "burnwatch-action:"
"""An action's message's buttons' ``block_id``, before the alert id (:mod:`detector.remediation.messages`)."""
BUTTONS = (("Acknowledge", "burnwatch_ack"), ("Snooze 24h", "burnwatch_snooze"), ("Mark as expected", "burnwatch_expected"))
GROUP_BLOCK = "burnwatch-group:"
"""A group's message's buttons' ``block_id``, before its first member's alert id: a click there is
taken for every alert the message opened (:meth:`~detector.store.deliveries.Deliveries.opened_in`)."""
SNOOZE_S = 86_400.0
MAX_AGE_S = 300.0
"""Slack's rule, which slack-sdk's verifier applies: a request signed longer ago is refused."""


class Unauthorized(Exception):
    """A request that did not come from Slack, or came too late or twice; ``reason`` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Clock(Clock):
    """slack-sdk's clock, read from ours (tests inject the time)."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now

    def now(self) -> float:
        return self._now()


class RequestVerifier:
    """Slack's request signature (``X-Slack-Signature``, HMAC-SHA256 of ``v0:timestamp:body``)
    and freshness (``X-Slack-Request-Timestamp`` within five minutes) as slack-sdk's
    :class:`SignatureVerifier` checks them; this class adds the reason for a refusal and
    remembers signatures for the window in which a replay could pass the timestamp check.
    Per process: another worker has not seen them (README, Slack: the effects are idempotent)."""

    def __init__(self, signing_secret: str, *, clock: Callable[[], float] = time.time):
        self._slack = SignatureVerifier(signing_secret, clock=_Clock(clock))
        self._clock = clock
        self._seen: dict[str, float] = {}
        """Signatures accepted within :data:`MAX_AGE_S`, in this process only."""
        self._lock = threading.Lock()

    def verify(self, body: bytes, headers: Mapping[str, str]) -> None:
        """Return if the request is Slack's, fresh and new; raise :class:`Unauthorized` if not."""
        lower = {k.lower(): v for k, v in headers.items()}
        timestamp, signature = lower.get("x-slack-request-timestamp"), lower.get("x-slack-signature")
        if not timestamp or not signature:
            raise Unauthorized("missing X-Slack-Request-Timestamp or X-Slack-Signature")
        try:
            sent = int(timestamp) if timestamp.isascii() else None
        except ValueError:
            sent = None
        if sent is None:
            raise Unauthorized(f"bad timestamp {timestamp[:40]!r}")
        if not signature.isascii():  # hmac.compare_digest raises TypeError on other text
            raise Unauthorized("signature does not match (not ASCII)")
        try:  # slack-sdk decodes the body itself, raising on bytes that are not UTF-8
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise Unauthorized("signature does not match (the body is not UTF-8, as Slack's always is)") from None
        if not self._slack.is_valid(body=text, timestamp=timestamp, signature=signature):
            age = self._clock() - sent
            if abs(age) > MAX_AGE_S:
                raise Unauthorized(f"stale request: signed {age:.0f} s ago (over {MAX_AGE_S:.0f} s)")
            raise Unauthorized("signature does not match (wrong signing secret, or the body was altered)")
        with self._lock:  # clicks are handled on executor threads: two copies must not both pass
            now = self._clock()
            self._seen = {s: t for s, t in self._seen.items() if now - t <= MAX_AGE_S}
            if signature in self._seen:
                raise Unauthorized("replayed request: this signed request was already handled")
            self._seen[signature] = sent


@dataclass(frozen=True)
class Click:
    action: str
    """acknowledged | snoozed | expected | approved | declined"""
    alert_id: str
    user_id: str
    user_name: str
    channel: str
    message_ts: str
    response_url: str = ""
    """Where Slack takes an answer to this click (an ephemeral message to the clicker)."""
    block_id: str = ""
    """The clicked button's block: :data:`ACTION_BLOCK` and the alert id on an action's message."""

    @property
    def on_group_message(self) -> bool:
        """Clicked on a group's message: for each alert it lists."""
        return self.block_id.startswith(GROUP_BLOCK)

    @property
    def on_action_message(self) -> bool:
        """Clicked on an action's message (its Snooze), not on the alert's own message."""
        return self.block_id.startswith(ACTION_BLOCK)


class _Action(msgspec.Struct):
    action_id: str
    value: str = ""
    block_id: str = ""


class _User(msgspec.Struct):
    id: str = ""
    username: str | None = None
    name: str | None = None


class _Channel(msgspec.Struct):
    id: str = ""


class _Message(msgspec.Struct):
    ts: str = ""


class _Payload(msgspec.Struct):
    """The fields of Slack's ``block_actions`` payload that a click uses, typed: anything else
    in them (a string for an object, a list for a string) is a 400 naming where, not a
    TypeError in the worker. Fields not named here are ignored."""

    actions: list[_Action]
    user: _User | None = None
    channel: _Channel | None = None
    message: _Message | None = None
    response_url: str | None = None


def parse_click(body: bytes) -> Click:
    """The click in a ``block_actions`` request; ``ValueError`` names what is missing or of the wrong type."""
    try:
        payload = msgspec.json.decode(parse_qs(body.decode("utf-8"))["payload"][0], type=_Payload)
    except (KeyError, ValueError) as exc:  # UnicodeDecodeError and msgspec's errors are ValueErrors
        raise ValueError(f"not a Slack block_actions payload: {exc}") from None
    if not payload.actions:
        raise ValueError("not a Slack block_actions payload: no actions")
    action = payload.actions[0]
    kind = ACTIONS.get(action.action_id)
    if kind is None:
        raise ValueError(f"unknown action {action.action_id!r}; expected one of {', '.join(ACTIONS)}")
    user = payload.user or _User()
    return Click(
        action=kind,
        alert_id=action.value,
        user_id=user.id,
        user_name=user.username or user.name or "",
        channel=payload.channel.id if payload.channel else "",
        message_ts=payload.message.ts if payload.message else "",
        response_url=payload.response_url or "",
        block_id=action.block_id,
    )


def _store_error(exc: BaseException) -> bool:
    """Whether ``exc`` says the store did not answer or refused: ClickHouse's client's database errors (its
    module is loaded wherever a store is) or a connection's; not a ``ProgrammingError`` (a query of ours that
    is wrong: a bug, which should show as one)."""
    clickhouse = sys.modules.get("clickhouse_connect.driver.exceptions")
    return isinstance(exc, (ConnectionError, TimeoutError)) or (
        clickhouse is not None and isinstance(exc, clickhouse.DatabaseError)
        and not isinstance(exc, clickhouse.ProgrammingError))


SLACK_RESPONSE_ORIGIN = "https://hooks.slack.com"
"""Where Slack's ``response_url`` points; an answer goes nowhere else (another origin: the
local stand-in named by ``SLACK_BASE_URL``)."""


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower() if parts.scheme and parts.netloc else ""


def refusal_text(why: str, approvers: list[str], owner: str, team: str) -> str:
    """What the clicker who may not decide is told: who may, and why not (no secret: Slack
    ids from ``routing.yaml`` and a group's read error)."""
    from detector.slack import code, escape

    who = [f"<!subteam^{i}>" if i.startswith("S") else f"<@{i}>" for i in approvers]
    if owner:
        who.append(f"the resource's owner (<@{owner}>)")
    team_words = f"team {code(team)}" if team else "resources with no team"
    lines = [f":no_entry: You may not approve or decline this action: {escape(why)}.",
             f"Approvers for {team_words}: {', '.join(who) if who else 'none are set in routing.yaml (approvers)'}.",
             "Your click was recorded as refused."]  # fmt: skip
    return "\n".join(lines)


class ActionHandler:
    """What the worker's ``/slack/actions`` view does with a request (blocking: run it in an
    executor). Returns (HTTP status, JSON body)."""

    def __init__(self, verifier: RequestVerifier, store: Store, notifier: Any, outbox: Any,
                 clock: Callable[[], float] = time.time, remediation: Any = None,
                 response_origin: str | None = None) -> None:  # fmt: skip
        self.verifier = verifier
        self._origins = {SLACK_RESPONSE_ORIGIN} | ({_origin(response_origin)} if response_origin else set())
        """Origins a ``response_url`` may point at: Slack's, and ``SLACK_BASE_URL``'s in tests."""
        self.answers: list[threading.Thread] = []
        """Ephemeral answers being posted (threads: the click is acknowledged at once)."""
        self.remediation = remediation
        """The worker's :class:`~detector.remediation.runner.ActionRunner` (None: no actions here)."""
        self.store = store
        self.notifier = notifier
        self.outbox = outbox
        self._clock = clock

    def handle(self, body: bytes, headers: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        try:
            self.verifier.verify(body, headers)
        except Unauthorized as exc:
            log.warning("slack_action_refused", reason=exc.reason)
            return 401, {"error": exc.reason}
        try:
            click = parse_click(body)
        except ValueError as exc:
            return 400, {"error": str(exc)}
        try:
            return self._handle(click)
        except Exception as exc:
            if not _store_error(exc):
                raise
            # As /incidents: a warning, no traceback; Slack shows the clicker an error, who clicks again.
            log.warning("slack_action_failed", alert_id=click.alert_id, action=click.action, error=one_line(exc))
            return 503, {"error": "the store did not answer; the click was not recorded. Try again"}

    def _handle(self, click: Click) -> tuple[int, dict[str, Any]]:
        from detector.store import alert_from_row

        row = self.store.alerts.get(click.alert_id)
        if row is None:
            return 404, {"error": f"no alert {click.alert_id!r}"}
        if click.action in DECISIONS:
            return self._decide(click, dict(row["tags"]))
        if click.on_group_message:
            return self._handle_group(click)
        now = self._clock()
        until = now + SNOOZE_S if click.action == "snoozed" else None
        self.store.actions.record(click, at=now, until=until)
        if until is not None and self.outbox is not None:
            self.outbox.snooze(snooze(click.alert_id, now, until, click.user_name or click.user_id))
        log.info("slack_action", alert_id=click.alert_id, action=click.action, user=click.user_name or click.user_id)
        if click.on_action_message:  # an action's warning, not the alert's message: the runner updates it
            if click.action == "snoozed":
                self._answer(click, self._snoozed_on_warning(click.alert_id))
        elif self.notifier is not None and click.channel and click.message_ts:
            alert = alert_from_row(row)
            try:
                self.notifier.show_actions(alert, self.store.actions.of(click.alert_id), click.channel, click.message_ts)
            except Exception as exc:  # recorded already; the message just does not show it yet
                log.warning("slack_action_not_shown", alert_id=click.alert_id, error=str(exc))
        return 200, {"ok": True, "action": click.action, "alert_id": click.alert_id}

    def _handle_group(self, click: Click) -> tuple[int, dict[str, Any]]:
        """Acknowledge, Snooze or Mark as expected on a group's message: for every alert it opened
        (those stored as posted in it; the clicked one alone if none is), then the message shows who."""
        from detector.store import alert_from_row

        members = self.store.deliveries.opened_in(click.channel, click.message_ts) if click.message_ts else []
        # The group's first member names it (its head, whose title and rule the message shows): first again when
        # the message is redrawn; alone if the record is not read.
        members = [click.alert_id, *(m for m in members if m != click.alert_id)]
        now = self._clock()
        until = now + SNOOZE_S if click.action == "snoozed" else None
        self.store.actions.record(click, at=now, until=until, alert_ids=members)
        if until is not None and self.outbox is not None:
            for alert_id in members:
                self.outbox.snooze(snooze(alert_id, now, until, click.user_name or click.user_id))
        log.info("slack_action", alert_id=click.alert_id, action=click.action, user=click.user_name or click.user_id,
                 alerts=len(members))  # fmt: skip
        rows = [r for r in (self.store.alerts.get(a) for a in members) if r is not None]
        show = getattr(self.notifier, "show_group_actions", None)
        if show is not None and click.channel and click.message_ts and rows:
            try:
                show([alert_from_row(r) for r in rows], self.store.actions.of(click.alert_id), click.channel,
                     click.message_ts)  # fmt: skip
            except Exception as exc:  # recorded already; the message just does not show it yet
                log.warning("slack_action_not_shown", alert_id=click.alert_id, error=str(exc))
        return 200, {"ok": True, "action": click.action, "alert_id": click.alert_id, "alerts": len(members)}

    def _snoozed_on_warning(self, alert_id: str) -> str:
        """What a snooze clicked on an automatic action's warning did: held it back, or came too late (its grace
        ended and the call is under way or done: a snooze stops what is still pending, nothing more)."""
        from detector.remediation.policy import Action

        late = [a for a in Action.from_steps(self.store.remediations.steps(alert_id)).values()
                if a.state in ("approved", "begun", "retry", "succeeded")]  # fmt: skip
        if late and late[0].stoppable:
            return (":zzz: Snoozed for 24 hours, but too late for the automatic action: it was approved, and waits to "
                    "be tried again. Decline stops it.")  # fmt: skip
        if late:
            return (f":zzz: Snoozed for 24 hours, but too late for the automatic action: it is {late[0].state} "
                    "already. Act by hand if it must be undone.")  # fmt: skip
        return (":zzz: Snoozed for 24 hours: a pending automatic action on this incident is not taken. This "
                "message says so at the worker's next pass.")  # fmt: skip

    def _decide(self, click: Click, tags: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """Approve or Decline: the runner checks who clicked, records it, and acts (or not)."""
        if self.remediation is None:
            return 409, {"error": "actions are not enabled in this worker"}
        status, what = self.remediation.decide(click.alert_id, click.user_id, click.action == "approved", tags)
        if status == 403:
            routing = self.remediation.ruleset().routing
            approvers, owner = routing.approvers_for(tags)
            self._answer(click, refusal_text(what, approvers, owner, tags.get(routing.by_tag, "")))
            return 200, {"ok": False, "status": 403, "error": what}
        if status == 409:
            from detector.slack import escape

            self._answer(click, f":information_source: {escape(what)}: it was decided already, or is no longer pending.")
            return 200, {"ok": False, "status": 409, "error": what}
        if status != 200:
            return status, {"error": what}
        try:  # the decision is stored (remediation_actions); this row is the click's own record besides it
            self.store.actions.record(click, at=self._clock())
        except Exception as exc:
            if not _store_error(exc):
                raise
            log.warning("slack_action_click_unrecorded", alert_id=click.alert_id, action=click.action,
                        error=one_line(exc), decision="stored")  # fmt: skip
        log.info("slack_action", alert_id=click.alert_id, action=click.action, user=click.user_name or click.user_id)
        if not getattr(self.remediation, "acting", True):  # the message is updated by the worker that acts
            self._answer(click, f":white_check_mark: {what.capitalize()}: recorded. The worker that carries out "
                                "actions takes it at its next pass; this message shows it then.")  # fmt: skip
        return 200, {"ok": True, "action": click.action, "alert_id": click.alert_id}

    def _answer(self, click: Click, text: str) -> None:
        """Tell the clicker ``text`` (only them: ephemeral) through the click's ``response_url``,
        in a thread so the click is acknowledged within Slack's 3 s. A URL elsewhere than
        Slack's is not called (a signed request could still carry one)."""
        if _origin(click.response_url) not in self._origins:
            if click.response_url:
                log.warning("slack_answer_not_sent", reason="response_url is not Slack's", origin=_origin(click.response_url))
            return

        def post() -> None:
            try:
                sent = WebhookClient(click.response_url, timeout=5).send(
                    text=text, response_type="ephemeral", replace_original=False)  # fmt: skip
                if sent.status_code != 200:
                    log.warning("slack_answer_not_sent", status=sent.status_code, body=sent.body[:200])
            except Exception as exc:  # noqa: BLE001 - the click is recorded; only the explanation is lost
                log.warning("slack_answer_not_sent", error=" ".join(str(exc).split())[:200])

        thread = threading.Thread(target=post, name="slack-answer", daemon=True)
        self.answers = [t for t in self.answers if t.is_alive()] + [thread]
        thread.start()
