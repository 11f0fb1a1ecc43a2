"""``anomaly``: what the isolation forest finds unusual in a resource's windows.

Example rule::

    - name: cost-anomaly
      type: anomaly
      params:
        window: 5m            # tumbling windows of event time
        for: 30m              # the longest run of mildly unusual windows that adds up to an alert
        min_history: 6h       # before its own baseline covers this, a resource is judged against the fleet
        quiet_windows: 2      # normal windows in a row that end an episode
        metrics: [cpu_util]   # generic metrics (a usage event's ``metrics``) the model also reads
      severity: info

The step only folds events into feature windows (:mod:`detector.model.features`); a
closed window is deferred to the batch phase (``end_batch``), which scores every window
of the batch in one ``score_samples`` call per model group. The model comes from outside:
a :class:`Scoring` handed to the rule set's anomaly rules (:func:`use_scoring`) holds the
scorer in use (the worker swaps it when the model files change), whoever watches the
windows (training) and whoever records each window's score (``backtest --scores``). With
none of them the step returns at once; with no model for a resource's group (cold start)
nothing is judged.

Severity comes from how far out a window is, not from a fixed hold. The model turns a
score into *evidence*, ``-log10`` of how rarely windows like the training ones score that
high (:meth:`detector.model.forest.ModelArtifact.evidence`). The last ``L`` windows in a row
(up to ``for``) open an episode when each of them carries at least ``budget / L``: a window
as rare as the whole budget alerts at once (a spike), milder ones alert once they have
lasted long enough (a shift). The budget is calibrated at training to a stated rate of
alerts per 1,000 resource-hours (``model show`` says it). An episode stays open while the
latest windows would still open one and ends after ``quiet_windows`` windows that would not; the
alert names the three features furthest from the resource's usual range, the score against
the threshold, and the dollars the resource cost meanwhile.

Rules do not hide windows from the model: a window during which a rule tracks unusual
behaviour on the resource (the rules' ``tracking``, read through the step's context) is
scored, recorded (decision ``rule``) and learnt, but opens no anomaly: the rule has the
first word, and a run starts after it. When a rule's incident opens on a resource whose
anomaly is open, the alert manager joins the anomaly to it rather than posting both. A
pause of the resource's work (idle, hung, dark: ``Behaviour.PAUSE``) is neither judged nor
learnt: the baselines wait for the work to come back, so the anomaly does not repeat the
rule's alert afterwards.
"""

from __future__ import annotations

import builtins
import math
from array import array
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, NamedTuple, Protocol

import msgspec
from pydantic import Field, StringConstraints

from detector.detectors.base import Behaviour, Context, DetectorBase, Finding, Params, ResourceInfo, make_finding
from detector.detectors.episode import Episode, end, fire
from detector.detectors.scrape import FIRST, Scrape
from detector.events import Event, GpuMetric, UsageEvent
from detector.floats import FloatArray
from detector.metrics import METRICS
from detector.model.features import BASE_FEATURES, METRIC_PREFIX, Window, WindowBuilder, WindowState, WindowStateBefore, follows
from detector.units import Duration

if TYPE_CHECKING:
    from detector.rules import CompiledRule

__all__ = ["Anomaly", "AnomalyFigures", "AnomalyParams", "AnomalyState", "AnomalyStateBefore", "ClosedWindow",
           "GroupModel", "Judged", "ScoredWindow", "Scorer", "Scoring", "scoring_during", "use_scoring"]


class GroupModel(Protocol):
    """One model group's scorer: higher scores are more unusual; ``evidence`` says how rare a
    score is; a run of ``L <= persist`` windows each carrying ``budget / L`` opens an episode."""

    threshold: float
    features: list[str]

    @property
    def budget(self) -> float: ...

    @property
    def persist(self) -> int: ...

    def score(self, rows: Any, fleet: Any = None) -> Any: ...

    def evidence(self, scores: Any) -> Any: ...


class Scorer(Protocol):
    """The models by group (:class:`detector.model.forest.ModelSet`); false when it has none."""

    def __bool__(self) -> bool: ...

    def get(self, group: str) -> GroupModel | None: ...


class ClosedWindow(NamedTuple):
    """A closed window waiting for the batch phase, with what judging it needs."""

    detector: Anomaly
    state: AnomalyState
    resource: ResourceInfo
    window: Window


class ScoredWindow(NamedTuple):
    """One judged window as ``backtest --scores`` writes it."""

    resource_id: str
    group: str
    start: float
    end: float
    score: float
    threshold: float
    evidence: float
    run: float
    """The run's evidence: the largest ``L * min(evidence of the last L windows)``."""
    budget: float
    decision: str
    """``normal``, ``unusual`` (counts towards a run), ``alert`` (opens an episode), ``open`` (keeps
    an open episode open), ``rule`` (a rule tracks the resource: it has the first word) or
    ``late`` (a window older than one already judged: ignored)."""
    rule_tracking: bool


class Scoring:
    """What the anomaly rules score with, shared by every anomaly rule it is handed to: swapping
    ``scorer`` (a model reload) reaches all of them at once, through rule reloads too."""

    def __init__(self, scorer: Scorer | None = None, observe: Callable[[list[ClosedWindow]], None] | None = None,
                 record: Callable[[list[ScoredWindow]], None] | None = None) -> None:  # fmt: skip
        self.scorer = scorer
        """The models in use; None or empty: nothing is judged (cold start)."""
        self.observe = observe
        """Sees each batch's closed windows before they are scored (training collects them)."""
        self.record = record
        """Sees each batch's judged windows with their scores and decisions (``backtest --scores``)."""

    @property
    def active(self) -> bool:
        """Whether windows are worth building: a model to score them, or someone watching."""
        return bool(self.scorer) or self.observe is not None


def _anomaly_rules(rules: Iterable[CompiledRule]) -> list[Anomaly]:
    found: list[Anomaly] = []
    for rule in rules:
        for detector in (rule.detector, *(d for _, d in rule.overrides)):
            if isinstance(detector, Anomaly):
                found.append(detector)
    return found


def use_scoring(rules: Iterable[CompiledRule], scoring: Scoring) -> None:
    """Hand ``scoring`` to every anomaly rule among ``rules`` (and their overrides)."""
    for detector in _anomaly_rules(rules):
        detector.scoring = scoring


@contextmanager
def scoring_during(rules: Iterable[CompiledRule], scoring: Scoring) -> Iterator[None]:
    """:func:`use_scoring` for a block (a backtest): each rule gets back what it had after it,
    so a rule set reused afterwards is not left scoring with a model it was lent."""
    detectors = _anomaly_rules(rules)
    before = [d.scoring for d in detectors]
    for detector in detectors:
        detector.scoring = scoring
    try:
        yield
    finally:
        for detector, previous in zip(detectors, before, strict=True):
            detector.scoring = previous


MAX_PERSIST = 64
"""Most windows a run keeps per resource (the state is bounded whatever a model file says)."""
MetricName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:/-]{1,128}$")]


class AnomalyParams(Params):
    window: Duration = Field(default=300.0, ge=60)
    for_: Duration = Field(default=1800.0, ge=0, alias="for")
    min_history: Duration = Field(default=6 * 3600.0, ge=0)
    quiet_windows: int = Field(default=2, ge=1)
    metrics: list[MetricName] = Field(default_factory=list, max_length=32)
    """Generic metrics (keys of a usage event's ``metrics``) the model reads besides the group's features."""

    @property
    def persist(self) -> int:
        """The longest run of windows whose evidence adds up (``for`` in windows, at least one)."""
        return max(1, round(self.for_ / self.window))


class AnomalyFigures(msgspec.Struct, kw_only=True, gc=False, forbid_unknown_fields=True):
    """An open episode's figures: made when it fires, gone when it resolves (nine fields fewer on
    every resource outside an episode)."""

    usd: float = 0.0
    score: float = 0.0
    threshold: float = 0.0
    stands_out: list[dict[str, Any]] | None = None
    """The features furthest from usual in the episode."""
    quiet: int = 0
    evidence: float = 0.0
    """The run's evidence when it opened (``L * min`` over its ``windows_run`` windows)."""
    budget: float = 0.0
    windows_run: int = 0
    quiet_usd: float = 0.0
    """Dollars of the episode's windows since its last unusual one: its own if it goes on."""


class Judged(Episode, kw_only=True, forbid_unknown_fields=True):
    """How a model judged the resource's windows: the run of evidence and the episode. Made at the
    first judged window; a worker that builds windows without judging them (training) holds none."""

    run: FloatArray | None = None
    """The last judged windows in a row (up to ``persist``): (start, evidence, dollars) of each,
    flat in one array of doubles, 24 bytes a window (a tuple of three floats was ~110: ~600 bytes
    on every resource a model judges); None: none. Saved as a flat list; a list of triples
    (saved before) is read flat (:func:`detector.floats.dec_hook`)."""
    last_seq: int = 0
    last_end: float = 0.0
    figures: AnomalyFigures | None = None
    """The open episode's figures; None outside an episode."""

    def __post_init__(self) -> None:
        if self.run is not None:
            if len(self.run) % 3:
                raise ValueError("an anomaly run holds (start, evidence, dollars) triples")
            if not self.run:
                self.run = None  # saved before as an empty list
        if (self.fired_at is None) != (self.figures is None):
            raise ValueError("an anomaly episode has figures while open, and only then")

    def clear(self) -> None:
        super().clear()
        self.figures = None


class AnomalyState(WindowState, kw_only=True, forbid_unknown_fields=True):
    """The resource's open window and baselines (the builder's :class:`WindowState`, one struct
    with this rule's state: no second object and pointer on every key), and how its windows
    were judged. Made at the first event the rule builds windows for (a worker without a model
    holds none: the rule is lazy). A state saved in the shape before (an episode with the window
    inside it: :class:`AnomalyStateBefore`) is read through that class."""

    judged: Judged | None = None
    """None until a model judges a window of the resource."""
    saved_before: ClassVar[type[AnomalyStateBefore]]  # type: ignore[assignment]  # the rule's own shape before


class AnomalyStateBefore(Episode, kw_only=True, forbid_unknown_fields=True):
    """The rule's state as snapshots saved it until 2026-12-02: an episode with every figure inline
    and the window inside it. Read only to be made an :class:`AnomalyState` (:meth:`upgrade`)."""

    windows: WindowStateBefore | None = None
    run: FloatArray | None = None
    last_seq: int = 0
    usd: float = 0.0
    score: float = 0.0
    threshold: float = 0.0
    stands_out: list[dict[str, Any]] | None = None
    quiet: int = 0
    evidence: float = 0.0
    budget: float = 0.0
    windows_run: int = 0
    quiet_usd: float = 0.0
    last_end: float = 0.0

    def __post_init__(self) -> None:
        if self.run is not None and not self.run:
            self.run = None  # saved before as an empty list

    def upgrade(self) -> AnomalyState:
        """The same window, baselines, run and episode in the shape held now. Figures of an episode
        that resolved (the old shape kept some) are dropped: a next episode sets them all at its fire."""
        window = self.windows.upgrade() if self.windows is not None else WindowState()
        judged = None
        judged_before = self.since is not None or self.fired_at is not None or self.run is not None
        if judged_before or self.last_report != 0.0 or self.last_seq != 0 or self.last_end != 0.0:
            figures = None
            if self.fired_at is not None:
                figures = AnomalyFigures(usd=self.usd, score=self.score, threshold=self.threshold,
                                         stands_out=self.stands_out, quiet=self.quiet, evidence=self.evidence,
                                         budget=self.budget, windows_run=self.windows_run,
                                         quiet_usd=self.quiet_usd)  # fmt: skip
            judged = Judged(since=self.since, fired_at=self.fired_at, last_report=self.last_report,
                            run=self.run, last_seq=self.last_seq,
                            last_end=self.last_end, figures=figures)  # fmt: skip
        return AnomalyState(**msgspec.structs.asdict(window), judged=judged)


AnomalyState.saved_before = AnomalyStateBefore


class Anomaly(DetectorBase):
    type: ClassVar[str] = "anomaly"
    title: ClassVar[str] = "Cost anomaly"
    Params: ClassVar[builtins.type[AnomalyParams]] = AnomalyParams
    State: ClassVar[builtins.type[AnomalyState]] = AnomalyState
    consumes: ClassVar[tuple[builtins.type, ...]] = (GpuMetric, UsageEvent)
    behaviour: ClassVar[bool] = True
    lazy: ClassVar[bool] = True
    """A worker running rules only (no model) builds no window: a key holds no state for this rule."""
    listens: ClassVar[bool] = True
    """It asks what the key's other rules track at each event: stepped after them."""
    dollars: ClassVar[str] = "spent during it"
    suggestion: ClassVar[str] = (
        "Look at what changed on the resource at the window's start (a deploy, a price or "
        "configuration change, a job that behaves differently); mark it expected if it is."
    )

    def __init__(self, name: str, severity: str, params: Any, pricing: Any = None) -> None:
        super().__init__(name, severity, params, pricing)
        self._builder = WindowBuilder(params.window, metrics=params.metrics)
        self.scoring = Scoring()
        """The scorer in use (:func:`use_scoring`); none until one is handed over: rules only."""

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        out = [("Score", f"{details.get('score', 0):.3f} (one window alone alerts above {details.get('threshold', 0):.3f})")]
        if details.get("windows"):
            out.append(("Evidence", f"{details.get('evidence', 0):.1f} over {details['windows']} window(s) in a row "
                                    f"(an alert takes {details.get('budget', 0):.1f})"))  # fmt: skip
        for f in details.get("stands_out", []):
            lo, hi = f["usual_range"]
            out.append((f["feature"], f"{f['value']:,.3g} (usually {lo:,.3g} to {hi:,.3g})"))
        return out

    def starts(self, ctx: Context, event: Event) -> bool:
        return self.scoring.active  # rules only: no window is built, nothing to hold

    def starts_scrape(self, ctx: Context, scrape: Scrape) -> bool:
        return self.scoring.active

    def step(self, state: AnomalyState, ctx: Context, event: Event, t: float) -> list[Finding]:
        if not self.scoring.active:
            return []  # no model loaded: rules only (the worker said so in its log)
        resource = ctx.resource
        # A rule tracking unusual behaviour here (idle, hung, dark, runaway) at the event's time is
        # noted on the window; a pause of the resource's work (idle, hung, dark) is neither judged nor
        # learnt. Asked at every event, samples too: live, a host's five minutes of usage can reach
        # detection after the samples that follow them, where a spell ended, so asked at usage alone
        # whether a window was paused would depend on which topic was read first (tests/test_fetch_order.py).
        builder = self._builder
        others = Behaviour.NONE if builder.paused_through(state, t) else ctx.others(t)  # (nothing left to hear)
        window = builder.add(state, resource.resource_id, resource.resource_type, resource.interval_usd,
                                   event, t, others is not Behaviour.NONE, others is Behaviour.PAUSE)  # fmt: skip
        if window is not None:
            self._defer(state, ctx, window)
        return []

    def step_scrape(self, state: AnomalyState, ctx: Context, scrape: Scrape,
                    t: float) -> list[tuple[int, Finding]]:  # fmt: skip
        """:meth:`step` for each sample of a scrape, in one call (none without a model: rules only).
        Like a step, it finds nothing itself: a window the scrape closes is judged in the batch phase."""
        if not self.scoring.active:
            return []
        resource, gpus = ctx.resource, scrape.gpus
        in_order = len(gpus) < len(FIRST) and gpus is FIRST[len(gpus)]
        builder = self._builder
        others = Behaviour.NONE if builder.paused_through(state, t) else ctx.others(t)
        window = builder.add_scrape(state, resource.resource_id, resource.resource_type, scrape.samples,
                                          in_order, t, others is not Behaviour.NONE, others is Behaviour.PAUSE)  # fmt: skip
        if window is not None:
            self._defer(state, ctx, window)
        return []

    def _defer(self, state: AnomalyState, ctx: Context, window: Window) -> None:
        if window.history_s < self.params.min_history:
            window = window.against_fleet()  # too little history of its own: judged by its levels alone
        ctx.defer(self, ClosedWindow(self, state, msgspec.structs.replace(ctx.resource), window))

    def end_batch(self, items: list[ClosedWindow]) -> list[Finding]:
        """Score a batch's closed windows, one call per model group, and turn them into findings
        in window order."""
        import numpy as np

        scoring = self.scoring
        if scoring.observe is not None:
            scoring.observe(items)
        models = scoring.scorer
        scores: dict[int, tuple[float, float, GroupModel]] = {}
        by_group: dict[str, list[int]] = {}
        for i, (_, _, _, window) in enumerate(items):
            by_group.setdefault(window.group, []).append(i)
        for group, indexes in by_group.items():
            artifact = models.get(group) if models else None
            if artifact is None:
                continue  # cold start for this group: rules only
            if list(items[indexes[0]][3].names) != artifact.features:
                METRICS.anomaly_unscored.labels(group).inc(len(indexes))
                continue  # trained on other features (the rule's metrics changed): retrain
            rows = np.array([items[i][3].vector() for i in indexes])
            group_scores = artifact.score(rows, np.array([not items[i][3].own_history for i in indexes]))
            evidence = artifact.evidence(group_scores)
            observe = METRICS.anomaly_scores.labels(group).observe
            for i, score, e in zip(indexes, group_scores, evidence, strict=True):
                scores[i] = (float(score), float(e), artifact)
                observe(float(score))
        found: list[Finding] = []
        recorded: list[ScoredWindow] = []
        for i, (_, state, resource, window) in enumerate(items):
            if i in scores:
                score, e, artifact = scores[i]
                decision, run, findings = self._judge(state, resource, window, score, e, artifact)
                found.extend(findings)
                if scoring.record is not None:
                    recorded.append(ScoredWindow(window.resource_id, window.group, window.start, window.end, score,
                                                 artifact.threshold, e, run, artifact.budget, decision,
                                                 window.covered))  # fmt: skip
        if recorded and scoring.record is not None:
            scoring.record(recorded)
        return found

    def _judge(self, state: AnomalyState, res: ResourceInfo, w: Window, score: float, e: float,
               model: GroupModel) -> tuple[str, float, list[Finding]]:  # fmt: skip
        """Fold one window's evidence into the resource's run and say what it decided."""
        st = state.judged
        if st is None:
            st = state.judged = Judged()
        if w.end <= st.last_end:
            return "late", 0.0, []
        persist, budget = max(1, min(model.persist, MAX_PERSIST)), model.budget
        if not follows(st.last_seq, st.last_end, w):
            st.run = None  # windows in between were not judged, or a long silence: a run starts again
        if math.isnan(e):
            e = 0.0  # never from a model file that loads (its calibration is checked); no evidence
        st.last_seq, st.last_end = w.seq, w.end
        if w.covered and st.fired_at is None:
            st.run = None  # a rule is tracking the resource: it has the first word, and a run starts after it
            return "rule", 0.0, []
        kept = st.run[-3 * (persist - 1) :] if st.run is not None and persist > 1 else ()
        windows = st.run = array("d", [*kept, w.start, e, w.cost_usd])  # made whole: no spare capacity on every key
        run, length, least = 0.0, 0, math.inf
        for n, evidence in enumerate(reversed(windows[1::3]), start=1):
            least = min(least, evidence)
            if n * least > run:
                run, length = n * least, n
        fig = st.figures
        if fig is None:
            if run < budget:
                return ("unusual" if e >= budget / persist else "normal"), run, []
            first = len(windows) - 3 * length  # the opening run's first window
            fig = AnomalyFigures(score=score, threshold=model.threshold, stands_out=stands_out(w), evidence=run,
                                 budget=budget, windows_run=length)  # fmt: skip
            action = fire(st, since=windows[first], fired_at=w.end, at=w.end)
            st.figures = fig
            fig.usd = sum(windows[first + 2 :: 3])
            return "alert", run, [self._finding(action, st, fig, res, w)]
        if run >= budget:  # open while the latest windows would still open it
            fig.quiet = 0
            fig.usd += fig.quiet_usd + w.cost_usd  # windows that dipped inside the episode are part of it
            fig.quiet_usd = 0.0
            st.last_report = w.end  # every anomalous window of an open episode reports it
            if score > fig.score:
                fig.score, fig.stands_out = score, stands_out(w)
            return "open", run, [self._finding("update", st, fig, res, w)]
        fig.quiet += 1
        fig.quiet_usd += w.cost_usd
        if fig.quiet < self.params.quiet_windows:
            return "normal", run, []
        st.run = None  # the next episode needs a run of its own
        return "normal", run, end(st, lambda: self._finding("resolve", st, fig, res, w, reason="back_to_normal"))

    def open_episode(self, state: AnomalyState, resource: ResourceInfo) -> Finding | None:
        st = state.judged
        if st is None or st.fired_at is None or st.figures is None:
            return None
        return make_finding(self, "update", resource, episode_start=st.since or 0.0, fired_at=st.fired_at,
                            at=st.last_end, usd=st.figures.usd, details=self._details(st.figures))  # fmt: skip

    def _details(self, fig: AnomalyFigures, **extra: object) -> dict[str, Any]:
        return {
            "score": round(fig.score, 4),
            "threshold": round(fig.threshold, 4),
            "evidence": round(fig.evidence, 3),
            "budget": round(fig.budget, 3),
            "windows": fig.windows_run,
            "stands_out": fig.stands_out or [],
            **extra,
        }

    def _finding(self, action: str, st: Judged, fig: AnomalyFigures, res: ResourceInfo, w: Window,
                 **extra: object) -> Finding:  # fmt: skip
        assert st.since is not None and st.fired_at is not None
        details = self._details(fig, window_start=w.start, window_end=w.end, model_group=w.group, **extra)
        return make_finding(self, action, res, episode_start=st.since, fired_at=st.fired_at, at=w.end, usd=fig.usd,
                            details=details, usd_per_hour=w.values.get("cost_usd_per_hour", 0.0))  # fmt: skip


def stands_out(w: Window, n: int = 3) -> list[dict[str, Any]]:
    """The ``n`` base features furthest from the resource's usual level, in its own deviations."""
    ranked = sorted(((abs(w.values.get(f"{name}_z", 0.0)), name) for name in w.usual), reverse=True)
    out = []
    for dev, name in ranked[:n]:
        usual, lo, hi = w.usual[name]
        out.append({"feature": name, "about": _about(name), "value": round(w.values.get(name, 0.0), 4),
                    "usual": round(usual, 4), "usual_range": [round(lo, 4), round(hi, 4)],
                    "deviation": round(dev, 2)})  # fmt: skip
    return out


def _about(name: str) -> str:
    if name.startswith(METRIC_PREFIX):
        return f"mean of the generic metric {name[len(METRIC_PREFIX):]!r} over the window"
    return BASE_FEATURES[name]
