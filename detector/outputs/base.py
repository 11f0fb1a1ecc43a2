"""What every output shares: the error it raises, and the interface the outbox drives."""

from __future__ import annotations

import os
import re
from typing import Protocol

from detector.alerts import Alert
from detector.logs import register_secrets

__all__ = ["Output", "OutputError", "secret"]


class OutputError(Exception):
    """A send that failed. ``retryable``: try again later (the receiver was down, answered
    5xx or 429); otherwise it refused the message for good. ``maybe_sent``: the request left
    and no answer came (a timeout, a dropped connection): the receiver may have it.
    ``retry_after_s``: how long the receiver asked to be left alone (``Retry-After``)."""

    def __init__(self, message: str, *, retryable: bool, maybe_sent: bool = False,
                 retry_after_s: float | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.retryable = retryable
        self.maybe_sent = maybe_sent
        self.retry_after_s = retry_after_s


class Output(Protocol):
    """One named destination (``rules/routing.yaml`` ``outputs``)."""

    name: str
    dedupes: bool
    """The receiver drops a repeated delivery of one (alert, output, change): a send that may
    have landed is sent again; otherwise it is recorded as ``unknown`` and not sent again."""
    resend_s: float
    """Firing alerts are sent again this often (0: never; Alertmanager needs it)."""

    def send(self, alert: Alert) -> str:
        """Deliver one change (``alert.change``: fired, resolved, or withdrawn or corrected after it); a short
        detail for the record. Raises :class:`OutputError`."""
        ...

    def refresh(self, alerts: list[Alert]) -> None:
        """Send still-firing alerts again (only where ``resend_s``)."""
        ...


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def secret(env: str | None, what: str, *, header: bool = False, trim: bool = False) -> str | None:
    """The value of environment variable ``env`` (read at each send, so a rotated secret is
    picked up); a missing one is a retryable error naming the variable, never a value.
    ``header``: it goes into an HTTP header, so it loses the surrounding whitespace a file
    mounted as a secret ends with, and one with a control character inside (it would end
    the header: http.client refuses it with an error that prints it) is refused the same way.
    ``trim``: it loses that whitespace too (a signing key: a Secret made ``--from-file`` ends
    with a newline the receiver's copy does not have, and every signature failed)."""
    if env is None:
        return None
    raw = os.environ.get(env) or ""
    value = raw.strip() if header or trim else raw
    register_secrets(raw, value)  # redacted from every log line from now on
    if not value:
        raise OutputError(f"environment variable {env} ({what}) is not set", retryable=True)
    if header and _CONTROL.search(value):
        raise OutputError(f"environment variable {env} ({what}) holds a line break or another control character",
                          retryable=True)  # fmt: skip
    return value
