"""Detection quality against ground truth: precision, recall and dollar error per type.

``make eval`` simulates fresh fleets with several seeds, backtests the rules over
each, and scores the alerts against the simulator's labels. A label is found when an
alert of its type on its resource fired inside the labelled episode; an alert no
label explains (or a second alert for one label) is a false positive. The dollar
error compares the alert's final dollars with the label's; for types whose news is
a figure rather than dollars (a growth rate), the label's ``expect`` figures are
compared with the alert's details instead.

The fleets include shared Kubernetes GPU nodes (``K8S_NODES`` of them), whose labels
are host-level episodes of some GPUs (``partly_idle_gpu``, ``unallocated_gpu``):
scored the same way, on the node's instance id and the label's dollars (each GPU's
share of the host over its own idle time). They also include ``SERVING_ENDPOINTS``
inference endpoints for the serving rules (:mod:`detector.simulate_serving`: idle
schedules with a week of history before the fleet's start, batching, caching, spot
redundancy), each kind twice, hard negatives included.

They also include ``CHOICES`` sets of workloads whose cost is a choice
(:mod:`detector.simulate_regions`: ``wrong_region``, ``build_or_call``), which bring a week
of hourly usage from before the fleet's start.

They also include ``TRAINING_JOBS`` training hosts seen through host gauges and run metrics
(:mod:`detector.simulate_training`: ``data_starved_training``, ``plateaued_run``), and ``CPU_NOTEBOOKS``
notebooks without GPUs seen through their Jupyter activity (:mod:`detector.simulate_notebooks`: ``idle_notebook``).
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detector.alerts import Alert
from detector.backtest import backtest
from detector.replay import write_replay
from detector.rules import RuleSet
from detector.simulate import Label, SimConfig, simulate

__all__ = ["CHOICES", "CPU_NOTEBOOKS", "K8S_NODES", "MATCH_SLACK_S", "SERVING_ENDPOINTS", "TRAINING_JOBS", "TypeScore",
           "evaluate", "match", "score"]

K8S_NODES = 4
"""Shared Kubernetes GPU nodes in each evaluated fleet (one of each kind the simulator has)."""
CHOICES = 2
"""Sets of region and build-or-call workloads in each evaluated fleet (every kind twice)."""
SERVING_ENDPOINTS = 20
"""Serving endpoints in each evaluated fleet (two of each kind :mod:`detector.simulate_serving` has)."""
TRAINING_JOBS = 6
"""Training hosts seen through host gauges and run metrics (:mod:`detector.simulate_training`): every
kind of job on each over 48 hours (``data_starved_training``, ``plateaued_run`` and their look-alikes)."""
CPU_NOTEBOOKS = 4
"""Notebooks without GPUs (:mod:`detector.simulate_notebooks`): nights stopped and nights left running
(``idle_notebook``), working days as negatives, activity heard through JupyterHub's 5-minute reports."""


@dataclass
class TypeScore:
    type: str
    labels: int = 0
    alerts: int = 0
    found: int = 0
    true_alerts: int = 0
    errors: list[float] = field(default_factory=list)
    """Relative dollar (or figure) error of each found label."""

    @property
    def precision(self) -> float | None:
        return self.true_alerts / self.alerts if self.alerts else None

    @property
    def recall(self) -> float | None:
        return self.found / self.labels if self.labels else None

    @property
    def median_error(self) -> float | None:
        return statistics.median(self.errors) if self.errors else None

    def add(self, other: TypeScore) -> None:
        self.labels += other.labels
        self.alerts += other.alerts
        self.found += other.found
        self.true_alerts += other.true_alerts
        self.errors += other.errors

    def to_json(self) -> dict[str, Any]:
        def rounded(x: float | None) -> float | None:
            return None if x is None else round(x, 4)

        return {"type": self.type, "labels": self.labels, "alerts": self.alerts, "found": self.found,
                "precision": rounded(self.precision), "recall": rounded(self.recall),
                "median_error": rounded(self.median_error)}  # fmt: skip


MATCH_SLACK_S = 5.0
"""How far outside its label an alert may be dated and still be that label's: a sample's
clock jitter (``--messy``: 2 s) moves an alert that fires at its episode's first sample (a
GPU long idle when another starts working again) just before the labelled start."""


def match(alert: Alert, label: Label) -> bool:
    return (
        alert.type == label.type
        and alert.resource_id == label.resource_id
        and label.start - MATCH_SLACK_S <= alert.fired_at <= label.end + MATCH_SLACK_S
    )


def _reported(alert: Alert, label: Label) -> bool:
    """A rule's alert on the label's resource, open at some point inside it: the anomaly was
    not the model's to find, though the model is still scored as having missed it."""
    end = alert.resolved_at if alert.resolved_at is not None else float("inf")
    return alert.resource_id == label.resource_id and alert.fired_at <= label.end and end >= label.start


def _error(alert: Alert, label: Label) -> float | None:
    if label.expect:
        errors = []
        for key, want in label.expect.items():
            got = alert.details.get(key)
            if isinstance(got, (int, float)) and want:
                errors.append(abs(got - want) / abs(want))
        return max(errors) if errors else None
    if label.waste_usd > 0:
        return abs(alert.waste_usd - label.waste_usd) / label.waste_usd
    return None


def score(alerts: Iterable[Alert], labels: Iterable[Label]) -> dict[str, TypeScore]:
    """Per-type scores of one run's alerts against its labels."""
    alerts = [a for a in alerts if not a.silenced]  # recorded, not posted: not an alert anyone saw
    labels = list(labels)
    scores: dict[str, TypeScore] = {}
    for label in labels:
        scores.setdefault(label.type, TypeScore(label.type)).labels += 1
    explained: set[str] = set()
    for label in labels:
        hits = [a for a in alerts if match(a, label) and a.alert_id not in explained]
        if hits:
            s = scores[label.type]
            s.found += 1
            explained.add(hits[0].alert_id)
            error = _error(hits[0], label)
            if error is not None:
                s.errors.append(error)
    for alert in alerts:
        s = scores.setdefault(alert.type, TypeScore(alert.type))
        s.alerts += 1
        s.true_alerts += alert.alert_id in explained
    return scores


def evaluate(
    ruleset: RuleSet, seeds: Sequence[int], hours: float = 48.0, messy: bool = False, k8s_nodes: int = K8S_NODES,
    bill: bool = False, serving_endpoints: int = SERVING_ENDPOINTS, choices: int = CHOICES,
    training_jobs: int = TRAINING_JOBS, cpu_notebooks: int = CPU_NOTEBOOKS,
) -> tuple[dict[str, TypeScore], list[dict]]:
    """Score the rules over one simulated fleet per seed (delivered messily: lost scrapes,
    jitter, duplicates, delays, with ``messy``); return the totals and each run's. With
    ``bill``, each fleet's FOCUS bill is written and read back, detection runs again priced
    from it, and each run says how many full-cost alerts agree with the billed rate within
    1 % (:mod:`detector.billing.agreement`)."""
    totals: dict[str, TypeScore] = {}
    runs = []
    with tempfile.TemporaryDirectory(prefix="burnwatch-eval-") as tmp:
        for seed in seeds:
            fleet = SimConfig.messy if messy else SimConfig
            cfg = fleet(hours=hours, seed=seed, k8s_nodes=k8s_nodes, serving_endpoints=serving_endpoints, choices=choices,
                        training_jobs=training_jobs, cpu_notebooks=cpu_notebooks)
            records, labels = simulate(cfg, ruleset.pricing)
            path = Path(tmp) / f"fleet-{seed}.jsonl"
            with open(path, "wb") as out:
                write_replay(records, out)
            result = backtest(path, ruleset)
            scores = score(result.alerts, labels)
            runs.append({"seed": seed, "events": result.events, "labels": len(labels), "alerts": len(result.alerts),
                         "types": {t: s.to_json() for t, s in sorted(scores.items())}})  # fmt: skip
            for rule_type, s in scores.items():
                totals.setdefault(rule_type, TypeScore(rule_type)).add(s)
            if bill:
                runs[-1]["bill"] = _against_the_bill(cfg, ruleset, path, Path(tmp) / f"bill-{seed}.parquet",
                                                     result.alerts)  # fmt: skip
            path.unlink()
    return totals, runs


def evaluate_model(ruleset: RuleSet, seeds: Sequence[int], hours: float = 96.0, split: float = 48.0,
                   out_dir: str | Path | None = None) -> tuple[TypeScore, float, list[dict]]:  # fmt: skip
    """The anomaly model as it would run: per seed, a fleet of ``hours`` with anomalies injected
    only after ``split`` hours; a model trained on the first ``split`` hours (its rule incidents
    left out as in production) scores the rest. Returns the ``anomaly`` scores over the second
    halves, false alerts per 1,000 resource-hours of them, and each run's figures."""
    from detector.model.forest import ModelSet
    from detector.model.train import TrainingSet, anomaly_ruleset, train

    ruleset = anomaly_ruleset(ruleset)
    total = TypeScore("anomaly")
    resource_hours = 0.0
    runs = []
    with tempfile.TemporaryDirectory(prefix="burnwatch-eval-model-") as tmp:
        for seed in seeds:
            cfg = SimConfig(hours=hours, seed=seed, anomalies=True, anomalies_from=split)
            records, labels = simulate(cfg, ruleset.pricing)
            path = Path(tmp) / f"fleet-{seed}.jsonl"
            with open(path, "wb") as out:
                write_replay(records, out)
            cut = cfg.start + split * 3600
            ts = TrainingSet()
            first = backtest(path, ruleset, on_windows=ts.collect)
            ts.windows = {g: [w for w in ws if w.end <= cut] for g, ws in ts.windows.items()}
            ts.span = (cfg.start, cut)
            models_dir = Path(out_dir or tmp) / f"models-{seed}"
            train(ts, [a for a in first.alerts if a.fired_at <= cut], set(), models_dir)
            result = backtest(path, ruleset, models=ModelSet.load(models_dir))
            alerts = [a for a in result.alerts if a.type == "anomaly" and a.fired_at > cut]
            anomaly_labels = [label for label in labels if label.type == "anomaly"]
            s = score(alerts, anomaly_labels).get("anomaly", TypeScore("anomaly"))
            missed = [label for label in anomaly_labels if not any(match(a, label) for a in alerts)]
            posted = [a for a in result.alerts if not a.silenced and a.type != "anomaly"]
            by_rule = sum(1 for label in missed if any(_reported(a, label) for a in posted))
            hours_judged = len({w.resource_id for ws in ts.windows.values() for w in ws}) * (hours - split)
            total.add(s)
            resource_hours += hours_judged
            runs.append({"seed": seed, **s.to_json(), "false_alerts": s.alerts - s.true_alerts,
                         "missed_but_reported_by_a_rule": by_rule, "resource_hours": hours_judged})  # fmt: skip
            path.unlink()
    false_rate = 1000.0 * (total.alerts - total.true_alerts) / resource_hours if resource_hours else 0.0
    return total, false_rate, runs


def _against_the_bill(cfg: SimConfig, ruleset: RuleSet, replay: Path, bill_path: Path,
                      unbilled: list[Alert]) -> dict[str, int]:  # fmt: skip
    """Full-cost alerts priced from the fleet's own bill, against the billed rates: checked and
    agreeing, and how many of ``unbilled`` (the same fleet priced from the price list) agreed."""
    from detector.billing.agreement import agreement
    from detector.billing.focus import read_focus
    from detector.billing.rates import BilledRates
    from detector.simulate_focus import simulate_focus, write_focus

    sim = simulate_focus(cfg, ruleset.pricing)
    billed = BilledRates.from_table(read_focus(write_focus(sim, bill_path)))
    check = agreement(backtest(replay, ruleset, billed=billed).alerts, sim.rates)
    before = agreement(unbilled, sim.rates)
    return {"checked": check.checked, "agree": check.agree, "agree_without_bill": before.agree}
