"""The anomaly model: features, the sign of the score, training and scoring in the engine."""

from __future__ import annotations

import math
import random
from typing import Any

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
    artifact = fit("cpu", rows, trained_from=0, trained_to=1)
    normal, odd = rows[:1], np.zeros((1, rows.shape[1]))
    odd[0, feature_names("cpu").index("cost_usd_per_hour_rel")] = 3.0  # far outside anything trained on
    assert artifact.score(odd)[0] > artifact.threshold > artifact.score(normal)[0]
    assert artifact.guard(odd)[0] > 0 and artifact.guard(normal)[0] == 0
    scores = artifact.score(np.vstack([normal, odd]))
    evidence = artifact.evidence(scores)
    assert evidence[1] > artifact.budget > evidence[0] >= 0  # one window this far out alerts at once


@pytest.mark.parametrize("rate", [0.5, 5.0])
def test_the_stated_alert_rate_holds_on_new_windows_like_the_training_ones(rate):
    """The threshold has a meaning: on fresh windows drawn like the training ones (independent,
    5-minute windows), the share whose run reaches the budget is about the stated rate per
    1,000 resource-hours, not a margin's accident. Checked at two rates, on 50,000 new windows."""
    from detector.model.forest import _run_statistic

    rng = np.random.default_rng(1)
    width = len(feature_names("cpu"))
    rows = rng.normal(0.0, 0.1, size=(3000, width))
    artifact = fit("cpu", rows, trained_from=0, trained_to=1, times=np.arange(3000) * 300.0,
                   resource_hours=3000 / 12, persist=6, alerts_per_1000h=rate)  # fmt: skip
    fresh = rng.normal(0.0, 0.1, size=(50_000, width))
    runs = _run_statistic(artifact.evidence(artifact.score(fresh)), artifact.persist)
    per_1000h = 1000 * np.count_nonzero(runs >= artifact.budget) / (len(fresh) / 12)
    # the windows' count bounds the episodes' from above; a model that never fires fails too
    assert rate / 3 <= per_1000h <= 3 * rate
    assert "alerts per 1,000 resource-hours" in artifact.explain()


def trained_on(events, tmp_path, min_samples: int = 50, metrics: tuple[str, ...] = ()) -> ModelSet:
    ruleset = anomaly_ruleset(load_rules(ROOT / "rules"), metrics)
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
    # this far out, a window or two alerts: no fixed 30-minute hold
    assert T0 + 12 * HOUR <= fire.episode_start < fire.fired_at <= T0 + 12 * HOUR + 15 * MIN
    assert fire.details["evidence"] >= fire.details["budget"] > 0 and fire.details["windows"] >= 1
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


def test_training_runs_anomaly_rules_of_its_own_not_the_ones_it_is_given():
    """Training lends its scoring (no model; its own collector) to the anomaly rules it runs for as
    long as it runs (``scoring_during``), and the worker retrains on a thread with the rule set it
    detects with (streams/timers.py, ``retrain_model``): were they the same detectors, the worker's
    anomaly rule would judge nothing during a retrain and feed its live windows to the training
    set (and share its window builder with another thread). The rules training runs are compiled
    afresh from the same sources, even when the rule set already has an anomaly rule."""
    given = load_rules(ROOT / "rules")
    live = {id(r.detector) for r in given.rules if r.detector.type == "anomaly"}
    trained = [r.detector for r in anomaly_ruleset(given).rules if r.detector.type == "anomaly"]
    assert live and trained and not any(id(d) in live for d in trained)


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


class _Calibrated:
    """A group model of known evidence per window: the decision's arithmetic, on its own."""

    threshold, budget, persist, features = 1.0, 6.0, 6, ["x"]


def _judged(evidences: list[float | None], covered: tuple[int, ...] = (), state: Any = None) -> list[str]:
    """The decisions of the anomaly rule on windows with these evidences (None: a window not judged),
    each window costing $1."""
    from detector.detectors import ResourceInfo
    from detector.detectors.anomaly import AnomalyState
    from detector.model.features import Window

    rule = next(r.detector for r in anomaly_ruleset(load_rules(ROOT / "rules")).rules if r.detector.type == "anomaly")
    st, res, decisions = state if state is not None else AnomalyState(), ResourceInfo(resource_id="r"), []
    for i, e in enumerate(evidences):
        if e is None:
            continue
        w = Window(resource_id="r", group="cpu", start=T0 + i * 300, end=T0 + (i + 1) * 300, values={}, usual={},
                   cost_usd=1.0, history=100 + i, seq=i + 1, covered=i in covered, names=("x",))  # fmt: skip
        decisions.append(rule._judge(st, res, w, e, e, _Calibrated())[0])
    return decisions


@pytest.mark.parametrize(("evidences", "decisions"), [
    # a window as rare as the whole budget alerts at once (a spike)
    ([0.2, 6.5, 0.1, 0.1], ["normal", "alert", "normal", "normal"]),
    # three windows of a third of it each: a shift that alerts on its third window
    ([2.1, 2.1, 2.1, 0.1, 0.1], ["unusual", "unusual", "alert", "normal", "normal"]),
    # the mildest that counts (budget / persist) needs the whole run of six
    ([1.0] * 6, ["unusual"] * 5 + ["alert"]),
    # mild windows that do not last are not an alert
    ([1.0, 1.0, 1.0, 0.2, 1.0, 1.0], ["unusual", "unusual", "unusual", "normal", "unusual", "unusual"]),
    # a window not judged in between (no usage, a pause) starts the run again
    ([2.1, 2.1, None, 2.1, 2.1], ["unusual", "unusual", "unusual", "unusual"]),
    # a strong window then weaker ones: the run is as strong as its weakest window times its length
    ([5.0, 1.5, 1.5, 1.5], ["unusual", "unusual", "unusual", "alert"]),
])  # fmt: skip
def test_severity_comes_from_how_far_out_windows_are(evidences, decisions):
    assert _judged(evidences) == decisions


def test_an_episode_stays_open_while_windows_count_and_a_rule_has_the_first_word():
    # open while the latest windows would open it; two windows that would not end it
    assert _judged([7.0, 6.5, 1.2, 0.1, 0.1]) == ["alert", "open", "normal", "normal", "normal"]
    assert _judged([1.0] * 8 + [0.2] * 2) == ["unusual"] * 5 + ["alert", "open", "open", "normal", "normal"]
    # mild windows after a spike do not hold it open: what it takes to open is what keeps it open
    assert _judged([7.0, 1.2, 1.2, 1.2, 1.2, 1.2, 7.0]) == ["alert", "normal", "normal", "unusual", "unusual",
                                                           "unusual", "alert"]  # fmt: skip
    # while a rule tracks the resource, the window is scored but opens nothing, and a run starts after it
    assert _judged([7.0, 2.1, 2.1, 2.1], covered=(0,)) == ["rule", "unusual", "unusual", "alert"]


def cpu_minutes(start: float, hours: float, rid: str, level: float, noise: float, seed: int = 0) -> list:
    """A CPU instance reporting only a generic metric (its utilisation), once a minute."""
    rng = random.Random(f"{rid}-{start}-{seed}")
    return [UsageEvent(ts=at(start + i * MIN), resource_id=rid, resource_type="cpu_instance", interval_s=60.0,
                       cost_usd=0.68 / 60, tags={"team": "data"}, metrics={"cpu_util": max(0.0, rng.gauss(level, noise))})
            for i in range(int(hours * 60))]  # fmt: skip


def test_each_resource_is_judged_against_its_own_history(tmp_path):
    """Two resources of one group at levels far apart (issue 14's 0.07 % and 92 % CPUs): a
    change of the quiet one to a level the busy one lives at is found, on the quiet one only,
    and a normal day after training raises nothing on either."""
    def both(start: float, hours: float, seed: int = 0) -> list:
        return sorted(cpu_minutes(start, hours, "quiet", 0.07, 0.02, seed) + cpu_minutes(start, hours, "busy", 92, 3, seed),
                      key=lambda e: e.t)  # fmt: skip

    history = both(T0, 24)
    models = trained_on(history, tmp_path, metrics=("cpu_util",))
    assert models.get("cpu").features[-1] == "metric.cpu_util_z"
    ruleset = anomaly_ruleset(load_rules(ROOT / "rules"), ("cpu_util",))
    use_scoring(ruleset.rules, Scoring(models))
    engine = Engine(ruleset)
    engine.process(history)
    normal_day = [f for f in engine.process(both(T0 + 24 * HOUR, 24, seed=1)) if f.type == "anomaly"]
    assert normal_day == []
    shifted = [e if e.resource_id == "busy" else msgspec_replace(e, metrics={"cpu_util": 45.0})
               for e in both(T0 + 48 * HOUR, 1, seed=2)]  # fmt: skip
    found = [f for f in engine.process(shifted + both(T0 + 49 * HOUR, 2, seed=3)) if f.type == "anomaly"]
    assert {f.resource_id for f in found} == {"quiet"}
    assert [f.action for f in found if f.action != "update"] == ["fire", "resolve"]
    assert found[0].details["stands_out"][0]["feature"] == "metric.cpu_util"


def msgspec_replace(event, **changes):
    import msgspec

    return msgspec.structs.replace(event, **changes)


def test_a_new_resource_is_judged_by_its_levels_against_the_fleet(tmp_path):
    """Before its own baseline covers ``min_history``, a resource has no history to be judged
    against: the group's forest judges its levels against the fleet's. A newcomer at the fleet's
    level raises nothing; one far above it is an anomaly within its first hour."""
    def fleet(start: float, hours: float, seed: int = 0) -> list:
        return [e for i in range(4) for e in cpu_minutes(start, hours, f"worker-{i}", 50, 5, seed)]

    history = sorted(fleet(T0, 24), key=lambda e: e.t)
    models = trained_on(history, tmp_path, metrics=("cpu_util",))
    ruleset = anomaly_ruleset(load_rules(ROOT / "rules"), ("cpu_util",))
    use_scoring(ruleset.rules, Scoring(models))
    engine = Engine(ruleset)
    engine.process(history)
    later = fleet(T0 + 24 * HOUR, 2, seed=1) + cpu_minutes(T0 + 24 * HOUR, 2, "newcomer", 50, 5, seed=1)
    later += cpu_minutes(T0 + 24 * HOUR, 2, "hot-newcomer", 99.5, 0.3, seed=1)
    found = [f for f in engine.process(sorted(later, key=lambda e: e.t)) if f.type == "anomaly"]
    assert {f.resource_id for f in found} == {"hot-newcomer"}
    assert min(f.fired_at for f in found) <= T0 + 25 * HOUR


def test_the_dollars_of_an_episode_include_the_windows_that_dipped_inside_it():
    from detector.detectors.anomaly import AnomalyState

    st = AnomalyState()
    # alert (1 window), a dip, back above the budget (the dip was part of it), two quiet: resolved
    assert _judged([7.0, 0.1, 7.0, 0.1, 0.1], state=st) == ["alert", "normal", "open", "normal", "normal"]
    st = AnomalyState()
    _judged([7.0, 0.1, 7.0, 0.1], state=st)
    assert st.judged.fired_at is not None and st.judged.figures.usd == 3.0  # $1 a window: the alert, the dip, the return


def test_evidence_that_is_not_a_number_is_no_evidence():
    assert _judged([0.1, math.nan, 0.1]) == ["normal", "normal", "normal"]


def test_a_long_silence_starts_the_baselines_again():
    """A resource back after longer than the baselines' half-life is judged as a new one (against
    the fleet) rather than against a spread that decayed to nothing while it was away."""
    builder, st = WindowBuilder(300.0, metrics=("v",)), WindowState()
    rng = random.Random(3)

    def windows(start: float, n: int, level: float = 10.0) -> list:
        out = []
        for i in range(n * 5 + 1):
            e = UsageEvent(ts=at(start + i * MIN), resource_id="r", resource_type="cpu_instance", interval_s=60.0,
                           cost_usd=0.01, metrics={"v": rng.gauss(level, 1.0)})  # fmt: skip
            if (w := builder.add(st, "r", "cpu_instance", 0.01, e, e.t)) is not None:
                out.append(w)
        return out

    before = windows(T0, 48 * 12)
    assert abs(before[-1].values["metric.v_z"]) < 5 and before[-1].history_s > 40 * HOUR
    after = windows(T0 + 14 * 86_400, 12, level=8.0)[1:]  # the first closed is the window left open before
    assert after[0].history_s == 0.0 and after[0].values["metric.v_z"] == 0.0  # forgotten: a new resource
    assert all(abs(w.values["metric.v_z"]) < 50 for w in after)


@pytest.mark.parametrize("change", [1.00001, 1.001, 1.005])
def test_a_price_change_far_below_any_meaning_is_no_deviation(change):
    """A resource whose cost never moved (a price list's constant rate) learns its first move as its whole
    spread: with a floor of 1e-9 under it, a 0.001 % price change read about 20 deviations out, window after
    window, and opened an anomaly on every such resource that never closed. A 2x change still reads far out."""
    def zs(factor: float) -> list[float]:
        builder, st = WindowBuilder(300.0), WindowState()
        out = []
        for i in range(36 * 60 + 1):
            cost = 0.5 / 60 * (factor if i >= 24 * 60 else 1.0)
            e = UsageEvent(ts=at(T0 + i * MIN), resource_id="r", resource_type="cpu_instance", interval_s=60.0,
                           cost_usd=cost)  # fmt: skip
            if (w := builder.add(st, "r", "cpu_instance", cost, e, e.t)) is not None and w.start >= T0 + 24 * HOUR:
                out.append(w.values["cost_usd_per_hour_z"])
        return out

    assert max(abs(z) for z in zs(change)) < 2.0  # a few tenths: within the usual
    assert max(abs(z) for z in zs(2.0)) > 10.0


def test_absurd_metric_values_never_poison_a_resource():
    """Two finite values that sum past the largest float, in one window: the window's mean stays
    finite, and later windows are judged on finite features."""
    builder, st = WindowBuilder(300.0, metrics=("v",)), WindowState()
    values = [1e308, 1.7e308] + [5.0] * 60
    closed = []
    for i, v in enumerate(values):
        e = UsageEvent(ts=at(T0 + i * MIN), resource_id="r", resource_type="cpu_instance", interval_s=60.0,
                       cost_usd=0.01, metrics={"v": v})  # fmt: skip
        if (w := builder.add(st, "r", "cpu_instance", 0.01, e, e.t)) is not None:
            closed.append(w)
    assert closed and all(math.isfinite(x) for w in closed for x in w.vector())
    assert st.baseline and all(math.isfinite(x) for x in st.baseline)


def test_a_numeric_field_beyond_the_contract_feeds_the_model_as_a_generic_metric():
    """A producer's own field (kept in ``extra``) is a metric the rule can name; text, booleans and
    the like are not numbers and are left out."""
    from detector.events import EventDecoder

    builder, st = WindowBuilder(300.0, metrics=("queue_depth", "mode")), WindowState()
    decoder = EventDecoder()
    closed = []
    for i in range(6):
        raw = {"ts": at(T0 + i * MIN).isoformat(), "resource_id": "r", "resource_type": "cpu_instance",
               "interval_s": 60, "queue_depth": 10 * (i + 1), "mode": "batch"}  # fmt: skip
        (event,) = decoder.decode("resource-usage", msgspec_json(raw))
        if (w := builder.add(st, "r", "cpu_instance", 0.01, event, event.t)) is not None:
            closed.append(w)
    (window,) = closed
    assert window.values["metric.queue_depth"] == pytest.approx(30.0)  # the mean of 10..50
    assert window.values["metric.mode"] == 0.0  # not a number: no value


def msgspec_json(value) -> bytes:
    import msgspec

    return msgspec.json.encode(value)


def test_a_run_does_not_build_across_a_silence_longer_than_the_half_life():
    """The stream and training's calibration agree (``features.follows``): the next window closed,
    after two days without a word, starts a run again; and the silence is no resource-hours."""
    from detector.detectors import ResourceInfo
    from detector.detectors.anomaly import AnomalyState
    from detector.model.features import Window
    from detector.model.train import _sequences

    def window(seq: int, start: float) -> Window:
        return Window(resource_id="r", group="cpu", start=start, end=start + 300, values={}, usual={}, cost_usd=1.0,
                      history=100, seq=seq, names=("x",))  # fmt: skip

    rule = next(r.detector for r in anomaly_ruleset(load_rules(ROOT / "rules")).rules if r.detector.type == "anomaly")
    res = ResourceInfo(resource_id="r")

    def decisions(*windows: Window) -> list[str]:
        st = AnomalyState()
        return [rule._judge(st, res, w, 3.0, 3.0, _Calibrated())[0] for w in windows]  # half the budget each

    assert decisions(window(1, T0), window(2, T0 + 300)) == ["unusual", "alert"]
    assert decisions(window(1, T0), window(2, T0 + 2 * 86_400)) == ["unusual", "unusual"]
    sequences, hours = _sequences([window(1, T0), window(2, T0 + 300), window(3, T0 + 2 * 86_400)])
    assert sequences == [[0, 1], [2]] and hours == pytest.approx(3 * 300 / 3600)


def _window_before(new: dict[str, Any]) -> dict[str, Any]:
    """A window's saved map (decoded) as the code before 2026-12-02 saved it: storage, requests and
    metrics inline, the per-GPU latest times an array, the baselines' four figures fields of their own."""
    extra = new.pop("extra", {})
    old = {**new, **extra}
    n, t = old.pop("gpu_n", 0), old.pop("gpu_t", None)
    if n:
        old["gpu_last"] = [t] * n
    b = old.pop("baseline", None)
    if b is not None:
        old["weight"], old["windows"], old["first"], old["learnt_at"], old["baseline"] = b[0], int(b[1]), b[2], b[3], b[4:]
    return old


def test_baselines_saved_by_name_before_are_read_back_and_judge_alike():
    """The baselines are now one array (level, variance per feature) for the group's shared tuple of
    names: a window state saved before, with a level and a variance dict by feature name, restores
    to the same baselines, and the windows that follow have exactly the features they would have had
    (both round-trips through the snapshot codec)."""
    import msgspec

    from detector.floats import enc_hook
    from detector.saved import read_state

    builder, st = WindowBuilder(300.0), WindowState()
    events = working(T0, 3.0)
    cut = len(events) // 2
    for e in events[:cut]:
        builder.add(st, "h1", "gpu_instance", 0.5 if isinstance(e, UsageEvent) else 0.0, e, e.t)
    assert st.baseline_names == tuple(feature_names("gpu")[:7]) and st.baseline_names is builder.bases("gpu")
    saved = _window_before(msgspec.msgpack.decode(msgspec.msgpack.encode(st, enc_hook=enc_hook)))
    b = saved.pop("baseline")
    saved.pop("baseline_names")
    saved["log_mean"] = {name: b[2 * i] for i, name in enumerate(st.baseline_names)}
    saved["log_var"] = {name: b[2 * i + 1] for i, name in enumerate(st.baseline_names)}
    old = read_state(msgspec.msgpack.encode(saved), WindowState)
    new = read_state(msgspec.msgpack.encode(st, enc_hook=enc_hook), WindowState)
    assert old == new == st

    def rest(state: WindowState) -> list:
        usd = [0.5 if isinstance(e, UsageEvent) else 0.0 for e in events[cut:]]
        return [w for e, u in zip(events[cut:], usd, strict=True) if (w := builder.add(state, "h1", "gpu_instance", u, e, e.t))]

    after = rest(st)
    assert len(after) >= 10 and rest(old) == after == rest(new)


def test_a_worker_starts_without_scikit_learn():
    """skops and scikit-learn (3.5 s of CPU) are imported when a model is read or written, not by
    every worker and CLI start (tests start a hundred workers)."""
    import subprocess
    import sys

    code = "import sys, streams.app, streams.cli; print(sorted(m for m in ('sklearn', 'skops') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_whole_percent_utilisation_is_held_a_byte_a_sample_and_judged_as_the_floats_it_was():
    """A window's GPU utilisation samples are a byte each while they are whole percents (DCGM's and
    NVML's), doubles from the first that is not (a fraction, -0.0, out of 0..255, NaN): the window's
    mean and p95 are the floats the samples were, and a window state saved before (its samples as
    floats) restores and closes the same window as the state never saved."""
    from array import array

    import msgspec

    from detector.floats import append, dec_hook, enc_hook

    series = array("B")
    for x in (0.0, 80.0, 100.0, 255.0):
        series = append(series, x)
    assert series.typecode == "B" and series.tolist() == [0, 80, 100, 255]
    for odd in (80.5, -0.0, 256.0, -1.0, math.nan):
        wide = append(array("B", [3]), odd)
        assert wide.typecode == "d" and wide[0] == 3.0
        assert math.copysign(1.0, wide[1]) == math.copysign(1.0, odd) and (wide[1] == odd or math.isnan(odd))

    def window(util: float) -> tuple[WindowBuilder, WindowState, list]:
        builder, st = WindowBuilder(300.0), WindowState()
        events = [e for k in range(5) for e in minute(T0 + k * MIN, util + k, 200.0)]
        for e in events:
            builder.add(st, "h1", "gpu_instance", 0.5 if isinstance(e, UsageEvent) else 0.0, e, e.t)
        return builder, st, minute(T0 + 5 * MIN, util, 200.0)

    for util, typecode in ((50.0, "B"), (50.25, "d")):
        builder, st, more = window(util)
        assert st.utils.typecode == typecode and len(st.utils) == 80
        saved = msgspec.msgpack.decode(msgspec.msgpack.encode(st, enc_hook=enc_hook))
        saved["utils"] = [float(x) for x in saved["utils"]]  # as the version before saved them
        old = msgspec.msgpack.decode(msgspec.msgpack.encode(saved), type=WindowState, dec_hook=dec_hook)
        (closed,) = [w for e in more if (w := builder.add(st, "h1", "gpu_instance", 0.0, e, e.t))]
        (again,) = [w for e in more if (w := builder.add(old, "h1", "gpu_instance", 0.0, e, e.t))]
        assert closed == again
        assert closed.values["gpu_util_mean"] == sum(util + k for k in range(5)) / 5
        assert closed.values["gpu_util_p95"] == util + 4 and type(closed.values["gpu_util_p95"]) is float


def test_a_window_holds_no_gpu_series_on_a_resource_without_gpus_and_restores_what_was_saved_empty():
    """A CPU instance's window never made an array of GPU samples or per-GPU times (two empty
    arrays on a third of a fleet's keys), nor does any resource hold baselines before its first
    window is learnt; a state saved before, with those as empty lists, restores to the same
    empties and closes the same window as one never saved."""
    import msgspec

    from detector.floats import dec_hook, enc_hook

    builder, st = WindowBuilder(300.0), WindowState()
    for k in range(5):
        event = UsageEvent(ts=at(T0 + k * MIN), resource_id="c1", resource_type="cpu_instance", interval_s=60.0,
                           cost_usd=0.01, egress_bytes=10**9)  # fmt: skip
        builder.add(st, "c1", "cpu_instance", 0.01, event, event.t)
    assert st.utils is None and st.gpu_last is None and st.baseline is None
    saved = msgspec.msgpack.decode(msgspec.msgpack.encode(st, enc_hook=enc_hook))
    old = msgspec.msgpack.decode(msgspec.msgpack.encode({**saved, "utils": [], "gpu_last": [], "baseline": []}),
                                 type=WindowState, dec_hook=dec_hook)  # fmt: skip
    assert old == st
    more = [UsageEvent(ts=at(T0 + k * MIN), resource_id="c1", resource_type="cpu_instance", interval_s=60.0,
                       cost_usd=0.02, egress_bytes=10**9) for k in range(5, 11)]  # fmt: skip
    closed = [w for e in more if (w := builder.add(st, "c1", "cpu_instance", 0.02, e, e.t))]
    again = [w for e in more if (w := builder.add(old, "c1", "cpu_instance", 0.02, e, e.t))]
    assert closed and closed == again and st.baseline is not None and len(st.baseline) == 4 + 2 * 2  # cost, egress
    assert st.utils is None and st.gpu_last is None  # a window closed leaves no empty series either


def test_resources_in_the_same_window_share_its_start_and_end():
    """The windows of a fleet are aligned: every resource whose window starts at the same time
    holds the same float for it (24 bytes a key less; the end of the last window learnt is a double
    in the baselines' array, no object), and a resource that moves on later to a start already seen
    still gets the window's start, not another's."""
    builder = WindowBuilder(300.0)
    states = [WindowState() for _ in range(3)]
    for i, st in enumerate(states[:2]):
        for e in minute(T0 + 301.0, 50.0, 200.0, rid=f"h{i}"):
            builder.add(st, f"h{i}", "gpu_instance", 0.5, e, e.t)
    assert states[0].start == T0 + 300.0 and states[0].start is states[1].start
    for e in minute(T0 + 10 * MIN, 50.0, 200.0, rid="h0"):
        builder.add(states[0], "h0", "gpu_instance", 0.5, e, e.t)
    for e in minute(T0 + 310.0, 50.0, 200.0, rid="h2"):
        builder.add(states[2], "h2", "gpu_instance", 0.5, e, e.t)
    assert states[2].start == T0 + 300.0 and states[0].start == T0 + 600.0
    for e in minute(T0 + 10 * MIN, 50.0, 200.0, rid="h1"):
        builder.add(states[1], "h1", "gpu_instance", 0.5, e, e.t)
    assert states[0].learnt_at == states[1].learnt_at == T0 + 600.0  # a double in the baselines' array, no object


def test_a_worker_running_rules_only_builds_no_windows():
    """With no model and nobody watching windows the anomaly rule's step is never called: a resource
    holds no state for it (the rule is lazy: 144 bytes a key for nothing); once a
    model or a watcher is handed over, windows are built and closed as ever."""
    from detector.detectors.anomaly import AnomalyState

    events = minute(T0, 50.0, 200.0) + minute(T0 + 5 * MIN, 50.0, 200.0)

    def anomaly_state(scoring: Scoring | None) -> AnomalyState | None:
        rules = anomaly_ruleset(load_rules(ROOT / "rules"))
        if scoring is not None:
            use_scoring(rules.rules, scoring)
        engine = Engine(rules)
        engine.process(events)
        (name,) = [rule.detector.name for rule in rules.rules if rule.detector.type == "anomaly"]
        assert name in engine._keys["h1"].names
        return engine._keys["h1"].rule(name)

    assert anomaly_state(None) is None
    windows: list = []
    watched = anomaly_state(Scoring(observe=windows.extend))
    assert watched is not None and watched.closes == 1 and len(windows) == 1 and watched.judged is None


def _shape_before(st: Any) -> dict[str, Any]:
    """An anomaly state as the code before 2026-12-02 saved it: an episode with every figure inline
    and the window (its storage, requests and metrics inline too) inside it."""
    import msgspec

    from detector.floats import enc_hook

    new = msgspec.msgpack.decode(msgspec.msgpack.encode(st, enc_hook=enc_hook))
    judged = new.pop("judged", None) or {"since": None, "fired_at": None, "last_report": 0.0}
    figures = judged.pop("figures", None) or {}
    return {**{k: judged.pop(k) for k in ("since", "fired_at", "last_report")}, "windows": _window_before(new),
            **judged, **figures}  # fmt: skip


def test_an_anomaly_state_saved_in_the_shape_before_restores_and_goes_on_the_same():
    """The rule's state is one struct with its window now (the rare window figures, the judging and
    the episode's figures each in a part made when needed): a state the code before saved (an episode
    with the window inside it) restores equal to the state never saved, mid-window with storage,
    requests and a generic metric, and mid-episode, and both go on to the same windows, decisions and
    findings; an episode that resolved leaves nothing of its figures behind."""
    from array import array

    import msgspec

    from detector.detectors import ResourceInfo
    from detector.detectors.anomaly import AnomalyState
    from detector.model.features import Window
    from detector.saved import read_state

    rule = next(r.detector for r in anomaly_ruleset(load_rules(ROOT / "rules")).rules if r.detector.type == "anomaly")
    builder, st = WindowBuilder(300.0, metrics=("queue_depth",)), AnomalyState()

    def usage(t: float) -> UsageEvent:
        return UsageEvent(ts=at(t), resource_id="e1", resource_type="inference_endpoint", interval_s=60.0, cost_usd=0.5,
                          requests=600, storage_bytes=10**9 + int(t - T0), metrics={"queue_depth": 3.0})  # fmt: skip

    for k in range(3):
        builder.add(st, "e1", "inference_endpoint", 0.5, usage(T0 + k * MIN), T0 + k * MIN)
    assert _judged([7.0, 0.1, 7.0], state=st) == ["alert", "normal", "open"]
    assert st.extra is not None and st.judged is not None and st.judged.figures is not None
    saved = msgspec.msgpack.encode(_shape_before(st))
    restored = read_state(saved, AnomalyState)
    assert restored == st

    def go_on(state: AnomalyState) -> list:
        out: list = [builder.add(state, "e1", "inference_endpoint", 0.5, usage(T0 + k * MIN), T0 + k * MIN)
                     for k in range(3, 12)]  # fmt: skip
        for i, e in enumerate((0.1, 0.1, 7.0), start=3):
            w = Window(resource_id="r", group="cpu", start=T0 + i * 300, end=T0 + (i + 1) * 300, values={}, usual={},
                       cost_usd=1.0, history=100 + i, seq=i + 1, names=("x",))  # fmt: skip
            out.append(rule._judge(state, ResourceInfo(resource_id="r"), w, e, e, _Calibrated()))
        return out

    assert go_on(restored) == go_on(st) and restored == st
    assert [d for d, _, _ in go_on(AnomalyState())[-3:]] == ["normal", "normal", "alert"]
    resolved = read_state(msgspec.msgpack.encode({**_shape_before(st), "fired_at": None, "since": None}), AnomalyState)
    assert resolved.judged is not None and resolved.judged.figures is None and resolved.judged.run == st.judged.run
    never = read_state(msgspec.msgpack.encode(_shape_before(AnomalyState(start=T0))), AnomalyState)
    assert never == AnomalyState(start=T0) and never.judged is None
    host = AnomalyState()  # a GPU host with baselines learnt, its GPUs' latest times as gpu_t / gpu_n
    def fold(state: AnomalyState, events: list) -> list:
        scrape: list = []  # GPUs 0..7 in order, as a host's exporter sends them
        out = []
        for e in events:
            if isinstance(e, UsageEvent):
                out.append(builder.add(state, "h1", "gpu_instance", 0.5, e, e.t))
            else:
                scrape.append(e)
                if e.gpu_index == 7:
                    out.append(builder.add_scrape(state, "h1", "gpu_instance", scrape, True, e.t))
                    scrape = []
        return [w for w in out if w is not None]

    fold(host, working(T0, 0.6))
    assert host.windows >= 6 and host.first == T0 and host.gpu_n == 8 and host.gpu_last is None
    back = read_state(msgspec.msgpack.encode(_shape_before(host)), AnomalyState)  # the array the code before kept
    assert back.gpu_last == array("d", [host.gpu_t] * 8)
    assert msgspec.structs.replace(back, gpu_last=None, gpu_t=host.gpu_t, gpu_n=8) == host

    more = working(T0 + 0.6 * HOUR, 0.2)
    assert fold(back, more) == fold(host, more) and back == host  # the array goes at the next window


def test_a_window_takes_exactly_the_samples_a_per_gpu_array_would_and_holds_none_for_the_usual_host():
    """A window keeps its GPUs' latest sample times as ``gpu_t`` and ``gpu_n`` (GPUs 0 .. n-1 at one time)
    on a host whose scrapes name its GPUs in order, and starts them afresh each window, instead of a
    per-GPU array kept for ever: over random scrapes (in order, shuffled, partial, repeated, late, across
    windows) and single samples, it takes after every event exactly the samples the array did (the
    samples of the window, in order), and an 8-GPU host's usual scrapes make no array."""
    from detector.events import GpuMetric
    from detector.floats import as_floats, newer, per_gpu

    def sample(i: int, t: float, util: float) -> GpuMetric:
        return GpuMetric(ts=at(t), resource_id="h", gpu_index=i, util_pct=util, power_w=100.0 + util,
                         mem_used_mib=1000, mem_total_mib=4000)  # fmt: skip

    rng, arrays = random.Random(16), 0
    for _ in range(400):
        builder, st = WindowBuilder(300.0), WindowState()
        times, start, taken, k = per_gpu(), None, [], 0  # the array as it was: never started afresh
        cursor = T0 + rng.choice((0, 240, 270))
        for _ in range(rng.randint(1, 30)):
            cursor += rng.choice((0, 30, 30, 30, 60, -30, -300))
            t, m = cursor, rng.choice((1, 2, 4, 8))
            gpus = list(range(m))
            shape = rng.random()
            if shape < 0.2:
                rng.shuffle(gpus)
            elif shape < 0.3:
                gpus = gpus[: rng.randint(1, m)] if rng.random() < 0.5 else gpus[rng.randint(0, m - 1):]
            events = []
            for i in gpus:
                k += 1
                events.append(sample(i, t, float(k % 256)))
            if rng.random() < 0.25:
                for event in events:
                    builder.add(st, "h", "gpu_instance", 0.0, event, t)
            else:
                builder.add_scrape(st, "h", "gpu_instance", events, gpus == list(range(len(gpus))), t)
            for event in events:
                w = t - t % 300.0
                if start is None or w > start:
                    start, taken = w, []
                elif w < start:
                    continue
                if newer(times, event.gpu_index, t):
                    taken.append(event.util_pct)
            assert (as_floats(st.utils) if st.utils is not None else []) == taken
            assert st.gpu_samples == len(taken)
        arrays += st.gpu_last is not None
    assert 0 < arrays < 400  # both ways were taken
    builder, st = WindowBuilder(300.0), WindowState()
    for e in working(T0, 0.5):
        if isinstance(e, GpuMetric):
            builder.add_scrape(st, "h1", "gpu_instance", [e], e.gpu_index == 0, e.t)
    for t in (T0 + 1800.0, T0 + 1830.0, T0 + 1830.0):
        scrape = [sample(i, t, 50.0) for i in range(8)]
        builder.add_scrape(st, "h1", "gpu_instance", scrape, True, t)
    assert st.gpu_last is None and (st.gpu_t, st.gpu_n, st.gpu_samples) == (T0 + 1830.0, 8, 16)


def test_a_window_saved_with_whole_utilisations_restores_them_a_byte_each_and_saves_the_same_bytes():
    """A window holds its GPU utilisations a byte each while they are whole numbers 0..255; saved, they
    are whole numbers, which msgpack reads back as doubles. Restored through the engine's reader, the
    window holds them a byte each again (not 8 bytes a sample until the window closes) and saves the
    very bytes it was restored from; a series widened by a value a byte cannot hold stays doubles."""
    import msgspec

    from detector.detectors.anomaly import AnomalyState
    from detector.events import GpuMetric
    from detector.floats import enc_hook
    from detector.saved import read_state

    def sample(i: int, t: float, util: float) -> GpuMetric:
        return GpuMetric(ts=at(t), resource_id="h1", gpu_index=i, util_pct=util, power_w=300.0,
                         mem_used_mib=1000, mem_total_mib=4000)  # fmt: skip

    for odd in (None, 37.5, -0.0):
        builder, st = WindowBuilder(300.0), AnomalyState()
        for k in range(3):
            t = T0 + 30.0 * k
            scrape = [sample(i, t, float(10 * i + k)) for i in range(8)]
            if odd is not None and k == 1:
                scrape[3] = sample(3, t, odd)
            builder.add_scrape(st, "h1", "gpu_instance", scrape, True, t)
        assert st.utils is not None and st.utils.typecode == ("B" if odd is None else "d")
        saved = msgspec.msgpack.encode(st, enc_hook=enc_hook)
        back = read_state(saved, AnomalyState)
        assert back.utils is not None and back.utils.typecode == st.utils.typecode
        assert list(back.utils) == list(st.utils)  # and -0.0 kept: the bytes below are the same
        assert msgspec.msgpack.encode(back, enc_hook=enc_hook) == saved


def test_a_generic_metric_of_huge_values_of_opposite_signs_keeps_a_finite_mean():
    """Values the decoder accepts (finite, however large) keep a window's running mean of a generic
    metric finite: -1e308 then 1e308 differ by more than a double holds, and the mean went inf, then
    NaN, into the window the model judges and into the snapshot."""
    from detector.events import EventDecoder
    from detector.model.features import METRIC_PREFIX

    decoder = EventDecoder(limits=load_rules(ROOT / "rules").limits)
    builder, st = WindowBuilder(300.0, metrics=("queue_depth",)), WindowState()
    for k, value in enumerate(("-1e308", "1e308", "1e308", "-1e308", "4")):
        t = T0 + k * MIN
        raw = (f'[{{"ts":"{at(t).isoformat()}","resource_id":"e1","resource_type":"inference_endpoint","interval_s":60.0,'
               f'"cost_usd":0.5,"metrics":{{"queue_depth":{value}}}}}]')  # fmt: skip
        (event,) = decoder.decode("resource-usage", raw.encode())
        builder.add(st, "e1", "inference_endpoint", 0.5, event, t)
        assert st.extra is not None and st.extra.metric_mean is not None
        assert math.isfinite(st.extra.metric_mean["queue_depth"])
    assert math.isfinite(builder._base_values(st)[METRIC_PREFIX + "queue_depth"])


def test_a_model_that_stops_scoring_skips_the_anomaly_rules_batch_not_the_worker(tmp_path, monkeypatch):
    """A model that loaded but raises when it scores (an edited file, a bug) fails the anomaly rule's batch
    phase: its windows of the batch are skipped, counted and logged once, and every other rule's findings
    are what they are without the model (raised, it stopped the worker at every restart on that batch)."""
    from structlog.testing import capture_logs

    events = working(T0, 12) + [e for i in range(90) for e in minute(T0 + 12 * HOUR + i * MIN, 0.0, 60.0)]  # then idle
    models = trained_on(working(T0 - 24 * HOUR, 12), tmp_path)
    gpu = models.get("gpu")
    assert gpu is not None

    def broken(rows, fleet=None):
        raise ValueError("tree 0 cannot be walked")

    monkeypatch.setattr(gpu, "score", broken)
    ruleset = anomaly_ruleset(load_rules(ROOT / "rules"))
    use_scoring(ruleset.rules, Scoring(models))
    engine = Engine(ruleset)
    with capture_logs() as logs:
        got = [(f.type, f.action, f.key, f.at) for batch in range(0, len(events), 5000)
               for f in engine.process(events[batch : batch + 5000]) if f.type != "anomaly"]  # fmt: skip
    expected_engine = Engine(load_rules(ROOT / "rules"))
    expected = [(f.type, f.action, f.key, f.at) for batch in range(0, len(events), 5000)
                for f in expected_engine.process(events[batch : batch + 5000])]  # fmt: skip
    assert got == expected and any(kind == "idle_gpu" for kind, *_ in got)
    anomaly = next(r.detector.name for r in ruleset.rules if r.detector.type == "anomaly")
    assert engine.errors[anomaly] > 0
    failed = [entry for entry in logs if entry["event"] == "detector_batch_error"]
    assert len(failed) == 1 and failed[0]["rule"] == anomaly and "tree 0 cannot be walked" in failed[0]["error"]


def test_a_stall_of_a_scrape_or_two_leaves_the_window_judged_a_spell_of_minutes_pauses_it():
    """Whether a rule tracks a pause is asked at every sample (not only at usage events, which a live
    worker reads after the samples that follow them). An idle spell counts from :data:`SPELL_S` into
    it: a host whose GPUs stall for half a minute in every window (a checkpoint) is judged and learnt
    (a review found every such window paused when a spell counted from its first sample), while
    three idle minutes pause the window they fall in."""
    def observed(idle_minutes: set[int]) -> list:
        rules = anomaly_ruleset(load_rules(ROOT / "rules"))
        windows: list = []
        use_scoring(rules.rules, Scoring(observe=windows.extend))
        events = [e for i in range(120) for e in minute(T0 + i * MIN, 0.0 if i % 5 in idle_minutes else 80.0, 300.0)]
        Engine(rules).process(events)
        return windows

    # the stall: samples at +60 s and +90 s of each window idle, busy again at +120 s
    assert len(observed(set())) == len(observed({1})) == 23  # every window but the last, still open
    assert len(observed({1, 2, 3})) == 0  # idle from +60 s to +239 s of each: each window paused


def test_an_idle_spell_that_starts_again_after_a_telemetry_gap_pauses_at_once():
    """The idle rule starts its count again at the first sample after a gap longer than its
    ``stale_after``; that spell follows no busy sample, so it is a pause from its first sample, not
    from a minute in (a review: samples back in a window's last minute left that window judged, all
    idle, where the idle rule has the first word)."""
    rules = anomaly_ruleset(load_rules(ROOT / "rules"))
    windows: list = []
    use_scoring(rules.rules, Scoring(observe=windows.extend))
    events: list = []
    for i in range(60):
        usage, *samples = minute(T0 + i * MIN, 80.0 if i < 30 else 0.0, 300.0 if i < 30 else 60.0)
        events += [usage, *(s for s in samples if not 2100 < s.ts.timestamp() - T0 < 2650)]  # dark 35:00-44:10
    Engine(rules).process(events)
    assert [w.window.start - T0 for w in windows] == [300.0 * k for k in range(6)]  # the busy half hour only
