"""An alert left open by a rule that is no longer loaded is resolved from the alert side, with the figures it
last recorded: a rule removed while the worker was down, or by a reload while its key was evicted. Before,
the engine dropped the rule's state unread and the incident stayed "firing" for ever (Slack, the incidents
page), remembered for ever by the alert manager. A real worker's pipeline on the embedded store."""

from __future__ import annotations

import asyncio
import json

import pytest

from detector.delivery import Outbox
from detector.engine import RULE_REMOVED, Engine
from detector.orphaned_alerts import CLOSED_BY, known_rules
from detector.store.states import SavedTimes
from streams.config import LiveConfig
from streams.parts import remembering_manager
from streams.pipeline import Message, Pipeline
from tests.helpers import MIN, T0, at, slack_bot
from tests.test_dropped_rules import RULES
from tests.test_pipeline import gpu_message, run_batches, usage_message

WITHOUT_NLP = RULES.split("  - name: idle-gpu-nlp")[0]


class Fleet:
    """Messages of hosts a minute apart, on partition 0 of each topic, offsets counted on."""

    def __init__(self) -> None:
        self.usage, self.gpu = iter(range(100_000)), iter(range(100_000))

    def minutes(self, start: float, n: int, hosts: dict[str, float]) -> list[Message]:
        return [m for k in range(n) for host, util in hosts.items()
                for m in (usage_message(next(self.usage), start + k * MIN, host),
                          gpu_message(next(self.gpu), start + k * MIN, util, host))]  # fmt: skip


def worker(store, config: LiveConfig, slack=None, **engine_options) -> Pipeline:
    """A worker's pipeline as it (re)starts on partition 0: the saved states loaded, read back when each key
    speaks; the alert manager's memory read from the store; ``config`` the rules it reloads; posting to the
    local Slack server ``slack``, if given."""
    latest: dict[str, float] = {}
    maybe_open: set[str] = set()
    states = store.states.load([0], saved_within_s=0, latest=latest, maybe_open=maybe_open)
    ruleset = config.current.ruleset
    engine = Engine(ruleset, loader=lambda key: store.states.take(states, key), fetch=store.states.get, **engine_options)
    pipeline = Pipeline(engine=engine, store=store, outbox=Outbox(store, slack_bot(slack) if slack else None, group_wait_s=0),
                        manager=remembering_manager(store, ruleset),
                        send_dead_letter=lambda key, value: asyncio.sleep(0), config=config, saved_states=states)  # fmt: skip
    pipeline.saved_times = SavedTimes(latest, maybe_open)
    pipeline.outbox.assign([0])  # (its posts of partition 0, as an assignment recovers them)
    return pipeline


def alerts_by_rule(store, resource_id: str) -> dict[str, dict]:
    return {a["rule"]: a for a in store.alerts.latest() if a["resource_id"] == resource_id}


def changes(store, alert_id: str) -> list[str]:
    """Its changes but the cost updates, in order (the history: ``alert_changes``)."""
    rows = store.client.query(f"SELECT change FROM {store.db}.alert_changes WHERE alert_id = %(id)s ORDER BY at, recorded_at",
                              parameters={"id": alert_id}).result_rows  # fmt: skip
    return [r[0] for r in rows if r[0] != "updated"]


def h1_evicted(store, tmp_path) -> tuple[LiveConfig, Pipeline, Fleet]:
    """Both rules loaded from ``tmp_path``; h1 and h2 idle 40 minutes (both rules fire on each), then h1 goes quiet
    while h2 and b go on for 20: the worker has evicted h1 (its state saved, out of memory)."""
    (tmp_path / "rules.yaml").write_text(RULES)
    config = LiveConfig.load(tmp_path)
    pipeline = worker(store, config, evict_after_s=600.0)
    fleet = Fleet()
    run_batches(pipeline, [fleet.minutes(T0, 40, {"h1": 1.0, "h2": 1.0, "b": 70.0}),
                           fleet.minutes(T0 + 40 * MIN, 20, {"h2": 1.0, "b": 70.0})], [])  # fmt: skip
    assert (pipeline.engine.evicted, len(pipeline.engine)) == (1, 2)  # h1 out of memory; h2 and b held
    return config, pipeline, fleet


def posted(slack, restarted: Pipeline) -> list:
    """What ``restarted`` posts of what it queued, at once (the worker's outbox task, in this thread)."""
    restarted.outbox.deliver_pending()
    return slack.calls("chat.postMessage")


def test_a_rule_removed_while_the_worker_was_down_has_its_open_alerts_resolved_at_the_start(store, tmp_path, slack):
    """h1 (team nlp) idles 40 minutes: idle-gpu and idle-gpu-nlp fire. The worker stops; idle-gpu-nlp is removed
    from the rules; the worker starts again and h1 never speaks again. Its first batch resolves idle-gpu-nlp's
    alert (rule_removed, closed by the alert manager) at the event time and with the dollars it last recorded,
    and replies in the opening's thread saying why; idle-gpu's goes on. A second restart changes and posts
    nothing more."""
    (tmp_path / "rules.yaml").write_text(RULES)
    fleet = Fleet()
    first = worker(store, LiveConfig.load(tmp_path), slack)
    run_batches(first, [fleet.minutes(T0, 40, {"h1": 1.0, "b": 70.0})], [])
    openings = posted(slack, first)
    assert len(openings) == 2 and not any(p.body.get("thread_ts") for p in openings)
    before = alerts_by_rule(store, "h1")
    assert {rule: a["status"] for rule, a in before.items()} == {"idle-gpu": "firing", "idle-gpu-nlp": "firing"}

    (tmp_path / "rules.yaml").write_text(WITHOUT_NLP)
    restarted = worker(store, LiveConfig.load(tmp_path), slack)
    run_batches(restarted, [fleet.minutes(T0 + 40 * MIN, 3, {"b": 70.0})], [])
    after = alerts_by_rule(store, "h1")
    gone, kept = after["idle-gpu-nlp"], after["idle-gpu"]
    assert gone["status"] == "resolved" and kept["status"] == "firing"
    details = json.loads(gone["details"])
    assert (details["reason"], details["closed_by"]) == (RULE_REMOVED, CLOSED_BY)
    last = before["idle-gpu-nlp"]
    assert (gone["resolved_at"], gone["waste_usd"]) == (last["updated_at"], last["waste_usd"])
    assert gone["waste_usd"] > 0 and gone["partition"] == 0
    assert changes(store, gone["alert_id"]) == ["fired", "resolved"]
    (reply,) = posted(slack, restarted)[2:]
    opening_ts = {p.response["ts"] for p in openings if gone["alert_id"] in p.text_of_blocks()}
    assert reply.body["thread_ts"] in opening_ts
    assert "rule removed" in reply.text_of_blocks() and "no longer loaded" in reply.text_of_blocks()

    again = worker(store, LiveConfig.load(tmp_path), slack)
    run_batches(again, [fleet.minutes(T0 + 43 * MIN, 3, {"b": 70.0})], [])
    assert len(posted(slack, again)) == 3
    assert changes(store, gone["alert_id"]) == ["fired", "resolved"]
    assert alerts_by_rule(store, "h1")["idle-gpu"]["status"] == "firing"


def test_a_reload_resolves_the_alerts_of_a_removed_rule_on_evicted_keys_too(store, tmp_path):
    """h1 idles 40 minutes, then goes quiet while b runs on: the worker evicts h1 (its state saved, out of
    memory). A reload removes idle-gpu-nlp: the engine has no state of h1 to resolve, so the next batch
    resolves its alert from the alert side; h2, idle and held in memory, has its alert resolved by the
    engine, exactly, once (not by the alert side too)."""
    config, pipeline, fleet = h1_evicted(store, tmp_path)
    assert {a["status"] for r in ("h1", "h2") for a in alerts_by_rule(store, r).values()} == {"firing"}

    (tmp_path / "rules.yaml").write_text(WITHOUT_NLP)
    new, refused = config.reload()
    assert refused is None and new is config.current
    run_batches(pipeline, [fleet.minutes(T0 + 60 * MIN, 2, {"h2": 1.0, "b": 70.0})], [])
    h1, h2 = alerts_by_rule(store, "h1"), alerts_by_rule(store, "h2")
    assert [h1["idle-gpu"]["status"], h2["idle-gpu"]["status"]] == ["firing", "firing"]
    by_alert_side, by_engine = json.loads(h1["idle-gpu-nlp"]["details"]), json.loads(h2["idle-gpu-nlp"]["details"])
    assert (h1["idle-gpu-nlp"]["status"], by_alert_side["reason"], by_alert_side["closed_by"]) == \
        ("resolved", RULE_REMOVED, CLOSED_BY)
    assert (h2["idle-gpu-nlp"]["status"], by_engine["reason"], "closed_by" in by_engine) == ("resolved", RULE_REMOVED, False)
    assert changes(store, h2["idle-gpu-nlp"]["alert_id"]) == ["fired", "resolved"]


def test_a_worker_resolves_the_orphaned_alerts_of_its_own_partitions_only(store, tmp_path, slack):
    """Two workers: the one holding partition 1 resolves the open alert of a removed rule made on partition 1,
    not the one made on partition 0 (its holder's to resolve and post), nor one of a rule still loaded."""
    from detector.alerts import Alert

    def alert(n: int, rule: str, partition: int) -> Alert:
        return Alert(alert_id=f"a{n}", type="idle_gpu", rule=rule, resource_id=f"h{n}", status="firing", change="fired",
                     severity="warning", episode_start=T0, fired_at=T0 + 20 * MIN, updated_at=T0 + 30 * MIN,
                     waste_usd=3.5, usd_per_hour=10.5, partition=partition, tags={"team": "nlp"})  # fmt: skip

    store.alerts.record([alert(1, "idle-gpu-nlp", 0), alert(2, "idle-gpu-nlp", 1), alert(3, "idle-gpu", 1)], version=1)
    (tmp_path / "rules.yaml").write_text(WITHOUT_NLP)
    config = LiveConfig.load(tmp_path)
    pipeline = Pipeline(engine=Engine(config.current.ruleset), store=store, config=config,
                        outbox=Outbox(store, slack_bot(slack), group_wait_s=0),
                        manager=remembering_manager(store, config.current.ruleset),
                        send_dead_letter=lambda key, value: asyncio.sleep(0))  # fmt: skip
    pipeline.expect([("gpu-metrics", 1), ("resource-usage", 1)])
    pipeline.outbox.assign([1])
    gpu = [Message("gpu-metrics", 1, i, b"x", json.dumps([{"ts": T0 + 40 * MIN + i * 60, "resource_id": "x",
                                                           "gpu_index": 0, "util_pct": 70.0}]).encode())
           for i in range(2)]  # fmt: skip
    run_batches(pipeline, [gpu], [])
    statuses = {a["alert_id"]: (a["status"], a["resolved_at"] is not None) for a in store.alerts.latest()}
    assert statuses == {"a1": ("firing", False), "a2": ("resolved", True), "a3": ("firing", False)}
    texts = [p.text_of_blocks() for p in posted(slack, pipeline)]  # (with the openings of partition 1 never posted)
    assert [t for t in texts if "rule removed" in t] == [t for t in texts if "rule removed" in t and "h2" in t] != []
    assert not [t for t in texts if "h1" in t]


def test_a_rule_put_back_opens_its_incident_again_on_an_evicted_key_as_on_a_held_one(store, tmp_path):
    """Review of 1e838a2. h1 and h2 idle 40 minutes (both rules fire); h1 goes quiet and is evicted, h2 idles on.
    A reload removes idle-gpu-nlp (the engine resolves h2's, the alert side h1's), a second puts it back (an edit
    rolled back), and both idle on. h2's state was saved without the rule's (marked dirty, review of 53dbe56):
    a new episode opens a new incident. h1's saved state still holds the old episode: it goes on under the id
    the alert side resolved, every change of it dropped by the alert manager's dedup, so h1 idles on with no
    incident open until that episode ends (days, for a forgotten GPU)."""
    config, pipeline, fleet = h1_evicted(store, tmp_path)
    (tmp_path / "rules.yaml").write_text(WITHOUT_NLP)
    assert config.reload()[1] is None
    run_batches(pipeline, [fleet.minutes(T0 + 60 * MIN, 2, {"h2": 1.0, "b": 70.0})], [])
    assert {r: alerts_by_rule(store, r)["idle-gpu-nlp"]["status"] for r in ("h1", "h2")} == {"h1": "resolved", "h2": "resolved"}

    (tmp_path / "rules.yaml").write_text(RULES)
    assert config.reload()[1] is None
    run_batches(pipeline, [fleet.minutes(T0 + 62 * MIN, 40, {"h1": 1.0, "h2": 1.0, "b": 70.0})], [])
    nlp_open = {a["resource_id"] for a in store.alerts.latest() if a["rule"] == "idle-gpu-nlp" and a["status"] == "firing"}
    assert nlp_open == {"h1", "h2"}


def test_a_worker_on_older_rules_leaves_open_the_alerts_of_a_rule_only_newer_workers_load(store, tmp_path):
    """Review of 1e838a2. A rolling update adds idle-gpu-nlp: a new worker fires it on h1 (partition 0), then a
    rebalance hands partition 0 to a worker still on the old rules, which has never loaded the rule. It is not
    removed (the newer workers load it): its incident stays open. (The old worker resolved it as rule_removed
    and posted that; once a new worker took the partition back, h1's episode went on under the resolved id,
    unseen.) The newest rule set any worker loaded has the rule (``rule_sets``: the old worker started before the
    new one), so the old worker leaves it; a worker starting with rules without it (the rule removed, or the
    update rolled back) resolves it."""
    (tmp_path / "new").mkdir()
    (tmp_path / "old").mkdir()
    (tmp_path / "new" / "rules.yaml").write_text(RULES)
    (tmp_path / "old" / "rules.yaml").write_text(WITHOUT_NLP)
    fleet = Fleet()
    old = worker(store, LiveConfig.load(tmp_path / "old"))  # running before the update: its rules recorded
    run_batches(old, [fleet.minutes(T0 - 5 * MIN, 5, {"b": 70.0})], [])
    new = worker(store, LiveConfig.load(tmp_path / "new"))
    run_batches(new, [fleet.minutes(T0, 40, {"h1": 1.0, "b": 70.0})], [])
    assert alerts_by_rule(store, "h1")["idle-gpu-nlp"]["status"] == "firing"

    old.reset()  # the rebalance: partition 0 back to the old worker, its alert manager's memory read again
    old.manager = remembering_manager(store, old.engine.ruleset)
    old.saved_states.update(store.states.load([0], saved_within_s=0))
    run_batches(old, [fleet.minutes(T0 + 40 * MIN, 2, {"b": 70.0})], [])
    assert alerts_by_rule(store, "h1")["idle-gpu-nlp"]["status"] == "firing"

    (tmp_path / "new" / "rules.yaml").write_text(WITHOUT_NLP)  # removed: the newest rule set lacks it too
    run_batches(worker(store, LiveConfig.load(tmp_path / "new")), [fleet.minutes(T0 + 42 * MIN, 2, {"b": 70.0})], [])
    assert alerts_by_rule(store, "h1")["idle-gpu-nlp"]["status"] == "resolved"


def test_an_assignment_resolves_the_orphaned_alerts_of_the_partitions_it_brings(store, tmp_path):
    """Review of 1e838a2: the look-up after an assignment (Pipeline.reset), which no test above reaches (each
    starts a fresh pipeline, due from its start). A worker holding partition 0 leaves partition 1's open alert
    of a removed rule alone; once a rebalance brings it partition 1, its next batch resolves it."""
    from detector.alerts import Alert

    store.alerts.record([Alert(alert_id="a1", type="idle_gpu", rule="idle-gpu-nlp", resource_id="h1", status="firing",
                               change="fired", severity="warning", episode_start=T0, fired_at=T0 + 20 * MIN,
                               updated_at=T0 + 30 * MIN, waste_usd=3.5, partition=1)], version=1)  # fmt: skip
    (tmp_path / "rules.yaml").write_text(WITHOUT_NLP)
    config = LiveConfig.load(tmp_path)
    pipeline = Pipeline(engine=Engine(config.current.ruleset), store=store, config=config, outbox=Outbox(store, None),
                        manager=remembering_manager(store, config.current.ruleset),
                        send_dead_letter=lambda key, value: asyncio.sleep(0))  # fmt: skip

    def batch(partition: int) -> list[Message]:
        return [Message("gpu-metrics", partition, i, b"x", json.dumps([{"ts": T0 + 40 * MIN + i * 60, "resource_id": "x",
                                                                        "gpu_index": 0, "util_pct": 70.0}]).encode())
                for i in range(2)]  # fmt: skip

    pipeline.expect([("gpu-metrics", 0), ("resource-usage", 0)])
    run_batches(pipeline, [batch(0)], [])
    assert store.alerts.get("a1")["status"] == "firing"
    pipeline.reset()  # (the rebalance: revoked, then partitions 0 and 1 assigned)
    pipeline.manager = remembering_manager(store, config.current.ruleset)
    pipeline.expect([("gpu-metrics", 0), ("resource-usage", 0), ("gpu-metrics", 1), ("resource-usage", 1)])
    run_batches(pipeline, [batch(1)], [])
    assert store.alerts.get("a1")["status"] == "resolved"


def test_a_silenced_opening_of_a_removed_rule_has_its_resolution_held_too(store, tmp_path, slack):
    """Review of 1e838a2 (passes): idle-gpu-nlp's opening on h1 is held by a silence; the rule and the silence are
    removed while the worker is down. Its resolution at the start is held too (not posted, still 'silenced' in
    the store, so the waste ledger and digest keep leaving it out)."""
    from tests.helpers import at

    silence = (f"silences:\n  - id: s1\n    match: {{resource_id: h1}}\n    rules: [idle-gpu-nlp]\n"
               f"    starts: {at(T0).isoformat()}\n    until: {at(T0 + 600 * MIN).isoformat()}\n    reason: quiet\n")
    (tmp_path / "rules.yaml").write_text(RULES + silence)
    fleet = Fleet()
    first = worker(store, LiveConfig.load(tmp_path), slack)
    run_batches(first, [fleet.minutes(T0, 40, {"h1": 1.0, "b": 70.0})], [])
    openings = posted(slack, first)
    assert len(openings) == 1  # idle-gpu's; idle-gpu-nlp's held
    assert alerts_by_rule(store, "h1")["idle-gpu-nlp"]["silenced"] == "quiet"

    (tmp_path / "rules.yaml").write_text(WITHOUT_NLP)
    restarted = worker(store, LiveConfig.load(tmp_path), slack)
    run_batches(restarted, [fleet.minutes(T0 + 40 * MIN, 3, {"b": 70.0})], [])
    gone = alerts_by_rule(store, "h1")["idle-gpu-nlp"]
    assert (gone["status"], gone["silenced"]) == ("resolved", "quiet")
    assert len(posted(slack, restarted)) == 1


def test_the_store_reads_as_orphans_the_open_alerts_of_a_rule_not_loaded_or_loaded_as_another_type(store):
    """Review of 1e838a2: the (rule, type) match, which no test above reaches (each removes a rule), and the
    partitions: -1 read as partition 0's, none held reads none, None reads all."""
    from detector.alerts import Alert

    def alert(n: int, rule: str, type_: str, partition: int, status: str = "firing") -> Alert:
        return Alert(alert_id=f"a{n}", type=type_, rule=rule, resource_id=f"h{n}", status=status,  # type: ignore[arg-type]
                     change="fired" if status == "firing" else "resolved", severity="warning", episode_start=T0,
                     fired_at=T0, updated_at=T0, partition=partition)  # fmt: skip

    store.alerts.record([alert(1, "idle-gpu", "idle_gpu", 0), alert(2, "idle-gpu", "stuck_gpu", 0),
                         alert(3, "gone", "idle_gpu", -1), alert(4, "gone", "idle_gpu", 3),
                         alert(5, "gone", "idle_gpu", 0, "resolved")], version=1)  # fmt: skip
    loaded = {"idle-gpu": "idle_gpu", "other": "stuck_gpu"}
    known = known_rules(loaded, None)
    assert [a.alert_id for a in store.alerts.open_orphans(known, {0})] == ["a2", "a3"]
    assert [a.alert_id for a in store.alerts.open_orphans(known, None)] == ["a2", "a3", "a4"]
    assert store.alerts.open_orphans(known, set()) == []
    assert [a.alert_id for a in store.alerts.open_orphans(set(), {3})] == ["a4"]
    # a newer worker loads idle-gpu as stuck_gpu: its alerts are not this (older) worker's to resolve
    newer = known_rules(loaded, {"idle-gpu": "stuck_gpu", "gone": "idle_gpu"})
    assert [a.alert_id for a in store.alerts.open_orphans(newer, None)] == []


RUN_RULES = """\
rules:
  - name: idle-gpu
    type: idle_gpu
    match: {resource_type: [gpu_instance, notebook]}
    params: {for: 30m}
  - name: plateaued-run
    type: plateaued_run
    params: {metric: val_loss, mode: min, min_delta: 0, patience: 5}
"""
WITHOUT_PLATEAU = RUN_RULES.split("  - name: plateaued-run")[0]


def test_a_run_rule_put_back_opens_its_incident_again_whose_state_is_the_projects_not_the_runs(store, tmp_path):
    """Review of 4fab862: a run-event rule's alert is of the run (``resource_id`` r1), its state of the engine key,
    the project (llm). plateaued-run fires on r1; the worker stops; the rule is removed; the worker starts again
    (llm loaded, not heard from) and resolves r1's alert from the alert side. Its state must be saved again without
    the rule's, as a resource's is: the rule put back (a reload), the run plateauing on opens a new incident, not
    the old episode going on under the id just resolved, every change of it dropped."""
    (tmp_path / "rules.yaml").write_text(RUN_RULES)
    runs = iter(range(100_000))
    usage = iter(range(100_000))

    def minutes(start: float, n: int) -> list[Message]:
        return [usage_message(next(usage), start + k * MIN, "h1") for k in range(n)]

    def run(t: float, value: float | None, step: int | None, status: str = "running") -> Message:
        value_ = {"ts": at(t).isoformat(), "run_id": "r1", "status": status, "resource_ids": ["h1"], "gpu_count": 8,
                  "project": "llm", "tags": {"team": "nlp"}, **({"metrics": {"val_loss": value}, "step": step}
                                                                 if value is not None else {})}  # fmt: skip
        return Message("run-events", 0, next(runs), b"llm", json.dumps(value_).encode())

    def evals(start: float, values: list[float], first_step: int) -> list[Message]:
        return [run(start + (i + 1) * 15 * MIN, v, first_step + i * 1000) for i, v in enumerate(values)]

    first = worker(store, LiveConfig.load(tmp_path))
    flat = [2.0, 1.5, 1.2, 1.0, 1.01, 1.02, 1.0, 1.03, 1.02]  # its best at the 4th, five evaluations not better
    batch = minutes(T0, 150) + [run(T0, None, None, "started")] + evals(T0, flat, 1000)
    run_batches(first, [sorted(batch, key=lambda m: json.loads(m.value)["ts"])], [])
    (plateau,) = [a for a in store.alerts.latest() if a["rule"] == "plateaued-run"]
    assert (plateau["resource_id"], plateau["status"]) == ("r1", "firing")

    (tmp_path / "rules.yaml").write_text(WITHOUT_PLATEAU)
    config = LiveConfig.load(tmp_path)
    restarted = worker(store, config)
    run_batches(restarted, [minutes(T0 + 150 * MIN, 3)], [])
    assert store.alerts.get(plateau["alert_id"])["status"] == "resolved"

    (tmp_path / "rules.yaml").write_text(RUN_RULES)
    assert config.reload()[1] is None
    batch = minutes(T0 + 153 * MIN, 120) + evals(T0 + 150 * MIN, [1.0, 1.02, 1.03, 1.04, 1.05, 1.06, 1.07], 10_000)
    run_batches(restarted, [sorted(batch, key=lambda m: json.loads(m.value)["ts"])], [])
    firing = [a for a in store.alerts.latest() if a["rule"] == "plateaued-run" and a["status"] == "firing"]
    assert [a["resource_id"] for a in firing] == ["r1"]


def test_the_states_of_many_orphans_keys_are_read_in_chunks_each_within_the_look_up_bound(store, tmp_path, monkeypatch):
    """Review of 4fab862: a rule removed while the worker was down had incidents open on many resources, loaded at
    the start and not heard from. Their states are read to be saved again without the rule's: each chunk of
    :data:`GET_MANY_CHUNK` keys reads within the look-up's bound here, all of them together do not. Read as one
    look-up, it timed out at every try and the pipeline stalled for ever under the batch lock, and again after
    every restart (as the sweep's read did before it was chunked: tests/test_pipeline.py)."""
    from detector.alerts import Alert
    from tests.helpers import scrape, slow_state_reads

    quiet = [f"q{i}" for i in range(40)]
    (tmp_path / "rules.yaml").write_text(RULES)
    maker = Engine(LiveConfig.load(tmp_path).current.ruleset)
    maker.process([e for key in quiet for e in scrape(T0, [1.0, 1.0], key)])
    store.states.save([(key, 0, maker.snapshot(key), T0) for key in quiet], version=1)
    store.alerts.record([Alert(alert_id=f"a{key}", type="idle_gpu", rule="idle-gpu-nlp", resource_id=key, status="firing",
                               change="fired", severity="warning", episode_start=T0, fired_at=T0 + 20 * MIN,
                               updated_at=T0 + 30 * MIN, waste_usd=3.5, partition=0) for key in quiet], version=1)  # fmt: skip
    (tmp_path / "rules.yaml").write_text(WITHOUT_NLP)
    pipeline = worker(store, LiveConfig.load(tmp_path))
    assert set(pipeline.saved_states) == set(quiet)
    slow_state_reads(monkeypatch, store, pipeline)

    async def ack(messages):
        pass

    async def go() -> bool:
        try:
            await asyncio.wait_for(pipeline.process(Fleet().minutes(T0 + 40 * MIN, 2, {"b": 70.0}), ack), 15)
            await pipeline.drain()
            return True
        except asyncio.TimeoutError:
            pipeline.stop()
            return False

    assert asyncio.run(go()), "the orphans' states were never read within the look-up's bound"
    assert {a["status"] for a in store.alerts.latest() if a["rule"] == "idle-gpu-nlp"} == {"resolved"}
    assert not set(quiet) & set(pipeline.saved_states)


def test_a_rule_whose_type_changed_keeps_no_episode_of_its_old_type_on_an_evicted_key_as_on_a_held_one(store, tmp_path):
    """Review of 4fab862. h1 and h2 idle 40 minutes (idle-gpu-nlp fires on both); h1 goes quiet and is evicted, h2
    idles on. A reload makes idle-gpu-nlp a stuck_gpu rule: the engine resolves h2's alert and drops its state (another
    type), the alert side resolves h1's. h1's state saved again must not hold the idle episode either: stuck_gpu's
    state is of the same class as idle_gpu's (GpuEpisodeState), so the restore read it as the new rule's, open, and
    the rule went on with it under the alert id just resolved (the id is the rule's name, the resource and the
    episode's start), every change of it dropped as closed."""
    from detector.alerts import alert_id

    config, pipeline, fleet = h1_evicted(store, tmp_path)
    (tmp_path / "rules.yaml").write_text(RULES.replace("    type: idle_gpu\n    match: {resource_type: [gpu_instance, "
                                                       "notebook], tags", "    type: stuck_gpu\n    match: {resource_type: "
                                                       "[gpu_instance, notebook], tags"))  # fmt: skip
    assert config.reload()[1] is None
    assert config.current.ruleset.by_name("idle-gpu-nlp").detector.type == "stuck_gpu"
    run_batches(pipeline, [fleet.minutes(T0 + 60 * MIN, 2, {"h2": 1.0, "b": 70.0})], [])
    resolved = {r: alerts_by_rule(store, r)["idle-gpu-nlp"] for r in ("h1", "h2")}
    assert {r: a["status"] for r, a in resolved.items()} == {"h1": "resolved", "h2": "resolved"}

    for host in ("h1", "h2"):  # as a worker would restore each (the evicted h1 at its next event, or after a restart)
        engine = Engine(config.current.ruleset)
        state = engine.restore(host, store.states.get(host))
        went_on = [alert_id(f.rule, f.resource_id, f.episode_start) for f in engine._open_in(host, state)
                   if f.rule == "idle-gpu-nlp"]  # fmt: skip
        assert went_on == [], (host, went_on, resolved[host]["alert_id"])


@pytest.mark.integration
def test_a_real_worker_restarted_without_a_rule_replies_in_its_incidents_thread(tmp_path):
    """End to end, with the embedded broker, a worker process and the local Slack server: an hour of an idle
    GPU host; the worker posts idle-gpu's incident. It stops; the operator disables the rule (enabled: false)
    and starts it again; another host's events come. The restarted worker replies in the incident's thread
    that it is resolved, its rule no longer loaded, and posts nothing else about it."""
    import shutil

    import yaml

    from detector.testing import LocalSlack
    from streams.embedded import EmbeddedBroker
    from streams.kafka import publish_records
    from streams.process import WorkerProcess, worker_env
    from tests.conftest import ROOT
    from tests.test_secrets import publish_idle_host

    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    with LocalSlack() as slack, EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        env = worker_env(broker.bootstrap, tmp_path / "data", rules, 1, SLACK_BOT_TOKEN="xoxb-local",
                         SLACK_CHANNEL="#ml-cost", SLACK_BASE_URL=slack.api_url)  # fmt: skip
        publish_idle_host(broker.bootstrap)
        worker = WorkerProcess(env, tmp_path / "first.log").start()
        try:
            assert slack.wait_for(lambda calls: any("gpu-1" in c.text_of_blocks() and not c.body.get("thread_ts")
                                                    for c in calls if c.method == "chat.postMessage"), timeout=90), \
                worker.tail()  # fmt: skip
        finally:
            worker.stop()
        (opening,) = [c for c in slack.calls("chat.postMessage") if "gpu-1" in c.text_of_blocks()
                      and "Idle GPUs" in c.text_of_blocks() and not c.body.get("thread_ts")]  # fmt: skip
        posts = len(slack.calls("chat.postMessage"))

        doc = yaml.safe_load((rules / "rules.yaml").read_text())
        for rule in doc["rules"]:
            if rule["name"] == "idle-gpu":
                rule["enabled"] = False
        (rules / "rules.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        later = [{"ts": at(T0 + 3600 + i * 60).isoformat(), "resource_id": "cpu-1", "resource_type": "cpu_instance",
                  "cost_usd": 0.1, "interval_s": 60, "tags": {"team": "nlp", "project": "p", "owner": "o"}}
                 for i in range(3)]  # fmt: skip
        asyncio.run(publish_records(broker.bootstrap, [("resource-usage", "cpu-1", json.dumps(later).encode())]))
        worker = WorkerProcess(env, tmp_path / "second.log").start()
        try:
            assert slack.wait_for(lambda calls: any(c.body.get("thread_ts") == opening.response["ts"]
                                                    for c in calls if c.method == "chat.postMessage"), timeout=90), \
                worker.tail()  # fmt: skip
            worker.wait_until(lambda health: health["partitions"] > 0, timeout=30)
        finally:
            worker.stop()
        replies = [c for c in slack.calls("chat.postMessage") if c.body.get("thread_ts") == opening.response["ts"]]
        assert len(replies) == 1 and "rule removed" in replies[0].text_of_blocks(), [r.text_of_blocks() for r in replies]
        assert "no longer loaded" in replies[0].text_of_blocks()
        assert not [c for c in slack.calls("chat.postMessage")[posts:] if "gpu-1" in c.text_of_blocks()
                    and c.body.get("thread_ts") != opening.response["ts"]]  # fmt: skip
