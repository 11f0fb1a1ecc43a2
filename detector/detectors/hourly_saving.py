"""What the serving rules that judge a window of whole hours share: ``inference_overprovisioned``
and ``inference_unbatched``.

Each keeps per-hour figures of an endpoint over a window (``params.window``), judges the window
whenever an hour closes, and, while the judgement finds a saving per hour, holds an episode whose
dollars are that saving over the time it covers, less the whole hours that served no request:
those are ``inference_scale_to_zero``'s (the full price of an hour nobody uses), so no hour is
counted by two rules. A rule says what an hour holds (its state's
:attr:`HourlySavingState.columns`), what goes into it, and what the window's saving is
(:meth:`HourlySaving.saving`); the rest is here.

The hours are rows of one flat array of doubles (:attr:`HourlySavingState.figures`), not a struct
of boxed floats per hour: a day of ``inference_overprovisioned``'s hours is ~1.5 KB, not ~10 KB.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from functools import partial
from typing import Any, ClassVar

import msgspec

from detector.detectors.base import DetectorBase, Finding, ResourceInfo, make_finding
from detector.detectors.episode import Episode, end, fire
from detector.detectors.inference_scale_to_zero import no_requests
from detector.floats import FloatArray, floats, newer, per_gpu
from detector.pricing import usd_over

__all__ = ["HOUR_S", "REQUESTS", "REQUEST_S", "START", "HourlySaving", "HourlySavingState"]

HOUR_S = 3600.0
START, REQUESTS, REQUEST_S = 0, 1, 2
"""The columns every hour has: its start, requests counted, and the seconds they cover."""


class HourlySavingState(Episode, kw_only=True):
    """An endpoint's window of hours and its episode's saving."""

    columns: ClassVar[tuple[str, ...]] = ("start", "requests", "request_s")
    """The figures of an hour, in their order in a row of :attr:`figures` (:data:`START`,
    :data:`REQUESTS`, :data:`REQUEST_S`, then the rule's own); the names of the fields of the
    struct per hour that snapshots saved before (:attr:`hours`)."""
    width: ClassVar[int] = len(columns)
    """Figures per hour (a row of :attr:`figures`): a rule's state sets it with its columns."""
    figures: FloatArray = msgspec.field(default_factory=floats)
    """The hours held, oldest first, as rows of :attr:`columns` flattened (a row per hour)."""
    hours: list[Any] | None = None
    """The hours as snapshots saved them before :attr:`figures` (a struct per hour): read into it, then None."""
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

    def __post_init__(self) -> None:
        if len(self.columns) != self.width or self.width > len(_ZEROS) + 1 or len(self.figures) % self.width:
            raise ValueError(f"hours are rows of {self.width} figures")  # (a rule's columns, at most 33)
        if self.hours is None:
            return
        hours, self.hours = self.hours, None  # saved before: one struct per hour
        for hour in hours:
            self.figures.extend(float(getattr(hour, name)) for name in self.columns)
            self.read_hour(hour)

    def read_hour(self, hour: Any) -> None:
        """What a struct per hour saved before holds besides :attr:`columns` (a rule's own)."""

    def clear(self) -> None:
        super().clear()
        self.saving_usd_h, self.advice, self.idle_s = 0.0, None, 0.0

    # -- the hours ------------------------------------------------------------------

    def column(self, c: int) -> FloatArray:
        """Figure ``c`` of each hour held, oldest first."""
        return self.figures[c :: self.width]

    def rows(self) -> Iterator[int]:
        """Where each hour's row starts in :attr:`figures`, oldest first."""
        return iter(range(0, len(self.figures), self.width))

    def latest(self) -> int:
        """Where the latest hour's row starts in :attr:`figures` (there is one); the per-sample
        paths index it from the end instead (``figures[c - width]``: no ``len`` per sample)."""
        return len(self.figures) - self.width

    def open_hour(self, start: float) -> None:
        """A new latest hour from ``start``, its figures 0."""
        self.figures.append(start)
        self.figures.extend(_ZEROS[: self.width - 1])

    def drop_hours(self, n: int) -> None:
        """The ``n`` oldest hours leave the window."""
        del self.figures[: n * self.width]


_ZEROS = floats()
_ZEROS.extend([0.0] * 32)
"""An hour's figures before anything goes into them (a slice of it: no list made per hour)."""


class HourlySaving(DetectorBase, ABC):
    """A rule judging an endpoint's window of hours for a saving per hour."""

    resolved_because: ClassVar[str]
    """The resolve reason when a judgement finds no saving any more."""

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
        the hour it closed, if any, and its figures go into the latest hour (``st.latest()``)."""
        return self.roll(st, res, t) if newer(st.gpu_last, gpu, t) else None

    def roll(self, st: HourlySavingState, res: ResourceInfo, t: float) -> list[Finding]:
        """Open the hour ``t`` falls in; when an hour closes, judge the window as of the new hour's start.
        Not as of ``t``, nor from the first event to arrive (``first_t`` is the earliest time
        seen): an endpoint's samples and its usage come on two topics, and which reaches detection
        first depends on how they were read, so the event that closes an hour, and the first one,
        would date the episode (its start, its id, its dollars) by the order of reading."""
        if st.first_t is None or t < st.first_t:
            st.first_t = t
        st.last_t = max(st.last_t, t)
        start = t - t % HOUR_S
        figures, width = st.figures, st.width
        if figures and figures[START - width] >= start:
            return []
        found = self._judge(st, res, start) if figures else []
        st.open_hour(start)
        horizon, old = start - self.params.window, 0
        while old * width < len(figures) and figures[old * width + START] <= horizon:
            old += 1
        if old:
            st.drop_hours(old)
        return found

    def stopped(self, st: HourlySavingState, res: ResourceInfo, t: float, state: str) -> list[Finding]:
        """The endpoint stopped running (``state``): an open episode resolves."""
        if st.fired_at is None:
            return []
        return end(st, partial(self._finding, "resolve", st, res, t, reason=f"instance_{state}"))

    def _judge(self, st: HourlySavingState, res: ResourceInfo, t: float) -> list[Finding]:
        """The hours up to ``t`` have closed: once a whole window is seen, fire, update or resolve on its saving."""
        assert st.first_t is not None
        window = self.params.window
        if t - st.first_t < window or not res.billed or not self.judgeable(st):
            return []
        advice = self.saving(st, res)
        if advice is None:
            return end(st, partial(self._finding, "resolve", st, res, t, reason=self.resolved_because))
        st.advice, st.saving_usd_h = advice, advice["saving_usd_per_hour"]
        if st.fired_at is None:
            since = max(st.first_t, t - window)
            f = st.figures
            st.idle_s = sum(HOUR_S for i in st.rows() if f[i + START] >= since and no_requests(f[i + REQUESTS], f[i + REQUEST_S]))
            return [self._finding(fire(st, since=since, fired_at=t, at=t), st, res, t)]
        f, i = st.figures, st.latest()
        if no_requests(f[i + REQUESTS], f[i + REQUEST_S]):
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
