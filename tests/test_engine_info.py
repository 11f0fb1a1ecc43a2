"""What the engine keeps of a key's usage events (``Engine._update_info``), against its definition.

The engine keeps it field by field (each compared once, only what changed taken, a price equal
to the one held kept as it is held): this holds that shortcut to the plain definition, event by
event, over random sequences: every field as the latest event says, the interval's dollars and
rate as the pricer gives them from scratch (a zero with its sign, a price of another type as it
came), the GPUs the price list gives its type, and the routes cleared exactly when what routes
rules changed.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from detector.detectors.base import ResourceInfo
from detector.engine import Engine, KeyState
from detector.events import UsageEvent
from detector.rules import load_rules

RULES = load_rules("rules/rules.yaml")
START = datetime(2026, 11, 2, tzinfo=timezone.utc)
ROUTED = ("resource_type", "account", "region", "instance_type")

prices = st.one_of(st.none(), st.sampled_from([0.0, -0.0, 0.25, 1.5, 2, 2.0]), st.floats(0.0, 50.0))
usage = st.builds(
    dict,
    resource_type=st.sampled_from(["gpu_instance", "instance", "storage_bucket"]),
    provider=st.sampled_from(["aws", "gcp", ""]),
    account=st.sampled_from(["ml", "data"]),
    region=st.sampled_from(["us-east-1", "eu-west-1", ""]),
    instance_type=st.sampled_from(["p4d.24xlarge", "g5.xlarge", "m5.large", "", "unlisted.type"]),
    pricing=st.sampled_from(["on_demand", "spot", "reserved"]),
    state=st.sampled_from(["running", "running", "stopped", "terminated"]),
    interval_s=st.sampled_from([60.0, 300.0, 3600.0]),
    cost_usd=prices,
    storage_bytes=st.one_of(st.none(), st.integers(0, 10**13)),
    tags=st.sampled_from([{}, {"team": "nlp"}, {"team": "nlp", "owner": "alice"}, {"team": "vision"}]),
)


def _same(a: float | None, b: float | None) -> bool:
    """Equal, of one type, and a zero of one sign."""
    if a is None or b is None:
        return a is b
    return type(a) is type(b) and a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


@settings(max_examples=600)
@given(st.lists(usage, min_size=1, max_size=12))
def test_the_info_is_what_the_latest_event_says_priced_from_scratch(fields):
    engine = Engine(RULES)
    state = KeyState(ResourceInfo(resource_id="r-1"))
    rate: float | None = None
    for i, f in enumerate(fields):
        ev = UsageEvent(ts=START + timedelta(minutes=i), resource_id="r-1", **f)
        before = {name: getattr(state.info, name) for name in (*ROUTED, "tags", "state")}
        state.usage_route = ()  # a route held: cleared only when what routes the rules changed
        engine._update_info(state, ev)
        info = state.info
        for name in (*ROUTED, "provider", "pricing", "state", "tags"):
            assert getattr(info, name) == getattr(ev, name), name
        cost = engine.pricer.cost(ev)
        rate = cost.usd_per_hour if cost.usd_per_hour is not None else rate
        assert _same(info.interval_usd, cost.usd), (info.interval_usd, cost.usd)
        assert _same(info.usd_per_hour, rate), (info.usd_per_hour, rate)
        listed = engine.pricer.pricing.instances.get(ev.instance_type)
        assert info.gpus == (listed.gpus if listed is not None and ev.instance_type else 0)
        changed = not before["state"] or any(before[name] != getattr(ev, name) for name in (*ROUTED, "tags"))
        assert (state.usage_route is None) == changed, i
