"""A fitted isolation forest's trees as flat arrays, walked for every tree at once.

scikit-learn's ``IsolationForest.score_samples`` walks its trees one by one, each a task of
joblib's: 4-12 ms a call on the development VM (by its speed) whatever the rows (100 trees), most of
what a model costs the anomaly rule, whose calls hold a batch's few closed windows of a group
(``bench/model.py``: the model halved ``backtest``). :class:`FlatForest` holds the same trees as
one array per node attribute, every tree's nodes after the one before's, and moves the rows
down all trees together, one level a step (a leaf points to itself, so the rows that reach one
early stay there): a few numpy operations a level, ~0.04 ms a call of one row, 0.75 ms of 100.

The scores are scikit-learn's, to the bit, not an approximation (``tests/test_flat_forest.py``
holds them equal on forests and rows drawn at random, NaN and infinities included): the rows
are compared as float32, as scikit-learn casts them; a NaN goes where the node's
``missing_go_to_left`` says; a leaf adds its depth plus the average path length of its samples
minus one, as scikit-learn's ``(a + b) - 1.0``; the trees' parts are summed in tree order
(``cumsum``, which is sequential, not numpy's pairwise ``sum``); then the same ``-2 ** -(depths /
denominator)``. Large calls (training scores thousands of held-out windows at once) go to
scikit-learn itself, whose compiled walk is faster there, and gives the same scores.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

__all__ = ["FlatForest"]

LARGE_CALL = 512
"""Rows from which scikit-learn's own walk (one compiled call a tree) is the faster."""
MAX_LEVELS = 64
"""Trees deeper than this are scikit-learn's to walk (a step a level costs ~4 µs a call): an isolation
forest grows none deeper than ``ceil(log2(max_samples))``; only an edited model file could."""


class FlatForest:
    """The trees of one fitted :class:`sklearn.ensemble.IsolationForest`; :meth:`score_samples` is its
    ``score_samples``. The forest's arrays are checked before it is used (``forest._check_forest``). It
    holds the forest weakly: a cache keyed by the forest lets both go together."""

    def __init__(self, forest: Any) -> None:
        from sklearn.ensemble._iforest import _average_path_length

        self._forest = weakref.ref(forest)  # not the forest itself: _FLAT's value would keep its key alive
        self._n_features = forest.n_features_in_
        trees, columns = forest.estimators_, forest.estimators_features_
        if forest._max_features == forest.n_features_in_:  # scikit-learn then gives each tree every column, in order
            columns = [np.arange(forest.n_features_in_)] * len(trees)
        sizes = [int(t.tree_.node_count) for t in trees]
        starts = np.cumsum([0, *sizes[:-1]])
        self._roots = np.asarray(starts, dtype=np.intp)[:, None]
        left, right, feature, threshold, nan_left, leaf_part = [], [], [], [], [], []
        for tree, cols, start, path, average in zip(trees, columns, starts, forest._decision_path_lengths,
                                                    forest._average_path_length_per_tree, strict=True):  # fmt: skip
            t = tree.tree_
            node = np.arange(t.node_count) + start
            leaf = np.asarray(t.children_left) == -1
            left.append(np.where(leaf, node, np.asarray(t.children_left) + start))
            right.append(np.where(leaf, node, np.asarray(t.children_right) + start))
            feature.append(np.where(leaf, 0, np.asarray(cols)[np.where(leaf, 0, t.feature)]))
            threshold.append(np.asarray(t.threshold, dtype=np.float64))
            nan_left.append(np.asarray(t.missing_go_to_left, dtype=bool))
            leaf_part.append((np.asarray(path) + np.asarray(average) - 1.0).astype(np.float64))  # sklearn's (a + b) - 1.0
        self._left, self._right = np.concatenate(left), np.concatenate(right)
        self._feature, self._threshold = np.concatenate(feature), np.concatenate(threshold)
        self._nan_left, self._leaf_part = np.concatenate(nan_left), np.concatenate(leaf_part)
        self._depth = _levels(self._roots[:, 0], self._left, self._right)
        """Levels below the roots: after this many steps every row is at a leaf (counted from the nodes,
        not read from the trees' ``max_depth``, which a model file could misstate)."""
        self._denominator = len(trees) * _average_path_length([forest._max_samples])

    def score_samples(self, rows: np.ndarray) -> np.ndarray:
        """``forest.score_samples(rows)``, the same numbers: lower is more anomalous."""
        x = np.asarray(rows)
        if x.ndim != 2 or x.shape[1] != self._n_features or not 0 < len(x) < LARGE_CALL or self._depth > MAX_LEVELS:
            forest = self._forest()  # alive: it is what this walk is looked up by
            if forest is None:
                raise ReferenceError("the forest this walk was made of is gone")
            return np.asarray(forest.score_samples(rows))  # its own walk, and its own errors
        with np.errstate(over="ignore"):  # beyond float32's range: infinite, as scikit-learn casts it
            x = x.astype(np.float32)  # the dtype scikit-learn's trees compare in
        depths = self._depths(x)
        return np.asarray(-(2 ** (-np.divide(depths, self._denominator, out=np.ones_like(depths),
                                             where=self._denominator != 0))))  # fmt: skip

    def _depths(self, x: np.ndarray) -> np.ndarray:
        """Per row, the sum over the trees, in their order, of its leaf's part."""
        node = np.repeat(self._roots, len(x), axis=1)  # (trees, rows)
        row = np.arange(len(x))[None, :]
        feature, threshold, nan_left = self._feature, self._threshold, self._nan_left
        for _ in range(self._depth):
            value = x[row, feature[node]]
            left = (value <= threshold[node]) | (np.isnan(value) & nan_left[node])
            node = np.where(left, self._left[node], self._right[node])
        return np.asarray(np.cumsum(self._leaf_part[node], axis=0)[-1])


def _levels(roots: np.ndarray, left: np.ndarray, right: np.ndarray) -> int:
    """The most levels any leaf lies below its tree's root (a leaf points to itself), or ``MAX_LEVELS + 1``
    past that. Each level's nodes are taken once: an edited file whose nodes share children (which the
    model's check refuses) must not double them at every level."""
    level, levels = roots, 0
    while levels <= MAX_LEVELS:
        inner = level[left[level] != level]
        if not len(inner):
            return levels
        level, levels = np.unique(np.concatenate([left[inner], right[inner]])), levels + 1
    return levels
