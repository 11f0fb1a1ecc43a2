"""``telemetry_stale``: a billed GPU host whose GPU metrics stopped arriving.

Example rule::

    - name: gpu-telemetry-stale
      type: telemetry_stale
      match: {resource_type: [gpu_instance, notebook]}
      params:
        after: 10m       # no GPU sample for this long while the host is billed
      severity: info

A data-quality finding, neither idle nor busy: while a host's exporter is down,
burnwatch cannot tell whether its GPUs are used, and ``idle_gpu`` and ``stuck_gpu``
stay silent by design. dcgm-exporter is usually scraped every 30 s; ten minutes
without a sample is an exporter or scrape failure, not jitter. It fires only for
hosts that have sent GPU metrics before (a CPU instance has none to miss), only while
usage says the host runs, and resolves when samples return or the host stops. The
dollars are the spend while blind.

Blind time is billed time: a host whose billed usage stopped coming for longer than ``after``
(gone quiet, not reported as stopped: from the end of its latest interval to the start of the
next) and then comes back counts from the start of its first interval back, not from its last
sample before the gap. Otherwise the hours it was away would count, and whether
the first usage interval back or the first sample back reaches detection first (the two topics
are read apart: any batching a consumer does decides it) would decide whether a host that just
came back fires.
"""

from __future__ import annotations

import builtins
from functools import partial
from typing import ClassVar

from pydantic import Field

from detector.detectors.base import Behaviour, Context, DetectorBase, Finding, Params, ResourceInfo, at_sample, make_finding
from detector.detectors.episode import Episode, advance, end
from detector.detectors.scrape import Scrape
from detector.events import Event, GpuMetric, UsageEvent
from detector.units import Duration

__all__ = ["TelemetryStale", "TelemetryStaleParams", "TelemetryStaleState"]

_KEEP_LATER = 16
"""Spells kept while samples wait for usage (:attr:`TelemetryStaleState.later`, two floats each): a wait
lasts ``settle`` or two usage intervals, and each spell ``after`` at least (twelve in two hours)."""

_KEEP_COUNTED = 16
"""Intervals kept for the take-back: more than a minute's worth at any usage cadence in use
(the allowed lateness is 60 s)."""


class TelemetryStaleParams(Params):
    after: Duration = Field(default=600.0, gt=0)
    update_every: Duration = Field(default=900.0, gt=0)
    settle: Duration = Field(default=1800.0, gt=0)
    """Once samples return, how long (by their own times) to wait for the host's usage to reach
    the returning sample before resolving without it: a host whose usage stopped coming must
    not stay alerted forever. Long, because an accelerated replay turns a second's fetch gap
    between the two topics into many minutes of event time; the GPU detectors are not paused
    meanwhile. Two of the host's usage intervals where that is longer (hourly billing)."""


class TelemetryStaleState(Episode, kw_only=True):
    """The episode starts at the last sample (``since`` once it fires)."""

    last_sample: float | None = None
    blind_usd: float = 0.0
    last_usage: float = 0.0
    """The latest usage interval's time (its start; 0: none)."""
    usage_end: float = 0.0
    """The end of the latest billed interval (0: none yet, or a state saved before it was kept)."""
    counted: tuple[tuple[float, float], ...] = ()
    """The latest intervals counted blind, (time, dollars): taken back if they turn out to come
    after the sample that ended the spell (see :meth:`TelemetryStale.step`). A tuple replaced on
    change (none: the one empty tuple, not a list on every host); a list saved before reads back."""
    back_at: float | None = None
    """The time of the sample that ended a fired spell, while usage has not reached it yet."""
    back_latest: float | None = None
    """The latest sample seen since ``back_at`` (the latest sample once the spell resolves)."""
    later: tuple[float, ...] = ()
    """Dark spells among the samples read while they wait (``back_at``), as (last sample before, first
    after) pairs flattened, oldest first, at most :data:`_KEEP_LATER`: each is judged as a spell of its
    own once usage has reached the one before it (usage read an hour late, two spells in its wait).
    The one empty tuple on most hosts."""
    billed_since: float | None = None
    """Start of the interval that brought the host's billed usage back after a gap longer than
    ``after`` (or its first interval), while no sample is later: blind time counts from here at the
    earliest. None otherwise (most hosts: no float held), as the latest sample only moves on."""

    def clear(self) -> None:
        super().clear()
        self.blind_usd = 0.0
        self.counted = ()
        self.back_at = self.back_latest = None


class TelemetryStale(DetectorBase):
    type: ClassVar[str] = "telemetry_stale"
    title: ClassVar[str] = "GPU telemetry missing"
    Params: ClassVar[builtins.type[TelemetryStaleParams]] = TelemetryStaleParams
    State: ClassVar[builtins.type[TelemetryStaleState]] = TelemetryStaleState
    consumes: ClassVar[tuple[builtins.type, ...]] = (GpuMetric, UsageEvent)
    suggestion: ClassVar[str] = (
        "Check the host's dcgm-exporter (and its scrape job): until its metrics return, idle "
        "and stuck GPUs on it cannot be detected."
    )

    dollars: ClassVar[str] = "spent while blind"
    behaviour: ClassVar[bool] = True

    def tracking(self, state: TelemetryStaleState, t: float) -> Behaviour:
        """Dark telemetry is a pause of what can be seen of the host's work: until the sample
        that ended the spell (``back_at``), which live may be read before the usage of the minutes
        it was still dark (they are dark at their time, as in event order)."""
        if state.fired_at is not None and (state.back_at is None or t < state.back_at):
            return Behaviour.PAUSE
        return Behaviour.NONE

    def step(self, state: TelemetryStaleState, ctx: Context, event: Event, t: float) -> list[Finding]:
        # Live, a caught-up partition does not wait for the others, so a host's usage and its
        # GPU samples can reach detection in either order around the sample that ends a spell.
        # The dollars are those of event order (backtest's) either way: intervals counted blind
        # that come after that sample are taken back, and the resolution waits until usage has
        # reached the sample, so intervals before it that arrive after it still count.
        resource = ctx.resource
        st = state
        if type(event) is GpuMetric:
            latest = st.back_at if st.back_at is not None else st.last_sample
            if latest is not None and t <= latest:
                return []
            if st.back_at is not None:  # the spell has ended already; waiting for usage to reach it
                previous = st.back_latest if st.back_latest is not None else st.back_at
                if t <= previous:
                    return []  # read already
                if t - previous >= self.params.after and len(st.later) < 2 * _KEEP_LATER:
                    st.later = (*st.later, previous, t)  # dark again meanwhile: a spell of its own
                st.back_latest = t
                if t >= st.back_at + self._settle(st):  # usage is not coming: resolve without it
                    return self._telemetry_back(st, resource, st.back_at)
                return []
            if st.fired_at is None:  # nothing open: a candidate spell, if any, ends
                if latest is not None and t - latest >= self.params.after and st.last_usage < t:
                    st.back_at = t  # dark long enough to fire, usage not read that far: it may yet (live, the
                    return []  # usage topic read behind), and ends here if it does, as a fired spell waits
                st.clear()
                st.last_sample = t
                if st.billed_since is not None and st.billed_since <= t:
                    st.billed_since = None  # the sample is later: it starts any spell
                return []
            taken = 0.0  # (a loop, not a generator over t: see at_sample)
            for at, usd in st.counted:
                if at >= t:
                    taken += usd
            st.blind_usd -= taken
            st.counted = ()
            if st.last_usage >= t:
                return self._telemetry_back(st, resource, t)
            st.back_at = t
            return []
        if type(event) is not UsageEvent or t <= st.last_usage:
            return []  # a re-read interval
        # Kept before the host's first sample too: which of its first interval back and its first
        # sample back reaches detection first must not move the start of a spell.
        self._billing(st, event, t, resource.billed)
        st.last_usage = t
        if st.last_sample is None:
            return []  # no GPU host yet (or one stopped: it starts afresh at its next sample)
        if st.back_at is None and t <= st.last_sample:
            return []  # an interval from before the latest sample
        found: list[Finding] = []
        if st.back_at is not None and t >= st.back_at:
            while st.back_at is not None and t >= st.back_at:  # (and a spell that followed, usage past it too)
                found += self._telemetry_back(st, resource, st.back_at)
                if not resource.billed:  # stopped as samples returned: start afresh when it runs again (what waits
                    st.last_sample, st.later, st.back_at, st.back_latest = None, (), None, None  # on it too)
                    return found
            if t <= st.last_sample:  # (billed and after the latest sample, the interval goes on below: it is
                return found  # also the first blind time of a spell going on, and may fire it)
        if not resource.billed:
            seen = max(st.back_at or 0.0, st.back_latest or 0.0)  # samples read before the stop, past it
            found = end(st, partial(self._finding, "resolve", st, resource, t, reason=f"instance_{resource.state}"))
            st.last_sample = seen or None  # a stopped host sends nothing: start afresh when it runs again
            st.later = ()
            return found
        # Spend since the last sample (the engine's price of the interval, as stored), counted
        # once the gap is long enough.
        st.blind_usd += resource.interval_usd
        st.counted = (*st.counted[-(_KEEP_COUNTED - 1):], (t, resource.interval_usd))
        if st.back_at is not None and st.fired_at is not None:
            return found  # blind, though it reached detection after the sample that ended the spell
        start = st.last_sample if st.billed_since is None else max(st.last_sample, st.billed_since)
        if t - start < self.params.after:
            return found
        p = self.params
        action = advance(st, t, start=start, held_s=t - start, need_s=p.after, every_s=p.update_every)
        if action is None or st.fired_at is None:
            return found
        return [*found, self._finding(action, st, resource, st.fired_at if action == "fire" else t)]

    def step_scrape(self, state: TelemetryStaleState, ctx: Context, scrape: Scrape,
                    t: float) -> list[tuple[int, Finding]]:  # fmt: skip
        """:meth:`step` for each sample of a scrape (samples of the host at ``t``): after the first,
        the others are usually at the latest time already seen, which changes nothing (and so
        nothing for the samples after it either): they are not stepped."""
        events = scrape.samples
        found = self.step(state, ctx, events[0], t)
        out = [(0, f) for f in found] if found else []
        for i in range(1, len(events)):
            latest = state.back_at if state.back_at is not None else state.last_sample
            if latest is not None and t <= latest:
                break
            found = self.step(state, ctx, events[i], t)
            if found:
                out += at_sample(i, found)
        return out

    def _billing(self, st: TelemetryStaleState, usage: UsageEvent, t: float, billed: bool) -> None:
        """A billed interval starting more than ``after`` past the end of the latest one (or the host's
        first) starts billed time afresh at ``t`` (the interval's start), and a candidate spell's
        dollars with it. A stopped host's intervals are not billed time: they neither end a gap
        nor start one."""
        if not billed:
            return
        previous_end = st.usage_end or (st.last_usage + usage.interval_s if st.last_usage else 0.0)  # (saved before)
        if not previous_end or t - previous_end > self.params.after:
            st.billed_since = t if st.last_sample is None or t > st.last_sample else None
            if st.fired_at is None:
                st.blind_usd, st.counted = 0.0, ()  # what was counted before the gap was not spent blind
        st.usage_end = max(st.usage_end, t + usage.interval_s)

    def _settle(self, st: TelemetryStaleState) -> float:
        """How long samples wait past the returning one for the host's usage: ``settle``, or two of its
        usage intervals where that is longer (hourly intervals sent hourly reach the returning sample up
        to two hours after it: a spell would resolve, or be forgotten, before its blind hours are read)."""
        interval = st.usage_end - st.last_usage
        return max(self.params.settle, 2.0 * interval) if interval > 0.0 else self.params.settle

    def _telemetry_back(self, st: TelemetryStaleState, resource: ResourceInfo, at: float) -> list[Finding]:
        """Resolve the spell ended by the sample at ``at``; the latest sample seen since is the
        latest now (samples kept coming while usage caught up), or where they went dark again
        meanwhile (:attr:`~TelemetryStaleState.later`), that spell is next: a candidate that waits for
        usage as its own returning sample would have."""
        latest = max(at, st.back_latest or at)
        found = end(st, partial(self._finding, "resolve", st, resource, at, reason="telemetry_back"))
        if st.later:
            st.last_sample, st.back_at, st.later = st.later[0], st.later[1], st.later[2:]
            st.back_latest = latest if latest > st.back_at else None
        else:
            st.last_sample = latest
        return found

    def _finding(self, action: str, st: TelemetryStaleState, res: ResourceInfo, at: float, **extra: object) -> Finding:
        assert st.last_sample is not None and st.fired_at is not None and st.since is not None
        details = {"last_sample_s_ago": round(at - st.last_sample, 3), **extra}
        return make_finding(self, action, res, episode_start=st.since, fired_at=st.fired_at, at=at,
                            usd=st.blind_usd, details=details)  # fmt: skip

    def open_episode(self, state: TelemetryStaleState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return self._finding("update", state, resource, state.last_usage)
