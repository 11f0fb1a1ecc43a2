"""Input partitions being handed over between workers: the marks a revocation leaves, and the
wait of the partitions' next holder for them (:mod:`streams.handover`, migration 0023)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Collection

from detector.store.connection import Connection

__all__ = ["PartitionHandovers"]


class PartitionHandovers:
    """The ``partition_handovers`` table: per (partition, holder), the holder's latest mark."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._seq = itertools.count(time.time_ns())
        """Orders this process's marks: the latest wins (a holder's begin and end may share the store's millisecond)."""

    def mark(self, holder: str, partitions: Collection[int], releasing: bool) -> None:
        """``holder`` begins (``releasing``) or has ended giving up ``partitions``."""
        if partitions:
            self.conn.insert("partition_handovers", [[p, holder, int(releasing), next(self._seq)] for p in sorted(partitions)],
                             column_names=["partition", "holder", "releasing", "seq"])  # fmt: skip

    def releasing(self, holder: str, partitions: Collection[int]) -> dict[int, dict[str, float]]:
        """Partition → the other holders whose handover of it has begun and not ended, each with the
        seconds since its latest mark (on the store's clock; a handover in progress is marked again
        every second or so): their writes may not have landed yet, or they died during it."""
        if not partitions:
            return {}
        rows = self.conn.query(
            f"""SELECT partition, holder, dateDiff('millisecond', max(at), now64(3)) / 1000 AS age
                FROM {self.conn.db}.partition_handovers
                WHERE partition IN %(partitions)s AND holder != %(holder)s
                GROUP BY partition, holder HAVING argMax(releasing, seq) = 1""",
            {"partitions": sorted(partitions), "holder": holder},
        )  # fmt: skip
        out: dict[int, dict[str, float]] = {}
        for row in rows:
            out.setdefault(int(row["partition"]), {})[str(row["holder"])] = float(row["age"])
        return out
