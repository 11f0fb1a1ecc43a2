"""``idle_notebook``: a billed notebook without GPUs whose Jupyter server has seen no activity for hours.

Example rule::

    - name: idle-notebook
      type: idle_notebook
      match: {resource_type: notebook}
      params:
        for: 3h             # no activity this long (event time) before alerting
      severity: info

What it reads: the notebook's usage events (``resource-usage``, ``resource_type: notebook``) with
Jupyter's own idea of activity in ``metrics``, as the exporter read it at the end of each interval:

- ``last_activity``: Unix seconds of the server's last activity, what Jupyter Server reports as
  ``last_activity`` on ``GET /api/status`` and as the gauge
  ``jupyter_server_last_activity_timestamp_seconds`` (Jupyter Server 2), JupyterHub as each server's
  ``last_activity`` on ``GET /hub/api/users``, and Kubeflow's notebook controller in the annotation
  ``notebooks.kubeflow.org/last-activity``. It moves with kernel messages, terminals and API
  requests: a person typing in a notebook moves it, a kernel sitting idle does not.
- ``kernels_busy`` (optional): kernels whose ``execution_state`` is ``busy`` (``GET /api/kernels``).
  A cell that computes for hours without printing leaves ``last_activity`` where it started; a busy
  kernel is work, so an interval with one is active (JupyterHub's culler spares busy kernels too).

GPU notebooks are ``idle_gpu``'s: their GPU samples say more than the kernel does, and the two
rules would price the same hours. A notebook whose instance type has GPUs (``rules/pricing.yaml``)
or that sends a GPU sample (after its first usage event: samples come every 30 s, and one before
any usage is not remembered, so that a GPU notebook holds no state for this rule) is never this
rule's; one that fired before its first GPU sample resolves (``reason: has_gpus``).

The idle spell starts at ``last_activity``, or where the notebook last started running when that
is later (a stop ends the spell: a notebook restarted at 08:00 after a night stopped is not idle
since yesterday), or at the first interval burnwatch saw of it (a spell that began before it was
watched is dated from then: its start and dollars are what was seen). It fires when ``for`` has
passed; it resolves when the activity moves past the spell's start (at that activity), when a
kernel is busy, or when the notebook stops (a stop read late too: where it came, as in time order).
An interval of an instance type with GPUs (a resize) ends the spell, and the next starts after it.
An interval without ``last_activity`` is not counted (silence is not evidence) and changes nothing.

Dollars: the billed cost of the running intervals inside the spell, an interval the spell began
in counted for its idle share; per hour, the notebook's price.

Why these defaults: the Zero to JupyterHub chart culls servers idle for an hour
(``cull.timeout: 3600``), as do SageMaker's idle-shutdown lifecycle samples; Vertex AI Workbench's
idle shutdown defaults to 180 minutes and Kubeflow's culler to a day. An alert a person reads
wants fewer than a culler: 3 hours leaves meetings and lunch alone and catches the notebook left
running overnight or over a weekend, the waste this rule is for.
"""

from __future__ import annotations

import builtins
import math
from datetime import datetime, timezone
from functools import partial
from typing import Any, ClassVar

from pydantic import Field

from detector.detectors.base import Context, DetectorBase, Finding, Params, ResourceInfo, make_finding
from detector.detectors.episode import WITHDRAWN, Episode, advance, end
from detector.detectors.scrape import Scrape
from detector.events import Event, GpuMetric, UsageEvent
from detector.units import Duration

__all__ = ["ACTIVITY", "BUSY", "IdleNotebook", "IdleNotebookParams", "IdleNotebookState"]

_Y2K = 946_684_800.0
"""2000-01-01 UTC: a last activity before it is not a time a server saw (shown as none)."""

ACTIVITY = "last_activity"
"""The ``UsageEvent.metrics`` name of the server's last activity, Unix seconds."""
BUSY = "kernels_busy"
"""The ``UsageEvent.metrics`` name of the kernels computing at the interval's end."""


class IdleNotebookParams(Params):
    for_: Duration = Field(default=10_800.0, alias="for", gt=0)
    update_every: Duration = Field(default=3600.0, gt=0)
    """How often an open episode reports its growing dollars (event time)."""


class IdleNotebookState(Episode, kw_only=True):
    counted_until: float = 0.0
    """End of the latest interval whose idle time was counted in the spell."""
    running_since: float = -math.inf
    """Where the notebook last started running after a stop burnwatch saw (the first interval it saw:
    -inf, no stop seen); a spell starts no earlier (nor before :attr:`first_seen`)."""
    first_seen: float = math.inf
    """Start of the first interval with activity figures: a spell is dated from here at the earliest."""
    activity: float = -math.inf
    """The latest ``last_activity`` read (a reading older than it changes nothing)."""
    idle_usd: float = 0.0
    peak_usd_per_s: float = 0.0
    """The highest rate (dollars a second) of the intervals counted in the spell: time counted and taken
    back (activity heard late, a stop read late) is taken back at it, so what stays is never more than
    was counted before that time, whatever the intervals cost (``cost_usd`` varies; a gap counted nothing)."""
    has_gpus: bool = False
    """A GPU sample came after its first usage event: ``idle_gpu``'s, never this rule's (an instance type with
    GPUs is read again from the resource at every event, not kept here)."""

    def clear(self) -> None:
        super().clear()
        self.idle_usd = 0.0
        self.peak_usd_per_s = 0.0


class IdleNotebook(DetectorBase):
    type: ClassVar[str] = "idle_notebook"
    title: ClassVar[str] = "Idle notebooks"
    Params: ClassVar[builtins.type[IdleNotebookParams]] = IdleNotebookParams
    State: ClassVar[builtins.type[IdleNotebookState]] = IdleNotebookState
    consumes: ClassVar[tuple[builtins.type, ...]] = (UsageEvent, GpuMetric)
    behaviour: ClassVar[bool] = True
    suggestion: ClassVar[str] = (
        "Save the work and stop the notebook if nobody is using it (stopping keeps its disk); turn on idle "
        "shutdown so it stops itself (JupyterHub's idle culler, SageMaker or Vertex AI idle shutdown)."
    )
    lazy: ClassVar[bool] = True
    """A notebook that reports no activity figures holds no state for this rule."""

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        """The last activity as a time (how long it has been idle is the message's duration already); none for a
        reading that is no time (Jupyter's are this century's: 0 or 1970 is a value never set)."""
        last = details.get("last_activity")
        if isinstance(last, (int, float)) and not isinstance(last, bool) and math.isfinite(last) and _Y2K <= last < 1e11:
            return [("Last activity", datetime.fromtimestamp(last, timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))]
        return []

    def starts(self, ctx: Context, event: Event) -> bool:
        """A GPU sample (the notebook is ``idle_gpu``'s: remembered), or a running interval newer than
        the key's others that carries activity figures; an interval without them is not counted."""
        if ctx.resource.gpus > 0:
            return False  # (its instance type has GPUs: nothing to remember)
        if type(event) is GpuMetric:  # (before its first usage event nothing says it is a notebook billed without GPUs:
            return ctx.resource.known  # its samples keep coming, and the first after that one is remembered)
        if type(event) is not UsageEvent or ctx.late or event.state != "running":
            return False
        metrics = event.metrics
        return ACTIVITY in metrics or BUSY in metrics

    def step_scrape(self, state: IdleNotebookState, ctx: Context, scrape: Scrape, t: float) -> list[tuple[int, Finding]]:
        """A notebook's GPU samples: it has GPUs, ``idle_gpu`` prices its idle time."""
        return [(0, f) for f in self.step(state, ctx, scrape.samples[0], t)]

    def step(self, state: IdleNotebookState, ctx: Context, event: Event, t: float) -> list[Finding]:
        resource = ctx.resource
        usage = type(event) is UsageEvent
        if usage and ctx.late:  # no newer than the key's newest interval; asked before its instance type is read,
            # so that an interval of a type with GPUs read again after a resize does not end the spell
            return self._late(state, resource, t, event)  # type: ignore[arg-type]
        if resource.gpus > 0:  # (what its instance type says is read again at every event)
            if usage and state.first_seen != math.inf:  # (a spell starts no earlier than after it, as after a stop)
                state.running_since = max(state.running_since, t + event.interval_s)  # type: ignore[union-attr]
            return self._ends_at(state, resource, t, "has_gpus")
        if type(event) is GpuMetric:
            return self._has_gpus(state, resource, t) if resource.known else []
        if not usage or state.has_gpus:
            return []
        assert type(event) is UsageEvent
        end_t = t + event.interval_s
        if event.state != "running":
            if state.first_seen != math.inf:  # (before any activity figures: no spell to start later, nothing kept)
                state.running_since = end_t  # (a spell starts no earlier than the next running interval)
            return self._ends_at(state, resource, t, "instance_" + event.state)
        metrics = event.metrics
        last = metrics.get(ACTIVITY)
        busy = metrics.get(BUSY)
        if last is None and busy is None:
            return []  # nothing said of activity: not counted, nothing changes
        if state.first_seen == math.inf:
            state.first_seen = t
        found: list[Finding] = []
        if busy is not None and busy > 0:
            state.activity = max(state.activity, end_t)  # (computing through the interval: idle from its end at the earliest)
            return self._ends_at(state, resource, t, "kernel_busy")
        if last is not None and last > state.activity:
            state.activity = min(last, end_t)  # (a clock ahead of ours: active now)
            if state.since is not None and state.activity > state.since:
                found = self._active(state, resource, t, end_t)
        if state.activity == -math.inf:
            return found  # (kernels idle, no time of the last activity: nothing to date a spell from)
        if state.since is None:
            state.since = max(state.activity, state.running_since, state.first_seen)
            state.counted_until = state.since
        self._count(state, resource, t, end_t, until=end_t)
        p = self.params
        action = advance(state, end_t, start=state.since, held_s=end_t - state.since, need_s=p.for_, every_s=p.update_every)
        if action is None or state.fired_at is None:
            return found
        return [*found, self._finding(action, state, resource, state.fired_at if action == "fire" else end_t)]

    def _count(self, st: IdleNotebookState, res: ResourceInfo, t: float, end_t: float, until: float) -> None:
        """The interval ``[t, end_t]``'s billed cost for its part in the spell, up to ``until``."""
        since = st.since
        if since is None:
            return
        start = max(t, since, st.counted_until)
        if until <= start:
            return
        if end_t > t:
            per_s = res.interval_usd / (end_t - t)
            st.idle_usd += per_s * (until - start)
            st.peak_usd_per_s = max(st.peak_usd_per_s, per_s)
        st.counted_until = until

    def _late(self, st: IdleNotebookState, res: ResourceInfo, t: float, event: UsageEvent) -> list[Finding]:
        """An interval ``[t, ...]`` read after later ones changes nothing (an old reading, an interval read
        again, one of an instance type with GPUs before a resize), but for a stop (a stop read late is a stop,
        :class:`~detector.detectors.base.Context`): in time order it ended the spell if it came within it. A stop
        folded in before ended its spell, and the spell after it began past it: read again, it changes nothing."""
        since = st.since
        if since is None or event.state == "running" or t < since:
            return []
        st.running_since = max(st.running_since, t + event.interval_s)  # (a spell starts no earlier than after it)
        return self._ends_at(st, res, t, "instance_" + event.state)

    def _ends_at(self, st: IdleNotebookState, res: ResourceInfo, at: float, reason: str) -> list[Finding]:
        """The spell ends at ``at``: what was counted past it is taken back; a fire after it is withdrawn
        (in time order the spell never lasted ``for``), else resolved with ``reason``."""
        if st.since is None:
            return []
        at = max(at, st.since)
        if st.counted_until > at:
            st.idle_usd = max(0.0, st.idle_usd - st.peak_usd_per_s * (st.counted_until - at))
            st.counted_until = at
        if st.fired_at is not None and at < st.fired_at:
            st.idle_usd = 0.0
            return self._ended(st, res, at, WITHDRAWN)
        return self._ended(st, res, at, reason)

    def _active(self, st: IdleNotebookState, res: ResourceInfo, t: float, end_t: float) -> list[Finding]:
        """Activity at :attr:`~IdleNotebookState.activity`, after the spell's start, read in the interval
        ``[t, end_t]``: the spell ends there. Read late (JupyterHub hears of a server's activity every
        5 minutes), it may predate what was counted, which is taken back, or the spell's fire, which is
        withdrawn: in time order the spell never lasted ``for``."""
        at = st.activity
        if at >= t:
            self._count(st, res, t, end_t, until=at)
        return self._ends_at(st, res, at, "notebook_active")

    def _ended(self, st: IdleNotebookState, res: ResourceInfo, at: float, reason: str) -> list[Finding]:
        """The spell ends at ``at``: its resolution if it fired; a candidate ends silently."""
        if st.since is None:
            return []
        at = max(at, st.since)
        return end(st, partial(self._finding, "resolve", st, res, at, reason=reason))

    def _has_gpus(self, st: IdleNotebookState, res: ResourceInfo, t: float) -> list[Finding]:
        st.has_gpus = True
        return self._ended(st, res, t, "has_gpus")

    def _finding(self, action: str, st: IdleNotebookState, res: ResourceInfo, at: float, **extra: object) -> Finding:
        assert st.since is not None and st.fired_at is not None
        details = {"idle_s": round(at - st.since, 3), "for_s": self.params.for_, **extra}
        if -math.inf < st.activity <= st.since:  # (the activity before the spell; one that ends it is ``at``)
            details["last_activity"] = st.activity
        return make_finding(self, action, res, episode_start=st.since, fired_at=st.fired_at, at=at,
                            usd=st.idle_usd, details=details)  # fmt: skip

    def open_episode(self, state: IdleNotebookState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return self._finding("update", state, resource, state.counted_until)
