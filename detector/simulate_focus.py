"""The bill of the simulated fleet: a FOCUS 1.2 export of what :mod:`detector.simulate` runs.

A FinOps team checks burnwatch's dollars against the bill, so the demo and ``burnwatch eval``
need a bill that agrees with the events where they are the same truth and differs where real
bills do. One row per resource and hour it ran (``ChargePeriodStart``/``End`` on the hour,
partial first and last hours prorated by the seconds it ran, stopped time not billed), with
the FOCUS 1.2 column names and types and the AWS export's ``x_ServiceCode``/``x_UsageType``.

What is trusted when (the reconciliation check depends on it):

- Resources whose usage events carry ``cost_usd`` (``send_cost`` in the simulator: training
  hosts, inference endpoints, Kubernetes nodes, buckets, vector databases): the events and the
  bill are the same truth, so each hour's ``EffectiveCost`` is exactly the sum of the events'
  ``cost_usd`` in that hour (spot hosts included: their events already carry the spot actual).
- The others (notebooks, ETL instances: priced by burnwatch from ``rules/pricing.yaml``): the
  bill is the truth, and it differs from the price list the way real bills do:
  a negotiated discount (``EffectiveCost = ListCost × (1 − 8 %)``) for account
  :data:`DISCOUNT_ACCOUNT`; spot actuals ±15 % of the list's spot figure per host and day; a
  Compute Savings Plan bought for every other on-demand host of account
  :data:`COMMITMENT_ACCOUNT` as if they ran around the clock (``PricingCategory = Committed``,
  ``CommitmentDiscountStatus = Used`` at the committed rate whenever they run, ``Unused`` rows
  with the commitment's id as ``ResourceId`` for the hours they are stopped, and the hourly
  fee as a ``Purchase`` row); one day of one resource first billed
  without its discount and restated by a ``ChargeClass = Correction`` row the next month.
- One account-level promotional ``Credit`` (negative costs, no resource).
- Untagged resources (those labelled ``untagged``): every other one has team/project tags in
  the bill only (the bill's tags are the finalised ones), so "tags from the bill" has work.

Everything derives from the seed, so a bill is reproducible byte for byte. :attr:`FocusBill.rates`
is the ground truth: the effective dollars per running hour of each resource and hour.
"""

from __future__ import annotations

import gzip
import io
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

from detector.pricing import HOURS_PER_MONTH, Pricing
from detector.simulate import (
    TEAMS,
    Fleet,
    SimConfig,
    _k8s_resource,
    _Resource,
    _storage_records,
    _Store,
    _untagged_label,
    _usage_records,
    build,
)

__all__ = ["COLUMNS", "COMMITMENT_ACCOUNT", "DISCOUNT", "DISCOUNT_ACCOUNT", "FocusBill", "bill_of", "simulate_focus",
           "write_focus"]

DISCOUNT = 0.08
"""The negotiated discount (enterprise agreement) of :data:`DISCOUNT_ACCOUNT`."""
DISCOUNT_ACCOUNT = "ml-prod-0"
COMMITMENT_ACCOUNT = "ml-dev"
SPOT_SPREAD = 0.15
"""Spot actuals vary this much either side of the price list's spot figure, per host and day."""
CREDIT_SHARE = 0.05
"""The promotional credit: this share of the first day's billed dollars."""
PAYER = "123456789012"
ISSUER = "Amazon Web Services, Inc."
REGION_NAMES = {"us-east-1": "US East (N. Virginia)", "us-west-2": "US West (Oregon)", "eu-west-1": "Europe (Ireland)"}
HOUR = 3600.0

COLUMNS: dict[str, str] = {
    "BilledCost": "decimal", "BillingAccountId": "string", "BillingAccountName": "string",
    "BillingCurrency": "string", "BillingPeriodStart": "datetime", "BillingPeriodEnd": "datetime",
    "ChargeCategory": "string", "ChargeClass": "string", "ChargeDescription": "string",
    "ChargeFrequency": "string", "ChargePeriodStart": "datetime", "ChargePeriodEnd": "datetime",
    "CommitmentDiscountCategory": "string", "CommitmentDiscountId": "string", "CommitmentDiscountName": "string",
    "CommitmentDiscountQuantity": "decimal", "CommitmentDiscountStatus": "string",
    "CommitmentDiscountType": "string", "CommitmentDiscountUnit": "string",
    "ConsumedQuantity": "decimal", "ConsumedUnit": "string", "ContractedCost": "decimal",
    "ContractedUnitPrice": "decimal", "EffectiveCost": "decimal", "InvoiceIssuerName": "string",
    "ListCost": "decimal", "ListUnitPrice": "decimal", "PricingCategory": "string", "PricingQuantity": "decimal",
    "PricingUnit": "string", "ProviderName": "string", "PublisherName": "string", "RegionId": "string",
    "RegionName": "string", "ResourceId": "string", "ResourceName": "string", "ResourceType": "string",
    "ServiceCategory": "string", "ServiceName": "string", "ServiceSubcategory": "string", "SkuId": "string",
    "SkuPriceId": "string", "SubAccountId": "string", "SubAccountName": "string", "Tags": "json",
    "x_ServiceCode": "string", "x_UsageType": "string",
}  # fmt: skip
"""The export's columns and their FOCUS data types, in file order."""


@dataclass
class FocusBill:
    """The export's rows (FOCUS column → value) and the ground truth behind them."""

    rows: list[dict[str, Any]]
    rates: dict[tuple[str, float], float] = field(default_factory=dict)
    """(resource_id, hour start) → effective dollars per running hour, after discounts,
    commitments and corrections (credits are account-level and not in it)."""
    commitment_id: str = ""
    corrected: tuple[str, float] | None = None
    """(resource_id, day start) of the restated resource-day."""


@dataclass
class _Hour:
    run_s: float = 0.0
    cost: float = 0.0
    gb_months: float = 0.0


def _hours_of(events: Iterable[dict[str, Any]]) -> dict[float, _Hour]:
    """Sum a resource's usage events per clock hour: seconds running, event dollars, GB-months stored."""
    hours: dict[float, _Hour] = {}
    for event in events:
        t = datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()
        h = hours.setdefault(t // HOUR * HOUR, _Hour())
        if event["state"] == "running":
            h.run_s += event["interval_s"]
        h.cost += event.get("cost_usd") or 0.0
        if "storage_bytes" in event:
            h.gb_months += event["storage_bytes"] / 1e9 * event["interval_s"] / (HOURS_PER_MONTH * HOUR)
    return hours


def _month(t: float) -> tuple[datetime, datetime]:
    d = datetime.fromtimestamp(t, tz=timezone.utc)
    start = datetime(d.year, d.month, 1, tzinfo=timezone.utc)
    end = datetime(d.year + d.month // 12, d.month % 12 + 1, 1, tzinfo=timezone.utc)
    return start, end


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=timezone.utc)


def _bill_tags(fleet: Fleet) -> dict[str, dict[str, str]]:
    """Tags as the bill has them: the resources' own, and team/project for every other untagged one."""
    untagged = sorted(res.resource_id for res in fleet.gpu_resources
                      if _untagged_label(res, fleet.cfg, fleet.end) is not None)  # fmt: skip
    by_id = {res.resource_id: res for res in fleet.gpu_resources}
    tags: dict[str, dict[str, str]] = {}
    for n, rid in enumerate(untagged):
        if n % 2 == 0:
            team, projects, owners = random.Random(f"{fleet.cfg.seed}-bill-tags-{rid}").choice(TEAMS)
            tags[rid] = {**by_id[rid].tags, "team": team, "project": projects[0], "owner": owners[0]}
    return tags


class _Rows:
    """Builds the rows, filling the columns every row shares."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, start: float, end: float, account: str, billed: float, effective: float, list_cost: float,
            contracted: float, **cols: Any) -> None:
        period_start, period_end = _month(cols.pop("billing_t", start))
        row: dict[str, Any] = {name: None for name in COLUMNS}
        row.update({
            "BillingAccountId": PAYER, "BillingAccountName": "burnwatch simulated payer", "BillingCurrency": "USD",
            "BillingPeriodStart": period_start, "BillingPeriodEnd": period_end,
            "ChargePeriodStart": _utc(start), "ChargePeriodEnd": _utc(end), "ChargeCategory": "Usage",
            "ChargeFrequency": "Usage-Based", "ProviderName": "AWS", "PublisherName": ISSUER,
            "InvoiceIssuerName": ISSUER, "SubAccountId": account, "SubAccountName": account,
            "BilledCost": billed, "EffectiveCost": effective, "ListCost": list_cost, "ContractedCost": contracted,
        })  # fmt: skip
        row.update(cols)
        self.rows.append(row)


def _compute_cols(res: _Resource, tags: dict[str, str], qty: float, list_rate: float) -> dict[str, Any]:
    sku = f"SIM-{res.instance_type}-{res.region}"
    return {
        "ResourceId": res.resource_id, "ResourceName": res.resource_id, "ResourceType": res.resource_type,
        "ServiceCategory": "Compute", "ServiceSubcategory": "Virtual Machines",
        "ServiceName": "Amazon Elastic Compute Cloud", "RegionId": res.region,
        "RegionName": REGION_NAMES.get(res.region, res.region), "ConsumedQuantity": qty, "ConsumedUnit": "Hours",
        "PricingQuantity": qty, "PricingUnit": "Hours", "ListUnitPrice": list_rate, "SkuId": sku,
        "Tags": tags, "x_ServiceCode": "AmazonEC2",
        "x_UsageType": f"{'SpotUsage' if res.pricing == 'spot' else 'BoxUsage'}:{res.instance_type}",
    }  # fmt: skip


def bill_of(fleet: Fleet, pricing: Pricing) -> FocusBill:
    """The FOCUS rows of a built fleet (see the module docstring for what each row says)."""
    cfg = fleet.cfg
    out = _Rows()
    bill = FocusBill(out.rows)
    bill_tags = _bill_tags(fleet)
    compute = fleet.gpu_resources + fleet.cpu_resources
    if cfg.k8s_nodes:
        from detector import simulate_k8s

        nodes = simulate_k8s.k8s_nodes(cfg.k8s_nodes, cfg.seed, cfg.start, fleet.end, cfg.scrape_s, pricing)
        compute += [_k8s_resource(node, cfg, fleet.end) for node in nodes]
    hours = {res.resource_id: _hours_of(r[3] for r in _usage_records(res, cfg, fleet.end)) for res in compute}

    # The restated resource-day: the first day of the first discounted resource priced from the list.
    corrected = next((r for r in compute if not r.send_cost and r.account == DISCOUNT_ACCOUNT), None)
    day0 = cfg.start // 86_400 * 86_400
    if corrected is not None:
        bill.corrected = (corrected.resource_id, day0)
    correction_usd = 0.0

    # The Savings Plan: bought for every other on-demand host of COMMITMENT_ACCOUNT priced from the list,
    # as if they ran around the clock (their committed rate each hour); the hours they are stopped go unused.
    # A host is covered whenever it runs, so each host has one rate (committed or list): a rate learnt from
    # the bill prices its alerts as billed.
    eligible = sorted((r for r in compute if not r.send_cost and r.account == COMMITMENT_ACCOUNT
                       and r.pricing == "on_demand"), key=lambda r: r.resource_id)  # fmt: skip
    covered = eligible[::2]
    sp_rate = {r.resource_id: pricing.hourly(r.instance_type, "reserved") or r.hourly * 0.6 for r in covered}
    all_hours = sorted({h for rid in hours for h in hours[rid]})
    commitment = sum(sp_rate.values())
    if commitment:
        bill.commitment_id = f"arn:aws:savingsplans::{PAYER}:savingsplan/sim-{cfg.seed:04d}"
    sp_cols = {"CommitmentDiscountId": bill.commitment_id, "CommitmentDiscountType": "ComputeSavingsPlans",
               "CommitmentDiscountCategory": "Spend", "CommitmentDiscountName": "notebooks 1yr no upfront",
               "CommitmentDiscountUnit": "USD"}  # fmt: skip
    left = {h: commitment for h in all_hours}
    covered_ids = {r.resource_id for r in covered}

    for res in sorted(compute, key=lambda r: r.resource_id):
        tags = bill_tags.get(res.resource_id, res.tags)
        list_rate = pricing.hourly(res.instance_type) or res.hourly
        for h, usage in sorted(hours[res.resource_id].items()):
            if usage.run_s <= 0:
                continue  # stopped: not billed
            qty = usage.run_s / HOUR
            cols = _compute_cols(res, tags, qty, list_rate)
            day = h // 86_400 * 86_400
            if res.send_cost:  # the events carry the truth
                category = "Dynamic" if res.pricing == "spot" else "Standard"
                out.add(h, h + HOUR, res.account, usage.cost, usage.cost, qty * list_rate, usage.cost,
                        PricingCategory=category, ContractedUnitPrice=usage.cost / qty, SkuPriceId=f"{cols['SkuId']}-{category}",
                        ChargeDescription=f"{res.instance_type} {category} instance hours", **cols)  # fmt: skip
                bill.rates[(res.resource_id, h)] = usage.cost / qty
                continue
            spent = 0.0
            if res.pricing == "spot":
                spot = pricing.hourly(res.instance_type, "spot") or list_rate
                rate = spot * random.Random(f"{cfg.seed}-spot-{res.resource_id}-{day:.0f}").uniform(
                    1 - SPOT_SPREAD, 1 + SPOT_SPREAD)
                out.add(h, h + HOUR, res.account, qty * rate, qty * rate, qty * list_rate, qty * rate,
                        PricingCategory="Dynamic", ContractedUnitPrice=rate, SkuPriceId=f"{cols['SkuId']}-Dynamic",
                        ChargeDescription=f"{res.instance_type} spot instance hours", **cols)  # fmt: skip
                bill.rates[(res.resource_id, h)] = rate
                continue
            standard_qty = qty
            if res.resource_id in covered_ids:
                used_qty = qty
                used = used_qty * sp_rate[res.resource_id]
                left[h] -= used
                standard_qty -= used_qty
                spent += used
                out.add(h, h + HOUR, res.account, 0.0, used, used_qty * list_rate, used_qty * list_rate,
                        PricingCategory="Committed", CommitmentDiscountStatus="Used", CommitmentDiscountQuantity=used,
                        ContractedUnitPrice=list_rate, SkuPriceId=f"{cols['SkuId']}-Committed",
                        ChargeDescription=f"{res.instance_type} hours covered by a Savings Plan",
                        **{**cols, "ConsumedQuantity": used_qty, "PricingQuantity": used_qty}, **sp_cols)  # fmt: skip
            if standard_qty > 1e-12:
                discount = DISCOUNT if res.account == DISCOUNT_ACCOUNT else 0.0
                rate = list_rate * (1 - discount)
                billed_rate = list_rate if bill.corrected == (res.resource_id, day) else rate
                correction_usd += (billed_rate - rate) * standard_qty
                spent += standard_qty * rate
                out.add(h, h + HOUR, res.account, standard_qty * billed_rate, standard_qty * billed_rate,
                        standard_qty * list_rate, standard_qty * billed_rate, PricingCategory="Standard",
                        ContractedUnitPrice=billed_rate, SkuPriceId=f"{cols['SkuId']}-Standard",
                        ChargeDescription=f"{res.instance_type} on-demand instance hours",
                        **{**cols, "ConsumedQuantity": standard_qty, "PricingQuantity": standard_qty})  # fmt: skip
            bill.rates[(res.resource_id, h)] = spent / qty

    if corrected is not None and correction_usd:
        cols = _compute_cols(corrected, bill_tags.get(corrected.resource_id, corrected.tags), 0.0, 0.0)
        next_month = _month(day0)[1].timestamp()
        out.add(day0, day0 + 86_400, corrected.account, -correction_usd, -correction_usd, 0.0, -correction_usd,
                billing_t=next_month, ChargeClass="Correction", PricingCategory="Standard",
                ChargeDescription=f"negotiated discount of {DISCOUNT:.0%} not applied on the original invoice",
                SkuPriceId=f"{cols['SkuId']}-Standard",
                **{**cols, "ConsumedQuantity": None, "PricingQuantity": None, "ListUnitPrice": None,
                   "ConsumedUnit": None, "PricingUnit": None})  # fmt: skip

    if commitment:
        sp = {"ResourceId": bill.commitment_id, "ResourceName": "notebooks 1yr no upfront",
              "ResourceType": "Savings Plan", "ServiceCategory": "Compute", "ServiceSubcategory": "Virtual Machines",
              "ServiceName": "Savings Plans for AWS Compute usage", "x_ServiceCode": "ComputeSavingsPlans",
              "Tags": {}}  # fmt: skip
        for h in all_hours:
            out.add(h, h + HOUR, COMMITMENT_ACCOUNT, commitment, 0.0, 0.0, 0.0, ChargeCategory="Purchase",
                    ChargeFrequency="Recurring", ChargeDescription="Savings Plan hourly fee",
                    x_UsageType="ComputeSP:1yrNoUpfront", CommitmentDiscountQuantity=commitment,
                    **sp, **sp_cols)  # fmt: skip
            if left[h] > 1e-9:
                out.add(h, h + HOUR, COMMITMENT_ACCOUNT, 0.0, left[h], 0.0, 0.0, PricingCategory="Committed",
                        CommitmentDiscountStatus="Unused", CommitmentDiscountQuantity=left[h],
                        ChargeDescription="Savings Plan commitment not used", x_UsageType="ComputeSP:1yrNoUpfront",
                        **sp, **sp_cols)  # fmt: skip

    for store in fleet.stores:
        _store_rows(out, bill, store, cfg, fleet.end, pricing)

    first_day = sum(r["EffectiveCost"] for r in out.rows
                    if r["SubAccountId"] == DISCOUNT_ACCOUNT and r["ChargePeriodStart"].timestamp() < day0 + 86_400)
    credit = round(first_day * CREDIT_SHARE, 2)
    if credit > 0:
        out.add(day0, day0 + 86_400, DISCOUNT_ACCOUNT, -credit, -credit, 0.0, 0.0, ChargeCategory="Credit",
                ChargeFrequency="One-Time", ChargeDescription="AWS Activate promotional credit",
                ServiceCategory="Compute", ServiceName="Amazon Elastic Compute Cloud", x_ServiceCode="AmazonEC2",
                x_UsageType="Credit", Tags={})  # fmt: skip

    out.rows.sort(key=lambda r: (r["ChargePeriodStart"], r["SubAccountId"] or "", r["ResourceId"] or "",
                                 r["ChargeCategory"], r["PricingCategory"] or "", r["ChargeClass"] or ""))  # fmt: skip
    return bill


def _store_rows(out: _Rows, bill: FocusBill, store: _Store, cfg: SimConfig, end: float, pricing: Pricing) -> None:
    """A bucket's or vector database's hours: storage billed as its events say (they carry the cost)."""
    records = _storage_records(store, cfg, end, pricing.storage_usd_per_gb_month)
    hours = _hours_of(r[3] for r in records)
    region, account = "us-east-1", "ml-data"
    vector = store.resource_type == "vector_db"
    usage_type = "VectorStorage-ByteHrs" if vector else "TimedStorage-ByteHrs"
    for h, usage in sorted(hours.items()):
        if usage.run_s <= 0:
            continue
        rate = pricing.storage_usd_per_gb_month
        sku = f"SIM-{usage_type}-{region}"
        out.add(h, h + HOUR, account, usage.cost, usage.cost, usage.gb_months * rate, usage.cost,
                PricingCategory="Standard", ResourceId=store.resource_id, ResourceName=store.resource_id,
                ResourceType=store.resource_type, ServiceCategory="Storage",
                ServiceSubcategory="Object Storage", ServiceName="Amazon S3 Vectors" if vector
                else "Amazon Simple Storage Service", RegionId=region, RegionName=REGION_NAMES[region],
                ConsumedQuantity=usage.gb_months, ConsumedUnit="GB-Mo", PricingQuantity=usage.gb_months,
                PricingUnit="GB-Mo", ListUnitPrice=rate, ContractedUnitPrice=rate, SkuId=sku,
                SkuPriceId=f"{sku}-Standard", ChargeDescription=f"${rate} per GB-month of storage",
                Tags=store.tags, x_ServiceCode="AmazonS3", x_UsageType=usage_type)  # fmt: skip
        bill.rates[(store.resource_id, h)] = usage.cost / (usage.run_s / HOUR)


def simulate_focus(cfg: SimConfig, pricing: Pricing) -> FocusBill:
    """The FOCUS export of the fleet :func:`detector.simulate.simulate` simulates for ``cfg``."""
    return bill_of(build(cfg, pricing), pricing)


def _decimal(x: float | None) -> Decimal | None:
    return None if x is None else Decimal(repr(float(x))).quantize(Decimal("1e-12"))


def to_table(bill: FocusBill) -> Any:
    """The rows as a pyarrow Table typed as FOCUS says: Decimal → decimal128(38,12), Date/Time →
    timestamp[ms, UTC], JSON → its text."""
    import pyarrow as pa

    types = {"decimal": pa.decimal128(38, 12), "datetime": pa.timestamp("ms", tz="UTC"), "string": pa.string(),
             "json": pa.string()}  # fmt: skip
    arrays = []
    for name, kind in COLUMNS.items():
        values = [row[name] for row in bill.rows]
        if kind == "decimal":
            values = [_decimal(v) for v in values]
        elif kind == "json":
            values = [None if v is None else json.dumps(v, sort_keys=True) for v in values]
        arrays.append(pa.array(values, type=types[kind]))
    return pa.Table.from_arrays(arrays, names=list(COLUMNS))


def write_focus(bill: FocusBill, path: str | Path) -> Path:
    """Write the export as Parquet (``.parquet``) or CSV (``.csv``, ``.csv.gz``, dates as ISO 8601 ``Z``).
    The same bill gives the same bytes."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    path = Path(path)
    table = to_table(bill)
    name = path.name.lower()
    if name.endswith(".parquet"):
        pq.write_table(table, path)
        return path
    if not (name.endswith(".csv") or name.endswith(".csv.gz")):
        raise ValueError(f"--focus {path}: the file name must end in .parquet, .csv or .csv.gz")
    for i, (col, kind) in enumerate(COLUMNS.items()):
        if kind == "datetime":
            text = [None if v is None else v.strftime("%Y-%m-%dT%H:%M:%SZ") for v in table.column(col).to_pylist()]
            table = table.set_column(i, col, pa.array(text, type=pa.string()))
    buf = io.BytesIO()
    pa_csv.write_csv(table, buf)
    data = buf.getvalue()
    if name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)
    return path

