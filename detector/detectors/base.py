"""The contract every detector keeps.

A detector is a small class: its rule ``type``, a pydantic model of its params,
a msgspec struct for its per-resource state, and a pure ``step`` that folds one
event into that state and returns findings. No I/O and no clock: time is the
event's, so the worker, ``backtest`` and a replay all see the same findings.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

import msgspec
from pydantic import BaseModel, ConfigDict

from detector.events import Event
from detector.pricing import Pricer, Pricing

__all__ = ["Detector", "DetectorBase", "Finding", "Params", "ResourceInfo", "make_finding"]


class Params(BaseModel):
    """Base of every detector's params: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ResourceInfo(msgspec.Struct, kw_only=True):
    """What the latest usage event said about a resource: who owns it, whether it is billed, its price."""

    resource_id: str = ""
    resource_type: str = ""
    provider: str = ""
    account: str = ""
    region: str = ""
    instance_type: str = ""
    pricing: str = ""
    state: str = ""
    """running | stopped | terminated; empty until a usage event has been seen."""
    usd_per_hour: float | None = None
    """The rate its latest priced running interval was billed at (:class:`~detector.pricing.Pricer`)."""
    interval_usd: float = 0.0
    """What its latest usage interval cost, priced once by the engine's pricer: detectors that
    add up spend add this, so their dollars are the stored rows' dollars."""
    tags: dict[str, str] = {}

    @property
    def known(self) -> bool:
        return bool(self.state)

    @property
    def billed(self) -> bool:
        return self.state == "running"


class Finding(msgspec.Struct, kw_only=True, frozen=True):
    """What a detector concluded about one problem of one resource at one event time.

    ``fire`` opens an episode, ``update`` reports its growing cost, ``resolve``
    closes it. ``episode_start`` together with rule and resource identifies the
    episode, so the same input always yields the same alert id.
    """

    action: Literal["fire", "update", "resolve"]
    rule: str
    type: str
    resource_id: str
    episode_start: float
    fired_at: float
    at: float
    waste_usd: float
    usd_per_hour: float
    severity: str
    details: dict[str, Any] = {}
    resource: ResourceInfo | None = None
    """A copy of what was known about the resource when the finding was made (owner tags, account)."""
    key: str = ""
    """The engine key whose state made it (the resource; the project for run events), set by
    the engine: the worker that holds the key's partition delivers the alert."""


class DetectorBase:
    """What every detector's constructor and state factory do; subclasses declare the rest."""

    State: ClassVar[type[msgspec.Struct]]

    def __init__(self, name: str, severity: str, params: Any, pricing: Pricing | None = None) -> None:
        self.name = name
        self.severity = severity
        self.params = params
        self.pricing = pricing or Pricing()
        """The rule set's price list, for detectors that compare prices (spot, a smaller instance, tiers)."""
        self.pricer = Pricer(self.pricing)
        """Its dollars (:mod:`detector.pricing`): what detectors use to turn usage into money."""

    dollars: ClassVar[str] = "wasted"
    """What an alert's dollars are, in words: "wasted", "spent untagged", "could be saved",
    or "" for forecasts whose news is not money already gone."""
    behaviour: ClassVar[bool] = False
    """Its episodes are a resource behaving unusually (idle, hung, runaway): the anomaly model
    leaves those windows out of training. False for attribution, capacity and advice."""
    group_by: ClassVar[str | None] = "team"
    """What openings of this type are grouped by (``team``, ``account``): those that share
    it and fire together are posted as one Slack message listing them. None: never."""

    def new_state(self) -> Any:
        return self.State()

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        """(label, value) pairs from a finding's details, for the alert message."""
        return []

    def open_episode(self, state: Any, resource: ResourceInfo) -> Finding | None:
        return None

    def open_episodes(self, state: Any, resource: ResourceInfo) -> list[Finding]:
        """Every episode in ``state`` that fired and has not resolved, as ``update`` findings
        with the dollars so far (for reports at the end of data). Most detectors hold at
        most one per key and define :meth:`open_episode` instead."""
        finding = self.open_episode(state, resource)
        return [finding] if finding is not None else []


def make_finding(
    detector: Any,
    action: str,
    resource: ResourceInfo,
    *,
    episode_start: float,
    fired_at: float,
    at: float,
    usd: float,
    details: dict[str, Any],
    usd_per_hour: float | None = None,
) -> Finding:
    """A finding of ``detector`` about ``resource``: the fields every detector fills the same way.
    ``usd_per_hour`` defaults to the resource's price (the rate of waste of an idle host)."""
    return Finding(
        action=action,  # type: ignore[arg-type]
        rule=detector.name,
        type=detector.type,
        resource_id=resource.resource_id,
        episode_start=episode_start,
        fired_at=fired_at,
        at=at,
        waste_usd=round(usd, 4),
        usd_per_hour=round(usd_per_hour if usd_per_hour is not None else resource.usd_per_hour or 0.0, 4),
        severity=detector.severity,
        details=details,
        resource=msgspec.structs.replace(resource),
    )


S = TypeVar("S", bound=msgspec.Struct)


class Detector(Protocol, Generic[S]):  # type: ignore[misc]
    """One rule type. Instances are built from a validated rule and are stateless themselves."""

    type: ClassVar[str]
    Params: ClassVar[type[Params]]
    State: ClassVar[type[msgspec.Struct]]
    consumes: ClassVar[tuple[type, ...]]
    """Event classes the detector wants; the engine routes nothing else to it."""
    title: ClassVar[str]
    """What the problem is called in alerts ("Idle GPUs")."""
    dollars: ClassVar[str]
    """What an alert's dollars are, in words ("wasted")."""
    suggestion: ClassVar[str]
    """The next step a person should take, shown in the alert."""

    name: str
    severity: str
    params: Any

    def new_state(self) -> S: ...

    def step(self, state: S, resource: ResourceInfo, event: Event, t: float) -> list[Finding]:
        """Fold one event (``t`` is its time in epoch seconds) into ``state``; return findings."""
        ...

    def open_episodes(self, state: S, resource: ResourceInfo) -> list[Finding]:
        """The still-open episodes in ``state`` as ``update`` findings, for reports at the end of data."""
        ...
