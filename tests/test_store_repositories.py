"""Each repository of ``detector.store`` read back on its own, on the embedded engine: what
a restarted worker's alert manager, outbox and partition handover rely on, checked where
it is read rather than only through the worker."""

from __future__ import annotations

import time

import msgspec

from detector.actions import Click
from detector.alerts import Alert
from detector.store import Store
from detector.suppression import Hold
from detector.suppression.stages import inhibiting_types
from detector.units import epoch
from tests.helpers import T0, at

HOUR = 3600.0
DAY = 86_400.0


def alert(alert_id: str, start: float, *, rule_type: str = "idle_gpu", rid: str = "h1", resolved: bool = False,
          held: Hold | None = None, partition: int = -1, fired: float | None = None) -> Alert:  # fmt: skip
    """An alert's latest change: fired at ``fired`` (its episode's start unless said)."""
    fired_at = start if fired is None else fired
    return Alert(alert_id=alert_id, type=rule_type, rule=rule_type.replace("_", "-"), resource_id=rid,
                 status="resolved" if resolved else "firing", change="resolved" if resolved else "fired",
                 severity="warning", episode_start=start, fired_at=fired_at, updated_at=fired_at + HOUR,
                 resolved_at=fired_at + HOUR if resolved else None, held=held,
                 silenced=held.reason if held else "", partition=partition)  # fmt: skip


def click(alert_id: str, action: str, user: str = "ana") -> Click:
    return Click(action=action, alert_id=alert_id, user_id="U1", user_name=user, channel="#c", message_ts="1.2")


# -- the alert manager's memory ---------------------------------------------------------


def test_memory_remembers_recent_episodes_and_whether_they_closed(store: Store):
    """Dedup after a restart: each alert's episode start and whether it resolved, for episodes
    within the horizon before the newest, and those still open however old; older closed ones
    are forgotten."""
    store.alerts.record([alert("old", T0, resolved=True), alert("open", T0 + 6 * DAY),
                         alert("closed", T0 + 8 * DAY, resolved=True), alert("long", T0 - 30 * DAY)],
                        version=1)  # fmt: skip
    assert store.memory.recent_alerts(horizon_s=7 * DAY) == {"open": (T0 + 6 * DAY, False),
                                                             "closed": (T0 + 8 * DAY, True),
                                                             "long": (T0 - 30 * DAY, False)}  # fmt: skip
    assert set(store.memory.recent_alerts(horizon_s=9 * DAY)) == {"old", "open", "closed", "long"}


def test_memory_reads_the_latest_change_of_each_alert(store: Store):
    """An alert fired then resolved is remembered as resolved (the newest version wins)."""
    store.alerts.record([alert("a", T0)], version=1)
    store.alerts.record([alert("a", T0, resolved=True)], version=2)
    assert store.memory.recent_alerts() == {"a": (T0, True)}



def test_memory_tells_a_withdrawn_alert_from_a_resolved_one(store: Store):
    """After a restart, an alert resolved may still be taken back once (a stop read late), and one
    withdrawn (while open, or after its resolution) takes nothing more: the alert manager lets a
    withdrawal re-derived from re-read input through only where none was stored."""
    from detector.suppression import AlertMemory
    from detector.suppression.stages import Dedup, Stage

    def withdrawn(a: Alert, change: str = "resolved") -> Alert:
        return msgspec.structs.replace(a, change=change, waste_usd=0.0, details={"reason": "withdrawn"})

    resolved = {rid: alert(rid, T0, rid=rid, resolved=True) for rid in ("r", "w", "t")}
    store.alerts.record(list(resolved.values()), version=1)
    store.alerts.record([withdrawn(resolved["w"]), withdrawn(resolved["t"], "withdrawn")], version=2)
    assert store.memory.recent_alerts() == {"r": (T0, Stage.RESOLVED), "w": (T0, Stage.WITHDRAWN),
                                            "t": (T0, Stage.WITHDRAWN)}  # fmt: skip
    dedup = Dedup(AlertMemory.load(store.memory).seen)  # (the alert manager's first stage, after a restart)
    assert [dedup.admit(a) and a.change for a in [withdrawn(a) for a in resolved.values()]] == ["withdrawn", False, False]


def _corrected(a: Alert, change: str = "corrected") -> Alert:
    """``a`` (resolved) corrected: it ended half an hour earlier, with fewer dollars."""
    assert a.resolved_at is not None
    return msgspec.structs.replace(a, change=change, waste_usd=2.0, resolved_at=a.resolved_at - HOUR / 2,
                                   details={"reason": "instance_stopped", "corrected": True,
                                            "was_resolved_at": a.resolved_at, "was_usd": a.waste_usd})  # fmt: skip


def test_memory_tells_a_corrected_alert_from_a_resolved_one(store: Store):
    """After a restart, an alert resolved may still be corrected once, and one corrected (after its
    resolution, or by a resolution first let through with corrected figures) takes nothing more: the
    correction re-derived from re-read input is not recorded twice."""
    from detector.suppression import AlertMemory
    from detector.suppression.stages import Dedup, Stage

    resolved = {rid: alert(rid, T0, rid=rid, resolved=True) for rid in ("r", "c", "f")}
    store.alerts.record(list(resolved.values()), version=1)
    store.alerts.record([_corrected(resolved["c"]), _corrected(resolved["f"], "resolved")], version=2)
    assert store.memory.recent_alerts() == {"r": (T0, Stage.RESOLVED), "c": (T0, Stage.CORRECTED),
                                            "f": (T0, Stage.CORRECTED)}  # fmt: skip
    dedup = Dedup(AlertMemory.load(store.memory).seen)  # (the alert manager's first stage, after a restart)
    assert [dedup.admit(a) and a.change for a in [_corrected(a, "resolved") for a in resolved.values()]] == [
        "corrected", False, False]  # fmt: skip


def test_a_correction_read_again_after_a_restart_is_not_recorded_again(store: Store):
    """The alert manager turns a GPU rule's second resolution of an episode (``corrected``) into change
    ``corrected``; input read again after a restart derives fire, resolution and correction again, and
    the manager that loaded its memory from the store lets none of them through."""
    from detector.alerts import AlertManager, AlertMemory
    from detector.detectors import Finding, ResourceInfo

    def finding(action: str, at: float, usd: float, **details: object) -> Finding:
        return Finding(action=action, rule="idle-gpu", type="idle_gpu", resource_id="h1", episode_start=T0,
                       fired_at=T0 + 1800, at=at, waste_usd=usd, usd_per_hour=2.0, severity="warning",
                       details=details, resource=ResourceInfo(resource_id="h1"))  # fmt: skip

    findings = [finding("fire", T0 + 1800, 1.0), finding("resolve", T0 + 2 * HOUR, 4.0, reason="gpu_busy"),
                finding("resolve", T0 + HOUR, 2.0, reason="instance_stopped", corrected=True,
                        was_resolved_at=T0 + 2 * HOUR, was_usd=4.0)]  # fmt: skip
    changes = AlertManager().handle(findings)
    assert [(a.change, a.waste_usd) for a in changes] == [("fired", 1.0), ("resolved", 4.0), ("corrected", 2.0)]
    for version, change in enumerate(changes, start=1):
        store.alerts.record([change], version=version)
    assert AlertManager(AlertMemory.load(store.memory)).handle(findings) == []
    row = store.alerts.get(changes[0].alert_id)
    assert row is not None and (row["waste_usd"], epoch(row["resolved_at"])) == (2.0, T0 + HOUR)


def test_memory_finds_open_incidents_of_the_types_an_anomaly_joins(store: Store):
    """Inhibit after a restart: per resource, an open incident of a rule that holds back an
    anomaly; resolved incidents, anomalies and other types are not."""
    store.alerts.record([
        alert("idle-h1", T0, rid="h1"),
        alert("idle-h2", T0, rid="h2", resolved=True),
        alert("anomaly-h3", T0, rid="h3", rule_type="anomaly"),
        alert("untagged-h4", T0, rid="h4", rule_type="untagged"),
    ], version=1)  # fmt: skip
    assert "anomaly" not in inhibiting_types() and "idle_gpu" in inhibiting_types()
    assert store.memory.open_incidents(inhibiting_types()) == {"h1": "idle-h1"}
    assert store.memory.open_incidents(["idle_gpu", "untagged"]) == {"h1": "idle-h1", "h4": "untagged-h4"}


def test_memory_tells_held_back_alerts_from_the_last_posted_opening(store: Store):
    """Realert after a restart counts from the latest posted opening per (rule, resource);
    an alert held back keeps its hold, and is not a posted opening."""
    silence = Hold(kind="silenced", by="s1", reason="maintenance")
    store.alerts.record([
        alert("a1", T0, fired=T0),
        alert("a2", T0 + HOUR, fired=T0 + 5 * HOUR),
        alert("a3", T0 + 9 * HOUR, held=silence),
        alert("b1", T0, rid="h2", rule_type="stuck_gpu"),
    ], version=1)  # fmt: skip
    last, held = store.memory.suppression()
    assert last == {("idle-gpu", "h1"): T0 + 5 * HOUR, ("stuck-gpu", "h2"): T0}
    assert held == {"a3": silence}


def test_memory_of_holds_and_openings_stops_at_the_horizon(store: Store):
    """Past the horizon: the hold of a closed alert is forgotten, an open one's is kept (its resolution is
    held back as its opening was, however long it lasted)."""
    hold = Hold(kind="realert", by="idle-gpu", reason="realert: r")
    store.alerts.record([alert("old", T0, held=hold, resolved=True), alert("new", T0 + 3 * DAY)], version=1)
    assert store.memory.suppression(horizon_s=DAY) == ({("idle-gpu", "h1"): T0 + 3 * DAY}, {})
    store.alerts.record([alert("open", T0, held=hold)], version=2)
    assert store.memory.suppression(horizon_s=DAY) == ({("idle-gpu", "h1"): T0 + 3 * DAY}, {"open": hold})


# -- deliveries --------------------------------------------------------------------------


def test_deliveries_made_leave_out_posts_only_begun(store: Store):
    store.deliveries.record_attempt(["a1", "a2"], "fired")
    store.deliveries.record("a1", "fired", "#c", "1.1")
    store.deliveries.record_many([("a3", "fired", "#d", "2.1"), ("a3", "resolved", "#d", "2.2")])
    assert store.deliveries.made() == {("a1", "fired"): ("#c", "1.1"), ("a3", "fired"): ("#d", "2.1"),
                                       ("a3", "resolved"): ("#d", "2.2")}  # fmt: skip
    attempted = store.deliveries.attempted()
    assert list(attempted) == [("a2", "fired")]  # a1's post landed and was recorded
    assert attempted[("a2", "fired")] > 0


def test_undelivered_is_what_people_should_have_heard_of(store: Store):
    """Openings, then resolutions, oldest first; never what a stage held back, nor what was
    delivered; per input partition (an unknown partition counts as partition 0's)."""
    store.alerts.record([
        alert("p0", T0, partition=0),
        alert("unknown", T0 + HOUR, partition=-1, resolved=True),
        alert("p1", T0 + 3 * HOUR, partition=1),
        alert("held", T0 + 4 * HOUR, partition=1, held=Hold(kind="silenced", by="s", reason="quiet")),
    ], version=1)  # fmt: skip
    store.deliveries.record("p0", "fired", "#c", "1.1")
    assert store.deliveries.undelivered() == [("unknown", "fired"), ("unknown", "resolved"), ("p1", "fired")]
    assert store.deliveries.undelivered([0]) == [("unknown", "fired"), ("unknown", "resolved")]
    assert store.deliveries.undelivered([1]) == [("p1", "fired")]
    assert store.deliveries.undelivered([]) == []  # no partitions held: nothing to deliver


def test_undelivered_has_the_correction_of_an_alert_corrected_after_its_resolution(store: Store):
    """A correction (change ``corrected``, the alert's latest row) is owed after its resolution, until it
    is delivered; a resolution first let through with corrected figures owes no correction."""
    resolved = alert("c", T0, resolved=True)
    store.alerts.record([resolved, alert("f", T0 + HOUR, rid="h2", resolved=True)], version=1)
    store.alerts.record([_corrected(resolved), _corrected(alert("f", T0 + HOUR, rid="h2", resolved=True), "resolved")],
                        version=2)  # fmt: skip
    store.deliveries.record_many([("c", "fired", "#c", "1.1"), ("c", "resolved", "#c", "1.1"),
                                  ("f", "fired", "#c", "2.1"), ("f", "resolved", "#c", "2.1")])  # fmt: skip
    assert store.deliveries.undelivered() == [("c", "corrected")]
    store.deliveries.record("c", "corrected", "#c", "1.1")
    assert store.deliveries.undelivered() == []


# -- clicks and snoozes, detector state, digests -----------------------------------------


def test_a_snooze_runs_from_its_latest_click_to_its_end(store: Store):
    store.actions.record(click("a1", "snoozed", "ana"), at=T0, until=T0 + HOUR)
    store.actions.record(click("a1", "snoozed", "bo"), at=T0 + 10, until=T0 + 2 * HOUR)
    store.actions.record(click("a2", "snoozed"), at=T0, until=T0 + 60)
    store.actions.record(click("a3", "acknowledged"), at=T0)
    running = store.actions.snoozed(now=T0 + 120)
    assert list(running) == ["a1"]
    assert (running["a1"].starts, running["a1"].ends) == (T0 + 10, T0 + 2 * HOUR)
    assert running["a1"].reason == "snoozed in Slack by bo"
    assert store.actions.snoozed(now=T0 + 2 * HOUR) == {}
    assert [c["action"] for c in store.actions.of("a1")] == ["snoozed", "snoozed"]


def test_alerts_marked_expected_are_known_to_training(store: Store):
    store.actions.record(click("a1", "expected"), at=T0)
    store.actions.record(click("a2", "acknowledged"), at=T0)
    assert store.actions.marked_expected() == {"a1"}


def test_states_newest_version_wins_and_a_tombstone_deletes(store: Store):
    store.states.save([("k1", 0, b"v1"), ("k2", 1, b"x"), ("k3", 2, b"other partition")], version=1)
    store.states.save([("k1", 0, b"v2")], version=2)
    store.states.delete(["k2"])
    assert store.states.load([0, 1]) == {"k1": b"v2"}
    assert store.states.load([]) == {}


def test_states_are_loaded_with_their_keys_latest_times_for_the_sweeps_in_time_order(store: Store):
    """Each state's latest event time is saved beside it and loaded with the names (the newest
    version's); a state saved without one (0: before the column) is not told, so never reclaimed
    by it. :class:`SavedTimes` gives the keys before a time once each, oldest first."""
    from detector.store.states import SavedTimes

    store.states.save([("k1", 0, b"v1", 300.0), ("k2", 0, b"x", 100.0), ("k3", 0, b"y", 200.0)], version=1)
    store.states.save([("k1", 0, b"v2", 400.0), ("old", 0, b"saved before the column")], version=2)
    store.states.delete(["k3"])
    latest: dict[str, float] = {}
    assert store.states.load([0], saved_within_s=0, latest=latest).keys() == {"k1", "k2", "old"}
    assert latest == {"k1": 400.0, "k2": 100.0}
    times, loaded = SavedTimes({**latest, "k4": 250.0}), {"k1", "k2", "k4"}
    assert times.before(100.0, loaded) == [] and times.before(300.0, loaded) == ["k2", "k4"]
    assert times.before(300.0, loaded) == [] and times.before(1e9, loaded) == ["k1"]


def test_saved_times_give_the_keys_in_time_order_ties_in_their_loaded_order():
    """Sorted by numpy (off the GIL) as ``sorted`` by time would: equal times keep the order the
    store gave the keys, so what a sweep reclaims does not depend on how they were sorted."""
    import random

    from detector.store.states import SavedTimes

    for seed in range(10):
        rng = random.Random(seed)
        latest = {f"key-{i}-{rng.random()}": rng.choice([1.0, 2.0, 2.0, -0.0, 1e300, rng.uniform(0, 1e9)])
                  for i in range(rng.randrange(0, 2000))}  # fmt: skip
        loaded = set(latest)
        assert SavedTimes(latest).before(float("inf"), loaded) == sorted(latest, key=latest.__getitem__)
    assert SavedTimes({}).before(float("inf"), set()) == []


def test_saved_times_let_go_of_the_keys_taken_since_the_load():
    """A key taken from the loaded states (it spoke: the engine holds it, by its event's own
    string) is no longer :class:`SavedTimes`' to give, nor to hold: once most of the loaded keys
    are taken, a sweep's look-up lets go of their strings, which the loaded dict no longer holds
    (before, every loaded key's string was held until the next assignment: 84 B a key at a
    million keys that all spoke, against the 16 B a key the loaded dict shares)."""
    import gc
    import tracemalloc

    from detector.store.states import SavedTimes

    n = 10_000
    tracemalloc.start()
    try:
        loaded: dict[str, bytes | None] = {"".join(("i-", f"{i:017x}")): None for i in range(n)}
        times = SavedTimes({key: 1_000.0 + i for i, key in enumerate(loaded)})
        for key in list(loaded)[1:]:
            del loaded[key]  # taken: it spoke
        loaded = dict(loaded)  # (a dict does not shrink as keys leave it)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        assert times.before(1_000.5, loaded) == ["i-" + "0" * 17]  # the key that never spoke
        gc.collect()
        assert held - tracemalloc.get_traced_memory()[0] > n * 50  # the strings of those that spoke
        assert times.before(1e9, loaded) == []
    finally:
        tracemalloc.stop()


def test_states_saved_long_ago_are_loaded_without_their_bytes_and_read_when_they_speak(store: Store):
    """A worker taking over partitions holds the bytes of the keys saved within the horizon only."""
    hour_ago = time.time_ns() - 3600 * 10**9
    store.states.save([("quiet", 0, b"old state"), ("gone", 0, b"x")], version=hour_ago - 1)
    store.states.save([("live", 0, b"new state")], version=time.time_ns())
    store.states.delete(["gone"])
    loaded = store.states.load([0], saved_within_s=3600)
    assert loaded == {"quiet": None, "live": b"new state"}
    assert store.states.load([0]) == {"quiet": b"old state", "live": b"new state"}  # no horizon: all
    assert store.states.take(loaded, "quiet") == b"old state"  # read from the store now
    assert store.states.take(loaded, "live") == b"new state"
    assert loaded == {} and store.states.take(loaded, "live") is None and store.states.take(loaded, "never") is None
    # After an outage longer than the horizon, the keys live before it still come with their bytes:
    # the horizon counts from the partitions' newest save, not from now.
    store.states.save([("a", 1, b"a"), ("b", 1, b"b")], version=hour_ago - 7200 * 10**9)
    store.states.save([("c", 1, b"c")], version=hour_ago - 7300 * 10**9)
    assert store.states.load([1], saved_within_s=3600) == {"a": b"a", "b": b"b", "c": b"c"}
    assert store.states.load([1], saved_within_s=60) == {"a": b"a", "b": b"b", "c": None}


def test_states_of_many_keys_are_read_together_newest_first_and_tombstones_absent(store: Store, monkeypatch):
    """``get_many`` answers what ``get`` answers for each key, in queries of at most
    ``GET_MANY_CHUNK`` keys (here 2, so five keys take three queries)."""
    from detector.store import states as states_module

    monkeypatch.setattr(states_module, "GET_MANY_CHUNK", 2)
    store.states.save([("k1", 0, b"v1"), ("k2", 1, b"x"), ("k3", 2, b"y"), ("k4", 0, b"z")], version=1)
    store.states.save([("k1", 0, b"v2")], version=2)
    store.states.delete(["k2"])
    keys = ["k1", "k2", "k3", "never", "k4"]
    queries: list[str] = []
    query = store.client.query
    monkeypatch.setattr(store.client, "query", lambda sql, **kw: queries.append(sql) or query(sql, **kw))
    found = store.states.get_many(keys)
    assert len(queries) == 3  # three chunks
    assert found == {"k1": b"v2", "k3": b"y", "k4": b"z"}
    assert found == {k: v for k in keys if (v := store.states.get(k)) is not None}
    assert store.states.get_many([]) == {}


def test_keys_loaded_without_their_bytes_are_filled_from_one_read(store: Store):
    """What the worker does before a batch: the keys it names that were loaded without bytes
    are read together; one deleted meanwhile leaves the loaded set, as ``take`` would find it."""
    loaded: dict[str, bytes | None] = {"quiet": None, "gone": None, "live": b"held"}
    assert store.states.unread(loaded, ["quiet", "gone", "live", "unknown"]) == ["quiet", "gone"]
    store.states.fill(loaded, ["quiet", "gone"], {"quiet": b"read"})
    assert loaded == {"quiet": b"read", "live": b"held"}
    assert store.states.unread(loaded, ["quiet", "gone", "live"]) == []


def test_digests_remember_the_last_day_sent(store: Store):
    assert store.digests.last_day() is None
    store.digests.record(T0, "", "")
    store.digests.record(T0 + DAY, "#c", "1.1")
    assert store.digests.last_day() == T0 + DAY


def test_an_alert_is_got_by_id(store: Store):
    store.alerts.record([alert("a1", T0)], version=1)
    assert store.alerts.get("a1")["resource_id"] == "h1"
    assert store.alerts.get("nope") is None


def test_named_queries_read_their_own_database(store: Store, chdb_client):
    """A named query binds the store's database: two stores on one engine do not mix."""
    other = Store(chdb_client, database=store.db + "_other")
    other.migrate()
    try:
        other.alerts.record([alert("a1", T0)], version=1)
        period = {"since": at(T0 - DAY), "until": at(T0 + DAY), "team": ""}
        assert store.named("reports/incidents", period) == []
        assert [r["alert_id"] for r in other.named("reports/incidents", period)] == ["a1"]
    finally:
        chdb_client.command(f"DROP DATABASE IF EXISTS {other.db}")
