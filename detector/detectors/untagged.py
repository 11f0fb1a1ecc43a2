"""``untagged``: a running resource missing a required tag, so nobody can say whose spend it is.

Example rule::

    - name: untagged
      type: untagged
      params:
        required_tags: [team, project]   # every one must be present and non-empty
        grace: 1h                        # time to tag a new resource before alerting
      severity: info

Why these defaults: cost-allocation policies (AWS, GCP and Azure tag policies, Cloud
Custodian's ``tag-compliance`` examples) most often require an owning team and a
project or cost centre; an hour leaves provisioning pipelines that tag after launch
alone. The grace starts when an untagged resource first runs (a stopped one spends
nothing to attribute). One alert per resource and episode: it resolves when the tags
are added or the resource is terminated. The dollars are the spend while untagged
(running intervals only, priced by :class:`~detector.pricing.Pricer` as the store prices
them: ``cost_usd``, else the price list, else a bucket's bytes), so
unattributable spend per account is a sum over the ``alerts`` table.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
from pydantic import Field

from detector.detectors.base import DetectorBase, Finding, Params, ResourceInfo, make_finding
from detector.events import Event, UsageEvent
from detector.units import Duration

__all__ = ["Untagged", "UntaggedParams", "UntaggedState"]


class UntaggedParams(Params):
    required_tags: list[str] = Field(default=["team", "project"], min_length=1)
    grace: Duration = 3600.0
    update_every: Duration = Field(default=900.0, gt=0)


class UntaggedState(msgspec.Struct, kw_only=True):
    missing_since: float | None = None
    missing: list[str] = []
    spend_usd: float = 0.0
    last_t: float = 0.0
    """Time of the latest usage interval counted: a re-read interval is not counted twice."""
    fired_at: float | None = None
    last_report: float = 0.0


class Untagged(DetectorBase):
    type: ClassVar[str] = "untagged"
    title: ClassVar[str] = "Untagged spend"
    Params: ClassVar[type[UntaggedParams]] = UntaggedParams
    State: ClassVar[type[UntaggedState]] = UntaggedState
    consumes: ClassVar[tuple[type, ...]] = (UsageEvent,)
    suggestion: ClassVar[str] = (
        "Add the missing tags (or ask the account owner who runs it); until then this spend "
        "cannot be charged to a team."
    )

    dollars: ClassVar[str] = "spent untagged"
    group_by: ClassVar[str | None] = "account"

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        return [("Missing tags", ", ".join(f"`{t}`" for t in details.get("missing_tags", [])))]

    def step(self, state: UntaggedState, resource: ResourceInfo, event: Event, t: float) -> list[Finding]:
        if type(event) is not UsageEvent or t <= state.last_t:
            return []
        state.last_t = t
        missing = [tag for tag in self.params.required_tags if not event.tags.get(tag)]
        found: list[Finding] = []
        if not missing or event.state == "terminated":
            if state.fired_at is not None:
                reason = "tags_added" if not missing else "terminated"
                found.append(self._finding("resolve", state, resource, t, reason=reason))
            self._reset(state)
            return found
        if state.missing_since is None:
            if event.state != "running":
                return found  # a stopped resource spends nothing: the grace starts when it runs
            state.missing_since = t
        state.missing = missing
        if event.state == "running":
            state.spend_usd += resource.interval_usd  # the engine's price of this interval, as stored
        if state.fired_at is None:
            if t - state.missing_since >= self.params.grace:
                state.fired_at = state.missing_since + self.params.grace
                state.last_report = t
                found.append(self._finding("fire", state, resource, state.fired_at))
        elif t - state.last_report >= self.params.update_every:
            state.last_report = t
            found.append(self._finding("update", state, resource, t))
        return found

    def _reset(self, state: UntaggedState) -> None:
        state.missing_since = state.fired_at = None
        state.missing = []
        state.spend_usd = 0.0
        state.last_report = 0.0

    def _finding(self, action: str, st: UntaggedState, res: ResourceInfo, at: float, **extra: object) -> Finding:
        assert st.missing_since is not None and st.fired_at is not None
        details = {"missing_tags": list(st.missing), "untagged_s": round(at - st.missing_since, 3), **extra}
        return make_finding(self, action, res, episode_start=st.missing_since, fired_at=st.fired_at, at=at,
                            usd=st.spend_usd, details=details)  # fmt: skip

    def open_episode(self, state: UntaggedState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return self._finding("update", state, resource, state.last_t)
