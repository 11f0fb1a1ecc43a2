"""The per-scrape view the GPU rules share, and the rules' short way through the usual scrape."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from itertools import groupby

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from detector import engine as engine_module
from detector.detectors.activity import busy, busy_flags, resident, resident_shares
from detector.detectors.base import Context, ResourceInfo
from detector.detectors.scrape import FIRST, Scrape
from detector.engine import Engine
from detector.events import GpuMetric, UsageEvent
from detector.floats import enc_hook
from detector.rules import load_rules
from tests.conftest import ROOT
from tests.helpers import T0, at, usage

GPUS = 8


def sample(t: float, index: int, util: float, model: str = "A100", **fields) -> GpuMetric:
    return GpuMetric(ts=at(t), resource_id="host-1", model=model, gpu_index=index, util_pct=util, **fields)


def test_a_scrape_answers_what_every_rule_asks_of_its_samples():
    samples = [sample(T0, 0, 95.0), sample(T0, 1, 1.0, gr_engine_active=0.97), sample(T0, 2, 1.0, dram_active=0.2)]
    scrape = Scrape(samples)
    assert scrape.gpus is FIRST[3]  # GPUs 0..n-1 in order: the one tuple every host holds
    assert scrape.model == "A100" and scrape.plain and scrape.holders_unknown
    assert scrape.busy(5.0) == tuple(busy(ev, 5.0) for ev in samples) == (True, True, True)
    assert scrape.busy(50.0) == (True, True, False)  # a threshold of its own
    assert scrape.busy(5.0) is scrape.busy(5.0)  # worked out once
    assert scrape.resident() == tuple(resident(ev) for ev in samples) == (95.0, 97.0, 1.0)

    other = Scrape([sample(T0, 1, 1.0), sample(T0, 0, 1.0, model="H100")])
    assert other.gpus == (1, 0) and other.model is None  # out of order; models that differ
    assert not Scrape([sample(T0, 0, 1.0, allocated=False)]).plain
    podded = Scrape([sample(T0, 0, 1.0, pod="p", namespace="ns")])
    assert podded.holders_unknown and not podded.plain  # a pod named, nobody said to hold the GPU
    assert not Scrape([sample(T0, 0, 1.0, mig_instance="1", mig_profile="1g.10gb")]).plain


_holder = st.fixed_dictionaries({}, optional={"allocated": st.sampled_from([None, True, False]),
                                              "pod": st.sampled_from(["", "p"]), "mig_instance": st.sampled_from(["", "1"]),
                                              "model": st.sampled_from(["A100", "H100", ""])})  # fmt: skip


@given(st.lists(_holder, max_size=6))
def test_a_scrapes_flags_are_what_each_of_its_samples_says(fields):
    """The flags as they read, sample by sample (the one pass over the usual scrape, and the count of
    models equal to the first, give the same): any mix of holders, pods, MIG instances and models."""
    samples = [sample(T0, i, 1.0, **f) for i, f in enumerate(fields)]
    scrape = Scrape(samples)
    models = {s.model for s in samples}
    assert scrape.model == (models.pop() if len(models) == 1 else None)
    assert scrape.holders_unknown == ({s.allocated for s in samples} == {None})
    assert scrape.pods_named == any(s.pod for s in samples) and scrape.mig == any(s.mig_instance for s in samples)
    assert scrape.plain == (scrape.holders_unknown and not scrape.pods_named and not scrape.mig)


@st.composite
def _scrape_at_edges(draw: st.DrawFn) -> tuple[list[GpuMetric], float]:
    """A threshold, and samples whose utilisation and profiling ratios sit on it, just either side of
    it, anywhere, or (the ratios) are missing."""
    threshold = draw(st.sampled_from([0.0, 5.0, 50.0, 100.0]) | st.floats(0, 100))
    ratio = threshold / 100
    near = st.sampled_from([ratio, math.nextafter(ratio, 0), math.nextafter(ratio, 2)]) | st.floats(0, 1)
    util = st.sampled_from([threshold, math.nextafter(threshold, 0), math.nextafter(threshold, 200)]) | st.floats(0, 100)
    fields = st.fixed_dictionaries({}, optional={name: near for name in
                                                 ("gr_engine_active", "sm_active", "tensor_active", "dram_active")})  # fmt: skip
    samples = draw(st.lists(st.builds(lambda u, f: sample(T0, 0, u, **f), util, fields), max_size=10))
    return samples, threshold


@given(_scrape_at_edges())
def test_a_scrapes_flags_and_shares_are_each_samples(case):
    """The scrape-wide comprehensions answer exactly what the per-sample definitions do, at the
    thresholds' edges and with any profiling ratio missing."""
    samples, threshold = case
    assert busy_flags(samples, threshold) == tuple(busy(ev, threshold) for ev in samples)
    assert all(type(flag) is bool for flag in busy_flags(samples, threshold))
    assert resident_shares(samples) == tuple(resident(ev) for ev in samples)


def scrapes() -> list[tuple[float, list[GpuMetric]]]:
    """An 8-GPU host every 30 s, in phases (steps of 30 s) that make every GPU rule move: all busy;
    GPU 0 busy, GPU 1 busy every other 40 minutes, the rest idle (``partly_idle_gpu``); a silence
    of 6 minutes (a telemetry gap); every GPU hung, resident at low power (``stuck_gpu``); the whole
    host idle (``idle_gpu``); a silence of 70 minutes (the units forgotten); every GPU bursting
    and waiting by turns (``data_starved_training``); the partly idle host again."""
    out, t = [], T0
    for step in range(560):
        t += 30
        if step in (100, 300):
            t += 360 if step == 100 else 4200
        partly = [95.0, 95.0 if step // 80 % 2 else 1.0] + [1.0] * (GPUS - 2)
        if step < 6:
            utils = [95.0] * GPUS
        elif step < 100 or 280 <= step < 300 or step >= 440:
            utils = partly
        elif step < 200:
            utils = [100.0] * GPUS
        elif step < 280:
            utils = [1.0] * GPUS
        else:
            utils = [95.0 if step % 2 else 2.0] * GPUS
        hung = 100 <= step < 200
        out.append((t, [GpuMetric(ts=at(t), resource_id="host-1", model="A100", gpu_index=g, util_pct=u,
                                  power_w=60.0 if hung or u < 50 else 300.0) for g, u in enumerate(utils)]))  # fmt: skip
    return out


@pytest.mark.parametrize("rule_type", ["partly_idle_gpu", "idle_gpu", "stuck_gpu", "data_starved_training",
                                       "telemetry_stale"])  # fmt: skip
def test_the_usual_scrape_keeps_what_the_sample_by_sample_way_keeps(rule_type):
    """The usual scrape (GPUs 0..n-1 in order, nothing new) takes a rule's short way; the same
    samples in another order take the way of any scrape, sample by sample. Both leave the same
    state and make the same findings (only the sample a finding is credited to may differ)."""
    detector = next(r.detector for r in load_rules(ROOT / "rules").rules if r.detector.type == rule_type)
    ctx = Context(ResourceInfo(resource_id="host-1", resource_type="gpu_instance", state="running",
                               usd_per_hour=32.0, gpus=GPUS))  # fmt: skip
    usual, shuffled = detector.new_state(), detector.new_state()
    found_usual, found_shuffled = [], []
    for n, (t, samples) in enumerate(scrapes()):
        found_usual += [f for _, f in detector.step_scrape(usual, ctx, Scrape(samples), t)]
        other = samples if n == 0 else samples[3:] + samples[:3]  # (the first, in order: the same GPUs' places)
        found_shuffled += [f for _, f in detector.step_scrape(shuffled, ctx, Scrape(other), t)]
    assert found_usual == found_shuffled
    assert msgspec.msgpack.encode(usual, enc_hook=enc_hook) == msgspec.msgpack.encode(shuffled, enc_hook=enc_hook)
    if rule_type != "telemetry_stale":  # (a host that always reports never fires it)
        assert found_usual, "the sequence should make findings of this rule"


PODS = [
    {"namespace": "nlp", "pod": "llm-train-0cv5-zf6zj", "container": "trainer", "workload": "Job/llm-train-0cv5",
     "tags": {"team": "nlp", "owner": "chen", "project": "llm", "pod-template-hash": "x1"}},
    {"namespace": "research", "pod": "nb-ana-0", "container": "notebook", "workload": "StatefulSet/nb-ana",
     "tags": {"team": "research", "notebook-name": "nb-ana"}},
    {"namespace": "serving", "pod": "api-7f9c-k2x", "container": "server", "workload": "Deployment/api",
     "tags": {"app": "api"}},
    {"namespace": "serving", "pod": "api-7f9c-k2x", "container": "server", "workload": "Deployment/api",
     "tags": {"app": "api", "team": "infra"}},  # the same pod, relabelled
]  # fmt: skip
"""Pods that hold GPUs, as dcgm-exporter's Kubernetes mode and the bridge label the samples."""


def kubernetes_host(seed: int) -> list[tuple[str, float, list[GpuMetric]]]:
    """A random Kubernetes node, MIG or not: ``("scrape", t, samples)`` and ``("stop" | "start", t, [])``.
    Its GPUs' holders mostly stay as they were (the usual scrape), and flap: a unit taken by another pod,
    released, unknown for a scrape, the same pod across every GPU, a pod relabelled. Phases make
    every GPU rule move (all idle, all hung, some idle, all busy); besides, scrapes with a GPU missing,
    a unit twice (another holder first), in another order, read again or late, silences of 6 and
    70 minutes, stops."""
    rng = random.Random(seed)
    gpus = rng.choice([1, 2, 4, 8])
    mig = rng.random() < 0.4
    units = [(g, str(m) if mig and split else "") for g in range(gpus)
             for split in [rng.random() < 0.7] for m in range(1, (rng.randint(2, 3) if mig and split else 1) + 1)]  # fmt: skip

    def anyone() -> dict:
        r = rng.random()
        if r < 0.6:
            return {**rng.choice(PODS), "allocated": True}
        if r < 0.8:
            return {"allocated": False}
        return {"allocated": None} if r < 0.9 else {**rng.choice(PODS), "allocated": None}

    holders = {u: anyone() for u in units}
    activity = {u: "idle" for u in units}
    out: list[tuple[str, float, list[GpuMetric]]] = []
    t, stopped, phase = T0, False, "mixed"
    for step in range(400):
        t += 30
        r = rng.random()
        if r < 0.01:
            t += 360 if rng.random() < 0.7 else 4200
        if step % 80 == 0:
            phase = rng.choice(["mixed", "idle", "hung", "busy", "mixed", "mixed"])
        if phase != "mixed":
            activity = dict.fromkeys(units, phase)
        elif rng.random() < 0.2:
            activity[rng.choice(units)] = rng.choice(["idle", "busy", "idle"])
        r = rng.random()
        if r < 0.06:
            holders[rng.choice(units)] = anyone()
        elif r < 0.065:
            holders = dict.fromkeys(units, {**rng.choice(PODS), "allocated": True})  # one pod across the node
        elif r < 0.09:
            unknown = rng.choice(units)
            samples_holders = {**holders, unknown: {k: v for k, v in holders[unknown].items() if k != "allocated"}}
        if not (0.065 <= r < 0.09):
            samples_holders = holders
        if rng.random() < 0.02:
            stopped = not stopped
            out.append(("stop" if stopped else "start", t, []))
        samples = []
        for g, instance in units:
            state = activity[(g, instance)]
            util = {"idle": 1.0, "busy": 95.0, "hung": 100.0}[state]
            fields = {"mig_instance": instance, "mig_profile": "2g.20gb", "gr_engine_active": util / 100} if instance else {}
            samples.append(GpuMetric(ts=at(t), resource_id="host-1", model="A100", gpu_index=g,
                                     util_pct=0.0 if instance else util, power_w=300.0 if state == "busy" else 60.0,
                                     dram_active=0.3 if state == "busy" else 0.0, **fields,
                                     **samples_holders[(g, instance)]))  # fmt: skip
        r = rng.random()
        if r < 0.03:
            del samples[rng.randrange(len(samples))]
        elif r < 0.06:
            twice = rng.randrange(len(samples))
            samples.insert(twice, msgspec.structs.replace(samples[twice], **{**anyone(), "util_pct": 97.0}))
        elif r < 0.08:
            rng.shuffle(samples)
        out.append(("scrape", t, samples))
        r = rng.random()
        if r < 0.03:
            out.append(("scrape", t, samples))  # read again
        elif r < 0.05 and len(out) > 4:
            out.append(out[-4])  # late
    return out


def both_ways(fast, slow, host: list[tuple[str, float, list[GpuMetric]]]) -> Iterator[list]:
    """A host's scrapes, stops and starts through a rule as it is (``fast``) and as it is kept from its
    short way (``slow``): after every event the same findings, credited to the same samples, and the
    same state. Yields each scrape's findings once both agree."""
    info = {"resource_id": "host-1", "resource_type": "gpu_instance", "usd_per_hour": 32.0, "gpus": 8}
    running = Context(ResourceInfo(state="running", **info))
    stopped = Context(ResourceInfo(state="stopped", **info))
    states = fast.new_state(), slow.new_state()
    ctx = running
    for kind, t, samples in host:
        if kind != "scrape":
            ctx = stopped if kind == "stop" else running
            usage = UsageEvent(ts=at(t), resource_id="host-1", resource_type="gpu_instance", state=ctx.resource.state)
            assert fast.step(states[0], ctx, usage, t) == slow.step(states[1], ctx, usage, t)
            continue
        got = [d.step_scrape(st, ctx, Scrape(samples), t) for d, st in zip((fast, slow), states, strict=True)]
        assert got[0] == got[1], t
        assert msgspec.msgpack.encode(states[0], enc_hook=enc_hook) == msgspec.msgpack.encode(states[1], enc_hook=enc_hook)
        yield got[0]


@pytest.mark.parametrize("rule_type", ["idle_gpu", "stuck_gpu", "partly_idle_gpu", "unallocated_gpu"])
def test_the_usual_kubernetes_scrape_keeps_what_the_sample_by_sample_way_keeps(rule_type, monkeypatch):
    """Random Kubernetes nodes (MIG or not, holders flapping) through a rule as it is, and through the
    same rule kept from its short way (its ``_usual`` says no to every scrape): at every scrape
    the same findings, credited to the same samples, and the same state."""
    fast, slow = (next(r.detector for r in load_rules(ROOT / "rules").rules if r.detector.type == rule_type)
                  for _ in range(2))  # fmt: skip
    usual = fast._usual
    taken: list[bool] = []
    monkeypatch.setattr(fast, "_usual", lambda st, scrape: taken.append(usual(st, scrape)) or taken[-1], raising=False)
    monkeypatch.setattr(slow, "_usual", lambda st, scrape: False, raising=False)
    findings = 0
    for seed in range(24):
        for found in both_ways(fast, slow, kubernetes_host(seed)):
            findings += len(found)
    assert findings, "the nodes should make findings of this rule"
    assert sum(taken) > len(taken) / 4, "the short way should be taken often (not MIG in gpu_share)"


def test_the_engine_folds_each_run_of_one_hosts_samples_at_one_time_as_one_scrape(monkeypatch):
    """The engine finds a scrape's samples by guessing its size (the host's GPUs by its instance type,
    8 here once its usage is known; else the latest scrape's) and checking the guess; whatever the
    sizes before (larger, smaller, a host's samples split by another's or by a usage event at the
    same time), each run of one host's samples at one time is one scrape, as a scan item by item
    finds it."""
    seen: list[list[GpuMetric]] = []

    class Spy(Scrape):
        def __init__(self, samples: list[GpuMetric]) -> None:
            seen.append(list(samples))
            super().__init__(samples)

    monkeypatch.setattr(engine_module, "Scrape", Spy)
    rng = random.Random(7)
    items: list[tuple[float, object]] = []
    for step in range(300):
        t = T0 + 30 * (step // 6)
        host = rng.choice(["a", "b", "c"])
        if rng.random() < 0.1:
            items.append((t, usage(t, rid=host)))
            continue
        for g in range(rng.choice([1, 2, 3, 8, 8, 8])):
            items.append((t, msgspec.structs.replace(sample(t, g, 50.0), resource_id=host)))
    expected = [[ev for _, ev in run] for (_, kind, _), run in
                ((k, list(g)) for k, g in groupby(items, key=lambda item: (item[0], type(item[1]), item[1].resource_id)))
                if kind is GpuMetric]  # fmt: skip
    Engine(load_rules(ROOT / "rules")).process_timed(items)
    assert seen == expected
    assert {len(run) for run in seen} >= {1, 2, 8, 16}  # (two runs of one host back to back are one)


HOSTILE = ["", "team", "\x00", "ns/pod", "a" * 256, "ünïcødé ☃", "team=x,owner=y", " ", "None"]
"""Label keys and values a producer may send: empty, separators, NUL, long, unicode, look-alikes."""


def churning_host(seed: int) -> list[tuple[str, float, list[GpuMetric]]]:
    """:func:`kubernetes_host` with what it lacks: pods relabelled under the same name (owner labels
    and others), a new pod name on every scrape for a while (thousands of distinct pods, past the
    table of :func:`~detector.detectors.pods.pod_of`), hostile label strings, a GPU split into MIG
    instances and made whole again, and a GPU index twice with the same holder."""
    rng = random.Random(1000 + seed)
    out = []
    churn = 0
    for kind, t, samples in kubernetes_host(seed):
        if kind == "scrape" and samples:
            r = rng.random()
            new = []
            for ev in samples:
                if not ev.pod:
                    new.append(ev)
                    continue
                if r < 0.3:  # a fresh pod per unit (a Job per step)
                    churn += 1
                    ev = msgspec.structs.replace(ev, pod=f"{ev.pod}-{churn}")
                elif r < 0.4:  # relabelled, the name kept
                    tags = dict(ev.tags)
                    tags[rng.choice(["team", "pod-template-hash", "owner", rng.choice(HOSTILE) or "x"])] = rng.choice(HOSTILE)
                    ev = msgspec.structs.replace(ev, tags=tags)
                elif r < 0.45:  # the same labels in another order
                    ev = msgspec.structs.replace(ev, tags=dict(reversed(list(ev.tags.items()))))
                new.append(ev)
            r = rng.random()
            if r < 0.05:  # GPU 0 made whole (its instances' first sample stands for it), or split
                first = new[0]
                whole = [ev for ev in new if ev.gpu_index != 0]
                if first.mig_instance:
                    new = [msgspec.structs.replace(first, mig_instance="", mig_profile=""), *whole]
                else:
                    new = [msgspec.structs.replace(first, mig_instance=str(m), mig_profile="1g.10gb") for m in (1, 2)] + new[1:]
            elif r < 0.08:  # a GPU twice, the same holder
                twice = rng.randrange(len(new))
                new.insert(twice + 1, new[twice])
            samples = new
        out.append((kind, t, samples))
    return out


@pytest.mark.parametrize("rule_type", ["idle_gpu", "stuck_gpu", "partly_idle_gpu", "unallocated_gpu"])
def test_churning_hostile_kubernetes_nodes_keep_what_the_sample_by_sample_way_keeps(rule_type, monkeypatch):
    """As above on nodes whose pods churn (past the shared pods' table), are relabelled, carry hostile
    labels, and whose GPUs move between MIG and whole: the short way keeps what the long way keeps."""
    from detector.detectors import pods as pods_module

    fast, slow = (next(r.detector for r in load_rules(ROOT / "rules").rules if r.detector.type == rule_type)
                  for _ in range(2))  # fmt: skip
    monkeypatch.setattr(slow, "_usual", lambda st, scrape: False, raising=False)
    pods_module._PODS.clear()
    for i in range(pods_module._MAX_PODS - 100):  # a worker that has seen nearly as many pods
        pods_module.pod_of(sample(T0, 0, 1.0, namespace="seen", pod=f"pod-{i}"))
    cleared, held = 0, len(pods_module._PODS)
    for seed in range(24):
        for _ in both_ways(fast, slow, churning_host(seed)):  # (only scrapes add pods: held is the size before this one)
            cleared += len(pods_module._PODS) < held
            held = len(pods_module._PODS)
    assert cleared and len(pods_module._PODS) <= pods_module._MAX_PODS  # (the table started afresh, and is bounded)
