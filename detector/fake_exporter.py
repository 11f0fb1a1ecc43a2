"""A stand-in for dcgm-exporter and kube-state-metrics, serving the simulator's Kubernetes nodes.

For the bridge's tests and the demo: burnwatch reads these exporters' Prometheus text
in production, and no GPU or cluster is reachable here. Each simulated node
(:mod:`detector.simulate_k8s`) gets a dcgm-exporter of its own on a loopback port
(dcgm-exporter runs as a DaemonSet, one per node, on ``:9400/metrics``), and one
kube-state-metrics endpoint describes the cluster:

- ``/metrics`` of a node's exporter renders its GPUs the way dcgm-exporter's template
  does (``FIELD{gpu="0",UUID="GPU-…",pci_bus_id="…",device="nvidia0",modelName="…",
  Hostname="<node name>"[,DCGM_FI_DRIVER_VERSION="…"][,container="…",namespace="…",pod="…"]} VALUE``),
  with HELP/TYPE lines and the fields of its ``default-counters.csv``: the profiling
  fields GR_ENGINE, PIPE_TENSOR and DRAM active, never SM_ACTIVE (commented out there).
  Pod labels appear on the GPUs a pod holds, as in its Kubernetes mode.
- ``/metrics`` of kube-state-metrics gives ``kube_node_info`` (``provider_id``: the node's
  instance), ``kube_node_labels``, ``kube_node_status_allocatable``, ``kube_pod_info``,
  ``kube_pod_owner``, ``kube_replicaset_owner``, ``kube_pod_labels``,
  ``kube_pod_container_resource_requests`` and ``kube_pod_status_phase``.

Simulated time, not the wall clock: every sample carries its timestamp in
milliseconds (the exposition format allows one), and each GET of a node's
``/metrics`` serves the next scrape (30 s of simulated time later), so a scraper
polling as fast as it can walks the simulated day. ``?t=<epoch seconds>`` serves a
given time instead and moves nothing. After the last scrape the exporter answers 503
(``simulated time is over``). kube-state-metrics describes the cluster as of the scrape
the nodes' exporters serve next (or at ``?t=``): a scraper that reads it first, as the
bridge does each round, then reads samples of the same instant, as it would from real
exporters scraped together.
"""

from __future__ import annotations

import math
import random
import threading
import zlib
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from detector.simulate_k8s import GpuSpan, K8sNode, Pod, k8s_sample

__all__ = ["DCGM_COUNTERS", "FakeExporters", "render_dcgm", "render_kube_state"]

DCGM_COUNTERS: list[tuple[str, str, str]] = [
    # The fields dcgm-exporter collects by default, with its Prometheus type and help text
    # (NVIDIA/dcgm-exporter, etc/default-counters.csv, Apache-2.0). DCGM_FI_DRIVER_VERSION
    # is a "label" there: it appears as a label of every other metric.
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes."),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
     "Ratio of cycles the device memory interface is active sending or receiving data."),  # fmt: skip
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus - including both "
     "protocol headers and data payloads - in bytes per second."),  # fmt: skip
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus - including both "
     "protocol headers and data payloads - in bytes per second."),  # fmt: skip
]
DRIVER_VERSION = "535.183.01"
FB_RESERVED_MIB = 512.0
CLOCKS = {"p4d.24xlarge": (1410, 1215), "p5.48xlarge": (1980, 2619)}
"""Busy SM clock and memory clock (MHz) of each node type's GPUs."""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)


def _dcgm_fields(node: K8sNode, gpu: int, span: GpuSpan, t: float, rng: random.Random) -> dict[str, str]:
    """Every default field's value for one GPU at ``t``, formatted as dcgm-exporter prints it
    (integers for integer fields, ``%f`` for doubles)."""
    s = k8s_sample(node, gpu, span, t, rng)
    work = s["gr_engine_active"]
    sm_clock, mem_clock = CLOCKS.get(node.instance_type, (1410, 1215))
    used = s["mem_used_mib"]
    elapsed = t - node_epoch(node)
    values: dict[str, Any] = {
        "DCGM_FI_DEV_SM_CLOCK": sm_clock if work > 0.05 else 210,
        "DCGM_FI_DEV_MEM_CLOCK": mem_clock,
        "DCGM_FI_DEV_MEMORY_TEMP": int(32 + 30 * work + rng.uniform(0, 3)),
        "DCGM_FI_DEV_GPU_TEMP": int(30 + 40 * work + rng.uniform(0, 3)),
        "DCGM_FI_DEV_POWER_USAGE": float(s["power_w"]),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": int(node.energy_mj(gpu, t)),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
        "DCGM_FI_DEV_GPU_UTIL": int(round(s["util_pct"])),
        "DCGM_FI_DEV_MEM_COPY_UTIL": int(s["dram_active"] * 100),
        "DCGM_FI_DEV_ENC_UTIL": 0,
        "DCGM_FI_DEV_DEC_UTIL": 0,
        "DCGM_FI_DEV_XID_ERRORS": 0,
        "DCGM_FI_DEV_FB_FREE": int(s["mem_total_mib"] - used - FB_RESERVED_MIB),
        "DCGM_FI_DEV_FB_USED": int(used),
        "DCGM_FI_DEV_FB_RESERVED": int(FB_RESERVED_MIB),
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": int(elapsed * 2e6),
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": float(s["gr_engine_active"]),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": float(s["tensor_active"]),
        "DCGM_FI_PROF_DRAM_ACTIVE": float(s["dram_active"]),
        "DCGM_FI_PROF_PCIE_TX_BYTES": int(2e9 * work + rng.uniform(0, 1e5)),
        "DCGM_FI_PROF_PCIE_RX_BYTES": int(3e9 * work + rng.uniform(0, 1e5)),
    }
    return {k: f"{v:f}" if isinstance(v, float) else str(v) for k, v in values.items()}


def node_epoch(node: K8sNode) -> float:
    """When the node booted: its first span's start (its energy and NVLink counters count from there)."""
    return min(spans[0].start for spans in node.spans if spans)


def render_dcgm(node: K8sNode, t: float, hostname_label: str = "Hostname") -> str:
    """One node's dcgm-exporter page at ``t`` (a Kubernetes-mode exporter on that node)."""
    rng = random.Random(f"{node.instance_id}-{t}")  # the same page for the same time
    ms = f" {int(round(t * 1000))}"
    gpus: list[tuple[str, dict[str, str]]] = []
    for gpu in range(node.gpus):
        span = node.span_at(gpu, t)
        if span is None:
            continue
        labels = [("gpu", str(gpu)), ("UUID", node.gpu_uuids[gpu]), ("pci_bus_id", node.pci_bus_id(gpu)),
                  ("device", f"nvidia{gpu}"), ("modelName", node.gpu_model), (hostname_label, node.node_name),
                  ("DCGM_FI_DRIVER_VERSION", DRIVER_VERSION)]  # fmt: skip
        if span.pod is not None:  # Go templates range over a map's keys in sorted order
            labels += [("container", span.pod.container), ("namespace", span.pod.namespace), ("pod", span.pod.name)]
        gpus.append((_labels(labels), _dcgm_fields(node, gpu, span, t, rng)))
    lines: list[str] = []
    for name, kind, help_text in DCGM_COUNTERS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{{{labels}}} {values[name]}{ms}" for labels, values in gpus]
    return "\n".join(lines) + "\n"


def _gauge(name: str, help_text: str, samples: list[tuple[list[tuple[str, str]], str]], ms: str) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    return lines + [f"{name}{{{_labels(labels)}}} {value}{ms}" for labels, value in samples]


def render_kube_state(nodes: list[K8sNode], t: float) -> str:
    """kube-state-metrics' page at ``t``: the nodes, and the pods holding their GPUs."""
    ms = f" {int(round(t * 1000))}"
    pods: list[tuple[K8sNode, Pod]] = [(node, pod) for node in nodes for pod in node.pods_at(t)]
    out: list[str] = []
    out += _gauge("kube_node_info", "Information about a cluster node.", [
        ([("node", n.node_name), ("kernel_version", "5.10.226-214.880.amzn2.x86_64"),
          ("os_image", "Amazon Linux 2"), ("container_runtime_version", "containerd://1.7.22"),
          ("kubelet_version", "v1.30.4-eks-a737599"), ("kubeproxy_version", "deprecated"),
          ("provider_id", n.provider_id), ("pod_cidr", ""), ("system_uuid", f"ec2{n.instance_id[2:10]}"),
          ("internal_ip", _internal_ip(n))], "1")
        for n in nodes], ms)  # fmt: skip
    out += _gauge("kube_node_labels", "Kubernetes labels converted to Prometheus labels.", [
        ([("node", n.node_name)] + sorted([
            ("label_eks_amazonaws_com_capacity_type", "ON_DEMAND"),
            ("label_eks_amazonaws_com_nodegroup", f"gpu-{n.instance_type.split('.')[0]}"),
            ("label_node_kubernetes_io_instance_type", n.instance_type),
            ("label_nvidia_com_gpu_product", n.gpu_model.replace(" ", "-")),
            ("label_topology_kubernetes_io_region", n.zone[:-1]),
            ("label_topology_kubernetes_io_zone", n.zone),
            *((f"label_{k}", v) for k, v in n.tags.items()),  # the node group's cost labels
        ]), "1")
        for n in nodes], ms)  # fmt: skip
    allocatable: list[tuple[list[tuple[str, str]], str]] = []
    for n in nodes:
        allocatable += [
            ([("node", n.node_name), ("resource", "cpu"), ("unit", "core")], "95.69"),
            ([("node", n.node_name), ("resource", "memory"), ("unit", "byte")], "1.157286469632e+12"),
            ([("node", n.node_name), ("resource", "nvidia_com_gpu"), ("unit", "integer")], str(n.gpus)),
            ([("node", n.node_name), ("resource", "pods"), ("unit", "integer")], "737"),
        ]
    out += _gauge("kube_node_status_allocatable",
                  "The allocatable for different resources of a node that are available for scheduling.",
                  allocatable, ms)  # fmt: skip
    out += _gauge("kube_pod_info", "Information about pod.", [
        ([("namespace", p.namespace), ("pod", p.name), ("uid", p.uid), ("host_ip", _internal_ip(n)),
          ("pod_ip", f"10.0.{zlib.crc32(p.uid.encode()) % 250}.{len(p.name) % 250 + 2}"), ("node", n.node_name),
          ("created_by_kind", _owner(p)[0]), ("created_by_name", _owner(p)[1]), ("priority_class", ""),
          ("host_network", "false")], "1")
        for n, p in pods], ms)  # fmt: skip
    out += _gauge("kube_pod_owner", "Information about the Pod's owner.", [
        ([("namespace", p.namespace), ("pod", p.name), ("uid", p.uid), ("owner_kind", _owner(p)[0]),
          ("owner_name", _owner(p)[1]), ("owner_is_controller", "true")], "1")
        for _, p in pods], ms)  # fmt: skip
    out += _gauge("kube_replicaset_owner", "Information about the ReplicaSet's owner.", [
        ([("namespace", p.namespace), ("replicaset", p.replicaset), ("owner_kind", "Deployment"),
          ("owner_name", p.workload.split("/", 1)[1]), ("owner_is_controller", "true")], "1")
        for _, p in pods if p.replicaset], ms)  # fmt: skip
    out += _gauge("kube_pod_labels", "Kubernetes labels converted to Prometheus labels.", [
        ([("namespace", p.namespace), ("pod", p.name), ("uid", p.uid)]
         + sorted((f"label_{k}", v) for k, v in [*p.labels, *_controller_labels(p)]), "1")
        for _, p in pods], ms)  # fmt: skip
    requests: list[tuple[list[tuple[str, str]], str]] = []
    for n, p in pods:
        where = [("namespace", p.namespace), ("pod", p.name), ("uid", p.uid), ("container", p.container),
                 ("node", n.node_name)]  # fmt: skip
        requests += [
            (where + [("resource", "cpu"), ("unit", "core")], str(4 * p.gpus)),
            (where + [("resource", "memory"), ("unit", "byte")], f"{64 * p.gpus * 2**30:.6e}"),
            (where + [("resource", "nvidia_com_gpu"), ("unit", "integer")], str(p.gpus)),
        ]
    out += _gauge("kube_pod_container_resource_requests",
                  "The number of requested request resource by a container. It is recommended to use the "
                  "kube_pod_resource_requests metric exposed by kube-scheduler instead, as it is more precise.",
                  requests, ms)  # fmt: skip
    out += _gauge("kube_pod_status_phase", "The pods current phase.", [
        ([("namespace", p.namespace), ("pod", p.name), ("uid", p.uid), ("phase", phase)],
         "1" if phase == "Running" else "0")
        for _, p in pods for phase in ("Pending", "Succeeded", "Failed", "Unknown", "Running")], ms)  # fmt: skip
    return "\n".join(out) + "\n"


def _owner(pod: Pod) -> tuple[str, str]:
    """What kube_pod_owner names: a Deployment's pods are owned by its ReplicaSet."""
    if pod.replicaset:
        return "ReplicaSet", pod.replicaset
    kind, name = pod.workload.split("/", 1)
    return kind, name


def _controller_labels(pod: Pod) -> list[tuple[str, str]]:
    """The labels Kubernetes' controllers put on their pods (sanitised as kube-state-metrics does)."""
    kind, name = pod.workload.split("/", 1)
    if kind == "Job":
        return [("batch_kubernetes_io_job_name", name), ("job_name", name)]
    if kind == "StatefulSet":
        return [("statefulset_kubernetes_io_pod_name", pod.name), ("app", name)]
    return [("pod_template_hash", pod.replicaset.rsplit("-", 1)[1]), ("app", name)]


def _internal_ip(node: K8sNode) -> str:
    return node.node_name.split(".")[0].removeprefix("ip-").replace("-", ".")


class _Clock:
    """A node's scrape schedule: the next scrape time, advanced by each page served."""

    def __init__(self, start: float, end: float, step: float) -> None:
        self.start, self.end, self.step = start, end, step
        self.k = 0
        self.lock = threading.Lock()

    def next(self) -> float | None:
        with self.lock:
            t = self.start + self.k * self.step
            if t >= self.end:
                return None
            self.k += 1
            return t

    @property
    def served(self) -> int:
        return self.k

    @property
    def steps(self) -> int:
        return max(0, math.ceil((self.end - self.start) / self.step))


class FakeExporters:
    """A dcgm-exporter per simulated node and one kube-state-metrics, on loopback ports.

    Use as a context manager; ``dcgm_urls[node_name]`` and ``kube_state_url`` are the
    scrape URLs. ``done`` says whether every node has served its last scrape.
    """

    def __init__(self, nodes: list[K8sNode], start: float, end: float, scrape_s: float = 30.0,
                 hostname_label: str = "Hostname", host: str = "127.0.0.1") -> None:  # fmt: skip
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"host {host!r}: the fake exporters bind to loopback only")
        self.nodes = nodes
        self.hostname_label = hostname_label
        self.host = host
        self.start, self.end, self.scrape_s = start, end, scrape_s
        self.clocks = {n.node_name: _Clock(start, end, scrape_s) for n in nodes}
        self.latest = start
        """The newest simulated time a node's exporter has served (kube-state-metrics describes it)."""
        self._latest_lock = threading.Lock()
        self._servers: list[ThreadingHTTPServer] = []
        self._threads: list[threading.Thread] = []
        self.dcgm_urls: dict[str, str] = {}
        self.kube_state_url = ""

    # -- lifecycle ------------------------------------------------------------

    def start_serving(self) -> FakeExporters:
        for node in self.nodes:
            port = self._serve(lambda query, node=node: self._dcgm_page(node, query))
            self.dcgm_urls[node.node_name] = f"http://{self.host}:{port}/metrics"
        port = self._serve(self._kube_state_page)
        self.kube_state_url = f"http://{self.host}:{port}/metrics"
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._servers, self._threads = [], []

    def __enter__(self) -> FakeExporters:
        return self.start_serving()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def done(self) -> bool:
        return all(clock.served >= clock.steps for clock in self.clocks.values())

    # -- pages ----------------------------------------------------------------

    def _dcgm_page(self, node: K8sNode, query: dict[str, list[str]]) -> tuple[int, str]:
        t = _asked_time(query)
        if t is None:
            t = self.clocks[node.node_name].next()
            if t is None:
                return 503, "simulated time is over: every scrape of this node has been served\n"
            with self._latest_lock:
                self.latest = max(self.latest, t)
        return 200, render_dcgm(node, t, self.hostname_label)

    def _kube_state_page(self, query: dict[str, list[str]]) -> tuple[int, str]:
        t = _asked_time(query)
        return 200, render_kube_state(self.nodes, self.now if t is None else t)

    @property
    def now(self) -> float:
        """The cluster's simulated time: the scrape the node exporters serve next (the last one
        once they have served it)."""
        clocks = list(self.clocks.values())
        if not clocks:
            return self.start
        k = min(min(c.served for c in clocks), max(0, min(c.steps for c in clocks) - 1))
        return self.start + k * self.scrape_s

    def _serve(self, page: Any) -> int:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                url = urlsplit(self.path)
                if url.path != "/metrics":
                    status, body = 404, "not found: the metrics are at /metrics\n"
                else:
                    try:
                        status, body = page(parse_qs(url.query))
                    except ValueError as exc:
                        status, body = 400, f"{exc}\n"
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:  # one line per scrape would flood the demo's output
                pass

        server = ThreadingHTTPServer((self.host, 0), Handler)
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, name="fake-exporter", daemon=True)
        thread.start()
        self._servers.append(server)
        self._threads.append(thread)
        return int(server.server_address[1])


def _asked_time(query: dict[str, list[str]]) -> float | None:
    """``?t=<epoch seconds>``, or None."""
    if "t" not in query:
        return None
    raw = query["t"][-1]
    try:
        t = float(raw)
    except ValueError:
        raise ValueError(f"t={raw!r}: expected the simulated time as epoch seconds") from None
    if not math.isfinite(t):
        raise ValueError(f"t={raw!r}: expected a finite time")
    return t
