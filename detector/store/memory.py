"""What the alert manager remembers across a restart, read from the alerts every worker
recorded (the memory is shared): :meth:`detector.suppression.AlertMemory.load` reads it."""

from __future__ import annotations

from collections.abc import Sequence

from detector.store.connection import Connection
from detector.suppression import Hold
from detector.suppression.memory import HORIZON_S
from detector.suppression.stages import Stage
from detector.units import epoch

__all__ = ["ManagerMemory"]


class ManagerMemory:
    """The alerts table read as the alert manager's stages need it after a restart: dedup
    (what was opened or closed), inhibit (open rule incidents), realert and holds."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def recent_alerts(self, horizon_s: float = HORIZON_S) -> dict[str, tuple[float, int]]:
        """alert id → (episode start, :class:`~detector.suppression.stages.Stage`) for alerts whose episode
        started within ``horizon_s`` of event time before the newest, and alerts still open however old (as
        :meth:`~detector.suppression.stages.Dedup.prune` keeps them): what the alert manager must remember.
        A resolution that says corrected (``details``; a correction, or a resolution first let through
        with corrected figures) is :attr:`~detector.suppression.stages.Stage.CORRECTED`: nothing follows it."""
        db = self.conn.db
        rows = self.conn.query(
            f"""SELECT alert_id, episode_start,
                       multiIf(status != 'resolved', 0, withdrawn, 2, JSONExtractBool(details, 'corrected'), 3, 1) AS stage
                FROM {db}.alerts FINAL
                WHERE episode_start >= (SELECT max(episode_start) FROM {db}.alerts) - toIntervalSecond(%(horizon)s)
                   OR status != 'resolved'""",
            {"horizon": int(horizon_s)},
        )
        return {r["alert_id"]: (epoch(r["episode_start"]), Stage(r["stage"])) for r in rows}

    def open_incidents(self, types: Sequence[str]) -> dict[str, str]:
        """Resource → an open incident of one of these rule types on it (what an anomaly
        joins: :func:`detector.suppression.stages.inhibiting_types`), for a restart."""
        rows = self.conn.query(f"SELECT resource_id, any(alert_id) AS alert_id FROM {self.conn.db}.alerts FINAL "
                               "WHERE status = 'firing' AND type IN %(types)s GROUP BY resource_id",
                               {"types": list(types)})  # fmt: skip
        return {r["resource_id"]: r["alert_id"] for r in rows}

    def suppression(self, horizon_s: float = HORIZON_S) -> tuple[dict[tuple[str, str], float], dict[str, Hold]]:
        """For :class:`detector.suppression.AlertMemory`: the fire time of the latest posted
        opening per (rule, resource) that was not withdrawn, for ``realert``; and why each held-back alert was held
        back, whose later changes stay held back. Within ``horizon_s`` of the newest alert, and the holds of
        alerts still open however old (their resolution stays held back too)."""
        db = self.conn.db
        rows = self.conn.query(
            f"""SELECT rule, resource_id, alert_id, fired_at, held, held_by, silenced, withdrawn
                FROM {db}.alerts FINAL
                WHERE fired_at >= (SELECT max(fired_at) FROM {db}.alerts) - toIntervalSecond(%(horizon)s)
                   OR (held != '' AND status != 'resolved')""",
            {"horizon": int(horizon_s)},
        )
        last: dict[tuple[str, str], float] = {}
        held: dict[str, Hold] = {}
        for r in rows:
            if r["held"]:
                held[r["alert_id"]] = Hold(kind=r["held"], by=r["held_by"], reason=r["silenced"])
            elif not r["withdrawn"]:  # a fire taken back never stood: it holds back no later opening
                key = (r["rule"], r["resource_id"])
                last[key] = max(last.get(key, 0.0), epoch(r["fired_at"]))
        return last, held
