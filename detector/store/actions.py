"""Clicks on an alert's buttons (acknowledged, snoozed, expected), and the snoozes they start."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from detector.store.connection import Connection, ms
from detector.suppression import Silence, snooze
from detector.units import epoch

if TYPE_CHECKING:
    from detector.actions import Click

__all__ = ["Actions"]

_ACTION_COLS = ["alert_id", "action", "user_id", "user_name", "channel", "message_ts", "at", "until"]


class Actions:
    """The ``alert_actions`` table: who clicked what on which alert, at wall time."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def record(self, click: Click, at: float, until: float | None = None, alert_ids: Sequence[str] = ()) -> None:
        """Record a button click at wall time ``at`` (``until``: a snooze's end), on the clicked alert or,
        for a group's message, on each of ``alert_ids`` (one insert)."""
        rows = [[alert_id, click.action, click.user_id, click.user_name, click.channel, click.message_ts,
                 ms(at), ms(until) if until is not None else None] for alert_id in (alert_ids or [click.alert_id])]  # fmt: skip
        self.conn.insert("alert_actions", rows, column_names=_ACTION_COLS)

    def of(self, alert_id: str) -> list[dict[str, Any]]:
        """Clicks on one alert, oldest first."""
        return self.conn.query(
            f"SELECT action, user_id, user_name, at, until FROM {self.conn.db}.alert_actions "
            "WHERE alert_id = %(id)s ORDER BY at",
            {"id": alert_id},
        )

    def snoozed(self, now: float) -> dict[str, Silence]:
        """Alert id → its snooze (a silence of that one alert, from the click to its end, wall
        time), for snoozes still running at ``now``."""
        rows = self.conn.query(
            f"SELECT alert_id, max(until) AS ends, argMax(at, until) AS starts, argMax(user_name, until) AS by "
            f"FROM {self.conn.db}.alert_actions WHERE action = 'snoozed' "
            "GROUP BY alert_id HAVING ends > fromUnixTimestamp64Milli(%(now)s, 'UTC')",
            {"now": ms(now)},
        )
        return {r["alert_id"]: snooze(r["alert_id"], epoch(r["starts"]), epoch(r["ends"]), r["by"]) for r in rows}

    def marked_expected(self) -> set[str]:
        """Ids of the alerts someone marked expected (not a problem): training leaves them out."""
        rows = self.conn.query(f"SELECT DISTINCT alert_id FROM {self.conn.db}.alert_actions WHERE action = 'expected'")
        return {r["alert_id"] for r in rows}
