"""What the serving rules that judge a window of whole hours share: ``inference_overprovisioned``
and ``inference_unbatched``.

Each keeps per-hour figures of an endpoint over a window (``params.window``), judges the window
whenever an hour closes, and, while the judgement finds a saving per hour, holds an episode whose
dollars are that saving over the time it covers, less the whole hours that served no request:
those are ``inference_scale_to_zero``'s (the full price of an hour nobody uses), so no hour is
counted by two rules. A rule says what an hour holds (:meth:`HourlySaving.new_hour`), what goes
into it, and what the window's saving is (:meth:`HourlySaving.saving`); the rest is here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import msgspec

from detector.detectors.base import DetectorBase, Finding, ResourceInfo, make_finding
from detector.detectors.episode import Episode, end, fire
from detector.detectors.inference_scale_to_zero import no_requests
from detector.floats import FloatArray, newer, per_gpu
from detector.pricing import usd_over

__all__ = ["HOUR_S", "HourlySaving", "HourlySavingState"]

HOUR_S = 3600.0


class HourlySavingState(Episode, kw_only=True):
    """An endpoint's window of hours (``hours``: each rule's own per-hour struct, with a
    ``start``, ``requests`` and ``request_s``) and its episode's saving."""

    hours: list[Any] = []
    first_t: float | None = None
    usage_last: float = 0.0
    gpu_last: FloatArray = msgspec.field(default_factory=per_gpu)
    """Latest sample time per GPU index (:func:`detector.floats.per_gpu`), so a sample read again is not counted twice."""
    last_t: float = 0.0
    saving_usd_h: float = 0.0
    advice: dict[str, Any] | None = None
    """The advice of the open episode (None: none, not an empty dict on every endpoint)."""
    idle_s: float = 0.0
    """Seconds of the episode in closed hours that served no request (scale-to-zero's, not counted)."""

    def clear(self) -> None:
        super().clear()
        self.saving_usd_h, self.advice, self.idle_s = 0.0, None, 0.0


class HourlySaving(DetectorBase, ABC):
    """A rule judging an endpoint's window of hours for a saving per hour."""

    resolved_because: ClassVar[str]
    """The resolve reason when a judgement finds no saving any more."""

    @abstractmethod
    def new_hour(self, start: float) -> Any:
        """The rule's figures of the hour from ``start``, empty."""

    @abstractmethod
    def saving(self, st: Any, res: ResourceInfo) -> dict[str, Any] | None:
        """The window's saving (``saving_usd_per_hour`` and what the alert shows: the episode's
        ``advice``), or None: none."""

    def judgeable(self, st: Any) -> bool:
        """Whether the window holds what a judgement needs (False: nothing changes, not even a resolve)."""
        return True

    def open_episode(self, state: HourlySavingState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return self._finding("update", state, resource, state.last_t)

    def sample_hour(self, st: HourlySavingState, res: ResourceInfo, gpu: int, t: float) -> list[Finding] | None:
        """A GPU sample of GPU ``gpu`` at ``t``: None when it was read before; else the findings of
        the hour it closed, if any, and its figures go into ``st.hours[-1]``."""
        return self.roll(st, res, t) if newer(st.gpu_last, gpu, t) else None

    def roll(self, st: HourlySavingState, res: ResourceInfo, t: float) -> list[Finding]:
        """Open the hour ``t`` falls in; when an hour closes, judge the window."""
        if st.first_t is None:
            st.first_t = t
        st.last_t = max(st.last_t, t)
        start = t - t % HOUR_S
        if st.hours and st.hours[-1].start >= start:
            return []
        found = self._judge(st, res, t) if st.hours else []
        st.hours.append(self.new_hour(start))
        while st.hours and st.hours[0].start <= start - self.params.window:
            st.hours.pop(0)
        return found

    def stopped(self, st: HourlySavingState, res: ResourceInfo, t: float, state: str) -> list[Finding]:
        """The endpoint stopped running (``state``): an open episode resolves."""
        if st.fired_at is None:
            return []
        return end(st, lambda: self._finding("resolve", st, res, t, reason=f"instance_{state}"))

    def _judge(self, st: HourlySavingState, res: ResourceInfo, t: float) -> list[Finding]:
        """An hour closed at ``t``: once a whole window is seen, fire, update or resolve on its saving."""
        assert st.first_t is not None
        window = self.params.window
        if t - st.first_t < window or not res.billed or not self.judgeable(st):
            return []
        advice = self.saving(st, res)
        if advice is None:
            return end(st, lambda: self._finding("resolve", st, res, t, reason=self.resolved_because))
        st.advice, st.saving_usd_h = advice, advice["saving_usd_per_hour"]
        if st.fired_at is None:
            since = max(st.first_t, t - window)
            st.idle_s = sum(HOUR_S for h in st.hours if h.start >= since and no_requests(h.requests, h.request_s))
            return [self._finding(fire(st, since=since, fired_at=t, at=t), st, res, t)]
        if no_requests(st.hours[-1].requests, st.hours[-1].request_s):
            st.idle_s += HOUR_S
        st.last_report = t  # every judgement of an open episode reports it
        return [self._finding("update", st, res, t)]

    def _finding(self, action: str, st: HourlySavingState, res: ResourceInfo, at: float,
                 **extra: object) -> Finding:  # fmt: skip
        assert st.since is not None and st.fired_at is not None
        usd = usd_over(st.saving_usd_h, max(0.0, at - st.since - st.idle_s))
        details = {**(st.advice or {}), "episode_s": round(at - st.since, 3), **extra}
        return make_finding(self, action, res, episode_start=st.since, fired_at=st.fired_at, at=at, usd=usd,
                            details=details, usd_per_hour=st.saving_usd_h)  # fmt: skip
