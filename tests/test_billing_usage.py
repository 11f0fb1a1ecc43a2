"""The bill's usage as usage events (``ingest focus --publish-usage``): billed resources
without telemetry and commitments reach the stream's detectors through the real decoder."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from detector.backtest import backtest
from detector.billing.focus import read_focus
from detector.billing.usage import COMMITMENT, usage_records
from detector.events import TOPIC_RESOURCE_USAGE, EventDecoder
from detector.simulate import SimConfig, build
from detector.simulate_focus import simulate_focus, write_focus

CFG = SimConfig(hours=54, training_hosts=2, notebooks=12, seed=5)
"""Two whole days and six hours: the Savings Plan leaves 20-30 % of its cost unused each whole day."""


@pytest.fixture(scope="module")
def bill(ruleset, tmp_path_factory):
    sim = simulate_focus(CFG, ruleset.pricing)
    table = read_focus(write_focus(sim, tmp_path_factory.mktemp("bill") / "bill.parquet"))
    return sim, table


def test_only_resources_without_telemetry_are_published_at_their_billed_cost(bill, ruleset):
    sim, table = bill
    fleet = build(CFG, ruleset.pricing)
    stores = {s.resource_id for s in fleet.stores}
    telemetry = {r.resource_id for r in fleet.gpu_resources + fleet.cpu_resources}  # the stores send none here
    decoder = EventDecoder()
    events = [e for _, _, value in usage_records(table, telemetry) for e in decoder.decode(TOPIC_RESOURCE_USAGE, value)]
    published = {e.resource_id for e in events if e.resource_type != COMMITMENT}
    assert published == stores
    for rid in stores:  # each store's events add up to what the bill charged it
        billed = sum(Decimal(str(r["EffectiveCost"])) for r in sim.rows
                     if r["ResourceId"] == rid and r["ChargeCategory"] == "Usage")  # fmt: skip
        assert sum(e.cost_usd or 0.0 for e in events if e.resource_id == rid) == pytest.approx(float(billed), rel=1e-9)
        assert all(e.extra.get("billed_from") == "focus" for e in events if e.resource_id == rid)


def test_a_partly_unused_commitment_alerts_through_backtest(bill, ruleset, tmp_path):
    sim, table = bill
    fleet = build(CFG, ruleset.pricing)
    telemetry = {r.resource_id for r in fleet.gpu_resources + fleet.cpu_resources} | {s.resource_id for s in fleet.stores}
    path = tmp_path / "published.jsonl"
    with open(path, "w") as out:
        for topic, key, value in usage_records(table, telemetry):
            out.write(json.dumps({"topic": topic, "key": key, "value": json.loads(value)}) + "\n")
    result = backtest(path, ruleset)
    assert result.invalid == []
    whole_days = CFG.start + 2 * 86_400.0  # the last six hours are no whole day: not judged yet
    unused = sum(float(r["EffectiveCost"]) for r in sim.rows if r["CommitmentDiscountStatus"] == "Unused"
                 and r["ChargeCategory"] == "Usage" and r["ChargePeriodStart"].timestamp() < whole_days)  # fmt: skip
    (alert,) = [a for a in result.alerts if a.type == "unused_commitment"]
    assert alert.resource_id == sim.commitment_id
    assert alert.waste_usd == pytest.approx(unused, rel=1e-6)  # the bill's unused dollars, to the cent


def test_a_tag_no_event_can_carry_is_left_out_not_the_dollars(tmp_path):
    """A bill's tag value over the contract's 4,096 characters made the resource's billed-usage event refused
    by the worker's decoder, its dollars with it: the tag is left out of the event (the stored bill keeps it)."""
    import csv
    from pathlib import Path

    fixture = Path(__file__).parent / "data" / "focus" / "charges-1.2.csv"
    with fixture.open(newline="") as f:
        rows = list(csv.DictReader(f))
    rows[1]["Tags"] = json.dumps({"team": "nlp", "notes": "x" * 5000})
    path = tmp_path / "bill.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    records = [r for r in usage_records(read_focus(path), set()) if r[1] == rows[1]["ResourceId"]]
    assert records
    decoder = EventDecoder(clock=lambda: 2e9)
    for topic, _, value in records:
        (event,) = decoder.decode(topic, value)
        assert event.tags == {"team": "nlp"} and event.cost_usd == pytest.approx(float(rows[1]["EffectiveCost"]))


def test_a_usage_charge_over_no_time_is_not_published_and_is_counted(tmp_path):
    """Its dollars over no time made an event of a rate the worker refuses (dead-lettered): left out, and counted
    for the command to say; the charge itself is stored with the bill."""
    import csv
    from pathlib import Path

    from detector.billing.usage import over_no_time

    fixture = Path(__file__).parent / "data" / "focus" / "charges-1.2.csv"
    with fixture.open(newline="") as f:
        rows = list(csv.DictReader(f))
    rows[1]["ChargePeriodEnd"] = rows[1]["ChargePeriodStart"]
    path = tmp_path / "bill.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    table = read_focus(path)
    assert table.num_rows == len(rows) and over_no_time(table) == 1
    published = {key for _, key, _ in usage_records(table, set())}
    assert rows[1]["ResourceId"] not in published and rows[0]["ResourceId"] in published
