"""``egress_runaway``: a resource sending far more data than it usually does, at a price.

Example rule::

    - name: egress-runaway
      type: egress_runaway
      params:
        window: 15m          # the recent rate is the egress over this much event time
        multiple: 5          # runaway when the recent rate exceeds this many times the baseline
        baseline: 24h        # the baseline is the median 5-minute rate over this trailing time
        min_history: 6h      # judge nothing before this much baseline exists
        min_excess_usd_per_hour: 1   # and the excess must cost at least this much
        min_burst: 3m        # over the multiple this long (a checkpoint upload takes a minute or two)
        resolve_multiple: 2  # resolved once the last 5 minutes are back under this multiple
      severity: warning

Why these defaults: egress anomalies in practice (a loop re-downloading a dataset
across regions, a misrouted replication, a public bucket being scraped) run at tens
of times normal; a 5x multiple over a 15-minute window ignores diurnal traffic (day peaks
are 1.5-3x the daily median) and checkpoint uploads of a few minutes at a few times the usual
rate, and ``min_burst`` (3 minutes over the multiple) one at hundreds of times it for a minute or
two (100 GB at 10 Gbit/s); the
median over 24 hours is not dragged up by the runaway itself (5-minute buckets inside
an open episode are left out of it). The dollar floor keeps a tiny resource's 10x
jump quiet. Each destination class (same region, inter-region, internet; see
``rules/pricing.yaml``) has its own baseline and price. The dollars are the egress in
excess of the baseline since the first runaway interval. A burst that began a day after one
and two days after another at about the same time (a nightly backup; or a week) is a schedule,
told only once it outlasts the one before by half (:data:`SCHEDULE_PERIODS_S`).
"""

from __future__ import annotations

import builtins
import math
from functools import partial
from typing import Any, ClassVar

import msgspec
from pydantic import Field

from detector.detectors.base import Behaviour, Context, DetectorBase, Finding, Params, ResourceInfo, intern, make_finding
from detector.detectors.bucket_rates import BucketRates
from detector.detectors.episode import Episode, due, end, fire
from detector.events import Event, UsageEvent
from detector.floats import FloatArray, floats
from detector.pricing import egress_destination
from detector.units import Duration, Money

__all__ = ["EgressRunaway", "EgressRunawayParams", "EgressRunawayState"]

SCHEDULE_PERIODS_S = (86_400.0, 7 * 86_400.0)
"""A burst that began about a day after one and two days after another (or a week and two weeks) is a
schedule's (a nightly backup, a weekly export: cron and backup tools run daily or weekly), not a
runaway. Twice, not once: a resource with a few unrelated bursts a day finds one near the same time
the day before now and then (a runaway that comes back every 8 to 14 hours, once in a few days)."""
SCHEDULE_SLACK_S = 900.0
"""How far its start may move from the earlier one's: cron starts a job at the same minute each day,
and its transfer follows a dump or a queue of minutes. Wider, a resource with a few unrelated
bursts a day would find one near the same time the day before too often (an hour: one in five)."""
SCHEDULE_OVERRUN = 1.5
"""A scheduled burst that lasts this many times its earlier self (plus ``window``) is a runaway after
all: a backup stuck in a retry loop."""
MAX_BURSTS = 64
"""Bursts kept per destination (two weeks of a few a day)."""

BUCKET_S = 300.0
"""Baseline resolution: the median is taken over 5-minute rates. A bucket's start is a whole multiple
of it (an event time is a datetime's, well under 2^53 s), so ``start + k * BUCKET_S`` is exact."""
GB = 1e9


class EgressRunawayParams(Params):
    window: Duration = Field(default=900.0, gt=0)
    multiple: float = Field(default=5.0, gt=1)
    baseline: Duration = Field(default=86_400.0, gt=0)
    min_history: Duration = Field(default=6 * 3600.0, ge=0)
    min_excess_usd_per_hour: Money = 1.0
    min_burst: Duration = Field(default=180.0, ge=0)
    """Over the multiple this long (from its first interval's start to its latest's end) before firing:
    a checkpoint of 100 GB leaves in a minute or two at 10 Gbit/s, hundreds of times the usual rate,
    and a window's rate passes the multiple at its first interval. Minutes under the multiple between
    do not end it (a runaway in pulses), the recent rate back under ``resolve_multiple`` does."""
    resolve_multiple: float = Field(default=2.0, ge=1)
    update_every: Duration = Field(default=900.0, gt=0)


class DestinationState(Episode, kw_only=True):
    """Egress of one resource to one destination class, and its episode."""

    dest_region: str = ""
    last_t: float = 0.0
    first_t: float | None = None
    recent: FloatArray = msgspec.field(default_factory=floats)
    """(t, bytes, interval_s) of the intervals inside the short window, as triples flattened
    (``t0, b0, s0, t1, b1, s1...``: 24 bytes an interval, not a tuple's ~120; a snapshot's list of
    triples from before is read back flat, :func:`detector.floats.dec_hook`)."""
    bucket: float = 0.0
    bucket_bytes: float = 0.0
    bucket_s: float = 0.0
    rates: BucketRates | None = None
    """Bytes/s of each closed 5-minute bucket inside the baseline window, oldest first (the exact
    median needs every one: a day of them is 1.5 KB held and saved as whole bytes, 2.3 KB as
    doubles); None before the first."""
    spans: FloatArray | None = None
    """The buckets' starts, as (first start, buckets) of each run of consecutive buckets, flattened:
    a run is broken only by a bucket without egress or inside a runaway, so a day's starts take a
    few pairs, not 288 doubles."""
    history: FloatArray | None = None
    """(bucket start, bytes/s) pairs as snapshots saved them before ``rates`` and ``spans``: read
    into them, then None."""
    baseline: float | None = None
    """Median of ``rates``, bytes/s."""
    above_since: float | None = None
    pending_bytes: float = 0.0
    """Excess bytes since the first interval over the multiple, before the episode fired."""
    excess_bytes: float = 0.0
    rate: float = 0.0
    """The short-window rate at the latest interval, bytes/s."""
    burst_since: float | None = None
    """The start of the burst over the multiple going on, judged or not (``above_since`` only from
    ``min_history``, and it keeps the burst out of the baseline: this does not)."""
    bursts: FloatArray | None = None
    """(start, end) of the bursts over the multiple of the past two weeks, flattened, oldest first, fired or
    not (None: none): what a burst at the same time of day, or of the week, is measured against."""

    def __post_init__(self) -> None:
        if (self.rates is None) != (self.spans is None) or not _runs(self.spans or floats(), len(self.rates or ())):
            raise ValueError("a rate per bucket of the runs of starts (each run a start and a whole count, in order)")
        if self.history is None:
            return
        history, self.history = self.history, None  # saved before: (start, rate) pairs
        if len(history) % 2:
            raise ValueError("(start, rate) pairs")
        for i in range(0, len(history) - 1, 2):
            self.keep(history[i], history[i + 1])

    def clear(self) -> None:
        super().clear()
        self.above_since = None
        self.excess_bytes = self.pending_bytes = 0.0

    def keep(self, bucket: float, rate: float) -> None:
        """A closed bucket from ``bucket`` at ``rate`` bytes/s joins the baseline's buckets, newest."""
        spans, rates = self.spans, self.rates
        if spans is None or rates is None:
            spans, rates = self.spans, self.rates = floats(), BucketRates()
        if spans and spans[-2] + spans[-1] * BUCKET_S == bucket:
            spans[-1] += 1.0
        else:
            spans.extend((bucket, 1.0))
        rates.append(rate)

    def forget_before(self, horizon: float) -> None:
        """The buckets that start before ``horizon`` leave the baseline."""
        spans, old = self.spans, 0
        if spans is None or self.rates is None:
            return
        while spans and spans[0] < horizon:
            start, count = spans[0], spans[1]
            gone = min(count, math.ceil((horizon - start) / BUCKET_S))  # the run's buckets starting before
            while gone < count and start + gone * BUCKET_S < horizon:  # the division's rounding, either way
                gone += 1
            while gone > 1 and start + (gone - 1) * BUCKET_S >= horizon:
                gone -= 1
            old += int(gone)
            if gone < count:
                spans[0], spans[1] = start + gone * BUCKET_S, count - gone
            else:
                del spans[:2]
        if old:
            self.rates.drop_first(old)


def _runs(spans: FloatArray, buckets: int) -> bool:
    """Whether ``spans`` are runs of buckets as :meth:`DestinationState.keep` makes them: each a finite
    start after the run before ends and a whole count of at least one, ``buckets`` in all. A snapshot
    that says otherwise would drop another run's rates, or step a start that never reaches the horizon."""
    if len(spans) % 2:
        return False
    end, total = -math.inf, 0.0
    for i in range(0, len(spans), 2):
        start, count = spans[i], spans[i + 1]
        if not (math.isfinite(start) and start >= end and count >= 1.0 and count.is_integer() and count <= 2**31):
            return False
        end, total = start + count * BUCKET_S, total + count
    return total == buckets


def _remember_burst(st: DestinationState, start: float, end: float) -> None:
    """Keep the burst from ``start`` to ``end``; forget those begun over two weeks (and the slack) before it."""
    bursts = st.bursts if st.bursts is not None else floats()
    bursts.extend((start, end))
    horizon = start - 2 * (SCHEDULE_PERIODS_S[-1] + SCHEDULE_SLACK_S)
    old = 0
    while old < len(bursts) - 2 and (bursts[old] < horizon or len(bursts) - old > 2 * MAX_BURSTS):
        old += 2
    if old:
        del bursts[:old]
    st.bursts = bursts


_NONE: dict[str, DestinationState] = {}
"""No destination (never filled: what a state without any reads)."""


class EgressRunawayState(msgspec.Struct, kw_only=True, gc=False):
    destinations: dict[str, DestinationState] | None = None
    """Each destination's state (None: no egress yet, as on a GPU host: not an empty dict on every
    resource; an empty dict saved before reads back as it was)."""


class EgressRunaway(DetectorBase):
    type: ClassVar[str] = "egress_runaway"
    title: ClassVar[str] = "Egress runaway"
    Params: ClassVar[builtins.type[EgressRunawayParams]] = EgressRunawayParams
    State: ClassVar[builtins.type[EgressRunawayState]] = EgressRunawayState
    consumes: ClassVar[tuple[builtins.type, ...]] = (UsageEvent,)
    suggestion: ClassVar[str] = (
        "Find what is sending (VPC flow logs or the bucket's access logs for this resource): a "
        "re-download loop, a misrouted replication or a public object; stop it or move the "
        "consumer into the same region."
    )
    dollars: ClassVar[str] = "paid for excess egress"
    behaviour: ClassVar[bool] = True
    lazy: ClassVar[bool] = True
    """A resource that reports no egress (a GPU host, a bucket) holds no state for this rule."""

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        return [
            ("Destination", f"{details.get('destination', '?').replace('_', ' ')} ({details.get('dest_region')})"),
            ("Excess egress", f"{details.get('excess_gb', 0):,.1f} GB at ${details.get('usd_per_gb', 0):g}/GB"),
            ("Rate", f"{details.get('rate_gb_per_hour', 0):,.1f} GB/h vs "
                     f"{details.get('baseline_gb_per_hour', 0):,.1f} GB/h usual"),
        ]  # fmt: skip

    def tracking(self, state: EgressRunawayState, t: float) -> Behaviour:
        """A runaway is a level, not a pause of the resource's work: the anomaly model's baselines
        keep learning while it is open (see :mod:`detector.detectors.anomaly`)."""
        if any(d.above_since is not None or d.fired_at is not None for d in (state.destinations or _NONE).values()):
            return Behaviour.LEVEL
        return Behaviour.NONE

    def starts(self, ctx: Context, event: Event) -> bool:
        return type(event) is UsageEvent and event.egress_bytes is not None

    def step(self, state: EgressRunawayState, ctx: Context, event: Event, t: float) -> list[Finding]:
        resource = ctx.resource
        if type(event) is not UsageEvent or event.egress_bytes is None:
            return []
        dest = egress_destination(event.region, event.dest_region)
        destinations = state.destinations
        if destinations is None:
            destinations = state.destinations = {}
        st = destinations.get(dest)
        if st is None:
            st = destinations[dest] = DestinationState()
        if t <= st.last_t:
            return []  # a re-read interval
        st.last_t = t
        if event.dest_region != st.dest_region:
            st.dest_region = intern(event.dest_region)
        if st.first_t is None:
            st.first_t = t
        size, interval = float(event.egress_bytes), event.interval_s
        self._add_to_window(st, t, size, interval)
        self._add_to_baseline(st, t, size, interval)
        base = st.baseline
        if base is None:
            return []
        if t - st.first_t < self.params.min_history:
            self._follow_burst(st, t, size > self.params.multiple * base * interval)  # a schedule is seen from the start
            return []
        price = self._price(dest)
        excess = max(0.0, size - base * interval)
        found: list[Finding] = []
        if st.fired_at is None:
            over = size > self.params.multiple * base * interval
            if st.since is not None:  # a runaway but for min_burst: it lasts as an open episode would
                st.pending_bytes += excess
                if self._recent_rate(st, t) <= self.params.resolve_multiple * base or resource.state == "terminated":
                    st.clear()  # it ended before min_burst (a checkpoint upload): nothing said
                    self._follow_burst(st, t, False)
                    return found
            elif over:
                if st.above_since is None:
                    st.above_since = t
                st.pending_bytes += excess
            else:
                st.above_since, st.pending_bytes = None, 0.0
            self._follow_burst(st, t, st.above_since is not None)
            excess_usd_h = (st.rate - base) * 3600.0 / GB * price
            if st.since is None and st.above_since is not None and st.rate > self.params.multiple * base \
                    and excess_usd_h >= self.params.min_excess_usd_per_hour and not self._scheduled(st, t):  # fmt: skip
                st.since = st.above_since  # a runaway from here: it fires once min_burst is over the multiple
            if st.since is not None and over and t + interval - st.since >= self.params.min_burst:
                st.excess_bytes = st.pending_bytes
                found.append(self._finding(fire(st, since=st.since, fired_at=t, at=t), st, dest, resource, t))
            return found
        st.excess_bytes += excess
        if self._recent_rate(st, t) <= self.params.resolve_multiple * base or resource.state == "terminated":
            found.extend(end(st, partial(self._finding, "resolve", st, dest, resource, t, reason="rate_back_to_baseline")))
            self._follow_burst(st, t, False)
        elif due(st, t, self.params.update_every):
            found.append(self._finding("update", st, dest, resource, t))
        return found

    def open_episode(self, state: EgressRunawayState, resource: ResourceInfo) -> Finding | None:
        for dest, st in (state.destinations or _NONE).items():
            if st.fired_at is not None:
                return self._finding("update", st, dest, resource, st.last_t)
        return None

    # -- schedules -----------------------------------------------------------------

    @staticmethod
    def _follow_burst(st: DestinationState, t: float, above: bool) -> None:
        """Open a burst at its first interval over the multiple; at the first under it, keep it (with its
        start and end) among the bursts a later one is measured against."""
        if above:
            if st.burst_since is None:
                st.burst_since = t
        elif st.burst_since is not None:
            _remember_burst(st, st.burst_since, t)
            st.burst_since = None

    def _scheduled(self, st: DestinationState, t: float) -> bool:
        """Whether the open burst began a period (a day or a week) after one and two periods after another,
        each within :data:`SCHEDULE_SLACK_S` a period, and has not yet outlasted the latest of them (see
        :data:`SCHEDULE_OVERRUN`)."""
        bursts, since = st.bursts, st.burst_since
        if not bursts or since is None:
            return False
        starts = bursts[0::2]
        for period in SCHEDULE_PERIODS_S:
            if not any(abs(since - start - 2 * period) <= 2 * SCHEDULE_SLACK_S for start in starts):
                continue
            for i in range(0, len(bursts), 2):
                start, end = bursts[i], bursts[i + 1]
                if abs(since - start - period) <= SCHEDULE_SLACK_S \
                        and t - since <= (end - start) * SCHEDULE_OVERRUN + self.params.window:  # fmt: skip
                    return True
        return False

    # -- rates --------------------------------------------------------------------

    def _add_to_window(self, st: DestinationState, t: float, size: float, interval: float) -> None:
        recent = st.recent
        recent.extend((t, size, interval))
        horizon = t + interval - self.params.window
        old = 0
        while old < len(recent) - 3 and recent[old] < horizon:  # the latest interval stays, however long
            old += 3
        if old:
            del recent[:old]
        st.rate = sum(recent[1::3]) / sum(recent[2::3])

    def _recent_rate(self, st: DestinationState, t: float) -> float:
        """The rate over the last baseline bucket's length: resolution needs no full window."""
        r, since = st.recent, t - BUCKET_S + 1e-6
        kept = [i for i in range(0, len(r), 3) if r[i] >= since]
        return sum(r[i + 1] for i in kept) / sum(r[i + 2] for i in kept)

    def _add_to_baseline(self, st: DestinationState, t: float, size: float, interval: float) -> None:
        bucket = t - t % BUCKET_S
        if bucket != st.bucket:
            if st.bucket_s > 0 and st.fired_at is None and st.above_since is None:
                st.keep(st.bucket, st.bucket_bytes / st.bucket_s)
            st.forget_before(t - self.params.baseline)
            if st.rates:
                st.baseline = st.rates.median()
            st.bucket, st.bucket_bytes, st.bucket_s = bucket, 0.0, 0.0
        st.bucket_bytes += size
        st.bucket_s += interval

    def _price(self, dest: str) -> float:
        return float(getattr(self.pricer.pricing.egress_per_gb, dest))

    def _finding(self, action: str, st: DestinationState, dest: str, res: ResourceInfo, at: float,
                 **extra: object) -> Finding:  # fmt: skip
        assert st.since is not None and st.fired_at is not None and st.baseline is not None
        price = self._price(dest)
        details = {
            "destination": dest,
            "dest_region": st.dest_region or "internet",
            "excess_gb": round(st.excess_bytes / GB, 3),
            "rate_gb_per_hour": round(st.rate * 3600 / GB, 3),
            "baseline_gb_per_hour": round(st.baseline * 3600 / GB, 3),
            "usd_per_gb": price,
            "multiple": self.params.multiple,
            "episode_s": round(at - st.since, 3),
            **extra,
        }
        excess_usd_h = max(0.0, st.rate - st.baseline) * 3600.0 / GB * price
        return make_finding(self, action, res, episode_start=st.since, fired_at=st.fired_at, at=at,
                            usd=st.excess_bytes / GB * price, details=details, usd_per_hour=excess_usd_h)  # fmt: skip
