"""The isolation forest, its artifact on disk, and the one place sklearn's sign is turned.

scikit-learn's ``score_samples`` is *lower* for more anomalous rows. Everywhere in
burnwatch a higher anomaly score means more anomalous: :meth:`ModelArtifact.score`
returns ``-score_samples`` plus the range guard below, and nothing else calls sklearn.
The decision threshold is a quantile of the training rows' scores
(``threshold_quantile``) plus a margin, not sklearn's ``predict``/``contamination``,
so the expected false-alert rate on data like the training data is stated in the
artifact.

The range guard. An isolation forest only splits between the values it was trained
on, so a value far outside them (a cost ratio that never moved in training) isolates no
faster than the most extreme training row: the forest cannot say "further out than
anything". The artifact keeps each feature's training range (0.1 %-99.9 % quantiles, at
least 0.3 wide on the log scale) and, for the features relative to the resource's own
baseline, adds to the forest's score how far the row lies outside it, in units of that
width (the furthest feature counts). Inside the ranges the guard is zero and the score
is the forest's.
"""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from detector.model.features import feature_names

__all__ = ["MODEL_VERSION", "ModelArtifact", "ModelSet", "fit"]

MODEL_VERSION = 1
GUARD_TOLERANCE = 1.0
"""The guard starts counting this many range-widths outside the trained range: closer in is
the unseen-but-normal variation any finite training misses."""
MIN_WIDTH = 0.3
"""Narrowest range the guard measures in, on the features' log scale (a 35 % change)."""


@dataclass
class ModelArtifact:
    group: str
    features: list[str]
    trained_from: float
    trained_to: float
    samples: int
    excluded: int
    """Windows left out of training (inside incidents)."""
    params: dict[str, Any]
    threshold: float
    threshold_quantile: float
    ranges: list[tuple[float, float]] = field(default_factory=list)
    """Per feature: the training range the guard measures against."""
    version: int = MODEL_VERSION
    created_at: float = field(default_factory=time.time)
    model: Any = None

    def score(self, rows: np.ndarray) -> np.ndarray:
        """Anomaly scores, higher = more anomalous: the forest's (sklearn's sign turned here,
        once) plus how far outside the training range the row lies."""
        return -self.model.score_samples(rows) + self.guard(rows)

    def guard(self, rows: np.ndarray) -> np.ndarray:
        """Distance outside the group's training range, of the relative features only: a level
        (a bigger bucket, a dearer host) legitimately differs from the resources trained on; a
        resource departing from its own usual level is what the guard is for. (Ranges per
        resource were tried: 48 hours of one resource do not cover its normal modes, and they
        doubled the false alerts.)"""
        relative = [i for i, name in enumerate(self.features) if name.endswith("_rel")]
        if not self.ranges or not relative:
            return np.zeros(len(rows))
        lo = np.array([self.ranges[i][0] for i in relative])
        hi = np.array([self.ranges[i][1] for i in relative])
        width = np.maximum(hi - lo, MIN_WIDTH)
        x = rows[:, relative]
        beyond = np.maximum(x - hi, lo - x) / width - GUARD_TOLERANCE
        return np.maximum(beyond, 0.0).max(axis=1)

    def meta(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("model")
        return data

    def save(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.group}.pkl"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(self))
        tmp.replace(path)  # a reader sees the old file or the new one, never half of one
        (directory / f"{self.group}.json").write_text(json.dumps(self.meta(), indent=2) + "\n")
        return path


def fit(group: str, rows: Sequence[Sequence[float]], *, trained_from: float, trained_to: float, excluded: int = 0,
        threshold_quantile: float = 0.9999, margin: float = 0.15, n_estimators: int = 200, max_samples: int = 256,
        seed: int = 0) -> ModelArtifact:  # fmt: skip
    """Train one group's forest; its threshold is ``threshold_quantile`` of the training rows'
    scores plus ``margin`` (normal data the model has not seen scores a little higher than
    the rows it was fitted on)."""
    from sklearn.ensemble import IsolationForest

    x = np.asarray(rows, dtype=np.float64)
    forest = IsolationForest(n_estimators=n_estimators, max_samples=min(max_samples, len(x)), random_state=seed)
    forest.fit(x)
    artifact = ModelArtifact(
        group=group, features=feature_names(group), trained_from=trained_from, trained_to=trained_to, samples=len(x),
        excluded=excluded, params={"n_estimators": n_estimators, "max_samples": min(max_samples, len(x)), "seed": seed,
                                   "margin": margin},
        threshold=0.0, threshold_quantile=threshold_quantile, model=forest,
        ranges=[(float(a), float(b)) for a, b in zip(np.quantile(x, 0.001, axis=0), np.quantile(x, 0.999, axis=0),
                                                      strict=True)],
    )  # fmt: skip
    artifact.threshold = float(np.quantile(artifact.score(x), threshold_quantile)) + margin
    return artifact


class ModelSet:
    """The artifacts of a model directory, by group; reloaded when the files change."""

    def __init__(self, artifacts: dict[str, ModelArtifact] | None = None, signature: tuple = ()) -> None:
        self.artifacts = artifacts or {}
        self.signature = signature

    def __bool__(self) -> bool:
        return bool(self.artifacts)

    def get(self, group: str) -> ModelArtifact | None:
        return self.artifacts.get(group)

    @staticmethod
    def _signature(directory: Path) -> tuple:
        if not directory.is_dir():
            return ()
        return tuple(sorted((p.name, p.stat().st_mtime_ns) for p in directory.glob("*.pkl")))

    @classmethod
    def load(cls, directory: str | Path) -> ModelSet:
        directory = Path(directory)
        artifacts = {}
        for path in sorted(directory.glob("*.pkl")) if directory.is_dir() else []:
            artifact = pickle.loads(path.read_bytes())
            if isinstance(artifact, ModelArtifact) and artifact.version == MODEL_VERSION:
                if artifact.features == feature_names(artifact.group):
                    artifacts[artifact.group] = artifact
        return cls(artifacts, cls._signature(directory))

    def changed(self, directory: str | Path) -> bool:
        return self._signature(Path(directory)) != self.signature
