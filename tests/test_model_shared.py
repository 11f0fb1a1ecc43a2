"""One model for a group of workers (detector/model/shared.py), through the store on the
embedded ClickHouse engine: what the worker that retrains publishes, every worker takes into
its model folder, checked as a file there is; a newer model in the folder is kept."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np

from detector.model import shared
from detector.model.features import feature_names
from detector.model.forest import SUFFIX, ModelArtifact, ModelSet, fit


def artifact(group: str, trained_to: float, seed: int = 1) -> ModelArtifact:
    rows = np.random.default_rng(seed).normal(size=(300, len(feature_names(group))))
    return fit(group, rows, trained_from=0.0, trained_to=trained_to, n_estimators=10, max_samples=64, seed=seed)


def trained(folder: Path, *artifacts: ModelArtifact) -> list[ModelArtifact]:
    for a in artifacts:
        a.save(folder)
    return list(artifacts)


def test_what_one_worker_publishes_every_other_takes_and_scores_with_alike(store, tmp_path: Path):
    trainer, other = tmp_path / "trainer", tmp_path / "other"
    artifacts = trained(trainer, artifact("gpu", 7200.0), artifact("cpu", 7200.0, seed=2))
    assert shared.publish(store.models, trainer, artifacts, version=10) == ["cpu", "gpu"]
    assert store.models.newest() == 10

    written, refused = shared.take(store.models, other)
    assert (written, refused) == (["cpu", "gpu"], [])
    mine, theirs = ModelSet.load(trainer), ModelSet.load(other)
    rows = np.random.default_rng(9).normal(size=(50, len(feature_names("gpu"))))
    for group in ("cpu", "gpu"):
        assert (other / f"{group}{SUFFIX}").read_bytes() == (trainer / f"{group}{SUFFIX}").read_bytes()
        assert theirs.get(group).threshold == mine.get(group).threshold
    assert np.array_equal(theirs.get("gpu").model.score_samples(rows), mine.get("gpu").model.score_samples(rows))
    assert shared.take(store.models, other) == ([], [])  # nothing newer: nothing rewritten


def test_a_newer_training_replaces_the_file_and_an_older_one_does_not(store, tmp_path: Path):
    folder = tmp_path / "models"
    trained(folder, artifact("gpu", 7200.0))
    publisher = tmp_path / "publisher"
    shared.publish(store.models, publisher, trained(publisher, artifact("gpu", 3600.0, seed=3)), version=5)
    assert shared.take(store.models, folder) == ([], [])  # trained on earlier events than the folder's
    assert ModelArtifact.read(folder / f"gpu{SUFFIX}").trained_to == 7200.0

    shared.publish(store.models, publisher, trained(publisher, artifact("gpu", 10_800.0, seed=4)), version=6)
    assert shared.take(store.models, folder) == (["gpu"], [])
    assert ModelArtifact.read(folder / f"gpu{SUFFIX}").trained_to == 10_800.0
    assert '"trained_to": 10800.0' in (folder / "gpu.json").read_text()  # the sidecar people read follows


def test_a_published_artifact_that_is_not_a_model_replaces_nothing_and_is_named(store, tmp_path: Path):
    folder = tmp_path / "models"
    trained(folder, artifact("gpu", 7200.0))
    before = (folder / f"gpu{SUFFIX}").read_bytes()
    rows = [["gpu", 7, 99_999.0, base64.b64encode(b"PK\x03\x04 not a skops file").decode()],
            ["../../etc/cron.d/x", 7, 99_999.0, base64.b64encode(before).decode()]]  # fmt: skip
    store.insert("model_artifacts", rows, column_names=["model_group", "version", "trained_to", "skops"])

    written, refused = shared.take(store.models, folder)
    assert written == []
    assert (folder / f"gpu{SUFFIX}").read_bytes() == before  # the good model stays
    assert len(refused) == 2 and all("model_artifacts" in r and "version 7" in r for r in refused)
    assert any("not a burnwatch model file" in r for r in refused)
    assert any("not a model group's name" in r for r in refused)
    assert sorted(p.name for p in folder.iterdir()) == ["gpu.json", f"gpu{SUFFIX}"]  # no temporary file left
    assert not (tmp_path / "etc").exists()
