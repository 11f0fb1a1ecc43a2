"""The audit of actions on incidents (``remediation_actions``): every step appended, read
back after a restart so that an action is never proposed or made twice (docs/actions.md)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from detector.store.connection import Connection, ms

__all__ = ["STEP_COLUMNS", "ActionStep", "Remediations"]

_COLS = ["action_key", "alert_id", "kind", "mode", "step", "decided_by", "rule", "resource_id", "team", "api",
         "request", "endpoint", "result", "usd_per_hour", "attempt", "due_at", "event_time", "at", "seq"]  # fmt: skip


STEP_COLUMNS = ("* REPLACE (if(isNull(due_at), NULL, least(due_at, toDateTime64('2299-12-31 23:59:59', 3, 'UTC'))) "
                "AS due_at)")
"""What to select of ``remediation_actions``: every column, a ``due_at`` past the end of
DateTime64 (2299) read as its end. Before ``grace`` was bounded (30 days), ``grace: 1000000w``
stored a due time in year 21192 that the client cannot turn into a datetime: every read of
the table failed (recovery, clicks, the incidents page). Read as 2299, such an action stays
pending (as its grace meant) until it is declined or its incident resolves."""


@dataclass(frozen=True)
class ActionStep:
    """One row of the audit: what happened to one action (``alert_id:kind``), at wall time ``at``."""

    alert_id: str
    kind: str
    step: str
    at: float
    mode: str = ""
    decided_by: str = ""
    rule: str = ""
    resource_id: str = ""
    team: str = ""
    api: str = ""
    request: str = ""
    """The call's arguments as JSON (never a credential)."""
    endpoint: str = ""
    result: str = ""
    usd_per_hour: float = 0.0
    attempt: int = 0
    due_at: float | None = None
    event_time: float | None = None

    @property
    def key(self) -> str:
        return f"{self.alert_id}:{self.kind}"


class Remediations:
    """The ``remediation_actions`` table."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def record(self, steps: Sequence[ActionStep]) -> None:
        """Append steps (one insert: a step is stored before what it announces is done)."""
        if not steps:
            return
        base = time.time_ns()
        rows = [[s.key, s.alert_id, s.kind, s.mode, s.step, s.decided_by, s.rule, s.resource_id, s.team, s.api,
                 s.request, s.endpoint, s.result[:2000], s.usd_per_hour, s.attempt,
                 ms(s.due_at) if s.due_at is not None else None,
                 ms(s.event_time) if s.event_time is not None else None, ms(s.at), base + i]
                for i, s in enumerate(steps)]  # fmt: skip
        self.conn.insert("remediation_actions", rows, column_names=_COLS)

    def decisions(self, keys: Sequence[str], since: float) -> list[dict[str, Any]]:
        """The decisions (``approved``, ``declined``, ``cancelled``) stored for actions ``keys``
        at or after wall time ``since``, in the order they were taken: what another worker
        recorded for actions the acting worker holds pending (one query, bounded by key)."""
        if not keys:
            return []
        return self.conn.query(
            f"SELECT {STEP_COLUMNS} FROM {self.conn.db}.remediation_actions WHERE action_key IN %(keys)s "
            "AND at >= fromUnixTimestamp64Milli(%(since)s, 'UTC') AND step IN ('approved', 'declined', 'cancelled') "
            "ORDER BY at, seq", {"keys": list(keys), "since": ms(since)})  # fmt: skip

    def steps(self, alert_id: str | None = None) -> list[dict[str, Any]]:
        """Every step (of one incident's actions), in the order they were taken."""
        where, params = ("WHERE alert_id = %(id)s", {"id": alert_id}) if alert_id is not None else ("", {})
        return self.conn.query(f"SELECT {STEP_COLUMNS} FROM {self.conn.db}.remediation_actions {where} "
                               "ORDER BY action_key, at, seq", params)  # fmt: skip
