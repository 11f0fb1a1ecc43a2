"""The worker with the anomaly model: it starts with rules only, retrains on schedule from
what it stored (holding partition 0, it is the one that trains), publishes the artifacts for
the group's other workers and picks them up; on the embedded broker and ClickHouse.
(Scoring in the stream is the engine's, tested in test_model.py; the demo ran it.)"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from detector.model.features import feature_names
from detector.model.forest import ModelSet, fit
from detector.model.train import MIN_SAMPLES
from detector.replay import write_replay
from detector.simulate import SimConfig, simulate
from streams.embedded import EmbeddedBroker
from streams.kafka import count_events, file_records
from streams.process import WorkerProcess, worker_env
from tests.conftest import ROOT
from tests.test_end_to_end import PARTITIONS, publish

pytestmark = pytest.mark.integration


class _RunsCode:
    """Unpickling this creates ``marker``: what a hostile pickle in the model directory could do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_scheduled_retrain_is_loaded(tmp_path: Path, ruleset):
    """...beside a model file of the old pickle format, which is refused unopened, saying to retrain."""
    records, _ = simulate(SimConfig(hours=14, training_hosts=6, notebooks=2, inference_endpoints=1, seed=5),
                          ruleset.pricing)  # fmt: skip
    path = tmp_path / "fleet.jsonl"
    with open(path, "wb") as out:
        write_replay(records, out)
    messages = list(file_records(path))
    models = tmp_path / "models"
    models.mkdir()
    (models / "gpu.pkl").write_bytes(pickle.dumps(_RunsCode(str(tmp_path / "ran"))))
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        publish(broker.bootstrap, messages)
        env = worker_env(broker.bootstrap, tmp_path / "data", ROOT / "rules", PARTITIONS,
                         BURNWATCH_MODEL_DIR=str(models), BURNWATCH_MODEL_RETRAIN_EVERY="5s",
                         BURNWATCH_MODEL_TRAIN_SINCE="14h")  # fmt: skip
        worker = WorkerProcess(env, tmp_path / "worker.log").start()
        try:
            worker.wait_until(lambda h: h["events"] >= count_events(messages), timeout=180)
            assert "rules only" in worker.wait_for_log('"model_absent"', timeout=10)
            refused = json.loads(worker.wait_for_log('"model_refused"', timeout=10))
            # the first that trained a model: one the schedule ran before the last batches were
            # stored (their write lags their detection) reads too little, and the next tries again
            published = json.loads(worker.wait_for_log('"model_published"', timeout=120))
            retrained = _last_before(worker, '"model_retrained"', '"model_published"')
            loaded = json.loads(worker.wait_for_log('"model_loaded"', timeout=60, after='"model_published"'))
        finally:
            assert worker.stop() == 0, worker.tail()
    assert retrained["groups"] and set(retrained["groups"]) <= set(loaded["groups"])
    assert published["groups"] == sorted(retrained["groups"])  # for the group's other workers to take
    assert "gpu.pkl: a model file in the old pickle format" in refused["errors"][0]
    assert "retrain with `burnwatch model train`" in refused["errors"][0]
    assert not (tmp_path / "ran").exists()
    artifacts, _ = ModelSet.read(models)
    assert set(artifacts.artifacts) == set(retrained["groups"])
    for artifact in artifacts.artifacts.values():
        assert artifact.samples >= MIN_SAMPLES and artifact.trained_to > artifact.trained_from


def _last_before(worker: WorkerProcess, text: str, before: str) -> dict:
    """The last line of the worker's log containing ``text`` above the first containing ``before``."""
    found = None
    for line in worker.log_path.read_text(errors="replace").splitlines():
        if before in line:
            break
        if text in line:
            found = line
    assert found is not None, worker.tail()
    return json.loads(found)


_PUBLISH = """
import sys
from pathlib import Path
from detector.model.forest import ModelArtifact
from detector.store import Store
store = Store.open("chdb://" + sys.argv[1])
artifact = ModelArtifact.read(Path(sys.argv[2]))
store.models.publish({artifact.group: (artifact.trained_to, Path(sys.argv[2]).read_bytes())}, version=1)
store.close()
"""


def test_a_worker_that_does_not_train_scores_with_what_the_group_published(tmp_path: Path):
    """The group's retraining worker published a model to the store; a worker started without
    retraining (and an empty model folder) takes it before its first event and loads it."""
    rows = np.random.default_rng(3).normal(size=(300, len(feature_names("gpu"))))
    published = fit("gpu", rows, trained_from=0.0, trained_to=7200.0, n_estimators=10, max_samples=64)
    published.save(tmp_path / "published")
    data = tmp_path / "data"
    data.mkdir()
    subprocess.run([sys.executable, "-c", _PUBLISH, str(data / "clickhouse"), str(tmp_path / "published" / "gpu.skops")],
                   cwd=ROOT, check=True, capture_output=True, timeout=120)  # fmt: skip  # its own chdb engine
    models = tmp_path / "models"
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        env = worker_env(broker.bootstrap, data, ROOT / "rules", PARTITIONS, BURNWATCH_MODEL_DIR=str(models))
        worker = WorkerProcess(env, tmp_path / "worker.log").start()
        try:
            taken = json.loads(worker.wait_for_log('"model_taken"', timeout=120))
            loaded = json.loads(worker.wait_for_log('"model_loaded"', timeout=30, after='"model_taken"'))
            # the model loads before Faust starts and installs its SIGTERM handler: a stop sent in
            # between ends the process by the signal (-15), so stop the worker once it is running
            worker.wait_until(lambda h: h["partitions"] > 0, timeout=120)
        finally:
            assert worker.stop() == 0, worker.tail()
    assert taken["groups"] == ["gpu"] and loaded["groups"] == ["gpu"]
    assert ModelSet.load(models).get("gpu").threshold == published.threshold
