"""Feature windows: what the anomaly model sees of a resource, one row per window.

Per resource and tumbling window of event time (5 minutes by default), from its usage
events and GPU samples: the cost rate, GPU utilisation mean and p95, GPU memory in use,
power per GPU, power relative to utilisation, egress rate, storage change and request
rate, and the mean of each generic metric the rule names (``metrics: [cpu_util]``: keys
of a usage event's ``metrics``, or numeric fields a producer sent beyond the contract,
kept in its ``extra``). Each is also taken against the resource's own history,
twice, on the log scale the model sees (log(1 + x)) and against its usual level (a
24-hour half-life mean): relative (``_rel``), the window over its usual level, so "this
host draws twice its usual power" is a feature as much as "this host draws 600 W"; and
standardised (``_z``), how many of the resource's own standard deviations the window
lies from it. (A 15-minute "recent level" smoothed ``_rel`` before severity came from
runs of windows; it also kept an anomaly open for hours after the resource came back.)
The ``_z`` features are what let one forest judge resources whose levels differ by
orders of magnitude: a CPU at 0.07 % and one at 92 % are each measured in their own
spread. The baselines decay with event time, not with windows, so a series
sampled hourly and one sampled every minute mean the same by "24-hour half-life", and
they learn a value clipped to 3 deviations of the usual, so a spike moves them little
and a shift that lasts moves them step by step. A resource silent for longer than the
half-life (stopped, paused, gone dark) starts its baselines again when it comes back.

The same :class:`WindowBuilder` runs in the stream (inside the ``anomaly`` detector)
and over history in ClickHouse (``burnwatch model train``), so the model is trained
on exactly the rows it will score. Which features a resource type gets is decided
here, in :data:`FEATURE_SETS`, and nowhere else.
"""

from __future__ import annotations

import math
from array import array
from typing import ClassVar

import msgspec

from detector.events import Event, GpuMetric, UsageEvent
from detector.floats import FloatArray, Series, as_floats, bytewise, extend, narrowed, newer, per_gpu

__all__ = ["BASE_FEATURES", "FEATURE_SETS", "METRIC_PREFIX", "Window", "WindowBuilder", "WindowExtras", "WindowState",
           "WindowStateBefore", "base_features", "feature_names", "follows", "metrics_of", "model_group"]

BASE_FEATURES = {
    "cost_usd_per_hour": "what the resource costs per hour in the window (its intervals as priced and stored)",
    "gpu_util_mean": "mean util_pct over every GPU sample",
    "gpu_util_p95": "95th percentile of util_pct over every GPU sample",
    "gpu_mem_frac": "mean mem_used_mib / mem_total_mib",
    "power_w_per_gpu": "mean power_w per GPU sample",
    "power_per_util": "power per GPU over (utilisation + 5 %): high when power is drawn without work",
    "egress_gb_per_hour": "egress_bytes per hour",
    "storage_delta_gb": "change of storage_bytes over the window",
    "requests_per_s": "requests served per second",
}
_GPU = ["cost_usd_per_hour", "gpu_util_mean", "gpu_util_p95", "gpu_mem_frac", "power_w_per_gpu", "power_per_util",
        "egress_gb_per_hour"]  # fmt: skip
FEATURE_SETS: dict[str, list[str]] = {
    "gpu": _GPU,
    "inference": [*_GPU, "requests_per_s"],
    "cpu": ["cost_usd_per_hour", "egress_gb_per_hour"],
    "storage": ["cost_usd_per_hour", "storage_delta_gb"],
}
"""Model group → its base features. Every base feature also appears relative to the
resource's baseline (``<name>_rel``) and standardised against it (``<name>_z``)."""
METRIC_PREFIX = "metric."
"""Generic metrics (a usage event's ``metrics``) are features named ``metric.<name>``."""
_GROUP_OF = {"gpu_instance": "gpu", "notebook": "gpu", "inference_endpoint": "inference", "cpu_instance": "cpu",
             "storage_bucket": "storage", "vector_db": "storage"}  # fmt: skip
_GPU_GROUPS = frozenset(("gpu", "inference"))
"""The groups whose windows need GPU samples: without any, the host's telemetry is missing."""
HALF_LIFE_S = 86_400.0
CLIP_SIGMAS = 3.0
"""A window teaches the baseline at most this many of its deviations away from the usual level."""
MIN_SCALE = 0.001
"""Smallest deviation a ``_z`` feature divides by, on the model's log1p scale: about a 0.1 % change of a
figure above 1, a change of 0.001 of one below. A series that never moved (a price list's constant cost)
learns its first move as its whole spread, so any move would read as far out however small: with a floor
of 1e-9, a 0.001 % price change opened an anomaly on every such resource that never closed. (0.01 cost
the real series' F1 0.260 -> 0.249; 0.001 keeps it: docs/detection.md.)"""
Z_CAP = 1e6
REL_CAP = 50.0
"""Largest log-ratio a ``_rel`` feature holds (its exponential stays a finite float)."""


def _log(x: float) -> float:
    """The model's scale: log(1 + |x|) with x's sign (costs and rates span orders of magnitude)."""
    return math.copysign(math.log1p(abs(x)), x)


def _number(value: object) -> float | None:
    """A field a producer sent beyond the contract (``extra``) as a metric, if it is a finite number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _forget(st: WindowState) -> None:
    """Drop a resource's baselines (it comes back after a silence longer than their half-life):
    it is judged against the fleet again until its new baseline covers ``min_history``."""
    st.baseline, st.baseline_names = None, ()


def follows(seq: int, end: float, window: Window) -> bool:
    """Whether ``window`` continues a run of judged windows whose last was number ``seq``, ending
    at ``end``: the resource's next closed window, after no silence longer than the baselines'
    half-life. Runs of evidence build only this way, in the stream and in training's calibration."""
    return window.seq == seq + 1 and window.start - end <= HALF_LIFE_S


def _unlog(y: float) -> float:
    return math.copysign(math.expm1(min(abs(y), 700.0)), y)


def model_group(resource_type: str) -> str:
    """The model a resource type is scored by (one IsolationForest per group)."""
    return _GROUP_OF.get(resource_type, "cpu")


def base_features(group: str, metrics: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The group's base features, then one per generic metric, in the order given."""
    return [*FEATURE_SETS[group], *(METRIC_PREFIX + m for m in metrics)]


def feature_names(group: str, metrics: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Every column the model sees, in order: the base features, then each relative to the
    resource's baseline, then each standardised against it."""
    base = base_features(group, metrics)
    return [*base, *(f"{name}_rel" for name in base), *(f"{name}_z" for name in base)]


def metrics_of(features: list[str]) -> tuple[str, ...]:
    """The generic metrics a feature list was built with (a model file's ``features``)."""
    return tuple(f[len(METRIC_PREFIX):] for f in features if f.startswith(METRIC_PREFIX) and not f.endswith(("_rel", "_z")))


class WindowExtras(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False, forbid_unknown_fields=True):
    """The open window's figures most resources never have: storage levels (buckets, vector
    databases), requests (endpoints), generic metrics. Made at the window's first such event,
    dropped when it closes: six fields fewer on every other resource."""

    storage_first: float | None = None
    storage_last: float | None = None
    requests: float = 0.0
    request_s: float = 0.0
    metric_mean: dict[str, float] | None = None
    """The window's running mean per generic metric, and below how many values it has (None: none yet)."""
    metric_n: dict[str, int] | None = None


class WindowState(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False, forbid_unknown_fields=True):
    """One resource's open window and its baselines. Saved without the fields at their defaults; a
    window saved in the shape before :class:`WindowExtras` (:class:`WindowStateBefore`) is refused
    here (its fields are unknown) and read through that class (:mod:`detector.saved`)."""

    start: float | None = None
    cost_usd: float = 0.0
    usage_s: float = 0.0
    utils: Series | None = None
    """The window's GPU utilisation samples, unboxed: a byte each while they are whole percents (as
    DCGM and NVML report them), 8 bytes once one is not (:func:`detector.floats.append`), never a
    float object's 32; saved as a list (:mod:`detector.floats`). None while the window has none
    (every window of a resource without GPUs): no empty array on every key."""
    mem_frac_sum: float = 0.0
    power_sum: float = 0.0
    gpu_samples: int = 0
    gpu_last: FloatArray | None = None
    """Latest sample time per GPU index in the window (:func:`detector.floats.per_gpu`): a re-read
    sample is not counted twice. None while :attr:`gpu_t` and :attr:`gpu_n` say it (the usual host)."""
    gpu_t: float | None = None
    gpu_n: int = 0
    """GPUs ``0 .. gpu_n-1``, and no other, have a sample in the window, each latest at ``gpu_t``: what
    ``gpu_last`` would hold on a host whose scrapes name its GPUs in order (most hosts), in two slots and
    the float the key's latest GPU time already is, not an array (80 bytes and 8 a GPU). A scrape or
    sample that does not fit makes the array (:meth:`WindowBuilder._newer`). Only the window's samples
    matter (an earlier window's are older than any sample the window takes), so both start afresh with
    each window."""
    usage_last: float = 0.0
    egress_bytes: float = 0.0
    covered: bool = False
    """A rule tracked unusual behaviour during the window: scored, but it opens no anomaly."""
    paused: bool = False
    """... and that behaviour was a pause of the resource's usual work: neither judged nor learnt."""
    extra: WindowExtras | None = None
    """Storage levels, requests and generic metrics of the window; None while it has none."""
    baseline: FloatArray | None = None
    """What the baselines learnt, one array of doubles (None before the first window learnt): first
    :attr:`weight`, :attr:`windows`, :attr:`first` and :attr:`learnt_at` (NaN for None: event times are
    finite), then the usual level and variance of each feature of ``baseline_names`` (24-hour half-life)
    on the model's log scale, interleaved (level, variance, level, ...): 8 bytes a figure, not a slot
    and a float or int object each (two dict slots and two floats a feature before)."""
    baseline_names: tuple[str, ...] = ()
    """The features ``baseline`` holds, in order: the builder's tuple for the group, shared by every
    resource of it (:meth:`WindowBuilder.bases`); none before the first window learnt."""
    closes: int = 0
    """Windows closed, learnt or not: consecutive judged windows have consecutive numbers."""
    saved_before: ClassVar[type[WindowStateBefore]]
    """The shape saved before, which reads what this one refuses (:func:`detector.saved.read_state`)."""

    def __post_init__(self) -> None:
        if self.utils is not None:  # saved before as an empty list: none, as now; bytes read back as doubles: bytes
            self.utils = narrowed(self.utils) if self.utils else None
        if self.gpu_last is not None and not self.gpu_last:
            self.gpu_last = None
        if not 0 <= self.gpu_n <= 256 or (self.gpu_n > 0) != (self.gpu_t is not None) or (self.gpu_n and self.gpu_last):
            raise ValueError("a window's GPUs are 0 .. gpu_n-1 at gpu_t, or a per-GPU array, not both")
        if self.baseline is not None and not self.baseline:
            self.baseline = None
        if self.baseline is not None and len(self.baseline) != _FEATURES_AT + 2 * len(self.baseline_names):
            raise ValueError("a window's baselines hold four figures, then a level and a variance per feature")

    @property
    def weight(self) -> float:
        """The exponential weights' total so far: the variance over it is unbiased while the
        history is short (a variance started at zero would call every early window far out)."""
        return self.baseline[0] if self.baseline is not None else 0.0

    @property
    def windows(self) -> int:
        """Windows learnt."""
        return int(self.baseline[1]) if self.baseline is not None else 0

    @property
    def first(self) -> float | None:
        """Start of the first window learnt: how much history the baselines cover."""
        return _time(self.baseline[2]) if self.baseline is not None else None

    @property
    def learnt_at(self) -> float | None:
        """End of the last window learnt: the baselines decay with the event time since."""
        return _time(self.baseline[3]) if self.baseline is not None else None

    def known(self) -> dict[str, tuple[float, float]]:
        """Feature → its usual level and variance, for the features the baselines hold."""
        b = self.baseline
        if b is None:
            return {}
        return {name: (b[_FEATURES_AT + 2 * i], b[_FEATURES_AT + 2 * i + 1]) for i, name in enumerate(self.baseline_names)}


_FEATURES_AT = 4
"""Where the features' levels and variances start in :attr:`WindowState.baseline`."""


def _time(x: float) -> float | None:
    return None if math.isnan(x) else x


class WindowStateBefore(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False, forbid_unknown_fields=True):
    """A window as snapshots saved it until 2026-12-02 (the rare figures inline; before that, the
    baselines as two dicts by name): read only to be made a :class:`WindowState` (:meth:`upgrade`)."""

    start: float | None = None
    cost_usd: float = 0.0
    usage_s: float = 0.0
    utils: Series | None = None
    mem_frac_sum: float = 0.0
    power_sum: float = 0.0
    gpu_samples: int = 0
    gpu_last: FloatArray | None = None
    usage_last: float = 0.0
    egress_bytes: float = 0.0
    covered: bool = False
    paused: bool = False
    storage_first: float | None = None
    storage_last: float | None = None
    requests: float = 0.0
    request_s: float = 0.0
    metric_mean: dict[str, float] | None = None
    metric_n: dict[str, int] | None = None
    baseline: FloatArray | None = None
    baseline_names: tuple[str, ...] = ()
    log_mean: dict[str, float] | None = None
    log_var: dict[str, float] | None = None
    weight: float = 0.0
    windows: int = 0
    first: float | None = None
    learnt_at: float | None = None
    closes: int = 0

    def __post_init__(self) -> None:
        if self.utils is not None and not self.utils:  # saved before as an empty list: none, as now
            self.utils = None
        if self.gpu_last is not None and not self.gpu_last:
            self.gpu_last = None
        if self.baseline is not None and not self.baseline:
            self.baseline = None
        if self.log_mean is not None or self.log_var is not None:  # saved before: level and variance by name
            means, variances = self.log_mean or {}, self.log_var or {}
            names = tuple(dict.fromkeys([*means, *variances]))
            self.baseline = array("d", [x for name in names for x in (means.get(name, 0.0), variances.get(name, 0.0))])
            self.baseline_names, self.log_mean, self.log_var = names, None, None

    def upgrade(self) -> WindowState:
        """The window in the shape held now: the same figures, the rare ones in :class:`WindowExtras`."""
        extra = WindowExtras(storage_first=self.storage_first, storage_last=self.storage_last, requests=self.requests,
                             request_s=self.request_s, metric_mean=self.metric_mean, metric_n=self.metric_n)  # fmt: skip
        baseline = None
        learnt = (self.weight, self.windows, self.first, self.learnt_at) != (0.0, 0, None, None)
        if self.baseline is not None or learnt:
            first, learnt_at = (math.nan if x is None else x for x in (self.first, self.learnt_at))
            baseline = array("d", [self.weight, self.windows, first, learnt_at, *(self.baseline or ())])
        return WindowState(start=self.start, cost_usd=self.cost_usd, usage_s=self.usage_s, utils=self.utils,
                           mem_frac_sum=self.mem_frac_sum, power_sum=self.power_sum, gpu_samples=self.gpu_samples,
                           gpu_last=self.gpu_last, usage_last=self.usage_last, egress_bytes=self.egress_bytes,
                           covered=self.covered, paused=self.paused, extra=None if extra == WindowExtras() else extra,
                           baseline=baseline, baseline_names=self.baseline_names, closes=self.closes)  # fmt: skip


WindowState.saved_before = WindowStateBefore
_NO_EXTRAS = WindowExtras()
"""What a window without storage, requests or metrics reads (never written)."""


class Window(msgspec.Struct, kw_only=True, frozen=True):
    """A closed window: its features (base and relative), the baseline they were judged
    against, and the dollars it cost."""

    resource_id: str
    group: str
    start: float
    end: float
    values: dict[str, float]
    usual: dict[str, tuple[float, float, float]]
    """Base feature → its usual level and the range two deviations either side (in the
    feature's units), before this window: what an alert explains a feature against."""
    cost_usd: float
    history: int
    """Windows the baseline had seen before this one."""
    history_s: float = 0.0
    """Event time the baseline covered before this one."""
    seq: int = 0
    """The resource's closed-window number: a gap means windows in between were not judged."""
    covered: bool = False
    """A rule tracked unusual behaviour on the resource during the window: scored, opens nothing."""
    names: tuple[str, ...] = ()
    """The features, in the model's column order."""
    own_history: bool = True
    """False: judged against the fleet alone (:meth:`against_fleet`)."""

    def against_fleet(self) -> Window:
        """This window with its own-history features neutral (``_rel`` 1, ``_z`` 0): a resource
        whose baseline is too short to mean anything is judged by its levels against the
        fleet's (the group's forest), the fallback for new resources."""
        values = {k: 1.0 if k.endswith("_rel") else 0.0 if k.endswith("_z") else v for k, v in self.values.items()}
        return msgspec.structs.replace(self, values=values, own_history=False)

    def vector(self) -> list[float]:
        """The row the model sees: levels as log(1 + x), ratios as log(x), standardised
        distances as log(1 + |z|) with their sign. Costs and rates span orders of magnitude
        across resources, and an isolation forest splits at uniform random points between a
        feature's extremes: on a log scale a 3x change means the same on a $0.50/h instance
        as on a $55/h one."""
        row = []
        for name in self.names:
            x = self.values[name]
            row.append(math.log(max(x, 1e-6)) if name.endswith("_rel") else math.copysign(math.log1p(abs(x)), x))
        return row


class WindowBuilder:
    """Folds a resource's events into tumbling windows; returns a :class:`Window` when one closes."""

    def __init__(self, window_s: float = 300.0, half_life_s: float = HALF_LIFE_S,
                 metrics: tuple[str, ...] | list[str] = ()) -> None:  # fmt: skip
        self.window_s = window_s
        self.half_life_s = half_life_s
        self.metrics = tuple(metrics)
        self._names: dict[str, tuple[str, ...]] = {}
        self._bases: dict[str, tuple[str, ...]] = {}
        self._layouts: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {}
        self._last_start = self._last_end = -math.inf
        """The latest window start a resource moved to, and end a resource closed: the next with the
        same holds this float, not one of its own (windows are aligned, so a fleet's keys share one:
        24 bytes a key each)."""

    @staticmethod
    def _shared(t: float, latest: float) -> float:
        """``latest`` if it is ``t`` (the float other resources hold), else ``t``. Read once by the
        caller: a builder used from two threads hands each the value it asked for."""
        return latest if t == latest else t

    def names(self, group: str) -> tuple[str, ...]:
        names = self._names.get(group)
        if names is None:
            names = self._names[group] = tuple(feature_names(group, self.metrics))
        return names

    def bases(self, group: str) -> tuple[str, ...]:
        """The group's base features (:func:`base_features`), one tuple per group: what a resource's
        baselines are kept for (:attr:`WindowState.baseline_names`)."""
        bases = self._bases.get(group)
        if bases is None:
            bases = self._bases[group] = tuple(base_features(group, self.metrics))
        return bases

    def add(self, st: WindowState, resource_id: str, resource_type: str, interval_usd: float, event: Event,
            t: float, covered: bool = False, paused: bool = False) -> Window | None:  # fmt: skip
        """Fold one event in. ``interval_usd``: what a usage event's interval cost, priced by the
        engine's :class:`~detector.pricing.Pricer` (the figure the store keeps), so the cost
        feature is the stored cost. ``covered``: a rule is tracking unusual behaviour on the resource
        now, so the window is scored but opens no anomaly (the rule has the first word).
        ``paused``: that behaviour is a pause of the resource's usual work (idle, hung, dark), so
        the window is neither judged nor learnt and the baselines wait for the work to come back.
        A covered window that is not a pause (a runaway: a level) is learnt, so that when the
        rule lets go of it, having absorbed the level into its own baseline, the model judges
        what follows against the resource's present and does not alert on the same change again."""
        closed, late = self._enter(st, resource_id, resource_type, t)
        if late:
            return None
        if covered:
            st.covered = True
            st.paused = st.paused or paused
        if type(event) is GpuMetric:
            if self._newer(st, event.gpu_index, t):
                self._fold(st, [event])
        elif type(event) is UsageEvent:
            if t <= st.usage_last:
                return closed
            st.usage_last = t
            if event.state == "running":
                st.cost_usd += interval_usd
                st.usage_s += event.interval_s
            if event.egress_bytes is not None:
                st.egress_bytes += event.egress_bytes
            if event.storage_bytes is not None:
                extra = st.extra
                if extra is None:
                    extra = st.extra = WindowExtras()
                if extra.storage_first is None:
                    extra.storage_first = float(event.storage_bytes)
                extra.storage_last = float(event.storage_bytes)
            if event.requests is not None:
                extra = st.extra
                if extra is None:
                    extra = st.extra = WindowExtras()
                extra.requests += event.requests
                extra.request_s += event.interval_s
            if self.metrics and (event.metrics or event.extra):
                for name in self.metrics:
                    value = event.metrics.get(name)
                    if value is None:
                        value = _number(event.extra.get(name))
                    if value is not None:  # a running mean: two huge values never sum to inf
                        extra = st.extra
                        if extra is None:
                            extra = st.extra = WindowExtras()
                        if extra.metric_n is None or extra.metric_mean is None:
                            extra.metric_mean, extra.metric_n = {}, {}
                        n = extra.metric_n.get(name, 0) + 1
                        mean = extra.metric_mean.get(name, 0.0)
                        step = value - mean  # huge values of opposite signs: their difference overflows
                        extra.metric_mean[name] = mean + step / n if math.isfinite(step) else mean * (1 - 1 / n) + value / n
                        extra.metric_n[name] = n
        return closed

    def paused_through(self, st: WindowState, t: float) -> bool:
        """Whether an event at ``t`` falls in a window that a pause has marked already (or in one closed
        before it): what the other rules track at ``t`` cannot change that window, so it need not be asked."""
        start = st.start
        return st.paused and start is not None and t - t % self.window_s <= start

    def _enter(self, st: WindowState, resource_id: str, resource_type: str, t: float) -> tuple[Window | None, bool]:
        """Move to the window ``t`` falls in: the window this closed, if any, and whether ``t`` is late
        for a window already closed."""
        start = t - t % self.window_s
        if st.start is None or start > st.start:
            closed = self._close(st, resource_id, resource_type) if st.start is not None else None
            st.start = self._last_start = self._shared(start, self._last_start)
            return closed, False
        return None, start < st.start

    def add_scrape(self, st: WindowState, resource_id: str, resource_type: str, samples: list[GpuMetric],
                   in_order: bool, t: float, covered: bool = False, paused: bool = False) -> Window | None:  # fmt: skip
        """:meth:`add` for each of one scrape's GPU samples (all at ``t``) in one call: the window the
        first closed, if any; ``covered`` and ``paused`` as :meth:`add` takes them. ``in_order``: the
        samples are GPUs ``0 .. n-1`` in that order (the usual scrape), which a window that holds its
        GPUs as ``gpu_t`` and ``gpu_n`` takes or refuses whole, as :meth:`_newer` would sample by
        sample, with no per-GPU array."""
        if not samples:
            return None
        closed, late = self._enter(st, resource_id, resource_type, t)
        if late:
            return None
        if covered:
            st.covered = True
            st.paused = st.paused or paused
        if in_order and st.gpu_last is None:
            m, n, last = len(samples), st.gpu_n, st.gpu_t
            if last is None or t > last:
                if m >= n:  # each GPU's latest is older (or none): every sample is taken
                    self._fold(st, samples)
                    st.gpu_t, st.gpu_n = t, m
                    return closed
            elif t == last:  # GPUs 0 .. n-1 are read again; the next ones are new
                if m > n:
                    self._fold(st, samples[n:])
                st.gpu_n = max(n, m)
                return closed
            elif m <= n:
                return closed  # each GPU's latest is later: none is taken
        taken = [event for event in samples if self._newer(st, event.gpu_index, t)]
        if taken:
            self._fold(st, taken)
        return closed

    @staticmethod
    def _newer(st: WindowState, index: int, t: float) -> bool:
        """Whether GPU ``index``'s sample at ``t`` is newer than its latest in the window; if so it
        becomes that. Exactly :func:`detector.floats.newer` on ``gpu_last``, which is made from
        ``gpu_t`` and ``gpu_n`` (GPUs ``0 .. n-1`` at ``gpu_t``) when a sample does not fit them."""
        times = st.gpu_last
        if times is None:
            n, last = st.gpu_n, st.gpu_t
            if last is not None and index < n and t <= last:
                return False  # read again, or late
            if index == n and (last is None or t == last):
                st.gpu_t, st.gpu_n = (t if last is None else last), n + 1  # the next GPU of the scrape
                return True
            if n == 1 and index == 0:  # a one-GPU host's next sample (t > last here)
                st.gpu_t = t
                return True
            times = st.gpu_last = array("d", [last]) * n if last is not None else per_gpu()
            st.gpu_t, st.gpu_n = None, 0
        return newer(times, index, t)

    @staticmethod
    def _fold(st: WindowState, samples: list[GpuMetric]) -> None:
        """Take GPU samples (at least one; a scrape's in one call) into the window, in order: each sum
        is added to sample by sample, in that order (a float sum depends on it)."""
        st.utils = extend(st.utils if st.utils is not None else bytewise(), [event.util_pct for event in samples])
        mem = st.mem_frac_sum
        for event in samples:
            if event.mem_total_mib > 0:
                mem += event.mem_used_mib / event.mem_total_mib
        st.mem_frac_sum = mem
        st.power_sum = sum([event.power_w for event in samples], st.power_sum)
        st.gpu_samples += len(samples)

    def _close(self, st: WindowState, resource_id: str, resource_type: str) -> Window | None:
        group = model_group(resource_type)
        start = st.start or 0.0
        end = self._last_end = self._shared(start + self.window_s, self._last_end)
        st.closes += 1
        window = None
        # Nothing judged or learnt without billed usage, with a GPU host's telemetry missing,
        # or while a rule tracks a pause of the resource's work (most closed windows: asked before
        # the figures are worked out); a window during a rule's other episodes is scored and
        # learnt (see ``add``), and opens nothing (the rule's first word).
        if st.usage_s > 0 and not st.paused and (st.gpu_samples or group not in _GPU_GROUPS):
            base = self._base_values(st)
            if all(map(math.isfinite, base.values())):  # sums of absurd values: neither judged nor learnt
                window = self._judge(st, base, resource_id, group, start, end)
        self._reset(st)
        return window

    def _judge(self, st: WindowState, base: dict[str, float], resource_id: str, group: str, start: float,
               end: float) -> Window:  # fmt: skip
        """The window of figures ``base`` against the resource's baselines, which then learn it."""
        names, bases, rels, zs = self._layout(group)
        if st.learnt_at is not None and end - st.learnt_at > self.half_life_s:
            _forget(st)  # a baseline older than its half-life says little about now: start again
        dt = end - st.learnt_at if st.learnt_at is not None else None
        logs = {name: _log(base[name]) for name in bases}
        known = st.known()
        weight = st.weight
        values = {name: base[name] for name in bases}
        usual = {}
        z_of = []
        for name, rel, y in zip(bases, rels, logs.values(), strict=True):
            mean, var = known.get(name, (y, 0.0))
            sd = math.sqrt(var / weight) if weight > 0.0 else 0.0
            usual[name] = (_unlog(mean), _unlog(mean - 2 * sd), _unlog(mean + 2 * sd))
            values[rel] = math.exp(max(-REL_CAP, min(REL_CAP, y - mean)))
            z_of.append(max(-Z_CAP, min(Z_CAP, (y - mean) / max(sd, MIN_SCALE))) if weight else 0.0)
        values.update(zip(zs, z_of, strict=True))
        window = Window(resource_id=resource_id, group=group, start=start, end=end, values=values, usual=usual,
                        cost_usd=st.cost_usd, history=st.windows,
                        history_s=end - st.first if st.first is not None else 0.0, seq=st.closes,
                        covered=st.covered, names=names)  # fmt: skip
        self._learn(st, logs, dt, known, bases, start, end)
        return window

    def _layout(self, group: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """The group's features in the model's order, its base features, and their ``_rel`` and ``_z``
        names (:func:`feature_names`), made once per group, not formatted at every window."""
        layout = self._layouts.get(group)
        if layout is None:
            names, bases = self.names(group), self.bases(group)
            rels, zs = names[len(bases) : 2 * len(bases)], names[2 * len(bases) :]
            if names != (*bases, *(f"{b}_rel" for b in bases), *(f"{b}_z" for b in bases)):
                raise AssertionError(f"the {group} features are not its bases, then _rel, then _z")
            layout = self._layouts[group] = (names, bases, rels, zs)
        return layout

    def _base_values(self, st: WindowState) -> dict[str, float]:
        utils = sorted(as_floats(st.utils)) if st.utils is not None else []
        n = st.gpu_samples
        util_mean = sum(utils) / n if n else 0.0
        power = st.power_sum / n if n else 0.0
        hours = st.usage_s / 3600.0
        extra = st.extra if st.extra is not None else _NO_EXTRAS
        first, last = extra.storage_first, extra.storage_last
        storage = (last - first) / 1e9 if first is not None and last is not None else 0.0
        return {
            "cost_usd_per_hour": st.cost_usd / hours if hours else 0.0,
            "gpu_util_mean": util_mean,
            "gpu_util_p95": utils[min(len(utils) - 1, int(0.95 * len(utils)))] if utils else 0.0,
            "gpu_mem_frac": st.mem_frac_sum / n if n else 0.0,
            "power_w_per_gpu": power,
            "power_per_util": power / (util_mean + 5.0) if n else 0.0,
            "egress_gb_per_hour": st.egress_bytes / 1e9 / hours if hours else 0.0,
            "storage_delta_gb": storage,
            "requests_per_s": extra.requests / extra.request_s if extra.request_s else 0.0,
            **{METRIC_PREFIX + m: (extra.metric_mean or {}).get(m, 0.0) for m in self.metrics},
        }

    def _learn(self, st: WindowState, logs: dict[str, float], dt: float | None, known: dict[str, tuple[float, float]],
               bases: tuple[str, ...], start: float, end: float) -> None:  # fmt: skip
        """Move the baselines towards the window (its base features on the log scale), by the event
        time since the last window learnt; once they have a spread, by at most ``CLIP_SIGMAS`` of it
        (a spike is not the usual level)."""
        a = 1.0 if dt is None else 1.0 - 0.5 ** (dt / self.half_life_s)
        for name, y in logs.items():
            mean, var = known.get(name, (y, 0.0))
            d = y - mean
            if var > 0.0 and st.weight > 0.0:
                limit = CLIP_SIGMAS * math.sqrt(var / st.weight)
                d = max(-limit, min(limit, d))
            known[name] = (mean + a * d, (1 - a) * (var + a * d * d))
        names = tuple(known)
        st.baseline_names = bases if names == bases else names  # the group's own: shared
        # the variance's weights: none for the first window (it sets the mean), a for each after
        weight, windows, first = (1 - a) * st.weight + (a if st.windows else 0.0), st.windows + 1, st.first
        st.baseline = array("d", [weight, windows, start if first is None else first, end,
                                  *(x for level_var in known.values() for x in level_var)])  # fmt: skip

    def _reset(self, st: WindowState) -> None:
        st.cost_usd = st.usage_s = st.mem_frac_sum = st.power_sum = 0.0
        st.utils = st.gpu_last = st.gpu_t = None
        st.gpu_samples = st.gpu_n = 0
        st.egress_bytes = 0.0
        st.extra = None
        st.covered = st.paused = False
