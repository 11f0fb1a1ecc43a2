"""The Kubernetes objects an alert's target names, read as hostile input.

A GPU alert lists the pods holding the GPUs in ``details["pods"]`` (as
:func:`detector.detectors.pods.listing` writes them: namespace, pod, ``workload``
``Kind/name`` and the labels an action needs). Everything there came from an exporter
and may be absurd or an injection, so a pod is only read when its namespace and names
are valid Kubernetes names, and a label only when it is a plain string of bounded length.
An action stops one thing: a target whose pods name several is not acted on (see
:func:`only`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from detector.remediation.base import NotApplicable, Target

__all__ = ["MAX_LABEL", "PodRef", "only", "pod_labels", "pods_of", "shown", "valid_name", "valid_namespace"]

_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""A DNS-1123 subdomain: a Deployment's, Notebook's or InferenceService's name."""
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
"""A DNS-1123 label: a namespace."""
MAX_LABEL = 253
"""Longest label value read (Kubernetes allows 63; a cloud tag 256)."""

T = TypeVar("T")


def valid_namespace(value: object) -> bool:
    """Whether ``value`` is a namespace Kubernetes would accept (a DNS-1123 label)."""
    return isinstance(value, str) and len(value) <= 63 and _LABEL.fullmatch(value) is not None


def valid_name(value: object) -> bool:
    """Whether ``value`` is an object name Kubernetes would accept (a DNS-1123 subdomain)."""
    return isinstance(value, str) and len(value) <= 253 and _NAME.fullmatch(value) is not None


def shown(value: object, limit: int = 60) -> str:
    """``value`` safe to put in a reason: quoted, control characters escaped, cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class PodRef:
    """A pod the target lists, with its controller."""

    namespace: str
    pod: str
    kind: str = ""
    """Its controller's kind (``Deployment``, ``StatefulSet``, ``Notebook``...); empty: a bare pod."""
    name: str = ""
    """Its controller's name (a valid Kubernetes name when ``kind`` is set)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """The labels an action reads (``notebook-name``, ``hub.jupyter.org/username``...), unchecked
    beyond being short strings: each executor validates what it uses."""

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.pod}"


def _pod(item: object, index: int) -> PodRef:
    if not isinstance(item, Mapping):
        raise NotApplicable(f"pod {index} of the alert is not an object")
    namespace, pod, workload = item.get("namespace"), item.get("pod", ""), item.get("workload", "")
    if not valid_namespace(namespace):
        raise NotApplicable(f"pod {index}: {shown(namespace)} is not a valid Kubernetes namespace")
    assert isinstance(namespace, str)
    if not isinstance(pod, str) or not valid_name(pod):
        raise NotApplicable(f"pod {index}: {shown(pod)} is not a valid pod name")
    if not isinstance(workload, str):
        raise NotApplicable(f"pod {index}: its workload {shown(workload)} is not Kind/name")
    kind, name = "", ""
    if workload:
        kind, sep, name = workload.partition("/")
        if not sep or not re.fullmatch(r"[A-Z][A-Za-z0-9]{0,62}", kind) or not valid_name(name):
            raise NotApplicable(f"pod {namespace}/{pod}: its workload {shown(workload)} is not Kind/name")
    raw = item.get("labels") or {}
    labels: dict[str, str] = {}
    if isinstance(raw, Mapping):
        labels = {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str) and len(v) <= MAX_LABEL}
    return PodRef(namespace=namespace, pod=pod, kind=kind, name=name, labels=labels)


def pods_of(target: Target) -> list[PodRef]:
    """The pods ``target`` lists; :class:`NotApplicable` when it lists none, lists only some
    (``pods_more``: the rest are unknown), or one of them is malformed."""
    pods = target.details.get("pods")
    if not pods:
        raise NotApplicable("the alert names no Kubernetes pod")
    if not isinstance(pods, list | tuple):
        raise NotApplicable("the alert's pods are not a list")
    more = target.details.get("pods_more")
    if more:
        raise NotApplicable(f"the alert lists {len(pods)} pods and {shown(more)} more: too many to act on as one")
    return [_pod(item, i) for i, item in enumerate(pods)]


def pod_labels(target: Target) -> list[Mapping[str, Any]]:
    """The ``labels`` of each pod the target lists that has them as an object (to tell which
    executor a target is for; :func:`pods_of` then reads them strictly)."""
    pods = target.details.get("pods")
    if not isinstance(pods, list | tuple):
        return []
    return [p["labels"] for p in pods if isinstance(p, Mapping) and isinstance(p.get("labels"), Mapping)]


def only(items: Iterable[T], key: Callable[[T], Any], what: str) -> T:
    """The one distinct item (by ``key``) of ``items``: an action stops one thing, and a host
    shared by several is left to people. :class:`NotApplicable` otherwise."""
    distinct: dict[Any, T] = {}
    for item in items:
        distinct.setdefault(key(item), item)
    if len(distinct) != 1:
        raise NotApplicable(f"the alert's pods belong to {len(distinct)} {what}s: an action stops one")
    return next(iter(distinct.values()))
