"""The fake dcgm-exporter and kube-state-metrics: their pages parse with prometheus_client's
parser, carry the label sets those exporters print, and walk simulated time one scrape per
request."""

from __future__ import annotations

import csv
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from detector.fake_exporter import DCGM_COUNTERS, FakeExporters, render_dcgm, render_kube_state
from detector.simulate_k8s import k8s_nodes
from tests.helpers import T0

HOUR = 3600.0
REFERENCE = Path("/work/shared/reference/dcgm-exporter/default-counters.csv")
GPU_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]
POD_LABELS = ["container", "namespace", "pod"]


@pytest.fixture(scope="module")
def nodes(ruleset):
    return k8s_nodes(4, 5, T0, T0 + 24 * HOUR, 30.0, ruleset.pricing)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(text: str) -> dict[str, list]:
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def test_dcgm_page_has_the_default_counters_and_the_exporters_label_layout(nodes):
    node, t = nodes[0], T0 + 10 * HOUR
    text = render_dcgm(node, t)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {name for name, _, _ in DCGM_COUNTERS} == set(families)
    assert "DCGM_FI_PROF_SM_ACTIVE" not in text  # commented out in the default counters
    for family in families.values():
        assert len(family.samples) == node.gpus
        for sample in family.samples:
            assert sample.timestamp == t  # simulated time, in ms on the wire
            assert list(sample.labels)[: len(GPU_LABELS)] == GPU_LABELS
            assert sample.labels["Hostname"] == node.node_name
            assert sample.labels["UUID"] == node.gpu_uuids[int(sample.labels["gpu"])]
    # the exact line layout of dcgm-exporter's template (labels in its order, pod labels sorted by key)
    line = re.compile(r'^DCGM_FI_[A-Z_]+\{gpu="\d",UUID="GPU-[0-9a-f-]{36}",pci_bus_id="0{8}:[0-9A-F]{2}:[0-9A-F]{2}\.0",'
                      r'device="nvidia\d",modelName="NVIDIA [^"]+",Hostname="ip-[0-9-]+\.ec2\.internal",'
                      r'DCGM_FI_DRIVER_VERSION="[0-9.]+"(,container="[^"]+",namespace="[^"]+",pod="[^"]+")?\} '
                      r'[0-9.]+ \d{13}$')  # fmt: skip
    body = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert body and all(line.match(ln) for ln in body), next(ln for ln in body if not line.match(ln))


@pytest.mark.skipif(not REFERENCE.exists(), reason="dcgm-exporter reference not present")
def test_help_and_type_lines_are_those_of_default_counters_csv():
    enabled = [row for row in csv.reader(REFERENCE.read_text().splitlines())
               if row and not row[0].startswith("#") and row[1].strip() != "label"]  # fmt: skip
    assert [(r[0].strip(), r[1].strip(), r[2].strip()) for r in enabled] == DCGM_COUNTERS


def test_gpus_show_their_pods_and_what_they_do(nodes):
    """Held GPUs carry their pod's labels (Kubernetes mode); a GPU no pod holds has none and does nothing."""
    seen = {"held": 0, "free": 0}
    for node in nodes:
        for hour in range(0, 24, 3):
            t = T0 + hour * HOUR
            by_field = samples(render_dcgm(node, t))
            for sample in by_field["DCGM_FI_DEV_GPU_UTIL"]:
                gpu = int(sample.labels["gpu"])
                span = node.span_at(gpu, t)
                if span.pod is None:
                    seen["free"] += 1
                    assert not set(POD_LABELS) & set(sample.labels)
                    assert sample.value == 0
                else:
                    seen["held"] += 1
                    pod = span.pod
                    assert [sample.labels[k] for k in POD_LABELS] == [pod.container, pod.namespace, pod.name]
                    assert (sample.value >= 70) == (span.mode == "busy") or span.mode == "serving"
            used = {int(s.labels["gpu"]): s.value for s in by_field["DCGM_FI_DEV_FB_USED"]}
            free = {int(s.labels["gpu"]): s.value for s in by_field["DCGM_FI_DEV_FB_FREE"]}
            reserved = {int(s.labels["gpu"]): s.value for s in by_field["DCGM_FI_DEV_FB_RESERVED"]}
            for gpu in used:
                assert used[gpu] + free[gpu] + reserved[gpu] == pytest.approx(node.mem_total_mib, abs=1)
    assert seen["held"] and seen["free"]


def test_kube_state_metrics_describe_the_nodes_and_the_pods_holding_gpus(nodes):
    t = T0 + 14 * HOUR
    by_name = samples(render_kube_state(nodes, t))
    info = {s.labels["node"]: s.labels["provider_id"] for s in by_name["kube_node_info"]}
    assert info == {n.node_name: f"aws:///{n.zone}/{n.instance_id}" for n in nodes}
    types = {s.labels["node"]: s.labels["label_node_kubernetes_io_instance_type"] for s in by_name["kube_node_labels"]}
    assert types == {n.node_name: n.instance_type for n in nodes}
    teams = {s.labels["node"]: s.labels["label_team"] for s in by_name["kube_node_labels"]}
    assert teams == {n.node_name: n.tags["team"] for n in nodes}
    gpus = {s.labels["node"]: s.value for s in by_name["kube_node_status_allocatable"]
            if s.labels["resource"] == "nvidia_com_gpu"}  # fmt: skip
    assert gpus == {n.node_name: 8 for n in nodes}
    requested: dict[str, float] = {}
    for s in by_name["kube_pod_container_resource_requests"]:
        if s.labels["resource"] == "nvidia_com_gpu":
            assert s.labels["unit"] == "integer"
            requested[s.labels["node"]] = requested.get(s.labels["node"], 0) + s.value
    for node in nodes:  # what kube-state-metrics says is requested is what dcgm-exporter shows held
        held = sum(1 for g in range(node.gpus) if node.span_at(g, t).pod is not None)
        assert requested.get(node.node_name, 0) == held
    owners = {s.labels["pod"]: (s.labels["owner_kind"], s.labels["owner_name"]) for s in by_name["kube_pod_owner"]}
    replicasets = {s.labels["replicaset"]: (s.labels["owner_kind"], s.labels["owner_name"])
                   for s in by_name["kube_replicaset_owner"]}  # fmt: skip
    labels = {s.labels["pod"]: s.labels for s in by_name["kube_pod_labels"]}
    pods = [p for n in nodes for p in n.pods_at(t)]
    assert pods and set(owners) == set(labels) == {p.name for p in pods}
    for pod in pods:
        kind, name = owners[pod.name]
        if kind == "ReplicaSet":  # a Deployment's pod: its ReplicaSet names the Deployment
            kind, name = replicasets[name]
        assert f"{kind}/{name}" == pod.workload
        assert {k: labels[pod.name][f"label_{k}"] for k in ("team", "owner", "project")} == pod.tags


def test_each_scrape_walks_simulated_time_and_t_serves_a_given_time(nodes):
    node = nodes[1]
    with FakeExporters([node], T0, T0 + 90.0, 30.0) as exporters:
        url = exporters.dcgm_urls[node.node_name]
        assert url.startswith("http://127.0.0.1:")
        kube = samples(get(exporters.kube_state_url)[1])["kube_node_info"][0]
        assert kube.timestamp == T0  # the cluster as of the scrape the node serves next
        stamps = []
        for _ in range(3):
            status, text = get(url)
            assert status == 200
            stamps.append(samples(text)["DCGM_FI_DEV_GPU_UTIL"][0].timestamp)
        assert stamps == [T0, T0 + 30, T0 + 60]
        assert exporters.done
        status, text = get(url)
        assert status == 503 and "simulated time is over" in text
        assert get(f"{url}?t={T0 + 30}") == get(f"{url}?t={T0 + 30}")  # a given time: same page, clock untouched
        status, text = get(f"{url}?t=noon")
        assert status == 400 and "t='noon'" in text
        assert get(url.replace("/metrics", "/other"))[0] == 404
        status, text = get(exporters.kube_state_url)  # all served: the cluster as of the last scrape
        assert status == 200 and samples(text)["kube_node_info"][0].timestamp == T0 + 60


def test_newer_exporters_spell_the_host_label_in_lower_case(nodes):
    text = render_dcgm(nodes[0], T0, hostname_label="hostname")
    sample = samples(text)["DCGM_FI_DEV_POWER_USAGE"][0]
    assert sample.labels["hostname"] == nodes[0].node_name and "Hostname" not in sample.labels


def test_binds_loopback_only(nodes):
    with pytest.raises(ValueError, match="loopback"):
        FakeExporters(nodes, T0, T0 + 60, host="0.0.0.0")


def test_kube_state_read_first_agrees_with_the_samples_read_next(nodes):
    """The bridge reads kube-state-metrics, then the node exporters: both describe one instant,
    also across a pod leaving its GPUs to nobody or taking them."""
    node = next(n for n in nodes if any(s.pod is None for spans in n.spans for s in spans[1:]))
    change = next(s.start for spans in node.spans for s in spans[1:] if s.pod is None)
    with FakeExporters([node], change - 60, change + 60, 30.0) as exporters:
        held_counts = set()
        for _ in range(4):
            requests = samples(get(exporters.kube_state_url)[1])["kube_pod_container_resource_requests"]
            requested = sum(s.value for s in requests if s.labels["resource"] == "nvidia_com_gpu")
            util = samples(get(exporters.dcgm_urls[node.node_name])[1])["DCGM_FI_DEV_GPU_UTIL"]
            held = sum(1 for s in util if "pod" in s.labels)
            assert requested == held
            held_counts.add(held)
        assert len(held_counts) == 2  # the change happened in between


def test_the_energy_counter_is_the_integral_of_the_draw(nodes):
    """Power from the energy counter's increase (the bridge's fallback without POWER_USAGE)
    is the GPU's mean draw in what it does."""
    node = nodes[0]
    span = next(s for s in node.spans[0] if s.mode == "busy" and s.end - s.start >= 600)

    def energy(t: float) -> float:
        (sample,) = [s for s in samples(render_dcgm(node, t))["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
                     if s.labels["gpu"] == "0"]  # fmt: skip
        return sample.value

    watts = (energy(span.start + 600) - energy(span.start)) / 1000 / 600
    assert watts == pytest.approx(node.max_power * 0.8, rel=0.01)
    readings = [energy(T0 + hour * HOUR) for hour in range(0, 24, 2)]
    assert readings == sorted(readings) and readings[-1] > readings[0]


def test_the_bridge_benchmark_measures_a_bridge_that_publishes(tmp_path: Path) -> None:
    """``bench/bridge.py`` times the bridge on fake exporters serving simulated time (2026-01-01); the bridge
    ran on the wall clock, so once it refused samples over an hour behind its scrape (a33d466, dce94fe) every
    GPU sample and every kube-state-metrics sample was refused: its rounds published nothing and the figures
    timed a bridge that parses and drops. Its clock follows the rounds' simulated time, as the demo's does."""
    import json
    import subprocess
    import sys

    out = tmp_path / "bridge.json"
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, str(root / "bench" / "bridge.py"), "--nodes", "1", "--rounds", "3",
                    "--json", str(out)], check=True, capture_output=True, timeout=240)  # fmt: skip
    published = json.loads(out.read_text())["messages_per_round"]
    assert published == {"gpu-metrics": 1, "resource-usage": 1}
