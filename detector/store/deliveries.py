"""Slack posts made, and posts begun: the outbox's record, read back after a restart or a
rebalance so that every change people should hear of is posted once (docs/reliability.md)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from detector.store.connection import Connection, ms
from detector.units import epoch, string_literal

__all__ = ["ATTEMPT", "Deliveries", "Made"]

ATTEMPT = "posting:"
"""Prefix of an ``alert_deliveries`` kind that marks a post begun (``posting:fired``)."""


def owned_by(partitions: Sequence[int] | None, column: str = "partition") -> str:
    """A condition on an alert's input ``column``: the alerts of keys on ``partitions`` (bound as ``%(partitions)s``;
    those of unknown partition, -1, count as partition 0's), or all (None)."""
    if partitions is None:
        return "1"
    return f"if({column} < 0, 0, {column}) IN %(partitions)s" if partitions else "0"


@dataclass
class Made:
    """Deliveries made, as the Slack outbox keeps them in memory."""

    done: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    """(alert_id, kind) → (channel, message ts)."""
    closed: dict[str, float] = field(default_factory=dict)
    """Alert id → when it closed (:func:`detector.closed_alerts.closed_at`), for those of them closed."""
    grouped: set[str] = field(default_factory=set)
    """Message ts of their openings that opened more than one alert: group messages."""


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
        """(alert_id, kind) → (channel, message ts) of every delivery made (tests, inspection)."""
        return self.remembered(float("-inf")).done

    def remembered(self, before: float) -> Made:
        """The deliveries of alerts open, or closed at ``before`` or later (event time): what the Slack
        outbox keeps in memory (:mod:`detector.closed_alerts`); those of alerts closed earlier are read
        back by :meth:`recall` when a change of their alert comes again."""
        if before == float("-inf"):
            return self._made("1", {})
        return self._made("(a.closed IS NULL OR a.closed >= %(before)s)", {"before": before})

    def recall(self, alert_ids: Sequence[str]) -> Made:
        """The deliveries of these alerts (forgotten by the outbox, and wanted again)."""
        if not alert_ids:
            return Made()
        db = self.conn.db  # (the sub-queries narrowed to these alerts: not a scan of every alert on the delivery thread)
        return self._made("d.alert_id IN %(ids)s", {"ids": list(alert_ids)}, alerts="WHERE alert_id IN %(ids)s",
                          grouped=f"AND message_ts IN (SELECT message_ts FROM {db}.alert_deliveries "
                                  "WHERE alert_id IN %(ids)s AND kind = 'fired')")  # fmt: skip

    def _made(self, where: str, parameters: dict[str, Any], alerts: str = "", grouped: str = "") -> Made:
        db = self.conn.db
        rows = self.conn.query(
            f"""SELECT d.alert_id AS alert_id, d.kind AS kind, d.channel AS channel, d.message_ts AS message_ts,
                       d.kind = 'fired' AND d.message_ts IN (
                           SELECT message_ts FROM {db}.alert_deliveries FINAL WHERE kind = 'fired' AND message_ts != '' {grouped}
                           GROUP BY message_ts HAVING uniqExact(alert_id) > 1) AS grouped,
                       a.closed AS closed
                FROM {db}.alert_deliveries AS d FINAL
                LEFT JOIN (SELECT alert_id, if(status = 'resolved' AND resolved_at IS NOT NULL,
                                              toUnixTimestamp64Milli(greatest(episode_start, assumeNotNull(resolved_at))) / 1000,
                                              NULL) AS closed
                           FROM {db}.alerts FINAL {alerts}) AS a ON a.alert_id = d.alert_id
                WHERE NOT startsWith(d.kind, %(attempt)s) AND {where}""",
            {"attempt": ATTEMPT, **parameters},
        )  # fmt: skip
        made = Made()
        for r in rows:
            made.done[(r["alert_id"], r["kind"])] = (r["channel"], r["message_ts"])
            if r["closed"] is not None:
                made.closed[r["alert_id"]] = float(r["closed"])
            if r["grouped"]:
                made.grouped.add(r["message_ts"])
        return made

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
                  AND (alert_id, change) NOT IN (
                      -- the attempted alerts' deliveries alone: not a set of every delivery
                      SELECT alert_id, kind FROM {db}.alert_deliveries
                      WHERE alert_id IN (SELECT alert_id FROM {db}.alert_deliveries WHERE startsWith(kind, %(attempt)s)))
                GROUP BY alert_id, change""",
            {"attempt": ATTEMPT, "n": len(ATTEMPT) + 1},
        )
        return {(r["alert_id"], r["change"]): epoch(r["at"]) for r in rows}

    def start_slack(self, marker: tuple[str, str]) -> int:
        """Mark that Slack posts from this store on (once: a row of ``output_deliveries``, output ``slack:bot``,
        state ``enabled``). The first time, in a store whose alerts Slack never heard of (the worker ran without
        Slack, then SLACK_BOT_TOKEN was set), the changes of the alerts already closed are recorded as handled
        with ``marker``, so the recovery that follows posts the incidents still open, not the history: a day's
        openings and resolutions in a burst, stale. A store that has posted to Slack before is left as it is (its
        undelivered changes are owed). Returns how many changes were marked."""
        db = self.conn.db
        if self.conn.query(f"SELECT 1 AS x FROM {db}.output_deliveries WHERE output = 'slack:bot' "
                           "AND state = 'enabled' LIMIT 1"):  # fmt: skip
            return 0
        marked = 0
        if not self.conn.query(f"SELECT 1 AS x FROM {db}.alert_deliveries LIMIT 1"):
            # In the store, not through the worker: a store of millions of closed alerts read into Python
            # (and written back) held gigabytes at the first recovery with Slack, in a rebalance's assignment.
            history = (f"""FROM {db}.alerts FINAL
                           ARRAY JOIN arrayConcat(['fired', 'resolved'],
                                                  if(change IN ('withdrawn', 'corrected'), [change], [])) AS kind
                           WHERE status = 'resolved'""")  # fmt: skip
            marked = int(self.conn.query(f"SELECT count() AS n {history}")[0]["n"])
            if marked:
                channel, ts = (string_literal(part) for part in marker)
                self.conn.command(f"INSERT INTO {db}.alert_deliveries (alert_id, kind, channel, message_ts) "
                                  f"SELECT alert_id, kind, {channel}, {ts} {history}")  # fmt: skip
        self.conn.insert("output_deliveries", [["", "slack:bot", "", "enabled", ""]],
                         column_names=["alert_id", "output", "change", "state", "detail"])  # fmt: skip
        return marked

    def refused_openings(self, marker: tuple[str, str], partitions: Sequence[int] | None = None) -> list[tuple[str, float]]:
        """Alerts still firing whose opening is recorded with ``marker`` (Slack refused it for good), oldest first:
        posted again once SLACK_CHANNEL takes posts (the app invited at last). ``partitions`` as :meth:`undelivered`.
        Each with the wall time of the latest post of its opening begun after it was recorded refused (0: none): a
        post again made and never recorded (the worker killed, a timeout, a rebalance) may be in Slack already, and
        :meth:`attempted` does not say it (its opening is recorded, as refused)."""
        db = self.conn.db
        owned = owned_by(partitions, "a.partition")
        refused = (f"SELECT alert_id, delivered_at AS at FROM {db}.alert_deliveries FINAL "
                   "WHERE kind = 'fired' AND channel = %(channel)s AND message_ts = %(ts)s")  # fmt: skip
        rows = self.conn.query(
            f"""SELECT a.alert_id AS alert_id,
                       if(p.at > r.at, toUnixTimestamp64Milli(p.at) / 1000, 0) AS attempted
                FROM {db}.alerts AS a FINAL
                INNER JOIN ({refused}) AS r ON r.alert_id = a.alert_id
                LEFT JOIN (SELECT alert_id, max(delivered_at) AS at FROM {db}.alert_deliveries
                           WHERE kind = %(attempt)s AND alert_id IN (SELECT alert_id FROM ({refused}))
                           GROUP BY alert_id) AS p ON p.alert_id = a.alert_id
                WHERE a.silenced = '' AND a.status = 'firing' AND {owned}
                ORDER BY a.fired_at, a.alert_id""",
            {"partitions": list(partitions or []), "channel": marker[0], "ts": marker[1], "attempt": ATTEMPT + "fired"},
        )  # fmt: skip
        return [(r["alert_id"], float(r["attempted"])) for r in rows]

    def undelivered(self, partitions: Sequence[int] | None = None) -> list[tuple[str, str]]:
        """(alert_id, change) pairs people should have heard of but have not, oldest first: the
        outbox after a restart or a rebalance. Read from the alerts' latest state alone (every
        posted alert opened; a resolved one also closed), so it agrees with the alert manager's
        memory; an alert resolved and then taken back (change ``withdrawn``) also has its withdrawal,
        and one resolved and then corrected (change ``corrected``) its correction.
        ``partitions``: only the alerts of keys on these input partitions (those of
        unknown partition count as partition 0's)."""
        db = self.conn.db
        owned = owned_by(partitions)
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
                -- one string a pair: a set of (String, String) tuples built and probed 5x slower (1.7 s at a million alerts)
                WHERE concat(alert_id, '/', change) NOT IN (SELECT concat(alert_id, '/', kind) FROM {db}.alert_deliveries)
                ORDER BY at, o, alert_id""",
            {"partitions": list(partitions or [])},
        )
        return [(r["alert_id"], r["change"]) for r in rows]

