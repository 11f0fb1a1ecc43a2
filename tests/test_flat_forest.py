"""The flat walk of an isolation forest gives scikit-learn's scores to the bit (detector.model.flat_forest)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.ensemble import IsolationForest

from detector.model.flat_forest import LARGE_CALL, FlatForest


def _forest(seed: int, n: int, features: int, trees: int, max_samples: int | str, max_features: float,
            nan_share: float) -> tuple[IsolationForest, np.ndarray, np.random.Generator]:  # fmt: skip
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)) * rng.choice([1e-3, 1.0, 1e4], size=features)
    x[rng.random(size=x.shape) < nan_share] = np.nan  # trees learn where a missing value goes
    forest = IsolationForest(n_estimators=trees, max_samples=max_samples, max_features=max_features,
                             random_state=seed).fit(x)  # fmt: skip
    return forest, x, rng


def _hostile_rows(forest: IsolationForest, x: np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray:
    """Rows drawn like the training rows, then values at and beside the trees' own thresholds (the
    float32 cast decides those), NaN, infinities, -0.0 and values beyond float32's range."""
    features = x.shape[1]
    rows = rng.normal(size=(n, features)) * np.nanstd(np.where(np.isfinite(x), x, np.nan), axis=0).clip(1e-6)
    thresholds = np.concatenate([e.tree_.threshold[e.tree_.children_left != -1] for e in forest.estimators_])
    if len(thresholds):
        picked = rng.choice(thresholds, size=rows.shape)
        near = np.where(rng.random(rows.shape) < 0.5, picked,
                        np.nextafter(picked.astype(np.float32), np.float32(rng.choice([-np.inf, np.inf]))))  # fmt: skip
        at = rng.random(rows.shape) < 0.4
        rows[at] = near[at]
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e39, -1e39, 3.4028235e38, 1e-46])
    odd = rng.random(rows.shape) < 0.1
    rows[odd] = rng.choice(specials, size=int(odd.sum()))
    return rows


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 400), features=st.integers(1, 9),
       trees=st.sampled_from([1, 3, 25, 100]), max_samples=st.sampled_from(["auto", 2, 16, 256]),
       max_features=st.sampled_from([1.0, 0.5]), nan_share=st.sampled_from([0.0, 0.0, 0.05, 0.5]),
       rows=st.integers(1, 300))  # fmt: skip
def test_the_flat_walk_gives_scikit_learns_scores_to_the_bit(seed, n, features, trees, max_samples, max_features,
                                                            nan_share, rows):  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # max_samples above n, overflow in the float32 cast: as scikit-learn says
        forest, x, rng = _forest(seed, n, features, trees, max_samples, max_features, nan_share)
        query = _hostile_rows(forest, x, rng, rows)
        expected = forest.score_samples(query)
        got = FlatForest(forest).score_samples(query)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert np.array_equal(got.view(np.int64), expected.view(np.int64)), np.flatnonzero(got != expected)[:5]


def test_rows_the_flat_walk_does_not_take_go_to_scikit_learn_as_they_would():
    """A large call is scikit-learn's own (faster there); rows of the wrong shape get its error."""
    forest, x, rng = _forest(7, 500, 4, 50, "auto", 1.0, 0.0)
    flat = FlatForest(forest)
    many = _hostile_rows(forest, x, rng, LARGE_CALL + 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.array_equal(flat.score_samples(many), forest.score_samples(many))
    with pytest.raises(ValueError):
        flat.score_samples(np.zeros((2, 5)))
    with pytest.raises(ValueError):
        flat.score_samples(np.zeros((0, 4)))


def test_a_single_row_is_walked_flat_not_tree_by_tree(monkeypatch):
    """What the anomaly rule's calls hold: a few windows. They never reach scikit-learn's tree-by-tree walk."""
    forest, x, _ = _forest(3, 300, 6, 100, "auto", 1.0, 0.0)
    expected = forest.score_samples(x[:1])
    flat = FlatForest(forest)
    monkeypatch.setattr(forest, "score_samples", lambda rows: pytest.fail("walked by scikit-learn"))
    assert np.array_equal(flat.score_samples(x[:1]), expected)


def test_a_walk_goes_when_its_forest_does():
    """The cache of walks is keyed by the forest, which the walk holds only weakly: a model reloaded, or a
    training's held-out forests, leave memory (holding it, every reload kept a forest for good)."""
    import gc
    import weakref

    from detector.model.forest import _FLAT, _score

    forest, x, _ = _forest(11, 200, 3, 10, "auto", 1.0, 0.0)
    _score(forest, ["a", "b", "c"], [], x[:2])
    assert forest in _FLAT
    gone = weakref.ref(forest)  # (the cache's size would also count other tests' forests going)
    del forest
    gc.collect()
    assert gone() is None


def test_nodes_that_share_children_are_walked_in_bounded_levels():
    """A model file's tree whose nodes both point at the next (in bounds, each child after its parent)
    doubles at every level if each level's nodes are not taken once; deeper than any isolation tree, it
    is left to scikit-learn's walk."""
    from detector.model.flat_forest import MAX_LEVELS, _levels

    n = 200
    left = np.minimum(np.arange(n) + 1, n - 1)
    left[-1] = n - 1  # the last a leaf (pointing to itself)
    assert _levels(np.array([0]), left, left.copy()) == MAX_LEVELS + 1
    chain = np.arange(5) + 1
    chain[-1] = 4
    assert _levels(np.array([0]), chain, chain.copy()) == 4
