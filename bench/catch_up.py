"""Memory while a worker catches up a backlog: the keys it holds and its RSS, at their peak.

    .venv/bin/python bench/catch_up.py [REV] [--waves 24 --hosts 500 --evict-after 1800 --batch-max 2000 --runs 1]

A backlog of GPU hosts in waves, one an hour, each host billed while idle for its hour and then
quiet (:func:`tests.reliability.idle_host`, one GPU), is published to a fresh embedded broker;
a worker (embedded chdb, ``BURNWATCH_EVICT_AFTER_S`` from ``--evict-after``) catches it up.
Meanwhile the worker's keys in memory are read from its ``worker_stats`` log line (every 10 s
of wall time: the one figure a worker before 2026-12-02 reports too) and from ``/healthz``
(``keys_held``, polled every 0.2 s, where the worker has it), its peak RSS from /proc (VmHWM).
Keys that spoke within the window are at most two waves' hosts; the rest belong in the store.
Batches are capped at ``--batch-max`` messages (``BURNWATCH_BATCH_MAX_MESSAGES``) so that one
spans minutes of event time, not hours: at a million resources the default 50,000 messages
span seconds, at 500 hosts an hour and more, and a batch's keys are all in memory at once.
With REV, that commit's worker (from a git worktree, first on ``PYTHONPATH``) runs too,
alternating with the working tree's, as ``bench/ab.py`` does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streams.embedded import EmbeddedBroker  # noqa: E402
from streams.kafka import count_events  # noqa: E402
from streams.process import WorkerProcess, worker_env  # noqa: E402
from tests.reliability import PARTITIONS, Record, idle_host, publish  # noqa: E402

T0 = datetime(2026, 11, 2, tzinfo=timezone.utc).timestamp()


def backlog(waves: int, hosts: int) -> list[Record]:
    """``waves`` hours of ``hosts`` hosts each, in event-time order (a wave's hosts block by block)."""
    out: list[Record] = []
    for wave in range(waves):
        each = [idle_host(f"w{wave}-h{h}", T0 + wave * 3600, gpus=1) for h in range(hosts)]
        for i in range(len(each[0])):
            out += [records[i] for records in each]
    return out


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in kB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0])
    return out


def run_once(records: list[Record], n_events: int, workdir: Path, name: str, evict_after: float,
             batch_max: int) -> dict:  # fmt: skip
    with EmbeddedBroker(log_path=workdir / f"broker-{name}.log") as broker:
        publish(broker.bootstrap, records)
        env = worker_env(broker.bootstrap, workdir / name, ROOT / "rules", PARTITIONS,
                         BURNWATCH_EVICT_AFTER_S=str(evict_after), BURNWATCH_BATCH_MAX_MESSAGES=str(batch_max))  # fmt: skip
        log_path = workdir / f"worker-{name}.log"
        worker = WorkerProcess(env, log_path).start()
        load_before = os.getloadavg()
        started, polled_peak, health = time.monotonic(), 0, None
        try:
            deadline = started + 1800
            while time.monotonic() < deadline:
                health = worker.health()
                if health is not None:
                    polled_peak = max(polled_peak, health.get("keys_held", 0))
                    if health["events"] >= n_events and health["held"] == 0:
                        break
                time.sleep(0.2)
            else:
                raise TimeoutError(f"not caught up: {health}")
            took = time.monotonic() - started
            status = _status(worker.pid)
        finally:
            worker.stop()
    stats = [json.loads(line) for line in log_path.read_text().splitlines() if '"worker_stats"' in line]
    return {"seconds": round(took, 1), "peak_rss_mb": round(status["VmHWM"] / 1024), "rss_mb": round(status["VmRSS"] / 1024),
            "peak_keys_logged": max((s["keys"] for s in stats), default=0), "peak_keys_polled": polled_peak or None,
            "keys_at_end": health.get("keys_held") if health else None, "load_before": [round(x, 1) for x in load_before],
            "load_after": [round(x, 1) for x in os.getloadavg()]}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rev", nargs="?", help="a commit to compare the working tree with")
    parser.add_argument("--waves", type=int, default=24, help="hours of backlog, a wave of hosts each")
    parser.add_argument("--hosts", type=int, default=500, help="hosts per wave")
    parser.add_argument("--evict-after", type=float, default=1800.0, help="BURNWATCH_EVICT_AFTER_S")
    parser.add_argument("--batch-max", type=int, default=2000, help="BURNWATCH_BATCH_MAX_MESSAGES")
    parser.add_argument("--runs", type=int, default=1, help="runs per side")
    args = parser.parse_args()
    records = backlog(args.waves, args.hosts)
    n_events = count_events(records)
    print(f"{len(records):,} messages, {n_events:,} events, {args.waves * args.hosts:,} hosts", flush=True)
    with tempfile.TemporaryDirectory(prefix="burnwatch-catch-up-") as tmp:
        workdir = Path(tmp)
        tree = workdir / "tree"
        sides = ["working tree"]
        if args.rev:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), args.rev], check=True)
            sides.insert(0, args.rev)
        try:
            for i in range(args.runs):
                for side in sides:
                    old = side == args.rev  # the worker runs ``python -m streams.cli`` from the current directory
                    os.chdir(tree if old else ROOT)
                    if old:
                        os.environ["PYTHONPATH"] = str(tree)
                    else:
                        os.environ.pop("PYTHONPATH", None)
                    result = run_once(records, n_events, workdir, f"run-{i}-{'old' if old else 'new'}", args.evict_after,
                                      args.batch_max)  # fmt: skip
                    print(f"{side}: {json.dumps(result)}", flush=True)
        finally:
            os.environ.pop("PYTHONPATH", None)
            os.chdir(ROOT)
            if args.rev:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
