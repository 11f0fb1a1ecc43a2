"""The simulated fleet's FOCUS bill: spec columns and types, the same truth as the events where
they carry cost, a bill that differs from the price list where real ones do, reproducible bytes."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections import defaultdict
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from detector.pricing import Pricing
from detector.rules import load_pricing
from detector.simulate import SimConfig, build, simulate
from detector.simulate_focus import DISCOUNT, DISCOUNT_ACCOUNT, SPOT_SPREAD, bill_of, simulate_focus, write_focus
from tests.conftest import ROOT

# FOCUS 1.2's Mandatory columns and their data types (columns/*.md of the spec), and whether nulls are allowed.
MANDATORY = {
    "BilledCost": ("Decimal", False), "BillingAccountId": ("String", False), "BillingAccountName": ("String", True),
    "BillingCurrency": ("String", False), "BillingPeriodEnd": ("Date/Time", False),
    "BillingPeriodStart": ("Date/Time", False), "ChargeCategory": ("String", False), "ChargeClass": ("String", True),
    "ChargeDescription": ("String", True), "ChargePeriodEnd": ("Date/Time", False),
    "ChargePeriodStart": ("Date/Time", False), "ContractedCost": ("Decimal", False),
    "EffectiveCost": ("Decimal", False), "InvoiceIssuerName": ("String", False), "ListCost": ("Decimal", False),
    "PricingQuantity": ("Decimal", True), "PricingUnit": ("String", True), "ProviderName": ("String", False),
    "PublisherName": ("String", False), "ServiceCategory": ("String", False), "ServiceName": ("String", False),
}  # fmt: skip
ASKED = ["SubAccountId", "ResourceId", "ResourceName", "ResourceType", "RegionId", "PricingCategory",
         "CommitmentDiscountId", "CommitmentDiscountStatus", "ConsumedQuantity", "ConsumedUnit", "SkuId", "Tags",
         "x_ServiceCode", "x_UsageType"]  # fmt: skip
CFG = SimConfig(hours=30, seed=7)


@pytest.fixture(scope="module")
def pricing() -> Pricing:
    return load_pricing(ROOT / "rules" / "pricing.yaml")


@pytest.fixture(scope="module")
def export(pricing: Pricing, tmp_path_factory: pytest.TempPathFactory) -> pa.Table:
    path = write_focus(simulate_focus(CFG, pricing), tmp_path_factory.mktemp("focus") / "bill.parquet")
    return pq.read_table(path)


def _rows(table: pa.Table) -> list[dict]:
    return table.to_pylist()


def test_simulate_output_unchanged_by_the_refactor(pricing: Pricing) -> None:
    """simulate() gives the records and labels it gave before build() was split out of it
    (digests taken from the code before the change, on these seeds)."""
    expected = {
        SimConfig(hours=8, seed=11, k8s_nodes=1): "ab2708492bae7a7384e5fa2a9ae08f05f7cbe6e8a046927267f1ce0936eb9429",
        SimConfig.messy(hours=3, seed=5): "6bb31f73457de87c4af20c75e76a332ac7e8e6b3233c23e27db6a7970c2930d7",
        SimConfig(hours=21, seed=2, training_hosts=4, notebooks=3, anomalies=True):
            "8e3201131f53c7d5a5486f863c84ea53c60574ec3a3c0ea514f12e5198d3f1d6",
    }
    for cfg, digest in expected.items():
        records, labels = simulate(cfg, pricing)
        h = hashlib.sha256()
        for record in records:
            h.update(json.dumps(record, sort_keys=True).encode())
        h.update(json.dumps([label.to_json() for label in labels], sort_keys=True).encode())
        assert h.hexdigest() == digest, cfg


def test_every_mandatory_column_with_its_type(export: pa.Table) -> None:
    kinds = {"Decimal": pa.types.is_decimal, "String": pa.types.is_string, "Date/Time": pa.types.is_timestamp}
    for name, (kind, nullable) in MANDATORY.items():
        assert name in export.column_names, name
        column = export.schema.field(name)
        assert kinds[kind](column.type), (name, column.type)
        if kind == "Date/Time":
            assert column.type.tz == "UTC", name
        if not nullable:
            assert export.column(name).null_count == 0, name
    for name in ASKED:
        assert name in export.column_names, name
    rows = _rows(export)
    assert {r["BillingCurrency"] for r in rows} == {"USD"} and {r["ProviderName"] for r in rows} == {"AWS"}
    for r in rows:
        assert r["Tags"] is None or isinstance(json.loads(r["Tags"]), dict)
        start = r["ChargePeriodStart"]
        assert start.minute == start.second == 0, r  # on the hour
        assert r["BillingPeriodStart"].day == 1 and r["BillingPeriodEnd"].day == 1
        if r["ChargeClass"] is None:  # a correction is billed in a later period than its charge
            assert r["BillingPeriodStart"] <= start < r["BillingPeriodEnd"]
    usage = [r for r in rows if r["x_ServiceCode"] == "AmazonEC2" and r["ChargeCategory"] == "Usage"
             and r["ChargeClass"] is None]  # fmt: skip
    assert {r["ConsumedUnit"] for r in usage} == {"Hours"}
    assert all(r["x_UsageType"].startswith(("BoxUsage:", "SpotUsage:")) for r in usage)
    assert all(0 < r["ConsumedQuantity"] <= 1 for r in usage)  # an hour at most; partial hours prorated
    assert {r["ServiceCategory"] for r in rows} == {"Compute", "Storage"}


def test_effective_cost_is_the_events_cost_where_they_carry_one(export: pa.Table, pricing: Pricing) -> None:
    """Per resource-day, the bill's EffectiveCost equals the sum of the usage events' cost_usd."""
    events: dict[tuple[str, str], float] = defaultdict(float)
    records, _ = simulate(CFG, pricing)
    for _, topic, _, value in records:
        for event in value if isinstance(value, list) else [value]:
            if topic == "resource-usage" and "cost_usd" in event:
                events[(event["resource_id"], event["ts"][:10])] += event["cost_usd"]
    billed: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for r in _rows(export):
        if r["ResourceId"]:
            billed[(r["ResourceId"], r["ChargePeriodStart"].strftime("%Y-%m-%d"))] += r["EffectiveCost"]
    assert len(events) > 40
    for key, usd in events.items():
        assert float(billed[key]) == pytest.approx(usd, rel=1e-6, abs=1e-9), key


def test_the_bill_differs_from_the_price_list_as_real_ones_do(export: pa.Table, pricing: Pricing) -> None:
    rows = _rows(export)
    fleet = build(CFG, pricing)
    from_list = {r.resource_id for r in fleet.gpu_resources + fleet.cpu_resources if not r.send_cost}
    # the negotiated discount, on the account's resources priced from the list
    discounted = [r for r in rows if r["SubAccountId"] == DISCOUNT_ACCOUNT and r["ResourceId"] in from_list
                  and r["PricingCategory"] == "Standard" and r["ChargeClass"] is None
                  and r["ChargePeriodStart"].day == 3]  # fmt: skip
    assert discounted
    for r in discounted:
        assert r["EffectiveCost"] == pytest.approx(r["ListCost"] * Decimal(1 - DISCOUNT), rel=Decimal("1e-9"))
    # the commitment: used at the committed rate, partly unused, its id as the unused rows' resource
    used = [r for r in rows if r["CommitmentDiscountStatus"] == "Used"]
    unused = [r for r in rows if r["CommitmentDiscountStatus"] == "Unused"]
    assert used and unused
    assert all(r["PricingCategory"] == "Committed" and r["BilledCost"] == 0 for r in used + unused)
    assert all(r["EffectiveCost"] < r["ListCost"] for r in used)
    assert all(r["ResourceId"] == r["CommitmentDiscountId"] and r["EffectiveCost"] > 0 for r in unused)
    assert {r["ResourceId"] for r in used} <= from_list
    # a credit, and one correction restating a resource-day in the next billing period
    credits = [r for r in rows if r["ChargeCategory"] == "Credit"]
    assert len(credits) == 1 and credits[0]["BilledCost"] < 0 and credits[0]["EffectiveCost"] < 0
    corrections = [r for r in rows if r["ChargeClass"] == "Correction"]
    assert len(corrections) == 1
    fix = corrections[0]
    assert fix["BillingPeriodStart"] > fix["ChargePeriodStart"] and fix["EffectiveCost"] < 0
    day = [r for r in rows if r["ResourceId"] == fix["ResourceId"] and r["ChargeClass"] is None
           and r["ChargePeriodStart"].date() == fix["ChargePeriodStart"].date()]  # fmt: skip
    list_usd = sum(r["ListCost"] for r in day)
    assert sum(r["EffectiveCost"] for r in day) == pytest.approx(list_usd)  # first billed without the discount
    assert sum(r["EffectiveCost"] for r in day) + fix["EffectiveCost"] == pytest.approx(list_usd * Decimal(1 - DISCOUNT))


def test_ground_truth_rates_add_up_to_the_bill(pricing: Pricing) -> None:
    """The truth table's effective hourly rates, times the hours run, are the bill's dollars per
    resource (corrections included, commitment fees and credits being no resource's)."""
    bill = simulate_focus(CFG, pricing)
    per_resource: dict[str, float] = defaultdict(float)
    hours: dict[tuple[str, float], float] = defaultdict(float)
    for r in bill.rows:
        rid = r["ResourceId"]
        if rid and rid != bill.commitment_id:
            per_resource[rid] += r["EffectiveCost"]
            if r["ChargeClass"] is None and r["ConsumedUnit"] == "Hours":
                hours[(rid, r["ChargePeriodStart"].timestamp())] += r["ConsumedQuantity"]
    truth: dict[str, float] = defaultdict(float)
    for (rid, h), rate in bill.rates.items():
        if (rid, h) in hours:
            truth[rid] += rate * hours[(rid, h)]
    for rid, usd in per_resource.items():
        if any(key[0] == rid for key in hours):
            assert truth[rid] == pytest.approx(usd, rel=1e-9), rid
    # One rate per instance over the span (its alerts priced at a rate learnt from the bill are priced as billed):
    # the commitment covers a host whenever it runs, the corrected day is corrected to the discounted rate.
    rates: dict[str, set[float]] = defaultdict(set)
    for (rid, _), rate in bill.rates.items():
        rates[rid].add(round(rate, 9))
    assert {rid for rid, found in rates.items() if len(found) > 1} == {
        rid for rid in rates if rid.startswith(("bucket-", "vectordb-"))}  # storage: dollars per hour grow with size


def test_spot_actuals_differ_from_the_price_list_by_host_and_day(pricing: Pricing) -> None:
    """A spot host priced from the list (its events carry no cost) is billed at spot actuals
    within ±15 % of the list's spot figure, varying from day to day."""
    fleet = build(CFG, pricing)
    host = next(r for r in fleet.gpu_resources if r.pricing == "spot")
    host.send_cost = False
    bill = bill_of(fleet, pricing)
    listed = pricing.hourly(host.instance_type, "spot")
    assert listed is not None
    rows = [r for r in bill.rows if r["ResourceId"] == host.resource_id]
    assert rows and {r["PricingCategory"] for r in rows} == {"Dynamic"}
    assert all(r["x_UsageType"] == f"SpotUsage:{host.instance_type}" for r in rows)
    by_day = {r["ChargePeriodStart"].date(): r["EffectiveCost"] / r["ConsumedQuantity"] for r in rows}
    assert len(set(by_day.values())) == len(by_day) == 2
    assert all(abs(rate / listed - 1) <= SPOT_SPREAD and rate != listed for rate in by_day.values())


def test_bill_only_tags_for_about_half_the_untagged(pricing: Pricing) -> None:
    _, labels = simulate(CFG, pricing)
    untagged = sorted({label.resource_id for label in labels if label.type == "untagged"})
    assert len(untagged) >= 2
    tags = {r["ResourceId"]: r["Tags"] for r in simulate_focus(CFG, pricing).rows if r["ResourceId"] in untagged}
    filled = [rid for rid in untagged if tags[rid].get("team") and tags[rid].get("project")]
    assert filled and len(filled) == (len(untagged) + 1) // 2


@pytest.mark.parametrize("name", ["bill.parquet", "bill.csv", "bill.csv.gz"])
def test_same_seed_same_bytes(pricing: Pricing, tmp_path: Path, name: str) -> None:
    cfg = SimConfig(hours=6, seed=3, notebooks=4, training_hosts=4)
    a = write_focus(simulate_focus(cfg, pricing), tmp_path / f"a-{name}").read_bytes()
    b = write_focus(simulate_focus(cfg, pricing), tmp_path / f"b-{name}").read_bytes()
    other = write_focus(simulate_focus(SimConfig(hours=6, seed=4, notebooks=4, training_hosts=4), pricing),
                        tmp_path / f"c-{name}").read_bytes()  # fmt: skip
    assert a == b and a != other
    if name.endswith(".gz"):
        assert a[4:8] == bytes(4)  # no write time in the gzip header: the same bytes on another day


def test_billed_hours_are_the_running_hours(export: pa.Table, pricing: Pricing) -> None:
    """Each instance is billed for the minutes its events say it ran (stopped time is not billed)."""
    running: dict[str, float] = defaultdict(float)
    records, _ = simulate(CFG, pricing)
    for _, topic, _, value in records:
        for event in value if isinstance(value, list) else [value]:
            if topic == "resource-usage" and "instance_type" in event and event["state"] == "running":
                running[event["resource_id"]] += event["interval_s"] / 3600
    billed: dict[str, Decimal] = defaultdict(Decimal)
    for r in _rows(export):
        if r["ConsumedUnit"] == "Hours" and r["ChargeClass"] is None:
            billed[r["ResourceId"]] += r["ConsumedQuantity"]
    assert any(hours < CFG.hours for hours in running.values())  # some were stopped a while
    assert billed.keys() == running.keys()
    for rid, hours in running.items():
        assert float(billed[rid]) == pytest.approx(hours, rel=1e-9), rid


def test_csv_dates_are_iso_8601(pricing: Pricing, tmp_path: Path) -> None:
    path = write_focus(simulate_focus(SimConfig(hours=2, seed=3), pricing), tmp_path / "bill.csv")
    table = pa_csv.read_csv(path, convert_options=pa_csv.ConvertOptions(column_types={"ChargePeriodStart": pa.string()}))
    first = table.column("ChargePeriodStart")[0].as_py()
    assert datetime.strptime(first, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp() == SimConfig().start


def test_cli_writes_the_bill_beside_the_replay(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "streams.cli", "simulate", "--hours", "2", "--hosts", "2", "--notebooks", "2",
           "--out", str(tmp_path / "fleet.replay")]  # fmt: skip
    ok = subprocess.run([*run, "--focus", str(tmp_path / "bill.parquet")], cwd=ROOT, capture_output=True, text=True,
                        timeout=120)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert pq.read_table(tmp_path / "bill.parquet").num_rows > 0 and (tmp_path / "fleet.replay").stat().st_size
    bad = subprocess.run([*run, "--focus", str(tmp_path / "bill.xlsx")], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert bad.returncode != 0 and "--focus" in bad.stderr and "Traceback" not in bad.stderr
