"""One pricer: what a usage interval cost is computed in one place, and every consumer of it
(detectors, the anomaly model's features, the store's ``usd`` column) gets the same figure."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import msgspec
import pytest
import structlog.testing

from detector.detectors.anomaly import Scoring, use_scoring
from detector.engine import Engine
from detector.events import UsageEvent
from detector.model.train import anomaly_ruleset
from detector.pricing import MAX_UNPRICED_SAID, Pricer, Pricing, storage_usd, usd_over
from detector.store import EventBatch
from tests.helpers import MIN, T0, at, scrape, usage

ROOT = Path(__file__).resolve().parent.parent
BUCKET_BYTES = 50 * 10**12
"""50 TB at the list's $0.023 per GB-month: $1.575 an hour, $4.73 over three hours."""


def bucket(t: float, tags: dict | None = None, state: str = "running") -> UsageEvent:
    """An untagged bucket's usage every 5 minutes, with no cost_usd: the price list prices it."""
    return UsageEvent(ts=at(t), resource_id="bkt-1", resource_type="storage_bucket", account="ml-data",
                      region="us-east-1", state=state, interval_s=300.0, storage_bytes=BUCKET_BYTES,
                      tags=tags or {})  # fmt: skip


def test_untagged_bucket_without_cost_is_alerted_at_what_its_stored_rows_cost(ruleset, store):
    """Issue 12, figure 2: the bucket's alert said $0.00 while its stored rows added up to $4.73."""
    events = [bucket(T0 + i * 300) for i in range(36)]  # three hours
    engine = Engine(ruleset)
    found = [f for f in engine.process(events) if f.type == "untagged"]
    batch = EventBatch()
    batch.extend(events)
    store.events.insert(batch, ruleset.pricing)
    stored = store.query(f"SELECT sum(usd) AS usd FROM {store.db}.resource_usage WHERE resource_id = 'bkt-1'")[0]["usd"]
    assert stored == pytest.approx(4.73, abs=0.005)
    assert found and found[0].action == "fire"
    (latest,) = [f for f in engine.open_episodes() if f.type == "untagged"]
    assert latest.waste_usd == pytest.approx(stored, abs=1e-3)
    assert latest.usd_per_hour == pytest.approx(stored / 3, rel=1e-3)  # its burn rate is the bucket's, not $0.00/h


def test_telemetry_stale_counts_an_interval_as_the_store_prices_it(ruleset, store):
    """A host of a type the price list does not know, whose exporter stops sending cost_usd
    half-way: the blind dollars are the stored rows' dollars over the same intervals (the
    unpriced ones count nothing in both), not the last rate seen carried on."""
    events: list = list(scrape(T0, [90.0] * 8))
    for i in range(60):
        ev = usage(T0 + (i + 1) * MIN, usd_per_hour=50.0 if i < 30 else None)
        events.append(msgspec.structs.replace(ev, instance_type="custom.gpu"))
    engine = Engine(ruleset)
    engine.process(events)
    (blind,) = [f for f in engine.open_episodes() if f.type == "telemetry_stale"]
    batch = EventBatch()
    batch.extend([e for e in events if isinstance(e, UsageEvent)])
    store.events.insert(batch, ruleset.pricing)
    stored = store.query(f"SELECT sum(usd) AS usd FROM {store.db}.resource_usage")[0]["usd"]
    assert blind.waste_usd == pytest.approx(stored, abs=1e-3)


def test_the_cost_feature_is_the_stored_cost(ruleset):
    """The anomaly model's cost rate is the pricer's: a bucket priced by its bytes is not free
    to the model while the store says it costs $1.58 an hour."""
    rules = anomaly_ruleset(ruleset)
    windows: list = []
    use_scoring(rules.rules, Scoring(observe=windows.extend))
    engine = Engine(rules)
    engine.process([bucket(T0 + i * 300) for i in range(90)])  # past the rule's 6 h of history
    assert windows
    for _, _, _, window in windows:
        assert window.values["cost_usd_per_hour"] == pytest.approx(storage_usd(BUCKET_BYTES, 3600, 0.023))


def test_interval_cost():
    """cost_usd wins; else the list price while running; else a bucket's bytes; egress by destination."""
    pricing = Pricing.model_validate({"instances": {"g5.xlarge": {"on_demand": 1.0, "spot": 0.4}}})
    pricer = Pricer(pricing)
    base = dict(ts=at(T0), resource_id="r", resource_type="gpu_instance", instance_type="g5.xlarge", interval_s=600.0)
    assert pricer.cost(UsageEvent(**base, cost_usd=0.5)).usd_per_hour == pytest.approx(3.0)
    assert pricer.cost(UsageEvent(**base)).usd == pytest.approx(1 / 6)
    assert pricer.cost(UsageEvent(**base, pricing="spot")).usd == pytest.approx(0.4 / 6)
    stopped = pricer.cost(UsageEvent(**base, state="stopped"))
    assert stopped.usd == 0 and stopped.usd_per_hour is None
    unknown = pricer.cost(UsageEvent(**{**base, "instance_type": "x9"}))
    assert unknown.usd == 0 and unknown.usd_per_hour is None
    egress = pricer.cost(UsageEvent(**base, region="us-east-1", dest_region="eu-west-1", egress_bytes=10**10))
    assert egress.egress_usd == pytest.approx(10 * 0.02)
    assert usd_over(36.0, 100.0) == pytest.approx(1.0)


def test_usage_nothing_prices_is_said_once_per_kind():
    """An instance type the price list lacks (a new one, a typo, the bridge's usage, which carries no cost_usd)
    costs $0: its alerts said $0.00/h with nothing said anywhere. Said once a kind, a bounded number of kinds."""
    pricing = Pricing.model_validate({"instances": {"g5.xlarge": {"on_demand": 1.0}}})
    pricer = Pricer(pricing, say=True)  # the engine's
    base = dict(ts=at(T0), resource_id="r", resource_type="gpu_instance", interval_s=600.0)
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):  # the pricers made per stored batch say nothing: they would say it each batch
            Pricer(pricing).cost(UsageEvent(**base, instance_type="p5e.48xlarge"))
        for instance_type in ("p5e.48xlarge", "p5e.48xlarge", "g5.xlarge", "p5e.48xlarge"):
            pricer.cost(UsageEvent(**base, instance_type=instance_type))
        pricer.cost(UsageEvent(**base, instance_type="p5e.48xlarge", cost_usd=1.0))  # priced by its producer
        pricer.cost(UsageEvent(**base, instance_type="p5e.48xlarge", state="stopped"))  # costs nothing anyway
        for i in range(MAX_UNPRICED_SAID + 50):
            pricer.cost(UsageEvent(**base, instance_type=f"made-up-{i}"))
    said = [e for e in logs if e["event"] == "unpriced_usage"]
    assert said[0]["instance_type"] == "p5e.48xlarge" and "pricing.yaml" in said[0]["note"]
    assert len(said) == MAX_UNPRICED_SAID and len({e["instance_type"] for e in said}) == MAX_UNPRICED_SAID


_PRICE = re.compile(r"usd|price|hourly|cost", re.IGNORECASE)


def test_no_other_module_multiplies_a_price_by_a_duration():
    """A product of a price and a duration (seconds over 3,600, a month of hours) appears only
    in detector/pricing.py: every other module asks the pricer (``usd_over``, ``Pricer.cost``)."""
    offenders = []
    for path in sorted([*ROOT.glob("detector/**/*.py"), *ROOT.glob("streams/**/*.py")]):
        if path.name == "pricing.py" and path.parent.name == "detector":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
                text = ast.unparse(node)
                if _PRICE.search(text) and ("interval_s" in text or "seconds" in text or "step" in text
                                            or "gap" in text or "runtime" in text or "hours" in text):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text}")
    assert offenders == []


@pytest.mark.parametrize(
    "name, listed",
    [
        ("gpt-4o", "gpt-4o"),  # listed as is
        ("gpt-4o-2024-08-06", "gpt-4o"),  # OpenAI's usage export names the dated snapshot
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),  # the mini's snapshot is the mini, not gpt-4o
        ("llama-3.1-8b-instruct-20250101", "llama-3.1-8b-instruct"),  # an undashed date (Anthropic's form)
        ("gpt-4o-audio-preview", None),  # another model of the family, priced otherwise: not gpt-4o
        ("gpt-4o-2024-08", None),  # not a whole date
        ("-2024-08-06", None),  # nothing but a date
        ("x" * 60_000 + "-2024-08-06", None),  # a hostile tag with a date: still not a listed model
    ],
)
def test_a_models_dated_snapshot_is_priced_as_the_model(ruleset, name, listed):
    found = ruleset.pricing.llm_model(name)
    assert found is (ruleset.pricing.llm_models[listed] if listed else None)


def test_the_engine_says_unpriced_usage_once_and_the_stored_batches_do_not(ruleset, store):
    """Through the engine and the store's insert, as the worker runs them: one line for the kind, however many batches."""
    engine = Engine(ruleset)
    with structlog.testing.capture_logs() as logs:
        for i in range(4):
            batch = EventBatch()
            event = UsageEvent(ts=at(T0 + i * MIN), resource_id="h", resource_type="gpu_instance",
                               instance_type="p5e.48xlarge", interval_s=60.0)  # fmt: skip
            batch.extend([event])
            store.events.insert(batch, ruleset.pricing)
            engine.process([event])
    assert [e["instance_type"] for e in logs if e["event"] == "unpriced_usage"] == ["p5e.48xlarge"]
