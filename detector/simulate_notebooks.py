"""Notebooks without GPUs (``SimConfig.cpu_notebooks``): a data scientist's CPU notebook server, seen
through its usage with Jupyter's activity as an exporter reads it (``idle_notebook``).

Each works in bursts from 09:00 to 18:00 (a person typing or running cells, ``last_activity`` moving;
the server ran before the data begins, so its first readings say the evening before),
then at night is either stopped (half of them, decided each evening) or left running untouched until the
next morning's first activity: labelled ``idle_notebook`` from the evening's last activity to the
morning's first (or the end of the data), at the instance's list price, where that is at least the rule's default ``for``.
The exporter reads the server's ``last_activity`` as JupyterHub knows it: heard from the server every
5 minutes (jupyterhub-singleuser's activity reports), so a reading lags the activity by up to that;
one in three also reports ``kernels_busy`` (a cell computing in the afternoon keeps it busy).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from detector.events import TOPIC_RESOURCE_USAGE
from detector.pricing import Pricing, usd_over
from detector.units import rfc3339

__all__ = ["INSTANCE_TYPE", "MIN_IDLE_S", "REPORT_EVERY_S", "cpu_notebooks"]

INSTANCE_TYPE = "m6i.2xlarge"
"""A CPU notebook's instance (8 vCPUs, 32 GiB; rules/pricing.yaml lists its price)."""
MIN_IDLE_S = 3 * 3600.0
"""A night idle this long is labelled (the rule's default ``for``)."""
REPORT_EVERY_S = 300.0
"""How often JupyterHub hears of a server's activity (jupyterhub-singleuser's default)."""
TEAMS = (("research", "hiro"), ("nlp", "chen"), ("vision", "dana"))


def cpu_notebooks(count: int, seed: int, start: float, end: float, step: float, flush_s: float,
                  pricing: Pricing) -> tuple[list[Iterator[tuple[float, str, str, Any]]], list[Any]]:  # fmt: skip
    """Each notebook's usage records (one message per ``flush_s`` of ``step`` intervals) and the labels."""
    from detector.simulate import Label, _batched  # (it imports this module's caller)

    hourly = pricing.hourly(INSTANCE_TYPE) or 0.384
    streams, labels = [], []
    for i in range(count):
        rid = f"cpu-notebook-{i:03d}"
        rng = random.Random(f"{seed}-{rid}")
        team, owner = TEAMS[i % len(TEAMS)]
        tags = {"team": team, "owner": owner, "project": "exploration", "hub.jupyter.org/username": owner}
        spans = _activity(rng, start, end, step)
        stopped = _nights_stopped(rng, spans, start, end)
        busy_kernels = i % 3 == 2
        streams.append(_batched(_records(rid, start, end, step, tags, hourly, spans, stopped, busy_kernels), flush_s))
        mornings = [first for first, _ in spans[1:]] + [end]  # (the last night lasts to the end of the data)
        for (_, evening), morning in zip(spans, mornings, strict=True):
            seen = max(evening, start)  # (a night begun before the data is dated from its first interval, as the rule does)
            if evening < end and morning - seen >= MIN_IDLE_S and not any(a < morning and seen < b for a, b in stopped):
                labels.append(Label("idle_notebook", rid, seen, morning, hourly, "left running overnight"))
    return streams, labels


def _records(rid: str, start: float, end: float, step: float, tags: dict[str, str], hourly: float,
             spans: list[tuple[float, float]], stopped: list[tuple[float, float]],
             busy_kernels: bool) -> Iterator[tuple[float, str, str, Any]]:  # fmt: skip
    t = start
    while t < end:
        yield _usage(rid, t, step, tags, hourly, spans, stopped, busy_kernels)
        t += step


def _activity(rng: random.Random, start: float, end: float, step: float) -> list[tuple[float, float]]:
    """The spans of each working day someone used the notebook: (first activity, last activity)."""
    spans = []
    day = datetime.fromtimestamp(start, tz=timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    day -= 86_400  # (the server ran before the data begins: its first readings say the evening before)
    while day < end:
        first = day + 9 * 3600 + rng.uniform(0, 45) * 60
        last = day + 17 * 3600 + rng.uniform(0, 90) * 60
        if first < end:  # (a day the data ends in: its activity up to there)
            spans.append((first, last))
        day += 86_400
    return spans


def _nights_stopped(rng: random.Random, spans: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """Half the nights the notebook is stopped, 10 minutes after its last activity till 08:55."""
    stopped = []
    for _, evening in spans:
        if rng.random() < 0.5:
            morning = datetime.fromtimestamp(evening, tz=timezone.utc).replace(hour=8, minute=55, second=0).timestamp()
            stopped.append((evening + 600, min(morning + 86_400, end)))
    return stopped


def _usage(rid: str, t: float, step: float, tags: dict[str, str], hourly: float, spans: list[tuple[float, float]],
           stopped: list[tuple[float, float]], busy_kernels: bool) -> tuple[float, str, str, dict[str, Any]]:  # fmt: skip
    """The interval from ``t``: billed unless stopped, with the activity JupyterHub knew of at its end."""
    end_t = t + step
    off = any(a <= t < b for a, b in stopped)
    event: dict[str, Any] = {
        "ts": rfc3339(t), "resource_id": rid, "resource_type": "notebook", "provider": "aws", "account": "ml-dev",
        "region": "us-west-2", "instance_type": INSTANCE_TYPE, "pricing": "on_demand",
        "state": "stopped" if off else "running", "interval_s": step,
        "cost_usd": 0.0 if off else round(usd_over(hourly, step), 6), "tags": tags,
    }  # fmt: skip
    if not off:
        heard = end_t - end_t % REPORT_EVERY_S  # (the hub's latest report)
        last = max((min(b, heard) for a, b in spans if a <= heard), default=None)
        if last is not None:
            event["metrics"] = {"last_activity": last}
            if busy_kernels:
                afternoon = 14 <= datetime.fromtimestamp(t, timezone.utc).hour < 16
                working = afternoon and any(a <= end_t <= b for a, b in spans)
                event["metrics"]["kernels_busy"] = 1.0 if working else 0.0
    return (end_t, TOPIC_RESOURCE_USAGE, rid, event)
