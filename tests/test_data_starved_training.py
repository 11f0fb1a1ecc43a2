"""The data_starved_training detector on crafted GPU scrapes and host gauges, fed to the engine."""

from __future__ import annotations

import random

import pytest

from detector.engine import Engine
from detector.events import GpuMetric, UsageEvent
from tests.helpers import MIN, T0, at, scrape

HOUR = 3600.0
PRICE = 32.0  # p4d.24xlarge, 8 GPUs


def host_usage(t: float, gauges: dict | None = None, state: str = "running", rid: str = "host-1") -> UsageEvent:
    return UsageEvent(ts=at(t), resource_id=rid, resource_type="gpu_instance", instance_type="p4d.24xlarge",
                      account="acct", region="us-east-1", state=state, interval_s=60.0,
                      cost_usd=PRICE / 60 if state == "running" else 0.0, metrics=gauges or {},
                      tags={"team": "nlp", "owner": "alice", "project": "llm"})  # fmt: skip


def job(start: float, end: float, util, gauges: dict | None = None, gpus: int = 8, seed: int = 1) -> list:
    """Scrapes every 30 s in [start, end) with ``util(rng, i)`` per scrape (a list per GPU or one
    value for all), a usage event a minute carrying ``gauges``."""
    rng = random.Random(seed)
    events: list = []
    t, i = start, 0
    while t < end:
        if (t - start) % MIN == 0:
            events.append(host_usage(t, gauges))
        value = util(rng, i)
        events.extend(scrape(t, value if isinstance(value, list) else [value] * gpus))
        t, i = t + 30.0, i + 1
    return events


def sawtooth(rng: random.Random, i: int) -> float:
    """Data-parallel ranks waiting on their loaders together: a burst every third scrape."""
    return rng.uniform(80, 100) if i % 3 == 0 else rng.uniform(0, 5)


def findings(events, late: tuple = (), at_end: bool = False) -> list:
    """The detector's findings over ``events`` in time order, then ``late`` ones; with ``at_end``,
    the open episodes at the end of the data too."""
    from detector.rules import load_rules
    from tests.conftest import ROOT

    engine = Engine(load_rules(ROOT / "rules"))
    found = engine.process(sorted(events, key=lambda e: e.ts) + list(late))
    if at_end:
        found += engine.open_episodes()
    return [f for f in found if f.type == "data_starved_training"]


def test_a_sawtooth_job_fires_after_30_minutes_with_the_unused_share():
    found = findings(job(T0, T0 + 2 * HOUR, sawtooth), at_end=True)
    fire = found[0]
    assert fire.action == "fire" and fire.episode_start == T0 and fire.fired_at == T0 + 30 * MIN
    assert fire.details["evidence"] == "sawtooth" and fire.details["job_gpus"] == 8
    # A third of the scrapes at ~90 %, two thirds at ~2.5 %: about 31.7 % used, 68.3 % of $32/h wasted.
    assert fire.details["used_pct"] == pytest.approx(31.7, abs=2)
    assert fire.usd_per_hour == pytest.approx(PRICE * 0.683, rel=0.05)
    final = found[-1]  # as of the last window judged: the data's last 5 minutes are not yet one
    assert final.at == T0 + 2 * HOUR - 5 * MIN
    assert final.waste_usd == pytest.approx((2 * HOUR - 5 * MIN) / HOUR * PRICE * 0.683, rel=0.05)


def test_low_utilisation_on_a_saturated_host_fires_and_names_the_gauge():
    found = findings(job(T0, T0 + HOUR, lambda rng, i: rng.uniform(30, 40), {"cpu_util_pct": 97.0}))
    fire = found[0]
    assert fire.action == "fire" and fire.details["evidence"] == "host_saturated"
    assert fire.details["host_gauge"] == "cpu_util_pct" and fire.details["host_pct"] == 97.0
    assert fire.usd_per_hour == pytest.approx(PRICE * 0.65, rel=0.03)


def test_a_starved_single_gpu_job_pays_for_its_gpu_only():
    # One GPU of eight bursts and waits; the other seven idle (partly_idle_gpu's, not priced here).
    found = findings(job(T0, T0 + HOUR, lambda rng, i: [sawtooth(rng, i)] + [0.0] * 7))
    assert found[0].details["job_gpus"] == 1
    assert found[0].usd_per_hour == pytest.approx(PRICE / 8 * 0.683, rel=0.05)


@pytest.mark.parametrize(
    "events",
    [
        # a healthy job: GPUs fed at 70-100 % while the CPU works hard
        job(T0, T0 + 2 * HOUR, lambda rng, i: rng.uniform(70, 100), {"cpu_util_pct": 95.0}),
        # a genuinely small job: steadily low GPUs, a quiet host
        job(T0, T0 + 2 * HOUR, lambda rng, i: rng.uniform(15, 35), {"cpu_util_pct": 30.0, "disk_busy_pct": 20.0}),
        # an idle host with no run, whatever its CPU does (idle_gpu's)
        job(T0, T0 + 2 * HOUR, lambda rng, i: rng.uniform(0, 2), {"cpu_util_pct": 99.0}),
        # a job hung in a collective: 100 % resident all along (stuck_gpu's)
        job(T0, T0 + 2 * HOUR, lambda rng, i: 100.0, {"cpu_util_pct": 99.0}),
        # epochs with a 4-minute dip every 40 minutes: one edge per window at most
        job(T0, T0 + 3 * HOUR, lambda rng, i: rng.uniform(0, 3) if i % 80 < 8 else rng.uniform(75, 100)),
        # a sawtooth for 25 minutes only, then fed
        job(T0, T0 + 25 * MIN, sawtooth) + job(T0 + 25 * MIN, T0 + 2 * HOUR, lambda rng, i: 90.0),
        # one GPU busy beside seven idle ones: a flat line (partly_idle_gpu's)
        job(T0, T0 + 2 * HOUR, lambda rng, i: [90.0] + [0.0] * 7),
        # a saturated gauge beyond any percentage (hostile input) and low GPUs: read as nothing
        job(T0, T0 + 2 * HOUR, lambda rng, i: 30.0, {"cpu_util_pct": 1e300}),
        # an evaluation (or checkpoint) every 5 minutes taking 2: one dip per window, never two, though the mean is 54 %
        job(T0, T0 + 2 * HOUR, lambda rng, i: 0.0 if i % 10 >= 6 else 90.0),
        # GPUs all but idle (3 %, one 12 % scrape a window) on a pegged host: under wait_below is idle_gpu's, not starved
        job(T0, T0 + 2 * HOUR, lambda rng, i: 12.0 if i % 10 == 0 else 3.0, {"cpu_util_pct": 99.0}),
        # a CPU figure summed over cores as top prints it (250 % = 2.5 cores of 96: a quiet host), not a share
        job(T0, T0 + 2 * HOUR, lambda rng, i: 30.0, {"cpu_util_pct": 250.0}),
    ],
    ids=["healthy", "small-job", "idle", "hung", "epoch-dips", "short", "single-gpu-flat", "absurd-gauge",
         "eval-every-window", "near-idle-pegged-host", "per-core-sum"],
)
def test_no_alert(events):
    assert findings(events) == []


def test_a_job_whose_exporter_reports_two_of_eight_gpus_pays_a_quarter_of_the_host():
    # A container's dcgm-exporter sees only its own two GPUs; the host (p4d, 8 GPUs) is priced over all eight.
    found = findings(job(T0, T0 + HOUR, sawtooth, gpus=2))
    assert found[0].details["job_gpus"] == 2 and found[0].details["gpu_count"] == 8
    assert found[0].usd_per_hour == pytest.approx(PRICE * 2 / 8 * 0.683, rel=0.05)


def test_a_telemetry_gap_restarts_the_count():
    # 20 minutes starved, 10 minutes without samples, 20 minutes starved: never 30 in a row.
    events = job(T0, T0 + 20 * MIN, sawtooth) + job(T0 + 30 * MIN, T0 + 50 * MIN, sawtooth, seed=2)
    assert findings(events) == []


def test_fed_gpus_resolve_and_a_stop_resolves():
    found = findings(job(T0, T0 + HOUR, sawtooth) + job(T0 + HOUR, T0 + 2 * HOUR, lambda rng, i: 90.0))
    assert found[0].action == "fire" and found[-1].action == "resolve"
    assert found[-1].details["reason"] == "gpus_fed" and found[-1].at == T0 + HOUR  # when the fed window began
    assert found[-1].waste_usd == pytest.approx(PRICE * 0.683, rel=0.05)
    stopped = findings(job(T0, T0 + HOUR, sawtooth) + [host_usage(T0 + HOUR, state="stopped")])
    assert stopped[-1].action == "resolve" and stopped[-1].details["reason"] == "instance_stopped"



def test_a_stop_from_before_the_episode_began_sent_again_leaves_it_open():
    """Stopped at 5:00, running again from 6:00 and starved for an hour: one alert, open. The stop sent
    again (an exporter's retry) and read at the end came before the episode began: it does not end it
    (it did, ``instance_stopped``; the GPU rules already left such a stop alone)."""
    events = [host_usage(T0 + m * MIN, state="stopped" if m == 5 else "running") for m in range(6)]
    events += job(T0 + 6 * MIN, T0 + 66 * MIN, sawtooth)
    once = findings(events)
    assert [f.action for f in once if f.action != "update"] == ["fire"]
    again = findings(events, late=(host_usage(T0 + 5 * MIN, state="stopped"),))
    assert [(f.action, f.waste_usd) for f in again] == [(f.action, f.waste_usd) for f in once]


def test_re_read_and_late_samples_change_nothing():
    events = job(T0, T0 + HOUR, sawtooth)
    once = findings(events)
    samples = [e for e in events if isinstance(e, GpuMetric)]
    # every seventh sample read twice in place, then a re-read batch and a late sample after the rest
    late = (*samples[:40], GpuMetric(ts=at(T0 + 5), resource_id="host-1", gpu_index=0, util_pct=100.0))
    again = findings(events + samples[::7], late=late)
    assert [(f.action, f.waste_usd) for f in again] == [(f.action, f.waste_usd) for f in once]


def test_state_stays_small():
    import msgspec

    from detector.detectors.base import Context, ResourceInfo
    from detector.detectors.data_starved_training import DataStarvedTraining

    det = DataStarvedTraining("r", "warning", DataStarvedTraining.Params())
    st = det.new_state()
    ctx = Context(ResourceInfo(resource_id="host-1", state="running", usd_per_hour=PRICE, gpus=8))
    for e in job(T0, T0 + 3 * HOUR, sawtooth):
        det.step(st, ctx, e, e.t)
    assert len(msgspec.json.encode(st, enc_hook=list)) < 800  # one window's per-GPU sums, no history


def test_a_gpu_index_past_63_leaves_the_state_saveable():
    """GPU indexes go to 255 on the wire, and a snapshot saves an int in 64 bits: a window's GPUs are bits
    by place (the order first seen), not by index, so a host sending indexes 0..79 (judged on the first 64)
    saves and restores after every batch; with bits by index its state could not be saved (the worker's
    commit of the batch failed)."""
    import msgspec

    from detector.detectors.data_starved_training import DataStarvedTrainingState
    from detector.floats import dec_hook, enc_hook
    from detector.rules import load_rules
    from detector.saved import read_state
    from tests.conftest import ROOT

    events = job(T0, T0 + 20 * MIN, sawtooth, gpus=80)
    engine = Engine(load_rules(ROOT / "rules"))
    engine.process(events)
    restarted = Engine(load_rules(ROOT / "rules"))
    state = restarted.restore("host-1", engine.snapshot("host-1")).rule("data-starved-training")
    assert state.gpus == tuple(range(64)) and state.worked == (1 << 64) - 1
    found = [f for f in restarted.process(job(T0 + 20 * MIN, T0 + 40 * MIN, sawtooth, gpus=80))
             if f.type == "data_starved_training"]  # fmt: skip
    assert [f.action for f in found] == ["fire"] and found[0].details["job_gpus"] == 64
    # A state saved before (bits by index, GPUs 1 and 3 seen, 3 worked) reads into places.
    old = msgspec.msgpack.encode({"seen": 0b1010, "worked": 0b1000, "scrape_mask": 0b10, "sums": [0.0, 5.0, 0.0, 9.0]})
    before = read_state(old, DataStarvedTrainingState)
    assert (before.gpus, before.worked, before.scrape_mask) == ((1, 3), 0b10, 0b01)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(before, enc_hook=enc_hook), type=DataStarvedTrainingState,
                                  dec_hook=dec_hook) == before  # fmt: skip


def test_hosts_share_the_float_of_a_whole_busiest_percent():
    """The current scrape's busiest GPU is kept until the next scrape: a whole percent (DCGM's and NVML's)
    is the one float of its value every host holds, not an object each; any other value (a fraction,
    -0.0) is kept as it came."""
    import math

    from detector.detectors.base import Context, ResourceInfo
    from detector.detectors.data_starved_training import DataStarvedTraining
    from detector.detectors.scrape import Scrape
    from detector.floats import shared_whole

    det = DataStarvedTraining("r", "warning", DataStarvedTraining.Params())
    ctx = Context(ResourceInfo(resource_id="host-1", state="running", usd_per_hour=PRICE, gpus=8))
    kept = []
    for utils in ([3.0, 97.0], [12.0, 97.0], [3.0, 42.5]):
        st = det.new_state()
        events = scrape(T0, [float(str(u)) for u in utils])  # the percents as new float objects, as decoded
        det.step_scrape(st, ctx, Scrape(events), T0)
        assert st.scrape_max == max(utils)
        kept.append(st.scrape_max)
    assert kept[0] is kept[1]  # 97.0: one object for two hosts
    assert kept[2] == 42.5
    assert math.copysign(1.0, shared_whole(-0.0)) == -1.0 and shared_whole(0.0) == 0.0
    assert shared_whole(255.0) is shared_whole(float("255")) and shared_whole(256.0) == 256.0


def test_one_fed_window_inside_an_episode_neither_splits_it_nor_counts():
    # 40 minutes starved, one 5-minute window fed (a lost burst looks like this), 40 more starved.
    events = (job(T0, T0 + 40 * MIN, sawtooth) + job(T0 + 40 * MIN, T0 + 45 * MIN, lambda rng, i: 90.0)
              + job(T0 + 45 * MIN, T0 + 85 * MIN, sawtooth, seed=2) + job(T0 + 85 * MIN, T0 + 2 * HOUR, lambda rng, i: 90.0))
    found = findings(events)
    assert [f.action for f in found if f.action != "update"] == ["fire", "resolve"]
    assert found[-1].at == T0 + 85 * MIN
    assert found[-1].waste_usd == pytest.approx(80 / 60 * PRICE * 0.683, rel=0.05)  # the fed 5 minutes left out


def test_clock_jitter_of_a_scrape_loses_no_time():
    # Each scrape's stamp off by up to 2 s: a window's first sample may come 28 s after its start.
    events = job(T0, T0 + HOUR, sawtooth) + job(T0 + HOUR, T0 + 2 * HOUR, lambda rng, i: 90.0)
    rng = random.Random(5)
    shift: dict = {}
    jittered = []
    for e in events:
        if isinstance(e, GpuMetric):
            d = shift.setdefault(e.ts, rng.uniform(-2, 2))
            e = GpuMetric(ts=at(e.t + d), resource_id=e.resource_id, gpu_index=e.gpu_index, util_pct=e.util_pct)
        jittered.append(e)
    found = findings(jittered)
    assert found[-1].action == "resolve" and found[-1].waste_usd == pytest.approx(PRICE * 0.683, rel=0.05)


def test_mig_and_profiling_only_samples_are_read_by_gr_engine_active():
    # Under MIG util_pct reads 0 and GR_ENGINE_ACTIVE carries the activity; GPU index 255 is valid.
    events = []
    for e in [e for e in job(T0, T0 + HOUR, sawtooth) if isinstance(e, GpuMetric)]:
        events.append(GpuMetric(ts=e.ts, resource_id="host-1", gpu_index=255 if e.gpu_index == 7 else e.gpu_index,
                                util_pct=0.0, gr_engine_active=e.util_pct / 100, mig_profile="1g.10gb"))  # fmt: skip
    events += [host_usage(T0 + i * MIN) for i in range(60)]
    fire = findings(events)[0]
    assert fire.action == "fire" and fire.details["job_gpus"] == 8 and fire.details["gpu_count"] == 8
    assert fire.usd_per_hour == pytest.approx(PRICE * 0.683, rel=0.05)  # 8 GPUs of the instance type's 8


def test_a_state_saved_in_the_shape_before_restores_mid_episode_and_goes_on_the_same():
    """The episode's figures and the saturated gauge are parts made when needed now (thirteen fields
    fewer on a host whose job is fed): a state the code before saved (every figure inline) restores,
    mid-episode on a saturated host, equal to the state never saved, and both go on to the same
    findings; what an episode that ended left behind is dropped, and a fed host holds no episode."""
    import msgspec

    from detector.detectors.data_starved_training import DataStarvedTrainingState
    from detector.floats import enc_hook
    from detector.rules import load_rules
    from detector.saved import read_state
    from tests.conftest import ROOT

    def shape_before(st: DataStarvedTrainingState) -> dict:
        new = msgspec.msgpack.decode(msgspec.msgpack.encode(st, enc_hook=enc_hook))
        ep = new.pop("episode", None) or {"since": None, "fired_at": None, "last_report": 0.0}
        sat = new.pop("saturated", None) or {}
        return {**new, **ep, **{"sat_until": sat["until"], "gauge": sat["gauge"], "gauge_pct": sat["pct"]}}

    starved = job(T0, T0 + 45 * MIN, lambda rng, i: 30.0, gauges={"cpu_util_pct": 97.0})
    rest = job(T0 + 45 * MIN, T0 + 2 * HOUR, lambda rng, i: 30.0, gauges={"cpu_util_pct": 97.0})
    rest += job(T0 + 2 * HOUR, T0 + 3 * HOUR, lambda rng, i: 90.0)
    engine = Engine(load_rules(ROOT / "rules"))
    fired = [f for f in engine.process(starved) if f.type == "data_starved_training"]
    st = engine._keys["host-1"].rule("data-starved-training")
    assert [f.action for f in fired] == ["fire"] and st.episode is not None and st.saturated is not None
    restored = read_state(msgspec.msgpack.encode(shape_before(st)), DataStarvedTrainingState)
    assert restored == st
    snapshot = msgspec.msgpack.decode(engine.snapshot("host-1"))
    snapshot["rules"]["data-starved-training"] = shape_before(st)
    again = Engine(load_rules(ROOT / "rules"), loader={"host-1": msgspec.msgpack.encode(snapshot)}.get)
    then = [(f.action, f.at, f.waste_usd, f.details) for f in engine.process(rest) if f.type == "data_starved_training"]
    now = [(f.action, f.at, f.waste_usd, f.details) for f in again.process(rest) if f.type == "data_starved_training"]
    assert now == then and [a for a, *_ in then][-1] == "resolve" and then[0][3]["host_gauge"] == "cpu_util_pct"
    assert engine._keys["host-1"].rule("data-starved-training").episode is None
    ended = {**shape_before(st), "since": None, "fired_at": None}
    assert read_state(msgspec.msgpack.encode(ended), DataStarvedTrainingState).episode is None
