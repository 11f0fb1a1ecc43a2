"""Workloads whose cost is a choice, for the simulator: where a GPU workload runs
(``wrong_region``) and whether a model is served or called (``build_or_call``).

Both choices are judged over a week, so these resources have history: their usage
starts ``HISTORY_DAYS`` before the fleet's start, as a usage export backfills it, in
hourly intervals (the granularity of the cloud's cost and usage report and of the model
providers' usage APIs). Each set (``SimConfig.choices``) holds one of every kind:

``wrong_region`` (GPU instances, no GPU telemetry needed):

- a p4d.24xlarge in ap-northeast-1 for the whole span, its volumes reporting tens of TB
  (labelled: a month's saving in us-east-1 net of moving the data);
- a g5.12xlarge in eu-west-1 reporting no storage (labelled; the rule's assumed data size);
- hard negatives: a p4d in ap-northeast-1 that runs three days and is terminated (short-lived);
  a g5.12xlarge in ap-northeast-1 whose hundreds of TB cost more to move than a month saves;
  a p4d in us-west-2 (already at the cheapest listed price); a g5.xlarge in eu-west-1 (dearer,
  but the month's saving is too small to move).

``build_or_call`` (the rule's defaults: a week, 20 % margin, 500 + 250 tokens a request):

- a self-hosted llama-3.1-8b endpoint on a g5.xlarge at well under one request a second
  (labelled ``call``: the API would have served it for less);
- an API account spending on gpt-4o at several requests a second, tokens reported
  (labelled ``build``: one p4d.24xlarge serving a 70B would be cheaper);
- hard negatives: a self-hosted endpoint busy enough to beat the API; an API account whose
  spend is too small to keep a p4d busy.

Labels' dollars are computed here from the price list and the traffic this module made,
independently of the detectors: ``wrong_region``'s a month's saving less the egress of
the data; ``build_or_call``'s the saving day by day from the first day of the week that
passed the crossover to the end of the fleet.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from detector.events import DAY_S, TOPIC_RESOURCE_USAGE
from detector.pricing import HOURS_PER_MONTH, Pricing, usd_over
from detector.simulate import Label, Record
from detector.units import rfc3339

__all__ = ["HISTORY_DAYS", "Workload", "choice_labels", "choice_records", "choice_workloads"]

HOUR_S = 3600.0
HISTORY_DAYS = 8
"""Days of usage before the fleet's start: a week for the rules to judge, and a day to spare."""
DEFAULT_DATA_GB = 1000.0
"""``wrong_region``'s ``data_gb`` default: the data assumed when a resource reports none."""
TOKENS_PER_REQUEST = (500.0, 250.0)
"""``build_or_call``'s default assumption, for endpoints that report no token counts."""
MARGIN = 0.2
WEEK_DAYS = 7
TEAMS = [("nlp", "chat-assist", "alice"), ("search", "rag", "dana"), ("research", "agents", "hiro")]


@dataclass
class Workload:
    """One resource's whole usage timeline (hourly) and what it is meant to be."""

    resource_id: str
    resource_type: str
    kind: str
    region: str = "us-east-1"
    instance_type: str = ""
    provider: str = "aws"
    start: float = 0.0
    end: float = 0.0
    storage_gb: float | None = None
    model: str = ""
    requests_per_s: float = 0.0
    diurnal: float = 0.0
    """Traffic swings by this share over the day (peak at 15:00 UTC)."""
    measured_tokens: bool = False
    tags: dict[str, str] = field(default_factory=dict)
    hours: list[tuple[float, int, float, float, float]] = field(default_factory=list)
    """(interval start, requests, input tokens, output tokens, cost USD) per hour, filled by :func:`_traffic`."""


def choice_workloads(n: int, seed: int, start: float, end: float, pricing: Pricing) -> list[Workload]:
    """``n`` sets of every kind (the module docstring), from their own random stream."""
    rng = random.Random(f"{seed}-regions")
    out: list[Workload] = []
    for i in range(n):
        out += _one_set(i, rng, start - HISTORY_DAYS * DAY_S, end)
    for w in out:
        _traffic(w, pricing, random.Random(f"{seed}-regions-{w.resource_id}"))
    return out


def _one_set(i: int, rng: random.Random, first: float, end: float) -> list[Workload]:
    team, project, owner = TEAMS[i % len(TEAMS)]
    tags = {"team": team, "project": project, "owner": owner, "env": "prod"}

    def gpu(kind: str, itype: str, region: str, storage_gb: float | None, until: float = end) -> Workload:
        return Workload(f"choice-{i}-{kind}", "gpu_instance", kind, region, itype, start=first, end=until,
                        storage_gb=storage_gb, tags=dict(tags))  # fmt: skip

    def model(kind: str, rtype: str, name: str, rps: float, itype: str = "", measured: bool = False) -> Workload:
        w = Workload(f"choice-{i}-{kind}", rtype, kind, "us-east-1", itype, start=first, end=end, model=name,
                     requests_per_s=rps, diurnal=rng.uniform(0.1, 0.4), measured_tokens=measured,
                     tags={**tags, "model": name})  # fmt: skip
        if rtype == "llm_api":
            w.provider, w.region = "openai", ""
        return w

    return [
        gpu("tokyo-p4d", "p4d.24xlarge", "ap-northeast-1", rng.uniform(10_000, 80_000)),
        gpu("ireland-g5", "g5.12xlarge", "eu-west-1", None),
        gpu("short-tokyo-p4d", "p4d.24xlarge", "ap-northeast-1", rng.uniform(1_000, 20_000),
            until=first + rng.uniform(2.0, 4.0) * DAY_S),
        gpu("heavy-data-tokyo-g5", "g5.12xlarge", "ap-northeast-1", rng.uniform(150_000, 400_000)),
        gpu("oregon-p4d", "p4d.24xlarge", "us-west-2", rng.uniform(1_000, 50_000)),
        gpu("small-gap-g5", "g5.xlarge", "eu-west-1", None),
        model("light-endpoint", "inference_endpoint", "llama-3.1-8b-instruct", rng.uniform(0.2, 0.8), "g5.xlarge"),
        model("busy-endpoint", "inference_endpoint", "llama-3.1-8b-instruct", rng.uniform(2.4, 3.0), "g5.xlarge"),
        # Busy enough that even two p4d (its busiest hours need two) beat the API by the margin.
        model("heavy-api", "llm_api", "gpt-4o", rng.uniform(6.5, 7.5), measured=True),
        model("small-api", "llm_api", "gpt-4o", rng.uniform(0.3, 1.2), measured=True),
    ]  # fmt: skip


def _traffic(w: Workload, pricing: Pricing, rng: random.Random) -> None:
    """Fill ``w.hours``: requests (with their diurnal swing and noise), tokens and the hour's cost."""
    t = w.start
    hourly = pricing.regions.hourly(w.instance_type, w.region) if w.instance_type else None
    if hourly is None and w.instance_type:
        hourly = pricing.hourly(w.instance_type)
    api = pricing.llm_models[w.model].api if w.model else None
    while t < w.end:
        requests = 0
        inp = out = 0.0
        if w.requests_per_s:
            hour = (t % DAY_S) / HOUR_S
            swing = 1 + w.diurnal * math.cos((hour - 15) / 24 * 2 * math.pi)
            requests = int(w.requests_per_s * swing * rng.uniform(0.9, 1.1) * HOUR_S)
            per_in = rng.uniform(300, 700) if w.measured_tokens else TOKENS_PER_REQUEST[0]
            per_out = rng.uniform(150, 350) if w.measured_tokens else TOKENS_PER_REQUEST[1]
            inp, out = round(requests * per_in), round(requests * per_out)
        if w.resource_type == "llm_api":
            assert api is not None
            cost = round(api.usd(inp, out), 6)
        else:
            cost = round(usd_over(hourly or 0.0, HOUR_S), 6)
        w.hours.append((t, requests, inp, out, cost))
        t += HOUR_S


def choice_records(w: Workload) -> Iterator[Record]:
    """The workload's hourly usage, each interval sent when it ends."""
    last = len(w.hours) - 1
    for k, (t, requests, inp, out, cost) in enumerate(w.hours):
        event: dict[str, Any] = {
            "ts": rfc3339(t), "resource_id": w.resource_id, "resource_type": w.resource_type,
            "provider": w.provider, "account": "ml-prod-0", "region": w.region, "instance_type": w.instance_type,
            "state": "running", "interval_s": HOUR_S, "cost_usd": cost, "tags": w.tags,
        }  # fmt: skip
        if w.storage_gb is not None:
            event["storage_bytes"] = int(w.storage_gb * 1e9)
        if w.requests_per_s:
            event["requests"] = requests
        if w.measured_tokens:
            event["metrics"] = {"input_tokens": inp, "output_tokens": out}
        yield (t + HOUR_S, TOPIC_RESOURCE_USAGE, w.resource_id, event)
        if k == last and w.kind.startswith("short-"):
            stopped = {**event, "ts": rfc3339(t + HOUR_S), "state": "terminated", "cost_usd": 0.0}
            stopped.pop("requests", None)
            yield (t + 2 * HOUR_S, TOPIC_RESOURCE_USAGE, w.resource_id, stopped)


def choice_labels(workloads: list[Workload], pricing: Pricing) -> list[Label]:
    """Ground truth, from the price list and the traffic made (module docstring)."""
    labels: list[Label] = []
    for w in workloads:
        label = _region_label(w, pricing) if w.resource_type == "gpu_instance" else _model_label(w, pricing)
        if label is not None:
            labels.append(label)
    return labels


def _region_label(w: Workload, pricing: Pricing) -> Label | None:
    """A month's saving in the cheapest listed region less moving the data once, when the
    workload runs a week and the saving is 10 % or more and $100 or more net."""
    if w.end - w.start < WEEK_DAYS * DAY_S:
        return None
    here = pricing.regions.hourly(w.instance_type, w.region)
    cheapest = pricing.regions.cheapest(w.instance_type)
    if here is None or cheapest is None:
        return None
    there = cheapest[1]
    saving = here - there
    data_gb = w.storage_gb if w.storage_gb is not None else DEFAULT_DATA_GB
    net = saving * HOURS_PER_MONTH - data_gb * pricing.egress_per_gb.inter_region
    if saving < 0.1 * here or net < 100.0:
        return None
    return Label("wrong_region", w.resource_id, w.start, w.end, saving, f"{w.instance_type} in {w.region}", net)


def _model_label(w: Workload, pricing: Pricing) -> Label | None:
    """The saving the other way, day by day, from the first week whose every day passed the
    crossover by the margin (the rule's defaults) to the end. Self-hosting is sized for the
    busiest hour of the week that ends with the day judged (a fleet is not resized daily)."""
    entry = pricing.llm_models[w.model]
    days: dict[float, list[tuple[float, int, float, float, float]]] = {}
    for hour in w.hours:
        days.setdefault(hour[0] - hour[0] % DAY_S, []).append(hour)
    daily = sorted(days.items())
    peaks = [max(h[3] for h in hours) for _, hours in daily]

    def figure(j: int, judged_at: int) -> tuple[float, bool, float]:
        """Day ``j`` as judged at the close of day ``judged_at``: (start, passed, saving)."""
        day_start, hours = daily[j]
        cost = sum(h[4] for h in hours)
        if w.resource_type == "llm_api":
            assert entry.self_host is not None
            capacity = entry.self_host.output_tokens_per_s * HOUR_S
            n = max(1, math.ceil(max(peaks[max(0, judged_at - WEEK_DAYS + 1):judged_at + 1]) / capacity))
            other = usd_over(n * (pricing.hourly(entry.self_host.instance_type) or 0.0), len(hours) * HOUR_S)
        else:
            assert entry.api is not None
            other = entry.api.usd(sum(h[2] for h in hours), sum(h[3] for h in hours))
        return day_start, len(hours) == 24 and other <= (1 - MARGIN) * cost, cost - other

    for k in range(len(daily) - WEEK_DAYS + 1):
        week = [figure(j, k + WEEK_DAYS - 1) for j in range(k, k + WEEK_DAYS)]
        if not all(passed for _, passed, _ in week) or k + WEEK_DAYS >= len(daily):
            continue  # not a week past the crossover, or no later day closes it
        end, usd = w.end, sum(saving for _, _, saving in week)
        for j in range(k + WEEK_DAYS, len(daily)):
            day_start, passed, saving = figure(j, j)
            if not passed and j < len(daily) - 1:  # a closed day back under the crossover ends it
                end = day_start
                break
            usd += saving  # the day in progress at the end counts as far as it has come
        direction = "build" if w.resource_type == "llm_api" else "call"
        return Label("build_or_call", w.resource_id, week[0][0], end, usd / ((end - week[0][0]) / HOUR_S),
                     f"{direction}: {w.model}", usd)  # fmt: skip
    return None
