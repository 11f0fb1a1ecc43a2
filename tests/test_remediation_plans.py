"""plan() of cull_notebook and scale_to_zero: which targets they act on, and a clear reason
for those they do not. Everything in a target came from exporters and events: hostile
values (path traversal, CR/LF, huge strings, wrong types) must end in NotApplicable, never
in a call. No API is reached: plan() only reads the target."""

from __future__ import annotations

from typing import Any

import pytest

from detector.alerts import AlertManager
from detector.engine import Engine
from detector.remediation.base import NotApplicable, Target
from detector.remediation.jupyterhub import API as HUB_API
from detector.remediation.jupyterhub import API_NAMED as HUB_API_NAMED
from detector.remediation.jupyterhub import JupyterHubCuller
from detector.remediation.kubeclient import KubeClient
from detector.remediation.kubeflow import API as KUBEFLOW_API
from detector.remediation.kubeflow import KubeflowCuller
from detector.remediation.kubernetes import DEPLOYMENT_API, KSERVE_API, ScaleToZero
from detector.remediation.notebooks import CullNotebook
from detector.rules import load_rules
from tests.test_partly_idle_gpu import host
from tests.test_pods import pod as gpu_pod

HUB = "http://hub.jhub.svc:8081/hub/api"
USER, SERVER, NB, ISVC = (
    "hub.jupyter.org/username",
    "hub.jupyter.org/servername",
    "notebook-name",
    "serving.kserve.io/inferenceservice",
)
HUGE = "a" * 100_000


def pod(ns: str = "ml", name: str = "p-0", workload: Any = "", labels: dict[str, str] | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"namespace": ns, "pod": name, "gpus": [0]}
    if workload:
        item["workload"] = workload
    if labels:
        item["labels"] = labels
    return item


def hub_pod(
    user: Any, ns: str = "jhub", name: str = "jupyter-x", server: str | None = None, workload: str = ""
) -> dict[str, Any]:
    labels = {USER: user, **({SERVER: server} if server is not None else {})}
    return {"namespace": ns, "pod": name, "workload": workload, "labels": labels}


def alert(*pods: Any, tags: dict[str, str] | None = None, **details: Any) -> Target:
    return Target(resource_id="i-0abc", resource_type="gpu_instance", tags=tags or {},
                  details={"pods": list(pods), **details} if pods else details)  # fmt: skip


def nb_pod(notebook: Any, ns: str = "kf", workload: str | None = None) -> dict[str, Any]:
    return {"namespace": ns, "pod": "nb-0", "workload": workload if workload is not None else "StatefulSet/nb",
            "labels": {NB: notebook}}  # fmt: skip


def culler() -> CullNotebook:
    hub = JupyterHubCuller(api_url=HUB, user_tag="jupyterhub-user", server_tag="jupyterhub-server")
    return CullNotebook(kubeflow=KubeflowCuller(KubeClient(context="prod")), jupyterhub=hub)


# --- cull_notebook ---------------------------------------------------------------------------

CULL_ACTS = [
    # a Kubeflow notebook's pod: the StatefulSet its Notebook owns, with the controller's label
    (alert(nb_pod("nb-dana", ns="kf-dana")), KUBEFLOW_API, {"namespace": "kf-dana", "name": "nb-dana"}),
    # a pod whose controller kube-state-metrics reports as the Notebook itself
    (
        alert({"namespace": "kf", "pod": "nb-0", "workload": "Notebook/nb-eve"}),
        KUBEFLOW_API,
        {"namespace": "kf", "name": "nb-eve"},
    ),
    # the same notebook's pod listed for two GPUs (two MIG slices, or two units): one notebook
    (alert(nb_pod("nb"), nb_pod("nb")), KUBEFLOW_API, {"namespace": "kf", "name": "nb"}),
    # JupyterHub on Kubernetes: KubeSpawner's bare pod with the username label
    (alert(hub_pod("alice")), HUB_API, {"user": "alice", "server": ""}),
    # a named server: the servername label too
    (alert(hub_pod("alice", server="gpu")), HUB_API_NAMED, {"user": "alice", "server": "gpu"}),
    # an empty servername label is the default server
    (alert(hub_pod("alice", server="")), HUB_API, {"user": "alice", "server": ""}),
    # a hub outside Kubernetes: the resource's configured tags name the user (an e-mail is a plausible name)
    (alert(tags={"jupyterhub-user": "dana+ml@example.org"}), HUB_API, {"user": "dana+ml@example.org", "server": ""}),
    (alert(tags={"jupyterhub-user": "bo", "jupyterhub-server": "big"}), HUB_API_NAMED, {"user": "bo", "server": "big"}),
    # a non-ASCII username is plausible (JupyterHub allows them), and quoted when called
    (alert(tags={"jupyterhub-user": "zoë"}), HUB_API, {"user": "zoë", "server": ""}),
]


@pytest.mark.parametrize(("target", "api", "request_"), CULL_ACTS)
def test_cull_notebook_plans_the_call(target, api, request_):
    call = culler().plan(target)
    assert call.api == api
    assert {k: call.request[k] for k in request_} == request_
    assert call.endpoint  # the hub or the cluster, for the audit


CULL_REFUSES = [
    # a cloud instance, no pods, no user tag: nothing says which notebook
    (alert(), "names no Kubeflow or JupyterHub notebook"),
    # a StatefulSet that is not a notebook (a database): no notebook label, no hub label
    (alert(pod(workload="StatefulSet/postgres")), "names no Kubeflow or JupyterHub notebook"),
    # a bare pod nobody spawned through a hub
    (alert(pod(name="debug")), "names no Kubeflow or JupyterHub notebook"),
    # path traversal in the username label: '/' never reaches the URL
    (alert(hub_pod("../admin")), "not a plausible JupyterHub username"),
    (alert(hub_pod("alice/../../users/admin")), "not a plausible JupyterHub username"),
    # CR/LF (header or log injection) and NUL in the username
    (alert(hub_pod("alice\r\nX-Injected: 1")), "not a plausible JupyterHub username"),
    (alert(hub_pod("alice\x00")), "not a plausible JupyterHub username"),
    # percent-encoding smuggled in (it would be decoded by the hub into another path)
    (alert(hub_pod("%2e%2e")), "not a plausible JupyterHub username"),
    # a query or fragment in the name
    (alert(hub_pod("alice?admin=1")), "not a plausible JupyterHub username"),
    # '..' inside a name
    (alert(hub_pod("a..b")), "not a plausible JupyterHub username"),
    # a huge username label is not read at all (over any Kubernetes label length)
    (alert(hub_pod(HUGE)), "no pod of the alert has the hub.jupyter.org/username label"),
    # a huge username tag (a cloud tag can be long): refused, and the reason stays short
    (alert(tags={"jupyterhub-user": HUGE}), "not a plausible JupyterHub username"),
    # a hostile server name with a plausible user
    (alert(hub_pod("alice", server="../../admin")), "not a plausible JupyterHub server name"),
    # an empty username tag
    (alert(tags={"jupyterhub-user": ""}), "not a plausible JupyterHub username"),
    # two users' servers on one host: an action stops one thing
    (alert(hub_pod("alice", name="jupyter-alice"), hub_pod("bob", name="jupyter-bob")), "2 JupyterHub servers"),
    # a user's server beside a training job: stopping the server would not free the host's GPUs
    (alert(hub_pod("alice"), pod(name="train-x", workload="Job/train")), "are not JupyterHub servers"),
    # a pod with the username label but run by a Deployment: not KubeSpawner's pod
    (alert(hub_pod("alice", workload="Deployment/impostor")), "not spawned by JupyterHub"),
    # a hostile notebook-name label (shell, traversal, upper case)
    (alert(nb_pod("nb && reboot")), "not a valid notebook name"),
    (alert(nb_pod("../../secrets")), "not a valid notebook name"),
    (alert(nb_pod("NB")), "not a valid notebook name"),
    # a notebook label on a pod another controller runs (a Deployment is not a Kubeflow notebook's)
    (alert(nb_pod("nb", workload="Deployment/web"), nb_pod("nb")), "is not a Kubeflow notebook's pod"),
    # two notebooks on one node
    (alert(nb_pod("nb-a"), nb_pod("nb-b")), "2 Kubeflow notebooks"),
    # the same notebook name in two namespaces is two notebooks
    (alert(nb_pod("nb", ns="a"), nb_pod("nb", ns="b")), "2 Kubeflow notebooks"),
    # a namespace that is not a Kubernetes namespace: traversal, CR/LF, too long, not a string
    (alert(nb_pod("nb", ns="../kube-system")), "not a valid Kubernetes namespace"),
    (alert(nb_pod("nb", ns="kf\r\nx")), "not a valid Kubernetes namespace"),
    (alert(nb_pod("nb", ns="a" * 64)), "not a valid Kubernetes namespace"),
    (alert({"namespace": 7, "pod": "nb-0", "labels": {NB: "nb"}}), "not a valid Kubernetes namespace"),
    # a pod name that is not a Kubernetes name
    (alert({"namespace": "kf", "pod": "nb-0;reboot", "labels": {NB: "nb"}}), "not a valid pod name"),
    # a workload that is not Kind/name
    (alert({"namespace": "kf", "pod": "nb-0", "workload": "Notebook/../x"}), "is not Kind/name"),
    # the alert lists 20 pods and more: what the others are is unknown
    (alert(nb_pod("nb"), pods_more=3), "and 3 more"),
    # pods that are not a list, labels or a workload that are not what they should be
    (Target(resource_id="i-0", details={"pods": "nb-0"}), "names no Kubeflow or JupyterHub notebook"),
    (alert({"namespace": "kf", "pod": "nb-0", "labels": 5}), "names no Kubeflow or JupyterHub notebook"),
    (alert({"namespace": "kf", "pod": "nb-0", "labels": f"{USER}=x"}), "names no Kubeflow or JupyterHub notebook"),
    (alert({"namespace": "kf", "pod": "nb-0", "workload": 5, "labels": {NB: "nb"}}), "is not Kind/name"),
    (alert({"namespace": "kf", "pod": "nb-0", "labels": {NB: 5}}), "is not a Kubeflow notebook's pod"),
    (alert({"namespace": "jhub", "pod": "jupyter-x", "labels": {USER: ["alice"]}}), "no pod of the alert has the"),
]


@pytest.mark.parametrize(("target", "reason"), CULL_REFUSES)
def test_cull_notebook_refuses_with_a_reason(target, reason):
    with pytest.raises(NotApplicable) as caught:
        culler().plan(target)
    assert reason in caught.value.reason
    assert len(caught.value.reason) < 400 and "\n" not in caught.value.reason and "\r" not in caught.value.reason


def test_kubeflow_culler_alone_names_what_it_cannot_stop():
    """Without the dispatcher: a pod that is not a notebook's, and a bare pod."""
    ex = KubeflowCuller(KubeClient())
    with pytest.raises(NotApplicable, match="run by StatefulSet/postgres"):
        ex.plan(alert(pod(workload="StatefulSet/postgres")))
    with pytest.raises(NotApplicable, match="a bare pod"):
        ex.plan(alert(pod()))
    with pytest.raises(NotApplicable, match="names no Kubernetes pod"):
        ex.plan(alert())


def test_cull_notebook_with_nothing_configured_says_so():
    with pytest.raises(NotApplicable, match="no notebook system is configured"):
        CullNotebook().plan(alert(nb_pod("nb")))
    hubless = CullNotebook(jupyterhub=JupyterHubCuller(api_url=""))
    with pytest.raises(NotApplicable, match="JUPYTERHUB_API_URL"):
        hubless.plan(alert(hub_pod("alice")))


# --- scale_to_zero ---------------------------------------------------------------------------

SCALE_ACTS = [
    # a Deployment's pods (kube-state-metrics' ReplicaSet followed to its Deployment): one call for both
    (alert(pod(name="llm-1", workload="Deployment/llm"), pod(name="llm-2", workload="Deployment/llm")), DEPLOYMENT_API,
     {"namespace": "ml", "name": "llm", "replicas": 0}),
    # a KServe predictor's pod: the InferenceService, not the Deployment its controller owns
    (alert(pod(name="bert-predictor-x", workload="Deployment/bert-predictor", labels={ISVC: "bert"})),
     KSERVE_API, {"namespace": "ml", "name": "bert", "min_replicas": 0}),
]  # fmt: skip


@pytest.mark.parametrize(("target", "api", "request_"), SCALE_ACTS)
def test_scale_to_zero_plans_the_call(target, api, request_):
    call = ScaleToZero(KubeClient(context="prod")).plan(target)
    assert call.api == api and dict(call.request) == request_ and "prod" in call.endpoint


SCALE_REFUSES = [
    # a cloud instance with no pods: nothing in Kubernetes to scale
    (alert(), "names no Kubernetes pod"),
    # a bare pod has no controller to scale
    (alert(pod()), "bare pod"),
    # a ReplicaSet no Deployment owns
    (alert(pod(workload="ReplicaSet/web-5d8f")), "which no Deployment owns"),
    # a Job finishes or is deleted; it has no replicas
    (alert(pod(workload="Job/train")), "a Job is stopped by deleting it"),
    # a StatefulSet that is not a notebook (a database, a Ray head): not this action's
    (alert(pod(workload="StatefulSet/postgres")), "acts on Deployments and InferenceServices"),
    # a DaemonSet runs a pod per node
    (alert(pod(workload="DaemonSet/dcgm-exporter")), "acts on Deployments and InferenceServices"),
    # a Kubeflow notebook: its controller would undo a scale; cull_notebook is the action
    (alert(nb_pod("nb")), "use cull_notebook"),
    # a JupyterHub user's pod
    (alert(hub_pod("alice")), "use cull_notebook"),
    # two Deployments on one node: an action stops one thing
    (alert(pod(name="a-1", workload="Deployment/a"), pod(name="b-1", workload="Deployment/b")), "2 workloads"),
    # a Deployment's pods beside a bare pod
    (alert(pod(name="a-1", workload="Deployment/a"), pod(name="dbg")), "bare pod"),
    # hostile workload names: shell, traversal, a query, upper case kind spelled wrong, no slash, too long, not a string
    (alert(pod(workload="Deployment/llm;rm -rf /")), "is not Kind/name"),
    (alert(pod(workload="Deployment/../../api/v1/secrets")), "is not Kind/name"),
    (alert(pod(workload="Deployment/llm?dryRun=All")), "is not Kind/name"),
    (alert(pod(workload="deployment/llm")), "is not Kind/name"),
    (alert(pod(workload="Deployment")), "is not Kind/name"),
    (alert(pod(workload="Deployment/" + HUGE)), "is not Kind/name"),
    (alert(pod(workload="Deployment/llm\r\nX: 1")), "is not Kind/name"),
    (alert({"namespace": "ml", "pod": "p", "workload": ["Deployment", "llm"]}), "is not Kind/name"),
    # a hostile InferenceService label
    (alert(pod(workload="Deployment/x", labels={ISVC: "../bert"})), "not a valid name"),
    # a hostile namespace
    (alert(pod(ns="ml/../kube-system", workload="Deployment/llm")), "not a valid Kubernetes namespace"),
    (alert(pod(ns=HUGE, workload="Deployment/llm")), "not a valid Kubernetes namespace"),
    # more pods than listed
    (alert(pod(workload="Deployment/llm"), pods_more=1), "and 1 more"),
    # a pods entry that is not an object, labels that are not an object
    (alert(["ml", "p"]), "pod 0 of the alert is not an object"),
    (alert({"namespace": "ml", "pod": "p", "labels": 5}), "bare pod"),
]


@pytest.mark.parametrize(("target", "reason"), SCALE_REFUSES)
def test_scale_to_zero_refuses_with_a_reason(target, reason):
    with pytest.raises(NotApplicable) as caught:
        ScaleToZero(KubeClient()).plan(target)
    assert reason in caught.value.reason
    assert len(caught.value.reason) < 400 and "\n" not in caught.value.reason and "\r" not in caught.value.reason


def test_the_executors_declare_their_kind():
    assert CullNotebook.kind == KubeflowCuller.kind == JupyterHubCuller.kind == "cull_notebook"
    assert ScaleToZero.kind == "scale_to_zero"


# --- what the detectors write is what the executors read -------------------------------------


def _idle_alert(tmp_path, units):
    (tmp_path / "rules.yaml").write_text("rules:\n  - {name: idle-gpu, type: idle_gpu}\n")
    ruleset = load_rules(tmp_path)
    alerts = AlertManager(ruleset=ruleset).handle(Engine(ruleset).process(host([(40, units)])))
    (fired,) = [a for a in alerts if a.change == "fired"]
    return Target.from_alert(fired)


def test_an_idle_jupyterhub_server_alert_plans_its_cull(tmp_path):
    """The pod's labels (kube-state-metrics -> the bridge -> GpuMetric tags) survive into the alert's pods."""
    tags = {"team": "vision", USER: "dana", SERVER: "gpu", "component": "singleuser-server"}
    units = [gpu_pod(g, "jupyter-dana--gpu", namespace="jhub", tags=tags) for g in range(8)]
    target = _idle_alert(tmp_path, units)
    assert target.details["pods"][0]["labels"] == {USER: "dana", SERVER: "gpu"}
    call = culler().plan(target)
    assert call.api == HUB_API_NAMED and call.request == {"user": "dana", "server": "gpu"}


def test_an_idle_kubeflow_notebook_alert_plans_its_annotation(tmp_path):
    units = [gpu_pod(g, "nb-dana-0", "StatefulSet/nb-dana", namespace="kf-dana", tags={"team": "vision", NB: "nb-dana"})
             for g in range(8)]  # fmt: skip
    call = culler().plan(_idle_alert(tmp_path, units))
    assert call.api == KUBEFLOW_API and (call.request["namespace"], call.request["name"]) == ("kf-dana", "nb-dana")


def test_an_idle_deployment_alert_plans_its_scale(tmp_path):
    units = [gpu_pod(g, f"llm-7d9c-{g}", "Deployment/llm", namespace="serving") for g in range(8)]
    call = ScaleToZero(KubeClient()).plan(_idle_alert(tmp_path, units))
    assert call.api == DEPLOYMENT_API and call.request == {"namespace": "serving", "name": "llm", "replicas": 0}
