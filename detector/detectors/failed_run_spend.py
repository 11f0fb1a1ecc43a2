"""``failed_run_spend``: a training run that failed after burning real money, and crash loops.

Example rule::

    - name: failed-run-spend
      type: failed_run_spend
      params:
        min_usd: 20          # a failed run that cost at least this alerts
        count_killed: false  # killed runs are deliberate unless a rule says otherwise
        loop_runs: 3         # this many failed runs of one project...
        loop_window: 6h      # ...within this time are one crash-loop alert
      severity: warning

Run events are keyed by project (``run-events`` contract), so one project's runs and
its crash-loop state live together. A run's cost is its hosts' price over its
lifetime (from ``started``, or the first event seen, to ``failed``), shared by GPU
count when the run uses only some of a host's GPUs: the hosts' prices come from their
own usage events (what they are billed), which the engine holds. Why these defaults:
$20 is about 40 minutes of an 8-GPU A100 host, which is when a failure stops being a
quick misconfiguration; three failures in six hours is a job retried by a scheduler
without anyone fixing it (Kubernetes' default Job ``backoffLimit`` is 6 retries with
exponential back-off over minutes).
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
from detector.units import Duration, Money

__all__ = ["FailedRunSpend", "FailedRunSpendParams", "FailedRunSpendState"]

class FailedRunSpendParams(Params):
    min_usd: Money = 20.0
    count_killed: bool = False
    loop_runs: int = Field(default=3, ge=2)
    loop_window: Duration = Field(default=6 * 3600.0, gt=0)


class Failure(msgspec.Struct, kw_only=True, gc=False):
    t: float
    run_id: str
    usd: float
    gpu_hours: float
    error: str = ""
    start: float = 0.0
    resource_ids: list[str] = []
    """The run's hosts and start: a crash loop lists its runs so the waste ledger can charge
    each run's dollars to its hosts' hours, once (a run alerted alone and in a loop)."""


class FailedRunSpendState(Episode, kw_only=True):
    """A project's runs, and its crash loop as the episode."""

    since: float | None = msgspec.field(default=None, name="loop_since")
    fired_at: float | None = msgspec.field(default=None, name="loop_fired_at")
    runs: dict[str, RunState] = {}
    """Runs of the project that have started and not ended."""
    ended: Ended = msgspec.field(default_factory=Ended)
    """Run id → end time, so a re-read end event is not a second failure."""
    failures: list[Failure] = []
    """Failures inside the crash-loop window."""
    loop_tags: dict[str, str] = {}
    """The open crash loop's tags (the project's as its firing run said)."""
    last_t: float = 0.0

    def clear(self) -> None:
        super().clear()
        self.failures, self.loop_tags = [], {}


class FailedRunSpend(DetectorBase):
    type: ClassVar[str] = "failed_run_spend"
    title: ClassVar[str] = "Failed run spend"
    Params: ClassVar[builtins.type[FailedRunSpendParams]] = FailedRunSpendParams
    State: ClassVar[builtins.type[FailedRunSpendState]] = FailedRunSpendState
    consumes: ClassVar[tuple[builtins.type, ...]] = (RunEvent,)
    burning: ClassVar[bool | str] = "crash_loop"
    """A failed run has ended: its dollars are sunk. A crash loop is open while the retries go on."""
    suggestion: ClassVar[str] = (
        "Read the run's error before retrying; for a crash loop, stop the retries (scheduler "
        "backoff or the pipeline's trigger) until the cause is fixed."
    )

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        gpu_hours = ("GPU-hours", f"{details.get('gpu_hours', 0):,.1f}")
        if details.get("crash_loop"):
            return [("Crash loop", f"{details.get('failed_runs')} failed runs of `{details.get('project')}`"),
                    ("Errors", ", ".join(details.get("errors", [])) or "_none reported_"), gpu_hours]  # fmt: skip
        return [("Run", f"`{details.get('run_id')}` ({details.get('status')})"),
                ("Error", details.get("error") or "_none reported_"), gpu_hours]  # fmt: skip

    def step(self, state: FailedRunSpendState, ctx: Context, event: Event, t: float) -> list[Finding]:
        resource = ctx.resource
        if type(event) is not RunEvent:
            return []
        st, ev = state, event
        if is_past(st.ended.get(ev.run_id), ev.status, t, running=ev.run_id in st.runs):
            return []  # a re-read or straggling event of a run that already ended
        # (Else the id is used again: a Job or task retried under its own name, a scheduled job's fixed
        # name. A new attempt; its end replaces the time kept.)
        st.last_t = max(st.last_t, t)
        found = self._maybe_end_loop(st, t, resource)
        run = follow(st.runs, ev, t)
        if ev.status in ("started", "running"):
            return found
        del st.runs[ev.run_id]
        st.runs = emptied(st.runs)
        st.ended.add(ev.run_id, t)
        self._prune(st, t)
        if ev.status == "succeeded":
            if st.fired_at is not None:
                found.extend(end(st, partial(self._loop_finding, "resolve", st, resource, t, reason="run_succeeded")))
            return found
        if ev.status == "killed" and not self.params.count_killed:
            return found
        usd, gpu_hours, info, hosts = self._cost(run, t, ctx.lookup)
        if usd is None:
            return found  # no price known for its hosts: nothing to weigh against the floor
        failure = Failure(t=t, run_id=ev.run_id, usd=usd, gpu_hours=gpu_hours, error=ev.error, start=run.start,
                          resource_ids=[h.resource_id for h in hosts])
        st.failures.append(failure)
        if st.fired_at is not None:
            st.last_report = t  # every failure inside an open loop reports it
            found.append(self._loop_finding("update", st, resource, t))
            return found
        if len(st.failures) >= self.params.loop_runs and sum(f.usd for f in st.failures) >= self.params.min_usd:
            action = fire(st, since=st.failures[0].t, fired_at=t, at=t)
            st.loop_tags = {**run.tags, "project": ev.project or tag_value(run.tags, "project")}
            found.append(self._loop_finding(action, st, resource, t))
            return found
        if usd >= self.params.min_usd:
            found.append(self._run_finding(ev, run, failure, info))
        return found

    def open_episode(self, state: FailedRunSpendState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return self._loop_finding("update", state, resource, state.last_t)

    # -- cost -----------------------------------------------------------------------

    def _cost(self, run: RunState, end: float, fleet: Fleet | None
              ) -> tuple[float | None, float, ResourceInfo, list[ResourceInfo]]:  # fmt: skip
        """(dollars or None when unpriced, GPU-hours, the first host's info, the priced hosts)."""
        seconds = max(0.0, end - run.start)
        hosts = hosts_of(run, fleet, self.pricing)
        gpu_hours = hosts.gpus * seconds / 3600.0
        if not hosts.hosts:
            return None, gpu_hours, hosts.first, []
        return usd_over(hosts.usd_per_hour, seconds), gpu_hours, hosts.first, hosts.hosts

    # -- loop bookkeeping -------------------------------------------------------------

    def _prune(self, st: FailedRunSpendState, t: float) -> None:
        horizon = t - self.params.loop_window
        if st.fired_at is None:
            st.failures = [f for f in st.failures if f.t >= horizon]
        st.ended.keep_since(horizon - self.params.loop_window)

    def _maybe_end_loop(self, st: FailedRunSpendState, t: float, res: ResourceInfo) -> list[Finding]:
        """A loop with no failure for a whole window is over."""
        if st.fired_at is None or t - st.failures[-1].t < self.params.loop_window:
            return []
        return end(st, partial(self._loop_finding, "resolve", st, res, t, reason="no_failure_in_window"))

    # -- findings -------------------------------------------------------------------

    def _run_finding(self, ev: RunEvent, run: RunState, failure: Failure, host: ResourceInfo) -> Finding:
        res = ResourceInfo(resource_id=ev.run_id, resource_type="run", account=host.account, region=host.region,
                           instance_type=host.instance_type, state="terminated",
                           tags={**run.tags, "project": ev.project or tag_value(run.tags, "project")})  # fmt: skip
        hours = failure.t - run.start
        details = {
            "run_id": ev.run_id, "project": ev.project, "owner": tag_value(run.tags, "owner"),
            "error": ev.error, "status": ev.status, "gpu_hours": round(failure.gpu_hours, 3),
            "resource_ids": list(run.resource_ids), "run_s": round(hours, 3), "min_usd": self.params.min_usd,
        }  # fmt: skip
        usd_per_hour = failure.usd * 3600 / hours if hours > 0 else 0.0
        return make_finding(self, "fire", res, episode_start=run.start, fired_at=failure.t, at=failure.t,
                            usd=failure.usd, details=details, usd_per_hour=usd_per_hour)  # fmt: skip

    def _loop_finding(self, action: str, st: FailedRunSpendState, res: ResourceInfo, at: float,
                      **extra: object) -> Finding:  # fmt: skip
        assert st.since is not None and st.fired_at is not None
        project = st.loop_tags.get("project", "")
        info = ResourceInfo(resource_id=f"project/{project or res.resource_id}", resource_type="project",
                            tags=dict(st.loop_tags))  # fmt: skip
        total = sum(f.usd for f in st.failures)
        details = {
            "crash_loop": True, "project": project, "failed_runs": len(st.failures),
            "run_ids": [f.run_id for f in st.failures], "errors": sorted({f.error for f in st.failures if f.error}),
            "gpu_hours": round(sum(f.gpu_hours for f in st.failures), 3),
            "runs": [{"run_id": f.run_id, "start": f.start, "end": f.t, "usd": round(f.usd, 4),
                      "resource_ids": f.resource_ids} for f in st.failures], **extra,
        }  # fmt: skip
        span = max(at, st.failures[-1].t) - st.since
        return make_finding(self, action, info, episode_start=st.since, fired_at=st.fired_at, at=at,
                            usd=total, details=details, usd_per_hour=total * 3600 / span if span > 0 else 0.0)  # fmt: skip
