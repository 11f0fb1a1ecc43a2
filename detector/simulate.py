"""A synthetic ML fleet with injected waste, and the ground truth to score detection against.

What it makes, per resource, is a timeline of segments:

- training hosts (8 or 4 GPUs) run jobs for hours, with the few-minute dips
  between epochs real jobs have; between jobs some hosts are left idle while
  billed (a labelled ``idle_gpu`` episode), some are stopped, some run a
  single-GPU job on one GPU of eight (the host is busy, not ``idle_gpu``; its
  other GPUs idle for an hour or more are a labelled ``partly_idle_gpu``
  episode), and some lose their GPU telemetry for an hour (missing data, not idle);
- notebooks (1 GPU) are used in bursts during the day and are either stopped
  or left running idle overnight (labelled);
- inference endpoints stay moderately busy and send responses to the internet on a
  daily cycle;
- vector databases grow in hourly ingestion batches: some fill their capacity within
  weeks, some grow by a fifth a day (both labelled ``vector_db_growth``), some grow
  slowly; dataset buckets only grow (labelled ``storage_growth`` when the data spans
  more than a day), checkpoint buckets have a lifecycle rule (a daily sawtooth) and
  some buckets grow slowly;
- CPU (ETL) instances copy data to another region: some run away (a sync loop at
  8-30x the usual rate for up to 2.5 hours, labelled ``egress_runaway`` with the
  excess dollars); hard negatives: a runaway too cheap to matter, a slow drift, and
  3-minute checkpoint bursts;
- runs end ``succeeded``, ``killed`` (deliberately: not waste) or ``failed``; a failed
  run costing $20 or more is labelled ``failed_run_spend``, and a job retried three
  or more times within six hours, failing within minutes each time, is one labelled
  crash loop with its total; configuration errors that fail in minutes are cheap
  hard negatives;
- about half the long runs checkpoint (a ``checkpoint`` run tag); those of four hours
  or more on on-demand hosts are labelled ``spot_eligible`` with the spot saving; one
  training host in four already runs on spot (a hard negative); runs send a
  ``running`` heartbeat every 30 minutes;
- some runs hang in a collective for half an hour or more before they are killed:
  GPUs at 100 % utilisation with idle SMs and idle power (labelled ``stuck_gpu``);
- some hosts lose their GPU exporter for an hour while billed (labelled
  ``telemetry_stale``; never idle, since silence is not evidence);
- about one GPU host in ten and one notebook in five carries no team/project tags
  (labelled ``untagged``, with its spend while running);
- with ``k8s_nodes``, shared Kubernetes GPU nodes whose pods hold some of the GPUs
  (:mod:`detector.simulate_k8s`): GPUs idle in pods beside busy ones
  (``partly_idle_gpu``), GPUs no pod requests (``unallocated_gpu``), whole nodes
  idle (``idle_gpu``), and their hard negatives. They draw from their own random
  stream, so the rest of a fleet is the same with or without them.
- with ``choices``, workloads whose cost is a choice (:mod:`detector.simulate_regions`):
  GPU instances in dear regions (``wrong_region``) and models served or called at the
  wrong volume (``build_or_call``), with a week of hourly usage before the start, and
  their hard negatives; their own random stream too.

Exporters batch like real ones: a host's GPU samples (every 30 s) go out once
a minute as one message holding every GPU's samples; usage comes once a minute
per resource. Records are ordered by the time the exporter would send them.
Everything is derived from the seed, so a run is reproducible.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from operator import itemgetter
from typing import Any

from detector.events import TOPIC_GPU_METRICS, TOPIC_RESOURCE_USAGE, TOPIC_RUN_EVENTS
from detector.pricing import Pricing, storage_usd, usd_over
from detector.units import rfc3339

__all__ = ["Fleet", "Label", "Record", "SimConfig", "build", "simulate"]

Record = tuple[float, str, str, Any]
"""(send time, topic, key, value): value is one event or a list of events."""

TEAMS = [
    ("nlp", ["llm-pretrain", "summarizer"], ["alice", "bogdan", "chen"]),
    ("vision", ["detector-v3", "segmentation"], ["dana", "emeka"]),
    ("recsys", ["ranker", "two-tower"], ["farah", "gus"]),
    ("research", ["rl-agents", "diffusion"], ["hiro", "ines", "jamal"]),
]
HOSTS = [
    ("p4d.24xlarge", 8, "A100-SXM4-40GB", 400.0),
    ("g5.12xlarge", 4, "A10G", 150.0),
    ("p5.48xlarge", 8, "H100-SXM5-80GB", 700.0),
]
NOTEBOOKS = [("g5.xlarge", "A10G", 150.0), ("g4dn.xlarge", "T4", 70.0), ("g6.xlarge", "L4", 72.0)]


@dataclass(frozen=True)
class SimConfig:
    start: float = datetime(2026, 11, 2, tzinfo=timezone.utc).timestamp()
    hours: float = 24.0
    training_hosts: int = 12
    notebooks: int = 8
    inference_endpoints: int = 3
    buckets: int = 3
    vector_dbs: int = 3
    cpu_instances: int = 6
    seed: int = 7
    scrape_s: float = 30.0
    usage_interval_s: float = 60.0
    flush_s: float = 60.0
    """A GPU exporter sends what it gathered once per flush interval, as one message per host."""
    usage_flush_s: float = 300.0
    """A usage exporter sends each resource's intervals every five minutes, as one message."""
    drop_p: float = 0.0
    """Messy delivery: the share of GPU scrapes lost (an exporter timeout)."""
    jitter_s: float = 0.0
    """Messy delivery: GPU sample timestamps off by up to this many seconds."""
    duplicate_p: float = 0.0
    """Messy delivery: the share of messages delivered twice (at-least-once producers)."""
    delay_s: float = 0.0
    """Messy delivery: messages sent up to this late, so topics arrive out of order."""
    anomalies: bool = False
    """Inject what no rule covers, labelled ``anomaly``: GPUs at full power with little
    utilisation, a silent price change, egress shifted to 3x (under the runaway bar)."""
    anomalies_from: float = 0.0
    """Hours from the start before which nothing anomalous happens (the model's training span)."""
    k8s_nodes: int = 0
    """Shared Kubernetes GPU nodes (8 GPUs each, pods holding some of them); see :mod:`detector.simulate_k8s`."""
    choices: int = 0
    """Sets of workloads whose cost is a choice (region; build or call), each with a week of
    hourly usage before ``start``; see :mod:`detector.simulate_regions`."""
    serving_endpoints: int = 0
    """Inference endpoints for the serving rules (idle schedules, batching, caching, spot
    redundancy), the kinds in turn; see :mod:`detector.simulate_serving`."""
    training_jobs: int = 0
    """Hosts running training jobs seen through their input pipelines (host gauges) and validation
    metrics (run events): data-starved and plateaued runs; see :mod:`detector.simulate_training`."""
    cpu_notebooks: int = 0
    """Notebooks without GPUs, their Jupyter activity in their usage: some left running overnight;
    see :mod:`detector.simulate_notebooks`."""

    @classmethod
    def messy(cls, **kw: Any) -> SimConfig:
        """The same fleet as real pipelines deliver it: 2 % of scrapes lost, 2 s clock jitter,
        1 % of messages duplicated, and up to 45 s of delivery delay."""
        return cls(drop_p=0.02, jitter_s=2.0, duplicate_p=0.01, delay_s=45.0, **kw)


@dataclass
class Label:
    """One injected waste episode: what detection should find, and its dollars."""

    type: str
    resource_id: str
    start: float
    end: float
    usd_per_hour: float
    note: str = ""
    usd: float | None = None
    """Dollars when they are not rate × duration (spend over running intervals only)."""
    expect: dict[str, float] = field(default_factory=dict)
    """Figures the alert's details should give, for types whose news is not dollars
    (a growth rate); scored like dollars."""
    gpus: list[int] = field(default_factory=list)
    """For an episode of some of a host's GPUs: their indices."""

    @property
    def waste_usd(self) -> float:
        if self.usd is not None:
            return self.usd
        return usd_over(self.usd_per_hour, self.end - self.start)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "resource_id": self.resource_id,
            "start": rfc3339(self.start),
            "end": rfc3339(self.end),
            "waste_usd": round(self.waste_usd, 2),
            "usd_per_hour": self.usd_per_hour,
            "note": self.note,
            **({"expect": self.expect} if self.expect else {}),
            **({"gpus": self.gpus} if self.gpus else {}),
        }


@dataclass
class _Egress:
    """A resource's network egress: a base rate with a daily cycle, a drift, and bursts."""

    dest_region: str
    gb_per_hour: float
    diurnal: float = 0.0
    """Amplitude of the daily cycle, as a fraction of the base rate."""
    drift_per_day: float = 0.0
    since: float = 0.0
    """Where the drift starts."""
    bursts: list[tuple[float, float, float]] = field(default_factory=list)
    """(start, end, factor) spells of many times the usual rate."""

    def base(self, t: float) -> float:
        """GB per hour at ``t`` without bursts."""
        day = (t % 86_400) / 86_400
        cycle = 1 + self.diurnal * math.sin(2 * math.pi * (day - 0.25))
        return self.gb_per_hour * cycle * (1 + self.drift_per_day) ** ((t - self.since) / 86_400)

    def rate(self, t: float) -> float:
        factor = next((f for a, b, f in self.bursts if a <= t < b), 1.0)
        return self.base(t) * factor


@dataclass
class _Store:
    """A bucket or vector database whose size grows in hourly ingestion batches."""

    resource_id: str
    resource_type: str
    tags: dict[str, str]
    start: float
    size0: float
    bytes_per_day: float
    capacity: float | None = None
    expires_daily: bool = False
    """A lifecycle rule deletes what was written, once a day (a sawtooth)."""

    def size(self, t: float) -> float:
        days = int((t - self.start) // 3600) / 24  # hourly ingestion batches
        return self.size0 + self.bytes_per_day * (days % 1.0 if self.expires_daily else days)


@dataclass
class _RunEnd:
    project: str
    run_id: str
    start: float
    end: float
    status: str
    usd: float


@dataclass
class _Segment:
    start: float
    end: float
    mode: str  # busy | idle | dip | single | gap | stopped
    label: bool = False


@dataclass
class _Resource:
    resource_id: str
    resource_type: str
    instance_type: str
    gpus: int
    gpu_model: str
    max_power: float
    tags: dict[str, str]
    account: str
    region: str
    hourly: float
    send_cost: bool
    segments: list[_Segment] = field(default_factory=list)
    egress: _Egress | None = None
    pricing: str = "on_demand"
    price_change: tuple[float, float] | None = None
    """(from, factor): the resource's billed price changes at that time."""
    model_mib: float = 0.0
    """GPU memory a served model holds, whatever the load."""
    requests_per_s: tuple[float, float] | None = None
    """Request rate at night and in office hours, for endpoints."""


def _frange(start: float, end: float, step: float) -> Iterator[float]:
    while start < end:
        yield start
        start += step


def _grid(t: float, step: float) -> float:
    return round(t / step) * step


class _Builder:
    def __init__(self, cfg: SimConfig, pricing: Pricing) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.pricing = pricing
        self.end = cfg.start + cfg.hours * 3600
        self.labels: list[Label] = []
        self.runs: list[Record] = []
        self.run_ends: list[_RunEnd] = []

    def tags(self, untagged_p: float = 0.1) -> dict[str, str]:
        team, projects, owners = self.rng.choice(TEAMS)
        if self.rng.random() < untagged_p:
            return {"env": "dev"}
        return {"team": team, "project": self.rng.choice(projects), "owner": self.rng.choice(owners), "env": "prod"}

    def minutes(self, lo: float, hi: float) -> float:
        return _grid(self.rng.uniform(lo, hi) * 60, self.cfg.scrape_s)

    def add(self, res: _Resource, start: float, length: float, mode: str, label: bool = False) -> float:
        end = min(start + length, self.end)
        if end <= start:
            return end
        if mode == "single" and res.gpus > 1 and end - start >= 1800 + 60:  # one GPU works, the others idle
            idle = res.gpus - 1
            self.labels.append(Label("partly_idle_gpu", res.resource_id, start, end, res.hourly * idle / res.gpus,
                                     f"{idle} of {res.gpus} GPUs idle beside a single-GPU job",
                                     gpus=list(range(1, res.gpus))))  # fmt: skip
        if label and mode == "gap":
            last_sample = start - self.cfg.scrape_s
            if end - last_sample >= 600 + 60:
                self.labels.append(Label("telemetry_stale", res.resource_id, last_sample, end, res.hourly,
                                         "GPU exporter down while billed"))  # fmt: skip
        elif label and mode == "stuck":
            if end - start >= 1200 + 60:
                self.labels.append(Label("stuck_gpu", res.resource_id, start, end, res.hourly, "job hung in a collective"))
        elif label:
            # GPUs already idle just before (a pause, a dip) make the episode start earlier.
            idle_from = start
            for prev in reversed(res.segments):
                if prev.mode not in ("idle", "dip") or prev.end != idle_from:
                    break
                idle_from = prev.start
            # At least 31 minutes, so a sample past the 30-minute mark exists in the data.
            if end - idle_from >= 1800 + 60:
                note = "left idle after a run" if res.resource_type == "gpu_instance" else "left running overnight"
                self.labels.append(Label("idle_gpu", res.resource_id, idle_from, end, res.hourly, note))
        res.segments.append(_Segment(start, end, mode, label))
        return end

    def training_host(self, i: int) -> _Resource:
        itype, gpus, model, power = HOSTS[i % len(HOSTS)]
        pricing = "spot" if i % 4 == 3 else "on_demand"  # some training already runs on spot
        res = _Resource(f"gpu-host-{i:03d}", "gpu_instance", itype, gpus, model, power, self.tags(),
                        f"ml-prod-{i % 2}", "us-east-1", self.pricing.hourly(itype, pricing) or 10.0, send_cost=True,
                        pricing=pricing)  # fmt: skip
        t = self.cfg.start
        while t < self.end:
            if self.rng.random() < 0.08:  # a job retried by its scheduler, failing within minutes each time
                for _ in range(self.rng.randint(3, 5)):
                    t = self._run(res, t, self.add(res, t, self.minutes(8, 25), "busy"), "failed")
                    t = self.add(res, t, self.minutes(2, 5), "dip")
                continue
            run_start, roll = t, self.rng.random()
            if roll < 0.05:  # a configuration error: fails in minutes, cheaply
                t = self._run(res, run_start, self.add(res, t, self.minutes(5, 15), "busy"), "failed")
            else:
                checkpoint = self.rng.random() < 0.5
                run_end = min(t + self.minutes(120, 360), self.end)
                while t < run_end:  # epochs with short dips between them
                    t = self.add(res, t, min(self.minutes(35, 90), run_end - t), "busy")
                    if t < run_end and self.rng.random() < 0.7:
                        t = self.add(res, t, self.minutes(2, 6), "dip")
                roll = self.rng.random()
                status = "failed" if roll < 0.12 else "killed" if roll < 0.2 else "succeeded"
                if t < self.end and self.rng.random() < 0.12:  # the job hangs in a collective, then is killed
                    t = self.add(res, t, self.minutes(25, 70), "stuck", label=True)
                    status = "failed"
                t = self._run(res, run_start, t, status, checkpoint)
            calm = t < self.cfg.start + self.cfg.anomalies_from * 3600
            if self.cfg.anomalies and self.rng.random() < 0.08 and not calm:  # full power with little work
                end = self.add(res, t, self.minutes(60, 110), "hot_idle")
                if end - t >= 60 * 60:  # the model's 30 minutes, after its recent level has moved
                    self.labels.append(Label("anomaly", res.resource_id, t, end, res.hourly,
                                             "full power at low utilisation", 0.0))  # fmt: skip
                t = end
            roll = self.rng.random()
            if roll < 0.40:
                t = self.add(res, t, self.minutes(45, 150), "idle", label=True)
            elif roll < 0.55:
                t = self.add(res, t, self.minutes(60, 180), "stopped")
            elif roll < 0.68:
                t = self.add(res, t, self.minutes(60, 120), "single")
            elif roll < 0.78:  # a short idle spell, then the exporter dies for an hour: not an idle episode
                t = self.add(res, t, self.minutes(10, 20), "idle")
                t = self.add(res, t, self.minutes(50, 80), "gap", label=True)
            else:
                t = self.add(res, t, self.minutes(5, 20), "idle")
        return res

    def _run(self, res: _Resource, start: float, end: float, status: str, checkpoint: bool = False) -> float:
        """Emit a run's events (keyed by project; a heartbeat every 30 minutes) and remember
        what it cost. A checkpointing run of 4 hours or more on on-demand capacity is
        labelled ``spot_eligible`` with what spot would have saved over it."""
        project = res.tags.get("project", "adhoc")
        run_id = f"run-{res.resource_id}-{len(self.run_ends) + 1}"
        tags = {**res.tags, "checkpoint": f"s3://checkpoints/{run_id}"} if checkpoint else res.tags
        self.runs.append((start, TOPIC_RUN_EVENTS, project, self._run_event(start, run_id, "started", res, project, tags)))
        for beat in _frange(start + 1800, end, 1800):
            self.runs.append((beat, TOPIC_RUN_EVENTS, project, self._run_event(beat, run_id, "running", res, project, tags)))
        self.runs.append((end, TOPIC_RUN_EVENTS, project, self._run_event(end, run_id, status, res, project, tags)))
        self.run_ends.append(_RunEnd(project, run_id, start, end, status, usd_over(res.hourly, end - start)))
        spot = self.pricing.hourly(res.instance_type, "spot")
        if checkpoint and res.pricing == "on_demand" and spot is not None and end - start >= 4 * 3600:
            saving = res.hourly - spot
            self.labels.append(Label("spot_eligible", run_id, start, end, saving, "checkpointing run on on-demand"))
        return end

    def _run_event(self, t: float, run_id: str, status: str, res: _Resource, project: str,
                   tags: dict[str, str]) -> dict[str, Any]:  # fmt: skip
        event: dict[str, Any] = {
            "ts": rfc3339(t), "run_id": run_id, "status": status, "resource_ids": [res.resource_id],
            "gpu_count": res.gpus, "project": project, "tags": tags,
        }  # fmt: skip
        if status == "failed":
            event["error"] = self.rng.choice(["CUDA out of memory", "NCCL watchdog timeout", "Loss is NaN", "OOMKilled"])
        return event

    def run_labels(self, min_usd: float = 20.0, loop_runs: int = 3, loop_window: float = 6 * 3600) -> list[Label]:
        """``failed_run_spend`` ground truth from the runs' true costs, by the definition users
        configure: a failed run costing at least ``min_usd``; ``loop_runs`` failures of one
        project within ``loop_window`` are one crash-loop episode with their total."""
        labels: list[Label] = []
        by_project: dict[str, list[_RunEnd]] = {}
        for end in sorted(self.run_ends, key=lambda r: (r.end, r.run_id)):
            by_project.setdefault(end.project, []).append(end)
        for project, ends in by_project.items():
            window: list[_RunEnd] = []
            loop: Label | None = None
            for run in ends:
                if loop is not None and run.end - window[-1].end >= loop_window:
                    loop, window = None, []
                if run.status == "succeeded":
                    if loop is not None:
                        loop, window = None, []
                    continue
                if run.status != "failed":
                    continue
                if loop is None:
                    window = [r for r in window if r.end >= run.end - loop_window]
                window.append(run)
                if loop is not None:
                    loop.usd = (loop.usd or 0.0) + run.usd
                    loop.end = run.end
                elif len(window) >= loop_runs and sum(r.usd for r in window) >= min_usd:
                    loop = Label("failed_run_spend", f"project/{project}", window[0].end, run.end, 0.0,
                                 "crash loop", sum(r.usd for r in window))  # fmt: skip
                    labels.append(loop)
                elif run.usd >= min_usd:
                    labels.append(Label("failed_run_spend", run.run_id, run.start, run.end, 0.0, "run failed", run.usd))
        return labels

    def notebook(self, i: int) -> _Resource:
        itype, model, power = NOTEBOOKS[i % len(NOTEBOOKS)]
        res = _Resource(f"notebook-{i:03d}", "notebook", itype, 1, model, power, self.tags(0.2),
                        "ml-dev", "us-west-2", self.pricing.hourly(itype) or 1.0, send_cost=False)
        t = self.cfg.start
        while t < self.end:
            hour = datetime.fromtimestamp(t, tz=timezone.utc).hour
            if 9 <= hour < 18:  # working hours: bursts of work, short pauses
                t = self.add(res, t, self.minutes(10, 45), "busy")
                t = self.add(res, t, self.minutes(3, 20), "idle")
            else:
                morning = _grid(self._next_morning(t), self.cfg.scrape_s)
                mode = "idle" if self.rng.random() < 0.5 else "stopped"
                t = self.add(res, t, morning - t, mode, label=mode == "idle")
        return res

    def _next_morning(self, t: float) -> float:
        day = datetime.fromtimestamp(t, tz=timezone.utc).replace(hour=9, minute=0, second=0, microsecond=0)
        morning = day.timestamp()
        return morning if morning > t else morning + 86_400

    def inference(self, i: int) -> _Resource:
        """Endpoints serving a 6 GiB model on an A10G: one in three is busy around the clock,
        one in three is quiet (labelled ``inference_overprovisioned`` when a day of data shows
        it, with the saving of the cheapest instance type that holds the model), and one is
        quiet at night but busy by day (a hard negative)."""
        itype = "g5.2xlarge"
        res = _Resource(f"inference-{i:03d}", "inference_endpoint", itype, 1, "A10G", 150.0,
                        self.tags(0.0), "ml-prod-0", "eu-west-1", self.pricing.hourly(itype) or 1.2, send_cost=True)
        mode = ("serving", "serving_quiet", "serving_peaky")[i % 3]
        res.segments.append(_Segment(self.cfg.start, self.end, mode))
        res.model_mib = 6144.0
        res.requests_per_s = {"serving": (30.0, 120.0), "serving_quiet": (1.0, 4.0), "serving_peaky": (2.0, 150.0)}[mode]
        # Responses to clients: internet egress following the day (hard negative for egress_runaway).
        res.egress = _Egress("", self.rng.uniform(15, 40), diurnal=0.5)
        if mode == "serving_quiet" and self.cfg.hours >= 25:  # judged on a whole day of traffic
            fits = [self.pricing.hourly(name) or 0.0 for name, p in self.pricing.instances.items()
                    if p.provider == "aws" and p.gpus >= 1 and p.gpu_mem_gb * 1024 >= 2 * res.model_mib]  # fmt: skip
            saving = res.hourly - min(fits)
            self.labels.append(Label("inference_overprovisioned", res.resource_id, self.cfg.start, self.end, saving,
                                     "endpoint at 3-15 % on an A10G"))  # fmt: skip
        return res

    def vector_db(self, i: int) -> _Store:
        """One in three fills its 10 TB within weeks, one in three grows by a fifth a day from
        a small start (both labelled); the rest grow slowly (hard negatives)."""
        cap, kind = 10e12, i % 3
        if kind == 0:
            size0 = cap * self.rng.uniform(0.6, 0.75)
            per_day = (cap - size0) / self.rng.uniform(8, 25)
        elif kind == 1:
            size0 = cap * self.rng.uniform(0.2, 0.4)
            per_day = size0 * self.rng.uniform(0.002, 0.008)
        else:
            size0 = self.rng.uniform(0.3e12, 0.8e12)
            per_day = size0 * self.rng.uniform(0.15, 0.3)
        store = _Store(f"vectordb-{i:03d}", "vector_db", self.tags(0.0), self.cfg.start, size0, per_day, capacity=cap)
        if kind != 1 and self.cfg.hours >= 13:  # a trend needs half a day of data to be told from a bulk load
            note = "fills its capacity within weeks" if kind == 0 else "grows by a fifth a day"
            self.labels.append(Label("vector_db_growth", store.resource_id, self.cfg.start, self.end, 0.0, note, 0.0,
                                     expect={"growth_gb_per_day": per_day / 1e9}))  # fmt: skip
        return store

    def bucket(self, i: int) -> _Store:
        """Dataset buckets that only grow (labelled when a day of data shows it), checkpoint
        buckets whose lifecycle rule expires each day's writes, and slow ones."""
        kind = i % 3
        if kind == 0:
            store = _Store(f"bucket-{i:03d}", "storage_bucket", self.tags(0.0), self.cfg.start,
                           self.rng.uniform(20e12, 80e12), self.rng.uniform(0.5e12, 2e12))  # fmt: skip
            if self.cfg.hours >= 25:  # growth is judged on a day of data, so a lifecycle job would have shown
                self.labels.append(Label("storage_growth", store.resource_id, self.cfg.start, self.end, 0.0,
                                         "dataset copies, no lifecycle rule", 0.0,
                                         expect={"growth_gb_per_day": store.bytes_per_day / 1e9}))  # fmt: skip
            return store
        if kind == 1:
            return _Store(f"bucket-{i:03d}", "storage_bucket", self.tags(0.0), self.cfg.start - self.minutes(0, 600),
                          self.rng.uniform(5e12, 20e12), self.rng.uniform(2e12, 4e12), expires_daily=True)  # fmt: skip
        return _Store(f"bucket-{i:03d}", "storage_bucket", self.tags(0.0), self.cfg.start,
                      self.rng.uniform(5e12, 20e12), self.rng.uniform(5e9, 15e9))  # fmt: skip

    def etl_instance(self, i: int) -> _Resource:
        """A CPU instance moving data to another region. One in three has a runaway (a sync
        loop re-sending a dataset), labelled; the others are hard negatives: one whose
        runaway is too cheap to matter, one with a slow drift and short checkpoint bursts."""
        itype = "m6i.2xlarge" if i % 2 else "c6i.4xlarge"
        res = _Resource(f"cpu-{i:03d}", "cpu_instance", itype, 0, "", 0.0, self.tags(0.0), "ml-prod-0",
                        "us-east-1", self.pricing.hourly(itype) or 0.4, send_cost=False,
                        segments=[_Segment(self.cfg.start, self.end, "running")])  # fmt: skip
        kind = i % 3
        egress = _Egress("eu-west-1", self.rng.uniform(30, 80) if kind != 1 else 0.05)
        if kind == 2:
            egress.drift_per_day, egress.since = 0.5, self.cfg.start
        t = self.cfg.start + 7 * 3600 + self.minutes(0, 120)  # after the detector's 6 h of baseline
        while t < self.end - 3600:
            if kind == 2:  # checkpoint uploads: 3 minutes at 10x, every few hours
                egress.bursts.append((t, t + 180, 10.0))
                t += self.minutes(120, 240)
                continue
            end = min(t + self.minutes(40, 150), self.end)
            factor = self.rng.uniform(8, 30)
            egress.bursts.append((t, end, factor))
            if kind == 0:
                price = self.pricing.egress_per_gb.inter_region
                step = self.cfg.usage_interval_s
                excess_gb = sum((factor - 1) * egress.base(a) * step / 3600 for a in _frange(t, end, step))
                self.labels.append(Label("egress_runaway", res.resource_id, t, end, 0.0,
                                         "dataset sync loop to another region", excess_gb * price))  # fmt: skip
            t = end + self.minutes(8 * 60, 12 * 60)
        res.egress = egress
        if self.cfg.anomalies and kind in (1, 2) and self.cfg.hours >= self.cfg.anomalies_from + 20:
            at = self.cfg.start + (max(14, self.cfg.anomalies_from + 2)) * 3600 + self.minutes(0, 300)
            if kind == 1:  # the provider's price rises 80 % without notice
                res.send_cost, res.price_change = True, (at, 1.8)
                note = "price rose 80 %"
            else:  # a new consumer triples the traffic: under the runaway bar of 5x
                egress.bursts.append((at, self.end, 3.0))
                note = "egress tripled"
            self.labels.append(Label("anomaly", res.resource_id, at, at + 2 * 3600, res.hourly, note, 0.0))
        return res


def _gpu_util(rng: random.Random, mode: str, gpu: int, t: float) -> tuple[float, float | None]:
    if mode == "busy":
        return rng.uniform(70, 100), rng.uniform(0.55, 0.9)
    if mode == "stuck":  # a kernel stays resident, the SMs do nothing
        return 100.0, rng.uniform(0.0, 0.01)
    if mode == "hot_idle":  # a little work, full power (a runaway clock, a spinning kernel)
        return rng.uniform(6, 12), rng.uniform(0.06, 0.12)
    if mode == "single":
        return (rng.uniform(80, 100), rng.uniform(0.6, 0.9)) if gpu == 0 else (0.0, 0.0)
    if mode == "serving":
        hour = datetime.fromtimestamp(t, tz=timezone.utc).hour
        base = 25 + 20 * (1 if 8 <= hour < 20 else 0)
        return rng.uniform(base - 10, base + 15), rng.uniform(0.15, 0.5)
    if mode == "serving_quiet":  # a model on a bigger GPU than its traffic needs
        return rng.uniform(3, 15), rng.uniform(0.02, 0.1)
    if mode == "serving_peaky":  # quiet at night, busy in office hours
        day = 9 <= datetime.fromtimestamp(t, tz=timezone.utc).hour < 18
        return (rng.uniform(60, 80), rng.uniform(0.4, 0.6)) if day else (rng.uniform(2, 8), rng.uniform(0.01, 0.05))
    return rng.uniform(0, 2.5), rng.uniform(0, 0.02)  # idle or dip


def _gpu_records(res: _Resource, cfg: SimConfig, rng: random.Random) -> Iterator[Record]:
    pending: list[dict[str, Any]] = []
    next_flush = cfg.start + cfg.flush_s
    for seg in res.segments:
        if seg.mode in ("stopped", "gap"):
            continue
        t = seg.start
        while t < seg.end:
            if t >= next_flush and pending:
                yield (next_flush, TOPIC_GPU_METRICS, res.resource_id, pending)
                pending = []
            while next_flush <= t:
                next_flush += cfg.flush_s
            if cfg.drop_p and rng.random() < cfg.drop_p:
                t += cfg.scrape_s
                continue
            stamp = rfc3339(t + rng.uniform(-cfg.jitter_s, cfg.jitter_s)) if cfg.jitter_s else rfc3339(t)
            for gpu in range(res.gpus):
                util, sm = _gpu_util(rng, seg.mode, gpu, t)
                busy = util > 10 and seg.mode != "stuck"
                mem = res.model_mib or (30000.0 if busy else 400.0)
                power = res.max_power * (0.9 if seg.mode == "hot_idle" else 0.8 if busy else 0.15)
                pending.append({
                    "ts": stamp, "resource_id": res.resource_id, "gpu_index": gpu,
                    "gpu_uuid": f"GPU-{res.resource_id}-{gpu}", "model": res.gpu_model,
                    "util_pct": round(util, 1), "mem_used_mib": mem,
                    "mem_total_mib": 40960.0, "power_w": round(power, 1),
                    "sm_active": round(sm, 3) if sm is not None else None,
                })  # fmt: skip
            t += cfg.scrape_s
    if pending:
        yield (next_flush, TOPIC_GPU_METRICS, res.resource_id, pending)


def _batched(records: Iterator[Record], flush_s: float) -> Iterator[Record]:
    """Group one key's records into one message per ``flush_s`` window, sent at its end."""
    pending: list[Any] = []
    window_end = 0.0
    topic = key = ""
    for send_t, topic, key, value in records:
        if pending and send_t > window_end:
            yield (window_end, topic, key, pending)
            pending = []
        if not pending:
            window_end = (send_t // flush_s + 1) * flush_s if send_t % flush_s else send_t
        pending.append(value)
    if pending:
        yield (window_end, topic, key, pending)


def _usage_records(res: _Resource, cfg: SimConfig, end: float) -> Iterator[Record]:
    step = cfg.usage_interval_s
    noise = random.Random(f"{cfg.seed}-egress-{res.resource_id}")
    t = cfg.start
    seg_i = 0
    segments = res.segments
    while t < end:
        while seg_i + 1 < len(segments) and segments[seg_i].end <= t:
            seg_i += 1
        seg = segments[seg_i] if segments else None
        state = "stopped" if seg is not None and seg.mode == "stopped" and seg.start <= t else "running"
        event: dict[str, Any] = {
            "ts": rfc3339(t), "resource_id": res.resource_id, "resource_type": res.resource_type,
            "provider": "aws", "account": res.account, "region": res.region,
            "instance_type": res.instance_type, "pricing": res.pricing, "state": state,
            "interval_s": step, "tags": res.tags,
        }  # fmt: skip
        if res.send_cost:
            hourly = res.hourly
            if res.price_change is not None and t >= res.price_change[0]:
                hourly *= res.price_change[1]
            event["cost_usd"] = round(usd_over(hourly, step), 6) if state == "running" else 0.0
        if res.requests_per_s is not None and state == "running":
            night, day = res.requests_per_s
            busy = 9 <= datetime.fromtimestamp(t, tz=timezone.utc).hour < 18
            event["requests"] = int((day if busy else night) * step * noise.uniform(0.8, 1.2))
        if res.egress is not None and state == "running":
            gb = res.egress.rate(t) * step / 3600 * noise.uniform(0.8, 1.2)
            event["egress_bytes"] = int(gb * 1e9)
            event["dest_region"] = res.egress.dest_region
        yield (t + step, TOPIC_RESOURCE_USAGE, res.resource_id, event)
        t += step


def _storage_records(store: _Store, cfg: SimConfig, end: float, usd_per_gb_month: float) -> Iterator[Record]:
    """A bucket's usage every 5 minutes, billed at the price list's object-storage price."""
    step = 300.0
    t = cfg.start
    while t < end:
        size = store.size(t)
        event: dict[str, Any] = {
            "ts": rfc3339(t), "resource_id": store.resource_id, "resource_type": store.resource_type,
            "provider": "aws", "account": "ml-data", "region": "us-east-1", "state": "running", "interval_s": step,
            "storage_bytes": int(size), "cost_usd": round(storage_usd(size, step, usd_per_gb_month), 6),
            "tags": store.tags,
        }  # fmt: skip
        if store.capacity is not None:
            event["capacity_bytes"] = int(store.capacity)
            event["vector_count"] = int(size / 3072)
        yield (t + step, TOPIC_RESOURCE_USAGE, store.resource_id, event)
        t += step


def _untagged_label(res: _Resource, cfg: SimConfig, end: float) -> Label | None:
    """Ground truth for a resource without team/project tags: its spend over running intervals."""
    if res.tags.get("team") and res.tags.get("project"):
        return None
    step = cfg.usage_interval_s
    stopped = [(s.start, s.end) for s in res.segments if s.mode == "stopped"]
    running = sum(
        1 for k in range(int((end - cfg.start) // step))
        if not any(a <= cfg.start + k * step < b for a, b in stopped)
    )  # fmt: skip
    if not running:
        return None  # never ran: no spend to attribute, nothing to say
    per_interval = round(usd_over(res.hourly, step), 6) if res.send_cost else usd_over(res.hourly, step)
    return Label("untagged", res.resource_id, cfg.start, end, res.hourly, "no team/project tags", running * per_interval)


def _messy_delivery(records: Iterator[Record], cfg: SimConfig, rng: random.Random) -> Iterator[Record]:
    """Delay each message by up to ``delay_s`` (reordering across resources and topics) and
    deliver some twice, as at-least-once producers and retries do."""
    pending: list[tuple[float, int, Record]] = []
    n = 0
    for record in records:
        copies = 2 if rng.random() < cfg.duplicate_p else 1
        for _ in range(copies):
            late = record[0] + rng.uniform(0, cfg.delay_s)
            heapq.heappush(pending, (late, n, (late, *record[1:])))
            n += 1
        while pending and pending[0][0] <= record[0]:
            yield heapq.heappop(pending)[2]
    while pending:
        yield heapq.heappop(pending)[2]


@dataclass
class Fleet:
    """What :func:`build` made: the resources whose records :func:`simulate` sends, so another
    view of the same fleet (its bill, :mod:`detector.simulate_focus`) is derived from the same truth."""

    cfg: SimConfig
    end: float
    gpu_resources: list[_Resource]
    cpu_resources: list[_Resource]
    stores: list[_Store]
    builder: _Builder


def build(cfg: SimConfig, pricing: Pricing) -> Fleet:
    """Build the fleet's resources from the seed (in one fixed order: the random stream depends on it)."""
    b = _Builder(cfg, pricing)
    gpu_resources = [b.training_host(i) for i in range(cfg.training_hosts)]
    gpu_resources += [b.notebook(i) for i in range(cfg.notebooks)]
    gpu_resources += [b.inference(i) for i in range(cfg.inference_endpoints)]
    cpu_resources = [b.etl_instance(i) for i in range(cfg.cpu_instances)]
    stores = [b.bucket(i) for i in range(cfg.buckets)] + [b.vector_db(i) for i in range(cfg.vector_dbs)]
    return Fleet(cfg, b.end, gpu_resources, cpu_resources, stores, b)


def simulate(cfg: SimConfig, pricing: Pricing) -> tuple[Iterator[Record], list[Label]]:
    """Build the fleet; return its records in send order (lazily) and the labels."""
    fleet = build(cfg, pricing)
    b, gpu_resources, stores = fleet.builder, fleet.gpu_resources, fleet.stores
    streams: list[Iterator[Record]] = []
    for res in gpu_resources:
        streams.append(_gpu_records(res, cfg, random.Random(f"{cfg.seed}-{res.resource_id}")))
        streams.append(_batched(_usage_records(res, cfg, b.end), cfg.usage_flush_s))
    for res in fleet.cpu_resources:
        streams.append(_batched(_usage_records(res, cfg, b.end), cfg.usage_flush_s))
    streams += [_storage_records(store, cfg, b.end, pricing.storage_usd_per_gb_month) for store in stores]
    streams.append(iter(sorted(b.runs, key=lambda r: r[0])))
    merged = delivered(streams, cfg, "delivery")
    untagged = (_untagged_label(res, cfg, b.end) for res in gpu_resources)
    labels = b.labels + b.run_labels() + [label for label in untagged if label is not None]
    # Each part the config adds is delivered apart (its own random streams) and merged by send
    # time, so the rest of the fleet's records are byte for byte those of a fleet without it.
    from detector.simulate_training import training_fleet  # it builds on this module's labels

    added = ((cfg.k8s_nodes, _k8s_fleet), (cfg.choices, _choices), (cfg.serving_endpoints, _serving_fleet),
             (cfg.training_jobs, training_fleet), (cfg.cpu_notebooks, _cpu_notebook_fleet))  # fmt: skip
    for count, part in added:
        if count:
            records, part_labels = part(cfg, pricing, b.end)
            merged = heapq.merge(merged, records, key=_send_order)
            labels += part_labels
    return merged, sorted(labels, key=lambda label: (label.start, label.resource_id))


_send_order = itemgetter(0, 1, 2)
"""A record's place in send order: (send time, topic, key)."""


def delivered(streams: Iterable[Iterator[Record]], cfg: SimConfig, name: str) -> Iterator[Record]:
    """The streams' records merged in send order and delivered as ``cfg`` says: messily (duplicates,
    delays) from a random stream of their own, ``{seed}-{name}``."""
    merged: Iterator[Record] = heapq.merge(*streams, key=_send_order)
    if cfg.duplicate_p or cfg.delay_s:
        merged = _messy_delivery(merged, cfg, random.Random(f"{cfg.seed}-{name}"))
    return merged


def _k8s_fleet(cfg: SimConfig, pricing: Pricing, end: float) -> tuple[Iterator[Record], list[Label]]:
    """The Kubernetes nodes' records (GPU samples, one message per scrape as the bridge sends them,
    and billing usage) and labels."""
    from detector import simulate_k8s  # it builds on this module's labels

    streams: list[Iterator[Record]] = []
    labels: list[Label] = []
    for node in simulate_k8s.k8s_nodes(cfg.k8s_nodes, cfg.seed, cfg.start, end, cfg.scrape_s, pricing):
        rng = random.Random(f"{cfg.seed}-{node.instance_id}")
        streams.append(simulate_k8s.k8s_records(node, cfg.start, end, cfg.scrape_s, rng, cfg.drop_p, cfg.jitter_s))
        streams.append(_batched(_usage_records(_k8s_resource(node, cfg, end), cfg, end), cfg.usage_flush_s))
        labels += simulate_k8s.k8s_labels(node, cfg.start, end, cfg.scrape_s)
    return delivered(streams, cfg, "k8s-delivery"), labels


def _cpu_notebook_fleet(cfg: SimConfig, pricing: Pricing, end: float) -> tuple[Iterator[Record], list[Label]]:
    """The CPU notebooks' usage records (their own random streams) and labels."""
    from detector.simulate_notebooks import cpu_notebooks  # it builds on this module's labels

    streams, labels = cpu_notebooks(cfg.cpu_notebooks, cfg.seed, cfg.start, end, cfg.usage_interval_s, cfg.usage_flush_s,
                                    pricing)  # fmt: skip
    return delivered(streams, cfg, "notebook-delivery"), labels


def _choices(cfg: SimConfig, pricing: Pricing, end: float) -> tuple[Iterator[Record], list[Label]]:
    """The region and build-or-call workloads' records (their own random streams) and labels."""
    from detector import simulate_regions  # it builds on this module's labels

    workloads = simulate_regions.choice_workloads(cfg.choices, cfg.seed, cfg.start, end, pricing)
    records = delivered((simulate_regions.choice_records(w) for w in workloads), cfg, "regions-delivery")
    return records, simulate_regions.choice_labels(workloads, pricing)


def _serving_fleet(cfg: SimConfig, pricing: Pricing, end: float) -> tuple[Iterator[Record], list[Label]]:
    """The serving endpoints' records and labels, from their own random streams (the rest of the
    fleet is unchanged by their presence)."""
    from detector import simulate_serving  # it builds on this module's labels

    endpoints = simulate_serving.serving_endpoints(cfg.serving_endpoints, cfg.seed, cfg.start, end, pricing)
    streams = [simulate_serving.serving_records(ep, max(cfg.scrape_s, 60.0), cfg.usage_flush_s,
                                                random.Random(f"{cfg.seed}-serving-{ep.resource_id}"))
               for ep in endpoints]  # fmt: skip
    return delivered(streams, cfg, "serving-delivery"), [label for ep in endpoints
                                                         for label in simulate_serving.serving_labels(ep)]


def _k8s_resource(node: Any, cfg: SimConfig, end: float) -> _Resource:
    """A Kubernetes node as the cloud bills it: a GPU instance running throughout, its cost on its usage events."""
    return _Resource(node.instance_id, "gpu_instance", node.instance_type, node.gpus, node.gpu_model,
                     node.max_power, node.tags, "ml-prod-0", node.zone[:-1], node.hourly, send_cost=True,
                     segments=[_Segment(cfg.start, end, "running")])  # fmt: skip
