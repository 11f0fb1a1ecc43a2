"""The alert manager's stages, one at a time, then together: dedup → route → inhibit → silence
→ realert, the memory a restart loads, and the pruning that keeps that memory bounded."""

from __future__ import annotations

from dataclasses import replace

import msgspec
import pytest

from detector.alerts import Alert, AlertManager, AlertMemory, from_finding
from detector.detectors import Finding, ResourceInfo
from detector.detectors.episode import CORRECTED
from detector.rules import load_rules
from detector.store import alert_from_row
from detector.store import schema as store_module
from detector.suppression import Hold, Silence, describe_holds
from detector.suppression.stages import Dedup, Inhibit, Realert, Route, Silencing, Stage
from tests.helpers import T0, at

HOUR = 3600.0


def finding(action: str = "fire", rule_type: str = "idle_gpu", rid: str = "h1", start: float = T0,
            at: float | None = None, rule: str | None = None, tags: dict[str, str] | None = None) -> Finding:  # fmt: skip
    """An episode of ``rule_type`` on ``rid`` that started at ``start`` and fired 30 minutes later."""
    return Finding(action=action, rule=rule or rule_type.replace("_", "-"), type=rule_type, resource_id=rid,
                   episode_start=start, fired_at=start + 1800, at=at if at is not None else start + 1800,
                   waste_usd=1.0, usd_per_hour=2.0, severity="warning",
                   resource=ResourceInfo(resource_id=rid, resource_type="gpu_instance", tags=tags or {}))  # fmt: skip


def alert(*args, **kwargs) -> Alert:
    return from_finding(finding(*args, **kwargs))


# -- each stage alone ---------------------------------------------------------------


def test_dedup_lets_each_opening_and_resolution_through_once_and_no_update_after_the_resolution():
    dedup = Dedup()
    opened, updated, resolved = alert("fire"), alert("update", at=T0 + HOUR), alert("resolve", at=T0 + 2 * HOUR)
    assert [dedup.admit(a) for a in (opened, opened, updated, updated, resolved, resolved, updated)] == [
        True, False, True, True, True, False, False]  # fmt: skip
    later = alert("fire", start=T0 + 10 * HOUR)
    dedup.admit(later)
    dedup.prune(T0 + 5 * HOUR)
    assert list(dedup.seen) == [later.alert_id]


def corrected(resolution: Alert, at: float, usd: float) -> Alert:
    """``resolution`` corrected: the episode ended at ``at`` with ``usd`` (a stop read after the sample that
    resolved it, dated within a gap in the samples before), as the GPU rules' second resolution says."""
    assert resolution.resolved_at is not None
    return msgspec.structs.replace(resolution, resolved_at=at, updated_at=at, waste_usd=usd, details={
        "reason": "instance_stopped", CORRECTED: True, "was_resolved_at": resolution.resolved_at,
        "was_usd": resolution.waste_usd})  # fmt: skip


def test_dedup_lets_one_correction_through_after_a_resolution_and_nothing_after_it():
    """A resolution's correction goes on once, as change ``corrected``; a second one, a withdrawal or an
    update after it are refused (re-read input derives them again), and so is a correction of an alert
    never seen (nothing to correct)."""
    dedup = Dedup()
    opened, resolved = alert("fire"), alert("resolve", at=T0 + 2 * HOUR)
    fix = corrected(resolved, T0 + HOUR, 0.5)
    assert fix.corrected and not resolved.corrected and fix.corrects == (T0 + 2 * HOUR, 1.0)
    assert [dedup.admit(a) for a in (opened, resolved)] == [True, True]
    assert dedup.admit(fix) and fix.change == "corrected"
    again = corrected(alert("resolve", at=T0 + 2 * HOUR), T0 + HOUR, 0.5)
    withdrawn = msgspec.structs.replace(alert("resolve", at=T0 + HOUR), details={"reason": "withdrawn"})
    assert [dedup.admit(a) for a in (again, withdrawn, alert("update", at=T0 + 3 * HOUR))] == [False, False, False]
    assert dedup.seen[opened.alert_id] == (T0, Stage.CORRECTED)
    unknown = corrected(alert("resolve", rid="h2", at=T0 + 2 * HOUR), T0 + HOUR, 0.5)
    assert not dedup.admit(unknown) and unknown.alert_id not in dedup.seen


def test_a_correction_whose_resolution_was_never_let_through_is_that_resolution():
    """Known open (the first resolution never admitted): the correction goes on as the resolution, with
    the corrected figures; then nothing more, neither the first resolution nor the correction again."""
    dedup = Dedup()
    opened, resolved = alert("fire"), alert("resolve", at=T0 + 2 * HOUR)
    fix = corrected(resolved, T0 + HOUR, 0.5)
    assert dedup.admit(opened) and dedup.admit(fix)
    assert fix.change == "resolved" and fix.waste_usd == 0.5 and dedup.seen[opened.alert_id] == (T0, Stage.CORRECTED)
    assert [dedup.admit(a) for a in (resolved, corrected(resolved, T0 + HOUR, 0.5))] == [False, False]


def test_route_picks_the_channel_from_the_rules(tmp_path):
    (tmp_path / "rules.yaml").write_text("rules:\n  - {name: idle-gpu, type: idle_gpu}\n")
    (tmp_path / "routing.yaml").write_text("default_channel: '#cost'\nchannels: {nlp: '#nlp-cost'}\n")
    ruleset = load_rules(tmp_path)
    nlp, other = alert(tags={"team": "nlp"}), alert(rid="h2", tags={"team": "vision"})
    Route.apply(nlp, ruleset)
    Route.apply(other, ruleset)
    assert (nlp.channel, other.channel) == ("#nlp-cost", "#cost")


def test_inhibit_joins_an_anomaly_to_the_rule_incident_open_on_its_resource():
    inhibit = Inhibit()
    idle = alert("fire")
    assert inhibit.hold(idle) is None
    anomaly = alert("fire", "anomaly", start=T0 + 600)
    assert inhibit.hold(anomaly) == Hold(kind="inhibited", by=idle.alert_id,
                                         reason=f"joined incident {idle.alert_id}: a rule's incident is open here")  # fmt: skip
    assert anomaly.details["joined_alert_id"] == idle.alert_id
    assert inhibit.hold(alert("fire", "anomaly", rid="h2")) is None  # another resource
    assert inhibit.hold(alert("fire", "untagged", rid="h3")) is None
    assert inhibit.hold(alert("fire", "anomaly", rid="h3")) is None  # untagged is no behaviour incident
    inhibit.resolved(alert("resolve", at=T0 + HOUR))
    assert inhibit.hold(alert("fire", "anomaly", start=T0 + 2 * HOUR)) is None


def test_silencing_holds_back_what_a_silence_covers_when_the_alert_opens():
    nlp = Silence(starts=T0, ends=T0 + HOUR, reason="drain", id="s1",
                  matches=lambda r: r.tags.get("team") == "nlp", types=frozenset({"idle_gpu"}))  # fmt: skip
    anything = Silence(starts=T0, ends=T0 + HOUR, reason="all idle", id="s2", rules=frozenset({"idle-gpu"}))
    assert Silencing.hold(alert(tags={"team": "nlp"}), [nlp, anything]) == Hold(kind="silenced", by="s1", reason="drain")
    assert Silencing.hold(alert(tags={"team": "cv"}), [nlp, anything]) == Hold(kind="silenced", by="s2", reason="all idle")
    assert Silencing.hold(alert(tags={"team": "nlp"}, start=T0 - 1801), [nlp]) is None  # opened before it started
    assert Silencing.hold(alert(tags={"team": "nlp"}, start=T0 + HOUR - 1800), [nlp]) is None  # at its end
    assert Silencing.hold(alert("fire", "stuck_gpu", tags={"team": "nlp"}), [nlp]) is None  # another type


def test_realert_holds_back_an_opening_sooner_than_the_interval_after_the_last_posted():
    realert = Realert()
    assert realert.hold(alert(), 2 * HOUR) is None
    soon = alert(start=T0 + HOUR)
    assert realert.hold(soon, 2 * HOUR) == Hold(
        kind="realert", by="idle-gpu", reason="realert: rule idle-gpu alerted on this resource within its realert interval")
    assert soon.details["realert_after"] == "2026-11-02T02:30:00Z"
    assert realert.hold(alert(start=T0 + 2 * HOUR), 2 * HOUR) is None  # two hours after the posted one
    assert realert.hold(alert(start=T0 + 2.5 * HOUR), 0.0) is None  # no interval: every opening is posted


def test_describe_holds_counts_by_stage_and_silence():
    alerts = [alert(rid=f"h{i}") for i in range(5)]
    alerts[0].held = alerts[1].held = Hold(kind="silenced", by="s1", reason="drain")
    alerts[2].held = Hold(kind="realert", by="idle-gpu", reason="realert: ...")
    assert describe_holds(alerts) == ("3 of 5 alerts held back, recorded but not posted: "
                                      "2 silenced (2 by silence s1 'drain'); 1 within their rule's realert interval")  # fmt: skip
    assert describe_holds(alerts[3:]) == ""


# -- the stages together --------------------------------------------------------------

RULES = """\
rules:
  - {name: idle-gpu, type: idle_gpu, realert: 2h}
  - {name: anomaly, type: anomaly}
silences:
  - {id: s1, types: [anomaly], starts: 2026-11-02T00:00:00Z, until: 2026-11-03T00:00:00Z, reason: noisy model}
  - {id: s2, match: {resource_id: h9}, starts: 2026-11-02T00:00:00Z, until: 2026-11-03T00:00:00Z, reason: h9 drained}
"""


@pytest.fixture
def ruleset(tmp_path):
    (tmp_path / "rules.yaml").write_text(RULES)
    return load_rules(tmp_path)


def load_rules_without_silences(ruleset):
    """The same rules after the silences were removed (a hot reload)."""
    return replace(ruleset, silences=())


def test_the_first_stage_that_holds_an_opening_back_says_why_and_its_later_changes_follow(ruleset):
    manager = AlertManager(ruleset=ruleset)
    idle, anomaly = manager.handle([finding(), finding("fire", "anomaly", start=T0 + 600, rule="anomaly")])
    assert idle.held is None and anomaly.held is not None and anomaly.held.kind == "inhibited"  # before the silence
    (alone,) = manager.handle([finding("fire", "anomaly", rid="h2", rule="anomaly")])
    assert alone.held == Hold(kind="silenced", by="s1", reason="noisy model")
    (update, resolved) = manager.handle([finding("update", "anomaly", rid="h2", at=T0 + HOUR, rule="anomaly"),
                                         finding("resolve", "anomaly", rid="h2", at=T0 + 2 * HOUR, rule="anomaly")])  # fmt: skip
    assert update.held == resolved.held == alone.held


def test_a_held_back_opening_does_not_count_as_posted_for_realert(ruleset):
    manager = AlertManager(ruleset=ruleset)
    (silenced,) = manager.handle([finding(rid="h9")])
    assert silenced.held is not None and silenced.held.kind == "silenced"
    manager.ruleset = load_rules_without_silences(ruleset)
    (soon,) = manager.handle([finding(rid="h9", start=T0 + HOUR)])
    assert soon.held is None  # nothing was posted before it: realert does not hold it back


def test_the_memory_a_restart_loads_holds_back_what_was_held_back(ruleset, store):
    manager = AlertManager(ruleset=ruleset)
    alerts = manager.handle([
        finding(rid="h1"), finding(rid="h1", start=T0 + HOUR),  # posted; realert
        finding("fire", "anomaly", rid="h1", start=T0 + 600, rule="anomaly"),  # inhibited
        finding(rid="h9"),  # silenced
    ])  # fmt: skip
    store.alerts.record(alerts, version=1)
    stored = {r["alert_id"]: alert_from_row(r).held for r in store.alerts.latest()}
    assert stored == {a.alert_id: a.held for a in alerts}
    memory = AlertMemory.load(store.memory)
    assert memory.held == {a.alert_id: a.held for a in alerts if a.held is not None}
    assert sorted(h.kind for h in memory.held.values()) == ["inhibited", "realert", "silenced"]
    assert memory.last_posted == {("idle-gpu", "h1"): T0 + 1800}
    assert memory.open_incidents.keys() == {"h1", "h9"} and memory.open_incidents["h9"] == alerts[3].alert_id
    assert set(memory.seen) == {a.alert_id for a in alerts}
    restarted = AlertManager(memory, ruleset=load_rules_without_silences(ruleset))
    resolutions = restarted.handle([
        finding("resolve", rid="h9", at=T0 + 3 * HOUR),
        finding("resolve", "anomaly", rid="h1", start=T0 + 600, at=T0 + HOUR, rule="anomaly"),
    ])  # fmt: skip
    assert [r.held for r in resolutions] == [alerts[3].held, alerts[2].held]  # still not posted after a restart
    assert restarted.handle([finding(rid="h1")]) == []  # opened before the restart: not again


def test_rows_stored_before_the_hold_columns_read_back_as_holds(store, monkeypatch):
    """Migration 0007 gives rows written with only the reason text their typed record."""
    db = store.db
    store.client.command(f"DROP DATABASE {db}")
    before = [m for m in store_module.migrations() if m.version < 8]
    monkeypatch.setattr(store_module, "migrations", lambda: before)
    store.migrate()
    cols = ["alert_id", "type", "rule", "resource_id", "status", "change", "severity", "episode_start", "fired_at",
            "updated_at", "waste_usd", "usd_per_hour", "details", "silenced", "version"]  # fmt: skip
    row = ["", "", "idle-gpu", "h1", "firing", "fired", "warning", at(T0), at(T0), at(T0), 1.0, 1.0]
    store.client.insert(f"{db}.alerts", [
        ["a1", "idle_gpu", *row[2:], "{}", "realert: rule idle-gpu alerted on this resource within its realert interval", 1],
        ["a2", "anomaly", "anomaly", *row[3:], '{"joined_alert_id": "a9"}', "joined incident a9: a rule's incident is open", 1],
        ["a3", "idle_gpu", *row[2:], "{}", "offsite", 1],
        ["a4", "idle_gpu", *row[2:], "{}", "", 1],
    ], column_names=cols)  # fmt: skip
    monkeypatch.undo()
    assert store.migrate()[0] == "0008_alert_holds"  # and the migrations after it
    held = {r["alert_id"]: (r["held"], r["held_by"]) for r in store.alerts.latest()}
    assert held == {"a1": ("realert", "idle-gpu"), "a2": ("inhibited", "a9"), "a3": ("silenced", ""), "a4": ("", "")}


# -- pruning --------------------------------------------------------------------------


def test_an_incident_open_past_the_horizon_stays_remembered_with_why_it_was_held(ruleset):
    """An idle GPU held back (a realert) and left idle for three horizons: its opening read again is not let
    through, and its resolution is held back as its opening was, not posted alone as a first sight (the
    alert manager forgot open episodes by their start: a resolution of a held opening, e.g. went_silent,
    was posted on its own, and a withdrawal after it was lost). Closed ones are forgotten as before."""
    manager = AlertManager(ruleset=ruleset, horizon_s=6 * HOUR, prune_every=2)
    first, second = finding(rid="h1"), finding(rid="h1", start=T0 + HOUR)
    later = [finding(rid=f"other{i}", start=T0 + (20 + i) * HOUR) for i in range(4)]
    alerts = manager.handle([first, second, *later])  # pruned past prune_every: h1's two are 19+ hours old
    assert [a.held.kind if a.held else None for a in alerts[:2]] == [None, "realert"]
    assert manager.handle([second]) == []  # still open: remembered
    (resolved,) = manager.handle([finding("resolve", rid="h1", start=T0 + HOUR, at=T0 + 25 * HOUR)])
    assert resolved.held is not None and resolved.held.kind == "realert"


def test_pruning_forgets_old_alerts_and_keeps_recent_ones(ruleset):
    """Memory is bounded, and pruning it keeps what is still within the horizon, and what is still
    open however old: replacing the pruned memory with an empty one lets re-read input open and
    close alerts twice."""
    manager = AlertManager(ruleset=ruleset, horizon_s=6 * HOUR, prune_every=4)
    old = [finding(rid=f"old{i}") for i in range(3)]
    closed = [finding("resolve", rid=f"old{i}", at=T0 + HOUR) for i in range(3)]
    posted, held = finding(rid="h1", start=T0 + 10 * HOUR), finding(rid="h1", start=T0 + 11 * HOUR)
    alerts = manager.handle(old + closed + [posted, held])  # more remembered than prune_every: pruned
    assert [a.held.kind if a.held else None for a in alerts] == [None] * 7 + ["realert"]
    assert manager.handle([posted, held]) == []  # within the horizon: still remembered
    assert len(manager.handle(old)) == 3  # closed and older than the horizon: forgotten
    (resolved,) = manager.handle([finding("resolve", rid="h1", start=T0 + 11 * HOUR, at=T0 + 12 * HOUR)])
    assert resolved.held is not None and resolved.held.kind == "realert"  # why it was held back is remembered
    (again,) = manager.handle([finding(rid="h1", start=T0 + 11.5 * HOUR)])
    assert again.held is not None and again.held.kind == "realert"  # the last posted opening is remembered
