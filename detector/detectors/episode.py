"""The one lifecycle of an episode: it fires once, reports its growing dollars, resolves, and
may fire again as a new episode.

Every episode-style detector keeps each episode in a state that extends :class:`Episode`
and moves it only through these functions, so the lifecycle's rules hold the same way for
all of them (a detector decides *when* its condition holds, never how an episode moves):

- **fire** opens the episode once: ``since`` (with rule and resource, the alert's identity)
  and ``fired_at`` are set, and an open episode never fires again;
- **update** comes while it is open, at most every ``every_s`` of event time (:func:`due`);
- **resolve** comes only for an episode that fired, made from its figures *before* they
  are cleared (:func:`end`); a candidate that never fired ends silently;
- after a resolve the state is clear, so the next fire is a new episode with its own
  ``since`` and so its own alert id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec

from detector.detectors.base import Finding

__all__ = ["CORRECTED", "ENDED", "GAP", "MAX_ENDED_GAPS", "STOP_GAP_S", "WITHDRAWN", "Action", "Ended", "Episode",
           "advance", "after_gap", "due", "end", "ended_of", "fire", "gap_at", "gap_holding", "is_ended", "rebased",
           "take_back_ended", "with_gaps", "withdraws", "SILENT"]

Action = Literal["fire", "update", "resolve"]

WITHDRAWN = "withdrawn"
"""The ``reason`` of a resolution that takes its fire back: the resource stopped before the sample that
completed the episode, a stop read after that sample (live, a usage flush read behind the samples).
Read in event-time order (``backtest``), the stop comes first and no episode fires: the alert never
stood, and it counts no dollars (:attr:`detector.alerts.Alert.withdrawn`)."""

SILENT = "went_silent"
"""The ``reason`` of a resolution made because the episode's resource sent no event for the state TTL
(it vanished: terminated with no stop event, its node removed, its exporter gone), dated where its
events stopped (:meth:`detector.engine.Engine.silent_resolutions`); ``silent_s`` in its details is the TTL,
at least how long it has been silent.
Nothing is counted after that: what it cost since, if anything, burnwatch cannot know."""

CORRECTED = "corrected"
"""The details key (True) of a resolution that corrects the one made before for the same episode: a stop
read after the sample that resolved it, dated after the sample that fired it and within a gap in the
samples before that resolution (live, a usage topic read behind a restarted host). In event-time order
(``backtest``) the stop ended the episode there: the correction says so, with its time and dollars
(``at``, ``waste_usd``), and the figures it replaces in ``was_resolved_at`` and ``was_usd``."""


STOP_GAP_S = 60.0
"""A gap in a host's samples longer than this may hold a stop: a host stopped and started again is
gone for a billing interval at least (a minute) and boots after, while a scrape every 15-60 s misses
one now and then. The GPU rules keep such gaps while an episode (or a candidate, an idle run) is
under way, until usage is read past them, so that a stop read after the samples past one (the usage
topic read behind) ends the episode there, as in time order."""


def withdraws(since: float, fired_by: float | None, stop: float) -> bool:
    """Whether a stop at ``stop``, read now, takes back the open episode that started at ``since`` and
    fired at ``fired_by`` (the time of the event that fired it): it came within, so in event-time order
    the stop ended the episode first and this one never fired, however many samples were read past
    the stop (a host started again soon after starts an episode of its own there). A stop before the
    episode began (a backlog's, or one sent again) never touched it. ``fired_by`` None: not known (a
    state saved before it was kept), so nothing is taken back."""
    return fired_by is not None and since <= stop < fired_by


Ended = tuple[float, ...]
"""``(since, fired_at, fired_by)`` of the episode a sample resolved last: a stop read after that sample and
dated within it (:func:`withdraws`) takes it back too, resolved though it is. Where the episode had gaps in
its samples that usage was not yet read past (:data:`GAP` figures each, oldest first, as the GPU rules keep
them), then ``(resolved_at, waste_usd, unpriced_s)`` of that resolution, the time of the episode's last
sample before it, and the gaps: a stop read later and dated in one of them, after the fire, corrects it
(:func:`gap_at`, :data:`CORRECTED`)."""

ENDED = 7
"""Figures of an :data:`Ended` before its gaps."""
MAX_ENDED_GAPS = 8
"""Gaps an :data:`Ended` holds at most (the GPU rules keep four, and the one a resolving sample ends)."""
GAP = 6
"""Figures of a gap in an episode's samples that may hold a stop: its last sample before, the first after,
``waste_usd`` and ``unpriced_s`` before it, and after it (the same unless it was counted)."""


def ended_of(since: float, fired_at: float, fired_by: float, at: float, waste_usd: float, unpriced_s: float,
             held_until: float, gaps: tuple[float, ...] | None) -> Ended:  # fmt: skip
    """The :data:`Ended` of an episode resolved at ``at`` with ``waste_usd`` and ``unpriced_s``, its last
    sample before at ``held_until``, its gaps ``gaps`` (None: none)."""
    if not gaps:
        return (since, fired_at, fired_by)
    return (since, fired_at, fired_by, at, waste_usd, unpriced_s, held_until, *gaps)


def with_gaps(figures: tuple[float, ...], head: int) -> bool:
    """Whether ``figures`` are ``head`` figures, then whole gaps (:data:`GAP`), at most :data:`MAX_ENDED_GAPS`."""
    n = len(figures) - head
    return 0 <= n <= GAP * MAX_ENDED_GAPS and n % GAP == 0


def is_ended(ended: tuple[float, ...]) -> bool:
    """Whether a saved ``ended`` has an :data:`Ended`'s shape (a state that does not is refused)."""
    return len(ended) == 3 or (len(ended) > ENDED and with_gaps(ended, ENDED))


def gap_holding(gaps: tuple[float, ...], t: float, start: int = 0) -> int | None:
    """The place of the gap (:data:`GAP` figures each, from ``start``) that holds ``t``: its last sample
    before at or before ``t``, its first after later. None: none does (gaps do not overlap)."""
    for k in range(start, len(gaps), GAP):
        if gaps[k] <= t < gaps[k + 1]:
            return k
    return None


def gap_at(ended: Ended, t: float) -> int | None:
    """The place in ``ended`` of its gap that holds a stop at ``t``: read after the sample that resolved the
    episode, the stop ended it there in event-time order (withdrew it, before its fire), and the samples
    after the gap were a candidate of their own. None: no gap of it holds ``t``."""
    return gap_holding(ended, t, ENDED)


def after_gap(gaps: tuple[float, ...], i: int, stale_after: float, for_s: float) -> tuple[float, float, float, int]:
    """Where the samples after the gap at ``i`` of ``gaps`` began a candidate of their own in time order, a stop
    in that gap read first: the gap's end, or a later gap's longer than ``stale_after`` that came before
    they had lasted ``for_s`` (a telemetry gap restarts a candidate); the dollars and unpriced seconds
    counted before that start; and the place of the gaps after it."""
    resumed_at, waste_after, unpriced_after, k = gaps[i + 1], gaps[i + 4], gaps[i + 5], i + GAP
    for j in range(i + GAP, len(gaps), GAP):
        if gaps[j + 1] - gaps[j] > stale_after and gaps[j] - resumed_at < for_s:
            resumed_at, waste_after, unpriced_after, k = gaps[j + 1], gaps[j + 4], gaps[j + 5], j + GAP
    return resumed_at, waste_after, unpriced_after, k


def rebased(gaps: tuple[float, ...], k: int, waste: float, unpriced: float) -> tuple[float, ...] | None:
    """The gaps from place ``k`` on, their dollars and unpriced seconds counted from a start at which the episode had
    ``waste`` and ``unpriced`` (a candidate of their own after a stop); None: none."""
    return tuple(x for j in range(k, len(gaps), GAP) for x in (
        gaps[j], gaps[j + 1], gaps[j + 2] - waste, gaps[j + 3] - unpriced, gaps[j + 4] - waste,
        gaps[j + 5] - unpriced)) or None  # fmt: skip


def take_back_ended(ended: Ended, t: float, stopped: bool) -> tuple[Ended | None, Ended | None]:
    """A usage event at ``t`` (``stopped``: it says the resource no longer runs), read after the sample
    that resolved the episode ``ended``: returns what is still to be kept of it, and the episode it
    takes back (None: none): withdrawn where the stop came before its fire, corrected where it came in
    one of its gaps (:func:`gap_at`). Kept until a usage event dated after its fire and its gaps: a
    resource's usage is read in order, so no stop read later is dated within them. A stop after the
    fire and before the resolution in no gap kept ended the episode there in time order, with dollars
    not known: the resolution stands, and no stop read later corrects it."""
    if t >= ended[2] and (len(ended) == 3 or t >= ended[-GAP + 1]):
        return None, None
    if stopped and (withdraws(ended[0], ended[2], t) or (t >= ended[2] and gap_at(ended, t) is not None)):
        return None, ended
    if stopped and len(ended) > 3 and ended[2] <= t < ended[3]:
        return None, None
    return ended, None


class Episode(msgspec.Struct, kw_only=True, gc=False):
    """One episode's place in the lifecycle. A detector's state extends it (or holds one per
    destination, run...) and adds its own figures; :meth:`clear` clears those too.

    ``gc=False`` (inherited), as on every per-key state struct: a state holds plain data and
    never a cycle, so the garbage collector need not track a million resources' structs
    (16 bytes each less, and no walk over them at each full collection)."""

    since: float | None = None
    """Start of the episode (event time); set when it fires, or earlier by a detector that
    counts a candidate from it."""
    fired_at: float | None = None
    """When it fired (event time); None: not open."""
    last_report: float = 0.0
    """Event time of its latest fire or update."""

    @property
    def open(self) -> bool:
        """Fired and not resolved."""
        return self.fired_at is not None

    def clear(self) -> None:
        """Forget the episode; a subclass clears its own figures of it too (and calls this)."""
        self.since = self.fired_at = None
        self.last_report = 0.0


def fire(ep: Episode, *, since: float, fired_at: float, at: float) -> Action:
    """Open ``ep``: it started at ``since``, fires dated ``fired_at``, reported as of ``at``."""
    if ep.fired_at is not None:
        raise ValueError("an open episode does not fire again")
    ep.since, ep.fired_at, ep.last_report = since, fired_at, at
    return "fire"


def due(ep: Episode, at: float, every_s: float) -> bool:
    """Whether an update of the open ``ep`` is due at ``at`` (``every_s`` after the latest
    report); when it is, it counts as made."""
    if ep.fired_at is None or at - ep.last_report < every_s:
        return False
    ep.last_report = at
    return True


def advance(ep: Episode, at: float, *, start: float, held_s: float, need_s: float, every_s: float) -> Action | None:
    """The condition has held since ``start``, for ``held_s``, as of ``at``: the episode fires
    once it has held ``need_s`` (dated ``start + need_s``, so the same input always dates it
    the same), then updates every ``every_s``. None: nothing to say yet."""
    if ep.fired_at is None:
        if held_s < need_s:
            return None
        return fire(ep, since=start, fired_at=start + need_s, at=at)
    return "update" if due(ep, at, every_s) else None


def end(ep: Episode, resolve: Callable[[], Finding]) -> list[Finding]:
    """The condition no longer holds: the ``resolve`` finding if ``ep`` fired (made before
    anything is cleared), then ``ep`` is cleared for the next episode.

    Code that runs per event or scrape passes ``functools.partial(self._finding, ...)``, not a
    lambda: a lambda over its locals costs it cells at every call, ending or not
    (:func:`~detector.detectors.base.at_sample`)."""
    found = [resolve()] if ep.fired_at is not None else []
    ep.clear()
    return found
