"""The simulator's training hosts: a fleet otherwise unchanged by them, events the contract
accepts, every kind of job and its look-alikes drawn, and labels the shipped rules find."""

from __future__ import annotations

import json

import msgspec
import pytest

from detector.backtest import backtest
from detector.evaluate import score
from detector.events import TOPIC_RESOURCE_USAGE, TOPIC_RUN_EVENTS, EventDecoder
from detector.simulate import SimConfig, simulate
from detector.simulate_training import training_hosts
from tests.helpers import T0, fleet_file

HOUR = 3600.0
SMALL = {"hours": 6.0, "training_hosts": 2, "notebooks": 1, "inference_endpoints": 1, "buckets": 1, "vector_dbs": 1,
         "cpu_instances": 1, "seed": 3}  # fmt: skip
ONLY = {"training_hosts": 0, "notebooks": 0, "inference_endpoints": 0, "buckets": 0, "vector_dbs": 0,
        "cpu_instances": 0}  # fmt: skip


@pytest.mark.parametrize("messy", [False, True])
def test_the_rest_of_the_fleet_is_byte_identical_with_training_hosts_added(ruleset, messy):
    make = SimConfig.messy if messy else SimConfig
    without = [json.dumps(r, sort_keys=True, default=str) for r in simulate(make(**SMALL), ruleset.pricing)[0]]
    records, labels = simulate(make(**SMALL, training_jobs=2), ruleset.pricing)
    added = [json.dumps(r, sort_keys=True, default=str) for r in records]
    assert len(added) > len(without)
    assert [r for r in added if "train-host-" not in r] == without


def test_events_are_the_contract_and_carry_gauges_and_metrics(ruleset):
    records, _ = simulate(SimConfig(**SMALL, training_jobs=2), ruleset.pricing)
    decoder = EventDecoder(clock=lambda: 2e9)
    gauges, metrics = set(), set()
    for _, topic, _, value in records:
        for event in decoder.decode(topic, msgspec.json.encode(value)):
            if topic == TOPIC_RESOURCE_USAGE and event.resource_id.startswith("train-host-"):
                gauges |= set(event.metrics)
            if topic == TOPIC_RUN_EVENTS and event.metrics:
                metrics |= set(event.metrics)
                assert event.step is not None
    assert "cpu_util_pct" in gauges <= {"cpu_util_pct", "disk_busy_pct", "network_util_pct"}
    assert "val_loss" in metrics


def test_every_kind_is_drawn_with_its_look_alikes(ruleset):
    hosts = training_hosts(6, 1, T0, T0 + 48 * HOUR, 30.0, ruleset.pricing)
    modes = {s.mode for h in hosts for s in h.stretches}
    assert {"saw", "low", "small", "healthy", "idle"} <= modes
    labels = [lb for h in hosts for lb in h.labels]
    assert {lb.type for lb in labels} == {"data_starved_training", "plateaued_run", "idle_gpu"}
    # the plateau's runs and the slowly improving and noisy ones: more runs than plateau labels
    runs = {r[3]["run_id"] for h in hosts for r in h.runs}
    assert len(runs) > 2 * sum(lb.type == "plateaued_run" for lb in labels)
    for lb in labels:
        assert lb.end > lb.start and lb.waste_usd > 0


def test_the_shipped_rules_find_the_labels_and_nothing_else(tmp_path, ruleset):
    cfg = SimConfig.messy(hours=24, seed=9, training_jobs=3, **ONLY)
    path, labels = fleet_file(tmp_path / "training.jsonl", cfg, ruleset.pricing)
    result = backtest(path, ruleset)
    assert result.invalid == []
    scores = score(result.alerts, labels)
    for rule_type in ("data_starved_training", "plateaued_run"):
        s = scores[rule_type]
        assert s.labels > 0 and s.found == s.labels and s.true_alerts == s.alerts, s.to_json()
        assert s.median_error is not None and s.median_error < 0.1
    assert set(scores) == {"data_starved_training", "plateaued_run", "idle_gpu"}


def test_cli_simulate_adds_training_hosts(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    out, labels = tmp_path / "fleet.jsonl", tmp_path / "labels.jsonl"
    subprocess.run([sys.executable, "-m", "streams.cli", "simulate", "--hours", "12", "--hosts", "0", "--notebooks",
                    "0", "--inference", "0", "--training-jobs", "2", "--out", str(out), "--labels", str(labels)],
                   cwd=ROOT, check=True, capture_output=True)  # fmt: skip
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["key"] for r in records if r["topic"] == "gpu-metrics"} == {"train-host-000", "train-host-001"}
    types = {json.loads(line)["type"] for line in labels.read_text().splitlines()}
    assert {"data_starved_training", "plateaued_run"} <= types
