"""A worker's resident memory at rest and the CPU its start took: what each worker costs before it holds any key.

Starts ``burnwatch worker`` on the embedded broker, once with the embedded engine in its process
(``chdb://``, the default) and once with a store server (``burnwatch store serve``, the worker
reaching it over HTTP as it would a ClickHouse server), feeds it an hour of one idle host so that
its event writer's child has started and written, and reads ``VmRSS`` of the worker and its child
and the CPU seconds both have used (a fresh store: the worker's start migrates it; with the store
server, the server's own CPU, the migration's inserts and statements included, is not counted).

    .venv/bin/python bench/worker_rss.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.run import _children, cpu_seconds  # noqa: E402
from streams.embedded import EmbeddedBroker  # noqa: E402
from streams.process import StoreServerProcess, worker_env  # noqa: E402
from tests.reliability import Worker, idle_host, publish, wait_acknowledged  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def rss_mb(pid: int) -> float:
    """The process's resident memory in MB (``VmRSS``): what the machine gives it, libraries' pages included."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise LookupError(f"no VmRSS for {pid}")


def at_rest(tmp: Path, store_url: str | None) -> tuple[float, float, float]:
    """(worker MB, its event writer's child MB, CPU seconds of both) once an hour of one idle host is stored."""
    tmp.mkdir(parents=True)
    with EmbeddedBroker(log_path=tmp / "broker.log") as broker:
        publish(broker.bootstrap, [])
        extra = {"BURNWATCH_CLICKHOUSE_DSN": store_url} if store_url else {}
        worker = Worker(worker_env(broker.bootstrap, tmp / "data", ROOT / "rules", 4, **extra), tmp / "worker.log")
        worker.start()
        try:
            worker.wait_until(lambda h: h["partitions"] > 0, timeout=120)
            host = idle_host("h1", time.time() - 7200)
            publish(broker.bootstrap, host)
            wait_acknowledged(broker.bootstrap, worker, timeout=120)  # stored: the child has started and written
            [child] = _children(worker.pid)
            return rss_mb(worker.pid), rss_mb(child), cpu_seconds(worker.pid)
        finally:
            worker.stop()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        embedded = at_rest(Path(tmp) / "embedded", None)
        server = StoreServerProcess(f"chdb://{Path(tmp) / 'served'}", Path(tmp) / "store.log").wait_ready()
        try:
            served = at_rest(Path(tmp) / "served-worker", server.url)
        finally:
            server.stop()
    for name, (worker, child, cpu) in (("embedded engine in the worker", embedded), ("a store server over HTTP", served)):
        print(f"{name:30s} worker {worker:.0f} MB, its event writer's child {child:.0f} MB; {cpu:.2f} CPU s to get there")


if __name__ == "__main__":
    main()
