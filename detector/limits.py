"""Plausibility bounds on usage events, from ``rules/limits.yaml``.

The contract (:mod:`detector.events`) only refuses what cannot be stored. A value
that can be stored can still be absurd: ``cost_usd: 1e6`` for one minute would post
"$60,000,000/h" and put it into every total. These bounds refuse such an event (it
goes to the dead-letter topic with the field, its value and the bound) before it is
stored or detected. They are deliberately loose, an order of magnitude above any
real price list, so only broken or hostile producers meet them; a fleet that
legitimately exceeds one raises it in ``limits.yaml``.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from detector.units import Duration

__all__ = ["LIMITS_FILE", "Limits"]

LIMITS_FILE = "limits.yaml"


class Limits(BaseModel):
    """The bounds; every one has a default, so a missing ``limits.yaml`` means these."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_usd_per_hour: Annotated[float, Field(gt=0)] = 2000.0
    """``cost_usd`` scaled by ``interval_s`` to dollars per hour, per resource. The most
    expensive cloud GPU hosts list at about $100/h (8 x H100/H200, on demand)."""
    max_interval: Annotated[Duration, Field(gt=0)] = 86_400.0
    """``interval_s``: exporters send 1 minute to 1 hour; a day is already generous."""
    max_egress_gbit_per_s: Annotated[float, Field(gt=0)] = 400.0
    """``egress_bytes`` over ``interval_s``, in Gbit/s: a 400 Gbit/s NIC sending flat out."""

    @classmethod
    def none(cls) -> Limits:
        """No bound at all, for a decoder that checks only what can be stored (a file's bounds are
        finite: ``.inf`` there is refused with its line, so this is made without validation)."""
        return cls.model_construct(max_usd_per_hour=math.inf, max_interval=math.inf, max_egress_gbit_per_s=math.inf)

    @property
    def max_egress_bytes_per_s(self) -> float:
        return self.max_egress_gbit_per_s * 1e9 / 8
