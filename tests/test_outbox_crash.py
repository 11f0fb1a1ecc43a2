"""A worker killed at any point posts every opening and resolution once, and the outbox's
threads do not trip over each other.

A kill is simulated on the real parts: the store's chdb client dies before its n-th
write (nothing after it happens), Slack (the local server) keeps what it received, and a
fresh alert manager and outbox are built from the same database, as a restarted worker
builds them. Slack must then have received exactly one message opening each incident
and exactly one reply resolving it.
"""

from __future__ import annotations

import threading
import time
from contextlib import nullcontext
from functools import partial
from typing import Any

import pytest

from detector import alerts
from detector.alerts import Alert, AlertManager, AlertMemory
from detector.delivery import Outbox
from detector.detectors import Finding, ResourceInfo
from detector.slack import SlackError, SlackNotifier
from detector.store import Store
from detector.testing import LocalSlack
from tests.helpers import T0
from tests.store_template import migrated_copy


class Killed(Exception):
    """The worker died here (kill -9): nothing after this point ran."""


class DiesBeforeWrite:
    """The store's real ClickHouse client, except that the process dies before its ``n``-th
    write (counting from 0); ``None``: it never dies, it counts."""

    def __init__(self, client: Any, n: int | None) -> None:
        self._client = client
        self._n = n
        self.writes = 0

    def insert(self, *args: Any, **kwargs: Any) -> Any:
        if self._n is not None and self.writes >= self._n:
            raise Killed(f"killed before write {self.writes}")
        self.writes += 1
        return self._client.insert(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def finding(action: str, rid: str, at: float, episode_start: float = T0, fired_at: float = T0 + 1800) -> Finding:
    return Finding(action=action, rule="idle-gpu", type="idle_gpu", resource_id=rid, episode_start=episode_start,
                   fired_at=fired_at, at=at, waste_usd=(at - episode_start) / 100, usd_per_hour=32.77,
                   severity="warning", details={"reason": "gpu_busy"} if action == "resolve" else {},
                   resource=ResourceInfo(resource_id=rid, account="ml-prod", tags={"team": "nlp"}))  # fmt: skip


LATER = T0 + 86_400.0
BATCHES = [
    # Two hosts of one team open together: one group message.
    [finding("fire", "h1", T0 + 1800), finding("fire", "h2", T0 + 1800)],
    [finding("update", "h1", T0 + 2400), finding("update", "h2", T0 + 2400)],
    # h1 resolves (a reply in the group's thread); a third host opens alone, a day later.
    [finding("resolve", "h1", T0 + 3600), finding("fire", "h3", LATER + 1800, LATER, LATER + 1800)],
    [finding("resolve", "h2", LATER + 600), finding("resolve", "h3", LATER + 3600, LATER, LATER + 1800)],
]
HOSTS = {"h1", "h2", "h3"}
"""Each host's incident opens and resolves."""


@pytest.fixture
def slack():
    with LocalSlack() as server:
        yield server


def run_worker(store: Store, slack: LocalSlack, acked: list[int], channel: str) -> None:
    """What the worker does with the batches not yet acknowledged: detect, write, acknowledge,
    deliver (the pipeline's order). A batch is acknowledged once its changes are written."""
    manager = AlertManager(AlertMemory.load(store.memory))
    outbox = Outbox(store, SlackNotifier(token="xoxb-test", channel=channel, base_url=slack.api_url, timeout=2),
                    group_wait_s=0, landing_s=0)  # fmt: skip
    outbox.recover()
    outbox.deliver_pending()
    for i, batch in enumerate(BATCHES):
        if i < len(acked):
            continue
        changes = manager.handle(batch)
        store.alerts.record(changes, version=time.time_ns())
        acked.append(i)
        outbox.add(changes)
        outbox.deliver_pending()
    outbox.deliver_pending()


def posted(slack: LocalSlack, channel: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Alert id → ts of the top-level messages in ``channel`` naming it; alert id → thread of
    each reply naming it."""
    openings: dict[str, list[str]] = {}
    replies: dict[str, list[str]] = {}
    for post in slack.calls("chat.postMessage"):
        if post.body["channel"] != channel:
            continue
        text = post.text_of_blocks()
        for alert_id in ALERT_IDS:
            if f"alert `{alert_id}`" in text:
                if "thread_ts" in post.body:
                    replies.setdefault(alert_id, []).append(post.body["thread_ts"])
                else:
                    openings.setdefault(alert_id, []).append(post.response["ts"])
    return openings, replies


ALERT_IDS = {alerts.alert_id(f.rule, f.resource_id, f.episode_start): f.resource_id for batch in BATCHES for f in batch}
"""Alert id → host."""


def test_a_kill_before_any_write_loses_no_post_and_doubles_none(chdb_client, slack):
    """For every write of a clean run, a worker killed just before it and restarted leaves
    Slack with each opening once and each resolution once, in its opening's thread."""
    counted = DiesBeforeWrite(chdb_client, None)
    run_worker(Store(counted, _fresh(chdb_client, "t_kill_clean").db), slack, [], "#clean")
    clean = posted(slack, "#clean")
    assert {ALERT_IDS[a] for a in clean[0]} == HOSTS and len(clean[1]) == 3
    assert len({ts for (ts,) in clean[0].values()}) == 2  # h1 and h2 in one group message
    assert counted.writes >= 9  # 4 batches of changes, 5 posts marked begun; each pass writes its last post's record (12 in all)
    for n in range(counted.writes + 1):
        store, channel, acked = _fresh(chdb_client, f"t_kill_{n}"), f"#kill-{n}", []
        with pytest.raises(Killed) if n < counted.writes else nullcontext():
            run_worker(Store(DiesBeforeWrite(chdb_client, n), store.db), slack, acked, channel)
        run_worker(store, slack, acked, channel)  # the restarted worker, on the same database
        openings, replies = posted(slack, channel)
        assert {ALERT_IDS[a]: len(ts) for a, ts in openings.items()} == dict.fromkeys(HOSTS, 1), f"killed at {n}"
        assert {ALERT_IDS[a]: len(ts) for a, ts in replies.items()} == dict.fromkeys(HOSTS, 1), f"killed at {n}"
        for alert_id, (thread,) in replies.items():
            assert thread == openings[alert_id][0], f"killed at {n}: {ALERT_IDS[alert_id]} resolved outside its thread"
        assert store.deliveries.undelivered() == [], n


def _fresh(client: Any, name: str) -> Store:
    """A freshly migrated database (a copy of one migrated once for the client: running the
    migrations is most of a kill test's time, and a kill test wants a store for each write),
    checked up to date as a migrating worker would find it: no migration left, no table missing."""
    store = migrated_copy(client, name)
    assert store.migrate() == [] and store.schema.missing_tables() == [], name
    return store


def idle(change: str = "fired", alert_id: str = "a1") -> Alert:
    resolved = change == "resolved"
    return Alert(alert_id=alert_id, type="idle_gpu", rule="idle-gpu", resource_id=f"host-{alert_id}",
                 status="resolved" if resolved else "firing", change=change, severity="warning", episode_start=T0,
                 fired_at=T0 + 1800, updated_at=T0 + (5400 if resolved else 1800),
                 resolved_at=T0 + 5400 if resolved else None, waste_usd=10.0, usd_per_hour=32.77,
                 tags={"team": alert_id}, details={"reason": "gpu_busy"} if resolved else {})  # fmt: skip


def impatient(slack: LocalSlack) -> SlackNotifier:
    return SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=1)


@pytest.mark.parametrize("change", ["fired", "resolved"])
def test_a_post_hanging_when_the_worker_dies_is_looked_for_after_the_restart(slack, store, change):
    """The post hung (Slack took it, the answer never came) and the worker died: the next
    worker finds it in the channel (or the thread) and does not post it again."""
    store.alerts.record([idle()], version=1)
    outbox = Outbox(store, impatient(slack), group_wait_s=0)
    outbox.add([idle()])
    if change == "resolved":
        outbox.deliver_pending()
        store.alerts.record([idle("resolved")], version=2)
        outbox.add([idle("resolved")])
    slack.hang(1.5)
    with pytest.raises(SlackError):
        outbox.deliver_pending()  # the worker dies here, with the post in flight
    slack.hang(0)
    expected = 2 if change == "resolved" else 1
    assert slack.wait_for(lambda reqs: sum(r.method == "chat.postMessage" for r in reqs) == expected, timeout=10)

    restarted = Outbox(store, impatient(slack), group_wait_s=0, landing_s=0)  # it has landed: look at once
    assert restarted.recover() == 1
    restarted.deliver_pending()
    posts = slack.calls("chat.postMessage")
    assert len(posts) == expected  # found, not posted twice
    assert store.deliveries.undelivered() == []
    assert store.deliveries.made()[("a1", change)] == ("#ml-cost", posts[0].response["ts"])
    lookups = slack.calls("conversations.replies" if change == "resolved" else "conversations.history")
    assert len(lookups) == 1


def test_a_post_begun_but_never_sent_is_posted_after_the_restart(slack, store):
    """The worker died after marking the post begun but before sending it: the lookup finds
    nothing, so it is posted (once)."""
    store.alerts.record([idle()], version=1)
    store.deliveries.record_attempt(["a1"], "fired")
    restarted = Outbox(store, impatient(slack), group_wait_s=0, landing_s=0)
    assert restarted.recover() == 1
    assert restarted.deliver_pending() == 1
    assert len(slack.calls("chat.postMessage")) == 1 and len(slack.calls("conversations.history")) == 1


class PausingNotifier(SlackNotifier):
    """A real notifier that stops inside its first ``edit`` until the test lets it go on."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.editing = threading.Event()
        self.go_on = threading.Event()

    def edit(self, alert: Alert, thread: tuple[str, str], actions: list[dict[str, Any]] | None = None) -> None:
        if not self.editing.is_set():
            self.editing.set()
            assert self.go_on.wait(10)
        super().edit(alert, thread, actions)


def test_a_change_added_while_a_message_is_edited_is_kept(slack, store):
    """The event loop adds a resolution while the delivery thread edits the same incident's
    message: the edit finishes, the resolution is posted (no KeyError, nothing lost)."""
    notifier = PausingNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=2)
    outbox = Outbox(store, notifier, group_wait_s=0, edit_every_s=0)
    outbox.add([idle()])
    outbox.deliver_pending()
    outbox.add([idle("updated")])
    errors: list[BaseException] = []

    def deliver() -> None:
        try:
            outbox.deliver_pending()
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            errors.append(exc)

    thread = threading.Thread(target=deliver)
    thread.start()
    assert notifier.editing.wait(10)
    outbox.add([idle("resolved")])  # from the event loop, mid-edit
    notifier.go_on.set()
    thread.join(10)
    assert errors == []
    outbox.deliver_pending()
    replies = [p for p in slack.calls("chat.postMessage") if "thread_ts" in p.body]
    assert len(replies) == 1 and not outbox.has_work and len(outbox) == 0


def edited(alert_id: str, requests: list) -> bool:
    return any(r.method == "chat.update" and f"alert `{alert_id}`" in r.text_of_blocks() for r in requests)


def test_adds_hammered_during_delivery_passes_are_all_posted_once(slack, store):
    """One thread adds openings, cost updates and resolutions while another runs delivery
    passes back to back: each resolution is added the moment Slack sees its incident's edit,
    while the delivery thread finishes that edit. Every incident is opened once and resolved
    once, and the delivery thread never fails."""
    outbox = Outbox(store, SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=5),
                    group_wait_s=0, edit_every_s=0)  # fmt: skip
    ids = [f"a{i}" for i in range(40)]
    done = threading.Event()
    errors: list[BaseException] = []

    def add() -> None:
        try:
            outbox.add([idle("fired", alert_id) for alert_id in ids])
            for alert_id in ids:
                outbox.add([idle("updated", alert_id)])
                assert slack.wait_for(partial(edited, alert_id), timeout=10), alert_id
                outbox.add([idle("resolved", alert_id)])
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            errors.append(exc)
        finally:
            done.set()

    def deliver() -> None:
        try:
            while not done.is_set() or outbox.has_work:
                outbox.deliver_pending()
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            errors.append(exc)
            done.set()

    threads = [threading.Thread(target=add), threading.Thread(target=deliver)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and not any(t.is_alive() for t in threads)
    posts = slack.calls("chat.postMessage")
    opened = [p for p in posts if "thread_ts" not in p.body]
    resolved = [p for p in posts if "thread_ts" in p.body]
    named = sorted(a for p in opened for a in ids if f"alert `{a}`" in p.text_of_blocks())
    assert named == sorted(ids)  # each opening once
    assert sorted(a for p in resolved for a in ids if f"alert `{a}`" in p.text_of_blocks()) == sorted(ids)


def test_a_post_that_lands_after_the_restart_is_not_posted_twice(slack, store):
    """The worker died while a post hung, and Slack takes that post only after the next worker
    has started: the next worker waits out the time a cut-off post may still land (from the
    attempt's recorded time), then finds it in the channel instead of posting it again."""
    store.alerts.record([idle()], version=1)
    outbox = Outbox(store, impatient(slack), group_wait_s=0)  # the client gives up after 1 s
    outbox.add([idle()])
    slack.hang(2.5)  # Slack takes the post 2.5 s after it was sent
    with pytest.raises(SlackError):
        outbox.deliver_pending()  # the worker dies here, with the post in flight
    restarted = Outbox(store, impatient(slack), group_wait_s=0, landing_s=4.0)
    assert restarted.recover() == 1
    assert restarted.deliver_pending() == 0 and restarted.hold_s > 0  # too early to tell: it waits
    slack.hang(0)
    deadline = time.monotonic() + 20
    while store.deliveries.undelivered() and time.monotonic() < deadline:
        time.sleep(min(restarted.hold_s, 0.5) or 0.05)  # the outbox's own hold, as the worker's task waits
        restarted.deliver_pending()
    assert store.deliveries.undelivered() == []
    assert len(slack.calls("chat.postMessage")) == 1  # the late one, found; not posted again


def test_a_group_posted_before_a_kill_is_not_posted_again_nor_taken_for_a_new_member(slack, store):
    """Two openings of a team went out as one message, then the worker died before recording
    it. After the restart a third opening of the same team joins the queue: the two are found
    in the channel (each once), and the third is posted, not taken as delivered with them."""
    first, second, third = idle(alert_id="a1"), idle(alert_id="a2"), idle(alert_id="a3")
    for a in (first, second, third):
        a.tags = {"team": "nlp"}
    store.alerts.record([first, second], version=1)
    store.deliveries.record_attempt(["a1", "a2"], "fired")
    impatient(slack).post_group([first, second])  # it landed; the worker died before recording it
    restarted = Outbox(store, impatient(slack), group_wait_s=0, landing_s=0)
    assert restarted.recover() == 2
    store.alerts.record([third], version=2)
    restarted.add([third])
    restarted.deliver_pending()
    restarted.deliver_pending()
    opened = [alert_id for p in slack.calls("chat.postMessage") if "thread_ts" not in p.body
              for alert_id in ("a1", "a2", "a3") if f"alert `{alert_id}`" in p.text_of_blocks()]  # fmt: skip
    assert sorted(opened) == ["a1", "a2", "a3"] and store.deliveries.undelivered() == []


class RefusesWrite(DiesBeforeWrite):
    """The store's real client, refusing its ``n``-th write once (a store error, not a kill)."""

    def insert(self, *args: Any, **kwargs: Any) -> Any:
        if self.writes == self._n:
            self._n = None
            raise ConnectionError("store unavailable")
        self.writes += 1
        return self._client.insert(*args, **kwargs)


def test_a_post_is_one_write_its_record_going_with_the_next_posts_mark(chdb_client, slack):
    """Five alerts of five teams (five messages) cost six writes, not ten: each post's mark
    carries the deliveries before it, the pass's end the last one; all are recorded."""
    counted = DiesBeforeWrite(chdb_client, None)
    store = Store(counted, _fresh(chdb_client, "t_one_write").db)
    ids = [f"a{i}" for i in range(5)]
    store.alerts.record([idle(alert_id=a) for a in ids], version=1)
    outbox = Outbox(store, impatient(slack), group_wait_s=0, landing_s=0)
    outbox.add([idle(alert_id=a) for a in ids])
    before = counted.writes
    assert outbox.deliver_pending() == 5
    assert counted.writes - before == 6
    assert {a for a, _ in store.deliveries.made()} == set(ids) and store.deliveries.attempted() == {}
    assert store.deliveries.undelivered() == []


def test_deliveries_the_store_refused_are_written_by_the_next_pass_and_nothing_is_posted_twice(chdb_client, slack):
    """The pass's last write (the last post's record) fails: the posts are known as made, the
    record is written by the next pass, and a restart then finds nothing to post or look for."""
    refusing = RefusesWrite(chdb_client, None)
    store = Store(refusing, _fresh(chdb_client, "t_refused_record").db)
    store.alerts.record([idle(alert_id=a) for a in ("a1", "a2")], version=1)
    outbox = Outbox(store, impatient(slack), group_wait_s=0, landing_s=0)
    outbox.add([idle(alert_id=a) for a in ("a1", "a2")])
    refusing._n = refusing.writes + 2  # the two marks pass, the end-of-pass record fails
    with pytest.raises(ConnectionError):
        outbox.deliver_pending()
    assert len(slack.calls("chat.postMessage")) == 2
    assert set(store.deliveries.attempted()) == {("a2", "fired")}  # a1's record went with a2's mark
    assert outbox.deliver_pending() == 0  # the retry: nothing posted again, the record written
    assert store.deliveries.attempted() == {} and store.deliveries.undelivered() == []
    restarted = Outbox(store, impatient(slack), group_wait_s=0, landing_s=0)
    assert restarted.recover() == 0
    assert len(slack.calls("chat.postMessage")) == 2 and slack.calls("conversations.history") == []


MULTI_IDS = ("a1", "a2", "g1", "g2", "a3")
"""Openings of four messages (g1 and g2 one team's group), then their resolutions: each phase one pass."""


def _multi(change: str) -> list[Alert]:
    out = [idle(change, alert_id) for alert_id in MULTI_IDS]
    for a in out:
        if a.alert_id.startswith("g"):
            a.tags = {"team": "grp"}
    return out


def _run_multi(store: Store, slack: LocalSlack, acked: list[int], channel: str) -> None:
    outbox = Outbox(store, SlackNotifier(token="xoxb-test", channel=channel, base_url=slack.api_url, timeout=2),
                    group_wait_s=0, landing_s=0)  # fmt: skip
    outbox.recover()
    outbox.deliver_pending()
    for i, change in enumerate(("fired", "resolved")):
        if i < len(acked):
            continue
        store.alerts.record(_multi(change), version=i + 1)
        acked.append(i)
        outbox.add(_multi(change))
        outbox.deliver_pending()
    outbox.deliver_pending()


def test_a_kill_before_any_write_of_passes_of_several_posts_loses_none_and_doubles_none(chdb_client, slack):
    """Passes that post several messages (four openings, one a group of two, then their five
    resolutions): killed before each write and restarted, Slack has each opening once and
    each resolution once, in its opening's thread."""
    counted = DiesBeforeWrite(chdb_client, None)
    _run_multi(Store(counted, _fresh(chdb_client, "t_multi_clean").db), slack, [], "#multi-clean")
    total = counted.writes
    assert len(slack.calls("chat.postMessage")) == 9 and total == 14  # Slack's start, 2 alert writes, 9 marks, 2 pass ends
    for n in range(total + 1):
        store, channel, acked = _fresh(chdb_client, f"t_multi_{n}"), f"#multi-{n}", []
        with pytest.raises(Killed) if n < total else nullcontext():
            _run_multi(Store(DiesBeforeWrite(chdb_client, n), store.db), slack, acked, channel)
        _run_multi(store, slack, acked, channel)
        openings: dict[str, list[str]] = {}
        replies: dict[str, list[str]] = {}
        for post in slack.calls("chat.postMessage"):
            if post.body["channel"] != channel:
                continue
            for alert_id in MULTI_IDS:
                if f"alert `{alert_id}`" in post.text_of_blocks():
                    if "thread_ts" in post.body:
                        replies.setdefault(alert_id, []).append(post.body["thread_ts"])
                    else:
                        openings.setdefault(alert_id, []).append(post.response["ts"])
        assert {a: len(ts) for a, ts in openings.items()} == dict.fromkeys(MULTI_IDS, 1), f"killed at {n}"
        assert {a: len(ts) for a, ts in replies.items()} == dict.fromkeys(MULTI_IDS, 1), f"killed at {n}"
        assert openings["g1"] == openings["g2"], f"killed at {n}: the group split"
        for alert_id, (thread,) in replies.items():
            assert thread == openings[alert_id][0], f"killed at {n}: {alert_id} resolved outside its thread"
        assert store.deliveries.undelivered() == [] and store.deliveries.attempted() == {}, n


class SlowEdits(SlackNotifier):
    """A real notifier whose edits take ``edit_s`` (Slack slow, or rate-limited), and which notes
    the wall time each post came back."""

    def __init__(self, edit_s: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.edit_s = edit_s
        self.posted_at: dict[str, float] = {}

    def post(self, alert: Alert, *args: Any, **kwargs: Any) -> tuple[str, str]:
        result = super().post(alert, *args, **kwargs)
        self.posted_at[alert.alert_id] = time.time()
        return result

    def edit(self, *args: Any, **kwargs: Any) -> None:
        time.sleep(self.edit_s)
        super().edit(*args, **kwargs)


def _delivered_at(store: Store, alert_id: str, kind: str) -> float:
    rows = store.query(f"SELECT toUnixTimestamp64Milli(delivered_at) AS at FROM {store.db}.alert_deliveries "
                            "WHERE alert_id = %(id)s AND kind = %(kind)s", {"id": alert_id, "kind": kind})  # fmt: skip
    return min(r["at"] for r in rows) / 1000


def test_a_delivery_is_stamped_with_its_posts_time_not_the_time_its_record_was_written(chdb_client, slack):
    """A post's record goes into the store later than the post (with the next mark, at the
    pass's end, or the next pass when the store refused it): its ``delivered_at``, which the
    ``incidents`` report counts time to acknowledge from, is still when Slack took the post."""
    refusing = RefusesWrite(chdb_client, None)
    store = Store(refusing, _fresh(chdb_client, "t_posted_at").db)
    store.alerts.record([idle(alert_id=a) for a in ("a1", "a2", "a3")], version=1)
    notifier = SlowEdits(1.5, token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=5)
    outbox = Outbox(store, notifier, group_wait_s=0, landing_s=0, edit_every_s=0)
    outbox.add([idle(alert_id="a1")])
    outbox.deliver_pending()
    outbox.add([idle(alert_id="a2"), idle("updated", "a1")])  # a2 posted, then a1's message edited (slowly)
    outbox.deliver_pending()
    assert abs(_delivered_at(store, "a2", "fired") - notifier.posted_at["a2"]) < 0.5
    outbox.add([idle(alert_id="a3")])
    refusing._n = refusing.writes + 1  # a3's mark passes, its record (the pass's end) is refused
    with pytest.raises(ConnectionError):
        outbox.deliver_pending()
    time.sleep(1.5)
    outbox.deliver_pending()  # the next pass writes it
    assert abs(_delivered_at(store, "a3", "fired") - notifier.posted_at["a3"]) < 0.5


class DiesEditing(SlackNotifier):
    """A real notifier; the worker is killed (the store's client too) inside its first edit."""

    def __init__(self, client: DiesBeforeWrite, **kw: Any) -> None:
        super().__init__(**kw)
        self.client = client

    def edit(self, *args: Any, **kwargs: Any) -> None:
        self.client._n = self.client.writes  # nothing more reaches the store
        raise Killed("killed while editing a message")


def test_a_kill_while_the_pass_edits_messages_leaves_its_posts_recorded(chdb_client, slack):
    """A pass posts, then edits other incidents' messages (Slack calls, rate-limited): the
    posts' records are written before the edits, so a worker killed during them leaves no post
    to look for in Slack, nor the restarted outbox waiting for one to land."""
    client = DiesBeforeWrite(chdb_client, None)
    store = Store(client, _fresh(chdb_client, "t_kill_editing").db)
    store.alerts.record([idle(alert_id=a) for a in ("a1", "a2")], version=1)
    outbox = Outbox(store, DiesEditing(client, token="xoxb-test", channel="#ml-cost", base_url=slack.api_url,
                                       timeout=2), group_wait_s=0, landing_s=30, edit_every_s=0)  # fmt: skip
    outbox.add([idle(alert_id="a1")])
    outbox.deliver_pending()
    outbox.add([idle(alert_id="a2"), idle("updated", "a1")])
    with pytest.raises(Killed):
        outbox.deliver_pending()  # a2 posted, then killed editing a1's message
    assert len(slack.calls("chat.postMessage")) == 2
    restarted = Outbox(Store(chdb_client, store.db), impatient(slack), group_wait_s=0, landing_s=30)
    assert restarted.recover() == 0 and store.deliveries.attempted() == {}
