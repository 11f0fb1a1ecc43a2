"""The worker's executor registry (detector/remediation/executors.py): every kind has its
dispatcher, and ``stop_instance`` reaches EC2 through :class:`StopInstances` with the same
plan, call and after-restart look-up as EC2's executor alone (boto3 against moto's server,
its endpoint and credentials from the environment, as the worker takes them)."""

from __future__ import annotations

import pytest

from detector.remediation.azure import DeallocateAzureVm
from detector.remediation.base import Call, NotApplicable, Target
from detector.remediation.ec2 import API, StopInstance
from detector.remediation.executors import executors
from detector.remediation.gce import StopGceInstance
from detector.remediation.instances import StopInstances
from detector.remediation.kubernetes import ScaleToZero
from detector.remediation.notebooks import CullNotebook
from tests import aws
from tests.aws import REGION, run_instance, state

moto_url = aws.moto_url


@pytest.fixture
def registry(moto_url, monkeypatch):
    """The registry as the worker builds it, boto3's chain pointed at moto by the environment."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", moto_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return executors()


def test_every_kind_that_acts_has_its_dispatcher(registry):
    assert set(registry) == {"stop_instance", "cull_notebook", "scale_to_zero"}
    stop = registry["stop_instance"]
    assert isinstance(stop, StopInstances) and isinstance(stop.executors["ec2"], StopInstance)
    assert (stop.executors["gce"] is not None) == StopGceInstance.available()
    assert (stop.executors["azure"] is not None) == DeallocateAzureVm.available()
    notebooks = registry["cull_notebook"]
    assert isinstance(notebooks, CullNotebook) and notebooks.kubeflow is not None and notebooks.jupyterhub is not None
    assert isinstance(registry["scale_to_zero"], ScaleToZero)
    assert {kind: ex.kind for kind, ex in registry.items()} == {k: k for k in registry}


def test_stop_instance_goes_to_ec2_plan_execute_and_observe(registry, moto_url):
    instance, stop = run_instance(moto_url), registry["stop_instance"]
    target = Target(resource_id=instance, resource_type="gpu_instance", region=REGION, tags={"team": "nlp"})
    call = stop.plan(target)
    assert call == Call(api=API, request={"InstanceIds": [instance]}, endpoint=REGION)
    assert state(moto_url, instance) == "running"  # planning called nothing
    assert stop.observe(call) is None  # not stopped: a restart would not count it done
    outcome = stop.execute(call)
    assert outcome.ok and outcome.detail == f"{instance}: stopping"
    assert state(moto_url, instance) in ("stopping", "stopped")
    found = stop.observe(call)
    assert found is not None and found.ok and "found after a restart" in found.detail


def test_an_ec2_host_named_by_its_instance_id_tag_is_stopped_by_that_id(registry, moto_url):
    instance = run_instance(moto_url)
    call = registry["stop_instance"].plan(Target(resource_id="gpu-node-7", region=REGION,
                                                 tags={"instance_id": instance}))  # fmt: skip
    assert call.request == {"InstanceIds": [instance]}
    assert registry["stop_instance"].execute(call).ok and state(moto_url, instance) in ("stopping", "stopped")


def test_what_ec2_would_refuse_is_not_applicable_before_any_call(registry):
    with pytest.raises(NotApplicable, match="no AWS region"):
        registry["stop_instance"].plan(Target(resource_id="i-0123456789abcdef0", region=""))
    with pytest.raises(NotApplicable, match="cannot tell which cloud"):
        registry["stop_instance"].plan(Target(resource_id="gpu-node-1", region=REGION))
    refused = registry["stop_instance"].execute(Call("lambda.Invoke", {"FunctionName": "x"}, REGION))
    assert not refused.ok and refused.detail.startswith("refused: no executor configured")
