"""How many exporters one bridge keeps up with: the bridge's CPU per scrape round of a Kubernetes
GPU fleet, and how much of it is prometheus-client's parser.

    .venv/bin/python bench/bridge.py [--nodes 100] [--rounds 6]

``--nodes`` simulated Kubernetes GPU nodes of 8 GPUs (:mod:`detector.simulate_k8s`) are served
by fake dcgm-exporters and one kube-state-metrics (:mod:`detector.fake_exporter`, the pages
dcgm-exporter's default counters make) from a child process, so that rendering them is not
counted as the bridge's work. The bridge (:class:`streams.bridge.Bridge`, Kubernetes mode,
usage on) then runs ``--rounds`` rounds, each every target once, as ``burnwatch bridge`` does
every 30 s, publishing into a sink that only counts (no broker: its client's cost is not the
bridge's). Its CPU seconds per round (every thread: the parser runs in threads) give the
hosts one core scrapes within a 30-second interval. The first round is left out (the
client's connections, the mappers' first sight of each GPU). Then the same pages, fetched
once, are parsed alone (:func:`detector.ingest.prometheus.parse_exposition`): the parser's share.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
"""Simulated time of the first scrape."""
SCRAPE_S = 30.0


def _serve(nodes: int, conn: Any) -> None:
    """The child: fake exporters of ``nodes`` nodes, their URLs sent back, served until told to stop."""
    from detector.fake_exporter import FakeExporters
    from detector.rules import load_pricing
    from detector.simulate_k8s import k8s_nodes

    fleet = k8s_nodes(nodes, 1, START, START + 86_400.0, SCRAPE_S, load_pricing(ROOT / "rules" / "pricing.yaml"))
    with FakeExporters(fleet, START, START + 86_400.0, SCRAPE_S) as exporters:
        conn.send((exporters.kube_state_url, list(exporters.dcgm_urls.values()), sum(n.gpus for n in fleet)))
        conn.recv()


async def _rounds(kube_url: str, dcgm_urls: list[str], rounds: int) -> tuple[list[float], dict[str, int]]:
    """The bridge's CPU seconds for each round after the first, and what one round published."""
    from detector.ingest.config import BridgeConfig, Target
    from streams.bridge import Bridge

    published: dict[str, int] = {}

    async def sink(topic: str, key: str, value: bytes) -> None:
        published[topic] = published.get(topic, 0) + 1

    targets = [Target(url=kube_url, job="kube-state-metrics")] + [Target(url=url) for url in dcgm_urls]
    # The bridge's clock is the simulated time the pages of its round carry (one scrape of each exporter a
    # round), as the demo's is: on the wall clock it refuses every sample as over an hour behind its scrape.
    now = START
    bridge = Bridge(BridgeConfig(targets=targets, kubernetes=True, listen=""), sink, clock=lambda: now)
    cpu: list[float] = []
    try:
        for i in range(rounds):
            now = START + i * SCRAPE_S
            published.clear()
            started = time.process_time()
            results = await bridge.round()
            if i:
                cpu.append(time.process_time() - started)
            failed = [r.error for r in results if not r.ok]
            if failed:
                raise SystemExit(f"round {i + 1}: {len(failed)} scrapes failed, the first: {failed[0]}")
            if not published.get("gpu-metrics"):  # a bridge that drops every sample is no bridge to time
                skipped = {reason: n for r in results for reason, n in r.skipped.items()}
                raise SystemExit(f"round {i + 1}: the bridge published no GPU metrics (skipped: {skipped})")
    finally:
        await bridge.close()
    return cpu, dict(published)


def _parse_alone(dcgm_urls: list[str]) -> tuple[float, int, int]:
    """CPU seconds to parse one page of each exporter (fetched first, at the next scrape's time), samples, bytes."""
    from detector.ingest.prometheus import parse_exposition

    pages = [urllib.request.urlopen(f"{url}?t={START + 3600.0}", timeout=30).read() for url in dcgm_urls]
    started = time.process_time()
    samples = sum(len(parse_exposition(page, url)) for page, url in zip(pages, dcgm_urls, strict=True))
    return time.process_time() - started, samples, sum(map(len, pages))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100, help="Kubernetes GPU nodes of 8 GPUs (default 100)")
    parser.add_argument("--rounds", type=int, default=6, help="scrape rounds, the first not counted (default 6)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    from detector.logs import configure_logging

    configure_logging(level="warning")  # not a line per scrape
    if args.nodes < 1 or args.rounds < 2:
        parser.error("--nodes at least 1, --rounds at least 2")
    ours, theirs = multiprocessing.Pipe()
    child = multiprocessing.get_context("spawn").Process(target=_serve, args=(args.nodes, theirs), daemon=True)
    child.start()
    try:
        kube_url, dcgm_urls, gpus = ours.recv()
        cpu, published = asyncio.run(_rounds(kube_url, dcgm_urls, args.rounds))
        parse_s, samples, size = _parse_alone(dcgm_urls)
    finally:
        ours.send("stop")
        child.join(timeout=30)
    per_round = sorted(cpu)[len(cpu) // 2]
    hosts_per_core = args.nodes * SCRAPE_S / per_round
    figures = {
        "nodes": args.nodes, "gpus": gpus, "samples_per_round": samples, "page_bytes": round(size / args.nodes),
        "messages_per_round": published, "cpu_s_per_round": [round(c, 3) for c in cpu],
        "cpu_ms_per_host": round(per_round / args.nodes * 1e3, 2), "cpu_us_per_sample": round(per_round / samples * 1e6, 2),
        "parse_share": round(parse_s / per_round, 3), "parse_samples_per_cpu_s": round(samples / parse_s),
        "hosts_per_core_at_30s": round(hosts_per_core), "gpus_per_core_at_30s": round(hosts_per_core * gpus / args.nodes),
    }  # fmt: skip
    print(json.dumps(figures, indent=2))
    print(f"one core scrapes ~{figures['hosts_per_core_at_30s']:,} hosts ({figures['gpus_per_core_at_30s']:,} GPUs) "
          f"every 30 s; the parser is {figures['parse_share']:.0%} of the bridge's CPU")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
