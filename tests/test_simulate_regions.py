"""The simulator's region and build-or-call workloads: the rest of the fleet unchanged, labels
on the injections only (never on the hard negatives), and the rules finding exactly them."""

from __future__ import annotations

import json

import pytest

from detector.backtest import backtest
from detector.evaluate import score
from detector.simulate import SimConfig, simulate
from detector.simulate_regions import HISTORY_DAYS
from tests.helpers import T0, fleet_file

SMALL = dict(hours=3, training_hosts=2, notebooks=1, inference_endpoints=1, buckets=1, vector_dbs=1, cpu_instances=1,
             seed=3)  # fmt: skip
ONLY = dict(training_hosts=0, notebooks=0, inference_endpoints=0, buckets=0, vector_dbs=0, cpu_instances=0)
LABELLED = {"tokyo-p4d": "wrong_region", "ireland-g5": "wrong_region", "light-endpoint": "build_or_call",
            "heavy-api": "build_or_call"}  # fmt: skip
HARD_NEGATIVES = {"short-tokyo-p4d", "heavy-data-tokyo-g5", "oregon-p4d", "small-gap-g5", "busy-endpoint",
                  "small-api"}  # fmt: skip


def _records(cfg: SimConfig, ruleset) -> list[str]:
    records, _ = simulate(cfg, ruleset.pricing)
    return [json.dumps(r, sort_keys=True, default=str) for r in records]


@pytest.mark.parametrize("messy", [False, True])
def test_the_rest_of_the_fleet_is_byte_identical_with_choices_added(ruleset, messy):
    make = SimConfig.messy if messy else SimConfig
    without = _records(make(**SMALL), ruleset)
    with_choices = _records(make(**SMALL, choices=1), ruleset)
    assert len(with_choices) > len(without)
    assert [r for r in with_choices if '"choice-' not in r] == without


def test_labels_are_on_the_injections_only_with_a_week_of_history(ruleset):
    records, labels = simulate(SimConfig(hours=24, seed=4, choices=2, **ONLY), ruleset.pricing)
    kinds = {(lb.resource_id.split("-", 2)[2], lb.type) for lb in labels}
    assert kinds == set(LABELLED.items())
    assert len(labels) == 2 * len(LABELLED)  # each set labels its own
    first = min(r[0] for r in records)
    assert first <= T0 - (HISTORY_DAYS - 1) * 86_400  # usage from before the fleet's start
    for lb in labels:
        assert lb.waste_usd > 0 and lb.start < T0


def test_the_rules_find_exactly_the_labelled_workloads(ruleset, tmp_path):
    cfg = SimConfig(hours=24, seed=9, choices=1, **ONLY)
    path, labels = fleet_file(tmp_path / "fleet.jsonl", cfg, ruleset.pricing)
    alerts = [a for a in backtest(path, ruleset).alerts if a.type in ("wrong_region", "build_or_call")]
    assert {a.resource_id.split("-", 2)[2] for a in alerts}.isdisjoint(HARD_NEGATIVES)
    scores = score(alerts, labels)
    for rule_type in ("wrong_region", "build_or_call"):
        s = scores[rule_type]
        assert (s.labels, s.found, s.alerts, s.true_alerts) == (2, 2, 2, 2), rule_type
        assert s.median_error is not None and s.median_error < 0.01
