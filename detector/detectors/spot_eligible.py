"""``spot_eligible``: long training on on-demand capacity that could run on spot.

Example rule::

    - name: spot-eligible
      type: spot_eligible
      params:
        min_runtime: 4h              # a run this long on on-demand hosts...
        checkpoint_tag: checkpoint   # ...that checkpoints (this run tag is set)...
        min_saving_usd_per_hour: 1   # ...and would save at least this much an hour on spot
      severity: info

A run that checkpoints can resume after a spot interruption and lose minutes, not
hours; spot GPU capacity costs 40-70 % less than on-demand (``rules/pricing.yaml``).
Four hours is long enough that the saving dwarfs the restart cost, and typical spot
interruption rates (AWS's advisor buckets: under 5 % to over 20 % a month) make an
interruption inside a checkpoint interval rare. A run "checkpoints" when its
``checkpoint_tag`` tag is present and not ``false``/``no``/``0`` (schedulers and
trackers can set it from the job's config: a checkpoint directory, a resume flag).
The dollars are what spot would have saved over the run so far, at the hosts' billed
rate against their spot price, shared by GPU count.
"""

from __future__ import annotations

import builtins
from functools import partial
from typing import Any, ClassVar

import msgspec
from pydantic import Field

from detector.detectors.base import Context, DetectorBase, Finding, Params, ResourceInfo, make_finding
from detector.detectors.ended import Ended, is_past
from detector.detectors.episode import Episode, end, fire
from detector.detectors.runs import Fleet, RunState, emptied, follow, hosts_of
from detector.events import Event, RunEvent
from detector.pricing import usd_over
from detector.tag_names import tag_value
from detector.units import Duration, Money, money

__all__ = ["SpotEligible", "SpotEligibleParams", "SpotEligibleState"]

_NO = {"", "false", "no", "0", "off"}


class SpotEligibleParams(Params):
    min_runtime: Duration = Field(default=4 * 3600.0, gt=0)
    checkpoint_tag: str = "checkpoint"
    min_saving_usd_per_hour: Money = 1.0


class Candidate(Episode, kw_only=True):
    """A run found eligible (its episode, from the run's start): the alert's figures."""

    saving_usd_h: float
    instance_type: str
    spot_usd_h: float
    host: ResourceInfo


class SpotEligibleState(msgspec.Struct, kw_only=True, gc=False):
    runs: dict[str, RunState] = {}
    fired: dict[str, Candidate] = {}
    ended: Ended = msgspec.field(default_factory=Ended)
    """Run id → end time, so a re-read event does not reopen a run."""
    last_t: float = 0.0


class SpotEligible(DetectorBase):
    type: ClassVar[str] = "spot_eligible"
    title: ClassVar[str] = "Training could run on spot"
    Params: ClassVar[builtins.type[SpotEligibleParams]] = SpotEligibleParams
    State: ClassVar[builtins.type[SpotEligibleState]] = SpotEligibleState
    consumes: ClassVar[tuple[builtins.type, ...]] = (RunEvent,)
    suggestion: ClassVar[str] = (
        "Run this project's next training on spot capacity (it checkpoints, so an interruption "
        "costs one checkpoint interval), with on-demand as the fallback."
    )

    dollars: ClassVar[str] = "could have been saved on spot"

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        spot, saving = (money(details.get(k, 0), exact=True) for k in ("spot_usd_per_hour", "saving_usd_per_hour"))
        return [
            ("Run", f"`{details.get('run_id')}` on {details.get('instance_type')}"),
            ("Spot", f"{spot}/h, saving {saving}/h"),
        ]

    def step(self, state: SpotEligibleState, ctx: Context, event: Event, t: float) -> list[Finding]:
        if type(event) is not RunEvent:
            return []
        if is_past(state.ended.get(event.run_id), event.status, t, running=event.run_id in state.runs):
            return []  # a re-read or straggling event of a run that ended; else the id used again (a new run)
        st = state
        st.last_t = max(st.last_t, t)
        follow(st.runs, event, t)
        found: list[Finding] = []
        for run_id, run in list(st.runs.items()):  # a project's few open runs, judged at each of its events
            if run_id not in st.fired and t - run.start >= self.params.min_runtime:
                candidate = self._candidate(run, t, ctx.lookup)
                if candidate is not None:
                    st.fired[run_id] = candidate
                    action = fire(candidate, since=run.start, fired_at=t, at=t)
                    found.append(self._finding(action, run_id, run, candidate, t))
        if event.status in ("succeeded", "failed", "killed"):
            run = st.runs.pop(event.run_id)
            st.runs = emptied(st.runs)
            st.ended.add(event.run_id, t)
            st.ended.keep_since(t - 2 * 86_400)
            candidate = st.fired.pop(event.run_id, None)
            st.fired = emptied(st.fired)
            if candidate is not None:
                found.extend(end(candidate, partial(self._finding, "resolve", event.run_id, run, candidate, t,
                                                    reason=f"run_{event.status}")))  # fmt: skip
        return found

    def open_episodes(self, state: SpotEligibleState, resource: ResourceInfo) -> list[Finding]:
        return [self._finding("update", run_id, state.runs[run_id], candidate, state.last_t)
                for run_id, candidate in state.fired.items()]  # fmt: skip

    def _candidate(self, run: RunState, t: float, fleet: Fleet | None) -> Candidate | None:
        if run.tags.get(self.params.checkpoint_tag, "").strip().lower() in _NO:
            return None
        hosts = hosts_of(run, fleet, self.pricing)
        if not hosts.hosts or len(hosts.hosts) < len(run.resource_ids):
            return None  # a host with no known price: the saving cannot be told
        saving = spot = 0.0
        for host in hosts.hosts:
            spot_price = self.pricing.hourly(host.instance_type, "spot")
            price = self.pricing.instances.get(host.instance_type)
            if host.pricing != "on_demand" or price is None or price.spot is None or spot_price is None:
                return None  # already spot or reserved, or no spot price to compare with
            saving += (host.usd_per_hour or 0.0) - spot_price
            spot += spot_price
        saving *= hosts.share
        if saving < self.params.min_saving_usd_per_hour:
            return None
        first = hosts.first
        return Candidate(saving_usd_h=saving, instance_type=first.instance_type,
                         spot_usd_h=spot * hosts.share, host=first)  # fmt: skip

    def _finding(self, action: str, run_id: str, run: RunState, c: Candidate, at: float, **extra: object) -> Finding:
        assert c.fired_at is not None
        res = ResourceInfo(resource_id=run_id, resource_type="run", account=c.host.account, region=c.host.region,
                           instance_type=c.instance_type, pricing="on_demand", state="running", tags=dict(run.tags))  # fmt: skip
        runtime = max(0.0, at - run.start)
        details = {
            "run_id": run_id, "project": run.project, "owner": tag_value(run.tags, "owner"),
            "instance_type": c.instance_type, "resource_ids": list(run.resource_ids),
            "spot_usd_per_hour": round(c.spot_usd_h, 4), "saving_usd_per_hour": round(c.saving_usd_h, 4),
            "run_s": round(runtime, 3), **extra,
        }  # fmt: skip
        return make_finding(self, action, res, episode_start=run.start, fired_at=c.fired_at, at=at,
                            usd=usd_over(c.saving_usd_h, runtime), details=details, usd_per_hour=c.saving_usd_h)  # fmt: skip
