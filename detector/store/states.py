"""Detector state: each key's snapshot, saved with the write that stored its events, so a
restarted or newly assigned worker resumes where the last one stopped (docs/reliability.md)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from detector.store.connection import Connection

__all__ = ["States"]

_STATE_COLS = ["key", "partition", "snapshot", "deleted", "version"]


class States:
    """The ``detector_state`` table: the newest version of a key wins; a tombstone deletes it."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def save(self, states: Sequence[tuple[str, int, bytes]], version: int) -> None:
        """Write (key, partition, snapshot) rows; the newest version of a key wins."""
        if not states:
            return
        cols = [[k for k, _, _ in states], [p for _, p, _ in states], [s for _, _, s in states],
                [0] * len(states), [version] * len(states)]  # fmt: skip
        with self.conn.lock:
            self.conn.client.insert(f"{self.conn.db}.detector_state", cols, column_oriented=True,
                                    column_names=_STATE_COLS)  # fmt: skip

    def load(self, partitions: Sequence[int]) -> dict[str, bytes]:
        """Latest snapshot of every live key on these partitions."""
        if not partitions:
            return {}
        with self.conn.lock:
            result = self.conn.client.query(
                f"SELECT key, snapshot FROM {self.conn.db}.detector_state FINAL "
                "WHERE partition IN %(partitions)s AND deleted = 0",
                parameters={"partitions": list(partitions)},
                column_formats={"snapshot": "bytes"},
            )
        return {row[0]: row[1] for row in result.result_rows}

    def get(self, key: str) -> bytes | None:
        """The latest snapshot of one key, or None (never saved, or deleted): how a key the engine
        evicted comes back when it speaks again (one look-up by the table's sort key)."""
        with self.conn.lock:
            result = self.conn.client.query(
                f"SELECT argMax(snapshot, version) AS snapshot, argMax(deleted, version) AS deleted, count() AS n "
                f"FROM {self.conn.db}.detector_state WHERE key = %(key)s",
                parameters={"key": key},
                column_formats={"snapshot": "bytes"},
            )
        snapshot, deleted, n = result.result_rows[0]
        return None if not n or deleted else bytes(snapshot)

    def delete(self, keys: Sequence[str]) -> None:
        """Tombstone keys whose state expired, so a restart does not bring them back."""
        if not keys:
            return
        self.conn.insert("detector_state", [[k, 0, b"", 1, time.time_ns()] for k in keys], column_names=_STATE_COLS)
