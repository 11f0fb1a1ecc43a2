"""The build_or_call detector on crafted hourly usage: self-hosted endpoints against the API
price of their model, and API spend against serving the model yourself."""

from __future__ import annotations

import math

import msgspec
import pytest

from detector.engine import Engine
from detector.events import UsageEvent
from tests.helpers import T0, at

HOUR = 3600.0
DAY = 86_400.0
TAGS = {"team": "search", "owner": "dana", "project": "rag"}

# rules/pricing.yaml: llama-3.1-8b-instruct at $0.18/1M tokens either way; g5.xlarge $1.006/h
# serving 800 output tokens/s. gpt-4o at $2.50/$10.00 per 1M; its replacement a 70B on a
# p4d.24xlarge ($32.77/h) at 2,500 output tokens/s. The rule assumes 500 + 250 tokens a request.
G5 = 1.006
P4D = 32.77
PER_8B_REQUEST = 750 * 0.18 / 1e6


def endpoint(n_hours: float, rps=lambda h: 0.5, *, model: str = "llama-3.1-8b-instruct", start: float = T0,
             state=lambda h: "running") -> list[UsageEvent]:  # fmt: skip
    """A self-hosted g5.xlarge priced from the list (no cost_usd), reporting its requests."""
    return [
        UsageEvent(ts=at(start + h * HOUR), resource_id="ep-1", resource_type="inference_endpoint",
                   instance_type="g5.xlarge", account="acct", region="us-east-1", interval_s=HOUR, state=state(h),
                   requests=int(rps(h) * HOUR), tags={**TAGS, "model": model})
        for h in range(int(n_hours))
    ]  # fmt: skip


def api(n_hours: float, rps=lambda h: 5.0, *, model: str = "gpt-4o", tokens: tuple[int, int] = (500, 250),
        measured: bool = True) -> list[UsageEvent]:  # fmt: skip
    """An API account's hourly usage export: its cost, requests and (when measured) tokens."""
    events = []
    for h in range(int(n_hours)):
        requests = int(rps(h) * HOUR)
        inp, out = requests * tokens[0], requests * tokens[1]
        cost = (inp * 2.50 + out * 10.00) / 1e6 if model.startswith("gpt-4o-2") or model == "gpt-4o" \
            else (inp * 0.15 + out * 0.60) / 1e6  # fmt: skip
        events.append(UsageEvent(
            ts=at(T0 + h * HOUR), resource_id="openai-prod", resource_type="llm_api", provider="openai",
            account="acct", interval_s=HOUR, cost_usd=cost, requests=requests, tags={**TAGS, "model": model},
            metrics={"input_tokens": inp, "output_tokens": out} if measured else {}))
    return events


def daily(events: list[UsageEvent]) -> list[UsageEvent]:
    """The same usage as a daily export: one interval a day with its sums (OpenAI's costs API is daily)."""
    out = []
    for first in range(0, len(events) - 23, 24):
        day = events[first:first + 24]
        out.append(msgspec.structs.replace(
            day[0], interval_s=DAY, cost_usd=sum(e.cost_usd or 0 for e in day), requests=sum(e.requests or 0 for e in day),
            metrics={k: sum(e.metrics.get(k, 0) for e in day) for k in day[0].metrics}))
    return out


def findings(ruleset, events):
    return [f for f in Engine(ruleset).process(events) if f.type == "build_or_call"]


def test_a_light_self_hosted_endpoint_fires_after_a_week_with_the_api_saving(ruleset):
    # 0.5 req/s: 1,800 requests/h cost $1.006 on the GPU and $0.243 on the API.
    events = endpoint(8 * 24 + 5)
    found = findings(ruleset, events)
    fire = next(f for f in found if f.action == "fire")
    assert fire.episode_start == T0 and fire.fired_at == T0 + 7 * DAY  # judged at the close of the 7th day
    d = fire.details
    assert d["direction"] == "call" and d["token_source"] == "assumed per request"
    per_hour = G5 - 1800 * PER_8B_REQUEST
    assert fire.waste_usd == pytest.approx(7 * 24 * per_hour, rel=1e-3)
    assert d["usd_per_1k_requests"] == pytest.approx(G5 / 1.8, rel=1e-3)
    assert d["alternative_usd_per_1k_requests"] == pytest.approx(PER_8B_REQUEST * 1000, rel=1e-3)
    assert d["api_price_as_of"] == "2025-07-01" and d["api_provider"] == "together"
    # At the end of data the open episode counts the eighth day and the 5 hours of the ninth too.
    engine = Engine(ruleset)
    engine.process(events)
    (open_,) = [f for f in engine.open_episodes() if f.type == "build_or_call"]
    assert open_.waste_usd == pytest.approx((8 * 24 + 5) * per_hour, rel=1e-3)


def test_heavy_api_spend_fires_with_the_instances_that_would_serve_it(ruleset):
    # 5 req/s to gpt-4o: $67.50/h. Its 4.5M output tokens an hour fit one p4d (9M/h): $32.77/h.
    (fire,) = [f for f in findings(ruleset, api(7 * 24 + 1)) if f.action == "fire"]
    d = fire.details
    assert d["direction"] == "build" and d["token_source"] == "measured"
    assert d["self_host_instances"] == 1 and d["self_host_model"] == "llama-3.1-70b-instruct"
    api_h = 5 * HOUR * (500 * 2.5 + 250 * 10.0) / 1e6
    assert fire.waste_usd == pytest.approx(7 * 24 * (api_h - P4D), rel=1e-3)
    assert fire.usd_per_hour == pytest.approx(api_h - P4D, rel=1e-3)


def test_an_api_export_naming_the_dated_snapshot_is_priced_as_the_model(ruleset):
    # OpenAI's usage export says "gpt-4o-2024-08-06": the price list's gpt-4o prices it.
    (fire,) = [f for f in findings(ruleset, api(7 * 24 + 1, model="gpt-4o-2024-08-06")) if f.action == "fire"]
    assert fire.details["model"] == "gpt-4o-2024-08-06" and fire.details["api_usd_per_1m_output"] == 10.0


def test_the_busiest_hour_sizes_the_self_hosted_fleet(ruleset):
    # 12 req/s for one hour a day: 10.8M output tokens that hour need two p4d all day.
    rps = lambda h: 12.0 if h % 24 == 12 else 6.0  # noqa: E731
    (fire,) = [f for f in findings(ruleset, api(7 * 24 + 1, rps)) if f.action == "fire"]
    assert fire.details["self_host_instances"] == 2
    api_day = sum(rps(h) for h in range(24)) * HOUR * (500 * 2.5 + 250 * 10.0) / 1e6
    assert fire.waste_usd == pytest.approx(7 * (api_day - 2 * 24 * P4D), rel=1e-3)


@pytest.mark.parametrize(
    "events",
    [
        endpoint(8 * 24, rps=lambda h: 3.0),  # busy: 10,800 requests/h would cost $1.46/h on the API
        endpoint(6 * 24 + 5),  # light, but not for a whole week yet
        endpoint(8 * 24, rps=lambda h: 0.5 if h // 24 != 3 else 3.0),  # one busy day breaks the week
        endpoint(8 * 24, model="my-finetune"),  # a model with no API price: not judged
        [e for e in endpoint(8 * 24) if not 30 <= (e.t - T0) / HOUR < 40],  # 10 hours of day 2 unreported
        api(8 * 24, rps=lambda h: 1.0),  # $13.50/h of gpt-4o: one p4d would cost more
        api(8 * 24, model="gpt-4o-mini", rps=lambda h: 1.0),  # $0.81/h of gpt-4o-mini: less than a g5
        api(8 * 24, rps=lambda h: 5.0 if h % 24 < 12 else 0.0),  # half the day idle: the week is not steady
        endpoint(8 * 24, rps=lambda h: 0.0),  # no request all week: idle (inference_scale_to_zero's), not light
        daily(api(8 * 24)),  # a daily cost export: the busiest hour, which sizes a fleet, is unknown
    ],
    ids=["busy-endpoint", "short-history", "one-busy-day", "unpriced-model", "data-gap", "small-api-spend",
         "cheap-api-model", "bursty-api", "no-traffic", "daily-api-export"],
)
def test_no_alert(ruleset, events):
    assert [f for f in findings(ruleset, events) if f.action == "fire"] == []


def test_one_busy_hour_in_the_week_sizes_the_fleet_for_the_whole_week(ruleset):
    # 7 req/s, and 12 req/s at noon of day 3 only: that hour's 10.8M output tokens need two p4d,
    # and a fleet is not resized day by day: two p4d all week, as the report sizes it.
    rps = lambda h: 12.0 if h == 3 * 24 + 12 else 7.0  # noqa: E731
    (fire,) = [f for f in findings(ruleset, api(7 * 24 + 1, rps)) if f.action == "fire"]
    assert fire.details["self_host_instances"] == 2
    api_week = sum(rps(h) for h in range(7 * 24)) * HOUR * (500 * 2.5 + 250 * 10.0) / 1e6
    assert fire.waste_usd == pytest.approx(api_week - 7 * 24 * 2 * P4D, rel=1e-3)


def test_an_interval_without_the_model_tag_does_not_restart_the_week(ruleset):
    # The exporter dropped the model label for one hour of day 3: the week still holds.
    events = endpoint(8 * 24 + 5)
    events[50] = msgspec.structs.replace(events[50], tags=TAGS)
    fires = [f for f in findings(ruleset, events) if f.action == "fire"]
    assert [f.fired_at for f in fires] == [T0 + 7 * DAY]


def test_resolves_when_the_crossover_is_no_longer_passed(ruleset):
    events = endpoint(10 * 24, rps=lambda h: 0.5 if h < 8 * 24 else 3.0)
    found = [f for f in findings(ruleset, events) if f.action != "update"]
    assert [(f.action, f.details.get("reason")) for f in found] == [("fire", None), ("resolve", "crossover_not_passed")]


def test_hostile_token_counts_neither_raise_nor_alert(ruleset):
    # Token metrics at the float64 bound: the cost of serving them is beyond any price; nothing fires.
    events = api(8 * 24, tokens=(0, 0))
    for e in events:
        e.metrics["output_tokens"] = 1.7e308
        e.metrics["input_tokens"] = -5.0  # a signed gauge gone wrong: counted as none
    assert [f for f in findings(ruleset, events) if f.action == "fire"] == []
    assert math.isfinite(sum(f.waste_usd for f in findings(ruleset, events)))


@pytest.mark.parametrize("split", [1, 30, 7 * 24, 7 * 24 + 1, 8 * 24 + 2])
def test_a_restore_mid_stream_gives_the_same_findings(ruleset, split):
    # A worker restarts after `split` intervals and re-reads the last three: same findings (the
    # day records and the episode's saving survive the snapshot), none twice.
    events = endpoint(10 * 24 + 1, rps=lambda h: 0.5 if h < 9 * 24 else 3.0)
    whole = [(f.action, f.at, round(f.waste_usd, 6), f.details) for f in findings(ruleset, events)]
    first = Engine(ruleset)
    before = [f for f in first.process(events[:split]) if f.type == "build_or_call"]
    second = Engine(ruleset, loader={key: first.snapshot(key) for key in first.dirty}.get)
    after = [f for f in second.process(events[max(0, split - 3):]) if f.type == "build_or_call"]
    assert [(f.action, f.at, round(f.waste_usd, 6), f.details) for f in before + after] == whole
    assert [f[0] for f in whole] == ["fire", "update", "update", "resolve"]


def test_the_window_is_bounded_so_the_state_is():
    # A day record per day of the window: a year of them per resource is refused at load.
    from pydantic import ValidationError

    from detector.detectors.build_or_call import BuildOrCallParams

    assert BuildOrCallParams(window="31d").window == 31 * DAY
    with pytest.raises(ValidationError):
        BuildOrCallParams(window="365d")


def test_days_saved_as_a_struct_each_before_restore_to_the_same_findings(ruleset):
    """The days are rows of one flat array of doubles now (the flags 1.0 or 0.0), not a struct per
    day: a snapshot saved by the version before, with its list of days, restores to the same rows,
    so the findings after the restart are a run's without one (the open episode's included)."""
    import msgspec

    from detector.detectors.build_or_call import WIDTH, BuildOrCallState
    from detector.floats import dec_hook

    events = endpoint(10 * 24 + 1, rps=lambda h: 0.5 if h < 9 * 24 else 3.0)
    split = 8 * 24 + 2
    whole = [(f.action, f.at, round(f.waste_usd, 6), f.details) for f in findings(ruleset, events)]
    first = Engine(ruleset)
    before = [f for f in first.process(events[:split]) if f.type == "build_or_call"]
    snap = msgspec.msgpack.decode(first.snapshot("ep-1"))
    state = snap["rules"]["build-or-call"]
    now, figures = dict(state), state.pop("figures")
    assert state.pop("days") is None and len(figures) == 8 * WIDTH
    state["days"] = [[*figures[i : i + 9], bool(figures[i + 9]), bool(figures[i + 10])]
                     for i in range(0, len(figures), WIDTH)]  # fmt: skip
    read = [msgspec.msgpack.decode(msgspec.msgpack.encode(s), type=BuildOrCallState, dec_hook=dec_hook)
            for s in (state, now)]  # fmt: skip
    assert read[0] == read[1] and read[0].days is None and [d.start for d in read[0].held()][-1] == T0 + 8 * DAY
    second = Engine(ruleset, loader={"ep-1": msgspec.msgpack.encode(snap)}.get)
    after = [f for f in second.process(events[split:]) if f.type == "build_or_call"]
    assert [(f.action, f.at, round(f.waste_usd, 6), f.details) for f in before + after] == whole
    assert [f[0] for f in whole] == ["fire", "update", "update", "resolve"]
