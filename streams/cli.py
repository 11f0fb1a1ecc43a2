"""``burnwatch``: the command line.

    burnwatch demo                          embedded broker + ClickHouse + worker + simulated fleet
    burnwatch worker                        the streaming worker (Faust)
    burnwatch simulate --out fleet.jsonl    a synthetic fleet with labelled waste
    burnwatch replay fleet.jsonl            publish a replay file to Kafka
    burnwatch backtest fleet.jsonl --json   run the rules in-process, print the alerts
    burnwatch backtest --since 7d --compare rules-new/   what a rules change would add or remove
    burnwatch eval                          precision/recall/dollar error per type, simulated fleets
    burnwatch rules check [PATH]            validate rule files; exit 1 on any error
    burnwatch silence add --match team=nlp --type idle_gpu --for 8h --reason "..."   (list, expire ID)
    burnwatch query waste --since 7d --team nlp --format csv   a named post-mortem report
    burnwatch sql "SELECT ..."              ad hoc post-mortem query against the store
    burnwatch store serve [--port 8123]     own the embedded store, serve it to several workers over HTTP
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from detector.logs import configure_logging, install_redaction, redact, redact_dsn, register_settings
from detector.settings import Settings, load_settings

__all__ = ["main"]


def _settings(args: argparse.Namespace, **overrides: Any) -> Settings:
    try:
        settings = load_settings(getattr(args, "config", None), **overrides)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    register_settings(settings)  # from here on, no log line, error or message shows its secrets
    return settings


def cmd_worker(args: argparse.Namespace) -> int:
    settings = _settings(args)
    configure_logging(settings.log_format, settings.log_level)
    if not settings.kafka_bootstrap:
        raise SystemExit(
            "BURNWATCH_KAFKA_BOOTSTRAP is not set (host:port of a Kafka broker); `burnwatch demo` starts an embedded one"
        )
    from detector.rules import RulesInvalid
    from detector.runtime import tune_gc
    from streams.app import run_worker

    tune_gc()
    try:
        run_worker(settings)
    except RulesInvalid as exc:
        raise SystemExit(f"rules refused:\n{exc}") from None
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from detector.pricing import load_pricing
    from detector.replay import write_replay
    from detector.simulate import SimConfig, simulate

    settings = _settings(args)
    cfg = SimConfig(
        hours=args.hours, training_hosts=args.hosts, notebooks=args.notebooks,
        inference_endpoints=args.inference, seed=args.seed,
    )  # fmt: skip
    pricing = load_pricing(settings.rules_path / "pricing.yaml")
    records, labels = simulate(cfg, pricing)
    if args.labels:
        Path(args.labels).write_text("".join(json.dumps(label.to_json()) + "\n" for label in labels))
    if args.publish:
        from streams.kafka import ensure_topics, publish_records

        bootstrap = settings.kafka_bootstrap or sys.exit("--publish needs BURNWATCH_KAFKA_BOOTSTRAP")
        encoded = ((topic, key, json.dumps(value).encode()) for _, topic, key, value in records)

        async def go() -> int:
            await ensure_topics(bootstrap, settings.partitions)
            return await publish_records(bootstrap, encoded, speed=args.speed)

        n = asyncio.run(go())
        print(f"published {n} messages; {len(labels)} labelled waste episodes", file=sys.stderr)
        return 0
    out = open(args.out, "wb") if args.out and args.out != "-" else sys.stdout.buffer
    try:
        n = write_replay(records, out)
    finally:
        if out is not sys.stdout.buffer:
            out.close()
    print(f"wrote {n} messages; {len(labels)} labelled waste episodes", file=sys.stderr)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from detector.replay import ReplayError
    from streams.kafka import publish_file

    settings = _settings(args)
    if not settings.kafka_bootstrap:
        raise SystemExit("BURNWATCH_KAFKA_BOOTSTRAP is not set")
    try:
        n = asyncio.run(publish_file(settings.kafka_bootstrap, args.file, settings.partitions, speed=args.speed))
    except ReplayError as exc:
        raise SystemExit(str(exc)) from None
    print(f"published {n} messages from {args.file}", file=sys.stderr)
    return 0


def _load_rules_or_exit(path: Any) -> Any:
    from detector.rules import RulesInvalid, load_rules

    try:
        return load_rules(path)
    except RulesInvalid as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(1) from None


def cmd_backtest(args: argparse.Namespace) -> int:
    import time

    from detector.backtest import backtest, backtest_store, compare
    from detector.replay import ReplayError
    from detector.runtime import tune_gc
    from detector.suppression import describe_holds
    from detector.units import format_duration, parse_duration, rfc3339

    tune_gc()
    settings = _settings(args)
    if bool(args.file) == bool(args.since):
        raise SystemExit("backtest needs a replay file or --since DURATION (events stored in ClickHouse), not both")
    ruleset = _load_rules_or_exit(args.rules or settings.rules_path)
    other = _load_rules_or_exit(args.compare) if args.compare else None
    started = time.perf_counter()
    if args.since:
        from detector.store import Store

        try:
            since = parse_duration(args.since)
        except ValueError as exc:
            raise SystemExit(f"--since: {exc}") from None
        try:
            store = Store.open(settings.dsn, settings.clickhouse_database)
        except Exception as exc:  # chdb refuses a data directory another process (the worker) holds
            raise SystemExit(f"cannot open the store {redact_dsn(settings.dsn)}: {redact(str(exc))}") from None
        try:
            result = backtest_store(store.history, since, ruleset, other)
        finally:
            store.close()
        source = (f"{redact_dsn(settings.dsn)} from {rfc3339(result.span[0])} to {rfc3339(result.span[1])} "
                  f"({format_duration(result.span[1] - result.span[0])})") if result.span else "an empty store"  # fmt: skip
    else:
        try:
            result = backtest(args.file, ruleset, other=other)
        except ReplayError as exc:
            raise SystemExit(str(exc)) from None
        source = args.file
    elapsed = time.perf_counter() - started
    if other is not None and result.other is not None:
        _print_comparison(compare(result.alerts, result.other), args.json)
    elif args.json:
        for alert in result.alerts:
            print(json.dumps(alert.to_json()))
    else:
        for alert in result.alerts:
            print(alert.summary() + (f"  (held back, {alert.held.kind}: {alert.held.reason})" if alert.held else ""))
    print(
        f"{len(result.alerts)} alerts from {result.events} events of {source} "
        f"({result.events / max(elapsed, 1e-9):,.0f} events/s); {len(result.invalid)} invalid",
        file=sys.stderr,
    )
    held = describe_holds(result.alerts)
    if held:
        print(held, file=sys.stderr)
    for line, reason in result.invalid[:20]:
        print(f"{args.file}:{line}: {reason}", file=sys.stderr)
    return 0


def _print_comparison(diff: Any, as_json: bool) -> None:
    if as_json:
        for change, alerts in (("added", diff.added), ("removed", diff.removed)):
            for alert in alerts:
                print(json.dumps({"change": change, **alert.to_json()}))
        return
    print(f"The change would add {len(diff.added)} alerts (${diff.added_usd:,.2f}) and remove "
          f"{len(diff.removed)} (${diff.removed_usd:,.2f}); {len(diff.kept)} stay "
          f"(their dollars change by ${diff.kept_usd_change:+,.2f}).")  # fmt: skip
    by_type: dict[str, list[int]] = {}
    for change, alerts in ((0, diff.added), (1, diff.removed)):
        for alert in alerts:
            by_type.setdefault(alert.type, [0, 0])[change] += 1
    for rule_type, (added, removed) in sorted(by_type.items()):
        print(f"  {rule_type}: +{added} -{removed}")
    for sign, alerts in (("+", diff.added), ("-", diff.removed)):
        for alert in alerts:
            print(f"{sign} {alert.summary()}")


def cmd_eval(args: argparse.Namespace) -> int:
    import time

    from detector.evaluate import evaluate
    from detector.runtime import tune_gc

    tune_gc()
    ruleset = _load_rules_or_exit(args.rules or _settings(args).rules_path)
    seeds = [int(s) for s in args.seeds.split(",")]
    started = time.perf_counter()
    if args.model:
        from detector.evaluate import evaluate_model

        anomaly, false_rate, model_runs = evaluate_model(ruleset, seeds)
        if args.json:
            print(json.dumps({"seeds": seeds, "runs": model_runs, "total": anomaly.to_json(),
                              "false_alerts_per_1000_resource_hours": round(false_rate, 3)}))  # fmt: skip
            return 0
        print(f"anomaly model, {len(seeds)} fleets of 96 h (seeds {args.seeds}): trained on the first 48 h, "
              f"scored on the last 48 h; {time.perf_counter() - started:.0f} s")  # fmt: skip
        for run in model_runs:
            print(f"  seed {run['seed']}: {run['labels']} injected, {run['alerts']} alerts, {run['found']} found, "
                  f"{run['false_alerts']} false over {run['resource_hours']:.0f} resource-hours; of the missed, "
                  f"{run['missed_but_reported_by_a_rule']} reported by a rule's alert")  # fmt: skip
        p, r = anomaly.precision, anomaly.recall
        print(f"precision {p if p is None else round(p, 3)}, recall {r if r is None else round(r, 3)}, "
              f"{false_rate:.2f} false alerts per 1,000 resource-hours (targets: recall >= 0.8, <= 1)")  # fmt: skip
        return 0
    totals, runs = evaluate(ruleset, seeds, hours=args.hours, messy=args.messy)
    if args.json:
        print(json.dumps({"seeds": seeds, "hours": args.hours, "runs": runs,
                          "totals": {t: s.to_json() for t, s in sorted(totals.items())}}))  # fmt: skip
        return 0
    how = "delivered messily (lost scrapes, jitter, duplicates, delays)" if args.messy else "delivered cleanly"
    print(f"{len(seeds)} fleets of {args.hours:g} h (seeds {args.seeds}), {how}; {time.perf_counter() - started:.0f} s")
    print(f"{'type':<28}{'labels':>7}{'alerts':>7}{'found':>7}{'precision':>11}{'recall':>8}{'median err':>12}")

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    for rule_type, s in sorted(totals.items()):
        error = "-" if s.median_error is None else f"{100 * s.median_error:.1f} %"
        print(f"{rule_type:<28}{s.labels:>7}{s.alerts:>7}{s.found:>7}{pct(s.precision):>11}{pct(s.recall):>8}{error:>12}")
    return 0


def cmd_silence(args: argparse.Namespace) -> int:
    import getpass

    from detector.rules import RulesInvalid
    from detector.silencing import add_silence, expire_silence, list_silences, now_utc, parse_match, parse_time
    from detector.units import parse_duration

    rules_dir = Path(args.rules or _settings(args).rules_path)
    now = now_utc()
    try:
        if args.silence_command == "add":
            starts = parse_time(args.start) if args.start else now
            silence = add_silence(
                rules_dir, parse_match(args.match or []), types=args.type or [], rules=args.rule or [], starts=starts,
                until=starts + parse_duration(args.duration), reason=args.reason, created_by=args.by or getpass.getuser(),
            )  # fmt: skip
            print(f"silence {silence.id} from {silence.starts.isoformat()} until {silence.until.isoformat()} added to "
                  f"{rules_dir}/silences.yaml; a running worker takes it up within seconds")  # fmt: skip
        elif args.silence_command == "expire":
            silence = expire_silence(rules_dir, args.id, now)
            print(f"silence {silence.id} expired")
        else:
            rows = [r for r in list_silences(rules_dir, now) if args.all or r["state"] != "expired"]
            if args.json:
                for row in rows:
                    print(json.dumps(row))
            else:
                _print_table(rows) if rows else print("no silences in force" + ("" if args.all else " (--all lists ended ones)"))
    except RulesInvalid as exc:
        print(f"refused, the rules would not load:\n{exc}", file=sys.stderr)
        return 1
    except (ValueError, KeyError) as exc:
        print(str(exc).strip("'\""), file=sys.stderr)
        return 1
    return 0


def cmd_digest(args: argparse.Namespace) -> int:
    from datetime import datetime, timezone

    from detector.digest import build_digests, digest_chart, render_digest
    from detector.store import Store

    settings = _settings(args)
    try:
        day = datetime.strptime(args.day, "%Y-%m-%d").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        raise SystemExit(f"--day {args.day!r}: expected YYYY-MM-DD") from None
    store = Store.open(settings.dsn, settings.clickhouse_database)
    try:
        digests = build_digests(store.digests, day)
    finally:
        store.close()
    if not digests:
        print(f"nothing burned on {args.day}")
        return 0
    notifier = None
    if args.post:
        from streams.app import _notifier

        notifier = _notifier(settings) or sys.exit("--post needs SLACK_BOT_TOKEN and SLACK_CHANNEL, or SLACK_WEBHOOK_URL")
    for d in digests:
        print(f"{d.channel or '(default channel)'}: ${d.total:,.2f} on {d.date}; {d.incidents} incidents, "
              f"{d.open_incidents} open at the end (${d.open_usd_per_hour:,.2f}/h)")  # fmt: skip
        for rule_type, usd in sorted(d.by_type.items(), key=lambda kv: -kv[1]):
            print(f"  {rule_type:<28}${usd:>12,.2f}")
        for team, usd in sorted(d.by_team.items(), key=lambda kv: -kv[1]):
            print(f"  team {team:<23}${usd:>12,.2f}")
        for o in d.top:
            print(f"  top: {o['resource_id']} ({o['type']}, {o['team']}) ${o['usd']:,.2f}")
        if notifier is not None:
            notifier.post_digest(d, render_digest(d), digest_chart(d))
    return 0


def cmd_model(args: argparse.Namespace) -> int:
    from detector.model.forest import ModelSet

    settings = _settings(args)
    out = Path(args.dir) if args.dir else settings.model_path
    if args.model_command == "show":
        models = ModelSet.load(out)
        if not models:
            print(f"no model in {out}: the worker runs rules only")
            return 0
        for artifact in models.artifacts.values():
            print(json.dumps(artifact.meta(), indent=2))
        return 0
    from detector.model.train import train_from_store
    from detector.store import Store
    from detector.units import parse_duration

    ruleset = _load_rules_or_exit(args.rules or settings.rules_path)
    store = Store.open(settings.dsn, settings.clickhouse_database)
    try:
        artifacts, ts = train_from_store(store, parse_duration(args.since), ruleset, out, quantile=args.quantile,
                                         margin=args.margin)  # fmt: skip
    finally:
        store.close()
    for group, windows in sorted(ts.windows.items()):
        trained = next((a for a in artifacts if a.group == group), None)
        what = f"trained on {trained.samples}, threshold {trained.threshold:.4f}" if trained else "too few windows: no model"
        print(f"{group}: {len(windows)} windows, {ts.excluded.get(group, 0)} left out (behaviour incidents); {what}")
    print(f"artifacts in {out}; a running worker loads them within 30 s")
    return 0


def cmd_rules_check(args: argparse.Namespace) -> int:
    from detector.rules import RulesInvalid, load_rules

    path = args.path or _settings(args).rules_path
    try:
        ruleset = load_rules(path)
    except RulesInvalid as exc:
        print(exc, file=sys.stderr)
        print(f"{len(exc.errors)} error(s)", file=sys.stderr)
        return 1
    if not ruleset.rules:
        print(f"{path}: no rule enabled (allow_no_rules: true): detection is off")
        return 0
    print(f"{path}: {len(ruleset.rules)} enabled rule(s) OK: {', '.join(ruleset.names)}")
    return 0


def cmd_rules_explain(args: argparse.Namespace) -> int:
    from detector.rules import RulesInvalid, explain, load_rules

    path = args.path or _settings(args).rules_path
    try:
        print(explain(load_rules(path), args.name), end="")
    except RulesInvalid as exc:
        print(exc, file=sys.stderr)
        return 1
    except KeyError as exc:
        print(exc.args[0], file=sys.stderr)
        return 1
    return 0


def cmd_db_migrate(args: argparse.Namespace) -> int:
    from detector.store import Store, connect

    settings = _settings(args)
    store = Store(connect(settings.dsn), settings.clickhouse_database)
    try:
        applied = store.migrate()
        store.schema.set_event_ttl(settings.event_ttl_days)
        history = store.schema.applied()
    finally:
        store.close()
    print(f"{redact_dsn(settings.dsn)} database {settings.clickhouse_database}: "
          f"{'applied ' + ', '.join(applied) if applied else 'up to date'}")  # fmt: skip
    for m in history:
        print(f"  {m['version']:04d}_{m['name']}  {m['checksum']}  applied {m['applied_at']:%Y-%m-%d %H:%M:%S}")
    ttl = f"{settings.event_ttl_days} days of event time" if settings.event_ttl_days else "forever"
    print(f"raw events kept {ttl}; rollups kept forever")
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from detector.reports import REPORTS, format_rows, run_report
    from detector.store import Store
    from detector.units import parse_duration

    if args.report not in REPORTS:
        known = "\n".join(f"  {name:<12} {r.title}" for name, r in REPORTS.items())
        raise SystemExit(f"unknown report {args.report!r}; the reports:\n{known}")
    try:
        since = parse_duration(args.since)
    except ValueError as exc:
        raise SystemExit(f"--since: {exc}") from None
    settings = _settings(args)
    store = Store.open(settings.dsn, settings.clickhouse_database)
    try:
        rows = run_report(store, args.report, since, args.team or "")
    finally:
        store.close()
    sys.stdout.write(format_rows(rows, args.format))
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    from detector.store import Store

    settings = _settings(args)
    store = Store.open(settings.dsn, settings.clickhouse_database)
    try:
        rows = store.query(args.query)
    finally:
        store.close()
    from detector.reports import format_rows

    sys.stdout.write(format_rows(rows, args.format))
    return 0


def cmd_store_serve(args: argparse.Namespace) -> int:
    from streams.storeserver import redact_dsn, serve

    settings = _settings(args)
    configure_logging(settings.log_format, settings.log_level)
    embedded = settings.dsn if settings.dsn.startswith("chdb:") else f"chdb://{(settings.data_dir / 'clickhouse').resolve()}"
    dsn = args.dsn or embedded
    try:
        return serve(dsn, args.host, args.port)
    except Exception as exc:  # a DSN that is not chdb, a directory another process holds, a port in use
        raise SystemExit(f"store serve {redact_dsn(dsn)} on {args.host}:{args.port}: {exc}") from None


def _print_table(rows: list[dict[str, Any]]) -> None:
    from detector.reports import format_rows

    sys.stdout.write(format_rows(rows, "table"))


def cmd_demo(args: argparse.Namespace) -> int:
    from streams.demo import run_demo

    return run_demo(_settings(args), hours=args.hours, speed=args.speed)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="burnwatch", description="Catch ML cloud waste while it happens.")
    parser.add_argument("--config", help="YAML config file (env: BURNWATCH_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("worker", help="run the streaming worker").set_defaults(func=cmd_worker)

    p = sub.add_parser("simulate", help="generate a simulated fleet with labelled waste")
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--hosts", type=int, default=12, help="GPU training hosts")
    p.add_argument("--notebooks", type=int, default=8)
    p.add_argument("--inference", type=int, default=3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", default="-", help="replay file to write ('-' for stdout)")
    p.add_argument("--labels", help="write the ground-truth labels (JSON lines) here")
    p.add_argument("--publish", action="store_true", help="publish to Kafka instead of writing a file")
    p.add_argument("--speed", type=float, help="with --publish: event-time acceleration (e.g. 600)")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("replay", help="publish a replay file to Kafka")
    p.add_argument("file")
    p.add_argument("--speed", type=float, help="pace by event time at this acceleration; default: as fast as possible")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("backtest", help="run the rules over a replay file, or stored events, in-process")
    p.add_argument("file", nargs="?", help="replay file (JSON lines of topic/key/value)")
    p.add_argument("--since", help="instead of a file: the events stored in ClickHouse over this much event "
                   "time before the newest (e.g. 7d)")  # fmt: skip
    p.add_argument("--rules", help="rules file or directory (default: BURNWATCH_RULES or rules/)")
    p.add_argument("--compare", metavar="OTHER_RULES",
                   help="also run these rules over the same events; print what they would add or remove")  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object per alert")
    p.set_defaults(func=cmd_backtest)

    p = sub.add_parser("eval", help="precision, recall and dollar error per type on simulated fleets")
    p.add_argument("--seeds", default="1,2,3,4,5", help="comma-separated simulator seeds")
    p.add_argument("--hours", type=float, default=48.0, help="hours of fleet time per seed")
    p.add_argument("--rules", help="rules file or directory (default: BURNWATCH_RULES or rules/)")
    p.add_argument("--messy", action="store_true", help="lose 2 %% of scrapes, jitter clocks, duplicate and delay messages")
    p.add_argument("--model", action="store_true", help="the anomaly model: train on 48 h, score the next 48 h")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_eval)

    silence = sub.add_parser("silence", help="silences (kept in rules/silences.yaml)").add_subparsers(
        dest="silence_command", required=True)  # fmt: skip
    p = silence.add_parser("add", help="record matching findings without posting them, for a while")
    p.add_argument("--match", action="append", metavar="KEY=VALUE",
                   help="team=nlp, resource_type=notebook, resource_id=i-0abc, account=..., any tag (repeatable)")
    p.add_argument("--type", action="append", help="rule type (repeatable); default: all")
    p.add_argument("--rule", action="append", help="rule name (repeatable); default: all")
    p.add_argument("--start", help="when it starts, RFC 3339 event time (default: now); alerts that opened "
                   "before it are not silenced")
    p.add_argument("--for", dest="duration", required=True, help="how long from its start, e.g. 8h, 2d")
    p.add_argument("--reason", required=True)
    p.add_argument("--by", help="who (default: $USER)")
    p.add_argument("--rules", help="rules directory (default: BURNWATCH_RULES or rules/)")
    p.set_defaults(func=cmd_silence)
    p = silence.add_parser("list", help="silences in force or pending")
    p.add_argument("--all", action="store_true", help="also the ones that ended")
    p.add_argument("--json", action="store_true")
    p.add_argument("--rules", help="rules directory (default: BURNWATCH_RULES or rules/)")
    p.set_defaults(func=cmd_silence)
    p = silence.add_parser("expire", help="end a silence now")
    p.add_argument("id")
    p.add_argument("--rules", help="rules directory (default: BURNWATCH_RULES or rules/)")
    p.set_defaults(func=cmd_silence)

    p = sub.add_parser("digest", help="a day's waste by type and team, top offenders (what the worker posts daily)")
    p.add_argument("--day", required=True, help="UTC day, YYYY-MM-DD")
    p.add_argument("--post", action="store_true", help="also post it to Slack")
    p.set_defaults(func=cmd_digest)

    model = sub.add_parser("model", help="the anomaly model").add_subparsers(dest="model_command", required=True)
    p = model.add_parser("train", help="train the isolation forests on the events stored in ClickHouse")
    p.add_argument("--since", default="14d", help="event time before the newest stored event (default 14d)")
    p.add_argument("--quantile", type=float, default=0.9999, help="training score quantile the threshold starts at")
    p.add_argument("--margin", type=float, default=0.15, help="added to that quantile's score (fewer false alerts)")
    p.add_argument("--dir", help="model directory (default: BURNWATCH_MODEL_DIR or <data dir>/models)")
    p.add_argument("--rules", help="rules file or directory (default: BURNWATCH_RULES or rules/)")
    p.set_defaults(func=cmd_model)
    p = model.add_parser("show", help="what the model directory holds")
    p.add_argument("--dir", help="model directory (default: BURNWATCH_MODEL_DIR or <data dir>/models)")
    p.set_defaults(func=cmd_model)

    rules = sub.add_parser("rules", help="rule files").add_subparsers(dest="rules_command", required=True)
    p = rules.add_parser("check", help="validate rule files, report every error")
    p.add_argument("path", nargs="?")
    p.set_defaults(func=cmd_rules_check)
    p = rules.add_parser("explain", help="print a rule as detection uses it: defaults and overrides applied")
    p.add_argument("name")
    p.add_argument("--path", help="rules file or directory (default: BURNWATCH_RULES or rules/)")
    p.set_defaults(func=cmd_rules_explain)

    db = sub.add_parser("db", help="the ClickHouse store").add_subparsers(dest="db_command", required=True)
    db.add_parser("migrate", help="create what the schema lacks (the worker does it on start too)").set_defaults(
        func=cmd_db_migrate)  # fmt: skip

    from detector.reports import REPORTS

    p = sub.add_parser("query", help="a named post-mortem report over the store (docs/postmortem.md)",
                       description="Reports: " + "; ".join(f"{n} ({r.title})" for n, r in REPORTS.items()))  # fmt: skip
    p.add_argument("report", help=", ".join(REPORTS))
    p.add_argument("--since", default="7d", help="period before the newest stored event time (default 7d)")
    p.add_argument("--team", help="only this team (the team tag)")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.set_defaults(func=cmd_query)

    p = sub.add_parser("sql", help="run a query against the store")
    p.add_argument("query")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.set_defaults(func=cmd_sql)

    store = sub.add_parser("store", help="the store several workers share").add_subparsers(
        dest="store_command", required=True)  # fmt: skip
    p = store.add_parser("serve", help="own the embedded ClickHouse engine and serve it over ClickHouse's HTTP "
                         "interface (workers: BURNWATCH_CLICKHOUSE_DSN=http://127.0.0.1:PORT)")  # fmt: skip
    p.add_argument("--dsn", help="chdb:///dir to own (default: BURNWATCH_CLICKHOUSE_DSN if chdb://, "
                   "else <data dir>/clickhouse)")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback: there is no auth)")
    p.add_argument("--port", type=int, default=8123, help="port (default 8123, ClickHouse's; 0 picks a free one)")
    p.set_defaults(func=cmd_store_serve)

    p = sub.add_parser("demo", help="everything on embedded defaults, with a simulated fleet")
    p.add_argument("--hours", type=float, default=24.0, help="hours of simulated fleet time")
    p.add_argument("--speed", type=float, default=1800.0, help="event-time acceleration")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    install_redaction()
    try:
        return int(args.func(args) or 0)
    except SystemExit as exc:
        if isinstance(exc.code, str):  # a message for the user: it may quote a DSN or an error
            raise SystemExit(redact(exc.code)) from None
        raise


if __name__ == "__main__":
    sys.exit(main())
