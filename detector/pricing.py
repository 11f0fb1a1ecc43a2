"""Hourly prices from ``rules/pricing.yaml``, for usage events that carry no cost."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["InstancePrice", "Pricing", "load_pricing"]


class InstancePrice(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    on_demand: float = Field(ge=0)
    spot: float | None = Field(default=None, ge=0)
    reserved: float | None = Field(default=None, ge=0)
    gpus: int = Field(default=0, ge=0)
    gpu_model: str = ""


class Pricing(BaseModel):
    """Price list; ``hourly`` answers None for an instance type it does not know."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reserved_discount: float = Field(default=0.6, gt=0, le=1)
    instances: dict[str, InstancePrice] = {}

    def hourly(self, instance_type: str, pricing: str = "on_demand") -> float | None:
        price = self.instances.get(instance_type)
        if price is None:
            return None
        if pricing == "spot" and price.spot is not None:
            return price.spot
        if pricing == "reserved":
            return price.reserved if price.reserved is not None else price.on_demand * self.reserved_discount
        return price.on_demand


def load_pricing(path: str | Path) -> Pricing:
    """Load and validate a pricing file; errors name the file and the field."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
        return Pricing.model_validate(data)
    except (yaml.YAMLError, ValidationError) as exc:
        raise ValueError(f"{path}: invalid pricing file: {exc}") from exc
