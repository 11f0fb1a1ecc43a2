"""Do alert dollars agree with the bill? The check ``make demo`` and ``burnwatch eval --bill``
print: for each alert whose dollars are its resource's whole spend (idle GPUs, untagged), its
dollars per hour against the rate the bill charged that resource in the hour it fired."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["FULL_COST", "Agreement", "agreement"]

FULL_COST = ("idle_gpu", "untagged")
"""Alert types whose dollars are the resource's whole spend over the episode, so their rate is
the resource's rate: the others (a share of a host, excess egress, a spot saving) are not."""


@dataclass(frozen=True)
class Agreement:
    checked: int
    """Alerts of :data:`FULL_COST` types on resources and hours the bill has."""
    agree: int
    """Of those, the ones within ``tolerance`` of the billed rate."""
    off: list[tuple[str, str, float, float]]
    """(type, resource, alert's $/h, billed $/h) of the others."""


def agreement(alerts: Iterable[Any], billed_rates: Mapping[tuple[str, float], float], tolerance: float = 0.01) -> Agreement:
    """``billed_rates``: (resource_id, hour start) → the billed dollars per running hour."""
    checked, off = 0, []
    for a in alerts:
        rate = billed_rates.get((a.resource_id, a.fired_at // 3600 * 3600))
        if a.type not in FULL_COST or rate is None:
            continue
        checked += 1
        if abs(a.usd_per_hour - rate) > tolerance * rate:
            off.append((a.type, a.resource_id, a.usd_per_hour, rate))
    return Agreement(checked, checked - len(off), off)
