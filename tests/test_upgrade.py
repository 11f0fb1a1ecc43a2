"""A store written by another release (an upgrade, a rollback, a rolling deploy mixing two): what this
release finds there is read, or set aside with a log line that says so, never a worker that exits on
every start. The old releases themselves run in ``bench/upgrade.py`` (CI has one checkout); here the
rows they leave are written directly."""

from __future__ import annotations

import msgspec
from structlog.testing import capture_logs

from detector.engine import Engine
from tests.helpers import MIN, T0, timeline

EVENTS = timeline(T0, T0 + 60 * MIN, [0.0] * 4, rid="host-1")


def fires(engine: Engine, events: list) -> list[tuple[str, str]]:
    return [(f.rule, f.resource_id) for f in engine.process(events) if f.action == "fire"]


def test_a_snapshot_of_a_shape_this_release_cannot_read_starts_the_key_afresh_and_says_so(ruleset):
    """A snapshot whose resource info is of another shape (a tag map saved as a list: a release that
    changed it). Restoring it raised out of the batch, and the worker exited 70 on every start (seen:
    such a row in ``detector_state`` of a store, two starts, two exits with ``pipeline_error``)."""
    foreign = msgspec.msgpack.encode({"v": 2, "info": {"resource_id": "host-1", "tags": ["a later shape"]},
                                      "rules": {}, "last_t": T0})  # fmt: skip
    engine = Engine(ruleset, loader={"host-1": foreign}.get)
    with capture_logs() as logs:
        fired = fires(engine, EVENTS)
    assert fired == fires(Engine(ruleset), EVENTS)  # as a key never seen
    assert engine.unreadable == {"": 1}
    [line] = [entry for entry in logs if entry["event"] == "saved_state_unreadable"]
    assert line["key"] == "host-1" and line["rule"] is None and "info.tags" in line["error"]


def test_a_rule_state_of_a_shape_this_release_cannot_read_is_started_afresh_with_one_line(ruleset):
    """A rule's state another release saved in a shape this one refuses: that rule starts afresh
    (it did so silently: an upgrade that lost every open episode of a rule said nothing), once logged
    for however many keys."""
    first = Engine(ruleset)
    first.process(EVENTS[: len(EVENTS) // 2] + timeline(T0, T0 + 30 * MIN, [0.0] * 4, rid="host-2"))
    saved = {}
    for key in ("host-1", "host-2"):
        snap = msgspec.msgpack.decode(first.snapshot(key))
        snap["rules"]["idle-gpu"] = ["a", "shape", "of", "another", "release"]
        saved[key] = msgspec.msgpack.encode(snap)
    engine = Engine(ruleset, loader=saved.get)
    with capture_logs() as logs:
        engine.process(EVENTS[len(EVENTS) // 2 :] + timeline(T0 + 30 * MIN, T0 + 60 * MIN, [0.0] * 4, rid="host-2"))
    assert engine.unreadable == {"idle-gpu": 2}
    [line] = [entry for entry in logs if entry["event"] == "saved_state_unreadable"]
    assert line["rule"] == "idle-gpu" and line["key"] in saved
    assert engine.restore("host-3", first.snapshot("host-1")).names  # a readable one is still read whole


def test_a_store_a_later_release_migrated_is_said_to_be_ahead(store):
    """A rollback: a later release recorded a migration this one does not know. Its worker and read-only
    commands run on (migrations only add, and a rollback must run), but say so, naming it: the releases
    before said nothing, and ran beside the later one's tables as if they were not there."""
    store.insert("schema_migrations", [[9999, "a_later_release", "0" * 16]], column_names=["version", "name", "checksum"])
    with capture_logs() as logs:
        assert store.migrate() == []
        store.schema.check()
    ahead = [entry for entry in logs if entry["event"] == "store_ahead_of_release"]
    assert len(ahead) == 1 and ahead[0]["unknown_migrations"] == ["9999_a_later_release"]  # (said once, not at each)
    with capture_logs() as logs:
        store.command(f"TRUNCATE TABLE {store.db}.schema_migrations")
        store.migrate()
        store.schema.check()
    assert not [entry for entry in logs if entry["event"] == "store_ahead_of_release"]  # one of its own: nothing said


def test_a_worker_held_back_by_one_of_a_release_that_records_no_progress_says_so(store, monkeypatch):
    """A rolling upgrade from a release before partition progress (2026-12-02's): the new worker that holds
    run events waits for the usage partitions the old one holds to be stored through their time, and the
    old one records none, so the new one releases nothing until the old one leaves (bench/upgrade.py
    --scenario rolling: 41 s held, 9,825 events). Its warning said a dead worker held it; it names the
    partitions no holder has recorded anything of, and why that may be."""
    from streams.progress import GroupProgress

    group = GroupProgress(store.progress, lambda topic: 2, lateness_s=60.0)
    group.assign([("resource-usage", 0), ("gpu-metrics", 0), ("run-events", 0)])
    clock = [1000.0]
    monkeypatch.setattr("streams.progress.time.monotonic", lambda: clock[0])
    with capture_logs() as logs:
        for _ in range(3):
            group.update(group.read(generation=5), watermark=T0)
            clock[0] += 20.0
    [line] = [entry for entry in logs if entry["event"] == "release_held_by_other_workers"]
    assert group.cap == float("-inf") and line["unrecorded_since_rebalance"] == [1]
    assert "release before 2026-12-04" in line["note"]
    # A new worker held the partition in an earlier generation and left its row; an old one holds it now.
    store.progress.record("resource-usage", [(1, T0 - 900, False)], version=1, generation=4)
    group.update(group.read(generation=5), watermark=T0)
    assert group.unrecorded == [1] and group.cap == T0 - 960
    store.progress.record("resource-usage", [(1, T0 - 600, False)], version=2, generation=5)  # a holder that records
    group.update(group.read(generation=5), watermark=T0)
    assert group.unrecorded == [] and group.cap == T0 - 660
