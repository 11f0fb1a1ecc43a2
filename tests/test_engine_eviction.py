"""Keys that go quiet leave memory and come back from the store as they were (issue 16)."""

from __future__ import annotations

from detector.engine import Engine
from tests.helpers import MIN, T0, timeline, usage

HOST = "host-1"


def _fleet() -> list:
    """host-1 is busy, then idle (an idle episode opens), then sends nothing for 40 minutes
    while three other hosts go on, then comes back still idle and finally busy (the
    episode resolves). Time-sorted, as the aligner releases events."""
    events = (
        timeline(T0, T0 + 10 * MIN, [90.0] * 4)
        + timeline(T0 + 10 * MIN, T0 + 50 * MIN, [1.0] * 4)
        + timeline(T0 + 90 * MIN, T0 + 110 * MIN, [1.0] * 4)
        + timeline(T0 + 110 * MIN, T0 + 130 * MIN, [90.0] * 4)
        + [usage(T0 + 130 * MIN, state="stopped")]
    )
    for other in ("host-2", "host-3", "host-4"):
        events += timeline(T0, T0 + 130 * MIN, [70.0, 80.0], rid=other)
    return sorted(events, key=lambda e: e.ts)


def _batches(events: list, span_s: float = 5 * MIN) -> list[list]:
    """The events in batches of ``span_s`` of event time (as a worker's steps take them)."""
    batches: dict[int, list] = {}
    for event in events:
        batches.setdefault(int((event.ts.timestamp() - T0) // span_s), []).append(event)
    return [batches[i] for i in sorted(batches)]


def _after_batch(engine: Engine, store, version: int) -> None:
    """What the worker does after each batch: save what the batch touched, then (a timer) expire."""
    store.states.save([(key, 0, engine.snapshot(key)) for key in engine.dirty], version=version)
    engine.dirty.clear()
    engine.expire()


def _whole(ruleset, events: list) -> list[tuple]:
    """The findings of an engine that keeps every key in memory, batch by batch."""
    kept = Engine(ruleset)
    return [_key(f) for batch in _batches(events) for f in kept.process(batch)]


def _key(f) -> tuple:
    return (f.action, f.rule, f.resource_id, f.episode_start, f.fired_at, f.at, f.waste_usd, f.usd_per_hour)


def test_an_evicted_key_comes_back_from_the_store_with_the_same_alerts(ruleset, store):
    events = _fleet()
    whole = _whole(ruleset, events)
    assert any(a == "fire" and r == "idle-gpu" and k == HOST for a, r, k, *_ in whole)
    assert any(a == "resolve" and r == "idle-gpu" and k == HOST for a, r, k, *_ in whole)

    fetched: list[str] = []

    def fetch(key: str) -> bytes | None:
        fetched.append(key)
        return store.states.get(key)

    engine = Engine(ruleset, evict_after_s=15 * MIN, fetch=fetch)
    found, away = [], 0
    for version, batch in enumerate(_batches(events), start=1):
        found += [_key(f) for f in engine.process(batch)]
        _after_batch(engine, store, version)
        away = max(away, engine.evicted)
        if engine.evicted:
            assert len(engine) == 3  # host-1 is out of memory
    assert away == 1 and fetched == [HOST]  # evicted once, and restored from the store, not memory
    assert found == whole


def test_evicted_keys_read_ahead_of_their_batch_give_the_same_alerts_without_a_look_up_each(ruleset, store):
    """The worker reads the batch's evicted keys together before detection (``unread``,
    ``read_ahead``): the key takes what was read, no one-by-one fetch, and the alerts are the
    ones of a key that never left memory. A key the store has no state for starts afresh."""
    events = _fleet()
    whole = _whole(ruleset, events)
    assert any(a == "resolve" and k == HOST for a, _, k, *_ in whole)

    def fetch(key: str) -> bytes | None:
        raise AssertionError(f"{key} was looked up alone")

    engine = Engine(ruleset, evict_after_s=15 * MIN, fetch=fetch)
    found, read = [], []
    for version, batch in enumerate(_batches(events), start=1):
        unread = engine.unread({e.resource_id for e in batch})
        if unread:
            read += unread
            engine.read_ahead({key: store.states.get_many(unread).get(key) for key in unread})
        found += [_key(f) for f in engine.process(batch)]
        _after_batch(engine, store, version)
    assert read == [HOST] and found == whole
    assert engine.unread([HOST, "host-2"]) == []  # held in memory, or not evicted: nothing to read
    engine.watermark += 3600.0  # the rest go quiet in the end, leaving memory
    engine.expire()
    assert engine.unread(["host-2", "host-3"]) == []  # their snapshots just taken are still held
    engine.expire()  # the next round: those are written long since, and now only in the store
    assert sorted(engine.unread(["host-2", "host-3", "nobody"])) == ["host-2", "host-3"]
    engine.read_ahead({"host-2": None, "host-3": store.states.get("host-3")})
    assert engine.resource("host-3") is not None and engine.resource("host-3").instance_type
    assert engine.resource("host-2") is None  # no saved state: afresh, as the look-up would give


def test_the_store_gives_one_keys_newest_state_and_none_once_deleted(store):
    store.states.save([("k1", 0, b"v1"), ("k2", 1, b"x")], version=1)
    store.states.save([("k1", 0, b"v2")], version=2)
    assert store.states.get("k1") == b"v2"
    assert store.states.get("k2") == b"x"
    store.states.delete(["k2"])
    assert store.states.get("k2") is None
    assert store.states.get("never-saved") is None


def test_nothing_is_evicted_without_a_store_to_restore_from(ruleset):
    engine = Engine(ruleset, evict_after_s=60.0)  # backtest: no fetch
    engine.process(_fleet())
    engine.expire()
    assert engine.evicted == 0 and len(engine) == 4


def test_a_runs_look_up_of_an_evicted_host_reads_it_back(ruleset, store):
    """A run event names its hosts (:meth:`Engine.resource`): an evicted host is read back from
    the store, as it was, not lost (no directory here, as in backtest)."""
    engine = Engine(ruleset, evict_after_s=15 * MIN, fetch=store.states.get)
    for version, batch in enumerate(_batches(_fleet()), start=1):
        engine.process(batch)
        _after_batch(engine, store, version)
        if engine.evicted:
            break
    assert engine.evicted == 1 and len(engine) == 3
    info = engine.resource(HOST)
    assert info is not None and info.instance_type == "p4d.24xlarge" and info.usd_per_hour == 32.0


def test_a_sweep_is_due_each_eighth_of_the_window_of_event_time(ruleset):
    """The worker sweeps when the watermark has moved an eighth of the eviction window since
    the last sweep, whatever the wall clock (a catch-up runs event time hundreds of times
    faster); without a store to evict to, an eighth of the state TTL."""
    evicting = Engine(ruleset, evict_after_s=20 * MIN, fetch=lambda key: None, state_ttl_s=86_400.0)
    keeping = Engine(ruleset, state_ttl_s=86_400.0)
    for engine, step in ((evicting, 150.0), (keeping, 86_400.0 / 8)):
        engine.process(timeline(T0, T0 + 10 * MIN, [90.0] * 2) + timeline(T0, T0 + 10 * MIN, [90.0] * 2, rid="host-2")
                       + timeline(T0, T0 + 10 * MIN, [90.0] * 2, rid="host-3"))  # fmt: skip
        assert engine.sweep_due  # never swept
        engine.expire()
        swept_at = engine.watermark
        assert not engine.sweep_due
        engine.watermark = swept_at + step - 1.0
        assert not engine.sweep_due
        engine.watermark = swept_at + step
        assert engine.sweep_due
        engine.expire()
        assert not engine.sweep_due


def test_a_key_whose_events_are_still_held_is_not_swept(ruleset):
    """The worker asks whether each decoded event was seen before (:meth:`Engine.already_seen`),
    which takes its key into memory, before the aligner releases it: such a key has folded in
    no event yet, and a sweep meanwhile must neither expire it (the worker would tombstone it
    and forget which partition it came on) nor evict it."""
    engine = Engine(ruleset, evict_after_s=20 * MIN, fetch=lambda key: None)
    engine.process(sorted(timeline(T0, T0 + 3 * 3600, [90.0] * 2) + timeline(T0, T0 + 3 * 3600, [90.0] * 2, rid="host-2")
                          + timeline(T0, T0 + 3 * 3600, [90.0] * 2, rid="host-3"), key=lambda e: e.ts))  # fmt: skip
    ahead = usage(T0 + 3 * 3600 + 60, rid="new-host")
    assert not engine.already_seen(ahead.ts.timestamp(), ahead) and len(engine) == 4
    assert engine.expire() == [] and engine.last_evicted == 0
    assert len(engine) == 4 and engine.evicted == 0
    engine.process([ahead])
    assert len(engine) == 4 and "new-host" in engine.dirty
