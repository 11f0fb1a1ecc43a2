"""How far each worker has stored the input partitions it holds: what a worker that looks up
another worker's hosts in the store waits for before it releases a run event
(:mod:`streams.progress`, docs/architecture.md, Several workers)."""

from __future__ import annotations

from collections.abc import Sequence

from detector.store.connection import Connection, ms
from detector.units import epoch

__all__ = ["PartitionProgress"]

_COLS = ["topic", "partition", "stored_through", "caught_up", "version"]


class PartitionProgress:
    """The ``partition_progress`` table: one row per (topic, partition), the newest version wins."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def record(self, topic: str, rows: Sequence[tuple[int, float, bool]], version: int) -> None:
        """(partition, stored through (epoch seconds; before 1970: nothing stored yet), caught up)
        of partitions of ``topic`` whose events are stored (written after them)."""
        if not rows:
            return
        self.conn.insert("partition_progress", [[topic, p, ms(t) if t > 0 else 0, int(done), version] for p, t, done in rows],
                         column_names=_COLS)  # fmt: skip

    def read(self, topic: str) -> dict[int, tuple[float, bool]]:
        """Partition → (stored through, caught up) of every partition of ``topic`` recorded."""
        rows = self.conn.query(
            f"""SELECT partition, argMax(stored_through, version) AS through, argMax(caught_up, version) AS done
                FROM {self.conn.db}.partition_progress WHERE topic = %(topic)s GROUP BY partition""",
            {"topic": topic},
        )
        return {int(r["partition"]): (epoch(r["through"]), bool(r["done"])) for r in rows}
