"""A rule's ``action``: what to do about its incidents, when, and who decides.

Validated with the rule (``extra=forbid``, file:line errors); :data:`APPLIES_TO` says which
kinds make sense for which rule types, so that a rule asking to stop the instance behind
a storage bucket's growth is refused when the file is read, not when an incident is due.
Credentials are never part of a rule: executors take them from the environment.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from detector.remediation.base import ActionKind, Mode
from detector.units import Duration, format_duration

__all__ = ["APPLIES_TO", "ATTENDED_ONLY", "MAX_WAIT_S", "MIN_GRACE_S", "ActionSpec", "kind_error", "mode_error"]

MAX_WAIT_S = 30 * 86_400.0
"""The longest ``after`` and ``grace``: 30 days. An incident that must last longer before anything is done
is one for a person; a grace past it is a typo (``1000000w`` for ``1000000s``), and a time far enough out
cannot be stored (ClickHouse's DateTime64 ends in 2299)."""

MIN_GRACE_S = 300.0
"""The shortest ``grace`` of ``auto_unless_objected``: 5 minutes. Shorter, the call is made at the pass after the
warning (seconds), before anyone could read it and object: an automatic action with no objection, which no mode
offers (``grace: 0s``; ``grace: 30``, thirty seconds, for 30 minutes)."""

APPLIES_TO: dict[ActionKind, frozenset[str]] = {
    "stop_instance": frozenset({"idle_gpu", "stuck_gpu", "unallocated_gpu", "telemetry_stale"}),
    "cull_notebook": frozenset({"idle_gpu", "idle_notebook", "stuck_gpu", "unallocated_gpu"}),
    "scale_to_zero": frozenset({"idle_gpu", "stuck_gpu", "inference_overprovisioned", "unallocated_gpu"}),
}
"""Rule types whose incidents each kind can end. A kind absent here (``notify_only``)
applies to every type. Rules on spend that stopping a machine would not end (a failed
run's cost, untagged spend, a commitment, storage growth) or on a machine still partly
busy (``partly_idle_gpu``: stopping it would kill the busy GPUs' work) take no action."""


ATTENDED_ONLY: frozenset[str] = frozenset({"telemetry_stale"})
"""Rule types whose incidents say nothing of whether the machine is busy: their actions are ``dry_run`` or
``approve``, never automatic. ``telemetry_stale`` fires because the GPU metrics stopped coming (the exporter
crashed, its port blocked); the machine may be training. Stale telemetry must not read as idle (DESIGN.md), and an
automatic stop would kill the job with nobody having looked."""


class ActionSpec(BaseModel):
    """``action: {kind: stop_instance, after: 2h, mode: approve}`` on a rule."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: ActionKind = "notify_only"
    after: Duration = 0.0
    """Event time the incident must have lasted (from its episode's start) before the
    action is proposed; 0: as soon as it fires (the rule's own ``for`` has passed)."""
    mode: Mode = "dry_run"
    """``dry_run`` (record and show what would be called, never call), ``approve`` (a Slack
    button; nothing happens without an allowed approver's click), ``auto_unless_objected``
    (announce, then act after ``grace`` unless snoozed or declined)."""
    grace: Duration = 3600.0
    """``auto_unless_objected`` only: wall-clock time between the announcement and the call."""

    @field_validator("after", "grace")
    @classmethod
    def _bounded(cls, value: float) -> float:
        """A wait past :data:`MAX_WAIT_S` is refused: its due time could not be stored and read back."""
        if value > MAX_WAIT_S:
            raise ValueError(f"at most 30d (got {format_duration(value)}); for longer, leave it to a person "
                             "(mode: approve, or notify_only)")  # fmt: skip
        return value

    @model_validator(mode="after")
    def _objectable(self) -> ActionSpec:
        """An automatic action's grace must leave people the time to object (:data:`MIN_GRACE_S`)."""
        if self.mode == "auto_unless_objected" and self.grace < MIN_GRACE_S:
            raise ValueError(f"grace: at least {format_duration(MIN_GRACE_S)} for mode auto_unless_objected (got "
                             f"{format_duration(self.grace)}): shorter, it acts before anyone could read its warning "
                             "and object; use mode approve to decide each one")  # fmt: skip
        return self

    @property
    def acts(self) -> bool:
        return self.kind != "notify_only"


def mode_error(mode: str, rule_type: str) -> str | None:
    """Why ``mode`` makes no sense on a rule of ``rule_type`` (None: it does): an automatic mode where the incident
    says nothing of the machine's work (:data:`ATTENDED_ONLY`)."""
    if mode != "auto_unless_objected" or rule_type not in ATTENDED_ONLY:
        return None
    return (f"mode auto_unless_objected cannot act on a {rule_type} incident: it fires because the GPU metrics stopped "
            "coming, which says nothing of whether the machine is busy; use mode approve, for a person to look "
            "first")  # fmt: skip


def kind_error(kind: str, rule_type: str) -> str | None:
    """Why ``kind`` makes no sense on a rule of ``rule_type`` (None: it does)."""
    types = APPLIES_TO.get(kind)  # type: ignore[call-overload]  # any str may be asked
    if types is None or rule_type in types:
        return None
    return (f"{kind} cannot end a {rule_type} incident; it applies to rule types "
            f"{', '.join(sorted(types))} (use notify_only, the default, for the others)")  # fmt: skip
