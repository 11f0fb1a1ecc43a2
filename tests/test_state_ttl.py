"""One rule for a key quiet longer than the state TTL, decided at its next event by event time: it
starts afresh, whether it stayed in memory, was swept, evicted, or restored after a restart."""

from __future__ import annotations

from detector.engine import Engine
from tests.helpers import MIN, T0, timeline, usage

DAY = 86_400.0
HOST = "host-1"
OTHERS = ("host-2", "host-3", "host-4")


def _events() -> list:
    """host-1 idle for 90 minutes (an idle episode fires), then nothing for three days while
    three other hosts go on (event time moves past its TTL), then busy again. Time-sorted."""
    events = timeline(T0, T0 + 90 * MIN, [0.0] * 4) + timeline(T0 + 3 * DAY, T0 + 3 * DAY + 30 * MIN, [90.0] * 4)
    for other in OTHERS:
        events += timeline(T0, T0 + 3 * DAY + 30 * MIN, [70.0, 80.0], rid=other, step=1800.0)
    return sorted(events, key=lambda e: e.ts)


def _batches(events: list, span_s: float = 3 * 3600.0) -> list[list]:
    """The events in batches of ``span_s`` of event time."""
    batches: dict[int, list] = {}
    for event in events:
        batches.setdefault(int((event.ts.timestamp() - T0) // span_s), []).append(event)
    return [batches[i] for i in sorted(batches)]


def _key(f) -> tuple:
    return (f.action, f.rule, f.resource_id, f.episode_start, f.fired_at, f.at, f.waste_usd)


def _host(findings: list) -> list[tuple]:
    return [_key(f) for f in findings if f.resource_id == HOST]


def _fresh(ruleset) -> list[tuple]:
    """host-1's findings from two engines: one for its events before the gap, a new one after."""
    before, after = ([e for e in _events() if e.resource_id == HOST and cond(e.ts.timestamp())]
                     for cond in (lambda t: t < T0 + DAY, lambda t: t >= T0 + DAY))  # fmt: skip
    return _host(Engine(ruleset).process(before)) + _host(Engine(ruleset).process(after))


def test_a_key_quiet_past_the_ttl_starts_afresh_in_an_engine_that_never_sweeps(ruleset):
    """``backtest`` never expires: the rule is the engine's own. Before, its state went on (the
    idle episode resolved three days later, and a stale-telemetry alert opened and closed)."""
    expected = _fresh(ruleset)
    assert [a for a, r, *_ in expected] == ["fire", "update", "update", "update"]
    engine = Engine(ruleset)
    assert [f for batch in _batches(_events()) for f in _host(engine.process(batch))] == expected


def test_the_same_whether_the_key_was_swept_restored_or_evicted(ruleset):
    """An uninterrupted worker that swept the key, one restarted during the gap (its state
    restored from the store) and one that evicted it (read back at its next event) all start
    it afresh at its next event, as the engine that never sweeps does."""
    expected = _fresh(ruleset)
    batches = _batches(_events())

    swept = Engine(ruleset)
    found = []
    gone: list[str] = []
    for batch in batches:
        found += _host(swept.process(batch))
        gone += swept.expire()
    assert HOST in gone and found == expected  # the sweep reclaimed it; the rule decided alike

    saved: dict[str, bytes] = {}
    first = Engine(ruleset)
    half = len(batches) // 2
    found = [f for batch in batches[:half] for f in _host(first.process(batch))]
    saved.update((key, first.snapshot(key)) for key in first.dirty)  # type: ignore[misc]
    restarted = Engine(ruleset, loader=saved.get)
    found += [f for batch in batches[half:] for f in _host(restarted.process(batch))]
    assert found == expected

    store: dict[str, bytes] = {}
    fetched: list[str] = []
    evicting = Engine(ruleset, evict_after_s=3600.0, fetch=lambda key: fetched.append(key) or store.get(key))
    found = []
    for batch in batches:
        found += _host(evicting.process(batch))
        store.update((key, evicting.snapshot(key)) for key in evicting.dirty)  # type: ignore[misc]
        evicting.dirty.clear()
        evicting.evict()  # eviction only: no expiry
    assert HOST in fetched and found == expected


def test_one_future_dated_event_starts_afresh_its_own_key_only(ruleset):
    """One event dated three days ahead (past the TTL) on another host, in the first batch: that
    host starts afresh, but event time does not move (the watermark's docstring), so no sweep
    reclaims host-1 during its episode, and its findings are those of a run without the event."""
    batches = _batches(_events())
    batches[0].append(usage(T0 + 3 * DAY + 40 * MIN, rid=OTHERS[0]))
    engine = Engine(ruleset)
    found = []
    for batch in batches:
        found += _host(engine.process(batch))
        assert engine.watermark < batch[0].ts.timestamp() + 3 * 3600.0
        engine.expire()
    assert found == _fresh(ruleset)


def test_a_late_event_of_the_life_before_goes_into_the_new_one_as_late(ruleset):
    """After host-1 has started afresh, 40 more idle minutes of its old life arrive late (an
    exporter's backlog): older than the key's latest time, they go into the state it has now,
    late by kind (the GPU rules skip them), and start nothing afresh again: no update of the old
    episode, no new one, whether or not a sweep reclaimed the old state. (Checked: a rule that
    also started a key afresh on an event that far behind its latest fails here.)"""
    batches = _batches(_events())
    late = timeline(T0 + 90 * MIN, T0 + 130 * MIN, [0.0] * 4)
    expected = _fresh(ruleset)
    for sweeping in (False, True):
        engine = Engine(ruleset)
        found = []
        for batch in [*batches, late]:
            found += _host(engine.process(batch))
            if sweeping:
                engine.expire()
        assert found == expected
