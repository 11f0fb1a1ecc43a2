"""structlog setup: JSON lines in containers, readable console on a terminal; secrets never.

Log per batch, never per event: rendering one line costs ~10 µs, as much as
decoding and detecting a hundred events.

Secrets (the Slack bot token, webhook URL and signing secret, the ClickHouse
password) are registered once at start from the settings (:func:`register_settings`)
and replaced by ``[redacted]`` wherever they would be written: in our structlog
events, in every stdlib record (slack-sdk logs a webhook's whole URL at debug level;
Faust, aiokafka, urllib3 and clickhouse-connect log through the same handler), in
tracebacks, and in the CLI's messages. Patterns catch what was not registered:
Slack tokens (``xoxb-…``), webhook paths (``hooks.slack.com/services/…``), the
password in ``scheme://user:password@host``, and OAUTHBEARER tokens and SigV4 signatures
(Amazon MSK's IAM tokens, which aiokafka and botocore log at debug level).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import traceback
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit, urlunsplit

import structlog
from structlog.typing import EventDict, Processor, ProcessorReturnValue, WrappedLogger

if TYPE_CHECKING:  # for the type only: logging does not load the settings (pydantic-settings)
    from detector.settings import Settings

__all__ = [
    "REDACTED",
    "RedactingFilter",
    "configure_logging",
    "install_redaction",
    "redact",
    "redact_dsn",
    "register_secrets",
    "register_settings",
    "stdlib_logging_config",
]

REDACTED = "[redacted]"
_PATTERNS = (
    (re.compile(r"xox[abeoprs]-[A-Za-z0-9-]+"), REDACTED),
    (re.compile(r"(hooks\.slack(?:-gov)?\.com/(?:services|workflows|triggers)/)[^\s\"'<>]+"), r"\1" + REDACTED),
    (re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@\"'<>]*:)[^@\s/\"'<>]+@"), r"\1" + REDACTED + "@"),
    # a bearer token (RFC 6750's characters): aiokafka logs a SASL OAUTHBEARER exchange, ``auth=Bearer TOKEN``,
    # at debug level, an OAuth server's token or an MSK IAM one (a presigned URL), each good for minutes or hours
    (re.compile(r"(\b[Bb]earer[ =]+)[A-Za-z0-9\-._~+/]+=*"), r"\1" + REDACTED),
    # a presigned URL's signature, and the one botocore logs at debug level after the request it signs (the two
    # make an MSK IAM token again)
    (re.compile(r"(X-Amz-Signature=|Signature:\s*)[0-9a-f]{64}\b"), r"\1" + REDACTED),
)
_secrets: tuple[str, ...] = ()
_lock = threading.Lock()


def register_secrets(*values: str | None) -> None:
    """Values to redact from now on (the longest first, so a URL goes before its path)."""
    global _secrets
    new = {v for v in values if v and len(v) >= 4}
    new |= {unquote(v) for v in new}  # a DSN's password as written and as decoded
    with _lock:
        _secrets = tuple(sorted(set(_secrets) | new, key=len, reverse=True))


def register_settings(settings: Settings) -> None:
    """Register every secret the settings hold: call once, right after loading them."""
    values: list[str | None] = []
    for name in ("slack_bot_token", "slack_webhook_url", "slack_signing_secret"):
        secret = getattr(settings, name, None)
        values.append(secret.get_secret_value() if secret is not None else None)
    if values[1]:
        values.append(urlsplit(values[1]).path)  # the webhook's secret part, should a log print only the path
    values.append(urlsplit(settings.dsn).password)
    kafka_password = settings.kafka_security.password  # aiokafka logs a PLAIN exchange, password and all, at debug level
    if kafka_password is not None:  # as a bytes repr: a backslash, a quote or a non-ASCII letter escaped
        values += [kafka_password.get_secret_value(), *_in_bytes_repr(kafka_password.get_secret_value())]
    register_secrets(*values)


def _in_bytes_repr(secret: str) -> tuple[str, str]:
    """How ``secret`` reads inside the repr of ``bytes`` holding it in UTF-8 (aiokafka logs a SASL/PLAIN token,
    ``b'user\\x00user\\x00password'``, at debug level): escaped, with ``'`` escaped (single-quoted) or not."""
    inner = repr(b'"' + secret.encode())[3:-1]  # the leading '"' makes the repr single-quoted whatever the secret holds
    return inner, inner.replace("\\'", "'")


def redact(text: str) -> str:
    """``text`` with every registered secret and every secret-shaped string replaced."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redact_dsn(dsn: str) -> str:
    """A DSN fit to print: its password (if any) replaced, the rest kept to say where it points."""
    try:
        parts = urlsplit(dsn)
        if parts.password is None:
            return redact(dsn)
        host = parts.netloc.rpartition("@")[2]
        user = parts.username or ""
        return urlunsplit(parts._replace(netloc=f"{user}:{REDACTED}@{host}"))
    except ValueError:  # not a URL urllib can read (a bad port): say nothing of its user part
        return redact(dsn)


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact_value(v) for v in value]
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return redact(str(value))


def _redact_event(logger: WrappedLogger, name: str, event_dict: EventDict) -> EventDict:
    """structlog processor: exceptions rendered to text, then every value redacted."""
    if event_dict.get("exc_info"):
        event_dict = structlog.processors.format_exc_info(logger, name, event_dict)
    return {k: v if k.startswith("_") else _redact_value(v) for k, v in event_dict.items()}


class _Redacted:
    """The renderer, with the line it renders redacted once more: a second pass for a secret
    that only appears once values are put together."""

    def __init__(self, renderer: Processor) -> None:
        self._renderer = renderer

    def __call__(self, logger: WrappedLogger, name: str, event_dict: EventDict) -> ProcessorReturnValue:
        out = self._renderer(logger, name, event_dict)
        return redact(out) if isinstance(out, str) else out


class RedactingFilter(logging.Filter):
    """A stdlib filter that redacts a record's message, arguments and traceback in place,
    so any handler and formatter (ours, Faust's, a library's) writes it without secrets."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a library's bad format string: keep what can be shown
            message = f"{record.msg!s} {record.args!r}"
        if not isinstance(record.msg, dict):  # structlog's own records carry their event dict
            record.msg, record.args = redact(message), ()
        if record.exc_info and record.exc_info[0] is not None:
            # Formatters use a record's exc_text when it is set (ours re-renders exc_info and redacts it).
            record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)).rstrip())
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def _renderer(fmt: str) -> Processor:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    if use_json:
        return structlog.processors.JSONRenderer()
    return structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())


def stdlib_logging_config(fmt: str = "auto", level: str = "info") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` that renders stdlib records (Faust's, aiokafka's)
    like structlog's, so a container's log is one format, not two; redacted like ours."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"redact": {"()": RedactingFilter}},
        "formatters": {
            "structlog": {
                "()": structlog.stdlib.ProcessorFormatter,
                "processors": [
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    _redact_event,
                    _Redacted(_renderer(fmt)),
                ],
                "foreign_pre_chain": [
                    structlog.stdlib.add_logger_name,
                    structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                ],
            }
        },
        "handlers": {
            "default": {
                "class": "logging.StreamHandler",
                "formatter": "structlog",
                "filters": ["redact"],
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"level": level.upper(), "handlers": ["default"]},
    }


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    renderer = _renderer(fmt)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact_event,
            _Redacted(renderer),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def install_redaction() -> None:
    """For a command line: uncaught tracebacks and stdlib's last-resort handler redacted too."""
    handler = logging.lastResort
    if handler is not None and not any(isinstance(f, RedactingFilter) for f in handler.filters):
        handler.addFilter(RedactingFilter())

    def excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        sys.stderr.write(redact("".join(traceback.format_exception(kind, exc, tb))))

    sys.excepthook = excepthook
