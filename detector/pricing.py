"""Hourly prices from ``rules/pricing.yaml``, for usage events that carry no cost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["HOURS_PER_MONTH", "CapacityTier", "EgressPrices", "InstancePrice", "Pricing", "egress_destination",
           "interval_usd", "load_pricing"]


class InstancePrice(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

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

    model_config = ConfigDict(extra="forbid", frozen=True)

    same_region: float = Field(default=0.01, ge=0)
    inter_region: float = Field(default=0.02, ge=0)
    internet: float = Field(default=0.09, ge=0)


class CapacityTier(BaseModel):
    """One size of a managed store (a vector database plan, a volume size) and its price."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    capacity_gb: float = Field(gt=0)
    usd_per_month: float = Field(ge=0)


class Pricing(BaseModel):
    """Price list; ``hourly`` answers None for an instance type it does not know."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reserved_discount: float = Field(default=0.6, gt=0, le=1)
    instances: dict[str, InstancePrice] = {}
    egress_per_gb: EgressPrices = EgressPrices()
    storage_usd_per_gb_month: float = Field(default=0.023, ge=0)
    """Object storage, for buckets whose usage events carry no cost (S3 Standard list price)."""
    capacity_tiers: dict[str, list[CapacityTier]] = {}
    """Resource type → its sizes, so a capacity alert can name the next one and its price."""

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


HOURS_PER_MONTH = 730.0
"""The clouds' billing month (8,760 hours / 12): monthly prices and "per month if left"."""


def interval_usd(pricing: Pricing, event: Any) -> tuple[float, float]:
    """(resource dollars, egress dollars) of one usage interval, as stored with it: the cost the
    exporter sent, else the list price of the instance while it runs (or of the bytes a bucket
    holds); egress priced by destination class. Rollups sum these and need no price list."""
    usd = event.cost_usd
    if usd is None:
        usd = 0.0
        if event.state == "running":
            hourly = pricing.hourly(event.instance_type, event.pricing)
            if hourly is not None:
                usd = hourly * event.interval_s / 3600.0
            elif event.storage_bytes is not None and event.resource_type == "storage_bucket":
                gb_months = event.storage_bytes / 1e9 * event.interval_s / (HOURS_PER_MONTH * 3600.0)
                usd = gb_months * pricing.storage_usd_per_gb_month
    egress = 0.0
    if event.egress_bytes:
        price = getattr(pricing.egress_per_gb, egress_destination(event.region, event.dest_region))
        egress = event.egress_bytes / 1e9 * price
    return usd, egress


def egress_destination(region: str, dest_region: str) -> str:
    """``same_region``, ``inter_region`` or ``internet``: how the clouds bill a transfer.
    An empty ``dest_region`` (or ``internet``) is traffic leaving the cloud."""
    if not dest_region or dest_region == "internet":
        return "internet"
    return "same_region" if dest_region == region else "inter_region"


def load_pricing(path: str | Path) -> Pricing:
    """Load and validate a pricing file; errors name the file and the field."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
        return Pricing.model_validate(data)
    except (yaml.YAMLError, ValidationError) as exc:
        raise ValueError(f"{path}: invalid pricing file: {exc}") from exc
