"""``stop_instance`` on Azure: deallocate the VM through azure-mgmt-compute.

Deallocate, not power off: a VM that is only powered off (``PowerState/stopped``, what
``az vm stop`` or a shutdown from inside the guest leaves) keeps its hardware and is still
billed for its compute, GPUs included; a deallocated one is not (its disks and reserved
public addresses still are). It starts again with ``az vm start``; a dynamic public IP
address may change.

The VM is named by its ARM resource id, which is what Azure's cost exports (FOCUS's
``ResourceId``, in lower case) and AKS nodes' ``providerID`` carry:
``/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}``.
It is parsed strictly: a subscription GUID, a resource group name and a VM name in Azure's
own syntax; the fixed segments compared without case (ARM ignores it, exports lower-case it);
nothing before, after or in between. A scale set's instance is not a VM this executor
deallocates: the scale set would replace it or count it against its capacity. A Uniform scale
set's instance says so in its id (``.../virtualMachineScaleSets/{ss}/virtualMachines/{n}``) and
is refused at plan time; a Flexible one's is a plain VM id, so the VM is read (``virtualMachines
get``) just before the call, and one whose ``virtualMachineScaleSet`` is set is refused, saying
to scale the scale set instead.

Credentials: azure-identity's ``DefaultAzureCredential`` (environment service principal,
workload identity, managed identity, Azure CLI login), never from a rule file, never logged.
The role needs ``Microsoft.Compute/virtualMachines/deallocate/action`` and ``.../read`` (the check
before the call, and :meth:`observe`), as "Virtual Machine Contributor" has.

Deallocation is a long-running operation (202 with ``Azure-AsyncOperation`` and ``Location``
headers, then polled). By default (``wait_s=0``) the executor does not wait: an accepted
deallocation is a success whose detail carries the operation's id (the last segment of its
``Azure-AsyncOperation`` URL); with ``wait_s`` it polls up to that long and reports the end
state (Succeeded, Failed with ARM's error, or still running).
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any, ClassVar
from urllib.parse import urlsplit

from detector.remediation.base import ActionKind, Call, NotApplicable, Outcome, Target
from detector.remediation.stored import rechecked
from detector.remediation.workloads import shown

__all__ = ["API", "DEFAULT_ENDPOINT", "DeallocateAzureVm", "arm_vm", "looks_like_azure"]

API = "Microsoft.Compute/virtualMachines/deallocate/action"
"""The ARM operation, which is also the RBAC permission it needs."""
READ = "Microsoft.Compute/virtualMachines/read"
"""The permission reading the VM needs, before the call and after a restart."""
DEFAULT_ENDPOINT = "https://management.azure.com"
SUBSCRIPTION = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
RESOURCE_GROUP = re.compile(r"[-\w().]{0,89}[-\w()]")
"""1 to 90 letters (any script), digits, ``_ - . ( )``, not ending in a period."""
VM_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,62}[A-Za-z0-9_])?")
"""1 to 64 letters, digits, ``_ . -``; neither starting nor ending with ``.`` or ``-``."""
_VM_ID = re.compile(r"/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/Microsoft\.Compute/virtualMachines/([^/]+)",
                    re.IGNORECASE)  # fmt: skip
_SCALE_SET_VM = re.compile(r"/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Compute/"
                           r"virtualMachineScaleSets/([^/]+)/virtualMachines/[^/]+", re.IGNORECASE)  # fmt: skip
DEALLOCATED = ("PowerState/deallocating", "PowerState/deallocated")
TIMEOUT_S = 20.0
NOT_INSTALLED = "azure-mgmt-compute or azure-identity is not installed: pip install 'burnwatch[azure]'"


def looks_like_azure(resource_id: str) -> bool:
    """Whether the id is an ARM resource id at all (``/subscriptions/...``)."""
    return resource_id.lower().startswith("/subscriptions/")


def _valid(subscription: object, group: object, name: object) -> bool:
    return (isinstance(subscription, str) and SUBSCRIPTION.fullmatch(subscription) is not None
            and isinstance(group, str) and RESOURCE_GROUP.fullmatch(group) is not None
            and isinstance(name, str) and VM_NAME.fullmatch(name) is not None)  # fmt: skip


def arm_vm(resource_id: str) -> tuple[str, str, str]:
    """(subscription, resource group, VM name) of an ARM VM id, or :class:`NotApplicable`."""
    if m := _SCALE_SET_VM.fullmatch(resource_id):
        raise NotApplicable(f"{shown(resource_id, 200)} is an instance of scale set {shown(m.group(1))}: "
                            "deallocate or scale the scale set instead")  # fmt: skip
    m = _VM_ID.fullmatch(resource_id)
    if m is None:
        raise NotApplicable(f"{shown(resource_id, 200)} is not an Azure VM id "
                            "(/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name})")
    subscription, group, name = m.groups()
    if not SUBSCRIPTION.fullmatch(subscription):
        raise NotApplicable(f"{shown(subscription)} is not an Azure subscription id (a GUID)")
    if not RESOURCE_GROUP.fullmatch(group):
        raise NotApplicable(f"{shown(group)} is not an Azure resource group name")
    if not VM_NAME.fullmatch(name):
        raise NotApplicable(f"{shown(name)} is not an Azure VM name")
    return subscription, group, name


class DeallocateAzureVm:
    """Deallocates the Azure VM the alert's resource id names."""

    kind: ClassVar[ActionKind] = "stop_instance"

    def __init__(self, *, endpoint: str | None = None, credential: Any = None, wait_s: float = 0.0,
                 timeout_s: float = TIMEOUT_S, polling_interval_s: float = 15.0) -> None:  # fmt: skip
        """``endpoint``: Azure Resource Manager (default ``https://management.azure.com``; another
        cloud's, like ``https://management.usgovcloudapi.net``, or a local server in tests:
        the token's audience follows ``AZURE_CLOUD``, azure-core's cloud setting);
        ``credential``: a ``TokenCredential`` (default ``DefaultAzureCredential()``, made when the
        first call is); ``wait_s``: how long to wait for the deallocation to finish (0: not at all);
        ``polling_interval_s``: between polls when the server sends no ``Retry-After``."""
        self.endpoint = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
        if "@" in urlsplit(self.endpoint).netloc:  # the endpoint is recorded with every call, and quoted below
            raise ValueError("Azure Resource Manager endpoint has a user or password in it: the credential is the token")
        if urlsplit(self.endpoint).scheme != "https":
            raise ValueError(f"Azure Resource Manager endpoint {self.endpoint!r} is not https (a bearer token goes there)")
        self._credential = credential
        self.wait_s = wait_s
        self.timeout_s = timeout_s
        self.polling_interval_s = polling_interval_s
        self._clients: dict[str, Any] = {}

    @staticmethod
    def available() -> bool:
        """Whether azure-mgmt-compute and azure-identity (the ``[azure]`` extra) are installed; where
        not, pass None for Azure to :class:`~detector.remediation.instances.StopInstances`."""
        try:
            return all(importlib.util.find_spec(m) is not None for m in ("azure.mgmt.compute", "azure.identity"))
        except (ImportError, ValueError):
            return False

    def plan(self, target: Target) -> Call:
        from detector.remediation.instances import NOT_INSTANCES

        if target.resource_type in NOT_INSTANCES:
            raise NotApplicable(f"{shown(target.resource_id)} is a {target.resource_type}, not an Azure VM")
        subscription, group, name = arm_vm(target.resource_id)
        return Call(api=API, request={"subscription_id": subscription, "resource_group": group, "vm_name": name},
                    endpoint=self.endpoint)  # fmt: skip

    def _checked(self, call: Call) -> tuple[str, ...] | Outcome:
        """The call's subscription, resource group, VM, checked again (:mod:`detector.remediation.stored`)."""
        return rechecked(call, api=API, fields=("subscription_id", "resource_group", "vm_name"), valid=_valid,
                         endpoint=self.endpoint, executor="Azure", what="subscription/resource group/VM name")

    def execute(self, call: Call) -> Outcome:
        checked = self._checked(call)
        if isinstance(checked, Outcome):
            return checked
        subscription, group, name = checked
        where = f"VM {group}/{name} (subscription {subscription})"
        initial: list[Any] = []

        def first_response(pipeline_response: Any) -> None:
            if not initial:  # the POST's answer; the polls come after it
                initial.append(pipeline_response.http_response)

        try:
            vms = self._client(subscription).virtual_machines
        except ImportError:
            return Outcome(ok=False, detail=NOT_INSTALLED)
        except Exception as exc:  # DefaultAzureCredential refusing its settings (a bad AZURE_TOKEN_CREDENTIALS)
            return _failure(exc, f"deallocating {where}: setting up Azure credentials")
        try:
            vm = vms.get(group, name, expand="instanceView")  # its power state in the same answer
        except Exception as exc:
            return _failure(exc, f"checking {where} before deallocating it", READ)
        scale_set = getattr(getattr(vm, "virtual_machine_scale_set", None), "id", None)
        if scale_set:
            return Outcome(ok=False, detail=f"{where} is an instance of scale set {shown(str(scale_set).rsplit('/', 1)[-1])} "
                                            "(Flexible orchestration), which would replace it or count it against its "
                                            "capacity: scale the scale set instead")  # fmt: skip
        power = _power_state(getattr(vm, "instance_view", None))
        if power in DEALLOCATED:  # deallocated since the proposal (by its owner): deallocating it saves nothing
            return Outcome(ok=True, detail=f"{where} was already stopped ({power}): nothing saved", saves=False)
        try:
            poller = vms.begin_deallocate(group, name, polling=self.wait_s > 0, polling_interval=self.polling_interval_s,
                                          raw_response_hook=first_response)  # fmt: skip
        except Exception as exc:  # every failure becomes the outcome, as the protocol says
            return _failure(exc, f"deallocating {where}")
        operation = _operation_id(initial[0] if initial else None)
        if self.wait_s <= 0:
            return Outcome(ok=True, detail=f"deallocating {where}{operation} (Azure finishes it in the background)")
        try:
            poller.wait(self.wait_s)  # raises what the polling thread met
            if not poller.done():
                return Outcome(ok=True, detail=f"deallocating {where}{operation}: still {poller.status()} after "
                                               f"{self.wait_s:g} s")  # fmt: skip
            poller.result()
        except Exception as exc:
            code = getattr(exc, "status_code", None)
            # the operation ended badly: its status read from a poll that itself succeeded (azure-core
            # also calls it "Failed" when a poll got a 4xx/5xx: that is the next case)
            if str(poller.status()).lower() in ("failed", "canceled", "cancelled") and (code is None or 200 <= code < 300):
                return Outcome(ok=False, detail=f"deallocating {where}{operation}: the operation "
                                                f"{str(poller.status()).lower()}: {_arm_error(exc)}")  # fmt: skip
            # accepted, then a poll failed (ARM unreachable, a 5xx): not following it is no reason to call again
            said = f"HTTP {code} {_arm_error(exc)}" if code else f"{type(exc).__name__}: {_line(str(exc))}"
            return Outcome(ok=True, detail=f"deallocating {where}{operation}; could not follow it: {said}")
        return Outcome(ok=True, detail=f"deallocated {where}{operation}")

    def observe(self, call: Call) -> Outcome | None:
        """After a worker died mid-call: the outcome if the VM is deallocating or deallocated (merely
        powered off does not count: it is still billed), None otherwise or if it cannot be read."""
        checked = self._checked(call)
        if isinstance(checked, Outcome):
            return None
        subscription, group, name = checked
        try:
            view = self._client(subscription).virtual_machines.instance_view(group, name)
        except Exception:  # cannot tell: the runner reports the action as interrupted
            return None
        power = _power_state(view)
        if power in DEALLOCATED:
            return Outcome(ok=True, detail=f"VM {group}/{name} (subscription {subscription}): {power} (found after a restart)")
        return None

    def _client(self, subscription: str) -> Any:
        client = self._clients.get(subscription)
        if client is None:
            from azure.mgmt.compute import ComputeManagementClient

            if self._credential is None:
                from azure.identity import DefaultAzureCredential

                self._credential = DefaultAzureCredential()
            # retry_total=0: the runner retries (with backoff, recorded), not the SDK behind its back
            client = ComputeManagementClient(self._credential, subscription, base_url=self.endpoint, retry_total=0,
                                             connection_timeout=5, read_timeout=self.timeout_s)  # fmt: skip
            self._clients[subscription] = client
        return client


def _power_state(view: Any) -> str:
    """``PowerState/...`` of a VM's instance view; '' when it has none."""
    codes = [str(s.code) for s in (getattr(view, "statuses", None) or []) if s.code]
    return next((c for c in codes if c.startswith("PowerState/")), "")


def _operation_id(response: Any) -> str:
    """`` (operation ID)`` from the answer's ``Azure-AsyncOperation`` (or ``Location``) URL; '' when none."""
    if response is None:
        return ""
    url = response.headers.get("Azure-AsyncOperation") or response.headers.get("Location") or ""
    path = urlsplit(url).path.rstrip("/")
    last = path.rsplit("/", 1)[-1] if path else ""
    return f" (operation {last[:100]})" if re.fullmatch(r"[\w.-]+", last) else ""


def _arm_error(exc: Exception) -> str:
    """ARM's ``error.code: error.message`` of a failed operation, in a line."""
    error = getattr(exc, "error", None)
    code, message = getattr(error, "code", None), getattr(error, "message", None)
    return _line(f"{code}: {message}" if code else str(exc))


RETRYABLE_HTTP = frozenset({408, 409, 429})
"""Besides 5xx: a timeout, another operation in progress on the VM (409 Conflict), throttling."""


def _failure(exc: Exception, doing: str, permission: str = API) -> Outcome:
    """What an exception from the SDK means: a refusal (``permission``: what the call needs), or worth trying again."""
    from azure.core import exceptions as az

    try:
        from azure.identity import CredentialUnavailableError
    except ImportError:  # pragma: no cover - installed with the [azure] extra
        CredentialUnavailableError = ()  # type: ignore[assignment,misc]  # noqa: N806
    if isinstance(exc, CredentialUnavailableError):
        return Outcome(ok=False, detail="no Azure credentials (DefaultAzureCredential: AZURE_CLIENT_ID/AZURE_TENANT_ID "
                                        "with a secret or workload identity, a managed identity, or az login)")  # fmt: skip
    if isinstance(exc, az.HttpResponseError) and exc.status_code is not None:
        code = int(exc.status_code)
        error = getattr(exc, "error", None)
        said = f"HTTP {code}" + (f" {error.code}: {_line(str(error.message))}" if error is not None and error.code else
                                 f": {_line(exc.message or '')}")  # fmt: skip
        if code in (401, 403):
            return Outcome(ok=False, detail=f"{doing}: refused ({said}): the identity needs {permission}")
        if code == 404:
            return Outcome(ok=False, detail=f"{doing}: no such VM, resource group or subscription ({said})")
        return Outcome(ok=False, detail=f"{doing}: {said}", retryable=code in RETRYABLE_HTTP or code >= 500)
    if isinstance(exc, az.ClientAuthenticationError):
        # no HTTP status: no token was got, so nothing was sent to ARM. DefaultAzureCredential
        # found no usable credential (its message lists what it tried): a setting to fix, not
        # something that passes by retrying
        return Outcome(ok=False, detail=f"no Azure credentials: {_line(str(exc))}")
    if isinstance(exc, az.HttpResponseError):  # no status: an answer that was not HTTP's
        return Outcome(ok=False, detail=f"{doing}: {_line(str(exc))}")
    if isinstance(exc, az.ServiceRequestError | az.ServiceResponseError | az.AzureError | OSError | TimeoutError):
        # unreachable or timed out: deallocating again is harmless
        return Outcome(ok=False, detail=f"{doing}: {type(exc).__name__}: {_line(str(exc))}", retryable=True)
    return Outcome(ok=False, detail=f"{doing}: {type(exc).__name__}: {_line(str(exc))}")


def _line(text: str) -> str:
    return " ".join(text.split())[:300]
