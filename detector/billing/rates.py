"""Prices and owners learnt from the bill: what each resource really paid per hour, and its
finalised tags.

The price list (``rules/pricing.yaml``) says what an hour costs on paper; the bill says
what it cost after negotiated discounts, Savings Plans and reservations, and at the spot
price of the hour. For a usage event without ``cost_usd`` the pricer asks here first
(:meth:`BilledRates.hourly`), then the price list:

1. the resource's own billed rate for the charge period holding the event's time, or its
   latest one when the event is newer than the bill (a bill lags by hours to a day);
2. else the rate the bill shows for its instance type, region and pricing model
   (``x_UsageType`` ``BoxUsage:p5.48xlarge``; FOCUS PricingCategory Standard, Dynamic,
   Committed), per instance-hour billed as the price list's, for a resource the bill does not know yet;
3. else nothing: the price list applies.

A rate is EffectiveCost over ConsumedQuantity for usage measured in hours (instances,
notebooks, endpoints), the quantity at most the charge period's length (a VM billed as
8 GPU-hours and 96 core-hours an hour ran one hour); a commitment's unused rows and usage
in other units (GB-months, requests) price no hour. A correction (``ChargeClass = Correction``) is spread over the
billed hours of the period it restates. Tags: the bill's tags are the finalised ones, so they fill in any
tag a resource's events lack (:meth:`BilledRates.fill_tags`); AWS's ``user:`` prefix of
user-defined tags is dropped, so ``user:team`` is the ``team`` the rules require.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from detector.tag_names import fold

if TYPE_CHECKING:
    import pyarrow as pa

    from detector.store.connection import Connection

__all__ = ["HOUR_UNITS", "PRICED_IN", "BilledRates", "hour_rows", "tag_key"]

PRICED_IN = "USD"
"""The currency every dollar figure is in: a bill in another is stored for queries, never priced from."""

HOUR_UNITS = ("Hours", "Hour", "Hrs", "hours", "hour", "Hrs.")
"""ConsumedUnit values that measure time in hours, as the clouds' FOCUS exports spell them."""
_PRICING = {"Standard": "on_demand", "Dynamic": "spot", "Committed": "reserved"}


def tag_key(key: str) -> str:
    """A bill's tag key as the events spell it: AWS's ``user:`` prefix of user-defined tags dropped."""
    return key.removeprefix("user:")


class BilledRates:
    """Rates per resource over time, per (instance type, region, pricing), and tags per resource."""

    def __init__(self, periods: Iterable[Mapping[str, Any]], tags: Mapping[str, Mapping[str, str]] | None = None,
                 corrections: Iterable[Mapping[str, Any]] = ()) -> None:  # fmt: skip
        """``periods``: one mapping per resource and charge period with ``resource_id``,
        ``start`` and ``end`` (epoch seconds), ``usd`` and ``hours`` (billed), ``usage_type``,
        ``region`` and ``pricing_category``. ``corrections``: ``resource_id``, ``start``, ``end``
        and ``usd`` of each ``ChargeClass = Correction`` charge, spread over the billed hours
        of the periods it covers (a restated day corrects each of its hours)."""
        spans: dict[str, list[dict[str, Any]]] = {}
        for p in sorted(periods, key=lambda p: (p["resource_id"], p["start"])):
            if p["hours"] and p["hours"] > 0:
                # A period bills no more hours of one resource than it lasts: quantities beyond (a VM's hour as 8
                # GPU-hours and 96 core-hours, SKUs of their own) are units of it, not hours it ran, as re-pricing
                # reads them. Fewer (a day's charge for 9 hours) are the hours it ran. The instance type's rate
                # keeps the hours as billed ("billed_hours"): one id billing several instances of it (a capacity
                # reservation's unused ones, an endpoint's) bills an instance-hour each, as the price list prices.
                hours = min(float(p["hours"]), (float(p["end"]) - float(p["start"])) / 3600.0)
                if hours > 0:
                    spans.setdefault(p["resource_id"], []).append({**p, "usd": float(p["usd"]), "hours": hours,
                                                                   "billed_hours": float(p["hours"])})  # fmt: skip
        for c in corrections:
            covered = [p for p in spans.get(c["resource_id"], []) if c["start"] <= p["start"] and p["end"] <= c["end"]]
            hours = sum(p["hours"] for p in covered)
            for p in covered:
                share = p["hours"] / hours  # of the correction: dollars spread, no price meets a duration here
                p["usd"] += share * float(c["usd"])
        by_kind: dict[tuple[str, str, str], list[float]] = {}
        for ps in spans.values():
            for p in ps:
                instance_type = (p.get("usage_type") or "").rpartition(":")[2]
                if instance_type:
                    kind = (instance_type, p.get("region") or "", _PRICING.get(p.get("pricing_category") or "", "on_demand"))
                    totals = by_kind.setdefault(kind, [0.0, 0.0])
                    totals[0] += p["usd"]
                    totals[1] += p["billed_hours"]
        self._starts = {rid: [float(p["start"]) for p in ps] for rid, ps in spans.items()}
        self._rates = {rid: [max(p["usd"] / p["hours"], 0.0) for p in ps] for rid, ps in spans.items()}
        self._by_kind = {k: max(usd / hours, 0.0) for k, (usd, hours) in by_kind.items() if hours > 0}
        self._tags = {rid: {tag_key(k): v for k, v in t.items() if v} for rid, t in (tags or {}).items()}

    def __len__(self) -> int:
        return len(self._rates)

    def hourly(self, resource_id: str, t: float, instance_type: str = "", region: str = "",
               pricing: str = "on_demand") -> float | None:  # fmt: skip
        """Dollars per hour the bill charged ``resource_id`` at time ``t`` (see the module docstring)."""
        starts = self._starts.get(resource_id)
        if starts is not None:
            i = bisect.bisect_right(starts, t) - 1
            return self._rates[resource_id][max(i, 0)]
        return self._by_kind.get((instance_type, region, pricing))

    def fill_tags(self, resource_id: str, tags: dict[str, str]) -> dict[str, str]:
        """``tags`` with what the bill adds: a key the events lack or leave empty, in any case (an event's ``Team``
        is its ``team``: the bill's ``team`` beside it would be read first, :class:`detector.tag_names.TagNames`)."""
        billed = self._tags.get(resource_id)
        if not billed or all(tags.get(k) for k in billed):
            return tags
        written = {fold(k) for k, v in tags.items() if v}
        return {**{k: v for k, v in billed.items() if fold(k) not in written}, **{k: v for k, v in tags.items() if v}}

    @classmethod
    def from_table(cls, table: pa.Table) -> BilledRates:
        """From a bill as :func:`detector.billing.focus.read_focus` reads it (``backtest --bill``)."""
        rows = table.select(["resource_id", "charge_period_start", "charge_period_end", "effective_cost",
                             "consumed_quantity", "consumed_unit", "charge_category", "commitment_discount_status",
                             "region_id", "pricing_category", "x_columns", "tags", "charge_class"]).to_pylist()  # fmt: skip
        periods: dict[tuple[str, float, float], dict[str, Any]] = {}
        tags: dict[str, tuple[float, dict[str, str]]] = {}
        corrections: list[dict[str, Any]] = []
        for r in rows:
            rid = r["resource_id"]
            if not rid:
                continue
            start = r["charge_period_start"].timestamp()
            if r["tags"] and start >= tags.get(rid, (float("-inf"), {}))[0]:
                tags[rid] = (start, dict(r["tags"]))
            if r["charge_category"] == "Usage" and r["charge_class"] == "Correction":
                corrections.append({"resource_id": rid, "start": start, "end": r["charge_period_end"].timestamp(),
                                    "usd": float(r["effective_cost"])})  # fmt: skip
                continue
            if not _prices_an_hour(r["charge_category"], r["consumed_unit"], r["commitment_discount_status"]):
                continue
            key = (rid, start, r["charge_period_end"].timestamp())
            p = periods.setdefault(key, {"resource_id": rid, "start": start, "end": key[2], "usd": 0.0, "hours": 0.0,
                                         "usage_type": dict(r["x_columns"] or []).get("x_UsageType", ""),
                                         "region": r["region_id"], "pricing_category": r["pricing_category"]})  # fmt: skip
            p["usd"] += float(r["effective_cost"])
            p["hours"] += float(r["consumed_quantity"] or 0)
        return cls(periods.values(), {rid: t for rid, (_, t) in tags.items()}, corrections)

    @classmethod
    def from_store(cls, store: Connection) -> BilledRates:
        """From the bills stored by ``burnwatch ingest focus`` (the worker, at start and on reload)."""
        units = ", ".join(f"'{u}'" for u in HOUR_UNITS)
        periods = store.query(f"""
            SELECT resource_id, toUnixTimestamp64Milli(charge_period_start) / 1000 AS start,
                   toUnixTimestamp64Milli(charge_period_end) / 1000 AS end, toFloat64(sum(effective_cost)) AS usd,
                   toFloat64(sum(ifNull(consumed_quantity, 0))) AS hours, any(x_columns['x_UsageType']) AS usage_type,
                   any(region_id) AS region, any(pricing_category) AS pricing_category
            FROM {store.db}.billing
            WHERE resource_id != '' AND charge_category = 'Usage' AND consumed_unit IN ({units})
                  AND commitment_discount_status != 'Unused' AND charge_class != 'Correction'
                  AND billing_currency = '{PRICED_IN}'
            GROUP BY resource_id, start, end""")  # fmt: skip
        corrections = store.query(f"""
            SELECT resource_id, toUnixTimestamp64Milli(charge_period_start) / 1000 AS start,
                   toUnixTimestamp64Milli(charge_period_end) / 1000 AS end, toFloat64(effective_cost) AS usd
            FROM {store.db}.billing
            WHERE resource_id != '' AND charge_category = 'Usage' AND charge_class = 'Correction'
                  AND billing_currency = '{PRICED_IN}'""")  # fmt: skip
        tags = store.query(f"SELECT resource_id, argMax(tags, charge_period_start) AS latest FROM {store.db}.billing "
                           f"WHERE resource_id != '' AND length(tags) > 0 GROUP BY resource_id")  # fmt: skip
        return cls(periods, {r["resource_id"]: r["latest"] for r in tags}, corrections)


def hour_rows(columns: Mapping[str, Any]) -> Any:
    """Which rows of a bill's columns (:func:`detector.billing.focus.read_focus`'s names) price a resource's
    hours, all at once: :func:`_prices_an_hour`'s rule, for a row with a resource and some hours that is no
    correction (what :meth:`BilledRates.from_table` takes a rate from). A boolean array, no null."""
    import pyarrow as pa
    import pyarrow.compute as pc

    quantity = pc.cast(columns["consumed_quantity"], pa.float64())
    usage = pc.and_(pc.equal(columns["charge_category"], "Usage"), pc.not_equal(columns["charge_class"], "Correction"))
    hours = pc.and_(pc.is_in(columns["consumed_unit"], pa.array(HOUR_UNITS)), pc.not_equal(columns["resource_id"], ""))
    used = pc.and_(pc.not_equal(columns["commitment_discount_status"], "Unused"), pc.greater(quantity, 0.0))
    return pc.and_(pc.and_(usage, hours), used).fill_null(False)


def _prices_an_hour(charge_category: str, consumed_unit: str, commitment_status: str) -> bool:
    """Whether a charge is usage measured in hours that a resource used (not a commitment's unused part)."""
    return charge_category == "Usage" and consumed_unit in HOUR_UNITS and commitment_status != "Unused"
