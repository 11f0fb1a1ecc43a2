"""The detector protocol is the whole contract: a detector that implements exactly
:class:`~detector.detectors.base.Detector`, and nothing else, runs through every path of the
engine (routing, the context, the batch phase, the other rules' behaviour, end of data,
snapshots, a rules reload), and the engine asks it for nothing the protocol does not declare."""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
import typing_extensions

from detector.detectors.anomaly import Scoring, use_scoring
from detector.detectors.base import Behaviour, Context, Detector, Finding, Params, ResourceInfo, make_finding
from detector.detectors.scrape import Scrape
from detector.engine import Engine
from detector.events import Event, GpuMetric, RunEvent, UsageEvent
from detector.pricing import Pricing
from detector.rules import CompiledRule, RuleSet, load_rules
from tests.conftest import ROOT
from tests.helpers import MIN, T0, at, scrape, usage

DECLARED = typing_extensions.get_protocol_members(Detector)
PROBED: list[str] = []
"""Attributes the engine asked of a :class:`Strict` detector that the protocol does not declare."""


class StrictParams(Params):
    every: int = 3


class StrictState(msgspec.Struct, kw_only=True):
    seen: int = 0
    hosts: list[str] = []
    others: list[int] = []


class Strict:
    """Exactly the protocol: every member it declares, no base class, nothing more. Any other
    attribute the engine asks for (``getattr(detector, "uses_fleet", False)`` included) is
    recorded, so a probe that falls back to a default still shows."""

    type: ClassVar[str] = "strict"
    Params: ClassVar[type[StrictParams]] = StrictParams
    State: ClassVar[type[StrictState]] = StrictState
    consumes: ClassVar[tuple[type, ...]] = (UsageEvent, GpuMetric, RunEvent)
    title: ClassVar[str] = "Strict"
    dollars: ClassVar[str] = "wasted"
    suggestion: ClassVar[str] = "none"
    behaviour: ClassVar[bool] = True
    group_by: ClassVar[str | None] = None
    lazy: ClassVar[bool] = True  # the engine makes its state at a key's first event, through starts
    listens: ClassVar[bool] = True  # it asks ctx.others: stepped after the key's other rules

    def __init__(self, name: str, severity: str, params: Any, pricing: Pricing | None = None) -> None:
        self.name = name
        self.severity = severity
        self.params = params
        self.batches: list[list[Any]] = []

    def __getattribute__(self, attr: str) -> Any:
        if not attr.startswith("__") and attr not in DECLARED and attr != "batches":
            PROBED.append(attr)
        return object.__getattribute__(self, attr)

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        return []

    def new_state(self) -> StrictState:
        return StrictState()

    def starts(self, ctx: Context, event: Event) -> bool:
        return True  # it counts every event

    def starts_scrape(self, ctx: Context, scrape: Scrape) -> bool:
        return True

    def step(self, state: StrictState, ctx: Context, event: Event, t: float) -> list[Finding]:
        state.seen += 1
        if type(event) is RunEvent:  # the fleet look-up: a run's host, held by the engine
            state.hosts = [h.instance_type for rid in event.resource_ids if (h := ctx.lookup(rid)) is not None]
        if type(event) is UsageEvent:
            state.others.append(int(ctx.others(t)))
        if state.seen % self.params.every == 0:
            ctx.defer(self, (state, msgspec.structs.replace(ctx.resource), t))
        return []

    def step_scrape(self, state: StrictState, ctx: Context, scrape: Scrape,
                    t: float) -> list[tuple[int, Finding]]:  # fmt: skip
        return [(i, f) for i, event in enumerate(scrape.samples) for f in self.step(state, ctx, event, t)]

    def end_batch(self, items: list[Any]) -> list[Finding]:
        self.batches.append(items)
        return [make_finding(self, "fire", resource, episode_start=t, fired_at=t, at=t, usd=float(state.seen),
                             details={}) for state, resource, t in items]  # fmt: skip

    def tracking(self, state: StrictState, t: float) -> Behaviour:
        return Behaviour.LEVEL if state.seen > 5 else Behaviour.NONE

    def open_episodes(self, state: StrictState, resource: ResourceInfo) -> list[Finding]:
        return [make_finding(self, "update", resource, episode_start=0.0, fired_at=0.0, at=0.0, usd=state.seen,
                             details={})]  # fmt: skip


def strict_rules() -> tuple[RuleSet, Strict]:
    """The shipped rules (the anomaly rule watching windows, so it asks what rules track)
    with a :class:`Strict` rule added."""
    shipped = load_rules(ROOT / "rules")
    use_scoring(shipped.rules, Scoring(observe=lambda items: None))
    strict = Strict("strict-rule", "info", StrictParams(every=2))
    rule = CompiledRule(detector=strict, matches=lambda r: True, consumes=Strict.consumes)
    return RuleSet(rules=(*shipped.rules, rule), pricing=shipped.pricing), strict


def test_the_protocol_declares_what_the_engine_uses():
    checked: Detector[StrictState] = Strict("x", "info", StrictParams())  # mypy: Strict keeps the protocol
    assert checked.name == "x"
    PROBED.clear()
    ruleset, strict = strict_rules()
    engine = Engine(ruleset)
    host = [e for i in range(8 * 60) for e in [*scrape(T0 + i * MIN, [0.0, 0.0]), usage(T0 + i * MIN)]]  # (the aligner's order)
    runs = [RunEvent(ts=at(T0 + 60 * MIN), run_id="r1", status="started", resource_ids=["host-1"], project="p"),
            RunEvent(ts=at(T0 + 3 * 60 * MIN), run_id="r1", status="failed", resource_ids=["host-1"], project="p")]
    events = sorted(host + runs, key=lambda e: e.ts)
    found = []
    for i in range(0, len(events), 500):  # batches, as the worker and backtest feed them
        found.extend(engine.process(events[i:i + 500]))
    mine = [f for f in found if f.type == "strict"]
    assert mine and {f.resource_id for f in mine} == {"host-1", "p"}  # the batch phase ran for both keys
    assert len(strict.batches) == 3 and sum(len(b) for b in strict.batches) == len(mine)  # once per batch
    assert engine.errors == {}
    state = engine._keys["host-1"].rules["strict-rule"]
    assert Behaviour.PAUSE in state.others  # the context saw the idle rule's episode
    assert engine._keys["p"].rules["strict-rule"].hosts == ["p4d.24xlarge"]  # and looked the run's host up
    assert [f for f in engine.open_episodes() if f.type == "strict"]
    restored = Engine(ruleset)
    restored.restore("host-1", engine.snapshot("host-1"))
    engine.set_ruleset(ruleset)
    engine.process(events[-10:])
    assert PROBED == [], f"the engine probed a detector for {sorted(set(PROBED))}, which the protocol does not declare"


def test_a_detector_that_raises_is_skipped_not_probed():
    """A step that raises is counted under the rule's name (a declared member)."""
    PROBED.clear()
    ruleset, strict = strict_rules()
    engine = Engine(ruleset)

    def broken(state: Any, ctx: Context, event: Event, t: float) -> list[Finding]:
        raise ValueError("boom")

    object.__setattr__(strict, "step", broken)
    engine.process([usage(T0)])
    assert engine.errors == {"strict-rule": 1}
    assert PROBED == []


def test_the_protocol_names_the_members_callers_rely_on():
    """Callers outside the engine (alert rendering, digests, training, grouping) read these."""
    assert {"title", "dollars", "suggestion", "behaviour", "group_by", "facts", "consumes", "State", "Params",
            "step", "end_batch", "tracking", "open_episodes", "new_state"} <= set(DECLARED)  # fmt: skip


def test_a_rules_reload_keeps_the_model_the_worker_loaded(tmp_path):
    """The worker's model reload swaps the scorer of its configuration's one ``Scoring``; a
    rules reload hands that same ``Scoring`` to the new rule set before any batch reads it,
    so neither reload undoes the other."""
    import shutil

    import yaml

    from detector.detectors.anomaly import Anomaly
    from detector.model.forest import ModelSet
    from streams.config import LiveConfig

    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    config = LiveConfig.load(rules)
    models = ModelSet()
    config.scoring.scorer = models  # what the worker's model reload does
    data = yaml.safe_load((rules / "rules.yaml").read_text())
    (rule,) = [r for r in data["rules"] if r["type"] == "anomaly"]
    rule.setdefault("params", {})["for"] = "45m"
    (rules / "rules.yaml").write_text(yaml.safe_dump(data))
    new, refused = config.reload()
    assert refused is None and new is config.current
    (anomaly,) = [r.detector for r in new.ruleset.rules if isinstance(r.detector, Anomaly)]
    assert anomaly.params.for_ == 45 * 60  # the edited rule...
    assert anomaly.scoring is config.scoring and anomaly.scoring.scorer is models  # ...scores with the model


def test_every_detector_that_asks_what_the_others_track_listens():
    """A detector that reads ``ctx.others`` must set ``listens``, or the engine may step it before the
    rules it asks (in the rule files' order) and it hears what they made of the previous event: the
    anomaly rule declared first judged 881 windows otherwise than declared last. Read from the source
    of each registered detector's class and its bases, so that a new detector cannot forget it."""
    import inspect

    from detector.detectors import REGISTRY

    def asks(cls: type) -> bool:
        return any("ctx.others(" in inspect.getsource(c) for c in cls.__mro__ if c.__module__.startswith("detector."))

    asking = {name for name, cls in REGISTRY.items() if asks(cls)}
    assert "anomaly" in asking
    assert {name for name in asking if not REGISTRY[name].listens} == set()
    assert {name for name, cls in REGISTRY.items() if cls.listens} == asking  # and none listens for nothing
