"""``inference_overprovisioned``: an inference endpoint on more GPU than its traffic needs.

Example rule::

    - name: inference-overprovisioned
      type: inference_overprovisioned
      match: {resource_type: inference_endpoint}
      params:
        window: 24h                  # judged on a whole day of traffic (it is diurnal)
        util_p95_below: 30%          # the busiest 5 % of samples stay under this
        max_requests_per_s: 20       # and the request rate under this (when reported)
        mem_headroom: 20%            # the smaller GPU must hold the peak memory plus this
        min_saving_usd_per_hour: 0.1
      severity: info

Why these defaults: AWS Compute Optimizer and GCP's rightsizing recommender judge
over days of data and flag instances whose peak stays low; a p95 under 30 % leaves
room for a GPU two to three times slower (an A10G's load on a T4) to stay under
90 %, and a day covers the daily peak. The suggested instance is the cheapest in
``rules/pricing.yaml`` from the same provider whose GPU memory holds the endpoint's
peak with headroom. The dollars are the saving over the time the episode covers, less
the whole hours in which the endpoint served no request at all: those are
``inference_scale_to_zero``'s (the full price of an hour nobody uses, not the difference
to a smaller GPU), so the two detectors never count the same hour.
"""

from __future__ import annotations

import builtins
import math
from array import array
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec
from pydantic import Field

from detector.detectors.base import Context, Finding, Params, ResourceInfo, at_sample
from detector.detectors.hourly_saving import HOUR_S, REQUEST_S, REQUESTS, HourlySaving, HourlySavingState
from detector.detectors.scrape import Scrape
from detector.events import Event, GpuMetric, UsageEvent
from detector.floats import newer
from detector.units import Duration, Money, Percent

__all__ = ["InferenceOverprovisioned", "InferenceOverprovisionedParams", "InferenceOverprovisionedState"]

BINS = 20
"""Utilisation histogram of 5 % bins: enough to place a p95 against a 30 % bar."""
MEM_PEAK = 3
"""An hour's column after the common ones (:mod:`detector.detectors.hourly_saving`): its peak GPU memory, MiB."""
_WIDER = {"B": "H", "H": "I", "I": "Q"}
"""The next wider type of unsigned counts: a bin's count that outgrows its type widens the histogram."""
_EMPTY_ROW = (0,) * BINS

if TYPE_CHECKING:
    Counts = array[int]
else:
    Counts = array  # not subscriptable at run time before Python 3.12


class InferenceOverprovisionedParams(Params):
    window: Duration = Field(default=86_400.0, ge=HOUR_S)
    util_p95_below: Percent = 30.0
    max_requests_per_s: float | None = Field(default=20.0, ge=0)
    mem_headroom: Percent = 20.0
    min_saving_usd_per_hour: Money = 0.1


class HourStats(msgspec.Struct, kw_only=True, array_like=True, gc=False):
    """An hour as snapshots saved it before the columns of :class:`InferenceOverprovisionedState`."""

    start: float
    hist: list[int]
    mem_peak_mib: float = 0.0
    requests: float = 0.0
    request_s: float = 0.0


def counts(values: Any = ()) -> Counts:
    """Whole counts, unboxed in the narrowest unsigned type that holds them (a byte each while under
    256): a struct field's ``default_factory``, and the histogram read back from a snapshot's list."""
    values = list(values)  # each type tried reads them all
    for code in "BHIQ":
        try:
            return array(code, values)
        except OverflowError:
            continue
    raise ValueError("counts are whole numbers under 2^64")


class InferenceOverprovisionedState(HourlySavingState, kw_only=True):
    columns: ClassVar[tuple[str, ...]] = (*HourlySavingState.columns, "mem_peak_mib")
    width: ClassVar[int] = len(columns)
    hist: Counts = msgspec.field(default_factory=counts)
    """Per hour (a row of :data:`BINS` in the order of ``figures``' rows), its GPU samples by utilisation bin."""
    hours: list[HourStats] | None = None

    def __post_init__(self) -> None:
        if self.hist.typecode == "d":  # saved as a list of counts, read back as doubles
            if not all(math.isfinite(x) and x >= 0.0 and float(x).is_integer() for x in self.hist):
                raise ValueError("histogram counts are whole numbers")
            self.hist = counts(map(int, self.hist))
        super().__post_init__()
        if len(self.hist) != len(self.figures) // self.width * BINS:
            raise ValueError(f"a histogram of {BINS} bins per hour")

    def read_hour(self, hour: HourStats) -> None:
        if len(hour.hist) != BINS:  # the version before failed on such an hour's next sample
            raise ValueError(f"an hour's histogram of {BINS} bins")
        self.hist = counts([*self.hist, *hour.hist])

    def open_hour(self, start: float) -> None:
        super().open_hour(start)
        self.hist.extend(_EMPTY_ROW)

    def drop_hours(self, n: int) -> None:
        super().drop_hours(n)
        del self.hist[: n * BINS]

    def count(self, b: int) -> None:
        """One more GPU sample in the latest hour's bin ``b``."""
        i = b - BINS  # from the end: the latest hour's row
        try:
            self.hist[i] += 1
        except OverflowError:
            self.hist = array(_WIDER[self.hist.typecode], self.hist)
            self.hist[i] += 1


class InferenceOverprovisioned(HourlySaving):
    type: ClassVar[str] = "inference_overprovisioned"
    title: ClassVar[str] = "Inference endpoint overprovisioned"
    Params: ClassVar[builtins.type[InferenceOverprovisionedParams]] = InferenceOverprovisionedParams
    State: ClassVar[builtins.type[InferenceOverprovisionedState]] = InferenceOverprovisionedState
    consumes: ClassVar[tuple[builtins.type, ...]] = (GpuMetric, UsageEvent)
    suggestion: ClassVar[str] = (
        "Move the endpoint to the suggested instance type (or fewer replicas), then watch its "
        "latency; keep the model in memory headroom."
    )

    dollars: ClassVar[str] = "could have been saved"
    resolved_because: ClassVar[str] = "load_grew"

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        rps = details.get("requests_per_s")
        return [
            ("Suggested", f"{details.get('suggested_instance_type')} ({details.get('suggested_gpu_model')}, "
                          f"${details.get('suggested_usd_per_hour', 0):,.3f}/h)"),
            ("Saving", f"${details.get('saving_usd_per_hour', 0):,.3f}/h"),
            ("Load", f"p95 GPU {details.get('util_pct', details.get('util_p95_pct'))} %"
                     + (f", {rps:,.1f} req/s" if rps is not None else "")
                     + f", peak memory {details.get('gpu_mem_peak_gb')} GB"),
        ]  # fmt: skip

    def step_scrape(self, state: InferenceOverprovisionedState, ctx: Context, scrape: Scrape,
                    t: float) -> list[tuple[int, Finding]]:  # fmt: skip
        """:meth:`step` for each sample of a scrape, in one call: an endpoint's GPUs, or every GPU of a
        host no usage event has described yet (the rule runs there until one does). Its first sample
        not read before opens the hour, as a step per sample would; at the same time again nothing."""
        st, found, rolled = state, None, False
        for i, event in enumerate(scrape.samples):
            if not newer(st.gpu_last, event.gpu_index, t):
                continue  # a sample read again
            if not rolled:
                rolled, closed = True, self.roll(st, ctx.resource, t)
                if closed:
                    found = at_sample(i, closed)
            st.count(min(BINS - 1, int(event.util_pct * BINS / 100.0)))
            f, j = st.figures, MEM_PEAK - st.width  # from the end: the latest hour's row
            if event.mem_used_mib > f[j]:
                f[j] = event.mem_used_mib
        return found if found is not None else []

    def step(self, state: InferenceOverprovisionedState, ctx: Context, event: Event, t: float) -> list[Finding]:
        resource = ctx.resource
        st = state
        if type(event) is GpuMetric:
            found = self.sample_hour(st, resource, event.gpu_index, t)
            if found is None:
                return []  # a sample read again
            st.count(min(BINS - 1, int(event.util_pct * BINS / 100.0)))
            f, i = st.figures, MEM_PEAK - st.width  # from the end: the latest hour's row
            if event.mem_used_mib > f[i]:  # max(), without writing an unchanged item (an array's write is dear)
                f[i] = event.mem_used_mib
            return found
        if type(event) is UsageEvent:
            if t <= st.usage_last:
                return []
            st.usage_last = t
            if event.state != "running" and st.fired_at is not None:
                return self.stopped(st, resource, t, event.state)
            found = self.roll(st, resource, t)
            if event.requests is not None:
                f, i = st.figures, -st.width
                f[i + REQUESTS] += event.requests
                f[i + REQUEST_S] += event.interval_s
            return found
        return []

    # -- hours and judgement --------------------------------------------------------

    def judgeable(self, st: InferenceOverprovisionedState) -> bool:
        return any(st.hist)  # no GPU sample in the window: nothing to judge

    def saving(self, st: InferenceOverprovisionedState, res: ResourceInfo) -> dict[str, Any] | None:
        """A smaller instance, when the window's p95 and request rate are under the bars."""
        hist = [sum(st.hist[i::BINS]) for i in range(BINS)]
        p95 = _quantile_upper(hist, 0.95)
        request_s = sum(st.column(REQUEST_S))
        rate = sum(st.column(REQUESTS)) / request_s if request_s else None
        quiet = p95 <= self.params.util_p95_below and (
            self.params.max_requests_per_s is None or rate is None or rate < self.params.max_requests_per_s
        )
        advice = self._cheaper(res, max(st.column(MEM_PEAK)), p95) if quiet else None
        if advice is not None:
            advice.update(util_p95_pct=p95, util_p95_below_pct=self.params.util_p95_below,
                          requests_per_s=round(rate, 3) if rate is not None else None)  # fmt: skip
        return advice

    def _cheaper(self, res: ResourceInfo, mem_peak_mib: float, p95: float) -> dict[str, Any] | None:
        """The cheapest listed instance from the same provider that holds the peak memory."""
        prices = self.pricing.instances
        current = prices.get(res.instance_type)
        if current is None or not current.gpus or res.usd_per_hour is None:
            return None
        need_gb = mem_peak_mib / 1024.0 * (1 + self.params.mem_headroom / 100.0)
        need_gpus = max(1, math.ceil(current.gpus * p95 / 60.0))
        best: tuple[float, str] | None = None
        for name, price in prices.items():
            if name == res.instance_type or price.provider != current.provider or price.gpus < need_gpus:
                continue
            if price.gpu_mem_gb < need_gb:
                continue
            hourly = self.pricing.hourly(name, res.pricing or "on_demand")
            if hourly is not None and (best is None or hourly < best[0]):
                best = (hourly, name)
        if best is None or res.usd_per_hour - best[0] < self.params.min_saving_usd_per_hour:
            return None
        hourly, name = best
        return {
            "suggested_instance_type": name,
            "suggested_gpu_model": prices[name].gpu_model,
            "suggested_usd_per_hour": hourly,
            "saving_usd_per_hour": round(res.usd_per_hour - hourly, 4),
            "gpu_mem_peak_gb": round(mem_peak_mib / 1024.0, 2),
        }


def _quantile_upper(hist: list[int], q: float) -> float:
    """The upper edge (percent) of the bin holding the ``q`` quantile: a conservative p95."""
    target = q * sum(hist)
    seen = 0
    for i, count in enumerate(hist):
        seen += count
        if seen >= target:
            return (i + 1) * 100.0 / BINS
    return 100.0
