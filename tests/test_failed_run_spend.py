"""The failed_run_spend detector on crafted run lifecycles over priced hosts."""

from __future__ import annotations

import msgspec
import pytest

from detector.engine import Engine
from detector.events import RunEvent
from detector.rules import load_rules
from tests.helpers import MIN, T0, at, usage

HOUR = 3600.0


def run(t: float, run_id: str, status: str, hosts=("host-1",), gpus: int = 8, project: str = "llm",
        error: str = "") -> RunEvent:  # fmt: skip
    return RunEvent(ts=at(t), run_id=run_id, status=status, resource_ids=list(hosts), gpu_count=gpus,
                    project=project, error=error, tags={"team": "nlp", "owner": "alice"})  # fmt: skip


def billed(hosts=("host-1",), hours: float = 12, usd_per_hour: float = 32.0) -> list:
    """Each host's usage, one event a minute (p4d.24xlarge: 8 GPUs)."""
    return [usage(T0 + i * MIN, rid, usd_per_hour=usd_per_hour) for rid in hosts for i in range(int(hours * 60))]


def findings(ruleset, *runs, hosts=("host-1",)):
    events = sorted(billed(hosts) + list(runs), key=lambda e: e.ts)
    return [f for f in Engine(ruleset).process(events) if f.type == "failed_run_spend"]


def test_failed_run_alerts_with_cost_gpu_hours_owner_and_error(ruleset):
    (fire,) = findings(ruleset, run(T0 + HOUR, "r1", "started"), run(T0 + 3 * HOUR, "r1", "failed", error="CUDA OOM"))
    assert fire.action == "fire" and fire.resource_id == "r1"
    assert fire.fired_at == T0 + 3 * HOUR and fire.episode_start == T0 + HOUR
    assert fire.waste_usd == pytest.approx(64.0, rel=1e-4)  # 2 h of a $32/h host
    assert fire.details["gpu_hours"] == 16 and fire.details["error"] == "CUDA OOM"
    assert fire.details["owner"] == "alice" and fire.details["project"] == "llm"
    assert fire.resource.tags["team"] == "nlp"


@pytest.mark.parametrize(
    "runs",
    [
        # it succeeded: the money bought a model
        [run(T0 + HOUR, "r1", "started"), run(T0 + 5 * HOUR, "r1", "succeeded")],
        # killed on purpose: not counted by default
        [run(T0 + HOUR, "r1", "started"), run(T0 + 5 * HOUR, "r1", "killed")],
        # failed after 20 minutes: $10.67, under the $20 floor
        [run(T0 + HOUR, "r1", "started"), run(T0 + HOUR + 20 * MIN, "r1", "failed")],
        # on a host burnwatch has no usage (price) for: nothing to weigh against the floor
        [run(T0 + HOUR, "r1", "started", hosts=("elsewhere",)), run(T0 + 5 * HOUR, "r1", "failed", hosts=("elsewhere",))],
        # two cheap failures of a project in six hours: not yet a crash loop
        [run(T0 + HOUR, "a", "started"), run(T0 + HOUR + 20 * MIN, "a", "failed"),
         run(T0 + 2 * HOUR, "b", "started"), run(T0 + 2 * HOUR + 20 * MIN, "b", "failed")],
    ],
    ids=["succeeded", "killed", "cheap", "unpriced", "two-failures"],
)
def test_no_alert(ruleset, runs):
    assert findings(ruleset, *runs) == []


def test_killed_runs_count_when_the_rule_says_so(tmp_path):
    (tmp_path / "rules.yaml").write_text(
        "rules:\n  - {name: failed, type: failed_run_spend, params: {count_killed: true}}\n"
    )
    ruleset = load_rules(tmp_path / "rules.yaml")
    (fire,) = findings(ruleset, run(T0 + HOUR, "r1", "started"), run(T0 + 5 * HOUR, "r1", "killed"))
    assert fire.details["status"] == "killed" and fire.waste_usd == pytest.approx(128.0, rel=1e-4)


def test_runs_sharing_a_host_pay_by_gpu_count(ruleset):
    # Two GPUs of an eight-GPU host for four hours: a quarter of $128.
    (fire,) = findings(ruleset, run(T0 + HOUR, "r1", "started", gpus=2), run(T0 + 5 * HOUR, "r1", "failed", gpus=2))
    assert fire.waste_usd == pytest.approx(32.0, rel=1e-4) and fire.details["gpu_hours"] == 8


def test_a_multi_host_run_pays_for_every_host(ruleset):
    hosts = ("host-1", "host-2")
    runs = [run(T0 + HOUR, "r1", "started", hosts=hosts, gpus=16), run(T0 + 2 * HOUR, "r1", "failed", hosts=hosts, gpus=16)]
    (fire,) = findings(ruleset, *runs, hosts=hosts)
    assert fire.waste_usd == pytest.approx(64.0, rel=1e-4) and fire.details["gpu_hours"] == 16


def test_crash_loop_is_one_alert_with_the_total_until_a_run_succeeds(ruleset):
    # Four 20-minute failures of one project, 40 minutes apart ($10.67 each), then a success.
    runs = []
    for k in range(4):
        start = T0 + HOUR + k * 40 * MIN
        runs += [run(start, f"r{k}", "started", error="OOM"), run(start + 20 * MIN, f"r{k}", "failed", error="OOM")]
    runs += [run(T0 + 5 * HOUR, "ok", "started"), run(T0 + 7 * HOUR, "ok", "succeeded")]
    found = findings(ruleset, *runs)
    assert [f.action for f in found] == ["fire", "update", "resolve"]
    fire, update, resolve = found
    assert fire.resource_id == "project/llm" and fire.details["crash_loop"] is True
    assert fire.fired_at == T0 + HOUR + 80 * MIN + 20 * MIN  # the third failure
    assert fire.episode_start == T0 + HOUR + 20 * MIN  # the first failure
    assert fire.details["failed_runs"] == 3 and fire.waste_usd == pytest.approx(32.0, rel=1e-3)
    assert update.details["failed_runs"] == 4 and update.waste_usd == pytest.approx(128 / 3, rel=1e-3)
    assert resolve.details["reason"] == "run_succeeded" and resolve.waste_usd == update.waste_usd


def test_reread_run_events_do_not_fail_twice(ruleset):
    started = run(T0 + HOUR, "r1", "started")
    events = sorted(billed() + [started, run(T0 + 3 * HOUR, "r1", "failed")], key=lambda e: e.ts)
    engine = Engine(ruleset)
    first = engine.process(events)
    again = engine.process(events[events.index(started):])  # the run's events, re-read after a restart
    assert len([f for f in first if f.type == "failed_run_spend"]) == 1
    assert [f for f in again if f.type == "failed_run_spend"] == []


def test_a_run_whose_hosts_another_worker_holds_is_priced_from_the_store(store, ruleset):
    """With several workers, the run's project and its host can sit on different workers: the
    run's engine holds no state for the host and looks it up in the store, as of the run's
    events, and prices the failure as one engine holding both does."""
    from detector.store import EventBatch

    runs = [run(T0 + HOUR, "r1", "started"), run(T0 + 3 * HOUR, "r1", "failed", error="CUDA OOM")]
    batch = EventBatch()
    batch.extend(billed())  # the host, stored by the worker that holds it
    store.events.insert(batch, ruleset.pricing)
    alone = Engine(ruleset)
    alone.directory = store.history.resource_info
    (fire,) = [f for f in alone.process(runs) if f.type == "failed_run_spend"]
    (together,) = findings(ruleset, *runs)
    assert fire.waste_usd == pytest.approx(together.waste_usd) == pytest.approx(64.0, rel=1e-4)
    assert fire.resource.instance_type == together.resource.instance_type == "p4d.24xlarge"
    nowhere = Engine(ruleset)  # a host nothing knows of, here or in the store: unpriced, no alert
    nowhere.directory = store.history.resource_info
    assert [f for f in nowhere.process([run(T0 + HOUR, "r2", "started", hosts=("gone",)),
                                         run(T0 + 3 * HOUR, "r2", "failed", hosts=("gone",))])] == []  # fmt: skip


def test_a_project_whose_runs_all_ended_keeps_no_table_they_grew(ruleset):
    """A dict keeps the table it grew to when its keys are deleted: once a project's eight open
    runs have all ended (one a crash loop's third failure, resolved by a success), the run rules
    hold an empty dict for its open runs (and spot_eligible for its candidates), not the table of
    eight, and the crash loop's tags go with its episode."""
    import sys

    runs = [run(T0 + HOUR, f"r{i}", "started") for i in range(8)]
    runs += [run(T0 + 3 * HOUR + i * MIN, f"r{i}", "failed") for i in range(3)]
    runs += [run(T0 + 4 * HOUR + i * MIN, f"r{i}", "succeeded") for i in range(3, 8)]
    engine = Engine(ruleset)
    found = [f for f in engine.process(sorted(billed() + runs, key=lambda e: e.ts)) if f.type == "failed_run_spend"]
    assert [f.action for f in found if f.details.get("crash_loop")] == ["fire", "resolve"]
    key = engine._keys["llm"]
    states = [key.rule(name) for name in ("failed-run-spend", "plateaued-run", "spot-eligible")]
    open_runs = [s.runs for s in states] + [states[2].fired]
    assert all(d == {} and sys.getsizeof(d) == sys.getsizeof({}) for d in open_runs)
    assert states[0].loop_tags == {} and states[0].fired_at is None


def test_a_run_id_retried_by_its_controller_is_a_crash_loop(ruleset):
    # A Kubernetes Job (or an Airflow task) retried under its own name: each attempt starts after the
    # last failed, 15 minutes at $32/h ($8) each. Three in an hour is a crash loop, not re-reads.
    runs = []
    for k in range(3):
        start = T0 + HOUR + k * 20 * MIN
        runs += [run(start, "job-train", "started", error="ImportError"),
                 run(start + 15 * MIN, "job-train", "failed", error="ImportError")]  # fmt: skip
    (fire,) = findings(ruleset, *runs)
    assert fire.resource_id == "project/llm" and fire.details["crash_loop"] is True
    assert fire.details["failed_runs"] == 3 and fire.fired_at == T0 + HOUR + 55 * MIN
    assert fire.waste_usd == pytest.approx(24.0, rel=1e-3)


def test_a_run_id_used_again_fails_on_its_own(ruleset):
    # A nightly job of a fixed name fails for three hours, then again the next night: two alerts.
    runs = [run(T0 + HOUR, "nightly", "started"), run(T0 + 4 * HOUR, "nightly", "failed"),
            run(T0 + 8 * HOUR, "nightly", "started"), run(T0 + 11 * HOUR, "nightly", "failed")]  # fmt: skip
    found = findings(ruleset, *runs)
    assert [(f.action, f.resource_id, f.fired_at) for f in found] == [
        ("fire", "nightly", T0 + 4 * HOUR), ("fire", "nightly", T0 + 11 * HOUR)]  # fmt: skip
    assert [f.waste_usd for f in found] == [pytest.approx(96.0, rel=1e-4)] * 2


def test_a_retried_run_ids_events_reread_fail_nothing_again(ruleset):
    # After a restart the attempts' events are read again, the second attempt still running.
    runs = [run(T0 + HOUR, "job", "started"), run(T0 + 3 * HOUR, "job", "failed"), run(T0 + 4 * HOUR, "job", "started")]
    events = sorted(billed() + runs, key=lambda e: e.ts)
    engine = Engine(ruleset)
    assert len([f for f in engine.process(events) if f.type == "failed_run_spend"]) == 1
    assert [f for f in engine.process(runs) if f.type == "failed_run_spend"] == []
    (second,) = [f for f in engine.process([run(T0 + 6 * HOUR, "job", "failed")]) if f.type == "failed_run_spend"]
    assert second.episode_start == T0 + 4 * HOUR and second.waste_usd == pytest.approx(64.0, rel=1e-4)


def test_a_straggling_event_of_a_failed_run_is_no_new_attempt(ruleset):
    """The tracker's last heartbeat, or a second 'failed' from its controller, a minute after the run failed: the
    run's own (one failure, one alert), where a 'started' of the id later would be a retry."""
    runs = [run(T0 + HOUR, "job", "started"), run(T0 + 3 * HOUR, "job", "failed"),
            run(T0 + 3 * HOUR + 40, "job", "running")]  # fmt: skip
    engine = Engine(ruleset)
    found = [f for f in engine.process(sorted(billed() + runs, key=lambda e: e.ts)) if f.type == "failed_run_spend"]
    assert [(f.action, f.waste_usd) for f in found] == [("fire", pytest.approx(64.0, rel=1e-4))]
    key = engine._keys["llm"]
    assert [key.rule(name).runs for name in ("failed-run-spend", "plateaued-run", "spot-eligible")] == [{}] * 3
    (retried,) = [f for f in engine.process([run(T0 + 3 * HOUR + 60, "job", "started"), run(T0 + 4 * HOUR, "job", "failed")])
                  if f.type == "failed_run_spend"]  # fmt: skip
    assert retried.episode_start == T0 + 3 * HOUR + 60  # a started of the id a minute on: a retry


def test_a_run_tagged_in_another_case_is_the_teams(ruleset):
    """A run's alert takes its tags from its events, as written: a run tagged Team (as its hosts are, on a fleet
    tagging as AWS's examples do) routed to the default channel and its waste went to no team, where its hosts' own
    alerts read team. Its alert's tags gain the rules' spelling too."""
    from detector.alerts import AlertManager

    failed = [msgspec.structs.replace(r, tags={"Team": "nlp", "Owner": "alice"})
              for r in (run(T0 + HOUR, "r1", "started"), run(T0 + 3 * HOUR, "r1", "failed"))]  # fmt: skip
    (alert,) = AlertManager(ruleset=ruleset).handle(findings(ruleset, *failed))
    assert (alert.tags["team"], alert.tags["owner"], alert.tags["Team"]) == ("nlp", "alice", "nlp")
    assert alert.details["owner"] == "alice"  # the owner its message names, read from the run's Owner too


def test_a_retry_started_and_failed_within_minutes_of_the_failure_is_a_failure_of_its_own(ruleset):
    """A Job retried within seconds of its failure under its own name (its 'started', then its 'failed' a minute on):
    each attempt ends with its own failure, however soon after the attempt before it, and three of them are a crash
    loop. Taken for the failed run's stragglers (within 5 minutes of its end), the retries' failures counted for
    nothing and their runs never ended: no crash loop, and spot_eligible judged a run that no longer ran."""
    end = T0 + 3 * HOUR
    runs = [run(T0 + HOUR, "job", "started"), run(end, "job", "failed"),
            run(end + 30, "job", "started"), run(end + 90, "job", "failed"),
            run(end + 120, "job", "started"), run(end + 180, "job", "failed")]  # fmt: skip
    engine = Engine(ruleset)
    found = [f for f in engine.process(sorted(billed() + runs, key=lambda e: e.ts)) if f.type == "failed_run_spend"]
    assert [(f.action, f.resource_id, f.fired_at) for f in found] == [
        ("fire", "job", end), ("fire", "project/llm", end + 180)]  # fmt: skip
    assert found[1].details["failed_runs"] == 3
    key = engine._keys["llm"]
    assert [key.rule(name).runs for name in ("failed-run-spend", "plateaued-run", "spot-eligible")] == [{}] * 3
