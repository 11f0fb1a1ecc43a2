"""The events' insert in a child process (``streams.event_writer``), against a store server
and against the worker's embedded engine, which the child reaches through the worker.

The child must store exactly what the writer thread stores (the same rows, ids and prices),
leave out what is stored already, name the message the store refuses, and, killed, be a store
unavailable for one try (the pipeline retries, dropping nothing) rather than a lost batch.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from detector.alerts import AlertManager
from detector.delivery import Outbox
from detector.engine import Engine
from detector.events import _TYPES, EventDecoder, RunEvent
from detector.limits import Limits
from detector.metrics import METRICS
from detector.store import Store, connect
from detector.store.batch import KIND, event_ids
from streams.children import die_with_parent
from streams.event_writer import (
    ANSWER_WITHIN_S,
    NotMember,
    ProcessEventWriter,
    StoreUnavailable,
    ThreadEventWriter,
    child_decoder,
    decode_items,
    encode_items,
    usable_cpus,
    writer_for,
)
from streams.membership import now as membership_clock
from streams.pipeline import Message, Pipeline
from tests.conftest import fresh_store
from tests.helpers import MIN, T0, at, scrape, usage
from tests.test_contract_bounds import NOW, SLOW, messages

DECODER = EventDecoder(clock=lambda: NOW)
"""The worker's decoder (its clock a day before the contract's last time)."""


def message(topic: str, partition: int, offset: int, events: list) -> tuple[Message, list]:
    """An item as the pipeline hands it over: the message, and what the worker decoded from it."""
    value = msgspec.json.encode(events)
    return Message(topic, partition, offset, None, value), DECODER.decode(topic, value)


def plain(items: list) -> list[tuple]:
    """Items as (topic, partition, offset, value, events), to compare the worker's with the child's."""
    return [(m.topic, m.partition, m.offset, m.value, events) for m, events in items]


def items():
    """Messages of every event type: GPU scrapes, usage with and without a price, a run event
    with metrics, and extras a JSON document may carry (an integer past 64 bits, unicode, nesting)."""
    out = [message("gpu-metrics", i % 3, i, scrape(T0 + i * MIN, [0.0, 55.5, 100.0], rid=f"h{i % 4}", sm=[0.0, 0.25, None]))
           for i in range(12)]  # fmt: skip
    out += [message("resource-usage", i % 2, i, [usage(T0 + i * MIN, rid=f"h{i % 4}", usd_per_hour=None if i % 3 else 32.0)])
            for i in range(8)]  # fmt: skip
    hostile = {"ts": "2026-11-02T00:00:00.123456Z", "resource_id": "cpu-1", "resource_type": "cpu_instance",
               "state": "running", "interval_s": 60, "big": 2**70, "name": "Grüße ' \" \\ \u2028",
               "nested": {"a": [1, 2.5, None, True]}}  # fmt: skip
    out.append(message("resource-usage", 0, 8, [hostile]))
    run = RunEvent(ts=at(T0 + 5 * MIN), run_id="run-1", status="failed", resource_ids=["h1", "h2"], gpu_count=16,
                   project="llm", error="NCCL timeout", tags={"team": "nlp"}, metrics={"loss": 1.25}, step=40)  # fmt: skip
    out.append(message("run-events", 1, 0, [run]))
    return out


def digest(store: Store) -> dict[str, tuple[int, int]]:
    out = {}
    for table in ("gpu_metrics", "resource_usage", "run_events"):
        row = store.query(f"SELECT count() AS n, sum(cityHash64(formatRowNoNewline('TSV', *))) AS h FROM {store.db}.{table}")[0]
        out[table] = (row["n"], row["h"] % 2**64)
    return out


def test_the_child_reads_the_same_events_with_the_same_ids():
    """What the child decodes from the values is what the worker decoded: equal events, equal
    ids, in order, extras included (an integer past 64 bits, unicode, nesting)."""
    sent = items()
    back = decode_items(encode_items(sent), child_decoder())
    assert plain(back) == plain(sent)
    for (_, events), (_, sent_events) in zip(back, sent, strict=True):
        kind = KIND[type(events[0])][0]
        assert event_ids(kind, events) == event_ids(kind, sent_events)
    assert back[20][1][0].extra["big"] == 2**70


@pytest.mark.parametrize("topic", list(_TYPES))
@SLOW
@given(data=st.data())
def test_whatever_the_worker_accepts_the_child_reads_the_same(topic, data):
    """Messages drawn from the contract's own bounds (every field, any JSON in ``extra``), as the
    worker's decoder accepts them under the default limits: the child, whose decoder has no clock
    or limits, reads equal events, with equal ids."""
    value = msgspec.json.encode(data.draw(messages(topic, Limits())))
    events = DECODER.decode(topic, value)
    sent = [(Message(topic, 0, 0, None, value), events)]
    back = decode_items(encode_items(sent), child_decoder())
    assert plain(back) == plain(sent)
    kind = KIND[type(events[0])][0]
    assert event_ids(kind, back[0][1]) == event_ids(kind, events)


def test_a_batch_the_child_cannot_read_is_written_by_the_thread(server, remote, ruleset, request):
    """A message the child's decoder refuses (a worker and a child that disagree: a bug) does not
    stall the worker: the batch is written in the writer thread instead, and logged."""
    writer = ProcessEventWriter(server.url, remote.db, remote)
    request.addfinalizer(writer.close)
    sent = items()[:3]
    sent[1][0].value = b"{not json"  # what the child gets differs from what the worker decoded
    assert writer.write(sent, ruleset.pricing) == []
    assert remote.count("gpu_metrics") == 3 * 3


def test_a_child_process_stores_what_the_thread_stores(server, request, ruleset):
    """The same items, one database written by the writer thread, one by the child: every row
    equal (ids, prices, sources); written again, nothing is stored twice and the duplicates are
    counted in the worker's metrics."""
    stores = []
    for side in ("thread", "child"):
        store = Store(connect(server.url), database=f"ew_{side}")
        request.addfinalizer(store.close)
        store.client.command(f"DROP DATABASE IF EXISTS {store.db}")
        store.migrate()
        stores.append(store)
    thread, child = ThreadEventWriter(stores[0]), ProcessEventWriter(server.url, stores[1].db)
    request.addfinalizer(child.close)
    assert thread.write(items(), ruleset.pricing) == child.write(items(), ruleset.pricing) == []
    assert digest(stores[0]) == digest(stores[1])
    assert digest(stores[1])["gpu_metrics"][0] == 12 * 3 and digest(stores[1])["run_events"][0] == 1
    before = METRICS.duplicates_skipped._value.get()
    assert child.write(items(), ruleset.pricing) == []
    assert METRICS.duplicates_skipped._value.get() - before == sum(len(events) for _, events in items())
    assert digest(stores[0]) == digest(stores[1])


def child_writer(engine: str, request) -> tuple[Store, ProcessEventWriter]:
    """A store and a writer child storing into it: with its own client to a server (``server``), or through
    the worker to the embedded engine (``embedded``); closed at the test's end."""
    if engine == "server":
        store = request.getfixturevalue("remote")
        writer = ProcessEventWriter(request.getfixturevalue("server").url, store.db)
    else:
        store = request.getfixturevalue("store")
        writer = ProcessEventWriter(None, store.db, store)
    request.addfinalizer(writer.close)
    return store, writer


@pytest.mark.parametrize("engine", ["server", "embedded"])
def test_a_killed_child_is_one_failed_try_and_the_next_starts_another(engine, ruleset, request):
    """kill -9 of the child between writes (its own client to a server, or reaching the embedded
    engine through the worker): the next write fails as a store unavailable (the pipeline retries
    it), the one after starts a new child, and what both stored is stored once."""
    remote, writer = child_writer(engine, request)
    first, second = items()[:10], items()[10:]
    assert writer.write(first, ruleset.pricing) == []
    assert writer._child is not None
    os.kill(writer._child.pid, signal.SIGKILL)
    with pytest.raises(StoreUnavailable, match="exited"):
        writer.write(second, ruleset.pricing)
    assert writer.write(second, ruleset.pricing) == []
    assert writer.write(items(), ruleset.pricing) == []
    assert remote.count("gpu_metrics") == 12 * 3 and remote.count("resource_usage") == 8 + 1


def gpu_message(offset: int, t: float, host: str = "h1") -> Message:
    value = json.dumps([{"ts": at(t).isoformat(), "resource_id": host, "gpu_index": g, "util_pct": 50.0,
                         "tags": {"team": "nlp"}} for g in range(2)]).encode()  # fmt: skip
    return Message("gpu-metrics", 0, offset, host.encode(), value)


@pytest.mark.parametrize("engine", ["server", "embedded"])
def test_the_message_the_store_refuses_is_named_from_the_child(engine, ruleset, request):
    """The pipeline with its inserts in a child process, on a store server (the child's own
    client) and on the embedded engine (the child's calls run by the worker, the error's code sent
    back): ClickHouse refuses one message's rows; that message alone is dead-lettered with the
    reason, every other one is stored once, and acknowledgements go on past it in order, as with
    the writer thread. On the embedded engine the second batch, the poisoned one, was prepared
    ahead by the child (the first started it)."""
    if engine == "server":
        remote, dsn = request.getfixturevalue("remote"), request.getfixturevalue("server").url
    else:
        remote, dsn = request.getfixturevalue("store"), "chdb://memory"
    remote.client.command(f"ALTER TABLE {remote.db}.gpu_metrics ADD CONSTRAINT no_poison CHECK resource_id != 'poison'")
    dead: list[bytes] = []

    async def send_dead_letter(key, value):
        dead.append(value)

    writer = writer_for(remote, dsn, remote.db, "process")
    assert isinstance(writer, ProcessEventWriter) and (writer.relay is remote) == (engine == "embedded")
    kinds = _exchanges(writer)
    pipeline = Pipeline(engine=Engine(ruleset), store=remote, outbox=Outbox(remote, None), manager=AlertManager(),
                        send_dead_letter=send_dead_letter, event_writer=writer)  # fmt: skip
    messages = [gpu_message(i, T0 + i * 60) for i in range(20)]
    messages[15] = gpu_message(15, T0 + 15 * 60, host="poison")
    acked: list[int] = []

    async def ack(done):
        acked.extend(m.offset for m in done)

    async def go():
        for batch in (messages[:12], messages[12:]):
            await pipeline.process(batch, ack)
            await pipeline.drain()  # (the first batch's write starts the child before the second is read)

    try:
        asyncio.run(asyncio.wait_for(go(), 120))
    finally:
        writer.close()
    assert remote.count("gpu_metrics") == 19 * 2
    (record,) = [json.loads(d) for d in dead]
    assert record["offset"] == 15 and "no_poison" in record["reason"] and "store refused" in record["reason"]
    assert acked == list(range(20))
    assert kinds == (["prepare", "write", "prepare", "write"] if engine == "embedded" else ["write", "write"])


def test_where_the_inserts_run_by_mode_cpus_and_store(store, server):
    """``process`` writes in a child, ``auto`` too when there are two CPUs for it, ``thread``
    never; with a server the child has its own client, with the embedded engine (one per
    process: the worker's) it reaches it through the worker."""
    embedded = writer_for(store, "chdb:///tmp/x", "db", "auto", cpus=2)
    assert isinstance(embedded, ProcessEventWriter) and embedded.relay is store and embedded.dsn is None
    assert isinstance(writer_for(store, "chdb://memory", "db", "process", cpus=1), ProcessEventWriter)
    assert isinstance(writer_for(store, "chdb:///tmp/x", "db", "auto", cpus=1), ThreadEventWriter)
    assert isinstance(writer_for(store, "chdb:///tmp/x", "db", "thread", cpus=8), ThreadEventWriter)
    served = writer_for(store, server.url, "db", "auto", cpus=2)
    assert isinstance(served, ProcessEventWriter) and served.relay is None and served.dsn == server.url
    assert isinstance(writer_for(store, server.url, "db", "process", cpus=1), ProcessEventWriter)
    assert isinstance(writer_for(store, server.url, "db", "auto", cpus=1.5), ThreadEventWriter)  # one CPU and a half: no gain
    assert isinstance(writer_for(store, server.url, "db", "thread", cpus=8), ThreadEventWriter)
    assert 0 < usable_cpus() <= (os.cpu_count() or 1)


def test_the_worker_logs_which_writer_it_picked(store, server):
    """An operator tells the three apart from the log, not from the process list."""
    with capture_logs() as logs:
        writer_for(store, "chdb:///tmp/x", "db", "auto", cpus=1)
        writer_for(store, "chdb:///tmp/x", "db", "auto", cpus=2)
        writer_for(store, server.url, "db", "process", cpus=1)
    picked = [(entry["writer"], entry["mode"], entry["usable_cpus"]) for entry in logs if entry["event"] == "event_writer"]
    assert picked == [("thread", "auto", 1), ("child, through the worker", "auto", 2),
                      ("child, own client", "process", 1)]  # fmt: skip


def test_a_closed_writer_writes_nothing(server, ruleset):
    writer = ProcessEventWriter(server.url, "nowhere")
    writer.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        writer.write(items()[:1], ruleset.pricing)


def test_a_child_that_cannot_reach_the_store_is_a_store_unavailable(ruleset, request):
    """No server where the DSN points: the write fails as a store unavailable naming why (the
    pipeline retries with backoff and reports the stall), not a traceback or a hang."""
    from streams.embedded import free_port

    writer = ProcessEventWriter(f"http://127.0.0.1:{free_port()}", "nowhere")
    request.addfinalizer(writer.close)
    with pytest.raises(StoreUnavailable, match="cannot reach the store"):
        writer.write(items()[:1], ruleset.pricing)


def test_a_child_that_cannot_reach_the_store_tries_it_again_at_the_next_write(ruleset, request):
    """The store unreachable for a while: every try asks the store again and says why it failed
    (the stall reason the pipeline reports), rather than finding the child that said so gone."""
    from streams.embedded import free_port

    writer = ProcessEventWriter(f"http://127.0.0.1:{free_port()}", "nowhere")
    request.addfinalizer(writer.close)
    for _ in range(3):
        with pytest.raises(StoreUnavailable, match="cannot reach the store"):
            writer.write(items()[:1], ruleset.pricing)


_WORKER = """
import sys
from streams.event_writer import ProcessEventWriter
from tests.test_event_writer import items
writer = ProcessEventWriter(sys.argv[1], sys.argv[2])
sent = items()
writer.write(sent[:10], None)
print(writer._child.pid, flush=True)
sys.stdin.readline()
writer.write(sent[10:], None)
"""


def _waiting_at(port: int) -> bool:
    """Whether bytes wait unread at the server on ``port`` (a request it has not read yet)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and int(fields[4].split(":")[1], 16) > 0:
            return True
    return False


def _stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` has stopped. ``kill(SIGSTOP)`` returns before they do (2-5 ms
    here when idle, far longer on a loaded machine), and a handler thread woken by the signal while a
    request arrives reads the request before it stops: the request then waits in the server's memory,
    where no socket shows it, and the test would wait in vain for it to reach the store."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "stat").read_text().split(") ")[1][0] != "T":
                return False
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
    return True


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    except FileNotFoundError:
        return True


def test_a_killed_worker_takes_its_child_with_it(server, remote):
    """kill -9 of the worker while its child waits on the store: the child goes too, as the
    writer thread's insert would. Left behind, it would store the batch after the worker is
    gone, racing the next holder of the partitions, which reads those messages again and checks
    what is stored before it inserts (so the same events could be stored twice)."""
    root = Path(__file__).resolve().parent.parent
    worker = subprocess.Popen([sys.executable, "-c", _WORKER, server.url, remote.db], cwd=root,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=die_with_parent())  # fmt: skip
    try:
        assert worker.stdout is not None and worker.stdin is not None
        child = int(worker.stdout.readline())
        stored = remote.count("gpu_metrics")
        assert stored == 10 * 3
        os.kill(server.proc.pid, signal.SIGSTOP)  # the store hangs: the child's next request waits there
        try:
            deadline = time.monotonic() + 60
            while not _stopped(server.proc.pid):  # (a thread not yet stopped would read the request first)
                assert time.monotonic() < deadline, "the store server never stopped"
                time.sleep(0.01)
            worker.stdin.write(b"go\n")
            worker.stdin.flush()
            deadline = time.monotonic() + 60
            while not _waiting_at(server.port):
                assert time.monotonic() < deadline, "the child's request never reached the store"
                time.sleep(0.05)
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait()
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while not _gone(child):
            assert time.monotonic() < deadline, "the child outlived its worker"
            time.sleep(0.05)
        assert remote.count("gpu_metrics") == stored
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def _open_files() -> set[tuple[str, str]]:
    """This process's open file descriptors, each with what it refers to (a pipe's inode, a socket's), so that one
    opened where another thread closed one shows as new, which their count alone would not."""
    opened = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            opened.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:  # (closed since it was listed; listdir's own descriptor among them)
            continue
    return opened


def test_a_child_that_cannot_be_started_is_a_store_unavailable(server, remote, ruleset, request, monkeypatch):
    """No process can be started (a fork refused by a pids or memory limit; here, no interpreter
    where it was): the try fails as a store unavailable, which the pipeline retries, not as an
    error that ends the worker; nothing is left open; the next try, able to start one, writes."""
    writer = ProcessEventWriter(server.url, remote.db)
    request.addfinalizer(writer.close)
    open_before = _open_files()
    monkeypatch.setattr(sys, "executable", "/nonexistent/python3")
    with pytest.raises(StoreUnavailable, match="cannot start the event writer process"):
        writer.write(items()[:1], ruleset.pricing)
    assert _open_files() <= open_before  # (another thread may close one meanwhile: none opened is kept)
    monkeypatch.undo()
    assert writer.write(items()[:1], ruleset.pricing) == []
    assert remote.count("gpu_metrics") == 3


@pytest.mark.parametrize(("files", "quota"), [
    ({"cpu.max": "150000 100000\n"}, 1.5),  # cgroup v2
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1.0),  # cgroup v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({}, None),
])  # fmt: skip
def test_a_containers_cpu_limit_caps_the_cpus_auto_counts(tmp_path, files, quota):
    """``limits.cpu`` as the kernel shows it, under cgroup v2 and under v1 (a node still on v1
    with a one-CPU limit must keep the inserts in the thread: a child there only adds work)."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    affinity = len(os.sched_getaffinity(0))
    assert usable_cpus(tmp_path) == (affinity if quota is None else min(affinity, quota))


def test_a_child_that_gives_no_answer_is_killed_and_the_next_write_starts_another(server, remote, ruleset, request):
    """A child stopped mid-write (SIGSTOP: hung, as a bug or a stuck client would leave it): the
    write waiting on it ends as a store unavailable after ``answer_within_s``, the child is
    killed, not left behind, and the next write stores the batch with a new child, once."""
    writer = ProcessEventWriter(server.url, remote.db)
    request.addfinalizer(writer.close)
    assert writer.write(items()[:2], ruleset.pricing) == []
    hung = writer._child
    assert hung is not None
    writer.answer_within_s = 1.0
    os.kill(hung.pid, signal.SIGSTOP)
    with pytest.raises(StoreUnavailable, match="no answer within 1 s"):
        writer.write(items(), ruleset.pricing)
    assert hung.poll() is not None  # killed and reaped
    writer.answer_within_s = ANSWER_WITHIN_S  # (a new child takes longer than a second to start)
    assert writer.write(items(), ruleset.pricing) == []
    assert remote.count("gpu_metrics") == 12 * 3 and remote.count("resource_usage") == 8 + 1


@pytest.fixture
def second_store(chdb_client, request):
    """Another fresh database on the session's embedded engine."""
    return fresh_store(chdb_client, request, prefix="t2_")


def test_a_child_reaching_the_embedded_engine_through_the_worker_stores_what_the_thread_stores(
    store, second_store, ruleset, request
):
    """The same items, one database written by the writer thread, one by a child whose queries
    and inserts (encoded in the child) the worker runs on its embedded engine: every row equal;
    written again, nothing is stored twice and the duplicates are counted in the worker's metrics."""
    thread, child = ThreadEventWriter(store), ProcessEventWriter(None, second_store.db, second_store)
    request.addfinalizer(child.close)
    assert thread.write(items(), ruleset.pricing) == child.write(items(), ruleset.pricing) == []
    assert child._child is not None  # written by the child, not by the fallback in this thread
    assert digest(store) == digest(second_store)
    assert digest(second_store)["gpu_metrics"][0] == 12 * 3 and digest(second_store)["run_events"][0] == 1
    before = METRICS.duplicates_skipped._value.get()
    assert child.write(items(), ruleset.pricing) == []
    assert METRICS.duplicates_skipped._value.get() - before == sum(len(events) for _, events in items())
    assert digest(store) == digest(second_store)


def test_a_batch_larger_than_one_native_block_is_stored_whole_through_the_worker(store, second_store, ruleset,
                                                                                 request):  # fmt: skip
    """Thousands of rows: the client cuts the insert into several Native blocks, and only the
    first carries the statement, which the child leaves out; every row arrives, as the thread's."""
    many = [message("gpu-metrics", 0, i, scrape(T0 + i * 15, [float(i % 100)] * 8, rid=f"h{i % 50}"))
            for i in range(6_000)]  # fmt: skip
    thread, child = ThreadEventWriter(store), ProcessEventWriter(None, second_store.db, second_store)
    request.addfinalizer(child.close)
    assert thread.write(many, ruleset.pricing) == child.write(many, ruleset.pricing) == []
    assert digest(second_store)["gpu_metrics"][0] == 6_000 * 8
    assert digest(store) == digest(second_store)


def test_an_embedded_table_gone_is_a_store_unavailable_not_a_refused_message(store, ruleset, request):
    """The engine fails for a reason that is not the rows (here the table is gone): the child, told
    the error's ClickHouse code, does not take it for refused rows to dead-letter but for a store
    that cannot be written now, which the pipeline retries, dropping nothing."""
    writer = ProcessEventWriter(None, store.db, store)
    request.addfinalizer(writer.close)
    store.client.command(f"DROP TABLE {store.db}.run_events")
    with pytest.raises(StoreUnavailable, match="run_events"):
        writer.write(items(), ruleset.pricing)


def test_a_write_that_fails_mid_exchange_leaves_no_stale_answer_for_the_next(store, ruleset, request, monkeypatch):
    """The worker fails while running one of the child's calls in a way the call's own answer
    cannot carry (out of memory making it): the child, waiting for that answer, must not read the
    next batch as one. The next write starts afresh and stores the batch, once."""
    writer = ProcessEventWriter(None, store.db, store)
    request.addfinalizer(writer.close)
    real, calls = ProcessEventWriter._run, []

    def failing_once(self, op, args):
        calls.append(op)
        if len(calls) == 1:
            raise MemoryError("making the answer")
        return real(self, op, args)

    monkeypatch.setattr(ProcessEventWriter, "_run", failing_once)
    sent = [message("gpu-metrics", 0, i, scrape(T0 + i * MIN, [1.0, 2.0], rid=f"h{i}")) for i in range(10)]
    with pytest.raises(MemoryError):
        writer.write(sent, ruleset.pricing)
    assert writer.write(sent, ruleset.pricing) == []
    assert writer.write(sent, ruleset.pricing) == []
    assert store.count("gpu_metrics") == 10 * 2


def _exchanges(writer: ProcessEventWriter) -> list[str]:
    """The kinds of exchange the writer has with its child from now on (``write``, ``prepare``), recorded
    as they pass: the writer's own method runs them."""
    kinds: list[str] = []
    exchange = writer._exchange

    def recorded(kind, items, pricing, held_until=None):
        kinds.append(kind)
        return exchange(kind, items, pricing, held_until)

    writer._exchange = recorded  # type: ignore[method-assign]
    return kinds


def _started(writer: ProcessEventWriter, ruleset) -> None:
    """The writer's child started, as the writer thread starts it: by a write (only a write starts one)."""
    first = [message("run-events", 0, 0, [RunEvent(ts=at(T0), run_id="run-0", status="running")])]
    assert writer.write(first, ruleset.pricing, writer.prepare(first, ruleset.pricing)) == []
    assert writer._child is not None


def test_a_batch_prepared_ahead_stores_what_the_thread_stores(store, second_store, ruleset, request):
    """A batch prepared by the child (ids, columns, Native blocks) and inserted by the worker: every
    row equal to the writer thread's, and the child did no write of its own. Written again, every
    id is found stored: nothing is sent, and all its rows count as duplicates. A batch whose
    messages repeat an event is stored once, the repeats counted."""
    thread, child = ThreadEventWriter(store), ProcessEventWriter(None, second_store.db, second_store)
    request.addfinalizer(child.close)
    _started(child, ruleset)
    kinds = _exchanges(child)
    assert thread.write(items(), ruleset.pricing) == []
    assert child.write(items(), ruleset.pricing, child.prepare(items(), ruleset.pricing)) == []
    assert kinds == ["prepare"]
    before = METRICS.duplicates_skipped._value.get()
    assert child.write(items(), ruleset.pricing, child.prepare(items(), ruleset.pricing)) == []
    assert kinds == ["prepare", "prepare"]
    assert METRICS.duplicates_skipped._value.get() - before == sum(len(events) for _, events in items())
    twice = [message("gpu-metrics", 0, 100 + i, scrape(T0 + 86_400 + i * MIN, [1.0, 2.0], rid="h9")) for i in range(3)] * 2
    before = METRICS.duplicates_skipped._value.get()
    assert child.write(twice, ruleset.pricing, child.prepare(twice, ruleset.pricing)) == []
    assert kinds[-1] == "prepare" and METRICS.duplicates_skipped._value.get() - before == 3 * 2
    assert thread.write(twice, ruleset.pricing) == []
    thread.write([message("run-events", 0, 0, [RunEvent(ts=at(T0), run_id="run-0", status="running")])], ruleset.pricing)
    assert digest(store) == digest(second_store)


def test_a_batch_partly_stored_when_its_prepared_write_comes_is_stored_once(store, ruleset, request):
    """Some of a prepared batch's events are stored when its write comes (re-sent by a producer):
    the look-up finds those ids, nothing prepared is sent, and the batch is written the usual way,
    which leaves them out."""
    writer = ProcessEventWriter(None, store.db, store)
    request.addfinalizer(writer.close)
    _started(writer, ruleset)
    kinds = _exchanges(writer)
    sent = [message("gpu-metrics", 0, i, scrape(T0 + i * MIN, [1.0, 2.0], rid=f"h{i % 3}")) for i in range(10)]
    prepared = writer.prepare(sent, ruleset.pricing)
    assert ThreadEventWriter(store).write(sent[3:7], ruleset.pricing) == []
    assert writer.write(sent, ruleset.pricing, prepared) == []
    assert kinds == ["prepare", "write"]
    assert store.count("gpu_metrics") == 10 * 2
    assert store.query(f"SELECT uniqExact(event_id) AS n FROM {store.db}.gpu_metrics")[0]["n"] == 10 * 2


def test_a_prepared_write_that_fails_midway_is_retried_and_stored_once(store, ruleset, request, monkeypatch):
    """The engine takes the prepared batch's first table, then fails (not the rows: a store
    unavailable, which the pipeline retries with the same preparation): the retry's look-up finds
    the first table's rows, and the usual write stores the rest, once."""
    writer = ProcessEventWriter(None, store.db, store)
    request.addfinalizer(writer.close)
    _started(writer, ruleset)
    real, calls = store.client.raw_insert, []

    def failing_second(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 2:
            raise OSError("the engine's disk went away")
        return real(*args, **kwargs)

    monkeypatch.setattr(store.client, "raw_insert", failing_second)
    sent = items()[:-1]  # GPU scrapes and usage: two tables
    prepared = writer.prepare(sent, ruleset.pricing)
    with pytest.raises(StoreUnavailable, match="disk went away"):
        writer.write(sent, ruleset.pricing, prepared)
    assert store.count("gpu_metrics") + store.count("resource_usage") in (12 * 3, 8 + 1)  # one table landed
    assert writer.write(sent, ruleset.pricing, prepared) == []
    assert store.count("gpu_metrics") == 12 * 3 and store.count("resource_usage") == 8 + 1


def test_the_message_the_store_refuses_in_a_prepared_batch_is_named(store, ruleset, request):
    """ClickHouse refuses one message's rows of a prepared batch: nothing prepared is stored, the
    usual write splits the batch until that message is alone, and every other one is stored once."""
    store.client.command(f"ALTER TABLE {store.db}.gpu_metrics ADD CONSTRAINT no_poison CHECK resource_id != 'poison'")
    writer = ProcessEventWriter(None, store.db, store)
    request.addfinalizer(writer.close)
    _started(writer, ruleset)
    kinds = _exchanges(writer)
    sent = [(gpu_message(i, T0 + i * 60, host="poison" if i == 5 else "h1"), None) for i in range(12)]
    sent = [(m, DECODER.decode(m.topic, m.value)) for m, _ in sent]
    refused = writer.write(sent, ruleset.pricing, writer.prepare(sent, ruleset.pricing))
    assert [index for index, _ in refused] == [5] and "no_poison" in refused[0][1]
    assert kinds == ["prepare", "write"]
    assert store.count("gpu_metrics") == 11 * 2


def test_a_child_hung_while_preparing_is_killed_and_the_batch_written_by_another(store, ruleset, request):
    """The child stops (SIGSTOP) while it prepares a batch: its watchdog kills it after
    ``answer_within_s``, the preparation fails (logged), and the write stores the batch the usual
    way with a new child, once. A preparation can delay a write, never hang it."""
    writer = ProcessEventWriter(None, store.db, store)
    request.addfinalizer(writer.close)
    _started(writer, ruleset)
    hung = writer._child
    assert hung is not None
    writer.answer_within_s = 1.0
    os.kill(hung.pid, signal.SIGSTOP)
    with capture_logs() as logs:
        prepared = writer.prepare(items()[:-1], ruleset.pricing)
        assert prepared is not None and prepared.result(timeout=60) is None
    assert [e["error"] for e in logs if e["event"] == "event_prepare_failed"] == [
        "StoreUnavailable: the event writer process gave no answer within 1 s and was killed; starting another"]
    assert hung.poll() is not None  # killed and reaped
    writer.answer_within_s = ANSWER_WITHIN_S
    assert writer.write(items()[:-1], ruleset.pricing, prepared) == []
    assert writer._child is not None and writer._child is not hung
    assert store.count("gpu_metrics") == 12 * 3 and store.count("resource_usage") == 8 + 1


def test_a_batch_read_while_there_is_no_child_is_not_prepared(store, ruleset, request):
    """Only the writer thread starts a child (the child's parent-death signal follows the thread
    that started it): a batch read before the first write is written the usual way."""
    writer = ProcessEventWriter(None, store.db, store)
    request.addfinalizer(writer.close)
    kinds = _exchanges(writer)
    prepared = writer.prepare(items(), ruleset.pricing)
    assert prepared is not None and prepared.result(timeout=60) is None and writer._child is None
    assert writer.write(items(), ruleset.pricing, prepared) == []
    assert kinds == ["prepare", "write"] and store.count("gpu_metrics") == 12 * 3


def test_a_closed_writer_writes_no_batch_it_prepared(store, ruleset, request):
    """Closed (the worker stopping) with a batch prepared: its write is a store unavailable, nothing
    stored, and nothing more is prepared."""
    writer = ProcessEventWriter(None, store.db, store)
    _started(writer, ruleset)
    prepared = writer.prepare(items()[:-1], ruleset.pricing)
    assert prepared is not None
    writer.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        writer.write(items()[:-1], ruleset.pricing, prepared)
    assert store.count("gpu_metrics") == 0
    assert writer.prepare(items(), ruleset.pricing) is None


def test_a_writer_on_a_server_or_in_the_thread_prepares_nothing(store, server, remote, ruleset, request):
    """With a server the child inserts itself (nothing to overlap), and the writer thread has no child."""
    served = ProcessEventWriter(server.url, remote.db)
    request.addfinalizer(served.close)
    assert served.prepare(items(), ruleset.pricing) is None
    assert ThreadEventWriter(store).prepare(items(), ruleset.pricing) is None


@pytest.mark.parametrize("path", ["thread", "server", "embedded", "prepared"])
def test_no_insert_is_sent_once_the_workers_membership_has_run_out(path, ruleset, request):
    """The worker's membership of its group (streams/membership.py) runs out at a time the writer asks
    for just before it sends: in the writer thread, in the child writing to a server or through the
    worker to the embedded engine, and for a batch the child prepared. Past that time the write raises
    NotMember with nothing stored, so a batch sent while the worker froze is not inserted after the group
    gave its partitions to another; before it, the same write stores the batch."""
    if path == "server":
        store = request.getfixturevalue("remote")
        writer: ThreadEventWriter | ProcessEventWriter = ProcessEventWriter(request.getfixturevalue("server").url, store.db)
    elif path == "thread":
        store = request.getfixturevalue("store")
        writer = ThreadEventWriter(store)
    else:
        store = request.getfixturevalue("store")
        writer = ProcessEventWriter(None, store.db, store)
    request.addfinalizer(writer.close)
    if isinstance(writer, ProcessEventWriter):
        _started(writer, ruleset)
    sent = [message("gpu-metrics", 0, i, scrape(T0 + i * MIN, [1.0, 2.0], rid=f"h{i % 3}")) for i in range(10)]
    before = store.count("gpu_metrics")

    def prepared():
        if path != "prepared":
            return None
        made = writer.prepare(sent, ruleset.pricing)
        assert made is not None
        return made

    with pytest.raises(NotMember):
        writer.write(sent, ruleset.pricing, prepared(), held_until=lambda: membership_clock() - 0.001)
    assert store.count("gpu_metrics") == before
    assert writer.write(sent, ruleset.pricing, prepared(), held_until=lambda: membership_clock() + 60) == []
    assert store.count("gpu_metrics") == before + 10 * 2


@pytest.mark.parametrize("engine", ["server", "embedded"])
def test_a_child_whose_deadline_passed_asks_the_worker_again_before_it_gives_a_batch_up(engine, ruleset, request):
    """The end the child was given passed while it decoded and looked the batch up, but a heartbeat renewed
    the membership since: the child asks the worker (over the pipe) and stores the batch, not refusing it."""
    store, writer = child_writer(engine, request)
    _started(writer, ruleset)
    sent = [message("gpu-metrics", 0, i, scrape(T0 + 7 * 86_400 + i * MIN, [1.0], rid="h7")) for i in range(5)]
    asked: list[float] = []

    def held_until() -> float:  # past when the batch is sent, renewed when the child asks again
        asked.append(membership_clock())
        return membership_clock() + (60.0 if len(asked) > 1 else -1.0)

    before = store.count("gpu_metrics")
    assert writer.write(sent, ruleset.pricing, held_until=held_until) == []
    assert len(asked) == 2 and store.count("gpu_metrics") == before + 5
