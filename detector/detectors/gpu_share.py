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
  GPU not yet counting. A GPU silent for an hour is forgotten.
- **Event time only.** A sample at or before the latest of its unit (a re-read batch, a
  duplicate) changes nothing; a late one updates its unit without recounting the past.
  Findings are dated by sample times.
- **Billed only.** It fires only while the host's latest usage says ``running``; a stop
  resolves it (``reason: instance_stopped``) and every GPU's count starts again.
- **Bounded.** At most :data:`MAX_UNITS` units per host (the least recently seen gives way).
"""

from __future__ import annotations

import builtins
from operator import attrgetter
from typing import Any, ClassVar

import msgspec
from pydantic import Field

from detector.detectors.activity import busy
from detector.detectors.base import Behaviour, Context, DetectorBase, Finding, Params, ResourceInfo, intern, make_finding
from detector.detectors.episode import Episode, end, fire
from detector.detectors.pods import MAX_UNITS, Pod, listing, pod_facts, pod_of, with_owner
from detector.events import Event, GpuMetric, UsageEvent
from detector.pricing import usd_over
from detector.units import Duration, Percent

__all__ = ["MAX_UNITS", "GpuShare", "GpuShareParams", "GpuShareState", "gpu_names"]

FORGET_S = 3600.0
"""A unit with no sample for this long (while the host's others report) is gone."""
_KEYS = tuple(str(i) for i in range(256))
"""A whole GPU's unit key, by index (made once: this runs for every sample)."""
_ALONE = {key: (key,) for key in _KEYS}
"""A whole GPU's units (itself alone), one tuple shared by every host's GPU of that index."""
BUSY, HELD, UNKNOWN, FREE = 3, 2, 1, 0
"""A fresh GPU at one instant, ordered so that the max over its units is the GPU's: busy if any
instance is; else held if a pod holds any, unknown if any says nothing, free if none is held."""
_CODE = {True: HELD, None: UNKNOWN, False: FREE}
_allocated = attrgetter("allocated")


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


class Unit(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """The latest sample of one GPU or MIG instance."""

    gpu: int
    seen: float
    busy: bool = False
    allocated: bool | None = None
    allocated_at: float = 0.0
    """Its newest sample that said who holds it (``allocated`` not None)."""
    pod: Pod | None = None


class GpuTrack(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """One physical GPU's idle run and its place in the episode."""

    units: tuple[str, ...] = ()
    """Its units' keys (one, or its MIG instances): a tuple replaced on change, so that a whole GPU's
    is one shared by every host (:data:`_ALONE`), not a list per GPU."""
    seen: float = 0.0
    """Its newest sample (of any of its units)."""
    idle_since: float | None = None
    """Its first idle sample after its last busy one (None: busy, or not seen idle yet)."""
    pending_s: float = 0.0
    """Host-seconds (its share of the host: seconds / GPUs) idle while another GPU worked,
    before it counted: priced once it does."""
    pending_from: float | None = None
    counted: bool = False
    """In the episode's set."""


class GpuShareState(Episode, kw_only=True):
    units: dict[str, Unit] = {}
    gpus: dict[int, GpuTrack] = {}
    model: str = ""
    covered_until: float = 0.0
    """Time of the newest sample seen: time is only counted up to here."""
    whole_idle_since: float | None = None
    """Start of the current spell with no GPU of the host busy."""
    rebase_at: float = 0.0
    """End of the latest whole-host idle spell that lasted ``for`` (``idle_gpu``'s): GPUs count
    their idle time again from here, as if their idle runs began then."""
    stopped_at: float = 0.0
    """When the host was last seen stopped: samples from before it are history."""
    listed: tuple[int, ...] = ()
    """The GPUs of the latest finding (a resolution names what was idle)."""
    left: str = ""
    """Why a GPU left the set since the clock last moved ('' = none left)."""
    waste_usd: float = 0.0
    unpriced_s: float = 0.0
    """Host-seconds counted before the host's price was known."""
    spell_s: float = 0.0
    """Host-seconds of the counted GPUs in the current whole-host idle spell: charged if it ends
    short of ``for``, dropped if it lasts (then it is ``idle_gpu``'s)."""

    def clear(self) -> None:
        super().clear()
        self.waste_usd = self.unpriced_s = self.spell_s = 0.0


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

    def counts(self, allocated: bool | None) -> bool:
        """Whether an idle GPU with this allocation is this detector's."""
        return _CODE[allocated] in self.codes

    def tracking(self, state: GpuShareState) -> Behaviour:
        """Part of the host idle while the rest works: an unusual level, not a pause; tracked from a
        GPU's first idle sample (being counted towards ``for``), as ``idle_gpu`` tracks a host, so
        the anomaly model leaves the rule the first word on it."""
        if state.since is not None or any(track.idle_since is not None for track in state.gpus.values()):
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
        return [f for _, f in self.step_scrape(state, ctx, [event], t)]

    def step_scrape(self, state: GpuShareState, ctx: Context, events: list[GpuMetric],
                    t: float) -> list[tuple[int, Finding]]:  # fmt: skip
        """:meth:`step` for each sample of a scrape (samples of the host at ``t``), in one call: this
        runs for every scrape of every host. Findings come with the index of the sample that made them."""
        st, res = state, ctx.resource
        if t <= st.stopped_at:
            return []
        units, gpus = st.units, st.gpus
        unknown_ours = UNKNOWN in self.codes
        if not units and not unknown_ours and set(map(_allocated, events)) == {None}:
            return []  # unallocated_gpu on a host that never said who holds its GPUs (not Kubernetes)
        out: list[tuple[int, Finding]] = []
        p = self.params
        stale_after, util_below = p.stale_after, p.util_below
        for i, ev in enumerate(events):
            if ev.allocated is None and not units and not unknown_ours:
                continue  # unallocated_gpu on a host that never said who holds its GPUs (not Kubernetes)
            key = f"{ev.gpu_index}/{ev.mig_instance}" if ev.mig_instance else _KEYS[ev.gpu_index]
            unit = units.get(key)
            if unit is not None and t <= unit.seen:
                continue  # a re-read or duplicate sample
            if t > st.covered_until:
                out.extend((i, f) for f in self._advance(st, res, t))
            track = gpus.get(ev.gpu_index)
            if track is None:
                track = gpus[ev.gpu_index] = GpuTrack()
            elif t - track.seen > stale_after and not (st.fired_at is not None and track.counted):
                _restart(track)  # a telemetry gap: its idle count starts again
            pod = pod_of(ev) if ev.pod else None
            allocated = ev.allocated
            if allocated is None and unit is not None and unit.allocated is not None and t - unit.allocated_at <= stale_after:
                # The bridge could not tell for this scrape (dcgm-exporter and kube-state-metrics a
                # scrape apart while a pod starts elsewhere): not news, the last known holder stands.
                allocated = unit.allocated
            if unit is None:
                if len(units) >= MAX_UNITS:
                    self._forget(st, min(units, key=lambda k: units[k].seen))
                    track = gpus.setdefault(ev.gpu_index, track)
                unit = units[key] = Unit(gpu=ev.gpu_index, seen=t, allocated=allocated, pod=pod)
                track.units = (*track.units, key) if track.units else _ALONE.get(key) or (key,)
            elif ((unit.allocated is not allocated and self.counts(unit.allocated) != self.counts(allocated))
                  or ((unit.pod is not None or pod is not None) and _who(unit.pod) != _who(pod))):  # fmt: skip
                # Another pod, or a GPU taken or released: a new idle run (a pod starting up is not idle waste).
                if track.counted:
                    track.counted, st.left = False, "allocation_changed"
                track.idle_since, track.pending_s, track.pending_from = None, 0.0, None
            unit.seen, unit.busy = t, busy(ev, util_below)
            unit.allocated, unit.pod = allocated, pod
            if ev.allocated is not None:
                unit.allocated_at = t
            if ev.model and ev.model != st.model:
                st.model = intern(ev.model)
            if t > track.seen:
                track.seen = t
            if unit.busy:
                if track.idle_since is not None or track.pending_from is not None:
                    track.idle_since, track.pending_s, track.pending_from = None, 0.0, None
            elif track.idle_since is None and (len(track.units) == 1 or not self._status(st, ev.gpu_index, t).busy):
                track.idle_since = t
        return out

    def open_episode(self, state: GpuShareState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return self._finding("update", state, resource, state.covered_until)

    def _on_usage(self, st: GpuShareState, res: ResourceInfo, t: float) -> list[Finding]:
        if not res.billed:
            found: list[Finding] = []
            if st.since is not None:
                since = st.since
                found = end(st, lambda: self._finding("resolve", st, res, max(t, since), reason=f"instance_{res.state}"))
            if t > st.stopped_at:
                st.stopped_at = t
            for track in st.gpus.values():
                _restart(track)
            st.whole_idle_since, st.spell_s = None, 0.0
            return found
        if st.unpriced_s and res.usd_per_hour is not None:
            st.waste_usd += usd_over(res.usd_per_hour, st.unpriced_s)
            st.unpriced_s = 0.0
        return []

    # -- the clock ----------------------------------------------------------

    def _advance(self, st: GpuShareState, res: ResourceInfo, t: float) -> list[Finding]:
        """Time moves from the newest sample ``c`` to ``t``: judge the host as the samples up to
        ``c`` left it (a whole scrape), make the findings dated ``c``, then count ``(c, t]``."""
        c, st.covered_until = st.covered_until, t
        if c <= 0.0:
            return []
        p = self.params
        reason, st.left = st.left, ""
        # Each fresh GPU's state at c, from its units' latest samples, in one pass (every scrape).
        state: dict[int, int] = {}
        stale, gone = p.stale_after, []
        for key, unit in st.units.items():
            age = c - unit.seen
            if age > stale:
                if age > FORGET_S:
                    gone.append(key)
                continue
            code = BUSY if unit.busy else _CODE[unit.allocated]
            if code > state.get(unit.gpu, -1):
                state[unit.gpu] = code
        for key in gone:
            track = st.gpus.get(st.units[key].gpu)
            if track is not None and track.counted and len(track.units) == 1:
                reason = "gpu_gone"
            self._forget(st, key)
        any_busy = BUSY in state.values()
        codes = self.codes
        if st.since is None and codes.isdisjoint(state.values()):
            self._spell(st, res, c, any_busy)  # no GPU of ours idle, no episode: only the host's spells
            return []
        self._spell(st, res, c, any_busy)
        changed = bool(reason)
        for gpu, track in st.gpus.items():
            now = state.get(gpu)
            if track.counted and now is not None and now not in codes:
                track.counted, changed = False, True
                reason = "gpu_busy" if now == BUSY else "allocation_changed"
        found: list[Finding] = []
        if any_busy:
            for gpu, track in st.gpus.items():
                if (not track.counted and state.get(gpu, BUSY) in codes and track.idle_since is not None
                        and c - max(track.idle_since, st.rebase_at) >= p.for_):  # fmt: skip
                    track.counted, changed = True, True
                    self._charge(st, res, track.pending_s)
                    start = track.pending_from if track.pending_from is not None else c
                    if st.fired_at is None:
                        st.since = start if st.since is None else min(st.since, start)
                    track.pending_s, track.pending_from = 0.0, None
        elif st.whole_idle_since is not None:
            if c - st.whole_idle_since >= p.for_ and any(tr.counted for tr in st.gpus.values()):
                spell, st.spell_s = st.whole_idle_since, 0.0
                for track in st.gpus.values():
                    track.counted = False
                return end(st, lambda: self._finding("resolve", st, res, max(spell, st.since or spell),
                                                     reason="whole_host_idle"))  # fmt: skip
        counted = [gpu for gpu, tr in st.gpus.items() if tr.counted]
        if not counted:
            if st.since is not None:
                found = end(st, lambda: self._finding("resolve", st, res, c, reason=reason or "gpu_busy"))
        elif st.fired_at is None:
            if any_busy and res.billed and len(counted) >= p.min_gpus and st.since is not None:
                qualified = sorted(max(st.gpus[g].idle_since or c, st.rebase_at) for g in counted)
                fired_at = min(c, max(st.since, qualified[p.min_gpus - 1] + p.for_))
                fire(st, since=st.since, fired_at=fired_at, at=c)
                found = [self._finding("fire", st, res, fired_at)]
        elif any_busy and (changed or c - st.last_report >= p.update_every):
            st.last_report = c
            found = [self._finding("update", st, res, c)]
        gap = t - c
        if gap <= p.stale_after:
            share_s = gap / max(len(st.gpus), res.gpus)
            n = 0
            for gpu, track in st.gpus.items():
                if state.get(gpu, BUSY) not in codes:
                    continue
                if track.counted:
                    n += 1
                elif track.idle_since is not None:
                    track.pending_s += share_s
                    if track.pending_from is None:
                        track.pending_from = c
            if n and any_busy:
                self._charge(st, res, share_s * n)
            elif n:
                st.spell_s += share_s * n
        return found

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
            for track in st.gpus.values():
                track.pending_s, track.pending_from = 0.0, None
        else:
            self._charge(st, res, st.spell_s)
            st.spell_s = 0.0
        st.whole_idle_since = None

    # -- helpers ------------------------------------------------------------

    def _status(self, st: GpuShareState, gpu: int, at: float) -> _Status:
        """GPU ``gpu`` as its units' latest samples left it at ``at``."""
        out = _Status(pods=[])
        stale, allocations = self.params.stale_after, []
        track = st.gpus.get(gpu)
        for key in track.units if track is not None else ():
            unit = st.units[key]
            if at - unit.seen > stale:
                continue
            out.fresh = True
            out.busy = out.busy or unit.busy
            allocations.append(unit.allocated)
            if unit.pod is not None:
                out.pods.append(unit.pod)
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
        gpu = st.units.pop(key).gpu
        track = st.gpus.get(gpu)
        if track is not None:
            track.units = tuple(k for k in track.units if k != key)
            if not track.units:
                del st.gpus[gpu]

    def _finding(self, action: str, st: GpuShareState, res: ResourceInfo, at: float, **extra: object) -> Finding:
        assert st.since is not None and st.fired_at is not None
        counted = sorted(g for g, tr in st.gpus.items() if tr.counted)
        if counted or action != "resolve":
            st.listed = tuple(counted)
        counted = counted or [g for g in st.listed if g in st.gpus]
        total = max(len(st.gpus), res.gpus, 1)
        pods = {g: self._status(st, g, st.covered_until).pods for g in counted}
        pod_list = [pod for ps in pods.values() for pod in ps]
        rate = (res.usd_per_hour or 0.0) * len(counted) / total
        details = {
            "gpu_count": total,
            "gpu_model": st.model,
            "gpus_idle": counted,
            "episode_s": round(max(at, st.since) - st.since, 3),
            "util_below_pct": self.params.util_below,
            **listing(pods),
            **extra,
        }
        return make_finding(self, action, with_owner(res, pod_list), episode_start=st.since, fired_at=st.fired_at,
                            at=at, usd=st.waste_usd, details=details, usd_per_hour=rate)  # fmt: skip


def _who(pod: Pod | None) -> tuple[str, str] | None:
    return (pod.namespace, pod.pod) if pod is not None else None


def _restart(track: GpuTrack) -> None:
    track.idle_since, track.pending_s, track.pending_from, track.counted = None, 0.0, None, False
