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

One isolation forest per model group (:data:`detector.model.features.FEATURE_SETS`);
a group with fewer than ``min_samples`` windows gets no new model: the one it had, if any,
stays in use (and ``burnwatch model train`` says so), else cold start continues.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detector.alerts import Alert
from detector.backtest import BacktestResult
from detector.detectors import REGISTRY
from detector.model.features import Window
from detector.model.forest import ModelArtifact, fit
from detector.rules import RuleSet, compile_rules, parse_rule

if TYPE_CHECKING:
    from detector.store import Store

__all__ = ["MIN_SAMPLES", "TrainingSet", "anomaly_ruleset", "train", "train_from_file", "train_from_store"]

MIN_SAMPLES = 500
"""Windows a group needs (after leaving incidents out) to get a model."""


@dataclass
class TrainingSet:
    windows: dict[str, list[Window]] = field(default_factory=dict)
    excluded: dict[str, int] = field(default_factory=dict)
    span: tuple[float, float] = (0.0, 0.0)

    def collect(self, items: list[tuple]) -> None:
        for _, _, _, window in items:
            self.windows.setdefault(window.group, []).append(window)


def anomaly_ruleset(ruleset: RuleSet) -> RuleSet:
    """The rule set as given, with an ``anomaly`` rule added if it has none (training needs its windows)."""
    if any(r.detector.type == "anomaly" for r in ruleset.rules):
        return ruleset
    extra = parse_rule({"name": "cost-anomaly", "type": "anomaly"})
    sources = [r.source for r in ruleset.rules if r.source is not None] + [extra]
    return compile_rules(sources, ruleset.pricing, routing=ruleset.routing)


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


def train(ts: TrainingSet, alerts: list[Alert], expected: set[str], out_dir: str | Path, *, quantile: float = 0.9999,
          margin: float = 0.15, min_samples: int = MIN_SAMPLES, seed: int = 0) -> list[ModelArtifact]:  # fmt: skip
    """Fit one forest per group from the collected windows and save the artifacts."""
    incidents = _incidents(alerts, expected)
    artifacts = []
    for group, windows in sorted(ts.windows.items()):
        rows, left_out = [], 0
        for w in windows:
            if any(lo < w.end and w.start < hi for lo, hi in incidents.get(w.resource_id, ())):
                left_out += 1
            else:
                rows.append(w.vector())
        ts.excluded[group] = left_out
        if len(rows) < min_samples:
            continue
        artifact = fit(group, rows, trained_from=ts.span[0], trained_to=ts.span[1], excluded=left_out,
                       threshold_quantile=quantile, margin=margin, seed=seed)  # fmt: skip
        artifact.save(Path(out_dir))
        artifacts.append(artifact)
    return artifacts


def _train(run: Callable[[RuleSet, Any], BacktestResult], ruleset: RuleSet, out_dir: str | Path, expected: set[str],
           **kw: Any) -> tuple[list[ModelArtifact], TrainingSet]:  # fmt: skip
    ts = TrainingSet()
    result = run(anomaly_ruleset(ruleset), ts.collect)
    windows = [w for ws in ts.windows.values() for w in ws]
    ts.span = (min((w.start for w in windows), default=0.0), max((w.end for w in windows), default=0.0))
    return train(ts, result.alerts, expected, out_dir, **kw), ts


def train_from_file(path: str | Path, ruleset: RuleSet, out_dir: str | Path,
                    **kw: Any) -> tuple[list[ModelArtifact], TrainingSet]:  # fmt: skip
    """Train from a replay file (what ``burnwatch eval`` does with a simulated fleet)."""
    from detector.backtest import backtest

    return _train(lambda rs, collect: backtest(path, rs, on_windows=collect), ruleset, out_dir, set(), **kw)


def train_from_store(store: Store, since_s: float, ruleset: RuleSet, out_dir: str | Path,
                     **kw: Any) -> tuple[list[ModelArtifact], TrainingSet]:  # fmt: skip
    """Train from the events stored in ClickHouse over ``since_s`` of event time before the newest."""
    from detector.backtest import backtest_store

    expected = store.actions.marked_expected()
    return _train(lambda rs, collect: backtest_store(store.history, since_s, rs, on_windows=collect), ruleset, out_dir,
                  expected, **kw)  # fmt: skip
