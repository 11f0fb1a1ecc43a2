"""Daily digests: the day's waste per alert read from the ledger, and the digests sent."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from detector.store.connection import Connection
from detector.units import epoch

__all__ = ["DAY_DONE", "Digests"]

DAY_DONE = "*"
"""The channel recorded for a day whose digests are all posted (no Slack channel's name has a ``*``): a day some of
whose channels' posts failed is taken up again at the next call (:func:`detector.digest.send_due_digests`), those
already recorded left out. In a store written before it, '' with no message (nothing to post that day, or the day
before the stream began) reads as it; a day's other records as its channels posted."""


class Digests:
    """The ``digests`` table (days sent, so a restart does not send one twice) and the day's
    rows of the waste ledger (``sql/digest.sql``) and its days before (``sql/digest_trend.sql``)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def day_rows(self, day: float) -> list[dict[str, Any]]:
        """Per alert posted (not held back) and kind (``waste`` or ``could_save``): its dollars
        in the waste ledger on the UTC day starting at ``day``, with the alert's channel, team,
        status, burn rate and resolution time."""
        return self.conn.named("digest", {"day": datetime.fromtimestamp(day, tz=timezone.utc).date()})

    def trend_rows(self, day: float, days: int) -> list[dict[str, Any]]:
        """Per channel, UTC day and alert type: the waste ledger's wasted dollars on the ``days``
        days ending with the one starting at ``day`` (``sql/digest_trend.sql``)."""
        last = datetime.fromtimestamp(day, tz=timezone.utc).date()
        first = datetime.fromtimestamp(day - (days - 1) * 86400, tz=timezone.utc).date()
        return self.conn.named("digest_trend", {"first": first, "day": last})

    def last_day(self) -> float | None:
        """Start of the last day a digest was recorded for; None before the first."""
        rows = self.conn.query(f"SELECT max(day) AS day, count() AS n FROM {self.conn.db}.digests")
        return epoch(rows[0]["day"]) if rows and rows[0]["n"] else None

    def channels(self, day: float) -> set[str]:
        """The channels the digest of the day starting at ``day`` was recorded as sent to ('' for ``SLACK_CHANNEL``;
        :data:`DAY_DONE` among them once the day is done)."""
        rows = self.conn.query(f"SELECT DISTINCT channel, message_ts = '' AS bare FROM {self.conn.db}.digests "
                               "WHERE day = %(day)s", parameters={"day": int(day)})  # fmt: skip
        # (a store written before the mark: '' with no message is a day recorded done, as it read then; so does a
        # webhook's digest of the default channel, which has no ts: a later channel's that failed is then not taken
        # up again, as before)
        return {DAY_DONE if row["channel"] == "" and row["bare"] else str(row["channel"]) for row in rows}

    def record(self, day: float, channel: str, message_ts: str) -> None:
        """Record a day's digest as sent to ``channel`` ('' with no ts: nothing to post that day)."""
        self.conn.insert("digests", [[int(day), channel, message_ts]], column_names=["day", "channel", "message_ts"])
