"""``scale_to_zero``: a Deployment to 0 replicas, or a KServe InferenceService to ``minReplicas: 0``.

- **Deployment** (the pod's controller, through its ReplicaSet: the alert's ``workload``
  ``Deployment/NAME``): a merge patch of its ``scale`` subresource to 0 replicas. Before it,
  the Deployment is read: its replica count goes in the outcome (so a person can scale it
  back), and one that another controller owns (an operator, a Knative Revision) is left
  alone, since that controller would scale it straight back.
- **KServe InferenceService** (a pod with the ``serving.kserve.io/inferenceservice`` label
  KServe sets): a merge patch of ``spec.predictor.minReplicas`` to 0, so KServe's autoscaler
  (Knative, in Serverless mode) removes the pods while no request comes and brings them back
  on the next one. The previous value goes in the outcome.

SageMaker real-time endpoints are not handled: a production variant keeps at least one
instance (only inference components can scale to zero, through Application Auto Scaling),
and no local server speaks that API for a test.

A Deployment under a HorizontalPodAutoscaler stays at 0 (the autoscaler does not act on a
workload scaled to zero); a GitOps tool that owns the manifest (Argo CD, Flux) may restore it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from detector.remediation.base import ActionKind, Call, NotApplicable, Outcome, Target
from detector.remediation.kubeclient import FIELD_MANAGER, KubeClient, failure
from detector.remediation.workloads import PodRef, only, pods_of, shown, valid_name, valid_namespace

__all__ = ["DEPLOYMENT_API", "KSERVE_API", "KSERVE_LABEL", "ScaleToZero"]

DEPLOYMENT_API = "apps/v1.patch_namespaced_deployment_scale"
KSERVE_API = "serving.kserve.io/v1beta1.patch_namespaced_custom_object"
KSERVE_LABEL = "serving.kserve.io/inferenceservice"
KSERVE = ("serving.kserve.io", "v1beta1", "inferenceservices")
MERGE_PATCH = "application/merge-patch+json"
NOTEBOOK_LABELS = ("notebook-name", "hub.jupyter.org/username")


def _object_of(pod: PodRef) -> tuple[str, str, str]:
    """(api, namespace, name) of what scales ``pod``'s workload to zero, or NotApplicable."""
    isvc = pod.labels.get(KSERVE_LABEL)
    if isvc is not None:
        if not valid_name(isvc):
            raise NotApplicable(f"{pod.where}: its {KSERVE_LABEL} label {shown(isvc)} is not a valid name")
        return KSERVE_API, pod.namespace, isvc
    if any(label in pod.labels for label in NOTEBOOK_LABELS) or pod.kind == "Notebook":
        raise NotApplicable(f"{pod.where} is a notebook's: use cull_notebook (its controller would undo a scale)")
    if pod.kind == "Deployment":
        return DEPLOYMENT_API, pod.namespace, pod.name
    if not pod.kind:
        raise NotApplicable(f"{pod.where} is a bare pod (no controller): there is nothing to scale")
    if pod.kind == "ReplicaSet":
        raise NotApplicable(
            f"{pod.where} is run by ReplicaSet/{pod.name}, which no Deployment owns: scale_to_zero acts on Deployments"
        )
    if pod.kind == "Job":
        raise NotApplicable(f"{pod.where} is run by Job/{pod.name}: a Job is stopped by deleting it, not scaled")
    raise NotApplicable(f"{pod.where} is run by {pod.kind}/{pod.name}: scale_to_zero acts on Deployments and InferenceServices")


class ScaleToZero:
    """Scales the one Deployment or InferenceService whose pods hold the alert's GPUs to zero."""

    kind: ClassVar[ActionKind] = "scale_to_zero"

    def __init__(self, kube: KubeClient | None = None) -> None:
        self.kube = kube or KubeClient()

    def plan(self, target: Target) -> Call:
        objects = [_object_of(p) for p in pods_of(target)]
        api, namespace, name = only(objects, lambda o: o, "workload")
        request: dict[str, Any] = {"namespace": namespace, "name": name}
        if api == DEPLOYMENT_API:
            request["replicas"] = 0
        else:
            request["min_replicas"] = 0
        return Call(api=api, request=request, endpoint=self.kube.endpoint)

    def execute(self, call: Call) -> Outcome:
        namespace, name = call.request.get("namespace"), call.request.get("name")
        # The call may come back from the audit table: check it again before it reaches the API.
        if not valid_namespace(namespace) or not valid_name(name):
            return Outcome(ok=False, detail=f"refused: {shown(namespace)}/{shown(name)} is not a namespace/name")
        assert isinstance(namespace, str) and isinstance(name, str)
        if call.api == DEPLOYMENT_API:
            return self._deployment(namespace, name)
        if call.api == KSERVE_API:
            return self._inference_service(namespace, name)
        return Outcome(ok=False, detail=f"refused: scale_to_zero does not make {call.api!r} calls")

    def observe(self, call: Call) -> Outcome | None:
        """Whether the call took, as the API server says now: after a worker died mid-call, or before an action
        whose answer timed out (a ``retry``) is cancelled. The outcome if the workload is at zero, None if it is
        not or cannot be read (the runner then reports it for a person, never calls again blindly)."""
        namespace, name = call.request.get("namespace"), call.request.get("name")
        if not valid_namespace(namespace) or not valid_name(name) or call.api not in (DEPLOYMENT_API, KSERVE_API):
            return None
        assert isinstance(namespace, str) and isinstance(name, str)
        try:
            if call.api == DEPLOYMENT_API:
                from kubernetes.client import AppsV1Api  # (at the first call: see kubeclient)

                deployment = AppsV1Api(self.kube.api()).read_namespaced_deployment(
                    name, namespace, _request_timeout=self.kube.timeout)  # fmt: skip
                where, zero = f"Deployment {namespace}/{name}", _replicas(deployment) == 0
            else:
                from kubernetes.client import CustomObjectsApi  # (at the first call: see kubeclient)

                group, version, plural = KSERVE
                current: Any = CustomObjectsApi(self.kube.api()).get_namespaced_custom_object(
                    group, version, namespace, plural, name, _request_timeout=self.kube.timeout)  # fmt: skip
                where, zero = f"InferenceService {namespace}/{name}", _predictor(current).get("minReplicas") == 0
        except Exception:  # noqa: BLE001 - cannot tell: the runner reports the action for a person
            return None
        return Outcome(ok=True, detail=f"{where} is at 0 (found after the call's answer was lost)") if zero else None

    def _deployment(self, namespace: str, name: str) -> Outcome:
        where = f"Deployment {namespace}/{name}"
        try:
            from kubernetes.client import AppsV1Api  # (at the first call: see kubeclient)

            apps = AppsV1Api(self.kube.api())
            deployment = apps.read_namespaced_deployment(name, namespace, _request_timeout=self.kube.timeout)
            owners = (deployment.metadata.owner_references if deployment.metadata else None) or []
            owner = next((o for o in owners if o.controller), None)
            if owner is not None:
                return Outcome(ok=False, detail=f"{where} is managed by {owner.kind}/{owner.name}: it would scale it "
                                                "back; act on that instead")  # fmt: skip
            before = _replicas(deployment)
            if before == 0:
                return Outcome(ok=True, detail=f"{where} was already at 0 replicas", saves=False)
            scale = apps.patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": 0}},
                                                           field_manager=FIELD_MANAGER, _request_timeout=self.kube.timeout,
                                                           _content_type=MERGE_PATCH)  # fmt: skip
        except Exception as exc:  # every failure becomes the outcome, as the protocol says
            return failure(exc, f"scaling {where} to 0")
        now = scale.spec.replicas if scale.spec and scale.spec.replicas is not None else 0
        if now != 0:
            return Outcome(ok=False, detail=f"{where}: asked for 0 replicas, the API server answered {now}", retryable=True)
        return Outcome(ok=True, detail=f"scaled {where} from {before} to 0 replicas (previous replicas: {before}; to undo: "
                                       f"kubectl -n {namespace} scale deployment/{name} --replicas={before})")  # fmt: skip

    def _inference_service(self, namespace: str, name: str) -> Outcome:
        where = f"InferenceService {namespace}/{name}"
        group, version, plural = KSERVE
        try:
            from kubernetes.client import CustomObjectsApi  # (at the first call: see kubeclient)

            api = CustomObjectsApi(self.kube.api())
            current: Any = api.get_namespaced_custom_object(
                group, version, namespace, plural, name, _request_timeout=self.kube.timeout
            )
            before = _predictor(current).get("minReplicas")
            if before == 0:
                return Outcome(ok=True, detail=f"{where} already had minReplicas 0", saves=False)
            api.patch_namespaced_custom_object(group, version, namespace, plural, name,
                                               {"spec": {"predictor": {"minReplicas": 0}}},
                                               field_manager=FIELD_MANAGER, _request_timeout=self.kube.timeout,
                                               _content_type=MERGE_PATCH)  # fmt: skip
        except Exception as exc:  # every failure becomes the outcome, as the protocol says
            return failure(exc, f"setting {where} minReplicas to 0")
        patch = f"kubectl -n {namespace} patch inferenceservice {name}"
        if isinstance(before, int) and not isinstance(before, bool):
            was, undo = f"{before}", f"""{patch} --type=merge -p '{{"spec":{{"predictor":{{"minReplicas":{before}}}}}}}'"""
        else:  # unset (a value of another type the CRD's schema would have refused: shown, not restored)
            remove = '[{"op":"remove","path":"/spec/predictor/minReplicas"}]'
            was = "unset (KServe's default, 1)" if before is None else shown(before)
            undo = f"{patch} --type=json -p '{remove}'"
        return Outcome(ok=True, detail=f"set {where} minReplicas from {was} to 0 (previous minReplicas: {was}; to undo: {undo})")


def _replicas(deployment: Any) -> int:
    """A Deployment's replicas (unset: Kubernetes' default, 1): what scaling and the look-up after a lost answer read."""
    return deployment.spec.replicas if deployment.spec and deployment.spec.replicas is not None else 1


def _predictor(service: Any) -> Mapping[str, Any]:
    """An InferenceService's ``spec.predictor`` (empty where it has none)."""
    return ((service or {}).get("spec") or {}).get("predictor") or {}
