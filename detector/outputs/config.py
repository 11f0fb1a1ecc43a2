"""What ``rules/routing.yaml`` says about outputs: the named outputs (``outputs``) and which
of them an alert goes to (``send``), validated like the rule files (errors name the file,
line and field; a bad file is refused and the configuration in force kept).

Secrets are never in the file: an output names the environment variables that hold them
(``secret_env``, ``password_env``...), read when it is built.
"""

from __future__ import annotations

import re
import string
from collections.abc import Collection
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

__all__ = [
    "OUTPUT_KINDS", "SLACK", "STRAY_PERCENT", "AlertmanagerSpec", "EmailSpec", "OutputName", "OutputSpec", "Send", "SlackSpec",
    "WebhookSpec", "check_outputs", "check_send", "outputs_for", "template_fields",
]  # fmt: skip

SLACK = "slack"
"""The built-in output: the Slack outbox (channels as ``routing.yaml`` chooses them)."""

EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)]
"""The name of an environment variable (never its value)."""


STRAY_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
"""A ``%`` that starts no escape such as ``%20``: Go's url.Parse, Alertmanager's, refuses it."""


def _url(value: str) -> str:
    """An ``http(s)`` URL that urllib can send as written. The value is never quoted back (a
    token in its query would show in ``rules check``); a user or password in it is refused:
    urllib sends no basic auth from a URL (it would take ``user:pw@host`` for a host name and
    fail to resolve it for good), and secrets belong in environment variables."""
    if not re.fullmatch(r"[!-~]+", value):  # http.client refuses the rest, with an error quoting the URL
        raise ValueError("not a URL urllib can send: only printable ASCII, no space or control character "
                         "(a host name in punycode, the rest percent-encoded: %C3%BC for ü)")  # fmt: skip
    if STRAY_PERCENT.search(value):  # Alertmanager refuses such a generatorURL, and every alert with it
        raise ValueError("a '%' that does not start an escape such as %20 (write a literal % as %25)")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https"):
        raise ValueError("must start with http:// or https://")
    if "@" in parts.netloc:
        raise ValueError("a user or password in the URL (user:password@host) is not supported and would be a "
                         "secret in the file: give a token by environment variable (bearer_token_env)")  # fmt: skip
    try:
        port = parts.port
    except ValueError:
        raise ValueError("the port is not a number from 1 to 65535") from None
    if not parts.hostname or port == 0:
        raise ValueError("no host" if not parts.hostname else "the port is not a number from 1 to 65535")
    return value


Url = Annotated[str, Field(max_length=2000), AfterValidator(_url)]
"""An ``http(s)`` URL with a host, in printable ASCII, without user or password."""
_ADDRESS = re.compile(r"[^@\s<>,;:\"()\[\]\\]+@[^@\s<>,;:\"()\[\]\\]+")


def _address(value: str) -> str:
    if len(value) > 254 or not _ADDRESS.fullmatch(value):
        raise ValueError(f"{value[:80]!r} is not a bare mail address (name@domain: no display name, space, line "
                         "break, comma or angle bracket)")  # fmt: skip
    return value


Address = Annotated[str, AfterValidator(_address)]
"""A bare mail address: no display name, no line break, nothing a header could be forged with."""
OutputName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)]
Seconds = Annotated[float, Field(gt=0, le=3600)]
MAX_TIMEOUT_S = 30.0


def _timeout(value: float) -> float:
    if value > MAX_TIMEOUT_S:
        raise ValueError(f"{value:g} s is too long: at most {MAX_TIMEOUT_S:g} s (one delivery thread serves every "
                         "output besides Slack: a receiver that hangs holds the others up this long)")  # fmt: skip
    return value


Timeout = Annotated[float, Field(gt=0), AfterValidator(_timeout)]
"""How long a send waits for the receiver's answer."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SlackSpec(_Spec):
    """The Slack outbox itself (``slack`` is always defined; naming another output of this
    kind is an alias of it)."""

    kind: Literal["slack"]


class WebhookSpec(_Spec):
    """A JSON POST per alert change, signed with HMAC-SHA256 (``X-Burnwatch-Signature``)."""

    kind: Literal["webhook"]
    url: Url
    secret_env: EnvName
    """The environment variable holding the signing secret (required: an unsigned webhook
    cannot be told from a forged one)."""
    receiver_dedupes: bool = False
    """The receiver drops a second request with an ``Idempotency-Key`` it has seen: then a send
    a kill cut off (maybe received, never recorded) is sent again; otherwise it is not."""
    timeout_s: Timeout = 10.0


class AlertmanagerSpec(_Spec):
    """Prometheus Alertmanager's API (``POST {url}/api/v2/alerts``)."""

    kind: Literal["alertmanager"]
    url: Url
    """Alertmanager's base URL, e.g. ``http://alertmanager:9093``."""
    resend_s: Seconds = 60.0
    """Firing alerts are posted again this often, as Prometheus does (Alertmanager resolves an
    alert whose ``endsAt`` passes)."""
    ends_after_s: Seconds | None = None
    """The ``endsAt`` each post of a firing alert sets, from now (default 4 × ``resend_s``,
    Prometheus's choice): a worker that stops re-sending lets its alerts resolve then."""
    bearer_token_env: EnvName | None = None
    generator_url: Url | None = None
    """``generatorURL`` template over the link fields (``{resource_id}``, ``{alert_id}``...);
    default: the alert's first ``links`` entry, if any."""
    timeout_s: Timeout = 10.0

    @model_validator(mode="after")
    def _ends_after_resend(self) -> AlertmanagerSpec:
        if self.ends_after_s is not None and self.ends_after_s <= self.resend_s:
            raise ValueError(f"ends_after_s ({self.ends_after_s:g}) must exceed resend_s ({self.resend_s:g}): "
                             "Alertmanager would resolve the alert between two re-sends")  # fmt: skip
        return self


class EmailSpec(_Spec):
    """One mail per alert change over SMTP (plain text and HTML)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True)

    kind: Literal["email"]
    host: Annotated[str, Field(pattern=r"^[A-Za-z0-9.:\[\]-]+$", max_length=253)]
    port: Annotated[int, Field(ge=1, le=65535)] = 25
    tls: Literal["none", "starttls", "ssl"] = "starttls"
    username_env: EnvName | None = None
    password_env: EnvName | None = None
    smtputf8: bool = False
    """The server takes internationalised addresses (SMTPUTF8): only then may ``from`` and
    ``to`` hold non-ASCII characters (elsewhere no server would ever take them)."""
    sender: Address = Field(alias="from")
    to: Annotated[list[Address], Field(min_length=1, max_length=100)]
    timeout_s: Timeout = 30.0

    @model_validator(mode="after")
    def _credentials(self) -> EmailSpec:
        if (self.username_env is None) != (self.password_env is None):
            given, missing = ("username_env", "password_env") if self.password_env is None else ("password_env", "username_env")
            raise ValueError(f"{given} without {missing}: give both (to log in) or neither (no login is tried, and "
                             "a server that wants one refuses every mail for good)")  # fmt: skip
        if self.username_env is not None and self.tls == "none":
            raise ValueError("a login with tls: none would send the password in clear: use tls: starttls or ssl")
        return self

    @field_validator("sender", "to")
    @classmethod
    def _ascii_unless_smtputf8(cls, value: str | list[str], info: ValidationInfo) -> str | list[str]:
        if info.data.get("smtputf8"):
            return value
        for address in [value] if isinstance(value, str) else value:
            if not address.isascii():
                raise ValueError(f"{address[:80]!r} is not ASCII: set smtputf8: true if the mail server takes "
                                 "internationalised addresses (SMTPUTF8)")  # fmt: skip
        return value


OUTPUT_KINDS = frozenset({"slack", "webhook", "alertmanager", "email"})
OutputSpec = Annotated[SlackSpec | WebhookSpec | AlertmanagerSpec | EmailSpec, Field(discriminator="kind")]


class Send(_Spec):
    """Which outputs an alert goes to: its team's list (``by_team``, the team being the tag
    ``by_tag`` names) or else ``default``, plus its severity's (``by_severity``). Slack is
    the default when nothing is said; a team list without ``slack`` keeps that team's alerts
    out of Slack."""

    default: list[OutputName] = [SLACK]
    by_team: dict[str, list[OutputName]] = {}
    by_severity: dict[Literal["info", "warning", "critical"], list[OutputName]] = {}


def template_fields(template: str) -> set[str]:
    """The fields a URL template (``{resource_id}``...) uses. A format spec or a conversion
    is refused: ``{resource_id:>999999999}`` would build a gigabyte for every alert."""
    fields = set()
    for _, field, spec, conversion in string.Formatter().parse(template):
        if field is None:
            continue
        if spec or conversion:
            shown = field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            raise ValueError(f"{{{shown[:60]}}}: only plain fields such as {{resource_id}} are allowed (no format "
                             "spec or conversion)")  # fmt: skip
        fields.add(field)
    return fields


def check_outputs(outputs: dict[str, Any], fields: Collection[str]) -> dict[str, Any]:
    """``slack`` names the Slack outbox: it may not name another kind of output. A
    ``generator_url`` template uses only the link ``fields``."""
    spec = outputs.get(SLACK)
    if spec is not None and spec.kind != SLACK:
        raise ValueError(f"{SLACK!r} is the built-in Slack output; give the {spec.kind} output another name")
    for name, spec in outputs.items():
        template = getattr(spec, "generator_url", None)
        if not template:
            continue
        try:
            used = template_fields(template)
        except ValueError as exc:
            raise ValueError(f"{name}.generator_url: invalid URL template: {exc}") from None
        unknown = sorted(used - set(fields))
        if unknown:
            raise ValueError(f"{name}.generator_url: unknown field(s) {', '.join(unknown)}; known: "
                             f"{', '.join(sorted(fields))}")  # fmt: skip
    return outputs


def check_send(send: Send, info: ValidationInfo) -> Send:
    """Every output ``send`` names is defined (in ``outputs``, or ``slack``)."""
    known = {SLACK, *(info.data.get("outputs") or {})}
    wrong = []
    for where, names in [("default", send.default), *((f"by_team.{t}", n) for t, n in send.by_team.items()),
                         *((f"by_severity.{s}", n) for s, n in send.by_severity.items())]:  # fmt: skip
        wrong += [f"{where}: {name!r}" for name in names if name not in known]
    if wrong:
        raise ValueError(f"unknown output(s) {', '.join(wrong)}; defined: {', '.join(sorted(known))}")
    return send


def outputs_for(send: Send, outputs: dict[str, Any], team: str, severity: str) -> list[str]:
    """The outputs an alert of ``team`` and ``severity`` goes to, in order, each once; a
    ``slack``-kind output is reported as ``slack``."""
    names = send.by_team.get(team, send.default) + send.by_severity.get(severity, [])  # type: ignore[call-overload]
    chosen: list[str] = []
    for name in names:
        spec = outputs.get(name)
        name = SLACK if spec is None or spec.kind == SLACK else name
        if name not in chosen:
            chosen.append(name)
    return chosen
