"""Deciding actions from the incidents page (``POST /incidents``): who asks, whether the
request came from the page, and the decision, through the same runner and policy as a
Slack click.

Who asks is a header set by the authenticating proxy in front of the worker, named by
``BURNWATCH_WEB_USER_HEADER`` (unset: the page is read-only and every POST is refused).
That identity (a user name or an e-mail) becomes an approver through ``routing.yaml``'s
``users`` map, the one that already turns an owner tag into a Slack user id: the id found
there is checked by :func:`detector.remediation.policy.may_approve` exactly as a Slack click
by that user would be (team lists, user groups, the owner). An identity ``users`` does not
name is nobody's Slack id: it is refused, and the refusal is recorded as ``web:<identity>``.

A POST is accepted only from the page itself: a token in the form, bound to the identity
by an HMAC with a key of this process (:class:`PageTokens`), and the browser's own word that
the request is same-origin (``Sec-Fetch-Site``, else ``Origin``). A second click, a replay
or a click on an action decided meanwhile is answered 409 and changes nothing: the runner
only decides an action that awaits a decision (``alert_id:kind`` is its idempotency key).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import structlog

from detector.remediation.policy import Action
from detector.rules import SLACK_USER_ID, Routing
from detector.store.remediation import STEP_COLUMNS

if TYPE_CHECKING:
    from detector.remediation.runner import ActionRunner
    from detector.store import Store

__all__ = ["DECISIONS", "PageTokens", "WebDecisions", "actions_of", "cross_site", "identity", "slack_user",
           "web_decider", "who_may"]  # fmt: skip

log = structlog.get_logger("burnwatch.web")

DECISIONS = ("approve", "decline", "snooze")
"""What a form may ask: Approve, Decline (Object, on an automatic action) and Snooze 24h."""
MAX_IDENTITY = 254
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ALERT_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
SNOOZE_S = 86_400.0


def identity(headers: Mapping[str, str], header: str | None) -> str | None:
    """The person the proxy names in ``header`` (None: no header configured, none sent, or a
    value no proxy would send: empty, control characters, longer than an e-mail may be)."""
    if not header:
        return None
    value = headers.get(header)
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > MAX_IDENTITY or _CONTROL.search(value):
        return None
    return value


def slack_user(routing: Routing, who: str) -> str:
    """The Slack user id ``routing.users`` gives the web identity ``who``: its entry, exactly;
    else, for an e-mail, the entry that differs only in case. '' if none (no prefix or domain
    is ever stripped: ``alice@elsewhere.com`` is not ``alice``)."""
    found = routing.users.get(who)
    if found is None and "@" in who:
        folded = who.casefold()
        found = next((v for k, v in routing.users.items() if "@" in k and k.casefold() == folded), None)
    return found if found is not None and SLACK_USER_ID.fullmatch(found) else ""


def who_may(routing: Routing, tags: Mapping[str, str]) -> str:
    """Who may decide an action on a resource with ``tags``, in a line: each approver's names
    in ``users`` with the Slack id, user groups by id, the owner where allowed."""
    ids, owner = routing.approvers_for(dict(tags))
    names: dict[str, list[str]] = {}
    for name, user in routing.users.items():
        names.setdefault(user, []).append(name)
    shown = [f"{', '.join(names[i])} ({i})" if i in names else (f"user group {i}" if i.startswith("S") else i)
             for i in ids]  # fmt: skip
    if owner:
        shown.append(f"the resource's owner ({', '.join(names.get(owner, [])) or owner})")
    team = tags.get(routing.by_tag, "")
    return (f"Approvers for {f'team {team}' if team else 'resources with no team'}: "
            f"{'; '.join(shown) if shown else 'none are set in routing.yaml (approvers)'}.")  # fmt: skip


def web_decider(routing: Routing, who: str) -> str:
    """Who decides, as the runner records and checks it: the Slack user id of ``who``, or
    ``web:<who>`` (which no approver list can hold, so it is refused and recorded)."""
    return slack_user(routing, who) or f"web:{who}"


class PageTokens:
    """A token per page, bound to the person it was served to: ``<issued>.<hmac>``, valid
    ``ttl_s``. The key is ``BURNWATCH_WEB_TOKEN_SECRET`` (shared by a group's workers), else
    random per process: after a restart, a page must then be reloaded."""

    def __init__(self, key: bytes | None = None, *, clock: Callable[[], float] = time.time,
                 ttl_s: float = 8 * 3600) -> None:  # fmt: skip
        self._key = key or secrets.token_bytes(32)
        self._clock = clock
        self.ttl_s = ttl_s

    def _mac(self, issued: str, who: str) -> str:
        return hmac.new(self._key, f"{issued}\n{who}".encode(), hashlib.sha256).hexdigest()

    def issue(self, who: str) -> str:
        issued = str(int(self._clock()))
        return f"{issued}.{self._mac(issued, who)}"

    def check(self, who: str, token: str) -> str | None:
        """Why ``token`` is not ``who``'s from a recent page (None: it is)."""
        issued, _, mac = token.partition(".")
        if not issued.isascii() or not issued.isdigit() or len(issued) > 12 or not hmac.compare_digest(
                mac.encode(), self._mac(issued, who).encode()):  # fmt: skip
            return "the form's token is missing or not this person's; reload the page"
        if not 0 <= self._clock() - int(issued) <= self.ttl_s:
            return "the page is too old; reload it"
        return None


def cross_site(headers: Mapping[str, str], host: str, public_origin: str | None = None) -> str | None:
    """Why a POST did not come from the page's own origin (None: it did). The browser's
    ``Sec-Fetch-Site`` decides where sent; else ``Origin`` must be ``public_origin``
    (``BURNWATCH_WEB_ORIGIN``) or, unset, name ``host``. A request with neither is refused:
    every browser sends one on a form's POST."""
    site = headers.get("Sec-Fetch-Site")
    if site is not None:
        return None if site == "same-origin" else f"a {site[:20]!r} request (Sec-Fetch-Site); only the page may post"
    origin = headers.get("Origin")
    if origin is None:
        return "no Origin or Sec-Fetch-Site header; only the page may post"
    if public_origin:
        ok = origin.rstrip("/") == public_origin.rstrip("/")
    else:
        ok = origin != "null" and urlsplit(origin).netloc == host
    return None if ok else f"Origin {origin[:100]!r} is not this page's"


def actions_of(conn: Any, alert_ids: Sequence[str]) -> dict[str, list[Action]]:
    """Alert id → its actions' states, rebuilt from ``remediation_actions`` as the runner does."""
    if not alert_ids:
        return {}
    rows = conn.query(f"SELECT {STEP_COLUMNS} FROM {conn.db}.remediation_actions WHERE alert_id IN %(ids)s "
                      "ORDER BY action_key, at, seq", {"ids": list(alert_ids)})  # fmt: skip
    out: dict[str, list[Action]] = {}
    for action in Action.from_steps(rows).values():
        out.setdefault(action.alert_id, []).append(action)
    return out


class WebDecisions:
    """What ``POST /incidents`` does once the person and the page are known (blocking: run it
    in an executor). Returns (HTTP status, what happened, in a line)."""

    def __init__(self, store: Store, runner: ActionRunner, tokens: PageTokens | None = None, *, outbox: Any = None,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.store = store
        self.runner = runner
        self.tokens = tokens or PageTokens(clock=clock)
        self.outbox = outbox
        """The worker's outbox: a snooze keeps the incident out of Slack, as Slack's button does."""
        self._clock = clock

    def handle(self, who: str, form: Mapping[str, Sequence[str]]) -> tuple[int, str]:
        """``who`` (the proxy's header, checked) posted ``form`` from a same-origin page."""
        tokens = form.get("token", ())
        why = self.tokens.check(who, tokens[0]) if len(tokens) == 1 else "the form has no token; reload the page"
        if why is not None:  # first: a request that is not the page's learns nothing else
            log.warning("web_action_refused", user=who, reason=why)
            return 403, why
        fields: dict[str, str] = {}
        for name in ("alert_id", "decision"):
            given = form.get(name, ())
            if len(given) != 1:
                return 400, f"{name}: give it once"
            fields[name] = given[0]
        if set(form) - {"token", *fields}:
            return 400, "unknown field in the form"
        alert_id, decision = fields["alert_id"], fields["decision"]
        if not _ALERT_ID.fullmatch(alert_id) or decision not in DECISIONS:
            return 400, "not an incident's id, or not one of approve, decline, snooze"
        row = self.store.alerts.get(alert_id)
        if row is None:
            return 404, f"no incident {alert_id}"
        tags = dict(row["tags"])
        if decision == "snooze":
            return self._snooze(who, alert_id)
        routing = self.runner.ruleset().routing
        decider = web_decider(routing, who)
        status, what = self.runner.decide(alert_id, decider, decision == "approve", tags)
        if status == 200:
            self.store.actions.record(self._click(what, alert_id, decider, who), at=self._clock())
        elif status == 403:  # told who may, as Slack's clicker is (the audit keeps the reason alone)
            what = f"{what}. {who_may(routing, tags)}"
        log.info("web_action", alert_id=alert_id, user=who, decided_by=decider, decision=decision, status=status)
        return status, what

    def _snooze(self, who: str, alert_id: str) -> tuple[int, str]:
        """Snooze 24h, as Slack's button (anyone who may see the incident may snooze it): an
        automatic action on it is cancelled at the runner's next pass."""
        from detector.suppression import snooze

        waiting = actions_of(self.store, [alert_id]).get(alert_id, [])
        if not any(a.awaits_decision and a.mode == "auto_unless_objected" for a in waiting):
            return 409, f"no automatic action on {alert_id} is pending"
        now = self._clock()
        until = now + SNOOZE_S
        self.store.actions.record(self._click("snoozed", alert_id, "", who), at=now, until=until)
        if self.outbox is not None:
            self.outbox.snooze(snooze(alert_id, now, until, who))
        self.runner.wake.set()
        log.info("web_action", alert_id=alert_id, user=who, decision="snooze", status=200)
        return 200, "snoozed"

    @staticmethod
    def _click(action: str, alert_id: str, user_id: str, who: str) -> Any:
        from detector.actions import Click

        return Click(action=action, alert_id=alert_id, user_id=user_id if not user_id.startswith("web:") else "",
                     user_name=who, channel="", message_ts="")  # fmt: skip
