"""A worker carries, through a restore into its snapshots, the saved states of rules it does not load that a newer
rule set has: in a rolling update that adds a rule, a worker of the older release given a key by a rebalance
dropped the new rule's state when the key spoke, and the newer worker that got the key back had lost the rule's
open episode: its incident stayed open for ever and a second one opened. Snapshots record each rule's type, so a
rule of the name of another type never reads a state as its own."""

from __future__ import annotations

import json
import sys

import msgspec

from detector.engine import Engine
from detector.rules import load_rules
from streams.config import LiveConfig
from streams.parts import remembering_manager
from tests.helpers import MIN, T0, idle_host
from tests.test_dropped_rules import RULES
from tests.test_orphaned_alerts import WITHOUT_NLP, Fleet, alerts_by_rule, changes, worker
from tests.test_pipeline import run_batches


def rules_in(tmp_path, name: str, text: str):
    (tmp_path / name).mkdir()
    (tmp_path / name / "rules.yaml").write_text(text)
    return load_rules(tmp_path / name)


def nlp_alerts(store, host: str) -> list[dict]:
    return [a for a in store.alerts.latest() if a["resource_id"] == host and a["rule"] == "idle-gpu-nlp"]


def handed_back(store, pipeline) -> None:
    """A rebalance gives partition 0 to ``pipeline`` again: its alert manager's memory and the saved states read."""
    pipeline.reset()
    pipeline.manager = remembering_manager(store, pipeline.engine.ruleset)
    pipeline.saved_states.update(store.states.load([0], saved_within_s=0))


def test_a_worker_of_the_older_release_keeps_a_newer_rules_open_episode_for_the_worker_that_gets_the_key_back(
        store, tmp_path):
    """A rolling update adds idle-gpu-nlp. A new worker fires it on h1; a rebalance hands partition 0 to a worker
    still on the old rules while h1 idles on, then back to a new worker. The incident goes on under its id, its
    dollars growing, and no second one opens. (Before, the old worker saved h1 without the rule's state: the new
    worker started the rule afresh on h1 and fired a second incident 20 minutes later, the first open for ever.)"""
    (tmp_path / "new").mkdir()
    (tmp_path / "old").mkdir()
    (tmp_path / "new" / "rules.yaml").write_text(RULES)
    (tmp_path / "old" / "rules.yaml").write_text(WITHOUT_NLP)
    fleet = Fleet()
    old = worker(store, LiveConfig.load(tmp_path / "old"))
    run_batches(old, [fleet.minutes(T0 - 5 * MIN, 5, {"b": 70.0})], [])
    new = worker(store, LiveConfig.load(tmp_path / "new"))
    run_batches(new, [fleet.minutes(T0, 40, {"h1": 1.0, "b": 70.0})], [])
    (opened,) = nlp_alerts(store, "h1")
    assert opened["status"] == "firing"

    handed_back(store, old)  # the old worker has never loaded idle-gpu-nlp
    run_batches(old, [fleet.minutes(T0 + 40 * MIN, 2, {"h1": 1.0, "b": 70.0})], [])
    saved = msgspec.msgpack.decode(store.states.get("h1"))
    assert "idle-gpu-nlp" in saved["rules"] and saved["types"]["idle-gpu-nlp"] == "idle_gpu"

    handed_back(store, new)
    run_batches(new, [fleet.minutes(T0 + 42 * MIN, 30, {"h1": 1.0, "b": 70.0})], [])
    (now,) = nlp_alerts(store, "h1")
    assert (now["alert_id"], now["status"]) == (opened["alert_id"], "firing")
    assert now["waste_usd"] > opened["waste_usd"]
    assert changes(store, now["alert_id"]) == ["fired"]
    assert alerts_by_rule(store, "h1")["idle-gpu"]["status"] == "firing"


def test_a_rule_removed_has_its_states_carried_only_until_the_newest_rule_set_is_known(store, tmp_path):
    """idle-gpu-nlp is removed while the worker is down (the newest rule set recorded lacks it). The restarted
    worker's first batch restores h1 before it has read the rule sets, carrying the rule's state; once read, the
    state is dropped and h1 saved again without it, so that the rule put back finds no episode whose incident
    was resolved for the removal."""
    (tmp_path / "rules.yaml").write_text(RULES)
    fleet = Fleet()
    run_batches(worker(store, LiveConfig.load(tmp_path)), [fleet.minutes(T0, 40, {"h1": 1.0, "b": 70.0})], [])
    (tmp_path / "rules.yaml").write_text(WITHOUT_NLP)
    restarted = worker(store, LiveConfig.load(tmp_path))
    run_batches(restarted, [fleet.minutes(T0 + 40 * MIN, 2, {"h1": 1.0, "b": 70.0})], [])
    assert restarted.engine.carry == {}
    saved = msgspec.msgpack.decode(store.states.get("h1"))
    assert "idle-gpu-nlp" not in saved["rules"] and "idle-gpu" in saved["rules"]
    (gone,) = nlp_alerts(store, "h1")
    assert gone["status"] == "resolved"


def test_carried_states_are_saved_as_read_and_dropped_once_settled_without_their_rule(tmp_path):
    """An engine without idle-gpu-nlp restores h (saved by one with it) and goes on with idle-gpu: its snapshot
    holds the nlp state's bytes as read, and its type. Settled with the rule in the newest set, they stay; settled
    without, they go and h is dirty (saved again)."""
    newer, older = Engine(rules_in(tmp_path, "new", RULES)), Engine(rules_in(tmp_path, "old", WITHOUT_NLP))
    newer.process(idle_host("h", "nlp", 40, T0))
    saved = msgspec.msgpack.decode(newer.snapshot("h"), type=dict[str, msgspec.Raw])
    nlp = msgspec.msgpack.decode(saved["rules"], type=dict[str, msgspec.Raw])["idle-gpu-nlp"]

    older.restore("h", newer.snapshot("h"))
    older.process(idle_host("h", "nlp", 5, T0 + 40 * MIN))
    again = msgspec.msgpack.decode(older.snapshot("h"))
    assert again["types"] == {"idle-gpu": "idle_gpu", "idle-gpu-nlp": "idle_gpu"}
    carried = msgspec.msgpack.decode(older.snapshot("h"), type=dict[str, msgspec.Raw])
    assert bytes(msgspec.msgpack.decode(carried["rules"], type=dict[str, msgspec.Raw])["idle-gpu-nlp"]) == bytes(nlp)

    older.dirty.clear()
    assert older.settle_carried({"idle-gpu-nlp": "idle_gpu"}) == [] and not older.dirty
    assert "idle-gpu-nlp" in msgspec.msgpack.decode(older.snapshot("h"))["rules"]
    assert older.settle_carried({"idle-gpu-nlp": "stuck_gpu"}) == ["h"] and older.dirty == {"h"}
    assert "idle-gpu-nlp" not in msgspec.msgpack.decode(older.snapshot("h"))["rules"]
    older.restore("h", newer.snapshot("h"))  # settled: a state of a rule not in the newest set is dropped at once
    assert "idle-gpu-nlp" not in msgspec.msgpack.decode(older.snapshot("h"))["rules"]


def test_a_reload_that_adds_a_carried_rule_goes_on_with_its_open_episode(tmp_path):
    """An engine without idle-gpu-nlp carries h's state of it; a reload adds the rule: the episode goes on from
    where the newer engine left it (the same start, its dollars growing), not afresh."""
    newer, older = Engine(rules_in(tmp_path, "new", RULES)), Engine(rules_in(tmp_path, "old", WITHOUT_NLP))
    fired = [f for f in newer.process(idle_host("h", "nlp", 40, T0)) if f.rule == "idle-gpu-nlp" and f.action == "fire"]
    older.restore("h", newer.snapshot("h"))
    older.process(idle_host("h", "nlp", 1, T0 + 40 * MIN))
    older.set_ruleset(newer.ruleset)
    assert "h" in older.dirty
    found = older.process(idle_host("h", "nlp", 5, T0 + 41 * MIN))
    assert not [f for f in found if f.rule == "idle-gpu-nlp" and f.action != "update"]
    (nlp,) = [f for f in older.open_episodes() if f.rule == "idle-gpu-nlp"]
    assert nlp.episode_start == fired[0].episode_start and nlp.waste_usd > fired[0].waste_usd


def test_a_state_saved_by_a_rule_of_another_type_is_not_read_as_the_loaded_rules(tmp_path):
    """idle-gpu-nlp was idle_gpu when h was saved, with an open episode; the engine restoring it loads the name as a
    stuck_gpu rule, whose state is of the same class: the state is not read as its own (it starts afresh, no
    episode open), as a reload drops a held key's."""
    newer = Engine(rules_in(tmp_path, "idle", RULES))
    newer.process(idle_host("h", "nlp", 40, T0))
    assert [f.rule for f in newer.open_episodes()].count("idle-gpu-nlp") == 1
    stuck = RULES.replace("  - name: idle-gpu-nlp\n    type: idle_gpu", "  - name: idle-gpu-nlp\n    type: stuck_gpu")
    other = Engine(rules_in(tmp_path, "stuck", stuck))
    assert other.ruleset.by_name("idle-gpu-nlp").detector.type == "stuck_gpu"
    state = other.restore("h", newer.snapshot("h"))
    assert "idle-gpu-nlp" not in state.names and "idle-gpu" in state.names
    assert [f.rule for f in other.open_episodes()] == ["idle-gpu"]


def test_an_evicted_key_takes_its_carried_states_out_of_memory_and_back(tmp_path):
    """An engine without idle-gpu-nlp carries h's state of it; h goes quiet and is evicted (its snapshot, with the
    carried state, saved), a reload adds the rule while h is out of memory, and h speaks again: the episode goes on.
    (A reload while a carried key was evicted raised KeyError: the carried states stayed behind, keyed by a key no
    longer held.)"""
    newer, saved = Engine(rules_in(tmp_path, "new", RULES)), {}
    older = Engine(rules_in(tmp_path, "old", WITHOUT_NLP), fetch=saved.get, evict_after_s=600.0)
    fired = [f for f in newer.process(idle_host("h", "nlp", 40, T0)) if f.rule == "idle-gpu-nlp" and f.action == "fire"]
    older.restore("h", newer.snapshot("h"))
    busy = [e for host in ("b1", "b2", "b3") for e in idle_host(host, "vision", 20, T0 + 41 * MIN)]
    older.process(idle_host("h", "nlp", 1, T0 + 40 * MIN) + sorted(busy, key=lambda e: e.ts))
    saved.update((key, older.snapshot(key)) for key in older.dirty)
    older.dirty.clear()
    older.expire()
    assert older.evicted == 1 and "h" not in older.dirty
    older.set_ruleset(newer.ruleset)
    older.process(idle_host("h", "nlp", 5, T0 + 61 * MIN))
    (nlp,) = [f for f in older.open_episodes() if f.rule == "idle-gpu-nlp" and f.resource_id == "h"]
    assert nlp.episode_start == fired[0].episode_start and nlp.waste_usd > fired[0].waste_usd


def test_a_key_whose_carried_state_holds_an_open_episode_is_saved_as_may_be_open(store, tmp_path):
    """Review of 2ddb96e. A new worker fires idle-gpu-nlp on h1 (20 minutes idle; idle-gpu, 30 minutes, not yet); a
    worker on the old rules gets partition 0 while h1 idles 2 minutes more, then h1 goes quiet for good and a new
    worker holds partition 0 again. Past the TTL, its sweep resolves the episode (went silent). (The old worker saved
    h1 as holding no open episode, its own rules' alone asked: the new worker's sweep deleted h1's state unread, and
    the incident the carried state held open stayed open for ever.)"""
    (tmp_path / "new").mkdir()
    (tmp_path / "old").mkdir()
    (tmp_path / "new" / "rules.yaml").write_text(RULES)
    (tmp_path / "old" / "rules.yaml").write_text(WITHOUT_NLP)
    fleet = Fleet()
    old = worker(store, LiveConfig.load(tmp_path / "old"), state_ttl_s=3600.0)
    run_batches(old, [fleet.minutes(T0 - 5 * MIN, 5, {"b": 70.0})], [])
    new = worker(store, LiveConfig.load(tmp_path / "new"), state_ttl_s=3600.0)
    run_batches(new, [fleet.minutes(T0, 25, {"h1": 1.0, "b": 70.0})], [])
    assert {r: a["status"] for r, a in alerts_by_rule(store, "h1").items()} == {"idle-gpu-nlp": "firing"}

    handed_back(store, old)
    run_batches(old, [fleet.minutes(T0 + 25 * MIN, 2, {"h1": 1.0, "b": 70.0})], [])
    assert "idle-gpu-nlp" in msgspec.msgpack.decode(store.states.get("h1"))["rules"]

    again = worker(store, LiveConfig.load(tmp_path / "new"), state_ttl_s=3600.0)  # h1 loaded, never heard from
    run_batches(again, [fleet.minutes(T0 + 27 * MIN, 70, {"b": 70.0})], [])
    (nlp,) = nlp_alerts(store, "h1")
    assert nlp["status"] == "resolved" and json.loads(nlp["details"])["reason"] == "went_silent"
    assert store.states.get("h1") is None


def test_a_carried_state_holds_its_own_bytes_not_the_whole_snapshots(tmp_path):
    """Review of 2ddb96e. A carried state is a view of the bytes read (msgspec.Raw): kept as it was, it kept the whole
    snapshot it was read from alive (~3.5 kB a key, every rule's state and the resource), where the engine holds a
    key in a few hundred bytes; a worker of the older release given a newer one's partitions held every key's twice."""
    newer, older = Engine(rules_in(tmp_path, "new", RULES)), Engine(rules_in(tmp_path, "old", WITHOUT_NLP))
    newer.process(idle_host("h", "nlp", 40, T0))
    data = newer.snapshot("h")
    before = sys.getrefcount(data)
    older.restore("h", data)
    assert sys.getrefcount(data) == before
    assert "idle-gpu-nlp" in msgspec.msgpack.decode(older.snapshot("h"))["rules"]


def test_a_reload_that_loads_a_carried_rule_as_another_type_saves_the_key_again_without_its_state(tmp_path):
    """Review of 2ddb96e. An engine without idle-gpu-nlp carries h's idle state of it, saved; a reload loads the name as a
    stuck_gpu rule: the carried state is not the rule's, and goes: h is dirty, saved again without it, as a reload
    saves a held key whose rule's state it dropped. (Left clean, the saved state kept the idle episode, whose alert the
    worker's look-up resolves as an orphan's for the type change, for a worker of the idle rule to go on with under the
    id just resolved.)"""
    newer, older = Engine(rules_in(tmp_path, "new", RULES)), Engine(rules_in(tmp_path, "old", WITHOUT_NLP))
    newer.process(idle_host("h", "nlp", 40, T0))
    older.restore("h", newer.snapshot("h"))
    older.dirty.clear()  # saved, carrying the state
    older.set_ruleset(rules_in(tmp_path, "stuck", RULES.replace("  - name: idle-gpu-nlp\n    type: idle_gpu",
                                                                "  - name: idle-gpu-nlp\n    type: stuck_gpu")))  # fmt: skip
    assert "h" in older.dirty
    saved = msgspec.msgpack.decode(older.snapshot("h"))
    assert "idle-gpu-nlp" not in saved["rules"] and "idle-gpu-nlp" not in saved["types"]
