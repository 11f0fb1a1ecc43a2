"""A lazy rule's state is made at the first event that starts it: until then the key holds None for
the rule, saved as None and restored as None, and detection is what it was with the state made at
the key's first event."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import msgspec
import pytest

from detector.detectors.anomaly import Scoring, scoring_during
from detector.detectors.base import Behaviour, Context, ResourceInfo
from detector.detectors.scrape import Scrape
from detector.engine import Engine
from detector.events import EventDecoder, GpuMetric, UsageEvent
from detector.floats import enc_hook
from detector.replay import read_replay
from detector.simulate import SimConfig
from tests.helpers import MIN, T0, at, fleet_file, timeline, usage

SMALL = {"hours": 4.0, "training_hosts": 3, "notebooks": 2, "inference_endpoints": 1, "buckets": 1, "vector_dbs": 1,
         "cpu_instances": 2, "k8s_nodes": 2, "seed": 4, "serving_endpoints": 10, "choices": 1,
         "cpu_notebooks": 2}  # fmt: skip
"""A fleet with a resource untagged, Kubernetes nodes and hosts off it, egress and none, endpoints on spot
alone and spread, and endpoints serving a named model and none (seed 4)."""


def _lazy(ruleset) -> list[Any]:
    return [rule.detector for rule in ruleset.rules if rule.detector.lazy]


def _encoded(state: Any) -> bytes:
    return msgspec.msgpack.encode(state, enc_hook=enc_hook)


def _batches(path: Path) -> list[list[tuple[float, Any]]]:
    """The replay's events in batches of 300 messages, each in time order, in the order delivered:
    with a messy fleet's delays some arrive after later ones were folded (late, as in the worker)."""
    decoder, batches, batch = EventDecoder(), [], []
    for i, (_, record) in enumerate(read_replay(path), start=1):
        batch.extend((ev.ts.timestamp(), ev) for ev in decoder.decode(record.topic, record.value))
        if i % 300 == 0:
            batches.append(sorted(batch, key=lambda item: item[0]))
            batch = []
    return [*batches, sorted(batch, key=lambda item: item[0])]


def test_the_shipped_rules_that_are_lazy(ruleset):
    """Those whose state most resources would hold at its defaults (the bench's memory figures)."""
    assert {d.type for d in _lazy(ruleset)} == {"unallocated_gpu", "egress_runaway", "untagged", "anomaly", "build_or_call",
                                           "spot_without_redundancy", "idle_notebook"}


@pytest.mark.parametrize("windows", [False, True], ids=["rules only", "windows built"])
def test_a_lazy_rule_finds_and_holds_what_it_did_with_its_state_made_at_once(ruleset, tmp_path, monkeypatch, windows):
    """The same messy fleet (Kubernetes nodes among hosts that are not, egress and none, resources
    untagged, lost, late and repeated samples) through an engine with the lazy rules as they ship and
    through one whose lazy rules make their state with the key's route: the same findings, and each
    key's state the same where both made one; where the lazy rule holds None the other tracks nothing
    and has no episode open (it holds at most the key's latest time). With and without windows."""
    path, _ = fleet_file(tmp_path / "fleet.jsonl", SimConfig.messy(**SMALL), ruleset.pricing)
    batches = _batches(path)
    with ExitStack() as lent:
        if windows:
            lent.enter_context(scoring_during(ruleset.rules, Scoring(observe=lambda items: None)))
        lazy, detectors = Engine(ruleset), _lazy(ruleset)
        found = [f for items in batches for f in lazy.process_timed(items)]
        for detector in detectors:
            monkeypatch.setattr(type(detector), "lazy", False)
        eager = Engine(ruleset)
        assert [f for items in batches for f in eager.process_timed(items)] == found
    assert found and lazy.errors == eager.errors == {}
    made: dict[str, int] = {}
    held: dict[str, int] = {}
    for key, state in eager._keys.items():
        for detector in detectors:
            mine, theirs = lazy._keys[key].rule(detector.name), state.rule(detector.name)
            if theirs is None:
                assert mine is None  # not a rule of this resource
            elif mine is None:
                held[detector.type] = held.get(detector.type, 0) + 1
                assert detector.tracking(theirs, 0.0) is Behaviour.NONE
                assert detector.open_episodes(theirs, state.info) == []
            else:
                made[detector.type] = made.get(detector.type, 0) + 1
                assert _encoded(mine) == _encoded(theirs)
    # Kubernetes nodes and hosts off it, egress and none, tagged and not: each rule both ways.
    every = {d.type for d in detectors}
    assert set(held) == every - ({"anomaly"} if windows else set())  # (with windows every key has one)
    assert set(made) == every - (set() if windows else {"anomaly"})


def _sample(gpu: int, allocated: bool | None, util: float = 1.0) -> GpuMetric:
    return GpuMetric(ts=at(T0), resource_id="host-1", gpu_index=gpu, model="A100", util_pct=util, allocated=allocated)


CASES: list[tuple[str, list[Any]]] = [
    ("running", [usage(T0)]),
    ("stopped", [usage(T0, state="stopped")]),
    ("terminated", [usage(T0, state="terminated")]),
    ("untagged", [usage(T0, tags={"team": "nlp"})]),
    ("stopped untagged", [usage(T0, state="stopped", tags={})]),
    ("egress", [msgspec.structs.replace(usage(T0), egress_bytes=10**9, dest_region="eu-west-1")]),
    ("a model served", [usage(T0, tags={"team": "nlp", "owner": "alice", "project": "llm", "model": "gpt-4o"})]),
    ("on spot alone", [msgspec.structs.replace(usage(T0), pricing="spot")]),
    ("on spot spread", [msgspec.structs.replace(usage(T0), pricing="spot", metrics={"replicas": 3.0, "zones": 3.0})]),
    ("off Kubernetes", [_sample(g, None, u) for g, u in enumerate([90.0, 1.0])]),
    ("every GPU free", [_sample(g, False) for g in range(2)]),
    ("a GPU held", [_sample(0, True), _sample(1, None)]),
    ("one sample", [_sample(0, False)]),
    ("a CPU notebook's activity", [msgspec.structs.replace(usage(T0, resource_type="notebook"), instance_type="m6i.2xlarge",
                                                           metrics={"last_activity": T0 - 3600.0})]),
    ("a CPU notebook's usage", [msgspec.structs.replace(usage(T0, resource_type="notebook"), instance_type="m6i.2xlarge")]),
    ("a CPU notebook stopped", [msgspec.structs.replace(usage(T0, resource_type="notebook", state="stopped"),
                                                        instance_type="m6i.2xlarge", metrics={"last_activity": T0 - 3600.0})]),
]


def _context(events: list[Any]) -> Context:
    first = events[0]
    if getattr(first, "instance_type", "") == "m6i.2xlarge":  # (a CPU notebook)
        return Context(ResourceInfo(resource_id="host-1", resource_type="notebook", instance_type="m6i.2xlarge",
                                    region="us-east-1", state=first.state, usd_per_hour=0.384, interval_usd=0.384 / 60,
                                    tags=first.tags))  # fmt: skip
    return Context(ResourceInfo(resource_id="host-1", resource_type="gpu_instance", instance_type="p4d.24xlarge",
                                region="us-east-1", state=getattr(first, "state", "running"), usd_per_hour=32.0,
                                gpus=8, interval_usd=32.0 / 60, tags=getattr(first, "tags", {})))  # fmt: skip


def _step(detector: Any, state: Any, events: list[Any], t: float) -> list[Any]:
    ctx, seen = _context(events), [e for e in events if type(e) in detector.consumes]
    if type(seen[0]) is GpuMetric and len(seen) > 1:
        return [f for _, f in detector.step_scrape(state, ctx, Scrape(seen), t)]
    return detector.step(state, ctx, seen[0], t)


def _starts(detector: Any, events: list[Any]) -> bool:
    ctx, seen = _context(events), [e for e in events if type(e) in detector.consumes]
    if type(seen[0]) is GpuMetric and len(seen) > 1:
        return detector.starts_scrape(ctx, Scrape(seen))
    return detector.starts(ctx, seen[0])


def _later(events: list[Any], t: float) -> list[Any]:
    return [msgspec.structs.replace(e, ts=at(t)) for e in events]


@pytest.mark.parametrize(("name", "events"), CASES, ids=[name for name, _ in CASES])
def test_an_event_that_does_not_start_a_lazy_rule_would_have_changed_nothing(ruleset, name, events):
    """The promise of ``starts`` (the engine skips the step it refuses), kept by every shipped lazy rule:
    a new state stepped with an event or scrape that does not start it finds nothing, and whatever
    starts the rule next leaves it as it leaves a state made then (what the engine makes)."""
    with scoring_during(ruleset.rules, Scoring(observe=lambda items: None)):
        for detector in _lazy(ruleset):
            if not any(type(e) in detector.consumes for e in events) or _starts(detector, events):
                continue
            state = detector.new_state()
            assert _step(detector, state, events, T0) == [], (detector.name, name)
            follows = [later for _, case in CASES if any(type(e) in detector.consumes for e in case)
                       if _starts(detector, later := _later(case, T0 + MIN))]  # fmt: skip
            assert follows, detector.name
            for later in follows:
                made, stepped = detector.new_state(), msgspec.msgpack.decode(_encoded(state), type=type(state))
                assert _step(detector, stepped, later, T0 + MIN) == _step(detector, made, later, T0 + MIN)
                assert _encoded(stepped) == _encoded(made), (detector.name, name)


def test_a_late_interval_does_not_start_a_rule_its_state_would_have_refused(ruleset, monkeypatch):
    """Out of order: a tagged resource's older interval arrives untagged after newer ones. The state
    ``untagged`` would have kept since the first interval holds the newest time and refuses it; with
    no state, the interval is ``late`` to the key and starts nothing. Then the tags go for good."""
    tagged, bare = {"team": "nlp", "project": "llm"}, {"team": "nlp"}
    events = [usage(T0 + i * MIN, tags=tagged) for i in range(5)] + [usage(T0 + 2.5 * MIN, tags=bare)]
    events += [usage(T0 + i * MIN, tags=bare) for i in range(5, 80)]
    lazy, detectors = Engine(ruleset), _lazy(ruleset)
    found = [f for e in events for f in lazy.process([e])]
    after_late = Engine(ruleset)
    after_late.process(events[:6])
    assert after_late._keys["host-1"].rule("untagged") is None
    for detector in detectors:
        monkeypatch.setattr(type(detector), "lazy", False)
    eager = Engine(ruleset)
    assert [f for e in events for f in eager.process([e])] == found
    assert [f.episode_start for f in found if f.type == "untagged"] == [T0 + 5 * MIN]
    assert _encoded(lazy._keys["host-1"].rule("untagged")) == _encoded(eager._keys["host-1"].rule("untagged"))


def test_every_lazy_rule_is_started_by_some_event(ruleset):
    with scoring_during(ruleset.rules, Scoring(observe=lambda items: None)):  # the anomaly rule's: a model's windows
        for detector in _lazy(ruleset):
            ctx = Context(ResourceInfo(resource_id="host-1", resource_type="gpu_instance", state="running"))
            assert any(detector.starts(ctx, e) for _, events in CASES for e in events if type(e) in detector.consumes)


def test_a_rule_with_nothing_to_track_is_saved_and_restored_as_none(ruleset):
    events = timeline(T0, T0 + 10 * MIN, [90.0, 1.0])  # a host off Kubernetes: no sample says who holds a GPU
    engine = Engine(ruleset)
    engine.process(events)
    assert engine._keys["host-1"].rule("unallocated-gpu") is None
    saved = engine.snapshot("host-1")
    assert msgspec.msgpack.decode(saved)["rules"]["unallocated-gpu"] is None
    restored = Engine(ruleset)
    state = restored.restore("host-1", saved)
    assert "unallocated-gpu" in state.names and state.rule("unallocated-gpu") is None
    # Its first sample that says who holds a GPU makes it, in the slot restored.
    t = T0 + 10 * MIN
    restored.process([usage(t), GpuMetric(ts=at(t), resource_id="host-1", gpu_index=0, model="A100", util_pct=1.0,
                                          allocated=False)])  # fmt: skip
    made = restored._keys["host-1"].rule("unallocated-gpu")
    assert made is not None and made.gpu_ids == (0,)
    assert restored.errors == {}


def _tampered(saved: bytes, rule: str, value: Any) -> bytes:
    snap = msgspec.msgpack.decode(saved)
    snap["rules"][rule] = value
    return msgspec.msgpack.encode(snap)


@pytest.mark.parametrize(("rule", "value"), [
    ("idle-gpu", None), ("idle-gpu", "a state"),
    ("unallocated-gpu", "a state"), ("unallocated-gpu", {"gpu_ids": [0], "gpu_counted": b"\x05"}),
])  # fmt: skip
def test_a_saved_state_that_is_not_the_rule_s_is_refused_and_the_rule_starts_afresh(ruleset, rule, value):
    """None for a rule that is not lazy, or a lazy rule's state of another shape (columns that do not
    line up): the rule starts afresh (a new state; for a lazy rule, None again), never read wrong."""
    engine = Engine(ruleset)
    engine.process(timeline(T0, T0 + 10 * MIN, [90.0, 1.0]))
    restored = Engine(ruleset)
    state = restored.restore("host-1", _tampered(engine.snapshot("host-1"), rule, value))
    assert rule not in state.names and "partly-idle-gpu" in state.names  # refused, the others kept
    restored.process(timeline(T0 + 10 * MIN, T0 + 11 * MIN, [90.0, 1.0]))
    again = restored._keys["host-1"].rule(rule)
    assert rule in restored._keys["host-1"].names
    if rule == "idle-gpu":
        assert again is not None and again.since is None
    else:
        assert again is None
    assert restored.errors == {}


def test_a_rules_reload_keeps_a_lazy_rule_s_none(ruleset):
    engine = Engine(ruleset)
    engine.process(timeline(T0, T0 + 5 * MIN, [90.0, 1.0]))
    engine.set_ruleset(ruleset)
    assert "unallocated-gpu" in engine._keys["host-1"].names
    assert engine._keys["host-1"].rule("unallocated-gpu") is None
    engine.process(timeline(T0 + 5 * MIN, T0 + 6 * MIN, [90.0, 1.0]))
    assert engine.errors == {}


def _endpoint(t: float, rid: str = "ep-1", pricing: str = "on_demand", model: str = "", state: str = "running",
              replicas: float = 1.0) -> UsageEvent:
    tags = {"team": "nlp", "owner": "alice", "project": "llm", **({"model": model} if model else {})}
    event = usage(t, rid=rid, state=state, resource_type="inference_endpoint", tags=tags, interval_s=300.0)
    return msgspec.structs.replace(event, pricing=pricing, requests=600, metrics={"replicas": replicas})


ENDPOINT_RULES = ("spot-without-redundancy", "build-or-call")


def test_an_endpoint_on_demand_that_names_no_model_holds_no_state_for_the_endpoint_rules(ruleset):
    """Most endpoints: never all on spot with too few replicas, no model the price list could know.
    Each rule is made by the first interval that gives it something to track, and only for its key."""
    engine = Engine(ruleset)
    engine.process([_endpoint(T0 + i * 5 * MIN) for i in range(12)] + [_endpoint(T0 + 60 * MIN, state="stopped")])
    assert [engine._keys["ep-1"].rule(name) for name in ENDPOINT_RULES] == [None, None]
    engine.process([_endpoint(T0 + 30 * MIN, pricing="spot", model="gpt-4o")])  # late: a state made first refuses it
    assert [engine._keys["ep-1"].rule(name) for name in ENDPOINT_RULES] == [None, None]
    engine.process([_endpoint(T0 + 65 * MIN, pricing="spot"), _endpoint(T0 + 65 * MIN, rid="ep-2", model="gpt-4o")])
    spot, ep2 = engine._keys["ep-1"], engine._keys["ep-2"]
    assert spot.rule("spot-without-redundancy").start == T0 + 65 * MIN and spot.rule("build-or-call") is None
    assert ep2.rule("build-or-call").model == "gpt-4o" and ep2.rule("spot-without-redundancy") is None
    assert engine.errors == {}


def test_an_eager_state_saved_before_the_rules_were_lazy_restores_and_goes_on_as_it_would_have(ruleset, monkeypatch):
    """A snapshot from before (each endpoint rule's state made with the key's route) is read as the
    state it is and goes on to the same findings as an engine whose rules are eager; and an endpoint
    that then goes to spot alone fires as it would have."""
    before = [_endpoint(T0 + i * 5 * MIN) for i in range(6)]
    after = [_endpoint(T0 + (6 + i) * 5 * MIN, pricing="spot", model="gpt-4o") for i in range(12)]
    after.insert(3, _endpoint(T0 + 2 * MIN, pricing="spot"))  # an older interval, late: refused by both
    lazy_now = Engine(ruleset)
    for name in ENDPOINT_RULES:
        monkeypatch.setattr(type(ruleset.by_name(name).detector), "lazy", False)
    old = Engine(ruleset)
    old.process(before)
    saved = old.snapshot("ep-1")
    assert all(msgspec.msgpack.decode(saved)["rules"][name] is not None for name in ENDPOINT_RULES)
    eager = Engine(ruleset)
    eager.restore("ep-1", saved)
    expected = [f for e in after for f in eager.process([e])]
    monkeypatch.undo()
    assert all(ruleset.by_name(name).detector.lazy for name in ENDPOINT_RULES)
    restored = lazy_now.restore("ep-1", saved)
    assert all(restored.rule(name) is not None for name in ENDPOINT_RULES)  # the saved state, not None
    assert [f for e in after for f in lazy_now.process([e])] == expected
    assert [f.action for f in expected if f.rule == "spot-without-redundancy"] == ["fire"]
    for name in ENDPOINT_RULES:
        assert _encoded(lazy_now._keys["ep-1"].rule(name)) == _encoded(eager._keys["ep-1"].rule(name))
