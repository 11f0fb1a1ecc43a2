"""How far each worker has stored the input partitions it holds: what a worker that looks up
another worker's hosts in the store waits for before it releases a run event
(:mod:`streams.progress`, docs/architecture.md, Several workers)."""

from __future__ import annotations

from collections.abc import Sequence

from detector.store.connection import Connection, ms
from detector.units import epoch

__all__ = ["PartitionProgress"]

_COLS = ["topic", "partition", "stored_through", "caught_up", "generation", "version"]


class PartitionProgress:
    """The ``partition_progress`` table: per (topic, partition), the row of the newest group generation
    wins, then the newest version within it."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def record(self, topic: str, rows: Sequence[tuple[int, float, bool]], version: int, generation: int = -1) -> None:
        """(partition, stored through (epoch seconds; before 1970: nothing stored yet), caught up)
        of partitions of ``topic`` whose events are stored (written after them), by a holder of the
        group's ``generation`` (-1: none known)."""
        if not rows:
            return
        self.conn.insert("partition_progress",
                         [[topic, p, ms(t) if t > 0 else 0, int(done), generation, version] for p, t, done in rows],
                         column_names=_COLS)  # fmt: skip

    def read(self, topic: str) -> dict[int, tuple[float, bool, int]]:
        """Partition → (stored through, caught up, the generation that said so) of every partition of
        ``topic`` recorded."""
        rows = self.conn.query(
            f"""SELECT partition, argMax(stored_through, (generation, version)) AS through,
                       argMax(caught_up, (generation, version)) AS done, max(generation) AS gen
                FROM {self.conn.db}.partition_progress WHERE topic = %(topic)s GROUP BY partition""",
            {"topic": topic},
        )
        return {int(r["partition"]): (epoch(r["through"]), bool(r["done"]), int(r["gen"])) for r in rows}
