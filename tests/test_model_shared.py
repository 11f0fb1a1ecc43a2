"""One model for a group of workers (detector/model/shared.py), through the store on the
embedded ClickHouse engine: what the worker that retrains publishes, every worker takes into
its model folder, checked as a file there is; a model trained on later events is kept; one
unusable row keeps no other group from being taken."""

from __future__ import annotations

import base64
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

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


def put_row(store, group: str, trained_to: float, version: int, data: bytes | str) -> None:
    """A row as it may be in the store, whoever wrote it."""
    encoded = data if isinstance(data, str) else base64.b64encode(data).decode()
    store.insert("model_artifacts", [[group, datetime.fromtimestamp(trained_to, tz=timezone.utc), version, encoded]],
                 column_names=["model_group", "trained_to", "version", "skops"])  # fmt: skip


def test_what_one_worker_publishes_every_other_takes_and_scores_with_alike(store, tmp_path: Path):
    trainer, other = tmp_path / "trainer", tmp_path / "other"
    artifacts = trained(trainer, artifact("gpu", 7200.0), artifact("cpu", 7200.0, seed=2))
    assert shared.publish(store.models, artifacts, version=10) == ["cpu", "gpu"]
    assert store.models.newest() == (10, 2)

    written, refused = shared.take(store.models, other)
    assert (written, refused) == (["cpu", "gpu"], [])
    mine, theirs = ModelSet.load(trainer), ModelSet.load(other)
    rows = np.random.default_rng(9).normal(size=(50, len(feature_names("gpu"))))
    for group in ("cpu", "gpu"):
        assert theirs.get(group).threshold == mine.get(group).threshold
        assert theirs.get(group).trained_to == mine.get(group).trained_to
    assert np.array_equal(theirs.get("gpu").model.score_samples(rows), mine.get("gpu").model.score_samples(rows))
    assert shared.take(store.models, other) == ([], [])  # nothing new: nothing rewritten
    assert sorted(p.name for p in other.iterdir()) == ["cpu.json", f"cpu{SUFFIX}", "gpu.json", f"gpu{SUFFIX}"]


def test_the_artifact_trained_on_the_latest_events_is_taken_whoever_published_last(store, tmp_path: Path):
    folder = tmp_path / "models"
    trained(folder, artifact("gpu", 7200.0))
    publisher = tmp_path / "publisher"
    shared.publish(store.models, trained(publisher, artifact("gpu", 3600.0, seed=3)), version=5)
    assert shared.take(store.models, folder) == ([], [])  # trained on earlier events than the folder's
    assert ModelArtifact.read(folder / f"gpu{SUFFIX}").trained_to == 7200.0

    shared.publish(store.models, trained(publisher, artifact("gpu", 10_800.0, seed=4)), version=6)
    shared.publish(store.models, trained(publisher, artifact("gpu", 9_000.0, seed=5)), version=7)  # a clock ahead
    assert shared.take(store.models, folder) == (["gpu"], [])
    assert ModelArtifact.read(folder / f"gpu{SUFFIX}").trained_to == 10_800.0  # event time decides
    assert '"trained_to": 10800.0' in (folder / "gpu.json").read_text()  # the sidecar people read follows

    # Retrained over the same events (rules changed, alerts marked expected): another model, taken
    shared.publish(store.models, [again := artifact("gpu", 10_800.0, seed=6)], version=8)
    assert shared.take(store.models, folder) == (["gpu"], [])
    assert ModelArtifact.read(folder / f"gpu{SUFFIX}").params["seed"] == again.params["seed"] == 6


def test_a_published_artifact_that_is_not_a_model_replaces_nothing_and_is_named(store, tmp_path: Path):
    folder = tmp_path / "models"
    trained(folder, artifact("gpu", 7200.0))
    before = (folder / f"gpu{SUFFIX}").read_bytes()
    put_row(store, "gpu", 99_999.0, 7, b"PK\x03\x04 not a skops file")
    put_row(store, "../../etc/cron.d/x", 99_999.0, 7, before)

    written, refused = shared.take(store.models, folder)
    assert written == []
    assert (folder / f"gpu{SUFFIX}").read_bytes() == before  # the good model stays
    assert len(refused) == 2 and all("model_artifacts" in r and "version 7" in r for r in refused)
    assert any("not a burnwatch model file" in r for r in refused)
    assert any("not a model group of this burnwatch" in r for r in refused)
    assert sorted(p.name for p in folder.iterdir()) == ["gpu.json", f"gpu{SUFFIX}"]  # no temporary file left
    assert not (tmp_path / "etc").exists()


def test_a_row_holding_another_groups_model_is_refused(store, tmp_path: Path):
    folder, publisher = tmp_path / "models", tmp_path / "publisher"
    trained(folder, artifact("gpu", 7200.0), artifact("cpu", 7200.0, seed=2))
    trained(publisher, artifact("cpu", 10_800.0, seed=5))
    put_row(store, "gpu", 10_800.0, 9, (publisher / f"cpu{SUFFIX}").read_bytes())

    written, refused = shared.take(store.models, folder)
    assert written == [] and len(refused) == 1 and "holds the model of group 'cpu'" in refused[0]
    models = ModelSet.load(folder)
    assert models.get("gpu").trained_to == 7200.0 and models.get("cpu").trained_to == 7200.0


def test_one_row_that_does_not_decode_keeps_no_other_group_from_being_taken(store, tmp_path: Path):
    folder = tmp_path / "models"
    shared.publish(store.models, [artifact("gpu", 7200.0)], version=5)
    put_row(store, "cpu", 7200.0, 5, "abc")  # not base64

    written, refused = shared.take(store.models, folder)
    assert written == ["gpu"] and len(refused) == 1 and "not base64" in refused[0]


def test_a_folder_that_cannot_be_written_is_said_and_nothing_else_breaks(store, tmp_path: Path):
    shared.publish(store.models, [artifact("gpu", 7200.0)], version=5)
    not_a_folder = tmp_path / "models"
    not_a_folder.write_text("a file where the model folder should be")
    written, refused = shared.take(store.models, not_a_folder)
    assert written == [] and len(refused) == 1 and "cannot write into" in refused[0]


@pytest.mark.parametrize(
    ("holds", "published_s", "now_s", "due"),
    [
        (True, 0, 1_000, True),  # nothing published yet: the holder trains
        (False, 0, 1_000, False),  # another worker holds partition 0: it trains
        (True, 1_000, 1_000 + 3_599, False),  # published within the hour
        (True, 1_000, 1_000 + 3_600, True),  # an hour since: whoever holds partition 0 now trains
        (False, 1_000, 1_000 + 7_200, False),
    ],
)
def test_the_holder_of_partition_0_retrains_once_nothing_was_published_within_the_interval(
        holds, published_s, now_s, due):  # fmt: skip
    assert shared.retrain_due(holds, published_s * 10**9, now_s * 10**9, 3600.0) is due
