"""The worker with the anomaly model: it starts with rules only, retrains on schedule from
what it stored (holding partition 0, it is the one that trains), publishes the artifacts for
the group's other workers and picks them up; on the embedded broker and ClickHouse.
(Scoring in the stream is the engine's, tested in test_model.py; the demo ran it.)"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from detector.model.forest import ModelSet
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
            retrained = json.loads(worker.wait_for_log('"model_retrained"', timeout=120))
            published = json.loads(worker.wait_for_log('"model_published"', timeout=60))
            loaded = json.loads(worker.wait_for_log('"model_loaded"', timeout=60, after='"model_retrained"'))
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
