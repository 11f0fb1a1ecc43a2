"""A store filled by the worker's pipeline with a simulated fleet at a platform's scale, for the reports,
incidents and digest to be timed on (no Slack, no Kafka: tests.helpers.store_fleet, streamed).

    .venv/bin/python bench/fill_fleet.py DIR [--hosts 400] [--hours 24] [--notebooks 100]

Prints the events stored, the alerts, and the seconds it took.
"""

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.environ.get("TREE", str(Path(__file__).resolve().parent.parent)))
import msgspec  # noqa: E402

from detector.alerts import AlertManager  # noqa: E402
from detector.delivery import Outbox  # noqa: E402
from detector.engine import Engine  # noqa: E402
from detector.rules import load_rules  # noqa: E402
from detector.simulate import SimConfig, simulate  # noqa: E402
from detector.store import Store  # noqa: E402
from streams.pipeline import Message, Pipeline  # noqa: E402

_encode = msgspec.json.Encoder().encode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--hosts", type=int, default=400)
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--notebooks", type=int, default=100)
    args = ap.parse_args()
    ruleset = load_rules(Path(__file__).resolve().parent.parent / "rules")
    store = Store.open(f"chdb://{args.dir}")
    store.migrate()

    async def ignore(*_: object) -> None:
        pass

    pipeline = Pipeline(engine=Engine(ruleset), store=store, outbox=Outbox(store, None),
                        manager=AlertManager(ruleset=ruleset), send_dead_letter=ignore)  # fmt: skip
    cfg = SimConfig(hours=args.hours, training_hosts=args.hosts, notebooks=args.notebooks, seed=7)
    records, _ = simulate(cfg, ruleset.pricing)
    started = time.perf_counter()

    async def feed() -> int:
        offsets: dict[str, int] = {}
        batch: list[Message] = []
        n = 0
        for _, topic, key, value in records:
            offset = offsets[topic] = offsets.get(topic, -1) + 1
            batch.append(Message(topic, 0, offset, key.encode() if key else None, _encode(value)))
            n += 1
            if len(batch) == 2000:
                await pipeline.process(batch, ignore)
                batch = []
        if batch:
            await pipeline.process(batch, ignore)
        await pipeline.drain()
        return n

    messages = asyncio.run(feed())
    took = time.perf_counter() - started
    alerts = store.client.query(f"SELECT count() FROM {store.db}.alerts FINAL").result_rows[0][0]
    print(f"{messages} messages in {took:.0f}s; {alerts} alerts")


if __name__ == "__main__":
    main()
