"""stop_instance on Compute Engine and Azure, and the dispatcher over the clouds: the real
google-cloud-compute (REST) and azure-mgmt-compute clients against local servers that speak
their REST paths (tests/cloud_vm_apis.py). Assertions are on what the servers received and
on the state they then serve back."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.core.credentials import AccessToken
from google.auth.credentials import AnonymousCredentials

from detector.remediation import azure as az
from detector.remediation import gce
from detector.remediation.base import Call, NotApplicable, Outcome, Target
from detector.remediation.instances import StopInstances, cloud_of
from tests.cloud_vm_apis import AzureApi, GceApi, Server, self_signed

PROJECT, ZONE = "ml-training-prod", "us-central1-a"
SUB = "0b1f6471-1bf0-4dda-aec3-cb9272f09590"
VMS = "providers/Microsoft.Compute/virtualMachines"
VM_ID = f"/subscriptions/{SUB}/resourceGroups/ml-gpu/{VMS}/gpu-vm-1"


class StaticToken:
    """A TokenCredential for tests only: the token the local ARM server expects."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.scopes: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.scopes.append(scopes)
        return AccessToken(self.token, int(time.time()) + 3600)


@pytest.fixture
def gce_api() -> Iterator[tuple[GceApi, str]]:
    state = GceApi()
    state.add(PROJECT, ZONE, "gpu-vm-1", "4518079127640735601")
    server = Server(state)
    try:
        yield state, server.url
    finally:
        if state.hang is not None:
            state.hang.set()
        server.close()


@pytest.fixture
def azure_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[AzureApi, str]]:
    """ARM over TLS; requests (under azure-core) trusts its certificate through REQUESTS_CA_BUNDLE."""
    cert, key = self_signed(tmp_path)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
    state = AzureApi()
    state.add(SUB, "ml-gpu", "gpu-vm-1")
    server = Server(state, tls=(cert, key))
    state.base_url = server.url
    try:
        yield state, server.url
    finally:
        if state.hang is not None:
            state.hang.set()
        server.close()


def gce_stopper(url: str, **kw: Any) -> gce.StopGceInstance:
    return gce.StopGceInstance(endpoint=url, credentials=AnonymousCredentials(), **kw)


def azure_stopper(api: AzureApi, url: str, **kw: Any) -> az.DeallocateAzureVm:
    # Retry-After: 0 makes azure-core wait its polling interval instead: shortened here
    return az.DeallocateAzureVm(endpoint=url, credential=StaticToken(api.token), polling_interval_s=0.05, **kw)


# --- Compute Engine: plan ------------------------------------------------------------------


@pytest.mark.parametrize(
    "target, expected",
    [
        # FOCUS ResourceId / the billing export's resource.global_name: the numeric id
        (Target(f"//compute.googleapis.com/projects/{PROJECT}/zones/{ZONE}/instances/4518079127640735601"),
         (PROJECT, ZONE, "4518079127640735601")),
        # the API's selfLink
        (Target(f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/gpu-vm-1"),
         (PROJECT, ZONE, "gpu-vm-1")),
        # the relative resource name
        (Target(f"projects/{PROJECT}/zones/{ZONE}/instances/gpu-vm-1"), (PROJECT, ZONE, "gpu-vm-1")),
        # a GKE node's providerID
        (Target(f"gce://{PROJECT}/{ZONE}/gke-pool-1-abcd"), (PROJECT, ZONE, "gke-pool-1-abcd")),
        # a bare name (what the bridge keeps of a GKE node): project from account, zone from a detail
        (Target("gpu-vm-1", account=PROJECT, region="us-central1", details={"zone": ZONE}), (PROJECT, ZONE, "gpu-vm-1")),
        # ... or from the node's topology label as a tag, or a region that is a zone
        (Target("gpu-vm-1", account=PROJECT, tags={"topology.kubernetes.io/zone": ZONE}), (PROJECT, ZONE, "gpu-vm-1")),
        (Target("gpu-vm-1", account=PROJECT, region=ZONE), (PROJECT, ZONE, "gpu-vm-1")),
        # a domain-scoped project
        (Target(f"projects/example.com:{PROJECT}/zones/{ZONE}/instances/vm"), (f"example.com:{PROJECT}", ZONE, "vm")),
    ],
)  # fmt: skip
def test_gce_plan_reads_the_forms_gcp_writes(target, expected):
    call = gce.StopGceInstance(endpoint="https://compute.googleapis.com").plan(target)
    assert call.api == "compute.instances.stop"
    assert (call.request["project"], call.request["zone"], call.request["instance"]) == expected
    assert call.endpoint == "https://compute.googleapis.com"


@pytest.mark.parametrize(
    "target, reason",
    [
        # the zone is nowhere: a region is not a zone
        (Target("gpu-vm-1", account=PROJECT, region="us-central1"), "no zone"),
        # no project: the `project` tag is the team's, not GCP's
        (Target("gpu-vm-1", tags={"project": "llm-pretrain"}, details={"zone": ZONE}), "no GCP project"),
        # a path segment smuggled into the name, the zone, the project
        (Target(f"projects/{PROJECT}/zones/{ZONE}/instances/..%2F..%2Fdisks"), "not a Compute Engine instance"),
        (Target("vm/../../disks/boot", account=PROJECT, details={"zone": ZONE}), "not a Compute Engine instance"),
        (Target("gpu-vm-1", account=PROJECT, details={"zone": "us-central1-a/instances/other"}), "not a Compute Engine zone"),
        (Target("gpu-vm-1", account="Proj?x=1", details={"zone": ZONE}), "not a GCP project id"),
        (Target(f"gce://{PROJECT}/{ZONE}/VM_UPPER"), "not a Compute Engine instance"),
        # a name too long, a number too long, control characters
        (Target("a" * 64, account=PROJECT, details={"zone": ZONE}), "not a Compute Engine instance"),
        (Target("9" * 21, account=PROJECT, details={"zone": ZONE}), "not a Compute Engine instance"),
        (Target("vm\n1", account=PROJECT, details={"zone": ZONE}), "not a Compute Engine instance"),
        # megabytes in one field
        (Target("a" * 100_000, account=PROJECT, details={"zone": ZONE}), "not a Compute Engine instance"),
        (Target(f"projects/{PROJECT}/zones/{'z' * 100_000}/instances/vm"), "not a Compute Engine zone"),
        # a zone detail of another type
        (Target("gpu-vm-1", account=PROJECT, details={"zone": ["us-central1-a"]}), "no zone"),
        # not an instance at all
        (Target("gs://bucket", resource_type="storage_bucket"), "not a Compute Engine instance"),
    ],
)  # fmt: skip
def test_gce_plan_refuses_what_is_not_an_instance_it_can_name(target, reason):
    with pytest.raises(NotApplicable, match=reason) as caught:
        gce.StopGceInstance().plan(target)
    assert len(caught.value.reason) < 400 and "\n" not in caught.value.reason  # shown on the alert: one short line


@pytest.mark.parametrize(
    "target, said",
    [
        (Target(f"projects/{PROJECT}/zones/{ZONE}/instances/gpu-vm-1", account="other-project"),
         "in project 'ml-training-prod' but the alert's account says 'other-project'"),
        (Target(f"//compute.googleapis.com/projects/{PROJECT}/zones/{ZONE}/instances/1", details={"project_id": "other-project"}),
         "project_id detail says 'other-project'"),
        (Target(f"gce://{PROJECT}/{ZONE}/node-1", tags={"topology.kubernetes.io/zone": "europe-west4-a"}),
         "in zone 'us-central1-a' but the alert's topology.kubernetes.io/zone tag says 'europe-west4-a'"),
        (Target(f"gce://{PROJECT}/{ZONE}/node-1", details={"zone": "us-central1-b"}), "zone detail says 'us-central1-b'"),
        (Target(f"gce://{PROJECT}/{ZONE}/node-1", region="us-central1-c"), "region says 'us-central1-c'"),
    ],
)  # fmt: skip
def test_gce_a_resource_id_the_alert_contradicts_is_refused(target, said):
    """The instance's path names its project and zone; an alert whose account or zone says otherwise
    may be about another instance: neither is stopped, and the reason names both."""
    with pytest.raises(NotApplicable, match=re.escape(said)):
        gce.StopGceInstance().plan(target)


def test_gce_a_resource_id_the_alert_agrees_with_is_planned():
    """Fields that agree, or that are no project or zone at all (a billing account, a region), are no contradiction."""
    rid = f"//compute.googleapis.com/projects/{PROJECT}/zones/{ZONE}/instances/1"
    target = Target(rid, account=PROJECT, region="us-central1", details={"zone": ZONE, "project_id": "01A2B3-C4D5E6"},
                    tags={"topology.kubernetes.io/zone": ZONE})  # fmt: skip
    assert gce.StopGceInstance().plan(target).request == {"project": PROJECT, "zone": ZONE, "instance": "1"}


# --- Compute Engine: execute ---------------------------------------------------------------


def test_gce_stop_posts_to_the_instance_and_records_the_operation(gce_api):
    api, url = gce_api
    ex = gce_stopper(url)
    call = ex.plan(Target(f"//compute.googleapis.com/projects/{PROJECT}/zones/{ZONE}/instances/4518079127640735601"))
    outcome = ex.execute(call)
    assert outcome.ok and outcome.saves, outcome.detail
    [post] = api.posts()
    assert post.path == f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/4518079127640735601/stop"
    assert post.body in (b"", b"{}")
    assert "operation-1-5f3c2a-stop RUNNING" in outcome.detail and f"--zone {ZONE}" in outcome.detail
    assert api.status(PROJECT, ZONE, "gpu-vm-1") == "STOPPING"
    # the instance read first (no managed group keeps it); no wait by default: the SDK's own poll is not made either
    assert [r.method for r in api.received] == ["GET", "POST"]
    # after a restart, observe() reads the instance's state through the same API
    found = ex.observe(call)
    assert found is not None and found.ok and "STOPPING" in found.detail
    assert api.received[-1].method == "GET"


def test_gce_stop_with_wait_waits_on_the_zone_operation(gce_api):
    api, url = gce_api
    ex = gce_stopper(url, wait_s=30)
    outcome = ex.execute(ex.plan(Target("gpu-vm-1", account=PROJECT, details={"zone": ZONE})))
    assert outcome.ok and "stopped" in outcome.detail and "DONE" in outcome.detail, outcome.detail
    assert [r.path for r in api.posts()] == [
        f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/gpu-vm-1/stop",
        f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/operations/operation-1-5f3c2a-stop/wait",
    ]
    assert api.status(PROJECT, ZONE, "gpu-vm-1") == "TERMINATED"


def test_gce_wait_is_called_again_while_time_is_left(gce_api):
    api, url = gce_api
    api.waits_running = 2  # the API answered RUNNING after its ~2 minutes, twice
    ex = gce_stopper(url, wait_s=30)
    outcome = ex.execute(ex.plan(Target("gpu-vm-1", account=PROJECT, region=ZONE)))
    assert outcome.ok and outcome.detail.startswith("stopped"), outcome.detail
    assert [r.path.rsplit("/", 1)[-1] for r in api.posts()] == ["stop", "wait", "wait", "wait"]


def test_gce_wait_gives_up_at_wait_s_with_the_stop_accepted(gce_api):
    api, url = gce_api
    api.waits_running = 1_000
    ex = gce_stopper(url, wait_s=0.5)
    started = time.monotonic()
    outcome = ex.execute(ex.plan(Target("gpu-vm-1", account=PROJECT, region=ZONE)))
    assert time.monotonic() - started < 5
    assert outcome.ok and "operation-1-5f3c2a-stop RUNNING (the instance stops in the background" in outcome.detail


def test_gce_wait_that_fails_after_the_stop_was_accepted_is_not_a_failure(gce_api):
    """The stop was accepted; a failed wait is reported, and is no reason to stop again."""
    api, url = gce_api
    api.pass_first, api.failures = 2, [503]  # the instance read and the stop pass
    ex = gce_stopper(url, wait_s=30)
    outcome = ex.execute(ex.plan(Target("gpu-vm-1", account=PROJECT, region=ZONE)))
    assert outcome.ok and "operation-1-5f3c2a-stop RUNNING; could not follow it" in outcome.detail, outcome.detail
    assert [r.path.rsplit("/", 1)[-1] for r in api.posts()] == ["stop", "wait"]
    assert api.status(PROJECT, ZONE, "gpu-vm-1") == "STOPPING"


def test_gce_operation_done_with_an_error_is_a_failure(gce_api):
    api, url = gce_api
    api.operation_error = {"errors": [{"code": "UNSUPPORTED_OPERATION", "message": "Instance with local SSD cannot be stopped"}]}
    ex = gce_stopper(url)
    outcome = ex.execute(ex.plan(Target("gpu-vm-1", account=PROJECT, region=ZONE)))
    assert not outcome.ok and not outcome.retryable
    assert "UNSUPPORTED_OPERATION" in outcome.detail and "local SSD" in outcome.detail


@pytest.mark.parametrize(
    "status, retryable, said",
    [
        (403, False, "compute.instances.stop"),  # the service account lacks the permission: a refusal
        (404, False, "no such instance"),  # deleted since the alert: nothing to retry
        (400, False, "HTTP 400"),
        (409, True, "HTTP 409"),  # another operation in progress on the instance
        (429, True, "HTTP 429"),  # rate limited
        (500, True, "HTTP 500"),
        (503, True, "HTTP 503"),
    ],
)  # fmt: skip
def test_gce_errors(gce_api, status, retryable, said):
    api, url = gce_api
    api.pass_first = 1  # the instance read passes, the stop fails
    api.failures.append(status)
    ex = gce_stopper(url)
    outcome = ex.execute(ex.plan(Target(f"projects/{PROJECT}/zones/{ZONE}/instances/gpu-vm-1")))
    assert (outcome.ok, outcome.retryable) == (False, retryable), outcome.detail
    assert said in outcome.detail and "injected" in outcome.detail
    assert api.status(PROJECT, ZONE, "gpu-vm-1") == "RUNNING"


@pytest.mark.parametrize("status, retryable, said", [(403, False, "need compute.instances.get"), (503, True, "HTTP 503")])
def test_gce_an_instance_that_cannot_be_read_first_is_not_stopped(gce_api, status, retryable, said):
    api, url = gce_api
    api.failures.append(status)
    outcome = gce_stopper(url).execute(gce_stopper(url).plan(Target(f"projects/{PROJECT}/zones/{ZONE}/instances/gpu-vm-1")))
    assert (outcome.ok, outcome.retryable) == (False, retryable) and said in outcome.detail, outcome.detail
    assert "before stopping it" in outcome.detail and api.posts() == []


def test_gce_an_instance_a_managed_group_keeps_is_not_stopped(gce_api):
    """The group would start it again (a GKE node pool's node is one's): resizing the group is the fix."""
    api, url = gce_api
    group = f"projects/123456789012/zones/{ZONE}/instanceGroupManagers/gke-train-gpu-pool-1a2b3c4d-grp"
    api.add(PROJECT, ZONE, "gke-train-gpu-pool-1a2b3c4d-x9zq", "4518079127640735999", created_by=group)
    ex = gce_stopper(url)
    outcome = ex.execute(ex.plan(Target(f"gce://{PROJECT}/{ZONE}/gke-train-gpu-pool-1a2b3c4d-x9zq")))
    assert (outcome.ok, outcome.retryable) == (False, False), outcome.detail
    assert "managed instance group" in outcome.detail and "gke-train-gpu-pool-1a2b3c4d-grp" in outcome.detail
    assert "resize" in outcome.detail and api.posts() == []
    assert api.status(PROJECT, ZONE, "gke-train-gpu-pool-1a2b3c4d-x9zq") == "RUNNING"


@pytest.mark.parametrize("status", ["TERMINATED", "STOPPING", "SUSPENDED"])
def test_gce_an_instance_already_stopped_is_not_stopped_again_and_saves_nothing(gce_api, status):
    """Its owner stopped it since the proposal: a success (nothing is left to do) that saves nothing."""
    api, url = gce_api
    api.instances[(PROJECT, ZONE, "gpu-vm-1")]["status"] = status
    outcome = gce_stopper(url).execute(Call(gce.API, {"project": PROJECT, "zone": ZONE, "instance": "gpu-vm-1"}, url))
    assert outcome.ok and not outcome.saves and f"was already stopped ({status})" in outcome.detail
    assert api.posts() == []


def test_gce_401_makes_google_auth_refresh_and_then_refuses(gce_api):
    """A 401 (a revoked key) makes google-auth refresh the credentials; ones that cannot be: refused, not retried."""
    api, url = gce_api
    api.failures.append(401)
    ex = gce_stopper(url)
    outcome = ex.execute(ex.plan(Target(f"projects/{PROJECT}/zones/{ZONE}/instances/gpu-vm-1")))
    assert (outcome.ok, outcome.retryable) == (False, False) and "credentials were refused" in outcome.detail


def test_gce_unknown_instance_is_reported_by_the_api(gce_api):
    _, url = gce_api
    ex = gce_stopper(url)
    outcome = ex.execute(ex.plan(Target(f"projects/{PROJECT}/zones/{ZONE}/instances/gone-vm")))
    assert not outcome.ok and not outcome.retryable and "was not found" in outcome.detail


def test_gce_timeout_is_retryable(gce_api):
    api, url = gce_api
    api.hang = threading.Event()
    ex = gce_stopper(url, timeout_s=0.5)
    outcome = ex.execute(ex.plan(Target(f"projects/{PROJECT}/zones/{ZONE}/instances/gpu-vm-1")))
    assert not outcome.ok and outcome.retryable and "Timeout" in outcome.detail, outcome.detail


def test_gce_unreachable_is_retryable():
    ex = gce_stopper("http://127.0.0.1:9")  # the discard port: nothing listens
    outcome = ex.execute(ex.plan(Target(f"projects/{PROJECT}/zones/{ZONE}/instances/gpu-vm-1")))
    assert not outcome.ok and outcome.retryable and "ConnectionError" in outcome.detail, outcome.detail


def test_gce_without_credentials_says_so(gce_api, tmp_path, monkeypatch):
    """Application Default Credentials find nothing (the key file named does not exist): no call is made."""
    api, url = gce_api
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    ex = gce.StopGceInstance(endpoint=url)
    outcome = ex.execute(ex.plan(Target(f"projects/{PROJECT}/zones/{ZONE}/instances/gpu-vm-1")))
    assert not outcome.ok and "no Google credentials" in outcome.detail
    assert api.received == []


@pytest.mark.parametrize(
    "call",
    [
        # stored calls come back from the audit table: each part is checked again
        Call(gce.API, {"project": PROJECT, "zone": ZONE, "instance": "../../global/images/x"}),
        Call(gce.API, {"project": PROJECT, "zone": "us-central1-a/instances/x", "instance": "vm"}),
        Call(gce.API, {"project": ["p"], "zone": ZONE, "instance": "vm"}),
        Call(gce.API, {"project": PROJECT, "zone": ZONE}),
        Call("compute.instances.delete", {"project": PROJECT, "zone": ZONE, "instance": "gpu-vm-1"}),
        # planned for another endpoint: the credentials are not sent there
        Call(gce.API, {"project": PROJECT, "zone": ZONE, "instance": "gpu-vm-1"}, endpoint="https://evil.example"),
    ],
)  # fmt: skip
def test_gce_refuses_a_stored_call_it_would_not_plan(gce_api, call):
    api, url = gce_api
    outcome = gce_stopper(url).execute(call)
    assert not outcome.ok and not outcome.retryable and outcome.detail.startswith("refused")
    assert api.received == []


# --- Azure: plan ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "resource_id, expected",
    [
        (VM_ID, (SUB, "ml-gpu", "gpu-vm-1")),
        # as Azure's cost exports (and the bridge) write it: in lower case
        (VM_ID.lower(), (SUB, "ml-gpu", "gpu-vm-1")),
        # resource groups take dots, parentheses and letters of any script
        (f"/subscriptions/{SUB}/resourceGroups/ml.gpu(west)_équipe/{VMS}/vm_1.a",
         (SUB, "ml.gpu(west)_équipe", "vm_1.a")),
    ],
)  # fmt: skip
def test_azure_plan_parses_the_arm_id(resource_id, expected):
    call = az.DeallocateAzureVm().plan(Target(resource_id))
    assert call.api == "Microsoft.Compute/virtualMachines/deallocate/action"
    assert (call.request["subscription_id"], call.request["resource_group"], call.request["vm_name"]) == expected
    assert call.endpoint == "https://management.azure.com"


@pytest.mark.parametrize(
    "resource_id, reason",
    [
        # a scale set's instance: the scale set would replace it
        (f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/ss/virtualMachines/3",
         "scale set"),
        # another resource type, a disk
        (f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/disks/d1", "not an Azure VM id"),
        # anything after the name (an action, a child resource)
        (VM_ID + "/extensions/x", "not an Azure VM id"),
        (VM_ID + "/", "not an Azure VM id"),
        # a subscription that is no GUID
        (f"/subscriptions/not-a-guid/resourceGroups/rg/{VMS}/vm", "not an Azure subscription"),
        # traversal and injection in each part
        (f"/subscriptions/{SUB}/resourceGroups/../{VMS}/vm", "resource group"),
        (f"/subscriptions/{SUB}/resourceGroups/rg/{VMS}/..", "not an Azure VM name"),
        (f"/subscriptions/{SUB}/resourceGroups/rg/{VMS}/vm?api-version=1",
         "not an Azure VM name"),
        (f"/subscriptions/{SUB}/resourceGroups/rg%2F..%2F/{VMS}/vm", "resource group"),
        (f"/subscriptions/{SUB}/resourceGroups/rg/{VMS}/vm\n", "not an Azure VM"),
        (f"/subscriptions/{SUB}/resourceGroups/rg/{VMS}/" + "v" * 65, "not an Azure VM name"),
        (f"/subscriptions/{SUB}/resourceGroups/{'r' * 91}/{VMS}/vm", "resource group"),
        (f"/subscriptions/{SUB}/resourceGroups/rg./{VMS}/vm", "resource group"),
        # something before the id
        ("https://management.azure.com" + VM_ID, "not an Azure VM id"),
        ("gpu-vm-1", "not an Azure VM id"),
        # megabytes in one field
        (f"/subscriptions/{SUB}/resourceGroups/rg/{VMS}/" + "v" * 100_000, "not an Azure VM name"),
        ("/subscriptions/" + "0" * 100_000, "not an Azure VM id"),
    ],
)  # fmt: skip
def test_azure_plan_refuses_hostile_or_other_ids(resource_id, reason):
    with pytest.raises(NotApplicable, match=reason) as caught:
        az.DeallocateAzureVm().plan(Target(resource_id))
    assert len(caught.value.reason) < 400 and "\n" not in caught.value.reason  # shown on the alert: one short line


def test_azure_endpoint_must_be_https():
    with pytest.raises(ValueError, match="not https"):
        az.DeallocateAzureVm(endpoint="http://management.azure.com")
    with pytest.raises(ValueError, match="user or password") as caught:  # recorded with every call: never
        az.DeallocateAzureVm(endpoint="https://admin:s3cret-pw@management.azure.com")
    assert "s3cret-pw" not in str(caught.value)


# --- Azure: execute -------------------------------------------------------------------------


def test_azure_deallocates_and_records_the_operation_without_waiting(azure_api):
    api, url = azure_api
    ex = azure_stopper(api, url)
    call = ex.plan(Target(VM_ID.lower()))
    outcome = ex.execute(call)
    assert outcome.ok, outcome.detail
    get, post = api.received  # the VM read first: a Flexible scale set's instance is refused
    assert (get.method, get.path) == ("GET", f"/subscriptions/{SUB}/resourceGroups/ml-gpu/{VMS}/gpu-vm-1")
    assert post.method == "POST"
    # the SDK's own casing of the fixed segments; the names as the (lower-cased) id gave them
    assert post.path == f"/subscriptions/{SUB}/resourceGroups/ml-gpu/{VMS}/gpu-vm-1/deallocate"
    assert "api-version=" in post.query and post.headers["Authorization"] == f"Bearer {api.token}"
    assert "operation 6a1f0c2e-0d4b-4c55-9a7e-000000000001" in outcome.detail and "deallocating" in outcome.detail
    assert api.power(SUB, "ml-gpu", "gpu-vm-1") == "deallocating"
    found = ex.observe(call)
    assert found is not None and found.ok and "PowerState/deallocating" in found.detail


@pytest.mark.parametrize("power", ["deallocated", "deallocating"])
def test_azure_a_vm_already_deallocated_is_not_deallocated_again_and_saves_nothing(azure_api, power):
    """Its owner deallocated it since the proposal: a success that saves nothing. Its power state
    comes with the read made before the call (``$expand=instanceView``): no call more."""
    api, url = azure_api
    api.vms[(SUB.lower(), "ml-gpu", "gpu-vm-1")] = power
    outcome = azure_stopper(api, url).execute(azure_stopper(api, url).plan(Target(VM_ID)))
    assert outcome.ok and not outcome.saves and f"was already stopped (PowerState/{power})" in outcome.detail
    assert [r.method for r in api.received] == ["GET"]


def test_azure_a_vm_merely_powered_off_is_deallocated_and_saves(azure_api):
    """Powered off (``stopped``), a VM is still billed for its compute: deallocating it saves."""
    api, url = azure_api
    api.vms[(SUB.lower(), "ml-gpu", "gpu-vm-1")] = "stopped"
    outcome = azure_stopper(api, url).execute(azure_stopper(api, url).plan(Target(VM_ID)))
    assert outcome.ok and outcome.saves and [r.method for r in api.received] == ["GET", "POST"]


def test_azure_with_wait_polls_the_async_operation_to_its_end(azure_api):
    api, url = azure_api
    api.polls_in_progress = 2
    ex = azure_stopper(api, url, wait_s=30)
    outcome = ex.execute(ex.plan(Target(VM_ID)))
    assert outcome.ok and outcome.detail.startswith("deallocated"), outcome.detail
    assert api.received[1].method == "POST" and api.received[1].path.endswith("/virtualMachines/gpu-vm-1/deallocate")
    polls = [r for r in api.received[2:] if "monitor=true" not in r.query]
    assert len(polls) == 3 and all(r.method == "GET" and "/operations/" in r.path for r in polls)
    assert all(r.headers["Authorization"] == f"Bearer {api.token}" for r in api.received)
    assert api.power(SUB, "ml-gpu", "gpu-vm-1") == "deallocated"


def test_azure_failed_operation_is_reported_with_arms_error(azure_api):
    api, url = azure_api
    api.operation_error = {"code": "OperationNotAllowed", "message": "The VM is being updated by another operation."}
    ex = azure_stopper(api, url, wait_s=30)
    outcome = ex.execute(ex.plan(Target(VM_ID)))
    assert (outcome.ok, outcome.retryable) == (False, False), outcome.detail
    assert "the operation failed: OperationNotAllowed: The VM is being updated" in outcome.detail
    assert api.power(SUB, "ml-gpu", "gpu-vm-1") == "deallocating"


def test_azure_poll_that_fails_after_the_deallocation_was_accepted_is_not_a_failure(azure_api):
    """ARM accepted the deallocation; a failed poll is reported, and is no reason to call again."""
    api, url = azure_api
    api.pass_first, api.failures = 2, [503]
    ex = azure_stopper(api, url, wait_s=30)
    outcome = ex.execute(ex.plan(Target(VM_ID)))
    assert outcome.ok and "could not follow it" in outcome.detail and "503" in outcome.detail, outcome.detail
    assert [r.method for r in api.received] == ["GET", "POST", "GET"]


def test_azure_merely_stopped_vm_is_not_observed_as_done(azure_api):
    """Powered off but allocated is still billed: observe() does not take it for a deallocation."""
    api, url = azure_api
    api.add(SUB, "ml-gpu", "gpu-vm-1", power="stopped")
    ex = azure_stopper(api, url)
    assert ex.observe(ex.plan(Target(VM_ID))) is None
    api.add(SUB, "ml-gpu", "gpu-vm-1", power="deallocated")
    found = ex.observe(ex.plan(Target(VM_ID)))
    assert found is not None and found.ok


@pytest.mark.parametrize("at", ["read", "deallocate"])
@pytest.mark.parametrize(
    "status, retryable, said",
    [
        (403, False, "needs Microsoft.Compute/virtualMachines/"),  # the identity lacks the role: a refusal
        (401, False, "refused"),
        (404, False, "no such VM"),
        (400, False, "HTTP 400"),
        (409, True, "HTTP 409"),  # another operation on the VM
        (429, True, "HTTP 429"),  # ARM's throttling
        (500, True, "HTTP 500"),
        (503, True, "HTTP 503"),
    ],
)  # fmt: skip
def test_azure_errors(azure_api, status, retryable, said, at):
    """The same classification whether the read before the call or the deallocation gets the error; a 403
    names the permission that call needs."""
    api, url = azure_api
    api.pass_first = 0 if at == "read" else 1
    api.failures.append(status)
    ex = azure_stopper(api, url)
    outcome = ex.execute(ex.plan(Target(VM_ID)))
    assert (outcome.ok, outcome.retryable) == (False, retryable), outcome.detail
    assert said in outcome.detail and "injected" in outcome.detail
    if status == 403:
        assert outcome.detail.endswith("virtualMachines/read" if at == "read" else "deallocate/action"), outcome.detail
    assert api.power(SUB, "ml-gpu", "gpu-vm-1") == "running"
    assert len(api.received) == api.pass_first + 1  # the SDK does not retry behind the runner's back


def test_azure_flexible_scale_set_instance_is_not_deallocated(azure_api):
    """Its id is a plain VM's: the VM read before the call says it belongs to a scale set, which would
    replace it or count it against its capacity. Nothing is deallocated; the detail says what to do."""
    api, url = azure_api
    scale_set = f"/subscriptions/{SUB}/resourceGroups/ml-gpu/providers/Microsoft.Compute/virtualMachineScaleSets/gpu-pool"
    api.add(SUB, "ml-gpu", "gpu-vm-1", scale_set=scale_set)
    ex = azure_stopper(api, url)
    outcome = ex.execute(ex.plan(Target(VM_ID)))
    assert (outcome.ok, outcome.retryable) == (False, False), outcome.detail
    assert "is an instance of scale set 'gpu-pool' (Flexible" in outcome.detail and "scale the scale set" in outcome.detail
    assert [r.method for r in api.received] == ["GET"] and api.power(SUB, "ml-gpu", "gpu-vm-1") == "running"


def test_azure_unknown_vm_is_reported_by_the_api(azure_api):
    api, url = azure_api
    ex = azure_stopper(api, url)
    outcome = ex.execute(ex.plan(Target(VM_ID.replace("gpu-vm-1", "gone-vm"))))
    assert not outcome.ok and not outcome.retryable and "ResourceNotFound" in outcome.detail, outcome.detail


def test_azure_timeout_is_retryable(azure_api):
    api, url = azure_api
    api.hang = threading.Event()
    ex = azure_stopper(api, url, timeout_s=0.5)
    outcome = ex.execute(ex.plan(Target(VM_ID)))
    assert not outcome.ok and outcome.retryable, outcome.detail


def test_azure_without_credentials_says_so(azure_api, monkeypatch):
    """DefaultAzureCredential, limited to the environment's service principal (so no managed identity
    endpoint or CLI is tried), finds none: nothing is sent to ARM."""
    api, url = azure_api
    for name in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_CLIENT_CERTIFICATE_PATH",
                 "AZURE_USERNAME", "AZURE_FEDERATED_TOKEN_FILE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_TOKEN_CREDENTIALS", "EnvironmentCredential")
    ex = az.DeallocateAzureVm(endpoint=url)
    outcome = ex.execute(ex.plan(Target(VM_ID)))
    assert (outcome.ok, outcome.retryable) == (False, False)
    assert outcome.detail.startswith("no Azure credentials") and "EnvironmentCredential" in outcome.detail
    assert api.received == []


def test_azure_credential_settings_that_are_refused_are_an_outcome_not_an_exception(azure_api, monkeypatch):
    """DefaultAzureCredential() itself raises ValueError on a bad AZURE_TOKEN_CREDENTIALS: execute never raises."""
    api, url = azure_api
    monkeypatch.setenv("AZURE_TOKEN_CREDENTIALS", "no-such-credential")
    ex = az.DeallocateAzureVm(endpoint=url)
    outcome = ex.execute(ex.plan(Target(VM_ID)))
    assert (outcome.ok, outcome.retryable) == (False, False)
    assert "setting up Azure credentials" in outcome.detail and "AZURE_TOKEN_CREDENTIALS" in outcome.detail, outcome.detail
    assert api.received == []


def test_azure_untrusted_certificate_is_not_sent_the_token(azure_api, monkeypatch):
    api, url = azure_api
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    ex = azure_stopper(api, url)
    outcome = ex.execute(ex.plan(Target(VM_ID)))
    assert not outcome.ok and "SSL" in outcome.detail.upper(), outcome.detail
    assert api.received == []


@pytest.mark.parametrize(
    "call",
    [
        Call(az.API, {"subscription_id": SUB, "resource_group": "rg/../x", "vm_name": "vm"}),
        Call(az.API, {"subscription_id": "x", "resource_group": "rg", "vm_name": "vm"}),
        Call(az.API, {"subscription_id": SUB, "resource_group": "rg", "vm_name": "vm/start"}),
        Call(az.API, {"subscription_id": SUB, "resource_group": "rg", "vm_name": 7}),
        Call("Microsoft.Compute/virtualMachines/delete", {"subscription_id": SUB, "resource_group": "rg", "vm_name": "vm"}),
        Call(az.API, {"subscription_id": SUB, "resource_group": "ml-gpu", "vm_name": "gpu-vm-1"}, endpoint="https://evil.example"),
    ],
)  # fmt: skip
def test_azure_refuses_a_stored_call_it_would_not_plan(azure_api, call):
    api, url = azure_api
    outcome = azure_stopper(api, url).execute(call)
    assert not outcome.ok and not outcome.retryable and outcome.detail.startswith("refused")
    assert api.received == []


# --- the dispatcher -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target, cloud",
    [
        (Target("i-0a1b2c3d4e5f67890", region="us-east-1"), "ec2"),
        (Target("gpu-host-3", tags={"instance_id": "i-0a1b2c3d"}), "ec2"),
        (Target(VM_ID.lower()), "azure"),
        (Target(f"//compute.googleapis.com/projects/{PROJECT}/zones/{ZONE}/instances/123"), "gce"),
        (Target(f"gce://{PROJECT}/{ZONE}/node-1"), "gce"),
        # a bare name says no cloud; the provider detail does (FOCUS's ProviderName or ours)
        (Target("gpu-vm-1", details={"provider": "Google Cloud"}), "gce"),
        (Target("gpu-vm-1", details={"provider": "gcp"}), "gce"),
        (Target("x", details={"provider": "Microsoft"}), "azure"),
        (Target("x", details={"provider": "AWS"}), "ec2"),
    ],
)  # fmt: skip
def test_cloud_of(target, cloud):
    assert cloud_of(target) == cloud


@pytest.mark.parametrize(
    "target, reason",
    [
        (Target("gpu-vm-1"), "cannot tell which cloud"),  # a bare name, no provider: not guessed
        (Target("gpu-vm-1", details={"provider": "oracle"}), "not on 'oracle'"),
        (Target("i-0a1b2c3d4e5f67890"), "EC2 instances is not configured"),  # EC2 passed as None
        (Target("bucket", resource_type="storage_bucket", details={"provider": "gcp"}), "not a VM"),
    ],
)  # fmt: skip
def test_dispatcher_not_applicable(target, reason):
    with pytest.raises(NotApplicable, match=reason):
        StopInstances(ec2=None, gce=gce.StopGceInstance(), azure=az.DeallocateAzureVm()).plan(target)


def test_dispatcher_with_no_cloud_configured_says_so():
    with pytest.raises(NotApplicable, match="no cloud is configured"):
        StopInstances().plan(Target(VM_ID))


def test_dispatcher_sends_each_call_to_its_cloud(gce_api, azure_api):
    gapi, gurl = gce_api
    aapi, aurl = azure_api
    stop = StopInstances(ec2=None, gce=gce_stopper(gurl), azure=azure_stopper(aapi, aurl))
    assert stop.kind == "stop_instance"
    gcall = stop.plan(Target("gpu-vm-1", account=PROJECT, region=ZONE, details={"provider": "gcp"}))
    acall = stop.plan(Target(VM_ID))
    assert stop.execute(gcall).ok and stop.execute(acall).ok
    assert [r.path.rsplit("/", 1)[-1] for r in gapi.posts()] == ["stop"]
    assert [r.path.rsplit("/", 1)[-1] for r in aapi.posts()] == ["deallocate"]
    observed = [stop.observe(gcall), stop.observe(acall)]
    assert all(isinstance(o, Outcome) and o.ok for o in observed)
    # EC2's call (as the EC2 executor plans it) with no EC2 executor: refused, nothing sent
    ec2_call = Call("ec2.StopInstances", {"InstanceIds": ["i-0a1b2c3d4e5f67890"]}, endpoint="us-east-1")
    outcome = stop.execute(ec2_call)
    assert not outcome.ok and "refused" in outcome.detail
    assert stop.observe(ec2_call) is None
    assert not stop.execute(Call("compute.instances.delete", dict(gcall.request))).ok


def test_no_cloud_sdk_is_imported_to_plan():
    """burnwatch without the [gcp]/[azure] extras: planning and dispatching import no SDK."""
    import subprocess
    import sys

    code = ("import sys; from detector.remediation.instances import StopInstances; "
            "from detector.remediation.gce import StopGceInstance; from detector.remediation.azure import DeallocateAzureVm; "
            "from detector.remediation.base import Target; "
            f"StopInstances(gce=StopGceInstance(), azure=DeallocateAzureVm()).plan(Target({VM_ID!r})); "
            "print(sorted(m for m in sys.modules if m.startswith(('google', 'azure', 'grpc'))))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


BLOCK_SDKS = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("google", "azure"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Absent())
"""


def test_without_the_sdks_the_executors_say_what_to_install():
    """As if neither extra were installed (imports of google.* and azure.* fail): available() is False,
    and a call made anyway says which extra to install instead of raising."""
    import subprocess
    import sys

    code = BLOCK_SDKS + (
        "from detector.remediation.gce import StopGceInstance; from detector.remediation.azure import DeallocateAzureVm\n"
        "from detector.remediation.base import Target\n"
        "g, a = StopGceInstance(), DeallocateAzureVm()\n"
        "print(g.available(), a.available())\n"
        f"print(g.execute(g.plan(Target('projects/{PROJECT}/zones/{ZONE}/instances/vm'))).detail)\n"
        f"print(a.execute(a.plan(Target({VM_ID!r}))).detail)\n"
    )  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.splitlines() == ["False False", gce.NOT_INSTALLED, az.NOT_INSTALLED]


def test_with_the_sdks_the_executors_are_available():
    assert gce.StopGceInstance.available() and az.DeallocateAzureVm.available()


# --- what the detectors write is what the dispatcher reads -----------------------------------


def _idle_alert_on(tmp_path: Path, rid: str, **fields: str) -> Target:
    """An idle_gpu alert from the engine, on a host whose usage events carry ``rid`` and ``fields``."""
    import msgspec

    from detector.alerts import AlertManager
    from detector.engine import Engine
    from detector.events import UsageEvent
    from detector.rules import load_rules
    from tests.test_partly_idle_gpu import ALL_IDLE, host

    (tmp_path / "rules.yaml").write_text("rules:\n  - {name: idle-gpu, type: idle_gpu}\n")
    ruleset = load_rules(tmp_path)
    events = [msgspec.structs.replace(e, **fields) if isinstance(e, UsageEvent) else e for e in host([(40, ALL_IDLE)], rid=rid)]
    (fired,) = [a for a in AlertManager(ruleset=ruleset).handle(Engine(ruleset).process(events)) if a.change == "fired"]
    return Target.from_alert(fired)


def test_an_idle_gce_host_from_the_bill_plans_its_stop(tmp_path):
    """FOCUS's ResourceId for a GCE VM (its full resource name, the numeric id) survives into the alert."""
    rid = f"//compute.googleapis.com/projects/{PROJECT}/zones/{ZONE}/instances/4518079127640735601"
    target = _idle_alert_on(tmp_path, rid, provider="Google Cloud", account=PROJECT, region="us-central1")
    call = StopInstances(gce=gce.StopGceInstance(), azure=az.DeallocateAzureVm()).plan(target)
    assert call.api == gce.API and call.request == {"project": PROJECT, "zone": ZONE, "instance": "4518079127640735601"}


def test_an_idle_azure_vm_plans_its_deallocation(tmp_path):
    target = _idle_alert_on(tmp_path, VM_ID.lower(), provider="azure", account=SUB, region="eastus")
    call = StopInstances(gce=gce.StopGceInstance(), azure=az.DeallocateAzureVm()).plan(target)
    assert call.api == az.API and call.request == {"subscription_id": SUB, "resource_group": "ml-gpu", "vm_name": "gpu-vm-1"}
