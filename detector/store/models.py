"""The anomaly model's artifacts shared through the store (``model_artifacts``): published by
the worker that retrains, taken by every worker of the group (:mod:`detector.model.shared`)."""

from __future__ import annotations

import base64

from detector.store.connection import Connection

__all__ = ["ModelArtifacts", "Published"]

Published = tuple[int, float, bytes]
"""(version, trained_to, the skops file's bytes) of one group's artifact in the store."""


class ModelArtifacts:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def publish(self, artifacts: dict[str, tuple[float, bytes]], version: int) -> None:
        """Group → (trained_to, skops bytes), published as ``version`` (a newer one replaces it)."""
        rows = [[group, version, trained_to, base64.b64encode(data).decode()]
                for group, (trained_to, data) in sorted(artifacts.items())]  # fmt: skip
        if rows:
            self.conn.insert("model_artifacts", rows, column_names=["model_group", "version", "trained_to", "skops"])

    def newest(self) -> int:
        """The newest version published (0: none): a cheap check before reading the artifacts."""
        return int(self.conn.command(f"SELECT max(version) FROM {self.conn.db}.model_artifacts") or 0)

    def latest(self) -> dict[str, Published]:
        """Each group's newest artifact."""
        rows = self.conn.query(
            f"SELECT model_group, max(version) AS newest, argMax(trained_to, version) AS trained, "
            f"argMax(skops, version) AS data FROM {self.conn.db}.model_artifacts GROUP BY model_group"
        )
        return {r["model_group"]: (int(r["newest"]), float(r["trained"]), base64.b64decode(r["data"])) for r in rows}
