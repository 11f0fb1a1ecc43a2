"""The tokens of SASL OAUTHBEARER: an OAuth 2.0 server's (:data:`detector.kafka_security.OAUTHBEARER`), and what
Amazon MSK's IAM tokens share with them (:mod:`streams.msk_iam_tokens`).

An OAuth server's token is taken from its token endpoint by the client credentials grant (RFC 6749 4.4), the
client id and secret sent as HTTP Basic credentials, each form-encoded first (RFC 6749 2.3.1). A broker closes a
connection whose token has expired, and the client connects again with a fresh one: each is made anew once a third of its life is
left, and shared by the connections made until then. One that cannot be made then (STS or the OAuth server
unreachable for a while) leaves the token in hand in use while it is good; after that, each connection fails as one
that could not be made, which aiokafka's clients retry.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import structlog
from aiokafka.abc import AbstractTokenProvider
from aiokafka.errors import KafkaConnectionError

from detector.kafka_security import check_trust

__all__ = ["OAuthTokens", "SharedTokens", "TokenUnavailable"]

_RENEW_WITHIN = 1 / 3
"""The share of a token's life left when the next connection gets a new one."""
_TOKEN_TIMEOUT_S = 10.0
"""How long the OAuth server may take to answer a token request."""
_UNSAID_LIFE_S = 3600.0
"""A token's life where the server says none (no ``expires_in``) and it is no JWT with an ``exp``: an hour, the
commonest lifetime of client credentials tokens."""
_MOST_LIFE_S = 86_400.0
"""The longest life a token is kept for, whatever the server says."""

log = structlog.get_logger("burnwatch.kafka")


class TokenUnavailable(KafkaConnectionError):
    """No token can be made: the region is unknown, no AWS credentials are found, or the OAuth server refuses the
    client or does not answer. The message says which, and what to check; never a secret. A connection that could
    not be made, to aiokafka: its clients retry it (any other error ends the consumer's fetcher, the producer's sender
    or the metadata updates for good). ``transient``: the server did not answer, or failed (5xx, 429), which says
    nothing of the credentials, and may pass."""

    __str__ = Exception.__str__  # the message alone, not aiokafka's "TokenUnavailable: ..."

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class SharedTokens(AbstractTokenProvider):
    """One token at a time, made in a thread (the AWS chain may call STS or the instance metadata service; the OAuth
    server is a round trip) and shared by the connections opened while more than a third of its life is left.

    The connections are opened on more than one event loop: Faust runs its consumer on a loop of its own, in its own
    thread, and its producer on the worker's, with one provider between them. So the token is looked up and made in
    a thread, under a thread lock: an asyncio lock belongs to one loop (a second loop waiting on it was not woken
    when it was released, or raised ``RuntimeError``)."""

    def __init__(self) -> None:
        self._token = ""
        self._expires_at = 0.0
        self._issued_at = 0.0
        self._lock = threading.Lock()

    async def token(self) -> str:
        return await asyncio.to_thread(self._current)

    def _current(self) -> str:
        with self._lock:  # connections opened together share one token
            now = time.time()
            left = self._expires_at - now
            if self._token and left > (self._expires_at - self._issued_at) * _RENEW_WITHIN:
                return self._token
            try:
                token, expires_at = self._make()
            except TokenUnavailable as exc:
                if self._token and left > 0:  # the one in hand is still good: try again at the next connection
                    log.warning("kafka_token_not_renewed", error=str(exc), token_left_s=round(left))
                    return self._token
                raise
            self._token, self._issued_at, self._expires_at = token, now, expires_at
            return self._token

    def _make(self) -> tuple[str, float]:
        """A new token and when it expires (epoch seconds); :class:`TokenUnavailable` if none can be made."""
        raise NotImplementedError


class OAuthTokens(SharedTokens):
    """aiokafka's token provider for an OAuth server's token endpoint ``url``, as ``client_id`` with ``secret``;
    ``scope`` asked where given, ``extensions`` sent beside each token."""

    def __init__(self, url: str, client_id: str, secret: str, scope: str | None = None,
                 extensions: Mapping[str, str] | None = None, ca_file: Path | None = None) -> None:  # fmt: skip
        super().__init__()
        self.url, self.scope = url, scope
        self._opener = _OPENER if ca_file is None else _opener(check_trust(ca_file))
        self._authorization = "Basic " + base64.b64encode(
            f"{urllib.parse.quote(client_id, safe='')}:{urllib.parse.quote(secret, safe='')}".encode()).decode()
        self._extensions = dict(extensions or {})

    def extensions(self) -> dict[str, str]:
        return dict(self._extensions)

    def _make(self) -> tuple[str, float]:
        form = {"grant_type": "client_credentials", **({"scope": self.scope} if self.scope else {})}
        request = urllib.request.Request(self.url, data=urllib.parse.urlencode(form).encode(), method="POST", headers={
            "Authorization": self._authorization, "Content-Type": "application/x-www-form-urlencoded",
            "Accept": "application/json"})  # fmt: skip
        now = time.time()
        try:
            with self._opener.open(request, timeout=_TOKEN_TIMEOUT_S) as answer:
                body = answer.read(1 << 20)
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                raise TokenUnavailable(f"the OAuth server at {self.url} answered a redirect ({exc.code}) to "
                                       f"{exc.headers.get('Location', '?')}, not followed with the client secret: set "
                                       "BURNWATCH_KAFKA_OAUTH_TOKEN_URL to the token endpoint itself") from None  # fmt: skip
            raise TokenUnavailable(f"the OAuth server at {self.url} refused a token ({exc.code} "
                                   f"{_oauth_error(exc.read(1 << 16))}): check BURNWATCH_KAFKA_SASL_USERNAME (the client "
                                   "id), BURNWATCH_KAFKA_SASL_PASSWORD (or _FILE: its secret) and "
                                   "BURNWATCH_KAFKA_OAUTH_SCOPE",
                                   transient=exc.code >= 500 or exc.code == 429) from None  # fmt: skip
        except (OSError, ValueError) as exc:  # URLError, a timeout, a connection refused, a certificate not trusted
            why = getattr(exc, "reason", exc)
            if isinstance(why, ssl.SSLCertVerificationError):  # says nothing of the server's health: not transient
                raise TokenUnavailable(f"the OAuth server at {self.url} has a certificate this machine does not trust "
                                       f"({why.verify_message}): set BURNWATCH_KAFKA_OAUTH_CA_FILE to its CAs' PEM "
                                       "bundle") from None  # fmt: skip
            raise TokenUnavailable(f"the OAuth server at {self.url} did not answer a token request ({why}): check "
                                   "BURNWATCH_KAFKA_OAUTH_TOKEN_URL", transient=isinstance(exc, OSError)) from None  # fmt: skip
        try:
            answer_json = json.loads(body)
            token = answer_json["access_token"]
            said_life = answer_json.get("expires_in")
            life = float(said_life) if said_life is not None else None
        except (ValueError, KeyError, TypeError, AttributeError):
            raise TokenUnavailable(f"the OAuth server at {self.url} answered no access_token (not an OAuth token "
                                   "endpoint? check BURNWATCH_KAFKA_OAUTH_TOKEN_URL)") from None  # fmt: skip
        if not isinstance(token, str) or not token:
            raise TokenUnavailable(f"the OAuth server at {self.url} answered an empty token")
        if life is None:  # RFC 6749 only recommends expires_in: a JWT says its own expiry
            expires = _jwt_expiry(token)
            if expires is not None and expires <= now:
                raise TokenUnavailable(f"the OAuth server at {self.url} answered a token that expired "
                                       f"{now - expires:.0f} s ago (its exp): is this machine's clock or the "
                                       "server's wrong?")  # fmt: skip
            life = expires - now if expires is not None else _UNSAID_LIFE_S
            if expires is None:
                log.warning("kafka_token_life_unknown", url=self.url, assumed_s=_UNSAID_LIFE_S)
        if not life > 0:  # NaN too
            raise TokenUnavailable(f"the OAuth server at {self.url} answered a token with no lifetime "
                                   f"(expires_in {said_life!r})")  # fmt: skip
        return token, now + min(life, _MOST_LIFE_S)


def _jwt_expiry(token: str) -> float | None:
    """A JWT's ``exp`` (RFC 7519 4.1.4: epoch seconds) read without checking its signature (the broker checks it: this
    only says when to ask for the next); None where the token is no JWT or has no numeric ``exp``."""
    parts = token.split(".")
    if len(parts) != 3 or len(parts[1]) > 1 << 16:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    expires = claims.get("exp") if isinstance(claims, dict) else None
    if isinstance(expires, bool) or not isinstance(expires, int | float):
        return None
    try:
        return float(expires) if math.isfinite(expires) else None  # (1e999 reads as inf)
    except OverflowError:  # an int beyond a float's range
        return None


def _oauth_error(body: bytes) -> str:
    """The error an OAuth server says (RFC 6749 5.2: ``error``, ``error_description``), shortened; its status alone if
    it says none."""
    try:
        said = json.loads(body)
        text = " ".join(str(said[k]) for k in ("error", "error_description") if isinstance(said, dict) and said.get(k))
    except ValueError:
        text = ""
    return text[:300] or "no reason given"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as it is (an ``HTTPError``), not followed: urllib sends the Authorization header on as it
    was, the client secret, to any host the redirect names, http:// too."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def _opener(context: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    """An opener of token requests that follows no redirect: proxies as the environment says, https verified against
    ``context``'s CAs (None: the system's trust store)."""
    return urllib.request.build_opener(_NoRedirect, urllib.request.HTTPSHandler(context=context))


_OPENER = _opener()
"""The token requests' where no CA bundle of the token endpoint is set."""
