"""GPUs no pod requested: a waste type of its own, apart from held-and-idle and from a wholly idle host."""

from __future__ import annotations

import pytest

from detector.alerts import from_finding
from detector.engine import Engine
from detector.events import GpuMetric
from tests.helpers import MIN, T0, at, usage
from tests.test_partly_idle_gpu import PRICE, _read, gpu, host

POD = {"namespace": "ml", "pod": "train-abc", "workload": "Job/train", "tags": {"team": "nlp", "owner": "alice"}}
GPU_TYPES = ("idle_gpu", "partly_idle_gpu", "unallocated_gpu")


def held(index: int, util: float = 95.0) -> dict:
    return gpu(index, util, allocated=True, **POD)


def free(index: int, util: float = 1.0) -> dict:
    return gpu(index, util, allocated=False)


SIX_HELD_TWO_FREE = [held(g) for g in range(6)] + [free(6), free(7)]


def openings(ruleset, events) -> list[tuple[str, float, list[int] | None]]:
    """(type, minutes since T0 it fired, the GPUs it counts) of every GPU alert that fired."""
    found = Engine(ruleset).process(events)
    return [(f.type, (f.fired_at - T0) / MIN, f.details.get("gpus_idle")) for f in found
            if f.action == "fire" and f.type in GPU_TYPES]  # fmt: skip


@pytest.mark.parametrize(
    ("segments", "expected"),
    [
        # six GPUs held and busy, two no pod requested: the two, after 30 m; nothing else
        ([(60, SIX_HELD_TWO_FREE)], [("unallocated_gpu", 30, [6, 7])]),
        # 29 minutes unrequested, then a pod takes them: nothing (a queue's next job)
        ([(29, SIX_HELD_TWO_FREE), (30, [held(g) for g in range(8)])], []),
        # allocation unknown (not Kubernetes): never this rule's; held-and-idle is partly_idle_gpu's
        ([(60, [held(g) for g in range(6)] + [gpu(6), gpu(7)])], [("partly_idle_gpu", 30, [6, 7])]),
        # no pod requested them but something uses them (outside Kubernetes' accounting): not waste
        ([(60, [held(g) for g in range(6)] + [free(6, 90.0), free(7, 90.0)])], []),
        # one held GPU idle beside the unrequested ones: each rule counts its own GPUs, none twice
        (
            [(60, [held(g) for g in range(5)] + [held(5, 1.0), free(6), free(7)])],
            [("partly_idle_gpu", 30, [5]), ("unallocated_gpu", 30, [6, 7])],
        ),
        # an empty node (every GPU unrequested and idle): idle_gpu's whole-host episode, not this rule's
        ([(60, [free(g) for g in range(8)])], [("idle_gpu", 30, None)]),
    ],
    ids=[
        "two-unrequested",
        "requested-again-in-29m",
        "allocation-unknown",
        "unrequested-but-busy",
        "held-idle-and-unrequested",
        "empty-node-is-idle-gpu",
    ],
)
def test_which_rule_counts_which_gpus(ruleset, segments, expected):
    assert openings(ruleset, host(segments)) == expected


def test_priced_as_their_share_and_resolved_when_a_pod_takes_them(ruleset):
    events = host([(60, SIX_HELD_TWO_FREE), (10, [held(g) for g in range(8)])])
    found = [f for f in Engine(ruleset).process(events) if f.type == "unallocated_gpu" and f.action != "update"]
    fire, resolve = found
    assert fire.usd_per_hour == pytest.approx(PRICE * 2 / 8)
    assert resolve.details["reason"] == "allocation_changed" and resolve.at == T0 + 60 * MIN
    assert resolve.waste_usd == pytest.approx(PRICE * 2 / 8, rel=1e-4)  # 60 minutes of two eighths


def test_the_count_starts_when_the_pod_lets_go(ruleset):
    """A held GPU idle 40 m, then released: partly_idle_gpu's until then, unallocated 30 m after the release."""
    events = host([(40, [held(g) for g in range(7)] + [held(7, 1.0)]), (40, [held(g) for g in range(7)] + [free(7)])])
    assert openings(ruleset, events) == [("partly_idle_gpu", 30, [7]), ("unallocated_gpu", 70, [7])]


def test_the_alert_says_unallocated_not_idle(ruleset):
    found = Engine(ruleset).process(host([(40, SIX_HELD_TWO_FREE)]))
    (fire,) = [f for f in found if f.type == "unallocated_gpu"]
    alert = from_finding(fire)
    assert "no pod requested" in alert.suggestion and "autoscaler" in alert.suggestion
    assert ("Unallocated GPUs", "2 of 8 × A100 (GPU 6, 7)") in alert.facts
    alert.details.update(gpus_idle=[*range(3, 256)], gpu_count=256)  # a host of 256: named as its chart names them
    assert ("Unallocated GPUs", "253 of 256 × A100 (GPU 3–255)") in alert.facts
    assert "pods" not in fire.details  # nobody holds them: no pod to name


UNKNOWN_FOR_A_SCRAPE = [held(g) for g in range(6)] + [gpu(6), gpu(7)]
"""dcgm-exporter and kube-state-metrics a scrape apart (a pod starting elsewhere on the node):
the bridge cannot tell who holds the unlabelled GPUs, so it says nothing (allocated None)."""


@pytest.mark.parametrize(
    ("segments", "expected"),
    [
        # a scrape that cannot tell, every 10 minutes: the last known allocation stands
        ([(9.5, SIX_HELD_TWO_FREE), (0.5, UNKNOWN_FOR_A_SCRAPE)] * 6, [("unallocated_gpu", 30, [6, 7])]),
        # unknown for longer than stale_after (5 m): no longer known, the count starts again
        ([(20, SIX_HELD_TWO_FREE), (6, UNKNOWN_FOR_A_SCRAPE), (20, SIX_HELD_TWO_FREE)], []),
    ],
    ids=["one-scrape-unknown", "unknown-past-stale-after"],
)
def test_a_scrape_that_cannot_tell_who_holds_a_gpu_changes_nothing(ruleset, segments, expected):
    assert openings(ruleset, host(segments)) == expected


def test_dollars_run_on_through_a_scrape_that_cannot_tell(ruleset):
    events = host([(9.5, SIX_HELD_TWO_FREE), (0.5, UNKNOWN_FOR_A_SCRAPE)] * 6 + [(10, [held(g) for g in range(8)])])
    (resolve,) = [f for f in Engine(ruleset).process(events) if f.type == "unallocated_gpu" and f.action == "resolve"]
    assert resolve.waste_usd == pytest.approx(PRICE * 2 / 8, rel=1e-3)  # the whole hour, two eighths


@pytest.mark.parametrize("lag_min", [5, 9])
def test_a_whole_idle_spell_across_a_restart_with_every_gpu_held_restarts_at_the_gap_s_end(ruleset, lag_min):
    """Every GPU held and idle, dark 50-53 and stopped 51-52, GPUs 4-7 free from the restart, GPU 0 busy
    from 83.5, the usage topic read minutes behind. In time order the stop ends the host's whole-idle
    spell, the next runs from the restart (53) to 83.5, longer than ``for`` (``idle_gpu``'s), and the free
    GPUs count from its end: fired at 113.5. Live no gap was kept while no GPU of this rule was idle, so
    the spell restarted at the stop's reading, came short of ``for``, and the free GPUs fired from 53 at
    83 (a review's reproduction, red before)."""
    events: list = []
    for k in range(2 * 200):
        m = k / 2
        if not 50 < m < 53:
            events += [GpuMetric(ts=at(T0 + m * MIN), resource_id="host-1", gpu_index=g, model="A100",
                                 util_pct=90.0 if g == 0 and m >= 83.5 else 0.0, allocated=not (g >= 4 and m >= 53))
                       for g in range(8)]  # fmt: skip
    events += [usage(T0 + m * MIN, state="stopped" if 51 <= m < 53 else "running") for m in range(200)]

    def fires(evs: list) -> list[tuple[float, float]]:
        return [((f.episode_start - T0) / MIN, (f.at - T0) / MIN) for f in Engine(ruleset).process(evs)
                if f.type == "unallocated_gpu" and f.action == "fire"]  # fmt: skip

    assert fires(_read(events)) == [(83.5, 113.5)]
    assert fires(_read(events, lag_min)) == fires(_read(events))
