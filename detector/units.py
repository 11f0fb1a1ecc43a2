"""Durations, percentages and money as users write them in rule files, and as burnwatch
writes them back (:func:`format_duration`, :func:`money`).

The annotated types here validate at load time, so a rule's params are plain
floats by the time detection runs.
"""

from __future__ import annotations

import math
import re
import unicodedata
from datetime import datetime, timezone
from typing import Annotated, Any

from pydantic import BeforeValidator

__all__ = ["FORMULA_START", "Duration", "Money", "Percent", "csv_cell", "epoch", "format_duration", "money", "one_line",
           "parse_duration", "printable", "rfc3339", "string_literal"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}


def parse_duration(value: Any) -> float:
    """``'30m'`` → 1800.0 seconds; a bare number is taken as seconds."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}; expected e.g. 30m")
    if isinstance(value, (int, float)):
        if isinstance(value, int) and abs(value) > 2**1023:  # math.isfinite would raise OverflowError, not say why
            raise ValueError("invalid duration: a number too large for a duration; expected e.g. 30m, 6h, 7d")
        if not math.isfinite(value):
            raise ValueError(f"invalid duration {value!r}; expected e.g. 30m, 6h, 7d")
        if value < 0:
            raise ValueError(f"invalid duration {value!r}; must not be negative")
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"invalid duration {str(value)!r}; expected e.g. 30m, 6h, 7d")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def _parse_percent(value: Any) -> float:
    """``'5%'`` or ``5`` → 5.0 (percent points, like ``util_pct``)."""
    if isinstance(value, bool):
        raise ValueError(f"invalid percentage {value!r}; expected e.g. 5%")
    text = str(value).strip()
    try:
        number = float(text[:-1] if text.endswith("%") else text)
    except ValueError:
        raise ValueError(f"invalid percentage {text!r}; expected e.g. 5%") from None
    if not 0 <= number <= 100:
        raise ValueError(f"invalid percentage {text!r}; must be between 0% and 100%")
    return number


def _parse_money(value: Any) -> float:
    """``20``, ``'20'``, ``'$20'`` or ``'20 USD'`` → 20.0 dollars."""
    if isinstance(value, bool):
        raise ValueError(f"invalid amount {value!r}; expected e.g. 20 (USD)")
    text = str(value).strip().removeprefix("$").removesuffix("USD").strip()
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"invalid amount {value!r}; expected e.g. 20 (USD)") from None
    if not math.isfinite(number):
        raise ValueError(f"invalid amount {value!r}; expected e.g. 20 (USD)")
    if number < 0:
        raise ValueError(f"invalid amount {value!r}; must not be negative")
    return number


Duration = Annotated[float, BeforeValidator(parse_duration)]
Percent = Annotated[float, BeforeValidator(_parse_percent)]
Money = Annotated[float, BeforeValidator(_parse_money)]


def format_duration(seconds: float) -> str:
    """1h 25m style, for humans reading alerts; under a minute in seconds (``30s``: a rule's
    ``for: 30``, a bare number, is 30 seconds, not ``0m``)."""
    if not math.isfinite(seconds):
        return "forever" if seconds > 0 else "?"
    seconds = int(round(seconds))
    if 0 < seconds < 60:
        return f"{seconds}s"
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    parts = [f"{days}d"] if days else []
    if hours:
        parts.append(f"{hours}h")
    if minutes or not parts:
        parts.append(f"{minutes}m")
    return " ".join(parts)


def money(usd: float, exact: bool = False) -> str:
    """Dollars as every message, chart and digest writes them, so one figure reads the same in
    each. At a glance, cents below $100 ("$4.20", "$32.77" — an hourly rate as the price list
    has it) and whole dollars from there ("$412", "$1,234"): no figure is off by more than half
    a percent. ``exact``: to the cent, as the bill is ("$1,234.56"), for totals a person adds
    up or holds against the bill. A credit is "-$5.00", never "$-5.00"; a figure that is not
    a number (a bad price upstream) is "$?", never "$nan" or "$inf". A figure above zero that
    rounds to no cent is "under $0.01" (not "<$0.01": "<" is markup in Slack's mrkdwn), never
    "$0.00": an untagged 100 GB bucket's $0.004/h read "$0.00/h" beside its "$2.92/month", as
    if it cost nothing."""
    if not math.isfinite(usd):
        return "$?"
    if 0 < usd < 0.005:
        return "under $0.01"
    sign = "-" if usd < 0 and round(abs(usd), 2) > 0 else ""
    cents = exact or abs(usd) < 100
    return f"{sign}${abs(usd):,.2f}" if cents else f"{sign}${abs(usd):,.0f}"


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""What makes a spreadsheet read a cell as a formula (CSV injection): such text gets a leading ``'``."""


def string_literal(text: str) -> str:
    """``text`` as a ClickHouse string literal, for a statement that takes no parameters."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def csv_cell(text: str) -> str:
    """A text cell a spreadsheet shows as text, not runs: resource ids and tags come from the events,
    anyone's input (``=HYPERLINK(...)``, ``=cmd|...``). Every CSV burnwatch writes passes its text here."""
    return "'" + text if text.startswith(FORMULA_START) else text


def rfc3339(t: float) -> str:
    """Epoch seconds → ``2026-11-02T03:04:05Z`` (milliseconds when present)."""
    dt = datetime.fromtimestamp(t, tz=timezone.utc)
    text = dt.isoformat(timespec="milliseconds" if dt.microsecond else "seconds")
    return text.replace("+00:00", "Z")


def parse_rfc3339(text: str, what: str, or_else: str = "") -> float:
    """``2026-11-02T00:00:00Z`` (RFC 3339, with its zone) → epoch seconds; a :class:`ValueError`
    naming ``what`` (the option or field) otherwise. ``or_else``: what else ``what`` accepts."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{what} {text!r}: expected an RFC 3339 time such as 2026-11-02T08:00:00Z{or_else}") from None
    if when.tzinfo is None:
        raise ValueError(f"{what} {text!r}: give the time zone, e.g. 2026-11-02T08:00:00Z")
    return when.timestamp()


def epoch(value: datetime) -> float:
    """Epoch seconds of a DateTime or DateTime64 read back: clickhouse-connect returns a DateTime64 naive
    (UTC), a DateTime aware in the store's zone, which is the machine's for the embedded store (not UTC on a
    laptop in New York): an aware one is read with its zone, never relabelled UTC."""
    return (value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)).timestamp()


def one_line(exc: BaseException, limit: int = 500) -> str:
    """An exception as one bounded line, its type first (ClickHouse and Kafka errors carry
    stack traces and newlines; a log line, a dead-letter reason or /healthz wants one line)."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[:limit] + "…"


def figure(value: object, spec: str = ",.2f") -> str:
    """A detail's number as a message writes it, or "?" when it is not a finite number (details
    are read back from stored JSON, where a None or a string can stand in a number's place)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "?"
    return format(value, spec)


def printable(value: object, limit: int = 0) -> str:
    """Text from an event made safe for a terminal: control and format characters (an escape
    sequence could clear the screen or retitle the window, a right-to-left override reverse what
    follows) shown escaped, as ``\\x1b``; cut at ``limit`` characters (0: never) with an ellipsis."""
    text = str(value)
    if not text.isprintable():  # the usual text takes no look at each character
        text = "".join(c if unicodedata.category(c)[0] != "C" else repr(c)[1:-1] for c in text)
    return text if not limit or len(text) <= limit else text[: limit - 1] + "…"
