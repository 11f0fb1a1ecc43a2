"""Labelled metric series (Microsoft's Cloud Monitoring Dataset format) into the event contract.

A series is a CSV file ``TimeStamp,Value,Label`` (quoted or not, a header first), one row per
step, per minute or per hour. It becomes one resource whose usage events carry the value as the
generic metric ``metrics["value"]``, so the same replay path that runs the rules on a fleet runs
them on data nobody here generated (issue 14). Its labelled anomaly windows are the contiguous
runs of ``Label=1``. A row that cannot be read is an error naming the file, line and column,
never a traceback; an empty ``Value`` is a missing sample and a row repeating the timestamp of
the one above is the same sample (the dataset has a few of both), not errors.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from detector.events import TOPIC_RESOURCE_USAGE
from detector.units import rfc3339

__all__ = ["METRIC", "Series", "SeriesError", "read_series", "read_series_dir", "replay_records"]

METRIC = "value"
"""The name the series' value carries in ``metrics``."""
HEADER = ("timestamp", "value", "label")
COLUMNS = ("TimeStamp", "Value", "Label")


class SeriesError(ValueError):
    """A series file that cannot be read; the message names file, line and column."""


@dataclass
class Series:
    """One labelled series: its samples in time order and where its anomalies are."""

    name: str
    """``domain/file`` (``data-ingress-rate/ingress-01``): the resource id of its events."""
    kind: str
    """The dataset's domain (its directory): the resource type of its events."""
    times: list[float] = field(default_factory=list)
    values: list[float | None] = field(default_factory=list)
    """``None`` where the file has no value (a missing sample: no event is sent for it)."""
    labels: list[int] = field(default_factory=list)
    duplicates: int = 0
    """Rows repeating the timestamp of the row above: the first one's value is kept."""

    @property
    def step_s(self) -> float:
        """The sampling step: the median gap, so a missing row or two does not change it."""
        if len(self.times) < 2:
            return 60.0
        return statistics.median(b - a for a, b in zip(self.times, self.times[1:], strict=False))

    @property
    def windows(self) -> list[tuple[float, float]]:
        """Labelled anomalies as ``(first, last)`` timestamps of each contiguous run of ``Label=1``."""
        out: list[tuple[float, float]] = []
        start: float | None = None
        for i, label in enumerate(self.labels):
            if label and start is None:
                start = self.times[i]
            if start is not None and (not label or i == len(self.labels) - 1):
                out.append((start, self.times[i] if label else self.times[i - 1]))
                start = None
        return out


def _timestamp(text: str) -> float:
    """ISO 8601, zone optional (the dataset's README): a time without a zone is taken as UTC."""
    ts = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return (ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)).timestamp()


def read_series(path: str | Path, kind: str | None = None) -> Series:
    """Read one series file, or raise :class:`SeriesError` at its first bad row."""
    path = Path(path)
    kind = kind or path.parent.name or "metric_series"
    series = Series(name=f"{kind}/{path.stem}", kind=kind)
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None or tuple(h.strip().lower() for h in header) != HEADER:
                got = "an empty file" if header is None else repr(header)
                raise SeriesError(f"{path}:1: expected the header {','.join(COLUMNS)}, got {got}")
            for row in reader:
                _read_row(series, row, f"{path}:{reader.line_num}")
    except UnicodeDecodeError as exc:
        raise SeriesError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except csv.Error as exc:
        raise SeriesError(f"{path}: not CSV ({exc})") from None
    except OSError as exc:
        raise SeriesError(f"{path}: {exc.strerror}") from None
    if not series.times:
        raise SeriesError(f"{path}: no rows after the header")
    return series


def _read_row(series: Series, row: list[str], where: str) -> None:
    if not row:
        return
    if len(row) != 3:
        raise SeriesError(f"{where}: expected 3 columns ({','.join(COLUMNS)}), got {len(row)}: {row!r}")
    stamp, value, label = (cell.strip() for cell in row)
    try:
        t = _timestamp(stamp)
    except ValueError:
        raise SeriesError(f"{where}: column TimeStamp: {stamp!r} is not an ISO 8601 time") from None
    if series.times and t < series.times[-1]:
        raise SeriesError(f"{where}: column TimeStamp: {stamp!r} is before the row above ({rfc3339(series.times[-1])})")
    number: float | None = None
    if value:
        try:
            number = float(value)
        except ValueError:
            raise SeriesError(f"{where}: column Value: {value!r} is not a number") from None
        if not math.isfinite(number):
            raise SeriesError(f"{where}: column Value: {value!r} is not a finite number")
    if label not in ("0", "1"):
        raise SeriesError(f"{where}: column Label: {label!r} is not 0 or 1")
    if series.times and t == series.times[-1]:  # the dataset repeats some rows: one sample, labelled if either is
        series.duplicates += 1
        series.labels[-1] = max(series.labels[-1], int(label))
        return
    series.times.append(t)
    series.values.append(number)
    series.labels.append(int(label))


def read_series_dir(directory: str | Path) -> list[Series]:
    """Every ``*.csv`` under ``directory`` (its subdirectories are the domains), by name."""
    directory = Path(directory)
    if not directory.is_dir():
        raise SeriesError(f"{directory}: not a directory")
    files = sorted(directory.rglob("*.csv"))
    if not files:
        raise SeriesError(f"{directory}: no *.csv series in it")
    return [read_series(f) for f in files]


def replay_records(series: Series) -> Iterator[tuple[float, str, str, dict[str, Any]]]:
    """``(send_t, topic, key, value)`` for :func:`detector.replay.write_replay`: one usage event
    per present sample, covering one step, with no cost (these resources have no price)."""
    step = series.step_s
    for t, value in zip(series.times, series.values, strict=True):
        if value is None:
            continue
        event = {"ts": rfc3339(t), "resource_id": series.name, "resource_type": series.kind,
                 "interval_s": step, "metrics": {METRIC: value}}  # fmt: skip
        yield t, TOPIC_RESOURCE_USAGE, series.name, event
