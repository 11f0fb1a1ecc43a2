"""``stop_instance`` on EC2: ``StopInstances`` through boto3.

Credentials and the endpoint come from boto3's standard chain (``AWS_ACCESS_KEY_ID`` /
``AWS_PROFILE`` / an instance role; ``AWS_ENDPOINT_URL`` or ``AWS_ENDPOINT_URL_EC2``),
never from a rule file, and are never logged or recorded. Stopping keeps the instance and
its EBS volumes (unlike terminating): the owner starts it again when needed.

An instance that something else keeps running is not stopped: a member of an Auto Scaling
group (EKS managed node groups are ones), a Karpenter node, an EC2 Fleet's or Spot Fleet's, or an
EMR cluster's node. The group would count a stopped
instance unhealthy, terminate it (its root volume with it, by default) and launch another, so
the waste goes on and the instance is lost; Karpenter replaces a node it no longer sees. The
alert's tags are read for it when the call is planned (so a dry run says it), and the
instance's own tags (``DescribeInstances``) just before the call, since an exporter's tags
may leave the cloud's own out.

An instance that read finds stopped (or ``StopInstances`` answers was: ``PreviousState``) is
a success that saves nothing (:attr:`Outcome.saves`): its owner stopped it since the proposal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from detector.remediation.base import ActionKind, Call, NotApplicable, Outcome, Target
from detector.remediation.workloads import shown

if TYPE_CHECKING:  # boto3 is imported at the first call (~0.5 CPU s of imports a worker start would pay)
    from botocore.exceptions import ClientError

__all__ = ["API", "StopInstance", "instance_of"]

API = "ec2.StopInstances"
INSTANCE_ID = re.compile(r"^i-(?:[0-9a-f]{8}|[0-9a-f]{17})$")
REGION = re.compile(r"^[a-z]{2}(?:-[a-z]+)+-\d{1,2}$")
RETRYABLE = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException", "InternalError", "InternalFailure",
                       "ServiceUnavailable", "Unavailable", "RequestTimeout", "RequestTimeoutException"})  # fmt: skip
"""EC2 error codes worth trying again; any 5xx is too. Others (UnauthorizedOperation,
InvalidInstanceID.NotFound, IncorrectInstanceState...) are refusals: reported, not retried."""
NOT_RUNNING = frozenset({"stopping", "stopped", "shutting-down", "terminated"})
"""Instance states that bill no compute (or soon will not): stopping one again saves nothing."""
NOT_INSTANCES = frozenset({"notebook", "pod", "inference_endpoint", "storage_bucket", "vector_db", "commitment",
                           "run", "project", "deployment"})  # fmt: skip
_KARPENTER = "a stopped node would be replaced; delete the node (kubectl delete node) and Karpenter removes the instance"
MANAGERS = (
    ("aws:autoscaling:groupName", "Auto Scaling group",
     "a stopped instance would be replaced; take it out with the group's capacity (aws autoscaling "
     "terminate-instance-in-auto-scaling-group --should-decrement-desired-capacity) or lower the group's desired capacity"),
    ("karpenter.sh/nodepool", "Karpenter node pool", _KARPENTER),
    ("karpenter.sh/provisioner-name", "Karpenter provisioner", _KARPENTER),
    ("aws:ec2:fleet-id", "EC2 Fleet", "a fleet that maintains its capacity would replace it; lower the fleet's target "
                                      "capacity (aws ec2 modify-fleet)"),
    ("aws:ec2spot:fleet-request-id", "Spot Fleet request", "a Spot Fleet that maintains its capacity would replace it; "
                                                           "lower its target capacity (aws ec2 modify-spot-fleet-request)"),
    ("aws:elasticmapreduce:job-flow-id", "EMR cluster", "EMR would count the node lost; resize the instance group or "
                                                        "fleet, or terminate the cluster when its work is done"),
)  # fmt: skip
"""Tags that say something else keeps the instance running, what it is, and what to do instead of a stop."""


class StopInstance:
    """Stops an EC2 instance: the alert's ``resource_id`` is the instance id (or, where the host is
    named otherwise, its ``instance_id`` tag or detail: :func:`instance_of`), its ``region`` the
    endpoint's region."""

    kind: ActionKind = "stop_instance"

    def __init__(self, *, endpoint_url: str | None = None, session: Any = None) -> None:
        self._endpoint_url = endpoint_url
        self._session = session
        self._clients: dict[str, Any] = {}

    def plan(self, target: Target) -> Call:
        if target.resource_type in NOT_INSTANCES:
            raise NotApplicable(f"{target.resource_id} is a {target.resource_type}, not an EC2 instance")
        instance = instance_of(target)
        if not REGION.fullmatch(target.region):
            raise NotApplicable(f"no AWS region on the alert (region {target.region[:40]!r})")
        managed = _managed(instance, target.tags)
        if managed:
            raise NotApplicable(managed)
        return Call(api=API, request={"InstanceIds": [instance]}, endpoint=target.region)

    def execute(self, call: Call) -> Outcome:
        """Stop the instances, unless the cloud says something else keeps one running (module docstring)."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        ids = self._ids(call)
        doing = "DescribeInstances, checking the instance before stopping it (ec2:DescribeInstances)"
        try:
            client = self._client(call.endpoint)
            found = client.describe_instances(InstanceIds=ids)
            managed = [m for i in _instances(found) if (m := _managed(i["InstanceId"], _tags(i)))]
            if managed:
                return Outcome(False, "; ".join(managed)[:500], retryable=False)
            before = {i["InstanceId"]: i["State"]["Name"] for i in _instances(found)}
            if all(before.get(i) in NOT_RUNNING for i in ids):  # stopped by hand since the proposal: nothing to save
                return _already_stopped(before)
            doing = "StopInstances"
            answer = client.stop_instances(InstanceIds=ids)
        except NoCredentialsError:
            return Outcome(False, "no AWS credentials (environment, profile or instance role)", retryable=False)
        except ClientError as exc:
            return _refusal(exc, doing)
        except BotoCoreError as exc:  # the endpoint unreachable, a timeout: the stop may be tried again safely
            return Outcome(False, f"{type(exc).__name__}: {exc} ({doing})"[:500], retryable=True)
        stopping = answer.get("StoppingInstances", [])
        states = {i["InstanceId"]: i["CurrentState"]["Name"] for i in stopping}
        missing = [i for i in ids if i not in states]
        if missing:
            return Outcome(False, f"StopInstances did not answer for {', '.join(missing)}", retryable=True)
        previous = {i["InstanceId"]: i.get("PreviousState", {}).get("Name", "") for i in stopping}
        if all(previous[i] in NOT_RUNNING for i in ids):  # stopped by someone else between the read and the call
            return _already_stopped(previous)
        return Outcome(True, ", ".join(f"{i}: {s}" for i, s in states.items()))

    def observe(self, call: Call) -> Outcome | None:
        """After a worker died mid-call: the outcome if the instances are stopping or stopped
        already, None if they are not (so the call was not made, or did not take)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            answer = self._client(call.endpoint).describe_instances(InstanceIds=self._ids(call))
        except (ClientError, BotoCoreError):
            return None
        states = {i["InstanceId"]: i["State"]["Name"] for i in _instances(answer)}
        if states and all(s in ("stopping", "stopped") for s in states.values()):
            return Outcome(True, ", ".join(f"{i}: {s}" for i, s in states.items()) + " (found after a restart)")
        return None

    @staticmethod
    def _ids(call: Call) -> list[str]:
        ids = [str(i) for i in call.request.get("InstanceIds", [])]
        if not ids or not all(INSTANCE_ID.fullmatch(i) for i in ids):
            raise ValueError(f"not a StopInstances request: {dict(call.request)!r}"[:300])
        return ids

    def _client(self, region: str) -> Any:
        client = self._clients.get(region)
        if client is None:
            import boto3
            from botocore.config import Config

            session = self._session or boto3.session.Session()
            config = Config(connect_timeout=5, read_timeout=20, retries={"max_attempts": 2, "mode": "standard"})
            client = session.client("ec2", region_name=region, endpoint_url=self._endpoint_url, config=config)
            self._clients[region] = client
        return client


def instance_of(target: Target) -> str:
    """The EC2 instance the alert is about: its ``resource_id`` when that is an instance id, else
    its ``instance_id`` detail or tag (a host named otherwise). A tag or detail naming another
    instance than the alert's own is refused: a stale or copied label must not redirect the stop."""
    named = {f"instance_id {where}": value for where, value in (("detail", target.details.get("instance_id")),
                                                                ("tag", target.tags.get("instance_id")))
             if isinstance(value, str) and INSTANCE_ID.fullmatch(value)}  # fmt: skip
    rid = target.resource_id
    if INSTANCE_ID.fullmatch(rid):
        other = {where: value for where, value in named.items() if value != rid}
        if other:
            where, value = next(iter(other.items()))
            raise NotApplicable(f"the alert is on instance {rid} but its {where} names instance {value}: "
                                "not stopped, as it cannot be told which one is meant")  # fmt: skip
        return rid
    ids = sorted(set(named.values()))
    if len(ids) > 1:
        raise NotApplicable(f"{shown(rid)}'s instance_id detail and tag name different instances ({', '.join(ids)}): "
                            "not stopped, as it cannot be told which one is meant")  # fmt: skip
    if not ids:
        raise NotApplicable(f"{shown(rid)} is not an EC2 instance id (i-...), and the alert has no instance_id tag or "
                            "detail that is one")  # fmt: skip
    return ids[0]


def _already_stopped(states: Mapping[str, str]) -> Outcome:
    """Success without a saving: the instances were not running when burnwatch came to stop them."""
    said = ", ".join(f"{i}: {s}" for i, s in states.items())
    return Outcome(True, f"was already stopped ({said}): nothing saved"[:500], saves=False)


def _instances(answer: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The instances of a ``DescribeInstances`` answer."""
    return [i for r in answer.get("Reservations", []) for i in r.get("Instances", [])]


def _tags(instance: Mapping[str, Any]) -> dict[str, str]:
    return {str(t.get("Key")): str(t.get("Value")) for t in instance.get("Tags") or []}


def _managed(instance: str, tags: Mapping[str, str]) -> str:
    """Why ``instance`` is not to be stopped, as its tags say (something else keeps it running); '' if not."""
    for key, what, instead in MANAGERS:
        name = tags.get(key)
        if name:
            return f"{instance} is in {what} {str(name)[:100]!r}, which keeps it running: {instead}"
    return ""


def _refusal(exc: ClientError, doing: str) -> Outcome:
    error: Mapping[str, Any] = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    detail = f"{code or status}: {error.get('Message', '')} ({doing})"[:500]
    return Outcome(False, detail, retryable=code in RETRYABLE or status >= 500)
