"""Deliveries to outputs besides Slack: begun, made, refused, per (alert, output, change), read
back after a restart or a rebalance so that each change reaches each output once
(:mod:`detector.outputs.outbox`, docs/outputs.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from detector.store.connection import Connection
from detector.store.deliveries import owned_by
from detector.units import epoch

__all__ = ["FINAL_STATES", "OutputDeliveries"]

State = Literal["sending", "not_sent", "sent", "refused", "unknown"]
"""``not_sent``: a try that certainly did not arrive (refused connection, 5xx...): a kill
after it does not leave the change begun (only a ``sending`` later than it does)."""
FINAL_STATES = ("sent", "refused", "unknown")
"""States after which a change is never sent to that output again."""
Key = tuple[str, str, str]
"""(alert_id, output, change)."""


class OutputDeliveries:
    """The ``output_deliveries`` table."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def record(self, rows: Sequence[tuple[str, str, str, State, str]]) -> None:
        """Record (alert_id, output, change, state, detail) rows in one insert."""
        if rows:
            self.conn.insert("output_deliveries", [list(r) for r in rows],
                             column_names=["alert_id", "output", "change", "state", "detail"])  # fmt: skip

    def enabled_since(self, outputs: Sequence[str]) -> dict[str, float]:
        """Output → wall time it was first configured; those never seen are marked now (a
        restart recovers only changes stored since, so adding an output does not replay history)."""
        db = self.conn.db
        rows = self.conn.query(
            f"SELECT output, min(at) AS at FROM {db}.output_deliveries WHERE state = 'enabled' AND output IN %(o)s "
            "GROUP BY output", {"o": list(outputs)},
        )  # fmt: skip
        known = {r["output"]: epoch(r["at"]) for r in rows}
        new = [name for name in outputs if name not in known]
        if new:
            self.record([("", name, "", "enabled", "") for name in new])  # type: ignore[misc]
            return self.enabled_since(outputs)
        return known

    def owed(self, output: str, since: float, partitions: Sequence[int] | None, *, firing: bool) -> list[dict[str, Any]]:
        """The latest state (rows of :meth:`Alerts.latest`) of unsilenced alerts stored since
        ``since`` (wall time) whose opening, resolution, or withdrawal after it (``taken_back``) or
        correction after it (``correction``), ``output`` has not finished; with ``firing``, every
        firing one too (re-sent while firing). ``partitions``: only the alerts of keys on those input
        partitions (None: all). Routing is the caller's to apply."""
        db = self.conn.db
        owned = owned_by(partitions)
        done = (f"SELECT alert_id FROM {db}.output_deliveries WHERE output = %(o)s AND state IN %(final)s "
                "AND change = ")  # fmt: skip
        return self.conn.query(
            f"""SELECT * EXCEPT (version, change), change = 'withdrawn' AS taken_back, change = 'corrected' AS correction
                FROM {db}.alerts FINAL
                WHERE silenced = '' AND version >= %(since)s AND {owned}
                  AND (alert_id NOT IN ({done}'fired')
                       OR (status = 'resolved' AND alert_id NOT IN ({done}'resolved'))
                       OR (change = 'withdrawn' AND alert_id NOT IN ({done}'withdrawn'))
                       OR (change = 'corrected' AND alert_id NOT IN ({done}'corrected'))
                       OR (%(firing)s AND status = 'firing'))
                ORDER BY fired_at, alert_id""",
            {"since": int(since * 1e9), "partitions": list(partitions or []), "o": output,
             "final": list(FINAL_STATES), "firing": firing},
        )  # fmt: skip

    def finished(self, output: str, alert_ids: Sequence[str]) -> dict[tuple[str, str], str]:
        """(alert_id, change) of these alerts never to be sent to ``output`` again → how it ended
        (``sent``, ``refused``, ``unknown``)."""
        if not alert_ids:
            return {}
        rows = self.conn.query(
            "SELECT alert_id, change, if(has(groupArray(state), 'sent'), 'sent', any(state)) AS ended "
            f"FROM {self.conn.db}.output_deliveries "
            "WHERE output = %(o)s AND alert_id IN %(ids)s AND state IN %(s)s GROUP BY alert_id, change",
            {"o": output, "ids": list(alert_ids), "s": list(FINAL_STATES)},
        )  # fmt: skip
        return {(r["alert_id"], r["change"]): r["ended"] for r in rows}

    def begun(self, output: str) -> set[tuple[str, str]]:
        """(alert_id, change) whose send to ``output`` was begun and never finished: a kill may
        have cut it off before or after the receiver had it. A begun try that ended
        ``not_sent`` (certainly not received) is not: its ``sending`` is no later than that."""
        db = self.conn.db
        rows = self.conn.query(
            f"""SELECT alert_id, change FROM {db}.output_deliveries
                WHERE output = %(o)s AND state IN ('sending', 'not_sent') AND (alert_id, change) NOT IN
                  (SELECT alert_id, change FROM {db}.output_deliveries WHERE output = %(o)s AND state IN %(s)s)
                GROUP BY alert_id, change
                HAVING countIf(state = 'sending') > 0
                   AND (countIf(state = 'not_sent') = 0 OR maxIf(at, state = 'sending') > maxIf(at, state = 'not_sent'))""",
            {"o": output, "s": list(FINAL_STATES)},
        )
        return {(r["alert_id"], r["change"]) for r in rows}

    def states(self, alert_id: str) -> dict[tuple[str, str], set[str]]:
        """(output, change) → the states recorded for one alert (tests, ``burnwatch`` inspection)."""
        rows = self.conn.query(
            f"SELECT output, change, state FROM {self.conn.db}.output_deliveries FINAL WHERE alert_id = %(a)s",
            {"a": alert_id},
        )
        found: dict[tuple[str, str], set[str]] = {}
        for r in rows:
            found.setdefault((r["output"], r["change"]), set()).add(r["state"])
        return found
