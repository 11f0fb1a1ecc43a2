"""A small stored fleet with one incident of each charted type, and the gallery of its charts.

``python -m detector.charts.gallery --out docs/gallery`` (``make gallery``) stores the fleet's
events in an embedded ClickHouse, draws each incident's chart exactly as the worker would
(:func:`detector.charts.render_chart`) and writes one PNG per chart. The same scenes feed
the picture tests (tests/test_chart_pictures.py), so what the docs show is what is tested.
Events are made here, from a seed, in event time: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detector.alerts import Alert, alert_id
from detector.events import DAY_S, GpuMetric, RunEvent, UsageEvent

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["DIGEST", "DIGEST_DAY", "HOSTILE", "SCENES", "Scene", "detect", "gallery", "scene", "store_fortnight",
           "store_scene"]

T0 = datetime(2026, 11, 2, tzinfo=timezone.utc).timestamp()
HOUR = 3600.0
MIN = 60.0
RULES = Path(__file__).resolve().parents[2] / "rules"
"""The shipped rules (a checkout's ``rules/``)."""
TAGS = {"team": "nlp", "owner": "alice", "project": "llm-pretrain"}
HOSTILE = "$HOME <@U123> *bold* $x$ \u202eevil\u202c 🔥 " + "i-" + "0" * 300 + "\nnext line"
"""An id no chart may choke on: mathtext dollars, a Slack mention, markdown, RTL override,
emoji, 300 characters and a newline."""


@dataclass
class Scene:
    """One incident and the events it was found in. ``alert`` is written here in the shape
    its detector writes; :func:`scene` with a rule set replaces it by what the detectors
    actually make of the events (``detected``), as the worker would."""

    name: str
    alert: Alert
    events: list[Any] = field(default_factory=list)
    detected: bool = False


def _at(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=timezone.utc)


def _alert(type_: str, rid: str, start: float, fired: float, end: float, resolved: bool, usd: float, per_hour: float,
           details: dict[str, Any], tags: dict[str, str] | None = None) -> Alert:  # fmt: skip
    return Alert(alert_id=alert_id(type_, rid, start), type=type_, rule=type_.replace("_", "-"),
                 resource_id=rid, status="resolved" if resolved else "firing", change="fired", severity="warning",
                 episode_start=start, fired_at=fired, updated_at=end, resolved_at=end if resolved else None,
                 waste_usd=usd, usd_per_hour=per_hour, tags=dict(TAGS) if tags is None else tags, details=details)  # fmt: skip


def _usage(t: float, rid: str, usd_per_hour: float | None = 32.77, interval: float = 60.0, rtype: str = "gpu_instance",
           state: str = "running", tags: dict[str, str] | None = None, instance_type: str = "p4d.24xlarge",
           **kw: Any) -> UsageEvent:  # fmt: skip
    return UsageEvent(ts=_at(t), resource_id=rid, resource_type=rtype, instance_type=instance_type, account="ml-prod",
                      region="us-east-1", state=state, interval_s=interval,  # type: ignore[arg-type]
                      cost_usd=None if usd_per_hour is None else usd_per_hour * interval / HOUR,
                      tags=tags if tags is not None else dict(TAGS), **kw)  # fmt: skip


def _host(rid: str, start: float, end: float, step: float, util: Callable[[int, float], float], gpus: int = 8,
          work: Callable[[int, float], float | None] | None = None, allocated: Callable[[int], bool | None] | None = None,
          tags: dict[str, str] | None = None, usd_per_hour: float = 32.77, mem_mib: float = 30000.0,
          **usage: Any) -> list[Any]:  # fmt: skip
    """A GPU host's samples every ``step`` and its usage every ``step`` (at least a minute)."""
    events: list[Any] = []
    t = start
    while t < end:
        events.append(_usage(t, rid, usd_per_hour=usd_per_hour, interval=max(step, 60.0), tags=tags, **usage))
        for g in range(gpus):
            u = max(0.0, min(100.0, util(g, t)))
            dram = work(g, t) if work is not None else None
            events.append(GpuMetric(ts=_at(t), resource_id=rid, gpu_index=g, model="A100", util_pct=u,
                                    mem_used_mib=mem_mib if u > 5 else 900.0, mem_total_mib=40960.0,
                                    power_w=90 + 3 * u, dram_active=dram,
                                    allocated=allocated(g) if allocated is not None else None))  # fmt: skip
        t += step
    return events


def _noise(seed: str) -> Callable[[float], float]:
    rng = random.Random(seed)
    return lambda scale: rng.gauss(0.0, scale)


# -- the scenes ------------------------------------------------------------------------------------------


def idle_gpu(span: float = 5 * HOUR, rid: str = "i-0a1b2c3d4e5f60718") -> Scene:
    """A training host left idle after its job, for ``span``, then stopped."""
    before = max(2 * HOUR, span * 0.4)
    start, end = T0 + before, T0 + before + span
    n = _noise("idle")
    step = max(30.0, (span + before) / 300)

    def util(g: int, t: float) -> float:
        return 86 + n(6) if t < start else 0.3 + abs(n(0.4))

    return Scene("idle_gpu", _alert("idle_gpu", rid, start, start + min(1800, span / 2), end, True, 32.77 * span / HOUR,
                                    32.77, {"gpu_count": 8, "gpu_model": "A100", "util_below_pct": 5.0}),
                 [*_host(rid, T0, end, step, util), _usage(end, rid, state="stopped", interval=step)])  # fmt: skip


def partly_idle_gpu(rid: str = "i-0b2c3d4e5f6071829", gpus: int = 8) -> Scene:
    """A host of eight running a three-GPU job: five GPUs idle for hours (of ``gpus``: all
    but the first three)."""
    start, end = T0 + 2 * HOUR, T0 + 8 * HOUR
    n = _noise("partly")
    idle = list(range(3, gpus))

    def util(g: int, t: float) -> float:
        if t >= start and g in idle:
            return 0.5 + abs(n(0.5))
        return 78 + n(8) + 6 * math.sin(t / 900 + g)

    rate = 32.77 * len(idle) / gpus
    details = {"gpu_count": gpus, "gpu_model": "A100", "gpus_idle": idle, "util_below_pct": 5.0}
    return Scene("partly_idle_gpu", _alert("partly_idle_gpu", rid, start, start + 1800, end, False, rate * 6, rate, details),
                 _host(rid, T0, end, 120.0, util, gpus=gpus))  # fmt: skip


def unallocated_gpu(rid: str = "gke-train-pool-7f3a-node-2") -> Scene:
    """A Kubernetes node of four GPUs where pods requested two."""
    start, end = T0 + 1 * HOUR, T0 + 4 * HOUR
    n = _noise("unalloc")

    def util(g: int, t: float) -> float:
        return 0.2 + abs(n(0.3)) if g >= 2 and t >= start else 64 + n(10)

    return Scene("unallocated_gpu", _alert("unallocated_gpu", rid, start, start + 1800, end, False, 16.38 * 3, 16.38,
                                           {"gpu_count": 4, "gpu_model": "A100", "gpus_idle": [2, 3], "util_below_pct": 5.0}),
                 _host(rid, T0, end, 60.0, util, gpus=4, allocated=lambda g: g < 2))  # fmt: skip


def stuck_gpu(rid: str = "i-0c3d4e5f607182930") -> Scene:
    """A job hung in a collective: utilisation 100 %, DRAM idle, for 80 minutes, then killed."""
    start, end = T0 + 2 * HOUR, T0 + 2 * HOUR + 80 * MIN
    n = _noise("stuck")

    def util(g: int, t: float) -> float:
        return 100.0 if t >= start else 88 + n(5)

    def dram(g: int, t: float) -> float:
        return 0.00001 if t >= start else max(0.0, min(1.0, 0.35 + n(0.05)))

    return Scene("stuck_gpu", _alert("stuck_gpu", rid, start, start + 20 * MIN, end, True, 32.77 * 80 / 60, 32.77,
                                     {"gpu_count": 8, "gpu_model": "A100", "util_above_pct": 90.0}),
                 _host(rid, T0, end, 60.0, util, work=dram))  # fmt: skip


def inference_overprovisioned(rid: str = "endpoint/chat-small-prod") -> Scene:
    """An endpoint on four GPUs whose busiest hour stays under a quarter."""
    start, end = T0 + DAY_S, T0 + 2 * DAY_S
    n = _noise("inference")

    def util(g: int, t: float) -> float:
        hour = (t % DAY_S) / HOUR
        return 9 + 9 * math.sin(math.pi * (hour - 6) / 12) + n(2)

    details = {"suggested_instance_type": "g5.xlarge", "suggested_gpu_model": "A10G", "suggested_usd_per_hour": 1.0,
               "saving_usd_per_hour": 4.67, "gpu_mem_peak_gb": 11.2, "util_p95_pct": 22, "util_p95_below_pct": 30}  # fmt: skip
    return Scene("inference_overprovisioned",
                 _alert("inference_overprovisioned", rid, start, start, end, False, 4.666 * 24, 4.666, details),
                 _host(rid, T0, end, 300.0, util, gpus=4, usd_per_hour=5.672, mem_mib=11000.0,
                       rtype="inference_endpoint", instance_type="g5.12xlarge"))  # fmt: skip


def egress_runaway(rid: str = "i-0etl5e6f70819203a") -> Scene:
    """A sync loop copying to another region at twenty times the usual rate for two hours."""
    start, end = T0 + 20 * HOUR, T0 + 22 * HOUR
    n = _noise("egress")
    events = []
    t = T0
    while t < end + HOUR:
        usual = 2.0 + 0.8 * math.sin(2 * math.pi * t / DAY_S) + n(0.2)
        rate = 90 + n(6) if start <= t < end else usual  # GB/h
        events.append(_usage(t, rid, usd_per_hour=0.68, interval=300.0, rtype="cpu_instance", instance_type="c6i.4xlarge",
                             egress_bytes=int(max(rate, 0.1) * 1e9 * 300 / HOUR), dest_region="eu-west-1"))  # fmt: skip
        t += 300
    details = {"destination": "inter_region", "dest_region": "eu-west-1", "excess_gb": 176.0, "rate_gb_per_hour": 90.0,
               "baseline_gb_per_hour": 2.1, "usd_per_gb": 0.02, "multiple": 5.0}  # fmt: skip
    return Scene("egress_runaway", _alert("egress_runaway", rid, start, start + 15 * MIN, end, True, 3.52, 1.76, details),
                 events)  # fmt: skip


def vector_db_growth(rid: str = "qdrant/prod-embeddings") -> Scene:
    """A vector database filling its 10 TB, hourly ingestion batches."""
    events = []
    t, size = T0, 6.2e12
    while t < T0 + 4 * DAY_S:
        events.append(_usage(t, rid, usd_per_hour=None, interval=900.0, rtype="vector_db", instance_type="",
                             storage_bytes=int(size), capacity_bytes=int(10e12)))  # fmt: skip
        t += 900
        size += 330e9 / 96 * (3.0 if int(t / HOUR) % 6 == 0 else 0.6)
    fired = T0 + 3 * DAY_S
    details = {"size_gb": size / 1e9, "growth_gb_per_day": 330.0, "growth_pct_per_day": 4.5, "capacity_gb": 10000.0,
               "fill_pct": 100 * size / 10e12, "days_to_full": (10e12 - size) / 330e9, "forecast_full": ""}  # fmt: skip
    return Scene("vector_db_growth", _alert("vector_db_growth", rid, fired - DAY_S / 2, fired, T0 + 4 * DAY_S, False, 0.0,
                                            0.0, details), events)  # fmt: skip


def storage_growth(rid: str = "s3://ml-checkpoints-prod") -> Scene:
    """A checkpoint bucket that only grows: 800 GB a day, no lifecycle rule."""
    events = []
    t, size = T0, 38e12
    while t < T0 + 10 * DAY_S:
        events.append(_usage(t, rid, usd_per_hour=None, interval=HOUR, rtype="storage_bucket", instance_type="",
                             storage_bytes=int(size)))
        t += HOUR
        size += 800e9 / 24 * (4 if int(t / HOUR) % 24 == 3 else 0.85)
    now = size / 1e9 * 0.023
    details = {"size_gb": size / 1e9, "growth_gb_per_day": 800.0, "usd_per_gb_month": 0.023, "monthly_usd_now": now,
               "monthly_usd_in_30d": now + 30 * 800 * 0.023, "monthly_usd_in_90d": now + 90 * 800 * 0.023}  # fmt: skip
    return Scene("storage_growth", _alert("storage_growth", rid, T0 + 7 * DAY_S, T0 + 8 * DAY_S, T0 + 10 * DAY_S, False, 0.0,
                                          now / 730, details), events)  # fmt: skip


def failed_run_spend(rid: str = "run-7f3a9c-llama-70b-sft") -> Scene:
    """A nine-hour run on two hosts that failed with an NCCL timeout."""
    start, failed = T0 + HOUR, T0 + 10 * HOUR
    hosts = ["i-0train1a2b3c4d5e", "i-0train2b3c4d5e6f"]
    events: list[Any] = [RunEvent(ts=_at(start), run_id=rid, status="started", resource_ids=hosts, gpu_count=16,
                                  project="llm-pretrain", tags=dict(TAGS))]  # fmt: skip
    for h in hosts:
        t = T0
        while t < failed + HOUR:
            events.append(_usage(t, h, interval=300.0))
            t += 300
    events.append(RunEvent(ts=_at(failed), run_id=rid, status="failed", resource_ids=hosts, gpu_count=16,
                           project="llm-pretrain", tags=dict(TAGS), error="NCCL timeout in allreduce"))  # fmt: skip
    usd = 2 * 32.77 * 9
    details = {"run_id": rid, "project": "llm-pretrain", "owner": "alice", "error": "NCCL timeout in allreduce",
               "status": "failed", "gpu_hours": 144.0, "resource_ids": hosts, "run_s": 9 * HOUR, "min_usd": 20.0}  # fmt: skip
    return Scene("failed_run_spend", _alert("failed_run_spend", rid, start, failed, failed, False, usd, usd / 9, details),
                 events)  # fmt: skip


def crash_loop(project: str = "llm-eval") -> Scene:
    """A job retried by its scheduler: five runs failing within minutes, over three hours."""
    runs: list[dict[str, Any]] = []
    for k in range(5):
        s = T0 + k * 40 * MIN
        runs.append({"run_id": f"eval-{k}", "start": s, "end": s + (9 + 2 * k) * MIN, "usd": 32.77 * (9 + 2 * k) / 60,
                     "resource_ids": ["i-0eval"]})  # fmt: skip
    total = sum(r["usd"] for r in runs)
    details = {"crash_loop": True, "project": project, "failed_runs": 5, "run_ids": [r["run_id"] for r in runs],
               "errors": ["ImportError: flash_attn"], "gpu_hours": 11.7, "runs": runs}  # fmt: skip
    events: list[Any] = []
    t = T0 - 10 * MIN
    while t < runs[-1]["end"] + 10 * MIN:
        events.append(_usage(t, "i-0eval", interval=300.0))
        t += 300
    tags = {**TAGS, "project": project}
    for r in runs:
        events.append(RunEvent(ts=_at(r["start"]), run_id=r["run_id"], status="started", resource_ids=["i-0eval"],
                               gpu_count=8, project=project, tags=tags))  # fmt: skip
        events.append(RunEvent(ts=_at(r["end"]), run_id=r["run_id"], status="failed", resource_ids=["i-0eval"],
                               gpu_count=8, project=project, tags=tags, error="ImportError: flash_attn"))  # fmt: skip
    return Scene("failed_run_spend-crash_loop",
                 _alert("failed_run_spend", f"project/{project}", T0, runs[2]["end"], runs[-1]["end"], False, total,
                        total * HOUR / (runs[-1]["end"] - T0), details), sorted(events, key=lambda e: e.ts))  # fmt: skip


def untagged(rid: str = "i-0notag9f8e7d6c5b4", tags: dict[str, str] | None = None) -> Scene:
    """A GPU host that lost its team and project tags and has run six days since."""
    start = T0 + 3 * DAY_S
    events = []
    t = T0
    n = _noise("untagged")
    while t < T0 + 9 * DAY_S:
        running = (t % DAY_S) / HOUR < 20 or t >= start  # stopped at night while it was tagged
        tagged = t < start
        events.append(_usage(t, rid, usd_per_hour=32.77 * (1 + n(0.02)), interval=HOUR,
                             state="running" if running else "stopped",
                             tags=dict(TAGS) if tagged else (tags if tags is not None else {"owner": "bob"})))  # fmt: skip
        t += HOUR
    return Scene("untagged", _alert("untagged", rid, start, start + HOUR, T0 + 9 * DAY_S, False, 32.77 * 24 * 6, 32.77,
                                    {"missing_tags": ["team", "project"], "untagged_s": 6 * DAY_S},
                                    tags=tags if tags is not None else {"owner": "bob"}), events)  # fmt: skip


def unused_commitment(rid: str = "sp-0a1b2c3d4e5f") -> Scene:
    """A Savings Plan used fully until the team moved to spot: a third unused for four days."""
    events = []
    start = T0 + 6 * DAY_S
    for k in range(10):
        day = T0 + k * DAY_S
        unused = 26.0 if day < start else 290.0
        events.append(_usage(day, rid, usd_per_hour=unused / 24, interval=DAY_S, rtype="commitment", instance_type="",
                             metrics={"commitment_used_usd": 840.0 - unused}))  # fmt: skip
    details = {"commitment_type": "savings_plan", "commitment_name": "Compute SP 1yr (ml-prod)", "day": "2026-11-11",
               "day_used_usd": 550.0, "day_unused_usd": 290.0, "unused_share": 0.345, "days": 4, "used_usd": 2200.0}  # fmt: skip
    return Scene("unused_commitment", _alert("unused_commitment", rid, start, start + 2 * DAY_S, T0 + 10 * DAY_S, False,
                                             4 * 290.0, 290.0 / 24, details), events)  # fmt: skip


def anomaly(rid: str = "i-0anom7a8b9c0d1e2") -> Scene:
    """A host whose power and egress jump while utilisation stays normal (a stolen GPU mining?)."""
    start, end = T0 + 8 * HOUR, T0 + 10 * HOUR
    n = _noise("anomaly")
    events: list[Any] = []
    t = T0
    while t < end + HOUR:
        odd = start <= t < end
        events.append(_usage(t, rid, interval=300.0, egress_bytes=int((14 if odd else 0.5 + abs(n(0.1))) * 1e9 * 300 / HOUR),
                             dest_region="internet"))  # fmt: skip
        for g in range(8):
            u = 60 + n(8)
            events.append(GpuMetric(ts=_at(t), resource_id=rid, gpu_index=g, model="A100", util_pct=max(0, min(100, u)),
                                    power_w=(385 if odd else 240) + n(12), mem_used_mib=30000, mem_total_mib=40960))  # fmt: skip
        t += 300
    stands_out = [
        {"feature": "egress_gb_per_hour", "about": "egress_bytes per hour", "value": 14.0, "usual": 0.6,
         "usual_range": [0.35, 0.95], "deviation": 8.0},
        {"feature": "power_per_util", "about": "power per GPU over (utilisation + 5 %)", "value": 5.9, "usual": 3.7,
         "usual_range": [3.2, 4.2], "deviation": 6.1},
        {"feature": "gpu_util_mean", "about": "mean util_pct over every GPU sample", "value": 60.0, "usual": 61.0,
         "usual_range": [50.0, 72.0], "deviation": 0.2},
    ]  # fmt: skip
    details = {"score": 0.7132, "threshold": 0.6418, "evidence": 4.21, "budget": 3.0, "windows": 6,
               "stands_out": stands_out, "model_group": "gpu"}  # fmt: skip
    return Scene("anomaly", _alert("anomaly", rid, start, start + 30 * MIN, end, True, 32.77 * 2, 32.77, details), events)


SCENES: dict[str, Callable[[], Scene]] = {
    "idle_gpu": idle_gpu, "partly_idle_gpu": partly_idle_gpu, "unallocated_gpu": unallocated_gpu,
    "stuck_gpu": stuck_gpu, "inference_overprovisioned": inference_overprovisioned,
    "egress_runaway": egress_runaway, "vector_db_growth": vector_db_growth, "storage_growth": storage_growth,
    "failed_run_spend": failed_run_spend, "failed_run_spend-crash_loop": crash_loop, "untagged": untagged,
    "unused_commitment": unused_commitment, "anomaly": anomaly,
}  # fmt: skip
"""Gallery name → its scene (one per chart type; the crash loop is a second picture of failed runs)."""


DIGEST = "digest"
"""The gallery's picture of the digest (not an alert's chart: :func:`store_fortnight`)."""
DIGEST_DAY = T0 + 13 * DAY_S
"""The day the gallery's digest is of: the last of a stored fortnight."""


def store_fortnight(store: Any) -> float:
    """Store a team's fortnight of incidents (their hosts' usage and the alerts' changes) and
    return the last day, whose digest :func:`gallery` draws as the worker would
    (:func:`detector.digest.build_digests` from the ledger, then its chart). Idle hosts most
    days, an ETL host's egress running away for two days, an untagged notebook all along, and on
    the last day a stuck host that burns all day and stays open."""
    from detector.store import EventBatch

    n = _noise("digest")
    rates = {"i-train-a": 32.77, "i-train-b": 32.77, "i-etl-c": 4.1, "nb-untagged-d": 3.06, "i-stuck-e": 32.77}
    batch = EventBatch()
    batch.extend([_usage(T0 + h * HOUR, rid, usd_per_hour=rate, interval=HOUR, tags={} if rid.startswith("nb") else None)
                  for rid, rate in rates.items() for h in range(14 * 24)])  # fmt: skip
    store.events.insert(batch)
    changes: list[Alert] = []

    def episode(type_: str, rid: str, start: float, hours: float, details: dict[str, Any] | None = None,
                resolved: bool = True, tags: dict[str, str] | None = None) -> None:  # fmt: skip
        end, rate = start + hours * HOUR, rates[rid]
        a = _alert(type_, rid, start, start, end, resolved, rate * hours, rate, details or {"reason": "gpu_busy"},
                   tags)  # fmt: skip
        fired = _alert(type_, rid, start, start, start, False, 0.0, rate, a.details, tags)
        a.change, fired.change = ("resolved" if resolved else "updated"), "fired"
        changes.extend([fired, a])

    for k in range(14):
        day = T0 + k * DAY_S
        if k % 7 not in (5, 6):  # idle after each weekday's runs, stopped in the morning
            episode("idle_gpu", "i-train-a", day + 18 * HOUR, 5 + 3 * abs(n(1.0)))
        if k % 3 == 0:
            episode("idle_gpu", "i-train-b", day + 20 * HOUR, 2 + abs(n(1.0)))
        if k in (6, 7):
            episode("egress_runaway", "i-etl-c", day + 3 * HOUR, 20)
    episode("untagged", "nb-untagged-d", T0, 14 * 24 - 1, resolved=False, tags={})
    episode("stuck_gpu", "i-stuck-e", DIGEST_DAY + 30 * MIN, 23, resolved=False)
    store.alerts.record(changes, version=1)
    return DIGEST_DAY


def scene(name: str, ruleset: Any = None) -> Scene:
    """The scene ``name``; with a :class:`~detector.rules.RuleSet`, its alert is the one the
    rules make of its events (the latest state of it), where they make one."""
    s = SCENES[name]()
    if ruleset is not None and s.events:
        found = detect(s, ruleset)
        if found is not None:
            s.alert, s.detected = found, True
    return s


def detect(s: Scene, ruleset: Any) -> Alert | None:
    """The alert the detectors make of the scene's events, for its type and resource, as of
    its latest finding (None: they make none)."""
    from detector.alerts import from_finding
    from detector.engine import Engine

    findings = Engine(ruleset).process(sorted(s.events, key=lambda e: e.ts))
    mine = [f for f in findings if f.type == s.alert.type and f.resource_id == s.alert.resource_id]
    if not mine:
        return None
    alert = from_finding(mine[-1])
    alert.change = "fired"
    return alert


def store_scene(store: Any, s: Scene) -> None:
    """Write a scene's events to ``store`` (a :class:`detector.store.Store`)."""
    from detector.store import EventBatch

    if not s.events:
        return
    batch = EventBatch()
    batch.extend(s.events)
    store.events.insert(batch)


def gallery(store: Any, out: Path, names: list[str] | None = None, figures: dict[str, Any] | None = None,
            ruleset: Any = None) -> list[Path]:  # fmt: skip
    """Store each scene, draw its chart and write ``out/<name>.png``, and the digest of a stored
    fortnight as ``out/digest.png`` (:func:`store_fortnight`); the paths written.
    ``ruleset``: draw what its rules detect in each scene (:func:`scene`). ``figures``: where
    to keep each drawn figure by name (the picture tests measure them)."""
    from detector.charts import draw_chart, style

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names or [*SCENES, DIGEST]:
        if name == DIGEST:
            from detector.charts.digest import digest_figure
            from detector.digest import build_digests

            (digest,) = build_digests(store.digests, store_fortnight(store))
            fig: Figure | None = digest_figure(digest)
        else:
            s = scene(name, ruleset)
            store_scene(store, s)
            fig = draw_chart(s.alert, store)
        if fig is None:
            raise RuntimeError(f"no chart for the {name} scene")
        path = out / f"{name}.png"
        path.write_bytes(style.png(fig))
        written.append(path)
        if figures is not None:
            figures[name] = fig
    return written


def main(argv: list[str] | None = None, store: Any = None) -> int:
    """``python -m detector.charts.gallery --out docs/gallery``: the gallery from an in-memory
    store (``store``: one already open, as in a test: chdb allows one engine per process)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--out", type=Path, default=Path("docs/gallery"))
    p.add_argument("--rules", type=Path, default=RULES, help="the rules whose alerts are drawn (default: the shipped rules/)")
    known = [*SCENES, DIGEST]
    p.add_argument("names", nargs="*", metavar="NAME", help=f"scenes to draw (default: all of {', '.join(known)})")
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in known]
    if unknown:
        p.error(f"no scene {', '.join(unknown)} (there are: {', '.join(known)})")
    client = None
    if store is None:
        from detector.store import Store, connect

        client = connect("chdb://memory")
        store = Store(client, database="gallery")
        store.migrate()
    from detector.rules import load_rules

    ruleset = load_rules(args.rules)
    try:
        for path in gallery(store, args.out, args.names or None, ruleset=ruleset):
            print(f"{path} ({path.stat().st_size // 1024} KB)")
    finally:
        if client is not None:
            client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
