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

On disk. The model directory may be writable by others (a shared volume, a retraining
job), so loading a file must not run code from it, which unpickling does. An artifact is
one skops file (``<group>.skops``: the forest and its metadata; ``<group>.json`` beside it
is a copy for people). skops rebuilds only the types it is told to trust; the one it does
not trust by default, scikit-learn's ``Tree``, holds node indices that scikit-learn follows
without bounds checks, so every tree is checked (:func:`_check_forest`) before it is used.
A pickle from an earlier version (``<group>.pkl``) is refused, saying to retrain.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import skops.io as sio

from detector.model.features import feature_names

__all__ = ["MODEL_VERSION", "ModelArtifact", "ModelRefused", "ModelSet", "fit"]

MODEL_VERSION = 2
"""2: skops files (1 was pickles)."""
SUFFIX = ".skops"
TRUSTED = ("sklearn.tree._tree.Tree",)
"""The types beyond skops' defaults a model file may hold; each tree is checked on loading."""
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
        path = directory / f"{self.group}{SUFFIX}"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(sio.dumps({"meta": self.meta(), "model": self.model}))
        tmp.replace(path)  # a reader sees the old file or the new one, never half of one
        (directory / f"{self.group}.json").write_text(json.dumps(self.meta(), indent=2) + "\n")
        return path

    @classmethod
    def read(cls, path: Path) -> ModelArtifact:
        """The artifact in a skops file, without running code from it; :class:`ModelRefused`
        says why a file is not one."""
        from sklearn.ensemble import IsolationForest

        data = path.read_bytes()
        try:
            untrusted = sorted(set(sio.get_untrusted_types(data=data)) - set(TRUSTED))
            if untrusted:
                raise ModelRefused(f"{path}: holds types no model file has ({', '.join(untrusted)}): not loaded")
            content = sio.loads(data, trusted=list(TRUSTED))
        except ModelRefused:
            raise
        except Exception as exc:  # noqa: BLE001 - a damaged or foreign file: zip, JSON or skops errors
            raise ModelRefused(f"{path}: not a burnwatch model file ({type(exc).__name__}: {exc})") from None
        if not isinstance(content, dict) or not isinstance(content.get("meta"), dict):
            raise ModelRefused(f"{path}: not a burnwatch model file (no metadata)")
        meta, forest = dict(content["meta"]), content.get("model")
        if meta.get("version") != MODEL_VERSION:
            raise ModelRefused(f"{path}: model version {meta.get('version')!r}, this burnwatch reads {MODEL_VERSION}: "
                               "retrain (burnwatch model train)")  # fmt: skip
        if not isinstance(forest, IsolationForest):
            raise ModelRefused(f"{path}: the model is a {type(forest).__name__}, not an IsolationForest")
        try:
            artifact = cls(**meta, model=forest)
        except TypeError as exc:
            raise ModelRefused(f"{path}: bad metadata ({exc})") from None
        artifact.ranges = [tuple(r) for r in artifact.ranges]  # type: ignore[misc]
        _check_forest(path, forest, len(artifact.features))
        return artifact


class ModelRefused(ValueError):
    """A file in the model directory that is not loaded, and why."""


def _check_forest(path: Path, forest: Any, n_features: int) -> None:
    """Every index scikit-learn follows without a bounds check is in bounds: each tree's children
    come after their parent (which also rules out cycles) and inside the tree, its split features
    are columns the tree is given, and those columns are the model's features."""
    if getattr(forest, "n_features_in_", None) != n_features:
        raise ModelRefused(f"{path}: the forest takes {getattr(forest, 'n_features_in_', None)} features, "
                           f"its metadata lists {n_features}")  # fmt: skip
    trees, columns = getattr(forest, "estimators_", []), getattr(forest, "estimators_features_", [])
    per_tree = [getattr(forest, "_decision_path_lengths", []), getattr(forest, "_average_path_length_per_tree", [])]
    if not trees or len(columns) != len(trees) or any(len(p) != len(trees) for p in per_tree):
        raise ModelRefused(f"{path}: the forest's trees and their columns do not match")
    for i, (estimator, cols) in enumerate(zip(trees, columns, strict=True)):
        tree = estimator.tree_
        n = int(tree.node_count)
        cols = np.asarray(cols)
        left, right, feature = np.asarray(tree.children_left), np.asarray(tree.children_right), np.asarray(tree.feature)
        node = np.arange(n)
        split = left != -1
        ok = (
            n > 0 and len(left) == len(right) == len(feature) == n
            and all(len(p[i]) == n for p in per_tree)
            and cols.ndim == 1 and len(cols) == tree.n_features and ((cols >= 0) & (cols < n_features)).all()
            and ((right != -1) == split).all()
            and ((left[split] > node[split]) & (left[split] < n)).all()
            and ((right[split] > node[split]) & (right[split] < n)).all()
            and ((feature[split] >= 0) & (feature[split] < len(cols))).all()
        )  # fmt: skip
        if not ok:
            raise ModelRefused(f"{path}: tree {i} has node or feature indices out of bounds: not loaded")


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
    def fingerprint(directory: Path) -> tuple:
        """The model files and their modification times: a change means a reload."""
        if not directory.is_dir():
            return ()
        files = [*directory.glob(f"*{SUFFIX}"), *directory.glob("*.pkl")]
        return tuple(sorted((p.name, p.stat().st_mtime_ns) for p in files))

    @classmethod
    def load(cls, directory: str | Path) -> ModelSet:
        """Every artifact of the directory; :class:`ModelRefused` (naming each file and why)
        if any file is not loaded, so that nobody runs on part of a model set unawares."""
        models, refused = cls.read(directory)
        if refused:
            raise ModelRefused("\n".join(refused))
        return models

    @classmethod
    def read(cls, directory: str | Path) -> tuple[ModelSet, list[str]]:
        """The artifacts that load, and why each other file does not (the worker's way: it
        scores with what loads and says what it refused)."""
        directory = Path(directory)
        artifacts, refused = {}, []
        if directory.is_dir():
            for path in sorted(directory.glob("*.pkl")):
                refused.append(f"{path}: a model file in the old pickle format, not loaded (unpickling runs any code "
                               "in the file); retrain with `burnwatch model train`, then delete it")  # fmt: skip
            for path in sorted(directory.glob(f"*{SUFFIX}")):
                try:
                    artifact = ModelArtifact.read(path)
                except ModelRefused as exc:
                    refused.append(str(exc))
                    continue
                if artifact.features != feature_names(artifact.group):
                    refused.append(f"{path}: trained on other features than this burnwatch computes for "
                                   f"{artifact.group!r}; retrain with `burnwatch model train`")  # fmt: skip
                    continue
                artifacts[artifact.group] = artifact
        return cls(artifacts, cls.fingerprint(directory)), refused

    def changed(self, directory: str | Path) -> bool:
        return self.fingerprint(Path(directory)) != self.signature
