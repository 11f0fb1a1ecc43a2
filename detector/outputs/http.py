"""One JSON POST with the standard library's HTTP client, its failures sorted into
:class:`~detector.outputs.base.OutputError` (retry, refused, maybe sent)."""

from __future__ import annotations

import http.client
import re
import socket
import time
import urllib.error
import urllib.request
from datetime import timezone
from email.utils import parsedate_to_datetime
from typing import Any

from detector.outputs.base import OutputError

__all__ = ["post", "retry_after"]

_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_RETRY = {401, 407, 408, 425, 429}
"""Besides 5xx. 401 and 407 say the credential (the signing secret, the bearer token) is wrong
or rotated, not the message: like a secret not set, the changes wait, stored, until it is fixed.
A 403 can refuse one message (a firewall taking a tag for an attack): refused for good."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not followed: urllib would turn the POST into a GET to
    anywhere, carrying ``Authorization`` along, and take that GET's 200 for a delivery."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def post(what: str, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> int:
    """POST ``body``; the status of a 2xx answer. ``what`` names the output in errors (the URL
    is left out of them: some carry a token)."""
    request = urllib.request.Request(url, data=body, method="POST", headers={"User-Agent": "burnwatch", **headers})
    try:
        with _OPENER.open(request, timeout=timeout_s) as answer:  # noqa: S310 - http(s) only (validated)
            _drain(answer)
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        text = _head(exc)
        redirect = 300 <= exc.code < 400  # the URL is wrong, not the message: the changes wait for a fixed one
        if redirect:
            text = f"a redirect to {exc.headers.get('Location', '?')[:200]}, not followed: configure the final URL"
        retryable = redirect or exc.code in _RETRY or exc.code >= 500
        wait = retry_after(exc.headers.get("Retry-After"), time.time()) if retryable else None
        raise OutputError(f"{what} answered {exc.code}: {text}", retryable=retryable, retry_after_s=wait) from None
    except (TimeoutError, socket.timeout) as exc:
        raise OutputError(f"{what}: no answer within {timeout_s:g} s", retryable=True, maybe_sent=True) from exc
    except urllib.error.URLError as exc:  # connecting or sending failed: the request never arrived whole
        raise OutputError(f"{what} unreachable: {exc.reason}", retryable=True) from None
    except (ConnectionError, OSError) as exc:  # the request left; the connection dropped before the answer
        raise OutputError(f"{what}: connection lost: {exc}", retryable=True, maybe_sent=True) from None
    except http.client.HTTPException as exc:  # the request left; the answer was not HTTP (BadStatusLine...)
        said = " ".join(str(exc).split())[:200]
        raise OutputError(f"{what}: an answer that is not HTTP: {type(exc).__name__} {said}", retryable=True,
                          maybe_sent=True) from None  # fmt: skip


def retry_after(value: str | None, now: float) -> float | None:
    """The seconds a ``Retry-After`` header asks for (``120`` or an HTTP date); None when there
    is none or it says nothing usable (negative, garbage). The outbox bounds it by its longest
    backoff, so an absurd one (a year, a date far ahead) costs nothing."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, when.timestamp() - now)


def _drain(answer: Any) -> None:
    """Read (a little of) a 2xx answer's body, which says nothing more: a body cut off or late
    after the status line must not turn a delivery into a send 'maybe sent' (recorded
    ``unknown`` by an output that does not dedupe)."""
    try:
        answer.read(65536)
    except (OSError, http.client.HTTPException):
        pass


def _head(exc: Any) -> str:
    """The start of an error answer's body, for the log: one line, no control characters (a
    terminal escape in it would reach a console)."""
    try:
        return " ".join(_UNPRINTABLE.sub(" ", exc.read(300).decode("utf-8", "replace")).split())
    except Exception:  # noqa: BLE001 - the body is only for the log
        return ""
