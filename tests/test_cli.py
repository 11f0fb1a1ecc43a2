"""The command line a newcomer meets: which store a command reads, the commands that only
read never creating one, what ``db migrate`` and ``model train`` say and keep, and an
expected failure being one line and an exit code (docs/cli.md), never a traceback.

Each test runs ``burnwatch`` as a user does, in a subprocess (one embedded ClickHouse per
process: the test process has its own)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from detector.settings import ENV, load_settings
from detector.store import Store
from streams.children import die_with_parent
from streams.cli import EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_UNAVAILABLE
from tests.conftest import ROOT
from tests.helpers import store_held

pytestmark = pytest.mark.integration


def burnwatch(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("BURNWATCH_", "SLACK_"))}
    return subprocess.run([sys.executable, "-m", "streams.cli", *args], env={**base, **(env or {})}, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, **kw)  # fmt: skip


_WRITE = """
import sys
from detector.settings import load_settings
from detector.store.connection import connect

client = connect(load_settings().dsn, create=False)
for statement in sys.argv[1:]:
    client.command(statement)
"""


def store_writes(*statements: str, env: dict[str, str]) -> None:
    """Statements that write, through the store's own client in a process of its own (`burnwatch sql` only
    reads); the store is the one ``env`` names."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("BURNWATCH_", "SLACK_"))}
    out = subprocess.run([sys.executable, "-c", _WRITE, *statements], env={**base, **env}, cwd=ROOT, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]


def no_traceback(out: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in out.stderr and "Traceback" not in out.stdout, out.stderr


@pytest.fixture(scope="module")
def migrated(tmp_path_factory) -> Path:
    """A data directory that ``burnwatch db migrate`` made an empty store in, kept forever (as
    the demo's is): one subprocess for the module (about 3 s of CPU) instead of one per test."""
    directory = tmp_path_factory.mktemp("migrated")
    out = burnwatch("db", "migrate", env={"BURNWATCH_DATA_DIR": str(directory), "BURNWATCH_EVENT_TTL_DAYS": "0"})
    assert out.returncode == 0, out.stderr
    return directory


@pytest.fixture
def made(migrated, tmp_path):
    """A copy of that data directory for this test alone (its tests drop tables, insert and
    migrate): the embedded store's files, no process holding them, copied as they are (its
    database and table links are relative ones into its store/, kept links)."""
    shutil.copytree(migrated, tmp_path, symlinks=True, dirs_exist_ok=True)
    return {"BURNWATCH_DATA_DIR": str(tmp_path)}


# -- figure 5: which store, and never a new empty one --------------------------------------------


@pytest.mark.parametrize("command", [
    ["query", "waste"],
    ["sql", "SELECT 1"],
    ["incidents", "--open"],
    ["backtest", "--since", "1d"],
    ["digest", "--day", "2026-11-02"],
    ["model", "train"],
])  # fmt: skip
def test_commands_that_read_say_which_store_and_never_create_one(tmp_path, command):
    """A mistyped data directory used to give ``(no rows)``, exit 0, and a new empty store there."""
    typo = tmp_path / "burnwach"
    out = burnwatch(*command, env={"BURNWATCH_DATA_DIR": str(typo), "BURNWATCH_MODEL_DIR": str(tmp_path / "m")})
    no_traceback(out)
    assert out.returncode == EXIT_FAILED, out.stdout
    assert f"store: chdb://{typo / 'clickhouse'}, database burnwatch" in out.stderr
    assert f"no store at {typo / 'clickhouse'}" in out.stderr and "BURNWATCH_DATA_DIR" in out.stderr
    assert "(no rows)" not in out.stdout
    assert not typo.exists()


def test_without_a_store_the_default_data_dir_points_at_the_demos(tmp_path):
    """``make demo`` then ``burnwatch query waste``: the demo's store is not the default one, and
    the error says where it is and how to read it."""
    burnwatch("db", "migrate", env={"BURNWATCH_DATA_DIR": str(tmp_path / "demo")})
    out = burnwatch("query", "waste", env={"BURNWATCH_DATA_DIR": str(tmp_path)})
    assert out.returncode == EXIT_FAILED
    assert f"BURNWATCH_DATA_DIR={tmp_path / 'demo'} before the command" in out.stderr
    assert not (tmp_path / "clickhouse").exists()


def test_a_worker_on_every_interface_whose_ipv6_port_is_taken_says_so_before_it_starts(tmp_path):
    """0.0.0.0 binds IPv6's every interface too (detector.settings.bind_host): a port taken there alone passed
    the check made on IPv4's, and Faust failed after the store was opened."""
    import socket

    with socket.socket(socket.AF_INET6) as taken:
        try:
            taken.bind(("::1", 0))
        except OSError:
            pytest.skip("this machine has no IPv6 loopback")
        taken.listen()
        port = taken.getsockname()[1]
        out = burnwatch("worker", env={"BURNWATCH_KAFKA_BOOTSTRAP": "127.0.0.1:9", "BURNWATCH_WEB_PORT": str(port),
                                       "BURNWATCH_WEB_HOST": "0.0.0.0", "BURNWATCH_DATA_DIR": str(tmp_path)})  # fmt: skip
    no_traceback(out)
    assert out.returncode == EXIT_FAILED and f"BURNWATCH_WEB_PORT {port}: cannot listen on 0.0.0.0:{port}" in out.stderr
    assert not (tmp_path / "clickhouse").exists()


def test_a_database_that_is_not_there_is_not_created(made):
    out = burnwatch("query", "waste", env={**made, "BURNWATCH_CLICKHOUSE_DATABASE": "burnwatcj"})
    assert out.returncode == EXIT_FAILED and "has no database 'burnwatcj'" in out.stderr
    out = burnwatch("sql", "SELECT count() AS n FROM system.databases WHERE name = 'burnwatcj'", "--format", "csv",
                    env=made)  # fmt: skip
    assert out.stdout.splitlines() == ["n", "0"]


def test_a_worker_whose_web_port_is_taken_says_so_before_it_starts(tmp_path):
    """Faust failed after the store was opened, with a traceback; now a line before anything starts."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = burnwatch("worker", env={"BURNWATCH_KAFKA_BOOTSTRAP": "127.0.0.1:9", "BURNWATCH_WEB_PORT": str(port),
                                       "BURNWATCH_DATA_DIR": str(tmp_path)})  # fmt: skip
    no_traceback(out)
    assert out.returncode == EXIT_FAILED and f"BURNWATCH_WEB_PORT {port}: cannot listen on 127.0.0.1:{port}" in out.stderr
    assert not (tmp_path / "clickhouse").exists()


@pytest.mark.parametrize("args, said", [
    (["simulate", "--hours", "nan"], "argument --hours: takes a number more than 0, not 'nan'"),  # int(NaN) traceback
    (["simulate", "--hours", "-3"], "argument --hours: takes a number more than 0"),  # wrote 0 messages, exit 0
    (["simulate", "--hosts", "-1"], "argument --hosts: takes 0 or more, not -1"),
    (["replay", "fleet.jsonl", "--speed", "-5"], "argument --speed: takes a number more than 0"),  # silently unpaced
    (["eval", "--hours", "-1"], "argument --hours: takes a number more than 0"),  # ran and printed a table
    (["store", "serve", "--max-execution-time", "-1"], "takes 0 (never) to 1000000000, not -1"),  # served, no limit
    (["store", "serve", "--port", "99999"], "takes 0 (a free one) to 65535, not 99999"),  # failed at bind()
])  # fmt: skip
def test_a_number_of_hours_or_an_acceleration_that_means_nothing_is_refused(args, said):
    out = burnwatch(*args)
    no_traceback(out)
    assert out.returncode == 2 and said in out.stderr, out.stderr


def test_run_outside_the_checkout_a_command_says_where_it_looked_for_the_rules(tmp_path):
    fleet = tmp_path / "fleet.jsonl"
    fleet.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BURNWATCH_", "SLACK_"))}
    for args, named in ((["backtest", str(fleet)], "'rules': --rules or BURNWATCH_RULES names them"),
                        (["simulate", "--hours", "1", "--out", str(tmp_path / "out.jsonl")],
                         "'rules': BURNWATCH_RULES names them"),  # simulate has no --rules: it named one
                        (["backtest", str(fleet), "--rules", str(ROOT / "rules"), "--compare", "nowhere"],
                         "read from 'nowhere', as --compare names them")):  # fmt: skip
        out = subprocess.run([sys.executable, "-m", "streams.cli", *args], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)  # fmt: skip
        no_traceback(out)
        assert out.returncode == EXIT_FAILED and named in out.stderr, out.stderr


def test_incidents_say_a_store_named_by_store_came_from_it(tmp_path):
    out = burnwatch("incidents", "--store", f"chdb://{tmp_path / 'missing'}")
    no_traceback(out)
    assert out.returncode == EXIT_FAILED and "(the store's address comes from --store)" in out.stderr, out.stderr
    out = burnwatch("incidents", "--store", "foo://x")  # refused by the settings, which know the option as --store
    no_traceback(out)
    assert out.returncode == EXIT_FAILED and "--store: " in out.stderr and "--clickhouse-dsn" not in out.stderr, out.stderr


def test_sql_only_reads(made):
    """Listed among the commands that only read: ClickHouse refuses anything that writes (it ran a TRUNCATE)."""
    for statement in ("TRUNCATE TABLE burnwatch.schema_migrations", "DROP TABLE burnwatch.alerts",
                      "INSERT INTO burnwatch.schema_migrations SELECT * FROM burnwatch.schema_migrations"):  # fmt: skip
        out = burnwatch("sql", statement, env=made)
        no_traceback(out)
        assert out.returncode == EXIT_FAILED and "readonly" in out.stderr, (statement, out.stderr)
    out = burnwatch("sql", "SELECT count() AS n FROM burnwatch.schema_migrations", "--format", "csv", env=made)
    assert out.returncode == 0 and int(out.stdout.splitlines()[1]) > 0, out.stderr
    empty = burnwatch("sql", "  ", env=made)
    assert empty.returncode != 0 and "the query is empty" in empty.stderr


def test_sql_writes_its_rows_as_they_come_so_a_reader_that_stops_ends_the_query(made):
    """`burnwatch sql ... | head` loaded the whole result first: 3M rows took 23 s, 100M never ended. The rows
    now go out a block at a time, and a reader that stops (a closed pipe) ends the query and the command."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("BURNWATCH_", "SLACK_"))}
    proc = subprocess.Popen([sys.executable, "-m", "streams.cli", "sql", "SELECT number AS n FROM numbers(10000000000)",
                             "--format", "csv"], env={**base, **made}, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        assert [proc.stdout.readline() for _ in range(3)] == ["n\n", "0\n", "1\n"]
        proc.stdout.close()  # as head does once it has its lines
        assert proc.wait(timeout=60) == EXIT_BROKEN_PIPE
    finally:
        proc.kill()
        proc.wait()


def test_db_migrate_says_it_created_the_store(tmp_path):
    out = burnwatch("db", "migrate", env={"BURNWATCH_DATA_DIR": str(tmp_path)})
    assert out.returncode == 0 and "created the store" in out.stdout.splitlines()[0]
    assert "raw events kept 30 days of event time (the default for a new store" in out.stdout


def test_query_says_its_store_and_period(made):
    out = burnwatch("query", "untagged", "--since", "1d", env=made)
    assert out.returncode == 0 and out.stdout == "(no rows)\n"
    assert "store: chdb://" in out.stderr and "the store holds no events yet" in out.stderr
    # a period reaching back past 1970 starts there (a traceback: year -273788674 is out of range)
    out = burnwatch("query", "untagged", "--since", "99999999999d", env=made)
    no_traceback(out)
    assert out.returncode == 0 and out.stdout == "(no rows)\n", out.stderr


def test_query_refuses_an_empty_period(tmp_path):
    """``--since 0d`` read an empty period and printed "(no rows)" for every report, as if nothing had
    burned; it is refused before any store is opened."""
    out = burnwatch("query", "waste", "--since", "0d", env={"BURNWATCH_DATA_DIR": str(tmp_path)})
    no_traceback(out)
    assert out.returncode == EXIT_FAILED and out.stdout == "", out.stdout
    assert out.stderr.strip() == "--since 0d: the period is empty; give a length, e.g. 1h, 1d, 7d"


def test_query_says_a_team_the_store_does_not_know(made):
    """``--team Research`` (the tag is ``research``) printed "(no rows)", which reads as a team that
    wasted nothing; a team no usage, alert or bill of the store names is one line naming the teams it has,
    exit 1. A known team with nothing in the period is still "(no rows)"."""
    store_writes("INSERT INTO burnwatch.resource_usage (ts, resource_id, resource_type, interval_s, usd, tags) "
                 "VALUES (now64(3), 'h1', 'gpu_instance', 60, 1, map('team', 'research'))", env=made)  # fmt: skip
    out = burnwatch("query", "failed-runs", "--team", "Research", env=made)
    no_traceback(out)
    assert out.returncode == EXIT_FAILED and out.stdout == "", out.stdout
    assert out.stderr.splitlines()[-1] == ("--team Research: no such team in this store (team tags are matched exactly); "
                                           "its teams: research")  # fmt: skip
    out = burnwatch("query", "failed-runs", "--team", "research", env=made)
    assert out.returncode == 0 and out.stdout == "(no rows)\n", out.stderr


# -- figure 6: db migrate and model train ---------------------------------------------------------


def test_db_migrate_leaves_a_stores_event_expiry_alone_unless_told(made):
    """On a copy of the demo's store (kept forever, events dated in the past), ``db migrate``
    with the environment's default turned the 30-day expiry on: 43,488 usage rows went to 0."""
    old = ("INSERT INTO burnwatch.resource_usage (ts, resource_id, resource_type, interval_s, usd) "
           "SELECT now64(3) - toIntervalDay(100) + toIntervalMinute(number), 'old-host', 'gpu_instance', 60, 1 "
           "FROM numbers(300)")  # fmt: skip
    store_writes(old, env=made)
    out = burnwatch("db", "migrate", env=made)
    store_writes("OPTIMIZE TABLE burnwatch.resource_usage FINAL", env=made)  # the merge that applies a TTL
    count = burnwatch("sql", "SELECT count() AS n FROM burnwatch.resource_usage", "--format", "csv", env=made)
    assert count.stdout.splitlines() == ["n", "300"]
    assert out.returncode == 0 and "raw events kept forever (the store's own" in out.stdout, out.stdout
    told = burnwatch("db", "migrate", env={**made, "BURNWATCH_EVENT_TTL_DAYS": "30"})  # set on purpose: applied
    assert "raw events kept 30 days of event time (BURNWATCH_EVENT_TTL_DAYS)" in told.stdout
    assert "300 raw events are older than 30 days" in told.stdout


def test_a_default_event_expiry_applies_to_a_new_store_only(chdb_client):
    """What the worker's start relies on (``explicit`` is whether the setting was given)."""
    for db in ("t_ttl_existing", "t_ttl_new"):
        chdb_client.command(f"DROP DATABASE IF EXISTS {db}")
    first = Store(chdb_client, "t_ttl_existing")
    first.migrate()
    assert first.schema.created and first.schema.set_event_ttl(0) == 0
    again = Store(chdb_client, "t_ttl_existing")
    again.migrate()
    assert not again.schema.created
    assert again.schema.set_event_ttl(30, explicit=False) == 0 and again.schema.event_ttl() == 0
    assert again.schema.set_event_ttl(30, explicit=True) == 30 and again.schema.event_ttl() == 30
    new = Store(chdb_client, "t_ttl_new")
    new.migrate()
    assert new.schema.set_event_ttl(30, explicit=False) == 30 and new.schema.event_ttl() == 30
    assert "event_ttl_days" not in load_settings(environ={}).model_fields_set
    assert "event_ttl_days" in load_settings(environ={"BURNWATCH_EVENT_TTL_DAYS": "0"}).model_fields_set


def test_db_migrate_makes_a_missing_table_again_instead_of_saying_up_to_date(made):
    store_writes("DROP TABLE burnwatch.alert_actions", env=made)
    out = burnwatch("db", "migrate", env=made)
    assert out.returncode == 0, out.stderr
    said = next(line for line in out.stdout.splitlines() if " database burnwatch: " in line)
    assert "up to date" not in said and said.endswith("made again the missing alert_actions")
    tables = burnwatch("sql", "EXISTS TABLE burnwatch.alert_actions", "--format", "csv", env=made)
    assert tables.stdout.splitlines()[1] == "1"
    assert burnwatch("db", "migrate", env=made).stdout.splitlines()[0].endswith(": up to date")


def test_model_train_that_trains_nothing_says_so_and_what_stays_in_use(made, tmp_path):
    import numpy as np

    from detector.model.features import FEATURE_SETS, feature_names
    from detector.model.forest import fit

    group = sorted(FEATURE_SETS)[0]
    rows = np.random.default_rng(0).normal(size=(600, len(feature_names(group))))
    models = tmp_path / "models"
    path = fit(group, rows, trained_from=1.7e9, trained_to=1.7e9 + 86_400).save(models)
    before = path.stat().st_mtime_ns
    out = burnwatch("model", "train", "--dir", str(models), env=made)
    no_traceback(out)
    assert out.returncode == EXIT_FAILED, out.stdout
    assert "trained nothing" in out.stderr and f"the models already in {models} stay in use ({group})" in out.stderr
    assert f"{group}: 0 windows" in out.stdout and "stays in use" in out.stdout
    assert "loads them within" not in out.stdout
    assert path.stat().st_mtime_ns == before


# -- expected failures: one line, an exit code -----------------------------------------------------


def test_a_query_clickhouse_refuses(made):
    out = burnwatch("sql", "SELEC 1", env=made)
    no_traceback(out)
    assert out.returncode == EXIT_FAILED and "ClickHouse refused the query: Code: 62" in out.stderr


@pytest.mark.parametrize("query", ["SELECT count() FROM burnwatch.alertz", "SELECT nosuchcol FROM burnwatch.alerts"])
def test_a_select_clickhouse_refuses_is_not_a_store_that_is_unavailable(made, query):
    """A mistyped table or column in a SELECT fails while its rows stream (clickhouse-connect's
    StreamFailureError, an OperationalError): it is the query that is wrong, not the store that is
    down, so exit 1, not 69 ("trying again later may work")."""
    out = burnwatch("sql", query, env=made)
    no_traceback(out)
    assert out.returncode == EXIT_FAILED, out.stderr
    assert "ClickHouse refused the query: Code: " in out.stderr and "unavailable" not in out.stderr


def test_the_embedded_store_held_by_another_process(made):
    directory = Path(made["BURNWATCH_DATA_DIR"]) / "clickhouse"
    with store_held(directory) as holder:
        for command in (["query", "waste"], ["backtest", "--since", "1d"]):
            out = burnwatch(*command, env=made)
            no_traceback(out)
            assert out.returncode == EXIT_UNAVAILABLE
            assert f"is held by another process (pid {holder.pid}" in out.stderr
            assert f"burnwatch store serve --dsn chdb://{directory}" in out.stderr


def test_a_server_or_broker_that_does_not_answer(tmp_path):
    from streams.embedded import free_port

    out = burnwatch("query", "waste", env={"BURNWATCH_CLICKHOUSE_DSN": f"http://127.0.0.1:{free_port()}"})
    no_traceback(out)
    assert out.returncode == EXIT_UNAVAILABLE and "cannot connect to ClickHouse at http://127.0.0.1:" in out.stderr
    kafka = f"127.0.0.1:{free_port()}"
    for args in (["worker"], ["simulate", "--hours", "0.1", "--publish"]):
        out = burnwatch(*args, env={"BURNWATCH_KAFKA_BOOTSTRAP": kafka, "BURNWATCH_DATA_DIR": str(tmp_path)})
        no_traceback(out)
        assert out.returncode == EXIT_UNAVAILABLE and f"cannot reach Kafka at {kafka}" in out.stderr, (args, out.stderr)
        assert "the port accepts connections" not in out.stderr  # nothing listens there: no hint of a protocol


def test_missing_files_bad_paths_and_bad_seeds(tmp_path):
    missing = str(tmp_path / "nope.jsonl")
    cases = [
        (["backtest", missing], f"{missing}: No such file or directory"),
        (["replay", missing], f"{missing}: No such file or directory"),
        (["simulate", "--hours", "1", "--out", str(tmp_path / "no" / "dir.jsonl")], "--out"),
        (["simulate", "--hours", "1", "--labels", str(tmp_path / "no" / "l.jsonl"), "--out", missing], "--labels"),
        (["eval", "--seeds", "1,two"], "--seeds '1,two': expected"),
        (["--config", missing, "rules", "check"], "cannot read config"),
    ]
    for args, message in cases:
        out = burnwatch(*args, env={"BURNWATCH_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
        no_traceback(out)
        assert out.returncode == EXIT_FAILED and message in out.stderr, (args, out.stderr)
    assert not Path(missing).exists()  # --labels failed before anything was written


def test_simulate_refuses_one_file_named_for_two_outputs(tmp_path):
    """--out F --labels F wrote the fleet, then the labels over it (or the other way), exit 0."""
    fleet = tmp_path / "fleet.jsonl"
    fleet.write_text("kept\n")
    out = burnwatch("simulate", "--hours", "1", "--out", str(fleet), "--labels", str(tmp_path / "." / "fleet.jsonl"))
    no_traceback(out)
    assert out.returncode == EXIT_FAILED and "--out and --labels name the same file" in out.stderr, out.stderr
    assert fleet.read_text() == "kept\n"  # refused before anything was opened


def test_simulate_refuses_a_wrong_price_before_writing_anything(tmp_path):
    """simulate prices its fleet with pricing.yaml: a wrong price is refused at its file and line
    (it was a ValueError's traceback), and no --out file is left empty behind it."""
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    pricing = rules / "pricing.yaml"
    text = pricing.read_text()
    assert text.count("on_demand: 55.04,") == 1
    pricing.write_text(text.replace("on_demand: 55.04,", "on_demand: lots,"))
    line = 1 + text[: text.index("on_demand: 55.04,")].count("\n")
    out_file = tmp_path / "fleet.jsonl"
    out = burnwatch("simulate", "--hours", "1", "--out", str(out_file), env={"BURNWATCH_RULES": str(rules)})
    no_traceback(out)
    assert out.returncode == EXIT_FAILED, out.stderr
    assert f"{pricing}:{line} instances.p5.48xlarge.on_demand: Input should be a valid number" in out.stderr
    assert not out_file.exists()


def test_output_piped_into_head_stops_quietly():
    reader = subprocess.Popen([sys.executable, "-m", "streams.cli", "simulate", "--hours", "2"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=die_with_parent())  # fmt: skip
    assert reader.stdout.read(100)
    reader.stdout.close()  # what `| head -c 100` does
    stderr = reader.stderr.read().decode()
    assert reader.wait(timeout=120) == EXIT_BROKEN_PIPE
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr


# -- the rest of what a newcomer meets -------------------------------------------------------------


def test_version_and_the_workers_environment_in_its_help():
    from importlib.metadata import version

    out = burnwatch("--version")
    assert out.returncode == 0 and out.stdout.startswith(f"burnwatch {version('burnwatch')} (Python ")
    text = burnwatch("worker", "--help").stdout
    assert all(var in text for var in ENV.values()), [var for var in ENV.values() if var not in text]


def test_rules_check_reports_duplicate_names_with_every_other_error(tmp_path):
    """A duplicate rule name used to be hidden while its file had any other error."""
    (tmp_path / "a.yaml").write_text("rules:\n  - name: idle-gpu\n    type: idle_gpu\n"
                                     "  - name: broken\n    type: idle_gpu\n    params: {for: 30 minutes}\n")  # fmt: skip
    (tmp_path / "b.yaml").write_text("rules:\n  - name: idle-gpu\n    type: idle_gpu\n")
    out = burnwatch("rules", "check", str(tmp_path))
    assert out.returncode == EXIT_FAILED
    assert f"{tmp_path / 'a.yaml'}:6 rules[1].params.for: invalid duration '30 minutes'" in out.stderr
    assert (f"{tmp_path / 'b.yaml'}:2 rules[0].name: duplicate rule name 'idle-gpu' (also in {tmp_path / 'a.yaml'}:2)"
            in out.stderr)  # fmt: skip
    assert "2 error(s)" in out.stderr


def test_backtest_shows_an_events_control_characters_escaped(tmp_path):
    """A resource id is the producer's text: an escape sequence in it would clear the reader's screen
    and print a forged line, a right-to-left override reverse what follows. Shown escaped instead."""
    from detector.simulate import SimConfig
    from tests.reliability import idle_host, write_records

    rid = "gpu-\x1b[2J\x1b[31mFAKE: all clear\x1b[0m\r\u202e"
    fleet = write_records(tmp_path / "fleet.jsonl", idle_host(rid, SimConfig().start))
    out = burnwatch("backtest", str(fleet))
    no_traceback(out)
    assert out.returncode == 0 and "Idle GPUs on gpu-" in out.stdout, out.stderr
    assert "\x1b" not in out.stdout and "\r" not in out.stdout and "\u202e" not in out.stdout
    assert "gpu-\\x1b[2J\\x1b[31mFAKE: all clear\\x1b[0m\\r\\u202e" in out.stdout


def test_the_digests_lines_show_an_events_text_escaped():
    from streams.cli import _offender

    line = _offender({"resource_id": "gpu-\x1b[2Jx", "type": "idle_gpu", "team": "nlp\u202e"})
    assert line == "gpu-\\x1b[2Jx (idle_gpu, nlp\\u202e)"


def test_replay_refuses_the_topics_backtest_refuses(tmp_path):
    fleet = tmp_path / "fleet.jsonl"
    fleet.write_text('{"topic": "resource-usage", "key": "h", "value": {}}\n'
                     '{"topic": "gpu_metrics", "key": "h", "value": {}}\n')  # fmt: skip
    refused = burnwatch("backtest", str(fleet))
    no_traceback(refused)
    assert refused.returncode == EXIT_FAILED and refused.stdout == "", refused.stdout  # it exited 0, alerts shown
    assert "1 record(s) on a topic burnwatch does not read" in refused.stderr
    assert f"{fleet}:2: unknown topic 'gpu_metrics'" in refused.stderr
    out = burnwatch("replay", str(fleet), env={"BURNWATCH_KAFKA_BOOTSTRAP": "127.0.0.1:1"})  # never reached
    no_traceback(out)
    assert out.returncode == EXIT_FAILED, out.stderr
    assert f"{fleet}:2: topic 'gpu_metrics'" in out.stderr and "nothing was published" in out.stderr


@pytest.mark.parametrize("name, content", [("gpu.pkl", b"\x80\x04junk"), ("gpu.skops", b"PK not a zip")])
def test_a_model_file_that_is_refused_is_one_line_naming_it(tmp_path, name, content):
    """`model show` (and `model train`, which reads what stays in use) on a directory holding an
    old pickle or a damaged file: the file named and why, exit 1, no traceback."""
    (tmp_path / name).write_bytes(content)
    out = burnwatch("model", "show", "--dir", str(tmp_path))
    no_traceback(out)
    assert out.returncode == EXIT_FAILED and str(tmp_path / name) in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize(("day", "said"), [("2026-02-29", "no such day (day is out of range for month)"),
                                           ("yesterday", "expected YYYY-MM-DD"),
                                           ("2026-02-011", "expected YYYY-MM-DD")])  # fmt: skip
def test_digest_of_a_day_no_calendar_has_says_so(day, said):
    """2026-02-29 is written as asked and is no day: it was told 'expected YYYY-MM-DD'."""
    out = burnwatch("digest", "--day", day)
    no_traceback(out)
    assert out.returncode != 0 and f"--day {day!r}: {said}" in out.stderr, out.stderr


def test_digest_of_a_day_without_alerts_says_which_days_the_store_holds(made):
    """A day outside the store's alerts (a typo of the year) read as a quiet day, 'nothing burned', exit 0: it
    says which days the store's alerts run over (first-day evaluation), and that it holds none yet when so."""
    out = burnwatch("digest", "--day", "2027-11-02", env=made)
    no_traceback(out)
    assert out.returncode == 0 and "nothing burned on 2027-11-02 (the store holds no alert yet)" in out.stdout, out.stdout
    alerts = ("INSERT INTO burnwatch.alerts (alert_id, type, rule, resource_id, status, change, severity, "
              "episode_start, fired_at, updated_at, waste_usd, usd_per_hour, details, silenced, version) VALUES "
              "('a1', 'idle_gpu', 'idle-gpu', 'h1', 'resolved', 'resolved', 'warning', "
              "'2026-11-02 02:00:00', '2026-11-02 02:30:00', '2026-11-03 06:00:00', 12, 3, '{}', '', 1)")  # fmt: skip
    store_writes(alerts, env=made)
    out = burnwatch("digest", "--day", "2027-11-02", env=made)
    assert "nothing burned on 2027-11-02 (the store's alerts run from 2026-11-02 to 2026-11-03)" in out.stdout, out.stdout


def test_digest_prints_what_could_be_saved_apart_from_the_waste(made):
    """The digest's could-be-saved dollars (spot, right-size) are printed on their own line,
    never added to the day's waste total."""
    usage = ("INSERT INTO burnwatch.resource_usage (ts, resource_id, resource_type, interval_s, usd) "
             "SELECT toDateTime64('2026-11-02 00:00:00', 3, 'UTC') + toIntervalHour(number), 'h1', 'gpu_instance', "
             "3600, 10 FROM numbers(24)")  # fmt: skip
    alerts = ("INSERT INTO burnwatch.alerts (alert_id, type, rule, resource_id, status, change, severity, "
              "episode_start, fired_at, updated_at, waste_usd, usd_per_hour, details, silenced, version) VALUES "
              "('s1', 'spot_eligible', 'spot-eligible', 'run-1', 'resolved', 'resolved', 'info', "
              "'2026-11-02 02:00:00', '2026-11-02 02:00:00', '2026-11-02 06:00:00', 12, 3, "
              "'{\"resource_ids\": [\"h1\"]}', '', 1)")  # fmt: skip
    store_writes(usage, alerts, env=made)
    out = burnwatch("digest", "--day", "2026-11-02", env=made)
    no_traceback(out)
    assert out.returncode == 0, out.stderr
    assert "could be saved (not waste, not in the total): $12.00" in out.stdout, out.stdout
    assert "spot_eligible" in out.stdout


def test_digest_prints_what_was_fixed_what_stayed_open_and_writes_its_chart(made, tmp_path):
    """``burnwatch digest`` shows the day as the Slack digest does: what was fixed (and how), what
    stayed open (and at what rate), the last days; ``--chart`` writes the chart it posts."""
    usage = ("INSERT INTO burnwatch.resource_usage (ts, resource_id, resource_type, interval_s, usd) "
             "SELECT toDateTime64('2026-11-02 00:00:00', 3, 'UTC') + toIntervalHour(number % 24), "
             "['h1', 'h2'][intDiv(number, 24) + 1], 'gpu_instance', 3600, 10 FROM numbers(48)")  # fmt: skip
    columns = ("INSERT INTO burnwatch.alerts (alert_id, type, rule, resource_id, status, change, severity, "
               "episode_start, fired_at, updated_at, resolved_at, waste_usd, usd_per_hour, tags, details, silenced, version) "
               "VALUES ")
    rows = ("('a1', 'idle_gpu', 'idle', 'h1', 'resolved', 'resolved', 'warning', '2026-11-02 01:00:00', "
            "'2026-11-02 01:00:00', '2026-11-02 05:00:00', '2026-11-02 05:00:00', 40, 10, {'team': 'nlp'}, "
            "'{\"reason\": \"gpu_busy\"}', '', 1), "
            "('a2', 'idle_gpu', 'idle', 'h2', 'firing', 'fired', 'warning', '2026-11-02 02:00:00', "
            "'2026-11-02 02:00:00', '2026-11-02 08:00:00', NULL, 60, 10, {'team': 'vision'}, '{}', '', 1)")  # fmt: skip
    changes = [("INSERT INTO burnwatch.alert_changes (alert_id, at, waste_usd) VALUES "
                "('a1', '2026-11-02 01:00:00', 0), ('a1', '2026-11-02 05:00:00', 40), "
                "('a2', '2026-11-02 02:00:00', 0), ('a2', '2026-11-02 08:00:00', 60)")]
    store_writes(usage, columns + rows, *changes, env=made)
    chart = tmp_path / "digest.png"
    out = burnwatch("digest", "--day", "2026-11-02", "--chart", str(chart), env=made)
    no_traceback(out)
    assert out.returncode == 0, out.stderr
    assert "fixed: h1 (idle_gpu, nlp) resolved 05:00 UTC, gpu busy; $40.00 that day" in out.stdout, out.stdout
    assert "open: h2 (idle_gpu, vision) $10.00/h; $60.00 that day" in out.stdout, out.stdout
    assert "last 14 days: 11-02 $100" in out.stdout, out.stdout
    assert chart.read_bytes().startswith(b"\x89PNG")


def test_query_shows_a_table_of_at_most_a_hundred_rows_unless_told_and_says_so():
    """``query incidents --since 2d`` on a fleet of 3,200 GPUs printed 4,398 rows, with nothing said of how many."""
    from streams.cli import _first_rows

    rows = [{"n": i} for i in range(250)]
    shown, said = _first_rows(rows, None, "table")
    assert shown == rows[:100] and said.startswith("(the first 100 of 250 rows: --limit 0 shows them all")
    assert _first_rows(rows, None, "csv") == (rows, "") and _first_rows(rows, 0, "table") == (rows, "")
    assert _first_rows(rows, 7, "json")[0] == rows[:7] and _first_rows(rows[:5], None, "table") == (rows[:5], "")
    out = burnwatch("query", "waste", "--limit", "-1")
    assert out.returncode == 2 and "argument --limit: takes 0 (all) or more, not -1" in out.stderr
