"""``build_or_call``: a model served on your own GPUs that a hosted API would serve for less,
or API spend steady and high enough that serving the model yourself would be cheaper.

Example rule::

    - name: build-or-call
      type: build_or_call
      match: {resource_type: [inference_endpoint, llm_api]}
      params:
        window: 7d                       # the crossover holds on every day of a week
        min_saving: 20%                  # the other way is at least this much cheaper
        model_tag: model                 # the tag naming the model served or called
        api_resource_types: [llm_api]    # usage billed per token by an API provider
        input_tokens_per_request: 500    # when the usage reports no token counts
        output_tokens_per_request: 250
      severity: info

Both sides are priced from ``rules/pricing.yaml``'s ``llm_models`` (each model's API list
price per million tokens, with its date and page, and the instance type and throughput that
serve it). The two directions:

- **call**: a self-hosted endpoint (a resource whose type is not an API's) pays its instance
  by the hour whatever its traffic: its cost per 1,000 requests is its cost ÷ its requests.
  The API would charge its tokens at the list price.
- **build**: an API resource (``api_resource_types``: usage with ``cost_usd`` and
  ``requests``, from the provider's usage export) pays per token. Serving it yourself needs
  enough instances for the day's busiest hour (its output tokens ÷ one instance's
  ``output_tokens_per_s`` × 3,600), on all day.

Tokens: the usage's ``metrics.input_tokens`` and ``metrics.output_tokens`` when reported
(vLLM's ``vllm:prompt_tokens_total`` / ``vllm:generation_tokens_total`` per interval; the
providers' usage APIs), else requests × ``input_tokens_per_request`` and
``output_tokens_per_request`` (a chat turn with some context: replace with your traffic's).

Why these defaults: a switch either way is a project (a migration, an on-call rotation, an
evaluation of the replacement model), so it must hold week in, week out (every day of
``window``: one quiet weekend does not make the case, and one busy day does not spoil it),
and save enough to pay for that work: 20 % is the margin the build-versus-buy playbooks
ask of self-hosting for its operations. The dollars are the saving since the first day of
the week that passed the crossover, day by day, including the day in progress.
"""

from __future__ import annotations

import builtins
from array import array
from functools import partial
from typing import Any, ClassVar

import msgspec
from pydantic import Field

from detector.detectors.base import Context, DetectorBase, Finding, Params, ResourceInfo, intern, make_finding
from detector.detectors.episode import Episode, end, fire
from detector.events import DAY_S, Event, UsageEvent
from detector.floats import FloatArray, floats
from detector.llm_costs import api_usd, cheaper_the_other_way, self_host_usd
from detector.pricing import LlmModel
from detector.units import Duration, Percent, figure

__all__ = ["BuildOrCall", "BuildOrCallParams", "BuildOrCallState"]

HOUR_S = 3600.0
FULL_DAY = 0.75
"""A day counts when usage covers at least this share of it (a few lost intervals do not void it)."""


class BuildOrCallParams(Params):
    window: Duration = Field(default=7 * DAY_S, ge=DAY_S, le=31 * DAY_S)
    """At most a month: the state holds a record per day of it."""
    min_saving: Percent = 20.0
    model_tag: str = "model"
    api_resource_types: list[str] = ["llm_api"]
    input_tokens_per_request: float = Field(default=500.0, ge=0)
    output_tokens_per_request: float = Field(default=250.0, ge=0)


class DayStats(msgspec.Struct, kw_only=True, array_like=True, gc=False):
    """A day's figures, as the judgement reads them (from a row of :attr:`BuildOrCallState.figures`)
    and as snapshots saved them before the rows."""

    start: float
    usd: float = 0.0
    requests: float = 0.0
    input_tokens: float = 0.0
    output_tokens: float = 0.0
    covered_s: float = 0.0
    hour_start: float = 0.0
    hour_output: float = 0.0
    peak_output_per_h: float = 0.0
    measured: bool = False
    """Token counts came from the usage (not the per-request assumption)."""
    coarse: bool = False
    """An interval longer than an hour (a daily cost export): the day's busiest hour is unknown."""


START, USD, REQUESTS, INPUT_TOKENS, OUTPUT_TOKENS, COVERED_S, HOUR_START, HOUR_OUTPUT, PEAK, MEASURED, COARSE = range(11)
"""A day's columns in a row of :attr:`BuildOrCallState.figures`: the fields of :class:`DayStats`,
in their order (the flags as 1.0 or 0.0)."""
WIDTH = 11
_ZEROS = (0.0,) * (WIDTH - 2)


class BuildOrCallState(Episode, kw_only=True):
    figures: FloatArray | None = None
    """The days held, oldest first, as rows of :data:`WIDTH` doubles flattened (a row per day, not
    a struct of boxed floats: a week is 0.7 KB, not 2.6); None before the first (most endpoints
    serve no model the price list knows)."""
    days: list[DayStats] | None = None
    """The days as snapshots saved them before :attr:`figures`: read into it, then None."""
    last_t: float = 0.0
    model: str = ""
    saved_usd: float = 0.0
    """Saving of the episode's closed days."""
    advice: dict[str, Any] | None = None
    """The open episode's figures (None while none is open)."""

    def __post_init__(self) -> None:
        if self.figures is not None and len(self.figures) % WIDTH:
            raise ValueError(f"days are rows of {WIDTH} figures")
        if self.days is None:
            return
        days, self.days = self.days, None  # saved before: a struct per day
        for day in days:
            self.open_day(day.start, day.hour_start)
            assert self.figures is not None
            self.figures[-WIDTH:] = array(
                "d", [day.start, day.usd, day.requests, day.input_tokens, day.output_tokens, day.covered_s, day.hour_start,
                 day.hour_output, day.peak_output_per_h, float(day.measured), float(day.coarse)])  # fmt: skip

    def clear(self) -> None:
        super().clear()
        self.saved_usd = 0.0
        self.advice = None

    # -- the days -------------------------------------------------------------------

    def latest_start(self) -> float | None:
        """Start of the latest day held (None: none)."""
        f = self.figures
        return f[len(f) - WIDTH + START] if f else None

    def open_day(self, start: float, hour_start: float) -> None:
        """A new latest day from ``start``, its busiest hour so far the one from ``hour_start``."""
        if self.figures is None:
            self.figures = floats()
        self.figures.append(start)
        self.figures.extend(_ZEROS[:HOUR_START - START - 1])
        self.figures.append(hour_start)
        self.figures.extend(_ZEROS[: WIDTH - HOUR_START - 1])

    def keep_last(self, n: int) -> None:
        """Only the ``n`` latest days stay."""
        if self.figures is not None:
            del self.figures[: max(0, len(self.figures) - n * WIDTH)]

    def held(self) -> list[DayStats]:
        """The days held, oldest first, as the judgement reads them."""
        f = self.figures or floats()
        return [DayStats(start=f[i], usd=f[i + USD], requests=f[i + REQUESTS], input_tokens=f[i + INPUT_TOKENS],
                         output_tokens=f[i + OUTPUT_TOKENS], covered_s=f[i + COVERED_S], hour_start=f[i + HOUR_START],
                         hour_output=f[i + HOUR_OUTPUT], peak_output_per_h=f[i + PEAK], measured=bool(f[i + MEASURED]),
                         coarse=bool(f[i + COARSE])) for i in range(0, len(f), WIDTH)]  # fmt: skip


class BuildOrCall(DetectorBase):
    type: ClassVar[str] = "build_or_call"
    title: ClassVar[str] = "Model served or called the dearer way"
    Params: ClassVar[builtins.type[BuildOrCallParams]] = BuildOrCallParams
    State: ClassVar[builtins.type[BuildOrCallState]] = BuildOrCallState
    consumes: ClassVar[tuple[builtins.type, ...]] = (UsageEvent,)
    suggestion: ClassVar[str] = "Compare the two ways on your own traffic before switching."
    dollars: ClassVar[str] = "could have been saved"
    lazy: ClassVar[bool] = True
    """An endpoint whose intervals never name a model (most of them) holds no state for this rule:
    what it would hold is the time of its latest interval, which is the key's."""

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        build = details.get("direction") == "build"
        facts = [
            ("Per 1,000 requests", f"${figure(details.get('usd_per_1k_requests'), ',.3f')} now, "
                                   f"${figure(details.get('alternative_usd_per_1k_requests'), ',.3f')} "
                                   f"{'self-hosted' if build else 'on the API'}"),
            ("Traffic", f"{figure(details.get('requests_per_h'), ',.0f')} requests/h, "
                        f"{figure(details.get('input_tokens_per_request'), ',.0f')} + "
                        f"{figure(details.get('output_tokens_per_request'), ',.0f')} tokens each "
                        f"({details.get('token_source', '')})"),
            ("API price", f"{details.get('api_provider', '')} ${figure(details.get('api_usd_per_1m_input'), ',.2f')} in, "
                          f"${figure(details.get('api_usd_per_1m_output'), ',.2f')} out per 1M tokens "
                          f"(as of {details.get('api_price_as_of', '')})"),
        ]
        if build:
            facts.append(("Self-hosted", f"{details.get('self_host_instances', 0)} × "
                                         f"{details.get('self_host_instance_type', '')} serving "
                                         f"{details.get('self_host_model', '')} at "
                                         f"{figure(details.get('self_host_output_tokens_per_s'), ',.0f')} output tokens/s each"))
        return facts  # fmt: skip

    @classmethod
    def suggest(cls, details: dict[str, Any]) -> str:
        if details.get("direction") == "call":
            return ("Its traffic is too light to keep a GPU busy: route it to the hosted API (or share the GPU "
                    "with other models), and scale the endpoint to zero once quality is checked.")
        return ("The API spend is steady and high enough to keep its own GPUs busy: evaluate serving the "
                "suggested open model yourself (quality first), on the suggested instance count.")

    def starts(self, ctx: Context, event: Event) -> bool:
        """An interval that names a model, newer than every interval of the resource before it: one
        without a model leaves a state kept from the first interval with no model and no day (an
        older interval is ``late`` to the key, as it would be to that state)."""
        return type(event) is UsageEvent and not ctx.late and bool(event.tags.get(self.params.model_tag))

    def step(self, state: BuildOrCallState, ctx: Context, event: Event, t: float) -> list[Finding]:
        if type(event) is not UsageEvent:
            return []
        st, res = state, ctx.resource
        if t <= st.last_t:
            return []
        st.last_t = t
        model = event.tags.get(self.params.model_tag, "")
        if model and model != st.model:
            st.model, st.figures = intern(model), None
            found = end(st, partial(self._finding, "resolve", st, res, t, reason="model_changed"))
        else:
            found = []
        entry = self.pricing.llm_model(st.model)
        if entry is None:
            return found
        day_start = t - t % DAY_S
        f = st.figures
        if not f or f[START - WIDTH] < day_start:  # the latest day's start, from the end
            found += self._judge(st, res, entry, t)
            st.open_day(day_start, t - t % HOUR_S)
            st.keep_last(self._need_days() + 1)
        if model:  # an interval without the tag (an exporter that dropped it) counts toward no day
            self._add(st, event, res, t)
        return found

    def open_episode(self, state: BuildOrCallState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return self._finding("update", state, resource, state.last_t)

    # -- accounting -----------------------------------------------------------------

    def _add(self, st: BuildOrCallState, event: UsageEvent, res: ResourceInfo, t: float) -> None:
        """The interval into the latest day's row."""
        p, f, i = self.params, st.figures, -WIDTH  # from the end: the latest day's row
        assert f is not None
        requests = float(event.requests or 0)
        measured_in, measured_out = event.metrics.get("input_tokens"), event.metrics.get("output_tokens")
        inp = max(0.0, measured_in) if measured_in is not None else requests * p.input_tokens_per_request
        out = max(0.0, measured_out) if measured_out is not None else requests * p.output_tokens_per_request
        if measured_in is not None or measured_out is not None:
            f[i + MEASURED] = 1.0
        f[i + USD] += res.interval_usd
        f[i + REQUESTS] += requests
        f[i + INPUT_TOKENS] += inp
        f[i + OUTPUT_TOKENS] += out
        f[i + COVERED_S] += event.interval_s
        if event.interval_s >= HOUR_S:
            if event.interval_s > HOUR_S:
                f[i + COARSE] = 1.0
            rate = out * HOUR_S / event.interval_s
            if rate > f[i + PEAK]:  # max(), without writing an unchanged item (an array's write is dear)
                f[i + PEAK] = rate
            return
        hour = t - t % HOUR_S
        if hour != f[i + HOUR_START]:
            f[i + HOUR_START], f[i + HOUR_OUTPUT] = hour, 0.0
        f[i + HOUR_OUTPUT] += out
        if f[i + HOUR_OUTPUT] > f[i + PEAK]:
            f[i + PEAK] = f[i + HOUR_OUTPUT]

    def _need_days(self) -> int:
        return max(1, round(self.params.window / DAY_S))

    def _api(self, res: ResourceInfo) -> bool:
        return res.resource_type in self.params.api_resource_types

    def _alternative(self, day: DayStats, res: ResourceInfo, entry: LlmModel, peak: float) -> tuple[float, int] | None:
        """What the day would have cost the other way (:mod:`detector.llm_costs`), and the
        instances it would take (0 for the API); None when the price list cannot say. A
        self-hosted fleet is sized for ``peak``, the window's busiest hour (a fleet is not
        resized day by day; the report sizes it for its period's busiest hour too)."""
        if self._api(res):
            return self_host_usd(entry, self.pricing, peak, day.covered_s)
        usd = api_usd(entry, day.input_tokens, day.output_tokens)
        return None if usd is None else (usd, 0)

    @staticmethod
    def _peak(days: list[DayStats]) -> float:
        return max((d.peak_output_per_h for d in days), default=0.0)

    def _saving(self, day: DayStats, res: ResourceInfo, entry: LlmModel, peak: float) -> float | None:
        """The day's saving the other way (negative: this way is cheaper), or None."""
        alt = self._alternative(day, res, entry, peak)
        return None if alt is None else day.usd - alt[0]

    def _passed(self, day: DayStats, res: ResourceInfo, entry: LlmModel, peak: float) -> bool:
        """The day covers enough and the other way was cheaper by the margin. Self-hosting is
        sized for the busiest hour: a day reported in coarser intervals cannot say how many
        instances it needs (its mean hour would undersize them), so it is not judged for it."""
        if day.coarse and self._api(res):
            return False
        alt = self._alternative(day, res, entry, peak)
        return (alt is not None and day.covered_s >= FULL_DAY * DAY_S
                and cheaper_the_other_way(day.usd, alt[0], self.params.min_saving))  # fmt: skip

    def _judge(self, st: BuildOrCallState, res: ResourceInfo, entry: LlmModel, t: float) -> list[Finding]:
        """Judge on a day's close: open when every day of the window passed the crossover, add
        each further passing day to the episode, close on one that did not."""
        days = st.held()
        if not days or not res.known:
            return []
        closed, need = days[-1], self._need_days()
        week = days[-need:]
        peak = self._peak(week)
        if st.fired_at is not None:
            if not self._passed(closed, res, entry, peak):
                return end(st, partial(self._finding, "resolve", st, res, t, reason="crossover_not_passed"))
            st.saved_usd += self._saving(closed, res, entry, peak) or 0.0
            st.advice = self._advice(week, res, entry)
            st.last_report = t
            return [self._finding("update", st, res, t)]
        consecutive = all(b.start - a.start == DAY_S for a, b in zip(week, week[1:], strict=False))
        if (len(week) < need or not consecutive or not sum(d.requests for d in week)
                or not all(self._passed(d, res, entry, peak) for d in week)):
            return []  # a week with no request at all is idle, not light (inference_scale_to_zero's)
        st.saved_usd = sum(self._saving(d, res, entry, peak) or 0.0 for d in week)
        st.advice = self._advice(week, res, entry)
        return [self._finding(fire(st, since=week[0].start, fired_at=t, at=t), st, res, t)]

    def _advice(self, days: list[DayStats], res: ResourceInfo, entry: LlmModel) -> dict[str, Any]:
        """The week's figures: cost per 1,000 requests both ways, traffic, and the prices used."""
        usd, peak = sum(d.usd for d in days), self._peak(days)
        alts = [self._alternative(d, res, entry, peak) for d in days]
        alt_usd = sum(a[0] for a in alts if a is not None)
        requests = sum(d.requests for d in days)
        hours = sum(d.covered_s for d in days) / HOUR_S
        api, host = entry.api, entry.self_host
        per_1k = 1000.0 / requests if requests else None  # none: no cost per request to show
        advice: dict[str, Any] = {
            "direction": "build" if self._api(res) else "call",
            "model": res.tags.get(self.params.model_tag, ""),
            "usd_per_1k_requests": round(usd * per_1k, 4) if per_1k else None,
            "alternative_usd_per_1k_requests": round(alt_usd * per_1k, 4) if per_1k else None,
            "week_usd": round(usd, 2), "alternative_week_usd": round(alt_usd, 2),
            "saving_usd_per_hour": round((usd - alt_usd) / hours, 4) if hours else 0.0,
            "requests_per_h": round(requests / hours, 1) if hours else 0.0,
            "token_source": "measured" if all(d.measured for d in days) else "assumed per request",
            "input_tokens_per_request": round(sum(d.input_tokens for d in days) / requests, 1) if requests else 0.0,
            "output_tokens_per_request": round(sum(d.output_tokens for d in days) / requests, 1) if requests else 0.0,
        }  # fmt: skip
        if api is not None:
            advice.update(api_provider=api.provider, api_usd_per_1m_input=api.usd_per_1m_input,
                          api_usd_per_1m_output=api.usd_per_1m_output, api_price_as_of=str(api.as_of or ""),
                          api_price_source=api.source)  # fmt: skip
        if host is not None and self._api(res):
            advice.update(self_host_model=host.model or advice["model"], self_host_instance_type=host.instance_type,
                          self_host_output_tokens_per_s=host.output_tokens_per_s,
                          self_host_instances=max((a[1] for a in alts if a is not None), default=0))  # fmt: skip
        return advice

    def _finding(self, action: str, st: BuildOrCallState, res: ResourceInfo, at: float, **extra: object) -> Finding:
        assert st.since is not None and st.fired_at is not None
        usd = st.saved_usd
        latest = st.latest_start()
        if action != "resolve" and latest is not None and latest >= at - at % DAY_S and latest > st.since:
            entry, days = self.pricing.llm_model(st.model), st.held()
            peak = self._peak(days[-self._need_days():])
            today = self._saving(days[-1], res, entry, peak) if entry is not None else None
            usd += today or 0.0  # the day in progress, as far as it has come
        advice = st.advice or {}
        details = {**advice, "episode_days": round((at - st.since) / DAY_S, 2), **extra}
        return make_finding(self, action, res, episode_start=st.since, fired_at=st.fired_at, at=at, usd=max(0.0, usd),
                            usd_per_hour=advice.get("saving_usd_per_hour", 0.0), details=details)  # fmt: skip
