"""``stop_instance`` on Compute Engine: ``instances.stop`` through google-cloud-compute (REST).

Stopping keeps the instance, its boot and persistent disks and its name (the owner starts it
again); it is no longer billed for vCPUs, memory or GPUs, only for its disks and reserved
addresses. Credentials come from Application Default Credentials
(``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth application-default login``, the metadata
server of a GCE/GKE workload), never from a rule file, and are never logged or recorded. The
role needs ``compute.instances.stop`` and ``compute.instances.get`` (the check below, and
:meth:`observe`; ``compute.zoneOperations.get`` if ``wait_s`` is set).

Which instance: ``instances.stop`` needs the project, the zone and the instance (its name or
its numeric id: the API accepts either). They are read from the first of:

- the resource id in one of the forms GCP writes: the full resource name of the billing
  export's ``resource.global_name`` and FOCUS's ``ResourceId``
  (``//compute.googleapis.com/projects/P/zones/Z/instances/ID``), the API's ``selfLink``
  (``https://www.googleapis.com/compute/v1/projects/P/zones/Z/instances/NAME``), the relative
  name (``projects/P/zones/Z/instances/NAME``), or a GKE node's ``providerID``
  (``gce://P/Z/NAME``);
- a bare name or numeric id (what ``burnwatch bridge`` keeps of a GKE node's ``providerID``),
  with the project from the alert's ``account`` (FOCUS's ``SubAccountId`` is the project id
  for Google Cloud) or its ``project_id`` detail, and the zone from its ``zone`` detail or
  tag, the ``topology.kubernetes.io/zone`` tag, or a ``region`` that is a zone
  (``us-central1-a``). The ``project`` tag is the team's project, not a GCP one, and is not read.

A path's project and zone are the instance's; an alert whose account, ``project_id``, zone
detail or tags, or region (where it is a zone) says otherwise is refused, naming both: it may
be about another instance.

Every part is checked against GCE's own syntax before it becomes a path segment.

An instance a managed instance group keeps (every GKE node pool's nodes are one's) is not stopped:
the group would start it again or recreate it, and the waste goes on. The instance is read
(``instances.get``) just before the call, and one whose ``created-by`` metadata names an
``instanceGroupManagers`` is refused, saying to resize the group instead.

The stop is asynchronous: the API answers with a zone Operation at once and the instance goes
STOPPING, then TERMINATED, in about a minute. By default (``wait_s=0``) the executor does not
wait: a stop the API accepted is a success whose detail names the operation
(``gcloud compute operations describe NAME --zone Z`` shows how it ended), and an operation
already DONE with an error is a failure. With ``wait_s`` it waits up to that long through
``zoneOperations.wait`` (on the same endpoint: the SDK's own ``ExtendedOperation.result()``
polls through a client built without the configured endpoint) and reports the end state.
"""

from __future__ import annotations

import importlib.util
import re
import time
from typing import Any, ClassVar

from detector.remediation.base import ActionKind, Call, NotApplicable, Outcome, Target
from detector.remediation.stored import rechecked
from detector.remediation.workloads import shown

__all__ = ["API", "DEFAULT_ENDPOINT", "StopGceInstance", "gce_instance", "looks_like_gce"]

API = "compute.instances.stop"
"""The API method, which is also the IAM permission it needs."""
DEFAULT_ENDPOINT = "https://compute.googleapis.com"
NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
"""An instance name (RFC 1035 label, as the API's own pattern)."""
NUMERIC_ID = re.compile(r"[1-9][0-9]{0,19}")
"""An instance's numeric id, which the API takes in place of its name."""
PROJECT = re.compile(r"(?:[a-z][-a-z0-9.]{0,61}[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]")
"""A project id (6 to 30 characters), optionally domain-scoped (``example.com:my-project``)."""
ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]{1,2}-[a-z]")
_FULL = re.compile(
    r"(?://compute\.googleapis\.com/|https://(?:www|compute)\.googleapis\.com/compute/(?:v1|beta|alpha)/)?"
    r"projects/([^/]+)/zones/([^/]+)/instances/([^/]+)"
)
_PROVIDER_ID = re.compile(r"gce://([^/]+)/([^/]+)/([^/]+)")
ZONE_KEYS = ("zone", "topology.kubernetes.io/zone")
STOPPED = ("STOPPING", "STOPPED", "TERMINATED", "SUSPENDING", "SUSPENDED")
"""Instance states that bill no vCPU, memory or GPU (or soon will not)."""
TIMEOUT_S = 20.0
NOT_INSTALLED = "google-cloud-compute is not installed: pip install 'burnwatch[gcp]'"


def looks_like_gce(resource_id: str) -> bool:
    """Whether the id is one of the path forms above (a bare name is not: it could be any cloud's)."""
    return _FULL.fullmatch(resource_id) is not None or _PROVIDER_ID.fullmatch(resource_id) is not None


def _valid(project: object, zone: object, instance: object) -> bool:
    return (isinstance(project, str) and PROJECT.fullmatch(project) is not None
            and isinstance(zone, str) and ZONE.fullmatch(zone) is not None
            and isinstance(instance, str) and _instance_name(instance))  # fmt: skip


def _instance_name(value: str) -> bool:
    """A name or a numeric id: the API takes either."""
    return NAME.fullmatch(value) is not None or NUMERIC_ID.fullmatch(value) is not None


def gce_instance(target: Target) -> tuple[str, str, str]:
    """(project, zone, instance) of ``target``, or :class:`NotApplicable` saying what is missing or wrong."""
    rid = target.resource_id
    m = _FULL.fullmatch(rid) or _PROVIDER_ID.fullmatch(rid)
    projects = {"account": target.account, "project_id detail": _text(target.details.get("project_id"))}
    zones = {"zone detail": _text(target.details.get("zone")), **{f"{k} tag": target.tags.get(k, "") for k in ZONE_KEYS}}
    if m is not None:
        project, zone, instance = m.groups()
        _same(rid, "project", project, projects, PROJECT)
        _same(rid, "zone", zone, {**zones, "region": target.region}, ZONE)
    else:
        instance = rid
        project = next((p for p in projects.values() if p), "")
        zone = next((z for z in zones.values() if z), "")
        if not zone and ZONE.fullmatch(target.region):
            zone = target.region
    if not _instance_name(instance):
        raise NotApplicable(f"{shown(instance)} is not a Compute Engine instance name or numeric id")
    if not project:
        raise NotApplicable(f"no GCP project for instance {instance}: the alert's account (the project id) is empty")
    if not PROJECT.fullmatch(project):
        raise NotApplicable(f"{shown(project)} is not a GCP project id")
    if not zone:
        raise NotApplicable(f"no zone for instance {instance}: the alert has no zone detail or tag, and its region "
                            f"{shown(target.region)} is not a zone")  # fmt: skip
    if not ZONE.fullmatch(zone):
        raise NotApplicable(f"{shown(zone)} is not a Compute Engine zone (like us-central1-a)")
    return project, zone, instance


def _same(rid: str, what: str, value: str, said: dict[str, str], valid: re.Pattern[str]) -> None:
    """Refuse a resource id whose project or zone another field of the alert contradicts: which
    instance is meant cannot be told, and stopping the wrong one is worse than stopping none."""
    for where, other in said.items():
        if isinstance(other, str) and valid.fullmatch(other) and other != value:
            raise NotApplicable(f"{shown(rid, 200)} is in {what} {shown(value)} but the alert's {where} says "
                                f"{shown(other)}: not stopped, as it cannot be told which instance is meant")  # fmt: skip


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


class StopGceInstance:
    """Stops a Compute Engine instance (see the module docstring for how it is found)."""

    kind: ClassVar[ActionKind] = "stop_instance"

    def __init__(self, *, endpoint: str | None = None, credentials: Any = None, wait_s: float = 0.0,
                 timeout_s: float = TIMEOUT_S) -> None:  # fmt: skip
        """``endpoint``: the API's root (default ``https://compute.googleapis.com``; a Private Service
        Connect endpoint, or a local server in tests); ``credentials``: a ``google.auth`` credentials
        object (default: Application Default Credentials, looked up when the first call is made);
        ``wait_s``: how long to wait for the operation to finish (0: not at all)."""
        self.endpoint = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
        self._credentials = credentials
        self.wait_s = wait_s
        self.timeout_s = timeout_s
        self._clients: dict[str, Any] = {}

    @staticmethod
    def available() -> bool:
        """Whether google-cloud-compute (the ``[gcp]`` extra) is installed; where not, pass None for
        GCE to :class:`~detector.remediation.instances.StopInstances` (not applicable, with the reason)."""
        try:
            return importlib.util.find_spec("google.cloud.compute_v1") is not None
        except (ImportError, ValueError):
            return False

    def plan(self, target: Target) -> Call:
        from detector.remediation.instances import NOT_INSTANCES

        if target.resource_type in NOT_INSTANCES:
            raise NotApplicable(f"{shown(target.resource_id)} is a {target.resource_type}, not a Compute Engine instance")
        project, zone, instance = gce_instance(target)
        return Call(api=API, request={"project": project, "zone": zone, "instance": instance}, endpoint=self.endpoint)

    def _checked(self, call: Call) -> tuple[str, ...] | Outcome:
        """The call's project, zone, instance, checked again (:mod:`detector.remediation.stored`)."""
        return rechecked(call, api=API, fields=("project", "zone", "instance"), valid=_valid, endpoint=self.endpoint,
                         executor="GCE", what="project/zone/instance")

    def execute(self, call: Call) -> Outcome:
        checked = self._checked(call)
        if isinstance(checked, Outcome):
            return checked
        project, zone, instance = checked
        where = f"projects/{project}/zones/{zone}/instances/{instance}"
        try:
            client = self._client("instances")
        except ImportError:
            return Outcome(ok=False, detail=NOT_INSTALLED)
        except Exception as exc:  # no Application Default Credentials
            return _failure(exc, f"stopping {where}")
        try:
            found = client.get(project=project, zone=zone, instance=instance, retry=None, timeout=self.timeout_s)
        except Exception as exc:
            return _failure(exc, f"checking {where} before stopping it", "compute.instances.get")
        group = _group_manager(found)
        if group:
            return Outcome(ok=False, detail=f"{where} is kept by managed instance group {shown(group, 200)}, which "
                                            "would start it again: resize the group (gcloud compute instance-groups "
                                            "managed resize, or the GKE node pool's size) instead")  # fmt: skip
        if str(found.status) in STOPPED:  # stopped since the proposal (by its owner): stopping it saves nothing
            return Outcome(ok=True, detail=f"{where} was already stopped ({found.status}): nothing saved", saves=False)
        try:
            operation = client.stop(project=project, zone=zone, instance=instance, retry=None, timeout=self.timeout_s)
        except Exception as exc:  # every failure becomes the outcome, as the protocol says
            return _failure(exc, f"stopping {where}")
        name, status = str(operation.name), _status(operation.status)
        failed = _operation_error(operation)
        deadline = time.monotonic() + self.wait_s
        while not failed and status != "DONE" and (left := deadline - time.monotonic()) > 0:
            try:  # the API answers when the operation is DONE or after about 2 minutes, whichever first
                done = self._client("zone_operations").wait(project=project, zone=zone, operation=name, retry=None,
                                                            timeout=left)  # fmt: skip
            except Exception as exc:  # the stop was accepted: not following it is no reason to stop again
                if _timed_out(exc):
                    break  # wait_s is spent: still running, as far as anyone knows
                return Outcome(ok=True, detail=f"stopping {where}: operation {name} {status}; could not follow it: "
                                               f"{type(exc).__name__}: {_line(str(exc))}")  # fmt: skip
            status, failed = _status(done.status), _operation_error(done)
        if failed:
            return Outcome(ok=False, detail=f"stopping {where}: operation {name} failed: {failed}")
        if status == "DONE":
            return Outcome(ok=True, detail=f"stopped {where} (operation {name} DONE)")
        return Outcome(ok=True, detail=f"stopping {where}: operation {name} {status} (the instance stops in the "
                                       f"background; gcloud compute operations describe {name} --zone {zone})")  # fmt: skip

    def observe(self, call: Call) -> Outcome | None:
        """After a worker died mid-call: the outcome if the instance is stopping or stopped, None if
        it is not or its state cannot be read."""
        checked = self._checked(call)
        if isinstance(checked, Outcome):
            return None
        project, zone, instance = checked
        try:
            found = self._client("instances").get(project=project, zone=zone, instance=instance, retry=None,
                                                  timeout=self.timeout_s)  # fmt: skip
        except Exception:  # cannot tell: the runner reports the action as interrupted
            return None
        status = str(found.status)
        if status in STOPPED:
            return Outcome(ok=True, detail=f"projects/{project}/zones/{zone}/instances/{instance}: {status} "
                                           "(found after a restart)")  # fmt: skip
        return None

    def _client(self, which: str) -> Any:
        client = self._clients.get(which)
        if client is None:
            from google.api_core.client_options import ClientOptions
            from google.cloud import compute_v1

            options = ClientOptions(api_endpoint=self.endpoint)
            cls = compute_v1.InstancesClient if which == "instances" else compute_v1.ZoneOperationsClient
            client = cls(credentials=self._credentials, transport="rest", client_options=options)
            self._clients[which] = client
        return client


def _group_manager(instance: Any) -> str:
    """The managed instance group an instance's ``created-by`` metadata names; '' if none."""
    items = getattr(getattr(instance, "metadata", None), "items", None) or []
    for item in items:
        if getattr(item, "key", "") == "created-by" and "/instanceGroupManagers/" in str(getattr(item, "value", "")):
            return str(item.value)
    return ""


def _timed_out(exc: Exception) -> bool:
    import requests
    from google.api_core import exceptions as gexc

    return isinstance(exc, requests.Timeout | gexc.DeadlineExceeded | TimeoutError)


def _status(status: Any) -> str:
    """An Operation's status as its name (the REST client gives an enum or its number)."""
    name = getattr(status, "name", None)
    return name if isinstance(name, str) else str(status)


def _operation_error(operation: Any) -> str:
    """The error of an Operation that is DONE with one, in a line; '' when none."""
    if _status(operation.status) != "DONE":
        return ""
    errors = getattr(getattr(operation, "error", None), "errors", None) or []
    said = "; ".join(f"{e.code}: {e.message}" for e in errors)
    code = getattr(operation, "http_error_status_code", 0)
    if not said and not code:
        return ""
    return _line(f"HTTP {code} {said}" if code else said)


RETRYABLE_HTTP = frozenset({408, 409, 429})
"""Besides 5xx: a timeout, a conflicting operation in progress on the instance, throttling."""


def _failure(exc: Exception, doing: str, permission: str = API) -> Outcome:
    """What an exception from the client means: a refusal, or worth trying again."""
    import requests  # the REST transport's HTTP library, a dependency of google-auth's
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as auth_exc

    if isinstance(exc, auth_exc.RefreshError | auth_exc.InvalidOperation):
        # a 401 makes google-auth refresh the token: a revoked key, a deleted service account, or
        # credentials that cannot be refreshed at all
        return Outcome(ok=False, detail=f"{doing}: the credentials were refused: {_line(str(exc))}")
    if isinstance(exc, auth_exc.DefaultCredentialsError):
        return Outcome(ok=False, detail="no Google credentials (Application Default Credentials: "
                                        "GOOGLE_APPLICATION_CREDENTIALS, gcloud auth application-default login, "
                                        "or a workload's metadata server)")  # fmt: skip
    if isinstance(exc, auth_exc.TransportError):  # the token endpoint or the metadata server unreachable
        return Outcome(ok=False, detail=f"{doing}: getting a token: {_line(str(exc))}", retryable=True)
    if isinstance(exc, gexc.GoogleAPICallError) and isinstance(exc.code, int):
        code = exc.code
        said = f"HTTP {code}: {_line(exc.message or '')}"
        if code in (401, 403):
            return Outcome(ok=False, detail=f"{doing}: refused ({said}): the credentials need {permission}")
        if code == 404:
            return Outcome(ok=False, detail=f"{doing}: no such instance, zone or project ({said})")
        return Outcome(ok=False, detail=f"{doing}: {said}", retryable=code in RETRYABLE_HTTP or code >= 500)
    if isinstance(exc, gexc.RetryError | gexc.GoogleAPIError):
        return Outcome(ok=False, detail=f"{doing}: {type(exc).__name__}: {_line(str(exc))}", retryable=True)
    if isinstance(exc, requests.RequestException | OSError | TimeoutError):
        # unreachable or timed out: the stop may have been made; stopping again is harmless
        return Outcome(ok=False, detail=f"{doing}: {type(exc).__name__}: {_line(str(exc))}", retryable=True)
    return Outcome(ok=False, detail=f"{doing}: {type(exc).__name__}: {_line(str(exc))}")


def _line(text: str) -> str:
    return " ".join(text.split())[:300]
