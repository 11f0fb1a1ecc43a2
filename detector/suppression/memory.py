"""What the alert manager's stages remember, and loading it after a restart."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from detector.suppression.hold import Hold

if TYPE_CHECKING:
    from detector.store import ManagerMemory

__all__ = ["HORIZON_S", "AlertMemory"]

HORIZON_S = 7 * 86_400.0
"""Event time an alert is remembered after its episode started (input that old is not re-read)."""


@dataclass
class AlertMemory:
    """Everything the stages need from before a restart, so that re-read input neither opens nor
    closes an alert twice, a held-back opening's later changes stay held back, an anomaly still
    joins an open rule incident, and ``realert`` counts from the last posted opening."""

    seen: dict[str, tuple[float, int]] = field(default_factory=dict)
    """Alert id → (episode start, how far it went): :class:`~detector.suppression.stages.Dedup`."""
    held: dict[str, Hold] = field(default_factory=dict)
    """Alert id → why its opening was held back: its later changes are held back alike."""
    open_incidents: dict[str, str] = field(default_factory=dict)
    """Resource → a rule incident open on it: :class:`~detector.suppression.stages.Inhibit`."""
    last_posted: dict[tuple[str, str], float] = field(default_factory=dict)
    """(rule, resource) → fire time of its latest posted opening: :class:`~detector.suppression.stages.Realert`."""

    @classmethod
    def load(cls, memory: ManagerMemory, horizon_s: float = HORIZON_S) -> AlertMemory:
        """Read it from the store (``store.memory``: every worker's alerts, since the memory is
        shared), within ``horizon_s`` of event time before the newest alert."""
        from detector.suppression.stages import inhibiting_types

        last_posted, held = memory.suppression(horizon_s)
        return cls(seen=memory.recent_alerts(horizon_s), held=held, open_incidents=memory.open_incidents(inhibiting_types()),
                   last_posted=last_posted)  # fmt: skip
