"""What the per-GPU detectors share: episodes of *some* GPUs of a host wasting their share of
its price while other GPUs of it work.

``idle_gpu`` sees a host: one busy GPU clears it. These detectors see each GPU: a host of
eight with one GPU busy and six idle wastes six eighths of its price. A subclass says which
GPUs it counts (:meth:`GpuShare.counts`: held by a pod or unknown, for ``partly_idle_gpu``;
held by none, for ``unallocated_gpu``); this class does the rest the same way for both:

- **Per GPU.** GPUs are tracked by :attr:`~detector.events.GpuMetric.unit` (a MIG instance is
  a unit of its GPU): a GPU is busy if any of its instances' latest sample is busy
  (:func:`detector.detectors.activity.busy`), idle if all are idle. A GPU counts once it has
  been idle for ``for`` (its idle run starts at its first idle sample after its last busy
  one); it then leaves the episode's set at its first busy sample (an ``update``, or the
  ``resolve`` when none is left).
- **Never the same hours as ``idle_gpu``.** A spell with every GPU of the host idle is
  ``idle_gpu``'s once it lasts ``for`` (same threshold and ``for`` by default): its episode
  starts where the spell does. So time in such a spell is held apart: a spell that ends
  sooner (a dip between epochs, which ``idle_gpu`` never alerts on) is counted here when it
  ends; one that lasts ``for`` is dropped, and an open episode hands over then (resolves,
  ``reason: whole_host_idle``, dated when the spell began). Each idle second is thus
  counted by one of the two rules, never both. After a spell that was ``idle_gpu``'s, the
  GPUs' counts start again when a GPU works (the staggered start of a resumed job is not
  part of a host idle). Idle time a GPU spends before it counts is priced too, once it
  counts.
- **Priced as a share.** ``idle GPUs / GPUs of the host`` (physical GPUs: those its instance
  type has by ``rules/pricing.yaml``, or those reporting if more) of the host's price
  (:attr:`~detector.detectors.base.ResourceInfo.usd_per_hour`), over time that samples
  cover only; time seen before the price is known is priced once it is.
- **Allocation is evidence too.** A sample that cannot say who holds its GPU (``allocated``
  None, e.g. the bridge's two sources a scrape apart) keeps the last known holder for up to
  ``stale_after``; unknown for longer is unknown.
- **Evidence, not silence.** A GPU counts only while its samples are fresh: a gap longer than
  ``stale_after`` (of the host, or of that GPU) is not idle time, and restarts the count of a
  GPU not yet counting. A GPU silent for an hour is forgotten; its next sample starts it afresh.
- **Event time only.** A sample at or before the latest of its unit (a re-read batch, a
  duplicate) changes nothing; a late one updates its unit without recounting the past.
  Findings are dated by sample times.
- **Billed only.** It fires only while the host's latest usage says ``running``; a stop
  resolves it (``reason: instance_stopped``) and every GPU's count starts again. Scrapes past the
  stop read before it (the usage topic read behind) count nothing: the dollars go back to those of
  the latest scrape not after it, and a stop before the scrape that fired the episode withdraws it
  (``reason: withdrawn``, no dollars: :func:`~detector.detectors.episode.withdraws`).
- **Bounded.** At most :data:`MAX_UNITS` units per host (the least recently seen gives way).
"""

from __future__ import annotations

import builtins
import math
from array import array
from collections.abc import Callable
from functools import partial
from itertools import compress
from math import isnan
from operator import or_
from typing import Any, ClassVar

import msgspec
from msgspec.structs import replace
from pydantic import Field

from detector.detectors.base import (
    SPELL_S,
    Behaviour,
    Context,
    DetectorBase,
    Finding,
    Params,
    ResourceInfo,
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
    after_gap,
    end,
    ended_of,
    fire,
    gap_at,
    take_back_ended,
    withdraws,
)
from detector.detectors.gpu_share_state import (
    BUSY_BIT,
    BUSY_CODES,
    GPU_SEEN,
    HOLDER,
    HOLDER_BITS,
    HOLDER_CODE,
    IDLE_SINCE,
    MAX_GAPS,
    PENDING_FROM,
    PENDING_S,
    PER_GPU,
    UNSET,
    Gap,
    GpuShareState,
    UnbilledCandidate,
    UnbilledEnded,
    is_set,
    place,
    set_counted,
    shared_flags,
)
from detector.detectors.pods import MAX_UNITS, Pod, listing, pod_facts, with_owner
from detector.detectors.scrape import KEYS, UNIT_KEYS, Scrape
from detector.events import Event, GpuMetric, UsageEvent
from detector.floats import floats
from detector.pricing import usd_over
from detector.units import Duration, Percent

__all__ = ["MAX_UNITS", "GpuShare", "GpuShareParams", "GpuShareState", "gpu_names"]

FORGET_S = 3600.0
"""A unit with no sample for this long (while the host's others report) is gone."""
_ALONE = {key: (key,) for key in KEYS}
"""A whole GPU's units (itself alone), one tuple shared by every host's GPU of that index."""
BUSY, HELD, UNKNOWN, FREE = 3, 2, 1, 0
"""A fresh GPU at one instant, ordered so that the max over its units is the GPU's: busy if any
instance is; else held if a pod holds any, unknown if any says nothing, free if none is held."""
_CODE = {True: HELD, None: UNKNOWN, False: FREE}
_STATE = (UNKNOWN, BUSY, HELD, BUSY, FREE, BUSY)
"""A fresh unit's state at one instant by its code (:attr:`GpuShareState.unit_codes`)."""


def gpu_names(gpus: list[int], limit: int = 6) -> str:
    """``[0, 1, 2, 3, 5, 7]`` as ``"0–3, 5, 7"``: runs as ranges, at most ``limit`` parts, so
    253 idle GPUs of 256 read "3–255" in the message as on its chart."""
    runs: list[list[int]] = []
    for g in sorted(gpus):
        if runs and g == runs[-1][1] + 1:
            runs[-1][1] = g
        else:
            runs.append([g, g])
    parts = [str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}–{b}" for a, b in runs]
    return ", ".join(parts[:limit]) + (", …" if len(parts) > limit else "")


class GpuShareParams(Params):
    util_below: Percent = 5.0
    """A GPU is busy at or above this ``util_pct`` (or any activity ratio × 100): keep it equal
    to ``idle_gpu``'s, so the two split a host's hours exactly."""
    for_: Duration = Field(default=1800.0, alias="for", gt=0)
    """How long a GPU must be idle before it counts, and how long a whole-host idle spell lasts
    before ``idle_gpu`` takes the host over."""
    min_gpus: int = Field(default=1, ge=1)
    """Fire only with at least this many GPUs counted at once."""
    stale_after: Duration = Field(default=300.0, gt=0)
    """A gap in GPU telemetry longer than this is missing data, not idle time."""
    update_every: Duration = Field(default=900.0, gt=0)
    """How often an open episode reports its growing dollars (event time)."""


class _Status(msgspec.Struct):
    """A GPU at one instant, from its units' latest samples."""

    fresh: bool = False
    busy: bool = False
    allocated: bool | None = None
    pods: list[Pod] = []


class GpuShare(DetectorBase):
    """Base of the per-GPU share detectors (see the module docstring)."""

    type: ClassVar[str]
    title: ClassVar[str]
    suggestion: ClassVar[str]
    Params: ClassVar[builtins.type[GpuShareParams]]
    State: ClassVar[builtins.type[GpuShareState]] = GpuShareState
    consumes: ClassVar[tuple[builtins.type, ...]] = (GpuMetric, UsageEvent)
    behaviour: ClassVar[bool] = True
    noun: ClassVar[str] = "idle"
    """What the counted GPUs are, in the facts ("6 of 8 idle")."""
    codes: ClassVar[frozenset[int]]
    """The idle GPUs this detector counts: :data:`HELD`, :data:`UNKNOWN`, :data:`FREE`."""

    def starts(self, ctx: Context, event: Event) -> bool:
        """A host's state starts with a sample this detector may count (for ``unallocated_gpu``, one
        that says who holds its GPU: never off Kubernetes), or a stop (samples before it are history)."""
        if type(event) is GpuMetric:
            return event.allocated is not None or UNKNOWN in self.codes
        return type(event) is UsageEvent and not ctx.resource.billed

    def starts_scrape(self, ctx: Context, scrape: Scrape) -> bool:
        return UNKNOWN in self.codes or not scrape.holders_unknown

    def counts(self, allocated: bool | None) -> bool:
        """Whether an idle GPU with this allocation is this detector's."""
        return _CODE[allocated] in self.codes

    def tracking(self, state: GpuShareState, t: float) -> Behaviour:
        """Part of the host idle while the rest works: an unusual level, not a pause; tracked from a
        GPU's first idle sample (being counted towards ``for``) once it has lasted :data:`SPELL_S`, to
        the GPU's latest sample, as ``idle_gpu`` tracks a host, so the anomaly model leaves the rule
        the first word on it: what the samples say of ``t``, not of a usage event's reading."""
        times = state.gpu_times
        if times is None:
            return Behaviour.NONE
        end = PER_GPU * len(state.gpu_ids)
        if state.since is None and all(map(isnan, times[IDLE_SINCE:end:PER_GPU])):
            return Behaviour.NONE  # (most hosts: every GPU busy)
        seen = times[GPU_SEEN:end:PER_GPU]
        if state.since is not None and state.since + SPELL_S <= t <= max(seen, default=state.since):
            return Behaviour.LEVEL
        for at in range(0, end, PER_GPU):
            if times[at + IDLE_SINCE] + SPELL_S <= t <= times[at + GPU_SEEN]:  # (False where unset: NaN)
                return Behaviour.LEVEL
        return Behaviour.NONE

    @classmethod
    def facts(cls, details: dict[str, Any]) -> list[tuple[str, str]]:
        ids = details.get("gpus_idle") or []
        if not ids:
            return []
        model = f" × {details['gpu_model']}" if details.get("gpu_model") else ""
        label = f"{cls.noun.capitalize()} GPUs"
        named = gpu_names([i for i in ids if isinstance(i, int)])
        return [(label, f"{len(ids)} of {details.get('gpu_count', '?')}{model} (GPU {named})"), *pod_facts(details)]

    # -- events -------------------------------------------------------------

    def step(self, state: GpuShareState, ctx: Context, event: Event, t: float) -> list[Finding]:
        if type(event) is UsageEvent:
            return self._on_usage(state, ctx.resource, t)
        if type(event) is not GpuMetric:
            return []
        return [f for _, f in self.step_scrape(state, ctx, Scrape([event]), t)]

    def step_scrape(self, state: GpuShareState, ctx: Context, scrape: Scrape,
                    t: float) -> list[tuple[int, Finding]]:  # fmt: skip
        """:meth:`step` for each sample of a scrape (samples of the host at ``t``), in one call: this
        runs for every scrape of every host (the columns are read by place here, not through the
        state's methods). Findings come with the index of the sample that made them.

        A scrape later than every sample before first moves the clock to ``t`` (:meth:`_advance`,
        whose findings are the first sample's: no sample of ``t`` is kept before it), then keeps its
        samples: the usual scrape (:meth:`_usual`) by GPU, each of the others by its unit."""
        st, res = state, ctx.resource
        if t <= st.stopped_at or not scrape.samples:
            return []
        unknown_ours = UNKNOWN in self.codes
        if not st.unit_keys and not unknown_ours and scrape.holders_unknown:
            return []  # unallocated_gpu on a host that never said who holds its GPUs (not Kubernetes)
        p = self.params
        busy_flags = scrape.busy(p.util_below)
        if t > st.covered_until:
            found = self._advance(st, res, t)
            out = [(0, f) for f in found] if found else []
            if self._usual(st, scrape):
                self._keep_usual(st, scrape, busy_flags, t)
                return out
        else:
            out = []  # a late scrape, or samples of the latest one read again
        stale_after = p.stale_after
        for ev, is_busy, key, pod in zip(scrape.samples, busy_flags, scrape.units(), scrape.pods(), strict=True):
            keys = st.unit_keys
            if ev.allocated is None and not keys and not unknown_ours:
                continue  # unallocated_gpu on a host that never said who holds its GPUs (not Kubernetes)
            gpu = ev.gpu_index
            j = gpu if gpu < len(keys) and keys[gpu] == key else place(keys, key)
            known = j >= 0
            was_holder: bool | None = None
            was_pod: Pod | None = None
            was_allocated_at = 0.0
            if known:
                column: Any = st.gpu_times
                units_at = PER_GPU * len(st.gpu_ids)  # where the units' latest samples start (after the GPUs' times)
                if t <= column[units_at + j]:
                    continue  # a re-read or duplicate sample
                # What its latest sample said.
                was_holder = HOLDER[st.unit_codes[j] >> 1]  # type: ignore[index]
                if was_holder is not None and ev.allocated is None:  # (only read where it is needed, below)
                    try:  # its allocation time (this runs for every sample: no method call)
                        was_allocated_at = column[units_at + len(keys) + j]
                    except IndexError:
                        pass  # none held yet: 0.0
                if st.unit_pods is not None:
                    was_pod = st.unit_pods[j]
            ids = st.gpu_ids
            g = gpu if gpu < len(ids) and ids[gpu] == gpu else place(ids, gpu)
            if g < 0:
                g, gpu_seen = st.add_gpu(gpu), 0.0
                units_at = PER_GPU * len(st.gpu_ids)
            else:
                gpu_seen = st.gpu_times[PER_GPU * g]  # type: ignore[index]  # (kept below: nothing between moves it)
                if st.gaps is not None and gpu_seen <= st.gaps[-1].before:
                    _note_back(st, gpu, gpu_seen, t)  # back after the gap's first scrape
                if t - gpu_seen > stale_after:
                    _dark_until(st, g, gpu, gpu_seen, t, p.for_)
            allocated = ev.allocated
            if allocated is None and known and was_holder is not None and t - was_allocated_at <= stale_after:
                # The bridge could not tell for this scrape (dcgm-exporter and kube-state-metrics a
                # scrape apart while a pod starts elsewhere): not news, the last known holder stands.
                allocated = was_holder
            if not known:
                if len(st.unit_keys) >= MAX_UNITS:
                    g = self._forget_for(st, g, gpu)
                j = st.add_unit(key, gpu, t, allocated, pod)
                units_at = PER_GPU * len(st.gpu_ids)
                units = st.gpu_units[g]
                st.set_gpu_units(g, (*units, key) if units else _ALONE.get(key) or (key,))
            elif ((was_holder is not allocated and self.counts(was_holder) != self.counts(allocated))
                  or ((was_pod is not None or pod is not None) and _who(was_pod) != _who(pod))):  # fmt: skip
                # Another pod, or a GPU taken or released: a new idle run (a pod starting up is not idle waste).
                if st.gpu_counted[g]:
                    set_counted(st, g, 0)
                    st.left = "allocation_changed"
                _restart_run(st, g)
            column = st.gpu_times
            at = units_at + j
            column[at] = t
            st.unit_codes[j] = (0 if allocated is None else 2 if allocated else 4) | is_busy  # type: ignore[index]  # HOLDER_CODE; bit 0: busy
            pods = st.unit_pods
            if pods is not None:
                pods[j] = pod
            elif pod is not None:  # the host's first pod
                pods = st.unit_pods = [None] * len(st.unit_keys)
                pods[j] = pod
            if ev.allocated is not None:
                try:
                    column[at + len(st.unit_keys)] = t
                except IndexError:
                    st.set_allocated_at(j, t)  # the host's first: the allocation times start
            if ev.model != st.model and ev.model:  # (the same model, the usual case, in one comparison)
                st.model = intern(ev.model)
            times: Any = st.gpu_times
            at = PER_GPU * g
            if t > gpu_seen:
                times[at] = t
            idle_since = times[at + IDLE_SINCE]
            if is_busy:
                pending_from = times[at + PENDING_FROM]
                if idle_since == idle_since or pending_from == pending_from:  # either set (not NaN)
                    _restart_run(st, g)
            elif idle_since != idle_since and (len(st.gpu_units[g]) == 1 or not self._status(st, gpu, t).busy):
                times[at + IDLE_SINCE] = t
        return out

    @staticmethod
    def _usual(st: GpuShareState, scrape: Scrape) -> bool:
        """Whether the scrape is the usual one of a host tracked as usual: one sample of each GPU
        ``0 .. n-1`` in order, whole GPUs (no MIG), one model, the host's units those GPUs, each at
        its index; and either nobody said to hold any (no pod, no ``allocated``) in the scrape or
        before, or, on Kubernetes, every sample says who holds its GPU, as the unit's latest did
        (``allocated``, whose times are kept), and names the pod its latest named: no holder moves, no
        idle run starts again for it. O(1) in Python (the comparisons of tuples and bytes run in C)."""
        gpus = scrape.gpus
        if scrape.model is None or scrape.mig or st.gpu_ids != gpus or st.unit_keys != UNIT_KEYS[len(gpus)]:
            return False
        codes, pods = st.unit_codes, st.unit_pods
        if scrape.plain:
            return pods is None and max(codes or b"\0") <= BUSY_BIT
        return (codes is not None and None not in scrape.allocations() and codes.translate(HOLDER_BITS) == _holders(scrape)
                and len(st.gpu_times or ()) == (PER_GPU + 2) * len(gpus)  # (the units' allocation times are kept)
                and (scrape.pods() == tuple(pods) if pods is not None else not scrape.pods_named))  # fmt: skip

    def _keep_usual(self, st: GpuShareState, scrape: Scrape, busy: tuple[bool, ...], t: float) -> None:
        """Keep the usual scrape (:meth:`_usual`), later than every sample before: what the loop over
        units in :meth:`step_scrape` does for it, where unit, GPU and sample share a place and no
        holder or pod moves. Every GPU's and unit's latest sample and every unit's code
        are written at once, as columns; a GPU's idle run is its own."""
        stale_after, n = self.params.stale_after, len(busy)
        times: Any = st.gpu_times
        assert times is not None and st.unit_codes is not None
        seen = times[GPU_SEEN : PER_GPU * n : PER_GPU]  # each GPU's latest sample
        if st.gaps is not None and min(seen) <= st.gaps[-1].before:  # back after the gap's first scrape
            for g in range(n):
                if seen[g] <= st.gaps[-1].before:
                    _note_back(st, g, seen[g], t)
        if t - min(seen) > stale_after:  # (the largest gap: t - x only falls as x grows)
            for g in range(n):
                if t - seen[g] > stale_after:
                    _dark_until(st, g, g, seen[g], t, self.params.for_)
        now = array("d", (t,)) * n
        # the GPUs' and their units' latest sample
        times[GPU_SEEN : PER_GPU * n : PER_GPU] = times[PER_GPU * n : PER_GPU * n + n] = now
        if scrape.plain:
            st.unit_codes[:] = busy  # held by: unknown (bits 1-2 at 0), busy or not (bit 0)
        else:  # every sample said who holds its GPU (as before): when, and who with busy or not
            times[PER_GPU * n + n :] = now
            st.unit_codes[:] = bytes(map(or_, _holders(scrape), busy))
        # Most scrapes move no idle run: every idle GPU's is under way, and no busy GPU has one (nor time
        # pending). Seen in C (NaN: unset); otherwise GPU by GPU.
        unset = tuple(map(isnan, times[IDLE_SINCE : PER_GPU * n : PER_GPU]))
        if unset != busy or not all(map(isnan, compress(times[PENDING_FROM : PER_GPU * n : PER_GPU], busy))):
            self._keep_runs(st, busy, t)
        if scrape.model and scrape.model != st.model:
            st.model = intern(scrape.model)

    @staticmethod
    def _keep_runs(st: GpuShareState, busy: tuple[bool, ...], t: float) -> None:
        """GPU ``g`` is sample ``g`` of the usual scrape, at ``t``: its idle run starts at an idle sample,
        and ends (with the time pending before it counts) at a busy one."""
        times: Any = st.gpu_times
        for g, is_busy in enumerate(busy):
            at = PER_GPU * g
            idle_since = times[at + IDLE_SINCE]
            if is_busy:
                pending_from = times[at + PENDING_FROM]
                if idle_since == idle_since or pending_from == pending_from:  # either set (not NaN)
                    _restart_run(st, g)
            elif idle_since != idle_since:  # unset (NaN): its idle run starts
                times[at + IDLE_SINCE] = t

    def _forget_for(self, st: GpuShareState, g: int, gpu: int) -> int:
        """Make room for a new unit of GPU ``gpu`` (at place ``g``): forget the least recently seen
        unit. Returns the GPU's place after; a GPU left with no unit is tracked again, last, with
        what it had (its idle run)."""
        times, units_at = st.gpu_times, PER_GPU * len(st.gpu_ids)
        assert times is not None
        kept = times[PER_GPU * g : PER_GPU * g + PER_GPU], st.gpu_counted[g]
        self._forget(st, st.unit_keys[min(range(len(st.unit_keys)), key=lambda k: times[units_at + k])])
        g = st.gpu(gpu)
        if g < 0:
            g = st.add_gpu(gpu)
            st.gpu_times[PER_GPU * g : PER_GPU * g + PER_GPU] = kept[0]  # type: ignore[index]
            set_counted(st, g, kept[1])
        return g

    def open_episode(self, state: GpuShareState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return self._finding("update", state, resource, state.covered_until)

    def _on_usage(self, st: GpuShareState, res: ResourceInfo, t: float) -> list[Finding]:
        found: list[Finding] = []
        if st.ended is not None:
            st.ended, taken = take_back_ended(st.ended, t, not res.billed)
            if taken is not None:  # stopped within the episode a scrape resolved since: it never fired, or it
                found += self._taken_back(st, res, taken, t)  # ended at the stop
        if isinstance(st.unbilled, UnbilledEnded):
            found += self._billed_late(st, res, t, st.unbilled)
        if not res.billed:
            since = st.since
            held = _gap_holding(st, t)
            undone = held is not None and held.rebase_at == st.rebase_at and st.rebase_at - held.after < self.params.for_
            if undone:
                st.rebase_at = t  # (the spell that set it spanned the stop's gap: in time order cut there, short of ``for``)
            if since is not None:
                if t < since:
                    return found  # a stop from before the episode began (read behind, or sent again): not its end
                reason = f"instance_{res.state}"
                if withdraws(since, st.fired_by, t):  # (fired_by: None unless it fired)
                    reason, st.waste_usd, st.unpriced_s = WITHDRAWN, 0.0, 0.0  # stopped before the scrape that fired it
                elif st.fired_at is not None:
                    if held is not None and not held.past:
                        self._back_to_gap(st, res, held)
                    else:
                        self._uncount_after(st, res, t)
                later = _gaps_from(st, t)
                found += end(st, partial(self._finding, "resolve", st, res, max(t, since), reason=reason))
                _set_gaps(st, later)  # (they may hold a later stop, read later still)
                _let_go_running(st)  # (the candidate stopped before usage said billed: it never fired)
            if t > st.stopped_at:
                st.stopped_at = t
            times = st.gpu_times
            for g in range(len(st.gpu_ids)):  # a GPU idle since after the stop (its samples read first) runs on
                if times is None or not times[PER_GPU * g + IDLE_SINCE] > t:  # (unset: NaN)
                    back = None if held is None or times is None or not is_set(times[PER_GPU * g + IDLE_SINCE]) else \
                        _back_at(held, st.gpu_ids[g], times[PER_GPU * g + GPU_SEEN])  # fmt: skip
                    if back is not None:
                        self._idle_from(st, res, g, back)  # idle across the gap that held the stop: from its return
                    else:
                        _restart(st, g)  # (or not back yet: from its first sample, as in time order)
                elif held is not None and (st.gpu_counted[g] or undone):  # idle since after the stop, it joined
                    # the ended episode, or pended from the rebase undone: from its own start
                    self._idle_from(st, res, g, times[PER_GPU * g + IDLE_SINCE])
            if held is not None and st.fired_at is None and st.fired_by is None:
                st.fired_by = _RESTARTED  # (the GPUs idle across the gap restart in the past: the next judge may fire late)
            if st.whole_idle_since is None or st.whole_idle_since <= t:
                # (A spell across the gap that held the stop, on since: the host all idle from the gap's end.)
                across = held is not None and st.whole_idle_since is not None
                st.whole_idle_since, st.spell_s = held.after if held is not None and across else None, 0.0
            return found
        running = st.unbilled
        if isinstance(running, UnbilledCandidate) and running.scrape is not None and not running.billed_before:
            # The candidate waiting for the host's billing: billed before the scrape that would have fired it
            # (time order fired it there), or from it on (fired at a scrape after, in time order too).
            if t < running.scrape:
                st.unbilled = replace(running, billed_before=True)
            else:  # (samples past it read first, live: time order judged the host at its date, the scrape before)
                billed_at = t if st.covered_until > t else None
                st.unbilled = UnbilledCandidate(running.fired_at, billed_at=billed_at, dips=running.dips)
        if st.gaps is not None and t >= st.gaps[0].after:  # usage is read in order: no stop read later falls in a gap
            _forget_gaps_before(st, t)  # before t
        if st.unpriced_s and res.usd_per_hour is not None:
            st.waste_usd += usd_over(res.usd_per_hour, st.unpriced_s)
            st.unpriced_s = 0.0
        return found

    # -- the clock ----------------------------------------------------------

    def _advance(self, st: GpuShareState, res: ResourceInfo, t: float) -> list[Finding]:
        """Time moves from the newest sample ``c`` to ``t``: judge the host as the samples up to
        ``c`` left it (a whole scrape), make the findings dated ``c``, then count ``(c, t]``."""
        c, st.covered_until = st.covered_until, t
        if c <= st.stopped_at or c <= 0.0:
            return []  # the scrape at c came before a stop read since: history, not the host's state now
        p = self.params
        reason, st.left = st.left, ""
        # Each fresh GPU's state at c, from its units' latest samples, in one pass (every scrape).
        state: dict[int, int] = {}
        stale, gone = p.stale_after, []
        column, units_at = st.gpu_times, PER_GPU * len(st.gpu_ids)
        seen = column[units_at : units_at + len(st.unit_keys)] if column is not None else ()
        codes_now = st.unit_codes or b""
        if (st.since is None and st.whole_idle_since is None and codes_now
                and not codes_now.translate(None, BUSY_CODES) and c - min(seen) <= stale):  # fmt: skip
            return []  # every unit fresh and busy, no episode nor idle spell: nothing to judge (most scrapes)
        if seen and c - min(seen) <= stale and st.unit_gpus == st.gpu_ids:
            # Every unit fresh (the largest age is c - the oldest's), and one unit a GPU: a GPU's state is its unit's.
            state = dict(zip(st.gpu_ids, map(_STATE.__getitem__, codes_now), strict=True))
        else:
            for key, gpu, unit_seen, unit_code in zip(st.unit_keys, st.unit_gpus, seen, codes_now, strict=True):
                age = c - unit_seen
                if age > stale:
                    if age > FORGET_S:
                        gone.append(key)
                    continue
                code = _STATE[unit_code]
                if code > state.get(gpu, -1):
                    state[gpu] = code
        for key in gone:
            g = st.gpu(st.unit_gpus[st.unit_keys.index(key)])
            if g >= 0 and st.gpu_counted[g] and len(st.gpu_units[g]) == 1:
                reason = "gpu_gone"
            self._forget(st, key)
        any_busy = BUSY in state.values()
        codes = self.codes
        if st.since is None and codes.isdisjoint(state.values()):
            self._spell(st, res, c, any_busy)  # no GPU of ours idle, no episode: only the host's spells
            if st.whole_idle_since is not None and t - c > STOP_GAP_S:
                _keep_gap(st, c, t)  # (a spell across a stop restarts at the gap's end)
            return []
        spell_from = st.whole_idle_since  # (a spell that c ends: no GPU was counted in it, so time order fires at c)
        self._spell(st, res, c, any_busy)
        changed = bool(reason)
        ids = st.gpu_ids
        times: Any = st.gpu_times  # None only with no GPU tracked (then no loop below reads them)
        counted = st.gpu_counted  # (bytes: replaced, not changed, by set_counted)
        if 1 in counted:
            for g, gpu in enumerate(ids):
                now = state.get(gpu)
                if counted[g] and now is not None and now not in codes:
                    counted, changed = set_counted(st, g, 0), True
                    reason = "gpu_busy" if now == BUSY else "allocation_changed"
        found: list[Finding] = []
        if any_busy:
            for g, gpu in enumerate(ids):
                if counted[g] or state.get(gpu, BUSY) not in codes:
                    continue
                at = PER_GPU * g
                idle_since = times[at + IDLE_SINCE]
                if idle_since == idle_since and c - max(idle_since, st.rebase_at) >= p.for_:  # set (not NaN), long enough
                    counted, changed = set_counted(st, g, 1), True
                    self._charge(st, res, times[at + PENDING_S])
                    pending_from = times[at + PENDING_FROM]
                    start = pending_from if pending_from == pending_from else c  # set: not NaN
                    if st.fired_at is None:
                        st.since = start if st.since is None else min(st.since, start)
                    times[at + PENDING_S], times[at + PENDING_FROM] = 0.0, UNSET
        elif st.whole_idle_since is not None:
            if c - st.whole_idle_since >= p.for_ and 1 in counted:
                spell, st.spell_s, st.gpu_counted = st.whole_idle_since, 0.0, shared_flags(bytes(len(ids)))
                _keep_unbilled(st, max(spell, st.since or spell), whole_host=True)
                return _resolve(st, None, partial(self._finding, "resolve", st, res, max(spell, st.since or spell),
                                            reason="whole_host_idle"))  # fmt: skip
        listed = st.counted()
        if not listed:
            if st.since is not None:
                log = st.charged  # (the scrape before c: the last that judged the GPUs idle)
                _keep_unbilled(st, c, whole_host=False)
                found = _resolve(st, log[-6] if log is not None and len(log) >= 6 else None,
                                 partial(self._finding, "resolve", st, res, c, reason=reason or "gpu_busy"))
        elif st.fired_at is None:
            if any_busy and len(listed) >= p.min_gpus and st.since is not None:
                fired_at = min(c, max(st.since, self._qualified(st, listed, c) + p.for_))
                if res.billed:
                    # Billed before the scrape that would have fired it (read since, usage dated before): time order
                    # fired it there, dated as then (GPUs may have left since), with what that scrape counted.
                    kept = _billed_before(st)
                    if kept is not None:
                        fired_at = kept.fired_at
                    fire(st, since=st.since, fired_at=fired_at, at=c)
                    # Its GPUs restarted in the past by a stop read late (_RESTARTED: NaN): time order fired it
                    # scrapes ago (see _fired), unless no GPU worked from its date to c.
                    restarted = st.fired_by is not None and st.fired_by != st.fired_by
                    step = min(t - c, STOP_GAP_S)  # (scrapes apart: the latest interval, a gap's a minute at most)
                    judged = None  # (time order's scrape that judged it, where made scrapes after)
                    if kept is not None:
                        st.fired_by = kept.scrape
                    elif restarted and c - fired_at > step and (spell_from is None or fired_at < spell_from):
                        judged, st.fired_by = _firing_scrape(st, fired_at, step, p)
                    elif st.fired_by is None or restarted:  # the scrape that judged the host at c: read after a stop
                        st.fired_by = t  # before it, none fires
                    # Billed by usage dated after the scrape that would have fired it, read after samples past it: time
                    # order judged it at that usage (or at its date, if later), fired by the scrape after, or where a
                    # whole-host dip held it (no GPU counts in one), by the scrape that ended the dip (it may be c)
                    running = st.unbilled
                    if isinstance(running, UnbilledCandidate) and running.billed_at is not None:
                        when, late = max(running.billed_at, fired_at), step
                        in_dip = running.dip_holding(when)
                        if in_dip is not None:
                            when, late = in_dip[1], 0.0
                            if kept is None and not restarted:  # (time order fired it by the scrape after the dip's
                                st.fired_by = max(st.fired_by or 0.0, when + step)  # end: a stop before withdraws)
                                if c > when and is_set(in_dip[2]):  # (with what that scrape counted, noted there)
                                    kept = UnbilledCandidate(fired_at, when, in_dip[2], in_dip[3], in_dip[4],
                                                             billed_before=True)  # fmt: skip
                        if c - when > late:
                            judged = max(when, judged or 0.0)
                    _let_go_running(st)
                    found = [self._fired(st, res, self._finding("fire", st, res, fired_at), listed, judged, kept)]
                else:
                    if not res.known and st.fired_by is None:
                        st.fired_by = t  # no usage read yet (its topic read behind): in time order it fires here
                    # (kept if it ends unfired, or fires late: usage read later may say billed) what this scrape
                    # counted, where it is the one time order judged it at (its date falls in the interval c ends, or
                    # in the whole-host dip c ends: no GPU counts in a dip), and the dip it ended, with what it counted
                    scraped = (st.waste_usd, st.unpriced_s, float(max(len(ids), res.gpus)))
                    dip_from = spell_from if spell_from is not None and c - spell_from < p.for_ else None
                    if st.unbilled is None:
                        if c - fired_at < t - c or (dip_from is not None and dip_from <= fired_at):
                            st.unbilled = UnbilledCandidate(fired_at, t, *scraped)
                        else:
                            st.unbilled = UnbilledCandidate(fired_at)
                    if dip_from is not None and isinstance(st.unbilled, UnbilledCandidate):  # (billed in it: fired at c)
                        st.unbilled = st.unbilled.with_dip(dip_from, c, scraped)
                    if _running(st):
                        st.listed = tuple(sorted(listed))  # (what its findings name, if they are made)
        elif any_busy and (changed or c - st.last_report >= p.update_every):
            st.last_report = c
            found = [self._finding("update", st, res, c)]
        gap = t - c
        if gap > STOP_GAP_S:  # (an episode or an idle run is under way, here: a stop in the gap restarts the GPUs from its end)
            _keep_gap(st, c, t)
        if gap <= p.stale_after:
            share_s = gap / max(len(ids), res.gpus)
            n = 0
            for g, gpu in enumerate(ids):
                if state.get(gpu, BUSY) not in codes:
                    continue
                if counted[g]:
                    n += 1
                    continue
                at = PER_GPU * g
                idle_since = times[at + IDLE_SINCE]
                if idle_since == idle_since:  # set: not NaN
                    times[at + PENDING_S] += share_s
                    if times[at + PENDING_FROM] != times[at + PENDING_FROM]:
                        times[at + PENDING_FROM] = c
            if n and any_busy:
                self._charge(st, res, share_s * n)
            elif n:
                st.spell_s += share_s * n
        if gap > STOP_GAP_S:
            _counted_to(st)  # (what judging c and counting the gap added: the episode's, not the next's)
        if st.fired_at is not None:
            _note_charged(st, t, p.stale_after)
        return found

    def _uncount_after(self, st: GpuShareState, res: ResourceInfo, t: float) -> None:
        """Put the open episode's dollars back to those of its latest scrape not after a stop at ``t``
        (:attr:`GpuShareState.charged`), taking back what scrapes past the stop, read before it, counted.
        Only up to ``stale_after`` past the stop, as ``idle_gpu`` does: beyond, a host started again."""
        log = st.charged
        if log is None or not 0.0 < st.covered_until - t <= self.params.stale_after:
            return
        for k in range(len(log) - 3, -1, -3):
            if log[k] <= t:
                st.waste_usd, st.unpriced_s = _priced(res, log[k + 1], log[k + 2])
                return

    @staticmethod
    def _back_to_gap(st: GpuShareState, res: ResourceInfo, gap: Gap) -> None:
        """The open episode's dollars put back to those of the start of ``gap``, which held a stop read after
        the scrapes past it (:func:`_gap_holding`): in time order the stop ended the episode there."""
        st.waste_usd, st.unpriced_s = _priced(res, gap.waste_usd, gap.unpriced_s)

    def _idle_from(self, st: GpuShareState, res: ResourceInfo, g: int, start: float) -> None:
        """GPU ``g``, idle from ``start`` to now after a stop that ended its episode (across the gap that held
        the stop: from its first sample after it; or idle since after the stop, its samples read first): out of the
        episode, idle since ``start``, its share of the host's seconds since then pending (since the rebase, where
        a whole-host spell after ``start`` lasted ``for``: ``idle_gpu``'s), as a GPU that went idle at that scrape
        holds them (:meth:`_advance`); what it counted after the gap went with the episode's dollars, put back to
        the gap's start."""
        times: Any = st.gpu_times
        at = PER_GPU * g
        pending_from = max(start, st.rebase_at)
        pending = max(0.0, st.covered_until - pending_from) / max(len(st.gpu_ids), res.gpus)
        times[at + IDLE_SINCE], times[at + PENDING_S], times[at + PENDING_FROM] = start, pending, pending_from
        set_counted(st, g, 0)

    def _qualified(self, st: GpuShareState, listed: list[int], c: float) -> float:
        """When the ``min_gpus``-th of the counted GPUs ``listed`` went idle (from the rebase at most): the
        episode fires ``for`` after it. (Apart from :meth:`_advance`, which runs every scrape: a closure
        there would cost it cells at every call, :func:`~detector.detectors.base.at_sample`.)"""
        return sorted(_idle_starts(st, listed, c))[self.params.min_gpus - 1]

    def _spell(self, st: GpuShareState, res: ResourceInfo, c: float, any_busy: bool) -> None:
        """Keep the host's whole-idle spells: one starts at the first instant no GPU works, and
        ends when one does. One that lasted ``for`` was ``idle_gpu``'s: counts start again and
        what it held is dropped; a shorter one (a dip) is this rule's after all."""
        since = st.whole_idle_since
        if not any_busy:
            if since is None:
                st.whole_idle_since = c
            return
        if since is None:
            return
        if c - since >= self.params.for_:
            st.rebase_at, st.spell_s = c, 0.0
            times = st.gpu_times
            for g in range(len(st.gpu_ids)):
                times[PER_GPU * g + PENDING_S], times[PER_GPU * g + PENDING_FROM] = 0.0, UNSET  # type: ignore[index]
            if st.gaps is not None:  # (a stop read later in a gap it spanned cut it short: Gap.rebase_at)
                _set_gaps(st, [replace(gap, rebase_at=c) if since <= gap.before else gap for gap in _gaps(st)])
        else:
            self._charge(st, res, st.spell_s)
            st.spell_s = 0.0
            if st.gaps is not None:  # (a fire dated within it, caught up after a stop read late in a gap before)
                _set_gaps(st, [replace(gap, dip=(since, c)) for gap in _gaps(st)])
            if isinstance(st.unbilled, UnbilledCandidate):  # (billed within it, read after: judged at its end)
                st.unbilled = st.unbilled.with_dip(since, c)
        st.whole_idle_since = None

    # -- helpers ------------------------------------------------------------

    def _status(self, st: GpuShareState, gpu: int, at: float) -> _Status:
        """GPU ``gpu`` as its units' latest samples left it at ``at``."""
        out = _Status(pods=[])
        stale, allocations = self.params.stale_after, []
        g = st.gpu(gpu)
        times, unit_codes, units_at = st.gpu_times, st.unit_codes, PER_GPU * len(st.gpu_ids)
        for key in st.gpu_units[g] if g >= 0 else ():
            j = st.unit(key, gpu)
            if at - times[units_at + j] > stale:  # type: ignore[index]
                continue
            out.fresh = True
            out.busy = out.busy or bool(unit_codes[j] & BUSY_BIT)  # type: ignore[index]
            allocations.append(st.holder(j))
            pod = st.pod(j)
            if pod is not None:
                out.pods.append(pod)
        if True in allocations:
            out.allocated = True
        elif allocations and all(a is False for a in allocations):
            out.allocated = False
        return out

    def _charge(self, st: GpuShareState, res: ResourceInfo, host_s: float) -> None:
        if host_s <= 0:
            return
        if res.usd_per_hour is None:
            st.unpriced_s += host_s
        else:
            st.waste_usd += usd_over(res.usd_per_hour, host_s)

    @staticmethod
    def _forget(st: GpuShareState, key: str) -> None:
        j = st.unit_keys.index(key)
        gpu = st.unit_gpus[j]
        st.drop_unit(j)
        g = st.gpu(gpu)
        if g >= 0:
            units = tuple(k for k in st.gpu_units[g] if k != key)
            if units:
                st.set_gpu_units(g, units)
            else:
                st.drop_gpu(g)

    def _taken_back(self, st: GpuShareState, res: ResourceInfo, ended: Ended, t: float) -> list[Finding]:
        """A stop at ``t`` read after the scrape that resolved ``ended``, dated within it: before its fire, it
        withdraws the episode; in one of its gaps after the fire, it corrects the resolution to the stop, its
        dollars those of the gap's start, as in time order (:meth:`_back_to_gap`). Where the stop is in one of
        its gaps, the GPUs idle after that gap were an episode of their own in time order (:meth:`_after_stop`)."""
        k = gap_at(ended, t)
        if t < ended[2]:
            found = [self._withdrawal(st, res, ended, t)]
        else:
            assert k is not None  # (take_back_ended: a stop after the fire takes it back only in a gap)
            since, fired_at, _, was_at, was_usd, _, _ = ended[:ENDED]
            waste, _ = _priced(res, ended[k + 2], ended[k + 3])
            at = max(t, since)
            listed = [g for g in st.listed if g in st.gpu_ids]  # (its latest finding's GPUs)
            details, who, rate = self._facts(st, res, listed, at - since)
            details.update({"reason": f"instance_{res.state}", CORRECTED: True, "was_resolved_at": was_at,
                            "was_usd": round(was_usd, 2)})  # fmt: skip
            found = [make_finding(self, "resolve", who, episode_start=since, fired_at=fired_at, at=at, usd=waste,
                                  details=details, usd_per_hour=rate)]  # fmt: skip
        return found + (self._after_stop(st, res, ended, k) if k is not None else [])

    def _after_stop(self, st: GpuShareState, res: ResourceInfo, ended: Ended, k: int) -> list[Finding]:
        """The GPUs idle after the gap at ``k`` of ``ended``, in which a stop read late fell: in time order the
        stop restarted them, from the gap's end (or a later gap's longer than ``stale_after``), and they made
        an episode of their own where at least ``min_gpus`` of them had been idle ``for`` by the last scrape
        that judged them idle, which the scrape that resolved ``ended`` resolved in turn. Made now, fire and
        resolution, dated as time order did, and kept as the episode resolved last (a stop read later in one
        of its gaps takes it back or corrects it too). Its GPUs are those that resolution named, priced as
        idle from the restart over the time samples cover (:func:`_covered_s`), not by the dollars the
        episode counted after the gap (GPUs that never lasted ``for`` after it, or a candidate's time before
        it, were in those). Its resolution says ``gpu_busy`` (the reason the GPUs left is not kept). None is made
        where a GPU it would name came back from a gap after its end (:func:`_resolve`: taken as back at its
        end, a review found an alert made where time order made none, a GPU back ten minutes late and idle 25
        minutes after)."""
        since, _, _, was_at, _, _, held_until = ended[:ENDED]
        gaps, p = ended[ENDED:], self.params
        listed = [g for g in st.listed if g in st.gpu_ids]
        start, _, _, j = after_gap(gaps, k - ENDED, p.stale_after, p.for_)
        if held_until <= since or held_until - start < p.for_ or len(listed) < p.min_gpus:
            return []  # (held_until at since: a whole-host spell's hand-over, see _resolve)
        share = _share_of(st, res, listed)
        later = gaps[j:]
        counted = partial(_share_priced, res, share, later, start, stale_after=p.stale_after)
        usd, unpriced = counted(was_at)
        its_gaps: list[float] = []  # (the gaps after its start, their dollars its own)
        for i in range(0, len(later), GAP):
            its_gaps += (later[i], later[i + 1], *counted(later[i]), *counted(later[i + 1]))
        fired_at = start + p.for_
        st.ended = ended_of(start, fired_at, fired_at, was_at, usd, unpriced, held_until, tuple(its_gaps) or None)
        return self._past_episode(st, res, start, fired_at, was_at, usd)

    def _fired(self, st: GpuShareState, res: ResourceInfo, fired: Finding, listed: list[int],
               judged: float | None, billed_before: UnbilledCandidate | None = None) -> Finding:  # fmt: skip
        """``fired``, the fire of the open episode of the GPUs ``listed``. The gaps kept after its start that a stop
        marked past the episode it ended (read late: the GPUs restarted from their return after its gap) are
        this episode's now, with its dollars at each, its GPUs idle from its start over the time samples cover
        (:func:`_share_priced`, as :meth:`_after_stop` prices): a second stop read late in one corrects or takes
        it back there, as time order ended it (:meth:`_back_to_gap`, :meth:`_taken_back`), not with every dollar
        counted since, nor withdrawn for want of a gap. ``judged``: made a scrape or more past its date,
        its GPUs restarted in the past by a stop read late (:data:`_RESTARTED`), time order made it when judging
        the host at ``judged`` (:func:`_firing_scrape`), with the dollars of its GPUs' idle time to then, not all
        counted since: those, priced so. ``billed_before``: the candidate that waited for the host's billing, where
        usage dated before the scrape that would have fired it said billed (:func:`_billed_before`): time order
        fired it there, with the dollars counted to then; those, each GPU's seconds a share of the host's GPUs
        (:attr:`UnbilledCandidate.share_of`). (Where the billing was dated later, time order, too, made it only once
        the billing was read, with every dollar counted to then; where that billing was read after samples past it,
        ``judged`` is its date, :attr:`UnbilledCandidate.billed_at`, or the end of a whole-host dip it fell in.)"""
        since, stale_after = fired.episode_start, self.params.stale_after
        share = _share_of(st, res, listed)
        gaps = _gaps(st)
        flat = tuple(x for gap in gaps if gap.before >= since for x in gap.figures())  # (their times: _covered_s)
        if any(gap.before >= since and gap.past for gap in gaps):
            priced = partial(_share_priced, res, share, flat, since, stale_after=stale_after)
            _set_gaps(st, [_claimed(gap, *priced(gap.before), *priced(gap.after))
                           if gap.before >= since and gap.past else gap for gap in gaps])  # fmt: skip
        if billed_before is not None:  # (counted a share of the GPUs then reporting where the host's were not known:
            # time order's share then, not of those now)
            shares = billed_before.share_of / max(res.gpus, billed_before.share_of)
            usd = min(fired.waste_usd, _priced(res, billed_before.waste_usd, billed_before.unpriced_s)[0] * shares)
        elif judged is None:
            return fired
        else:
            usd = min(fired.waste_usd, self._judged_usd(st, res, listed, since, judged, flat))
        return msgspec.structs.replace(fired, waste_usd=round(usd, 4))

    def _judged_usd(self, st: GpuShareState, res: ResourceInfo, listed: list[int], since: float, judged: float,
                    gaps: tuple[float, ...]) -> float:  # fmt: skip
        """The dollars time order's fire said, judging the host at ``judged``: those of the GPUs of ``listed`` that
        had been idle ``for`` by then, each from its own start (from the rebase at most, as :meth:`_idle_from`
        pends them), over the time samples cover; not a GPU that joined the episode after (it counted each from
        ``since`` before). All of ``listed`` from ``since`` where fewer than ``min_gpus`` had. A GPU that left before
        the scrape that made the fire is not in ``listed``: too little, then."""
        p, one_gpu = self.params, _share_of(st, res, [0])  # (one GPU's share of the host)
        starts = [max(start, since) for start in _idle_starts(st, listed, judged)]
        starts = [start for start in starts if judged - start >= p.for_]
        if len(starts) < p.min_gpus:
            starts = [since] * len(listed)
        return sum(_share_priced(res, one_gpu, gaps, start, judged, stale_after=p.stale_after)[0] for start in starts)

    def _billed_late(self, st: GpuShareState, res: ResourceInfo, t: float, kept: UnbilledEnded) -> list[Finding]:
        """A usage event at ``t`` read after the candidate ``kept`` ended unfired:
        where it says billed before the break, time order fired the candidate (at the date kept) and the
        break resolved it: both are made now, and it is kept as the episode resolved last (a stop read later
        within it takes it back or corrects it). A stop within it ended it short of a fire, and usage from
        its break on is too late: either lets it go."""
        since, fired_at, broken = kept.since, kept.fired_at, kept.ended_at
        if t >= broken or (not res.billed and t >= since):
            st.unbilled = None
            return []
        if not res.billed:
            return []  # (a stop from before it began: not its end)
        st.unbilled = None
        usd, unpriced = _priced(res, kept.waste_usd, kept.unpriced_s)
        if st.ended is None:  # (kept with its gaps: a stop read later in one corrects it)
            st.ended = ended_of(since, fired_at, max(t, fired_at), broken, usd, unpriced, since, kept.gaps or None)
        return self._past_episode(st, res, since, fired_at, broken, usd,
                                  "whole_host_idle" if kept.whole_host else "gpu_busy")

    def _past_episode(self, st: GpuShareState, res: ResourceInfo, since: float, fired_at: float, resolved_at: float,
                      usd: float, reason: str = "gpu_busy") -> list[Finding]:  # fmt: skip
        """The fire and the resolution (``reason``) of an episode found only now to have been one in time
        order (a stop or usage read late), with the GPUs of the latest finding: from ``since``, fired at
        ``fired_at`` with the dollars of ``for`` of those GPUs, resolved at ``resolved_at`` with ``usd``."""
        listed = [g for g in st.listed if g in st.gpu_ids]
        found = []
        for action, when, extra in (("fire", fired_at, {}), ("resolve", resolved_at, {"reason": reason})):
            details, who, rate = self._facts(st, res, listed, when - since)
            details.update(extra)
            dollars = usd if action == "resolve" else min(usd, rate * self.params.for_ / 3600.0)
            found.append(make_finding(self, action, who, episode_start=since, fired_at=fired_at, at=when, usd=dollars,
                                      details=details, usd_per_hour=rate))  # fmt: skip
        return found

    def _withdrawal(self, st: GpuShareState, res: ResourceInfo, ended: Ended, t: float) -> Finding:
        """The resolution that takes back the resolved episode ``ended``: a stop at ``t`` came within it."""
        since, fired_at = ended[0], ended[1]
        at = max(t, since)
        details = {"gpu_count": max(len(st.gpu_ids), res.gpus, 1), "gpu_model": st.model, "episode_s": round(at - since, 3),
                   "util_below_pct": self.params.util_below, "reason": WITHDRAWN}  # fmt: skip
        return make_finding(self, "resolve", res, episode_start=since, fired_at=fired_at, at=at, usd=0.0, details=details,
                            usd_per_hour=0.0)  # fmt: skip

    def _finding(self, action: str, st: GpuShareState, res: ResourceInfo, at: float, **extra: object) -> Finding:
        assert st.since is not None and st.fired_at is not None
        counted = sorted(st.counted())
        if counted or action != "resolve":
            st.listed = tuple(counted)
        counted = counted or [g for g in st.listed if g in st.gpu_ids]
        details, who, rate = self._facts(st, res, counted, max(at, st.since) - st.since)
        details.update(extra)
        return make_finding(self, action, who, episode_start=st.since, fired_at=st.fired_at, at=at, usd=st.waste_usd,
                            details=details, usd_per_hour=rate)  # fmt: skip

    def _facts(self, st: GpuShareState, res: ResourceInfo, counted: list[int],
               episode_s: float) -> tuple[dict[str, Any], ResourceInfo, float]:  # fmt: skip
        """What a finding says of the host with the GPUs ``counted`` idle (their pods) ``episode_s`` into the
        episode, the resource with the owner those pods name, and what those GPUs' share of the host costs
        an hour."""
        total = max(len(st.gpu_ids), res.gpus, 1)
        pods = {g: self._status(st, g, st.covered_until).pods for g in counted}
        details = {"gpu_count": total, "gpu_model": st.model, "gpus_idle": counted, "episode_s": round(episode_s, 3),
                   "util_below_pct": self.params.util_below, **listing(pods)}  # fmt: skip
        who = with_owner(res, [pod for ps in pods.values() for pod in ps])
        return details, who, (res.usd_per_hour or 0.0) * len(counted) / total


def _resolve(st: GpuShareState, held_until: float | None, resolution: Callable[[], Finding]) -> list[Finding]:
    """The episode ends by a scrape: ``resolution`` if it fired, then kept with its gaps for a stop read later
    (:attr:`GpuShareState.ended`), and ``held_until``, the last scrape that judged its GPUs idle (None: a
    whole-host spell's hand-over; and where a GPU the resolution names came back from a gap after its end,
    the Ended not keeping when: no episode of the GPUs after a gap is made then, :meth:`GpuShare._after_stop`);
    the gaps stay kept past the episode's end, so that where such a stop falls in one, the GPUs idle across
    it start again from their return."""
    kept, since, fired_at, fired_by, unpriced = _gaps(st), st.since, st.fired_at, st.fired_by, st.unpriced_s
    found = end(st, resolution)
    if found and since is not None and fired_at is not None and fired_by is not None:
        gaps = _episode_gaps(st, kept)
        at = found[0].at
        if held_until is not None and _back_late(kept, st.listed):
            held_until = None
        st.ended = ended_of(since, fired_at, fired_by, at, found[0].waste_usd, unpriced,
                            since if held_until is None else held_until, gaps or None)  # fmt: skip
    _set_gaps(st, [_past(gap) for gap in kept])
    _let_go_running(st)  # (a candidate that would have fired, ended otherwise than by _keep_unbilled)
    return found


def _firing_scrape(st: GpuShareState, fired_at: float, step: float, p: GpuShareParams) -> tuple[float, float]:
    """The scrape that judged, in time order, an episode dated ``fired_at``, and the one after it, which fired it
    (scrapes ``step`` apart: the latest interval, a gap's no longer than a minute). Usually its date; after a whole-
    host dip that held its date (noted in the gaps kept and by the candidate, :attr:`Gap.dip`,
    :attr:`UnbilledCandidate.dips`), no GPU counted before the dip's end; after
    a gap kept that holds its date, or that comes right after it, the firing scrape is the gap's end, or the next
    after it (a stop read late in such a gap, or dip, came before the fire: :func:`withdraws`). A gap kept
    longer than ``stale_after`` from its start to then restarted its GPUs, not yet counted, in time order: judged
    ``for`` after its end at the earliest (:meth:`GpuShare._idle_from` took them as idle from their return, and a
    dip may have kept them from counting where :func:`_note_dark` takes them as counted: a review's find)."""
    judged, since, gaps = fired_at, st.since if st.since is not None else fired_at, _gaps(st)
    dips = [gap.dip for gap in gaps]
    if isinstance(st.unbilled, UnbilledCandidate):  # (one that waited for its billing keeps its latest dips too)
        dips += st.unbilled.dip_spans()
    for dip in dips:
        if dip is not None and dip[0] <= judged < dip[1]:
            judged = dip[1]
    for gap in gaps:
        if since <= gap.before < judged and gap.after - gap.before > p.stale_after:
            judged = max(judged, gap.after + p.for_)
    for gap in gaps:
        if judged <= gap.before < judged + step:  # judged at the gap's start, by the scrape that ends it
            return gap.before, gap.after
        if gap.before < judged < gap.after:  # judged at the gap's end
            return gap.after, gap.after + step
    return judged, judged + step


def _idle_starts(st: GpuShareState, gpus: list[int], at: float) -> list[float]:
    """When each of ``gpus`` went idle (from the rebase at most; ``at`` where not idle): what it counts from."""
    times: Any = st.gpu_times
    return [max(_or(times[PER_GPU * st.gpu(gpu) + IDLE_SINCE], at), st.rebase_at) for gpu in gpus]


def _share_of(st: GpuShareState, res: ResourceInfo, gpus: list[int]) -> float:
    """The share of the host ``gpus`` are: of the GPUs its instance type has, or of those reporting if more."""
    return len(gpus) / max(len(st.gpu_ids), res.gpus, 1)


def _share_priced(res: ResourceInfo, share: float, gaps: tuple[float, ...], start: float, at: float, *,
                  stale_after: float) -> tuple[float, float]:
    """Dollars and unpriced seconds of ``share`` of the host idle from ``start`` to ``at``, over the time samples
    cover (:func:`_covered_s`)."""
    return _priced(res, 0.0, share * _covered_s(gaps, start, at, stale_after))


def _covered_s(gaps: tuple[float, ...], start: float, at: float, stale_after: float) -> float:
    """Seconds from ``start`` to ``at`` that samples cover: less the gaps (:data:`GAP` figures each) within
    them longer than ``stale_after``, which are not idle time."""
    dark = sum(min(gaps[i + 1], at) - gaps[i] for i in range(0, len(gaps), GAP)
               if gaps[i + 1] - gaps[i] > stale_after and start <= gaps[i] < at)  # fmt: skip
    return max(0.0, at - start - dark)


def _back_late(gaps: list[Gap], gpus: tuple[int, ...]) -> bool:
    """Whether any of ``gpus`` came back from one of ``gaps`` after its end (a return noted in it)."""
    return any(gpu in gpus for gap in gaps for gpu, _ in gap.returns)


def _keep_unbilled(st: GpuShareState, at: float, *, whole_host: bool) -> None:
    """The candidate, which would have fired but for the host's billing (:attr:`GpuShareState.unbilled`), ends
    unfired at ``at`` (its GPUs busy, or a whole-host spell's start): kept, with its dollars and gaps, for
    usage read later that says billed before then."""
    if st.fired_at is None and st.since is not None and isinstance(st.unbilled, UnbilledCandidate):
        st.unbilled = UnbilledEnded(st.since, st.unbilled.fired_at, at, st.waste_usd, st.unpriced_s, whole_host,
                                    _episode_gaps(st))  # fmt: skip


def _billed_before(st: GpuShareState) -> UnbilledCandidate | None:
    """The candidate running unbilled where usage read since, dated before the scrape that would have fired it,
    said billed: None where not so."""
    running = st.unbilled
    return running if isinstance(running, UnbilledCandidate) and running.billed_before else None


def _running(st: GpuShareState) -> bool:
    """Whether :attr:`GpuShareState.unbilled` holds a candidate still running."""
    return isinstance(st.unbilled, UnbilledCandidate)


def _let_go_running(st: GpuShareState) -> None:
    """The candidate running unbilled fired, or ended otherwise than kept: no longer held (one ended and kept
    stays, for usage read later)."""
    if _running(st):
        st.unbilled = None


def _episode_gaps(st: GpuShareState, kept: list[Gap] | None = None) -> tuple[float, ...]:
    """The episode's gaps kept (``kept``, or the state's), :data:`GAP` figures each, as an
    :data:`~detector.detectors.episode.Ended` holds them: those marked past an earlier episode's end left out."""
    return tuple(x for gap in (_gaps(st) if kept is None else kept) if not gap.past for x in gap.figures())


def _priced(res: ResourceInfo, waste: float, unpriced: float) -> tuple[float, float]:
    """Dollars and unpriced seconds as a scrape left them, the seconds priced where the host's price is known
    since (as the usage that priced them did)."""
    if unpriced and res.usd_per_hour is not None:
        return waste + usd_over(res.usd_per_hour, unpriced), 0.0
    return waste, unpriced


def _holders(scrape: Scrape) -> bytes:
    """Per sample, who holds its unit as a code's bits 1-2 (:data:`HOLDER_CODE`)."""
    return bytes(map(HOLDER_CODE.__getitem__, scrape.allocations()))


def _who(pod: Pod | None) -> tuple[str, str] | None:
    return (pod.namespace, pod.pod) if pod is not None else None


def _or(x: float, default: float) -> float:
    """``x``, or ``default`` where unset or 0.0 (what ``idle_since or c`` said of the struct's field)."""
    return x if is_set(x) and x else default


def _note_charged(st: GpuShareState, t: float, stale_after: float) -> None:
    """Keep the open episode's dollars as the scrape at ``t`` left them (:attr:`GpuShareState.charged`),
    and of the earlier ones those a stop within ``stale_after`` of ``t`` may need."""
    log = st.charged
    if log is None:
        log = st.charged = floats()
    log.extend((t, st.waste_usd, st.unpriced_s))
    horizon, k = t - stale_after, 0
    while k + 3 < len(log) and log[k + 3] <= horizon:
        k += 3
    if k:
        del log[:k]


def _gaps(st: GpuShareState) -> list[Gap]:
    """The gaps kept, oldest first."""
    return list(st.gaps or ())


def _set_gaps(st: GpuShareState, gaps: list[Gap]) -> None:
    st.gaps = tuple(gaps) or None


def _forget_gaps_before(st: GpuShareState, t: float) -> None:
    """Usage read at ``t``: the gaps kept that end by then go (a resource's usage is read in order, so no
    stop read later falls in them)."""
    _set_gaps(st, [gap for gap in _gaps(st) if t < gap.after])


def _gaps_from(st: GpuShareState, t: float) -> list[Gap]:
    """The gaps kept that begin after a stop at ``t``, which ends the open episode: marked as past it (their
    dollars not the next episode's), as :func:`_resolve` leaves them."""
    return [_past(gap) for gap in _gaps(st) if gap.before > t]


def _claimed(gap: Gap, waste: float, unpriced: float, waste_after: float, unpriced_after: float) -> Gap:
    """``gap``, kept past the episode it came in, claimed by the one that fired since, with its dollars at it."""
    return replace(gap, past=False, waste_usd=waste, unpriced_s=unpriced, waste_after_usd=waste_after,
                   unpriced_after_s=unpriced_after)  # fmt: skip


def _past(gap: Gap) -> Gap:
    """``gap`` kept past the end of the episode it came in: its GPUs' returns still say where a stop read later
    in it restarts them, its dollars are no episode's."""
    return replace(gap, past=True, waste_usd=0.0, unpriced_s=0.0, waste_after_usd=0.0, unpriced_after_s=0.0)


def _gap_holding(st: GpuShareState, t: float) -> Gap | None:
    """The gap in the host's scrapes kept (:attr:`GpuShareState.gaps`) that
    holds a stop at ``t``, read after the scrapes past it: in time order the stop came first, so the episode
    (or the candidate, or the GPUs' idle runs, or the host's whole-idle spell) ended there, and the GPUs idle
    across the gap start again from their first sample after it (:func:`_back_at`), a spell across it from
    its end."""
    return next((gap for gap in _gaps(st) if gap.before <= t < gap.after), None)


def _keep_gap(st: GpuShareState, c: float, t: float) -> None:
    """The scrapes of the host jump from ``c`` to ``t``, more than a minute, while an episode, an idle run
    or a whole-idle spell is under way: the gap is kept (:attr:`GpuShareState.gaps`) with those before it (a
    missed scrape, or a late one, does not hide a restart's: past :data:`MAX_GAPS` the shortest before it
    gives way). The dollars are those the scrape at ``c`` left (the ``charged`` log's latest), not as
    judging ``c`` moved them: in time order a stop in the gap is read before the scrape at ``t``, which
    judges ``c``; those after it, the same until :func:`_counted_to` says what the scrape at ``t`` left. It
    keeps the latest whole-host dip the gaps before it noted (:attr:`Gap.dip`): a stop read later in one of those
    lets it go with that gap, and a fire caught up after it may have been held by the dip (:func:`_firing_scrape`)."""
    log = st.charged
    waste, unpriced = (log[-2], log[-1]) if log else (st.waste_usd, st.unpriced_s)
    gaps = _gaps(st)
    dip = gaps[-1].dip if gaps else None
    if len(gaps) >= MAX_GAPS:
        del gaps[min(range(len(gaps)), key=lambda k: gaps[k].after - gaps[k].before)]
    _set_gaps(st, [*gaps, Gap(c, t, waste, unpriced, waste, unpriced, dip=dip)])


def _counted_to(st: GpuShareState) -> None:
    """The scrape that ends the latest gap kept has judged the one before and counted the gap: the dollars
    after the gap are those it left (what the episode counted from there on was an episode of its own in
    time order, where a stop read later falls in the gap: :meth:`GpuShare._after_stop`)."""
    gaps = st.gaps
    assert gaps is not None  # (kept by _keep_gap in the same call)
    st.gaps = (*gaps[:-1], replace(gaps[-1], waste_after_usd=st.waste_usd, unpriced_after_s=st.unpriced_s))


_RESTARTED = math.nan
""":attr:`GpuShareState.fired_by` between a stop read late that restarted GPUs idle across its gap in the past
(from their return: :meth:`GpuShare._idle_from`) and the next fire, which may come more than ``stale_after`` past
its date (also when it waited for the restart's usage), as time order made it scrapes ago (:meth:`GpuShare._fired`).
Time order never reads a stop in a gap kept, so never sets it: its fires are never capped."""


def _returned_at(gap: Gap, gpu: int) -> float | None:
    """When GPU ``gpu``'s return after ``gap`` was noted in it (:attr:`Gap.returns`), or None."""
    return next((at for g, at in gap.returns if g == gpu), None)


def _with_return(gap: Gap, gpu: int, t: float) -> Gap:
    """``gap`` with GPU ``gpu``'s return at ``t`` noted (a later one replacing the one kept)."""
    return replace(gap, returns=(*((g, at) for g, at in gap.returns if g != gpu), (gpu, t)))


def _note_back(st: GpuShareState, gpu: int, seen: float, t: float) -> None:
    """GPU ``gpu``, silent since ``seen``, before the latest gap kept (:attr:`GpuShareState.gaps`), reports
    at ``t``: kept in each gap it was silent across, where ``t`` is after the gap's first scrape (then it
    was missing from it), so that a stop read later in that gap starts its idle run here, where time
    order started it (:func:`_back_at`). Once a GPU: a later return replaces the earlier (:func:`_note_dark`)."""
    gaps = _gaps(st)
    if any(seen <= gap.before and t > gap.after for gap in gaps):
        _set_gaps(st, [_with_return(gap, gpu, t) if seen <= gap.before and t > gap.after else gap for gap in gaps])


def _dark_until(st: GpuShareState, g: int, gpu: int, seen: float, t: float, for_s: float) -> None:
    """GPU ``gpu`` (at place ``g``) back at ``t`` from a telemetry gap of its own longer than ``stale_after``
    (its latest sample ``seen``): its idle count starts again, unless it is counted in the open episode,
    which such a gap spares (then its return is kept for a stop read later: :func:`_note_dark`)."""
    if not (st.fired_at is not None and st.gpu_counted[g]):
        _restart(st, g)
    elif st.gaps is not None:
        _note_dark(st, gpu, seen, t, for_s)


def _note_dark(st: GpuShareState, gpu: int, seen: float, t: float, for_s: float) -> None:
    """GPU ``gpu``, counted in the open episode (so not restarted), back at ``t`` from a telemetry gap of its
    own (its latest sample ``seen``; the host's, a gap kept, darkens every GPU) after a gap kept: where a
    stop read later falls in that gap, time order had ended the episode there, and this gap restarted the
    GPU's idle run here, unless it had counted ``for`` since its return (then it was in an episode of its
    own, whose GPUs such a gap spares)."""
    gaps = _gaps(st)
    for k, gap in enumerate(gaps):
        back = _back_at(gap, gpu, seen)
        if back is not None and seen - back < for_s:
            gaps[k] = _with_return(gap, gpu, t)
    _set_gaps(st, gaps)


def _back_at(gap: Gap, gpu: int, seen: float) -> float | None:
    """When GPU ``gpu`` (its latest sample ``seen``) first reported after ``gap``: the gap's first scrape,
    or later where :func:`_note_back` kept it; None while it has not (in time order the stop restarted its
    idle run, which starts again at its first sample)."""
    if seen <= gap.before:
        return None
    back = _returned_at(gap, gpu)
    return gap.after if back is None else back


def _restart_run(st: GpuShareState, g: int) -> None:
    """GPU ``g``'s idle run and the idle time pending before it counts start again."""
    times = st.gpu_times
    assert times is not None
    at = PER_GPU * g
    times[at + IDLE_SINCE], times[at + PENDING_S], times[at + PENDING_FROM] = UNSET, 0.0, UNSET


def _restart(st: GpuShareState, g: int) -> None:
    """... and it leaves the episode's set."""
    _restart_run(st, g)
    set_counted(st, g, 0)
