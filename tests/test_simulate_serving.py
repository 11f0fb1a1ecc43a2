"""The simulator's serving endpoints: valid events, ground truth from their figures, a fleet otherwise
unchanged by their presence, and the serving rules finding the labelled ones and none of the look-alikes."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from detector.backtest import backtest
from detector.evaluate import score
from detector.events import EventDecoder, UsageEvent
from detector.simulate import SimConfig, simulate
from detector.simulate_serving import HISTORY_S, KINDS, serving_endpoints
from tests.helpers import T0, fleet_file

HOUR = 3600.0
SMALL = {"hours": 6.0, "training_hosts": 2, "notebooks": 1, "inference_endpoints": 1, "buckets": 1, "vector_dbs": 1,
         "cpu_instances": 1, "seed": 3}  # fmt: skip
ONLY = {"training_hosts": 0, "notebooks": 0, "inference_endpoints": 0, "buckets": 0, "vector_dbs": 0,
        "cpu_instances": 0}  # fmt: skip
TYPES = ("inference_scale_to_zero", "inference_unbatched", "spot_without_redundancy")


def _records(cfg: SimConfig, ruleset) -> list[str]:
    records, _ = simulate(cfg, ruleset.pricing)
    return [json.dumps(r, sort_keys=True, default=str) for r in records]


@pytest.mark.parametrize("messy", [False, True])
def test_the_rest_of_the_fleet_is_byte_identical_with_endpoints_added(ruleset, messy):
    make = SimConfig.messy if messy else SimConfig
    without = _records(make(**SMALL), ruleset)
    with_serving = _records(make(**SMALL, serving_endpoints=len(KINDS)), ruleset)
    assert len(with_serving) > len(without)
    assert [r for r in with_serving if "serving-" not in r] == without


def _events(ruleset, n: int = len(KINDS), hours: float = 8.0) -> tuple[list, list]:
    records, labels = simulate(SimConfig(hours=hours, seed=5, serving_endpoints=n, **ONLY), ruleset.pricing)
    decoder = EventDecoder(clock=lambda: T0 + 10 * 86_400)
    events = [e for _, topic, _, value in records for e in decoder.decode(topic, json.dumps(value).encode())]
    return events, labels


def test_events_keep_the_contract_and_labels_follow_the_kinds(ruleset):
    events, labels = _events(ruleset)
    assert events  # every record decoded (the decoder raises on a bad one)
    kinds = {f"serving-{i:03d}": kind for i, kind in enumerate(KINDS)}
    labelled = {(label.type, kinds[label.resource_id]) for label in labels}
    assert labelled == {("inference_scale_to_zero", "nightly"), ("inference_unbatched", "unbatched"),
                        ("inference_unbatched", "uncached"), ("spot_without_redundancy", "spot_single"),
                        ("spot_without_redundancy", "spot_one_zone")}  # fmt: skip
    # The schedule kinds have a week of history before the fleet's start; the rest start with it.
    first = {}
    for e in events:
        first.setdefault(e.resource_id, e.t)
    assert first["serving-000"] == T0 - HISTORY_S and first["serving-002"] == T0


def test_the_nightly_label_is_its_hours_without_a_request(ruleset):
    events, labels = _events(ruleset)
    (label,) = [lb for lb in labels if lb.type == "inference_scale_to_zero"]
    hours: dict[float, int] = {}
    price = 0.0
    for e in events:
        if isinstance(e, UsageEvent) and e.resource_id == label.resource_id:
            hours[e.t - e.t % HOUR] = hours.get(e.t - e.t % HOUR, 0) + (e.requests or 0)
            price = e.cost_usd * HOUR / e.interval_s
    idle = [h for h, n in hours.items() if n == 0]
    assert label.waste_usd == pytest.approx(len(idle) * price, rel=1e-4)
    # Every weekend hour is idle; a weekday's idle hours are at night only.
    for h in idle:
        d = datetime.fromtimestamp(h, tz=timezone.utc)
        assert d.weekday() >= 5 or d.hour >= 19 or d.hour < 8


def test_the_busy_at_night_look_alike_has_requests_every_interval(ruleset):
    events, _ = _events(ruleset)
    night_busy = [e for e in events if isinstance(e, UsageEvent) and e.resource_id == "serving-001"]
    assert night_busy and all(e.requests for e in night_busy)


def test_the_serving_rules_find_the_labelled_endpoints_and_no_look_alike(ruleset, tmp_path):
    cfg = SimConfig(hours=8.0, seed=9, serving_endpoints=2 * len(KINDS), **ONLY)
    path, labels = fleet_file(tmp_path / "fleet.jsonl", cfg, ruleset.pricing)
    result = backtest(path, ruleset)
    scores = score(result.alerts, labels)
    for rule_type in TYPES:
        s = scores[rule_type]
        assert s.labels >= 2 and (s.found, s.alerts, s.true_alerts) == (s.labels,) * 3, rule_type
    assert {a.type for a in result.alerts} <= set(TYPES)  # nothing else fires on these endpoints
    assert scores["inference_unbatched"].median_error < 0.1


def test_endpoints_are_drawn_from_their_own_stream(ruleset):
    a = serving_endpoints(10, 1, T0, T0 + HOUR, ruleset.pricing)
    b = serving_endpoints(10, 1, T0, T0 + HOUR, ruleset.pricing)
    c = serving_endpoints(10, 2, T0, T0 + HOUR, ruleset.pricing)
    assert a == b and a != c
    assert [e.kind for e in a] == list(KINDS)
