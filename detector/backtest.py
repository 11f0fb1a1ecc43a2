"""Run the rules over a replay file in-process: the same decoder, engine and alert
manager the worker uses, without Kafka, ClickHouse or Slack."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from detector.alerts import Alert, AlertManager, from_finding
from detector.align import EventTimeAligner
from detector.engine import Engine
from detector.events import EventDecoder, InvalidMessage
from detector.replay import read_replay
from detector.rules import RuleSet

__all__ = ["BacktestResult", "backtest"]


@dataclass
class BacktestResult:
    alerts: list[Alert]
    """Latest state of every alert, in the order they fired."""
    events: int = 0
    messages: int = 0
    invalid: list[tuple[int, str]] = field(default_factory=list)
    """(line, reason) of every message the worker would send to the dead-letter topic."""


def backtest(
    path: str | Path, ruleset: RuleSet, decoder: EventDecoder | None = None, lateness_s: float = 60.0
) -> BacktestResult:
    """Detect over the whole file, topics aligned on event time as the worker aligns them."""
    decoder = decoder or EventDecoder()
    aligner: EventTimeAligner[None] = EventTimeAligner(lateness_s)
    engine = Engine(ruleset)
    manager = AlertManager(ruleset=ruleset)
    latest: dict[str, Alert] = {}
    result = BacktestResult(alerts=[])
    for line_no, record in read_replay(path):
        result.messages += 1
        try:
            events = decoder.decode(record.topic, bytes(record.value))
        except InvalidMessage as exc:
            result.invalid.append((line_no, exc.reason))
            continue
        result.events += len(events)
        aligner.push(record.topic, events)
        if result.messages % 1000 == 0:  # as the worker does per batch
            released, _ = aligner.release()
            for alert in manager.handle(engine.process_timed(released)):
                latest[alert.alert_id] = alert
    released, _ = aligner.release(everything=True)
    for alert in manager.handle(engine.process_timed(released)):
        latest[alert.alert_id] = alert
    for finding in engine.open_episodes():
        alert = from_finding(finding)
        latest[alert.alert_id] = alert
    result.alerts = sorted(latest.values(), key=lambda a: (a.fired_at, a.alert_id))
    return result
