"""What every remediation shares: the target read from an alert, the call an executor
would make, and what came of it.

An executor knows one kind of action (``stop_instance``, ``cull_notebook``,
``scale_to_zero``) on one API. It is split in two so dry-run and the audit trail show
exactly what would be or was called: :meth:`Executor.plan` turns a target into a
:class:`Call` without touching the API (or says why the target cannot take this
action), :meth:`Executor.execute` makes that call. A :class:`Call` never holds a
credential: credentials come from the environment or the cloud's credential chain,
inside the executor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

__all__ = ["KINDS", "MODES", "ActionKind", "Call", "Executor", "Mode", "NotApplicable", "Outcome", "Target"]

ActionKind = Literal["notify_only", "stop_instance", "cull_notebook", "scale_to_zero"]
KINDS: tuple[ActionKind, ...] = ("notify_only", "stop_instance", "cull_notebook", "scale_to_zero")
Mode = Literal["dry_run", "approve", "auto_unless_objected"]
MODES: tuple[Mode, ...] = ("dry_run", "approve", "auto_unless_objected")


class NotApplicable(Exception):
    """This target cannot take this action (a pod with no owning Deployment, a host in a
    cloud no executor speaks): ``reason`` is shown on the alert and recorded."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Target:
    """What to act on, as the alert describes it."""

    resource_id: str
    resource_type: str = ""
    account: str = ""
    region: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)
    details: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_alert(cls, alert: Any) -> Target:
        """The target of a :class:`detector.alerts.Alert` (or any object with its fields)."""
        return cls(
            resource_id=alert.resource_id, resource_type=alert.resource_type, account=alert.account,
            region=alert.region, tags=dict(alert.tags), details=dict(alert.details),
        )  # fmt: skip


@dataclass(frozen=True)
class Call:
    """One API call, as recorded in the audit table and shown in dry-run."""

    api: str
    """The API and operation, in the provider's words: ``ec2.StopInstances``,
    ``jupyterhub.DELETE /users/{name}/server``, ``apps/v1.patch_namespaced_deployment_scale``."""
    request: Mapping[str, Any]
    """Its arguments (JSON-serialisable, no credentials)."""
    endpoint: str = ""
    """Where it goes (a region, a hub URL, a cluster), for people reading the audit."""


@dataclass(frozen=True)
class Outcome:
    """What a call returned."""

    ok: bool
    detail: str
    """The API's answer in a line (the new state), or the error."""
    retryable: bool = False
    """A failure worth trying again (throttling, a timeout, a 5xx); False for a refusal."""
    saves: bool = True
    """A success that ended spending: False when the call changed nothing that costs (the
    instance was already stopped), so the audit records no saving for it."""


class Executor(Protocol):
    """One kind of action on one API."""

    @property
    def kind(self) -> ActionKind:
        """``stop_instance``...: a class attribute or an instance's (read-only here, so either fits)."""
        ...

    def plan(self, target: Target) -> Call:
        """The call that would act on ``target``; raises :class:`NotApplicable` if none would."""
        ...

    def execute(self, call: Call) -> Outcome:
        """Make the call. Never raises for an API error: the outcome says it."""
        ...
