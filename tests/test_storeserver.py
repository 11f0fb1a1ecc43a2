"""``burnwatch store serve``: one process owns the embedded engine and several processes use
it through clickhouse-connect's unmodified HTTP client, as they would a ClickHouse server.

The server runs as its own process (as an operator runs it); the store's code, the
reports and the CLI run against ``http://127.0.0.1:PORT`` and must behave as they do
on the engine in-process (the ``store`` fixture).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import tracemalloc
import urllib.error
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

import clickhouse_connect
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from detector.alerts import Alert
from detector.events import RunEvent
from detector.reports import run_report
from detector.store import EventBatch, Store, alert_from_row, connect, migrations
from detector.store.schema import BATCH_TABLES, PACKED_BELOW_BYTES
from streams.children import die_with_parent
from streams.embedded import free_port
from streams.process import StoreServerProcess as ServerProcess
from streams.storeserver import redact_dsn
from tests.conftest import ROOT
from tests.helpers import MIN, T0, at, ipv6_loopback, scrape, usage

HOUR = 3600.0


def one_of_each() -> EventBatch:
    """A batch with every event type, tags, extras and nulls."""
    run = RunEvent(ts=at(T0 + 5 * MIN), run_id="run-1", status="failed", resource_ids=["host-1", "host-2"],
                   gpu_count=16, project="llm", error="NCCL timeout", tags={"team": "nlp"}, extra={"attempt": 2})  # fmt: skip
    events = [usage(T0 + i * MIN, rid=f"host-{i % 3}") for i in range(30)]
    events += [e for i in range(10) for e in scrape(T0 + i * MIN, [0.0, 55.5, 100.0], sm=[0.0, 0.25, None])]
    events += [usage(T0, rid="cpu-1", usd_per_hour=None, resource_type="cpu_instance", tags={})]
    batch = EventBatch()
    batch.extend(events)
    batch.extend([run], source=("run-events", 3, 42))
    return batch


def test_events_round_trip_as_they_do_in_process(remote, store):
    """Migrations, a batch of each event type, its read-back, and the deduplication look-up
    (client-side ``%(x)s`` parameters, insert ``settings=``): through the server exactly what
    the engine in-process gives."""
    assert [m["version"] for m in remote.schema.applied()] == [m.version for m in migrations()]
    assert remote.events.insert(one_of_each()) == store.events.insert(one_of_each()) == 62
    assert remote.events.insert(one_of_each()) == 0  # read again: stored once
    span = remote.history.span()
    assert span == store.history.span() == (T0, T0 + 29 * MIN)
    events = remote.history.between(T0, T0 + HOUR)
    assert len(events) == 62 and events == store.history.between(T0, T0 + HOUR)
    for table in ("resource_usage", "gpu_metrics", "run_events"):
        assert remote.count(table) == store.count(table) > 0
    sql = "SELECT src_topic, src_partition, src_offset, error FROM {db}.run_events"
    assert remote.query(sql.format(db=remote.db)) == [{"src_topic": "run-events", "src_partition": 3,
                                                       "src_offset": 42, "error": "NCCL timeout"}]  # fmt: skip


def test_a_store_workers_make_through_the_server_packs_its_batch_tables_small_parts(server):
    """The served engine is chdb on the server's own disk, as the worker's own engine is: a store made
    through it (its tables made over HTTP by ``migrate``) writes the batch tables' small parts packed
    (one file each), and leaves the other tables at ClickHouse's default."""
    db = "t_served_packed"
    client = connect(server.url)
    client.command(f"DROP DATABASE IF EXISTS {db}")
    store = Store(client, db)
    try:
        store.migrate()
        ddl = {r["name"]: r["q"] for r in store.query(
            "SELECT name, create_table_query AS q FROM system.tables WHERE database = %(d)s", {"d": db})}  # fmt: skip
        packed = {t for t, q in ddl.items() if f"min_bytes_for_full_part_storage = {PACKED_BELOW_BYTES}" in q}
        assert packed == set(BATCH_TABLES)
        assert store.events.insert(one_of_each()) == 62
        parts = store.query("SELECT DISTINCT part_storage_type AS s FROM system.parts WHERE database = %(d)s AND active "
                            "AND table IN ('resource_usage', 'gpu_metrics', 'run_events')", {"d": db})  # fmt: skip
        assert [r["s"] for r in parts] == ["Packed"]
    finally:
        client.command(f"DROP DATABASE IF EXISTS {db}")
        client.close()


def test_alerts_states_and_deliveries_round_trip(remote):
    base = dict(alert_id="a1", type="idle_gpu", rule="idle-gpu", resource_id="gpu-1", status="firing",
                severity="warning", episode_start=T0, fired_at=T0 + HOUR, tags={"team": "nlp", "owner": "<!channel>"},
                details={"gpus": 8, "note": "tab\there"})  # fmt: skip
    fired = Alert(**base, change="fired", updated_at=T0 + HOUR, waste_usd=4.0)
    resolved = Alert(**{**base, "status": "resolved"}, change="resolved", updated_at=T0 + 2 * HOUR,
                     resolved_at=T0 + 2 * HOUR, waste_usd=9.5)  # fmt: skip
    remote.alerts.record([fired], version=1)
    remote.alerts.record([resolved], version=2)
    (row,) = remote.alerts.latest()
    back = alert_from_row(row)
    assert (back.status, back.resolved_at, back.waste_usd, back.tags, back.details) == (
        "resolved", T0 + 2 * HOUR, 9.5, base["tags"], base["details"])  # fmt: skip
    assert remote.deliveries.undelivered() == [("a1", "fired"), ("a1", "resolved")]
    remote.deliveries.record("a1", "fired", "#ml-cost", "1700000000.000100")
    assert remote.deliveries.made() == {("a1", "fired"): ("#ml-cost", "1700000000.000100")}
    assert remote.deliveries.undelivered() == [("a1", "resolved")]
    snapshot = bytes(range(256))  # any bytes, read back as bytes (column_formats)
    remote.states.save([("gpu-1", 2, snapshot), ("gpu-2", 3, b"x")], version=1)
    remote.states.delete(["gpu-2"])
    assert remote.states.load([2, 3]) == {"gpu-1": snapshot}


def test_a_report_with_server_side_parameters_matches_in_process(remote, store):
    """Reports bind ``{since:DateTime('UTC')}``, ``{types:Array(String)}`` on the server
    (``param_*``): the same rows as in-process."""
    midnight = T0 + 86_400
    base = dict(alert_id="a1", type="idle_gpu", rule="idle-gpu", resource_id="gpu-1", status="firing",
                severity="warning", episode_start=midnight - 3 * HOUR, fired_at=midnight - 2 * HOUR,
                tags={"team": "nlp"})  # fmt: skip
    changes = [Alert(**base, change="fired", updated_at=midnight - 2 * HOUR, waste_usd=4.0),
               Alert(**base, change="updated", updated_at=midnight + HOUR, waste_usd=25.0)]  # fmt: skip
    for s in (remote, store):
        s.alerts.record(changes, version=1)
        batch = EventBatch()
        batch.extend([usage(midnight - 2 * HOUR + i * MIN, rid="gpu-1") for i in range(180)])
        s.events.insert(batch)
    for report in ("waste", "incidents", "untagged"):
        assert run_report(remote, report, 7 * 86_400.0) == run_report(store, report, 7 * 86_400.0)
    waste = run_report(remote, "waste", 7 * 86_400.0, team="nlp")
    # The waste ledger spreads each change's dollars over the hours since the one before and
    # caps them at the hour's bill: the $4 before the first usage row has no bill to claim;
    # the $21 from 2 h before midnight to 1 h after is 14 on the first day, 7 on the next.
    assert [(r["type"], r["usd"]) for r in waste] == [("idle_gpu", 14.0), ("idle_gpu", 7.0)]


def test_bad_sql_is_a_database_error_with_clickhouse_message(remote, server):
    """A refused statement reaches the caller as ClickHouse's error, is logged once by the
    server, and the server goes on."""
    with pytest.raises(DatabaseError) as caught:
        remote.query("SELEC 1")
    assert caught.value.code == 62 and "Code: 62. DB::Exception: Syntax error" in str(caught.value)
    with pytest.raises(DatabaseError, match=r"UNKNOWN_TABLE|does not exist"):
        remote.count("no_such_table")
    failed = server.log_events("store_request_failed")
    assert any(e["code"] == 62 for e in failed) and any(e["code"] == 60 for e in failed)
    assert remote.query("SELECT 1 AS one") == [{"one": 1}]


def test_settings_apply_to_their_request_only(server):
    """A setting sent with one request (as inserts send ``max_partitions_per_insert_block``)
    does not stay on the shared engine for the next; SET would, so it is refused."""
    client = clickhouse_connect.get_client(dsn=server.url)
    probe = "SELECT getSetting('max_partitions_per_insert_block') AS v"
    assert client.query(probe, settings={"max_partitions_per_insert_block": 0}).result_rows == [(0,)]
    assert client.query(probe).result_rows == [(100,)]
    with pytest.raises(DatabaseError, match="SET and USE"):
        client.command("SET max_partitions_per_insert_block = 0")
    with pytest.raises(DatabaseError, match="Unknown setting|UNKNOWN_SETTING"):
        client.query("SELECT 1", settings={"no_such_setting": 1})
    assert client.query(probe).result_rows == [(100,)]
    client.close()


def test_a_readonly_request_only_reads_and_leaves_the_engine_writable(remote, server):
    """`burnwatch sql` asks ClickHouse to refuse writes (readonly = 2). Set on the shared engine, chdb would keep
    it for every client; the server lets only a statement that reads run instead."""
    client = clickhouse_connect.get_client(dsn=server.url)
    read_only = {"readonly": 2}
    before = remote.query(f"SELECT count() AS n FROM {remote.db}.schema_migrations")
    assert client.query(f"SELECT count() AS n FROM {remote.db}.schema_migrations", settings=read_only).result_rows \
        == [(before[0]["n"],)]  # fmt: skip
    for statement in (f"TRUNCATE TABLE {remote.db}.schema_migrations", f"DROP TABLE {remote.db}.alerts",
                      f"INSERT INTO {remote.db}.schema_migrations SELECT * FROM {remote.db}.schema_migrations",
                      f"WITH 1 AS y INSERT INTO {remote.db}.schema_migrations SELECT * FROM {remote.db}.schema_migrations",
                      "SELECT 1 INTO OUTFILE '/tmp/burnwatch-readonly-probe'",
                      "SELECT 1 INTO/**/OUTFILE '/tmp/burnwatch-readonly-probe'"):  # fmt: skip
        with pytest.raises(DatabaseError, match="readonly mode") as caught:
            client.command(statement, settings=read_only)
        assert caught.value.code == 164, statement
    with pytest.raises(DatabaseError, match="Multi-statements"):  # chdb would run both: the second wrote
        client.command(f"SELECT 1 AS a; TRUNCATE TABLE {remote.db}.schema_migrations", settings=read_only)
    assert remote.query(f"SELECT count() AS n FROM {remote.db}.schema_migrations") == before
    assert not Path("/tmp/burnwatch-readonly-probe").exists()
    for statement in ("-- how many\nSELECT 2 AS n", "/* a note */ SELECT 2 AS n", "WITH 2 AS n SELECT n"):  # reads
        assert client.query(statement, settings=read_only).result_rows == [(2,)], statement
    client.command("CREATE TABLE IF NOT EXISTS default.readonly_probe (x UInt8) ENGINE = Memory")  # still writable
    client.command("DROP TABLE default.readonly_probe")
    client.close()


def test_a_client_stays_inside_the_store(server, tmp_path):
    """chdb is clickhouse-local: it lets a statement read and write any file the server's user can, reach the
    network, stop the server (SYSTEM SHUTDOWN, SYSTEM KILL) and change the session every client shares. Through
    the port each of these is refused, however spelled (a comment before a SET made the engine read-only for
    every worker until a restart; a second statement ran unjudged); what only looks like them still runs."""
    client = clickhouse_connect.get_client(dsn=server.url)
    secret, written = tmp_path / "secret.txt", tmp_path / "written.txt"
    secret.write_text("s3cret\n")
    refused = [
        ("SYSTEM SHUTDOWN", "SYSTEM"), ("SYSTEM KILL", "SYSTEM"),
        ("/* a note */ SET readonly = 1", "SET"), ("-- a note\nUSE system", "USE"),
        ("SELECT 1; SET readonly = 1", "Multi-statements"),
        (f"SELECT * FROM file('{secret}', 'LineAsString')", "file()"),
        (f"SELECT file('{secret}')", "file()"),
        (f"SELECT `fil\\x65`('{secret}')", "file()"),
        (f"SELECT 1 INTO OUTFILE '{written}'", "INTO OUTFILE"),
        (f"INSERT INTO FUNCTION file('{written}', 'TSV', 's String') VALUES ('x')", "file()"),
        (f"CREATE TABLE default.f (s String) ENGINE = File(LineAsString, '{secret}')", "File()"),
        (f"CREATE TABLE default.m (s String) ENGINE = MergeTree ORDER BY s SETTINGS disk = disk(type = 'local', "
         f"path = '{tmp_path}/disk/')", "disk()"),
        (f"ATTACH TABLE default.a FROM '{tmp_path}' (s String) ENGINE = MergeTree ORDER BY s", "ATTACH"),
        (f"BACKUP TABLE default.x TO File('{written}')", "BACKUP"),
        (f"SELECT * FROM url('{server.url}/ping', 'LineAsString')", "url()"),
        ("CREATE DICTIONARY default.d (k UInt64, v String) PRIMARY KEY k SOURCE(HTTP(url 'http://127.0.0.1:9/' "
         "format 'TSV')) LAYOUT(FLAT()) LIFETIME(0)", "dictionary source"),
        ("SELECT * FROM python(x)", "python()"),
    ]  # fmt: skip
    for statement, what in refused:
        with pytest.raises(DatabaseError, match=re.escape(what)) as caught:
            client.command(statement)
        assert caught.value.code in (497, 62), statement
    unquoted = "concat(" + ", ".join(f"char({ord(c)})" for c in str(written)) + ")"  # no quote: split as an insert
    insert = urllib.request.Request(server.url, data=f"INSERT INTO FUNCTION file({unquoted}, TSV) FORMAT TSV\nx\n".encode())
    with pytest.raises(urllib.error.HTTPError) as failed:  # the insert's data is run as FROM INFILE by the server
        urllib.request.urlopen(insert, timeout=10)
    assert failed.value.headers["X-ClickHouse-Exception-Code"] == "497"
    assert not written.exists() and not (tmp_path / "disk").exists()
    assert client.query("SELECT currentDatabase(), getSetting('readonly')").result_rows == [("default", 0)]
    client.command("CREATE TABLE IF NOT EXISTS default.inside (s String) ENGINE = ReplacingMergeTree ORDER BY s")
    client.insert("default.inside", [["file"], ["url"]], column_names=["s"])
    assert client.query("SELECT count() FROM default.inside WHERE s IN ('file', 'url', 'system', 'set')").result_rows \
        == [(2,)]  # fmt: skip
    assert client.query("SELECT sum(number), format('{} set', 1), log(1) FROM numbers(4)").result_rows == [(6, "1 set", 0)]
    client.command("DROP TABLE default.inside")
    client.close()
    with urllib.request.urlopen(f"{server.url}/ping", timeout=5) as response:
        assert response.read() == b"Ok.\n"


def test_a_value_that_only_names_a_refused_clause_runs(server):
    """The clauses refused (INTO OUTFILE, FROM INFILE, disk()) are looked for in the statement without its
    values: a resource, a title or a burnwatch sql filter saying "disk (nvme)" or "into outfile" was refused
    as the clause it only names, while the clause itself, whatever the values beside it, still is."""
    client = clickhouse_connect.get_client(dsn=server.url)
    client.command("CREATE TABLE IF NOT EXISTS default.named (s String) ENGINE = MergeTree ORDER BY s")
    values = ["data-disk(eu)", "disk (nvme)", "dump into outfile", "load from infile"]
    client.insert("default.named", [[v] for v in values], column_names=["s"])
    for value in values:
        assert client.query("SELECT count() FROM default.named WHERE s = %(v)s", parameters={"v": value}).result_rows \
            == [(1,)], value  # fmt: skip
    assert client.query("SELECT count() FROM default.named WHERE s LIKE '%disk (%' OR s ILIKE '%INTO OUTFILE%'")\
        .result_rows == [(2,)]  # fmt: skip
    for statement, what in [("SELECT 'disk (' AS `x'` INTO OUTFILE '/tmp/burnwatch-named-probe'", "INTO OUTFILE"),
                            ("SELECT 'into outfile' INTO OUTFILE '/tmp/burnwatch-named-probe'", "INTO OUTFILE")]:  # fmt: skip
        with pytest.raises(DatabaseError, match=re.escape(what)):
            client.command(statement)
    client.command("DROP TABLE default.named")
    client.close()


def test_a_web_page_cannot_reach_the_store(server):
    """The port has no password, and a browser on this machine reaches loopback for any page it shows: a GET
    (an image, a link) only reads, as on ClickHouse; a page's POST (it carries Origin) and a request for a name
    rebound to 127.0.0.1 (its Host) are refused. clickhouse-connect, curl and the workers send neither."""
    client = clickhouse_connect.get_client(dsn=server.url)
    client.command("CREATE TABLE IF NOT EXISTS default.web_probe (x UInt8) ENGINE = Memory")

    def send(method: str, query: str, headers: dict[str, str]) -> tuple[int, str]:
        data = query.encode() if method == "POST" else None
        url = server.url + ("/" if method == "POST" else "/?" + urllib.parse.urlencode({"query": query}))
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=10) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    status, text = send("GET", "DROP TABLE default.web_probe", {})
    assert status == 403 and text.startswith("Code: 164.") and "readonly" in text
    assert send("GET", "SELECT 1", {}) == (200, "1\n")
    status, text = send("POST", "DROP TABLE default.web_probe", {"Origin": "https://evil.example"})
    assert status == 403 and text.startswith("Code: 497.") and "Origin" in text
    status, text = send("POST", "DROP TABLE default.web_probe", {"Host": f"rebound.example:{server.port}"})
    assert status == 403 and "'rebound.example' is refused" in text
    assert client.command("EXISTS TABLE default.web_probe") == 1
    assert send("POST", "SELECT 2", {"Host": f"localhost:{server.port}"}) == (200, "2\n")
    client.command("DROP TABLE default.web_probe")
    client.close()


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "lz4", "zstd"])
def test_a_compressed_body_is_refused_once_it_passes_the_limit_not_after(encoding):
    """A small body can expand a thousandfold: a 4 MB gzip body of zeros took the server to 8.8 GB before its size
    was checked. Decompression stops as soon as the output passes the limit, so a bomb costs about the limit."""
    import lz4.frame
    from backports import zstd

    from streams.storeserver import StoreError, decompress

    zeros = b"\0" * (1 << 20)
    if encoding in ("gzip", "deflate"):
        codec = zlib.compressobj(9, zlib.DEFLATED, 31 if encoding == "gzip" else 15)
        bomb = b"".join(codec.compress(zeros) for _ in range(256)) + codec.flush()  # 256 MiB in ~250 kB
    else:
        frame = lz4.frame.compress(zeros) if encoding == "lz4" else zstd.compress(zeros)
        bomb = frame * 256  # 256 frames of 1 MiB each, as clickhouse-connect sends one frame a block
    assert decompress(bomb, encoding, limit=256 << 20)[-1:] == b"\0"  # a body at the limit is whole
    tracemalloc.start()
    try:
        with pytest.raises(StoreError) as caught:
            decompress(bomb, encoding, limit=4 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.status == 413 and "over 4194304 bytes once decompressed" in str(caught.value)
    assert peak < 16 << 20, peak  # what it decompressed stayed near the limit (was the whole 256 MiB)


@pytest.mark.parametrize("compress", ["lz4", "zstd", "gzip", False])
def test_compressed_inserts_and_form_encoded_parameters(server, compress):
    """What clickhouse-connect may send: bodies compressed block by block, and long
    server-side parameters as a multipart form."""
    client = clickhouse_connect.get_client(dsn=server.url, compress=compress, form_encode_query_params=True)
    table = f"default.compressed_{compress or 'none'}"
    client.command(f"CREATE OR REPLACE TABLE {table} (n UInt32, s String) ENGINE = MergeTree ORDER BY n")
    rows = [[i, f"row {i} " * (i % 60)] for i in range(20_000)]  # about 3 MiB: several blocks, several frames
    client.insert(table, rows, column_names=["n", "s"])
    assert client.command(f"SELECT count() FROM {table}") == 20_000
    result = client.query(f"SELECT sum(n) FROM {table} WHERE s != {{skip:String}} AND n IN {{ns:Array(UInt32)}}",
                          parameters={"skip": "x", "ns": list(range(0, 20_000, 2))})  # fmt: skip
    assert result.result_rows == [(sum(range(0, 20_000, 2)),)]
    client.close()


def test_hostile_requests_get_a_clickhouse_error_and_the_server_goes_on(server):
    def post(body: bytes, headers: dict[str, str]) -> tuple[int, str, str]:
        request = urllib.request.Request(f"{server.url}/?query=INSERT%20INTO%20default.x%20FORMAT%20Native",
                                         data=body, headers=headers, method="POST")  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.headers.get("X-ClickHouse-Exception-Code", ""), response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers.get("X-ClickHouse-Exception-Code", ""), exc.read().decode()

    status, code, text = post(b"\x04\x22\x4d\x18garbage", {"Content-Encoding": "lz4"})
    assert (status, code) == (400, "271") and text.startswith("Code: 271. DB::Exception: Cannot decompress")
    status, code, text = post(b"x", {"Content-Encoding": "snappy"})
    assert (status, code) == (400, "271") and "Unsupported Content-Encoding 'snappy'" in text
    status, code, text = post(b"\x01\x01", {})  # a truncated Native block for a missing table
    assert status == 500 and code and text.startswith(f"Code: {code}. DB::Exception:")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\nSELECT 1")
        reply = b"".join(iter(lambda: sock.recv(4096), b"")).decode()  # it closes the connection
    assert reply.startswith("HTTP/1.1 400") and "Code: 27. DB::Exception: bad Content-Length '-5'" in reply
    # A client killed while sending an insert: what arrived is not inserted.
    client = clickhouse_connect.get_client(dsn=server.url)
    client.command("CREATE OR REPLACE TABLE default.partial (n UInt32) ENGINE = MergeTree ORDER BY n")
    for framing in (b"Content-Length: 1000\r\n", b"Transfer-Encoding: chunked\r\n"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            rows = b"INSERT INTO default.partial FORMAT TSV\n1\n2\n3\n"
            chunk = rows if framing.startswith(b"Content") else b"%x\r\n%s\r\n" % (len(rows), rows)
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n" + chunk)
            sock.shutdown(socket.SHUT_WR)
            reply = b"".join(iter(lambda: sock.recv(4096), b"")).decode()
        assert reply.startswith("HTTP/1.1 400") and "Code: 27." in reply
    assert client.command("SELECT count() FROM default.partial") == 0
    client.close()
    with urllib.request.urlopen(f"{server.url}/ping", timeout=5) as response:
        assert response.read() == b"Ok.\n"


WRITER = """
import sys, time
from pathlib import Path
from detector.store import EventBatch, Store, connect
from tests.helpers import T0, usage

url, db, name, batches, per, flags = sys.argv[1:7]
batches, per, flags = int(batches), int(per), Path(flags)
store = Store(connect(url), db)
store.migrate()  # both writers migrate the same new database at once, as two workers starting together
(flags / f"ready-{name}").touch()
deadline = time.monotonic() + 60
while not (flags / "go").exists():
    assert time.monotonic() < deadline, "no go"
    time.sleep(0.01)
for b in range(batches):
    batch = EventBatch()
    batch.extend([usage(T0 + (b * per + i) * 60, rid=f"{name}-{i % 10}") for i in range(per)])
    assert store.events.insert(batch) == per
store.close()
"""


def test_two_processes_write_to_one_store_at_once(server, tmp_path):
    """The point of the server: two processes (as two workers) migrate and write the same
    store concurrently, and every row of both is there afterwards."""
    db, batches, per = "t_two_writers", 20, 500
    setup = clickhouse_connect.get_client(dsn=server.url)
    setup.command(f"DROP DATABASE IF EXISTS {db}")
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, server.url, db, name, str(batches), str(per), str(tmp_path)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=die_with_parent())  # fmt: skip
        for name in ("w1", "w2")
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{n}").exists() for n in ("w1", "w2")):
        assert time.monotonic() < deadline and all(w.poll() is None for w in writers), [w.communicate() for w in writers]
        time.sleep(0.05)
    (tmp_path / "go").touch()
    for w in writers:
        out, _ = w.communicate(timeout=120)
        assert w.returncode == 0, out.decode()
    counts = setup.query(f"SELECT substring(resource_id, 1, 2) AS w, count() FROM {db}.resource_usage "
                         "GROUP BY w ORDER BY w").result_rows  # fmt: skip
    assert counts == [("w1", batches * per), ("w2", batches * per)]
    versions = setup.query(f"SELECT version FROM {db}.schema_migrations FINAL ORDER BY version").result_rows
    assert [v for (v,) in versions] == [m.version for m in migrations()]
    setup.close()


def test_an_endless_query_whose_client_left_holds_the_engine_no_longer_than_the_limit(tmp_path):
    """The engine runs one statement at a time, and nothing stops one whose client gave up: an endless query
    held every other client, and a SIGTERM, until the server was killed. A statement that sets no
    ``max_execution_time`` is stopped after ``--max-execution-time``."""
    server = ServerProcess(f"chdb://{tmp_path / 'ch'}", tmp_path / "server.log", "--max-execution-time", "3").wait_ready()
    try:
        impatient = clickhouse_connect.get_client(dsn=server.url, send_receive_timeout=1)
        with pytest.raises(Exception, match="timed out|Read timed out|timeout"):
            impatient.query("SELECT count() FROM numbers_mt(1000000000000000)")
        started = time.monotonic()
        client = clickhouse_connect.get_client(dsn=server.url, send_receive_timeout=60)
        assert client.command("SELECT 1") == 1
        assert time.monotonic() - started < 20
        failed = [e for e in server.log_events("store_request_failed") if e["code"] == 159]
        assert failed and "TIMEOUT_EXCEEDED" in failed[0]["error"]
        client.close()
    finally:
        assert server.stop(timeout=20) == 0, server.log()


def test_a_second_server_on_a_held_store_says_who_holds_it(server):
    """chdb's own words were two lines about a status file and "Error initializing EmbeddedServer: ."."""
    dsn = server.proc.args[server.proc.args.index("--dsn") + 1]
    out = subprocess.run([sys.executable, "-m", "streams.cli", "store", "serve", "--dsn", dsn, "--port", str(free_port())],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 1
    assert f"is held by another process (pid {server.proc.pid}: " in out.stderr and "store serve" in out.stderr
    assert "EmbeddedServer" not in out.stderr + out.stdout and "Traceback" not in out.stderr


def test_a_command_on_a_served_store_is_pointed_at_the_server(server):
    """A command opening the directory a ``store serve`` holds was told to start ``store serve`` and use
    port 8123: the server already runs, and on a port of its own. It is now told the server's address."""
    dsn = server.proc.args[server.proc.args.index("--dsn") + 1]
    clickhouse_connect.get_client(dsn=server.url).command("CREATE DATABASE IF NOT EXISTS t_pointed")  # a store there
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BURNWATCH_", "SLACK_"))}
    out = subprocess.run([sys.executable, "-m", "streams.cli", "sql", "SELECT 1"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={**env, "BURNWATCH_CLICKHOUSE_DSN": dsn})  # fmt: skip
    assert out.returncode == 69, out.stderr
    assert f"BURNWATCH_CLICKHOUSE_DSN={server.url}" in out.stderr, out.stderr
    assert "have one process own the store" not in out.stderr and "Traceback" not in out.stderr


def test_serve_refuses_a_dsn_it_cannot_own_without_showing_its_password():
    out = subprocess.run(
        [sys.executable, "-m", "streams.cli", "store", "serve", "--dsn", "http://ops:s3cret@127.0.0.1:8123",
         "--port", str(free_port())],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode != 0
    assert "needs a chdb:// DSN" in out.stderr and "s3cret" not in out.stderr + out.stdout
    assert redact_dsn("http://ops:s3cret@host:8123/db") == "http://ops:***@host:8123/db"


@pytest.mark.integration
def test_a_worker_stores_through_the_server(tmp_path, ruleset):
    """The real worker with ``BURNWATCH_CLICKHOUSE_DSN=http://...``: every event of a small
    fleet is stored; ``burnwatch sql`` and ``backtest --since`` work against the same
    server while it serves, and the stored history gives the file's alerts."""
    from detector.backtest import backtest
    from detector.replay import write_replay
    from detector.simulate import SimConfig, simulate
    from streams.embedded import EmbeddedBroker
    from streams.kafka import count_events, ensure_topics, file_records, publish_records
    from streams.process import WorkerProcess, worker_env

    records, _ = simulate(SimConfig(hours=6, training_hosts=3, notebooks=2, inference_endpoints=1, seed=3),
                          ruleset.pricing)  # fmt: skip
    replay = tmp_path / "fleet.jsonl"
    with open(replay, "wb") as out:
        write_replay(records, out)
    messages = list(file_records(replay))
    events = count_events(messages)
    expected = sorted(a.alert_id for a in backtest(replay, ruleset).alerts)
    assert expected

    server = ServerProcess(f"chdb://{tmp_path / 'ch'}", tmp_path / "server.log").wait_ready()
    try:
        with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
            import asyncio

            async def publish() -> None:
                await ensure_topics(broker.bootstrap, 2)
                await publish_records(broker.bootstrap, messages)

            asyncio.run(publish())
            rules = tmp_path / "rules"
            shutil.copytree(ROOT / "rules", rules)
            env = worker_env(broker.bootstrap, tmp_path / "data", rules, 2, BURNWATCH_CLICKHOUSE_DSN=server.url)
            worker = WorkerProcess(env, tmp_path / "worker.log").start()
            try:
                worker.wait_until(lambda h: h["events"] >= events, timeout=60)
                cli_env = {**os.environ, **env}
                stored = subprocess.run(
                    [sys.executable, "-m", "streams.cli", "sql", "SELECT (SELECT count() FROM burnwatch.resource_usage)"
                     " + (SELECT count() FROM burnwatch.gpu_metrics) + (SELECT count() FROM burnwatch.run_events) AS n",
                     "--format", "json"], env=cli_env, cwd=ROOT, capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                assert stored.returncode == 0, stored.stderr
                assert json.loads(stored.stdout) == {"n": events}
                replayed = subprocess.run(
                    [sys.executable, "-m", "streams.cli", "backtest", "--since", "30d", "--json"],
                    env=cli_env, cwd=ROOT, capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                assert replayed.returncode == 0, replayed.stderr
                assert sorted(json.loads(line)["alert_id"] for line in replayed.stdout.splitlines()) == expected
            finally:
                assert worker.stop() == 0, worker.tail()
    finally:
        assert server.stop() == 0, server.log()
    assert not server.log_events("store_request_failed")


@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_a_server_on_ipv6_loopback_answers_the_store_and_refuses_a_rebound_host(tmp_path: Path):
    """``--host ::1`` was refused ("Address family for hostname not supported"): the server was IPv4 only."""
    server = ServerProcess(f"chdb://{tmp_path / 'ch'}", tmp_path / "store.log", host="::1").wait_ready()
    try:
        client = clickhouse_connect.get_client(host="::1", port=server.port)
        assert client.query("SELECT 1 + 1").result_rows == [(2,)]
        request = urllib.request.Request(f"{server.url}/?query=SELECT%203", headers={"Host": "rebound.example"})
        with pytest.raises(urllib.error.HTTPError):  # still loopback: a rebound name is refused
            urllib.request.urlopen(request, timeout=10)
    finally:
        assert server.stop() == 0
