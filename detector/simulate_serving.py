"""Inference endpoints for the serving rules: idle schedules, batching and caching, spot redundancy.

Each endpoint is one ``inference_endpoint`` resource (a Deployment or KServe
InferenceService of ``replicas`` identical GPU replicas) whose usage events carry
``requests`` and the ``metrics`` the serving rules read (``docs/events.md``), and,
for the batching kinds, one GPU sample per replica per scrape. Kinds, in turn:

- ``nightly``: no request from an evening hour (19-22 h) to a morning hour (6-8 h)
  on weekdays, and none at weekends, for a week before the fleet's start and through
  it (labelled ``inference_scale_to_zero``: the billed price of every idle hour);
- ``night_busy``: the same by day but a trickle of requests every hour of the night
  and weekend (the hard negative);
- ``unbatched``: several replicas serving one request per execution, kernels busy,
  SMs mostly idle (labelled ``inference_unbatched``, the replicas 2x throughput frees);
- ``batched``: the same traffic in batches of 4-12 (the hard negative);
- ``uncached``: batching well, but half or more of the requests repeat one served
  before and no cache answers them (labelled, the replicas a cache frees);
- ``cached``: as many repeats, answered by a response cache (the hard negative);
- ``spot_single`` / ``spot_one_zone``: on spot with one replica, or three in one zone
  (labelled ``spot_without_redundancy``, no dollars: a risk);
- ``spot_spread``: three spot replicas in three zones; ``on_demand_single``: one
  replica on on-demand capacity (hard negatives).

GPU samples come once a minute (Prometheus's default scrape interval, or the fleet's
own when longer), with ``util_pct`` and ``sm_active``; messy delivery duplicates and
delays these endpoints' messages as the rest of the fleet's (lost scrapes and jitter
are left to the fleet's GPU hosts).

Labels are the ground truth of what happened (the hours no request came, the replicas
the batching or cache would free by the estimate's documented formula at the endpoint's
true batch and repeat share), never the detectors' figures.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from detector.events import TOPIC_GPU_METRICS, TOPIC_RESOURCE_USAGE
from detector.pricing import Pricing, usd_over
from detector.simulate import Label, Record, _batched, _send_order
from detector.units import rfc3339

__all__ = ["KINDS", "Endpoint", "serving_endpoints", "serving_labels", "serving_records"]

KINDS = ("nightly", "night_busy", "unbatched", "batched", "uncached", "cached",
         "spot_single", "spot_one_zone", "spot_spread", "on_demand_single")  # fmt: skip
HISTORY_S = 7 * 86_400.0
"""How long before the fleet's start the schedule kinds have been running (a week to learn from)."""
SCHEDULE_STEP_S = 300.0
"""The schedule kinds' usage interval: five minutes, so a week of history stays small."""
BATCHING = ("unbatched", "batched", "uncached", "cached")
"""The kinds that report their batching (and GPU samples)."""
BATCHING_GAIN = 2.0
"""The throughput the label counts for batching: the rule's documented default estimate."""
INSTANCES = ("g5.xlarge", "g5.2xlarge", "g6.xlarge")
ZONES = ("a", "b", "c")
TEAMS = [("search", "rag", "ola"), ("recsys", "ranker", "gus"), ("nlp", "summarizer", "chen")]


@dataclass
class Endpoint:
    resource_id: str
    kind: str
    instance_type: str
    hourly: float
    """Billed price of one replica."""
    replicas: int
    start: float
    end: float
    tags: dict[str, str]
    pricing: str = "on_demand"
    zones: int = 1
    rps: float = 0.0
    """Requests per second while serving."""
    night_rps: float = 0.0
    """Requests per second in the schedule kinds' quiet hours (0: none at all)."""
    quiet: tuple[int, int] = (20, 7)
    """The schedule kinds' quiet hours of a weekday: from the first, to the second (UTC)."""
    batch: float = 1.0
    dup: float | None = None
    cache: float | None = None
    util: float = 0.0
    sm: float = 0.0
    region: str = "eu-west-1"
    gpu_model: str = "A10G"

    def quiet_at(self, t: float) -> bool:
        d = datetime.fromtimestamp(t, tz=timezone.utc)
        evening, morning = self.quiet
        return d.weekday() >= 5 or d.hour >= evening or d.hour < morning


def serving_endpoints(n: int, seed: int, start: float, end: float, pricing: Pricing) -> list[Endpoint]:
    """``n`` endpoints, the kinds in turn, their figures drawn from the seed's own stream."""
    rng = random.Random(f"{seed}-serving")
    out = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        itype = rng.choice(INSTANCES)
        team, project, owner = rng.choice(TEAMS)
        ep = Endpoint(f"serving-{i:03d}", kind, itype, pricing.hourly(itype) or 1.0, 1, start, end,
                      {"team": team, "project": project, "owner": owner, "env": "prod"},
                      gpu_model=pricing.instances[itype].gpu_model if itype in pricing.instances else "A10G")  # fmt: skip
        if kind in ("nightly", "night_busy"):
            ep.start = start - HISTORY_S
            ep.rps = rng.uniform(2.0, 20.0)
            ep.quiet = (rng.randint(19, 22), rng.randint(6, 8))
            ep.night_rps = 0.0 if kind == "nightly" else rng.uniform(0.03, 0.2)
        elif kind in BATCHING:
            ep.replicas = rng.randint(3, 6)
            ep.rps = rng.uniform(20.0, 80.0)
            ep.batch = 1.0 if kind == "unbatched" else rng.uniform(4.0, 12.0)
            ep.util = rng.uniform(45.0, 80.0)
            ep.sm = rng.uniform(0.12, 0.35) if kind == "unbatched" else rng.uniform(0.55, 0.8)
            if kind in ("uncached", "cached"):
                ep.dup = rng.uniform(0.4, 0.7)
                ep.cache = ep.dup * rng.uniform(0.85, 0.98) if kind == "cached" else None
            elif rng.random() < 0.5:
                ep.dup = rng.uniform(0.0, 0.08)  # a few repeats: not worth a cache
        else:
            ep.rps = rng.uniform(5.0, 50.0)
            ep.pricing = "on_demand" if kind == "on_demand_single" else "spot"
            ep.hourly = pricing.hourly(itype, ep.pricing) or ep.hourly
            ep.replicas, ep.zones = {"spot_single": (1, 1), "spot_one_zone": (3, 1), "spot_spread": (3, 3),
                                     "on_demand_single": (1, 1)}[kind]  # fmt: skip
        out.append(ep)
    return out


def serving_records(ep: Endpoint, scrape_s: float, flush_s: float, rng: random.Random) -> Iterator[Record]:
    """The endpoint's usage events (one message per ``flush_s``) and, for the batching kinds, one
    GPU message per scrape (a sample per replica), in send order."""
    usage = _batched(_usage(ep, rng), flush_s)
    if ep.kind not in BATCHING:
        return usage
    return heapq.merge(usage, _gpu(ep, scrape_s, rng), key=_send_order)


def _usage(ep: Endpoint, rng: random.Random) -> Iterator[Record]:
    schedule = ep.kind in ("nightly", "night_busy")
    step = SCHEDULE_STEP_S if schedule else 60.0
    t = ep.start
    while t < ep.end:
        rate = ep.night_rps if schedule and ep.quiet_at(t) else ep.rps
        requests = math.ceil(rate * step * rng.uniform(0.8, 1.2)) if rate > 0 else 0
        metrics: dict[str, float] = {"replicas": ep.replicas}
        if ep.pricing == "spot" or ep.kind == "on_demand_single":
            metrics["zones"] = ep.zones
        if ep.kind in BATCHING:
            per_batch = ep.batch * rng.uniform(0.95, 1.05) if ep.batch > 1 else 1.0
            metrics["batches"] = max(1, round(requests / per_batch))
            if ep.dup is not None:
                dup = metrics["duplicate_share"] = round(min(1.0, ep.dup * rng.uniform(0.95, 1.05)), 4)
                if ep.cache is not None:
                    metrics["cache_hit_ratio"] = round(min(dup, ep.cache * rng.uniform(0.97, 1.03)), 4)
        event: dict[str, Any] = {
            "ts": rfc3339(t), "resource_id": ep.resource_id, "resource_type": "inference_endpoint",
            "provider": "aws", "account": "ml-prod-0", "region": ep.region, "instance_type": ep.instance_type,
            "pricing": ep.pricing, "state": "running", "interval_s": step,
            "cost_usd": round(usd_over(ep.hourly * ep.replicas, step), 6), "requests": requests,
            "metrics": metrics, "tags": ep.tags,
        }  # fmt: skip
        yield (t + step, TOPIC_RESOURCE_USAGE, ep.resource_id, event)
        t += step


def _gpu(ep: Endpoint, scrape_s: float, rng: random.Random) -> Iterator[Record]:
    t = ep.start
    while t < ep.end:
        samples = [{
            "ts": rfc3339(t), "resource_id": ep.resource_id, "gpu_index": r, "model": ep.gpu_model,
            "util_pct": round(min(100.0, ep.util * rng.uniform(0.85, 1.15)), 2),
            "sm_active": round(min(1.0, ep.sm * rng.uniform(0.85, 1.15)), 4),
            "mem_used_mib": 18_000.0, "mem_total_mib": 23_028.0, "power_w": round(150 * ep.util / 100, 1),
        } for r in range(ep.replicas)]  # fmt: skip
        yield (t, TOPIC_GPU_METRICS, ep.resource_id, samples)
        t += scrape_s


def serving_labels(ep: Endpoint) -> list[Label]:
    """The endpoint's ground truth, from its figures (the records follow the same ones)."""
    if ep.kind == "nightly":
        # Quiet hours start and end on the hour, and a busy interval always has a request.
        idle = sum(1 for h in range(int((ep.end - ep.start) // 3600)) if ep.quiet_at(ep.start + h * 3600.0))
        usd = usd_over(ep.hourly * ep.replicas, 3600.0) * idle
        return [Label("inference_scale_to_zero", ep.resource_id, ep.start, ep.end, ep.hourly * ep.replicas,
                      f"no request {ep.quiet[0]}:00-{ep.quiet[1]:02d}:00 and at weekends", usd=usd)]  # fmt: skip
    if ep.kind in ("unbatched", "uncached"):
        # An unbatched endpoint's few repeats (under 8 %) are under any cache's worth.
        left = 1.0 / BATCHING_GAIN if ep.kind == "unbatched" else 1.0 - (ep.dup or 0.0)
        needed = max(1, math.ceil(ep.replicas * left - 1e-9))
        saving = ep.hourly * (ep.replicas - needed)
        note = "one request per batch" if ep.kind == "unbatched" else f"{ep.dup:.0%} repeats, no cache"
        return [Label("inference_unbatched", ep.resource_id, ep.start, ep.end, saving, note)]
    if ep.kind in ("spot_single", "spot_one_zone"):
        return [Label("spot_without_redundancy", ep.resource_id, ep.start, ep.end, 0.0,
                      f"{ep.replicas} spot replica(s) in one zone", usd=0.0)]  # fmt: skip
    return []
