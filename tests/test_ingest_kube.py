"""kube-state-metrics exposition -> nodes, GPU requests, owners and tags (detector.ingest.kube),
and the bridge's config file (detector.ingest.config)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from detector.ingest.config import ConfigInvalid, FileSd, Target, file_sd_targets, load_bridge_config
from detector.ingest.kube import instance_id, kube_state
from detector.ingest.prometheus import parse_exposition
from tests.exposition import ksm_text, merge, node, pod

T = 1_796_000_000.0

# (case, providerID, (provider, the id billing uses))
PROVIDER_IDS = [
    # EKS / any EC2 node: the instance id after the availability zone
    ("aws", "aws:///us-east-1a/i-0abc123def4567890", ("aws", "i-0abc123def4567890")),
    # GKE / GCE: project, zone, instance name; the name is what GCP's billing export calls the resource
    ("gce", "gce://ml-project/us-central1-a/gke-gpu-pool-1a2b3c4d-x9z8", ("gcp", "gke-gpu-pool-1a2b3c4d-x9z8")),
    # Azure VM: the ARM resource id, lower case as Azure cost exports write it
    ("azure vm", "azure:///subscriptions/0000-11/resourceGroups/MC_rg_aks_eastus/providers/Microsoft.Compute/"
     "virtualMachines/gpu-vm-1",
     ("azure", "/subscriptions/0000-11/resourcegroups/mc_rg_aks_eastus/providers/microsoft.compute/"
      "virtualmachines/gpu-vm-1")),
    # AKS scale set: the instance's id within its scale set
    ("azure vmss", "azure:///subscriptions/0000-11/resourceGroups/mc_rg/providers/Microsoft.Compute/"
     "virtualMachineScaleSets/aks-gpu-12345678-vmss/virtualMachines/3",
     ("azure", "/subscriptions/0000-11/resourcegroups/mc_rg/providers/microsoft.compute/"
      "virtualmachinescalesets/aks-gpu-12345678-vmss/virtualmachines/3")),
    # another scheme (kind, k3s, vsphere...): the last path segment
    ("kind", "kind://docker/kind/kind-worker", ("kind", "kind-worker")),
    # none (bare-metal kubeadm): the host name stays the id
    ("empty", "", None),
    ("no scheme", "i-0abc", None),
]  # fmt: skip


@pytest.mark.parametrize("provider_id, want", [c[1:] for c in PROVIDER_IDS], ids=[c[0] for c in PROVIDER_IDS])
def test_instance_id(provider_id: str, want: tuple[str, str] | None) -> None:
    assert instance_id(provider_id) == want


def test_nodes_requests_owners_and_tags() -> None:
    text = ksm_text(merge(
        node("n1", "aws:///us-east-1a/i-0n1", "p4d.24xlarge", "us-east-1", 8, ip="10.0.0.5",
             extra_labels={"label_karpenter_sh_capacity_type": "spot"}),
        node("n2", "aws:///us-east-1b/i-0n2", "g5.12xlarge", "us-east-1", 4),
        pod("ml", "train-0", "n1", 4, owner=("Job", "train-20261130"), labels={"team": "nlp", "project": "llm"}),
        pod("ml", "web-abc-1", "n1", 1, owner=("ReplicaSet", "web-abc"), phase="Pending"),
        pod("ml", "old-run", "n1", 2, phase="Succeeded"),  # finished: holds nothing
        pod("ml", "gone", "n2", 1, phase="Failed"),
        pod("ml", "unscheduled", "", 1, phase="Pending"),  # no node yet: holds no node's GPU
        {"kube_replicaset_owner": [({"namespace": "ml", "replicaset": "web-abc", "owner_kind": "Deployment",
                                     "owner_name": "web", "owner_is_controller": "true"}, 1)],
         "kube_job_owner": [({"namespace": "ml", "job_name": "train-20261130", "owner_kind": "CronJob",
                              "owner_name": "train", "owner_is_controller": "true"}, 1)],
         "kube_namespace_labels": [({"namespace": "ml", "label_team": "ml-platform", "label_env": "prod"}, 1)]},
    ))  # fmt: skip
    state = kube_state(parse_exposition(text, "ksm:8080"), T)
    n1, n2 = state.nodes["n1"], state.nodes["n2"]
    assert (n1.provider, n1.instance_id, n1.instance_type, n1.region, n1.pricing) == (
        "aws",
        "i-0n1",
        "p4d.24xlarge",
        "us-east-1",
        "spot",
    )
    assert (n1.gpus_allocatable, n1.gpus_requested) == (8, 5)  # 4 running + 1 pending; the finished pod's 2 not
    assert (n2.gpus_allocatable, n2.gpus_requested, n2.pricing) == (4, 0, "on_demand")
    assert state.node("10.0.0.5") is n1  # an exporter known only by its address (federate's instance label)
    assert state.workloads[("ml", "web-abc-1")] == "Deployment/web"  # ReplicaSet -> its Deployment
    assert state.workloads[("ml", "train-0")] == "CronJob/train"  # Job -> its CronJob
    assert ("ml", "old-run") not in state.workloads  # no owner (<none>)
    assert state.tags("ml", "train-0") == {"team": "nlp", "env": "prod", "project": "llm"}  # pod over namespace
    assert state.tags("ml", "web-abc-1") == {"team": "ml-platform", "env": "prod"}


def test_beta_labels_and_exported_labels() -> None:
    """Older clusters carry the beta labels; through Prometheus, ksm's namespace/pod may be exported_*."""
    text = ksm_text({
        "kube_node_labels": [({"node": "n1", "label_beta_kubernetes_io_instance_type": "p3.8xlarge",
                               "label_failure_domain_beta_kubernetes_io_region": "eu-west-1"}, 1)],
        "kube_node_status_allocatable": [({"node": "n1", "resource": "nvidia_com_gpu", "unit": "integer"}, 4)],
        "kube_pod_container_resource_requests": [({"namespace": "monitoring", "pod": "kube-state-metrics-0",
                                                   "exported_namespace": "ml", "exported_pod": "p", "container": "c",
                                                   "node": "n1", "resource": "nvidia_com_gpu", "unit": "integer"}, 2)],
        "kube_pod_status_phase": [({"namespace": "monitoring", "pod": "kube-state-metrics-0", "exported_namespace": "ml",
                                    "exported_pod": "p", "phase": "Running"}, 1)],
    })  # fmt: skip
    n1 = kube_state(parse_exposition(text, "prometheus"), T).nodes["n1"]
    assert (n1.instance_type, n1.region, n1.gpus_requested, n1.instance_id) == ("p3.8xlarge", "eu-west-1", 2, "")


def test_config_errors_name_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_text("interval: 0\ntargets:\n  - url: ftp://x\nhosts:\n  n1: {resource_id: i-1, pricing: cheap}\n")
    with pytest.raises(ConfigInvalid) as err:
        load_bridge_config(path)
    lines = str(err.value).splitlines()
    assert f"{path}:1 interval: must be more than 0" in lines
    assert any(line.startswith(f"{path}:3 targets[0].url: expected http(s)://host:port/path") for line in lines)
    assert any(line.startswith(f"{path}:5 hosts.n1.pricing: Input should be") for line in lines)
    path.write_text("interval: 30s\n")
    with pytest.raises(ConfigInvalid, match="nothing to scrape"):
        load_bridge_config(path)


def test_target_addresses() -> None:
    assert Target(url="10.0.0.5:9400").address() == "http://10.0.0.5:9400/metrics"
    assert Target(url="http://prom:9090", job="federate").address() == (
        "http://prom:9090/federate?match%5B%5D=%7B__name__%3D~%22DCGM_FI_.%2A%7Ckube_.%2A%22%7D"
    )
    assert Target(url="http://ksm:8080/metrics", job="kube-state-metrics").address() == "http://ksm:8080/metrics"


def test_file_sd(tmp_path: Path) -> None:
    """Prometheus' file_sd format; a file that cannot be read is an error naming it, not a crash."""
    (tmp_path / "gpus.json").write_text(json.dumps([
        {"targets": ["10.0.0.5:9400", "10.0.0.6:9400"], "labels": {"cluster": "prod"}},
        {"targets": ["10.0.0.7:9401"], "labels": {"__scheme__": "https", "__metrics_path__": "/dcgm"}},
    ]))  # fmt: skip
    (tmp_path / "broken.json").write_text('[{"targets": ["a:1"],')
    targets, errors = file_sd_targets(FileSd(files=["gpus.json", "broken.json", "missing.json"], timeout=3), tmp_path)
    assert [t.address() for t in targets] == ["http://10.0.0.5:9400/metrics", "http://10.0.0.6:9400/metrics",
                                              "https://10.0.0.7:9401/dcgm"]  # fmt: skip
    assert targets[0].labels == {"cluster": "prod"} and targets[2].labels == {}
    assert {t.timeout for t in targets} == {3.0}
    assert errors[0].startswith(f"{tmp_path / 'broken.json'}:1: not JSON")
    assert errors[1] == f"{tmp_path / 'missing.json'}: cannot read: No such file or directory"


def test_shipped_example_config_is_valid() -> None:
    """deploy/bridge.yaml, the example the docs point at, loads as it is."""
    config = load_bridge_config(Path(__file__).resolve().parent.parent / "deploy" / "bridge.yaml")
    assert [t.job for t in config.targets] == ["kube-state-metrics", "dcgm"]
    assert config.hosts["gpu-node-1"].resource_id == "i-0a1b2c3d4e5f67890"


def test_usage_intervals() -> None:
    """Each usage event covers the time since that resource's previous one; the first sight, and
    the first after a gap of more than 5 intervals, only start the clock (nothing is billed
    that the bridge did not see between two scrapes: a restart or a --once bills nothing twice)."""
    from detector.ingest.hosts import Host, StaticHost
    from detector.ingest.kube import Node
    from detector.ingest.usage import UsageClock

    clock = UsageClock(30.0)
    node_host = Host("n1", "i-0n1", node=Node("n1", provider="aws", instance_type="p4d.24xlarge", region="us-east-1",
                                              pricing="spot"))  # fmt: skip
    events = [clock.event(node_host, T + dt) for dt in (0, 45, 90, 90, 85, 1085, 1115)]
    assert [(e["ts"], e["interval_s"]) if e else None for e in events] == [
        None,  # the first sight: the clock starts
        ("2026-11-30T00:53:20Z", 45.0),  # since the previous
        ("2026-11-30T00:54:05Z", 45.0),
        None,  # the same time again (federate repeating a sample): nothing new
        None,  # earlier than the previous: nothing
        None,  # after a 995 s gap (the bridge was down): not billed, the clock starts again
        ("2026-11-30T01:11:25Z", 30.0),
    ]
    assert {
        k: events[1][k] for k in ("resource_id", "resource_type", "instance_type", "region", "provider", "pricing", "state")
    } == {  # fmt: skip
        "resource_id": "i-0n1",
        "resource_type": "gpu_instance",
        "instance_type": "p4d.24xlarge",
        "region": "us-east-1",
        "provider": "aws",
        "pricing": "spot",
        "state": "running",
    }
    assert "cost_usd" not in events[1]  # priced by the worker from pricing.yaml
    assert clock.event(Host("bare", "bare"), T) is None  # no instance type: it could not be priced
    static = Host("lab", "i-0lab", static=StaticHost(resource_id="i-0lab", instance_type="g5.xlarge", tags={"team": "x"}))
    assert clock.event(static, T) is None
    assert clock.event(static, T + 30)["tags"] == {"team": "x"}  # type: ignore[index]


def test_a_nodes_tag_labels_become_its_usage_tags() -> None:
    """A node pool labelled with an owner is that team's spend, not untagged; a host entry's tags win."""
    from detector.ingest.hosts import Host, StaticHost
    from detector.ingest.usage import UsageClock

    text = ksm_text(merge(node("n1", "aws:///us-east-1a/i-0n1", "p4d.24xlarge", "us-east-1", 8,
                               extra_labels={"label_team": "platform", "label_env": "prod", "label_zone": "a"})))  # fmt: skip
    n1 = kube_state(parse_exposition(text, "ksm"), T).nodes["n1"]
    assert n1.tags == {"team": "platform", "env": "prod"}  # only the tag labels
    clock = UsageClock(30.0)
    assert clock.event(Host("n1", "i-0n1", node=n1), T) is None  # the clock starts
    assert clock.event(Host("n1", "i-0n1", node=n1), T + 30)["tags"] == {"team": "platform", "env": "prod"}  # type: ignore[index]
    both = Host("n1", "i-0n1", node=n1, static=StaticHost(resource_id="i-0n1", tags={"team": "research"}))
    assert clock.event(both, T + 60)["tags"] == {"team": "research", "env": "prod"}  # type: ignore[index]


def test_an_absurd_node_timestamp_is_not_a_usage_time() -> None:
    """kube_node_info's timestamp (through /federate) times the node's usage event: one in year 5000
    would have failed the scrape (no datetime holds it) or stopped the node's billing for good."""
    text = ksm_text(merge(node("n1", "aws:///us-east-1a/i-0n1", "p4d.24xlarge", "us-east-1", 8)), ts_ms=10**17)
    assert kube_state(parse_exposition(text, "ksm"), T).nodes["n1"].t is None
    text = ksm_text(merge(node("n1", "aws:///us-east-1a/i-0n1", "p4d.24xlarge", "us-east-1", 8)), ts_ms=int(T * 1000))
    assert kube_state(parse_exposition(text, "ksm"), T + 15).nodes["n1"].t == T


def test_a_usage_event_the_contract_refuses_is_counted_not_sent() -> None:
    """A node label the contract cannot hold (a 2,000-character instance type) gives no usage event,
    counted, not sent to be dead-lettered."""
    from detector.ingest.hosts import Host
    from detector.ingest.kube import Node
    from detector.ingest.usage import UsageClock

    clock = UsageClock(30.0)
    absurd = Host("n1", "i-0n1", node=Node("n1", instance_type="x" * 2000))
    assert clock.event(absurd, T) is None  # the clock starts
    assert clock.event(absurd, T + 30) is None
    assert clock.skipped == {
        "usage event breaks the resource-usage contract: Expected `str` of length <= 1024 - at `$.instance_type`": 1
    }


def test_usage_clock_forgets_nodes_that_are_gone() -> None:
    """An autoscaled fleet replaces instances all day: the clock keeps only those seen within the
    hour, and one that comes back after longer starts a new interval (as after any gap)."""
    from detector.ingest.hosts import Host
    from detector.ingest.kube import Node
    from detector.ingest.usage import UsageClock

    clock = UsageClock(30.0)
    for i in range(500):  # a new instance every 30 s for 4 hours, each seen twice
        host = Host(f"n{i}", f"i-{i}", node=Node(f"n{i}", instance_type="g5.xlarge"))
        assert clock.event(host, T + 30 * i) is None and clock.event(host, T + 30 * i + 15)
    assert len(clock._last) <= 2 * 3600 / 30 + 1
    n0 = Host("n0", "i-0", node=Node("n0", instance_type="g5.xlarge"))
    assert clock.event(n0, T + 30 * 500) is None  # forgotten: its clock starts again
    assert clock.event(n0, T + 30 * 501)["interval_s"] == 30.0  # type: ignore[index]


def test_a_huge_file_sd_file_is_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runaway file_sd file (a generator gone wrong) is an error naming it, never read into memory."""
    import detector.ingest.config as config

    monkeypatch.setattr(config, "MAX_FILE_SD_BYTES", 1000)
    big = tmp_path / "dcgm.json"
    big.write_text(json.dumps([{"targets": [f"10.0.{i // 250}.{i % 250}:9400" for i in range(200)]}]))
    targets, errors = file_sd_targets(FileSd(files=[str(big)]))
    assert targets == [] and errors == [f"{big}: larger than 1,000 bytes: not a target list"]


def test_the_labels_that_say_what_stops_a_pod_are_read_by_default() -> None:
    """KubeSpawner's and KServe's labels, as kube-state-metrics spells them (dots and slashes as '_'),
    become the pod's tags under their Kubernetes names: the cull_notebook and scale_to_zero actions read them."""
    text = ksm_text(merge(
        node("n1", "aws:///us-east-1a/i-0n1", "g5.12xlarge", "us-east-1", 4),
        pod("jhub", "jupyter-dana", "n1", 1),
        pod("serving", "bert-predictor-x", "n1", 1, owner=("ReplicaSet", "bert-predictor-5d")),
        {"kube_pod_labels": [
            ({"namespace": "jhub", "pod": "jupyter-dana", "uid": "uid-jupyter-dana", "label_hub_jupyter_org_username": "dana",
              "label_hub_jupyter_org_servername": "", "label_component": "singleuser-server"}, 1),
            ({"namespace": "serving", "pod": "bert-predictor-x", "uid": "uid-bert-predictor-x",
              "label_serving_kserve_io_inferenceservice": "bert"}, 1)]},
    ))  # fmt: skip
    state = kube_state(parse_exposition(text, "ksm:8080"), T)
    assert state.tags("jhub", "jupyter-dana") == {"hub.jupyter.org/username": "dana"}  # an empty servername: the default server
    assert state.tags("serving", "bert-predictor-x") == {"serving.kserve.io/inferenceservice": "bert"}


def _addresses(targets: list[Target]) -> list[str]:
    return [t.address().split("//")[1].split("/")[0] for t in targets]


def test_one_unreadable_file_sd_file_holds_back_no_other_and_a_deleted_one_takes_its_targets(tmp_path: Path) -> None:
    """Per file, as Prometheus reads them: before, one broken file of an entry froze the whole entry
    (the other file's new targets were never scraped), and a deleted file's targets were scraped forever."""
    from detector.ingest.config import FileSdWatch

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps([{"targets": ["10.0.0.1:9400"]}]))
    b.write_text('[{"targets": ["10.0.0.9:9400"]')  # half written
    watch = FileSdWatch([FileSd(files=["a.json", "b.json"])], tmp_path)
    targets, new = watch.poll()
    assert _addresses(targets) == ["10.0.0.1:9400"] and [f for f, _ in new] == [str(b)]

    a.write_text(json.dumps([{"targets": ["10.0.0.1:9400", "10.0.0.2:9400"]}]))
    targets, new = watch.poll()
    assert _addresses(targets) == ["10.0.0.1:9400", "10.0.0.2:9400"]  # taken though b.json is still broken
    assert new == [] and [f for f, _ in watch.errors] == [str(b)]  # logged once, still reported

    b.write_text(json.dumps([{"targets": ["10.0.0.9:9400"]}]))
    assert _addresses(watch.poll()[0]) == ["10.0.0.1:9400", "10.0.0.2:9400", "10.0.0.9:9400"] and watch.errors == []
    b.write_text("")  # truncated by a writer that has not written yet: b's targets stay
    assert _addresses(watch.poll()[0])[-1] == "10.0.0.9:9400" and watch.errors[0][1].startswith(f"{b}:1: not JSON")

    a.unlink()
    targets, new = watch.poll()
    assert _addresses(targets) == ["10.0.0.9:9400"]  # a deleted file's targets are no longer scraped
    assert new == [(str(a), f"{a}: cannot read: No such file or directory")]


def test_file_sd_reads_globs_and_yaml_as_prometheus_does(tmp_path: Path) -> None:
    """`files: [dir/*.json]` and `.yml` files are what Prometheus' file_sd_configs take; before, a
    pattern was a file name that did not exist and YAML 'not JSON'."""
    from detector.ingest.config import FileSdWatch

    sd = tmp_path / "sd"
    sd.mkdir()
    (sd / "n1.json").write_text(json.dumps([{"targets": ["10.0.0.1:9400"]}]))
    (sd / "n2.yml").write_text("- targets: ['10.0.0.2:9400']\n  labels: {cluster: prod}\n")
    watch = FileSdWatch([FileSd(files=["sd/*.json", "sd/*.yml", "sd/*.yaml"])], tmp_path)
    targets, _ = watch.poll()
    assert _addresses(targets) == ["10.0.0.1:9400", "10.0.0.2:9400"] and targets[1].labels == {"cluster": "prod"}
    assert watch.errors == [(str(sd / "*.yaml"), f"{sd / '*.yaml'}: no file matches")]

    (sd / "n3.json").write_text(json.dumps([{"targets": ["10.0.0.3:9400"]}]))
    (sd / "n1.json").unlink()  # a file the pattern matched went: no error, its targets go
    (sd / "n2.yml").write_text("- targets: ['10.0.0.2:9400']\n  labels: {cluster: [prod}\n")
    targets, new = watch.poll()
    assert _addresses(targets) == ["10.0.0.3:9400", "10.0.0.2:9400"]  # n2's last good targets kept
    assert [e for _, e in new] == [f"{sd / 'n2.yml'}:2: not YAML: " + "expected ',' or ']', but got '}'"]


@pytest.mark.timeout(20)
def test_a_hostile_file_sd_file_is_an_error_naming_it_not_a_crash_or_a_hang(tmp_path: Path) -> None:
    """Before: nested brackets raised RecursionError out of the bridge's loop (it stopped), a symlink
    to /dev/zero was read until memory ran out, a FIFO blocked the bridge forever."""
    import os

    (tmp_path / "deep.json").write_text("[" * 100_000)
    (tmp_path / "deep.yaml").write_text("[" * 100_000)
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "latin1.json").write_bytes(b'[{"targets": ["h\xe9te:9400"]}]')
    files = ["deep.json", "deep.yaml", "zero.json", "fifo.json", "latin1.json"]
    targets, errors = file_sd_targets(FileSd(files=files), tmp_path)
    assert targets == []
    assert errors == [
        f"{tmp_path / 'deep.json'}: not JSON: nested too deeply",
        f"{tmp_path / 'deep.yaml'}: not YAML: nested too deeply",
        f"{tmp_path / 'zero.json'}: cannot read: not a regular file",
        f"{tmp_path / 'fifo.json'}: cannot read: not a regular file",
        f"{tmp_path / 'latin1.json'}:1: cannot read: not UTF-8 (byte 0xe9)",
    ]


def test_a_file_sd_file_renamed_over_with_the_same_size_and_time_is_read_again(tmp_path: Path) -> None:
    """`mv new.json dcgm.json` (or a ConfigMap's symlink swap) from a file written with the same size and a
    preserved time (`cp -p`, rsync -t): modification time and size alone did not see the change."""
    import os

    from detector.ingest.config import FileSdWatch

    live, new = tmp_path / "dcgm.json", tmp_path / "new.json"
    live.write_text(json.dumps([{"targets": ["10.0.0.1:9400"]}]))
    watch = FileSdWatch([FileSd(files=[str(live)])])
    assert _addresses(watch.poll()[0]) == ["10.0.0.1:9400"]
    new.write_text(json.dumps([{"targets": ["10.0.0.2:9400"]}]))
    stamp = live.stat()
    os.utime(new, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    new.replace(live)
    assert _addresses(watch.poll()[0]) == ["10.0.0.2:9400"]


@pytest.mark.parametrize("address", ["10.0.0.5:94OO", "10.0.0.5:99999", "10.0.0.5:0"])
def test_a_target_whose_port_is_no_port_is_refused_where_it_is_written(tmp_path: Path, address: str) -> None:
    """Before: taken, then every scrape failed as 'unreachable: http://10.0.0.5:94OO/metrics', which does not say why."""
    with pytest.raises(ValueError, match=f"expected a port from 1 to 65535 in '{address}'"):
        Target(url=address)
    (tmp_path / "dcgm.json").write_text(json.dumps([{"targets": ["10.0.0.4:9400", address]}]))
    targets, errors = file_sd_targets(FileSd(files=["dcgm.json"]), tmp_path)
    assert targets == [] and errors[0].startswith(f"{tmp_path / 'dcgm.json'}: [0].targets[1]: '{address}' is not a host:port")


def test_a_federate_answers_stale_series_describe_no_node_or_pod_now() -> None:
    """A /federate that looks back far (VictoriaMetrics: a day) answers the last samples of a node removed and a
    pod deleted hours ago, with their old timestamps. The node is billed by its usage events and its pod's GPUs
    count as requested: what is over an hour behind the scrape is no cluster state now (as the GPU samples)."""
    from detector.ingest.hosts import resolve_host
    from detector.ingest.usage import UsageClock

    live = ksm_text(merge(node("n1", "aws:///us-east-1a/i-0n1", "p4d.24xlarge", "us-east-1", 8),
                          pod("ml", "train", "n1", 8)), ts_ms=int((T - 20) * 1000))  # fmt: skip
    gone = ksm_text(merge(node("n2", "aws:///us-east-1a/i-0n2", "p4d.24xlarge", "us-east-1", 8),
                          pod("ml", "old", "n2", 8)), ts_ms=int((T - 20 * 3600) * 1000))  # fmt: skip
    clock = UsageClock(30.0)
    for t in (T, T + 30, T + 60):
        state = kube_state(parse_exposition(live, "ksm") + parse_exposition(gone, "ksm"), t)
        assert set(state.nodes) == {"n1"} and state.gpu_pods == {("ml", "train")}
        billed = [clock.event(resolve_host(n.name, state, {}), t) for n in state.nodes.values()]
    assert [e["resource_id"] for e in billed if e] == ["i-0n1"]
