"""scale_to_zero and Kubeflow's cull_notebook: the real ``kubernetes`` client, with its
credentials from a kubeconfig (the standard chain), against a local API server
(tests/kube_api.py). The assertions are on what the server received and on the state it
then serves back through the same client."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from kubernetes import client as k8s

from detector.remediation.base import Call, Target
from detector.remediation.kubeclient import KubeClient
from detector.remediation.kubeflow import ANNOTATION, KubeflowCuller
from detector.remediation.kubernetes import DEPLOYMENT_API, KSERVE_API, ScaleToZero
from detector.remediation.notebooks import CullNotebook
from streams.embedded import free_port
from tests.kube_api import MERGE, KubeApi, Server

NOW = datetime(2026, 12, 1, 10, 0, 0, tzinfo=timezone.utc)


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeApi]:
    """The API server, and a kubeconfig for it in ``KUBECONFIG`` (not in a cluster: no in-cluster config)."""
    state = KubeApi()
    server = Server(state)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(state.kubeconfig(tmp_path / "kubeconfig", server.url)))
    try:
        yield state
    finally:
        if state.hang is not None:
            state.hang.set()
        server.close()


def pods(*items: dict) -> Target:
    """An idle-GPU alert on a node whose GPUs these pods hold."""
    return Target(resource_id="i-0abc", resource_type="gpu_instance", details={"pods": list(items)})


def reader() -> k8s.ApiClient:
    """A client of our own to read the server's state back, from the same kubeconfig."""
    return KubeClient().api()


def test_scales_the_deployment_to_zero_and_records_the_replicas_it_had(api):
    api.add_deployment("serving", "llm", replicas=3)
    target = pods({"namespace": "serving", "pod": "llm-7d9c-abcde", "workload": "Deployment/llm", "gpus": [0]},
                  {"namespace": "serving", "pod": "llm-7d9c-fghij", "workload": "Deployment/llm", "gpus": [1]})  # fmt: skip
    ex = ScaleToZero()
    call = ex.plan(target)
    assert call.api == DEPLOYMENT_API and call.request == {"namespace": "serving", "name": "llm", "replicas": 0}
    outcome = ex.execute(call)
    assert outcome.ok, outcome.detail
    assert "previous replicas: 3" in outcome.detail and "--replicas=3" in outcome.detail
    (patch,) = api.patches()
    assert patch.path == "/apis/apps/v1/namespaces/serving/deployments/llm/scale"
    assert patch.content_type == MERGE and patch.body == {"spec": {"replicas": 0}}
    assert "fieldManager=burnwatch" in patch.query
    assert patch.authorization == f"Bearer {api.token}"  # from the kubeconfig, through the client
    assert api.token not in outcome.detail and api.token not in repr(call)
    scale = k8s.AppsV1Api(reader()).read_namespaced_deployment_scale("llm", "serving")
    assert scale.spec is not None and scale.spec.replicas == 0


def test_scaling_again_changes_nothing(api):
    api.add_deployment("serving", "llm", replicas=2)
    ex = ScaleToZero()
    call = ex.plan(pods({"namespace": "serving", "pod": "llm-1", "workload": "Deployment/llm"}))
    assert ex.execute(call).ok
    again = ex.execute(call)
    assert again.ok and "already at 0" in again.detail
    assert not again.saves  # its succeeded step credits no saving: nothing was running (docs/actions.md)
    assert len(api.patches()) == 1


def test_an_inference_service_already_at_min_replicas_zero_saves_nothing(api):
    api.add_object("serving.kserve.io", "v1beta1", "inferenceservices", "serving", "bert", "InferenceService",
                   {"predictor": {"minReplicas": 0, "model": {"modelFormat": {"name": "pytorch"}}}})  # fmt: skip
    outcome = ScaleToZero().execute(Call(api=KSERVE_API, request={"namespace": "serving", "name": "bert", "min_replicas": 0}))
    assert outcome.ok and "already had minReplicas 0" in outcome.detail and not outcome.saves
    assert api.patches() == []


def test_a_deployment_another_controller_owns_is_left_alone(api):
    """A Knative Revision's Deployment (KServe Serverless without the label exported): Knative would scale it back."""
    api.add_deployment("serving", "bert-predictor-00001-deployment", replicas=1,
                       owner={"kind": "Revision", "name": "bert-predictor-00001"})  # fmt: skip
    ex = ScaleToZero()
    outcome = ex.execute(ex.plan(pods({"namespace": "serving", "pod": "bert-predictor-00001-deployment-x",
                                       "workload": "Deployment/bert-predictor-00001-deployment"})))  # fmt: skip
    assert not outcome.ok and not outcome.retryable and "Revision/bert-predictor-00001" in outcome.detail
    assert api.patches() == []


def test_an_inference_service_gets_min_replicas_zero_and_keeps_the_rest_of_its_spec(api):
    spec = {
        "predictor": {
            "minReplicas": 2,
            "maxReplicas": 4,
            "model": {"modelFormat": {"name": "pytorch"}, "storageUri": "s3://m/bert"},
        }
    }
    api.add_object("serving.kserve.io", "v1beta1", "inferenceservices", "serving", "bert", "InferenceService", spec)
    ex = ScaleToZero()
    call = ex.plan(pods({"namespace": "serving", "pod": "bert-predictor-00001-deployment-x",
                         "workload": "Deployment/bert-predictor-00001-deployment",
                         "labels": {"serving.kserve.io/inferenceservice": "bert"}}))  # fmt: skip
    assert call.api == KSERVE_API and call.request == {"namespace": "serving", "name": "bert", "min_replicas": 0}
    outcome = ex.execute(call)
    assert outcome.ok and "previous minReplicas: 2" in outcome.detail, outcome.detail
    (patch,) = api.patches()
    assert patch.path == "/apis/serving.kserve.io/v1beta1/namespaces/serving/inferenceservices/bert"
    assert patch.content_type == MERGE and patch.body == {"spec": {"predictor": {"minReplicas": 0}}}
    isvc = k8s.CustomObjectsApi(reader()).get_namespaced_custom_object("serving.kserve.io", "v1beta1", "serving",
                                                                        "inferenceservices", "bert")  # fmt: skip
    assert isvc["spec"]["predictor"] == {**spec["predictor"], "minReplicas": 0}


def test_an_inference_service_without_min_replicas_says_how_to_restore_the_default(api):
    api.add_object("serving.kserve.io", "v1beta1", "inferenceservices", "serving", "t5", "InferenceService",
                   {"predictor": {"model": {"modelFormat": {"name": "huggingface"}}}})  # fmt: skip
    ex = ScaleToZero()
    outcome = ex.execute(Call(api=KSERVE_API, request={"namespace": "serving", "name": "t5", "min_replicas": 0}))
    assert outcome.ok and "unset" in outcome.detail and '"op":"remove"' in outcome.detail, outcome.detail


def test_stops_a_kubeflow_notebook_with_the_culler_annotation_and_keeps_its_others(api):
    api.add_object("kubeflow.org", "v1", "notebooks", "kf-dana", "nb-dana", "Notebook",
                   {"template": {"spec": {"containers": [{"name": "nb-dana", "image": "jupyter-pytorch-cuda"}]}}},
                   annotations={"notebooks.kubeflow.org/creator": "dana@example.org"})  # fmt: skip
    ex = CullNotebook(kubeflow=KubeflowCuller(clock=lambda: NOW))
    call = ex.plan(pods({"namespace": "kf-dana", "pod": "nb-dana-0", "workload": "StatefulSet/nb-dana",
                         "labels": {"notebook-name": "nb-dana"}}))  # fmt: skip
    assert call.request["namespace"] == "kf-dana" and call.request["name"] == "nb-dana"
    outcome = ex.execute(call)
    assert outcome.ok and "2026-12-01T10:00:00Z" in outcome.detail, outcome.detail
    (patch,) = api.patches()
    assert patch.path == "/apis/kubeflow.org/v1/namespaces/kf-dana/notebooks/nb-dana"
    assert patch.content_type == MERGE
    assert patch.body == {"metadata": {"annotations": {ANNOTATION: "2026-12-01T10:00:00Z"}}}
    nb = k8s.CustomObjectsApi(reader()).get_namespaced_custom_object("kubeflow.org", "v1", "kf-dana", "notebooks", "nb-dana")
    assert nb["metadata"]["annotations"] == {"notebooks.kubeflow.org/creator": "dana@example.org",
                                             ANNOTATION: "2026-12-01T10:00:00Z"}  # fmt: skip
    assert nb["spec"]["template"]["spec"]["containers"][0]["image"] == "jupyter-pytorch-cuda"


def test_a_notebook_already_stopped_keeps_its_stop_time(api):
    api.add_object(
        "kubeflow.org", "v1", "notebooks", "kf", "nb", "Notebook", {}, annotations={ANNOTATION: "2026-11-30T22:00:00Z"}
    )
    ex = KubeflowCuller(clock=lambda: NOW)
    outcome = ex.execute(ex.plan(pods({"namespace": "kf", "pod": "nb-0", "workload": "Notebook/nb"})))
    assert outcome.ok and "already stopped" in outcome.detail
    assert not outcome.saves  # stopped by Kubeflow's own culler or its owner since the proposal: no saving credited
    assert api.patches() == []


def _deployment_call() -> tuple[ScaleToZero, Call]:
    return ScaleToZero(), Call(api=DEPLOYMENT_API, request={"namespace": "serving", "name": "llm", "replicas": 0})


def _notebook_call() -> tuple[KubeflowCuller, Call]:
    return KubeflowCuller(clock=lambda: NOW), Call(api="kubeflow.org/v1.patch_namespaced_custom_object",
                                                   request={"namespace": "kf", "name": "nb"})  # fmt: skip


def _isvc_call() -> tuple[ScaleToZero, Call]:
    return ScaleToZero(), Call(api=KSERVE_API, request={"namespace": "serving", "name": "bert", "min_replicas": 0})


@pytest.mark.parametrize("make", [_deployment_call, _notebook_call, _isvc_call], ids=["deployment", "kubeflow", "kserve"])
@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (403, False),  # RBAC refuses the service account: a person must grant it, retrying will not
        (404, False),  # the object is gone (deleted since the alert): nothing to retry
        (409, False),  # a conflict the API server reports: retrying the same call blindly is not safe
        (422, False),  # invalid (an admission webhook refused minReplicas 0, say)
        (429, True),  # API priority and fairness throttled us
        (500, True),  # the API server failed
        (503, True),  # the API server is unavailable (an upgrade)
    ],
)
def test_api_errors_become_outcomes(api, make, status, retryable):
    api.add_deployment("serving", "llm", replicas=1)
    api.add_object("kubeflow.org", "v1", "notebooks", "kf", "nb", "Notebook", {})
    api.add_object("serving.kserve.io", "v1beta1", "inferenceservices", "serving", "bert", "InferenceService", {"predictor": {}})
    api.failures = [status]
    ex, call = make()
    outcome = ex.execute(call)
    assert not outcome.ok and outcome.retryable is retryable
    assert f"HTTP {status}" in outcome.detail and "injected" in outcome.detail
    assert len(api.received) == 1 and api.patches() == []  # the failed read stopped it: nothing was changed


def test_a_wrong_token_is_refused_by_the_server_and_not_retried(api):
    good = api.token
    api.token = "another-token-" + "x" * 20  # the server now expects another one
    ex, call = _deployment_call()
    api.add_deployment("serving", "llm", replicas=1)
    outcome = ex.execute(call)
    assert not outcome.ok and not outcome.retryable and "HTTP 401" in outcome.detail
    assert good not in outcome.detail


def test_a_hung_api_server_times_out_as_a_retryable_failure(api):
    api.add_deployment("serving", "llm", replicas=1)
    api.hang = threading.Event()
    ex = ScaleToZero(KubeClient(timeout=(1.0, 0.5)))
    outcome = ex.execute(_deployment_call()[1])
    assert not outcome.ok and outcome.retryable, outcome.detail


def test_an_unreachable_api_server_is_a_retryable_failure(tmp_path, monkeypatch):
    state = KubeApi()
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(state.kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{free_port()}")))
    outcome = ScaleToZero().execute(_deployment_call()[1])
    assert not outcome.ok and outcome.retryable, outcome.detail


def test_no_credentials_anywhere_is_a_failure_that_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config either
    outcome = KubeflowCuller().execute(_notebook_call()[1])
    assert not outcome.ok and not outcome.retryable and "no Kubernetes credentials" in outcome.detail


@pytest.mark.parametrize(
    "request_",
    [
        {"namespace": "serving", "name": "../../api/v1/secrets"},  # path traversal from a tampered audit row
        {"namespace": "serving\r\nX-Injected: 1", "name": "llm"},  # header injection
        {"namespace": "serving", "name": "llm?dryRun=All"},  # a query smuggled in the name
        {"namespace": "serving", "name": "x" * 300},  # longer than any Kubernetes name
        {"namespace": "serving"},  # no name at all
    ],
)
def test_a_call_from_the_audit_table_is_checked_again_before_any_request(api, request_):
    for ex, api_name in ((ScaleToZero(), DEPLOYMENT_API), (KubeflowCuller(), "kubeflow.org/v1.patch_namespaced_custom_object"),
                         (ScaleToZero(), KSERVE_API)):  # fmt: skip
        outcome = ex.execute(Call(api=api_name, request=request_))
        assert not outcome.ok and outcome.detail.startswith("refused"), outcome.detail
    assert api.received == []


def test_executors_refuse_calls_they_do_not_make(api):
    request = {"namespace": "a", "name": "b"}
    for ex in (ScaleToZero(), KubeflowCuller(), CullNotebook(kubeflow=KubeflowCuller())):
        outcome = ex.execute(Call(api="apps/v1.delete_namespaced_deployment", request=request))
        assert not outcome.ok and outcome.detail.startswith("refused"), outcome.detail
    assert api.received == []


@pytest.mark.skipif(Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists(),
                    reason="running in a pod: its own service account would be used")  # fmt: skip
def test_in_a_pod_without_a_service_account_token_the_kubeconfig_is_used(api, monkeypatch):
    """The chain: in-cluster config first (here KUBERNETES_SERVICE_HOST is set but no token is mounted), then KUBECONFIG."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    api.add_deployment("serving", "llm", replicas=1)
    outcome = ScaleToZero().execute(_deployment_call()[1])
    assert outcome.ok, outcome.detail
    assert api.received[0].authorization == f"Bearer {api.token}"


def test_a_scale_or_a_cull_whose_answer_was_lost_is_found_done(api):
    """``observe``: after a worker died mid-call, or before a retry whose answer timed out is cancelled, the
    API server is asked whether the call took. A workload at 0 or a notebook carrying the annotation is done;
    one that is not, or cannot be read, is not known done (None: the runner reports it for a person)."""
    api.add_deployment("serving", "llm", replicas=2)
    api.add_object("serving.kserve.io", "v1beta1", "inferenceservices", "serving", "bert", "InferenceService",
                   {"predictor": {"minReplicas": 1}})  # fmt: skip
    api.add_object("kubeflow.org", "v1", "notebooks", "kf", "nb", "Notebook", {})
    scale, deployment = _deployment_call()
    isvc = Call(api=KSERVE_API, request={"namespace": "serving", "name": "bert", "min_replicas": 0})
    notebooks = CullNotebook(kubeflow=KubeflowCuller(clock=lambda: NOW))
    notebook = notebooks.plan(pods({"namespace": "kf", "pod": "nb-0", "workload": "Notebook/nb"}))
    assert scale.observe(deployment) is None and scale.observe(isvc) is None and notebooks.observe(notebook) is None
    for ex, call in ((scale, deployment), (scale, isvc), (notebooks, notebook)):
        assert ex.execute(call).ok
    for ex, call in ((scale, deployment), (scale, isvc), (notebooks, notebook)):
        found = ex.observe(call)
        assert found is not None and found.ok, call
    assert "Deployment serving/llm is at 0" in scale.observe(deployment).detail  # type: ignore[union-attr]
    api.failures = [503]
    assert scale.observe(deployment) is None  # cannot tell
    gone = Call(api=DEPLOYMENT_API, request={"namespace": "serving", "name": "nope", "replicas": 0})
    assert scale.observe(gone) is None


def test_a_scale_begun_by_a_worker_that_died_is_found_done_not_reported_interrupted(api, store):
    """The worker died after storing ``begun`` and the patch landed: on restart the runner asks the API server
    (as it asks EC2) and records the action done, where it said 'interrupted ... act by hand' about a
    Deployment that was at 0."""
    import json

    from detector.remediation.runner import ActionRunner
    from detector.rules import RuleSet
    from detector.store import ActionStep

    api.add_deployment("serving", "llm", replicas=0)  # the call had landed before the worker died
    api.add_deployment("serving", "asr", replicas=3)  # this one had not
    for alert_id, name in (("a1", "llm"), ("a2", "asr")):
        common = dict(alert_id=alert_id, kind="scale_to_zero", mode="approve", rule="idle-gpu", resource_id="i-0abc",
                      api=DEPLOYMENT_API, request=json.dumps({"namespace": "serving", "name": name, "replicas": 0}),
                      endpoint="kubernetes (in-cluster, else the current context)")  # fmt: skip
        store.remediations.record([ActionStep(step="proposed", at=1_800_000_000 - 60, usd_per_hour=12.0, **common),
                                   ActionStep(step="approved", at=1_800_000_000 - 30, decided_by="U0LEAD", **common),
                                   ActionStep(step="begun", at=1_800_000_000 - 29, attempt=1, **common)])  # fmt: skip
    runner = ActionRunner(store, {"scale_to_zero": ScaleToZero()}, RuleSet, wall=lambda: 1_800_000_000)
    assert runner.recover() == 0
    assert [r["step"] for r in store.remediations.steps("a1")][-1] == "succeeded"
    assert [r["step"] for r in store.remediations.steps("a2")][-1] == "interrupted"
    assert len(api.patches()) == 0  # nothing called again
