"""``burnwatch incidents`` as a user runs it, in a subprocess (one embedded ClickHouse per
process): the table, the JSON the worker's endpoint also serves, the filters, and the
expected failures (a bad option, the embedded store held by a worker) as one line and an
exit code."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from streams.cli import EXIT_FAILED, EXIT_UNAVAILABLE
from tests.conftest import ROOT
from tests.helpers import store_held
from tests.test_cli import burnwatch, no_traceback

pytestmark = pytest.mark.integration

SEED = textwrap.dedent("""
    import sys
    from detector.actions import Click
    from detector.store import Store
    from tests.test_incidents import alert
    store = Store.open("chdb://" + sys.argv[1])
    store.alerts.record([alert("big", 98.0, usd=196.0, team="nlp", owner="ines"),
                         alert("small", 1.5, usd=3.0, team="nlp", owner="\\x1b[2Jmallory"),
                         alert("cv", 12.0, usd=24.0, team="cv", owner="ola"),
                         alert("done", 40.0, usd=80.0, team="nlp", resolved_at=1_790_009_000.0)], version=1)
    store.actions.record(Click(alert_id="small", action="acknowledged", user_id="U1", user_name="bob", channel="C1",
                               message_ts="1.2"), at=1_800_000_000.0)
    store.deliveries.record("big", "fired", "C0123ABC", "1790000060.123456")
    store.close()
""")


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    data = tmp_path_factory.mktemp("incidents")
    out = subprocess.run([sys.executable, "-c", SEED, str(data / "clickhouse")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return {"BURNWATCH_DATA_DIR": str(data)}


def test_the_table_open_ones_first_by_dollars_per_hour(seeded):
    out = burnwatch("incidents", env=seeded)
    no_traceback(out)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["firing", "firing", "acknowledged", "resolved"]
    assert [line.split()[-1] for line in lines[1:]] == ["big", "cv", "small", "done"]
    assert lines[1].split()[1:4] == ["$98.00", "$196.00", "1h"]
    assert "\x1b" not in out.stdout and "\\x1b[2Jmallory" in out.stdout  # a terminal shows it, does not obey it
    assert f"store: chdb://{Path(seeded['BURNWATCH_DATA_DIR']) / 'clickhouse'}" in out.stderr
    assert "4 incidents; 3 open, burning $111.50/h" in out.stderr


def test_json_with_filters_is_the_endpoints_document(seeded):
    out = burnwatch("incidents", "--open", "--team", "nlp", "--format", "json", "--limit", "1",
                    env={**seeded, "SLACK_WORKSPACE_URL": "https://acme.slack.com"})  # fmt: skip
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["filter"] == {"open": True, "team": "nlp", "limit": 1, "offset": 0}
    assert (body["total"], body["shown"], body["open_total"], body["open_usd_per_hour"]) == (2, 1, 2, 99.5)
    (big,) = body["incidents"]
    assert (big["alert_id"], big["state"], big["owner"]) == ("big", "firing", "ines")
    assert (big["usd_per_hour"], big["usd"]) == (98.0, 196.0)
    assert big["slack_url"] == "https://acme.slack.com/archives/C0123ABC/p1790000060123456"


def test_nothing_open_for_a_team_says_so_of_the_store_given(seeded, tmp_path):
    dsn = f"chdb://{Path(seeded['BURNWATCH_DATA_DIR']) / 'clickhouse'}"
    out = burnwatch("incidents", "--open", "--team", "search", "--store", dsn, env={"BURNWATCH_DATA_DIR": str(tmp_path)})
    assert out.returncode == 0 and out.stdout == "no open incidents for team search\n"
    assert f"store: {dsn}, database burnwatch" in out.stderr


@pytest.mark.parametrize(("args", "says"), [
    (["--limit", "0"], "--limit: 0 is not between 1 and 1000"),
    (["--team", "nlp\x07"], "--team: control characters are not allowed"),
])  # fmt: skip
def test_a_bad_option_is_one_line(tmp_path, args, says):
    out = burnwatch("incidents", *args, env={"BURNWATCH_DATA_DIR": str(tmp_path)})
    no_traceback(out)
    assert out.returncode == EXIT_FAILED and out.stderr.strip() == says
    assert not (tmp_path / "clickhouse").exists()


def test_a_store_held_by_the_worker_points_at_the_workers_endpoint(seeded):
    directory = Path(seeded["BURNWATCH_DATA_DIR"]) / "clickhouse"
    with store_held(directory) as holder:
        out = burnwatch("incidents", "--open", env={**seeded, "BURNWATCH_WEB_PORT": "7077"})
        no_traceback(out)
        assert out.returncode == EXIT_UNAVAILABLE
        assert f"is held by another process (pid {holder.pid}" in out.stderr
        assert "curl 'http://127.0.0.1:7077/api/incidents?open=1'" in out.stderr
        assert "http://127.0.0.1:7077/incidents" in out.stderr
        # the same question of the worker (team quoted), at an IPv6 address written as a URL takes it
        out = burnwatch("incidents", "--team", "r&d", "--limit", "5",
                        env={**seeded, "BURNWATCH_WEB_PORT": "7077", "BURNWATCH_WEB_HOST": "::1"})  # fmt: skip
        assert out.returncode == EXIT_UNAVAILABLE
        assert "curl 'http://[::1]:7077/api/incidents?team=r%26d&limit=5'" in out.stderr, out.stderr
        assert "http://[::1]:7077/incidents (" in out.stderr
