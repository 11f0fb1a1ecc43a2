"""Training the anomaly model on history: the stream's own feature code, over stored events.

History runs through a backtest (the worker's engine, aligner and rules) with the
``anomaly`` rule collecting every closed window instead of scoring it. Windows are
then kept or left out deliberately:

- **left out**: windows inside incidents of unusual *behaviour*, found by a rule (idle
  GPUs, a hung job, dark telemetry, an egress runaway) or by an earlier model, so the
  model does not learn waste as normal. (When the model then finds such a window
  unusual, the rule's incident is already open by the time the anomaly has lasted
  its ``for``, and the anomaly joins it instead of alerting again.)
- **kept**: windows inside incidents that are not behaviour (untagged spend, capacity
  forecasts, advice such as spot or rightsizing: the resource behaves as always), and
  windows of incidents someone marked "expected" in Slack: their owners say this is
  how the resource behaves, and the model should learn it.

One isolation forest per model group (:data:`detector.model.features.FEATURE_SETS`),
calibrated to a stated rate of alerts per 1,000 resource-hours
(:class:`detector.model.forest.Calibration`); a group with fewer than ``min_samples``
windows gets no new model: the one it had, if any, stays in use (and ``burnwatch model
train`` says so), else cold start continues. ``until`` ends training at an event time
(``model train --from FILE --until``: learn from the start of a series, judge the rest).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detector.alerts import Alert
from detector.backtest import BacktestResult
from detector.detectors import REGISTRY
from detector.model.features import Window, follows
from detector.model.forest import ALERTS_PER_1000H, ModelArtifact, fit
from detector.rules import RuleSet, compile_rules, parse_rule

if TYPE_CHECKING:
    from detector.store import Store

__all__ = ["MIN_SAMPLES", "ModelsPartlyWritten", "TrainingSet", "anomaly_ruleset", "train", "train_from_file",
           "train_from_store"]

MIN_SAMPLES = 48
"""Windows a group needs (after leaving incidents out) to get a model: the calibration fits a
forest to each half of them to score the other, and 48 windows (two days of hourly samples)
is the least whose halves each hold a daily cycle of an hourly series."""


@dataclass
class TrainingSet:
    windows: dict[str, list[Window]] = field(default_factory=dict)
    excluded: dict[str, int] = field(default_factory=dict)
    span: tuple[float, float] = (0.0, 0.0)
    persist: int = 0
    """The anomaly rule's longest run of windows (its ``for`` over its ``window``)."""
    until: float | None = None
    """Windows ending after this event time are not collected."""

    def collect(self, items: list[tuple]) -> None:
        for detector, _, _, window in items:
            if self.until is not None and window.end > self.until:
                continue
            self.persist = self.persist or detector.params.persist
            self.windows.setdefault(window.group, []).append(window)


def anomaly_ruleset(ruleset: RuleSet, metrics: Sequence[str] = ()) -> RuleSet:
    """The rule set's rules compiled afresh for training, with an ``anomaly`` rule added if it has
    none (training needs its windows), its anomaly rules reading the generic ``metrics`` too if
    any are named. Afresh, never the rules given: training lends its own scoring to the anomaly
    rules it runs for as long as it runs (no model; its collector), and a worker retrains on a
    thread beside the rules it detects with, which must go on judging with the model in use."""
    sources = [r.source for r in ruleset.rules if r.source is not None]
    if not any(r.detector.type == "anomaly" for r in ruleset.rules):
        sources.append(parse_rule({"name": "cost-anomaly", "type": "anomaly"}))
    if metrics:
        sources = [_reading(s, metrics) if s.type == "anomaly" else s for s in sources]
    return compile_rules(sources, ruleset.pricing, routing=ruleset.routing, limits=ruleset.limits)


def _reading(source: Any, metrics: Sequence[str]) -> Any:
    data = source.model_dump(by_alias=True, exclude_unset=True)
    params = dict(data.get("params") or {})
    params["metrics"] = list(dict.fromkeys([*params.get("metrics", []), *metrics]))
    return parse_rule({**data, "params": params})


def _incidents(alerts: Iterable[Alert], expected: set[str]) -> dict[str, list[tuple[float, float]]]:
    """Resource → intervals of behaviour incidents not marked expected: the windows to leave out."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for a in alerts:
        cls = REGISTRY.get(a.type)
        if cls is None or not cls.behaviour or a.alert_id in expected:
            continue
        end = a.resolved_at if a.resolved_at is not None else a.updated_at
        spans.setdefault(a.resource_id, []).append((a.episode_start, end))
    return spans


def _sequences(windows: list[Window]) -> tuple[list[list[int]], float]:
    """Row indexes per resource in time order, split where windows in between were not kept,
    and the resource-hours they cover."""
    by_resource: dict[str, list[int]] = {}
    for i, w in enumerate(windows):
        by_resource.setdefault(w.resource_id, []).append(i)
    sequences: list[list[int]] = []
    hours = 0.0
    for indexes in by_resource.values():
        indexes.sort(key=lambda i: windows[i].seq)
        current = [indexes[0]]
        for i in indexes[1:]:
            previous = windows[current[-1]]
            if not follows(previous.seq, previous.end, windows[i]):
                sequences.append(current)
                current = []
            current.append(i)
        sequences.append(current)
    for q in sequences:
        first, last = windows[q[0]], windows[q[-1]]
        step = (last.start - first.start) / (len(q) - 1) if len(q) > 1 else first.end - first.start
        hours += len(q) * step / 3600.0
    return sequences, hours


def train(ts: TrainingSet, alerts: list[Alert], expected: set[str], out_dir: str | Path, *,
          alerts_per_1000h: float = ALERTS_PER_1000H, min_samples: int = MIN_SAMPLES,
          seed: int = 0) -> list[ModelArtifact]:  # fmt: skip
    """Fit one forest per group from the collected windows, calibrate it, and save the artifacts."""
    incidents = _incidents(alerts, expected)
    artifacts = []
    for group, windows in sorted(ts.windows.items()):
        kept, left_out = [], 0
        for w in windows:
            if any(lo < w.end and w.start < hi for lo, hi in incidents.get(w.resource_id, ())):
                left_out += 1
            else:
                kept.append(w)
        ts.excluded[group] = left_out
        if len(kept) < min_samples:
            continue
        sequences, hours = _sequences(kept)
        artifact = fit(group, [w.vector() for w in kept], features=list(kept[0].names), trained_from=ts.span[0],
                       trained_to=ts.span[1], excluded=left_out, times=[w.start for w in kept], sequences=sequences,
                       resource_hours=hours, persist=ts.persist or 1, alerts_per_1000h=alerts_per_1000h,
                       seed=seed)  # fmt: skip
        artifacts.append(artifact)
    written: list[str] = []
    try:  # every group fitted before any is written: a fit that fails leaves the directory as it was
        for artifact in artifacts:
            artifact.save_model(Path(out_dir))
            written.append(artifact.group)
            artifact.save_meta(Path(out_dir))
    except OSError as exc:
        raise ModelsPartlyWritten(written, exc) from exc
    return artifacts


class ModelsPartlyWritten(OSError):
    """Writing the models stopped at a file (a full disk, a permission): which groups' models (their
    ``.skops``, what scores) were replaced before it, so that nobody is told nothing changed when some did."""

    def __init__(self, written: list[str], cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror, cause.filename)
        self.written = written


def _train(run: Callable[[RuleSet, Any], BacktestResult], ruleset: RuleSet, out_dir: str | Path, expected: set[str],
           until: float | None = None, **kw: Any) -> tuple[list[ModelArtifact], TrainingSet]:  # fmt: skip
    ts = TrainingSet(until=until)
    result = run(anomaly_ruleset(ruleset), ts.collect)
    windows = [w for ws in ts.windows.values() for w in ws]
    ts.span = (min((w.start for w in windows), default=0.0), max((w.end for w in windows), default=0.0))
    alerts = [a for a in result.alerts if until is None or a.fired_at <= until]
    return train(ts, alerts, expected, out_dir, **kw), ts


def train_from_file(path: str | Path, ruleset: RuleSet, out_dir: str | Path, until: float | None = None,
                    **kw: Any) -> tuple[list[ModelArtifact], TrainingSet]:  # fmt: skip
    """Train from a replay file (``model train --from``; ``burnwatch eval`` on a fleet or a series),
    on the windows that end by ``until`` (event time) if given."""
    from detector.backtest import backtest

    return _train(lambda rs, collect: backtest(path, rs, on_windows=collect), ruleset, out_dir, set(), until, **kw)


def train_from_store(store: Store, since_s: float, ruleset: RuleSet, out_dir: str | Path,
                     **kw: Any) -> tuple[list[ModelArtifact], TrainingSet]:  # fmt: skip
    """Train from the events stored in ClickHouse over ``since_s`` of event time before the newest."""
    from detector.backtest import backtest_store

    expected = store.actions.marked_expected()
    return _train(lambda rs, collect: backtest_store(store.history, since_s, rs, on_windows=collect), ruleset, out_dir,
                  expected, **kw)  # fmt: skip
