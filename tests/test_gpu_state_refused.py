"""A GPU rule's saved state whose parts do not line up is refused (the engine then starts the rule
afresh), not read so that one unit's or GPU's time is taken for another's, nor kept to raise on
every scrape after (as tests/test_inference_overprovisioned.py asks of its windows)."""

from __future__ import annotations

import msgspec
import pytest

from detector.detectors.data_starved_training import DataStarvedTrainingState
from detector.detectors.gpu_share_state import GpuShareState
from detector.floats import dec_hook
from tests.test_partly_idle_gpu import kubernetes_host_with_mig, run


@pytest.fixture(scope="module")
def saved() -> dict:
    """partly-idle-gpu's state of a Kubernetes host with MIG, its allocation times known (4 GPUs, 5 units)."""
    from detector.rules import load_rules
    from tests.conftest import ROOT

    engine, _ = run(load_rules(ROOT / "rules"), kubernetes_host_with_mig())
    state = msgspec.msgpack.decode(engine.snapshot("host-1"))["rules"]["partly-idle-gpu"]
    m, n = len(state["gpu_ids"]), len(state["unit_keys"])
    assert len(state["gpu_times"]) == 4 * m + 2 * n  # the GPUs' four, the units' latest, their allocation times
    return state


def decode(state: dict) -> GpuShareState:
    return msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=GpuShareState, dec_hook=dec_hook)


def test_the_saved_state_itself_is_read(saved):
    assert decode(saved).unit_keys == tuple(saved["unit_keys"])


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s["gpu_times"].pop(),  # an allocation time short: the others read as if in place
        lambda s: s["gpu_times"].append(1.0),  # a time too many
        lambda s: s.update(gpu_times=s["gpu_times"][: -len(s["unit_keys"]) - 1]),  # a unit's latest short
        lambda s: s.update(gpu_counted=s["gpu_counted"][:-1]),  # a GPU's flag short: counted() raises
        lambda s: s.update(gpu_counted=b"\x02" * len(s["gpu_ids"])),  # not a flag: counted and not listed
        lambda s: s.update(unit_codes=s["unit_codes"][:-1]),  # a unit's code short
        lambda s: s.update(unit_gpus=s["unit_gpus"][:-1]),  # a unit's GPU short
    ],
    ids=["alloc-short", "time-extra", "seen-short", "flags-short", "flag-2", "codes-short", "unit-gpus-short"],
)
def test_a_gpu_share_state_whose_columns_do_not_line_up_is_refused(saved, change):
    state = msgspec.msgpack.decode(msgspec.msgpack.encode(saved))
    change(state)
    with pytest.raises(msgspec.ValidationError):
        decode(state)


@pytest.mark.parametrize(
    "saved_dst",
    [
        {"gpus": list(range(65))},  # past MAX_GPUS: every scrape after raised IndexError (_FIRST[65])
        {"gpus": [0, 1, 1]},  # a GPU twice: counted twice in gpu_count, a place that no sample sets
    ],
    ids=["65-gpus", "duplicate"],
)
def test_a_data_starved_state_whose_gpus_are_not_places_is_refused(saved_dst):
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(msgspec.msgpack.encode(saved_dst), type=DataStarvedTrainingState, dec_hook=dec_hook)


def test_a_gpu_share_state_saved_before_any_gpu_was_tracked_restores():
    """The code before saved ``gpu_counted: None`` (its default, written out) in every state that
    tracked no GPU yet: ``unallocated_gpu``'s on every host off Kubernetes, either rule's on a host
    stopped before its first sample. Such a state restores as it was, not refused (the engine would
    start the rule afresh, its stop and clock forgotten)."""
    from detector.floats import enc_hook

    saved = msgspec.msgpack.decode(msgspec.msgpack.encode(GpuShareState(stopped_at=5.0, covered_until=5.0),
                                                          enc_hook=enc_hook))  # fmt: skip
    restored = decode({**saved, "gpu_counted": None})
    assert (restored.stopped_at, restored.covered_until, restored.counted()) == (5.0, 5.0, [])
