"""Exposition text as dcgm-exporter and kube-state-metrics print it, for the ingest tests.

dcgm-exporter lines follow its render template (/work/shared/reference/dcgm-exporter/NOTES.md):
``FIELD{gpu="0",UUID="GPU-…",pci_bus_id="…",device="nvidia0",modelName="…"[,GPU_I_PROFILE="…",GPU_I_ID="…"]
[,hostname="…"][,labels (sorted)…][,attributes…]} VALUE``, one ``# HELP``/``# TYPE`` pair per field,
HELP texts from its default-counters.csv. kube-state-metrics lines are as v2 prints them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HELP = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("counter", "Total energy consumption since boot (in mJ)."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "Framebuffer memory reserved (in MiB)."),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
    "DCGM_FI_PROF_SM_ACTIVE": ("gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gauge", "Ratio of cycles the device memory interface is active sending or receiving data."),
}
MODEL = "NVIDIA A100-SXM4-40GB"


@dataclass
class Gpu:
    """One GPU (or MIG instance) as dcgm-exporter sees it, and the values it reports."""

    index: int
    values: dict[str, float]
    host: str = ""
    host_label: str = "Hostname"
    """``Hostname`` (released versions) or ``hostname`` (newer); empty host: no label at all."""
    uuid_label: str = "UUID"
    mig: tuple[str, str] | None = None
    """(GPU_I_PROFILE, GPU_I_ID)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Kubernetes mode: pod, namespace, container (or the older pod_name, ...)."""
    ts_ms: int | None = None
    model: str = MODEL
    uuid: str = ""
    """The GPU's UUID (default: one made from host and index)."""
    pci_bus_id: str = ""

    def line(self, name: str) -> str | None:
        if name not in self.values:
            return None
        uuid = self.uuid or f"GPU-{self.host or 'x'}-{self.index:04d}"
        bus = self.pci_bus_id or f"00000000:{16 + self.index:02X}:1C.0"
        parts = [f'gpu="{self.index}"', f'{self.uuid_label}="{uuid}"', f'pci_bus_id="{bus}"',
                 f'device="nvidia{self.index}"', f'modelName="{self.model}"']  # fmt: skip
        if self.mig:
            parts += [f'GPU_I_PROFILE="{self.mig[0]}"', f'GPU_I_ID="{self.mig[1]}"']
        if self.host:
            parts.append(f'{self.host_label}="{self.host}"')
        parts += [f'{k}="{v}"' for k, v in sorted(self.labels.items())]
        parts.append('DCGM_FI_DRIVER_VERSION="535.104.12"')
        value = self.values[name]
        text = str(int(value)) if float(value).is_integer() else repr(value)
        stamp = f" {self.ts_ms}" if self.ts_ms is not None else ""
        return f"{name}{{{','.join(parts)}}} {text}{stamp}"


def dcgm_text(gpus: list[Gpu]) -> str:
    """A dcgm-exporter ``/metrics`` page (families in the order of its default counters)."""
    out = []
    for name, (kind, help_text) in HELP.items():
        lines = [line for g in gpus if (line := g.line(name))]
        if lines:
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *lines]
    return "\n".join(out) + "\n"


def gpu_values(util: float, *, power: float | None = 250.0, energy: float | None = None, used: float = 30000,
               gr: float | None = None, tensor: float | None = None, dram: float | None = None) -> dict[str, float]:  # fmt: skip
    values = {"DCGM_FI_DEV_SM_CLOCK": 1410, "DCGM_FI_DEV_GPU_TEMP": 41, "DCGM_FI_DEV_GPU_UTIL": util,
              "DCGM_FI_DEV_MEM_COPY_UTIL": 3, "DCGM_FI_DEV_FB_USED": used, "DCGM_FI_DEV_FB_FREE": 40536 - used,
              "DCGM_FI_DEV_FB_RESERVED": 424}  # fmt: skip
    for name, value in (("DCGM_FI_DEV_POWER_USAGE", power), ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", energy),
                        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", gr), ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", tensor),
                        ("DCGM_FI_PROF_DRAM_ACTIVE", dram)):  # fmt: skip
        if value is not None:
            values[name] = value
    return values


KSM_HELP = {
    "kube_node_info": "[STABLE] Information about a cluster node.",
    "kube_node_labels": "[STABLE] Kubernetes labels converted to Prometheus labels.",
    "kube_node_status_allocatable": "[STABLE] The allocatable for different resources of a node that are available "
                                    "for scheduling.",
    "kube_pod_info": "[STABLE] Information about pod.",
    "kube_pod_status_phase": "[STABLE] The pods current phase.",
    "kube_pod_container_resource_requests": "The number of requested request resource by a container. It is "
        "recommended to use the kube_pod_resource_requests metric exposed by kube-scheduler instead, as it is more precise.",
    "kube_pod_owner": "[STABLE] Information about the Pod's owner.",
    "kube_replicaset_owner": "[STABLE] Information about the ReplicaSet's owner.",
    "kube_job_owner": "[STABLE] Information about the Job's owner.",
    "kube_pod_labels": "[STABLE] Kubernetes labels converted to Prometheus labels.",
    "kube_namespace_labels": "[STABLE] Kubernetes labels converted to Prometheus labels.",
}  # fmt: skip


def ksm_text(lines: dict[str, list[tuple[dict[str, str], float]]], ts_ms: int | None = None) -> str:
    """A kube-state-metrics page: ``{metric: [(labels, value), ...]}`` with its HELP/TYPE lines."""
    out = []
    for name, samples in lines.items():
        out += [f"# HELP {name} {KSM_HELP[name]}", f"# TYPE {name} gauge"]
        for labels, value in samples:
            body = ",".join(f'{k}="{v}"' for k, v in labels.items())
            out.append(f"{name}{{{body}}} {value:g}" + (f" {ts_ms}" if ts_ms is not None else ""))
    return "\n".join(out) + "\n"


def node(name: str, provider_id: str, instance_type: str, region: str, gpus: int, ip: str = "",
         extra_labels: dict[str, str] | None = None) -> dict[str, list[tuple[dict[str, str], float]]]:  # fmt: skip
    """kube-state-metrics' lines of one node (its info, labels, allocatable GPUs and CPU)."""
    return {
        "kube_node_info": [({"node": name, "kernel_version": "5.10.228", "os_image": "Amazon Linux 2",
                             "container_runtime_version": "containerd://1.7.23", "kubelet_version": "v1.31.2",
                             "kubeproxy_version": "deprecated", "provider_id": provider_id, "pod_cidr": "",
                             "system_uuid": "ec2c0ffe-0000", "internal_ip": ip or "10.0.0.1"}, 1)],  # fmt: skip
        "kube_node_labels": [({"node": name, "label_node_kubernetes_io_instance_type": instance_type,
                               "label_topology_kubernetes_io_region": region, **(extra_labels or {})}, 1)],  # fmt: skip
        "kube_node_status_allocatable": [({"node": name, "resource": "cpu", "unit": "core"}, 95.69),
                                         ({"node": name, "resource": "nvidia_com_gpu", "unit": "integer"}, gpus)],
    }


def pod(namespace: str, name: str, node_name: str, gpus: int, *, phase: str = "Running", owner: tuple[str, str] | None = None,
        labels: dict[str, str] | None = None) -> dict[str, list[tuple[dict[str, str], float]]]:  # fmt: skip
    """kube-state-metrics' lines of one pod that requests ``gpus`` GPUs."""
    uid = f"uid-{name}"
    out: dict[str, list[tuple[dict[str, str], float]]] = {
        "kube_pod_info": [({"namespace": namespace, "pod": name, "uid": uid, "host_ip": "10.0.0.1", "pod_ip": "10.1.0.9",
                            "node": node_name, "created_by_kind": owner[0] if owner else "<none>",
                            "created_by_name": owner[1] if owner else "<none>", "priority_class": "",
                            "host_network": "false"}, 1)],  # fmt: skip
        "kube_pod_status_phase": [({"namespace": namespace, "pod": name, "uid": uid, "phase": p}, 1 if p == phase else 0)
                                  for p in ("Pending", "Succeeded", "Failed", "Unknown", "Running")],
        "kube_pod_container_resource_requests": [({"namespace": namespace, "pod": name, "uid": uid, "container": "main",
                                                   "node": node_name, "resource": "nvidia_com_gpu", "unit": "integer"},
                                                  gpus)],  # fmt: skip
        "kube_pod_owner": [({"namespace": namespace, "pod": name, "uid": uid,
                             "owner_kind": owner[0] if owner else "<none>", "owner_name": owner[1] if owner else "<none>",
                             "owner_is_controller": "true" if owner else "<none>"}, 1)],  # fmt: skip
    }
    if labels:
        out["kube_pod_labels"] = [({"namespace": namespace, "pod": name, "uid": uid,
                                    **{f"label_{k.replace('-', '_')}": v for k, v in labels.items()}}, 1)]  # fmt: skip
    return out


def merge(*parts: dict[str, list[tuple[dict[str, str], float]]]) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for part in parts:
        for name, samples in part.items():
            out.setdefault(name, []).extend(samples)
    return out


def federate_text(pages: list[tuple[str, dict[str, str]]], ts_ms: int) -> str:
    """What a Prometheus server's ``/federate`` answers for these scraped pages: each page's
    samples with its target labels attached (a sample's own label that collides with one
    becomes ``exported_<name>``, honor_labels being false), labels sorted, every family
    ``untyped``, and the timestamp of Prometheus' scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    by_name: dict[str, list[str]] = {}
    for text, target in pages:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                name = family.name if family.type == "counter" else s.name
                labels = {(f"exported_{k}" if k in target else k): v for k, v in s.labels.items()} | target
                body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                value = repr(float(s.value)) if not float(s.value).is_integer() else str(int(s.value))
                by_name.setdefault(name, []).append(f"{name}{{{body}}} {value} {ts_ms}")
    out = []
    for name, lines in by_name.items():
        out += [f"# TYPE {name} untyped", *lines]
    return "\n".join(out) + "\n"
