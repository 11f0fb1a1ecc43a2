"""Slack posts made, and posts begun: the outbox's record, read back after a restart or a
rebalance so that every change people should hear of is posted once (docs/reliability.md)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from detector.store.connection import Connection, ms
from detector.units import epoch

__all__ = ["ATTEMPT", "Deliveries"]

ATTEMPT = "posting:"
"""Prefix of an ``alert_deliveries`` kind that marks a post begun (``posting:fired``)."""


class Deliveries:
    """The ``alert_deliveries`` table, against the alerts' latest state."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def record(self, alert_id: str, kind: str, channel: str, message_ts: str) -> None:
        """Record one delivery (``kind``: the change posted, ``fired``, ``resolved``, ``withdrawn`` or ``corrected``)."""
        self.record_many([(alert_id, kind, channel, message_ts)])

    def record_many(self, rows: Sequence[tuple[str, str, str, str]]) -> None:
        """Record (alert_id, kind, channel, message ts) rows in one insert: a group's members together."""
        if not rows:
            return
        self.conn.insert("alert_deliveries", [list(r) for r in rows], column_names=["alert_id", "kind", "channel", "message_ts"])

    def record_attempt(self, alert_ids: Sequence[str], change: str,
                       delivered: Sequence[tuple[str, str, str, str, float]] = ()) -> None:  # fmt: skip
        """Mark a post as about to be sent, before it is: if the worker dies before the post is
        recorded as delivered, the next one looks for it in Slack before posting again. With the
        deliveries made since the last write (``delivered``, rows as :meth:`record_made`'s) in the
        same insert: an insert into the embedded engine costs ~10 ms of CPU whatever its rows."""
        now = time.time()
        self.record_made([*delivered, *((alert_id, ATTEMPT + change, "", "", now) for alert_id in alert_ids)])

    def record_made(self, rows: Sequence[tuple[str, str, str, str, float]]) -> None:
        """Record (alert_id, kind, channel, message ts, wall time) rows in one insert, each row's
        ``delivered_at`` its own time: a delivery's record may be written a pass after its post,
        and ``delivered_at`` is when the post was made (the ``incidents`` report's time to acknowledge)."""
        if not rows:
            return
        self.conn.insert("alert_deliveries", [[a, kind, channel, ts, ms(at)] for a, kind, channel, ts, at in rows],
                         column_names=["alert_id", "kind", "channel", "message_ts", "delivered_at"])  # fmt: skip

    def made(self) -> dict[tuple[str, str], tuple[str, str]]:
        """(alert_id, kind) → (channel, message ts) of every delivery made."""
        with self.conn.lock:
            result = self.conn.client.query(
                f"SELECT alert_id, kind, channel, message_ts FROM {self.conn.db}.alert_deliveries FINAL "
                "WHERE NOT startsWith(kind, %(attempt)s)", parameters={"attempt": ATTEMPT},
            )  # fmt: skip
        return {(r[0], r[1]): (r[2], r[3]) for r in result.result_rows}

    def thread_of(self, alert_id: str) -> tuple[str, str] | None:
        """(channel, message ts) of the message that opened ``alert_id``, if it was posted."""
        rows = self.conn.query(f"SELECT channel, message_ts FROM {self.conn.db}.alert_deliveries FINAL "
                               "WHERE alert_id = %(id)s AND kind = 'fired' LIMIT 1", {"id": alert_id})  # fmt: skip
        return (rows[0]["channel"], rows[0]["message_ts"]) if rows else None

    def opened_in(self, channel: str, message_ts: str) -> list[str]:
        """The alerts one message opened: a group's members, or the one alert of an incident's message."""
        rows = self.conn.query(f"SELECT DISTINCT alert_id FROM {self.conn.db}.alert_deliveries FINAL "
                               "WHERE channel = %(c)s AND message_ts = %(ts)s AND kind = 'fired' ORDER BY alert_id",
                               {"c": channel, "ts": message_ts})  # fmt: skip
        return [r["alert_id"] for r in rows]

    def attempted(self) -> dict[tuple[str, str], float]:
        """(alert_id, change) of posts begun but not recorded as delivered (maybe in Slack
        already, or about to land there) → wall time of the latest attempt."""
        db = self.conn.db
        rows = self.conn.query(
            f"""SELECT alert_id, substring(kind, %(n)s) AS change, max(delivered_at) AS at
                FROM {db}.alert_deliveries
                WHERE startsWith(kind, %(attempt)s)
                  AND (alert_id, change) NOT IN (SELECT alert_id, kind FROM {db}.alert_deliveries)
                GROUP BY alert_id, change""",
            {"attempt": ATTEMPT, "n": len(ATTEMPT) + 1},
        )
        return {(r["alert_id"], r["change"]): epoch(r["at"]) for r in rows}

    def undelivered(self, partitions: Sequence[int] | None = None) -> list[tuple[str, str]]:
        """(alert_id, change) pairs people should have heard of but have not, oldest first: the
        outbox after a restart or a rebalance. Read from the alerts' latest state alone (every
        posted alert opened; a resolved one also closed), so it agrees with the alert manager's
        memory; an alert resolved and then taken back (change ``withdrawn``) also has its withdrawal,
        and one resolved and then corrected (change ``corrected``) its correction.
        ``partitions``: only the alerts of keys on these input partitions (those of
        unknown partition count as partition 0's)."""
        db = self.conn.db
        owned = "1"
        if partitions is not None:
            owned = "if(partition < 0, 0, partition) IN %(partitions)s" if partitions else "0"
        rows = self.conn.query(
            f"""SELECT alert_id, change FROM (
                    SELECT alert_id, 'fired' AS change, fired_at AS at, 0 AS o FROM {db}.alerts FINAL
                    WHERE silenced = '' AND {owned}
                    UNION ALL
                    SELECT alert_id, 'resolved' AS change, assumeNotNull(resolved_at) AS at, 1 AS o
                    FROM {db}.alerts FINAL WHERE silenced = '' AND status = 'resolved' AND {owned}
                    UNION ALL
                    SELECT alert_id, 'withdrawn' AS change, assumeNotNull(resolved_at) AS at, 2 AS o
                    FROM {db}.alerts AS a FINAL WHERE silenced = '' AND a.change = 'withdrawn' AND {owned}
                    UNION ALL
                    SELECT alert_id, 'corrected' AS change, assumeNotNull(resolved_at) AS at, 3 AS o
                    FROM {db}.alerts AS a FINAL WHERE silenced = '' AND a.change = 'corrected' AND {owned})
                WHERE (alert_id, change) NOT IN (SELECT alert_id, kind FROM {db}.alert_deliveries)
                ORDER BY at, o, alert_id""",
            {"partitions": list(partitions or [])},
        )
        return [(r["alert_id"], r["change"]) for r in rows]
