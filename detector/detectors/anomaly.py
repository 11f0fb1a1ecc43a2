"""``anomaly``: what the isolation forest finds unusual in a resource's 5-minute windows.

Example rule::

    - name: cost-anomaly
      type: anomaly
      params:
        window: 5m            # tumbling windows of event time
        for: 30m              # anomalous windows in a row for this long open an episode
        min_history: 6h       # a resource's baseline must cover this before it is judged
        quiet_windows: 2      # normal windows in a row that end an episode
      severity: info

The step only folds events into feature windows (:mod:`detector.model.features`); a
closed window goes to the engine's batch, which scores every window of the batch in
one ``score_samples`` call per model group (``score_windows``). With no model for a
resource's group (cold start) nothing is judged. Consecutive anomalous windows are
one episode; the alert names the three features furthest from the resource's usual
range, the score against the threshold, and the dollars the resource cost meanwhile.
A window in which a rule is already tracking unusual behaviour on the resource (an idle
or hung episode, dark telemetry, a runaway: ``behaviour_active`` on its state) is not
judged: the rules get the first word. Its baselines wait out a pause of the resource's
work (idle, hung, dark) and learn a runaway's level (``pauses_work = False`` on the
state), so an anomaly does not repeat the rule's alert once the rule lets go. And when
a rule's incident opens on a resource whose anomaly is open, the alert manager joins
the anomaly to it rather than posting both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import msgspec
from pydantic import Field

from detector.detectors.base import DetectorBase, Finding, Params, ResourceInfo, make_finding
from detector.events import Event, GpuMetric, UsageEvent
from detector.metrics import METRICS
from detector.model.features import BASE_FEATURES, FEATURE_SETS, Window, WindowBuilder, WindowState
from detector.units import Duration

__all__ = ["Anomaly", "AnomalyParams", "AnomalyState"]

Sink = Callable[[tuple], None]


class AnomalyParams(Params):
    window: Duration = Field(default=300.0, ge=60)
    for_: Duration = Field(default=1800.0, ge=0, alias="for")
    min_history: Duration = Field(default=6 * 3600.0, ge=0)
    quiet_windows: int = Field(default=2, ge=1)


class AnomalyState(msgspec.Struct, kw_only=True):
    windows: WindowState = msgspec.field(default_factory=WindowState)
    candidate: float | None = None
    """Start of the current run of anomalous windows, before it has lasted ``for``."""
    candidate_usd: float = 0.0
    since: float | None = None
    fired_at: float | None = None
    usd: float = 0.0
    score: float = 0.0
    threshold: float = 0.0
    stands_out: list[dict[str, Any]] = []
    quiet: int = 0
    last_end: float = 0.0


class Anomaly(DetectorBase):
    type: ClassVar[str] = "anomaly"
    title: ClassVar[str] = "Cost anomaly"
    Params: ClassVar[type[AnomalyParams]] = AnomalyParams
    State: ClassVar[type[AnomalyState]] = AnomalyState
    consumes: ClassVar[tuple[type, ...]] = (GpuMetric, UsageEvent)
    uses_sink: ClassVar[bool] = True
    behaviour: ClassVar[bool] = True
    """The engine passes ``sink``: closed windows are scored together at the end of the batch."""
    dollars: ClassVar[str] = "spent during it"
    suggestion: ClassVar[str] = (
        "Look at what changed on the resource at the window's start (a deploy, a price or "
        "configuration change, a job that behaves differently); mark it expected if it is."
    )

    def __init__(self, name: str, severity: str, params: Any, pricing: Any = None) -> None:
        super().__init__(name, severity, params, pricing)
        self._builder = WindowBuilder(params.window)

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        out = [("Score", f"{details.get('score', 0):.3f} (threshold {details.get('threshold', 0):.3f})")]
        for f in details.get("stands_out", []):
            lo, hi = f["usual_range"]
            out.append((f["feature"], f"{f['value']:,.3g} (usually {lo:,.3g} to {hi:,.3g})"))
        return out

    def step(self, state: AnomalyState, resource: ResourceInfo, event: Event, t: float,
             sink: Sink | None = None, siblings: dict[str, Any] | None = None) -> list[Finding]:  # fmt: skip
        if sink is None:
            return []  # no model loaded: rules only (the worker said so in its log)
        # A rule already on it (idle, hung, dark, runaway) covers the window: the rules get the
        # first word, and the window opens no anomaly; a pause of the resource's work (idle,
        # hung, dark) does not move the baselines either. Asked on usage events (a minute
        # apart), not on every GPU sample.
        covered = paused = False
        if type(event) is UsageEvent and siblings:
            for s in siblings.values():
                if getattr(s, "behaviour_active", False):
                    covered = True
                    paused = paused or getattr(s, "pauses_work", True)
        window = self._builder.add(state.windows, resource.resource_id, resource.resource_type, resource.interval_usd,
                                   event, t, covered, paused)  # fmt: skip
        if window is None or window.history * self.params.window < self.params.min_history:
            return []
        sink((self, state, msgspec.structs.replace(resource), window))
        return []

    def score_windows(self, items: list[tuple], models: Any) -> list[Finding]:
        """Score a batch's closed windows (``(detector, state, resource, window)``), one call per
        model group, and turn them into findings in window order."""
        import numpy as np

        scores: dict[int, tuple[float, float]] = {}
        by_group: dict[str, list[int]] = {}
        for i, (_, _, _, window) in enumerate(items):
            by_group.setdefault(window.group, []).append(i)
        for group, indexes in by_group.items():
            artifact = models.get(group) if models else None
            if artifact is None:
                continue  # cold start for this group: rules only
            rows = np.array([items[i][3].vector() for i in indexes])
            group_scores = artifact.score(rows)
            observe = METRICS.anomaly_scores.labels(group).observe
            for i, score in zip(indexes, group_scores, strict=True):
                scores[i] = (float(score), artifact.threshold)
                observe(float(score))
        found: list[Finding] = []
        for i, (_, state, resource, window) in enumerate(items):
            if i in scores:
                found.extend(self._judge(state, resource, window, *scores[i]))
        return found

    def _judge(self, st: AnomalyState, res: ResourceInfo, w: Window, score: float, threshold: float) -> list[Finding]:
        if w.end <= st.last_end:
            return []
        if st.candidate is not None and w.start > st.last_end + 1e-6:
            st.candidate, st.candidate_usd = None, 0.0  # windows in between were not judged: start again
        st.last_end = w.end
        if score > threshold:
            st.quiet = 0
            if st.fired_at is None:
                if st.candidate is None or score > st.score:
                    st.score, st.threshold, st.stands_out = score, threshold, stands_out(w)
                if st.candidate is None:
                    st.candidate, st.candidate_usd = w.start, 0.0
                st.candidate_usd += w.cost_usd
                if w.end - st.candidate < self.params.for_:
                    return []
                st.since, st.fired_at, st.usd = st.candidate, w.end, st.candidate_usd
                st.candidate = None
                return [self._finding("fire", st, res, w)]
            st.usd += w.cost_usd
            if score > st.score:
                st.score, st.stands_out = score, stands_out(w)
            return [self._finding("update", st, res, w)]
        if st.fired_at is None:
            st.candidate, st.candidate_usd, st.score = None, 0.0, 0.0
            return []
        st.quiet += 1
        if st.quiet < self.params.quiet_windows:
            return []
        finding = self._finding("resolve", st, res, w, reason="back_to_normal")
        st.since = st.fired_at = None
        st.usd, st.quiet, st.stands_out = 0.0, 0, []
        return [finding]

    def open_episode(self, state: AnomalyState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return make_finding(self, "update", resource, episode_start=state.since or 0.0, fired_at=state.fired_at,
                            at=state.last_end, usd=state.usd, details=self._details(state))  # fmt: skip

    def _details(self, st: AnomalyState, **extra: object) -> dict[str, Any]:
        return {"score": round(st.score, 4), "threshold": round(st.threshold, 4), "stands_out": st.stands_out, **extra}

    def _finding(self, action: str, st: AnomalyState, res: ResourceInfo, w: Window, **extra: object) -> Finding:
        assert st.since is not None and st.fired_at is not None
        details = self._details(st, window_start=w.start, window_end=w.end, model_group=w.group, **extra)
        return make_finding(self, action, res, episode_start=st.since, fired_at=st.fired_at, at=w.end, usd=st.usd,
                            details=details, usd_per_hour=w.values.get("cost_usd_per_hour", 0.0))  # fmt: skip


def stands_out(w: Window, n: int = 3) -> list[dict[str, Any]]:
    """The ``n`` base features furthest from the resource's usual level, in its own spread."""
    ranked = []
    for name in FEATURE_SETS[w.group]:
        mean, std = w.usual[name]
        value = w.values[name]
        scale = max(std, 0.1 * abs(mean), 1e-6)
        ranked.append((abs(value - mean) / scale, name, value, mean, std))
    ranked.sort(reverse=True)
    return [
        {"feature": name, "about": BASE_FEATURES[name], "value": round(value, 4), "usual": round(mean, 4),
         "usual_range": [round(mean - 2 * std, 4), round(mean + 2 * std, 4)], "deviation": round(dev, 2)}
        for dev, name, value, mean, std in ranked[:n]
    ]  # fmt: skip
