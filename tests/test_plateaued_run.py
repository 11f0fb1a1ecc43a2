"""The plateaued_run detector on crafted run events carrying a validation metric, over priced hosts."""

from __future__ import annotations

import pytest

from detector.engine import Engine
from detector.events import RunEvent
from detector.rules import load_rules
from tests.helpers import MIN, T0, at, usage

HOUR = 3600.0
EVAL = 15 * MIN


def ev(t: float, status: str = "running", value: float | None = None, step: int | None = None, run_id: str = "r1",
       gpus: int = 8, metric: str = "val_loss") -> RunEvent:  # fmt: skip
    return RunEvent(ts=at(t), run_id=run_id, status=status, resource_ids=["host-1"], gpu_count=gpus, project="llm",
                    tags={"team": "nlp", "owner": "alice"}, metrics={} if value is None else {metric: value},
                    step=step)  # fmt: skip


def evals(values: list[float], start: float = T0, every: float = EVAL, **kw) -> list[RunEvent]:
    """A run started at ``start`` logging one evaluation every ``every``, at steps 1000, 2000, ..."""
    return [ev(start, "started", **kw)] + [ev(start + (i + 1) * every, value=v, step=(i + 1) * 1000, **kw)
                                          for i, v in enumerate(values)]  # fmt: skip


def findings(events, rules: str | None = None, tmp_path=None) -> list:
    from tests.conftest import ROOT

    if rules is not None:
        (tmp_path / "rules.yaml").write_text(rules)
    ruleset = load_rules(tmp_path / "rules.yaml" if rules is not None else ROOT / "rules")
    host = [usage(T0 + i * MIN, "host-1") for i in range(int(12 * HOUR / MIN))]  # p4d.24xlarge at $32/h
    found = Engine(ruleset).process(sorted(host + list(events), key=lambda e: e.ts))
    return [f for f in found if f.type == "plateaued_run"]


IMPROVING = [2.0, 1.5, 1.2, 1.0]


def test_a_flat_run_fires_at_the_fifth_evaluation_without_improvement_and_prices_from_the_best():
    events = evals(IMPROVING + [1.01, 1.02, 1.0, 1.03, 1.02, 1.04]) + [ev(T0 + 12 * EVAL, "succeeded")]
    fire, *rest = findings(events)
    best_t = T0 + 4 * EVAL
    assert fire.action == "fire" and fire.resource_id == "r1" and fire.episode_start == best_t
    assert fire.fired_at == T0 + 9 * EVAL  # 1.01, 1.02, 1.0 (not better), 1.03, 1.02
    assert fire.waste_usd == pytest.approx(32.0 * 5 * EVAL / HOUR, rel=1e-4)
    assert fire.details["best"] == 1.0 and fire.details["best_step"] == 4000
    assert fire.details["evaluations_since_best"] == 5 and fire.resource.tags["team"] == "nlp"
    resolve = rest[-1]
    assert resolve.action == "resolve" and resolve.details["reason"] == "run_succeeded"
    assert resolve.waste_usd == pytest.approx(32.0 * 8 * EVAL / HOUR, rel=1e-4)  # best to the run's end


@pytest.mark.parametrize(
    "values",
    [
        # still improving, slowly: a new best at every evaluation
        [2.0 - 0.001 * i for i in range(20)],
        # a noisy metric on its way down: worse for two or three evaluations, then a new best
        [2.0, 1.9, 1.95, 1.97, 1.85, 1.88, 1.9, 1.92, 1.8, 1.83, 1.79, 1.81, 1.84, 1.86, 1.75],
        # four evaluations without improvement: one short of the patience
        IMPROVING + [1.1, 1.05, 1.2, 1.01, 0.9],
        # NaN and infinite values are not evaluations
        IMPROVING + [float("nan"), float("inf"), float("-inf"), 1.2, 0.95],
    ],
    ids=["slow", "noisy", "four", "not-finite"],
)
def test_no_alert(values):
    assert findings(evals(values)) == []


def test_other_runs_and_events_without_the_metric_are_not_evaluations():
    # Heartbeats without metrics, a repeated report at the same step, another metric: none counts.
    events = evals(IMPROVING)
    last = T0 + 4 * EVAL
    events += [ev(last + i * MIN) for i in range(1, 30)]
    events += [ev(last + 30 * MIN + i, value=1.5, step=4000) for i in range(10)]
    events += [ev(last + 31 * MIN + i * MIN, value=9.9, step=5000 + i, metric="train_loss") for i in range(10)]
    assert findings(events) == []


def test_the_metric_improving_again_resolves_and_a_new_plateau_is_a_new_episode():
    events = evals(IMPROVING + [1.1] * 5 + [0.8] + [0.9] * 5)
    found = findings(events)
    assert [f.action for f in found] == ["fire", "resolve", "fire"]
    assert found[1].details["reason"] == "improved"
    assert found[2].episode_start == T0 + 10 * EVAL and found[2].episode_start != found[0].episode_start


def test_max_mode_min_delta_and_patience_for(tmp_path):
    rules = ("rules:\n  - {name: acc, type: plateaued_run, params: {metric: eval_accuracy, mode: max, "
             "min_delta: 0.01, patience: 50, patience_for: 2h}}\n")  # fmt: skip
    # accuracy wavers between 0.800 and 0.809: within min_delta of the best, so no improvement after 0.80
    values = [0.5, 0.7, 0.8] + [0.8 + 0.009 * (i % 2) for i in range(1, 12)]
    (fire,) = [f for f in findings(evals(values, metric="eval_accuracy"), rules, tmp_path) if f.action == "fire"]
    assert fire.episode_start == T0 + 3 * EVAL and fire.fired_at == T0 + 11 * EVAL  # 2 h after the best


def test_a_run_on_two_of_eight_gpus_pays_a_quarter_and_an_unpriced_run_waits():
    (fire,) = [f for f in findings(evals(IMPROVING + [1.1] * 5, gpus=2)) if f.action == "fire"]
    assert fire.usd_per_hour == pytest.approx(8.0)
    on_unknown = [e for e in evals(IMPROVING + [1.1] * 5)]
    for e in on_unknown:
        e.resource_ids = ["elsewhere"]
    assert findings(on_unknown) == []


def test_a_re_read_end_event_and_hostile_values_change_nothing():
    events = evals(IMPROVING + [1.1] * 6) + [ev(T0 + 12 * EVAL, "killed")]
    once = findings(events)
    again = findings(events + [ev(T0 + 12 * EVAL + 1, "killed"), ev(T0 + 13 * EVAL, value=-1e308, step=2**63 - 1)])
    assert [(f.action, f.waste_usd) for f in again] == [(f.action, f.waste_usd) for f in once]
    assert once[-1].details["reason"] == "run_killed"


def test_state_is_bounded_by_open_runs():
    from detector.detectors.base import Context, ResourceInfo
    from detector.detectors.plateaued_run import PlateauedRun

    det = PlateauedRun("r", "warning", PlateauedRun.Params())
    st = det.new_state()
    ctx = Context(ResourceInfo())
    for i in range(50):  # fifty runs started and never heard from again
        e = ev(T0 + i * HOUR, "started", run_id=f"lost-{i}")
        det.step(st, ctx, e, e.t)
    assert len(st.runs) <= 49 and "lost-0" not in st.runs  # forgotten after two quiet days


def test_a_sweep_of_short_runs_keeps_a_bounded_memory_of_ended_ones():
    # A hyperparameter sweep ends 3,000 runs in a few hours: the ended runs remembered (so a
    # re-read end event changes nothing) stay within MAX_ENDED, the newest kept.
    from detector.detectors.base import Context, ResourceInfo
    from detector.detectors.plateaued_run import MAX_ENDED, PlateauedRun

    det = PlateauedRun("r", "warning", PlateauedRun.Params())
    st = det.new_state()
    ctx = Context(ResourceInfo())
    for i in range(3000):
        for status, dt in (("started", 0.0), ("succeeded", 1.0)):
            e = ev(T0 + i * 5.0 + dt, status, run_id=f"sweep-{i}")
            det.step(st, ctx, e, e.t)
    assert len(st.ended) <= MAX_ENDED and "sweep-2999" in st.ended and not st.runs


def test_metrics_and_step_go_through_the_store_and_keep_old_ids(store):
    """Stored in the run events' extra column and read back as the events sent; an event without
    them keeps the id it had before they existed."""
    from detector.store.batch import EventBatch, event_ids

    sent = [ev(T0, "started"), ev(T0 + EVAL, value=1.25, step=1000),
            RunEvent(ts=at(T0 + 2 * EVAL), run_id="r1", status="running", extra={"note": "x"}, metrics={"acc": -1.0})]
    batch = EventBatch()
    batch.extend(sent)
    assert store.events.insert(batch) == 3
    back = [event for _, event in store.history.between(0, 2e9)]
    assert back == sent
    plain = RunEvent(ts=at(T0), run_id="r1", status="started")
    assert event_ids(b"run", [plain]) == event_ids(b"run", [RunEvent(ts=at(T0), run_id="r1", status="started",
                                                                     metrics={}, step=None)])  # fmt: skip
    assert event_ids(b"run", [plain]) != event_ids(b"run", [ev(T0, "started", value=1.0, step=1)])


def test_the_alert_says_the_metric_dollars_and_the_callback():
    from detector.detectors.plateaued_run import PlateauedRun

    (fire,) = [f for f in findings(evals(IMPROVING + [1.1] * 5)) if f.action == "fire"]
    facts = dict(PlateauedRun.facts(fire.details))
    assert facts["Metric"] == "`val_loss` best 1 at step 4000, 5 evaluations without improvement"
    assert "EarlyStopping" in PlateauedRun.suggest(fire.details)
    assert dict(PlateauedRun.facts({"best": None, "metric": "x"}))["Metric"].startswith("`x` best -")


def test_a_restart_from_a_checkpoint_at_a_lower_step_is_evaluated():
    # A plateau fires at step 9000; the run is resumed from its step-4000 checkpoint with a lower
    # learning rate and logs steps 4500, 5000... again. Its new evaluations count: 0.7 beats the
    # best (1.0), so the plateau resolves as improved instead of billing on past the improvement.
    events = evals(IMPROVING + [1.1] * 5)
    restart = T0 + 10 * EVAL
    events += [ev(restart + (i + 1) * EVAL, value=v, step=4500 + 500 * i) for i, v in enumerate([1.05, 0.7])]
    found = findings(events)
    assert [f.action for f in found] == ["fire", "resolve"]
    assert found[-1].details["reason"] == "improved" and found[-1].at == restart + 2 * EVAL


def test_a_run_id_used_again_later_is_a_new_run():
    # A scheduled job logs under a fixed run name: yesterday's run ended at 03:00; today's, under
    # the same id from 04:00, plateaus and fires. (Re-read events dated before the end still change nothing.)
    first = evals(IMPROVING) + [ev(T0 + 5 * EVAL, "succeeded")]
    second = evals(IMPROVING + [1.1] * 5, start=T0 + 6 * EVAL)
    (fire,) = [f for f in findings(first + second) if f.action == "fire"]
    assert fire.episode_start == T0 + 10 * EVAL and fire.details["evaluations_since_best"] == 5


@pytest.mark.parametrize(
    ("params", "mode"),
    [
        ({"metric": "val_loss"}, "min"),  # a loss is minimised
        ({"metric": "eval/perplexity"}, "min"),  # W&B's slash-separated names: perplexity, minimised
        ({"metric": "eval_accuracy"}, "max"),  # an accuracy without a mode: maximised, not read as a loss
        ({"metric": "val-F1"}, "max"),  # any case and separator
        ({"metric": "eval_accuracy", "mode": "min"}, "min"),  # an explicit mode wins
    ],
    ids=["loss", "perplexity", "accuracy", "f1", "explicit"],
)
def test_the_mode_follows_the_metric_name_when_not_given(params, mode):
    from detector.detectors.plateaued_run import PlateauedRunParams

    assert PlateauedRunParams(**params).mode == mode


def test_a_metric_of_no_known_direction_without_a_mode_is_refused():
    # "throughput" says nothing of which way is better: the rule must say, or every improving run would alert.
    from pydantic import ValidationError

    from detector.detectors.plateaued_run import PlateauedRunParams

    with pytest.raises(ValidationError, match="mode"):
        PlateauedRunParams(metric="throughput")


def test_an_open_plateau_updates_hourly_with_the_dollars_since_the_best():
    # Fired at the fifth flat evaluation (1 h 15 m after the best); flat on for 3 more hours: an
    # update each hour of event time, each priced $32/h from the best evaluation.
    found = findings(evals(IMPROVING + [1.1] * 17))
    best_t = T0 + 4 * EVAL
    updates = [f for f in found if f.action == "update"]
    assert [f.at for f in updates] == [T0 + 13 * EVAL, T0 + 17 * EVAL, T0 + 21 * EVAL]
    assert [f.waste_usd for f in updates] == pytest.approx([32.0 * (f.at - best_t) / HOUR for f in updates])


def test_a_project_past_max_runs_forgets_its_quietest_run(monkeypatch):
    # Runs whose end events never came fill the project's table: past MAX_RUNS the one heard from
    # longest ago goes, so the state stays bounded.
    from detector.detectors import plateaued_run
    from detector.detectors.base import Context, ResourceInfo

    monkeypatch.setattr(plateaued_run, "MAX_RUNS", 3)
    det = plateaued_run.PlateauedRun("r", "warning", plateaued_run.PlateauedRun.Params())
    st = det.new_state()
    for i in range(4):
        e = ev(T0 + i * MIN, "started", run_id=f"r{i}")
        det.step(st, Context(ResourceInfo()), e, e.t)
    assert sorted(st.runs) == ["r1", "r2", "r3"]


def test_an_open_plateau_at_the_end_of_the_data_keeps_its_price_and_host():
    # A backtest ends with the plateau open: the engine's open_episodes (no look-up of other keys
    # there) must report the dollars since the best at the hosts' last known price, not $0.
    from tests.conftest import ROOT

    engine = Engine(load_rules(ROOT / "rules"))
    host = [usage(T0 + i * MIN, "host-1") for i in range(int(12 * HOUR / MIN))]
    engine.process(sorted(host + evals(IMPROVING + [1.1] * 8), key=lambda e: e.ts))
    (last,) = [f for f in engine.open_episodes() if f.type == "plateaued_run"]
    assert last.action == "update" and last.at == T0 + 12 * EVAL and last.usd_per_hour == pytest.approx(32.0)
    assert last.waste_usd == pytest.approx(32.0 * 8 * EVAL / HOUR)
    assert (last.resource.account, last.resource.instance_type) == ("acct", "p4d.24xlarge")


def test_quiet_runs_are_looked_for_hourly_not_at_every_event(monkeypatch):
    # 2,000 open runs sending 20,000 heartbeats within an hour: the scan for runs quiet for two
    # days walks every run, so it runs once an hour of event time, not 20,000 times (440 µs an event).
    from detector.detectors.base import Context, ResourceInfo
    from detector.detectors.plateaued_run import PlateauedRun

    det = PlateauedRun("r", "warning", PlateauedRun.Params())
    scans = []
    scan = det._forget_quiet
    monkeypatch.setattr(det, "_forget_quiet", lambda st, t, fleet: scans.append(t) or scan(st, t, fleet))
    st = det.new_state()
    for i in range(20_000):
        e = ev(T0 + i * 0.1, run_id=f"r{i % 2000}")
        det.step(st, Context(ResourceInfo()), e, e.t)
    assert len(st.runs) == 2000 and len(scans) <= 2
