"""An older release's worker upgraded to this checkout's on one store and one consumer group.

    .venv/bin/python bench/upgrade.py --old /path/to/old/worktree --scenario term|kill|rolling|downgrade|rollback
        [--server old] [--hours 12] [--hosts 4] [--speed 900] [--workdir DIR]

The old release is a git worktree with its own ``.venv`` (``git worktree add DIR SHA && make -C DIR
install-test``); its worker runs from there, this checkout's from here. A seeded fleet is paced into
the embedded broker; Slack is the local stand-in, shared by both versions.

- ``term`` / ``kill``: the old worker (on ``chdb:///dir``) takes the first half and is stopped with
  SIGTERM / SIGKILL mid-stream; the new worker then starts on the same store and group and takes the
  rest (``term``: it migrates the store at its start, the log's ``migrations_applied``; ``kill``: a
  ``burnwatch db migrate`` of this checkout first, timed, as a pre-upgrade job would).
- ``rolling``: a store server (this checkout's); an old and a new worker share the group for the middle
  third, then the old one leaves cleanly (a Kubernetes rolling update); the new one's ``/healthz`` is
  sampled meanwhile (``held_by_other_workers_s``: an old release records no partition progress).
- ``downgrade``: ``term``, then the old worker started again on the store the new one migrated.
- ``rollback``: ``term`` the other way round: this checkout's worker takes the first half, the old one the
  rest (the store stays migrated; "old" and "new" in the report then name the first and the second).

At the end: events stored against the file (each once), stored alerts against backtest's at this
checkout, and Slack's posts (each incident opened once, each resolution once in its thread).
Not part of the suite: CI has one checkout (tests/test_upgrade.py reproduces what this found from
rows of the old shape written directly).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from detector.rules import load_rules  # noqa: E402
from detector.simulate import SimConfig  # noqa: E402
from detector.testing import LocalSlack  # noqa: E402
from streams.children import die_with_parent  # noqa: E402
from streams.embedded import EmbeddedBroker  # noqa: E402
from streams.kafka import value_end_time  # noqa: E402
from streams.process import StoreServerProcess  # noqa: E402
from tests.reliability import (  # noqa: E402
    Pacer,
    Worker,
    compare_alerts,
    compare_posts,
    expected_counts,
    fleet,
    publish,
    slack_env,
    stored,
    stored_alerts,
    wait_acknowledged,
    worker_env,
)  # fmt: skip

PARTITIONS = 4


class VersionWorker(Worker):
    """The worker of the checkout at ``root`` (its own ``.venv``), run from there."""

    def __init__(self, env: dict[str, str], log_path: Path, root: Path) -> None:
        super().__init__(env, log_path)
        self.root = root

    def start(self) -> VersionWorker:
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [str(self.root / ".venv/bin/python"), "-m", "streams.cli", "worker"], cwd=self.root,
                env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=die_with_parent(),
            )  # fmt: skip
        return self


def old_sql(old: Path, env: dict[str, str], query: str) -> subprocess.CompletedProcess[str]:
    """``burnwatch sql`` of the old release (its exit status and output, refused or not)."""
    return subprocess.run([str(old / ".venv/bin/python"), "-m", "streams.cli", "sql", query, "--format", "json"],
                          cwd=old, env={**os.environ, **env}, capture_output=True, text=True, timeout=180)  # fmt: skip


def events_of(log: Path, *names: str) -> list[dict]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") in names or entry.get("level") in ("error", "critical", "exception"):
            out.append(entry)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--scenario", choices=["term", "kill", "rolling", "downgrade", "rollback"], required=True)
    parser.add_argument("--hours", type=float, default=12)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--speed", type=float, default=900.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--k8s-nodes", type=int, default=0)
    parser.add_argument("--serving", type=int, default=0)
    parser.add_argument("--training-jobs", type=int, default=0)
    parser.add_argument("--notebooks", type=int, default=2)
    parser.add_argument("--server", choices=["new", "old"], default="new",
                        help="whose `store serve` the rolling scenario runs (an operator may upgrade it last)")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="upgrade_"))
    work.mkdir(parents=True, exist_ok=True)
    ruleset = load_rules(ROOT / "rules")
    cfg = SimConfig(hours=args.hours, training_hosts=args.hosts, notebooks=args.notebooks, inference_endpoints=1, buckets=1,
                    vector_dbs=1, cpu_instances=1, seed=args.seed, k8s_nodes=args.k8s_nodes,
                    serving_endpoints=args.serving, training_jobs=args.training_jobs)  # fmt: skip
    fl = fleet(work / "fleet.jsonl", cfg, ruleset)
    n = len(fl.records)
    old_rules, new_rules = work / "rules_old", work / "rules_new"
    shutil.copytree(args.old / "rules", old_rules, dirs_exist_ok=True)
    shutil.copytree(ROOT / "rules", new_rules, dirs_exist_ok=True)
    store_dir = work / "ch"
    server: StoreServerProcess | None = None
    workers: list[Worker] = []
    report: dict = {"work": str(work), "scenario": args.scenario, "messages": n, "expected_alerts": len(fl.expected)}
    t0 = time.monotonic()

    def note(what: str) -> None:
        print(f"{time.monotonic() - t0:7.1f}s {what}", flush=True)

    try:
        with EmbeddedBroker(log_path=work / "broker.log") as broker, LocalSlack() as slack:
            publish(broker.bootstrap, [], partitions=PARTITIONS)
            if args.scenario == "rolling":
                server = StoreServerProcess(f"chdb://{store_dir}", work / "store.log")
                if args.server == "old":  # the same command, from the old checkout
                    server.proc.kill()
                    server.proc.wait()
                    with open(work / "store.log", "ab") as log:
                        server.proc = subprocess.Popen(
                            [str(args.old / ".venv/bin/python"), "-m", "streams.cli", "store", "serve", "--dsn",
                             f"chdb://{store_dir}", "--port", str(server.port)], cwd=args.old, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=die_with_parent(),
                        )  # fmt: skip
                server.wait_ready()
                dsn = server.url
            else:
                dsn = f"chdb://{store_dir}"

            def env(name: str, rules: Path) -> dict[str, str]:
                return worker_env(broker.bootstrap, work / name, rules, PARTITIONS, BURNWATCH_CLICKHOUSE_DSN=dsn,
                                  **slack_env(slack))  # fmt: skip

            def start(name: str, root: Path, rules: Path) -> Worker:
                worker = VersionWorker(env(name, rules), work / f"{name}.log", root).start()
                workers.append(worker)
                note(f"started {name} ({root})")
                return worker

            first, second = (ROOT, args.old) if args.scenario == "rollback" else (args.old, ROOT)
            old = start("old", first, old_rules)
            old.wait_until(lambda h: h["partitions"] > 0, timeout=180)
            pacer = Pacer(broker.bootstrap, fl.records, args.speed)
            pacer.start()
            if args.scenario == "rolling":
                pacer.wait_sent(n // 3, timeout=300)
                new = start("new", ROOT, new_rules)
                new.wait_until(lambda h: h["partitions"] > 0, timeout=180)
                note("new holds partitions")
                samples = []
                while pacer.sent < 2 * n // 3 and not pacer.finished.is_set():
                    h = new.health()
                    if h is not None:
                        samples.append((h.get("status"), h.get("held_by_other_workers_s"), h.get("held"),
                                        h.get("alerts_fired", h.get("alerts"))))
                    time.sleep(1.0)
                report["new_health_during_overlap"] = samples[::5]
                report["overlap_max_held_by_other_workers_s"] = max((s[1] or 0 for s in samples), default=None)
                code = old.stop()
                note(f"old stopped (SIGTERM): {code}")
            else:
                pacer.wait_sent(n // 2, timeout=300)
                code = old.kill() if args.scenario == "kill" else old.stop()
                note(f"old stopped ({'SIGKILL' if args.scenario == 'kill' else 'SIGTERM'}): {code}")
                report["cut_sent"] = cut = pacer.sent
                cut_t = max(value_end_time(v) or 0.0 for _, _, v in fl.records[:cut])
                report["alerts_open_across_cut"] = sum(
                    1 for a in fl.expected if a.fired_at <= cut_t and (a.resolved_at is None or a.resolved_at > cut_t))
                if args.scenario == "kill":  # a pre-upgrade `db migrate` job on the killed worker's store, timed
                    started = time.monotonic()
                    migrate = subprocess.run([sys.executable, "-m", "streams.cli", "db", "migrate"], capture_output=True,
                                             text=True, env={**os.environ, **env("migrate", new_rules)})  # fmt: skip
                    report["db_migrate"] = (migrate.returncode, round(time.monotonic() - started, 2),
                                            (migrate.stdout + migrate.stderr)[-400:])
                workers.remove(old)
                started = time.monotonic()
                new = start("new", second, new_rules)
                new.wait_until(lambda h: h["partitions"] > 0, timeout=180)
                report["new_start_to_partitions_s"] = round(time.monotonic() - started, 1)
            workers[:] = [new]
            pacer.wait_sent(n, timeout=600)
            note("all sent")
            wait_acknowledged(broker.bootstrap, new, timeout=300)
            note("all acknowledged")
            report["new_exit"] = new.stop()
            if args.scenario == "downgrade":
                again = start("old_again", args.old, old_rules)
                deadline = time.monotonic() + 90
                while time.monotonic() < deadline and again.running and again.health() is None:
                    time.sleep(0.5)
                report["downgrade_running"] = again.running
                report["downgrade_health"] = again.health()
                report["downgrade_exit"] = again.stop()
                report["downgrade_sql"] = old_sql(args.old, env("old_again", old_rules),
                                                  "SELECT count() FROM burnwatch.alerts").stderr[-600:]
            posts = compare_posts(slack, fl.expected)
        if server is not None:
            server.stop()
            server = StoreServerProcess(f"chdb://{store_dir}", work / "store2.log").wait_ready()
            dsn = server.url
        read_env = worker_env("127.0.0.1:1", work / "read", new_rules, PARTITIONS, BURNWATCH_CLICKHOUSE_DSN=dsn)
        counts = stored(read_env)
        alerts = compare_alerts(fl.expected, stored_alerts(read_env))
        kinds = {a.alert_id: f"{a.type} {a.resource_id} fired {a.fired_at:.0f}" for a in fl.expected}
        report["alerts_differing"] = {i: kinds.get(i.split(" ")[0], "") for i in alerts.missing + alerts.different_ids}
        report["expected_by_type"] = dict(sorted(Counter(a.type for a in fl.expected).items()))
        report.update(
            events_file=sum(expected_counts(fl.records).values()), events_stored=counts.total,
            events_doubled=counts.doubled, per_table={t: (counts.rows[t], expected_counts(fl.records)[t]) for t in counts.rows},
            alerts=str(alerts), posts=str(posts),
        )  # fmt: skip
        for name in ("old", "new"):
            log = work / f"{name}.log"
            if log.exists():
                report[f"{name}_log"] = [
                    {k: e.get(k) for k in ("timestamp", "event", "level", "migrations", "error", "exception", "key",
                                           "rule", "partitions", "keys", "note") if k in e}
                    for e in events_of(log, "migrations_applied", "state_loaded", "migration_edited", "tables_restored",
                                       "state_unreadable", "rule_state_discarded")
                ][:40]  # fmt: skip
    finally:
        for worker in workers:
            worker.kill()
        if server is not None:
            server.stop()
    print(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
