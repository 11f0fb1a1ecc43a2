"""End to end on real parts: embedded Kafka-protocol broker, the Faust worker in its own
process, embedded ClickHouse, slack-sdk against the local Slack server.

A simulated fleet is replayed in two halves with a worker restart between them,
placed inside an open idle episode, so the test also shows that state and the
outbox survive a restart: the episode opened before it resolves after it, in
the same Slack thread, and nothing is posted twice.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from detector.backtest import backtest
from detector.outputs.webhook import verify
from detector.replay import write_replay
from detector.simulate import SimConfig, simulate
from detector.testing import LocalSlack
from streams.embedded import EmbeddedBroker
from streams.kafka import count_events, ensure_topics, file_records, publish_records, value_end_time
from streams.process import WorkerProcess, worker_env
from tests.conftest import ROOT
from tests.receivers import LocalReceiver
from tests.reliability import read_dead_letters
from tests.test_actions import click_body, signed

pytestmark = pytest.mark.integration

PARTITIONS = 4
MALFORMED = [
    ("gpu-metrics", "gpu-host-000", b"{not json", "not JSON"),
    ("resource-usage", "cpu-000", json.dumps({"ts": "2026-11-02T01:00:00Z", "resource_type": "cpu_instance"}).encode(),
     "missing required field `resource_id`"),
    ("gpu-metrics", "gpu-host-001", json.dumps({"ts": "2099-01-01T00:00:00Z", "resource_id": "gpu-host-001",
                                                "gpu_index": 0, "util_pct": 1}).encode(), "in the future"),
]  # fmt: skip
ALERT_ID = re.compile(r"alert `([0-9a-f]{16})`")
SIGNING_SECRET = "e2e-signing-secret"
HOOK_SECRET = "e2e-webhook-secret"


def post_click(port: int, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/slack/actions", data=body, method="POST",
                                     headers={**headers, "Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def publish(bootstrap: str, records) -> int:
    async def go() -> int:
        await ensure_topics(bootstrap, PARTITIONS)
        return await publish_records(bootstrap, records)

    return asyncio.run(go())


def sql(env: dict[str, str], query: str) -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-m", "streams.cli", "sql", query, "--format", "json"],
        env=env, check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_fleet_through_kafka_faust_clickhouse_and_slack(tmp_path: Path, ruleset):
    records, labels = simulate(SimConfig(hours=16, training_hosts=8, notebooks=4, inference_endpoints=2, seed=4,
                                         cpu_notebooks=2), ruleset.pricing)  # fmt: skip
    replay = tmp_path / "fleet.jsonl"
    with open(replay, "wb") as out:
        write_replay(records, out)
    expected = {a.alert_id: a for a in backtest(replay, ruleset).alerts}
    assert len(expected) == len(labels) >= 8

    # Restart the worker in the middle of an open episode (fired, not yet resolved).
    straddling = next(a for a in expected.values() if a.resolved_at is not None and a.resolved_at - a.fired_at > 1200)
    restart_at = straddling.fired_at + 600
    messages = list(file_records(replay))
    split = next(i for i, m in enumerate(messages) if (value_end_time(m[2]) or 0) > restart_at)
    first, second = messages[:split], messages[split:]

    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker, LocalSlack() as slack, LocalReceiver() as hook:
        rules = tmp_path / "rules"
        shutil.copytree(ROOT / "rules", rules)
        routing = yaml.safe_load((rules / "routing.yaml").read_text())  # every alert to a webhook as well as Slack
        routing |= {"outputs": {"hook": {"kind": "webhook", "url": hook.url, "secret_env": "E2E_HOOK_SECRET"}},
                    "send": {"default": ["slack", "hook"]}}  # fmt: skip
        (rules / "routing.yaml").write_text(yaml.safe_dump(routing))
        env = worker_env(broker.bootstrap, tmp_path / "data", rules, PARTITIONS,
                         SLACK_BOT_TOKEN="xoxb-local", SLACK_CHANNEL="#ml-cost", SLACK_BASE_URL=slack.api_url,
                         SLACK_SIGNING_SECRET=SIGNING_SECRET, E2E_HOOK_SECRET=HOOK_SECRET)  # fmt: skip
        publish(broker.bootstrap, first)
        events_first = count_events(first)

        worker = WorkerProcess(env, tmp_path / "worker-1.log").start()
        try:
            worker.wait_until(lambda h: h["events"] >= events_first and h["detected"] >= events_first
                              and h["slack_pending"] == 0 and h["outputs_pending"] == 0, timeout=180)  # fmt: skip
            assert "rules only" in worker.wait_for_log('"model_absent"', timeout=10)  # cold start, said once
        finally:
            assert worker.stop() == 0, worker.tail()
        fired_before = {m for p in slack.calls("chat.postMessage") for m in ALERT_ID.findall(p.text_of_blocks())}
        assert straddling.alert_id in fired_before

        publish(broker.bootstrap, second + [(t, k, v) for t, k, v, _ in MALFORMED])
        events_second = count_events(second)
        worker = WorkerProcess(env, tmp_path / "worker-2.log").start()
        try:
            n_resolved = sum(a.resolved_at is not None for a in expected.values())
            worker.wait_until(
                lambda h: h["events"] >= events_second and h["dead_letters"] >= len(MALFORMED) and h["held"] == 0
                and h["slack_pending"] == 0 and h["outputs_pending"] == 0,  # all detected before the reload below
                timeout=180,
            )  # fmt: skip
            assert slack.wait_for(lambda reqs: len(reqs) >= len(expected) + 2 * n_resolved, timeout=30)
            # Hot reload: a bad edit is refused with its error and the rules in force kept;
            # a good one is taken up, without a restart.
            rules_file = rules / "rules.yaml"
            good = rules_file.read_text()
            rules_file.write_text(good.replace("for: 30m", "for: 30 minutes"))
            refused = json.loads(worker.wait_for_log('"rules_refused"', timeout=30))
            assert any("rules.yaml:" in e and "invalid duration '30 minutes'" in e for e in refused["errors"])
            assert "idle-gpu" in refused["kept"]
            rules_file.write_text(good.replace("for: 30m", "for: 45m"))
            reloaded = json.loads(worker.wait_for_log('"rules_reloaded"', timeout=30))
            assert "idle-gpu" in reloaded["rules"]
            # A button click reaches the worker's web view: signed ones count, forged ones are refused.
            opening = next(p for p in slack.calls("chat.postMessage")
                           if "thread_ts" not in p.body and straddling.alert_id in p.text_of_blocks())  # fmt: skip
            body = click_body("burnwatch_ack", straddling.alert_id, opening.response["ts"])
            assert post_click(worker.port, body, signed(body, at=int(time.time()), secret=SIGNING_SECRET)) == 200
            forged = signed(body, at=int(time.time()), secret="guessed")
            assert post_click(worker.port, body, forged) == 401
            assert post_click(worker.port, body, signed(body, at=int(time.time()) - 600, secret=SIGNING_SECRET)) == 401
            acked = slack.calls("chat.update")[-1]
            assert acked.body["ts"] == opening.response["ts"] and "Acknowledged by <@U123>" in acked.text_of_blocks()
            # Prometheus metrics on the web port.
            with urllib.request.urlopen(f"http://127.0.0.1:{worker.port}/metrics", timeout=10) as response:
                metrics = response.read().decode()
            assert re.search(r'^burnwatch_events_total\{topic="gpu-metrics"\} [1-9]', metrics, re.M)
            assert re.search(r'^burnwatch_consumer_lag\{partition="0",topic="gpu-metrics"\} 0\.0$', metrics, re.M)
            assert re.search(r'^burnwatch_dead_letters_total [1-9]', metrics, re.M)
            assert re.search(r'^burnwatch_slack_requests_total\{outcome="ok"\} [1-9]', metrics, re.M)
            assert re.search(r"^burnwatch_slack_channels_refusing 0\.0$", metrics, re.M)
            assert worker.health()["slack_refusing"] == {}  # every channel took the app's posts
            assert "burnwatch_clickhouse_insert_seconds_bucket" in metrics and "burnwatch_batch_seconds_count" in metrics
        finally:
            assert worker.stop() == 0, worker.tail()

        (click,) = sql(env, "SELECT alert_id, action, user_id FROM burnwatch.alert_actions")
        assert click == {"alert_id": straddling.alert_id, "action": "acknowledged", "user_id": "U123"}

        # -- Slack: one opening per episode, each resolution in its own thread, nothing twice.
        posts = slack.calls("chat.postMessage")
        openings = [(ALERT_ID.findall(p.text_of_blocks()), p.response["ts"]) for p in posts if "thread_ts" not in p.body]
        opened = [alert_id for ids, _ in openings for alert_id in ids]
        assert len(opened) == len(set(opened)), "an incident opened twice"
        missing = {a: (e.type, e.resource_id, e.fired_at) for a, e in expected.items() if a not in opened}
        mentioned = [p.text_of_blocks()[:600] for p in posts for a in missing if expected[a].resource_id in p.text_of_blocks()]
        assert set(opened) == set(expected), f"each episode opens exactly one incident: missing {missing}, {mentioned}"
        opening_ts = {alert_id: ts for ids, ts in openings for alert_id in ids}
        group_ts = {ts for ids, ts in openings if len(ids) > 1}
        replies = [p for p in posts if "thread_ts" in p.body]
        resolved_ids = [ALERT_ID.search(r.text_of_blocks()).group(1) for r in replies]
        assert sorted(resolved_ids) == sorted(a for a, alert in expected.items() if alert.resolved_at is not None)
        for reply, alert_id in zip(replies, resolved_ids, strict=True):
            assert reply.body["thread_ts"] == opening_ts[alert_id]  # in its incident's thread
            alert = expected[alert_id]
            assert f"${alert.waste_usd:,.2f} {alert.dollars}" in reply.text_of_blocks()
        assert straddling.alert_id in resolved_ids  # opened before the restart, resolved after, same thread
        charts = slack.calls("files.completeUploadExternal")  # a chart in incidents' threads
        assert charts and {c.body["thread_ts"] for c in charts} <= set(opening_ts.values()) - group_ts
        last_edit = {u.body["ts"]: u.text_of_blocks() for u in slack.calls("chat.update")}
        assert not group_ts & last_edit.keys()  # a group's message is never rewritten for one member
        still_open = {opening_ts[a] for a, alert in expected.items() if alert.resolved_at is None} - group_ts
        assert still_open & last_edit.keys()  # open incidents' messages were edited as their dollars grew
        for alert_id in resolved_ids:  # every other resolved incident's message ends up saying so
            if opening_ts[alert_id] not in group_ts:
                assert "Resolved" in last_edit[opening_ts[alert_id]]

        # -- the webhook: every opening and every resolution once, across the restart, each signed.
        hooked = [(r.json["id"], r.json["change"]) for r in hook.requests]
        assert sorted(hooked) == sorted([(a, "fired") for a in expected]
                                        + [(a, "resolved") for a, alert in expected.items() if alert.resolved_at])
        assert all(verify(HOOK_SECRET, r.headers["x-burnwatch-timestamp"], r.body, r.headers["x-burnwatch-signature"])
                   for r in hook.requests)  # fmt: skip

        # -- every labelled episode alerted once, on the right resource, dollars within 10 %.
        stored = {r["alert_id"]: r for r in sql(env, "SELECT * FROM burnwatch.alerts FINAL")}
        assert set(stored) == set(expected)
        for label in labels:
            (row,) = [r for r in stored.values() if r["type"] == label.type and r["resource_id"] == label.resource_id
                      and label.start <= expected[r["alert_id"]].fired_at <= label.end]  # fmt: skip
            if row["resolved_at"] is not None:
                assert row["waste_usd"] == pytest.approx(label.waste_usd, rel=0.10)
                assert row["waste_usd"] == pytest.approx(expected[row["alert_id"]].waste_usd, abs=0.01)
            else:  # still open (or a notice) when the data ends: last reported at most 15 minutes ago
                assert -0.01 <= label.waste_usd - row["waste_usd"] <= row["usd_per_hour"] * 0.25 + 0.01

        # -- the stream and backtest agree: same alerts, same event times.
        for alert_id, alert in expected.items():
            row = stored[alert_id]
            assert row["resource_id"] == alert.resource_id
            assert row["fired_at"].replace(" ", "T").startswith(alert.to_json()["fired_at"][:19])
            assert (row["resolved_at"] is None) == (alert.resolved_at is None)

        # -- every valid event is stored; malformed ones went to dead-letter with their reason.
        counts = sql(env, "SELECT (SELECT count() FROM burnwatch.gpu_metrics) + (SELECT count() FROM "
                          "burnwatch.resource_usage) + (SELECT count() FROM burnwatch.run_events) AS n")  # fmt: skip
        # exactly once: what the first worker had stored but not acknowledged is read again
        # by the second and detected again, not stored again
        assert counts[0]["n"] == events_first + events_second
        dead = read_dead_letters(broker.bootstrap, len(MALFORMED))
        assert len(dead) == len(MALFORMED)
        for topic, key, value, reason in MALFORMED:
            (record,) = [d for d in dead if d["key"] == key]
            assert record["topic"] == topic and reason in record["reason"]
            assert record["offset"] >= 0 and record["value_preview"] == value.decode()[:500]
