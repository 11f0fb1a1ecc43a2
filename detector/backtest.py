"""Run rules over history in-process: the same decoder, engine and alert manager the
worker uses, without Kafka or Slack.

History is a replay file (topics aligned on event time as the worker aligns them)
or the events stored in ClickHouse. With a second rule set, both run over the same
events in one pass, and :func:`compare` says what the change would add or remove.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detector.alerts import Alert, AlertManager, from_finding
from detector.align import EventTimeAligner
from detector.billing.rates import BilledRates
from detector.detectors.anomaly import Scoring, scoring_during
from detector.engine import Engine
from detector.events import EventDecoder, InvalidMessage
from detector.replay import read_replay
from detector.rules import RuleSet

if TYPE_CHECKING:
    from detector.store import EventHistory

__all__ = ["BacktestResult", "RuleDiff", "backtest", "backtest_store", "compare"]

HOUR_S = 3600.0


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


class _Detection:
    """One rule set's engine and alert manager, fed time-ordered events."""

    def __init__(self, ruleset: RuleSet, billed: BilledRates | None = None) -> None:
        self.engine = Engine(ruleset, billed=billed)
        self.manager = AlertManager(ruleset=ruleset)
        self.latest: dict[str, Alert] = {}

    def feed(self, items: list[tuple[float, Any]]) -> None:
        for alert in self.manager.handle(self.engine.process_timed(items)):
            self.latest[alert.alert_id] = alert

    def finish(self) -> list[Alert]:
        for finding in self.engine.open_episodes():
            alert = from_finding(finding)
            before = self.latest.get(alert.alert_id)
            if before is not None:  # its latest figures, as routed and held back when it opened
                alert.channel, alert.held, alert.silenced = before.channel, before.held, before.silenced
                alert.details = {**before.details, **alert.details}
            self.latest[alert.alert_id] = alert
        return sorted(self.latest.values(), key=lambda a: (a.fired_at, a.alert_id))


def _run(batches: Iterable[list[tuple[float, Any]]], ruleset: RuleSet, other: RuleSet | None, result: BacktestResult,
         models: Any = None, on_windows: Any = None, record: Any = None,
         billed: BilledRates | None = None) -> None:  # fmt: skip
    runs = [_Detection(ruleset, billed)] + ([_Detection(other, billed)] if other is not None else [])
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
) -> BacktestResult:
    """Detect over a whole replay file, topics aligned on event time as the worker aligns them.
    ``models`` scores the ``anomaly`` rule's windows; ``on_windows`` sees them (training);
    ``record`` sees each batch's judged windows with their scores (``backtest --scores``). Without
    a ``decoder``, events are decoded with the rule set's plausibility bounds, as the worker does.
    ``billed``: rates and tags from a FOCUS bill (``backtest --bill``), as the worker has them."""
    decoder = decoder or EventDecoder(limits=ruleset.limits)
    result = BacktestResult(alerts=[])

    def batches() -> Iterable[list[tuple[float, Any]]]:
        aligner: EventTimeAligner[None] = EventTimeAligner(lateness_s)
        decode, invalid = decoder.decode, result.invalid
        messages = n_events = 0
        topic, run = "", []  # type: tuple[str, list[Any]]  # consecutive messages of a topic, pushed as one
        for line_no, record in read_replay(path):
            messages += 1
            try:
                events = decode(record.topic, record.value)  # the record's buffer, not a copy
            except InvalidMessage as exc:
                invalid.append((line_no, exc.reason))
                continue
            n_events += len(events)
            if record.topic != topic:
                if run:
                    aligner.push(topic, run)
                topic, run = record.topic, events
            else:
                run.extend(events)
            if messages % 1000 == 0:  # as the worker does per batch
                if run:
                    aligner.push(topic, run)
                    run = []
                result.messages, result.events = messages, n_events
                yield aligner.release()[0]
        if run:
            aligner.push(topic, run)
        result.messages, result.events = messages, n_events
        yield aligner.release(everything=True)[0]

    _run(batches(), ruleset, other, result, models, on_windows, record, billed)
    return result


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
