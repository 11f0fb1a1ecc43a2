"""``burnwatch bridge``: exporters served from a local HTTP server, scraped into the embedded
broker, and the messages read back from the topics."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from detector.events import TOPIC_GPU_METRICS, TOPIC_RESOURCE_USAGE, EventDecoder, GpuMetric, UsageEvent
from streams.embedded import EmbeddedBroker
from tests.exposition import Gpu, dcgm_text, federate_text, gpu_values, ksm_text, merge, node, pod
from tests.helpers import ipv6_loopback
from tests.reliability import true_ends
from tests.test_cli import burnwatch, no_traceback

PARTITIONS = 4


class Exporters:
    """A local HTTP server: ``pages[path]`` is served as text (a callable: its answer to each request,
    None for 404); ``/slow`` answers only once ``release`` is set (a target that times out),
    ``/garbage`` is not Prometheus text."""

    def __init__(self) -> None:
        self.pages: dict[str, str | Callable[[], str | None]] = {}
        self.release = threading.Event()
        self.requests: list[str] = []
        exporters = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                exporters.requests.append(self.path)
                body = exporters.pages.get(self.path.split("?")[0])
                if callable(body):
                    body = body()
                if self.path.startswith("/slow"):
                    exporters.release.wait(30)
                    body = ""
                if self.path.startswith("/garbage"):
                    body = "<html><body><h1>Welcome to nginx!</h1></body></html>\n"
                if body is None:
                    self.send_error(404)
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except OSError:  # the client gave up (the target that times out)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Exporters:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def exporters() -> Iterator[Exporters]:
    with Exporters() as e:
        yield e


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(log_path=tmp_path_factory.mktemp("broker") / "broker.log") as b:
        yield b


def read_topic(bootstrap: str, topic: str) -> list[tuple[str, bytes]]:
    """Every (key, value) on ``topic``, up to its end as a fetch reports it."""

    async def go() -> list[tuple[str, bytes]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            ends = await true_ends(consumer, tps)
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, 0)
            out: list[tuple[str, bytes]] = []
            for _ in range(200):
                positions = [await consumer.position(tp) for tp in tps]
                if all(position >= ends[tp] for position, tp in zip(positions, tps, strict=True)):
                    break
                for records in (await consumer.getmany(timeout_ms=100)).values():
                    out += [(r.key.decode(), r.value) for r in records]
            return out
        finally:
            await consumer.stop()

    return asyncio.run(go())


def kafka_env(broker: EmbeddedBroker) -> dict[str, str]:
    return {"BURNWATCH_KAFKA_BOOTSTRAP": broker.bootstrap, "BURNWATCH_PARTITIONS": str(PARTITIONS)}


def decoded(messages: list[tuple[str, bytes]], topic: str) -> dict[str, list[Any]]:
    """key -> events of each message, each decoded by the worker's decoder (which raises on anything invalid)."""
    decoder = EventDecoder()
    out: dict[str, list[Any]] = {}
    for key, value in messages:
        events = decoder.decode(topic, value)
        assert json.loads(value) and isinstance(json.loads(value), list)
        out.setdefault(key, []).append(events)
    return out


def cluster_ksm() -> str:
    """Two GPU nodes: `gpu-node-a` (EC2, 8 GPUs, pods request 5) and `gpu-node-b` (GCE, 2 GPUs, pods request 2)."""
    return ksm_text(merge(
        node("gpu-node-a", "aws:///us-east-1a/i-0aaa111", "p4d.24xlarge", "us-east-1", 8, ip="10.0.1.10"),
        node("gpu-node-b", "gce://ml-proj/us-central1-a/gpu-node-b", "a2-highgpu-1g", "us-central1", 2, ip="10.0.1.11",
             extra_labels={"label_cloud_google_com_gke_spot": "true"}),
        node("cpu-node-c", "aws:///us-east-1b/i-0ccc333", "m6i.2xlarge", "us-east-1", 0, ip="10.0.1.12"),
        pod("ml", "train-6c5d8-abcde", "gpu-node-a", 4, owner=("ReplicaSet", "train-6c5d8"), labels={"team": "nlp"}),
        pod("research", "nb-alice-0", "gpu-node-a", 1, owner=("StatefulSet", "nb-alice")),
        pod("ml", "eval-1", "gpu-node-b", 2, owner=("Job", "eval-1")),
        {"kube_replicaset_owner": [({"namespace": "ml", "replicaset": "train-6c5d8", "owner_kind": "Deployment",
                                     "owner_name": "train", "owner_is_controller": "true"}, 1)],
         "kube_namespace_labels": [({"namespace": "research", "label_team": "research", "label_owner": "alice"}, 1)]},
    ))  # fmt: skip


def node_a() -> str:
    """dcgm-exporter on gpu-node-a, released version (`Hostname`), Kubernetes mode: 4 GPUs for the
    training pod, 1 for the notebook, 3 held by nobody."""
    gpus = []
    for i in range(8):
        labels = {}
        if i < 4:
            labels = {"pod": "train-6c5d8-abcde", "namespace": "ml", "container": "trainer"}
        elif i == 4:
            labels = {"pod": "nb-alice-0", "namespace": "research", "container": "jupyter"}
        gpus.append(Gpu(i, gpu_values(95 if i < 4 else 0, gr=0.9 if i < 4 else 0.0, tensor=0.5, dram=0.4), "gpu-node-a",
                        labels=labels))  # fmt: skip
    return dcgm_text(gpus)


def node_b() -> str:
    """dcgm-exporter on gpu-node-b, newer version (`hostname`), older pod labels; one GPU's pod is
    not labelled yet while both are requested (the exporter is behind): that GPU's allocation is unknown."""
    return dcgm_text([
        Gpu(0, gpu_values(40), "gpu-node-b", host_label="hostname",
            labels={"pod_name": "eval-1", "pod_namespace": "ml", "container_name": "eval"}),
        Gpu(1, gpu_values(0), "gpu-node-b", host_label="hostname"),
    ])  # fmt: skip


def bare_metal() -> str:
    """A host outside Kubernetes, mapped in config; it reports energy only (no POWER_USAGE)."""
    return dcgm_text([Gpu(0, gpu_values(0, power=None, energy=7.2e9), "lab-box-1")])


def write_config(tmp_path: Path, exporters: Exporters, **extra: Any) -> Path:
    """A config with ksm and node-a static, node-b and the bare-metal host from a file_sd file
    (as Prometheus reads it), a target that times out and one that serves garbage."""
    addr = exporters.address
    exporters.pages.update({"/ksm/metrics": cluster_ksm(), "/a/metrics": node_a(), "/b/metrics": node_b(),
                            "/lab/metrics": bare_metal()})  # fmt: skip
    (tmp_path / "dcgm.json").write_text(json.dumps([
        {"targets": [addr], "labels": {"__metrics_path__": "/b/metrics", "cluster": "prod"}},
        {"targets": [addr], "labels": {"__metrics_path__": "/lab/metrics"}},
    ]))  # fmt: skip
    config = {
        "interval": "30s",
        "listen": "",
        "targets": [
            {"url": f"http://{addr}/ksm/metrics", "job": "kube-state-metrics"},
            {"url": f"http://{addr}/a/metrics", "job": "dcgm"},
            {"url": f"http://{addr}/slow/metrics", "job": "dcgm", "timeout": "0.5s"},
            {"url": f"http://{addr}/garbage/metrics", "job": "dcgm"},
        ],
        "file_sd": [{"files": ["dcgm.json"], "job": "dcgm"}],
        "hosts": {"lab-box-1": {"resource_id": "i-0lab0001", "instance_type": "g5.xlarge", "region": "us-east-1"}},
        **extra,
    }
    path = tmp_path / "bridge.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


@pytest.mark.integration
def test_once_publishes_one_message_per_host(tmp_path: Path, exporters: Exporters, broker: EmbeddedBroker) -> None:
    config = write_config(tmp_path, exporters)

    run = burnwatch("bridge", "--config", str(config), "--once", env=kafka_env(broker))

    no_traceback(run)
    out, err = run.stdout, run.stderr
    assert run.returncode == 1, out + err  # two targets failed; the others were published all the same
    assert f"FAILED dcgm               http://{exporters.address}/slow/metrics: no answer within 0.5s" in out
    assert f"http://{exporters.address}/garbage/metrics: not Prometheus text at line 1 (invalid metric name)" in out
    assert "2 of 6 targets failed" in err

    metrics = decoded(read_topic(broker.bootstrap, TOPIC_GPU_METRICS), TOPIC_GPU_METRICS)
    # one message per host, keyed by the resource billing uses: the node's instance from its providerID
    assert {k: len(v) for k, v in metrics.items()} == {"i-0aaa111": 1, "gpu-node-b": 1, "i-0lab0001": 1}
    a: list[GpuMetric] = metrics["i-0aaa111"][0]
    assert [e.gpu_index for e in a] == list(range(8))
    assert {e.hostname for e in a} == {"gpu-node-a"}
    assert [e.allocated for e in a] == [True] * 5 + [False] * 3  # 5 requested, 5 labelled: the rest held by nobody
    assert (a[0].pod, a[0].namespace, a[0].container, a[0].workload) == ("train-6c5d8-abcde", "ml", "trainer",
                                                                          "Deployment/train")  # fmt: skip
    assert a[0].tags == {"team": "nlp"}
    assert (a[4].pod, a[4].workload, a[4].tags) == ("nb-alice-0", "StatefulSet/nb-alice", {"team": "research", "owner": "alice"})
    assert (a[0].util_pct, a[0].gr_engine_active, a[0].tensor_active, a[0].dram_active) == (95, 0.9, 0.5, 0.4)
    assert (a[0].mem_used_mib, a[0].mem_total_mib, a[0].power_w) == (30000, 40960, 250)
    # gpu-node-b's providerID is a GCE one: billing names the instance, here the node's name
    b: list[GpuMetric] = metrics["gpu-node-b"][0]
    assert [(e.pod, e.allocated) for e in b] == [("eval-1", True), ("", None)]  # 2 requested, 1 labelled: unknown
    lab: list[GpuMetric] = metrics["i-0lab0001"][0]
    assert (lab[0].hostname, lab[0].allocated, lab[0].power_w) == ("lab-box-1", None, 0.0)  # one energy reading: no power yet

    # One round bills nothing: usage covers the time seen between two scrapes, so a --once check
    # beside the running bridge never bills a node twice.
    assert read_topic(broker.bootstrap, TOPIC_RESOURCE_USAGE) == []


@pytest.mark.integration
def test_bad_config_names_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_text("interval: 30s\ntargets:\n  - url: http://127.0.0.1:9400/metrics\n    job: dcgm-exporter\n"
                    "    timeot: 5s\n")  # fmt: skip
    run = burnwatch("bridge", "--config", str(path), "--once", env={"BURNWATCH_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    no_traceback(run)
    assert run.returncode == 1  # as for any refused config; nothing was scraped or published
    message = run.stderr
    assert f"{path}:4 targets[0].job: Input should be 'dcgm', 'kube-state-metrics' or 'federate'" in message
    assert f"{path}:5 targets[0].timeot: unknown key" in message


@pytest.mark.parametrize(
    "line, said",
    [
        ("listen: 127.0.0.1:99999", "listen: expected host:port with a port from 1 to 65535"),  # bind() traceback before
        ("timeout: .inf", "timeout: invalid duration inf"),  # aiohttp's OverflowError before
        ("interval: .nan", "interval: invalid duration nan"),  # scraped about every 10 s before
    ],
)  # fmt: skip
def test_a_config_value_no_bridge_can_run_with_is_refused_at_its_line(tmp_path: Path, line: str, said: str) -> None:
    from detector.ingest.config import ConfigInvalid, load_bridge_config

    path = tmp_path / "bridge.yaml"
    path.write_text(f"{line}\ntargets:\n  - url: http://127.0.0.1:9400/metrics\n    job: dcgm\n")
    with pytest.raises(ConfigInvalid) as info:
        load_bridge_config(path)
    assert str(info.value).startswith(f"{path}:1 ") and said in str(info.value), str(info.value)


def federated(ts_ms: int) -> str:
    """A Prometheus that scrapes the cluster's exporters through Kubernetes service discovery
    (target labels namespace/pod/container/instance/job), federated: the GPU's pod labels
    become exported_*, and node-b's exporter says no host name (only its address)."""
    dcgm_target = {"namespace": "gpu-operator", "container": "nvidia-dcgm-exporter", "job": "nvidia-dcgm-exporter"}
    node_b_anonymous = dcgm_text([
        Gpu(0, gpu_values(40), labels={"pod": "eval-1", "namespace": "ml", "container": "eval"}),
        Gpu(1, gpu_values(0), labels={"pod": "eval-1", "namespace": "ml", "container": "eval"}),
    ])  # fmt: skip
    return federate_text([
        (cluster_ksm(), {"instance": "10.2.0.8:8080", "job": "kube-state-metrics"}),
        (node_a(), {**dcgm_target, "pod": "nvidia-dcgm-exporter-7xk2p", "instance": "10.0.1.10:9400"}),
        (node_b_anonymous, {**dcgm_target, "pod": "nvidia-dcgm-exporter-q9w4r", "instance": "10.0.1.11:9400"}),
    ], ts_ms=ts_ms)  # fmt: skip


@pytest.mark.integration
def test_federate(tmp_path: Path, exporters: Exporters, broker: EmbeddedBroker) -> None:
    """The second path: an existing Prometheus' /federate, many hosts per response, samples with their timestamps."""
    scraped = int(time.time() - 20) * 1000 + 250  # Prometheus' scrape, seconds before: a federate answer is live
    exporters.pages["/federate"] = federated(scraped)
    path = tmp_path / "bridge.yaml"
    path.write_text(f"listen: ''\ntargets:\n  - url: http://{exporters.address}\n    job: federate\n")
    before = {k: len(v) for k, v in decoded(read_topic(broker.bootstrap, TOPIC_GPU_METRICS), TOPIC_GPU_METRICS).items()}

    run = burnwatch("bridge", "--config", str(path), "--once", env=kafka_env(broker))
    assert run.returncode == 0, run.stdout + run.stderr
    assert [r for r in exporters.requests if r.startswith("/federate")] == [
        "/federate?match%5B%5D=%7B__name__%3D~%22DCGM_FI_.*%7Ckube_.*%22%7D"]  # fmt: skip

    metrics = decoded(read_topic(broker.bootstrap, TOPIC_GPU_METRICS), TOPIC_GPU_METRICS)
    new = {k: v[before.get(k, 0):] for k, v in metrics.items() if len(v) > before.get(k, 0)}
    # one message per host; node-b known only by its address, found through the node's internal IP
    assert {k: len(v) for k, v in new.items()} == {"i-0aaa111": 1, "gpu-node-b": 1}
    a: list[GpuMetric] = new["i-0aaa111"][0]
    assert {e.ts.timestamp() for e in a} == {scraped / 1000}  # Prometheus' timestamp
    assert [(e.pod, e.namespace, e.container) for e in a[:1]] == [("train-6c5d8-abcde", "ml", "trainer")]  # not the exporter's
    assert [e.allocated for e in a] == [True] * 5 + [False] * 3
    b: list[GpuMetric] = new["gpu-node-b"][0]
    assert [(e.hostname, e.pod, e.allocated) for e in b] == [("10.0.1.11", "eval-1", True)] * 2


def wait_for(condition: Any, timeout: float = 30.0) -> Any:
    """Poll an async condition until it holds (raising with what it last was otherwise)."""

    async def go() -> Any:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            value = condition()
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"condition not met within {timeout}s")
            await asyncio.sleep(0.05)

    return go()


@pytest.mark.integration
def test_usage_for_the_gpu_nodes_and_the_mapped_hosts_from_the_second_round(tmp_path: Path, exporters: Exporters) -> None:
    """The GPU nodes kube-state-metrics lists and the statically mapped host that answered are billed
    (not the CPU node), for the time between two rounds: the first round only starts their clocks."""
    from detector.ingest.config import load_bridge_config
    from streams.bridge import Bridge

    config = load_bridge_config(write_config(tmp_path, exporters))
    sent: list[tuple[str, str, bytes]] = []

    async def send(topic: str, key: str, value: bytes) -> None:
        sent.append((topic, key, value))

    async def go() -> None:
        bridge = Bridge(config, send, base=tmp_path)
        try:
            await bridge.round()
            assert not [k for t, k, _ in sent if t == TOPIC_RESOURCE_USAGE]
            exporters.release.set()  # the hung target answers (empty) from now on
            await bridge.round()
        finally:
            await bridge.close()

    asyncio.run(go())
    usage = decoded([(k, v) for t, k, v in sent if t == TOPIC_RESOURCE_USAGE], TOPIC_RESOURCE_USAGE)
    assert {k: len(v) for k, v in usage.items()} == {"i-0aaa111": 1, "gpu-node-b": 1, "i-0lab0001": 1}
    u: UsageEvent = usage["i-0aaa111"][0][0]
    assert (u.resource_type, u.instance_type, u.region, u.provider, u.state, u.cost_usd, u.pricing) == (
        "gpu_instance", "p4d.24xlarge", "us-east-1", "aws", "running", None, "on_demand")  # fmt: skip
    assert 0 < u.interval_s < 30  # the time between the two rounds, not a whole scrape interval
    assert usage["gpu-node-b"][0][0].pricing == "spot"  # GKE Spot label
    assert usage["i-0lab0001"][0][0].instance_type == "g5.xlarge"


@pytest.mark.integration
def test_loop_rereads_file_sd_and_a_hung_target_delays_no_other(tmp_path: Path, exporters: Exporters) -> None:
    """The scrape loop: every target on its own schedule, so one that hangs (until its timeout) holds
    no other back; a file_sd file is re-read when it changes; the counters are on /metrics."""
    from detector.ingest.config import load_bridge_config
    from streams.bridge import Bridge, serve_metrics
    from streams.embedded import free_port

    exporters.pages["/a/metrics"] = node_a()
    exporters.pages["/lab/metrics"] = bare_metal()
    sd = tmp_path / "dcgm.json"
    sd.write_text(json.dumps([{"targets": [exporters.address], "labels": {"__metrics_path__": "/a/metrics"}}]))
    port = free_port()
    (tmp_path / "bridge.yaml").write_text(json.dumps({
        "interval": "0.1s", "listen": f"127.0.0.1:{port}", "file_sd": [{"files": [str(sd)]}],
        "targets": [{"url": f"http://{exporters.address}/slow/metrics", "timeout": "60s"}],
        "hosts": {"lab-box-1": {"resource_id": "i-0lab0001", "instance_type": "g5.xlarge"}},
    }))  # fmt: skip
    config = load_bridge_config(tmp_path / "bridge.yaml")
    sent: list[tuple[str, str, list[dict[str, Any]]]] = []

    async def send(topic: str, key: str, value: bytes) -> None:
        sent.append((topic, key, json.loads(value)))

    def keys(topic: str = TOPIC_GPU_METRICS) -> list[str]:
        return [k for t, k, _ in sent if t == topic]

    async def go() -> str:
        bridge = Bridge(config, send)
        runner = await serve_metrics(bridge, config.listen)
        stop = asyncio.Event()
        task = asyncio.create_task(bridge.run(stop))
        try:
            # the hung target is still waiting for its answer while node-a is scraped again and again
            await wait_for(lambda: keys().count("gpu-node-a") >= 3)
            assert "/slow/metrics" in exporters.requests
            slow = {"target": f"http://{exporters.address}/slow/metrics", "job": "dcgm", "result": "failed"}
            assert not bridge.metrics.registry.get_sample_value("burnwatch_bridge_scrapes_total", slow)
            # a new target in the file_sd file is picked up, without a restart
            sd.write_text(json.dumps([{"targets": [exporters.address], "labels": {"__metrics_path__": "/lab/metrics"}}]))
            await wait_for(lambda: "i-0lab0001" in keys())
            count = keys().count("gpu-node-a")
            await wait_for(lambda: keys().count("i-0lab0001") >= 3)
            assert keys().count("gpu-node-a") <= count + 1  # ... and the one it lost is no longer scraped
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                    return await response.text()
        finally:
            stop.set()
            await task
            await bridge.close()
            await runner.cleanup()

    import aiohttp

    metrics = asyncio.run(go())
    lab = [events for t, k, events in sent if t == TOPIC_GPU_METRICS and k == "i-0lab0001"]
    # the energy counter's second reading gives power; the static host's usage follows its scrapes
    assert lab[0][0].get("power_w") is None and lab[1][0].get("power_w") == 0.0
    assert keys(TOPIC_RESOURCE_USAGE).count("i-0lab0001") == len(lab) - 1  # the first scrape starts its clock
    assert f'burnwatch_bridge_scrapes_total{{job="dcgm",result="ok",target="http://{exporters.address}/lab/metrics"}}' in metrics
    # the target file_sd dropped is no longer 'up' (nor counted): its series went with it
    assert f'target="http://{exporters.address}/a/metrics"' not in metrics
    assert 'burnwatch_bridge_messages_total{topic="gpu-metrics"}' in metrics


@pytest.mark.integration
def test_a_response_beyond_max_bytes_is_refused(exporters: Exporters) -> None:
    """A wrong URL serving a large file, or a runaway exporter, is a failed scrape, not memory exhausted."""
    from detector.ingest.config import BridgeConfig, Target
    from streams.bridge import Bridge

    exporters.pages["/a/metrics"] = node_a()  # about 20 kB
    target = Target(url=f"http://{exporters.address}/a/metrics")
    sent: list[str] = []

    async def send(topic: str, key: str, value: bytes) -> None:
        sent.append(key)

    async def go(max_bytes: int) -> Any:
        bridge = Bridge(BridgeConfig(targets=[target], max_bytes=max_bytes), send)
        try:
            return await bridge.scrape(target)
        finally:
            await bridge.close()

    refused = asyncio.run(go(4096))
    assert (refused.ok, refused.error, sent) == (False, f"{target.address()}: response longer than max_bytes (4096 bytes)", [])
    assert asyncio.run(go(1 << 20)).ok and sent == ["gpu-node-a"]


@pytest.mark.integration
def test_several_clusters_are_merged_once_per_answer_not_per_dcgm_scrape(exporters: Exporters) -> None:
    """Two kube-state-metrics (two clusters): the DCGM mapping of every exporter reads one merged state,
    made again only when a cluster answers anew (a thousand exporters a round each copied every pod)."""
    from detector.ingest.config import BridgeConfig, Target
    from streams.bridge import Bridge

    exporters.pages["/east/metrics"] = ksm_text(node("east-1", "aws:///us-east-1a/i-0e1", "p4d.24xlarge", "us-east-1", 8))
    exporters.pages["/west/metrics"] = ksm_text(node("west-1", "aws:///us-west-2a/i-0w1", "p4d.24xlarge", "us-west-2", 8))
    east, west = (Target(url=f"http://{exporters.address}/{c}/metrics", job="kube-state-metrics") for c in ("east", "west"))

    async def send(topic: str, key: str, value: bytes) -> None:
        pass

    async def go() -> None:
        bridge = Bridge(BridgeConfig(targets=[east, west], listen=""), send, clock=lambda: 1_796_000_000.0)
        try:
            assert all([(await bridge.scrape(east)).ok, (await bridge.scrape(west)).ok])
            merged = bridge.kube(1_796_000_000.0)
            assert merged is not None and set(merged.nodes) == {"east-1", "west-1"}
            assert bridge.kube(1_796_000_000.0) is merged  # the same state for the next exporter
            exporters.pages["/west/metrics"] = ksm_text(merge(
                node("west-1", "aws:///us-west-2a/i-0w1", "p4d.24xlarge", "us-west-2", 8),
                node("west-2", "aws:///us-west-2a/i-0w2", "p4d.24xlarge", "us-west-2", 8)))  # fmt: skip
            assert (await bridge.scrape(west)).ok
            again = bridge.kube(1_796_000_000.0)
            assert again is not merged and set(again.nodes) == {"east-1", "west-1", "west-2"}  # type: ignore[union-attr]
        finally:
            await bridge.close()

    asyncio.run(go())


@pytest.mark.integration
def test_once_fails_on_a_file_sd_file_it_cannot_read(tmp_path: Path, exporters: Exporters, broker: EmbeddedBroker) -> None:
    """`--once` checks a config: a file_sd file that is not JSON is a FAILED line naming the file and
    line, and exit 1, though the static target was scraped (before: a log line, and exit 0)."""
    exporters.pages["/a/metrics"] = node_a()
    (tmp_path / "dcgm.json").write_text('[{"targets": ["10.0.0.5:9400"]}\n{"targets": []}]')
    (tmp_path / "bridge.yaml").write_text(json.dumps({
        "listen": "", "targets": [{"url": f"http://{exporters.address}/a/metrics"}],
        "file_sd": [{"files": ["dcgm.json"]}]}))  # fmt: skip

    run = burnwatch("bridge", "--config", str(tmp_path / "bridge.yaml"), "--once", env=kafka_env(broker))

    no_traceback(run)
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"FAILED file_sd            {tmp_path / 'dcgm.json'}:2: not JSON: Expecting ',' delimiter" in run.stdout
    assert f"ok     dcgm               http://{exporters.address}/a/metrics: 1 hosts, 8 GPUs" in run.stdout


def test_an_unreachable_target_says_why_in_plain_words() -> None:
    """aiohttp's own text of a refused connection carries 'ssl:default' even for plain http."""
    from detector.ingest.config import BridgeConfig
    from streams.bridge import Bridge
    from streams.embedded import free_port

    url = f"http://127.0.0.1:{free_port()}/metrics"

    async def go() -> list[str]:
        async def send(topic: str, key: str, value: bytes) -> None:
            raise AssertionError("nothing to publish")

        bridge = Bridge(BridgeConfig.model_validate({"listen": "", "targets": [{"url": url, "job": "dcgm"}]}), send)
        try:
            return [r.error for r in await bridge.round()]
        finally:
            await bridge.close()

    (error,) = asyncio.run(go())
    assert error.startswith(f"{url}: unreachable: ") and "ssl" not in error


@pytest.mark.integration
def test_more_hung_targets_than_a_connection_pool_holds_delay_no_healthy_one(exporters: Exporters) -> None:
    """aiohttp's default pool of 100 connections was shared by every target: 150 exporters that hang
    (a zone down, packets dropped) held them all, and a healthy target queued behind them failed with
    'no answer within 1s' though it answers at once."""
    from detector.ingest.config import BridgeConfig, Target
    from streams.bridge import Bridge

    exporters.server.socket.listen(512)  # http.server's backlog of 5 would drop the connections' SYNs
    exporters.pages["/a/metrics"] = node_a()
    hung = [Target(url=f"http://{exporters.address}/slow/{i}", timeout=1) for i in range(150)]
    healthy = Target(url=f"http://{exporters.address}/a/metrics", timeout=1)

    async def send(topic: str, key: str, value: bytes) -> None:
        pass

    async def go() -> list[Any]:
        bridge = Bridge(BridgeConfig(targets=[*hung, healthy], listen=""), send)
        try:
            return await bridge.round()
        finally:
            await bridge.close()

    results = asyncio.run(go())
    assert [r.ok for r in results] == [False] * 150 + [True], results[-1].error


def test_the_bridge_raises_its_open_files_limit_to_the_hard_one() -> None:
    """With no pool limit each target has a socket of its own, all at once: a shell's soft limit of
    1,024 open files would fail the round past ~1,000 targets, so the bridge takes the hard limit."""
    import subprocess
    import sys

    code = ("import resource\n"
            "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
            "from streams.bridge import open_files_limit\n"
            "print(open_files_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    said, now, hard = (int(v) for v in out.stdout.split())
    assert said == now
    assert now == hard or hard == -1  # RLIM_INFINITY, which some kernels refuse as a soft limit
    assert now > 256


# (what the exporter answers, raw; the error the scrape reports after the target's URL)
BROKEN_ANSWERS = [
    # not HTTP at all (a wrong port: an SSH or Redis server); before: "unreachable: 400, message=..."
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
     "not a valid HTTP answer: Bad status line: Expected HTTP/, RTSP/ or ICE/: b'SSH-2.0-OpenSSH_9.6'"),
    # a proxy that says gzip and sends something else: aiohttp's own "400" read as the exporter's HTTP status
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 8\r\nConnection: close\r\n\r\nnot gzip",
     "answer cut short or not decodable: Can not decode content-encoding: gzip"),
    # the exporter died mid-answer
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nConnection: close\r\n\r\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 5\n",
     "answer cut short or not decodable: Not enough data to satisfy content length header (received 32 of 1000 bytes)."),
    # a redirect to itself
    (b"HTTP/1.1 302 Found\r\nLocation: /metrics\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", "too many redirects"),
]  # fmt: skip


@pytest.mark.parametrize("answer, said", BROKEN_ANSWERS)
def test_a_broken_http_answer_is_named_for_what_it_is_not_an_http_400(answer: bytes, said: str) -> None:
    from detector.ingest.config import BridgeConfig, Target
    from streams.bridge import Bridge

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        writer.write(answer)
        await writer.drain()
        writer.close()

    async def send(topic: str, key: str, value: bytes) -> None:
        raise AssertionError("nothing to publish")

    async def go() -> str:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        target = Target(url=f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/metrics")
        bridge = Bridge(BridgeConfig(targets=[target], listen=""), send)
        try:
            result = await bridge.scrape(target)
            assert not result.ok
            return result.error.removeprefix(f"{target.address()}: ")
        finally:
            await bridge.close()
            server.close()

    assert asyncio.run(go()) == said


@pytest.mark.integration
def test_once_fails_when_kafka_takes_nothing_the_targets_gave(tmp_path: Path, exporters: Exporters) -> None:
    """`--once` checks a config end to end: before, a round whose every message Kafka refused (a topic
    it may not write, a message too large) printed 'ok' and exited 0. The target stays up on
    /metrics: it answered; Kafka's refusals have their own counter."""
    from aiokafka.errors import TopicAuthorizationFailedError

    from detector.ingest.config import BridgeConfig, Target
    from streams.bridge import Bridge

    exporters.pages["/a/metrics"] = node_a()
    target = Target(url=f"http://{exporters.address}/a/metrics")

    async def send(topic: str, key: str, value: bytes) -> None:
        raise TopicAuthorizationFailedError()

    async def go() -> tuple[list[Any], Bridge]:
        bridge = Bridge(BridgeConfig(targets=[target], listen=""), send)
        try:
            return await bridge.round(), bridge
        finally:
            await bridge.close()

    (result,), bridge = asyncio.run(go())
    assert not result.ok and (result.hosts, result.gpus, result.unpublished) == (1, 8, 1)
    assert result.error == (f"{target.address()}: scraped, but Kafka did not take 1 of 1 messages: "
                            "TopicAuthorizationFailedError: [Error 29] TopicAuthorizationFailedError")  # fmt: skip
    value = bridge.metrics.registry.get_sample_value
    assert value("burnwatch_bridge_target_up", {"target": target.address(), "job": "dcgm"}) == 1
    assert value("burnwatch_bridge_publish_failures_total", {"topic": TOPIC_GPU_METRICS}) == 1


@pytest.mark.integration
def test_a_target_file_sd_drops_takes_its_skipped_series_off_metrics(tmp_path: Path, exporters: Exporters) -> None:
    """Its `up` and `scrapes_total` went with it, its `skipped_total` stayed: with nodes coming and going
    all day, /metrics grew by a series per departed node and reason."""
    from detector.ingest.config import load_bridge_config
    from streams.bridge import Bridge

    exporters.pages["/old/metrics"] = 'DCGM_FI_DEV_GPU_UTIL{Hostname="old-node"} 5\n'  # no gpu label: skipped
    exporters.pages["/new/metrics"] = node_a()
    sd = tmp_path / "dcgm.json"
    sd.write_text(json.dumps([{"targets": [exporters.address], "labels": {"__metrics_path__": "/old/metrics"}}]))
    (tmp_path / "bridge.yaml").write_text(json.dumps({"interval": "0.1s", "listen": "", "file_sd": [{"files": [str(sd)]}]}))
    bridge = Bridge(load_bridge_config(tmp_path / "bridge.yaml"), lambda topic, key, value: asyncio.sleep(0))
    old = f"http://{exporters.address}/old/metrics"

    def series(target: str) -> list[str]:
        return [line for line in bridge.render_metrics().decode().splitlines() if f'target="{target}"' in line]

    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(bridge.run(stop))
        try:
            await wait_for(lambda: any("burnwatch_bridge_skipped_total" in line for line in series(old)))
            sd.write_text(json.dumps([{"targets": [exporters.address], "labels": {"__metrics_path__": "/new/metrics"}}]))
            await wait_for(lambda: series(f"http://{exporters.address}/new/metrics"))
            await asyncio.sleep(0.3)  # a scrape of the old target in flight when it was dropped has ended
        finally:
            stop.set()
            await task
            await bridge.close()

    asyncio.run(go())
    assert series(old) == []


def test_a_password_in_a_target_url_reaches_neither_metrics_nor_results(exporters: Exporters) -> None:
    """A target behind basic auth (``http://user:password@host/metrics``) was labelled with its whole URL
    on /metrics and in ``--once``'s lines and errors: the password stays out of them."""
    from detector.ingest.config import BridgeConfig, Target
    from streams.bridge import Bridge

    exporters.pages["/a/metrics"] = node_a()
    good = Target(url=f"http://scraper:s3cret-pw@{exporters.address}/a/metrics", timeout=5)
    missing = Target(url=f"http://scraper:s3cret-pw@{exporters.address}/nothing-here", timeout=5)

    async def send(topic: str, key: str, value: bytes) -> None:
        pass

    async def go() -> tuple[list[Any], bytes]:
        bridge = Bridge(BridgeConfig(targets=[good, missing], listen=""), send)
        try:
            return await bridge.round(), bridge.render_metrics()
        finally:
            await bridge.close()

    results, page = asyncio.run(go())
    assert [r.ok for r in results] == [True, False]
    said = " ".join(f"{r.target} {r.error}" for r in results) + page.decode()
    assert "s3cret-pw" not in said, said
    assert results[0].target == f"http://scraper:[redacted]@{exporters.address}/a/metrics"  # still says which


def test_a_fleets_targets_are_scraped_spread_over_the_interval_not_in_one_instant() -> None:
    """Every target's scrapes followed its first by whole intervals, so a fleet's thousands of exporters
    were fetched, parsed and published in the same instant every 30 s. Each now keeps a phase of its own
    from its address (stable across restarts), its second scrape half an interval to one and a half after
    its first."""
    from streams.bridge import _phase

    addresses = [f"http://10.{i // 250}.{i % 250}.7:9400/metrics" for i in range(2000)]
    phases = [_phase(a, 30.0) for a in addresses]
    assert all(15.0 <= p < 45.0 for p in phases)
    tenths = {int((p - 15.0) / 3.0) for p in phases}
    assert tenths == set(range(10))  # every tenth of the interval has targets
    busiest = max(sum(1 for p in phases if int((p - 15.0) / 3.0) == t) for t in range(10))
    assert busiest < 2000 * 0.15  # none holds much more than its share
    assert phases == [_phase(a, 30.0) for a in addresses]  # the same after a restart


@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback")
@pytest.mark.parametrize("listen", ["0.0.0.0", "[::]"])
def test_metrics_on_every_interface_answers_over_ipv4_and_ipv6(listen: str) -> None:
    """``0.0.0.0`` (deploy/k8s/bridge.yaml's) bound IPv4 alone: on an IPv6-only cluster (EKS in IPv6 mode) the
    kubelet's liveness probe reaches the pod by its IPv6 address and restarted the bridge every two minutes.
    ``::`` bound IPv6 alone (asyncio sets IPV6_V6ONLY). Both mean every interface, as they do to Go's servers."""
    import aiohttp

    from detector.ingest.config import BridgeConfig
    from streams.bridge import Bridge, serve_metrics
    from streams.embedded import free_port

    async def go() -> list[int]:
        async def send(topic: str, key: str, value: bytes) -> None:
            pass

        port = free_port()
        runner = await serve_metrics(Bridge(BridgeConfig(), send), f"{listen}:{port}")
        try:
            async with aiohttp.ClientSession() as session:
                answers = []
                for host in ("127.0.0.1", "[::1]"):
                    async with session.get(f"http://{host}:{port}/metrics") as response:
                        answers.append(response.status)
                return answers
        finally:
            await runner.cleanup()

    assert asyncio.run(go()) == [200, 200]


def test_the_worker_binds_every_interface_for_0_0_0_0_and_what_it_is_told_otherwise() -> None:
    """The worker's web server (probes, Slack's clicks, Prometheus) as the bridge's /metrics: ``0.0.0.0``, the
    container files' setting, is IPv6 too."""
    from detector.settings import Settings
    from streams.topology import make_app

    apps = {host: make_app(Settings(BURNWATCH_WEB_HOST=host)).conf for host in ("0.0.0.0", "::", "127.0.0.1", "::1")}
    assert {host: conf.web_bind for host, conf in apps.items()} == {"0.0.0.0": "", "::": "", "127.0.0.1": "127.0.0.1",
                                                                    "::1": "::1"}  # fmt: skip
    assert str(apps["::1"].canonical_url) == "http://[::1]:6066"  # "::" was refused: Faust's URL of itself


@pytest.mark.integration
def test_kube_state_samples_over_an_hour_behind_are_counted_where_they_are_left_out(exporters: Exporters) -> None:
    """A /federate's kube-state-metrics samples over an hour behind the scrape are left out (dce94fe): a node
    removed or a pod deleted hours ago. A federate whose kube-state-metrics stopped an hour ago, or a bridge
    whose clock runs an hour ahead, lost every node that way with nothing said, where the GPU samples so old
    are counted: the left-out samples are counted among the scrape's skipped, on /metrics and in --once."""
    from detector.ingest.config import BridgeConfig, Target
    from streams.bridge import Bridge

    t = 1_796_000_000.0
    live, old = int((t - 20) * 1000), int((t - 5 * 3600) * 1000)
    page = ksm_text(merge(node("n1", "aws:///us-east-1a/i-0n1", "p4d.24xlarge", "us-east-1", 8),
                          node("n2", "aws:///us-east-1a/i-0n2", "p4d.24xlarge", "us-east-1", 8)), ts_ms=live)  # fmt: skip
    lines = [line.replace(f" {live}", f" {old}") if 'node="n2"' in line else line for line in page.splitlines()]
    gone = sum(1 for line in lines if line.endswith(f" {old}"))
    exporters.pages["/federate"] = "\n".join(lines) + "\n"
    target = Target(url=f"http://{exporters.address}/federate", job="federate")

    async def send(topic: str, key: str, value: bytes) -> None:
        pass

    async def go() -> Any:
        bridge = Bridge(BridgeConfig(targets=[target], listen=""), send, clock=lambda: t)
        try:
            result = await bridge.scrape(target)
            return result, bridge.kube(t), bridge.render_metrics().decode()
        finally:
            await bridge.close()

    result, state, metrics = asyncio.run(go())
    assert result.ok and state is not None and set(state.nodes) == {"n1"}
    reason = "kube-state-metrics sample over an hour behind the scrape (a node or pod gone)"
    assert gone and result.skipped == {reason: gone}
    assert f'reason="{reason}"' in metrics
