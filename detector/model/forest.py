"""The isolation forest, its artifact on disk, and the one place sklearn's sign is turned.

scikit-learn's ``score_samples`` is *lower* for more anomalous rows. Everywhere in
burnwatch a higher anomaly score means more anomalous: :meth:`ModelArtifact.score`
returns ``-score_samples`` plus the range guard below, and nothing else scores. (The
forest's scores are walked flat, :mod:`detector.model.flat_forest`: sklearn's to the bit,
without its per-tree cost on a call of a few windows.)
The decision is calibrated to a stated rate of alerts, not sklearn's
``predict``/``contamination`` nor a margin tuned on one simulator (:class:`Calibration`):
training scores the windows of each half of the training span with a forest fitted on the
other half, so the scores it calibrates on are those of windows the forest did not see, as
new windows will be. A score's *evidence* is ``-log10`` of the share of those held-out
windows scoring at least as high: read off them up to the top ``CONTAMINATION`` (which may be
anomalies nobody labelled), and beyond it from an exponential tail whose scale is what the
scores between the 90th percentile and that edge say. The *budget* is the evidence that
opens an episode: a run of ``L`` windows (``L`` up to ``persist``) opens one when each carries
``budget / L``. It is the larger of what the stated rate implies if windows were independent
(``log10(persist * 1000 * windows per hour / rate)``: a union bound over the run lengths) and
the level the held-out windows' own runs reach at that rate (correlated windows make runs
longer than chance; their tail is extrapolated the same way). ``threshold`` is the score at
which one window alone opens an episode.

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
import math
import os
import tempfile
import time
import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from detector.model.features import feature_names, metrics_of
from detector.model.flat_forest import FlatForest

__all__ = ["ALERTS_PER_1000H", "MODEL_VERSION", "Calibration", "ModelArtifact", "ModelRefused", "ModelSet", "fit"]

MODEL_VERSION = 3
"""3: per-resource standardised features and a calibrated alert rate (2: skops files, 1: pickles)."""
ALERTS_PER_1000H = 0.5
"""The default stated rate: half the product's target of at most one false alert per 1,000
resource-hours, because windows after training drift from it and score higher."""
TAIL_FROM = 0.9
"""The exponential tail's scale is measured from this quantile up to the edge."""
CONTAMINATION = 0.01
"""The share of training windows that may be anomalies nobody labelled (training data is
history, not a clean sample; labelled public benchmarks put anomalies at 1-2 % of points):
the calibration trusts the held-out scores' distribution below it and extrapolates above.
The low end of that range, so that a daily half-hour job (2 % of a day's windows) is still
taken as the normal it is."""
MIN_TAIL_SCALE = 0.01
"""Narrowest tail, in score units: a forest's score of one row varies about this much with its
random splits, so a narrower fitted tail is noise, not certainty."""
MAX_EVIDENCE = 50.0
"""Most evidence one window carries (a share of 1e-50: beyond any fleet's windows)."""
RATE_BOUNDS = (1e-6, 1e6)
"""Stated alert rates per 1,000 resource-hours that a calibration accepts."""
MIN_BUDGET = 1.0
"""Least evidence that opens an episode (a 1-in-10 window): a rate so high it would alert on
ordinary windows is not one."""
SUFFIX = ".skops"
TRUSTED = ("sklearn.tree._tree.Tree",)
"""The types beyond skops' defaults a model file may hold; each tree is checked on loading."""
GUARD_TOLERANCE = 1.0
"""The guard starts counting this many range-widths outside the trained range: closer in is
the unseen-but-normal variation any finite training misses."""
MIN_WIDTH = 0.3
"""Narrowest range the guard measures in, on the features' log scale (a 35 % change)."""


@dataclass
class Calibration:
    """What a score means: how rare it is among held-out training windows, and the evidence
    that opens an episode at the stated rate (see the module's docstring)."""

    levels: list[float]
    grid: list[float]
    """Held-out training scores at these shares of them below, up to the edge: the empirical
    distribution, which says how rare a score is wherever training saw one."""
    edge: float
    """The share above which the held-out scores are not taken at their word: one in n, or the
    ``CONTAMINATION`` training may hold (the highest 1 % may be anomalies nobody labelled)."""
    tail_scale: float
    """Beyond the edge, the share falls exponentially with this scale (the gap between the 90th
    percentile and the edge over log(0.1 / edge), exact for an exponential tail): rarer than
    that, extrapolated."""
    alerts_per_1000h: float
    windows_per_hour: float
    """Judged windows per resource-hour in training (12 for 5-minute windows of a steady resource)."""
    persist: int
    """The longest run of windows whose evidence adds up."""
    budget: float
    budget_independent: float
    budget_runs: float
    """The level the held-out training windows' runs, in their own order, reach in the stated
    share of windows (their tail extrapolated): correlated windows make runs longer than chance."""
    training_openings: int
    """Episodes the budget opens over the training windows."""
    training_hours: float

    def evidence(self, scores: np.ndarray) -> np.ndarray:
        """``-log10`` of the share of held-out training windows scoring at least as high."""
        return -np.log10(np.clip(_share(self.levels, self.grid, self.edge, self.tail_scale, scores),
                                 10.0**-MAX_EVIDENCE, 1.0))  # fmt: skip

    def score_at(self, evidence: float) -> float:
        """The score that carries ``evidence``."""
        return _level(self.levels, self.grid, self.edge, self.tail_scale, evidence)

    def explain(self) -> str:
        """The threshold in words, for ``model show``."""
        one = self.score_at(self.budget)
        mild = self.score_at(self.budget / self.persist)
        return (f"calibrated to {self.alerts_per_1000h:g} alerts per 1,000 resource-hours "
                f"({self.windows_per_hour:.3g} windows per resource-hour in training): a window scoring above "
                f"{one:.3f} (rarer than 1 in 10^{self.budget:.1f} held-out training windows) alerts at once; "
                f"milder ones alert when {self.persist} in a row each score above {mild:.3f} "
                f"(1 in 10^{self.budget / self.persist:.2f}), and runs in between in proportion. "
                f"Evidence budget {self.budget:.2f}: the larger of {self.budget_independent:.2f} (the rate, were "
                f"windows independent) and {self.budget_runs:.2f} (what the held-out training windows' own runs "
                f"reach at that rate); it opens {self.training_openings} episode(s) over the "
                f"{self.training_hours:,.0f} training resource-hours")  # fmt: skip


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
    """The score at which one window alone opens an episode (``calibration.score_at(budget)``)."""
    calibration: dict[str, Any]
    ranges: list[tuple[float, float]] = field(default_factory=list)
    """Per feature: the training range the guard measures against."""
    version: int = MODEL_VERSION
    created_at: float = field(default_factory=time.time)
    model: Any = None

    def __post_init__(self) -> None:
        self._calibration = Calibration(**self.calibration) if self.calibration else None

    @property
    def budget(self) -> float:
        return self._calibrated.budget

    @property
    def persist(self) -> int:
        return self._calibrated.persist

    @property
    def _calibrated(self) -> Calibration:
        if self._calibration is None:
            raise ModelRefused(f"model {self.group!r} has no calibration")
        return self._calibration

    def score(self, rows: np.ndarray, fleet: np.ndarray | None = None) -> np.ndarray:
        """Anomaly scores, higher = more anomalous: the forest's (sklearn's sign turned here,
        once) plus how far outside the training range the row lies. ``fleet`` marks rows judged
        against the fleet alone (a new resource): their guard measures the levels instead."""
        scores = _score(self.model, self.features, self.ranges, rows)
        if fleet is not None and fleet.any():
            scores[fleet] += _guard(self.features, self.ranges, rows[fleet], levels=True)
        return scores

    def evidence(self, scores: np.ndarray) -> np.ndarray:
        """How rare each score is among held-out training windows, as ``-log10`` of its share."""
        return self._calibrated.evidence(scores)

    def explain(self) -> str:
        return self._calibrated.explain()

    def guard(self, rows: np.ndarray) -> np.ndarray:
        """Distance outside the group's training range, of the features relative to the
        resource's own history only (``_rel``, ``_z``): a level (a bigger bucket, a dearer host)
        legitimately differs from the resources trained on; a resource departing from its own
        usual level is what the guard is for. (Ranges per resource were tried: 48 hours of one
        resource do not cover its normal modes, and they doubled the false alerts.)"""
        return _guard(self.features, self.ranges, rows)

    def meta(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("model")
        return data

    def to_bytes(self) -> bytes:
        """The artifact as its skops file holds it."""
        import skops.io as sio  # with scikit-learn, 3.5 s of a worker's start: only when a model is written or read

        return sio.dumps({"meta": self.meta(), "model": self.model})

    def save(self, directory: Path, data: bytes | None = None) -> Path:
        """Write the artifact (``data``: its :meth:`to_bytes`, when already made) and its metadata
        for people (``<group>.json``) into ``directory``."""
        path = self.save_model(directory, data)
        self.save_meta(directory)
        return path

    def save_model(self, directory: Path, data: bytes | None = None) -> Path:
        """The artifact alone, ``<group>.skops``: what scores."""
        path = directory / f"{self.group}{SUFFIX}"
        replace_file(path, self.to_bytes() if data is None else data)
        return path

    def save_meta(self, directory: Path) -> None:
        """Its metadata for people, ``<group>.json``."""
        replace_file(directory / f"{self.group}.json", (json.dumps(self.meta(), indent=2) + "\n").encode())

    @classmethod
    def read(cls, path: Path) -> ModelArtifact:
        """The artifact in a skops file, without running code from it; :class:`ModelRefused`
        says why a file is not one."""
        import skops.io as sio
        from sklearn.ensemble import IsolationForest

        try:
            data = path.read_bytes()
        except OSError as exc:  # a directory named like a model, a file nobody may read
            raise ModelRefused(f"{path}: cannot be read ({exc.strerror})") from None
        if not data:
            raise ModelRefused(f"{path}: empty (a copy or a write cut short?); retrain with `burnwatch model train`")
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
            artifact.ranges = [(float(lo), float(hi)) for lo, hi in artifact.ranges]  # JSON-like lists in the file
            if len(artifact.ranges) != len(artifact.features):
                raise ValueError(f"{len(artifact.ranges)} ranges for {len(artifact.features)} features")
            if artifact.features != feature_names(artifact.group, metrics_of(artifact.features)):
                raise ValueError(f"features {artifact.features} are not what this burnwatch computes")
            if not all(math.isfinite(lo) and math.isfinite(hi) and lo <= hi for lo, hi in artifact.ranges):
                raise ValueError("a feature's range is not two finite numbers, low then high")
            _check_times(artifact)
            _check_calibration(artifact._calibrated)
            artifact.threshold = artifact._calibrated.score_at(artifact._calibrated.budget)  # not taken from the file
        except (TypeError, ValueError, KeyError) as exc:
            raise ModelRefused(f"{path}: bad metadata ({exc}); retrain with `burnwatch model train`") from None
        _check_forest(path, forest, len(artifact.features))
        return artifact


def replace_file(path: Path, data: bytes) -> None:
    """Write ``path`` whole: a reader sees the old file or the new one, never half of one, and
    writers sharing the folder (several workers' model directory on one volume, each maybe
    pid 1 in its container) never write the same temporary file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ModelRefused(ValueError):
    """A file in the model directory that is not loaded, and why."""


def _check_calibration(cal: Calibration) -> None:
    """A calibration read from a file can neither raise while scoring nor make every window (or
    none) an alert by construction: its numbers are the types and in the bounds training writes."""
    numbers = (*cal.grid, *cal.levels, cal.edge, cal.tail_scale, cal.budget, cal.alerts_per_1000h, cal.windows_per_hour)
    if not all(type(x) in (int, float) and math.isfinite(x) for x in numbers) or type(cal.persist) is not int:
        raise ValueError("calibration: not finite numbers (and an integer persist)")
    levels, grid = np.asarray(cal.levels), np.asarray(cal.grid)
    if not (len(grid) == len(levels) >= 2 and (np.diff(levels) > 0).all() and (np.diff(grid) >= 0).all()
            and levels[0] >= 0 and levels[-1] <= 1):
        raise ValueError("calibration: quantile levels not increasing within [0, 1], or their scores decreasing")
    if not (0 < cal.edge <= 1 and 0 < cal.tail_scale <= 1e6 and 1 <= cal.persist <= 10_000
            and 0 < cal.budget <= MAX_EVIDENCE * cal.persist and RATE_BOUNDS[0] <= cal.alerts_per_1000h <= RATE_BOUNDS[1]
            and cal.windows_per_hour > 0):
        raise ValueError("calibration: edge, tail, persistence, budget or rate out of bounds")


def _check_times(artifact: ModelArtifact) -> None:
    """Its training period and creation are times events may carry (1970 to 2200), in order, and its counts
    whole and not negative: a time of 1e300 loaded, then failed every command that showed it, and a
    ``trained_to`` far ahead would keep a published model from ever replacing the file."""
    from detector.events import TS_MAX, TS_MIN

    earliest, latest = TS_MIN.timestamp(), TS_MAX.timestamp()
    times = {"trained_from": artifact.trained_from, "trained_to": artifact.trained_to, "created_at": artifact.created_at}
    for name, value in times.items():
        if not isinstance(value, int | float) or not earliest <= value <= latest:
            raise ValueError(f"{name} {value!r} is not a time from 1970 to 2200")
    if artifact.trained_from > artifact.trained_to:
        raise ValueError(f"trained_from {artifact.trained_from} is after trained_to {artifact.trained_to}")
    for name in ("samples", "excluded"):
        value = getattr(artifact, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} {value!r} is not a count")


def _check_forest(path: Path, forest: Any, n_features: int) -> None:
    """Every index scikit-learn follows without a bounds check is in bounds: each tree's children
    come after their parent (which also rules out cycles) and inside the tree, its split features
    are columns the tree is given, and those columns are the model's features. And each tree is one:
    every node but the root is the child of exactly one node (shared children would make the flat
    walk's levels double, :mod:`detector.model.flat_forest`), its columns are whole numbers and its
    path lengths the types scikit-learn makes."""
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
            and np.issubdtype(cols.dtype, np.integer)
            and all(np.asarray(p[i]).dtype in (np.int64, np.float64) for p in per_tree)
            and (np.bincount(np.concatenate([left[split], right[split]]), minlength=n)[1:] == 1).all()
        )  # fmt: skip
        if not ok:
            raise ModelRefused(f"{path}: tree {i} has node or feature indices out of bounds, or is not a tree (a node "
                               "with two parents, arrays of another type): not loaded")  # fmt: skip


def _ranges(x: np.ndarray) -> list[tuple[float, float]]:
    lo, hi = np.quantile(x, 0.001, axis=0), np.quantile(x, 0.999, axis=0)
    return [(float(a), float(b)) for a, b in zip(lo, hi, strict=True)]


def _guard(features: list[str], ranges: list[tuple[float, float]], rows: np.ndarray,
           levels: bool = False) -> np.ndarray:  # fmt: skip
    relative = [i for i, name in enumerate(features) if name.endswith(("_rel", "_z")) != levels]
    if not ranges or not relative:
        return np.zeros(len(rows))
    lo = np.array([ranges[i][0] for i in relative])
    hi = np.array([ranges[i][1] for i in relative])
    width = np.maximum(hi - lo, MIN_WIDTH)
    x = rows[:, relative]
    beyond = np.maximum(x - hi, lo - x) / width - GUARD_TOLERANCE
    return np.maximum(beyond, 0.0).max(axis=1)


def _score(forest: Any, features: list[str], ranges: list[tuple[float, float]], rows: np.ndarray) -> np.ndarray:
    """The forest's scores (walked flat: :mod:`detector.model.flat_forest`, scikit-learn's to the bit),
    sign turned, plus the guard."""
    flat = _FLAT.get(forest)
    if flat is None:
        flat = _FLAT[forest] = FlatForest(forest)
    return -flat.score_samples(rows) + _guard(features, ranges, rows)


_FLAT: weakref.WeakKeyDictionary[Any, FlatForest] = weakref.WeakKeyDictionary()
"""Each forest in use, flattened once (it goes when the forest does: a model reloaded, a training's)."""


def _forest(x: np.ndarray, n_estimators: int, max_samples: int, seed: int) -> Any:
    from sklearn.ensemble import IsolationForest

    return IsolationForest(n_estimators=n_estimators, max_samples=min(max_samples, len(x)), random_state=seed).fit(x)


def _held_out_scores(x: np.ndarray, times: np.ndarray, features: list[str], n_estimators: int, max_samples: int,
                     seed: int) -> np.ndarray:  # fmt: skip
    """Each row scored by a forest fitted on the other half of the training span (by time),
    so the calibration sees windows the scoring forest did not, as new windows will be."""
    later = times >= np.median(times)
    if later.all() or not later.any():
        later = np.arange(len(x)) >= len(x) // 2
    out = np.empty(len(x))
    for fit_on in (~later, later):
        held = ~fit_on
        forest = _forest(x[fit_on], n_estimators, max_samples, seed)
        out[held] = _score(forest, features, _ranges(x[fit_on]), x[held])
    return out


def _openings(runs: list[np.ndarray], budget: float) -> int:
    """Episodes ``budget`` opens over the training runs: upcrossings of each run's statistic."""
    n = 0
    for r in runs:
        above = r >= budget
        n += int(above[0]) + int(np.count_nonzero(above[1:] & ~above[:-1]))
    return n


def _run_statistic(evidence: np.ndarray, persist: int) -> np.ndarray:
    """Per window: the largest ``L * min(evidence of the last L windows)``, ``L <= persist``."""
    best = evidence.copy()
    least = evidence.copy()
    for n in range(2, min(persist, len(evidence)) + 1):
        shifted = np.full(len(evidence), -np.inf)
        shifted[n - 1:] = evidence[: len(evidence) - n + 1]
        least = np.minimum(least, shifted)
        best = np.maximum(best, n * least)
    return best


def _distribution(values: np.ndarray) -> tuple[list[float], list[float], float, float]:
    """``(levels, grid, edge, tail scale)`` of ``values``: quantiles at shares below, up to the
    share ``edge`` at the top (one value in n, or ``CONTAMINATION``), and the scale of an
    exponential tail beyond it. The scale is what the quantiles between the 90th percentile and
    the edge say (for an exponential tail, their gap is the scale times log(0.1 / edge)), so
    the values above the edge, possibly anomalies, do not set it."""
    n = len(values)
    edge = max(1.0 / n, CONTAMINATION)
    levels = np.unique(np.concatenate([np.linspace(0.0, min(0.99, 1.0 - edge), 100), [1.0 - edge]]))
    grid = np.maximum.accumulate(np.quantile(values, levels, method="inverted_cdf"))
    tail_from, edge_value = float(np.quantile(values, TAIL_FROM)), float(grid[-1])
    gap = math.log((1.0 - TAIL_FROM) / edge)
    scale = max((edge_value - tail_from) / gap if gap > 0 else 0.0, MIN_TAIL_SCALE)
    return [float(x) for x in levels], [float(x) for x in grid], edge, scale


def _share(levels: list[float], grid: list[float], edge: float, scale: float, values: Any) -> np.ndarray:
    """Share of the distribution at or above each value: empirical up to the edge, then falling
    exponentially from it."""
    x = np.asarray(values, dtype=np.float64)
    top = grid[-1]
    inside = 1.0 - np.interp(x, grid, levels)
    beyond = edge * np.exp(-np.maximum(x - top, 0.0) / scale)
    return np.where(x > top, beyond, np.maximum(inside, edge))


def _level(levels: list[float], grid: list[float], edge: float, scale: float, evidence: float) -> float:
    """The value at or above which a share ``10 ** -evidence`` of the distribution lies (see
    :func:`_share`); in log space, so any evidence has a level."""
    if evidence > -math.log10(edge):
        return grid[-1] + scale * (evidence * math.log(10.0) + math.log(edge))
    return float(np.interp(1.0 - 10.0**-evidence, levels, grid))


def fit(group: str, rows: Sequence[Sequence[float]], *, features: list[str] | None = None, trained_from: float,
        trained_to: float, excluded: int = 0, times: Sequence[float] | None = None,
        sequences: Sequence[Sequence[int]] | None = None, resource_hours: float | None = None, persist: int = 6,
        alerts_per_1000h: float = ALERTS_PER_1000H, n_estimators: int = 200, max_samples: int = 256,
        seed: int = 0) -> ModelArtifact:  # fmt: skip
    """Train one group's forest and calibrate it to ``alerts_per_1000h``.

    ``times``: each row's window start (the calibration's halves are by time); ``sequences``:
    the rows of each resource in time order, split where windows in between were not judged
    (runs of evidence only build within one); ``resource_hours``: the event time they cover."""
    if not RATE_BOUNDS[0] <= alerts_per_1000h <= RATE_BOUNDS[1]:
        raise ValueError(f"alerts per 1,000 resource-hours: {alerts_per_1000h:g} is outside {RATE_BOUNDS}")
    x = np.asarray(rows, dtype=np.float64)
    features = features or feature_names(group)
    t = np.asarray(times if times is not None else np.arange(len(x)), dtype=np.float64)
    seqs = [np.asarray(q, dtype=np.int64) for q in (sequences if sequences is not None else [range(len(x))]) if len(q)]
    hours = resource_hours if resource_hours else len(x) / 12.0
    forest = _forest(x, n_estimators, max_samples, seed)
    held = _held_out_scores(x, t, features, n_estimators, max_samples, seed)
    levels, grid, edge, scale = _distribution(held)
    per_hour = len(x) / hours if hours > 0 else 12.0
    cal = Calibration(levels=levels, grid=grid, edge=edge, tail_scale=scale, alerts_per_1000h=alerts_per_1000h,
                      windows_per_hour=per_hour, persist=persist, budget=0.0, budget_independent=0.0, budget_runs=0.0,
                      training_openings=0, training_hours=hours)  # fmt: skip
    cal.budget_independent = math.log10(persist * 1000.0 * per_hour / alerts_per_1000h)
    evidence = cal.evidence(held)
    runs = [_run_statistic(evidence[q], persist) for q in seqs]
    cal.budget_runs = _level(*_distribution(np.concatenate(runs)), -math.log10(alerts_per_1000h / 1000.0 / per_hour))
    cal.budget = min(max(cal.budget_independent, cal.budget_runs, MIN_BUDGET), MAX_EVIDENCE * persist)
    cal.training_openings = _openings(runs, cal.budget)
    artifact = ModelArtifact(
        group=group, features=list(features), trained_from=trained_from, trained_to=trained_to, samples=len(x),
        excluded=excluded, params={"n_estimators": n_estimators, "max_samples": min(max_samples, len(x)), "seed": seed},
        threshold=cal.score_at(cal.budget), calibration=asdict(cal), model=forest, ranges=_ranges(x),
    )  # fmt: skip
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
        signature = cls.fingerprint(directory)  # before reading: a file replaced meanwhile is seen as a change
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
                if path.name != f"{artifact.group}{SUFFIX}":  # a kept backup (cpu_old) or a copy: which one scores?
                    refused.append(f"{path}: a model of group {artifact.group!r} in a file not named "
                                   f"{artifact.group}{SUFFIX}, not loaded (a group's model is that file alone; move "
                                   "backups out of the model directory)")  # fmt: skip
                    continue
                artifacts[artifact.group] = artifact
        return cls(artifacts, signature), refused

    def changed(self, directory: str | Path) -> bool:
        return self.fingerprint(Path(directory)) != self.signature
