"""What the GPU detectors share: episodes of a host whose every GPU sample shows a
waste condition, held for a sustained time while the host is billed.

A subclass says which sample of a scrape first *breaks* an episode (``first_break``) and what its findings
add (``describe``); this class does the rest the same way for all of them:

- the episode starts at the first sample after the last breaking one, and fires when
  samples cover ``for`` of it, with ``fired_at = start + for`` (event time);
- it fires only while the host is billed (its latest usage event says ``running``);
  a stop resolves it, its dollars counted to the stop: samples past the stop read before it (the
  usage topic read behind) are taken back, so that either order gives the same dollars, and a
  stop before the sample that fired the episode withdraws it (``reason: withdrawn``, no dollars:
  :func:`~detector.detectors.episode.withdraws`), where in time order nothing would have fired;
  a stop from before the episode began (read behind, or sent again) leaves it alone;
- silence is not evidence: a telemetry gap longer than ``stale_after`` restarts a
  candidate episode and is not counted (time or dollars) in an open one; a stop read later and
  dated within that gap (a host restarted while its usage was read behind) ends the open episode
  there, and the samples after the gap are a candidate of their own, as in time order;
- dollars accrue over sample-covered time at the host's price; time seen before the
  price is known is priced once it is, so topic arrival order does not matter;
- a sample already seen (a re-read batch) or a late one changes nothing;
- on Kubernetes, the pods holding the GPUs (their latest samples) are named in the findings,
  and their owner labels decide the alert's owner (:mod:`detector.detectors.pods`).
"""

from __future__ import annotations

import builtins
from functools import partial
from typing import Any, ClassVar

import msgspec
from pydantic import Field

from detector.detectors.base import (
    SPELL_S,
    Behaviour,
    Context,
    DetectorBase,
    Finding,
    Params,
    ResourceInfo,
    at_sample,
    intern,
    make_finding,
)
from detector.detectors.episode import (
    CORRECTED,
    ENDED,
    GAP,
    STOP_GAP_S,
    WITHDRAWN,
    Ended,
    Episode,
    advance,
    after_gap,
    end,
    ended_of,
    gap_at,
    gap_holding,
    is_ended,
    rebased,
    take_back_ended,
    with_gaps,
    withdraws,
)
from detector.detectors.pods import MAX_UNITS, Pod, listing, pod_facts, with_owner
from detector.detectors.scrape import FIRST, Scrape
from detector.events import Event, GpuMetric, UsageEvent
from detector.floats import FloatArray
from detector.pricing import usd_over
from detector.units import Duration

__all__ = ["GpuEpisode", "GpuEpisodeParams", "GpuEpisodeState"]


class GpuEpisodeParams(Params):
    for_: Duration = Field(default=1800.0, alias="for", gt=0)
    stale_after: Duration = Field(default=300.0, gt=0)
    """A gap in GPU telemetry longer than this is missing data, not evidence."""
    update_every: Duration = Field(default=900.0, gt=0)
    """How often an open episode reports its growing dollars (event time)."""


class GpuEpisodeState(Episode, kw_only=True):
    gpus: tuple[int, ...] = ()
    """The GPU indexes seen, in order: a tuple replaced when one is new, the usual ``0, 1, ... n-1``
    one shared by every host (:data:`~detector.detectors.scrape.FIRST`), not a list on each."""
    model: str = ""
    peak_power_w: FloatArray | None = None
    """Highest power each GPU has drawn, by GPU index (:func:`detector.floats.per_gpu`), kept by the
    detectors that read power (None for the others, and before a sample)."""
    last_break: float = 0.0
    """Time of the newest sample that breaks an episode, or stop that ended one: a sample not after it starts none."""
    covered_until: float = 0.0
    """Time of the newest sample seen: episode time is only counted up to here."""
    fired_by: float | None = None
    """Time of the event that fired the open episode (None: none open): the sample that completed
    ``for``, or the usage event that said the host is billed. A stop read after it and dated before it
    takes the fire back (:func:`~detector.detectors.episode.withdraws`)."""
    ended: Ended | None = None
    """The episode a sample resolved last, with its gaps (:attr:`resumed`), while a stop read later may still
    take it back or correct it (:func:`~detector.detectors.episode.take_back_ended`); not cleared with the episode."""
    waste_usd: float = 0.0
    unpriced_s: float = 0.0
    """Episode seconds seen before the host's price was known."""
    unbilled: tuple[float, ...] | None = None
    """A candidate that lasted ``for`` while the host read as not billed (no usage read yet, or a stop
    before a restart), broken before a usage event said billed: ``(since, broken at, waste_usd,
    unpriced_s, its last sample before the break)`` and its gaps (:attr:`resumed`, and the one the
    breaking sample ended) until usage is read past it. Usage read that says billed before the break (its topic
    read behind: an exporter flushing an hour at once) fires and resolves it, as time order did
    (:meth:`GpuEpisode._billed_late`); a stop within it, or usage past it, lets it go."""
    resumed: tuple[float, ...] | None = None
    """The gaps in the episode's samples (open, or a candidate's) longer than :data:`~detector.detectors.episode.STOP_GAP_S`
    that usage is not yet read past, oldest first, six figures each (:data:`GAP`): its last sample before,
    the first after, ``waste_usd`` and ``unpriced_s`` before it, and after it (the same unless it was
    bridged). At most :data:`MAX_GAPS`: then the shortest goes (a missed or late scrape does not hide a
    restart's). A stop read later and dated within one (a host restarted while the usage topic was read
    behind) ends the episode there, and what came after is a candidate of its own, as in time order
    (:meth:`GpuEpisode._split_at_gap`). None while there is none (usage read past a gap drops it: usage
    is read in order). Four figures as saved on 2026-12-05 before bridged gaps were kept (a gap not
    counted): read as six."""
    pods: dict[str, Pod] | None = None
    """Unit (``"3"``, ``"3/1"`` for a MIG instance) → the pod its latest sample named (None: no sample
    named one; most hosts are not on Kubernetes, and an empty dict is 64 bytes on each)."""
    allocated: dict[str, bool] | None = None
    """Unit → whether a pod holds it, for units whose samples say (None: none said)."""

    def __post_init__(self) -> None:
        if self.ended is not None and not is_ended(self.ended):
            raise ValueError("the episode resolved last is its start, fire and firing event, then its resolution and gaps")
        held = self.unbilled
        if held is not None and not (len(held) >= 5 and with_gaps(held, 5) and held[0] <= held[1]):
            raise ValueError("a candidate not billed is its start, break, dollars, unpriced seconds, last sample and gaps")
        gap = self.resumed
        if gap is not None and (not gap or len(gap) % GAP or len(gap) > GAP * MAX_GAPS):
            if len(gap) != 4:
                raise ValueError("a gap is its two times and the dollars and unpriced seconds before and after it")
            self.resumed = (*gap, gap[2], gap[3])  # saved before bridged gaps were kept: not counted, the same after

    def clear(self) -> None:
        super().clear()
        self.waste_usd = self.unpriced_s = 0.0
        self.fired_by = self.resumed = None


class GpuEpisode(DetectorBase):
    """Base of the GPU-sample episode detectors (see the module docstring)."""

    type: ClassVar[str]
    Params: ClassVar[builtins.type[GpuEpisodeParams]]
    State: ClassVar[builtins.type[GpuEpisodeState]] = GpuEpisodeState
    consumes: ClassVar[tuple[builtins.type, ...]] = (GpuMetric, UsageEvent)
    behaviour: ClassVar[bool] = True
    suggestion: ClassVar[str]
    break_reason: ClassVar[str]
    """The ``reason`` a resolution by a breaking sample carries."""
    pod_commands: ClassVar[bool] = False
    """Whether its findings say what to run to stop the pods (what stops an idle pod would
    only restart a hung one)."""

    def first_break(self, st: GpuEpisodeState, scrape: Scrape) -> int:
        """The place in the scrape of its first sample that shows the waste condition does not hold
        (ends an episode), or the scrape's length when none does; what the rule keeps of every
        sample (``stuck_gpu``: its power) is kept."""
        raise NotImplementedError

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        if not details.get("gpu_count"):
            return []
        model = f" × {details['gpu_model']}" if details.get("gpu_model") else " GPUs"
        facts = [("GPUs", f"{details['gpu_count']}{model}")]
        if details.get("gpus_unallocated"):
            facts.append(("Unallocated", f"{details['gpus_unallocated']} of {details['gpu_count']} (no pod requested them)"))
        return facts + pod_facts(details)

    def describe(self, st: GpuEpisodeState) -> dict[str, Any]:
        """What this detector adds to its findings' details."""
        return {}

    def tracking(self, state: GpuEpisodeState, t: float) -> Behaviour:
        """An episode being counted or open is a pause of the host's work (the anomaly model stays out)
        once it has lasted :data:`SPELL_S` at ``t``, up to its latest sample: what the samples say of
        ``t``, not of a usage event's reading (live, after the samples that follow it). At once where
        no breaking sample came within :data:`SPELL_S` before it (the count started again after a
        telemetry gap, or at the host's first sample): no stall of busy work, a spell going on."""
        since = state.since
        if since is None or not since <= t <= state.covered_until:
            return Behaviour.NONE
        return Behaviour.PAUSE if t >= since + SPELL_S or since - state.last_break > SPELL_S else Behaviour.NONE

    def step(self, state: GpuEpisodeState, ctx: Context, event: Event, t: float) -> list[Finding]:
        if type(event) is GpuMetric:
            return [f for _, f in self.step_scrape(state, ctx, Scrape([event]), t)]
        if type(event) is UsageEvent:
            return self._on_usage(state, ctx.resource, t, ctx.late)
        return []

    def step_scrape(self, state: GpuEpisodeState, ctx: Context, scrape: Scrape,
                    t: float) -> list[tuple[int, Finding]]:  # fmt: skip
        """:meth:`step` for each sample of a scrape (samples of the host at ``t``), in one call: this
        runs for every scrape of every host. Findings come with the index of the sample that made them.

        All the samples are at one time, so the episode moves at two of them at most: the first
        (when it does not break: the episode holds at ``t``) and the first that breaks; at any
        other, the episode has been moved to ``t`` already and it changes nothing. Each sample may
        still tell something new of the host (a GPU, its model, a pod), kept in order, so that a
        finding says what the samples up to its own said: in the usual scrape none does
        (:meth:`_usual`), and the episode is all there is to move."""
        resource = ctx.resource
        st = state
        events = scrape.samples
        first = self.first_break(st, scrape)
        gpus = scrape.gpus
        if ((scrape.plain and not st.pods and not st.allocated and gpus == st.gpus and scrape.model is not None)
                or self._usual(st, scrape)):  # (off Kubernetes without MIG, the usual host, in one line)  # fmt: skip
            if scrape.model and scrape.model != st.model:
                st.model = intern(scrape.model)
            held = self._holds(st, resource, t) if first else []
            broken = self._breaks(st, resource, t) if first < len(events) else []
            if not held and not broken:
                return []  # (most scrapes)
            return at_sample(0, held) + at_sample(first, broken)
        out: list[tuple[int, Finding]] = []
        gpus = st.gpus
        units: tuple[str, ...] | None = None
        pods: tuple[Pod | None, ...] | None = None
        for i, ev in enumerate(events):
            if ev.gpu_index not in gpus:
                gpus = (*gpus, ev.gpu_index)
                st.gpus = gpus = FIRST[len(gpus)] if gpus == FIRST[len(gpus)] else gpus
            if ev.model and ev.model != st.model:
                st.model = intern(ev.model)
            if ev.pod or ev.allocated is not None or st.pods or st.allocated:
                if units is None or pods is None:
                    units, pods = scrape.units(), scrape.pods()  # (worked out once, for every rule that asks)
                _note_pod(st, units[i], pods[i], ev.allocated)
            if i == first:
                found = self._breaks(st, resource, t)
            elif i == 0:
                found = self._holds(st, resource, t)
            else:
                continue
            if found:
                out += at_sample(i, found)
        return out

    def _usual(self, st: GpuEpisodeState, scrape: Scrape) -> bool:
        """Whether the scrape tells nothing new of the host, so that keeping its samples one by one would
        change nothing but the model: one model in it, no GPU new (in the order tracked: a MIG GPU's
        instances one after another), and either nobody says who holds a unit, in it or before, or
        every unit is held as its latest sample said (the same pods and allocations: the usual
        Kubernetes scrape). The comparisons run in C; the scrape's holders are worked out once."""
        gpus = scrape.gpus
        if scrape.model is None or (gpus != st.gpus and scrape.distinct_gpus() != st.gpus):
            return False
        if scrape.holders_unknown and not scrape.pods_named and not st.pods and not st.allocated:
            return True  # (off Kubernetes: no sample moves a holder)
        held = scrape.by_unit()  # (a dict is never None: a state that kept no holder yet is not the usual)
        return held is not None and held[0] == st.pods and held[1] == st.allocated

    def _breaks(self, st: GpuEpisodeState, resource: ResourceInfo, t: float) -> list[Finding]:
        """A sample at ``t`` that breaks the episode."""
        if t > st.last_break:
            st.last_break = t
        found: list[Finding] = []
        if st.since is not None and t >= st.since:
            unbilled = st.fired_at is None and st.covered_until - st.since >= self.params.for_ and not resource.billed
            if st.fired_at is not None or unbilled:  # (unbilled: usage read later may bill it)
                before, waste, unpriced = st.covered_until, st.waste_usd, st.unpriced_s
                self._accrue(st, resource, t)
                gaps = st.resumed
                if t - before > STOP_GAP_S:  # the gap this sample ends may hold a stop too
                    gaps = (*(gaps or ()), before, t, waste, unpriced, st.waste_usd, st.unpriced_s)
                if unbilled:
                    st.unbilled = (st.since, t, st.waste_usd, st.unpriced_s, before, *(gaps or ()))
                elif st.fired_at is not None and st.fired_by is not None:
                    st.ended = ended_of(st.since, st.fired_at, st.fired_by, t, st.waste_usd, st.unpriced_s, before, gaps)
            found = end(st, partial(self._finding, "resolve", st, resource, t, reason=self.break_reason))
        if t > st.covered_until:
            st.covered_until = t
        return found

    def _holds(self, st: GpuEpisodeState, resource: ResourceInfo, t: float) -> list[Finding]:
        """A sample at ``t`` that does not break the episode: it starts, goes on or fires."""
        if t <= st.last_break:
            return []  # a late reading from before the latest breaking one
        if st.since is None:
            st.since = t
            if t > st.covered_until:
                st.covered_until = t
        elif t > st.covered_until:
            gap = t - st.covered_until
            if gap > self.params.stale_after:
                if st.fired_at is None:
                    st.since = t  # telemetry gap: the count starts again (after every gap kept: none of them is its)
                    st.waste_usd = st.unpriced_s = 0.0
                    st.resumed = None
                else:  # not counted in the open episode; where a stop read later falls in it, it ends there
                    _keep_gap(st, (st.covered_until, t, st.waste_usd, st.unpriced_s, st.waste_usd, st.unpriced_s))
                st.covered_until = t
            elif gap > STOP_GAP_S:  # bridged (an episode or a candidate): it may hold a stop
                before, waste, unpriced = st.covered_until, st.waste_usd, st.unpriced_s
                self._accrue(st, resource, t)
                _keep_gap(st, (before, t, waste, unpriced, st.waste_usd, st.unpriced_s))
            else:
                self._accrue(st, resource, t)
        else:
            return []  # another GPU of a scrape already counted
        return self._maybe_fire_or_report(st, resource, t)

    def open_episode(self, state: GpuEpisodeState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return self._finding("update", state, resource, state.covered_until)

    # -- events -------------------------------------------------------------

    def _on_usage(self, st: GpuEpisodeState, res: ResourceInfo, t: float, late: bool = False) -> list[Finding]:
        """A usage event at ``t``; ``late``: older than the host's newest (sent again, or read behind it),
        which says how the host was billed then, not now: a stop in it still ends what it came within,
        but a running one fires nothing (the host's newest usage decides that)."""
        if st.ended is not None:
            st.ended, taken = take_back_ended(st.ended, t, not res.billed)
            if taken is not None:  # stopped within the episode a sample resolved since: it never fired, or it
                return self._taken_back(st, res, taken, t)  # ended at the stop (the open one began after that sample)
        if st.unbilled is not None:
            found = self._billed_late(st, res, t, late)
            if found:
                return found + (self._on_usage(st, res, t, late) if st.since is not None else [])
        if st.since is None:
            return []
        if not res.billed:
            since, reason = st.since, f"instance_{res.state}"
            if t < since:  # a stop from before the episode began (a backlog's usage read behind its samples, or
                return []  # a stop sent again): in time order the host ran again after it, and this one began
            after = self._split_at_gap(st, t)  # (a candidate's too: in time order the next starts after the gap)
            if st.fired_at is not None:
                early = withdraws(since, st.fired_by, t)
                self._accrue(st, res, t)
                self._uncount_after(st, res, t)
                if early:  # stopped before the sample that fired it: the episode never held for ``for``
                    reason, st.waste_usd, st.unpriced_s = WITHDRAWN, 0.0, 0.0
            if t > st.last_break:  # the stop breaks the episode: a late sample from before it starts none (one
                st.last_break = t  # did, from its own time: the resolved episode's start, so its alert id, at worst)
            found = end(st, partial(self._finding, "resolve", st, res, max(t, since), reason=reason))
            if after is not None:  # the samples after the gap: a candidate of their own, fired when usage says billed
                (st.since, st.covered_until, st.waste_usd, st.unpriced_s), st.resumed = after
            return found
        if st.resumed is not None and t >= st.resumed[1]:  # usage is read in order: no stop read later falls in a gap before t
            st.resumed = _gaps_after(st.resumed, t)
        if st.unpriced_s and res.usd_per_hour is not None:
            st.waste_usd += usd_over(res.usd_per_hour, st.unpriced_s)
            st.unpriced_s = 0.0
            if st.resumed is not None:  # (what was counted at the gaps, priced alike)
                st.resumed = _gaps_priced(st.resumed, res.usd_per_hour)
        return [] if late else self._maybe_fire_or_report(st, res, t)

    # -- helpers ------------------------------------------------------------

    def _accrue(self, st: GpuEpisodeState, res: ResourceInfo, t: float) -> None:
        """Count episode time from the last covered instant to ``t`` unless the gap is telemetry loss."""
        gap = t - st.covered_until
        if gap <= 0:
            return
        if gap <= self.params.stale_after:
            if res.usd_per_hour is None:
                st.unpriced_s += gap
            else:
                st.waste_usd += usd_over(res.usd_per_hour, gap)
        st.covered_until = t

    def _split_at_gap(self, st: GpuEpisodeState, t: float) -> _Split | None:
        """A stop at ``t`` within one of the episode's gaps in samples (:attr:`GpuEpisodeState.resumed`; a
        candidate's too): the episode is cut back to that gap's start (the stop's own seconds are counted
        after, as in time order), and what the samples after it counted is returned, (start, newest sample,
        dollars, unpriced seconds), to become a candidate of its own, with the gaps after it that are still
        its (dollars from its start). In time order that candidate began at the gap's end, and a later gap
        longer than ``stale_after`` before it had lasted ``for`` began it again there. None where the stop
        is in no gap: a stop at the first sample after one is read after that sample in time order
        (samples first at a tie)."""
        gaps = st.resumed
        if gaps is None:
            return None
        i = gap_holding(gaps, t)
        if i is None:
            return None
        start, _, waste, unpriced = gaps[i : i + 4]
        resumed_at, waste_after, unpriced_after, k = after_gap(gaps, i, self.params.stale_after, self.params.for_)
        rest = rebased(gaps, k, waste_after, unpriced_after)
        after = (resumed_at, st.covered_until, st.waste_usd - waste_after, st.unpriced_s - unpriced_after)
        st.covered_until, st.waste_usd, st.unpriced_s = start, waste, unpriced
        return after, rest

    def _uncount_after(self, st: GpuEpisodeState, res: ResourceInfo, t: float) -> None:
        """Take back the episode time counted past a stop at ``t``: samples after the stop, read before
        it. Only up to ``stale_after`` past the stop, where every second was counted (no gap that
        long inside); beyond (a host restarted minutes later, its samples read first) what was counted
        is not known, and nothing is taken back."""
        excess = st.covered_until - t
        if excess <= 0 or excess > self.params.stale_after:
            return
        if res.usd_per_hour is None:
            st.unpriced_s = max(0.0, st.unpriced_s - excess)
        else:
            st.waste_usd = max(0.0, st.waste_usd - usd_over(res.usd_per_hour, excess))
        st.covered_until = t

    def _maybe_fire_or_report(self, st: GpuEpisodeState, res: ResourceInfo, t: float) -> list[Finding]:
        """Fire, or report the open episode's dollars, as of its newest sample; ``t``: the event's time."""
        if st.since is None or not res.billed:
            return []
        p, at = self.params, st.covered_until
        action = advance(st, at, start=st.since, held_s=at - st.since, need_s=p.for_, every_s=p.update_every)
        if action is None or st.fired_at is None:
            return []
        if action == "fire":  # by a sample at ``at``, or by a usage event at ``t`` (the host billed at last), after
            # samples read ahead of it: in time order it fired at that event, or at the sample that completed ``for``
            st.fired_by = at if at <= t else max(t, st.fired_at)
            if at - st.fired_by > 0.0 and res.usd_per_hour is not None:
                # Fired by a usage event read after samples past the time order fired it (a stop or the host's
                # billing read late): its dollars those counted to then (gaps aside, as _past_episode prices: the
                # lesser of the two), not all counted since. (In time order no sample past the event is read yet.)
                found = self._finding(action, st, res, st.fired_at)
                usd = min(st.waste_usd, usd_over(res.usd_per_hour, st.fired_by - st.since))
                return [msgspec.structs.replace(found, waste_usd=round(usd, 4))]
        return [self._finding(action, st, res, st.fired_at if action == "fire" else at)]

    def _taken_back(self, st: GpuEpisodeState, res: ResourceInfo, ended: Ended, t: float) -> list[Finding]:
        """A stop at ``t`` read after the sample that resolved ``ended``, dated within it: before its fire, it
        withdraws the episode; in one of its gaps after the fire, it corrects the resolution to the stop, as
        in time order (the stop's own seconds counted up to ``stale_after``, as :meth:`_on_usage` counts
        them). Where the stop is in one of its gaps, the samples after that gap were a candidate of their
        own in time order (:meth:`_after_stop`)."""
        k = gap_at(ended, t)
        if t < ended[2]:
            found = [self._withdrawal(st, res, ended, t)]
        else:
            assert k is not None
            since, fired_at, _, was_at, was_usd = ended[:5]
            before, _, waste, unpriced = ended[k : k + 4]
            own, price = t - before, res.usd_per_hour
            if price is not None:
                waste += usd_over(price, unpriced + (own if own <= self.params.stale_after else 0.0))
            at = max(t, since)
            said = {"reason": f"instance_{res.state}", CORRECTED: True, "was_resolved_at": was_at, "was_usd": round(was_usd, 2)}
            details, who = self._facts(st, res, at - since, said)
            found = [make_finding(self, "resolve", who, episode_start=since, fired_at=fired_at, at=at, usd=waste,
                                  details=details)]  # fmt: skip
        return found + (self._after_stop(st, res, ended, k) if k is not None else [])

    def _after_stop(self, st: GpuEpisodeState, res: ResourceInfo, ended: Ended, k: int) -> list[Finding]:
        """The samples after the gap at ``k`` of ``ended``, in which a stop read late fell: in time order a
        candidate of their own, from the gap's end (or a later telemetry gap's), which fired where they
        covered ``for`` before the sample that resolved ``ended``, and which that sample resolved. Made now,
        fire and resolution, dated and priced as time order did, and kept as the episode resolved last (a
        stop read later in one of its gaps takes it back or corrects it too)."""
        _, _, _, was_at, was_usd, was_unpriced, held_until = ended[:ENDED]
        gaps, p, price = ended[ENDED:], self.params, res.usd_per_hour
        start, waste_after, unpriced_after, j = after_gap(gaps, k - ENDED, p.stale_after, p.for_)
        if held_until - start < p.for_:
            return []
        usd, unpriced = was_usd - waste_after, was_unpriced - unpriced_after
        if price is not None:
            usd, unpriced = usd + usd_over(price, unpriced), 0.0
        fired_at = start + p.for_
        st.ended = ended_of(start, fired_at, fired_at, was_at, usd, unpriced, held_until,
                            rebased(gaps, j, waste_after, unpriced_after))  # fmt: skip
        return self._past_episode(st, res, start, was_at, usd)

    def _billed_late(self, st: GpuEpisodeState, res: ResourceInfo, t: float, late: bool) -> list[Finding]:
        """A usage event at ``t`` read after the candidate kept in :attr:`GpuEpisodeState.unbilled` was broken:
        where it says billed before the break, time order fired the candidate (at its ``for``, or at this
        event) and the break resolved it: both are made now, dated so, and it is kept as the episode resolved
        last (a stop read later within it takes it back). A stop within it ended it short of a fire, and
        usage from its break on is too late: either lets it go."""
        assert st.unbilled is not None
        since, broken, waste, unpriced, held_until = st.unbilled[:5]
        if t >= broken or (not res.billed and t >= since):
            st.unbilled = None
            return []
        if not res.billed or late:
            return []
        gaps, st.unbilled = st.unbilled[5:], None
        p, price = self.params, res.usd_per_hour
        if price is not None:
            waste, unpriced = waste + usd_over(price, unpriced), 0.0
        fired_at = since + p.for_
        if st.ended is None:  # (kept with its gaps: a stop read later in one corrects it)
            st.ended = ended_of(since, fired_at, max(t, fired_at), broken, waste, unpriced, held_until, gaps or None)
        return self._past_episode(st, res, since, broken, waste)

    def _past_episode(self, st: GpuEpisodeState, res: ResourceInfo, since: float, resolved_at: float,
                      usd: float) -> list[Finding]:  # fmt: skip
        """The fire and the resolution of an episode found only now to have been one in time order (its
        usage or a stop read late): from ``since``, fired ``for`` into it with the dollars of ``for`` (gaps
        aside), resolved by the breaking sample at ``resolved_at`` with ``usd``."""
        p, price = self.params, res.usd_per_hour
        fired_at = since + p.for_
        at_fire = min(usd, usd_over(price, p.for_)) if price is not None else 0.0
        found = []
        for action, when, dollars, extra in (("fire", fired_at, at_fire, {}),
                                             ("resolve", resolved_at, usd, {"reason": self.break_reason})):  # fmt: skip
            details, who = self._facts(st, res, when - since, extra)
            found.append(make_finding(self, action, who, episode_start=since, fired_at=fired_at, at=when, usd=dollars,
                                      details=details))  # fmt: skip
        return found

    def _withdrawal(self, st: GpuEpisodeState, res: ResourceInfo, ended: Ended, t: float) -> Finding:
        """The resolution that takes back the resolved episode ``ended``: a stop at ``t`` came within it."""
        since, fired_at = ended[0], ended[1]
        at = max(t, since)
        details, who = self._facts(st, res, at - since, {"reason": WITHDRAWN})
        return make_finding(self, "resolve", who, episode_start=since, fired_at=fired_at, at=at, usd=0.0, details=details,
                            usd_per_hour=0.0)  # fmt: skip

    def _finding(self, action: str, st: GpuEpisodeState, res: ResourceInfo, at: float, **extra: object) -> Finding:
        assert st.since is not None and st.fired_at is not None
        details, res = self._facts(st, res, max(at, st.covered_until) - st.since, extra)
        return make_finding(self, action, res, episode_start=st.since, fired_at=st.fired_at, at=at,
                            usd=st.waste_usd, details=details)  # fmt: skip

    def _facts(self, st: GpuEpisodeState, res: ResourceInfo, episode_s: float,
               extra: dict[str, Any]) -> tuple[dict[str, Any], ResourceInfo]:  # fmt: skip
        """What a finding ``episode_s`` into its episode says of the host as its samples left it (its GPUs,
        free ones, pods), with ``extra``, and the resource with the owner those pods name."""
        details = {"gpu_count": len(st.gpus), "gpu_model": st.model, "episode_s": round(episode_s, 3), **self.describe(st),
                   **extra}  # fmt: skip
        if st.allocated:
            by_gpu: dict[str, list[bool]] = {}
            for unit, held in st.allocated.items():
                by_gpu.setdefault(unit.partition("/")[0], []).append(held)
            free = sum(1 for helds in by_gpu.values() if not any(helds))
            if free:
                details["gpus_unallocated"] = free
        if st.pods:
            pods: dict[int, list[Pod]] = {}
            for unit, pod in st.pods.items():
                pods.setdefault(int(unit.partition("/")[0]), []).append(pod)
            details.update(listing(pods, commands=self.pod_commands))
            res = with_owner(res, [pod for ps in pods.values() for pod in ps])
        return details, res


_Split = tuple[tuple[float, float, float, float], tuple[float, ...] | None]
"""What a stop in a gap leaves (:meth:`GpuEpisode._split_at_gap`): the candidate after it, and its gaps."""
MAX_GAPS = 4
"""Gaps kept at most: a host's stops come minutes apart at the least, and usage is read behind by minutes."""


def _gaps_after(gaps: tuple[float, ...], t: float) -> tuple[float, ...] | None:
    """The gaps kept that end after ``t`` (a usage event's time: none before it can hold a stop read later).
    (Apart from :meth:`GpuEpisode._on_usage`, which runs for every usage event: its comprehensions would
    cost it cells at every call.)"""
    return tuple(x for k in range(0, len(gaps), GAP) if t < gaps[k + 1] for x in gaps[k : k + GAP]) or None


def _gaps_priced(gaps: tuple[float, ...], price: float) -> tuple[float, ...]:
    """The gaps kept, what they counted unpriced priced at ``price`` (the host's price known at last)."""
    return tuple(x for k in range(0, len(gaps), GAP) for x in (
        gaps[k], gaps[k + 1], gaps[k + 2] + usd_over(price, gaps[k + 3]), 0.0,
        gaps[k + 4] + usd_over(price, gaps[k + 5]), 0.0))  # fmt: skip


def _keep_gap(st: GpuEpisodeState, gap: tuple[float, float, float, float, float, float]) -> None:
    """Keep ``gap`` (:attr:`GpuEpisodeState.resumed`), the latest; past :data:`MAX_GAPS`, the shortest goes (a
    missed scrape, or a one-minute scrape half a second late, does not push out a restart's), of equal ones
    the newest (usage is read in order: a stop in an older gap is read first)."""
    gaps = [*(st.resumed[k : k + GAP] for k in range(0, len(st.resumed), GAP))] if st.resumed else []
    gaps.append(gap)
    if len(gaps) > MAX_GAPS:
        del gaps[min(range(len(gaps)), key=lambda k: (gaps[k][1] - gaps[k][0], -k))]
    st.resumed = tuple(x for g in gaps for x in g)


def _note_pod(st: GpuEpisodeState, unit: str, pod: Pod | None, allocated: bool | None) -> None:
    """Keep the pod and allocation a unit's latest sample says (bounded: a unit past
    :data:`~detector.detectors.pods.MAX_UNITS` is not kept)."""
    if st.pods is None:
        st.pods = {}
    if st.allocated is None:
        st.allocated = {}
    if pod is None:
        st.pods.pop(unit, None)
    elif unit in st.pods or len(st.pods) < MAX_UNITS:
        st.pods[unit] = pod
    if allocated is None:
        st.allocated.pop(unit, None)
    elif unit in st.allocated or len(st.allocated) < MAX_UNITS:
        st.allocated[unit] = allocated
