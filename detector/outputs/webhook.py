"""A generic webhook: one signed JSON POST per alert change.

Signature, as Slack and Stripe sign theirs: ``X-Burnwatch-Timestamp`` is the Unix time of
the send and ``X-Burnwatch-Signature`` is ``v1=`` + hex HMAC-SHA256 of
``"{timestamp}.{body}"`` under the shared secret (from the environment variable the
output names; never in the YAML, never logged). A receiver recomputes it over the raw
body, compares in constant time and refuses timestamps more than a few minutes old
(:func:`verify`). ``Idempotency-Key`` is ``{alert id}:{output}:{change}``, the same on every
retry, so a receiver that remembers keys can drop a repeat.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable

from detector.alerts import Alert
from detector.outputs.base import secret
from detector.outputs.config import WebhookSpec
from detector.outputs.http import post
from detector.outputs.payload import alert_fields
from detector.rules import Routing

__all__ = ["SIGNATURE", "TIMESTAMP", "WebhookOutput", "sign", "verify"]

TIMESTAMP = "X-Burnwatch-Timestamp"
SIGNATURE = "X-Burnwatch-Signature"
IDEMPOTENCY = "Idempotency-Key"


def sign(secret_value: str, timestamp: str, body: bytes) -> str:
    """``v1=`` + hex HMAC-SHA256 of ``timestamp.body``."""
    mac = hmac.new(secret_value.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def verify(secret_value: str, timestamp: str, body: bytes, signature: str, *, now: float | None = None,
           tolerance_s: float = 300.0) -> bool:  # fmt: skip
    """What a receiver checks: the signature matches and the timestamp is recent (no replay)."""
    try:
        age = abs((time.time() if now is None else now) - int(timestamp))
    except ValueError:
        return False
    return age <= tolerance_s and hmac.compare_digest(sign(secret_value, timestamp, body), signature)


class WebhookOutput:
    """Posts :func:`~detector.outputs.payload.alert_fields` (plus ``output``) as JSON."""

    resend_s = 0.0

    def __init__(self, name: str, spec: WebhookSpec, routing: Callable[[], Routing]) -> None:
        self.name = name
        self.spec = spec
        self.dedupes = spec.receiver_dedupes
        self._routing = routing
        self._clock = time.time

    def body(self, alert: Alert) -> bytes:
        fields = {"output": self.name, **alert_fields(alert, self._routing())}
        return json.dumps(fields, ensure_ascii=True, separators=(",", ":")).encode()

    def send(self, alert: Alert) -> str:
        key = secret(self.spec.secret_env, "the webhook's signing secret", trim=True)
        assert key is not None
        body = self.body(alert)
        timestamp = str(int(self._clock()))
        headers = {
            "Content-Type": "application/json",
            TIMESTAMP: timestamp,
            SIGNATURE: sign(key, timestamp, body),
            IDEMPOTENCY: f"{alert.alert_id}:{self.name}:{alert.change}",
        }
        status = post(f"webhook {self.name}", self.spec.url, body, headers, self.spec.timeout_s)
        return f"HTTP {status}"

    def refresh(self, alerts: list[Alert]) -> None:
        return None
