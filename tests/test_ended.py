"""A project's ended runs (:class:`detector.detectors.ended.Ended`): the dict it replaced, in less memory."""

from __future__ import annotations

import random
import sys

import msgspec
import pytest

from detector.detectors.ended import SMALL, Ended, digest
from detector.engine import Engine
from detector.events import RunEvent
from detector.floats import dec_hook, enc_hook
from tests.helpers import MIN, T0, at, usage

HOUR = 3600.0
RULES = ("failed-run-spend", "plateaued-run", "spot-eligible")


@pytest.mark.parametrize("seed", range(6))
def test_ended_answers_as_the_dict_it_replaces(seed):
    """Random ends, re-uses and prunes, across the size where it holds a dict: every answer, the
    order and what is saved are the dict's."""
    rng = random.Random(seed)
    ids = [f"run-{i}" for i in range(3 * SMALL)]
    model: dict[str, float] = {}
    ended = Ended()
    t = 0.0
    for _ in range(2000):
        t += rng.choice((0.0, 1.0, 7.5))
        op = rng.random()
        run_id = rng.choice(ids)
        if op < 0.6:
            model[run_id] = t
            ended.add(run_id, t)
        elif op < 0.75:
            model.pop(run_id, None)
            ended.discard(run_id)
        elif op < 0.8:
            horizon, newest = t - rng.choice((10.0, 100.0, 1000.0)), rng.choice((None, 0, 5, SMALL + 3))
            kept = [(k, v) for k, v in model.items() if v >= horizon]
            model = dict(kept if newest is None else kept[-newest:] if newest else [])
            ended.keep_since(horizon, newest=newest)
        probe = rng.choice(ids)
        assert ended.get(probe) == model.get(probe) and (probe in ended) == (probe in model)
        assert len(ended) == len(model) and ended.items() == [(digest(k), v) for k, v in model.items()]
    saved = msgspec.msgpack.encode(ended, enc_hook=enc_hook)
    assert msgspec.msgpack.decode(saved, type=Ended, dec_hook=dec_hook) == ended
    assert len(saved) <= 27 * len(model) + 3  # a 17-character key and a double a run
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(model), type=Ended, dec_hook=dec_hook) == ended  # saved before


def test_ended_holds_a_run_in_16_bytes_not_its_id():
    """Under SMALL runs: two arrays' 8 bytes each, not a dict's slot, a float object and the id string."""
    runs = {f"train-llm-sweep-{i:04d}-2026-12-05": T0 + i * 60.0 for i in range(SMALL)}
    ended = Ended(runs)
    held = sys.getsizeof(ended) + sys.getsizeof(ended._keys) + sys.getsizeof(ended._times)
    as_dict = sys.getsizeof(runs) + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in runs.items())
    assert held < 20 * SMALL + 300 and held < as_dict / 5
    none = Ended()  # none ended: two shared empty arrays, in less than an empty dict
    assert none._keys is Ended()._keys and none._times is Ended()._times and sys.getsizeof(none) < sys.getsizeof({})


def test_a_digest_is_the_same_in_every_process_and_every_version():
    """A snapshot saved by one worker is read by another, and by the next version: the digest is not
    ``hash()``'s (salted per process) and never changes (BLAKE2b-64 of the id's UTF-8, little-endian)."""
    assert digest("r1") == 0x30BD695B0C8ADD83 and digest("train-llm-7b") == 0x346145C26F122A51
    assert digest("\ud800") != digest("?")  # a lone surrogate is an id too, not an error


def test_what_is_saved_reads_in_the_code_before_as_runs_no_id_has():
    """Saved as a map of strings to end times, the shape the code before reads: a rollback keeps the run
    rules' other state. An id saved before that looks like a saved digest is read as one."""
    ended = Ended({"r1": 10.0, "r2": 20.0})
    saved = ended.saved()
    assert saved == {"#30bd695b0c8add83": 10.0, f"#{digest('r2'):016x}": 20.0}
    assert all(isinstance(k, str) and isinstance(v, float) for k, v in saved.items())
    mixed = Ended.read_saved({"r1": 10.0, "#00000000000000ff": 30.0, "#notadigest": 40.0})
    assert mixed.items() == [(digest("r1"), 10.0), (0xFF, 30.0), (digest("#notadigest"), 40.0)]


def test_a_saved_map_that_is_not_run_ids_to_times_is_refused():
    for bad in ({"r1": "late"}, {"r1": True}, [["r1", 1.0]], {1: 2.0}, {"r1": float("nan")}, {"#00000000000000ff": float("inf")},
                {"k": bytes(8), "t": bytes(8)}):  # fmt: skip
        with pytest.raises(msgspec.ValidationError):
            msgspec.msgpack.decode(msgspec.msgpack.encode(bad), type=Ended, dec_hook=dec_hook)


def test_a_time_that_is_not_finite_is_refused_as_its_restore_would_refuse_it():
    """Held, a NaN end time would be saved and then make the rule's whole state unreadable at its restore."""
    ended = Ended({"r1": 10.0})
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match="not a time"):
            ended.add("r2", bad)
    assert ended.items() == [(digest("r1"), 10.0)]
    assert Ended.read_saved(ended.saved()).items() == ended.items()


def run(t: float, run_id: str, status: str, project: str = "llm") -> RunEvent:
    return RunEvent(ts=at(t), run_id=run_id, status=status, resource_ids=["host-1"], gpu_count=8, project=project,
                    metrics={"val_loss": 1.0}, step=int(t - T0),
                    tags={"team": "nlp", "owner": "alice", "checkpoint": "s3://ckpt/llm"})  # fmt: skip


def day_of_runs() -> list:
    """A host billed for a day and a project's runs on it: failures (a crash loop), successes, a run id
    used again, and the end events of all sent twice (a re-read after a restart)."""
    runs = []
    for i in range(40):
        start, status = T0 + i * 30 * MIN, ("failed" if i % 3 == 0 else "succeeded")
        runs += [run(start, f"r{i % 33}", "started"), run(start + 25 * MIN, f"r{i % 33}", status)]
        runs.append(run(start + 26 * MIN, f"r{i % 33}", status))  # re-read: changes nothing
    runs += [run(T0 + HOUR, "long", "started"), run(T0 + 6 * HOUR, "long", "succeeded")]  # spot_eligible's
    billed = [usage(T0 + i * MIN, "host-1", usd_per_hour=32.0) for i in range(24 * 60)]
    return sorted(billed + runs, key=lambda e: e.ts)


def test_a_snapshot_of_the_dict_shape_restores_to_the_same_findings(ruleset):
    """What was saved up to 4c0bdb7 (``ended`` a map of run id to end time) restores into Ended, and the
    run rules then find what an uninterrupted run finds; a snapshot saved now (the digests and times)
    restores byte for byte."""
    events = day_of_runs()
    whole = Engine(ruleset).process(events)
    assert {f.type for f in whole} >= {"failed_run_spend", "spot_eligible"}
    half = len(events) // 2
    first = Engine(ruleset)
    before = first.process(events[:half])
    saved = first.snapshot("llm")
    assert saved is not None
    ids = {digest(e.run_id): e.run_id for e in events if isinstance(e, RunEvent)}
    raw = msgspec.msgpack.decode(saved)
    for name in RULES:  # the shape saved before: a plain map of id to time, in the order the runs ended
        ended = msgspec.msgpack.decode(msgspec.msgpack.encode(raw["rules"][name]["ended"]), type=Ended, dec_hook=dec_hook)
        assert len(ended) > 0
        raw["rules"][name]["ended"] = {ids[k]: t for k, t in ended.items()}
    old_shape = msgspec.msgpack.encode(raw)
    for snapshot in (saved, old_shape):
        second = Engine(ruleset)
        for key in first._keys:
            state = second.restore(key, old_shape if key == "llm" and snapshot is old_shape else first.snapshot(key))
            if key == "llm":
                assert all(isinstance(state.rule(name).ended, Ended) for name in RULES)
                assert second.snapshot(key) == saved
        after = second.process(events[half:])
        assert msgspec.json.encode(before + after) == msgspec.json.encode(whole)
