"""``inference_unbatched``: a GPU endpoint serving one request per batch, or the same requests again without a cache.

Example rule::

    - name: inference-unbatched
      type: inference_unbatched
      match: {resource_type: inference_endpoint}
      params:
        window: 6h                   # judged on this much traffic
        max_batch_size: 1.5          # requests per model execution at or under this is "unbatched"...
        min_requests_per_s: 5        # ...at a rate where batches could form
        sm_active_below: 50%         # ...while the GPU's SMs stay this idle
        min_gpu_busy: 30%            # and its kernels run this much (idler is inference_overprovisioned's)
        batching_gain: 2             # throughput that dynamic batching is counted to give
        min_duplicate_share: 20%     # or this share of requests repeats one already served, uncached
        min_saving_usd_per_hour: 0.5
      severity: info

What it reads (``UsageEvent.requests`` and ``UsageEvent.metrics``, per usage interval;
``docs/events.md`` says how Triton, vLLM, TGI and KServe exporters fill them):

- ``requests``: requests served in the interval;
- ``metrics.batches``: model executions in the interval (Triton ``nv_inference_exec_count``),
  so the mean batch is requests / batches; or ``metrics.batch_size``, the mean batch as a
  gauge (TGI ``tgi_batch_current_size``, vLLM ``vllm:num_requests_running``);
- ``metrics.duplicate_share``: the share (0-1) of requests identical to one served shortly
  before (a gateway that hashes request bodies);
- ``metrics.cache_hit_ratio``: the share (0-1) served from a response cache (Triton
  ``nv_cache_num_hits_per_model`` / (hits + misses)); absent: no cache;
- ``metrics.replicas``: ready replicas (kube-state-metrics
  ``kube_deployment_status_replicas_ready``); absent: 1, one machine (its GPUs may hold one
  model sharded over them, and a VM's GPUs are not freed by scaling replicas: a smaller
  instance is ``inference_overprovisioned``'s advice);
- and the GPU samples: ``util_pct`` (kernel duty) and ``sm_active`` (else ``gr_engine_active``;
  neither: the kernel duty stands in as its upper bound, and the alert says SM activity was
  not reported).

*Unbatched*: the mean batch is at most ``max_batch_size`` at ``min_requests_per_s`` or more
while mean SM activity is under ``sm_active_below``: each execution feeds the GPU one
request, so it is busy (``util_pct`` at least ``min_gpu_busy``) doing little. *Uncached*: the
duplicate share less the cache hit ratio is at least ``min_duplicate_share``.

The saving is an estimate, computed so: the work left is ``1 / batching_gain`` when
unbatched, times ``1 - (duplicate_share - cache_hit_ratio)`` when uncached; the replicas
needed are ``max(1, ceil(replicas * work left))``, and the saving per hour is the billed rate
times the replicas freed over the replicas. One replica frees nothing (a smaller GPU is
``inference_overprovisioned``'s advice), so one replica never alerts. Dollars are that saving
over the episode, less whole hours with no requests (``inference_scale_to_zero``'s).

Why these defaults: Triton's and TorchServe's docs show dynamic batching multiplying
throughput several times over batch 1 on the same GPU (2x is the conservative end); a
batch only forms when requests overlap (5 req/s with a few ms of queue delay). SM activity
under 50 % is where NVIDIA's DCGM guidance reads a kernel-busy GPU as underused. Response
caches in front of LLM and embedding endpoints report 20-30 %+ hit rates on chat and search
traffic; under 20 % a cache's upkeep eats the gain. Six hours of traffic smooths bursts and
still alerts the same day. The requirement that kernels run at least 30 % keeps this apart
from ``inference_overprovisioned`` (which wants the p95 under 30 %).
"""

from __future__ import annotations

import builtins
import math
from typing import Any, ClassVar

import msgspec
from pydantic import Field

from detector.detectors.base import Context, Finding, Params, ResourceInfo, at_sample
from detector.detectors.hourly_saving import HOUR_S, REQUEST_S, REQUESTS, HourlySaving, HourlySavingState
from detector.detectors.scrape import Scrape
from detector.events import Event, GpuMetric, UsageEvent
from detector.floats import newer
from detector.units import Duration, Money, Percent, figure

__all__ = ["InferenceUnbatched", "InferenceUnbatchedParams", "InferenceUnbatchedState", "work_left"]

MAX_REPLICAS = 10_000.0
"""A replicas figure beyond this is not a real endpoint's: it is ignored."""


class InferenceUnbatchedParams(Params):
    window: Duration = Field(default=6 * HOUR_S, ge=HOUR_S, le=7 * 86_400.0)
    max_batch_size: float = Field(default=1.5, ge=1.0)
    min_requests_per_s: float = Field(default=5.0, ge=0)
    sm_active_below: Percent = 50.0
    min_gpu_busy: Percent = 30.0
    batching_gain: float = Field(default=2.0, gt=1.0, le=64.0)
    min_duplicate_share: Percent = 20.0
    min_saving_usd_per_hour: Money = 0.5


class HourStats(msgspec.Struct, kw_only=True, array_like=True, gc=False):
    """An hour as snapshots saved it before the columns of :class:`InferenceUnbatchedState` (each
    field is a column of the same name)."""

    start: float
    requests: float = 0.0
    request_s: float = 0.0
    batch_requests: float = 0.0
    """Requests of intervals that reported their batching..."""
    batches: float = 0.0
    """...and the executions they took (requests / mean batch when only a gauge was reported)."""
    dup_requests: float = 0.0
    """Requests of intervals that reported their duplicate share..."""
    dups: float = 0.0
    cached: float = 0.0
    """...the duplicates among them, and those served from a cache."""
    util_sum: float = 0.0
    sm_sum: float = 0.0
    samples: int = 0
    sm_samples: int = 0
    """Samples that carried SM (or graphics engine) activity, whose sum is ``sm_sum``."""


BATCH_REQUESTS, BATCHES, DUP_REQUESTS, DUPS, CACHED, UTIL_SUM, SM_SUM, SAMPLES, SM_SAMPLES = range(3, 12)
"""An hour's columns after the common ones (:mod:`detector.detectors.hourly_saving`): the fields
of :class:`HourStats` of the same names (the sample counts as doubles: exact up to 2^53)."""


class InferenceUnbatchedState(HourlySavingState, kw_only=True):
    columns: ClassVar[tuple[str, ...]] = (
        *HourlySavingState.columns, "batch_requests", "batches", "dup_requests", "dups", "cached", "util_sum",
        "sm_sum", "samples", "sm_samples")  # fmt: skip
    width: ClassVar[int] = len(columns)
    hours: list[HourStats] | None = None
    replicas: float = 0.0
    """The latest reported replicas (0: not reported)."""


class InferenceUnbatched(HourlySaving):
    type: ClassVar[str] = "inference_unbatched"
    title: ClassVar[str] = "Inference endpoint without batching or caching"
    Params: ClassVar[builtins.type[InferenceUnbatchedParams]] = InferenceUnbatchedParams
    State: ClassVar[builtins.type[InferenceUnbatchedState]] = InferenceUnbatchedState
    consumes: ClassVar[tuple[builtins.type, ...]] = (GpuMetric, UsageEvent)
    suggestion: ClassVar[str] = (
        "Turn on dynamic batching (Triton dynamic_batching with a few ms max_queue_delay, TorchServe "
        "batch_size/max_batch_delay, vLLM/TGI continuous batching) and put a response cache in front of "
        "repeated requests; then scale the replicas down to the estimate and watch latency."
    )
    dollars: ClassVar[str] = "could have been saved (estimate)"
    resolved_because: ClassVar[str] = "batching_or_cache"

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        causes = details.get("causes")
        ok = isinstance(causes, list) and all(isinstance(c, str) for c in causes)
        facts = [("Causes", ", ".join(causes) if ok and causes else "?")]  # (details read back from the store)
        if details.get("batch_size") is not None:
            sm = details.get("sm_active_pct")
            sm_text = (f"SM activity {sm} %" if sm is not None
                       else f"SM activity not reported (kernels busy {details.get('util_pct')} %, its upper bound)")
            facts.append(("Batching", f"{figure(details['batch_size'], ',.2f')} requests per batch at "
                                      f"{figure(details.get('requests_per_s', 0), ',.1f')} req/s, {sm_text}"))  # fmt: skip
        if details.get("duplicate_share_pct") is not None:
            facts.append(("Repeats", f"{details['duplicate_share_pct']} % of requests repeat, "
                                     f"{details.get('cache_hit_pct', 0)} % served from cache"))  # fmt: skip
        facts.append(("Estimate", f"{details.get('replicas_needed')} of its {details.get('replicas')} replicas would do, "
                                  f"saving ${figure(details.get('saving_usd_per_hour', 0), ',.3f')}/h "
                                  f"({details.get('how', '')})"))  # fmt: skip
        return facts

    def step_scrape(self, state: InferenceUnbatchedState, ctx: Context, scrape: Scrape,
                    t: float) -> list[tuple[int, Finding]]:  # fmt: skip
        """:meth:`step` for each sample of a scrape, in one call (as ``inference_overprovisioned``'s)."""
        st, found, rolled = state, None, False
        for i, event in enumerate(scrape.samples):
            if not newer(st.gpu_last, event.gpu_index, t):
                continue  # a sample read again
            if not rolled:
                rolled, closed = True, self.roll(st, ctx.resource, t)
                if closed:
                    found = at_sample(i, closed)
            f, j = st.figures, -st.width  # from the end: the latest hour's row
            sm = event.sm_active if event.sm_active is not None else event.gr_engine_active
            f[j + UTIL_SUM] += event.util_pct
            f[j + SAMPLES] += 1.0
            if sm is not None:
                f[j + SM_SUM] += 100.0 * sm
                f[j + SM_SAMPLES] += 1.0
        return found if found is not None else []

    def step(self, state: InferenceUnbatchedState, ctx: Context, event: Event, t: float) -> list[Finding]:
        st, res = state, ctx.resource
        if type(event) is GpuMetric:
            found = self.sample_hour(st, res, event.gpu_index, t)
            if found is None:
                return []  # a sample read again
            f, i = st.figures, -st.width  # from the end: the latest hour's row
            sm = event.sm_active if event.sm_active is not None else event.gr_engine_active
            f[i + UTIL_SUM] += event.util_pct
            f[i + SAMPLES] += 1.0
            if sm is not None:
                f[i + SM_SUM] += 100.0 * sm
                f[i + SM_SAMPLES] += 1.0
            return found
        if type(event) is not UsageEvent or t <= st.usage_last:
            return []
        st.usage_last = t
        if event.state != "running":
            return self.stopped(st, res, t, event.state)
        found = self.roll(st, res, t)
        metrics = event.metrics
        replicas = metrics.get("replicas")
        if replicas is not None and 1 <= replicas <= MAX_REPLICAS:
            st.replicas = float(int(replicas))
        if event.requests is None:
            return found
        f, i, n = st.figures, -st.width, float(event.requests)
        f[i + REQUESTS] += n
        f[i + REQUEST_S] += event.interval_s
        batches, size = metrics.get("batches"), metrics.get("batch_size")
        if batches is not None and 0 < batches <= n:
            f[i + BATCH_REQUESTS] += n
            f[i + BATCHES] += batches
        elif size is not None and 1 <= size <= MAX_REPLICAS * 1000 and n:
            f[i + BATCH_REQUESTS] += n
            f[i + BATCHES] += n / size
        dup, cache = metrics.get("duplicate_share"), metrics.get("cache_hit_ratio")
        if dup is not None and 0 <= dup <= 1:
            f[i + DUP_REQUESTS] += n
            f[i + DUPS] += n * dup
            if cache is not None and 0 <= cache <= 1:
                f[i + CACHED] += n * min(cache, dup)
        return found

    # -- hours and judgement --------------------------------------------------------

    def saving(self, st: InferenceUnbatchedState, res: ResourceInfo) -> dict[str, Any] | None:
        """Fewer replicas, when the window is unbatched or uncached and that frees at least one."""
        p, total = self.params, lambda c: sum(st.column(c))
        request_s = total(REQUEST_S)
        if not request_s or res.usd_per_hour is None or res.gpus <= 0:
            return None
        requests = total(REQUESTS)
        rate = requests / request_s
        samples = total(SAMPLES)
        util = total(UTIL_SUM) / samples if samples else None
        sm_samples = total(SM_SAMPLES)
        sm = total(SM_SUM) / sm_samples if sm_samples else None
        sm_bound = sm if sm is not None else util  # SMs are never more active than kernels run
        batch_requests, batches = total(BATCH_REQUESTS), total(BATCHES)
        batch = batch_requests / batches if batches else None
        unbatched = (batch is not None and util is not None and sm_bound is not None and batch <= p.max_batch_size
                     and rate >= p.min_requests_per_s and sm_bound < p.sm_active_below
                     and util >= p.min_gpu_busy)  # fmt: skip
        dup_requests = total(DUP_REQUESTS)
        dup = total(DUPS) / dup_requests if dup_requests else None
        cached = total(CACHED) / dup_requests if dup_requests else 0.0
        repeat = dup - cached if dup is not None else 0.0
        uncached = dup is not None and repeat * 100.0 >= p.min_duplicate_share
        if not unbatched and not uncached:
            return None
        replicas = st.replicas or 1.0  # not reported: one machine, nothing to scale down
        left = work_left(p.batching_gain if unbatched else 1.0, repeat if uncached else 0.0)
        needed = max(1, math.ceil(replicas * left - 1e-9))
        saving = res.usd_per_hour * (replicas - needed) / replicas
        if saving < p.min_saving_usd_per_hour:
            return None
        causes = (["unbatched"] if unbatched else []) + (["uncached"] if uncached else [])
        how = []
        if unbatched:
            how.append(f"batching counted as {p.batching_gain:g}x throughput")
        if uncached:
            how.append(f"a cache serving the {repeat * 100:.0f} % repeats")
        return {
            "causes": causes,
            "requests_per_s": round(rate, 3),
            "batch_size": round(batch, 3) if batch is not None else None,
            "util_pct": round(util, 1) if util is not None else None,
            "sm_active_pct": round(sm, 1) if sm is not None else None,
            "duplicate_share_pct": round(dup * 100, 1) if dup is not None else None,
            "cache_hit_pct": round(cached * 100, 1),
            "replicas": int(replicas),
            "replicas_needed": needed,
            "work_left": round(left, 4),
            "saving_usd_per_hour": round(saving, 4),
            "how": "; ".join(how) + f": replicas needed = max(1, ceil({int(replicas)} x {left:.2f}))",
        }


def work_left(batching_gain: float, uncached_repeats: float) -> float:
    """The share of the endpoint's GPU work left once batched (``1 / gain``) and cached (the
    repeats, a share 0-1, served from the cache): the estimate behind the saving."""
    return (1.0 / batching_gain) * (1.0 - max(0.0, min(1.0, uncached_repeats)))
