"""Event-level scoring of detectors on labelled series (issue 14), and the two detectors scored.

A detector is a function ``(series, train_until) -> alert times``: it may learn from the
series up to ``train_until`` (the first ``train_fraction`` of its samples) and is scored on
the rest. The scoring is event-level, as public benchmarks score: a labelled window counts as
found once if any alert falls inside it or within ``tolerance`` steps after its last sample;
every alert outside all windows (and their tolerance) is a false positive; extra alerts in a
found window are neither. So a detector cannot earn recall by firing on every sample of a long
window, and precision counts alerts a person would have to look at.

The default tolerance, 3 steps, was chosen before any run: a detector that confirms an anomaly
over a few samples (as a rule's persistence does) reports it just after it ends, and 3 samples
after, on hourly series three hours, is still the same incident; later is something else.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detector.series import Series

__all__ = [
    "DEFAULT_TOLERANCE", "Detector", "Score", "burnwatch_detector", "evaluate_series", "first_of_runs", "naive_forest", "score",
]  # fmt: skip

DEFAULT_TOLERANCE = 3
"""Steps after a window's last sample that still count as finding it (see the module's docstring)."""

Detector = Callable[[Series, float], list[float]]
"""``(series, train_until) -> alert times`` (epoch seconds): what a model under test provides."""


@dataclass
class Score:
    """Event-level counts of one detector on one or more series."""

    windows: int = 0
    found: int = 0
    false_alerts: int = 0
    alerts: int = 0

    def __add__(self, other: Score) -> Score:
        return Score(self.windows + other.windows, self.found + other.found,
                     self.false_alerts + other.false_alerts, self.alerts + other.alerts)  # fmt: skip

    @property
    def precision(self) -> float | None:
        """Found windows over found windows and false alerts; None when nothing was alerted."""
        denominator = self.found + self.false_alerts
        return self.found / denominator if denominator else None

    @property
    def recall(self) -> float | None:
        return self.found / self.windows if self.windows else None

    @property
    def f1(self) -> float | None:
        p, r = self.precision, self.recall
        if r is None:
            return None
        if not p or not r:
            return 0.0
        return 2 * p * r / (p + r)

    def to_json(self) -> dict[str, Any]:
        return {"windows": self.windows, "found": self.found, "alerts": self.alerts,
                "false_alerts": self.false_alerts, "precision": self.precision, "recall": self.recall,
                "f1": self.f1}  # fmt: skip


def score(windows: Sequence[tuple[float, float]], alerts: Sequence[float], tolerance_s: float) -> Score:
    """Event-level counts: each window found at most once, each alert outside every window false."""
    found = [False] * len(windows)
    false_alerts = 0
    for t in alerts:
        hit = False
        for i, (start, end) in enumerate(windows):
            if start <= t <= end + tolerance_s:
                found[i] = hit = True
        false_alerts += not hit
    return Score(windows=len(windows), found=sum(found), false_alerts=false_alerts, alerts=len(alerts))


def _split(series: Series, train_fraction: float) -> float:
    """The time training ends: that of the first sample after the first ``train_fraction``."""
    n = min(len(series.times) - 1, int(len(series.times) * train_fraction))
    return series.times[n]


def evaluate_series(series: Series, detector: Detector, train_fraction: float = 0.15,
                    tolerance: int = DEFAULT_TOLERANCE) -> Score:  # fmt: skip
    """Score ``detector`` on the part of ``series`` after its training part: windows that end
    before it, and alerts raised in it, are left out (the model was allowed to see them)."""
    until = _split(series, train_fraction)
    windows = [(a, b) for a, b in series.windows if b >= until]
    alerts = sorted(t for t in detector(series, until) if t >= until)
    return score(windows, alerts, tolerance * series.step_s)


def naive_forest(series: Series, train_until: float) -> list[float]:
    """The baseline of issue 14: an IsolationForest over the raw value, scikit-learn's defaults,
    fitted on the training part; a run of consecutive samples it predicts -1 is one alert, at the
    run's first sample. No tuning: it is the figure a better model has to beat."""
    import numpy as np
    from sklearn.ensemble import IsolationForest

    present = [(t, v) for t, v in zip(series.times, series.values, strict=True) if v is not None]
    train = np.array([[v] for t, v in present if t < train_until])
    test = [(t, v) for t, v in present if t >= train_until]
    if len(train) < 2 or not test:
        return []
    forest = IsolationForest(random_state=0).fit(train)
    flags = forest.predict(np.array([[v] for _, v in test]))
    return first_of_runs([t for t, _ in test], [bool(f == -1) for f in flags])


def first_of_runs(times: Sequence[float], anomalous: Sequence[bool]) -> list[float]:
    """One alert per run of consecutive anomalous samples, at its first: a point detector's
    flags as the alerts a person would get (the rules, too, alert once per episode)."""
    alerts: list[float] = []
    previous = False
    for t, flag in zip(times, anomalous, strict=True):
        if flag and not previous:
            alerts.append(t)
        previous = flag
    return alerts


def burnwatch_detector(ruleset: Any, alerts_per_1000h: float | None = None) -> Detector:
    """burnwatch as it would run on the series' resource, through the replay path: the rules, and
    an anomaly model reading the series' metric (``metrics: [value]``), trained from the replay file
    up to ``train_until`` (``burnwatch model train --from FILE --until``), then a backtest with it
    (``burnwatch backtest FILE``). Every alert of unusual behaviour on the resource counts, at the
    time it fired (the rules' and the model's; not ``untagged``'s, which says whose spend it is: the
    series carry no tags)."""
    from detector.backtest import backtest
    from detector.detectors import REGISTRY
    from detector.model.forest import ALERTS_PER_1000H, ModelSet
    from detector.model.train import anomaly_ruleset, train_from_file
    from detector.replay import write_replay
    from detector.series import METRIC, SeriesError, replay_records

    rules = anomaly_ruleset(ruleset, [METRIC])
    rate = ALERTS_PER_1000H if alerts_per_1000h is None else alerts_per_1000h

    def detect(series: Series, train_until: float) -> list[float]:
        with tempfile.TemporaryDirectory(prefix="burnwatch-series-") as tmp:
            path, models = Path(tmp) / "series.jsonl", Path(tmp) / "models"
            with open(path, "wb") as out:
                write_replay(replay_records(series), out)
            train_from_file(path, rules, models, until=train_until, alerts_per_1000h=rate)
            result = backtest(path, rules, models=ModelSet.load(models))
        if result.invalid:  # a row burnwatch's events cannot carry (before 1970, days ahead, a step over a day)
            line, reason = result.invalid[0]
            raise SeriesError(f"{series.name}: line {line + 1} of its file is refused as burnwatch refuses events: "
                              f"{reason}; this series cannot be replayed")  # fmt: skip
        return [a.fired_at for a in result.alerts
                if a.resource_id == series.name and getattr(REGISTRY.get(a.type), "behaviour", False)]  # fmt: skip

    return detect
