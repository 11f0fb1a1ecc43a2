"""Email over SMTP: one message per alert change, plain text and HTML.

Everything an event carries is inert here: header values (the subject names the resource)
lose their control characters, CR and LF included, so a tag cannot add a header or a
recipient; the HTML part escapes every value (``html.escape``); values are capped in
length (:mod:`detector.outputs.payload`). Recipients and sender come only from
``routing.yaml``. The ``Message-ID`` is derived from (alert, output, change) and the
resolution answers the opening (``In-Reply-To``), so mail clients thread them. SMTP does
not dedupe, so a send cut off after the message may have been taken is not sent again.
"""

from __future__ import annotations

import html
import re
import smtplib
import socket
import ssl
from collections.abc import Callable
from email.message import EmailMessage
from email.utils import formatdate
from typing import Any

from detector.alerts import Alert
from detector.outputs.base import OutputError, secret
from detector.outputs.config import EmailSpec
from detector.outputs.payload import alert_fields, cap
from detector.rules import Routing
from detector.units import money

__all__ = ["EmailOutput", "header_text"]

_AUTH = {530, 534, 535, 538}
"""SMTP codes that say the login is missing or wrong, not the message: retried like a 4xx (the
changes wait, stored, until the credentials are fixed)."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]+")


def header_text(value: object, limit: int = 200) -> str:
    """A value fit for a header: one line, no control characters, at most ``limit`` characters."""
    return cap(_CONTROL.sub(" ", str(value)).strip(), limit)


class EmailOutput:
    dedupes = False
    resend_s = 0.0

    def __init__(self, name: str, spec: EmailSpec, routing: Callable[[], Routing]) -> None:
        self.name = name
        self.spec = spec
        self._routing = routing

    def message_id(self, alert: Alert, change: str) -> str:
        return f"<{alert.alert_id}.{change}.{self.name}@burnwatch>"

    def message(self, alert: Alert) -> EmailMessage:
        fields = alert_fields(alert, self._routing())
        msg = EmailMessage()
        msg["Subject"] = header_text(f"[burnwatch] {alert.summary()}")
        msg["From"] = self.spec.sender
        msg["To"] = ", ".join(self.spec.to)
        msg["Date"] = formatdate(localtime=False)
        msg["Message-ID"] = self.message_id(alert, alert.change)
        if alert.closes:
            msg["In-Reply-To"] = msg["References"] = self.message_id(alert, "fired")
        msg["X-Burnwatch-Alert-Id"] = alert.alert_id
        msg.set_content(_plain(fields))
        msg.add_alternative(_html(fields), subtype="html")
        return msg

    def send(self, alert: Alert) -> str:
        msg = self.message(alert)
        user = secret(self.spec.username_env, "the SMTP user")
        password = secret(self.spec.password_env, "the SMTP password")
        spec = self.spec
        try:
            if spec.tls == "ssl":
                smtp: smtplib.SMTP = smtplib.SMTP_SSL(spec.host, spec.port, timeout=spec.timeout_s,
                                                      context=ssl.create_default_context())  # fmt: skip
            else:
                smtp = smtplib.SMTP(spec.host, spec.port, timeout=spec.timeout_s)
        except (OSError, smtplib.SMTPException) as exc:
            raise OutputError(f"email {self.name}: cannot connect: {exc}", retryable=True) from None
        try:
            try:
                if spec.tls == "starttls":
                    smtp.starttls(context=ssl.create_default_context())
                if user is not None and password is not None:
                    smtp.login(user, password)
            except smtplib.SMTPNotSupportedError as exc:  # no STARTTLS or AUTH there: asking again will not help
                raise OutputError(f"email {self.name}: the server does not offer it: {exc}", retryable=False) from None
            except smtplib.SMTPResponseException as exc:
                raise OutputError(f"email {self.name}: {exc.smtp_code} {_said(exc)}",
                                  retryable=_retryable(exc.smtp_code)) from None  # fmt: skip
            except (OSError, smtplib.SMTPException) as exc:
                raise OutputError(f"email {self.name}: {exc}", retryable=True) from None
            try:
                refused = smtp.send_message(msg)
            except (smtplib.SMTPNotSupportedError, UnicodeError) as exc:  # an address it cannot take: nothing left
                raise OutputError(f"email {self.name}: the server cannot take these addresses: {exc}",
                                  retryable=False) from None  # fmt: skip
            except smtplib.SMTPRecipientsRefused as exc:
                codes = [code for code, _ in exc.recipients.values()]
                raise OutputError(f"email {self.name}: every recipient refused ({codes})",
                                  retryable=all(_retryable(c) for c in codes)) from None  # fmt: skip
            except smtplib.SMTPResponseException as exc:  # the server answered: it did not take it
                raise OutputError(f"email {self.name}: {exc.smtp_code} {_said(exc)}",
                                  retryable=_retryable(exc.smtp_code)) from None  # fmt: skip
            except (OSError, socket.timeout, smtplib.SMTPServerDisconnected) as exc:
                raise OutputError(f"email {self.name}: cut off while sending: {exc}", retryable=True,
                                  maybe_sent=True) from None  # fmt: skip
        finally:
            _quit(smtp)
        detail = f"to {len(spec.to) - len(refused)} of {len(spec.to)}"
        return detail

    def refresh(self, alerts: list[Alert]) -> None:
        return None


def _quit(smtp: smtplib.SMTP) -> None:
    """End the session whatever QUIT is answered: the message's fate was decided by the
    answer to its DATA (``with smtp:`` raises on a QUIT answered other than 221, which
    would take a mail delivered for a failure, and send it again)."""
    try:
        smtp.quit()
    except (OSError, smtplib.SMTPException):
        pass
    finally:
        smtp.close()


def _retryable(code: int) -> bool:
    return 400 <= code < 500 or code in _AUTH


def _said(exc: Any) -> str:
    text = exc.smtp_error.decode("utf-8", "replace") if isinstance(exc.smtp_error, bytes) else str(exc.smtp_error)
    return " ".join(text.split())[:300]


def _rows(fields: dict[str, Any]) -> list[tuple[str, str]]:
    res = fields["resource"]
    rows = [
        ("Alert", fields["id"]), ("Status", fields["status"]), ("Severity", fields["severity"]),
        ("Rule", f"{fields['rule']} ({fields['type']})"), ("Resource", res["id"]),
        ("Account / region", f"{res['account']} / {res['region']}"), ("Instance type", res["instance_type"]),
        ("Team", fields["team"]), ("Owner", fields["owner"]),
        (f"Dollars {fields['dollars_are'] or 'so far'}", money(fields["dollars_so_far"], exact=True)),
        ("Burn rate", f"{money(fields['usd_per_hour'])}/h"), ("Episode start", fields["episode_start"]),
    ]  # fmt: skip
    if fields["resolved_at"]:
        rows.append(("Resolved at", fields["resolved_at"]))
    if fields["corrects"]:  # a correction: what the resolution it replaces said
        was = fields["corrects"]
        rows.append(("Corrected from", f"{money(was['dollars_so_far'], exact=True)} at {was['resolved_at']}"))
    rows += [(k, v) for k, v in fields["facts"]]
    return [(k, v) for k, v in rows if v]


def _plain(fields: dict[str, Any]) -> str:
    lines = [fields["summary"], ""]
    lines += [f"{k}: {_CONTROL.sub(' ', str(v))}" for k, v in _rows(fields)]
    if fields["suggestion"]:
        lines += ["", f"Next step: {fields['suggestion']}"]
    lines += [""] + [f"{link['name']}: {link['url']}" for link in fields["links"]]
    return "\n".join(lines).rstrip() + "\n"


def _html(fields: dict[str, Any]) -> str:
    e = html.escape
    rows = "".join(f"<tr><th align=\"left\">{e(str(k))}</th><td>{e(str(v))}</td></tr>" for k, v in _rows(fields))
    links = "".join(f"<li><a href=\"{e(link['url'])}\">{e(link['name'])}</a></li>" for link in fields["links"])
    suggestion = f"<p><b>Next step:</b> {e(fields['suggestion'])}</p>" if fields["suggestion"] else ""
    return (f"<html><body><p>{e(fields['summary'])}</p><table>{rows}</table>{suggestion}"
            + (f"<ul>{links}</ul>" if links else "") + "</body></html>\n")  # fmt: skip
