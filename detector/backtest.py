"""Run rules over history in-process: the same decoder, engine and alert manager the
worker uses, without Kafka or Slack.

History is a replay file (topics aligned on event time as the worker aligns them)
or the events stored in ClickHouse. With a second rule set, both run over the same
events in one pass, and :func:`compare` says what the change would add or remove.

A replay file can be detected over in several processes at once (``jobs``): each takes the keys
of one shard (``crc32`` of the key modulo the processes: stable from run to run) and detects as a
single process would. Each reads and decodes the whole file and aligns it as one process would,
so every engine sees its keys' events in the single process's order and at its batch boundaries.
Of the other shards' resources it takes the usage events (what each resource is: a run's hosts'
price, through :meth:`Engine.resource`), the run events (no rule runs on them: their projects'
times move the engine's watermark as in one process, and a sweep by the state TTL resolves what
one process's would) and each GPU sample's key and time (:class:`SeenSample`: when a host starts
afresh after going quiet), so what it looks up is what one process would find. The alerts are
merged in the order one process lists them.

The alert manager's memory is the whole fleet's in one process and a shard's in each, which shows
in three cases (found by review; docs/cli.md): two projects' runs of one run id whose alerts share
an id (rule, run id, start second), which one process takes for one alert; ``realert`` held across
such runs; and what the manager forgets each 10,000 alerts it remembers, which a shard, remembering
fewer, forgets later (an alert held by ``realert`` more than 7 days of episodes after its previous
one).
"""

from __future__ import annotations

import multiprocessing
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detector.alerts import Alert, AlertManager, from_finding
from detector.align import EventTimeAligner, message_start
from detector.billing.rates import BilledRates
from detector.detectors import Finding
from detector.detectors.anomaly import Scoring, scoring_during
from detector.engine import Engine, SeenSample
from detector.events import EventDecoder, GpuMetric, InvalidMessage
from detector.replay import read_replay
from detector.rules import RuleSet

if TYPE_CHECKING:
    from detector.store import EventHistory

__all__ = ["BacktestResult", "RuleDiff", "ShardFailed", "backtest", "backtest_store", "compare"]

_NEVER = float("-inf")

HOUR_S = 3600.0


class ShardFailed(RuntimeError):
    """A process of ``backtest --jobs`` ended without its alerts, or read another file than the rest."""


@dataclass
class BacktestResult:
    alerts: list[Alert]
    """Latest state of every alert, in the order they fired."""
    events: int = 0
    messages: int = 0
    invalid: list[tuple[int, str]] = field(default_factory=list)
    """(line, reason) of every message the worker would send to the dead-letter topic."""
    other: list[Alert] | None = None
    """With a second rule set: its alerts over the same events."""
    span: tuple[float, float] | None = None
    """Event time covered, for ``--since`` runs."""


class _Shard:
    """Which keys one of ``of`` processes detects for (``backtest --jobs``): a stable hash of the key."""

    def __init__(self, index: int, of: int) -> None:
        self.index, self.of = index, of
        self._mine: dict[str, bool] = {}

    def owns(self, key: str) -> bool:
        mine = self._mine.get(key)
        if mine is None:
            mine = self._mine[key] = zlib.crc32(key.encode("utf-8", "surrogatepass")) % self.of == self.index
        return mine

    def foreign(self, key: str) -> bool:
        return not self.owns(key)


class _Detection:
    """One rule set's engine and alert manager, fed time-ordered events as the aligner releases them
    (a message's GPU samples of one host at one time as one item: :mod:`detector.align`)."""

    def __init__(self, ruleset: RuleSet, billed: BilledRates | None = None, shard: _Shard | None = None) -> None:
        self.engine = Engine(ruleset, billed=billed, foreign=shard.foreign if shard is not None else None)
        self.manager = AlertManager(ruleset=ruleset)
        self.latest: dict[str, Alert] = {}

    def feed(self, items: list[tuple[float, Any]]) -> None:
        engine = self.engine
        findings = engine.process_timed(items)
        if engine.sweep_due:  # where a worker sweeps too: keys quiet past the TTL end their open episodes
            engine.expire()
            findings += engine.last_ended
        self._take(findings)

    def _take(self, findings: list[Finding]) -> None:
        for alert in self.manager.handle(findings):
            self.latest[alert.alert_id] = alert

    def finish(self) -> list[Alert]:
        self.engine.expire()  # as a worker's sweep on the wall clock does once the stream stops
        self._take(self.engine.last_ended)
        names = self.manager.ruleset.tag_names if self.manager.ruleset is not None else None
        for finding in self.engine.open_episodes():
            alert = from_finding(finding, names)
            before = self.latest.get(alert.alert_id)
            if before is not None:  # its latest figures, as routed and held back when it opened
                alert.channel, alert.held, alert.silenced = before.channel, before.held, before.silenced
                alert.details = {**before.details, **alert.details}
            self.latest[alert.alert_id] = alert
        return _in_order(self.latest.values())


def _run(batches: Iterable[list[tuple[float, Any]]], ruleset: RuleSet, other: RuleSet | None, result: BacktestResult,
         models: Any = None, on_windows: Any = None, record: Any = None,
         billed: BilledRates | None = None, shard: _Shard | None = None) -> None:  # fmt: skip
    runs = [_Detection(ruleset, billed, shard)] + ([_Detection(other, billed, shard)] if other is not None else [])
    with ExitStack() as lent:  # the anomaly rules score with ``models`` for this run only
        lent.enter_context(scoring_during(ruleset.rules, Scoring(models, on_windows, record)))
        if other is not None:
            lent.enter_context(scoring_during(other.rules, Scoring(models)))
        for items in batches:
            for detection in runs:
                detection.feed(items)
        result.alerts = runs[0].finish()
        if other is not None:
            result.other = runs[1].finish()


def backtest(
    path: str | Path,
    ruleset: RuleSet,
    decoder: EventDecoder | None = None,
    lateness_s: float = 60.0,
    other: RuleSet | None = None,
    models: Any = None,
    on_windows: Any = None,
    record: Any = None,
    billed: BilledRates | None = None,
    jobs: int = 1,
    shard: _Shard | None = None,
) -> BacktestResult:
    """Detect over a whole replay file, topics aligned on event time as the worker aligns them.
    ``models`` scores the ``anomaly`` rule's windows; ``on_windows`` sees them (training);
    ``record`` sees each batch's judged windows with their scores (``backtest --scores``). Without
    a ``decoder``, events are decoded with the rule set's plausibility bounds, as the worker does.
    ``billed``: rates and tags from a FOCUS bill (``backtest --bill``), as the worker has them.
    ``jobs``: processes that detect at once, each for a shard of the keys (the module's docstring);
    1 or less, this one. Not with ``on_windows`` or ``record``, which see windows in file order.
    ``shard``: this process is one of them (what :func:`_in_processes` gives each)."""
    if jobs > 1:
        if on_windows is not None or record is not None:
            raise ValueError("backtest in several processes (jobs) cannot train or record scores: those see "
                             "every window in the file's order")  # fmt: skip
        return _in_processes(jobs, lambda part: backtest(path, ruleset, decoder=decoder, lateness_s=lateness_s, other=other,
                                                         models=models, billed=billed, shard=part))  # fmt: skip
    decoder = decoder or EventDecoder(limits=ruleset.limits)
    result = BacktestResult(alerts=[])
    owns = shard.owns if shard is not None else None

    def batches() -> Iterable[list[tuple[float, Any]]]:
        aligner: EventTimeAligner[None] = EventTimeAligner(lateness_s)
        seen: list[Any] = [None, None]  # the latest SeenSample's (host, timestamp): one a scrape is enough

        def of_shard(topic: str, events: list[Any], owns: Callable[[str], bool]) -> list[Any]:
            """What of a message this shard's engine takes: the events of its keys, every usage event (what
            the other shards' resources are, for look-ups), every run event (its project's time moves the
            engine's watermark as in one process, which the state TTL's sweeps go by; its rules run in its
            shard alone) and each other host's sample as a SeenSample, one a host and time (when it starts
            afresh)."""
            kind = type(events[0])  # a message holds one topic's events
            if kind is not GpuMetric:  # usage and run events: the engine skips the rules of other shards' keys
                return events
            kept = []
            for e in events:
                host = e.resource_id
                if owns(host):
                    kept.append(e)
                elif host != seen[0] or e.ts != seen[1]:
                    seen[0], seen[1] = host, e.ts
                    kept.append(SeenSample(host, e.ts))
            return kept

        decode, invalid = decoder.decode, result.invalid
        messages = n_events = 0
        topic, run = "", []  # type: tuple[str, list[tuple[None, list[Any]]]]  # consecutive messages of a topic
        # A shard's messages lose other shards' events: the whole messages' starts (their earliest events)
        # move the topic, as in one process; the aligner reads them off the messages it is given otherwise.
        run_start = _NEVER

        def push() -> None:
            aligner.push_many(topic, run, start=None if owns is None else run_start)

        for line_no, record in read_replay(path):
            messages += 1
            try:
                events = decode(record.topic, record.value)  # the record's buffer, not a copy
            except InvalidMessage as exc:
                invalid.append((line_no, exc.reason))
                continue
            n_events += len(events)
            start = _NEVER
            if owns is not None:
                start = message_start(events)
                events = of_shard(record.topic, events, owns)
            if record.topic != topic:
                if run:
                    push()
                topic, run, run_start = record.topic, [], _NEVER
            run.append((None, events))
            if start > run_start:
                run_start = start
            if messages % 1000 == 0:  # as the worker does per batch
                push()
                run, run_start = [], _NEVER
                result.messages, result.events = messages, n_events
                yield aligner.release()[0]
        if run:
            push()
        result.messages, result.events = messages, n_events
        yield aligner.release(everything=True)[0]

    _run(batches(), ruleset, other, result, models, on_windows, record, billed, shard)
    return result


_SHARD_RUN: Callable[[_Shard], BacktestResult] | None = None
"""What each forked process of :func:`_in_processes` runs (a closure: inherited, never pickled)."""


def _run_shard(index_of: tuple[int, int]) -> BacktestResult:
    assert _SHARD_RUN is not None
    return _SHARD_RUN(_Shard(*index_of))


def _in_processes(jobs: int, run: Callable[[_Shard], BacktestResult]) -> BacktestResult:
    """``run`` for each of ``jobs`` shards in its own process (forked: the rules and models are
    shared, not pickled), merged: every shard reads the whole file, so the counts and the invalid
    lines are the first's; the alerts are all of theirs, in the order one process lists them."""
    global _SHARD_RUN
    _SHARD_RUN = run
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            parts = list(pool.map(_run_shard, [(i, jobs) for i in range(jobs)]))
    except BrokenProcessPool:  # one was killed (out of memory: every process reads the whole file)
        raise ShardFailed(f"a backtest process of the {jobs} ended without its alerts (killed: out of memory?); "
                          "run it again with fewer --jobs") from None
    finally:
        _SHARD_RUN = None
    if any((p.events, p.messages, p.invalid) != (parts[0].events, parts[0].messages, parts[0].invalid) for p in parts):
        raise ShardFailed("the backtest processes read the file differently (it changed while they read it?)")
    merged = parts[0]
    merged.alerts = _in_order(a for part in parts for a in part.alerts)
    if merged.other is not None:
        merged.other = _in_order(a for part in parts for a in part.other or [])
    return merged


def _in_order(alerts: Iterable[Alert]) -> list[Alert]:
    """As :meth:`_Detection.finish` lists them."""
    return sorted(alerts, key=lambda a: (a.fired_at, a.alert_id))


def backtest_store(history: EventHistory, since_s: float, ruleset: RuleSet, other: RuleSet | None = None, models: Any = None,
                   on_windows: Any = None) -> BacktestResult:  # fmt: skip
    """Detect over the events stored in ClickHouse (``store.history``) in the last ``since_s``
    of event time (before the newest stored event, so a replayed history works as a live one)."""
    result = BacktestResult(alerts=[])
    span = history.span()
    if span is None:
        _run([], ruleset, other, result)
        return result
    end = span[1] + 0.001
    start = max(span[0], end - since_s)
    result.span = (start, span[1])

    def batches() -> Iterable[list[tuple[float, Any]]]:
        t = start
        while t < end:  # an hour at a time: memory stays bounded over weeks of history
            items = history.between(t, min(t + HOUR_S, end))
            result.events += len(items)
            yield items
            t += HOUR_S

    _run(batches(), ruleset, other, result, models, on_windows)
    return result


@dataclass
class RuleDiff:
    """What switching from one rule set to another changes over the same history."""

    added: list[Alert]
    removed: list[Alert]
    kept: list[tuple[Alert, Alert]]
    """(before, after) pairs: the same problem found by both."""

    @property
    def added_usd(self) -> float:
        return sum(a.waste_usd for a in self.added)

    @property
    def removed_usd(self) -> float:
        return sum(a.waste_usd for a in self.removed)

    @property
    def kept_usd_change(self) -> float:
        return sum(after.waste_usd - before.waste_usd for before, after in self.kept)


def _span(alert: Alert) -> tuple[float, float]:
    end = alert.resolved_at if alert.resolved_at is not None else alert.updated_at
    return alert.episode_start, max(end, alert.fired_at)


def compare(before: list[Alert], after: list[Alert]) -> RuleDiff:
    """Pair alerts of the same type on the same resource whose episodes overlap: what is
    left over in ``after`` is added by the change, what is left in ``before`` removed."""
    unmatched = list(after)
    kept, removed = [], []
    for old in before:
        lo, hi = _span(old)
        pair = next((new for new in unmatched if new.type == old.type and new.resource_id == old.resource_id
                     and _span(new)[0] <= hi and lo <= _span(new)[1]), None)  # fmt: skip
        if pair is None:
            removed.append(old)
        else:
            unmatched.remove(pair)
            kept.append((old, pair))
    return RuleDiff(added=unmatched, removed=removed, kept=kept)
