"""``burnwatch demo``: the whole pipeline on one machine, on embedded defaults.

Starts the embedded broker, the worker (its ClickHouse under
``.burnwatch/demo/``), replays a simulated fleet at accelerated event time,
prints each alert as the worker fires it, then a summary scored against the
simulator's ground truth, one post-mortem query, and follow-up commands that
read the demo's store as typed (it is not the default store, so they name it).
Every process it starts is stopped on exit, Ctrl-C included.

``--via-bridge`` shows the path from telemetry a fleet already has instead: shared
Kubernetes GPU nodes of the simulator (:mod:`detector.simulate_k8s`) are served by fake
dcgm-exporters and a fake kube-state-metrics (:mod:`detector.fake_exporter`), the
bridge (:mod:`streams.bridge`) scrapes them into the broker, and the worker alerts on
GPUs idle beside busy ones, GPUs no pod requested and idle nodes. The bridge's own code
runs round after round as fast as it can; its clock is the exporters' simulated one
(``burnwatch bridge`` runs the same rounds on a 30 s timer).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from detector.detectors import REGISTRY
from detector.logs import redact_dsn
from detector.replay import write_replay
from detector.rules import load_rules
from detector.settings import Settings
from detector.simulate import SimConfig, simulate
from detector.store import Store, epoch
from detector.units import printable, rfc3339
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


_MARKERS = {"alert_fired": "🔥", "alert_resolved": "✅", "alert_withdrawn": "↩️", "alert_corrected": "✏️"}
"""The worker's log events the demo shows, and how (``alert_withdrawn``: an alert resolved, then taken back;
``alert_corrected``: one resolved, then found to have ended earlier)."""


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
                    marker = _MARKERS.get(record.get("event", ""))
                    if marker is not None:
                        silenced = f"  (silenced: {record['silenced']})" if record.get("silenced") else ""
                        _say(f"  {marker} {printable(record['summary'])}{silenced}")
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
                       config: str | None = None, billed: bool = True, egress: bool = True) -> list[str]:  # fmt: skip
    """Commands that read the demo's store, runnable verbatim from the current directory. ``billed`` and
    ``egress``: whether the fleet has a stored bill and egress, without which ``query reconcile`` lists
    every resource "not billed (yet)" and ``query egress`` prints "(no rows)"."""
    store = f"chdb://{workdir.resolve() / 'clickhouse'}"  # a DSN set in this shell would win over a data directory
    env = (f"BURNWATCH_CLICKHOUSE_DSN={shlex.quote(store)} " if settings.clickhouse_dsn
           else f"BURNWATCH_DATA_DIR={shlex.quote(_as_typed(workdir))} ")  # fmt: skip
    burnwatch = env + burnwatch_command(config)
    since = f"{max(1, math.ceil(hours / 24))}d"
    db = settings.clickhouse_database
    sql = (f"SELECT type, count() AS alerts, round(sum(waste_usd), 2) AS usd FROM {db}.alerts FINAL "
           "WHERE silenced = '' GROUP BY type ORDER BY usd DESC")  # fmt: skip
    commands = [f"{burnwatch} query waste --since {since}", f"{burnwatch} query idle-gpus --since {since}"]
    if egress:
        commands.append(f"{burnwatch} query egress --since {since}")
    commands.append(f'{burnwatch} sql "{sql}"')  # no character a shell expands inside double quotes
    if billed:
        commands.append(f"{burnwatch} query reconcile --since {since}")
    if first_day:
        commands.append(f"{burnwatch} digest --day {first_day}")
    return commands


class _Pipeline:
    """The embedded broker (unless Kafka is configured), a worker on the demo's own store, and
    its alerts printed as they fire: what both demos run. Every process it started is
    stopped on exit from ``with``, Ctrl-C included."""

    def __init__(self, settings: Settings, workdir: Path) -> None:
        self.settings, self.workdir = settings, workdir
        self.broker: EmbeddedBroker | None = None
        self.worker: WorkerProcess | None = None
        self.stop_follow = threading.Event()
        self.follower: threading.Thread | None = None
        self.started = time.monotonic()
        # Never the configured broker or store: the simulated fleet would reach the topics real workers
        # read (and their Slack), and its worker, which keeps the demo's events forever, would turn off
        # the store's event expiry and write the simulated alerts beside real ones.
        self.bootstrap = ""
        self.dsn = f"chdb://{workdir / 'clickhouse'}"

    def __enter__(self) -> _Pipeline:
        try:
            return self._start()
        except BaseException:  # a failed or interrupted start stops what did start
            self.__exit__()
            raise

    def _start(self) -> _Pipeline:
        settings = self.settings
        self.broker = EmbeddedBroker(log_path=self.workdir / "broker.log").start()
        self.bootstrap = self.broker.bootstrap
        unused = " (not BURNWATCH_KAFKA_BOOTSTRAP's: the demo's fleet is simulated)" if settings.kafka_bootstrap else ""
        _say(f"- Kafka: embedded Tansu broker on {self.bootstrap}{unused}")
        unused = " (not BURNWATCH_CLICKHOUSE_DSN's)" if settings.clickhouse_dsn else ""
        _say(f"- ClickHouse: {redact_dsn(self.dsn)}{unused}")
        slack = "posting to Slack" if settings.slack_configured else "Slack not configured: alerts are printed here"
        _say(f"- Slack: {slack}")
        asyncio.run(ensure_topics(self.bootstrap, settings.partitions))
        env = worker_env(self.bootstrap, self.workdir, settings.rules_path.resolve(), settings.partitions,
                         BURNWATCH_CLICKHOUSE_DSN=self.dsn)  # fmt: skip
        log_path = self.workdir / "worker.log"
        self.worker = WorkerProcess(env, log_path).start()
        self.follower = threading.Thread(target=_follow_alerts, args=(log_path, self.stop_follow), daemon=True)
        self.follower.start()
        return self

    def ready(self, then: str) -> None:
        """Wait for the worker's partitions; say what comes next."""
        assert self.worker is not None
        self.worker.wait_until(lambda h: h["partitions"] > 0, timeout=90)
        _say(f"- worker up ({time.monotonic() - self.started:.0f}s); {then}...")
        _say()

    def drain(self, n_events: int) -> dict:
        """Wait until the worker has stored ``n_events``, decided every one (none held for event time: a
        CI run under load stopped the worker with the last two episodes not yet decided) and sent what it
        had to; stop it."""
        assert self.worker is not None and self.follower is not None
        health = self.worker.wait_until(lambda h: h["events"] >= n_events and h["held"] == 0 and h["slack_pending"] == 0,
                                        timeout=120)  # fmt: skip
        self.stop_follow.set()
        self.follower.join(timeout=2)
        self.worker.stop()
        self.worker = None
        _say()
        return health

    def wall_s(self) -> float:
        return time.monotonic() - self.started

    def __exit__(self, *exc: object) -> None:
        self.stop_follow.set()
        if self.worker is not None:
            self.worker.stop(timeout=15)
        if self.broker is not None:
            self.broker.stop()


def _fresh_workdir(settings: Settings) -> Path:
    workdir = (settings.data_dir / "demo").resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    return workdir


def _closing(settings: Settings, pipeline: _Pipeline, labels: list, hours: float, config: str | None,
             postmortem: str = POSTMORTEM_SQL, bridge: bool = False) -> None:  # fmt: skip
    """The summary, the post-mortem query and the commands that read the demo's store (``bridge``: the
    bridge demo's, whose Kubernetes nodes have no bill and send no egress)."""
    first_day = _summary(pipeline.dsn, settings.clickhouse_database, labels, postmortem)
    _say()
    workdir = pipeline.workdir
    _say(f"The demo's worker has stopped; these commands read its store, {workdir / 'clickhouse'} (not the default "
         "store):")  # fmt: skip
    _say()
    for command in follow_up_commands(settings, workdir, hours, first_day, config, billed=not bridge, egress=not bridge):
        _say(f"    {command}")


def _the_bill(pipeline: _Pipeline, settings: Settings, cfg: SimConfig, ruleset: Any, replay: Path) -> None:
    """The fleet's FOCUS bill arrives after the fact, as bills do: store it, put the events'
    dollars against it (``query reconcile``), and price the fleet's alerts from it
    (``backtest --bill``): alert dollars then agree with billed dollars."""
    from detector.backtest import backtest
    from detector.billing.agreement import agreement
    from detector.billing.ingest import ingest_files
    from detector.billing.rates import BilledRates
    from detector.billing.reprice import reprice
    from detector.reports import run_report
    from detector.simulate_focus import simulate_focus, write_focus

    bill = simulate_focus(cfg, ruleset.pricing)
    path = write_focus(bill, pipeline.workdir / "bill.parquet")
    store = Store.open(pipeline.dsn, settings.clickhouse_database)
    try:
        result = ingest_files(store, path)
        repriced = reprice(store, result.ingest_id).repriced
        rows = run_report(store, "reconcile", cfg.hours * 3600 + 86_400, "")
        billed = BilledRates.from_store(store)
    finally:
        store.close()
    _say(f"The fleet's FOCUS bill ({path.name}: {result.rows:,} charges, ${result.effective_cost:,.2f} effective) "
         f"stored with `burnwatch ingest focus`, which re-priced {repriced} incidents from it (the digest shows "
         "their billed dollars); `burnwatch query reconcile`, per resource-day:")  # fmt: skip
    both = [r for r in rows if r["claimed_usd"] and r["billed_usd"]]
    reasons: dict[str, int] = {}
    for r in both:
        reasons[r["why"] or "unexplained"] = reasons.get(r["why"] or "unexplained", 0) + 1
    for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        _say(f"    {n:>4}  {why}")
    check = agreement(backtest(replay, ruleset, billed=billed).alerts, bill.rates)
    _say(f"Priced from the bill (`burnwatch backtest {replay.name} --bill {path.name}`): {check.agree} of "
         f"{check.checked} idle and untagged alerts' dollars per hour agree with the billed rate within 1 %.")
    _say()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_demo(settings: Settings, hours: float | None = None, speed: float = 1800.0, config: str | None = None,
             via_bridge: bool = False) -> int:  # fmt: skip
    """The demo; ``hours`` of simulated time (default 24, or 12 through the bridge, whose
    parsing of each scrape's text is what takes the time). Stopped by SIGTERM (``kill``,
    ``timeout``, a supervisor) as by Ctrl-C: it stops what it started, then exits 130."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    if via_bridge:
        return run_bridge_demo(settings, hours or BRIDGE_HOURS, config)
    hours = hours or 24.0
    workdir = _fresh_workdir(settings)
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
    try:
        with _Pipeline(settings, workdir) as pipeline:
            pipeline.ready("replaying the fleet")
            asyncio.run(publish_records(pipeline.bootstrap, messages, speed=speed))
            health = pipeline.drain(n_events)
            _say(f"Processed {health['events']:,} events ({health['dead_letters']} to dead-letter) "
                 f"in {pipeline.wall_s():.0f}s of wall time.")  # fmt: skip
            _say("The same from telemetry a GPU fleet already exposes (dcgm-exporter, kube-state-metrics, through "
                 "`burnwatch bridge`): make demo-bridge, or burnwatch demo --via-bridge.")  # fmt: skip
            _the_bill(pipeline, settings, cfg, ruleset, replay)
            _closing(settings, pipeline, labels, hours, config)
        return 0
    except KeyboardInterrupt:
        _say("\ninterrupted; stopping")
        return 130


BRIDGE_NODES = 4
"""Kubernetes nodes of the bridge demo: one of each kind the simulator has."""
BRIDGE_HOURS = 12.0
"""The bridge demo's simulated time: about a minute and a half of scraping and parsing."""


def run_bridge_demo(settings: Settings, hours: float = BRIDGE_HOURS, config: str | None = None,
                    nodes: int = BRIDGE_NODES) -> int:  # fmt: skip
    """The demo through the bridge: fake exporters → ``streams.bridge`` → Kafka → the worker."""
    from detector.fake_exporter import FakeExporters
    from detector.simulate_k8s import k8s_labels, k8s_nodes

    workdir = _fresh_workdir(settings)
    ruleset = load_rules(settings.rules_path)
    cfg = SimConfig(hours=hours)
    start, end = cfg.start, cfg.start + hours * 3600
    fleet = k8s_nodes(nodes, cfg.seed, start, end, cfg.scrape_s, ruleset.pricing)
    labels = sorted((label for node in fleet for label in k8s_labels(node, start, end, cfg.scrape_s)),
                    key=lambda label: (label.start, label.resource_id))  # fmt: skip
    (workdir / "labels.jsonl").write_text("".join(json.dumps(label.to_json()) + "\n" for label in labels))
    _say(f"burnwatch demo --via-bridge: {hours:g}h of {nodes} shared Kubernetes GPU nodes "
         f"({', '.join(sorted({n.instance_type for n in fleet}))}, pods holding some of the GPUs),")  # fmt: skip
    kinds = ", ".join(f"{sum(label.type == k for label in labels)} {k}" for k in sorted({lb.type for lb in labels}))
    _say(f"  injected waste: {kinds}; served as dcgm-exporter and kube-state-metrics text, scraped by the bridge")
    try:
        with _Pipeline(settings, workdir) as pipeline, FakeExporters(fleet, start, end, cfg.scrape_s) as exporters:
            bridge_yaml = _bridge_config(workdir, exporters)
            _say(f"- exporters: {len(exporters.dcgm_urls)} dcgm-exporters and a kube-state-metrics on 127.0.0.1; "
                 f"the bridge reads {bridge_yaml}")  # fmt: skip
            pipeline.ready("the bridge walks the simulated day")
            n_events = asyncio.run(_walk(pipeline.bootstrap, bridge_yaml, exporters))
            health = pipeline.drain(n_events)
            _say(f"The bridge published {n_events:,} events; the worker processed {health['events']:,} "
                 f"({health['dead_letters']} to dead-letter) in {pipeline.wall_s():.0f}s of wall time.")  # fmt: skip
            _closing(settings, pipeline, labels, hours, config, POSTMORTEM_PODS_SQL, bridge=True)
        return 0
    except KeyboardInterrupt:
        _say("\ninterrupted; stopping")
        return 130


POSTMORTEM_PODS_SQL = """\
SELECT type,
       count() AS episodes,
       round(sum(waste_usd), 2) AS wasted_usd,
       round(sum(dateDiff('second', episode_start, coalesce(resolved_at, updated_at))) / 3600, 1) AS hours
FROM burnwatch.alerts FINAL
WHERE type IN ('idle_gpu', 'partly_idle_gpu', 'unallocated_gpu')
GROUP BY type
ORDER BY wasted_usd DESC"""


def _bridge_config(workdir: Path, exporters: Any) -> Path:
    """The bridge's config for the fake exporters, written as a user would write it: one
    target per node's dcgm-exporter, and kube-state-metrics (which maps each node to its
    instance, and gives the node group's cost labels)."""
    import yaml

    config = {
        "kubernetes": True,
        "listen": "",
        "targets": [{"url": url, "job": "dcgm"} for url in exporters.dcgm_urls.values()]
        + [{"url": exporters.kube_state_url, "job": "kube-state-metrics"}],
    }
    path = workdir / "bridge.yaml"
    path.write_text("# written by burnwatch demo --via-bridge for the fake exporters it started\n"
                    + yaml.safe_dump(config, sort_keys=False))  # fmt: skip
    return path


async def _walk(bootstrap: str, config_path: Path, exporters: Any) -> int:
    """Run the bridge's rounds back to back until the exporters have served the whole
    simulated time; return how many events it published."""
    import msgspec

    from detector.ingest.config import load_bridge_config
    from streams.bridge import Bridge
    from streams.kafka import producer as new_producer

    producer = new_producer(bootstrap)
    await producer.start()
    events = 0

    async def send(topic: str, key: str, value: bytes) -> None:
        nonlocal events
        await producer.send(topic, value=value, key=key.encode())
        events += len(msgspec.json.decode(value))

    bridge = Bridge(load_bridge_config(config_path), send, clock=lambda: exporters.latest)
    next_report = exporters.start + 6 * 3600
    try:
        while not exporters.done:
            for result in await bridge.round():
                if not result.ok and not exporters.done:
                    _say(f"  ! bridge: {result.error}")
            if exporters.latest >= next_report:
                _say(f"  … {rfc3339(exporters.latest)} event time: {events:,} events published")
                next_report += 6 * 3600
        await producer.flush()
    finally:
        await bridge.close()
        await producer.stop()
    return events


def _summary(dsn: str, database: str, labels: list, postmortem: str = POSTMORTEM_SQL) -> str | None:
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
        _say("    " + postmortem.replace("\n", "\n    "))
        _say()
        rows = store.query(postmortem)
        cols = list(rows[0]) if rows else ["team", "episodes", "wasted_usd", "idle_hours"]
        cols = cols if rows or postmortem is POSTMORTEM_SQL else []
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
