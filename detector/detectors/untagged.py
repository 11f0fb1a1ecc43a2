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

import builtins
from functools import partial
from typing import Any, ClassVar

import msgspec
from pydantic import Field

from detector.detectors.base import Context, DetectorBase, Finding, Params, ResourceInfo, make_finding, shared
from detector.detectors.episode import Episode, advance, end
from detector.events import Event, UsageEvent
from detector.units import Duration

__all__ = ["Untagged", "UntaggedParams", "UntaggedState"]


class UntaggedParams(Params):
    required_tags: list[str] = Field(default=["team", "project"], min_length=1)
    grace: Duration = 3600.0
    update_every: Duration = Field(default=900.0, gt=0)


class UntaggedState(Episode, kw_only=True):
    since: float | None = msgspec.field(default=None, name="missing_since")
    """When the resource first ran untagged (the grace starts there)."""
    missing: tuple[str, ...] = ()
    """The required tags missing: a tuple shared by the resources missing the same (a list was
    saved before, and reads back as the tuple)."""
    spend_usd: float = 0.0
    last_t: float = 0.0
    """Time of the latest usage interval counted: a re-read interval is not counted twice."""

    def clear(self) -> None:
        super().clear()
        self.missing = ()
        self.spend_usd = 0.0


class Untagged(DetectorBase):
    type: ClassVar[str] = "untagged"
    title: ClassVar[str] = "Untagged spend"
    Params: ClassVar[builtins.type[UntaggedParams]] = UntaggedParams
    State: ClassVar[builtins.type[UntaggedState]] = UntaggedState
    consumes: ClassVar[tuple[builtins.type, ...]] = (UsageEvent,)
    suggestion: ClassVar[str] = (
        "Add the missing tags (or ask the account owner who runs it); until then this spend "
        "cannot be charged to a team."
    )

    dollars: ClassVar[str] = "spent untagged"
    group_by: ClassVar[str | None] = "account"
    lazy: ClassVar[bool] = True
    """A resource tagged as required holds no state for this rule (most of a fleet)."""

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        return [("Missing tags", ", ".join(f"`{t}`" for t in details.get("missing_tags", [])))]

    def starts(self, ctx: Context, event: Event) -> bool:
        """A running interval missing a required tag, newer than every interval of the resource before
        it: what a state kept from the resource's first interval would count. (Its time of the latest
        interval, all it would hold before, is the key's: an older interval is ``late``.)"""
        if type(event) is not UsageEvent or ctx.late or event.state != "running":
            return False
        return not all(map(ctx.resource.tags.get, self.params.required_tags))

    def step(self, state: UntaggedState, ctx: Context, event: Event, t: float) -> list[Finding]:
        resource = ctx.resource
        if type(event) is not UsageEvent or t <= state.last_t:
            return []
        state.last_t = t
        required = self.params.required_tags  # (the bill's tags filled in; no closure over locals: see at_sample)
        missing = tuple(tag for tag, value in zip(required, map(resource.tags.get, required), strict=True) if not value)
        if not missing or event.state == "terminated":
            reason = "tags_added" if not missing else "terminated"
            return end(state, partial(self._finding, "resolve", state, resource, t, reason=reason))
        if state.since is None:
            if event.state != "running":
                return []  # a stopped resource spends nothing: the grace starts when it runs
            state.since = t
        state.missing = shared(missing)
        if event.state == "running":
            state.spend_usd += resource.interval_usd  # the engine's price of this interval, as stored
        p = self.params
        action = advance(state, t, start=state.since, held_s=t - state.since, need_s=p.grace, every_s=p.update_every)
        if action is None or state.fired_at is None:
            return []
        return [self._finding(action, state, resource, state.fired_at if action == "fire" else t)]

    def _finding(self, action: str, st: UntaggedState, res: ResourceInfo, at: float, **extra: object) -> Finding:
        assert st.since is not None and st.fired_at is not None
        details = {"missing_tags": list(st.missing), "untagged_s": round(at - st.since, 3), **extra}
        return make_finding(self, action, res, episode_start=st.since, fired_at=st.fired_at, at=at,
                            usd=st.spend_usd, details=details)  # fmt: skip

    def open_episode(self, state: UntaggedState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return self._finding("update", state, resource, state.last_t)
