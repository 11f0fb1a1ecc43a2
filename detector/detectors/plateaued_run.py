"""``plateaued_run``: a training run that goes on holding its GPUs after its metric stopped improving.

Example rule::

    - name: plateaued-run
      type: plateaued_run
      params:
        metric: val_loss     # the metric in the run events' ``metrics`` to watch...
        mode: min            # ...and which way is better (min | max; left out, the name says: loss, accuracy, f1...)
        min_delta: 0         # an evaluation must beat the best by more than this to count
        patience: 5          # evaluations without improvement...
        patience_for: 2h     # ...or this long since the best one (optional), whichever first
      severity: warning

Run events carry the run's latest metrics (``metrics``, with the ``step`` they were logged
at) as MLflow's ``log_metric`` and W&B's ``wandb.log`` record them. A run whose watched
metric has not beaten its best by ``min_delta`` for ``patience`` evaluations (or, with
``patience_for``, for that long) is paying for GPUs that no longer buy a better model:
that is what an early-stopping callback would have stopped. Dollars run from the best
evaluation (the plateau's start) at the run's share of its hosts' price, as
``failed_run_spend`` prices runs (:mod:`detector.detectors.runs`); the alert resolves when
the metric improves again or the run ends, with the dollars up to then.

Why these defaults: the frameworks' early-stopping callbacks compare against the best value
with ``min_delta`` 0 (PyTorch Lightning ``EarlyStopping``, Keras ``EarlyStopping``, Hugging
Face ``EarlyStoppingCallback``'s ``early_stopping_threshold``); their patience defaults are
3 (Lightning) and 0-1 (Keras, HF), which people raise for noisy validation; Keras'
``ReduceLROnPlateau`` waits 10. Five evaluations is past the dips a noisy metric makes on its
way down without letting a flat run burn long. An evaluation is a new ``step`` (or, without
one, a later event carrying the metric): a heartbeat repeating the last value at the same
step counts once. A lower step in a later event is the run resumed from a checkpoint: its
evaluations count (against the same best), so an improvement after the restart resolves.
"""

from __future__ import annotations

import builtins
import math
import re
from functools import partial
from typing import Any, ClassVar, Literal

import msgspec
from pydantic import Field, model_validator

from detector.detectors.base import Context, DetectorBase, Finding, Params, ResourceInfo, make_finding
from detector.detectors.ended import Ended, is_past
from detector.detectors.episode import Episode, due, end, fire
from detector.detectors.runs import Fleet, RunState, emptied, hosts_of, refresh
from detector.events import Event, RunEvent
from detector.pricing import usd_over
from detector.tag_names import tag_value
from detector.units import Duration

__all__ = ["PlateauedRun", "PlateauedRunParams", "PlateauedRunState", "mode_of"]

MAX_RUNS = 4096
"""Open runs followed per project; a project past it (runs whose end event never came) drops its
oldest quiet run first."""
SCAN_EVERY_S = 3600.0
"""How often (event time) the open runs are walked for ones quiet past ``forget_after``: a day or two's
horizon loses nothing to an hour's lateness, and a project of thousands of open runs is not walked at
every event."""
MAX_ENDED = 1024
"""Ended runs remembered per project (so a re-read end or metric event of one changes nothing): past
it, those older than ``forget_after`` go, then all but the newest half. A sweep of thousands of short
runs must not grow a project's state (or cost a copy of it at every run's end)."""


LOWER_IS_BETTER = frozenset({"loss", "nll", "error", "err", "perplexity", "ppl", "wer", "cer", "ter", "mse", "mae",
                             "rmse", "mape", "distance", "fid"})
HIGHER_IS_BETTER = frozenset({"acc", "accuracy", "f1", "auc", "auroc", "roc", "bleu", "rouge", "rouge1", "rouge2",
                              "rougel", "meteor", "map", "precision", "recall", "iou", "miou", "dice", "r2",
                              "em", "exact", "match", "reward", "return", "score", "top1", "top5", "ndcg", "mrr"})
"""Words of a metric's name (split at anything not a letter or digit) that say which way is better,
when a rule gives no ``mode``: the frameworks' own names (``val_loss``, ``eval_accuracy``, ``eval/f1``)."""


def mode_of(metric: str) -> Literal["min", "max"] | None:
    """Which way the metric named ``metric`` is better, from its name's words; None: they do not say (or disagree)."""
    words = set(re.split(r"[^a-z0-9]+", metric.lower()))
    low, high = bool(words & LOWER_IS_BETTER), bool(words & HIGHER_IS_BETTER)
    return "min" if low and not high else "max" if high and not low else None


class PlateauedRunParams(Params):
    metric: str = Field(default="val_loss", min_length=1)
    mode: Literal["min", "max"] = "min"
    """Which way is better; when a rule leaves it out, the metric's name says (:func:`mode_of`), or the rule is
    refused: an accuracy read as a loss would call every improving run plateaued."""
    min_delta: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    patience: int = Field(default=5, ge=1)
    patience_for: Duration | None = Field(default=None, gt=0)
    update_every: Duration = Field(default=3600.0, gt=0)
    forget_after: Duration = Field(default=2 * 86_400.0, gt=0)
    """A run with no event for this long is forgotten (its end event was lost)."""

    @model_validator(mode="before")
    @classmethod
    def _mode_from_metric(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("mode") is None:
            metric = data.get("metric", "val_loss")
            mode = mode_of(metric) if isinstance(metric, str) else None
            if mode is None:
                raise ValueError(f"say mode: min or max for metric {metric!r} (its name does not say which way is "
                                 "better)")  # fmt: skip
            data = {**data, "mode": mode}
        return data


class WatchedRun(Episode, kw_only=True):
    """One open run, its best metric, and its plateau as the episode."""

    run_id: str
    run: RunState
    best: float | None = None
    best_t: float = 0.0
    best_step: int | None = None
    stale: int = 0
    """Evaluations since the best one."""
    last_eval_t: float = -math.inf
    last_step: int | None = None
    last_value: float = 0.0
    last_t: float = 0.0
    hourly: float = 0.0
    """The run's share of its hosts' price at the latest finding priced, with the first host's
    place and the GPUs below: what a finding made without a look-up of the hosts (the open
    episodes at the end of a backtest) reports, rather than $0."""
    gpus: int = 0
    account: str = ""
    region: str = ""
    instance_type: str = ""


class PlateauedRunState(Episode, kw_only=True):
    """A project's open runs (the episodes live on each run)."""

    runs: dict[str, WatchedRun] = {}
    ended: Ended = msgspec.field(default_factory=Ended)
    """Run id → end time: a re-read event of an ended run (dated up to its end) changes nothing."""
    scan_at: float = -math.inf
    """Event time of the next look for runs gone quiet (it walks every open run: hourly, not per event)."""


class PlateauedRun(DetectorBase):
    type: ClassVar[str] = "plateaued_run"
    title: ClassVar[str] = "Run no longer improving"
    Params: ClassVar[builtins.type[PlateauedRunParams]] = PlateauedRunParams
    State: ClassVar[builtins.type[PlateauedRunState]] = PlateauedRunState
    consumes: ClassVar[tuple[builtins.type, ...]] = (RunEvent,)
    suggestion: ClassVar[str] = (
        "Stop the run and keep its best checkpoint, and add early stopping so the next one stops itself: "
        "PyTorch Lightning EarlyStopping(monitor=..., patience=...), Keras "
        "callbacks.EarlyStopping(monitor=..., patience=..., restore_best_weights=True), Hugging Face "
        "EarlyStoppingCallback(early_stopping_patience=...) with load_best_model_at_end=True."
    )

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        best = details.get("best")
        best_text = f"{best:.6g}" if isinstance(best, (int, float)) else "-"
        return [("Run", f"`{details.get('run_id')}`"),
                ("Metric", f"`{details.get('metric', '')}` best {best_text} at step {details.get('best_step')}, "
                           f"{details.get('evaluations_since_best', 0)} evaluations without improvement"),
                ("GPUs", str(details.get("gpu_count", 0)))]  # fmt: skip

    def step(self, state: PlateauedRunState, ctx: Context, event: Event, t: float) -> list[Finding]:
        if type(event) is not RunEvent:
            return []
        st, ev = state, event
        ended_at = st.ended.get(ev.run_id)
        if is_past(ended_at, ev.status, t):
            return []  # a re-read or straggling event of the ended run
        if ended_at is not None:
            st.ended.discard(ev.run_id)  # the id used again later (a scheduled job's fixed name): a new run
        found: list[Finding] = []
        if t >= st.scan_at:
            st.scan_at = t + SCAN_EVERY_S
            found = self._forget_quiet(st, t, ctx.lookup)
        w = st.runs.get(ev.run_id)
        if w is None:
            if len(st.runs) >= MAX_RUNS:
                oldest = self._oldest(st)
                found += self._drop(st, oldest, st.runs[oldest].last_t, ctx.lookup, reason="forgotten")
            w = st.runs[ev.run_id] = WatchedRun(run_id=ev.run_id, run=RunState(start=t))
        refresh(w.run, ev)  # its hosts, GPUs and tags
        if t > w.last_t:
            w.last_t = t
        if ev.status not in ("started", "running"):
            found += self._drop(st, ev.run_id, t, ctx.lookup, reason=f"run_{ev.status}")
            st.ended.add(ev.run_id, t)
            if len(st.ended) > MAX_ENDED:  # pruned now and then, not at every end (a sweep ends thousands)
                st.ended.keep_since(t - self.params.forget_after, newest=MAX_ENDED // 2)  # ended in event-time order
            return found
        value = ev.metrics.get(self.params.metric) if ev.metrics else None
        if value is not None and math.isfinite(value) and self._new_evaluation(w, ev, t):
            found += self._evaluate(w, ev, value, t, ctx.lookup)
        elif w.fired_at is not None and due(w, t, self.params.update_every):
            found.append(self._finding("update", w, t, ctx.lookup))
        return found

    @staticmethod
    def _oldest(st: PlateauedRunState) -> str:
        """The watched run quiet the longest (a helper: the lambda in :meth:`step` would cost it a cell
        at every run event, :func:`~detector.detectors.base.at_sample`)."""
        runs = st.runs
        return min(runs, key=lambda k: runs[k].last_t)

    def open_episodes(self, state: PlateauedRunState, resource: ResourceInfo) -> list[Finding]:
        return [self._finding("update", w, w.last_t, None) for w in state.runs.values() if w.fired_at is not None]

    # -- evaluations -----------------------------------------------------------

    @staticmethod
    def _new_evaluation(w: WatchedRun, ev: RunEvent, t: float) -> bool:
        if ev.step is not None:
            if w.last_step is not None and ev.step <= w.last_step and (ev.step == w.last_step or t <= w.last_eval_t):
                return False  # the same evaluation again (a heartbeat, a re-read message)
            w.last_step = ev.step  # (a lower step, later: resumed from a checkpoint, evaluating anew)
        elif t <= w.last_eval_t:
            return False
        w.last_eval_t = t
        return True

    def _evaluate(self, w: WatchedRun, ev: RunEvent, value: float, t: float, fleet: Fleet | None) -> list[Finding]:
        p = self.params
        w.last_value = value
        better = w.best is None or (value < w.best - p.min_delta if p.mode == "min" else value > w.best + p.min_delta)
        if better:
            found = end(w, partial(self._finding, "resolve", w, t, fleet, reason="improved"))  # (clears it either way)
            w.best, w.best_t, w.best_step, w.stale = value, t, ev.step, 0
            return found
        w.stale += 1
        if w.fired_at is not None:
            return [self._finding("update", w, t, fleet)] if due(w, t, p.update_every) else []
        plateau = w.stale >= p.patience or (p.patience_for is not None and t - w.best_t >= p.patience_for)
        if not plateau or self._hourly(w, fleet) is None:
            return []  # not yet, or its hosts' price is not known: nothing to weigh
        fire(w, since=w.best_t, fired_at=t, at=t)
        return [self._finding("fire", w, t, fleet)]

    # -- bookkeeping -----------------------------------------------------------

    def _drop(self, st: PlateauedRunState, run_id: str, t: float, fleet: Fleet | None, reason: str) -> list[Finding]:
        w = st.runs.pop(run_id)
        st.runs = emptied(st.runs)
        if w.fired_at is None:
            return []
        return end(w, lambda: self._finding("resolve", w, max(t, w.best_t), fleet, reason=reason))

    def _forget_quiet(self, st: PlateauedRunState, t: float, fleet: Fleet | None) -> list[Finding]:
        horizon = t - self.params.forget_after
        found: list[Finding] = []
        for run_id in [k for k, w in st.runs.items() if w.last_t < horizon]:
            found += self._drop(st, run_id, st.runs[run_id].last_t, fleet, reason="no_events")
        return found

    # -- money and findings ------------------------------------------------------

    def _hourly(self, w: WatchedRun, fleet: Fleet | None) -> tuple[float, ResourceInfo, int] | None:
        """(the run's share of its hosts' price per hour, the first host, its GPUs), or None when unpriced."""
        hosts = hosts_of(w.run, fleet, self.pricing)
        if not hosts.hosts or not hosts.gpus:
            return None
        return hosts.usd_per_hour, hosts.first, hosts.gpus

    def _finding(self, action: str, w: WatchedRun, at: float, fleet: Fleet | None, **extra: object) -> Finding:
        assert w.since is not None and w.fired_at is not None
        priced = self._hourly(w, fleet)
        if priced is not None:
            w.hourly, host, w.gpus = priced
            w.account, w.region, w.instance_type = host.account, host.region, host.instance_type
        hourly, gpus = w.hourly, w.gpus or w.run.gpu_count
        run = w.run
        tags = {**run.tags, "project": run.project or tag_value(run.tags, "project")}
        res = ResourceInfo(resource_id=w.run_id, resource_type="run", account=w.account, region=w.region,
                           instance_type=w.instance_type, state="running", tags=tags)  # fmt: skip
        details = {
            "run_id": w.run_id, "project": run.project, "owner": tag_value(run.tags, "owner"),
            "metric": self.params.metric, "mode": self.params.mode, "best": w.best, "best_step": w.best_step,
            "latest": w.last_value, "evaluations_since_best": w.stale, "gpu_count": gpus,
            "resource_ids": list(run.resource_ids), "plateau_s": round(max(0.0, at - w.since), 3), **extra,
        }  # fmt: skip
        return make_finding(self, action, res, episode_start=w.since, fired_at=w.fired_at, at=at,
                            usd=usd_over(hourly, max(0.0, at - w.since)), details=details, usd_per_hour=hourly)  # fmt: skip
