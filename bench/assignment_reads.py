"""What a partition assignment reads of the alerts and their deliveries, timed on a store with a long history.

    .venv/bin/python bench/assignment_reads.py [--alerts 1000000] [--open 5000] [--partitions 8] [--runs 3]

A fresh embedded ClickHouse (chdb) in a temporary folder is filled with ``--alerts`` alerts over a year of
event time, ``--open`` of them still firing, each closed one with the Slack deliveries of its opening and its
resolution (an open one, its opening's), spread over ``--partitions`` input partitions. Then each read a worker
makes when it takes partitions over (``streams.handover``), and at its first batch, is timed as the worker
makes it, holding one partition: the alert manager's memory (``AlertMemory.load``), the Slack outbox's
recovery (``Outbox.assign``: the undelivered changes, the posts in doubt, the deliveries remembered) and the
look-up of open alerts of rules no longer loaded (``Alerts.open_orphans``, :mod:`detector.orphaned_alerts`).
Each figure is the best of ``--runs`` (the first run pays the engine's cold caches; the best is what a worker
that restarts on a warm machine sees).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from detector.delivery import Outbox  # noqa: E402
from detector.slack import SlackNotifier  # noqa: E402
from detector.store import Store, connect  # noqa: E402
from detector.store.connection import ms  # noqa: E402
from detector.suppression import AlertMemory  # noqa: E402
from detector.suppression.stages import inhibiting_types  # noqa: E402

_YEAR = 365 * 86_400.0
_T0 = 1_767_225_600.0  # 2026-01-01
_CHUNK = 100_000


def fill(store: Store, n: int, n_open: int, partitions: int) -> None:
    """``n`` idle-GPU alerts a year long, the last ``n_open`` still firing; their Slack deliveries."""
    alert_cols = ["alert_id", "type", "rule", "resource_id", "status", "change", "severity", "episode_start",
                  "fired_at", "updated_at", "resolved_at", "waste_usd", "usd_per_hour", "tags", "details", "partition",
                  "version"]  # fmt: skip
    step = _YEAR / n
    for start in range(0, n, _CHUNK):
        alerts, deliveries = [], []
        for i in range(start, min(n, start + _CHUNK)):
            t = _T0 + i * step
            firing = i >= n - n_open
            aid = f"{i:016x}"
            alerts.append([aid, "idle_gpu", "idle-gpu", f"host-{i % 20_000:05d}", "firing" if firing else "resolved",
                           "fired" if firing else "resolved", "warning", ms(t), ms(t + 1800), ms(t + 3600),
                           None if firing else ms(t + 3600), 12.5, 30.0, {"team": f"t{i % 40}"},
                           '{"gpus": 8}', i % partitions, i])  # fmt: skip
            deliveries.append([aid, "fired", "#ml-cost", f"{1_700_000_000 + i}.000100", ms(t + 1800)])
            if not firing:
                deliveries.append([aid, "resolved", "#ml-cost", f"{1_700_000_000 + i}.000200", ms(t + 3600)])
        store.insert("alerts", alerts, column_names=alert_cols)
        store.insert("alert_deliveries", deliveries,
                     column_names=["alert_id", "kind", "channel", "message_ts", "delivered_at"])  # fmt: skip


def best(runs: int, read: Callable[[], Any]) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(runs):
        started = time.perf_counter()
        out = read()
        times.append(time.perf_counter() - started)
    return min(times), out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--alerts", type=int, default=1_000_000)
    parser.add_argument("--open", type=int, default=5_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        store = Store(connect(f"chdb://{folder}/ch"), database="bench")
        store.migrate()
        started = time.perf_counter()
        fill(store, args.alerts, args.open, args.partitions)
        print(f"filled {args.alerts:,} alerts ({args.open:,} open), {2 * args.alerts - args.open:,} deliveries, "
              f"{args.partitions} partitions in {time.perf_counter() - started:.1f} s")  # fmt: skip
        mine = [0]
        slack = SlackNotifier(token="xoxb-bench", channel="#ml-cost", base_url="http://127.0.0.1:9/")  # (never called)
        reads: list[tuple[str, Callable[[], Any]]] = [
            ("alert manager: recent alerts (dedup)", lambda: store.memory.recent_alerts()),
            ("alert manager: realert and holds", lambda: store.memory.suppression()),
            ("alert manager: open incidents (inhibit)", lambda: store.memory.open_incidents(inhibiting_types())),
            ("AlertMemory.load (the three above)", lambda: AlertMemory.load(store.memory)),
            ("outbox: undelivered changes", lambda: store.deliveries.undelivered(mine)),
            ("outbox: posts in doubt", lambda: store.deliveries.attempted()),
            ("outbox: newest alert", lambda: store.alerts.newest()),
            ("Outbox.assign (the recovery, whole)", lambda: Outbox(store, slack).assign(mine)),
            ("orphaned alerts look-up", lambda: store.alerts.open_orphans({("idle-gpu", "idle_gpu")}, mine)),
        ]
        for name, read in reads:
            seconds, _ = best(args.runs, read)
            print(f"{name:45s} {seconds * 1000:9.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
