"""kube-state-metrics samples -> what the bridge needs to know of a cluster.

Per node: the cloud instance it is (``providerID`` of ``kube_node_info``), its type,
region and capacity type (``kube_node_labels``), the GPUs it offers
(``kube_node_status_allocatable``) and the GPUs its unfinished pods request
(``kube_pod_container_resource_requests``). Per pod: its controller
(``kube_pod_owner``, a ReplicaSet followed to its Deployment, a Job to its CronJob)
and its ownership labels (``kube_pod_labels`` over ``kube_namespace_labels``).

kube-state-metrics exposes only the Kubernetes labels it is told to
(``--metric-labels-allowlist``), each as ``label_<name>`` with every character
that is not a letter, digit or underscore replaced by ``_``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from detector.ingest.labels import label
from detector.ingest.prometheus import MAX_BEHIND_S, Sample, plausible_time

__all__ = ["DEFAULT_TAG_LABELS", "KubeState", "Node", "instance_id", "kube_state"]

DEFAULT_TAG_LABELS = ("team", "owner", "department", "env", "app", "project", "notebook-name", "hub.jupyter.org/username",
                      "hub.jupyter.org/servername", "serving.kserve.io/inferenceservice")  # fmt: skip
"""OpenCost's default owner labels, ``project``, the label Kubeflow's notebook controller puts
on a notebook's pods (its alert then says how to stop the notebook, not the StatefulSet under it),
and the labels JupyterHub's KubeSpawner and KServe put on theirs (the ``cull_notebook`` and
``scale_to_zero`` actions read them)."""

_INSTANCE_TYPE = ("label_node_kubernetes_io_instance_type", "label_beta_kubernetes_io_instance_type")
_REGION = ("label_topology_kubernetes_io_region", "label_failure_domain_beta_kubernetes_io_region")
_SPOT = {
    "label_eks_amazonaws_com_capacity_type": "spot",  # EKS managed node groups: SPOT / ON_DEMAND
    "label_karpenter_sh_capacity_type": "spot",  # Karpenter: spot / on-demand
    "label_cloud_google_com_gke_spot": "true",  # GKE Spot VMs
    "label_cloud_google_com_gke_preemptible": "true",  # GKE preemptible VMs
    "label_kubernetes_azure_com_scalesetpriority": "spot",  # AKS spot node pools
}
_FINISHED = {"Succeeded", "Failed"}
_HOLDING = {"Running", "Pending"}
_OWNER_CHAINS = {"ReplicaSet": "replicaset", "Job": "job_name"}
"""Owner kinds whose own owner kube-state-metrics reports (``kube_replicaset_owner``,
``kube_job_owner``), and the label that names them there."""


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def gpu_resource(resource: str) -> bool:
    """``nvidia.com/gpu`` and the MIG resources (``nvidia.com/mig-1g.10gb``), as kube-state-metrics spells them."""
    return resource.startswith("nvidia_com_gpu") or resource.startswith("nvidia_com_mig_")


def instance_id(provider_id: str) -> tuple[str, str] | None:
    """(provider, the id billing uses) of a node's ``spec.providerID``; None when empty.

    - ``aws:///us-east-1a/i-0abc`` -> ``("aws", "i-0abc")``: the EC2 instance id.
    - ``gce://project/us-central1-a/gpu-node-1`` -> ``("gcp", "gpu-node-1")``: the instance name.
    - ``azure:///subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachines/vm1``
      -> ``("azure", "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachines/vm1")``:
      the ARM resource id in lower case, as Azure cost exports write it (a scale set's
      instance keeps its ``.../virtualmachinescalesets/SS/virtualmachines/3``).
    - any other scheme: the last path segment.
    """
    text = provider_id.strip()
    if not text or "://" not in text:
        return None
    scheme, rest = text.split("://", 1)
    scheme = scheme.lower()
    if scheme == "azure":
        path = "/" + rest.strip("/")
        return ("azure", path.lower()) if path != "/" else None
    segments = [s for s in rest.split("/") if s]
    if not segments:
        return None
    return ("gcp" if scheme == "gce" else scheme), segments[-1]


@dataclass
class Node:
    """A node as kube-state-metrics describes it."""

    name: str
    provider: str = ""
    instance_id: str = ""
    """From ``providerID``; empty when the node has none."""
    internal_ip: str = ""
    instance_type: str = ""
    region: str = ""
    pricing: str = "on_demand"
    gpus_allocatable: float = 0.0
    gpus_requested: float = 0.0
    """GPUs (and MIG instances) requested by the node's pods that have not finished."""
    t: float | None = None
    """The sample time of its ``kube_node_info``, when the exposition carried one."""
    tags: dict[str, str] = field(default_factory=dict)
    """The node's own ``tag_labels`` (a node pool labelled ``team=platform``): its usage events' tags."""


@dataclass
class KubeState:
    """One kube-state-metrics scrape, indexed for the DCGM mapping."""

    t: float
    """When it was scraped (epoch seconds): stale state is not used."""
    nodes: dict[str, Node] = field(default_factory=dict)
    workloads: dict[tuple[str, str], str] = field(default_factory=dict)
    """(namespace, pod) -> ``Kind/name`` of its controller."""
    pod_tags: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    namespace_tags: dict[str, dict[str, str]] = field(default_factory=dict)
    pods: set[tuple[str, str]] = field(default_factory=set)
    """(namespace, pod) of every pod ``kube_pod_info`` lists."""
    lists_nodes: bool = False
    """Whether the scrape had ``kube_node_info`` (kube-state-metrics can run without node metrics)."""
    gpu_pods: set[tuple[str, str]] = field(default_factory=set)
    """(namespace, pod) of the unfinished pods that request a GPU."""
    stale: int = 0
    """``kube_*`` samples left out as over :data:`MAX_BEHIND_S` behind the scrape: the bridge counts them
    among the scrape's skipped, so a federate whose kube-state-metrics stopped loses no node unsaid."""
    _by_ip: dict[str, str] = field(default_factory=dict)

    def node(self, host: str) -> Node | None:
        """The node a host label or address names: by node name, then by its internal IP."""
        found = self.nodes.get(host) or self.nodes.get(host.lower())
        if found is None and host in self._by_ip:
            found = self.nodes.get(self._by_ip[host])
        return found

    @classmethod
    def merged(cls, states: list[KubeState]) -> KubeState:
        """Several clusters' states (one kube-state-metrics each) as one."""
        out = cls(t=max(s.t for s in states), lists_nodes=any(s.lists_nodes for s in states))
        for s in states:
            out.nodes.update(s.nodes)
            out.workloads.update(s.workloads)
            out.pod_tags.update(s.pod_tags)
            out.namespace_tags.update(s.namespace_tags)
            out.pods |= s.pods
            out.gpu_pods |= s.gpu_pods
            out._by_ip.update(s._by_ip)
        return out

    def tags(self, namespace: str, pod: str) -> dict[str, str]:
        """Ownership tags of a pod: its namespace's labels, overridden by its own."""
        return {**self.namespace_tags.get(namespace, {}), **self.pod_tags.get((namespace, pod), {})}


def kube_state(samples: Iterable[Sample], t: float, tag_labels: Iterable[str] = DEFAULT_TAG_LABELS) -> KubeState:
    """Index the ``kube_*`` samples of one scrape (other names are ignored). A sample over
    :data:`MAX_BEHIND_S` behind ``t`` is no state now: a /federate that looks back far
    (VictoriaMetrics: a day) answers the last samples of nodes removed and pods deleted."""
    wanted = {f"label_{_sanitize(name)}": name for name in tag_labels}
    state = KubeState(t=t)
    by_name: dict[str, list[Sample]] = {}
    stale = t - MAX_BEHIND_S
    for s in samples:
        if not s.name.startswith("kube_"):
            continue
        if s.timestamp is not None and s.timestamp < stale:
            state.stale += 1
            continue
        by_name.setdefault(s.name, []).append(s)

    def node(name: str) -> Node:
        if name not in state.nodes:
            state.nodes[name] = Node(name)
        return state.nodes[name]

    state.lists_nodes = bool(by_name.get("kube_node_info"))
    for s in by_name.get("kube_node_info", ()):
        name = label(s.labels, "node")
        if not name:
            continue
        n = node(name)
        n.t = s.timestamp if s.timestamp is not None and plausible_time(s.timestamp, t) else None
        n.internal_ip = s.labels.get("internal_ip", "")
        if n.internal_ip:
            state._by_ip[n.internal_ip] = name
        ident = instance_id(s.labels.get("provider_id", ""))
        if ident:
            n.provider, n.instance_id = ident
    for s in by_name.get("kube_node_labels", ()):
        name = label(s.labels, "node")
        if not name:
            continue
        n = node(name)
        n.instance_type = next((s.labels[k] for k in _INSTANCE_TYPE if s.labels.get(k)), n.instance_type)
        n.region = next((s.labels[k] for k in _REGION if s.labels.get(k)), n.region)
        if any(s.labels.get(k, "").lower() == v for k, v in _SPOT.items()):
            n.pricing = "spot"
        n.tags = _tags(s.labels, wanted) or n.tags
    for s in by_name.get("kube_node_status_allocatable", ()):
        name = label(s.labels, "node")
        if name and gpu_resource(s.labels.get("resource", "")) and s.value > 0:
            node(name).gpus_allocatable += s.value

    phases: dict[tuple[str, str], set[str]] = {}
    for s in by_name.get("kube_pod_status_phase", ()):
        if s.value == 1:
            phases.setdefault((label(s.labels, "namespace"), label(s.labels, "pod")), set()).add(s.labels.get("phase", ""))
    pod_node = {(label(s.labels, "namespace"), label(s.labels, "pod")): label(s.labels, "node")
                for s in by_name.get("kube_pod_info", ())}  # fmt: skip
    state.pods = set(pod_node)
    for s in by_name.get("kube_pod_container_resource_requests", ()):
        if not gpu_resource(s.labels.get("resource", "")) or not s.value > 0:
            continue
        held_by = (label(s.labels, "namespace"), label(s.labels, "pod"))
        phase = phases.get(held_by)
        if phase is not None and not phase & _HOLDING:  # finished (or unknown): holds nothing
            continue
        state.gpu_pods.add(held_by)
        name = label(s.labels, "node") or pod_node.get(held_by, "")
        if name:  # a pending pod not yet scheduled holds no node's GPU
            node(name).gpus_requested += s.value

    owners = _owners(by_name)
    for s in by_name.get("kube_pod_owner", ()):
        kind, owner = s.labels.get("owner_kind", ""), s.labels.get("owner_name", "")
        if not kind or kind == "<none>" or not owner or owner == "<none>":
            continue
        namespace = label(s.labels, "namespace")
        key = (namespace, label(s.labels, "pod"))
        if key in state.workloads and s.labels.get("owner_is_controller") != "true":
            continue
        kind, owner = owners.get((namespace, kind, owner), (kind, owner))
        state.workloads[key] = f"{kind}/{owner}"

    for s in by_name.get("kube_pod_labels", ()):
        tags = _tags(s.labels, wanted)
        if tags:
            state.pod_tags[(label(s.labels, "namespace"), label(s.labels, "pod"))] = tags
    for s in by_name.get("kube_namespace_labels", ()):
        tags = _tags(s.labels, wanted)
        if tags:
            state.namespace_tags[label(s.labels, "namespace")] = tags
    return state


def _owners(by_name: dict[str, list[Sample]]) -> dict[tuple[str, str, str], tuple[str, str]]:
    """(namespace, kind, name) of a ReplicaSet or Job -> (kind, name) of its controller."""
    out = {}
    for kind, name_label in _OWNER_CHAINS.items():
        for s in by_name.get(f"kube_{kind.lower()}_owner", ()):
            owner_kind, owner = s.labels.get("owner_kind", ""), s.labels.get("owner_name", "")
            if owner_kind and owner_kind != "<none>" and owner and owner != "<none>":
                out[(label(s.labels, "namespace"), kind, s.labels.get(name_label, ""))] = (owner_kind, owner)
    return out


def _tags(labels: dict[str, str], wanted: dict[str, str]) -> dict[str, str]:
    return {tag: labels[key] for key, tag in wanted.items() if labels.get(key)}
