"""``burnwatch demo``: the whole pipeline on one machine, on embedded defaults.

Starts the embedded broker, the worker (its ClickHouse under
``.burnwatch/demo/``), replays a simulated fleet at accelerated event time,
prints each alert as the worker fires it, then a summary scored against the
simulator's ground truth, one post-mortem query, and follow-up commands that
read the demo's store as typed (it is not the default store, so they name it).
Every process it starts is stopped on exit, Ctrl-C included.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shlex
import shutil
import sys
import threading
import time
from pathlib import Path

from detector.detectors import REGISTRY
from detector.logs import redact_dsn
from detector.replay import write_replay
from detector.rules import load_rules
from detector.settings import Settings
from detector.simulate import SimConfig, simulate
from detector.store import Store, epoch
from detector.units import rfc3339
from streams.embedded import EmbeddedBroker
from streams.kafka import count_events, ensure_topics, file_records, publish_records
from streams.process import WorkerProcess, worker_env

__all__ = ["run_demo"]

POSTMORTEM_SQL = """\
SELECT tags['team'] AS team,
       count() AS episodes,
       round(sum(waste_usd), 2) AS wasted_usd,
       round(sum(dateDiff('second', episode_start, coalesce(resolved_at, updated_at))) / 3600, 1) AS idle_hours
FROM burnwatch.alerts FINAL
WHERE type = 'idle_gpu'
GROUP BY team
ORDER BY wasted_usd DESC"""


def _say(text: str = "") -> None:
    print(text, flush=True)


def _follow_alerts(log_path: Path, stop: threading.Event) -> None:
    """Print the worker's alert lines as they appear in its log."""
    position = 0
    while not stop.is_set():
        try:
            with open(log_path, "rb") as log:
                log.seek(position)
                for line in log:
                    position += len(line)
                    if not line.startswith(b"{"):
                        continue
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    if record.get("event") in ("alert_fired", "alert_resolved"):
                        marker = "🔥" if record["event"] == "alert_fired" else "✅"
                        silenced = f"  (silenced: {record['silenced']})" if record.get("silenced") else ""
                        _say(f"  {marker} {record['summary']}{silenced}")
                    elif record.get("level") in ("error", "critical"):
                        _say(f"  ! worker: {record.get('event')} {record}")
        except FileNotFoundError:
            pass
        stop.wait(0.2)


def burnwatch_command(config: str | None = None) -> str:
    """How to run this burnwatch again from the current directory, as typed into a shell:
    ``burnwatch`` when that is on PATH, else the script beside this Python (``.venv/bin/burnwatch``)."""
    script = Path(sys.executable).parent / "burnwatch"
    on_path = shutil.which("burnwatch")
    if on_path and script.exists() and Path(on_path).resolve() == script.resolve():
        command = "burnwatch"
    elif script.exists():
        command = shlex.quote(_as_typed(script))
    else:
        command = f"{shlex.quote(sys.executable)} -m streams.cli"
    return command + (f" --config {shlex.quote(config)}" if config else "")


def _as_typed(path: Path) -> str:
    """``path`` relative to the current directory when it lies under it, else absolute."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def follow_up_commands(settings: Settings, workdir: Path, hours: float, first_day: str | None,
                       config: str | None = None) -> list[str]:  # fmt: skip
    """Commands that read the demo's store, runnable verbatim from the current directory."""
    env = "" if settings.clickhouse_dsn else f"BURNWATCH_DATA_DIR={shlex.quote(_as_typed(workdir))} "
    burnwatch = env + burnwatch_command(config)
    since = f"{max(1, math.ceil(hours / 24))}d"
    db = settings.clickhouse_database
    sql = (f"SELECT type, count() AS alerts, round(sum(waste_usd), 2) AS usd FROM {db}.alerts FINAL "
           "WHERE silenced = '' GROUP BY type ORDER BY usd DESC")  # fmt: skip
    commands = [
        f"{burnwatch} query waste --since {since}",
        f"{burnwatch} query idle-gpus --since {since}",
        f"{burnwatch} query egress --since {since}",
        f'{burnwatch} sql "{sql}"',  # no character a shell expands inside double quotes
    ]
    if first_day:
        commands.append(f"{burnwatch} digest --day {first_day}")
    return commands


def run_demo(settings: Settings, hours: float = 24.0, speed: float = 1800.0, config: str | None = None) -> int:
    workdir = (settings.data_dir / "demo").resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    ruleset = load_rules(settings.rules_path)
    cfg = SimConfig(hours=hours)
    records, labels = simulate(cfg, ruleset.pricing)
    replay = workdir / "fleet.jsonl"
    with open(replay, "wb") as out:
        n_messages = write_replay(records, out)
    (workdir / "labels.jsonl").write_text("".join(json.dumps(label.to_json()) + "\n" for label in labels))
    messages = list(file_records(replay))
    n_events = count_events(messages)

    _say(f"burnwatch demo: {hours:g}h of a simulated fleet ({n_events:,} events in {n_messages:,} messages,")
    kinds = ", ".join(f"{sum(label.type == k for label in labels)} {k}" for k in sorted({lb.type for lb in labels}))
    _say(f"  injected waste: {kinds}) replayed at {speed:g}x event time")
    broker = worker = None
    stop_follow = threading.Event()
    started = time.monotonic()
    try:
        if settings.kafka_bootstrap:
            bootstrap = settings.kafka_bootstrap
            _say(f"- Kafka: {bootstrap}")
        else:
            broker = EmbeddedBroker(log_path=workdir / "broker.log").start()
            bootstrap = broker.bootstrap
            _say(f"- Kafka: embedded Tansu broker on {bootstrap}")
        dsn = settings.clickhouse_dsn or f"chdb://{workdir / 'clickhouse'}"
        _say(f"- ClickHouse: {redact_dsn(dsn)}")
        slack = "posting to Slack" if settings.slack_configured else "Slack not configured: alerts are printed here"
        _say(f"- Slack: {slack}")
        asyncio.run(ensure_topics(bootstrap, settings.partitions))
        env = worker_env(bootstrap, workdir, settings.rules_path.resolve(), settings.partitions,
                         BURNWATCH_CLICKHOUSE_DSN=dsn)  # fmt: skip
        log_path = workdir / "worker.log"
        worker = WorkerProcess(env, log_path).start()
        follower = threading.Thread(target=_follow_alerts, args=(log_path, stop_follow), daemon=True)
        follower.start()
        worker.wait_until(lambda h: h["partitions"] > 0, timeout=90)
        _say(f"- worker up ({time.monotonic() - started:.0f}s); replaying the fleet...")
        _say()
        asyncio.run(publish_records(bootstrap, messages, speed=speed))
        health = worker.wait_until(lambda h: h["events"] >= n_events and h["slack_pending"] == 0, timeout=120)
        stop_follow.set()
        follower.join(timeout=2)
        worker.stop()
        worker = None
        _say()
        _say(f"Processed {health['events']:,} events ({health['dead_letters']} to dead-letter) "
             f"in {time.monotonic() - started:.0f}s of wall time.")  # fmt: skip
        first_day = _summary(dsn, settings.clickhouse_database, labels)
        _say()
        where = "its store" if settings.clickhouse_dsn else f"its store, {workdir / 'clickhouse'}"
        _say(f"The demo's worker has stopped; these commands read {where} (not the default store):")
        _say()
        for command in follow_up_commands(settings, workdir, hours, first_day, config):
            _say(f"    {command}")
        return 0
    except KeyboardInterrupt:
        _say("\ninterrupted; stopping")
        return 130
    finally:
        stop_follow.set()
        if worker is not None:
            worker.stop(timeout=15)
        if broker is not None:
            broker.stop()


def _summary(dsn: str, database: str, labels: list) -> str | None:
    """Print the summary; return the first alert's day of event time (YYYY-MM-DD), if any."""
    store = Store.open(dsn, database)
    try:
        alerts = store.alerts.latest()
        for rule_type in sorted({a["type"] for a in alerts} | {label.type for label in labels}):
            of_type = [a for a in alerts if a["type"] == rule_type]
            dollars = sum(a["waste_usd"] for a in of_type)
            cls = REGISTRY.get(rule_type)
            what = f", ${dollars:,.2f} {cls.dollars}" if cls is not None and cls.dollars else ""
            _say(f"{rule_type}: {len(of_type)} alerts{what}.")
        found = sum(
            any(a["type"] == label.type and a["resource_id"] == label.resource_id
                and label.start <= epoch(a["fired_at"]) <= label.end
                for a in alerts)
            for label in labels
        )  # fmt: skip
        _say(f"{found} of {len(labels)} injected episodes found.")
        _say()
        _say("A post-mortem query (burnwatch sql '...' runs any other):")
        _say()
        _say("    " + POSTMORTEM_SQL.replace("\n", "\n    "))
        _say()
        rows = store.query(POSTMORTEM_SQL)
        cols = ["team", "episodes", "wasted_usd", "idle_hours"]
        _say("    " + "  ".join(f"{c:>12}" for c in cols))
        for row in rows:
            _say("    " + "  ".join(f"{str(row[c] or '(untagged)'):>12}" for c in cols))
        first = min((a["fired_at"] for a in alerts), default=None)
        if first is None:
            return None
        _say()
        _say(f"Alerts and events stay in ClickHouse ({redact_dsn(dsn)}); first alert fired at "
             f"{rfc3339(epoch(first))} event time.")  # fmt: skip
        return rfc3339(epoch(first))[:10]
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(run_demo(Settings()))
