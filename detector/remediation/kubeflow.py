"""``cull_notebook`` on Kubeflow: set the ``kubeflow-resource-stopped`` annotation.

This is what Kubeflow's own notebook culler and the dashboard's "stop" button do: the
notebook controller sees the annotation and scales the notebook's StatefulSet to zero; the
volume (the user's work) stays. Removing the annotation starts it again.

The call is a JSON merge patch of the Notebook custom resource (``kubeflow.org/v1``,
``notebooks``) in its namespace, made with the Kubernetes Python client; the value is the
time of the call in RFC 3339 (the worker's clock, not event time). A notebook already
annotated is left as it is (its stop time is kept), so acting twice changes nothing.

Which notebook: a pod whose controller is ``Notebook/NAME``, or a pod with the
``notebook-name`` label Kubeflow's controller sets (its controller is the StatefulSet the
Notebook owns).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any, ClassVar

from detector.remediation.base import ActionKind, Call, NotApplicable, Outcome, Target
from detector.remediation.kubeclient import FIELD_MANAGER, KubeClient, failure
from detector.remediation.workloads import PodRef, only, pod_labels, pods_of, shown, valid_name, valid_namespace

__all__ = ["ANNOTATION", "API", "NOTEBOOK_LABEL", "KubeflowCuller", "notebook_of"]

ANNOTATION = "kubeflow-resource-stopped"
NOTEBOOK_LABEL = "notebook-name"
GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "notebooks"
API = "kubeflow.org/v1.patch_namespaced_custom_object"


def notebook_of(pod: PodRef) -> str | None:
    """The Kubeflow notebook a pod belongs to (None: not a notebook's pod)."""
    if pod.kind == "Notebook":
        return pod.name
    label = pod.labels.get(NOTEBOOK_LABEL)
    if label is not None and pod.kind in ("StatefulSet", ""):
        if not valid_name(label):
            raise NotApplicable(f"{pod.where}: its {NOTEBOOK_LABEL} label {shown(label)} is not a valid notebook name")
        return label
    return None


def rfc3339(at: datetime) -> str:
    return at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeflowCuller:
    """Stops a Kubeflow notebook."""

    kind: ClassVar[ActionKind] = "cull_notebook"

    def __init__(self, kube: KubeClient | None = None, clock: Callable[[], datetime] | None = None) -> None:
        self.kube = kube or KubeClient()
        self.clock = clock or (lambda: datetime.now(timezone.utc))

    def applies(self, target: Target) -> bool:
        """Whether any pod of the target looks like a Kubeflow notebook's."""
        pods = target.details.get("pods")
        notebooks = isinstance(pods, list) and any(
            isinstance(p, Mapping) and isinstance(p.get("workload"), str) and p["workload"].startswith("Notebook/") for p in pods
        )
        return notebooks or any(NOTEBOOK_LABEL in labels for labels in pod_labels(target))

    def plan(self, target: Target) -> Call:
        pods = pods_of(target)
        notebooks = [(p, notebook_of(p)) for p in pods]
        others = [p for p, nb in notebooks if nb is None]
        if others:
            p = others[0]
            what = f"run by {p.kind}/{p.name}" if p.kind else "a bare pod"
            raise NotApplicable(f"{p.where} is not a Kubeflow notebook's pod ({what}, no {NOTEBOOK_LABEL} label)")
        pod, name = only(notebooks, lambda pn: (pn[0].namespace, pn[1]), "Kubeflow notebook")
        assert name is not None and valid_namespace(pod.namespace)
        return Call(api=API, endpoint=self.kube.endpoint,
                    request={"group": GROUP, "version": VERSION, "plural": PLURAL, "namespace": pod.namespace, "name": name,
                             "annotation": ANNOTATION})  # fmt: skip

    def observe(self, call: Call) -> Outcome | None:
        """Whether the call took, as the API server says now (after a worker died mid-call, or before a ``retry``
        is cancelled): the outcome if the notebook carries the stop annotation, None if not or if it cannot be
        read (the runner then reports it for a person)."""
        namespace, name = call.request.get("namespace"), call.request.get("name")
        if call.api != API or not valid_namespace(namespace) or not valid_name(name):
            return None
        assert isinstance(namespace, str) and isinstance(name, str)
        try:
            from kubernetes.client import CustomObjectsApi  # (at the first call: see kubeclient)

            current: Any = CustomObjectsApi(self.kube.api()).get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=self.kube.timeout)  # fmt: skip
        except Exception:  # noqa: BLE001 - cannot tell: the runner reports the action for a person
            return None
        annotations = _annotations(current)
        if ANNOTATION not in annotations:
            return None
        return Outcome(ok=True, detail=f"notebook {namespace}/{name} is stopped ({ANNOTATION}="
                                       f"{shown(annotations[ANNOTATION])}; found after the call's answer was lost)")  # fmt: skip

    def execute(self, call: Call) -> Outcome:
        if call.api != API:
            return Outcome(ok=False, detail=f"refused: the Kubeflow culler does not make {shown(call.api)} calls")
        namespace, name = call.request.get("namespace"), call.request.get("name")
        if not valid_namespace(namespace) or not valid_name(name):
            return Outcome(ok=False, detail=f"refused: {shown(namespace)}/{shown(name)} is not a namespace/name")
        assert isinstance(namespace, str) and isinstance(name, str)
        where = f"notebook {namespace}/{name}"
        try:
            from kubernetes.client import CustomObjectsApi  # (at the first call: see kubeclient)

            api = CustomObjectsApi(self.kube.api())
            current: Any = api.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=self.kube.timeout
            )
            annotations = _annotations(current)
            if ANNOTATION in annotations:
                return Outcome(ok=True, detail=f"{where} was already stopped ({ANNOTATION}={shown(annotations[ANNOTATION])})",
                               saves=False)
            at = rfc3339(self.clock())
            api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                               {"metadata": {"annotations": {ANNOTATION: at}}},
                                               field_manager=FIELD_MANAGER, _request_timeout=self.kube.timeout,
                                               _content_type="application/merge-patch+json")  # fmt: skip
        except Exception as exc:  # every failure becomes the outcome, as the protocol says
            return failure(exc, f"stopping {where}")
        return Outcome(ok=True, detail=f"stopped {where}: {ANNOTATION}={at} (remove the annotation to start it again)")


def _annotations(notebook: Any) -> Mapping[str, Any]:
    """A Notebook's annotations (empty where it has none): its stop annotation is what stopping it sets, and what the
    look-up after a lost answer reads."""
    return ((notebook or {}).get("metadata") or {}).get("annotations") or {}
