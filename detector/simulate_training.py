"""Training jobs seen through their input pipelines and validation metrics: ground truth for
``data_starved_training`` and ``plateaued_run``, with the look-alikes that must not alert.

Each host (8 or 4 GPUs, billed on demand) runs one job after another. A job's GPUs are, for
its main stretch, one of:

- **starved, sawtooth** (labelled): synchronous ranks burst to 75-100 % every 2nd-4th scrape
  and wait near 0 between, the host's CPU pegged or not;
- **starved, low** (labelled): GPUs steady at 25-50 % while the host's CPU, busiest disk or
  network link is at 92-99 % (the exporter averaging the bursts away);
- **small** (hard negative): GPUs steady at 12-30 % on a quiet host: a small model, not a
  starved one;
- **healthy** (hard negative): GPUs at 75-100 %, the CPU often busy too.

Every job warms up healthy first, and a starved stretch may be followed by a healthy tail.
No job starts unless it and the idle after it end 6 hours before the data does (an episode cut
short by the end of the data would be neither found nor missed); the rest is one healthy job.
Between jobs a host idles a few minutes, or (labelled ``idle_gpu``: an idle host with no run,
sometimes with its CPU pegged by something else; a hard negative for starvation) an hour.

Each job is one run (``started``, a ``running`` event per evaluation carrying ``val_loss``
and the ``step``, ``succeeded``), evaluated every 10-20 minutes. Its metric:

- **plateaus** (labelled ``plateaued_run`` from the best evaluation to the run's end): it
  improves, then hovers above its best (slowly overfitting) for patience + 2 to + 8
  evaluations until the run ends;
- **improves slowly** (hard negative): a new best at every evaluation, by 0.0005;
- **is noisy on its way down** (hard negative): a trend of -0.02 per evaluation with noise of
  up to ±0.03, so a new best comes within three evaluations.

Label dollars are the truth the detectors should find: a starved stretch costs the host's
price × (1 − the GPUs' mean utilisation, known from how the stretch is drawn) over its length;
a plateau the host's price from the best evaluation to the run's end. The hosts draw from their
own random streams (``{seed}-training-{i}``), so the rest of a fleet is the same with or without
them; ``SimConfig.training_jobs`` (default 0) turns them on.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from detector.events import TOPIC_GPU_METRICS, TOPIC_RESOURCE_USAGE, TOPIC_RUN_EVENTS
from detector.pricing import Pricing, usd_over
from detector.simulate import Label, Record, SimConfig, _batched, delivered
from detector.units import rfc3339

__all__ = ["PATIENCE", "TrainingHost", "training_fleet", "training_hosts"]

PATIENCE = 5
"""The shipped rule's patience: a plateau is drawn at least two evaluations longer."""
BURST = (75.0, 100.0)
WAIT = (0.0, 6.0)
HOSTS = [("p4d.24xlarge", 8, "A100-SXM4-40GB", 400.0), ("g5.12xlarge", 4, "A10G", 150.0),
         ("p5.48xlarge", 8, "H100-SXM5-80GB", 700.0)]  # fmt: skip
TEAMS = [("nlp", "llm-finetune", "chen"), ("vision", "ocr", "emeka"), ("recsys", "ctr-model", "gus"),
         ("research", "video-gen", "ines")]  # fmt: skip
"""Projects of their own: run events are keyed by project, and the main fleet's crash loops are its projects'."""
GAUGES = ("cpu_util_pct", "disk_busy_pct", "network_util_pct")


@dataclass
class Stretch:
    """What a host's GPUs and gauges do from ``start`` to ``end``."""

    start: float
    end: float
    mode: str  # healthy | saw | low | small | idle
    period: int = 3
    """saw: a burst every ``period`` scrapes."""
    level: float = 0.0
    """low / small: the GPUs' floor (percent; they read level to level + 10)."""
    gauges: dict[str, float] = field(default_factory=dict)
    """Host gauges' centre (percent); each minute reads it ± 3."""

    def used(self) -> float:
        """The GPUs' expected mean utilisation as a share."""
        if self.mode == "saw":
            burst, wait = sum(BURST) / 2, sum(WAIT) / 2
            return (burst + (self.period - 1) * wait) / self.period / 100
        if self.mode in ("low", "small"):
            return (self.level + 5) / 100
        if self.mode == "healthy":
            return sum(BURST) / 2 / 100
        return 0.0


@dataclass
class TrainingHost:
    resource_id: str
    instance_type: str
    gpus: int
    gpu_model: str
    max_power: float
    hourly: float
    tags: dict[str, str]
    stretches: list[Stretch] = field(default_factory=list)
    runs: list[Record] = field(default_factory=list)
    labels: list[Label] = field(default_factory=list)


def training_hosts(n: int, seed: int, start: float, end: float, scrape_s: float, pricing: Pricing) -> list[TrainingHost]:
    """``n`` hosts with their jobs, runs and labels, each from its own random stream."""
    return [_host(i, random.Random(f"{seed}-training-{i}"), start, end, scrape_s, pricing) for i in range(n)]


def _host(i: int, rng: random.Random, start: float, end: float, scrape_s: float, pricing: Pricing) -> TrainingHost:
    itype, gpus, model, power = HOSTS[i % len(HOSTS)]
    team, project, owner = TEAMS[i % len(TEAMS)]
    host = TrainingHost(f"train-host-{i:03d}", itype, gpus, model, power, pricing.hourly(itype) or 10.0,
                        {"team": team, "project": project, "owner": owner, "env": "prod"})  # fmt: skip

    def minutes(lo: float, hi: float) -> float:
        return round(rng.uniform(lo, hi) * 60 / scrape_s) * scrape_s

    def add(t: float, length: float, mode: str, **kw: Any) -> float:
        stop = min(t + length, end)
        if stop > t:
            host.stretches.append(Stretch(t, stop, mode, **kw))
        return stop

    t, k = start, 0
    while t + 6 * 3600 <= end:  # a job and the idle after it take at most 5 h 40 m: none is cut short
        gpu_kind = ("saw", "healthy", "low", "small", "saw", "healthy")[(i + k) % 6]
        metric_kind = ("plateau", "slow", "noisy", "plateau")[(2 * i + k) % 4]
        run_start = t
        t = add(t, minutes(20, 50), "healthy", gauges={"cpu_util_pct": rng.uniform(40, 80)})
        if gpu_kind == "saw":
            gauges = {"cpu_util_pct": rng.choice([rng.uniform(93, 97), rng.uniform(40, 70)])}
            period = rng.choice([2, 3, 4])
            t = add(t, minutes(60, 150), "saw", period=period, gauges=gauges)
            _starved_label(host, host.stretches[-1])
        elif gpu_kind == "low":
            gauge = rng.choice(GAUGES)
            t = add(t, minutes(60, 150), "low", level=rng.uniform(25, 40), gauges={gauge: rng.uniform(94, 97)})
            _starved_label(host, host.stretches[-1])
        elif gpu_kind == "small":
            t = add(t, minutes(60, 150), "small", level=rng.uniform(12, 20),
                    gauges={"cpu_util_pct": rng.uniform(20, 60), "disk_busy_pct": rng.uniform(5, 40)})  # fmt: skip
        else:
            t = add(t, minutes(60, 150), "healthy", gauges={"cpu_util_pct": rng.uniform(50, 96)})
        if gpu_kind in ("saw", "low") and rng.random() < 0.6:
            t = add(t, minutes(10, 40), "healthy", gauges={"cpu_util_pct": rng.uniform(40, 80)})
        _run(host, rng, run_start, t, metric_kind, f"run-{host.resource_id}-{k + 1}", scrape_s)
        roll = rng.random()
        if roll < 0.25 and t < end:  # an idle host with no run, sometimes its CPU busy with something else
            idle_start = t
            cpu = rng.choice([rng.uniform(3, 15), rng.uniform(94, 97)])
            t = add(t, minutes(45, 100), "idle", gauges={"cpu_util_pct": cpu})
            if t - idle_start >= 1800 + 60:
                host.labels.append(Label("idle_gpu", host.resource_id, idle_start, t, host.hourly,
                                         "training host idle between jobs, no run"))  # fmt: skip
        else:
            t = add(t, minutes(5, 20), "idle", gauges={"cpu_util_pct": rng.uniform(3, 15)})
        k += 1
    if t < end:  # the last hours: a healthy job to the end of the data
        run_start = t
        t = add(t, end - t, "healthy", gauges={"cpu_util_pct": rng.uniform(40, 80)})
        _run(host, rng, run_start, t, "slow", f"run-{host.resource_id}-{k + 1}", scrape_s)
    return host


def _starved_label(host: TrainingHost, stretch: Stretch) -> None:
    if stretch.end - stretch.start >= 1800 + 2 * 300:  # the rule's 30 minutes, with a window either side
        how = "sawtooth" if stretch.mode == "saw" else f"GPUs low, {next(iter(stretch.gauges))} saturated"
        host.labels.append(Label("data_starved_training", host.resource_id, stretch.start, stretch.end,
                                 host.hourly * (1 - stretch.used()), f"input pipeline starving the GPUs ({how})"))


def _run(host: TrainingHost, rng: random.Random, start: float, end: float, kind: str, run_id: str,
         scrape_s: float) -> None:  # fmt: skip
    """The run's events, and a ``plateaued_run`` label when its metric plateaus long enough."""
    every = round(rng.uniform(10, 20) * 60 / scrape_s) * scrape_s
    times = [start + every * (j + 1) for j in range(int((end - start - 1) // every))]
    n = len(times)
    best = max(2, n - PATIENCE - rng.randint(2, 8)) if kind == "plateau" else n
    if kind == "plateau" and n - best < PATIENCE + 2:
        kind, best = "slow", n
    values: list[float] = []
    for j in range(n):
        if kind == "slow":
            values.append(2.0 - 0.0005 * j)
        elif kind == "noisy":
            values.append(2.0 - 0.02 * j + rng.uniform(-0.03, 0.03))
        elif j <= best:
            values.append(0.5 + 1.5 * 0.85**j)
        else:
            values.append(values[best] + rng.uniform(0.001, 0.04) + 0.003 * (j - best))
    project = host.tags["project"]
    base = {"run_id": run_id, "resource_ids": [host.resource_id], "gpu_count": host.gpus, "project": project,
            "tags": host.tags}  # fmt: skip
    host.runs.append((start, TOPIC_RUN_EVENTS, project, {"ts": rfc3339(start), "status": "started", **base}))
    for j, at in enumerate(times):
        host.runs.append((at, TOPIC_RUN_EVENTS, project, {"ts": rfc3339(at), "status": "running", **base,
                          "metrics": {"val_loss": round(values[j], 6), "train_loss": round(values[j] * 0.9, 6)},
                          "step": (j + 1) * 500}))  # fmt: skip
    host.runs.append((end, TOPIC_RUN_EVENTS, project, {"ts": rfc3339(end), "status": "succeeded", **base}))
    if kind == "plateau":
        host.labels.append(Label("plateaued_run", run_id, times[best], end, host.hourly,
                                 f"val_loss flat for {n - 1 - best} evaluations"))  # fmt: skip


def _util(rng: random.Random, s: Stretch, j: int) -> float:
    if s.mode == "saw":
        return rng.uniform(*BURST) if j % s.period == 0 else rng.uniform(*WAIT)
    if s.mode in ("low", "small"):
        return rng.uniform(s.level, s.level + 10)
    if s.mode == "healthy":
        return rng.uniform(*BURST)
    return rng.uniform(0, 2.5)


def _gpu_records(host: TrainingHost, cfg: SimConfig, rng: random.Random) -> Iterator[Record]:
    """One message per minute holding the host's samples, as dcgm-exporter's pipeline sends them."""
    pending: list[dict[str, Any]] = []
    next_flush = cfg.start + cfg.flush_s
    for s in host.stretches:
        t, j = s.start, 0
        while t < s.end:
            if t >= next_flush and pending:
                yield (next_flush, TOPIC_GPU_METRICS, host.resource_id, pending)
                pending = []
            while next_flush <= t:
                next_flush += cfg.flush_s
            if cfg.drop_p and rng.random() < cfg.drop_p:
                t, j = t + cfg.scrape_s, j + 1
                continue
            stamp = rfc3339(t + rng.uniform(-cfg.jitter_s, cfg.jitter_s)) if cfg.jitter_s else rfc3339(t)
            for gpu in range(host.gpus):
                util = _util(rng, s, j)
                busy = s.mode != "idle"
                pending.append({
                    "ts": stamp, "resource_id": host.resource_id, "gpu_index": gpu, "model": host.gpu_model,
                    "util_pct": round(util, 1), "mem_used_mib": 30000.0 if busy else 400.0,
                    "mem_total_mib": 40960.0, "power_w": round(host.max_power * (0.2 + 0.7 * util / 100), 1),
                    "sm_active": round(util / 100 * 0.9, 3),
                })  # fmt: skip
            t, j = t + cfg.scrape_s, j + 1
    if pending:
        yield (next_flush, TOPIC_GPU_METRICS, host.resource_id, pending)


def _usage_records(host: TrainingHost, cfg: SimConfig, end: float, rng: random.Random) -> Iterator[Record]:
    step = cfg.usage_interval_s
    t, i = cfg.start, 0
    stretches = host.stretches
    while t < end:
        while i + 1 < len(stretches) and stretches[i].end <= t:
            i += 1
        gauges = stretches[i].gauges if stretches else {}
        event: dict[str, Any] = {
            "ts": rfc3339(t), "resource_id": host.resource_id, "resource_type": "gpu_instance", "provider": "aws",
            "account": "ml-prod-0", "region": "us-east-1", "instance_type": host.instance_type,
            "pricing": "on_demand", "state": "running", "interval_s": step,
            "cost_usd": round(usd_over(host.hourly, step), 6), "tags": host.tags,
            "metrics": {name: round(min(100.0, max(0.0, v + rng.uniform(-3, 3))), 1) for name, v in gauges.items()},
        }  # fmt: skip
        yield (t + step, TOPIC_RESOURCE_USAGE, host.resource_id, event)
        t += step


def training_fleet(cfg: SimConfig, pricing: Pricing, end: float) -> tuple[Iterator[Record], list[Label]]:
    """The training hosts' records (GPU samples, usage with host gauges, run events), delivered
    apart from the rest of the fleet, and their labels."""
    streams: list[Iterator[Record]] = []
    labels: list[Label] = []
    runs: list[Record] = []
    for host in training_hosts(cfg.training_jobs, cfg.seed, cfg.start, end, cfg.scrape_s, pricing):
        streams.append(_gpu_records(host, cfg, random.Random(f"{cfg.seed}-training-gpu-{host.resource_id}")))
        usage = _usage_records(host, cfg, end, random.Random(f"{cfg.seed}-training-usage-{host.resource_id}"))
        streams.append(_batched(usage, cfg.usage_flush_s))
        runs += host.runs
        labels += host.labels
    streams.append(iter(sorted(runs, key=lambda r: r[0])))
    return delivered(streams, cfg, "training-delivery"), labels
