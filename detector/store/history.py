"""Reading stored events back: what ``backtest --since`` and model training replay, and what
a worker reads of a resource another worker holds."""

from __future__ import annotations

from datetime import timezone
from typing import Any

import msgspec

from detector.detectors import ResourceInfo
from detector.events import Event, GpuMetric, RunEvent, UsageEvent, typed_run_fields
from detector.store.batch import GPU_COLS, RUN_COLS, USAGE_COLS
from detector.store.connection import Connection, ms
from detector.store.schema import RAW_TABLES
from detector.units import epoch

__all__ = ["EventHistory"]


class EventHistory:
    """The raw event tables, read back in event time."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def span(self) -> tuple[float, float] | None:
        """(earliest, latest) event time stored across the three tables, or None when empty."""
        sql = " UNION ALL ".join(
            f"SELECT min(ts) AS lo, max(ts) AS hi, count() AS n FROM {self.conn.db}.{table}" for table in RAW_TABLES
        )
        rows = [r for r in self.conn.query(sql) if r["n"]]
        if not rows:
            return None
        return min(epoch(r["lo"]) for r in rows), max(epoch(r["hi"]) for r in rows)

    def between(self, start: float, end: float) -> list[tuple[float, Event]]:
        """Stored events with ``start <= ts < end`` as typed events, in event-time order
        (ties: GPU samples, then usage, then run events, as the worker's aligner ranks them)."""
        bounds = {"lo": ms(start), "hi": ms(end)}
        where = "ts >= fromUnixTimestamp64Milli(%(lo)s, 'UTC') AND ts < fromUnixTimestamp64Milli(%(hi)s, 'UTC')"
        out: list[tuple[float, int, Event]] = []
        tables: tuple[tuple[str, type[Event], list[str]], ...] = (
            ("gpu_metrics", GpuMetric, GPU_COLS), ("resource_usage", UsageEvent, USAGE_COLS),
            ("run_events", RunEvent, RUN_COLS),
        )  # fmt: skip
        for rank, (table, cls, cols) in enumerate(tables):
            with self.conn.lock:
                result = self.conn.client.query(
                    f"SELECT {', '.join(cols)} FROM {self.conn.db}.{table} WHERE {where} ORDER BY ts", parameters=bounds
                )
            for row in result.result_rows:
                fields: dict[str, Any] = dict(zip(cols, row, strict=True))
                ts = fields["ts"].replace(tzinfo=timezone.utc)
                fields["ts"] = ts
                fields["extra"] = msgspec.json.decode(fields["extra"]) if fields["extra"] else {}
                if cls is RunEvent:  # metrics and step live in the extra column (store/batch.py)
                    typed_run_fields(fields, fields["extra"])
                fields = {k: v for k, v in fields.items() if v is not None}
                out.append((ts.timestamp(), rank, cls(**fields)))
        out.sort(key=lambda item: (item[0], item[1]))
        return [(t, event) for t, _, event in out]

    def resource_info(self, resource_id: str, at: float) -> ResourceInfo | None:
        """What the usage events stored for a resource up to event time ``at`` say of it, as
        the engine that holds it knows it (state, tags, price per hour while running): how a
        worker sees a run's host that another worker holds. None when nothing is stored."""
        rows = self.conn.query(
            f"""SELECT argMax(resource_type, ts) AS r_type, argMax(provider, ts) AS r_provider,
                       argMax(account, ts) AS r_account, argMax(region, ts) AS r_region,
                       argMax(instance_type, ts) AS r_instance, argMax(pricing, ts) AS r_pricing,
                       argMax(state, ts) AS r_state, argMax(tags, ts) AS r_tags,
                       argMaxIf(usd * 3600 / interval_s, ts, state = 'running') AS r_usd_per_hour,
                       countIf(state = 'running') AS running, count() AS n
                FROM {self.conn.db}.resource_usage
                WHERE resource_id = %(rid)s AND ts <= fromUnixTimestamp64Milli(%(at)s, 'UTC')""",
            {"rid": resource_id, "at": ms(at)},
        )
        if not rows or not rows[0]["n"]:
            return None
        r = rows[0]
        return ResourceInfo(resource_id=resource_id, resource_type=r["r_type"], provider=r["r_provider"],
                            account=r["r_account"], region=r["r_region"], instance_type=r["r_instance"],
                            pricing=r["r_pricing"], state=r["r_state"], tags=dict(r["r_tags"]),
                            usd_per_hour=r["r_usd_per_hour"] if r["running"] else None)  # fmt: skip
