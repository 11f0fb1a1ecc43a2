"""What a model's traffic costs the other way: on the hosted API, or on your own GPUs.

The one calculation behind ``build_or_call``'s alerts and the ``build-or-call`` report
(:mod:`detector.reports`), so the two agree. Prices come from ``rules/pricing.yaml``'s
``llm_models``: the API's list price per million tokens, and the instance type and output
tokens per second one instance sustains. Self-hosting is sized for the busiest hour and
kept on all the time; the API is paid per token.
"""

from __future__ import annotations

import math
from typing import Any

from detector.pricing import LlmModel, Pricing, usd_over

__all__ = ["api_usd", "cheaper_the_other_way", "compare", "self_host_usd"]

HOUR_S = 3600.0


def cheaper_the_other_way(usd: float, alternative_usd: float, min_saving_pct: float) -> bool:
    """Whether the other way costs at least ``min_saving_pct`` percent less than ``usd`` spent
    (the crossover the rule waits a week past, and the report's verdict)."""
    return usd > 0 and alternative_usd <= (1 - min_saving_pct / 100.0) * usd


def api_usd(entry: LlmModel, input_tokens: float, output_tokens: float) -> float | None:
    """The API's list price for these tokens; None when the model has no API price (or the
    tokens are beyond any price)."""
    if entry.api is None:
        return None
    usd = entry.api.usd(input_tokens, output_tokens)
    return usd if math.isfinite(usd) else None


def self_host_usd(entry: LlmModel, pricing: Pricing, peak_output_per_h: float,
                  seconds: float) -> tuple[float, int] | None:  # fmt: skip
    """Serving the model yourself for ``seconds``: enough instances for the busiest hour's
    output tokens, on throughout, at the instance type's list price; with the instance count.
    None when the model has no self-hosting or its instance type no price."""
    host = entry.self_host
    hourly = pricing.hourly(host.instance_type) if host is not None else None
    if host is None or hourly is None:
        return None
    instances = peak_output_per_h / (host.output_tokens_per_s * HOUR_S)
    if not math.isfinite(instances):
        return None
    n = max(1, math.ceil(instances))
    return usd_over(n * hourly, seconds), n


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def compare(row: dict[str, Any], pricing: Pricing, api_types: list[str], tokens_per_request: tuple[float, float],
            min_saving_pct: float) -> dict[str, Any]:  # fmt: skip
    """One report row (a resource's usage over the period: ``resource_type``, ``model``,
    ``hours``, ``usd``, ``requests``, token sums, ``measured_tokens``, the busiest hour's
    requests and output tokens) with the other way's cost, both per 1,000 requests, the
    crossover volume and the verdict."""
    entry = pricing.llm_model(str(row.get("model", "")))
    out = dict(row)
    requests = float(row.get("requests") or 0)
    measured = bool(row.get("measured_tokens"))
    # Requests of intervals without token counts are priced at the assumption, as the detector
    # prices them interval by interval (a row without the split: all of them, unless measured).
    default_unmeasured = 0.0 if measured else requests
    no_in = float(_or(row.get("unmeasured_in_requests"), default_unmeasured))
    no_out = float(_or(row.get("unmeasured_out_requests"), default_unmeasured))
    inp = (float(row.get("input_tokens") or 0) if measured else 0.0) + no_in * tokens_per_request[0]
    outp = (float(row.get("output_tokens") or 0) if measured else 0.0) + no_out * tokens_per_request[1]
    # The busiest hour: measured tokens, plus assumed ones (an upper bound when an hour mixes both).
    peak_unmeasured = _or(row.get("peak_unmeasured_requests_per_h"), 0.0 if measured else row.get("peak_requests_per_h"))
    peak = (float(row.get("peak_output_per_h") or 0) if measured else 0.0) + \
        float(peak_unmeasured or 0) * tokens_per_request[1]  # fmt: skip
    source = ("measured" if not (no_in or no_out) else "partly assumed per request") if measured else "assumed per request"
    usd, hours = float(row.get("usd") or 0), float(row.get("hours") or 0)
    api = row.get("resource_type") in api_types
    out.update(direction="build" if api else "call", token_source=source,
               alternative_usd=None, usd_per_1k_requests=None, alternative_usd_per_1k_requests=None,
               crossover_requests_per_h=None, verdict="not priced")  # fmt: skip
    if entry is None:
        return out
    other = self_host_usd(entry, pricing, peak, hours * HOUR_S) if api else (api_usd(entry, inp, outp), 0)
    if other is None or other[0] is None:
        return out
    alt = other[0]
    per_request_api = api_usd(entry, inp / requests, outp / requests) if requests else None
    one_instance = self_host_usd(entry, pricing, 0.0, HOUR_S)
    # The volume at which the hour costs the same both ways: the self-hosted hour (this
    # endpoint's, or one instance of the replacement) over the API's price of a request.
    hourly = (usd / hours if hours else None) if not api else (one_instance[0] if one_instance else None)
    out.update(
        alternative_usd=round(alt, 2),
        usd_per_1k_requests=round(usd * 1000 / requests, 4) if requests else None,
        alternative_usd_per_1k_requests=round(alt * 1000 / requests, 4) if requests else None,
        crossover_requests_per_h=round(hourly / per_request_api, 0) if hourly and per_request_api else None,
        verdict="switch" if cheaper_the_other_way(usd, alt, min_saving_pct) else "keep",
    )
    if api and other[1]:
        out["self_host_instances"] = other[1]
    return out
