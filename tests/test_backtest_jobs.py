"""``backtest --jobs``: detection sharded by key over processes gives the single process's alerts,
on fleets delivered messily, with runs whose hosts another shard detects, with hostile lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from detector.align import each_event
from detector.backtest import _Shard, backtest
from detector.events import RunEvent, UsageEvent
from detector.replay import write_replay
from detector.rules import RuleSet
from detector.simulate import SimConfig
from tests.conftest import ROOT
from tests.helpers import T0, at, fleet_file, scrape, usage

DAY = 86_400.0


def listed(alerts) -> list[dict]:
    """Everything an alert says, as ``backtest --json`` prints it, plus the key that made it."""
    return [{**a.to_json(), "key": a.key} for a in alerts]


@pytest.fixture(scope="module")
def messy(tmp_path_factory, ruleset):
    """26 h of a fleet with training hosts, runs that fail, notebooks, Kubernetes nodes, serving
    endpoints and regional choices, delivered as real pipelines do: scrapes lost, clocks
    jittered, messages duplicated and delayed. Small (GPU scrapes are most of a backtest's time)
    but over a day, so buckets and vector databases grow into alerts: every type in ``TYPES``."""
    cfg = SimConfig.messy(hours=26, training_hosts=4, notebooks=2, inference_endpoints=2, k8s_nodes=2,
                          serving_endpoints=4, choices=1, training_jobs=2, seed=11)  # fmt: skip
    path, _ = fleet_file(tmp_path_factory.mktemp("jobs") / "messy.jsonl", cfg, ruleset.pricing)
    return path


TYPES = {"build_or_call", "data_starved_training", "egress_runaway", "failed_run_spend", "idle_gpu",
         "inference_overprovisioned", "inference_scale_to_zero", "inference_unbatched", "partly_idle_gpu",
         "plateaued_run", "spot_eligible", "storage_growth", "stuck_gpu", "telemetry_stale", "unallocated_gpu",
         "untagged", "vector_db_growth", "wrong_region"}  # fmt: skip
"""The alert types the fleet gives: the equalities below are tested on each of them."""


@pytest.fixture(scope="module")
def single(messy, ruleset):
    return backtest(messy, ruleset)


@pytest.mark.parametrize("jobs", [2, 3])
def test_sharded_backtest_gives_the_single_process_alerts(messy, single, ruleset, jobs):
    sharded = backtest(messy, ruleset, jobs=jobs)
    assert len(single.alerts) > 50
    assert {a.type for a in single.alerts} == TYPES  # each detector's alerts are compared
    assert listed(sharded.alerts) == listed(single.alerts)
    assert (sharded.events, sharded.messages, sharded.invalid) == (single.events, single.messages, single.invalid)


def test_runs_whose_hosts_another_shard_detects_are_priced_as_in_one_process(single):
    """A run's project and its hosts are keys of their own: sharded apart, the run's shard knows
    the hosts from their usage events alone. Without that, these alerts go missing."""
    shard = _Shard(0, 2)
    apart = [a for a in single.alerts if a.type == "failed_run_spend" and a.details.get("resource_ids")
             and any(shard.owns(host) != shard.owns(a.key) for host in a.details["resource_ids"])]  # fmt: skip
    assert apart, "the fleet has no run alert whose hosts are in another shard: nothing is tested"
    assert all(a.usd_per_hour > 0 and a.waste_usd > 0 for a in apart)


def test_a_hostile_file_gives_the_same_alerts_and_the_same_invalid_lines(tmp_path, messy, ruleset):
    """Lines that are not events, events from far in the future, and a stretch of messages
    delivered out of order, late past the allowed lateness: each shard aligns the whole file
    as one process does, so late events come where they came."""
    lines = messy.read_bytes().splitlines()
    late = lines[3000:3400]
    del lines[3000:3400]
    lines[9000:9000] = late  # minutes late: past the 60 s lateness
    hostile = [
        b'{"topic":"gpu-metrics","key":"gpu-host-000","value":{"ts":"2099-01-01T00:00:00Z"}}',
        b'{"topic":"gpu-metrics","key":"x","value":"not an event"}',
        b'{"topic":"resource-usage","key":"r","value":[]}',
        b'{"topic":"run-events","key":"p","value":{"ts":"2026-11-02T05:00:00Z","run_id":"' + b"r" * 5000 + b'"}}',
    ]
    for i, line in enumerate(hostile):
        lines.insert(500 + 2000 * i, line)
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    one = backtest(path, ruleset)
    assert len(one.invalid) >= len(hostile)
    three = backtest(path, ruleset, jobs=3)
    assert listed(three.alerts) == listed(one.alerts)
    assert three.invalid == one.invalid


def test_a_rules_comparison_is_the_same_in_shards(messy, ruleset):
    fewer = RuleSet(tuple(r for r in ruleset.rules if r.detector.type != "idle_gpu"), ruleset.pricing)
    one = backtest(messy, ruleset, other=fewer)
    two = backtest(messy, ruleset, other=fewer, jobs=2)
    assert one.other is not None and two.other is not None
    assert len(one.other) < len(one.alerts)
    assert listed(two.other) == listed(one.other)
    assert listed(two.alerts) == listed(one.alerts)


def test_recording_scores_or_training_needs_one_process(messy, ruleset):
    with pytest.raises(ValueError, match="cannot train or record"):
        backtest(messy, ruleset, jobs=2, record=lambda windows: None)
    with pytest.raises(ValueError, match="cannot train or record"):
        backtest(messy, ruleset, jobs=2, on_windows=lambda windows: None)


def test_cli_jobs_prints_the_same_alerts_and_refuses_what_it_cannot_do(messy, single, tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "streams.cli", "backtest", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)  # fmt: skip

    two = run(str(messy), "--json", "--jobs", "2")
    assert two.returncode == 0, two.stderr
    # the single process's alerts as `backtest --json` prints them (one line each, json.dumps of to_json)
    one = [json.loads(json.dumps(a.to_json())) for a in single.alerts]
    assert [json.loads(line) for line in two.stdout.splitlines()] == one
    for args, says in [
        (["--jobs", "two"], "'two' is not a whole number of processes"),
        (["--jobs", "-1"], "takes 0 (one per usable CPU) to 1024, not -1"),
        (["--jobs", "2", "--scores", str(tmp_path / "s.csv"), "--model-dir", str(tmp_path)], "--jobs cannot write --scores"),
    ]:
        done = run(str(messy), *args)
        assert done.returncode != 0 and says in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    done = run("--since", "1d", "--jobs", "2")
    assert done.returncode != 0 and "--jobs works with a replay file, not --since" in done.stderr
    assert not (tmp_path / "s.csv").exists()


def test_a_shard_is_a_stable_hash_of_the_key():
    """The same key in the same shard in every process (not Python's per-process string hash)."""
    keys = [f"gpu-host-{i:03d}" for i in range(200)] + ["project/détecteur", "\udcff"]
    for of in (2, 3, 7):
        owners = [[k for k in keys if _Shard(i, of).owns(k)] for i in range(of)]
        assert sorted(sum(owners, [])) == sorted(keys)  # each key in exactly one shard
        assert all(owners)
        some = keys[:200]
        done = subprocess.run([sys.executable, "-c", "import sys, json; from detector.backtest import _Shard; "
                               f"print(json.dumps([k for k in json.loads(sys.argv[1]) if _Shard(0, {of}).owns(k)]))",
                               msgspec.json.encode(some).decode()],
                              cwd=ROOT, capture_output=True, text=True, check=True)  # fmt: skip
        assert json.loads(done.stdout) == [k for k in some if _Shard(0, of).owns(k)]


def test_each_shard_sees_its_keys_events_in_the_batches_and_order_of_one_process(tmp_path, messy, ruleset, monkeypatch):
    """The invariant the equality rests on: batch by batch, a shard's engine is given exactly the
    single process's events of its keys and every usage and run event, in the same order, and the other
    hosts' samples as their host and time (SeenSample, one a host and time). Its aligner holds only
    those, yet releases at the single process's watermark, so a batch boundary never falls elsewhere."""
    from detector.engine import Engine, SeenSample

    path = tmp_path / "part.jsonl"
    path.write_bytes(b"".join(messy.read_bytes().splitlines(keepends=True)[:12_000]))
    batches: list[list[tuple[float, str, str, bytes]]] = []
    process_timed = Engine.process_timed

    def seen(self, items):
        items = list(items)
        batches.append([(t, type(e).__name__, e.key if isinstance(e, RunEvent) else e.resource_id,
                         b"" if isinstance(e, SeenSample) else msgspec.json.encode(e))
                        for t, e in each_event(items)])  # fmt: skip
        return process_timed(self, items)

    monkeypatch.setattr(Engine, "process_timed", seen)
    backtest(path, ruleset)
    whole, batches[:] = list(batches), []
    for i in range(3):
        shard = _Shard(i, 3)
        backtest(path, ruleset, shard=shard)
        assert len(batches) == len(whole)
        for k, (mine, one) in enumerate(zip(batches, whole, strict=True)):
            expected = [item for item in one if item[1] in ("UsageEvent", "RunEvent") or shard.owns(item[2])]
            assert [item for item in mine if item[1] != "SeenSample"] == expected, f"shard {i} of 3, batch {k}"
            others = {(t, key) for t, kind, key, _ in one if kind == "GpuMetric" and not shard.owns(key)}
            assert {(t, key) for t, kind, key, _ in mine if kind == "SeenSample"} == others, f"shard {i}, batch {k}"
        assert sum(map(len, batches)) < sum(map(len, whole))
        batches[:] = []

def keys_apart(of: int = 2) -> tuple[str, str]:
    """A host and a project that shard 0 of ``of`` splits apart."""
    s = _Shard(0, of)
    host = next(f"host-{i}" for i in range(100) if s.owns(f"host-{i}"))
    project = next(f"proj-{i}" for i in range(100) if not s.owns(f"proj-{i}"))
    return host, project


def write(path: Path, records: list[tuple[str, str, Any]]) -> Path:
    with open(path, "wb") as out:
        write_replay(((0, topic, key, value) for topic, key, value in records), out)
    return path


def run(t: float, project: str, host: str, status: str, run_id: str = "run-1") -> RunEvent:
    return RunEvent(
        ts=at(t),
        run_id=run_id,
        status=status,
        resource_ids=[host],
        gpu_count=8,
        project=project,
        tags={"team": "nlp", "owner": "alice", "project": project},
    )


def host_and_run(path: Path, sample_days: tuple[int, ...], last_usage: UsageEvent | None = None) -> Path:
    """A host of one shard, priced by 5 minutes of usage at T0, with a run on it of a project of the
    other shard: started at T0, running on days 1 and 2, failed at day 3 + 60 s; the host's GPU
    scrapes on ``sample_days``, and ``last_usage`` (at day 3) if given."""
    host, project = keys_apart()
    recs: list[tuple[str, str, Any]] = [("resource-usage", host, usage(T0 + 60 * m, host)) for m in range(5)]
    recs.append(("run-events", project, run(T0, project, host, "started")))
    for d in (1, 2, 3):
        if d in sample_days:
            recs.append(("gpu-metrics", host, scrape(T0 + d * DAY, [90.0] * 8, host)))
        if d < 3:
            recs.append(("run-events", project, run(T0 + d * DAY, project, host, "running")))
    if last_usage is not None:
        recs.append(("resource-usage", host, last_usage))
    recs.append(("run-events", project, run(T0 + 3 * DAY + 60, project, host, "failed")))
    return write(path, recs)


def test_a_host_a_sample_starts_afresh_is_unknown_to_the_run_in_every_shard(tmp_path, ruleset):
    """One process: the host's GPU sample 3 days after its last usage event starts it afresh (what
    it was is forgotten), so the failed run on it is unpriced. The run's shard, which does not detect
    on the host, learns of that sample as a SeenSample, and does the same (it priced the run from
    the 3-day-old usage event, a $2,304 alert, before SeenSample; found by review)."""
    path = host_and_run(tmp_path / "renew.jsonl", sample_days=(3,))
    one = backtest(path, ruleset)
    assert not [a for a in one.alerts if a.type == "failed_run_spend"]
    for jobs in (2, 3):
        assert listed(backtest(path, ruleset, jobs=jobs).alerts) == listed(one.alerts)


def test_a_host_its_samples_keep_alive_keeps_its_price_for_the_run_in_every_shard(tmp_path, ruleset):
    """The host's usage events are more than the TTL (2 days) apart but its GPU samples keep it alive:
    one process never starts it afresh, and a ``stopped`` usage event (no rate) leaves its last price.
    The run's shard sees the samples as SeenSamples and keeps the price too (with usage events alone it
    started the host afresh at the stopped one and the run went unpriced; found by review)."""
    host, _ = keys_apart()
    stopped = usage(T0 + 3 * DAY, host, state="stopped", usd_per_hour=None)
    path = host_and_run(tmp_path / "stopped.jsonl", sample_days=(1, 2), last_usage=stopped)
    one = backtest(path, ruleset)
    assert [a.waste_usd > 0 for a in one.alerts if a.type == "failed_run_spend"] == [True]
    for jobs in (2, 3):
        assert listed(backtest(path, ruleset, jobs=jobs).alerts) == listed(one.alerts)

def test_a_process_killed_midway_is_a_clear_error_not_a_hang(messy, ruleset):
    """What the out-of-memory killer does to one of the processes: the run ends with a message
    saying so (multiprocessing's Pool waited forever for its result)."""
    import os
    import signal

    from detector.backtest import ShardFailed, _in_processes

    def killed_in_shard_1(part):
        if part.index == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return backtest(messy, ruleset, shard=part)

    with pytest.raises(ShardFailed, match="ended without its alerts .* fewer --jobs"):
        _in_processes(3, killed_in_shard_1)


def test_a_shard_moves_a_topic_as_one_process_when_its_messages_are_another_shards(tmp_path, ruleset):
    """Two run-event messages at a batch's end (every 1,000 lines): this shard's run running on day 2,
    then another shard's project's at day 3 + 2,000 s; then this shard's run fails at day 3 + 500 s
    (late, past the lateness), while its host's price doubles at day 3 + 600 s. One process takes
    the topic's time from the start of its latest message, the other project's; a shard that drops
    that message must move it the same, not to the start of what it kept, or the two price the run
    on either side of the change (review, 2026-12-03: $4,616.89 in a shard, $2,308.44 in one process,
    when one process pushed a batch's messages of a topic as one, timed by the earliest of all)."""
    shard = _Shard(0, 2)
    host = next(f"host-{i}" for i in range(100) if shard.owns(f"host-{i}"))
    other = next(f"host-{i}" for i in range(100) if not shard.owns(f"host-{i}"))
    mine = next(f"proj-{i}" for i in range(100) if shard.owns(f"proj-{i}"))
    theirs = next(f"proj-{i}" for i in range(100) if not shard.owns(f"proj-{i}"))
    def run_of(t: float, project: str, host: str, status: str) -> RunEvent:  # one run a project
        return run(t, project, host, status, run_id=f"run-{project}")

    recs: list[tuple[str, str, Any]] = [("gpu-metrics", other, scrape(T0 + 30 * k, [90.0] * 8, other)) for k in range(981)]
    recs += [("gpu-metrics", host, scrape(T0 + d * DAY, [90.0] * 8, host)) for d in (1, 2, 3)]
    recs += [("resource-usage", host, usage(T0 + 60 * m, host)) for m in range(5)]
    later = ("resource-usage", other, usage(T0 + 3 * DAY + 3000, other))
    recs += [("run-events", mine, run_of(T0, mine, host, "started")),
             ("run-events", mine, run_of(T0 + DAY, mine, host, "running")), later,
             ("gpu-metrics", host, scrape(T0 + 3 * DAY + 600, [90.0] * 8, host)),
             ("resource-usage", host, usage(T0 + 3 * DAY + 600, host, usd_per_hour=64.0)), later,
             ("gpu-metrics", other, scrape(T0 + 3 * DAY + 2000, [90.0] * 8, other))]  # fmt: skip
    recs += [later] * (998 - len(recs))
    recs += [("run-events", mine, run_of(T0 + 2 * DAY, mine, host, "running")),  # line 999
             ("run-events", theirs, run_of(T0 + 3 * DAY + 2000, theirs, other, "running")),  # line 1000: a batch ends
             ("run-events", mine, run_of(T0 + 3 * DAY + 500, mine, host, "failed"))]  # fmt: skip
    path = write(tmp_path / "ends.jsonl", recs)
    one = backtest(path, ruleset)
    assert [a.type for a in one.alerts if a.key == mine] == ["failed_run_spend"]
    assert listed(backtest(path, ruleset, jobs=2).alerts) == listed(one.alerts)


def test_a_run_quiet_past_the_ttl_is_resolved_in_every_shard_as_in_one_process(tmp_path, ruleset):
    """A project of shard 0 plateaus (its alert fires) and is never heard of again, while three projects
    of shard 1 go on reporting for three days, and nothing else does. One process's watermark follows
    them, so the end of its data resolves the plateau (``went_silent``, the TTL being 2 days). Shard 0
    never sees the other shard's run events: its watermark stayed at the plateau's last event and its
    alert stayed firing (review of 72134cf)."""
    from detector.detectors.episode import SILENT

    shard = _Shard(0, 2)
    host = next(f"host-{i}" for i in range(100) if shard.owns(f"host-{i}"))
    mine = next(f"proj-{i}" for i in range(100) if shard.owns(f"proj-{i}"))
    others = [f"proj-{i}" for i in range(100) if not shard.owns(f"proj-{i}")][:3]

    def event(t: float, project: str, step: int | None = None, loss: float | None = None) -> RunEvent:
        return RunEvent(ts=at(t), run_id=f"run-{project}", status="running", resource_ids=[host], gpu_count=8,
                        project=project, tags={"team": "nlp", "project": project},
                        metrics={"val_loss": loss} if loss is not None else {}, step=step)  # fmt: skip

    recs: list[tuple[str, str, Any]] = [("resource-usage", host, usage(T0 + 60 * m, host)) for m in range(5)]
    recs += [("run-events", mine, event(T0 + 600 * k, mine, step=k, loss=2.0 if k == 1 else 1.0)) for k in range(1, 13)]
    recs += [("run-events", p, event(T0 + h * 3600.0, p)) for h in range(1, 73) for p in others]
    path = write(tmp_path / "quiet_run.jsonl", recs)
    one = backtest(path, ruleset)
    assert [(a.type, a.status, a.details.get("reason")) for a in one.alerts] == [("plateaued_run", "resolved", SILENT)]
    for jobs in (2, 3):
        assert listed(backtest(path, ruleset, jobs=jobs).alerts) == listed(one.alerts)
