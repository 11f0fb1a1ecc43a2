"""The anomaly model: features, the sign of the score, training and scoring in the engine."""

from __future__ import annotations

import random

import numpy as np
import pytest

from detector.detectors.anomaly import Scoring, use_scoring
from detector.engine import Engine
from detector.events import GpuMetric, UsageEvent
from detector.model.features import WindowBuilder, WindowState, feature_names
from detector.model.forest import ModelSet, fit
from detector.model.train import TrainingSet, anomaly_ruleset, train, train_from_store
from detector.pricing import Pricer
from detector.rules import load_rules
from detector.store import EventBatch
from tests.conftest import ROOT
from tests.helpers import MIN, T0, at

HOUR = 3600.0


def minute(t: float, util: float, power: float, rid: str = "h1", usd_per_hour: float = 32.0) -> list:
    """A minute of an 8-GPU host: its usage, and two scrapes of every GPU."""
    events: list = [UsageEvent(ts=at(t), resource_id=rid, resource_type="gpu_instance", instance_type="p4d.24xlarge",
                               interval_s=60.0, cost_usd=usd_per_hour / 60, tags={"team": "nlp"})]  # fmt: skip
    for s in (0, 30):
        events += [GpuMetric(ts=at(t + s), resource_id=rid, gpu_index=g, util_pct=util, power_w=power,
                             mem_used_mib=30000, mem_total_mib=40960, sm_active=util / 100)  # fmt: skip
                   for g in range(8)]
    return events


def working(start: float, hours: float, rid: str = "h1") -> list:
    """Training, with the few-minute dips between epochs real jobs have (never idle for long)."""
    rng = random.Random(f"{rid}-{start}")
    events = []
    for i in range(int(hours * 60)):
        dip = i % 50 >= 46
        util = rng.uniform(3, 12) if dip else rng.uniform(70, 100)
        events += minute(start + i * MIN, util, rng.uniform(90, 150) if dip else rng.uniform(260, 380), rid)
    return events


def test_window_features_are_what_the_minute_said():
    builder, st = WindowBuilder(300.0), WindowState()
    pricer = Pricer()

    def add(e):  # a usage event's interval as the engine prices it
        return builder.add(st, "h1", "gpu_instance", pricer.cost(e).usd if isinstance(e, UsageEvent) else 0.0, e, e.t)

    closed = [w for e in minute(T0, 50.0, 200.0) if (w := add(e))]
    for k in range(1, 6):
        closed += [w for e in minute(T0 + k * MIN, 50.0, 200.0) if (w := add(e))]
    (window,) = closed  # the minute at T0+5m opened the next window and closed the first
    assert window.start == T0 and window.end == T0 + 300
    assert window.values["cost_usd_per_hour"] == pytest.approx(32.0)
    assert window.values["gpu_util_mean"] == 50.0 and window.values["power_w_per_gpu"] == 200.0
    assert window.values["power_per_util"] == pytest.approx(200.0 / 55.0)
    assert window.values["cost_usd_per_hour_rel"] == pytest.approx(1.0)  # no history: its own baseline
    assert len(window.vector()) == len(feature_names("gpu"))


def test_higher_score_means_more_anomalous_and_the_guard_sees_beyond_training():
    rng = np.random.default_rng(0)
    rows = rng.normal(0.0, 0.1, size=(2000, len(feature_names("cpu"))))
    artifact = fit("cpu", rows, trained_from=0, trained_to=1, threshold_quantile=0.999)
    normal, odd = rows[:1], np.zeros((1, rows.shape[1]))
    odd[0, feature_names("cpu").index("cost_usd_per_hour_rel")] = 3.0  # far outside anything trained on
    assert artifact.score(odd)[0] > artifact.threshold > artifact.score(normal)[0]
    assert artifact.guard(odd)[0] > 0 and artifact.guard(normal)[0] == 0
    assert np.mean(artifact.score(rows) > artifact.threshold) < 0.002  # the stated quantile, roughly


def trained_on(events, tmp_path, min_samples: int = 50) -> ModelSet:
    ruleset = anomaly_ruleset(load_rules(ROOT / "rules"))
    ts = TrainingSet()
    use_scoring(ruleset.rules, Scoring(observe=ts.collect))
    engine = Engine(ruleset)
    engine.process(events)
    train(ts, [], set(), tmp_path, min_samples=min_samples)
    return ModelSet.load(tmp_path)


def test_full_power_at_low_utilisation_is_an_anomaly_that_names_power(tmp_path):
    ruleset = anomaly_ruleset(load_rules(ROOT / "rules"))
    history = working(T0, 12)
    models = trained_on(history, tmp_path)
    assert models.get("gpu") is not None
    use_scoring(ruleset.rules, Scoring(models))
    engine = Engine(ruleset)
    engine.process(history)
    hot = [e for i in range(60) for e in minute(T0 + 12 * HOUR + i * MIN, 9.0, 380.0)]  # an hour at full power, 9 %
    after = working(T0 + 13 * HOUR, 3)
    found = [f for f in engine.process(hot + after) if f.type == "anomaly"]
    assert [f.action for f in found if f.action != "update"] == ["fire", "resolve"]
    fire = found[0]
    assert T0 + 12 * HOUR + 30 * MIN <= fire.fired_at <= T0 + 12 * HOUR + 50 * MIN
    assert fire.details["score"] > fire.details["threshold"]
    assert "power_per_util" in [f["feature"] for f in fire.details["stands_out"]]
    assert fire.waste_usd > 0


def test_cold_start_no_model_no_windows_no_findings():
    ruleset = anomaly_ruleset(load_rules(ROOT / "rules"))
    windows: list = []
    scoring = Scoring(ModelSet())
    use_scoring(ruleset.rules, scoring)
    engine = Engine(ruleset)
    events = working(T0, 8) + [e for i in range(60) for e in minute(T0 + 8 * HOUR + i * MIN, 9.0, 380.0)]
    assert [f for f in engine.process(events) if f.type == "anomaly"] == []
    scoring.observe = windows.extend  # someone watching: the same events do close windows
    engine = Engine(ruleset)
    assert [f for f in engine.process(events) if f.type == "anomaly"] == [] and windows


def test_train_from_the_store_writes_artifacts_a_worker_reloads(store, tmp_path):
    batch = EventBatch()
    batch.extend(working(T0, 14) + working(T0, 14, rid="h2"))  # judged after 6 h of baseline: 8 h each
    store.events.insert(batch)
    models = ModelSet.load(tmp_path)
    assert not models
    artifacts, ts = train_from_store(store, 15 * HOUR, load_rules(ROOT / "rules"), tmp_path, min_samples=50)
    (artifact,) = artifacts
    assert artifact.group == "gpu" and artifact.samples == len(ts.windows["gpu"]) > 150
    assert len(artifact.ranges) == len(artifact.features)
    assert models.changed(tmp_path) and ModelSet.load(tmp_path).get("gpu").threshold == artifact.threshold
    assert (tmp_path / "gpu.json").exists()


def test_an_anomaly_on_a_resource_with_an_open_rule_incident_joins_it(store):
    from detector.alerts import AlertManager, AlertMemory
    from detector.detectors import Finding, ResourceInfo
    from detector.suppression import Hold

    def finding(rule_type: str, action: str, start: float, at: float) -> Finding:
        return Finding(action=action, rule=rule_type, type=rule_type, resource_id="h1", episode_start=start,
                       fired_at=start + 1800, at=at, waste_usd=1.0, usd_per_hour=2.0, severity="info",
                       resource=ResourceInfo(resource_id="h1"))  # fmt: skip

    manager = AlertManager()
    idle = manager.handle([finding("idle_gpu", "fire", T0, T0 + 1800)])
    joined = manager.handle([finding("anomaly", "fire", T0 + 600, T0 + 2400)])
    assert idle[0].held is None and joined[0].held == Hold(
        kind="inhibited", by=idle[0].alert_id, reason=f"joined incident {idle[0].alert_id}: a rule's incident is open here")
    store.alerts.record(idle + joined, version=1)
    restarted = AlertManager(AlertMemory.load(store.memory))
    (resolved,) = restarted.handle([finding("anomaly", "resolve", T0 + 600, T0 + 3600)])
    assert resolved.held == joined[0].held  # still not posted after a restart
    restarted.handle([finding("idle_gpu", "resolve", T0, T0 + 4000)])
    (alone,) = restarted.handle([finding("anomaly", "fire", T0 + 5000, T0 + 7000)])
    assert alone.held is None and alone.silenced == ""  # no incident open any more: this one is posted
