"""Billed usage as usage events, for ``burnwatch ingest focus --publish-usage``.

Two kinds, so the stream's detectors see what only the bill shows:

- a resource the bill charges but that sends no telemetry (a bucket, a managed vector
  database, a NAT gateway): one usage event per resource and charge period, its
  ``cost_usd`` the period's EffectiveCost. Resources that do send telemetry are left out,
  or their spend would count twice. Tags keep their keys, less AWS's ``user:`` prefix of
  user-defined tags, so ``user:team`` is the ``team`` the rules look for;
- a commitment (Savings Plan, reservation): one event per commitment and charge period,
  ``resource_type`` ``commitment``, its ``cost_usd`` the unused dollars
  (``CommitmentDiscountStatus = Unused``) and ``metrics`` the used and unused dollars, which
  the ``unused_commitment`` detector reads.

Events are built from the bill's columns in one pass per group; they pass the same
decoder as an exporter's (``detector.events``), so the worker stores and checks them alike.
Each carries ``billed_from: focus`` (kept in ``extra``), so the bill's own events are never
mistaken for telemetry when the next bill is published (:func:`telemetry_sql`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from datetime import datetime
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from detector.events import MAX_ID, MAX_TAG_VALUE, MAX_TAGS, TOPIC_RESOURCE_USAGE

__all__ = ["COMMITMENT", "over_no_time", "telemetry_sql", "usage_records"]

COMMITMENT = "commitment"
_PRICING = {"Dynamic": "spot", "Committed": "reserved"}
"""FOCUS PricingCategory → the contract's pricing (Standard and Other are on demand)."""


def usage_records(table: pa.Table, with_telemetry: Collection[str]) -> Iterator[tuple[str, str, bytes]]:
    """``(topic, key, value)`` records of the bill's usage: resources not in ``with_telemetry``,
    and every commitment (see the module docstring). Costs become floats here, at the edge
    of the stream contract; the store's bill keeps them exact."""
    groups: dict[tuple[str, datetime, datetime], dict[str, Any]] = {}
    columns = ("resource_id", "resource_type", "provider_name", "sub_account_id", "region_id", "pricing_category",
               "charge_period_start", "charge_period_end", "effective_cost", "charge_category",
               "commitment_discount_id", "commitment_discount_status", "commitment_discount_type",
               "commitment_discount_name", "tags")  # fmt: skip
    for row in table.select(list(columns)).to_pylist():
        if row["charge_category"] != "Usage":
            continue  # purchases, taxes, credits and adjustments are no resource's usage
        commitment = row["commitment_discount_id"]
        status = row["commitment_discount_status"]
        if commitment and status in ("Used", "Unused"):
            g = _group(groups, commitment, row, COMMITMENT)
            g["used" if status == "Used" else "unused"] += float(row["effective_cost"])
            g["commitment_type"] = row["commitment_discount_type"] or g.get("commitment_type", "")
            g["commitment_name"] = row["commitment_discount_name"] or g.get("commitment_name", "")
            if status == "Unused":
                continue  # the commitment's own dollars: nobody's resource
        rid = row["resource_id"]
        if not rid or rid in with_telemetry:
            continue
        _group(groups, rid, row, row["resource_type"] or "billed")["cost"] += float(row["effective_cost"])
    for (rid, start, end), g in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if end <= start:
            continue  # usage over no time has no rate: the worker would refuse it (:func:`over_no_time`)
        event: dict[str, Any] = {
            "ts": start.isoformat().replace("+00:00", "Z"), "resource_id": rid, "resource_type": g["type"],
            "provider": g["provider"], "account": g["account"], "region": g["region"], "pricing": g["pricing"],
            "state": "running", "interval_s": max((end - start).total_seconds(), 0.001), "tags": g["tags"],
            "billed_from": "focus",
        }  # fmt: skip
        if g["type"] == COMMITMENT:
            event["cost_usd"] = max(g["unused"], 0.0)
            event["metrics"] = {"commitment_used_usd": max(g["used"], 0.0), "commitment_unused_usd": max(g["unused"], 0.0)}
            event["commitment_type"] = g.get("commitment_type", "")
            event["commitment_name"] = g.get("commitment_name", "")
        else:
            event["cost_usd"] = max(g["cost"], 0.0)
        yield TOPIC_RESOURCE_USAGE, rid, msgspec.json.encode(event)


def over_no_time(table: pa.Table) -> int:
    """The bill's usage charges whose period ends where it starts, which :func:`usage_records` leaves out
    (their dollars over no time are no rate an event can carry; the stored bill keeps them)."""
    usage = pc.and_(pc.equal(table.column("charge_category"), "Usage"),
                    pc.equal(table.column("charge_period_end"), table.column("charge_period_start")))  # fmt: skip
    return int(pc.sum(pc.cast(usage, pa.int64())).as_py() or 0)


def _group(groups: dict[tuple[str, datetime, datetime], dict[str, Any]], rid: str, row: dict[str, Any],
           kind: str) -> dict[str, Any]:  # fmt: skip
    key = (rid, row["charge_period_start"], row["charge_period_end"])
    g = groups.get(key)
    if g is None:
        g = groups[key] = {
            "type": kind, "provider": row["provider_name"], "account": row["sub_account_id"], "region": row["region_id"],
            "pricing": "reserved" if kind == COMMITMENT else _PRICING.get(row["pricing_category"], "on_demand"),
            "tags": _carried(row["tags"]), "cost": 0.0, "used": 0.0, "unused": 0.0,
        }  # fmt: skip
    return g


def _carried(tags: list[tuple[str, str]] | None) -> dict[str, str]:
    """The bill's tags an event can carry (keys less AWS's ``user:``): a tag longer than the contract
    takes, or one past its count, is left out of the event rather than the event refused with its dollars
    (the bill in the store keeps every tag)."""
    carried: dict[str, str] = {}
    for k, v in tags or []:
        key = k.removeprefix("user:")
        if len(key) <= MAX_ID and len(v) <= MAX_TAG_VALUE and len(carried) < MAX_TAGS:
            carried[key] = v
    return carried


def telemetry_sql(db: str) -> str:
    """The resources that sent usage telemetry of their own (not the bill's events)."""
    return f"SELECT DISTINCT resource_id FROM {db}.resource_usage WHERE JSONExtractString(extra, 'billed_from') = ''"
