"""A worker's memory over a long simulated life: does it stay bounded? Not part of ``make test``.

Publishes many simulated days of a modest fleet into the embedded broker (paced by event time at
``--speed``, or as fast as possible with ``--speed 0``), runs one ``burnwatch worker`` on it with the
embedded store, Slack (a local Slack server) and a webhook output (a local receiver) on, and every
``--sample-s`` seconds reads the worker's resident memory and its event writer child's (``VmRSS``)
against the event time it has reached (``/healthz``'s watermark). The worker (and its child) also run
``bench/soak_probe/sitecustomize.py``, which every ``--probe-s`` seconds writes their Python heap
(``sys.getallocatedblocks``), the gc-tracked objects by type and the length of every large container
attribute of burnwatch's own objects (``Outbox._done``, ``Engine._evicted``...): what grows with
simulated time is named, not guessed.

    .venv/bin/python bench/soak.py --days 10                      # the same resources all along
    .venv/bin/python bench/soak.py --days 10 --churn-hours 24     # every resource replaced each day
    .venv/bin/python bench/soak.py --days 14 --hosts 2 --speed 4000 --out bench/out/soak.json

``--churn-hours H``: every resource id (and the resource ids of run events) gets the suffix of the
H-hour span of event time its message was sent in, so each H hours a fleet of new resources appears
and the previous one goes quiet (it is evicted after ``BURNWATCH_EVICT_AFTER_S``, an hour by default).

Prints, per simulated day, the worker's and its child's RSS, the heap in blocks, keys held and
evicted, alerts and deliveries, then the growth per simulated day (a least-squares line over the
samples after the first simulated day) and the containers whose length grew; writes every sample
and probe line to ``--out`` (JSON). With the default fleet (4 training hosts, 4 notebooks, 3
endpoints, 3 CPU instances, 3 buckets, 3 vector databases: ~100k events a simulated day) and
``--speed 2000`` a simulated day takes ~45 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.run import _children  # noqa: E402
from bench.worker_rss import rss_mb  # noqa: E402
from detector.rules import load_rules  # noqa: E402
from detector.simulate import SimConfig, simulate  # noqa: E402
from detector.testing import LocalSlack  # noqa: E402
from streams.embedded import EmbeddedBroker  # noqa: E402
from streams.process import StoreServerProcess  # noqa: E402
from tests.receivers import LocalReceiver  # noqa: E402
from tests.reliability import Worker, publish, slack_env, wait_acknowledged, worker_env  # noqa: E402

PROBE = ROOT / "bench" / "soak_probe"
RECORDS = ("detector.delivery.Outbox._done", "detector.outputs.outbox._Lane.finished")
"""The outboxes' records of deliveries made, per day in the report (bounded by ``BURNWATCH_DELIVERY_MEMORY_S``)."""
DAY = 86_400.0
_ID = re.compile(rb'"(resource_id|resource_ids)"')


def churned(value: Any, gen: int) -> Any:
    """``value`` (an event or a list of them) with its resource ids of generation ``gen``."""
    for item in value if isinstance(value, list) else [value]:
        if "resource_id" in item:
            item["resource_id"] = f"{item['resource_id']}-g{gen}"
        if "resource_ids" in item:
            item["resource_ids"] = [f"{r}-g{gen}" for r in item["resource_ids"]]
        if "run_id" in item:
            item["run_id"] = f"{item['run_id']}-g{gen}"
    return value


def records(cfg: SimConfig, churn_s: float, counter: list[int]) -> Iterator[tuple[str, str, bytes]]:
    """The fleet's messages, lazily, in send order (resource ids churned every ``churn_s``)."""
    raw, _ = simulate(cfg, load_rules(ROOT / "rules").pricing)
    enc = msgspec.json.Encoder()
    for sent, topic, key, value in raw:
        if churn_s:
            gen = int((sent - cfg.start) // churn_s)
            value = churned(value, gen)
            if topic != "run-events":
                key = f"{key}-g{gen}"
        counter[0] += len(value) if isinstance(value, list) else 1
        yield topic, key, enc.encode(value)


def rules_with_webhook(dest: Path, url: str) -> Path:
    """The shipped rules, with a webhook output every alert also goes to (the outputs' outbox exercised)."""
    shutil.copytree(ROOT / "rules", dest)
    routing = yaml.safe_load((dest / "routing.yaml").read_text())
    routing["outputs"] = {"hook": {"kind": "webhook", "url": url, "secret_env": "SOAK_HOOK_SECRET"}}
    routing.setdefault("send", {})["default"] = ["slack", "hook"]
    (dest / "routing.yaml").write_text(yaml.safe_dump(routing))
    return dest


def fit(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y)."""
    if len(points) < 2:
        return float("nan")
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--days", type=float, default=10.0)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--notebooks", type=int, default=4)
    ap.add_argument("--inference", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=3)
    ap.add_argument("--stores", type=int, default=3, help="buckets, and as many vector databases")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--speed", type=float, default=2000.0, help="event-time acceleration; 0: as fast as possible")
    ap.add_argument("--churn-hours", type=float, default=0.0)
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--probe-s", type=float, default=20.0)
    ap.add_argument("--store-server", action="store_true",
                    help="the store in its own process (burnwatch store serve, as a ClickHouse server would be): the "
                         "worker's RSS is then its own, not the embedded engine's too; the server's is sampled apart")
    ap.add_argument("--collect", action="store_true",
                    help="the probe runs a full gc.collect() before each sample: live objects, not garbage not yet collected")
    ap.add_argument("--no-outputs", action="store_true", help="Slack only, no webhook output")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the worker (repeatable)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "soak.json")
    args = ap.parse_args()

    cfg = SimConfig(hours=24 * args.days, training_hosts=args.hosts, notebooks=args.notebooks,
                    inference_endpoints=args.inference, cpu_instances=args.cpu, buckets=args.stores,
                    vector_dbs=args.stores, seed=args.seed)  # fmt: skip
    samples: list[dict[str, Any]] = []
    counter = [0]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp_, EmbeddedBroker(log_path=Path(tmp_) / "broker.log") as broker, \
            LocalSlack() as slack, LocalReceiver() as hook:  # fmt: skip
        tmp = Path(tmp_)
        probes = tmp / "probes"
        probes.mkdir()
        rules = rules_with_webhook(tmp / "rules", hook.url) if not args.no_outputs else ROOT / "rules"
        publish(broker.bootstrap, [])  # the topics
        extra = dict(kv.split("=", 1) for kv in args.env)
        server = None
        if args.store_server:
            server = StoreServerProcess(f"chdb://{tmp / 'served'}", tmp / "store.log").wait_ready()
            extra["BURNWATCH_CLICKHOUSE_DSN"] = server.url
        env = worker_env(broker.bootstrap, tmp / "data", rules, 4, **slack_env(slack),
                         PYTHONPATH=os.pathsep.join([str(PROBE), str(ROOT)]), SOAK_PROBE_DIR=str(probes),
                         SOAK_PROBE_S=str(args.probe_s), SOAK_HOOK_SECRET="soak",
                         SOAK_PROBE_COLLECT="1" if args.collect else "0", **extra)  # fmt: skip
        worker = Worker(env, tmp / "worker.log").start()
        try:
            worker.wait_until(lambda h: h["partitions"] > 0, timeout=180)
            done = threading.Event()
            failure: list[BaseException] = []

            def send() -> None:
                try:
                    publish(broker.bootstrap, records(cfg, args.churn_hours * 3600, counter), speed=args.speed or None)
                except BaseException as exc:  # reported below
                    failure.append(exc)
                finally:
                    done.set()

            threading.Thread(target=send, daemon=True, name="publisher").start()

            def sample() -> dict[str, Any]:
                health = worker.health() or {}
                children = _children(worker.pid)
                s = {"wall": round(time.monotonic() - started, 1), "t": time.time(), "pid": worker.pid,
                     "day": (health["watermark"] - cfg.start) / DAY if health.get("watermark") else None,
                     "rss": rss_mb(worker.pid), "child_rss": sum(rss_mb(c) for c in children), "published": counter[0],
                     "store_rss": rss_mb(server.proc.pid) if server is not None else None,
                     **{k: health.get(k) for k in ("events", "held", "keys_held", "keys_evicted", "alerts_fired",
                                                   "alerts_resolved", "slack_delivered", "outputs_delivered")}}  # fmt: skip
                samples.append(s)
                return s

            last_print = 0.0
            while not done.is_set():
                s = sample()
                if s["wall"] - last_print >= 30:
                    last_print = s["wall"]
                    print(f"[{s['wall']:6.0f}s] day {s['day'] or 0:5.2f} rss {s['rss']:6.1f} MB child {s['child_rss']:5.1f} MB "
                          f"keys {s['keys_held']}/{s['keys_evicted']} alerts {s['alerts_fired']} slack {s['slack_delivered']}",
                          flush=True)  # fmt: skip
                time.sleep(args.sample_s)
            if failure:
                raise RuntimeError(f"publisher failed: {failure[0]!r}")
            wait_acknowledged(broker.bootstrap, worker, timeout=600)
            time.sleep(args.probe_s + 1)  # a probe line after the end
            sample()
        finally:
            worker.stop()
            if server is not None:
                server.stop()
        probe_lines = [json.loads(line) for f in sorted(probes.glob("*.jsonl")) for line in f.read_text().splitlines()]
    wall = time.monotonic() - started
    report(args, cfg, samples, probe_lines, counter[0], wall)


def day_at(samples: list[dict[str, Any]], t: float) -> float | None:
    """The simulated day the worker had reached at wall time ``t`` (the last sample before it)."""
    before = [s for s in samples if s["t"] <= t and s["day"] is not None]
    return before[-1]["day"] if before else None


def report(args: argparse.Namespace, cfg: SimConfig, samples: list[dict], probes: list[dict], events: int, wall: float) -> None:
    errors = [p for p in probes if "error" in p]
    if errors:
        print(f"{len(errors)} probe lines failed, the first: {errors[0]['error']}")
    probes = [p for p in probes if "blocks" in p]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "events": events, "wall_s": wall,
                                    "samples": samples, "probes": probes}))  # fmt: skip
    worker_pid = samples[0]["pid"] if samples else None
    for p in probes:
        p["day"] = day_at(samples, p["t"]) if "t" in p else None
    print(f"\n{events:,} events over {args.days:g} simulated days in {wall:.0f} s "
          f"({'churn every %gh' % args.churn_hours if args.churn_hours else 'steady fleet'})")
    print("| sim day | worker RSS MB | child RSS MB | heap blocks (worker) | keys held / evicted | alerts fired / resolved "
          "| slack delivered | records kept: Slack / outputs |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for d in range(0, int(args.days) + 1):
        at = [s for s in samples if s["day"] is not None and s["day"] <= d + 1]
        if not at:
            continue
        s = at[-1]
        heap = [p for p in probes if p.get("pid") == worker_pid and p.get("day") is not None and p["day"] <= d + 1]
        blocks = heap[-1]["blocks"] if heap else None
        kept = [heap[-1]["containers"].get(name, 0) if heap else None for name in RECORDS]
        print(f"| {s['day']:.2f} | {s['rss']:.1f} | {s['child_rss']:.1f} | {blocks} | {s['keys_held']} / {s['keys_evicted']} | "
              f"{s['alerts_fired']} / {s['alerts_resolved']} | {s['slack_delivered']} | {kept[0]} / {kept[1]} |")  # fmt: skip
    after = [s for s in samples if s["day"] is not None and s["day"] >= 1]
    if after and after[-1].get("store_rss") is not None:
        print(f"store server RSS {after[0]['store_rss']:.0f} → {after[-1]['store_rss']:.0f} MB, "
              f"{fit([(s['day'], s['store_rss']) for s in after]):+.2f} MB/day")
    print(f"worker RSS {fit([(s['day'], s['rss']) for s in after]):+.2f} MB/day, child "
          f"{fit([(s['day'], s['child_rss']) for s in after]):+.2f} MB/day (least squares, samples after day 1)")
    mine = [p for p in probes if p.get("pid") == worker_pid and p.get("day") is not None and p["day"] >= 1 and "blocks" in p]
    if mine:
        print(f"worker heap {fit([(p['day'], p['blocks']) for p in mine]):+,.0f} blocks/day, gc objects "
              f"{fit([(p['day'], p['gc_objects']) for p in mine]):+,.0f}/day")
        first, last = mine[0], mine[-1]
        span = last["day"] - first["day"]
        if span > 0:
            print(f"containers of burnwatch objects, day {first['day']:.2f} → {last['day']:.2f} (items; per day):")
            names = set(first["containers"]) | set(last["containers"])
            grown = sorted(((last["containers"].get(n, 0) - first["containers"].get(n, 0), n) for n in names), reverse=True)
            for diff, name in grown[:25]:
                if diff > 0:
                    was, now = first["containers"].get(name, 0), last["containers"].get(name, 0)
                    print(f"  {name}: {was} → {now} ({diff / span:+.0f}/day)")
            print("gc-tracked types, most grown:")
            kinds = set(first["types"]) | set(last["types"])
            moved = sorted(((last["types"].get(k, 0) - first["types"].get(k, 0), k) for k in kinds), reverse=True)
            for diff, kind in moved[:12]:
                print(f"  {kind}: {first['types'].get(kind, 0)} → {last['types'].get(kind, 0)} ({diff / span:+.0f}/day)")
    print(f"samples and probes: {args.out}")


if __name__ == "__main__":
    main()
