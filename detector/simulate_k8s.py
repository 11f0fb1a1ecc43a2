"""Shared Kubernetes GPU nodes for the simulator: pods holding some of a node's GPUs.

A node (an 8-GPU ``p4d.24xlarge`` or ``p5.48xlarge`` with an instance id and a node
name) runs all day; its GPUs are split into groups, and each group is held in turn by
pods of one kind:

- training ``Job`` pods, busy for hours with few-minute dips between epochs (short
  idle spells: hard negatives); some pods then sit idle holding their GPUs (the process
  finished, the container sleeps); when a pod ends its GPUs are either requested again
  within minutes (a hard negative) or left to no pod for hours;
- notebook ``StatefulSet`` pods (one GPU): bursts of work in office hours with pauses,
  then left running idle overnight, or deleted at night so their GPU is requested by
  nobody;
- inference ``Deployment`` pods serving around the clock; some stall for an hour or
  more (idle, still holding their GPUs).

One node kind in four has every pod go quiet together for an hour or two once a day:
the whole host idle, which is ``idle_gpu``'s (labelled so, as for any host).

Labels come from the per-GPU timeline, sample by sample, the way the label types
define them (and ``partly_idle_gpu`` / ``unallocated_gpu`` are documented to behave,
detector/detectors/gpu_share.py):

- ``idle_gpu``: every GPU of the host idle (held by a pod or not) for 31 minutes or more;
- ``partly_idle_gpu``: a GPU held by a pod and idle for 30 minutes (its idle run starts
  at its first idle sample; another pod starts a new run) counts, at a sample when some
  GPU of the host works; the host's episode lasts while a GPU counts, and an ``idle_gpu``
  spell ends it where the spell starts (a shorter whole-host idle spell it waits through;
  after an ``idle_gpu`` spell every idle run starts again where work resumes, so a GPU
  idle through it counts 30 minutes later). Dollars: each GPU's
  share of the host price over its idle run's time while another GPU worked, its time
  before it counted included; never a whole-host idle hour;
- ``unallocated_gpu``: the same for GPUs no pod holds.

Samples look like a stock dcgm-exporter's in Kubernetes mode after the bridge has
mapped them: ``util_pct``, memory, power and the default profiling fields
(``gr_engine_active``, ``tensor_active``, ``dram_active``), never ``sm_active`` (off
by default); the node name as ``hostname``; the holding pod's namespace, name,
container, controller and ownership labels, and ``allocated``. One message per scrape
of a node, as the bridge publishes them.
"""

from __future__ import annotations

import bisect
import random
import string
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from detector.events import TOPIC_GPU_METRICS
from detector.pricing import Pricing, usd_over
from detector.simulate import Label
from detector.units import rfc3339

__all__ = ["GPU_FIELDS", "GpuSpan", "K8sNode", "Pod", "k8s_labels", "k8s_nodes", "k8s_sample"]

NODE_TYPES = [
    # instance type, dcgm-exporter's modelName, peak power (W), framebuffer (MiB)
    ("p4d.24xlarge", "NVIDIA A100-SXM4-40GB", 400.0, 40960.0),
    ("p5.48xlarge", "NVIDIA H100 80GB HBM3", 700.0, 81559.0),
]
NODE_GPUS = 8
ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]
NODE_TAGS = {"team": "ml-platform", "project": "gpu-pool", "owner": "kai", "env": "prod", "cluster": "ml-prod"}
TEAMS = [
    ("nlp", ["llm-pretrain", "summarizer"], ["alice", "bogdan", "chen"]),
    ("vision", ["detector-v3", "segmentation"], ["dana", "emeka"]),
    ("recsys", ["ranker", "two-tower"], ["farah", "gus"]),
    ("research", ["rl-agents", "diffusion"], ["hiro", "ines", "jamal"]),
]
MIN_EPISODE_S = 1800.0 + 60.0
"""A labelled episode lasts 31 minutes or more, so a sample past the detectors' 30 minutes exists."""
IDLE = ("idle", "dip")
"""Modes of a GPU a pod holds while nothing runs on it."""
BUSY = ("busy", "serving")
POWER_SHARE = {"busy": 0.8, "serving": 0.45, "idle": 0.15, "dip": 0.15, "free": 0.1}
"""A GPU's mean draw in each mode, as a share of its peak (samples vary by 5 % around it)."""
FOR_S = 1800.0
"""How long a GPU is idle before its idle time is an episode (the rules' ``for``)."""
GPU_FIELDS = ("util_pct", "mem_used_mib", "mem_total_mib", "power_w", "gr_engine_active", "tensor_active",
              "dram_active")  # fmt: skip
"""The measurements a sample carries (``sm_active`` is absent, as in dcgm-exporter's defaults)."""


@dataclass(frozen=True)
class Pod:
    """A pod holding GPUs: what dcgm-exporter labels a GPU with, and kube-state-metrics knows of it."""

    namespace: str
    name: str
    container: str
    workload: str
    """``Kind/name`` of its controller: ``Job/…``, ``Deployment/…``, ``StatefulSet/…``."""
    labels: tuple[tuple[str, str], ...]
    """Ownership labels (team, owner, project), as the pod carries them."""
    uid: str
    gpus: int
    """GPUs it requests (``nvidia.com/gpu``)."""
    mem_mib: float
    """Framebuffer its process holds, busy or idle."""
    replicaset: str = ""
    """The ReplicaSet between a Deployment and its pod (kube_pod_owner names it)."""

    @property
    def tags(self) -> dict[str, str]:
        return dict(self.labels)


@dataclass
class GpuSpan:
    start: float
    end: float
    mode: str
    """busy | dip | idle | serving | free (no pod holds the GPU)."""
    pod: Pod | None = None


@dataclass
class K8sNode:
    """One Kubernetes GPU node and what each of its GPUs does over the simulated time."""

    instance_id: str
    node_name: str
    zone: str
    instance_type: str
    gpu_model: str
    max_power: float
    mem_total_mib: float
    hourly: float
    gpu_uuids: list[str]
    spans: list[list[GpuSpan]] = field(default_factory=list)
    """Per GPU, spans covering the simulated time in order."""
    tags: dict[str, str] = field(default_factory=lambda: dict(NODE_TAGS))
    _starts: list[list[float]] = field(default_factory=list, repr=False)

    @property
    def gpus(self) -> int:
        return len(self.gpu_uuids)

    @property
    def provider_id(self) -> str:
        return f"aws:///{self.zone}/{self.instance_id}"

    def pci_bus_id(self, gpu: int) -> str:
        return f"00000000:{0x10 * (gpu // 2 + 1):02X}:{0x1C + gpu % 2:02X}.0"

    def span_at(self, gpu: int, t: float) -> GpuSpan | None:
        """What GPU ``gpu`` does at ``t``; None outside the simulated time."""
        if len(self._starts) != len(self.spans):
            self._starts = [[s.start for s in spans] for spans in self.spans]
        i = bisect.bisect_right(self._starts[gpu], t) - 1
        if i < 0:
            return None
        span = self.spans[gpu][i]
        return span if t < span.end else None

    def energy_mj(self, gpu: int, t: float) -> float:
        """Energy GPU ``gpu`` drew from the first span to ``t`` at its modes' mean power, in mJ
        (what dcgm-exporter's energy counter counts)."""
        joules = 0.0
        for span in self.spans[gpu]:
            if span.start >= t:
                break
            joules += self.max_power * POWER_SHARE[span.mode] * (min(span.end, t) - span.start)
        return joules * 1000.0

    def pods_at(self, t: float) -> list[Pod]:
        """The pods holding GPUs of this node at ``t``, each once."""
        pods: dict[str, Pod] = {}
        for gpu in range(self.gpus):
            span = self.span_at(gpu, t)
            if span is not None and span.pod is not None:
                pods.setdefault(span.pod.uid, span.pod)
        return list(pods.values())


def k8s_sample(node: K8sNode, gpu: int, span: GpuSpan, t: float, rng: random.Random) -> dict[str, Any]:
    """One GPU's measurements at ``t`` (the fields of :data:`GPU_FIELDS`), drawn for its mode."""
    mode = span.mode
    if mode == "busy":
        util, gr = rng.uniform(70, 100), rng.uniform(0.6, 0.95)
        tensor, dram, power = rng.uniform(0.25, 0.7), rng.uniform(0.3, 0.65), POWER_SHARE[mode]
    elif mode == "serving":
        day = 8 <= datetime.fromtimestamp(t, tz=timezone.utc).hour < 20
        util = rng.uniform(35, 60) if day else rng.uniform(15, 40)
        gr = util / 100 * rng.uniform(0.85, 1.0)
        tensor, dram, power = gr * rng.uniform(0.2, 0.4), gr * rng.uniform(0.3, 0.6), POWER_SHARE[mode]
    elif mode == "free":  # no process: nothing resident
        util = gr = tensor = dram = 0.0
        power = POWER_SHARE[mode]
    else:  # idle or dip: the pod's process holds its memory and does nothing
        util, gr = rng.uniform(0, 2.5), rng.uniform(0, 0.015)
        tensor, dram, power = rng.uniform(0, 0.002), rng.uniform(0, 0.01), POWER_SHARE[mode]
    mem = span.pod.mem_mib if span.pod is not None else 0.0
    return {
        "util_pct": round(util, 1), "mem_used_mib": mem, "mem_total_mib": node.mem_total_mib,
        "power_w": round(node.max_power * power * rng.uniform(0.95, 1.05), 1),
        "gr_engine_active": round(gr, 3), "tensor_active": round(tensor, 3), "dram_active": round(dram, 3),
    }  # fmt: skip


def k8s_event(node: K8sNode, gpu: int, span: GpuSpan, t: float, stamp: str, rng: random.Random) -> dict[str, Any]:
    """A ``gpu-metrics`` event as the bridge makes it from a dcgm-exporter sample of this GPU."""
    event: dict[str, Any] = {
        "ts": stamp, "resource_id": node.instance_id, "gpu_index": gpu, "gpu_uuid": node.gpu_uuids[gpu],
        "model": node.gpu_model, **k8s_sample(node, gpu, span, t, rng), "hostname": node.node_name,
    }  # fmt: skip
    pod = span.pod
    if pod is not None:
        event.update(namespace=pod.namespace, pod=pod.name, container=pod.container, workload=pod.workload,
                     allocated=True, tags=pod.tags)  # fmt: skip
    else:
        event["allocated"] = False
    return event


def k8s_records(node: K8sNode, start: float, end: float, scrape_s: float, rng: random.Random,
                drop_p: float = 0.0, jitter_s: float = 0.0) -> Iterator[tuple[float, str, str, Any]]:  # fmt: skip
    """One message per scrape of the node, all its GPUs, sent when scraped (as the bridge does)."""
    t = start
    while t < end:
        if drop_p and rng.random() < drop_p:
            t += scrape_s
            continue
        stamp = rfc3339(t + rng.uniform(-jitter_s, jitter_s)) if jitter_s else rfc3339(t)
        events = []
        for gpu in range(node.gpus):
            span = node.span_at(gpu, t)
            if span is not None:
                events.append(k8s_event(node, gpu, span, t, stamp, rng))
        if events:
            yield (t, TOPIC_GPU_METRICS, node.instance_id, events)
        t += scrape_s


class _NodeBuilder:
    """Builds the GPU groups of one node; every draw comes from ``rng``, so a seed gives one fleet."""

    def __init__(self, rng: random.Random, start: float, end: float, scrape_s: float, names: set[str]) -> None:
        self.rng, self.start, self.end, self.scrape_s = rng, start, end, scrape_s
        self.names = names
        """Notebook StatefulSets of the cluster: one name each."""

    def minutes(self, lo: float, hi: float) -> float:
        return round(self.rng.uniform(lo, hi) * 60 / self.scrape_s) * self.scrape_s

    def suffix(self, n: int = 5) -> str:
        return "".join(self.rng.choice(string.ascii_lowercase + string.digits) for _ in range(n))

    def owner(self) -> tuple[str, str, str]:
        team, projects, owners = self.rng.choice(TEAMS)
        return team, self.rng.choice(projects), self.rng.choice(owners)

    def pod(self, kind: str, gpus: int, mem_mib: float, owner: tuple[str, str, str] | None = None) -> Pod:
        team, project, person = owner or self.owner()
        labels = (("team", team), ("owner", person), ("project", project))
        uid = _uuid(self.rng)
        if kind == "job":
            job = f"{project}-train-{self.suffix(4)}"
            return Pod(team, f"{job}-{self.suffix()}", "trainer", f"Job/{job}", labels, uid, gpus, mem_mib)
        if kind == "notebook":
            sts = f"nb-{person}"
            n = 1
            while sts in self.names:
                n += 1
                sts = f"nb-{person}-{n}"
            self.names.add(sts)
            return Pod(team, f"{sts}-0", "notebook", f"StatefulSet/{sts}", labels, uid, gpus, mem_mib)
        rs = f"{project}-serving-{self.suffix(9)}"
        return Pod(team, f"{rs}-{self.suffix()}", "server", f"Deployment/{project}-serving", labels, uid, gpus,
                   mem_mib, replicaset=rs)  # fmt: skip

    def add(self, spans: list[GpuSpan], t: float, length: float, mode: str, pod: Pod | None) -> float:
        end = min(t + length, self.end)
        if end > t:
            spans.append(GpuSpan(t, end, mode, pod))
        return end

    def jobs(self, gpus: int, mem: float, long_free_p: float, idle_tail_p: float, quick: bool) -> list[GpuSpan]:
        """Training pods one after another; between them the GPUs are free for minutes
        (``quick``), for none at all, or (``long_free_p``) for hours."""
        spans: list[GpuSpan] = []
        t = self.start
        while t < self.end:
            pod = self.pod("job", gpus, mem)
            run_end = min(t + self.minutes(90, 300), self.end)
            while t < run_end:  # epochs with short dips between them
                t = self.add(spans, t, min(self.minutes(35, 90), run_end - t), "busy", pod)
                if t < run_end and self.rng.random() < 0.7:
                    t = self.add(spans, t, self.minutes(2, 6), "dip", pod)
            if self.rng.random() < idle_tail_p:  # the job's process is done, its pod sleeps holding the GPUs
                t = self.add(spans, t, self.minutes(45, 150), "idle", pod)
            if self.rng.random() < long_free_p:  # nobody requests them for hours
                t = self.add(spans, t, self.minutes(90, 240), "free", None)
            elif quick:  # the next pod is scheduled within minutes
                t = self.add(spans, t, self.minutes(0.5, 5), "free", None)
        return spans

    def notebook(self, mem: float, deleted_at_night_p: float) -> list[GpuSpan]:
        """One person's notebook: bursts of work in office hours; overnight left idle, or
        deleted (its GPU then held by no pod) and recreated in the morning."""
        spans: list[GpuSpan] = []
        owner = self.owner()
        pod = first = self.pod("notebook", 1, mem, owner)
        t = self.start
        while t < self.end:
            if 9 <= datetime.fromtimestamp(t, tz=timezone.utc).hour < 18:
                t = self.add(spans, t, self.minutes(10, 45), "busy", pod)
                t = self.add(spans, t, self.minutes(3, 20), "idle", pod)
                continue
            morning = _next_morning(t)
            if self.rng.random() < deleted_at_night_p:
                t = self.add(spans, t, morning - t, "free", None)
                pod = replace(first, uid=_uuid(self.rng))  # recreated by its StatefulSet: a new pod uid
            else:
                t = self.add(spans, t, morning - t, "idle", pod)
        return spans

    def serving(self, gpus: int, mem: float, stall_p: float) -> list[GpuSpan]:
        """An inference pod serving all day; with ``stall_p`` it stalls (idle) for 1-3 hours now and then."""
        spans: list[GpuSpan] = []
        pod = self.pod("serving", gpus, mem)
        t = self.start
        while t < self.end:
            t = self.add(spans, t, self.minutes(5 * 60, 16 * 60), "serving", pod)
            if self.rng.random() < stall_p:
                t = self.add(spans, t, self.minutes(60, 180), "idle", pod)
        return spans


def _uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _next_morning(t: float) -> float:
    day = datetime.fromtimestamp(t, tz=timezone.utc).replace(hour=9, minute=0, second=0, microsecond=0)
    morning = day.timestamp()
    return morning if morning > t else morning + 86_400


def _quiet(spans: list[GpuSpan], a: float, b: float) -> list[GpuSpan]:
    """``spans`` with every pod idle over [a, b) (GPUs no pod holds stay free)."""
    out: list[GpuSpan] = []
    for s in spans:
        if s.end <= a or s.start >= b or s.mode == "free":
            out.append(s)
            continue
        if s.start < a:
            out.append(GpuSpan(s.start, a, s.mode, s.pod))
        out.append(GpuSpan(max(s.start, a), min(s.end, b), "idle", s.pod))
        if s.end > b:
            out.append(GpuSpan(b, s.end, s.mode, s.pod))
    return out


def k8s_nodes(n: int, seed: int, start: float, end: float, scrape_s: float, pricing: Pricing) -> list[K8sNode]:
    """``n`` nodes, drawn from their own random stream so that adding them leaves the rest
    of a simulated fleet as it was."""
    rng = random.Random(f"{seed}-k8s")
    nodes = []
    names: set[str] = set()
    for i in range(n):
        itype, model, power, mem_total = NODE_TYPES[i % len(NODE_TYPES)]
        uuids = [f"GPU-{_uuid(rng)}" for _ in range(NODE_GPUS)]
        node = K8sNode(f"i-0{rng.getrandbits(64):016x}", f"ip-10-0-{rng.randint(0, 255)}-{rng.randint(1, 254)}.ec2.internal",
                       ZONES[i % len(ZONES)], itype, model, power, mem_total, pricing.hourly(itype) or 32.0, uuids)  # fmt: skip
        b = _NodeBuilder(rng, start, end, scrape_s, names)
        big, small = 0.7 * mem_total, 0.3 * mem_total
        kind = i % 4
        if kind == 0:  # training beside serving and two notebooks
            groups = [(4, b.jobs(4, big, 0.0, 0.25, quick=True)), (2, b.serving(2, small, 0.0)),
                      (1, b.notebook(small, 0.5)), (1, b.notebook(small, 0.0))]  # fmt: skip
        elif kind == 1:  # two training groups; GPUs of one are sometimes left to nobody for hours
            groups = [(4, b.jobs(4, big, 0.0, 0.0, quick=True)), (4, b.jobs(4, big, 0.4, 0.0, quick=True))]
        elif kind == 2:  # one team's node: pods are replaced at once, and all go quiet together daily
            groups = [(4, b.jobs(4, big, 0.0, 0.3, quick=False)), (2, b.jobs(2, big, 0.0, 0.3, quick=False)),
                      (1, b.notebook(small, 0.0)), (1, b.notebook(small, 0.0))]  # fmt: skip
        else:  # serving, some of it stalling, and four notebooks
            groups = [(2, b.serving(2, small, 0.0)), (2, b.serving(2, small, 0.7))] + [
                (1, b.notebook(small, 0.5 if j % 2 else 0.0)) for j in range(4)]  # fmt: skip
        for size, spans in groups:
            node.spans += [spans] * size
        if kind == 2:
            day = start
            while day < end:
                quiet_from = day + b.minutes(2 * 60, 20 * 60)
                quiet_to = quiet_from + b.minutes(60, 120)
                node.spans = [_quiet(spans, quiet_from, quiet_to) for spans in node.spans]
                day += 86_400
        nodes.append(node)
    return nodes


def k8s_labels(node: K8sNode, start: float, end: float, scrape_s: float) -> list[Label]:
    """Ground truth of one node, from its per-GPU timeline sampled at its scrapes (see the module docstring)."""
    times: list[float] = []
    t = start
    while t < end:
        times.append(t)
        t += scrape_s
    spans = [[node.span_at(g, t) or GpuSpan(t, t, "free") for t in times] for g in range(node.gpus)]
    labels: list[Label] = []
    busy = [any(spans[g][k].mode in BUSY for g in range(node.gpus)) for k in range(len(times))]
    handover = [False] * len(times)
    """Samples of a whole-host idle spell long enough to be ``idle_gpu``'s."""
    for a, b in _runs([not x for x in busy]):
        t0, t1 = times[a], min(times[b] + scrape_s, end)
        if t1 - t0 >= MIN_EPISODE_S:
            labels.append(Label("idle_gpu", node.instance_id, t0, t1, node.hourly, "every pod on the node idle"))
            handover[a : b + 1] = [True] * (b + 1 - a)
    for rule_type, wanted in (("partly_idle_gpu", IDLE), ("unallocated_gpu", ("free",))):
        labels += _share_labels(rule_type, wanted, node, times, spans, busy, handover, end, scrape_s)
    return labels


@dataclass
class _Run:
    """One GPU's idle run, as the label types define it."""

    key: tuple[str, str] | None = None
    start: float = 0.0
    counted: bool = False
    pending_usd: float = 0.0
    pending_from: float | None = None


def _share_labels(rule_type: str, wanted: tuple[str, ...], node: K8sNode, times: list[float],
                  spans: list[list[GpuSpan]], busy: list[bool], handover: list[bool], end: float,
                  scrape_s: float) -> list[Label]:  # fmt: skip
    """Host-level episodes of GPUs in ``wanted`` modes while another GPU works.

    A GPU's idle run starts at its first sample in a wanted mode (a new pod, or a GPU taken or
    released, starts a new one) and counts once it has lasted :data:`FOR_S`, at a sample when
    some GPU of the host works. An episode lasts while a GPU counts; a whole-host idle spell
    that is ``idle_gpu``'s ends it where the spell starts (a shorter one it waits through), and
    the runs start again where work resumes.
    Dollars: each run's share of the host over its time while some GPU worked, the time
    before it counted included.
    """
    share = node.hourly / node.gpus
    runs = [_Run() for _ in range(node.gpus)]
    labels: list[Label] = []
    episode: Label | None = None
    born = -1

    def close(at: float) -> None:
        nonlocal episode
        if episode is not None:
            episode.end = at
            what = "idle in the pods holding them" if rule_type == "partly_idle_gpu" else "held by no pod"
            episode.note = f"GPUs {', '.join(map(str, episode.gpus))} of {node.gpus} {what}"
            episode.usd_per_hour = share * len(episode.gpus)
            labels.append(episode)
            episode = None

    for k, t in enumerate(times):
        for g, run in enumerate(runs):
            span = spans[g][k]
            key = (span.mode if span.mode != "dip" else "idle", span.pod.uid if span.pod else "")
            key_or_none = key if span.mode in wanted else None
            if key_or_none != run.key:
                runs[g] = run = _Run(key_or_none, t)
        if handover[k] and (k == 0 or not handover[k - 1]):
            close(t)
            for run in runs:
                run.counted = False
        if k > 0 and handover[k - 1] and not handover[k]:
            # After an idle_gpu spell the idle runs start again where work resumes: a job's GPUs
            # starting minutes apart are not partly idle (nor is their time before the spell).
            for run in runs:
                if run.key is not None:
                    run.start, run.pending_usd, run.pending_from = max(run.start, t), 0.0, None
        if busy[k]:
            for g, run in enumerate(runs):
                if run.key is not None and not run.counted and t - run.start >= FOR_S:
                    run.counted = True
                    if episode is None:
                        episode, born = Label(rule_type, node.instance_id, t, end, 0.0, usd=0.0), k
                    if born == k:  # GPUs counting from the sample the episode starts at: their idle time is its start
                        episode.start = min(episode.start, run.pending_from or t)
                    episode.usd = (episode.usd or 0.0) + run.pending_usd
                    if g not in episode.gpus:
                        episode.gpus = sorted([*episode.gpus, g])
                    run.pending_usd, run.pending_from = 0.0, None
        if episode is not None and not any(run.counted for run in runs):
            close(t)
        if busy[k]:
            step = min(scrape_s, end - t)
            for run in runs:
                if run.key is None:
                    continue
                if run.counted and episode is not None:
                    episode.usd = (episode.usd or 0.0) + usd_over(share, step)
                else:
                    run.pending_usd += usd_over(share, step)
                    run.pending_from = t if run.pending_from is None else run.pending_from
    close(end)
    return labels


def _runs(flags: list[bool]) -> Iterator[tuple[int, int]]:
    """(first, last) indices of each run of True."""
    a = None
    for k, flag in enumerate(flags):
        if flag and a is None:
            a = k
        elif not flag and a is not None:
            yield a, k - 1
            a = None
    if a is not None:
        yield a, len(flags) - 1
