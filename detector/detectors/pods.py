"""Who holds a GPU on Kubernetes, who owns it, and what to run to stop it.

dcgm-exporter's Kubernetes mode labels a GPU's samples with the pod holding it; the
bridge adds the pod's controller (``workload``, ``Kind/name``) and its and its
namespace's ownership labels (``tags``). The idle alerts use them three ways:

- **Owner.** ``team``, ``owner`` and ``project`` from the pod's labels, with OpenCost's
  default label names as fallbacks (``department`` for the team, ``app`` for the
  project; ``env`` kept as is). They win over the instance's tags for a pod's waste:
  the node belongs to the platform team, the idle GPUs to whoever runs the pod. With
  several pods, a label counts only when they all agree on it.
- **Details.** Each pod (namespace, name, workload, GPUs, owner, and the :data:`ACTION_LABELS`
  it has) goes in the finding.
- **Command.** What to run instead of "stop the instance" (which the node group would
  replace): ``Deployment``/``StatefulSet`` → ``kubectl scale --replicas=0``; ``Job`` →
  ``kubectl delete job``; a Kubeflow notebook (workload ``Notebook/NAME``, or a pod
  with the ``notebook-name`` label its controller sets) → the
  ``kubeflow-resource-stopped`` annotation its culler uses, which stops it and keeps its
  volume; a bare pod → ``kubectl delete pod``. Other controllers (a ReplicaSet that a
  Deployment may own, a DaemonSet, operators' kinds) get no command: their owner knows
  how to stop them. A command is built only from names that are valid Kubernetes names,
  so nothing pasted from an alert into a shell can do more than the command says.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import msgspec

from detector.detectors.base import ResourceInfo
from detector.events import GpuMetric

__all__ = ["ACTION_LABELS", "MAX_LISTED", "MAX_UNITS", "NOTEBOOK_LABEL", "OWNER_LABELS", "Pod", "listing", "owner_tags",
           "pod_facts", "pod_of", "stop_command", "with_owner"]

NOTEBOOK_LABEL = "notebook-name"
"""The label Kubeflow's notebook controller puts on a notebook's pods."""
ACTION_LABELS = (NOTEBOOK_LABEL, "hub.jupyter.org/username", "hub.jupyter.org/servername",
                 "serving.kserve.io/inferenceservice")  # fmt: skip
"""Labels that say which system stops a pod (a Kubeflow notebook, a JupyterHub user's server on
Kubernetes, a KServe InferenceService): listed with the pod for the actions of
:mod:`detector.remediation` to read."""
OWNER_LABELS = ("team", "owner", "project", "department", "env", "app", *ACTION_LABELS)
"""The labels kept of a pod's ``tags`` (the rest is not needed here)."""
MAX_UNITS = 2048
"""Units (GPUs and MIG instances) a detector tracks per host: 256 GPUs × 7 MIG instances fit,
and a producer that invents instance ids cannot grow the state without end."""
MAX_LISTED = 20
"""Pods listed in a finding's details; the rest are counted."""

_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""A DNS-1123 subdomain: what Kubernetes allows as a pod, Deployment, Job or Notebook name."""
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
"""A DNS-1123 label: what Kubernetes allows as a namespace."""


class Pod(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The pod holding a GPU, as its latest sample said."""

    namespace: str = ""
    pod: str = ""
    container: str = ""
    workload: str = ""
    tags: dict[str, str] = {}


_PODS: dict[tuple[Any, ...], Pod] = {}
_MAX_PODS = 10_000


def pod_of(ev: GpuMetric) -> Pod | None:
    """The pod a sample names (with only its ownership labels), or None. One :class:`Pod` for the
    samples that name it alike (a pod's every sample, on every scrape, in every rule's state): made
    once, found again by what it keeps (names and :data:`OWNER_LABELS`, the very strings the Pod
    holds: the table keeps nothing the Pods do not, not a sample's other labels, up to 1,024 of
    4 KB each). The table is bounded: past ``_MAX_PODS`` it starts afresh."""
    if not ev.pod:
        return None
    labels = ev.tags
    key = (ev.namespace, ev.pod, ev.container, ev.workload, *map(labels.get, OWNER_LABELS))  # (None: no such label)
    pod = _PODS.get(key)
    if pod is None:
        tags = {k: labels[k] for k in OWNER_LABELS if k in labels} if labels else {}
        if len(_PODS) >= _MAX_PODS:
            _PODS.clear()
        pod = _PODS[key] = Pod(namespace=ev.namespace, pod=ev.pod, container=ev.container, workload=ev.workload, tags=tags)
    return pod


def _owner(tags: dict[str, str]) -> dict[str, str]:
    """team / owner / project (and env) from a pod's labels, OpenCost's names as fallbacks."""
    out = {
        "team": tags.get("team") or tags.get("department", ""),
        "owner": tags.get("owner", ""),
        "project": tags.get("project") or tags.get("app", ""),
        "env": tags.get("env", ""),
    }
    return {k: v for k, v in out.items() if v}


def owner_tags(pods: Iterable[Pod]) -> dict[str, str]:
    """The ownership tags all the pods agree on (a label that differs between them is left out)."""
    values: dict[str, set[str]] = {}
    for pod in pods:
        for key, value in _owner(pod.tags).items():
            values.setdefault(key, set()).add(value)
    return {key: next(iter(vals)) for key, vals in values.items() if len(vals) == 1}


def with_owner(resource: ResourceInfo, pods: Iterable[Pod]) -> ResourceInfo:
    """``resource`` with its pods' ownership tags over the instance's (routing, mentions and
    the ledger's team read these)."""
    tags = owner_tags(pods)
    if not tags:
        return resource
    return msgspec.structs.replace(resource, tags={**resource.tags, **tags})


def stop_command(pod: Pod) -> str | None:
    """What to run to stop what holds the GPU, or None (unknown controller, or names that are
    not valid Kubernetes names)."""
    ns = pod.namespace
    if not _LABEL.fullmatch(ns) or len(ns) > 63:
        return None
    kind, _, name = pod.workload.partition("/")
    notebook = pod.tags.get(NOTEBOOK_LABEL, "") if kind in ("StatefulSet", "") else ""
    if kind == "Notebook" or notebook:
        target = name if kind == "Notebook" else notebook
        if not _valid(target):
            return None
        return (f"kubectl -n {ns} annotate notebook {target} "
                "kubeflow-resource-stopped=$(date -u +%Y-%m-%dT%H:%M:%SZ) --overwrite")  # fmt: skip
    if not pod.workload:
        return f"kubectl -n {ns} delete pod {pod.pod}" if _valid(pod.pod) else None
    if not _valid(name):
        return None
    if kind in ("Deployment", "StatefulSet"):
        return f"kubectl -n {ns} scale {kind.lower()}/{name} --replicas=0"
    if kind == "Job":
        return f"kubectl -n {ns} delete job {name}"
    return None


def _valid(name: str) -> bool:
    return len(name) <= 253 and _NAME.fullmatch(name) is not None


def listing(pods: dict[int, list[Pod]], commands: bool = True) -> dict[str, Any]:
    """The ``pods`` of a finding's details: each pod once (namespace, name, workload, the GPUs it
    holds, its owner labels, the command that stops it), at most :data:`MAX_LISTED`, and
    ``pods_more`` for the rest. ``pods`` maps a GPU index to the pods holding it (a MIG GPU
    can hold several)."""
    by_pod: dict[tuple[str, str], tuple[Pod, list[int]]] = {}
    for gpu in sorted(pods):
        for pod in pods[gpu]:
            entry = by_pod.setdefault((pod.namespace, pod.pod), (pod, []))
            if gpu not in entry[1]:
                entry[1].append(gpu)
    if not by_pod:
        return {}
    listed = []
    for (_, _), (pod, gpus) in sorted(by_pod.items())[:MAX_LISTED]:
        item: dict[str, Any] = {"namespace": pod.namespace, "pod": pod.pod, "gpus": gpus}
        if pod.workload:
            item["workload"] = pod.workload
        item.update(_owner(pod.tags))
        labels = {k: pod.tags[k] for k in ACTION_LABELS if k in pod.tags}
        if labels:
            item["labels"] = labels
        command = stop_command(pod) if commands else None
        if command:
            item["command"] = command
        listed.append(item)
    out: dict[str, Any] = {"pods": listed}
    if len(by_pod) > MAX_LISTED:
        out["pods_more"] = len(by_pod) - MAX_LISTED
    return out


def pod_facts(details: dict[str, Any]) -> list[tuple[str, str]]:
    """The alert's facts about the pods: who holds the GPUs (the commands are rendered apart)."""
    pods = details.get("pods") or []
    if not pods:
        return []
    names = []
    for p in pods[:5]:
        workload = f" ({p['workload']})" if p.get("workload") else ""
        names.append(f"{p.get('namespace', '')}/{p.get('pod', '')}{workload}")
    more = len(pods) - 5 + int(details.get("pods_more", 0))
    label = "Pod" if len(pods) == 1 else "Pods"
    return [(label, ", ".join(names) + (f" and {more} more" if more > 0 else ""))]
