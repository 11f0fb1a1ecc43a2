"""Prices (``rules/pricing.yaml``) and the one pricer that turns them into dollars.

Every dollar burnwatch reports starts here. :meth:`Pricer.cost` says what one usage
interval cost (the exporter's ``cost_usd``, else the rate the FOCUS bill charged the
resource (:mod:`detector.billing.rates`), else the price list's rate over the interval,
or the bytes a bucket holds; egress by destination class), and :func:`usd_over` is the
only place a rate per hour meets a duration. The engine prices each usage event once and
hands the result to the detectors (``ResourceInfo.interval_usd``, ``usd_per_hour``) and
the anomaly model's features; the store writes the same figure into the ``usd`` column.
A cost is a pure function of the event and the price list, so all of them agree, and
an untagged bucket's alert adds up to what its stored rows say it cost.
"""

from __future__ import annotations

import re
from datetime import date
from typing import Any, Protocol

import msgspec
import structlog
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["HOURS_PER_MONTH", "ApiPrice", "BilledRate", "CapacityTier", "EgressPrices", "InstancePrice", "IntervalCost",
           "LlmModel", "Pricer", "Pricing", "RegionalPrices", "SelfHost", "egress_destination", "usd_over"]


class InstancePrice(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    on_demand: float = Field(ge=0)
    spot: float | None = Field(default=None, ge=0)
    reserved: float | None = Field(default=None, ge=0)
    gpus: int = Field(default=0, ge=0)
    gpu_model: str = ""
    gpu_mem_gb: float = Field(default=0, ge=0)
    """Memory of one GPU, so a downsizing suggestion keeps the model in memory."""
    provider: str = ""


class EgressPrices(BaseModel):
    """USD per GB of network egress by destination class (AWS list prices, first tier)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    same_region: float = Field(default=0.01, ge=0)
    inter_region: float = Field(default=0.02, ge=0)
    internet: float = Field(default=0.09, ge=0)


class CapacityTier(BaseModel):
    """One size of a managed store (a vector database plan, a volume size) and its price."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = ""
    capacity_gb: float = Field(gt=0)
    usd_per_month: float = Field(ge=0)


class RegionalPrices(BaseModel):
    """On-demand USD/hour of instance types by region, with where and when they were read."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    as_of: date | None = None
    source: str = ""
    on_demand: dict[str, dict[str, float]] = {}
    """Instance type → region → on-demand USD per hour."""

    def hourly(self, instance_type: str, region: str) -> float | None:
        price = self.on_demand.get(instance_type, {}).get(region)
        return price if price is not None and price > 0 else None

    def cheapest(self, instance_type: str, regions: list[str] | None = None) -> tuple[str, float] | None:
        """The listed region (of ``regions``, when given) where ``instance_type`` costs least,
        and its price; ties go to the first listed."""
        listed = [(r, p) for r, p in self.on_demand.get(instance_type, {}).items()
                  if p > 0 and (not regions or r in regions)]  # fmt: skip
        return min(listed, key=lambda rp: rp[1], default=None)


class ApiPrice(BaseModel):
    """A hosted model API's list price, per million tokens, with when and where it was read."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    provider: str = ""
    usd_per_1m_input: float = Field(ge=0)
    usd_per_1m_output: float = Field(ge=0)
    as_of: date | None = None
    source: str = ""

    def usd(self, input_tokens: float, output_tokens: float) -> float:
        return (input_tokens * self.usd_per_1m_input + output_tokens * self.usd_per_1m_output) / 1e6


class SelfHost(BaseModel):
    """How a model (or the open model that would replace an API one) is served on your own GPUs:
    the instance type and the output tokens per second one instance sustains at acceptable latency."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    instance_type: str
    output_tokens_per_s: float = Field(gt=0)
    model: str = ""
    """The open model served, when it is not the API's own (``llama-3.1-70b-instruct`` for ``gpt-4o``)."""


class LlmModel(BaseModel):
    """One model's two ways to be had: its hosted API price, and serving it yourself."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    api: ApiPrice | None = None
    self_host: SelfHost | None = None


class Pricing(BaseModel):
    """Price list; ``hourly`` answers None for an instance type it does not know."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    reserved_discount: float = Field(default=0.6, gt=0, le=1)
    instances: dict[str, InstancePrice] = {}
    egress_per_gb: EgressPrices = EgressPrices()
    storage_usd_per_gb_month: float = Field(default=0.023, ge=0)
    """Object storage, for buckets whose usage events carry no cost (S3 Standard list price)."""
    capacity_tiers: dict[str, list[CapacityTier]] = {}
    """Resource type → its sizes, so a capacity alert can name the next one and its price."""
    regions: RegionalPrices = RegionalPrices()
    """On-demand prices per region (``wrong_region``); the pricer itself uses ``instances``."""
    llm_models: dict[str, LlmModel] = {}
    """Model name → its API price and its self-hosting (``build_or_call``)."""

    def llm_model(self, name: str) -> LlmModel | None:
        """The listed model ``name`` is, or a dated snapshot of: the providers' usage exports name
        the snapshot served (``gpt-4o-2024-08-06``, ``claude-3-5-sonnet-20241022``), priced as the
        model it pins. Only a trailing date is dropped: ``gpt-4o-audio-preview`` is not ``gpt-4o``."""
        found = self.llm_models.get(name)
        if found is None and (undated := _SNAPSHOT_DATE.sub("", name)) != name:
            found = self.llm_models.get(undated)
        return found

    def next_tier(self, resource_type: str, capacity_bytes: float) -> CapacityTier | None:
        """The smallest listed size above ``capacity_bytes``, or None."""
        bigger = [t for t in self.capacity_tiers.get(resource_type, []) if t.capacity_gb * 1e9 > capacity_bytes * 1.0001]
        return min(bigger, key=lambda t: t.capacity_gb, default=None)

    def hourly(self, instance_type: str, pricing: str = "on_demand") -> float | None:
        price = self.instances.get(instance_type)
        if price is None:
            return None
        if pricing == "spot" and price.spot is not None:
            return price.spot
        if pricing == "reserved":
            return price.reserved if price.reserved is not None else price.on_demand * self.reserved_discount
        return price.on_demand


_SNAPSHOT_DATE = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8})$")
"""A model snapshot's trailing date: ``-2024-08-06`` (OpenAI), ``-20241022`` (Anthropic)."""

HOURS_PER_MONTH = 730.0
"""The clouds' billing month (8,760 hours / 12): monthly prices and "per month if left"."""


def usd_over(usd_per_hour: float, seconds: float) -> float:
    """Dollars of a rate per hour held for ``seconds``: the one place a price meets a duration."""
    return usd_per_hour * seconds / 3600.0


def storage_usd(stored_bytes: float, seconds: float, usd_per_gb_month: float) -> float:
    """Dollars of keeping ``stored_bytes`` for ``seconds`` at a price per GB-month (the clouds'
    month: :data:`HOURS_PER_MONTH`)."""
    return usd_over(stored_bytes / 1e9 * usd_per_gb_month / HOURS_PER_MONTH, seconds)


class IntervalCost(msgspec.Struct, frozen=True, gc=False):
    """What one usage interval cost, as stored with it and as detectors count it."""

    usd: float
    """The resource's dollars (0 while stopped or when nothing prices it)."""
    egress_usd: float
    """Its egress, priced by destination class."""
    usd_per_hour: float | None
    """The rate the interval was billed at while running; None when stopped or unpriced."""


log = structlog.get_logger("burnwatch.pricing")
MAX_UNPRICED_SAID = 100
"""Kinds of unpriced usage said at most: a producer inventing instance types floods no log."""


class BilledRate(Protocol):
    """Rates learnt from the bill (:class:`detector.billing.rates.BilledRates`)."""

    def hourly(self, resource_id: str, t: float, instance_type: str = "", region: str = "",
               pricing: str = "on_demand") -> float | None: ...  # fmt: skip


class Pricer:
    """Prices usage intervals from one price list (see the module docstring)."""

    def __init__(self, pricing: Pricing | None = None, billed: BilledRate | None = None, *, say: bool = False) -> None:
        """``say``: log usage nothing prices (:meth:`_unpriced`); the engine's pricer does, one for the rules in
        force, and not the pricers made per stored batch, which would say it again each batch."""
        self.pricing = pricing or Pricing()
        self.billed = billed
        """What the bill charged (``detector.billing.rates.BilledRates``), asked before the price list."""
        self.unpriced: set[tuple[str, str]] | None = set() if say else None
        """(resource type, instance type) of running intervals nothing priced, each said once (:meth:`_unpriced`)."""

    def cost(self, event: Any) -> IntervalCost:
        """The cost of one usage interval: ``cost_usd`` when the exporter sent it, else (while
        running) the rate the bill charged it, else the list price of its instance type and
        pricing model, else the bytes a storage bucket holds at the object-storage price;
        nothing else prices it."""
        usd, rate = self.interval(event)
        return IntervalCost(usd=usd, egress_usd=self.egress_usd(event), usd_per_hour=rate)

    def interval(self, event: Any) -> tuple[float, float | None]:
        """:meth:`cost`'s dollars of the interval and rate per hour, without its egress: what the
        engine keeps of every usage event (the egress is priced where it is stored and judged)."""
        usd = event.cost_usd
        rate = None
        if event.state == "running":
            if usd is None:
                if self.billed is not None:
                    rate = self.billed.hourly(event.resource_id, event.ts.timestamp(), event.instance_type,
                                              event.region, event.pricing)  # fmt: skip
                if rate is None:
                    rate = self.pricing.hourly(event.instance_type, event.pricing)
                if rate is None and event.storage_bytes is not None and event.resource_type == "storage_bucket":
                    rate = self.storage_rate(event.storage_bytes, self.pricing.storage_usd_per_gb_month)
                if rate is None and self.unpriced is not None and event.instance_type:
                    self._unpriced(event, self.unpriced)  # (with no instance type, no price list would price it)
                usd = usd_over(rate, event.interval_s) if rate is not None else 0.0
            else:
                rate = usd * 3600.0 / event.interval_s
        elif usd is None:
            usd = 0.0
        return usd, rate

    @staticmethod
    def _unpriced(event: Any, said: set[tuple[str, str]]) -> None:
        """Say once per kind that a running resource costs $0 here: an instance type the price list
        lacks (a new one, a typo, the bridge's usage events, which carry no ``cost_usd``) would otherwise
        put $0.00/h on its alerts with nothing said."""
        kind = (event.resource_type, event.instance_type)
        if kind not in said and len(said) < MAX_UNPRICED_SAID:
            said.add(kind)
            log.warning("unpriced_usage", resource_type=event.resource_type, instance_type=event.instance_type,
                        resource_id=event.resource_id,
                        note="no cost_usd, no billed rate and no list price: its alerts put $0 on it "
                             "($0.00/h); add the instance type to pricing.yaml beside the rules, or send cost_usd")  # fmt: skip

    def egress_usd(self, event: Any) -> float:
        """An interval's egress dollars at its destination class's price."""
        if not event.egress_bytes:
            return 0.0
        return event.egress_bytes / 1e9 * self.egress_usd_per_gb(event.region, event.dest_region)

    def egress_usd_per_gb(self, region: str, dest_region: str) -> float:
        return float(getattr(self.pricing.egress_per_gb, egress_destination(region, dest_region)))

    def storage_usd_per_gb_month(self, event: Any) -> float | None:
        """What a bucket pays per GB-month: from its billed cost when the exporter sent one,
        else None (the price list's :attr:`Pricing.storage_usd_per_gb_month` then applies)."""
        if event.cost_usd is None or not event.storage_bytes:
            return None
        gb_months = event.storage_bytes / 1e9 * event.interval_s / (HOURS_PER_MONTH * 3600.0)
        return event.cost_usd / gb_months

    @staticmethod
    def storage_rate(stored_bytes: float, usd_per_gb_month: float) -> float:
        """Dollars per hour of keeping ``stored_bytes``."""
        return storage_usd(stored_bytes, 3600.0, usd_per_gb_month)


def egress_destination(region: str, dest_region: str) -> str:
    """``same_region``, ``inter_region`` or ``internet``: how the clouds bill a transfer.
    An empty ``dest_region`` (or ``internet``) is traffic leaving the cloud."""
    if not dest_region or dest_region == "internet":
        return "internet"
    return "same_region" if dest_region == region else "inter_region"
