"""Store FOCUS bills in ClickHouse: whole files or nothing, and never the same charge twice.

Every file is read and checked (:func:`detector.billing.focus.read_focus`) before a row is
written, so a bad file stores nothing. The rows then go to a staging table, and one
``INSERT … SELECT`` gives each its identity (``row_key``: a hash of the charge's dimensions
and of which of several identical charges it is), so a re-delivered or restated export of a
billing period replaces the rows it restates instead of adding to them. The ingest's line in
``billing_ingests`` is written last: the ``billing`` view reads only committed ingests, so a
kill mid-way leaves rows nobody reads (migration ``0013_billing``). Corrections
(``ChargeClass = Correction``) are charges of their own and add to what they correct, as
FOCUS intends.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from detector.billing.focus import SCHEMA, focus_files, read_focus
from detector.store.connection import Connection

__all__ = ["IDENTITY", "Bill", "IngestResult", "ingest_files", "read_bill", "store_bill"]

IDENTITY = (
    "billing_account_id", "sub_account_id", "billing_period_start", "charge_period_start", "charge_period_end",
    "resource_id", "sku_id", "sku_price_id", "charge_category", "charge_class", "charge_frequency",
    "charge_description", "pricing_category", "commitment_discount_id", "commitment_discount_status", "region_id",
    "availability_zone", "service_name", "consumed_unit", "pricing_unit", "billing_currency",
)  # fmt: skip
"""What tells one charge from another: every dimension, none of the measures (costs,
quantities) a restatement may change, nor the tags it may finalise."""

_MEASURES = ("effective_cost", "billed_cost", "list_cost", "contracted_cost", "consumed_quantity", "pricing_quantity")


@dataclass(frozen=True)
class IngestResult:
    ingest_id: str
    files: list[str]
    rows: int
    billed_cost: Decimal
    effective_cost: Decimal
    overlapping: int = 0
    """Usage charges of this bill over a time another usage charge of the same resource and SKU
    covers with a period of another length (this bill's, or one stored): the same month exported
    hourly and daily, which the ``billing`` view would count twice."""
    overlapping_resources: tuple[str, ...] = ()
    """A few of their resources, to look at."""


@dataclass(frozen=True)
class Bill:
    """FOCUS files read and checked, not yet stored."""

    files: list[Path]
    table: pa.Table
    """The reader's columns, and ``source``: the file each row came from."""


def read_bill(path: Path | str, currency: str = "USD", max_usd_per_hour: float | None = None) -> Bill:
    """Read every FOCUS file at ``path`` (a file or a directory). Raises
    :class:`~detector.billing.focus.FocusError` (naming file, row and column) when any is bad
    (``max_usd_per_hour``: :func:`~detector.billing.focus.read_focus`'s)."""
    files = focus_files(path)
    tables = [read_focus(f, currency=currency, max_usd_per_hour=max_usd_per_hour) for f in files]
    sources = [pa.array([f.name] * t.num_rows, pa.string()) for f, t in zip(files, tables, strict=True)]
    return Bill(files, pa.concat_tables([t.append_column("source", s) for t, s in zip(tables, sources, strict=True)]))


def ingest_files(store: Connection, path: Path | str, currency: str = "USD") -> IngestResult:
    """Read every FOCUS file at ``path`` and store them as one ingest: nothing is written
    when any file is bad."""
    return store_bill(store, read_bill(path, currency))


def store_bill(store: Connection, bill: Bill) -> IngestResult:
    """Store checked files as one ingest (see the module docstring)."""
    files, table = bill.files, bill.table
    version = time.time_ns()
    ingest_id = f"{version}-{uuid.uuid4().hex[:8]}"
    staging = f"billing_staging_{uuid.uuid4().hex}"
    db = store.db
    names = ", ".join(SCHEMA.names)
    identity = ", ".join(IDENTITY)
    with store.lock:
        client = store.client
        client.command(f"CREATE TABLE {db}.{staging} AS {db}.billing_charges ENGINE = Memory")
        try:
            client.command(f"ALTER TABLE {db}.{staging} DROP COLUMN row_key, DROP COLUMN ingest_id, "
                           f"DROP COLUMN version")  # fmt: skip
            client.insert_arrow(f"{db}.{staging}", table)
            overlapping, resources = _overlapping(store, staging)
            client.command(
                f"INSERT INTO {db}.billing_charges (row_key, ingest_id, version, source, {names}) "
                f"SELECT reinterpretAsUInt128(sipHash128({identity}, ordinal)), '{ingest_id}', {version}, source, {names} "
                f"FROM (SELECT *, row_number() OVER (PARTITION BY {identity} ORDER BY {', '.join(_MEASURES)}) AS ordinal "
                f"FROM {db}.{staging})"
            )  # fmt: skip
        finally:
            client.command(f"DROP TABLE IF EXISTS {db}.{staging}")
        result = IngestResult(ingest_id, [str(f) for f in files], table.num_rows,
                              _total(table, "billed_cost"), _total(table, "effective_cost"), overlapping, resources)  # fmt: skip
        client.insert(f"{db}.billing_ingests", [[ingest_id, version, version // 1_000_000, result.files, result.rows,
                                                 result.billed_cost, result.effective_cost]],
                      column_names=["ingest_id", "version", "at", "files", "rows", "billed_cost", "effective_cost"])  # fmt: skip
    return result


def _overlapping(store: Connection, staging: str) -> tuple[int, tuple[str, ...]]:
    """(how many, a few resources): the staged usage charges that a usage charge of the same resource,
    SKU and unit over a period of another length overlaps, in the staged bill or among those stored. A
    restatement has the same periods and replaces its rows; another granularity adds to them."""
    db = store.db
    # Consumption measured in a unit (not a correction, which adds to what it corrects, nor a fee of no quantity).
    usage = "charge_category = 'Usage' AND charge_class != 'Correction' AND consumed_quantity > 0 AND resource_id != ''"
    row = store.client.query(
        f"SELECT uniqExact(s.resource_id, s.sku_id, s.a, s.b) AS n, groupUniqArray(5)(s.resource_id) AS some FROM "
        f"(SELECT resource_id, sku_id, consumed_unit, charge_period_start AS a, charge_period_end AS b "
        f" FROM {db}.{staging} WHERE {usage}) AS s "
        f"INNER JOIN (SELECT resource_id, sku_id, consumed_unit, charge_period_start AS a, charge_period_end AS b "
        f" FROM {db}.{staging} WHERE {usage} UNION ALL SELECT resource_id, sku_id, consumed_unit, charge_period_start, "
        f" charge_period_end FROM {db}.billing "
        f" WHERE {usage} AND resource_id IN (SELECT resource_id FROM {db}.{staging})) AS o "
        f"ON s.resource_id = o.resource_id AND s.sku_id = o.sku_id AND s.consumed_unit = o.consumed_unit "
        f"WHERE o.a < s.b AND s.a < o.b AND o.b - o.a != s.b - s.a"
    ).first_row
    return int(row[0]), tuple(sorted(row[1]))


def _total(table: pa.Table, column: str) -> Decimal:
    """The exact sum of a money column (pyarrow sums decimal128 without rounding)."""
    total = pc.sum(table.column(column)).as_py()
    return Decimal(0) if total is None else Decimal(total)
