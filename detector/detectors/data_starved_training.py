"""``data_starved_training``: a training job whose GPUs wait on its input pipeline.

Example rule::

    - name: data-starved-training
      type: data_starved_training
      match: {resource_type: [gpu_instance, notebook]}
      params:
        util_below: 70%        # the working GPUs' average over a window is under this...
        busy_above: 70%        # ...and they burst to at least this...
        wait_below: 10%        # ...from under this (a rising edge), at least min_bursts times a window
        min_bursts: 2
        cpu_above: 90%         # or: host CPU (node_exporter) at or above this...
        disk_above: 90%        # ...or its busiest disk, or its network link, while the GPUs are low
        network_above: 90%
        window: 5m             # samples are judged in windows of this length...
        for: 30m               # ...starved windows in a row this long alert...
        fed_windows: 2         # ...and this many fed windows in a row resolve
      severity: warning

"A GPU waiting on data is the most expensive idle resource you own." A job is running
(the host's GPUs work, so it is neither ``idle_gpu``'s nor, with its kernels coming and
going, ``stuck_gpu``'s), but the GPUs it holds do well under their share of the work
because the CPU-side input pipeline (decoding, augmentation, reading shards) cannot keep up.
Two signs, each enough in a window:

- **sawtooth**: the GPUs burst to ``busy_above`` and drop under ``wait_below`` at least
  ``min_bursts`` times within one window. Synchronous data-parallel ranks wait on their
  loaders together, so the host's busiest GPU per scrape goes up and down with them; one
  GPU busy beside idle ones (``partly_idle_gpu``) gives a flat line, not a sawtooth. An epoch
  boundary or an evaluation is one dip per window at most, and busy windows around it
  break the episode long before ``for``;
- **low while the host is saturated**: the working GPUs average between ``wait_below`` and
  ``util_below`` while a host gauge says the input side is pegged. The gauges are
  ``UsageEvent.metrics`` from node_exporter: ``cpu_util_pct`` (100 minus the idle share of
  ``node_cpu_seconds_total``), ``disk_busy_pct`` (``rate(node_disk_io_time_seconds_total)``
  × 100 for the busiest device) and ``network_util_pct`` (received bytes over
  ``node_network_speed_bytes``, busiest interface). A GPU steadily low with an idle host is
  a small job, not a starved one, and does not alert.

Defaults are SageMaker Debugger's profiler rules: ``LowGPUUtilization`` calls a GPU
fluctuating when its 95th percentile is above 70 % and its 5th below 10 %, and
``CPUBottleneck`` counts a bottleneck when the CPU is above 90 % while a GPU is under
10 %. A window of 5 minutes holds ten 30 s scrapes (dcgm-exporter's usual interval),
enough to see two bursts; 30 minutes sustained is ``idle_gpu``'s horizon, past any warm-up
(SageMaker's rules also wait out the first values: "during training initialization, GPU is
likely at 0 percent").

Dollars are the GPU time the job pays for and does not use: per starved window, the host's
price × the share of its GPUs the job holds (those that worked in the window) × (1 − their
average utilisation). ``util_pct`` is read, or ``gr_engine_active`` when higher (the
profiling form, the one there is under MIG). A window without samples is a telemetry gap:
it restarts a candidate and adds nothing to an open episode. Two fed windows in a row
(``fed_windows``) end an episode: dcgm-exporter loses a scrape now and then, and a lost burst
leaves a window with one rising edge, which alone must not split an episode in two.
"""

from __future__ import annotations

import builtins
import math
from functools import partial
from typing import Any, ClassVar

import msgspec
from pydantic import Field

from detector.detectors.base import Behaviour, Context, DetectorBase, Finding, Params, ResourceInfo, intern, make_finding, shared
from detector.detectors.episode import Episode, advance, end
from detector.detectors.scrape import FIRST, Scrape
from detector.events import Event, GpuMetric, UsageEvent
from detector.floats import FloatArray, grow, per_gpu, shared_whole
from detector.pricing import usd_over
from detector.units import Duration, Percent

__all__ = ["DataStarvedTraining", "DataStarvedTrainingParams", "DataStarvedTrainingState", "DataStarvedTrainingStateBefore",
           "HOST_GAUGES", "SaturatedGauge", "StarvedEpisode"]

HOST_GAUGES = ("cpu_util_pct", "disk_busy_pct", "network_util_pct")
"""The ``UsageEvent.metrics`` names read, in percent (see the module docstring for their source)."""
MAX_GAUGE_PCT = 101.0
"""A host gauge above this is not a share of the host (rounding aside): top's per-process CPU is
summed over cores (250 % is 2.5 cores of 96), and reading it as pegged would call a quiet host saturated."""
_WAITING, _BURST = 1, 2
MAX_GPUS = 64
"""GPUs of a host judged: the first 64 seen (a host has 16 at most; a producer may send any index
0..255). A window's GPUs are bits of ints by place, and a snapshot saves an int in 64 bits."""
_FIRST = FIRST[: MAX_GPUS + 1]
"""``_FIRST[n]`` is GPUs ``0 .. n-1``, seen in order (a GPU's place is its index): the one tuple of every
host that has it (:func:`_gpus`), the scrape's too (:data:`~detector.detectors.scrape.FIRST`), so that a
scrape tells it by identity."""


def _gpus(gpus: tuple[int, ...]) -> tuple[int, ...]:
    """The tuple every host with these GPUs holds."""
    first = _FIRST[len(gpus)] if len(gpus) <= MAX_GPUS else None
    return first if gpus == first else shared(gpus)


class DataStarvedTrainingParams(Params):
    util_below: Percent = 70.0
    busy_above: Percent = 70.0
    wait_below: Percent = 10.0
    min_bursts: int = Field(default=2, ge=1)
    cpu_above: Percent = 90.0
    disk_above: Percent = 90.0
    network_above: Percent = 90.0
    window: Duration = Field(default=300.0, gt=0)
    fed_windows: int = Field(default=2, ge=1)
    """Fed windows in a row that end an episode: one lost burst scrape must not split it."""
    for_: Duration = Field(default=1800.0, alias="for", gt=0)
    update_every: Duration = Field(default=900.0, gt=0)


class StarvedEpisode(Episode, kw_only=True, forbid_unknown_fields=True):
    """An episode's figures, from the first starved window that counts to the resolve: none on a host
    whose job is fed (thirteen fields fewer on every GPU host outside an episode)."""

    evidence: str = ""
    covered_until: float = 0.0
    waste_usd: float = 0.0
    unpriced_s: float = 0.0
    """Unused GPU-share seconds seen before the host's price was known."""
    share_unused: float = 0.0
    """The latest starved window's unused share of the host (the rate of waste)."""
    job_gpus: int = 0
    used_s: float = 0.0
    seen_s: float = 0.0
    fed: int = 0
    """Fed windows in a row inside the episode, the first starting at ``fed_at``."""
    fed_at: float = 0.0


class SaturatedGauge(msgspec.Struct, kw_only=True, gc=False, forbid_unknown_fields=True):
    """The latest host gauge (CPU, disk, network) seen saturated: none on most hosts."""

    until: float = -math.inf
    """End of the latest usage interval whose host gauges were saturated."""
    gauge: str = ""
    pct: float = 0.0


class DataStarvedTrainingState(msgspec.Struct, kw_only=True, gc=False, forbid_unknown_fields=True):
    """One window being gathered, the current scrape, and the episode (None outside one). A state
    saved in the shape before (the episode's figures inline: :class:`DataStarvedTrainingStateBefore`)
    is read through that class."""

    win: float = -math.inf
    """Start of the window being gathered (a multiple of ``window``)."""
    first_t: float = 0.0
    """The window's first scrape."""
    follows: bool = False
    """The window directly follows one with samples (so it is covered from its start, whatever
    a scrape's clock jitter put its first sample at)."""
    scrapes: int = 0
    edges: int = 0
    """Rising edges (a waiting scrape, then a burst) in the window."""
    phase: int = 0
    sums: FloatArray | None = None
    """Per GPU, the sum of its utilisation over the window's scrapes (None before a sample)."""
    worked: int = 0
    """Bit mask of the GPUs that reached ``wait_below`` in the window (bit ``p``: ``gpus[p]``)."""
    scrape_t: float = -math.inf
    scrape_max: float = 0.0
    """The current scrape's busiest GPU (a whole percent the float every state shares: :func:`~detector.floats.shared_whole`)."""
    scrape_mask: int = 0
    """GPUs already counted in the current scrape (a re-read sample counts once; bit ``p``: ``gpus[p]``)."""
    gpus: tuple[int, ...] = ()
    """The GPU indexes seen on the host, in the order first seen, at most :data:`MAX_GPUS` (their
    number is the host's GPU count when the price list has none): a GPU's place, its bit in the
    masks. One tuple for every host alike (:func:`~detector.detectors.base.shared`)."""
    model: str = ""
    saturated: SaturatedGauge | None = None
    episode: StarvedEpisode | None = None
    """The episode, from its first starved window that counts; None outside one."""
    saved_before: ClassVar[builtins.type[DataStarvedTrainingStateBefore]]

    def __post_init__(self) -> None:
        if self.gpus:
            if len(self.gpus) > MAX_GPUS or len(set(self.gpus)) != len(self.gpus) or not all(0 <= i <= 255 for i in self.gpus):
                raise ValueError(f"a window's GPUs are at most {MAX_GPUS} distinct indexes 0..255")
            self.gpus = _gpus(self.gpus)
        if self.episode is not None and self.episode.since is None:
            raise ValueError("an episode starts with its first starved window")


class DataStarvedTrainingStateBefore(Episode, kw_only=True, forbid_unknown_fields=True):
    """The state as snapshots saved it until 2026-12-02 (the episode's figures and the saturated gauge
    inline; before that, GPUs as bits by index in ``seen``): read only to be made a
    :class:`DataStarvedTrainingState` (:meth:`upgrade`)."""

    win: float = -math.inf
    first_t: float = 0.0
    follows: bool = False
    scrapes: int = 0
    edges: int = 0
    phase: int = 0
    sums: FloatArray | None = None
    worked: int = 0
    scrape_t: float = -math.inf
    scrape_max: float = 0.0
    scrape_mask: int = 0
    gpus: tuple[int, ...] = ()
    seen: int = 0
    model: str = ""
    sat_until: float = -math.inf
    gauge: str = ""
    gauge_pct: float = 0.0
    evidence: str = ""
    covered_until: float = 0.0
    waste_usd: float = 0.0
    unpriced_s: float = 0.0
    share_unused: float = 0.0
    job_gpus: int = 0
    used_s: float = 0.0
    seen_s: float = 0.0
    fed: int = 0
    fed_at: float = 0.0

    def __post_init__(self) -> None:
        if self.gpus:
            if len(self.gpus) > MAX_GPUS or len(set(self.gpus)) != len(self.gpus) or not all(0 <= i <= 255 for i in self.gpus):
                raise ValueError(f"a window's GPUs are at most {MAX_GPUS} distinct indexes 0..255")
            self.gpus = _gpus(self.gpus)
        if self.seen:  # saved before: bits by GPU index (each under 64, or it could not have been saved)
            indexes = [i for i in range(64) if self.seen >> i & 1]
            self.gpus, self.seen = _gpus(tuple(indexes)), 0
            self.worked = sum(1 << p for p, i in enumerate(indexes) if self.worked >> i & 1)
            self.scrape_mask = sum(1 << p for p, i in enumerate(indexes) if self.scrape_mask >> i & 1)

    def upgrade(self) -> DataStarvedTrainingState:
        """The same window and episode in the shape held now; figures left by an episode that ended (the
        old shape kept some) are dropped: the next episode sets each before it reads it."""
        episode = None
        if self.since is not None:
            episode = StarvedEpisode(since=self.since, fired_at=self.fired_at, last_report=self.last_report,
                                     evidence=self.evidence, covered_until=self.covered_until, waste_usd=self.waste_usd,
                                     unpriced_s=self.unpriced_s, share_unused=self.share_unused, job_gpus=self.job_gpus,
                                     used_s=self.used_s, seen_s=self.seen_s, fed=self.fed, fed_at=self.fed_at)  # fmt: skip
        saturated = None
        if (self.sat_until, self.gauge, self.gauge_pct) != (-math.inf, "", 0.0):
            saturated = SaturatedGauge(until=self.sat_until, gauge=self.gauge, pct=self.gauge_pct)
        return DataStarvedTrainingState(win=self.win, first_t=self.first_t, follows=self.follows, scrapes=self.scrapes,
                                        edges=self.edges, phase=self.phase, sums=self.sums, worked=self.worked,
                                        scrape_t=self.scrape_t, scrape_max=self.scrape_max,
                                        scrape_mask=self.scrape_mask, gpus=self.gpus, model=self.model,
                                        saturated=saturated, episode=episode)  # fmt: skip


DataStarvedTrainingState.saved_before = DataStarvedTrainingStateBefore



class DataStarvedTraining(DetectorBase):
    type: ClassVar[str] = "data_starved_training"
    title: ClassVar[str] = "Training starved of data"
    Params: ClassVar[builtins.type[DataStarvedTrainingParams]] = DataStarvedTrainingParams
    State: ClassVar[builtins.type[DataStarvedTrainingState]] = DataStarvedTrainingState
    consumes: ClassVar[tuple[builtins.type, ...]] = (GpuMetric, UsageEvent)
    behaviour: ClassVar[bool] = True
    suggestion: ClassVar[str] = (
        "The GPUs wait on the input pipeline: raise the data loader's workers (PyTorch DataLoader "
        "num_workers, pin_memory, prefetch_factor; tf.data AUTOTUNE), prefetch to the GPU, move "
        "decoding/augmentation to the GPU (NVIDIA DALI), or read shards from faster storage "
        "(local NVMe cache instead of network storage)."
    )

    def __init__(self, name: str, severity: str, params: Any, pricing: Any = None) -> None:
        super().__init__(name, severity, params, pricing)
        self._last_win = -math.inf
        """The latest window start a host moved to: the next host to move there holds this float, not
        one of its own (windows are aligned: 24 bytes a host)."""

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        used, pct = details.get("used_pct"), details.get("host_pct")
        used_text = f"{used:.0f} %" if isinstance(used, (int, float)) else "-"
        facts = [("GPU use", f"{used_text} of {details.get('job_gpus', 0)} GPUs' time")]
        if details.get("host_gauge"):
            pct_text = f"{pct:.0f} %" if isinstance(pct, (int, float)) else "-"
            facts.append(("Host", f"{details['host_gauge']} at {pct_text}"))
        if details.get("evidence"):
            facts.append(("Evidence", str(details["evidence"])))
        return facts

    def tracking(self, state: DataStarvedTrainingState, t: float) -> Behaviour:
        return Behaviour.LEVEL if state.episode is not None else Behaviour.NONE

    def step(self, state: DataStarvedTrainingState, ctx: Context, event: Event, t: float) -> list[Finding]:
        if type(event) is UsageEvent:
            return self._on_usage(state, ctx.resource, event, t)
        if type(event) is GpuMetric:
            return [f for _, f in self.step_scrape(state, ctx, Scrape([event]), t)]
        return []

    def step_scrape(self, state: DataStarvedTrainingState, ctx: Context, scrape: Scrape,
                    t: float) -> list[tuple[int, Finding]]:  # fmt: skip
        """The samples of one scrape (all at ``t``) in one call: this runs for every scrape of every host.
        What a new scrape closes (the previous scrape, perhaps a window) is the first sample's doing.
        The usual scrape is the host's GPUs ``0 .. n-1`` once each, as before (the scrape says so in O(1)):
        a GPU's place is then its index and its sample's, and no sample is a repeat."""
        st = state
        if t < st.scrape_t:
            return []  # late samples of a scrape already closed
        found: list[Finding] = []
        if t > st.scrape_t:
            self._close_scrape(st)
            if t >= st.win + self.params.window:
                found = self._close_window(st, ctx.resource, t)
            st.scrape_t, st.scrape_max, st.scrape_mask = t, 0.0, 0
            if st.scrapes == 0:
                st.first_t = t
        sums = st.sums
        if sums is None:
            sums = st.sums = per_gpu()
        wait_below, mask, worked, top = self.params.wait_below, st.scrape_mask, st.worked, st.scrape_max
        n, gpus = len(sums), st.gpus
        events, utils = scrape.samples, scrape.resident()  # util_pct, or gr_engine_active when higher
        if utils and scrape.gpus is gpus and not mask and n >= len(gpus):
            for gpu, util in enumerate(utils):
                sums[gpu] += util
                if util >= wait_below:
                    worked |= 1 << gpu
            mask, most = (1 << len(gpus)) - 1, max(utils)
            if most > top:
                top = most
        else:
            top, mask, worked = self._gather(st, events, utils, top, mask, worked)
        st.scrape_mask, st.worked, st.scrape_max = mask, worked, shared_whole(top)
        model = events[-1].model if events else ""
        if model and model != st.model:
            st.model = intern(model)
        return [(0, f) for f in found] if found else []

    def _gather(self, st: DataStarvedTrainingState, events: list[GpuMetric], utils: tuple[float, ...], top: float,
                mask: int, worked: int) -> tuple[float, int, int]:  # fmt: skip
        """The scrape's samples one by one (GPUs new, out of order or repeated): the busiest, the GPUs
        counted and those that worked, after."""
        sums = st.sums
        assert sums is not None
        wait_below, n, gpus = self.params.wait_below, len(sums), st.gpus
        ident = len(gpus) if gpus is _FIRST[len(gpus)] else 0  # GPUs 0..n-1 seen in order (most hosts): place = index
        for i, ev in enumerate(events):
            gpu = ev.gpu_index
            if gpu < ident:
                bit = 1 << gpu
            else:
                p = gpus.index(gpu) if gpu in gpus else -1
                if p < 0:
                    if len(gpus) >= MAX_GPUS:
                        continue  # past the host's first 64 GPUs: no host has them
                    p, gpus = len(gpus), _gpus((*gpus, gpu))
                    st.gpus = gpus
                    if gpu == p == ident:
                        ident += 1
                bit = 1 << p
            if mask & bit:
                continue  # the same GPU again in one scrape (a re-read message)
            mask |= bit
            if gpu >= n:
                grow(sums, gpu)
                n = len(sums)
            util = utils[i]
            sums[gpu] += util
            if util >= wait_below:
                worked |= bit
            if util > top:
                top = util
        return top, mask, worked

    def open_episode(self, state: DataStarvedTrainingState, resource: ResourceInfo) -> Finding | None:
        ep = state.episode
        if ep is None or ep.fired_at is None:
            return None
        return self._finding("update", state, ep, resource, ep.covered_until)

    # -- gathering ----------------------------------------------------------

    def _close_scrape(self, st: DataStarvedTrainingState) -> None:
        if st.scrape_mask == 0:
            return
        st.scrapes += 1
        top = st.scrape_max
        if top >= self.params.busy_above:
            if st.phase == _WAITING:
                st.edges += 1
            st.phase = _BURST
        elif top < self.params.wait_below:
            st.phase = _WAITING
        st.scrape_mask = 0

    def _on_usage(self, st: DataStarvedTrainingState, res: ResourceInfo, ev: UsageEvent, t: float) -> list[Finding]:
        p = self.params
        metrics = ev.metrics
        if metrics:
            for name, above in zip(HOST_GAUGES, (p.cpu_above, p.disk_above, p.network_above), strict=True):
                value = metrics.get(name)
                if value is not None and above <= value <= MAX_GAUGE_PCT:
                    sat = st.saturated
                    if sat is None:
                        sat = st.saturated = SaturatedGauge()
                    end_t = t + ev.interval_s
                    if end_t > sat.until:
                        sat.until = end_t
                    sat.gauge, sat.pct = name, min(value, 100.0)
                    break
        ep = st.episode
        if ep is None:
            return []
        if not res.billed:
            since = ep.since or 0.0
            if t < since:  # a stop from before the episode began (read behind its samples, or sent again): in
                return []  # time order the host ran again after it, and this episode began then
            found = end(ep, partial(self._finding, "resolve", st, ep, res, max(t, since), reason=f"instance_{res.state}"))
            st.episode = None
            return found
        if ep.unpriced_s and res.usd_per_hour is not None:
            ep.waste_usd += usd_over(res.usd_per_hour, ep.unpriced_s)
            ep.unpriced_s = 0.0
        return []

    def _close_window(self, st: DataStarvedTrainingState, res: ResourceInfo, t: float) -> list[Finding]:
        """Judge the window gathered so far, then start the one ``t`` falls in."""
        p = self.params
        found: list[Finding] = []
        win_start, win_end = st.win, st.win + p.window
        new_win = math.floor(t / p.window) * p.window
        if st.scrapes:
            found = self._judge(st, res, win_start if st.follows else max(win_start, st.first_t), win_end)
        st.follows = bool(st.scrapes) and new_win == win_end
        if new_win > win_end:  # a whole window without a sample: telemetry lost
            st.phase = 0
            if st.episode is not None and st.episode.fired_at is None:
                st.episode = None  # the count starts again
        last = self._last_win  # read once: the float every host that moved to this window holds
        st.win = self._last_win = last if new_win == last else new_win
        st.scrapes = st.edges = st.worked = 0
        if st.sums is not None:
            for i in range(len(st.sums)):
                st.sums[i] = 0.0
        return found

    def _judge(self, st: DataStarvedTrainingState, res: ResourceInfo, start: float, win_end: float) -> list[Finding]:
        p = self.params
        job = sorted(gpu for p, gpu in enumerate(st.gpus) if st.worked >> p & 1)
        sums = st.sums
        used = sum(sums[i] for i in job) / (st.scrapes * len(job) * 100.0) if job and sums is not None else 0.0
        sawtooth = st.edges >= p.min_bursts
        saturated = st.saturated is not None and st.saturated.until > start and p.wait_below <= used * 100.0
        starved = bool(job) and used * 100.0 < p.util_below and (sawtooth or saturated)
        ep = st.episode
        if not starved:
            if ep is None:
                return []
            ep.fed += 1
            if ep.fed == 1:
                ep.fed_at = start
            if ep.fed < p.fed_windows:
                return []  # not counted; a second fed window in a row ends it from this one's start
            fed_at, ending = ep.fed_at, ep
            found = end(ep, partial(self._finding, "resolve", st, ending, res, max(fed_at, ending.covered_until),
                                                  reason="gpus_fed"))  # fmt: skip
            st.episode = None
            return found
        if ep is not None:
            ep.fed = 0
        if not res.billed and res.known:
            return []
        if ep is None:
            ep = st.episode = StarvedEpisode(since=start)
        since = ep.since
        assert since is not None
        host_gpus = res.gpus or len(st.gpus) or 1  # the instance type's GPUs, else those seen
        share = min(1.0, len(job) / host_gpus)
        seconds = win_end - start
        ep.share_unused = share * (1.0 - used)
        ep.job_gpus = len(job)
        ep.used_s += used * seconds
        ep.seen_s += seconds
        ep.evidence = "sawtooth" if sawtooth and not saturated else "host_saturated" if not sawtooth else "both"
        if res.usd_per_hour is None:
            ep.unpriced_s += seconds * ep.share_unused
        else:
            ep.waste_usd += usd_over(res.usd_per_hour * ep.share_unused, seconds)
        ep.covered_until = win_end
        if not res.billed:
            return []
        action = advance(ep, win_end, start=since, held_s=win_end - since, need_s=p.for_,
                         every_s=p.update_every)  # fmt: skip
        if action is None or ep.fired_at is None:
            return []
        return [self._finding(action, st, ep, res, ep.fired_at if action == "fire" else win_end)]

    def _finding(self, action: str, st: DataStarvedTrainingState, ep: StarvedEpisode, res: ResourceInfo, at: float,
                 **extra: object) -> Finding:  # fmt: skip
        assert ep.since is not None and ep.fired_at is not None
        used_pct = 100.0 * ep.used_s / ep.seen_s if ep.seen_s else 0.0
        details: dict[str, Any] = {
            "gpu_count": res.gpus or len(st.gpus), "gpu_model": st.model, "job_gpus": ep.job_gpus,
            "used_pct": round(used_pct, 1), "evidence": ep.evidence,
            "episode_s": round(max(at, ep.covered_until) - ep.since, 3), **extra,
        }  # fmt: skip
        sat = st.saturated
        if ep.evidence != "sawtooth" and sat is not None and sat.gauge:
            details["host_gauge"], details["host_pct"] = sat.gauge, round(sat.pct, 1)
        rate = (res.usd_per_hour or 0.0) * ep.share_unused
        return make_finding(self, action, res, episode_start=ep.since, fired_at=ep.fired_at, at=at,
                            usd=ep.waste_usd, details=details, usd_per_hour=rate)  # fmt: skip
