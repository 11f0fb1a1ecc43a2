"""Re-price incidents from the bill: a bill arrives hours to a day after the events, and
finance trusts it, so once it covers an incident's whole episode the incident's record
gains what the bill charged (``alert_billing``, migration 0014).

The incident's dollars are scaled by the bill over the events for the same resource, hours and
kind of charge: billed_waste_usd = waste_usd x billed_usd / claimed_usd. An egress incident
(``egress_runaway``) compares the events' egress dollars with the bill's network charges
(ServiceCategory ``Networking``, or usage in bytes); every other incident the events' other
dollars with the bill's other usage charges: scaling an egress incident by the instance's
compute bill had priced $77.92 of egress at $0.81. claimed_usd is what the events said over
the episode (``cost_hourly``, each hour prorated by its overlap); billed_usd the bill's
EffectiveCost over it: a charge in hours with its ConsumedQuantity counts the hours the episode
overlaps out of those it billed (a day's charge for 9 hours of a host is 9 hours' worth, not
a 24th of it an hour: the episode's hours are hours it ran), any other charge is prorated by
its overlap with its period. Only usage charges in US dollars count: a credit, a tax or a
purchase is no hour's use of the resource (a credit netted in made an idle GPU's billed waste
negative), and a bill in another currency is no dollar figure; a usage refund larger than
the usage bills the waste at nothing, never below. An episode the bill does not cover end to
end (its charges of that kind for the resource leave a gap, or stop before the episode
ends) is left for a later bill. One INSERT ... SELECT: the work is the engine's, never a loop
per alert.
"""

from __future__ import annotations

from typing import NamedTuple

from detector.billing.rates import HOUR_UNITS, PRICED_IN
from detector.limits import Limits
from detector.store.connection import Connection

__all__ = ["MAX_EGRESS_USD_PER_GB", "Repriced", "max_egress_usd_per_hour", "reprice"]

_EGRESS_TYPES = ("egress_runaway",)
"""Incident types whose waste is egress: priced against the bill's network charges."""
_DATA_UNITS = ("Bytes", "Byte", "B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB")
"""ConsumedUnit values of data moved (a transfer), not stored (GB-Mo) or run (Hours)."""

_JUDGED = """
WITH episodes AS (
    SELECT alert_id, resource_id, episode_start AS s,
           ifNull(resolved_at, updated_at) AS e, waste_usd, type IN {egress_types} AS egress,
           toUnixTimestamp64Milli(episode_start) AS s_ms, toUnixTimestamp64Milli(ifNull(resolved_at, updated_at)) AS e_ms
    FROM {db}.alerts FINAL
    WHERE waste_usd > 0 AND ifNull(resolved_at, updated_at) > episode_start
      AND resource_id IN (SELECT resource_id FROM {db}.billing_charges WHERE ingest_id = {{ingest_id:String}}
                          AND charge_category = 'Usage' AND billing_currency = '{priced_in}')
),
charges AS (
    -- a resource's charges of one kind netted per period (a refund or correction cancels its charge whatever
    -- quantity it states), with the hours billed in hour units
    SELECT resource_id, p_s, p_e, network, sum(usd) AS usd, sum(hours) * 3600000 AS used_ms
    FROM (SELECT resource_id, toFloat64(effective_cost) AS usd,
                 toUnixTimestamp64Milli(charge_period_start) AS p_s, toUnixTimestamp64Milli(charge_period_end) AS p_e,
                 if(consumed_unit IN {hour_units}, toFloat64(ifNull(consumed_quantity, 0)), 0) AS hours,
                 service_category = 'Networking' OR consumed_unit IN {data_units} AS network
          FROM {db}.billing
          WHERE charge_category = 'Usage' AND billing_currency = '{priced_in}'
            AND resource_id IN (SELECT resource_id FROM episodes))
    GROUP BY resource_id, p_s, p_e, network
),
billed AS (
    SELECT ep.alert_id AS alert_id,
           -- each period's share of the episode: of the hours it billed where they are fewer than its own (a day
           -- billing 9 hours of a host), else of the period (an hour billing 8 GPU-hours is that hour's)
           sum(b.usd * if(b.used_ms > 0 AND b.used_ms < b.p_e - b.p_s,
                          least(1, greatest(0, least(ep.e_ms, b.p_e) - greatest(ep.s_ms, b.p_s)) / b.used_ms),
                          greatest(0, least(ep.e_ms, b.p_e) - greatest(ep.s_ms, b.p_s)) / greatest(1, b.p_e - b.p_s)))
               AS billed_usd,
           -- the episode's milliseconds the bill's charge periods cover (each period once)
           arraySum(arrayMap(p -> greatest(0, least(any(ep.e_ms), p.2) - greatest(any(ep.s_ms), p.1)),
                             groupUniqArray((b.p_s, b.p_e)))) AS covered_ms
    FROM episodes AS ep
    INNER JOIN charges AS b ON b.resource_id = ep.resource_id
    WHERE b.p_e > ep.s_ms AND b.p_s < ep.e_ms AND b.network = ep.egress
    GROUP BY ep.alert_id
),
claimed AS (
    SELECT ep.alert_id AS alert_id,
           sum(if(ep.egress, c.egress_usd, c.usd)
               * greatest(0, least(ep.e_ms, toInt64(toUnixTimestamp(c.hour)) * 1000 + 3600000)
                             - greatest(ep.s_ms, toInt64(toUnixTimestamp(c.hour)) * 1000)) / 3600000) AS claimed_usd
    FROM episodes AS ep
    INNER JOIN {db}.cost_hourly AS c ON c.resource_id = ep.resource_id
    WHERE c.hour + INTERVAL 1 HOUR > ep.s AND c.hour < ep.e
    GROUP BY ep.alert_id
)
SELECT ep.alert_id AS alert_id, ep.resource_id AS resource_id, ep.s AS s, ep.e AS e, c.claimed_usd AS claimed_usd,
       b.billed_usd AS billed_usd, ep.waste_usd AS waste_usd,
       ep.waste_usd * greatest(b.billed_usd, 0) / c.claimed_usd AS billed_waste_usd,
       b.billed_usd <= if(ep.egress, {{max_egress_usd_per_hour:Float64}}, {{max_usd_per_hour:Float64}})
                       * (ep.e_ms - ep.s_ms) / 3600000 AS within_limits,
       -- periods that cover more of the episode than it lasted overlap one another: the same hours
       -- billed at two granularities (an hourly and a daily export of one month), which would count twice
       b.covered_ms > ep.e_ms - ep.s_ms + 1000 AS overlapping
FROM episodes AS ep
INNER JOIN billed AS b ON b.alert_id = ep.alert_id
INNER JOIN claimed AS c ON c.alert_id = ep.alert_id
WHERE b.covered_ms >= ep.e_ms - ep.s_ms AND c.claimed_usd > 0
"""

_INSERT = """
INSERT INTO {db}.alert_billing (alert_id, resource_id, episode_start, episode_end, claimed_usd, billed_usd,
                                 waste_usd, billed_waste_usd, repriced_at, ingest_id)
SELECT alert_id, resource_id, s, e, claimed_usd, billed_usd, waste_usd, billed_waste_usd, now64(3), {{ingest_id:String}}
FROM ({judged}) WHERE within_limits AND NOT overlapping
"""

_LEFT = """
SELECT countIf(NOT within_limits AND NOT overlapping) AS n,
       groupUniqArrayIf(5)(resource_id, NOT within_limits AND NOT overlapping) AS some,
       countIf(overlapping) AS n_overlapping, groupUniqArrayIf(5)(resource_id, overlapping) AS some_overlapping
FROM ({judged})
"""


class Repriced(NamedTuple):
    """What :func:`reprice` did: incidents re-priced, those the bill prices beyond ``limits.yaml``
    (``some_beyond``: up to five of their resources), and those whose charges overlap one another
    over the episode (the same hours at two granularities: ``some_overlapping``)."""

    repriced: int
    beyond_limits: int
    some_beyond: list[str]
    overlapping: int
    some_overlapping: list[str]


def reprice(store: Connection, ingest_id: str, limits: Limits | None = None) -> Repriced:
    """Re-price every incident on a resource of ingest ``ingest_id`` whose episode the bill
    covers end to end. A later bill's figure replaces an earlier one. An incident whose bill
    charges the resource more over the episode's hours than its events may claim (``limits.yaml``:
    ``max_usd_per_hour``, or for egress ``max_egress_gbit_per_s`` at :data:`MAX_EGRESS_USD_PER_GB`)
    is not re-priced by this bill, and is counted in ``beyond_limits``: the reader bounds only
    charges in hours, and a corrupt charge in another unit (GB, requests) would otherwise price the
    waste at it. Nor is one whose charges' periods overlap (``overlapping``)."""
    db = store.db
    limits = limits or Limits()
    judged = _JUDGED.format(db=db, priced_in=PRICED_IN, egress_types=_sql_tuple(_EGRESS_TYPES),
                            hour_units=_sql_tuple(HOUR_UNITS), data_units=_sql_tuple(_DATA_UNITS))
    parameters = {"ingest_id": ingest_id, "max_usd_per_hour": limits.max_usd_per_hour,
                  "max_egress_usd_per_hour": max_egress_usd_per_hour(limits)}  # fmt: skip
    with store.lock:
        store.client.command(_INSERT.format(db=db, judged=judged), parameters=parameters)
    (left,) = store.query(_LEFT.format(judged=judged), parameters)
    rows = store.query(f"SELECT uniqExact(alert_id) AS n FROM {db}.alert_billing WHERE ingest_id = {{i:String}}",
                       {"i": ingest_id})
    return Repriced(int(rows[0]["n"]), int(left["n"]), list(left["some"]), int(left["n_overlapping"]),
                    list(left["some_overlapping"]))  # fmt: skip


MAX_EGRESS_USD_PER_GB = 0.25
"""Above any cloud's list price for internet egress (about $0.05-0.23 a GB by region and tier): with
``max_egress_gbit_per_s`` it bounds what a resource's egress may cost an hour."""


def max_egress_usd_per_hour(limits: Limits) -> float:
    """The most an hour of a resource's egress may cost: ``max_egress_gbit_per_s`` flat out (GB an hour)
    at :data:`MAX_EGRESS_USD_PER_GB` (400 Gbit/s: 180,000 GB, $45,000 an hour)."""
    return limits.max_egress_gbit_per_s * 3600 / 8 * MAX_EGRESS_USD_PER_GB


def _sql_tuple(values: tuple[str, ...]) -> str:
    """``('a', 'b')``: constants of this module, quoted for SQL (none holds a quote)."""
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"
