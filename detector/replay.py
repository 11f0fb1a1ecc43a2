"""Replay files: JSON lines of ``{"topic": ..., "key": ..., "value": <event or array>}``.

The same file feeds ``burnwatch replay`` (to Kafka) and ``burnwatch backtest``
(in-process), which is what lets a test hold the two to the same alerts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

__all__ = ["ReplayError", "ReplayRecord", "one_event_per_message", "read_replay", "write_replay"]


class ReplayRecord(msgspec.Struct):
    topic: str
    key: str
    value: msgspec.Raw
    """The message value exactly as it will be published, undecoded."""


class ReplayError(ValueError):
    """A replay file line that is not a record; names the file and line."""


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(ReplayRecord)


def write_replay(records: Iterable[tuple[Any, str, str, Any]], out: IO[bytes]) -> int:
    """Write ``(send_t, topic, key, value)`` records; return how many."""
    n = 0
    for _, topic, key, value in records:
        out.write(_encoder.encode({"topic": topic, "key": key, "value": value}))
        out.write(b"\n")
        n += 1
    return n


def one_event_per_message(records: Iterable[tuple[Any, str, str, Any]]) -> Iterator[tuple[Any, str, str, Any]]:
    """The same records with each array value split into one message per event, as exporters
    that send every sample on its own (many bridges and SDKs) would send them."""
    for send_t, topic, key, value in records:
        for event in value if isinstance(value, list) else (value,):
            yield send_t, topic, key, event


def read_replay(path: str | Path) -> Iterator[tuple[int, ReplayRecord]]:
    """Yield ``(line number, record)``; a malformed line raises :class:`ReplayError`."""
    with open(path, "rb") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield line_no, _decoder.decode(line)
            except msgspec.DecodeError as exc:
                raise ReplayError(f"{path}:{line_no}: not a replay record ({exc})") from None
