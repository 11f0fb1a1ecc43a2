"""Alert records: every state change of every alert, the latest of each read with ``FINAL``."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, cast

import msgspec

from detector.alerts import Alert, Change
from detector.store.connection import Connection, ms
from detector.suppression import Hold
from detector.units import epoch

__all__ = ["Alerts", "alert_from_row"]

_json = msgspec.json.Encoder()
_ALERT_COLS = [
    "alert_id", "type", "rule", "resource_id", "status", "change", "severity", "episode_start", "fired_at",
    "updated_at", "resolved_at", "waste_usd", "usd_per_hour", "resource_type", "account", "region",
    "instance_type", "tags", "details", "silenced", "held", "held_by", "withdrawn", "channel", "partition", "version",
]  # fmt: skip


def alert_from_row(row: dict[str, Any], change: str | None = None) -> Alert:
    """Rebuild an :class:`Alert` from a row of :meth:`Alerts.latest`."""
    t = epoch
    return Alert(
        alert_id=row["alert_id"],
        type=row["type"],
        rule=row["rule"],
        resource_id=row["resource_id"],
        status=row["status"],
        change=cast(Change, change or ("resolved" if row["status"] == "resolved" else "fired")),
        severity=row["severity"],
        episode_start=t(row["episode_start"]),
        fired_at=t(row["fired_at"]),
        updated_at=t(row["updated_at"]),
        resolved_at=t(row["resolved_at"]) if row["resolved_at"] is not None else None,
        waste_usd=row["waste_usd"],
        usd_per_hour=row["usd_per_hour"],
        resource_type=row["resource_type"],
        account=row["account"],
        region=row["region"],
        instance_type=row["instance_type"],
        tags=dict(row["tags"]),
        details=msgspec.json.decode(row["details"]) if row["details"] else {},
        held=Hold(kind=row["held"], by=row.get("held_by", ""), reason=row.get("silenced", "")) if row.get("held") else None,
        silenced=row.get("silenced", ""),
        channel=row.get("channel", ""),
        partition=row.get("partition", -1),
    )


class Alerts:
    """The ``alerts`` table: one row per change; ``alert_changes`` (history, reports) follows
    from it by a materialized view."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def record(self, alerts: Sequence[Alert], version: int) -> None:
        """Write alert state changes; ``version`` orders them (a counter or ns timestamp).

        One insert into ``alerts`` is the whole record of a change: the alert manager's
        memory and the outbox's recovery read it alone, and ``alert_changes`` (history,
        reports) follows from it by a materialized view. A kill cannot land between two
        records of one change and leave them disagreeing."""
        if not alerts:
            return
        rows = [
            [a.alert_id, a.type, a.rule, a.resource_id, a.status, a.change, a.severity, ms(a.episode_start),
             ms(a.fired_at), ms(a.updated_at), ms(a.resolved_at) if a.resolved_at is not None else None,
             a.waste_usd, a.usd_per_hour, a.resource_type, a.account, a.region, a.instance_type, a.tags,
             _json.encode(a.details).decode(), a.silenced, a.held.kind if a.held else "", a.held.by if a.held else "",
             a.withdrawn, a.channel, a.partition, version + i]
            for i, a in enumerate(alerts)
        ]  # fmt: skip
        self.conn.insert("alerts", rows, column_names=_ALERT_COLS)

    def latest(self, where: str = "1", parameters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Latest state of each alert (``where``: a condition on its columns), as dicts, in
        order of firing."""
        return self.conn.query(
            f"SELECT * EXCEPT (version, change) FROM {self.conn.db}.alerts FINAL WHERE {where} ORDER BY fired_at, alert_id",
            parameters,
        )

    def open_orphans(self, known: Collection[tuple[str, str]], partitions: Collection[int] | None) -> list[Alert]:
        """The alerts still open whose (rule, type) is not ``known`` (one of a known name and another type
        too), of the input partitions ``partitions`` (an alert of partition -1, made before that column:
        partition 0's; None: all), as last recorded: :mod:`detector.orphaned_alerts`."""
        where, parameters = "status = 'firing'", dict[str, Any]()
        if known:
            where += " AND NOT has(arrayZip(%(names)s, %(types)s), (rule, type))"
            pairs = sorted(known)
            parameters.update(names=[name for name, _ in pairs], types=[type_ for _, type_ in pairs])
        if partitions is not None:
            where += " AND greatest(partition, 0) IN %(partitions)s"
            parameters["partitions"] = sorted(partitions) or [-1]  # (none held: no alert is this worker's)
        return [alert_from_row(row) for row in self.latest(where, parameters)]

    def span(self) -> tuple[float, float] | None:
        """Event time of the first episode's start and the latest change stored (None: no alert yet)."""
        rows = self.conn.query(f"SELECT count() AS n, min(episode_start) AS first, max(updated_at) AS last "
                               f"FROM {self.conn.db}.alerts")  # fmt: skip
        return (epoch(rows[0]["first"]), epoch(rows[0]["last"])) if rows[0]["n"] else None

    def newest(self) -> float | None:
        """Event time of the newest alert change stored (None: no alert yet)."""
        rows = self.conn.query(f"SELECT count() AS n, max(updated_at) AS at FROM {self.conn.db}.alerts")
        return epoch(rows[0]["at"]) if rows[0]["n"] else None

    def get(self, alert_id: str) -> dict[str, Any] | None:
        """The latest state of one alert, or None when there is no such alert."""
        rows = self.latest("alert_id = %(id)s", {"id": alert_id})
        return rows[0] if rows else None
