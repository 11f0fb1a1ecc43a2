"""``make bench``, the bill's part: how fast a FOCUS export is read, columnar end to end.

A synthetic AWS-style FOCUS 1.2 export of 1,000,000 rows (20,000 resources × 50 hours, the
simulator's columns: :data:`detector.simulate_focus.COLUMNS`) is generated column by column
with numpy and pyarrow (no Python object per row), written as Parquet into a temporary
directory, and read back: with ``pyarrow.parquet`` alone (the floor) and with burnwatch's
reader :func:`detector.billing.focus.read_focus` (validation and normalisation included).
Then the whole ingest path, as ``burnwatch ingest focus`` runs it, into an embedded chdb store
in the same temporary directory: :func:`~detector.billing.ingest.read_bill` (read and check),
:func:`~detector.billing.ingest.store_bill` (staging, identities, the committed ingest), end to
end, and a re-ingest of the same file, which must leave the ``billing`` view's row count
unchanged (checked here: a correctness check, not a timing).
Prints rows/s and writes bench/out/focus.json.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from detector.simulate_focus import COLUMNS  # noqa: E402

RESOURCES = 20_000
HOURS = 50
START_MS = 1_793_577_600_000  # 2026-11-02T00:00:00Z
INSTANCES = {"p4d.24xlarge": 21.96, "p5.48xlarge": 55.04, "g5.xlarge": 1.006, "g5.12xlarge": 5.672,
             "m6i.2xlarge": 0.384, "c6i.4xlarge": 0.68, "g6.xlarge": 0.805, "g4dn.xlarge": 0.526}  # fmt: skip
REGIONS = ["us-east-1", "us-west-2", "eu-west-1", "eu-central-1", "ap-northeast-1"]
ACCOUNTS = [f"{100000000000 + 7919 * i}" for i in range(40)]
TEAMS = ["nlp", "vision", "recsys", "research", "platform", "ads", "search", "speech"]


def synthetic_export(resources: int = RESOURCES, hours: int = HOURS, seed: int = 1) -> pa.Table:
    """``resources × hours`` FOCUS rows: one per resource and hour, a tenth of them spot, a tenth
    covered by one of 20 Savings Plans, the rest on demand at a negotiated discount."""
    rng = np.random.default_rng(seed)
    n = resources * hours
    res = np.repeat(np.arange(resources), hours)
    hour = np.tile(np.arange(hours), resources)

    def take(values: list[str], index: np.ndarray) -> pa.Array:
        return pc.take(pa.array(values, pa.string()), pa.array(index))

    def decimal(x: np.ndarray) -> pa.Array:
        return pc.cast(pa.array(x), pa.decimal128(38, 12), safe=False)

    def timestamps(ms: np.ndarray) -> pa.Array:
        return pa.array(ms, pa.timestamp("ms", tz="UTC"))

    names = list(INSTANCES)
    itype = rng.integers(0, len(names), resources)[res]
    region = rng.integers(0, len(REGIONS), resources)[res]
    account = rng.integers(0, len(ACCOUNTS), resources)[res]
    kind = rng.choice(3, resources, p=[0.8, 0.1, 0.1])[res]  # 0 on demand, 1 spot, 2 committed
    list_rate = np.array([INSTANCES[k] for k in names])[itype]
    qty = np.where(rng.random(n) < 0.05, rng.uniform(0.1, 1.0, n), 1.0)  # some partial hours
    list_cost = list_rate * qty
    effective = np.select([kind == 1, kind == 2], [list_cost * rng.uniform(0.25, 0.45, n), list_cost * 0.6],
                          list_cost * 0.92)  # fmt: skip
    billed = np.where(kind == 2, 0.0, effective)
    committed = kind == 2
    ids = [f"i-{k:017x}" for k in range(resources)]
    tags = [json.dumps({"team": TEAMS[k % len(TEAMS)], "project": f"p{k % 97}", "user:cost-center": f"cc{k % 13}"})
            for k in range(resources)]  # fmt: skip
    sp = [f"arn:aws:savingsplans::123456789012:savingsplan/sp-{k:04d}" for k in range(20)]
    sp_index = pa.array(np.where(committed, res % 20, 0), mask=~committed)
    month_start, month_end = 1_793_491_200_000, 1_796_083_200_000  # November 2026
    null_str = pa.nulls(n, pa.string())
    columns = {
        "BilledCost": decimal(billed), "BillingAccountId": take(["123456789012"], np.zeros(n, dtype=np.int64)),
        "BillingAccountName": take(["payer"], np.zeros(n, dtype=np.int64)),
        "BillingCurrency": take(["USD"], np.zeros(n, dtype=np.int64)),
        "BillingPeriodStart": timestamps(np.full(n, month_start)), "BillingPeriodEnd": timestamps(np.full(n, month_end)),
        "ChargeCategory": take(["Usage"], np.zeros(n, dtype=np.int64)), "ChargeClass": null_str,
        "ChargeDescription": take([f"{k} instance hours" for k in names], itype),
        "ChargeFrequency": take(["Usage-Based"], np.zeros(n, dtype=np.int64)),
        "ChargePeriodStart": timestamps(START_MS + hour * 3_600_000),
        "ChargePeriodEnd": timestamps(START_MS + (hour + 1) * 3_600_000),
        "CommitmentDiscountCategory": pc.if_else(committed, "Spend", null_str),
        "CommitmentDiscountId": pc.take(pa.array(sp), sp_index),
        "CommitmentDiscountName": pc.take(pa.array(sp), sp_index),
        "CommitmentDiscountQuantity": pc.if_else(committed, decimal(effective), pa.nulls(n, pa.decimal128(38, 12))),
        "CommitmentDiscountStatus": pc.if_else(committed, "Used", null_str),
        "CommitmentDiscountType": pc.if_else(committed, "ComputeSavingsPlans", null_str),
        "CommitmentDiscountUnit": pc.if_else(committed, "USD", null_str),
        "ConsumedQuantity": decimal(qty), "ConsumedUnit": take(["Hours"], np.zeros(n, dtype=np.int64)),
        "ContractedCost": decimal(np.where(kind == 1, effective, list_cost * 0.92)),
        "ContractedUnitPrice": decimal(list_rate * 0.92), "EffectiveCost": decimal(effective),
        "InvoiceIssuerName": take(["Amazon Web Services, Inc."], np.zeros(n, dtype=np.int64)),
        "ListCost": decimal(list_cost), "ListUnitPrice": decimal(list_rate),
        "PricingCategory": take(["Standard", "Dynamic", "Committed"], kind),
        "PricingQuantity": decimal(qty), "PricingUnit": take(["Hours"], np.zeros(n, dtype=np.int64)),
        "ProviderName": take(["AWS"], np.zeros(n, dtype=np.int64)),
        "PublisherName": take(["Amazon Web Services, Inc."], np.zeros(n, dtype=np.int64)),
        "RegionId": take(REGIONS, region), "RegionName": take(REGIONS, region),
        "ResourceId": take(ids, res), "ResourceName": take(ids, res),
        "ResourceType": take(["gpu_instance"], np.zeros(n, dtype=np.int64)),
        "ServiceCategory": take(["Compute"], np.zeros(n, dtype=np.int64)),
        "ServiceName": take(["Amazon Elastic Compute Cloud"], np.zeros(n, dtype=np.int64)),
        "ServiceSubcategory": take(["Virtual Machines"], np.zeros(n, dtype=np.int64)),
        "SkuId": take([f"SKU-{k}" for k in names], itype), "SkuPriceId": take([f"SKU-{k}-P" for k in names], itype),
        "SubAccountId": take(ACCOUNTS, account), "SubAccountName": take(ACCOUNTS, account),
        "Tags": take(tags, res),
        "x_ServiceCode": take(["AmazonEC2"], np.zeros(n, dtype=np.int64)),
        "x_UsageType": pc.binary_join_element_wise(take(["BoxUsage", "SpotUsage", "BoxUsage"], kind),
                                                   take(names, itype), ":"),
    }  # fmt: skip
    assert list(columns) == list(COLUMNS), "the export's columns are the simulator's"
    return pa.table(columns)


def ingest(path: Path, store_dir: Path, rows: int) -> dict:
    """Time ``read_bill`` and ``store_bill`` into a fresh embedded store, then the same file
    again: the ``billing`` view must count ``rows`` after both (a redelivery replaces)."""
    from detector.billing.ingest import read_bill, store_bill
    from detector.store import Store

    out: dict = {}
    store = Store.open(f"chdb://{store_dir}")
    try:
        started = time.perf_counter()
        bill = read_bill(path, currency="USD")
        read_s = time.perf_counter() - started
        started = time.perf_counter()
        store_bill(store, bill)
        store_s = time.perf_counter() - started
        del bill
        out["read_bill"] = {"seconds": read_s, "rows_per_s": rows / read_s}
        out["store_bill"] = {"seconds": store_s, "rows_per_s": rows / store_s}
        out["ingest"] = {"seconds": read_s + store_s, "rows_per_s": rows / (read_s + store_s)}
        print("read_bill", out["read_bill"], "store_bill", out["store_bill"], "ingest", out["ingest"], flush=True)
        assert _billed_rows(store) == rows, (_billed_rows(store), rows)
        started = time.perf_counter()
        store_bill(store, read_bill(path, currency="USD"))
        elapsed = time.perf_counter() - started
        out["reingest"] = {"seconds": elapsed, "rows_per_s": rows / elapsed}
        print("re-ingest", out["reingest"], flush=True)
        assert _billed_rows(store) == rows, f"re-ingest changed the billing view: {_billed_rows(store)} != {rows}"
    finally:
        store.close()
    return out


def _billed_rows(store) -> int:  # noqa: ANN001 (detector.store.Store, imported lazily)
    (row,) = store.query(f"SELECT count() AS n FROM {store.db}.billing")
    return int(row["n"])


def main() -> int:
    out_dir = ROOT / "bench" / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"}
    with tempfile.TemporaryDirectory(prefix="burnwatch-bench-focus-") as tmp:
        path = Path(tmp) / "focus-1m.parquet"
        started = time.perf_counter()
        table = synthetic_export()
        results["generate_s"] = time.perf_counter() - started
        pq.write_table(table, path)
        rows = table.num_rows
        del table
        results.update(rows=rows, file_mb=path.stat().st_size / 1e6)
        print(f"export: {rows:,} rows, {results['file_mb']:.1f} MB Parquet", flush=True)

        started = time.perf_counter()
        pq.read_table(path)
        elapsed = time.perf_counter() - started
        results["pyarrow_read"] = {"seconds": elapsed, "rows_per_s": rows / elapsed}
        print("pyarrow.parquet.read_table", results["pyarrow_read"], flush=True)

        try:
            from detector.billing.focus import read_focus  # helper A's reader (issue 15)
        except ImportError:
            read_focus = None
            print("detector.billing.focus.read_focus is not there yet: reader not timed", flush=True)
        if read_focus is not None:
            started = time.perf_counter()
            normalized = read_focus(path, currency="USD")
            elapsed = time.perf_counter() - started
            assert normalized.num_rows == rows, (normalized.num_rows, rows)
            results["read_focus"] = {"seconds": elapsed, "rows_per_s": rows / elapsed}
            print("read_focus", results["read_focus"], flush=True)
            del normalized
            results.update(ingest(path, Path(tmp) / "clickhouse", rows))
    (out_dir / "focus.json").write_text(json.dumps(results, indent=2))
    print()
    print("| measure | figure |\n|---|---|")
    print(f"| FOCUS export | {rows:,} rows, {results['file_mb']:.1f} MB Parquet |")
    print(f"| pyarrow.parquet.read_table alone | {results['pyarrow_read']['rows_per_s']:,.0f} rows/s |")
    if "read_focus" in results:
        print(f"| read_focus (validated, normalized) | {results['read_focus']['rows_per_s']:,.0f} rows/s |")
    for key, label in (("read_bill", "read_bill (read and check, as the CLI)"),
                       ("store_bill", "store_bill into chdb (staging, identities, commit)"),
                       ("ingest", "ingest end to end (read_bill + store_bill)"),
                       ("reingest", "re-ingest of the same file (replaces, count unchanged)")):  # fmt: skip
        if key in results:
            print(f"| {label} | {results[key]['rows_per_s']:,.0f} rows/s ({results[key]['seconds']:.1f} s) |")
    print(f"| machine | {results['machine']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
