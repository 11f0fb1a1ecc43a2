"""Model files are loaded from a directory others may write to: loading runs no code from a
file, refuses what is not a model (naming the file and why), and a pickle from an earlier
version is refused with the instruction to retrain."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import skops.io as sio

from detector.model.features import feature_names
from detector.model.forest import MODEL_VERSION, ModelArtifact, ModelRefused, ModelSet, fit

GROUP = "gpu"


def artifact() -> ModelArtifact:
    width = len(feature_names(GROUP))
    rows = np.random.default_rng(1).normal(size=(300, width))
    return fit(GROUP, rows, trained_from=0.0, trained_to=3600.0, n_estimators=10, max_samples=64)


class _RunsCode:
    """Unpickling this creates ``marker``: what a hostile pickle could do instead."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_saved_model_loads_and_scores_the_same(tmp_path):
    saved = artifact()
    path = saved.save(tmp_path)
    assert path.suffix == ".skops" and (tmp_path / "gpu.json").exists()
    loaded = ModelSet.load(tmp_path).get(GROUP)
    rows = np.random.default_rng(2).normal(size=(20, len(saved.features)))
    assert loaded is not None and loaded.meta() == {**saved.meta(), "ranges": loaded.ranges}
    assert loaded.ranges == saved.ranges
    assert np.array_equal(loaded.score(rows), saved.score(rows))


def test_an_old_pickle_is_refused_unopened_saying_to_retrain(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "gpu.pkl").write_bytes(pickle.dumps(_RunsCode(str(marker))))
    with pytest.raises(ModelRefused) as caught:
        ModelSet.load(tmp_path)
    assert "gpu.pkl: a model file in the old pickle format" in str(caught.value)
    assert "retrain with `burnwatch model train`" in str(caught.value)
    assert not marker.exists()


def test_a_file_with_other_types_is_refused_unopened(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "gpu.skops").write_bytes(sio.dumps({"meta": artifact().meta(), "model": _RunsCode(str(marker))}))
    with pytest.raises(ModelRefused, match=r"gpu.skops: holds types no model file has \(.*_RunsCode\)"):
        ModelSet.load(tmp_path)
    assert not marker.exists()


def test_a_tree_pointing_outside_itself_is_refused(tmp_path):
    """scikit-learn follows a tree's child indices without bounds checks: a crafted file
    could make scoring read outside the tree, so the loader checks them."""
    saved = artifact()
    tree = saved.model.estimators_[3].tree_
    state = tree.__getstate__()
    state["nodes"]["left_child"][0] = 10**6
    tree.__setstate__(state)
    saved.save(tmp_path)
    with pytest.raises(ModelRefused, match="gpu.skops: tree 3 has node or feature indices out of bounds"):
        ModelSet.load(tmp_path)


def test_a_tree_that_loops_is_refused(tmp_path):
    saved = artifact()
    tree = saved.model.estimators_[0].tree_
    state = tree.__getstate__()
    split = int(np.flatnonzero(state["nodes"]["left_child"] != -1)[-1])
    state["nodes"]["right_child"][split] = 0  # back to the root: scoring would never end
    tree.__setstate__(state)
    saved.save(tmp_path)
    with pytest.raises(ModelRefused, match="tree 0 has node or feature indices out of bounds"):
        ModelSet.load(tmp_path)


def test_a_tree_whose_node_has_two_parents_is_refused(tmp_path):
    """Children after their parents and in bounds, but a node both children of one split (its sibling
    orphaned): not a tree. Such nodes repeated down a file's tree would double the flat walk's levels."""
    saved = artifact()
    tree = saved.model.estimators_[2].tree_
    state = tree.__getstate__()
    split = int(np.flatnonzero(state["nodes"]["left_child"] != -1)[0])
    state["nodes"]["right_child"][split] = state["nodes"]["left_child"][split]
    tree.__setstate__(state)
    saved.save(tmp_path)
    with pytest.raises(ModelRefused, match="tree 2 has node or feature indices out of bounds, or is not a tree"):
        ModelSet.load(tmp_path)


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"not a zip at all", "not a burnwatch model file (BadZipFile"),
        (sio.dumps([1, 2, 3]), "not a burnwatch model file (no metadata)"),
        (sio.dumps({"meta": {"version": 1}, "model": None}), f"model version 1, this burnwatch reads {MODEL_VERSION}: retrain"),
        (sio.dumps({"meta": {"version": 2}, "model": None}), f"model version 2, this burnwatch reads {MODEL_VERSION}: retrain"),
    ],
    ids=["damaged", "a-list", "pickle-era", "before-calibration"],
)
def test_a_file_that_is_not_a_model_is_named(tmp_path, content, reason):
    artifact().save(tmp_path)
    (tmp_path / "storage.skops").write_bytes(content)
    with pytest.raises(ModelRefused) as caught:
        ModelSet.load(tmp_path)
    assert f"storage.skops: {reason}" in str(caught.value)
    assert "gpu.skops" not in str(caught.value)  # the good file is not blamed


def test_an_empty_model_file_or_a_directory_named_like_one_is_named_without_a_traceback(tmp_path):
    """An empty file said skops' zip error; a directory named ``cpu.skops`` was an IsADirectoryError
    traceback out of every command that reads the models."""
    artifact().save(tmp_path)
    (tmp_path / "storage.skops").write_bytes(b"")
    (tmp_path / "cpu.skops").mkdir()
    models, refused = ModelSet.read(tmp_path)
    assert sorted(models.artifacts) == ["gpu"]
    assert any("storage.skops: empty" in r for r in refused), refused
    assert any("cpu.skops: cannot be read (Is a directory)" in r for r in refused), refused


@pytest.mark.parametrize("ranges", [[["low", "high"]], [[0.0, 1.0, 2.0]], [5.0]], ids=["words", "a-triple", "a-number"])
def test_a_file_whose_ranges_are_not_pairs_of_numbers_is_refused(tmp_path, ranges):
    saved = artifact()
    (tmp_path / "gpu.skops").write_bytes(sio.dumps({"meta": {**saved.meta(), "ranges": ranges}, "model": saved.model}))
    with pytest.raises(ModelRefused, match="gpu.skops: bad metadata"):
        ModelSet.load(tmp_path)


@pytest.mark.parametrize("change", [
    {"tail_scale": -1.0}, {"tail_scale": 0.0}, {"tail_scale": float("inf")}, {"persist": 0}, {"persist": 6.5},
    {"edge": 0.0}, {"edge": 2.0}, {"grid": [float("nan")] * 2, "levels": [0.0, 1.0]}, {"grid": [0.1]},
    {"grid": [0.9, 0.1], "levels": [0.0, 1.0]}, {"levels": [1.0, 0.0], "grid": [0.1, 0.9]},
    {"budget": float("inf")}, {"budget": -1.0}, {"budget": 0.0}, {"budget": 1e300}, {"budget": 400.0},
    {"alerts_per_1000h": 0.0}, {"surprise": 1}, {"budget": "high"},
], ids=["negative-tail", "flat-tail", "infinite-tail", "no-persistence", "fractional-persistence", "no-edge",
        "edge-above-one", "nan-grid", "grid-without-levels", "grid-decreasing", "levels-decreasing",
        "infinite-budget", "negative-budget", "zero-budget", "budget-never-reached", "budget-beyond-any-run",
        "no-rate", "unknown-key", "a-word"])  # fmt: skip
def test_a_file_whose_calibration_is_out_of_bounds_is_refused(tmp_path, change):
    """What a score means is read from the file: a calibration that would make every window (or none)
    an alert, or make scoring raise, is refused with the file named, never used."""
    saved = artifact()
    meta = {**saved.meta(), "calibration": {**saved.calibration, **change}}
    (tmp_path / "gpu.skops").write_bytes(sio.dumps({"meta": meta, "model": saved.model}))
    with pytest.raises(ModelRefused, match="gpu.skops: bad metadata"):
        ModelSet.load(tmp_path)


def test_the_worker_reads_what_loads_and_is_told_what_does_not(tmp_path):
    artifact().save(tmp_path)
    (tmp_path / "storage.pkl").write_bytes(pickle.dumps(_RunsCode(str(tmp_path / "ran"))))
    models, refused = ModelSet.read(tmp_path)
    assert set(models.artifacts) == {GROUP}
    assert len(refused) == 1 and "storage.pkl: a model file in the old pickle format" in refused[0]
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("name", ["gpu_old.skops", "cpu.skops"])
def test_a_model_in_a_file_not_named_for_its_group_is_refused_naming_it(tmp_path, name):
    """A backup kept beside the model (gpu_old.skops sorts after gpu.skops, and scored instead of it), or a
    copy under another group's name (cpu.skops holding gpu's, which left cpu unscored): which model scores
    is never a matter of how file names sort."""
    path = artifact().save(tmp_path)
    (tmp_path / name).write_bytes(path.read_bytes())
    models, refused = ModelSet.read(tmp_path)
    assert set(models.artifacts) == {GROUP}
    assert len(refused) == 1 and refused[0].startswith(f"{tmp_path / name}: a model of group 'gpu' in a file not named")
    with pytest.raises(ModelRefused, match=name):
        ModelSet.load(tmp_path)


def test_a_new_or_replaced_file_is_a_change(tmp_path):
    models = ModelSet.load(tmp_path)
    (tmp_path / "gpu.pkl").write_bytes(b"")
    assert models.changed(tmp_path)


@pytest.mark.parametrize("ranges", [[[float("nan"), 1.0]], [[2.0, 1.0]], [[0.0, float("inf")]]],
                         ids=["nan", "low-above-high", "infinite"])  # fmt: skip
def test_a_file_whose_ranges_are_not_finite_low_then_high_is_refused(tmp_path, ranges):
    saved = artifact()
    meta = {**saved.meta(), "ranges": ranges * len(saved.features)}
    (tmp_path / "gpu.skops").write_bytes(sio.dumps({"meta": meta, "model": saved.model}))
    with pytest.raises(ModelRefused, match="gpu.skops: bad metadata"):
        ModelSet.load(tmp_path)


@pytest.mark.parametrize("change, said", [
    ({"trained_from": 1e300}, "trained_from 1e+300 is not a time"),  # loaded, then show and train failed on it
    ({"trained_to": 1e13}, "trained_to 10000000000000.0 is not a time"),  # past 2200: never replaced by a newer one
    ({"trained_from": 7200.0}, "trained_from 7200.0 is after trained_to"),
    ({"samples": -5}, "samples -5 is not a count"),
    ({"created_at": float("nan")}, "created_at nan is not a time"),
])  # fmt: skip
def test_a_file_whose_times_or_counts_are_absurd_is_refused(tmp_path, change, said):
    saved = artifact()
    (tmp_path / "gpu.skops").write_bytes(sio.dumps({"meta": {**saved.meta(), **change}, "model": saved.model}))
    with pytest.raises(ModelRefused) as info:
        ModelSet.load(tmp_path)
    assert f"gpu.skops: bad metadata ({said}" in str(info.value)


def test_the_threshold_is_recomputed_from_the_calibration_not_read_from_the_file(tmp_path):
    saved = artifact()
    (tmp_path / "gpu.skops").write_bytes(sio.dumps({"meta": {**saved.meta(), "threshold": -5.0}, "model": saved.model}))
    assert ModelSet.load(tmp_path).get("gpu").threshold == pytest.approx(saved.threshold)
