"""Prices and owners from the bill: events without ``cost_usd`` are priced at what the bill
charged, and the bill's tags fill in what the events lack, in backtest as in the worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.backtest import backtest
from detector.billing.agreement import agreement
from detector.billing.focus import read_focus
from detector.billing.ingest import ingest_files
from detector.billing.rates import BilledRates
from detector.events import UsageEvent
from detector.pricing import Pricer
from detector.simulate import SimConfig, build
from detector.simulate_focus import simulate_focus, write_focus
from tests.helpers import at, fleet_file

FIXTURE = Path(__file__).parent / "data" / "focus" / "charges-1.2.csv"
CFG = SimConfig(hours=30, training_hosts=6, notebooks=8, seed=9)


def usage(rid: str, t: float, **kw) -> UsageEvent:
    fields = {"resource_type": "instance", "instance_type": "p5.48xlarge", "region": "us-east-1", **kw}
    return UsageEvent(ts=at(t), resource_id=rid, interval_s=3600.0, **fields)


def test_a_resource_is_priced_at_its_billed_rate_then_its_kind_then_the_price_list(ruleset):
    billed = BilledRates.from_table(read_focus(FIXTURE))
    pricer = Pricer(ruleset.pricing, billed)
    t = at(0).replace(year=2026, month=11, day=3, hour=10, minute=30).timestamp()
    # the bill's own rate for this resource and hour (on demand, billed 98.32 for one hour)
    assert pricer.cost(usage("i-0abc", t)).usd == pytest.approx(98.32)
    # covered by a Savings Plan: the committed rate, not the list price
    assert pricer.cost(usage("i-0def", t)).usd == pytest.approx(40.125)
    # newer than the bill: its latest billed rate (a bill lags by hours to a day)
    assert pricer.cost(usage("i-0abc", t + 86_400)).usd == pytest.approx(98.32)
    # the bill knows the instance type in this region on demand, not the resource
    assert pricer.cost(usage("i-new", t)).usd == pytest.approx(98.32)
    # nothing billed like it: the price list
    listed = ruleset.pricing.hourly("p5.48xlarge", "spot")
    assert pricer.cost(usage("i-new", t, pricing="spot")).usd == pytest.approx(listed)
    # an exporter's cost_usd always wins
    assert pricer.cost(usage("i-0abc", t, cost_usd=1.5)).usd == 1.5


def test_the_stored_bill_gives_the_rates_the_files_give(store, ruleset, tmp_path):
    sim = simulate_focus(CFG, ruleset.pricing)
    path = write_focus(sim, tmp_path / "bill.parquet")
    ingest_files(store, path)
    from_files, from_store = BilledRates.from_table(read_focus(path)), BilledRates.from_store(store)
    assert len(from_store) == len(from_files) > 0
    stores = {s.resource_id for s in build(CFG, ruleset.pricing).stores}  # billed per GB-month: no hourly rate
    for rid, hour in [k for k in sim.rates if k[0] not in stores][::7]:
        assert from_store.hourly(rid, hour + 60) == pytest.approx(from_files.hourly(rid, hour + 60), rel=1e-9)
        assert from_store.hourly(rid, hour + 60) == pytest.approx(sim.rates[(rid, hour)], rel=1e-6)


@pytest.fixture(scope="module")
def fleet_and_bill(ruleset, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("billed")
    path, _ = fleet_file(tmp / "fleet.jsonl", CFG, ruleset.pricing)
    sim = simulate_focus(CFG, ruleset.pricing)
    return path, sim, BilledRates.from_table(read_focus(write_focus(sim, tmp / "bill.parquet")))


@pytest.fixture(scope="module")
def replayed(fleet_and_bill, ruleset):
    """The fleet's alerts from backtest without the bill and with it: once for the module (two
    tests read both; each backtest of this 30 h fleet is seconds of CPU)."""
    path, _, billed = fleet_and_bill
    return backtest(path, ruleset).alerts, backtest(path, ruleset, billed=billed).alerts


def test_alert_dollars_agree_with_the_bill_once_it_is_in(fleet_and_bill, replayed, ruleset):
    """The issue's check: for resources that have both, alert dollars within 1 % of billed.
    Without the bill, the list-priced resources' alerts are off by the discount or commitment."""
    _, sim, _ = fleet_and_bill
    plain, billed_alerts = replayed
    fleet = build(CFG, ruleset.pricing)
    list_priced = {r.resource_id for r in fleet.gpu_resources + fleet.cpu_resources if not r.send_cost}

    with_bill = agreement(billed_alerts, sim.rates)
    assert with_bill.checked > 0, "the fleet must have full-cost alerts on billed resources to check"
    assert with_bill.off == []
    without = agreement(plain, sim.rates)
    assert {rid for _, rid, _, _ in without.off} and {rid for _, rid, _, _ in without.off} <= list_priced


def test_untagged_alerts_only_what_is_untagged_in_the_bill_too(fleet_and_bill, replayed):
    _, sim, _ = fleet_and_bill
    plain, billed_alerts = replayed
    tagged_in_bill = {r["ResourceId"] for r in sim.rows if r["Tags"] and "team" in r["Tags"] and "project" in r["Tags"]}
    before = {a.resource_id for a in plain if a.type == "untagged"}
    after = {a.resource_id for a in billed_alerts if a.type == "untagged"}
    assert before & tagged_in_bill, "some resources untagged in their events must be tagged in the bill"
    assert after == before - tagged_in_bill


def test_a_resource_billed_per_gpu_and_per_core_hour_is_priced_per_hour_it_ran(store, ruleset, tmp_path):
    """A cloud that bills a VM's GPUs and cores as SKUs of their own under the VM's id (Google Cloud: an
    a2-highgpu-8g's hour is 8 GPU-hours and 96 core-hours, its memory GiB-hours) states ConsumedQuantity in
    those units. The rate was the hour-unit dollars over the hour-unit quantities, $32.42 / 104 = $0.31 an
    hour for a $32.42 hour, so every idle-GPU alert on it said a hundredth of what it burned. A period bills
    no more hours of one resource than it lasts; fewer (a host up 9 hours of a day) still count as stated.
    The stored bill gives the same rate as the file."""
    import csv

    with FIXTURE.open(newline="") as f:
        first = next(csv.DictReader(f))
    vm = {**first, "ResourceId": "a2-node-1", "ProviderName": "Google Cloud", "x_UsageType": "", "Tags": ""}
    rows = [{**vm, "SkuId": "GPU", "ConsumedQuantity": "8", "ConsumedUnit": "hour", "EffectiveCost": "29.39",
             "BilledCost": "29.39"},
            {**vm, "SkuId": "CORE", "ConsumedQuantity": "96", "ConsumedUnit": "hour", "EffectiveCost": "3.03",
             "BilledCost": "3.03"},
            {**vm, "SkuId": "RAM", "ConsumedQuantity": "680", "ConsumedUnit": "gibibyte hour",
             "EffectiveCost": "2.7", "BilledCost": "2.7"},
            {**vm, "ResourceId": "a2-node-2", "ChargePeriodStart": "2026-11-03T00:00:00Z",  # a day's charge, up 9 h
             "ChargePeriodEnd": "2026-11-04T00:00:00Z", "ConsumedQuantity": "9", "ConsumedUnit": "hour",
             "EffectiveCost": "90", "BilledCost": "90"}]  # fmt: skip
    path = tmp_path / "gcp.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(first))
        writer.writeheader()
        writer.writerows(rows)
    ingest_files(store, path)
    t = at(0).replace(year=2026, month=11, day=3, hour=10, minute=30).timestamp()
    for billed in (BilledRates.from_table(read_focus(path)), BilledRates.from_store(store)):
        assert billed.hourly("a2-node-1", t) == pytest.approx(32.42)
        assert billed.hourly("a2-node-2", t) == pytest.approx(10.0)


def test_an_instance_types_rate_is_per_instance_hour_where_one_id_bills_several(ruleset, tmp_path):
    """The rate the bill shows for an instance type prices a resource the bill does not know yet, as the
    price list would: per instance-hour. An EC2 capacity reservation bills its unused instances under its
    own id (UnusedBox:p5.48xlarge, 3 hours an hour of 8 reserved, 5 in use under their instances' ids); a
    SageMaker endpoint its instances under the endpoint's. Capping that id's hours at the hour's length
    (what its own rate needs, a VM's SKUs being units of its hour) made the type's rate $786.56 over 6
    hours, $131.09 where every instance-hour cost $98.32: a new p5's events, and their waste, a third over
    the bill."""
    import csv

    with FIXTURE.open(newline="") as f:
        first = next(csv.DictReader(f))
    running = [{**first, "ResourceId": f"i-0run{i}"} for i in range(5)]
    unused = {**first, "ResourceId": "cr-0p5", "x_UsageType": "USE1-UnusedBox:p5.48xlarge", "ConsumedQuantity": "3",
              "EffectiveCost": "294.96", "BilledCost": "294.96"}  # fmt: skip
    path = tmp_path / "reserved.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(first))
        writer.writeheader()
        writer.writerows([*running, unused])
    t = at(0).replace(year=2026, month=11, day=3, hour=10, minute=30).timestamp()
    billed = BilledRates.from_table(read_focus(path))
    assert billed.hourly("i-new", t, "p5.48xlarge", "us-east-1") == pytest.approx(98.32)
    assert Pricer(ruleset.pricing, billed).cost(usage("i-new", t)).usd == pytest.approx(98.32)


def test_an_events_tag_in_another_case_wins_over_the_bills():
    """The events tag ``Team: nlp``, the bill (a CUR's ``user:team``) ``team: vision``: the bill's key was added beside
    the event's, and the rules read their own spelling first, so the resource's alerts went to vision. The events'
    tags win in any case; the bill fills what they lack or leave empty."""
    billed = BilledRates([], tags={"i-1": {"team": "vision", "cost-center": "42", "Owner": "bob"}})
    assert billed.fill_tags("i-1", {"Team": "nlp", "owner": ""}) == {"cost-center": "42", "Owner": "bob", "Team": "nlp"}
    assert billed.fill_tags("i-1", {"TEAM": ""}) == {"team": "vision", "cost-center": "42", "Owner": "bob"}
    assert billed.fill_tags("i-2", {"Team": "nlp"}) == {"Team": "nlp"}
