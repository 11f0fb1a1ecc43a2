"""The simulator's shared Kubernetes GPU nodes: events as a stock dcgm-exporter in Kubernetes
mode gives them (through the bridge), labels computed from the per-GPU timeline, and a fleet
otherwise unchanged by their presence."""

from __future__ import annotations

import json

import pytest

from detector.backtest import backtest
from detector.events import TOPIC_GPU_METRICS, EventDecoder, GpuMetric
from detector.pricing import usd_over
from detector.simulate import SimConfig, simulate
from detector.simulate_k8s import GpuSpan, K8sNode, Pod, k8s_labels, k8s_nodes
from tests.helpers import MIN, T0, fleet_file

HOUR = 3600.0
SMALL = {"hours": 6.0, "training_hosts": 3, "notebooks": 2, "inference_endpoints": 1, "buckets": 1, "vector_dbs": 1,
         "cpu_instances": 1, "seed": 3}  # fmt: skip


def _node(spans: list[list[GpuSpan]], hourly: float = 32.0) -> K8sNode:
    node = K8sNode("i-0abc", "ip-10-0-1-2.ec2.internal", "us-east-1a", "p4d.24xlarge", "NVIDIA A100-SXM4-40GB", 400.0,
                   40960.0, hourly, [f"GPU-{g}" for g in range(len(spans))])  # fmt: skip
    node.spans = spans
    return node


def _pod(name: str, gpus: int = 1) -> Pod:
    return Pod("nlp", name, "trainer", f"Job/{name}", (("team", "nlp"), ("owner", "alice"), ("project", "llm")),
               f"uid-{name}", gpus, 20000.0)  # fmt: skip


def _spans(*parts: tuple[float, str, Pod | None]) -> list[GpuSpan]:
    """Consecutive spans from T0: (minutes, mode, pod)."""
    out, t = [], T0
    for minutes, mode, pod in parts:
        out.append(GpuSpan(t, t + minutes * MIN, mode, pod))
        t += minutes * MIN
    return out


def _records(cfg: SimConfig, ruleset, skip: set[str] = frozenset()) -> list[str]:
    records, _ = simulate(cfg, ruleset.pricing)
    return [json.dumps(r, sort_keys=True, default=str) for r in records if r[2] not in skip]


@pytest.mark.parametrize("messy", [False, True])
def test_the_rest_of_the_fleet_is_byte_identical_with_nodes_added(ruleset, messy):
    make = SimConfig.messy if messy else SimConfig
    ids = {n.instance_id for n in k8s_nodes(2, SMALL["seed"], T0, T0 + SMALL["hours"] * HOUR, 30.0, ruleset.pricing)}
    without = _records(make(**SMALL), ruleset)
    with_nodes = _records(make(**SMALL, k8s_nodes=2), ruleset)
    assert len(with_nodes) > len(without)
    assert [r for r in with_nodes if not any(i in r for i in ids)] == without


def test_samples_are_a_stock_dcgm_exporter_in_kubernetes_mode(ruleset):
    records, _ = simulate(SimConfig(**SMALL, k8s_nodes=4), ruleset.pricing)
    nodes = {n.instance_id: n for n in k8s_nodes(4, SMALL["seed"], T0, T0 + SMALL["hours"] * HOUR, 30.0,
                                                 ruleset.pricing)}  # fmt: skip
    decoder = EventDecoder(clock=lambda: T0)
    held = free = 0
    for _, topic, key, value in records:
        if topic != TOPIC_GPU_METRICS or key not in nodes:
            continue
        events = decoder.decode(topic, json.dumps(value).encode())
        assert len(events) == 8 and len({e.ts for e in events}) == 1  # one message per scrape of a node
        for ev in events:
            assert isinstance(ev, GpuMetric) and ev.extra == {}
            assert ev.sm_active is None  # off in dcgm-exporter's default counters
            assert None not in (ev.gr_engine_active, ev.tensor_active, ev.dram_active)
            assert ev.hostname == nodes[key].node_name and ev.gpu_uuid == nodes[key].gpu_uuids[ev.gpu_index]
            if ev.allocated:
                held += 1
                assert ev.pod and ev.namespace and ev.container and ev.workload.split("/")[0] in (
                    "Job", "Deployment", "StatefulSet")  # fmt: skip
                assert {"team", "owner", "project"} <= ev.tags.keys()
            else:
                free += 1
                assert ev.allocated is False and (ev.pod, ev.namespace, ev.workload, ev.tags) == ("", "", "", {})
                assert ev.util_pct == ev.gr_engine_active == ev.mem_used_mib == 0.0
    assert held and free


def test_labels_follow_the_per_gpu_timeline():
    a, b, c = _pod("a", 4), _pod("b", 2), _pod("c")
    node = _node(
        [_spans((240, "busy", a))] * 4  # a job busy all along
        + [_spans((60, "busy", b), (90, "idle", b), (20, "dip", b), (70, "busy", b))] * 2  # idle 110 min
        + [_spans((100, "busy", c), (25, "idle", c), (115, "busy", c))]  # a pause under 30 minutes
        + [_spans((60, "busy", c), (2, "free", None), (58, "busy", c), (120, "free", None))]  # retaken, then not
    )
    labels = k8s_labels(node, T0, T0 + 240 * MIN, 30.0)
    assert [(lb.type, lb.gpus, (lb.start - T0) / MIN, (lb.end - T0) / MIN) for lb in labels] == [
        ("partly_idle_gpu", [4, 5], 60, 170),
        ("unallocated_gpu", [7], 120, 240),
    ]
    share = 32.0 / 8
    assert labels[0].waste_usd == pytest.approx(2 * usd_over(share, 110 * MIN))
    assert labels[1].waste_usd == pytest.approx(usd_over(share, 120 * MIN))


def test_a_whole_idle_host_is_idle_gpus_and_its_hours_are_nobody_elses():
    a, b = _pod("a", 6), _pod("b", 2)
    node = _node(
        [_spans((60, "busy", a), (60, "idle", a), (60, "busy", a))] * 6
        + [_spans((15, "busy", b), (165, "idle", b))] * 2  # idle before, during and after the whole host is
    )
    labels = k8s_labels(node, T0, T0 + 180 * MIN, 30.0)
    assert sorted(((lb.start - T0) / MIN, (lb.end - T0) / MIN, lb.type) for lb in labels) == [
        (15, 60, "partly_idle_gpu"),
        (60, 120, "idle_gpu"),
        (120, 180, "partly_idle_gpu"),
    ]
    by_start = {(lb.start - T0) / MIN: lb for lb in labels}
    assert by_start[60].waste_usd == pytest.approx(usd_over(32.0, HOUR))
    assert by_start[15].waste_usd == pytest.approx(2 * usd_over(32.0 / 8, 45 * MIN))
    assert by_start[120].waste_usd == pytest.approx(2 * usd_over(32.0 / 8, HOUR))


def test_a_gpu_idle_through_a_whole_idle_spell_starts_its_count_again_when_work_resumes():
    """The spell is idle_gpu's; after it, the GPU's idle run starts again where work resumes (as
    partly_idle_gpu's does: a job's GPUs resuming minutes apart are not partly idle), so it counts
    30 minutes later, its episode starting where work resumed; its time before the spell is not charged."""
    a, b = _pod("a", 6), _pod("b", 2)
    node = _node(
        [_spans((60, "busy", a), (60, "idle", a), (60, "busy", a))] * 6
        + [_spans((50, "busy", b), (130, "idle", b))] * 2
    )
    labels = k8s_labels(node, T0, T0 + 180 * MIN, 30.0)
    assert sorted(((lb.start - T0) / MIN, (lb.end - T0) / MIN, lb.type) for lb in labels) == [
        (60, 120, "idle_gpu"),
        (120, 180, "partly_idle_gpu"),
    ]
    partly = next(lb for lb in labels if lb.type == "partly_idle_gpu")
    assert partly.waste_usd == pytest.approx(2 * usd_over(32.0 / 8, 60 * MIN))  # the hour after the spell


def test_fleet_labels_on_instance_ids_and_never_two_types_for_the_same_hours(ruleset):
    _, labels = simulate(SimConfig(hours=48, seed=2, k8s_nodes=4, training_hosts=0, notebooks=0,
                                   inference_endpoints=0, cpu_instances=0, buckets=0, vector_dbs=0),
                         ruleset.pricing)  # fmt: skip
    types = {lb.type for lb in labels}
    assert {"partly_idle_gpu", "unallocated_gpu", "idle_gpu"} <= types
    nodes = k8s_nodes(4, 2, T0, T0 + 48 * HOUR, 30.0, ruleset.pricing)
    for hour in range(48):  # a pod name names one pod at a time in the cluster
        pods = [p for n in nodes for p in n.pods_at(T0 + hour * HOUR)]
        assert len({(p.namespace, p.name) for p in pods}) == len(pods)
    assert all(lb.resource_id.startswith("i-0") for lb in labels)
    for lb in labels:
        if lb.type in ("partly_idle_gpu", "unallocated_gpu"):
            assert lb.gpus and lb.waste_usd > 0
            idle_gpu_s = sum(max(0.0, min(lb.end, idle.end) - max(lb.start, idle.start)) for idle in labels
                             if idle.type == "idle_gpu" and idle.resource_id == lb.resource_id)  # fmt: skip
            # the hours of an idle_gpu episode are its own: priced in neither of the others
            assert lb.waste_usd <= usd_over(lb.usd_per_hour, lb.end - lb.start - idle_gpu_s) + 1e-9, lb.to_json()


def test_a_single_gpu_job_on_a_training_host_leaves_the_others_partly_idle(ruleset):
    _, labels = simulate(SimConfig(hours=48, seed=1), ruleset.pricing)
    partly = [lb for lb in labels if lb.type == "partly_idle_gpu"]
    assert partly and all(lb.resource_id.startswith("gpu-host-") for lb in partly)
    for lb in partly:
        gpus = 8 if lb.gpus == list(range(1, 8)) else 4
        assert lb.gpus == list(range(1, gpus))
        assert lb.waste_usd == pytest.approx(usd_over(lb.usd_per_hour, lb.end - lb.start))


def test_the_idle_gpu_rule_finds_the_whole_idle_nodes_and_nothing_else(tmp_path, ruleset):
    """With ``sm_active`` absent the shipped idle_gpu rule still reads the nodes right."""
    cfg = SimConfig(hours=48, seed=2, k8s_nodes=4, training_hosts=0, notebooks=0, inference_endpoints=0,
                    cpu_instances=0, buckets=0, vector_dbs=0)  # fmt: skip
    path, labels = fleet_file(tmp_path / "k8s.jsonl", cfg, ruleset.pricing)
    result = backtest(path, ruleset)
    assert result.invalid == []
    idle = [lb for lb in labels if lb.type == "idle_gpu"]
    alerts = [a for a in result.alerts if a.type == "idle_gpu"]
    assert idle and len(alerts) == len(idle)
    for label in idle:
        found = [a for a in alerts if a.resource_id == label.resource_id and label.start <= a.fired_at <= label.end]
        assert len(found) == 1
        assert found[0].waste_usd == pytest.approx(label.waste_usd, rel=0.05)


def test_cli_simulate_adds_nodes(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    out, labels = tmp_path / "fleet.jsonl", tmp_path / "labels.jsonl"
    subprocess.run([sys.executable, "-m", "streams.cli", "simulate", "--hours", "2", "--hosts", "1", "--notebooks", "0",
                    "--inference", "0", "--k8s-nodes", "1", "--out", str(out), "--labels", str(labels)],
                   cwd=ROOT, check=True, capture_output=True)  # fmt: skip
    records = [json.loads(line) for line in out.read_text().splitlines()]
    hosts = {r["key"] for r in records if r["topic"] == TOPIC_GPU_METRICS}
    assert any(h.startswith("i-0") for h in hosts) and "gpu-host-000" in hosts
