"""The anomaly model's artifacts shared through the store (``model_artifacts``): published by
the worker that retrains, taken by every worker of the group (:mod:`detector.model.shared`)."""

from __future__ import annotations

import base64
from datetime import datetime, timezone

from detector.store.connection import Connection

__all__ = ["ModelArtifacts", "Published"]

Published = tuple[int, str]
"""(version, the skops file's bytes as base64, undecoded: a row that does not decode is refused
on its own) of one group's artifact in the store."""


class ModelArtifacts:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def publish(self, artifacts: dict[str, tuple[float, bytes]], version: int) -> None:
        """Group → (trained_to, skops bytes), published as ``version`` (when it was published)."""
        rows = [[group, datetime.fromtimestamp(trained_to, tz=timezone.utc), version, base64.b64encode(data).decode()]
                for group, (trained_to, data) in sorted(artifacts.items())]  # fmt: skip
        if rows:
            self.conn.insert("model_artifacts", rows, column_names=["model_group", "trained_to", "version", "skops"])

    def newest(self) -> tuple[int, int]:
        """(the newest version published, rows): a cheap check for a change before reading the
        artifacts; (0, 0) before the first."""
        rows = self.conn.query(f"SELECT max(version) AS v, count() AS n FROM {self.conn.db}.model_artifacts")
        return (int(rows[0]["v"] or 0), int(rows[0]["n"])) if rows else (0, 0)

    def latest(self) -> dict[str, Published]:
        """Each group's artifact trained on the latest events (of two trained alike, the later
        published): event time decides, not the publishers' clocks."""
        rows = self.conn.query(
            f"SELECT model_group, argMax(version, (trained_to, version)) AS v, "
            f"argMax(skops, (trained_to, version)) AS data FROM {self.conn.db}.model_artifacts GROUP BY model_group"
        )
        return {r["model_group"]: (int(r["v"]), r["data"]) for r in rows}
