"""The typed record of why an alert was held back (recorded, not posted)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

import msgspec

if TYPE_CHECKING:
    from detector.alerts import Alert

__all__ = ["HOLD_KINDS", "Hold", "HoldKind", "describe_holds"]

HoldKind = Literal["inhibited", "silenced", "realert"]
HOLD_KINDS: tuple[HoldKind, ...] = ("inhibited", "silenced", "realert")


class Hold(msgspec.Struct, frozen=True, kw_only=True):
    """Which stage held an alert back and on whose account, stored in its own columns
    (``alerts.held``, ``alerts.held_by``, ``alerts.silenced``) so that nothing parses the
    reason text back."""

    kind: HoldKind
    by: str
    """The silence id (``silenced``), the incident joined (``inhibited``), the rule (``realert``)."""
    reason: str
    """For people: what ``alerts.silenced`` holds."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "by": self.by, "reason": self.reason}


def describe_holds(alerts: Iterable[Alert]) -> str:
    """One line saying how many alerts were held back and by what, e.g. for ``backtest``:
    ``3 of 72 alerts held back, not posted: 2 silenced (silence 1f2e3d4c "offsite"), 1 realert``.
    '' when every alert would be posted."""
    alerts = list(alerts)
    held = [a.held for a in alerts if a.held is not None]
    if not held:
        return ""
    by_kind = Counter(h.kind for h in held)
    parts = []
    for kind in HOLD_KINDS:
        if not by_kind[kind]:
            continue
        if kind == "silenced":
            silences = Counter((h.by, h.reason) for h in held if h.kind == "silenced")
            which = ", ".join(f"{n} by silence {sid or '(no id)'} {reason!r}" for (sid, reason), n in silences.most_common())
            parts.append(f"{by_kind[kind]} silenced ({which})")
        elif kind == "inhibited":
            parts.append(f"{by_kind[kind]} inhibited (an anomaly joined a rule's open incident)")
        else:
            parts.append(f"{by_kind[kind]} within their rule's realert interval")
    return f"{len(held)} of {len(alerts)} alerts held back, recorded but not posted: " + "; ".join(parts)
