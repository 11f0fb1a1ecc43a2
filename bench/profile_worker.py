"""Where the streaming worker's time goes: py-spy attached to a worker consuming a fleet file.

    .venv/bin/python bench/profile_worker.py FLEET.jsonl [--top 30] [--out stacks.txt] [--store-server thread|process] [--child]

The file is published to a fresh embedded broker first; then one worker process consumes it
into a fresh embedded ClickHouse while py-spy samples it (every thread, 200 Hz, idle samples
left out). Prints the functions with the most samples of their own ("self") and with the
most samples anywhere on the stack ("total"), as shares of all samples, and the events/s of
the run (sampling slows it a little). Needs py-spy (``pip install py-spy``; not a dependency
of burnwatch) and permission to read another process's memory (root, or ptrace allowed).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.run import PARTITIONS, _children, env  # noqa: E402
from streams.embedded import EmbeddedBroker  # noqa: E402
from streams.kafka import count_events, ensure_topics, file_records, publish_records  # noqa: E402
from streams.process import StoreServerProcess, WorkerProcess  # noqa: E402


def summarise(stacks: Path, top: int) -> str:
    """Self and total sample shares per function from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in stacks.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [f.split(" (")[0] + " (" + f.rsplit("/", 1)[-1].split(":")[0] if " (" in f else f
                  for f in stack.split(";")[1:]]  # fmt: skip  # the first frame is the thread
        samples += n
        if frames:
            own[frames[-1]] += n
        for frame in set(frames):
            total[frame] += n
    lines = [f"{samples} samples", "", "| self | function |", "|---:|---|"]
    lines += [f"| {100 * n / samples:.1f} % | `{name}` |" for name, n in own.most_common(top)]
    lines += ["", "| total | function |", "|---:|---|"]
    lines += [f"| {100 * n / samples:.1f} % | `{name}` |" for name, n in total.most_common(top)]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("fleet", type=Path)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, help="keep py-spy's collapsed stacks here")
    parser.add_argument("--store-server", choices=("thread", "process"),
                        help="write to a `burnwatch store serve` instead of the embedded engine, the inserts in the "
                             "worker's writer thread or its child process (BURNWATCH_EVENT_WRITER); the worker's own "
                             "process is what is sampled")  # fmt: skip
    parser.add_argument("--child", action="store_true",
                        help="sample the worker's event writer child (BURNWATCH_EVENT_WRITER=process: the events' ids, "
                             "columns and inserts) instead of the worker, from its first stored batch")  # fmt: skip
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        print("py-spy is not installed: pip install py-spy", file=sys.stderr)
        return 2
    messages = list(file_records(args.fleet))
    n_events = count_events(messages)
    with tempfile.TemporaryDirectory(prefix="burnwatch-profile-") as tmp, \
            EmbeddedBroker(log_path=Path(tmp) / "broker.log") as broker, contextlib.ExitStack() as stack:  # fmt: skip
        workdir = Path(tmp)
        asyncio.run(ensure_topics(broker.bootstrap, PARTITIONS))
        asyncio.run(publish_records(broker.bootstrap, messages))
        worker_env = env(broker.bootstrap, workdir / "data")
        if args.store_server:
            server = StoreServerProcess(f"chdb://{workdir / 'ch'}", workdir / "store.log").wait_ready()
            stack.callback(server.stop)
            worker_env |= {"BURNWATCH_CLICKHOUSE_DSN": server.url, "BURNWATCH_EVENT_WRITER": args.store_server}
        worker = WorkerProcess(worker_env, workdir / "worker.log").start()
        stacks = args.out or workdir / "stacks.txt"
        try:
            worker.wait_until(lambda h: h["partitions"] > 0, timeout=120, poll_s=0.05)
            pid = worker._proc.pid  # type: ignore[union-attr]
            if args.child:  # started with the worker's first write
                worker.wait_until(lambda h: h["events"] > 0, timeout=120, poll_s=0.02)
                children = _children(pid)
                if len(children) != 1:
                    print(f"expected one event writer child, found {children}", file=sys.stderr)
                    return 2
                pid = children[0]
            spy = subprocess.Popen([py_spy, "record", "--pid", str(pid), "--rate", "200",
                                    "--format", "raw", "--output", str(stacks), "--nonblocking"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            worker.wait_until(lambda h: h["events"] > 0, timeout=120, poll_s=0.02)
            first = time.perf_counter()
            health = worker.wait_until(lambda h: h["events"] >= n_events, timeout=1800, poll_s=0.05)
            elapsed = time.perf_counter() - first
            spy.send_signal(2)  # py-spy writes its file on SIGINT
            spy.wait(timeout=60)
        finally:
            worker.stop()
        print(f"{n_events:,} events in {len(messages):,} messages: {n_events / elapsed:,.0f} events/s under py-spy, "
              f"{health['batches']:,} batches\n")
        print(summarise(stacks, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
