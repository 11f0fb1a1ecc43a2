"""``inference_scale_to_zero``: an inference endpoint that keeps its GPUs through hours with no requests.

Example rule::

    - name: inference-scale-to-zero
      type: inference_scale_to_zero
      match: {resource_type: inference_endpoint}
      params:
        learn: 7d                    # the schedule is learned from this much event time (a whole week)
        min_idle_run: 4h             # idle hours in a row worth a cold start
        max_requests_per_hour: 0     # an hour with at most this many requests is idle
        min_saving_usd_per_week: 10
        timezone: UTC                # the schedule's hours are read in this zone
      severity: info

An hour is *idle* when the endpoint was billed running through it (at least 50 of its 60
minutes), every interval reported its ``requests``, and they add up to at most
``max_requests_per_hour``. Each of the 168 hours of the week remembers for how many weeks
in a row it was idle; the *schedule* is the hours idle in every week seen (``learn`` / 7 d
weeks, at least one) that lie in runs of at least ``min_idle_run``, so "scale to zero
20:00-07:00 and at weekends" is what a week of nights and weekends teaches, and a single
quiet hour is not (a ``learn`` under a week schedules only the hours of the week it saw).
An hour not billed (the endpoint already scales down) or without request counts is never
idle. Hours are whole hours of ``timezone`` (half past the UTC hour in India), so the
schedule's times are ones the endpoint was seen idle through.

Why these defaults: KServe/Knative, SageMaker serverless and async endpoints and KEDA
scale to zero with a cold start of seconds to a few minutes for a model load; a run of
4 hours keeps that below a few percent of the saving. A week is the shortest span that
shows both nights and weekends (the schedule is hours of the week). $10 a week keeps
CPU-priced endpoints quiet.

Dollars: what the endpoint was billed for its idle runs (each at least ``min_idle_run``)
since the schedule's learning began (the episode's start); per hour, the billed rate times
the scheduled idle share of the week. The alert's weekly saving is the scheduled idle
hours times the billed rate. Unlike ``inference_overprovisioned`` (a smaller GPU for the
traffic there is), this is the hours with *no* traffic: that detector leaves whole hours
without requests out of its dollars, so the two never count the same hour.
"""

from __future__ import annotations

import builtins
import math
import re
from datetime import datetime
from functools import partial
from typing import Any, ClassVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator

from detector.detectors.base import Context, DetectorBase, Finding, Params, ResourceInfo, make_finding
from detector.detectors.episode import Episode, due, end, fire
from detector.events import Event, UsageEvent
from detector.pricing import Pricing, usd_over
from detector.units import Duration, Money, figure, money

__all__ = ["InferenceScaleToZero", "InferenceScaleToZeroParams", "InferenceScaleToZeroState", "schedule_text"]

HOUR_S = 3600.0
WEEK_H = 168
WEEK_S = WEEK_H * HOUR_S
COVERED_S = 50 * 60.0
"""An hour counts when the endpoint was billed for at least this much of it (a lost interval is tolerated)."""


def no_requests(requests: float, request_s: float) -> bool:
    """An hour whose request counts covered :data:`COVERED_S` or more and held no request: an
    idle hour, this rule's; ``inference_overprovisioned`` and ``inference_unbatched`` leave such
    hours out of their dollars, so the serving rules never count the same hour."""
    return request_s >= COVERED_S and requests == 0
UNSEEN, BUSY = 0, 1
"""A slot's byte: never seen, last seen busy; ``BUSY + k``: idle in the last ``k`` weeks in a row."""
_ZONE_NAME = re.compile(r"[A-Za-z0-9_+\-]{1,32}(/[A-Za-z0-9_+\-]{1,32}){0,2}")
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_UNSEEN_WEEK = bytes(WEEK_H)


class InferenceScaleToZeroParams(Params):
    learn: Duration = Field(default=7 * 86_400.0, ge=86_400.0)
    min_idle_run: Duration = Field(default=4 * HOUR_S, ge=HOUR_S, le=WEEK_S)
    max_requests_per_hour: float = Field(default=0.0, ge=0)
    min_saving_usd_per_week: Money = 10.0
    timezone: str = "UTC"
    update_every: Duration = Field(default=6 * HOUR_S, gt=0)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {value!r} (an IANA name such as Europe/Berlin)") from exc
        return value


class InferenceScaleToZeroState(Episode, kw_only=True):
    first_t: float | None = None
    """Start of the span the schedule is learned over (and of the episode's dollars)."""
    hour: float = -1.0
    """Start of the open hour (epoch s, a local hour's start); -1: none yet."""
    hour_running_s: float = 0.0
    hour_requests: float = 0.0
    hour_unknown: bool = False
    """A running interval of the open hour reported no request count: it cannot be called idle."""
    hour_usd: float = 0.0
    usage_last: float = 0.0
    slots: bytearray | None = None
    """A byte per hour of the week (:data:`UNSEEN`, :data:`BUSY`, ``BUSY + k``); None while every
    one is unseen (no hour closed yet)."""
    run_h: int = 0
    """Idle hours in a row up to the latest closed hour..."""
    run_usd: float = 0.0
    """...and what they were billed."""
    idle_usd: float = 0.0
    """Billed dollars of closed idle runs of at least ``min_idle_run`` since ``first_t``."""
    usd_h: float = 0.0
    idle_hours: int = 0
    runs: list[tuple[int, int]] | None = None
    """The schedule at the latest judgement: (first slot, hours) of each idle run of the week (None: none)."""
    last_t: float = 0.0

    def clear(self) -> None:
        super().clear()
        self.idle_hours, self.runs = 0, None


class InferenceScaleToZero(DetectorBase):
    type: ClassVar[str] = "inference_scale_to_zero"
    title: ClassVar[str] = "Inference endpoint could scale to zero"
    Params: ClassVar[builtins.type[InferenceScaleToZeroParams]] = InferenceScaleToZeroParams
    State: ClassVar[builtins.type[InferenceScaleToZeroState]] = InferenceScaleToZeroState
    consumes: ClassVar[tuple[builtins.type, ...]] = (UsageEvent,)
    suggestion: ClassVar[str] = (
        "Scale the endpoint to zero in its idle hours: a scheduled scale-down (KEDA cron scaler, a "
        "CronJob patching replicas, SageMaker scheduled scaling) or scale-to-zero on no traffic "
        "(KServe/Knative minReplicas 0, SageMaker async or serverless endpoints)."
    )
    dollars: ClassVar[str] = "spent on idle hours"

    def __init__(self, name: str, severity: str, params: Any, pricing: Pricing | None = None) -> None:
        super().__init__(name, severity, params, pricing)
        self._zone = ZoneInfo(self.params.timezone)
        self._utc = self.params.timezone == "UTC"
        self._min_run_h = int(self.params.min_idle_run // HOUR_S)
        self._weeks = max(1, int(self.params.learn // WEEK_S))

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        return [
            ("Idle", f"{details.get('schedule_text', '')} ({details.get('idle_hours_per_week', 0)} h a week, "
                     f"{details.get('timezone', 'UTC')})"),
            ("Saving", f"${figure(details.get('saving_usd_per_week', 0), ',.2f')}/week at "
                       f"${figure(details.get('usd_per_idle_hour', 0), ',.3f')} per idle hour"),
        ]  # fmt: skip

    @classmethod
    def suggest(cls, details: dict[str, Any]) -> str:
        """The schedule in our own words: rebuilt from its hour numbers (never the stored text),
        its zone named only when it is a plain IANA name."""
        runs, week, zone = details.get("schedule"), details.get("saving_usd_per_week"), details.get("timezone")
        if not isinstance(runs, list) or not runs or not isinstance(week, (int, float)) or not math.isfinite(week):
            return cls.suggestion
        pairs = [(r[0], r[1]) for r in runs if isinstance(r, list) and len(r) == 2
                 and all(type(x) is int and 0 <= x <= WEEK_H for x in r)]  # fmt: skip
        if len(pairs) != len(runs):
            return cls.suggestion
        where = zone if isinstance(zone, str) and _ZONE_NAME.fullmatch(zone) else "UTC"
        return f"Scale to zero {schedule_text(pairs)} ({where}): saves {money(week, exact=True)}/week. " + cls.suggestion

    def step(self, state: InferenceScaleToZeroState, ctx: Context, event: Event, t: float) -> list[Finding]:
        st, res = state, ctx.resource
        if type(event) is not UsageEvent or t <= st.usage_last:
            return []
        st.usage_last = t
        if st.first_t is None:
            st.first_t = t
        st.last_t = t
        hour = self._hour_start(t)
        found: list[Finding] = []
        if hour > st.hour:
            found = self._close(st, res, hour)
        if event.state != "running":
            if st.fired_at is not None:
                found += end(st, partial(self._finding, "resolve", st, res, t, reason=f"instance_{event.state}"))
                st.first_t, st.idle_usd = t, 0.0  # a new episode learns afresh from here, with its own start (alert id)
            return found
        st.hour_running_s += min(event.interval_s, HOUR_S)
        st.hour_usd += res.interval_usd
        if event.requests is None:
            st.hour_unknown = True
        else:
            st.hour_requests += event.requests
        if res.usd_per_hour is not None:
            st.usd_h = res.usd_per_hour
        return found

    def open_episode(self, state: InferenceScaleToZeroState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return self._finding("update", state, resource, state.last_t)

    # -- hours, the week's slots and judgement ------------------------------------------

    def _close(self, st: InferenceScaleToZeroState, res: ResourceInfo, nxt: float) -> list[Finding]:
        """Close the open hour (and mark the hours skipped before ``nxt`` busy: not billed), then judge."""
        if st.hour >= 0:
            idle = (st.hour_running_s >= COVERED_S and not st.hour_unknown
                    and st.hour_requests <= self.params.max_requests_per_hour)  # fmt: skip
            self._mark(st, st.hour, idle, st.hour_usd)
            skipped = int((nxt - st.hour) // HOUR_S) - 1
            for k in range(min(skipped, WEEK_H)):
                self._mark(st, st.hour + (k + 1) * HOUR_S, False, 0.0)
        st.hour, st.hour_running_s, st.hour_requests, st.hour_unknown, st.hour_usd = nxt, 0.0, 0.0, False, 0.0
        return self._judge(st, res, nxt)

    def _mark(self, st: InferenceScaleToZeroState, hour: float, idle: bool, usd: float) -> None:
        slot, slots = self._slot(hour), st.slots
        if slots is None:
            slots = st.slots = bytearray(WEEK_H)
        if idle:
            slots[slot] = min(255, max(BUSY, slots[slot]) + 1)
            st.run_h += 1
            st.run_usd += usd
            return
        slots[slot] = BUSY
        if st.run_h >= self._min_run_h:
            st.idle_usd += st.run_usd
        st.run_h, st.run_usd = 0, 0.0

    def _hour_start(self, t: float) -> float:
        """Start of the local hour ``t`` falls in: the UTC hour, but half past it in a zone half an
        hour off UTC (India, Newfoundland, South Australia), so a slot is a whole local hour."""
        if self._utc:
            return t - t % HOUR_S
        offset = datetime.fromtimestamp(t, tz=self._zone).utcoffset()
        shift = offset.total_seconds() if offset is not None else 0.0
        return t - (t + shift) % HOUR_S

    def _slot(self, hour: float) -> int:
        local = datetime.fromtimestamp(hour, tz=self._zone)
        return local.weekday() * 24 + local.hour

    def _schedule(self, st: InferenceScaleToZeroState) -> list[tuple[int, int]]:
        """Runs of scheduled idle slots around the week (a run may wrap from Sunday into Monday)."""
        idle = [s >= BUSY + self._weeks for s in st.slots or _UNSEEN_WEEK]
        if all(idle):
            return [(0, WEEK_H)]
        first_busy = idle.index(False)
        runs: list[tuple[int, int]] = []
        start, length = 0, 0
        for k in range(1, WEEK_H + 1):
            slot = (first_busy + k) % WEEK_H
            if idle[slot]:
                if length == 0:
                    start = slot
                length += 1
            elif length:
                runs.append((start, length))
                length = 0
        return sorted(r for r in runs if r[1] >= self._min_run_h)

    def _judge(self, st: InferenceScaleToZeroState, res: ResourceInfo, t: float) -> list[Finding]:
        assert st.first_t is not None
        if t - st.first_t < self.params.learn or not res.billed:
            return []  # (a stopped endpoint's episode ends in step, with its reason)
        runs = self._schedule(st)
        hours = sum(n for _, n in runs)
        worth = usd_over(st.usd_h, hours * HOUR_S) >= self.params.min_saving_usd_per_week and res.gpus > 0
        if not worth or not hours:
            found = end(st, partial(self._finding, "resolve", st, res, t, reason="traffic_in_idle_hours"))
            if found:  # a new episode learns afresh from here
                st.first_t, st.idle_usd = t, 0.0
            return found
        st.runs, st.idle_hours = runs, hours
        if st.fired_at is None:
            return [self._finding(fire(st, since=st.first_t, fired_at=t, at=t), st, res, t)]
        if due(st, t, self.params.update_every):
            return [self._finding("update", st, res, t)]
        return []

    def _finding(self, action: str, st: InferenceScaleToZeroState, res: ResourceInfo, at: float,
                 **extra: object) -> Finding:  # fmt: skip
        assert st.since is not None and st.fired_at is not None
        usd = st.idle_usd + (st.run_usd if st.run_h >= self._min_run_h else 0.0)
        week = usd_over(st.usd_h, st.idle_hours * HOUR_S)
        details = {
            "idle_hours_per_week": st.idle_hours,
            "usd_per_idle_hour": round(st.usd_h, 4),
            "saving_usd_per_week": round(week, 2),
            "schedule": [[s, n] for s, n in st.runs or ()],
            "schedule_text": schedule_text(st.runs or []),
            "timezone": self.params.timezone,
            "episode_s": round(at - st.since, 3),
            **extra,
        }
        return make_finding(self, action, res, episode_start=st.since, fired_at=st.fired_at, at=at, usd=usd,
                            details=details, usd_per_hour=week / WEEK_H)  # fmt: skip


def _at(slot: int) -> tuple[str, str]:
    slot %= WEEK_H
    return DAYS[slot // 24], f"{slot % 24:02d}:00"


def schedule_text(runs: list[tuple[int, int]]) -> str:
    """The idle runs in words: nightly runs on consecutive days with the same hours are written
    once ("Mon-Thu 20:00-07:00"), other runs with their days ("Fri 20:00-Mon 07:00")."""
    if runs == [(0, WEEK_H)]:
        return "all week"
    parts: list[str] = []
    i = 0
    while i < len(runs):
        start, n = runs[i]
        j = i
        if n < 24:
            while j + 1 < len(runs) and runs[j + 1][1] == n and runs[j + 1][0] == runs[j][0] + 24:
                j += 1
        (d0, h0), (d1, h1) = _at(start), _at(start + n)
        if j > i:
            parts.append(f"{d0}-{_at(runs[j][0])[0]} {h0}-{h1}")
        elif n < 24:
            parts.append(f"{d0} {h0}-{h1}")
        else:
            parts.append(f"{d0} {h0}-{d1} {h1}")
        i = j + 1
    return ", ".join(parts)
