"""No secret in any log line, error or report, at any level.

The secrets: the Slack bot token, webhook URL and signing secret, and the ClickHouse
password in the DSN. The real CLI and a real worker run with ``BURNWATCH_LOG_LEVEL=debug``
(slack-sdk logs a webhook's whole URL at debug level) and are made to fail; their
output must name what failed without the secret.
"""

from __future__ import annotations

import io
import json
import logging
import logging.config
import os
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest

from detector.logs import (
    REDACTED,
    install_redaction,
    redact,
    redact_dsn,
    register_secrets,
    register_settings,
    stdlib_logging_config,
)
from detector.settings import load_settings
from detector.testing import LocalSlack
from streams.embedded import EmbeddedBroker, free_port
from streams.process import WorkerProcess, worker_env
from tests.conftest import ROOT
from tests.helpers import T0

TOKEN = "xoxb-1111111111-2222222222-TokenSecretValue"
SIGNING = "signing-secret-5a6b7c8d9e"
PASSWORD = "Pa55w0rd-ClickHouse"


def secrets_in(text: str, *extra: str) -> list[str]:
    return [s for s in (TOKEN, SIGNING, PASSWORD, *extra) if s in text]


def dead_dsn() -> str:
    """A ClickHouse server URL with a password, where nothing listens."""
    return f"http://burnwatch:{PASSWORD}@127.0.0.1:{free_port()}"


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("token xoxb-123-456-abcDEF in a message", "xoxb-123-456-abcDEF"),  # a bot token nobody registered
        ("user token xoxp-9-8-7", "xoxp-9-8-7"),
        ("posting to https://hooks.slack.com/services/T0/B0/abcdef now", "T0/B0/abcdef"),
        ("connecting to http://user:hunter22@db:8123/?x=1", "hunter22"),
        ("{'dsn': 'https://u:p%40ss@h'}", "p%40ss"),
    ],
)
def test_secret_shaped_strings_are_redacted_unregistered(text, secret):
    assert secret not in redact(text) and REDACTED in redact(text)


def test_registered_values_are_redacted_and_the_dsn_keeps_where_it_points():
    dsn = f"http://burnwatch:{PASSWORD}@clickhouse:8123"
    settings = load_settings(environ={"SLACK_BOT_TOKEN": TOKEN, "SLACK_SIGNING_SECRET": SIGNING,
                                      "SLACK_WEBHOOK_URL": "http://127.0.0.1:9/services/T1/B1/Hook",
                                      "BURNWATCH_CLICKHOUSE_DSN": dsn})  # fmt: skip
    register_settings(settings)
    line = f"sign {SIGNING} pass {PASSWORD} hook http://127.0.0.1:9/services/T1/B1/Hook path /services/T1/B1/Hook"
    assert secrets_in(redact(line), "T1/B1/Hook") == []
    assert redact_dsn(dsn) == f"http://burnwatch:{REDACTED}@clickhouse:8123"
    assert redact_dsn("chdb:///var/lib/burnwatch/clickhouse") == "chdb:///var/lib/burnwatch/clickhouse"


def test_third_party_debug_records_and_tracebacks_are_redacted():
    """What slack-sdk, urllib3, aiokafka or Faust log at debug level goes through the
    same handler as ours: message, arguments and traceback are redacted."""
    register_secrets(PASSWORD, "http://127.0.0.1:9/services/T2/B2/Hook")
    root = logging.getLogger()
    saved = (root.level, root.handlers[:])
    out = io.StringIO()
    try:
        logging.config.dictConfig(stdlib_logging_config("json", "debug"))
        root.handlers[0].setStream(out)  # type: ignore[attr-defined]
        logging.getLogger("slack_sdk.webhook.client").debug(
            "Sending a request - url: http://127.0.0.1:9/services/T2/B2/Hook, body: {}")
        logging.getLogger("aiokafka").debug("password %s in args", PASSWORD)
        try:
            raise RuntimeError(f"cannot log in with {PASSWORD}")
        except RuntimeError:
            logging.getLogger("faust").exception("crashed")
    finally:
        root.handlers[:] = saved[1]
        root.setLevel(saved[0])
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["event"].split(" ")[0] for line in lines] == ["Sending", "password", "crashed"]
    assert secrets_in(out.getvalue(), "T2/B2/Hook") == []
    assert "RuntimeError: cannot log in with [redacted]" in lines[2]["exception"]


def test_a_command_lines_tracebacks_and_last_resort_logs_are_redacted(capsys, monkeypatch):
    """Before logging is configured (any command but the worker), stdlib's last-resort
    handler writes warnings, and Python writes uncaught tracebacks: both redacted."""
    register_secrets(PASSWORD)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setattr(logging.lastResort, "filters", [])
    install_redaction()
    try:
        raise ConnectionError(f"refused for burnwatch:{PASSWORD}")
    except ConnectionError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    logging.lastResort.handle(logging.makeLogRecord({"msg": "retrying with %s", "args": (PASSWORD,),
                                                     "levelno": logging.WARNING, "levelname": "WARNING"}))  # fmt: skip
    err = capsys.readouterr().err
    assert "ConnectionError: refused for burnwatch:[redacted]" in err and "retrying with [redacted]" in err
    assert PASSWORD not in err


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streams.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env})  # fmt: skip


def test_cli_names_an_unreachable_store_without_its_password(tmp_path):
    env = {"BURNWATCH_CLICKHOUSE_DSN": dead_dsn(), "BURNWATCH_LOG_LEVEL": "debug", "SLACK_BOT_TOKEN": TOKEN,
           "SLACK_SIGNING_SECRET": SIGNING, "BURNWATCH_DATA_DIR": str(tmp_path)}  # fmt: skip
    for args in (["backtest", "--since", "1d"], ["db", "migrate"], ["sql", "SELECT 1"]):
        run = cli(*args, env=env)
        assert run.returncode != 0, args
        output = run.stdout + run.stderr
        assert secrets_in(output) == [], (args, output)
        assert "burnwatch:[redacted]@127.0.0.1" in output, (args, output)  # it still says where it tried


def test_a_worker_at_debug_level_logs_no_secret(tmp_path):
    """Two real workers with every secret set: one whose store cannot be reached (it must
    fail, saying where), one that posts an idle-GPU alert through the webhook after a
    failed attempt (slack-sdk logs the webhook URL at debug level)."""
    with LocalSlack() as slack, EmbeddedBroker() as broker:
        webhook = slack.webhook_url
        secrets = {"SLACK_BOT_TOKEN": TOKEN, "SLACK_WEBHOOK_URL": webhook, "SLACK_SIGNING_SECRET": SIGNING,
                   "BURNWATCH_LOG_LEVEL": "debug"}  # fmt: skip (no SLACK_CHANNEL: the webhook posts)
        failing = WorkerProcess(worker_env(broker.bootstrap, tmp_path / "a", ROOT / "rules", 1,
                                           BURNWATCH_CLICKHOUSE_DSN=dead_dsn(), **secrets), tmp_path / "a.log")  # fmt: skip
        failing.start()
        assert exited(failing, timeout=30), failing.tail()
        assert failing.stop() not in (0, None)
        log = failing.log_path.read_text()
        assert "burnwatch:[redacted]@127.0.0.1" in log and secrets_in(log, webhook) == [], log[-3000:]

        publish_idle_host(broker.bootstrap)
        slack.fail_next(1, status=500)  # a failed post: its error is logged too
        worker = WorkerProcess(worker_env(broker.bootstrap, tmp_path / "b", ROOT / "rules", 1, **secrets),
                               tmp_path / "b.log").start()  # fmt: skip
        try:
            assert slack.wait_for(lambda requests: any(r.method == "webhook" for r in requests), timeout=45), worker.tail()
        finally:
            worker.stop()
        log = worker.log_path.read_text()
        assert "Sending a request" in log  # slack-sdk's debug line, which held the webhook URL
        assert secrets_in(log, webhook, "T000/B000/XXXX") == [], [
            line for line in log.splitlines() if secrets_in(line, webhook, "T000/B000/XXXX")][:3]


def exited(worker: WorkerProcess, timeout: float) -> bool:
    """Wait for the worker to exit on its own (True), or the timeout (False)."""
    deadline = time.monotonic() + timeout
    while worker.running and time.monotonic() < deadline:
        time.sleep(0.1)
    return not worker.running


def publish_idle_host(bootstrap: str) -> None:
    """An hour of one GPU host at 0 % utilisation: the shipped idle-gpu rule fires."""
    import asyncio

    from streams.kafka import ensure_topics, publish_records

    def ts(t: float) -> str:
        return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    usage = [{"ts": ts(T0 + i * 60), "resource_id": "gpu-1", "resource_type": "gpu_instance",
              "instance_type": "p4d.24xlarge", "region": "us-east-1", "cost_usd": 0.5, "interval_s": 60,
              "tags": {"team": "nlp"}} for i in range(60)]  # fmt: skip
    metrics = [{"ts": ts(T0 + i * 30), "resource_id": "gpu-1", "gpu_index": 0, "util_pct": 0.0} for i in range(120)]
    records = [("resource-usage", "gpu-1", json.dumps(usage).encode()),
               ("gpu-metrics", "gpu-1", json.dumps(metrics).encode())]  # fmt: skip

    async def go() -> None:
        await ensure_topics(bootstrap, 1)
        await publish_records(bootstrap, records)

    asyncio.run(go())
