"""Event-time alignment of several inputs: release events in timestamp order.

A resource's usage and its GPU metrics arrive on different topics, and a
consumer working through a backlog reads them at different speeds: the usage
topic, with fewer messages per hour, can run hours ahead in event time. Fed
straight to the detectors, a host's "stopped" could then arrive before the idle
samples that preceded it. The aligner holds each event until every source that
still has data to give has passed its timestamp (a watermark, less an allowed
lateness), then releases events sorted by time. A source that has caught up
with its input (nothing more to read now) does not hold the others back.

Both the worker (sources: topic-partitions) and ``backtest`` (sources: topics)
go through it, which is what makes them see the same order.

A source's time is the *earliest* event of its latest message: a message may span more than the
lateness (an exporter flushing five minutes of usage at once), and the next message of the same
partition, another resource's flush, may start before it ends, but not (by much) before it starts.
Taken from the latest event instead (before 2026-12-03 evening), a usage message ending at 30:00
let samples to 29:00 through while another host's flush, holding its stop at 29:30, was still to
come: that host's scrape at 29:45 completed its idle half hour before its stop was read, and it
fired and resolved where backtest had nothing. What is held grows by one message's span per
source; a source caught up holds nothing back, so a live worker whose partitions are caught up
decides as soon as before (and there, a flush not yet published can still arrive after what it
precedes), while one behind holds decisions a message's span longer (a five-minute flush: five
minutes). A part of a message pushed alone (its events not yet seen after a restart, a shard's
keys' events) moves its source as the whole would (``start``: :func:`message_start`), so that the
worker, ``backtest`` and its shards release alike. Events close in time on two topics may still
reach detection in an order the batching decides (a worker's fetches, where a restart starts them
again) where messages start out of order by more than the lateness; the detectors must decide the
same in either order, which ``tests/test_fetch_order.py`` checks with fetches drawn at random.

Released items are ``(t, event)``, with one more shape: a message's GPU samples (``GpuMetric``) of one
host at one time, two or more side by side, are held and released as one ``(t, samples)`` item, a
``list`` of them in message order (no event is a list). The engine takes such a list as a scrape
as it is (:meth:`~detector.engine.Engine.process_timed`), where it would otherwise find the scrape's
end and check it sample by sample, and the aligner sorts, cuts and holds one item where it held one
per GPU. Expanded (:func:`each_event`), the items are what one item per event would give, event by
event: a message's events sit side by side in their rank's list, and a stable sort by time keeps its
samples of one time together where the first of them would be. What counts events counts a list's
samples (:func:`count`, ``len()``). A list only ever holds samples of one message: a host's scrape
split across messages comes as two items side by side, which the engine takes as one scrape. Every
other event stays a pair of its own: a list around each usage or run event would cost them what it
saves the samples, and a sample alone in its message gains nothing from one.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Container, Hashable, Iterator, Sequence
from itertools import groupby
from operator import attrgetter, itemgetter
from typing import Any, Generic, TypeVar

__all__ = ["EventTimeAligner", "count", "each_event", "message_start"]

T = TypeVar("T")
_time = itemgetter(0)
_event = itemgetter(1)
_token = itemgetter(1)
_source = itemgetter(2)
_ts = attrgetter("ts")
_resource_id = attrgetter("resource_id")
_is_list = list.__instancecheck__
_GATHERED = "GpuMetric"
"""The event type (by name, as :data:`_RANK`) of which a message's samples of one host at one time are
held as one item: the GPU rules take a host's samples at one time together (a scrape)."""
_RANK: dict[str, int] = {"GpuMetric": 0, "SeenSample": 0, "UsageEvent": 1, "RunEvent": 2}
"""At equal timestamps, samples before usage intervals before run events: every consumer
of the same events then sees the same order, whichever topic was read first. A
:class:`~detector.engine.SeenSample` (a sample's key and time alone) ranks as the sample."""
_NEVER = float("-inf")


def message_start(events: Sequence[Any]) -> float:
    """A message's earliest event: where its source has reached (the ``start`` of a part of it pushed alone)."""
    if len(events) == 1:
        return events[0].ts.timestamp()
    return min(e.ts.timestamp() for e in events) if events else _NEVER


def count(items: Sequence[tuple[float, Any]]) -> int:
    """The events in released items (a list of samples counts each), counted in C, not item by item."""
    gathered = list(filter(_is_list, map(_event, items)))
    return len(items) + sum(map(len, gathered)) - len(gathered)


def each_event(items: Sequence[tuple[float, Any]]) -> Iterator[tuple[float, Any]]:
    """Released items as ``(t, event)``, one per event (a list's samples each at its time), in order:
    for what reads events one by one rather than as the engine does."""
    for t, item in items:
        if type(item) is list:
            for event in item:
                yield t, event
        else:
            yield t, item


def _gather(events: Sequence[Any], held: list[tuple[float, Any]]) -> tuple[float, float]:
    """Hold a GPU message's events (GPU samples, or a shard's :class:`~detector.engine.SeenSample`):
    each run of its ``GpuMetric`` samples of one host at one time as one ``(t, samples)`` item when
    it has two or more, any other event as ``(t, event)``. Returns the latest and earliest time.
    Runs are found on the samples' timestamps (datetimes, equal where their times are) and hosts,
    in C; a time is worked out once a run, not once a sample."""
    n = len(events)
    stamps = list(map(_ts, events))
    hosts = list(map(_resource_id, events))
    kinds = list(map(type, events))
    if hosts.count(hosts[0]) == n and kinds.count(kinds[0]) == n:
        keys: list[Any] = stamps  # one host, one type (the usual message): runs by time alone
    else:
        keys = list(zip(kinds, hosts, stamps, strict=True))
    latest = earliest = None
    i = 0
    for _, run in groupby(keys):
        j = i + len(list(run))
        first = events[i]
        t = first.ts.timestamp()
        if j - i == 1:
            held.append((t, first))
        elif type(first).__name__ == _GATHERED:
            samples = events[i:j]
            held.append((t, samples if type(samples) is list else list(samples)))
        else:
            for event in events[i:j]:  # (a loop, not a generator over t: a cell at every message otherwise)
                held.append((t, event))
        if latest is None or t > latest:
            latest = t
        if earliest is None or t < earliest:
            earliest = t
        i = j
    return latest, earliest  # type: ignore[return-value]  # a message of events has a run


def _take_until(by_rank: dict[int, list[Any]], limit: float) -> list[Any]:
    """Take out of each rank's list (items of which the time comes first, in arrival order) those at
    or before ``limit``, each list sorted stably by time first, then all of them sorted stably by time:
    (time, rank, arrival) order. Input is nearly in order, so each sort merges a few runs."""
    taken: list[Any] = []
    for rank, items in by_rank.items():
        if not items:
            continue
        items.sort(key=_time)
        cut = len(items) if limit == float("inf") else bisect.bisect_right(items, limit, key=_time)
        if cut == len(items):
            taken.extend(items)
            by_rank[rank] = []
        elif cut:
            taken.extend(items[:cut])
            del items[:cut]
    taken.sort(key=_time)  # stable: at equal times, by rank (the order of the lists), then arrival
    return taken


class EventTimeAligner(Generic[T]):
    """Buffers messages (lists of events) per source; releases events in time order.

    Each pushed message carries a token (the worker's Kafka message); a token is
    returned by :meth:`release` once every event of its message has been
    released, so the caller can acknowledge exactly what detection has seen.
    A message's GPU samples of one host at one time come out as one item (the module's docstring).
    """

    def __init__(self, lateness_s: float = 60.0) -> None:
        self.lateness_s = lateness_s
        self._held: dict[int, list[tuple[float, Any]]] = {}
        """Rank of the event type → its ``(t, event)`` pairs (``(t, samples)`` for a message's GPU
        samples of one host at one time) in arrival order, sorted lazily (and stably) by time at
        release. One list per rank, so that concatenated in rank order and sorted stably by time
        alone they come out in (time, rank, arrival) order, and a pair is released as it was held:
        nothing is built per event beyond it. Input is nearly in order, so each sort is a merge of a
        few runs: linear in practice."""
        self._source_t: dict[Hashable, float] = {}
        self._caught_up: set[Hashable] = set()
        self._pending: dict[int, list[tuple[float, T, Hashable]]] = {}
        """Rank of its first event's type → (latest time of its events, token, source) of each message
        with a token not yet released, in arrival order: kept as :attr:`_held` is (one list per rank,
        sorted stably by time at release), so the tokens come out in (time, rank, arrival) order with
        no key built per message. A message is released whole once its latest event is, which is
        once the watermark reaches that time; its token then comes where its last event does."""
        self.held_by_source: dict[Hashable, int] = {}
        """Source → messages with a token it has pushed that are not released yet (the worker pauses
        fetching from a source far ahead of the others, so that what is held stays bounded)."""
        self._rank: dict[type, int] = {}
        """Event type → its rank (:data:`_RANK`, by the type's name: this module imports no event type)."""
        self._events = 0
        """Events held (a list of samples is as many as it holds): ``len()``, kept as they come and go."""

    def __len__(self) -> int:
        """Events held, not items: a message's samples held as one item count each."""
        return self._events

    def held_keys(self) -> set[Any]:
        """The keys (``event.key``) of the events held: their next event is read, not yet released."""
        return {item[0].key if type(item) is list else item.key for held in self._held.values() for _, item in held}

    def push(self, source: Hashable, events: Sequence[Any], token: T | None = None, start: float | None = None) -> None:
        """Add one message's events (each with its ``ts``) from ``source``, with its token (None:
        no token to give back): :meth:`push_many` of that one message."""
        self.push_many(source, ((token, events),), start)

    def push_many(self, source: Hashable, messages: Sequence[tuple[T | None, Sequence[Any]]],
                  start: float | None = None) -> None:  # fmt: skip
        """Add messages from ``source`` in order, each ``(token, events)`` (events each with its ``ts``;
        a token None: none to give back at release). Pushing a run at once gives what pushing its
        messages one by one gives. The worker hands over a fetch's run of one partition's messages
        at a time, so what is the source's (its time, caught-up flag and count of messages held) is
        touched once per run, not once per message; ``(token, events)``, as the worker keeps each
        decoded message, so that no pair is built again to push it. Called once per Kafka message
        too (:meth:`push`), so written for the message of one event that many exporters send.

        ``start``: the source's time after these messages, when they are a part of what it gave (the
        events of a message not yet seen, after a restart; a shard's keys' events), so that the source
        moves as the whole would have moved it: the latest start of the whole messages, each one's
        earliest event. A message of the GPU rank holds its samples of one host at one time as one item
        (:func:`_gather`)."""
        if not messages:
            if start is not None:
                self.advance(source, start)
            return
        ranks = self._rank
        run_start = _NEVER  # the latest start (earliest event) of the run's messages: the source's time
        kind: type | None = None
        held: list[tuple[float, Any]] = []
        pending: list[tuple[float, T, Hashable]] = []
        tokens = n_events = 0
        gpu = False  # the run's latest type is of the GPU rank, whose messages' samples are gathered
        for token, events in messages:
            latest = earliest = _NEVER
            if events:
                first = events[0]
                if type(first) is not kind:  # a run is mostly of one event type: its rank and list kept
                    kind = type(first)
                    known = ranks.get(kind)
                    if known is None:
                        known = ranks[kind] = _RANK.get(kind.__name__, 9)
                    found = self._held.get(known)
                    held = found if found is not None else self._add_rank(known)
                    pending = self._pending[known]
                    gpu = known == 0
                if len(events) == 1:
                    latest = earliest = first.ts.timestamp()
                    held.append((latest, first))
                    n_events += 1
                elif gpu:
                    latest, earliest = _gather(events, held)
                    n_events += len(events)
                else:
                    times = [event.ts.timestamp() for event in events]
                    latest, earliest = max(times), min(times)
                    held.extend(zip(times, events, strict=True))
                    n_events += len(events)
                if token is not None:
                    pending.append((latest, token, source))
                    tokens += 1
                if earliest > run_start:
                    run_start = earliest
        self._events += n_events
        if tokens:
            held_by_source = self.held_by_source
            held_by_source[source] = held_by_source.get(source, 0) + tokens
        if start is not None:
            run_start = start
        source_t = self._source_t
        if run_start > source_t.get(source, _NEVER) or source not in source_t:
            source_t[source] = run_start
        self._caught_up.discard(source)

    def _add_rank(self, rank: int) -> list[tuple[float, Any]]:
        """A rank's first event: its held and pending lists, each dict kept in rank order."""
        held: list[tuple[float, Any]] = []
        self._held[rank] = held
        self._pending[rank] = []
        self._held = dict(sorted(self._held.items()))
        self._pending = dict(sorted(self._pending.items()))
        return held

    def advance(self, source: Hashable, t: float) -> None:
        """``source`` has given data from ``t`` on (a message's earliest event) that needs no detection
        (read again after a restart, already seen): it may move the watermark as a push would."""
        if t > self._source_t.get(source, float("-inf")):
            self._source_t[source] = t
        self._caught_up.discard(source)

    def expect(self, source: Hashable) -> None:
        """Hold everything back until ``source`` has given its first events or is caught up:
        a partition just assigned may hold older events than the others have shown yet."""
        self._source_t.setdefault(source, float("-inf"))

    def caught_up(self, source: Hashable, value: bool = True) -> None:
        """Say whether ``source`` has nothing more to read right now."""
        if value:
            self._caught_up.add(source)
        else:
            self._caught_up.discard(source)

    def progress(self, source: Hashable) -> tuple[float, bool]:
        """Where ``source`` has reached (its latest message's earliest event; -inf: nothing given yet)
        and whether it is caught up: what a worker tells the others of a partition it holds."""
        return self._source_t.get(source, _NEVER), source in self._caught_up

    def slowest(self) -> Hashable | None:
        """The source that sets the watermark (None: every source has caught up)."""
        behind = [(t, s) for s, t in self._source_t.items() if s not in self._caught_up]
        return min(behind, key=_time)[1] if behind else None

    @property
    def watermark(self) -> float:
        """Events at or before this time can be released."""
        slowest = self.slowest()
        return self._source_t[slowest] - self.lateness_s if slowest is not None else float("inf")

    def release(self, everything: bool = False, cap: float = float("inf")) -> tuple[list[tuple[float, Any]], list[T]]:
        """``(t, event)`` up to the watermark in time order (``(t, samples)`` for a message's GPU samples
        of one host at one time: the module's docstring), and the tokens of fully released messages.
        ``cap``: release nothing later than it either (what other workers have stored through, for a
        worker that looks up their hosts): what is later waits, in order, as behind a slow source."""
        limit = float("inf") if everything else self.watermark
        if cap < limit:
            limit = cap
        out = _take_until(self._held, limit)
        if not out:
            return [], []
        self._events -= count(out)
        done = _take_until(self._pending, limit)  # each message where its last event is in ``out``
        if not done:
            return out, []
        held_by_source = self.held_by_source
        for source, n in Counter(map(_source, done)).items():
            held_by_source[source] -= n
        return out, list(map(_token, done))

    def clear(self) -> None:
        """Partitions moved: drop what is held. Its messages were never acknowledged, so
        whichever worker now owns their partitions reads them again."""
        self._held.clear()
        self._pending.clear()
        self._events = 0
        self.held_by_source.clear()
        self._source_t.clear()
        self._caught_up.clear()


class HeldKeys(Container[Any]):
    """The keys of the events an aligner holds (:meth:`EventTimeAligner.held_keys`), gathered at the
    first look-up. A sweep asks only about keys gone quiet, and most sweeps find none, while gathering
    walks every event held: a catch-up sweeps at nearly every batch, and did it each time (~2 % of a
    worker's samples, one event a message; docs/performance.md)."""

    __slots__ = ("_aligner", "_keys")

    def __init__(self, aligner: EventTimeAligner[Any]) -> None:
        self._aligner = aligner
        self._keys: set[Any] | None = None

    def __contains__(self, key: object) -> bool:
        if self._keys is None:
            self._keys = self._aligner.held_keys()
        return key in self._keys
