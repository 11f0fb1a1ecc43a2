"""The rule sets workers loaded, newest last: :mod:`detector.orphaned_alerts` tells a rule removed from one
not yet loaded everywhere by them."""

from __future__ import annotations

from collections.abc import Mapping

from detector.store.connection import Connection, ms

__all__ = ["RuleSets"]


class RuleSets:
    """The ``rule_sets`` table: one row per load of the rules by a worker (its start, each reload)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def record(self, loaded: Mapping[str, str], at: float, worker: str) -> None:
        """``loaded`` (rule name → type) was loaded by ``worker`` at wall time ``at``."""
        self.conn.insert("rule_sets", [[ms(at), list(loaded), list(loaded.values()), worker]],
                         column_names=["loaded_at", "names", "types", "worker"])  # fmt: skip

    def newest(self) -> dict[str, str] | None:
        """Rule name → type of the rule set loaded last, by any worker (None: none recorded)."""
        rows = self.conn.query(f"SELECT names, types FROM {self.conn.db}.rule_sets ORDER BY loaded_at DESC LIMIT 1")
        return dict(zip(rows[0]["names"], rows[0]["types"], strict=True)) if rows else None
