"""Backtest over a simulated fleet: every labelled episode found once, with its dollars, and nothing else."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from detector.backtest import backtest
from detector.simulate import SimConfig
from tests.conftest import ROOT
from tests.helpers import fleet_file


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, ruleset):
    return fleet_file(tmp_path_factory.mktemp("fleet") / "fleet.jsonl",
                      SimConfig(hours=30, training_hosts=10, notebooks=6, seed=11), ruleset.pricing)  # fmt: skip


@pytest.fixture(scope="module")
def small(tmp_path_factory, ruleset):
    """A smaller fleet (half the hosts, over a day still) whose alerts are every labelled type: for the
    tests that compare two ways of detecting over it, not the labels."""
    path, labels = fleet_file(tmp_path_factory.mktemp("small") / "small.jsonl",
                              SimConfig(hours=26, training_hosts=5, notebooks=3, seed=11), ruleset.pricing)  # fmt: skip
    return path, {label.type for label in labels}


def match(alerts, labels):
    """Pair each label with the alerts whose episode overlaps it on the same resource."""
    return {id(label): [a for a in alerts if a.type == label.type and a.resource_id == label.resource_id
                        and label.start <= a.fired_at <= label.end]
            for label in labels}  # fmt: skip


def test_every_labelled_episode_alerts_exactly_once_with_its_dollars(fleet, ruleset):
    path, labels = fleet
    assert len(labels) >= 20
    result = backtest(path, ruleset)
    assert result.invalid == []
    pairs = match(result.alerts, labels)
    for label in labels:
        found = pairs[id(label)]
        assert len(found) == 1, (label.to_json(), [a.to_json() for a in found])
        assert found[0].waste_usd == pytest.approx(label.waste_usd, rel=0.10)
    matched = {a.alert_id for alerts in pairs.values() for a in alerts}
    assert [a.to_json() for a in result.alerts if a.alert_id not in matched] == []  # no alert on busy resources


def test_cli_json_output(fleet):
    path, labels = fleet
    out = subprocess.run(
        [sys.executable, "-m", "streams.cli", "backtest", str(path), "--json"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(records) == len(labels)
    types = {"idle_gpu", "stuck_gpu", "telemetry_stale", "untagged", "egress_runaway", "failed_run_spend",
             "vector_db_growth", "storage_growth", "inference_overprovisioned", "spot_eligible", "partly_idle_gpu"}
    assert {r["type"] for r in records} == {label.type for label in labels} == types
    required = {"alert_id", "type", "resource_id", "episode_start", "fired_at", "resolved_at", "waste_usd",
                "usd_per_hour", "tags", "severity"}  # fmt: skip
    for record in records:
        assert required <= record.keys()
        assert record["fired_at"].endswith("Z")
    assert any(r["resolved_at"] is None for r in records) and any(r["resolved_at"] for r in records)


def test_malformed_replay_line_names_file_and_line(tmp_path, ruleset):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"topic": "gpu-metrics", "key": "h", "value": {}}\nnot json\n')
    out = subprocess.run([sys.executable, "-m", "streams.cli", "backtest", str(path)], capture_output=True, text=True)
    assert out.returncode != 0
    assert f"{path}:2: not a replay record" in out.stderr


def test_history_in_clickhouse_gives_the_alerts_of_the_replay(small, ruleset, store):
    """`backtest --since`: the events the worker stored, read back an hour at a time."""
    from detector.backtest import backtest_store
    from detector.events import EventDecoder
    from detector.replay import read_replay
    from detector.store import EventBatch

    path, types = small
    decoder = EventDecoder()
    batch = EventBatch()
    for _, record in read_replay(path):
        batch.extend(decoder.decode(record.topic, bytes(record.value)))
    store.events.insert(batch)
    from_file = backtest(path, ruleset)
    assert len(from_file.alerts) >= 20 and {a.type for a in from_file.alerts} == types  # every labelled type
    from_store = backtest_store(store.history, 27 * 3600, ruleset)  # the fleet spans 26 h
    assert from_store.events == len(batch)
    assert [a.to_json() for a in from_store.alerts] == [a.to_json() for a in from_file.alerts]
    last_day = backtest_store(store.history, 6 * 3600, ruleset)  # only the last six hours of event time
    assert 0 < last_day.events < len(batch) and last_day.span[1] - last_day.span[0] <= 6 * 3600


def test_compare_prints_what_a_rules_change_adds_and_removes(small, tmp_path):
    path, _ = small
    stricter = tmp_path / "rules"
    stricter.mkdir()
    for name in ("rules.yaml", "pricing.yaml", "routing.yaml"):
        text = (ROOT / "rules" / name).read_text()
        (stricter / name).write_text(text.replace("for: 30m           # sustained", "for: 2h           # sustained"))
    out = subprocess.run(
        [sys.executable, "-m", "streams.cli", "backtest", str(path), "--compare", str(stricter), "--json"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    changes = [json.loads(line) for line in out.stdout.splitlines()]
    assert changes and {c["change"] for c in changes} == {"removed"}  # waiting longer only drops alerts
    assert {c["type"] for c in changes} == {"idle_gpu"}
    assert all(c["episode_start"] < c["fired_at"] for c in changes)


@pytest.mark.parametrize(("change", "said"), [(-5.0, "-$5.00"), (1234.5, "+$1,234.50"), (0.0, "$0.00"),
                                              (0.004, "under $0.01")])  # fmt: skip
def test_compare_says_the_dollars_of_the_alerts_both_find_as_money(capsys, change, said):
    """A rules change that shortens the kept alerts' episodes printed "their dollars change by $-5.00"."""
    from detector.alerts import Alert
    from detector.backtest import RuleDiff
    from streams.cli import _print_comparison

    def one(usd: float) -> Alert:
        return Alert(alert_id="a", type="idle_gpu", rule="idle-gpu", resource_id="h", status="firing", change="fired",
                     severity="warning", episode_start=0.0, fired_at=60.0, updated_at=60.0, waste_usd=usd)  # fmt: skip

    _print_comparison(RuleDiff(added=[], removed=[], kept=[(one(10.0), one(10.0 + change))]), as_json=False)
    assert f"(their dollars change by {said})." in capsys.readouterr().out
