"""``burnwatch``: the command line.

    burnwatch demo                          embedded broker + ClickHouse + worker + simulated fleet
    burnwatch worker                        the streaming worker (Faust); --help lists its environment
    burnwatch simulate --out fleet.jsonl    a synthetic fleet with labelled waste
    burnwatch replay fleet.jsonl            publish a replay file to Kafka
    burnwatch bridge --config bridge.yaml   scrape dcgm-exporter/kube-state-metrics into Kafka (--once: one round)
    burnwatch backtest fleet.jsonl --json   run the rules in-process, print the alerts
    burnwatch backtest --since 7d --compare rules-new/   what a rules change would add or remove
    burnwatch model train --from f.jsonl --until T       the anomaly model from a replay file's start
    burnwatch backtest f.jsonl --scores out.csv          every window the model judged, to a CSV
    burnwatch eval                          precision/recall/dollar error per type, simulated fleets
    burnwatch eval --series DIR             event-level precision/recall/F1 on labelled real series
    burnwatch rules check [PATH]            validate rule files; exit 1 on any error
    burnwatch silence add --match team=nlp --type idle_gpu --for 8h --reason "..."   (list, expire ID)
    burnwatch query waste --since 7d --team nlp --format csv   a named post-mortem report
    burnwatch sql "SELECT ..."              ad hoc post-mortem query against the store
    burnwatch incidents --open [--team T]   incidents with dollars so far, $/h, owner, age, state
    burnwatch store serve [--port 8123]     own the embedded store, serve it to several workers over HTTP

Every command that uses the store says which one on stderr, and the commands that only
read it (``query``, ``sql``, ``incidents``, ``backtest --since``, ``digest``, ``model train``) never
create one: a mistyped data directory is an error, not a new empty store. An expected
failure is one line on stderr and an exit code (docs/cli.md), never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detector.logs import configure_logging, install_redaction, redact, redact_dsn, register_settings
from detector.settings import ENV, Settings, bind_host, load_settings, unknown_variables, url_host
from detector.units import csv_cell, money, printable

if TYPE_CHECKING:  # imported where used, so the CLI starts fast
    from detector.backtest import RuleDiff
    from detector.rules import RuleSet

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_UNAVAILABLE", "EXIT_USAGE", "main"]

EXIT_FAILED = 1
"""The command failed for a reason it printed: invalid input, rules refused, no store, a query refused."""
EXIT_USAGE = 2
"""The command line itself is wrong (argparse's code)."""
EXIT_UNAVAILABLE = 69
"""A service is unreachable, or the embedded store is held by another process: trying later may work."""
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
"""Whoever read the output stopped reading (``| head``): as a process killed by SIGPIPE."""


def _settings(args: argparse.Namespace, options: dict[str, str] | None = None, **overrides: Any) -> Settings:
    """The settings, ``overrides`` given by options (``options``: the option of each, where it is not
    ``--its-name``); a bad value ends the command with what was wrong and where it came from."""
    try:
        settings = load_settings(getattr(args, "config", None), options=options, **overrides)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    register_settings(settings)  # from here on, no log line, error or message shows its secrets
    _say_unknown_variables()
    return settings


@functools.cache  # once a command, which may read its settings more than once
def _say_unknown_variables() -> None:
    """A misspelt ``BURNWATCH_`` variable is ignored by the settings: said on stderr, not refused."""
    for warning in unknown_variables(os.environ):
        _note(f"warning: {warning}")


def _note(text: str) -> None:
    """A line for the person at the terminal, on stderr: stdout stays the command's output."""
    print(text, file=sys.stderr, flush=True)


def _say_store(settings: Settings) -> None:
    _note(f"store: {redact_dsn(settings.dsn)}, database {settings.clickhouse_database}")


def _open_store(settings: Settings, source: str = "") -> Any:
    """The configured store for a command that only reads it: it must exist (``source``: the option that
    named it, if one did)."""
    from detector.store import Store, StoreNotFound, StoreOutdated

    _say_store(settings)
    try:
        return Store.open(settings.dsn, settings.clickhouse_database, create=False)
    except StoreOutdated as exc:
        raise SystemExit(str(exc)) from None
    except StoreNotFound as exc:
        raise SystemExit(_no_store(settings, exc, source)) from None


def _no_store(settings: Settings, exc: Exception, source: str = "") -> str:
    """Why there is no store, where its address came from (``source``: an option that named it), and where
    one may be."""
    if not source:
        default = "" if "data_dir" in settings.model_fields_set else ", the default"
        source = "BURNWATCH_CLICKHOUSE_DSN" if settings.clickhouse_dsn else f"BURNWATCH_DATA_DIR={settings.data_dir}{default}"
    lines = [f"{exc} (the store's address comes from {source}); nothing was created."]
    demo = settings.data_dir / "demo"
    if not settings.clickhouse_dsn and (demo / "clickhouse" / "metadata").is_dir():
        lines.append(f"`burnwatch demo` keeps its store in {demo}: put BURNWATCH_DATA_DIR={shlex.quote(str(demo))} "
                     "before the command.")  # fmt: skip
    lines.append("A worker creates its store when it starts; `burnwatch db migrate` creates an empty one.")
    return "\n".join(lines)


def _web_port_free(host: str, port: int) -> None:
    """Exit saying so when the worker's web port is taken (Faust would fail after the store was opened, with
    a traceback), before anything starts: another worker on this machine, or another program."""
    import errno
    import socket

    try:  # every address the server binds: 0.0.0.0 is IPv6's every interface too (bind_host)
        infos = socket.getaddrinfo(bind_host(host) or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return  # an address the web server will refuse in its own words
    for family, kind, proto, _, address in infos:
        try:
            probe = socket.socket(family, kind, proto)
        except OSError:
            continue  # an address family this host lacks (::1 without IPv6): the web server skips it
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no owner
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as asyncio binds it, beside IPv4's
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                    continue
                raise SystemExit(f"BURNWATCH_WEB_PORT {port}: cannot listen on {host}:{port} ({exc.strerror}); "
                                 "another worker on this machine? Give each its own BURNWATCH_WEB_PORT") from None  # fmt: skip


def cmd_worker(args: argparse.Namespace) -> int:
    settings = _settings(args)
    configure_logging(settings.log_format, settings.log_level)
    if not settings.kafka_bootstrap:
        raise SystemExit(
            "BURNWATCH_KAFKA_BOOTSTRAP is not set (host:port of a Kafka broker); `burnwatch demo` starts an embedded one"
        )
    _web_port_free(settings.web_host, settings.web_port)
    import structlog

    from detector.rules import RulesInvalid
    from detector.runtime import tune_gc
    from streams.app import run_worker

    cli_log = structlog.get_logger("burnwatch.cli")
    cli_log.info(
        "worker_starting", store=redact_dsn(settings.dsn), database=settings.clickhouse_database,
        kafka=settings.kafka_bootstrap, kafka_security=settings.kafka_security.describe(), rules=str(settings.rules_path),
    )  # fmt: skip
    if settings.kafka_security_protocol == "SASL_PLAINTEXT" and settings.kafka_sasl_mechanism == "PLAIN":
        cli_log.warning("kafka_password_in_clear", note="SASL PLAIN over SASL_PLAINTEXT sends the password unencrypted "
                        "at every connection: use SASL_SSL, or SCRAM, which never sends it")  # fmt: skip
    from streams.kafka import ensure_worker_topics

    _kafka(settings, lambda: ensure_worker_topics(settings))  # a broker not answering: exit 69; refusing: 1
    tune_gc()
    try:
        run_worker(settings)
    except RulesInvalid as exc:
        raise SystemExit(f"rules refused:\n{exc}") from None
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from detector.replay import write_replay
    from detector.rules import RulesInvalid, load_pricing
    from detector.simulate import SimConfig, simulate

    settings = _settings(args)
    cfg = SimConfig(
        hours=args.hours, training_hosts=args.hosts, notebooks=args.notebooks,
        inference_endpoints=args.inference, seed=args.seed, k8s_nodes=args.k8s_nodes, choices=args.choices,
        serving_endpoints=args.serving, training_jobs=args.training_jobs, cpu_notebooks=args.cpu_notebooks,
    )  # fmt: skip
    bootstrap = settings.kafka_bootstrap
    if args.publish and not bootstrap:
        raise SystemExit("--publish needs BURNWATCH_KAFKA_BOOTSTRAP")
    try:  # before any output file is opened: a refused price list leaves none truncated
        pricing = load_pricing(settings.rules_path / "pricing.yaml")
    except RulesInvalid as exc:
        raise SystemExit(f"pricing refused:\n{exc}{_rules_hint(settings.rules_path)}") from None
    named = {opt: Path(path).resolve() for opt, path in (("--out", args.out), ("--labels", args.labels),
                                                         ("--focus", args.focus)) if path and path != "-"}  # fmt: skip
    for opt, path in named.items():  # one file named twice kept the last written and lost the other, saying nothing
        if (twice := [o for o, p in named.items() if p == path and o != opt]):
            raise SystemExit(f"{opt} and {twice[0]} name the same file {str(path)!r}; name two files")
    # the files are opened before the fleet is simulated: a bad path fails at once
    labels_file = _open_for_writing(args.labels, "--labels") if args.labels else None
    if args.focus and not args.focus.lower().endswith((".parquet", ".csv", ".csv.gz")):
        raise SystemExit(f"--focus {args.focus}: the file name must end in .parquet, .csv or .csv.gz")
    if args.focus:
        _open_for_writing(args.focus, "--focus", binary=True).close()
    to_stdout = args.publish or not args.out or args.out == "-"
    out = sys.stdout.buffer if to_stdout else _open_for_writing(args.out, "--out", binary=True)
    records, labels = simulate(cfg, pricing)
    if labels_file is not None:
        with labels_file:
            labels_file.write("".join(json.dumps(label.to_json()) + "\n" for label in labels))
    if args.focus:
        from detector.simulate_focus import simulate_focus, write_focus

        bill = simulate_focus(cfg, pricing)
        write_focus(bill, args.focus)
        print(f"wrote the fleet's FOCUS 1.2 bill: {len(bill.rows)} rows to {args.focus}", file=sys.stderr)
    if args.publish:
        from streams.kafka import ensure_topics, publish_records

        encoded = ((topic, key, json.dumps(value).encode()) for _, topic, key, value in records)

        async def go() -> int:
            await ensure_topics(bootstrap, settings.partitions, replication_factor=settings.replication_factor,
                                security=settings.kafka_security)  # fmt: skip
            return await publish_records(bootstrap, encoded, speed=args.speed, security=settings.kafka_security)

        n = _kafka(settings, go)
        print(f"published {n} messages; {len(labels)} labelled waste episodes", file=sys.stderr)
        return 0
    try:
        n = write_replay(records, out)
    finally:
        if out is not sys.stdout.buffer:
            out.close()
    print(f"wrote {n} messages; {len(labels)} labelled waste episodes", file=sys.stderr)
    return 0


def _open_for_writing(path: str, option: str, binary: bool = False) -> Any:
    try:
        return open(path, "wb" if binary else "w")
    except OSError as exc:
        raise SystemExit(f"{option} {path}: {exc.strerror}") from None


def _kafka(settings: Settings, go: Any) -> Any:
    """Run the coroutine function ``go``; a broker that cannot be reached is a one-line error, and one that
    refuses burnwatch's TLS or SASL (or whose certificate is not trusted) says why (``KafkaRefused``)."""
    from aiokafka.errors import KafkaError

    from streams.kafka import KafkaRefused, accepts_connections, why_refused

    bootstrap = settings.kafka_bootstrap
    try:
        return asyncio.run(go())
    except KafkaError as exc:
        failure = str(exc)
    protocol = settings.kafka_security_protocol
    refused = None if protocol == "PLAINTEXT" else asyncio.run(why_refused(bootstrap, settings.kafka_security))
    if refused:
        raise KafkaRefused(f"Kafka at {bootstrap} refused the connection: {refused}")
    if asyncio.run(accepts_connections(bootstrap)):  # the port answers, Kafka as set does not: the usual first-day slip
        failure += (f"; the port accepts connections, but not as {protocol}: if Kafka is up, check "
                    "BURNWATCH_KAFKA_SECURITY_PROTOCOL and the port (a cluster listens for each protocol on its own: "
                    "Amazon MSK 9092 plaintext, 9094 TLS, 9096 SASL/SCRAM; Confluent Cloud SASL_SSL on 9092)")  # fmt: skip
    raise ConnectionError(f"cannot reach Kafka at {bootstrap}: {failure}")


def _check_replay(path: str) -> None:
    """Refuse a replay file before anything is published: unreadable, malformed, or with
    records on topics burnwatch does not read (which ``backtest`` refuses as well)."""
    from detector.events import TOPICS
    from detector.replay import ReplayError, read_replay

    stray: list[str] = []
    try:
        for line, record in read_replay(path):
            if record.topic not in TOPICS:
                stray.append(f"{path}:{line}: topic {record.topic!r}")
    except OSError as exc:
        raise SystemExit(f"{path}: {exc.strerror}") from None
    except ReplayError as exc:
        raise SystemExit(f"{exc}; nothing was published") from None
    if stray:
        more = f"\n... and {len(stray) - 20} more" if len(stray) > 20 else ""
        raise SystemExit(f"{len(stray)} record(s) on a topic burnwatch does not read (it reads {', '.join(TOPICS)}; "
                         "backtest refuses them too); nothing was published:\n" + "\n".join(stray[:20]) + more)  # fmt: skip


def cmd_replay(args: argparse.Namespace) -> int:
    from streams.kafka import publish_file

    settings = _settings(args)
    if not settings.kafka_bootstrap:
        raise SystemExit("BURNWATCH_KAFKA_BOOTSTRAP is not set")
    _check_replay(args.file)
    bootstrap = settings.kafka_bootstrap
    n = _kafka(settings, lambda: publish_file(bootstrap, args.file, settings.partitions, speed=args.speed,
                                              replication_factor=settings.replication_factor,
                                              security=settings.kafka_security))  # fmt: skip
    print(f"published {n} messages from {args.file}", file=sys.stderr)
    return 0


def cmd_bridge(args: argparse.Namespace) -> int:
    from detector.ingest.config import ConfigInvalid, load_bridge_config
    from streams.bridge import run_bridge

    settings = _settings(args)
    try:
        config = load_bridge_config(args.bridge_config)
    except ConfigInvalid as exc:
        raise SystemExit(f"bridge config refused:\n{exc}") from None
    bootstrap = settings.kafka_bootstrap
    if not bootstrap:
        raise SystemExit("BURNWATCH_KAFKA_BOOTSTRAP is not set (host:port of the Kafka broker the worker reads)")
    base = Path(args.bridge_config).resolve().parent  # file_sd paths are relative to the config file
    if args.once:
        results = _kafka(settings, lambda: run_bridge(config, bootstrap, once=True, base=base, partitions=settings.partitions,
                                                        replication_factor=settings.replication_factor,
                                                        security=settings.kafka_security))  # fmt: skip
        for r in results:
            sent = ", ".join(f"{n} to {topic}" for topic, n in sorted(r.messages.items())) or "nothing published"
            line = f"ok     {r.job:<18} {r.target}: {r.hosts} hosts, {r.gpus} GPUs; {sent}" if r.ok else \
                f"FAILED {r.job:<18} {r.error}"  # fmt: skip
            print(line)
            for reason, n in sorted(r.skipped.items()):
                print(f"       skipped {n}: {reason}")
        if not results:
            _note("nothing scraped: no targets (the file_sd files list none)")
            return EXIT_FAILED
        failed = sum(not r.ok for r in results)
        if failed:
            _note(f"{failed} of {len(results)} targets failed")
        return EXIT_FAILED if failed else 0
    configure_logging(settings.log_format, settings.log_level)

    async def go() -> None:
        import signal

        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await run_bridge(config, bootstrap, base=base, stop=stop, partitions=settings.partitions,
                         replication_factor=settings.replication_factor, security=settings.kafka_security)  # fmt: skip

    _kafka(settings, go)
    return 0


def _load_rules_or_exit(path: str | Path, option: str = "--rules") -> RuleSet:
    """The rules at ``path``, or the command ends with every error (``option``: the command's option naming
    them, if it has one)."""
    from detector.rules import RulesInvalid, load_rules

    try:
        return load_rules(path)
    except RulesInvalid as exc:
        print(f"{exc}{_rules_hint(path, option)}", file=sys.stderr)
        raise SystemExit(1) from None


def _rules_hint(path: str | Path, option: str = "") -> str:
    """Where the rules are looked for, when they are not there (a command run outside the checkout);
    ``option``: the command's own option naming them ('' where it has none, as ``simulate``)."""
    if Path(path).exists():
        return ""
    if option == "--compare":
        return f"\n(the rules to compare with are read from {str(path)!r}, as --compare names them)"
    named = f"{option} or BURNWATCH_RULES names them" if option else "BURNWATCH_RULES names them"
    return (f"\n(the rules are read from {str(path)!r}: {named}, and the default "
            "'rules' is relative to the directory the command runs in)")  # fmt: skip


def _billed(args: argparse.Namespace, limits: Any) -> Any:
    """``--bill PATH``: rates and tags from a FOCUS bill read from files, or None."""
    if not getattr(args, "bill", None):
        return None
    from detector.billing.focus import FocusError
    from detector.billing.ingest import read_bill
    from detector.billing.rates import PRICED_IN, BilledRates

    if args.currency != PRICED_IN:
        raise SystemExit(f"--bill: burnwatch prices in {PRICED_IN}, and a bill in {args.currency!r} would put its "
                         f"numbers on alerts as dollars; convert it to {PRICED_IN}, or leave --bill out")  # fmt: skip
    try:
        return BilledRates.from_table(read_bill(args.bill, currency=args.currency,
                                                max_usd_per_hour=limits.max_usd_per_hour).table)  # fmt: skip
    except FocusError as exc:
        raise SystemExit(f"--bill: {exc}") from None


def _whole(text: str, what: str = "", most: int | None = None, zero: str = "") -> int:
    """A whole number (of ``what``) from 0 (``zero``: what 0 means) to ``most``, for argparse."""
    try:
        value = int(text)
    except ValueError:
        said = f"{text!r} is not a whole number" + (f" of {what}" if what else "") + (f" (0: {zero})" if zero else "")
        raise argparse.ArgumentTypeError(said) from None
    if value < 0 or (most is not None and value > most):
        low = f"0 ({zero})" if zero else "0"
        raise argparse.ArgumentTypeError(f"takes {low} to {most}, not {value}" if most is not None
                                         else f"takes {low} or more, not {value}")  # fmt: skip
    return value


def _jobs(text: str) -> int:
    """``--jobs``: a whole number of processes, 0 for one per usable CPU."""
    return _whole(text, "processes", 1024, "one per usable CPU")


def _count(text: str) -> int:
    """How many of a simulated kind: a whole number, 0 or more."""
    return _whole(text)


def _positive(text: str) -> float:
    """A number of hours, an acceleration: finite and more than 0 (argparse's float takes nan, inf and -5)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"takes a number more than 0, not {text!r}")
    return value


def cmd_backtest(args: argparse.Namespace) -> int:
    import time

    from detector.backtest import ShardFailed, backtest, backtest_store, compare
    from detector.replay import ReplayError
    from detector.runtime import tune_gc
    from detector.suppression import describe_holds
    from detector.units import format_duration, parse_duration, rfc3339

    tune_gc()
    settings = _settings(args)
    if bool(args.file) == bool(args.since):
        raise SystemExit("backtest needs a replay file or --since DURATION (events stored in ClickHouse), not both")
    scored = args.scores or args.model_dir or args.metrics
    if scored and args.since:
        raise SystemExit("--scores, --model-dir and --metrics work with a replay file, not --since")
    if args.jobs == 0:
        from streams.event_writer import usable_cpus

        args.jobs = max(1, int(usable_cpus()))
    if args.jobs > 1 and args.since:
        raise SystemExit("--jobs works with a replay file, not --since")
    if args.jobs > 1 and args.scores:
        raise SystemExit("--jobs cannot write --scores: the scores file lists every window in the file's order; "
                         "leave --jobs out")  # fmt: skip
    metrics = _metrics(args.metrics)
    ruleset = _load_rules_or_exit(args.rules or settings.rules_path)
    other = _load_rules_or_exit(args.compare, "--compare") if args.compare else None
    models, scores = None, None
    if scored:  # the anomaly model scores the file's windows too
        from detector.model.forest import SUFFIX
        from detector.model.train import anomaly_ruleset

        ruleset = _with_metrics(anomaly_ruleset, ruleset, metrics)
        model_dir = Path(args.model_dir) if args.model_dir else settings.model_path
        models = _load_models_or_exit(model_dir)
        if not models:
            raise SystemExit(f"no model in {model_dir}: nothing to score (train one with `burnwatch model train "
                             "--from FILE`, or point --model-dir at a model directory)")  # fmt: skip
        if args.scores:
            target = Path(args.scores).resolve()
            if target == Path(args.file).resolve():
                raise SystemExit(f"--scores {args.scores}: that is the replay file being read; name another file")
            if target.suffix in (SUFFIX, ".pkl") or (target.parent == model_dir.resolve() and target.exists()):
                raise SystemExit(f"--scores {args.scores}: that is a model's file, which the CSV would replace; "
                                 "name another file")  # fmt: skip
            scores = _ScoresFile(_open_for_writing(args.scores, "--scores"))
    started = time.perf_counter()
    judged = [0]  # with a model and one process: how many windows it judged, to say why if none
    if args.since:
        try:
            since = parse_duration(args.since)
        except ValueError as exc:
            raise SystemExit(f"--since: {exc}") from None
        store = _open_store(settings)
        try:
            result = backtest_store(store.history, since, ruleset, other)
        finally:
            store.close()
        source = (f"{redact_dsn(settings.dsn)} from {rfc3339(result.span[0])} to {rfc3339(result.span[1])} "
                  f"({format_duration(result.span[1] - result.span[0])})") if result.span else "an empty store"  # fmt: skip
    else:
        completed = False

        def counted(windows: list[Any]) -> None:
            judged[0] += len(windows)
            if scores is not None:
                scores.write(windows)

        record = counted if models is not None and args.jobs <= 1 else None
        try:
            result = backtest(args.file, ruleset, other=other, models=models, record=record,
                              billed=_billed(args, ruleset.limits), jobs=args.jobs)  # fmt: skip
            completed = True
        except (ReplayError, ShardFailed) as exc:
            raise SystemExit(str(exc)) from None
        except OSError as exc:
            raise SystemExit(f"{exc.filename or args.file}: {exc.strerror}") from None
        finally:
            if scores is not None:
                scores.close()
                if not completed:  # a failed or interrupted run leaves no half-written scores behind
                    Path(args.scores).unlink(missing_ok=True)
        source = args.file
        stray = [(line, reason) for line, reason in result.invalid if reason.startswith("unknown topic")]
        if stray:  # as replay refuses them: the detection would miss those events, and say nothing
            if scores is not None:
                Path(args.scores).unlink(missing_ok=True)  # no scores of a run refused
            shown = "\n".join(f"{args.file}:{line}: {printable(reason)}" for line, reason in stray[:20])
            more = f"\n... and {len(stray) - 20} more" if len(stray) > 20 else ""
            raise SystemExit(f"{len(stray)} record(s) on a topic burnwatch does not read (a typo of a topic's name?); "
                             f"no alerts are shown, as they would miss those events:\n{shown}{more}")  # fmt: skip
    elapsed = time.perf_counter() - started
    if other is not None and result.other is not None:
        _print_comparison(compare(result.alerts, result.other), args.json)
    elif args.json:
        for alert in result.alerts:
            print(json.dumps(alert.to_json()))
    else:
        for alert in result.alerts:
            print(printable(alert.summary()) + (f"  (held back, {alert.held.kind}: {alert.held.reason})" if alert.held else ""))
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
    if scores is not None:
        if not scores.rows:
            _note(f"--scores: no window was judged, {args.scores} holds the header only: {_why_unjudged(models, ruleset)}")
            return EXIT_FAILED
        _note(f"{scores.rows} judged windows written to {args.scores}")
    elif models is not None and args.file and args.jobs <= 1 and not judged[0]:  # the model did nothing: say why
        _note(f"--model-dir: the model judged no window, so no alert of it could be here: {_why_unjudged(models, ruleset)}")
    return 0


SCORE_COLUMNS = ("resource_id", "group", "window_start", "window_end", "score", "threshold", "evidence", "run", "budget",
                 "decision", "rule_tracking")  # fmt: skip
"""``backtest --scores``: one row per judged window (:class:`detector.detectors.anomaly.ScoredWindow`)."""


class _ScoresFile:
    """The ``--scores`` CSV, written batch by batch as the backtest judges windows (memory stays
    flat over a long file); the csv module quotes commas, quotes and line breaks in ids."""

    def __init__(self, handle: Any) -> None:
        import csv

        from detector.units import rfc3339

        self.handle, self.rows, self._rfc3339 = handle, 0, rfc3339
        self._writer = csv.writer(handle, lineterminator="\n")
        self._writer.writerow(SCORE_COLUMNS)

    def write(self, windows: list[Any]) -> None:
        """``+ 0.0``: evidence of a window as common as any is ``-log10(1)``, which floats write ``-0.0``."""
        t = self._rfc3339
        self._writer.writerows(
            (csv_cell(w.resource_id), csv_cell(w.group), t(w.start), t(w.end), str(float(w.score)), str(float(w.threshold)),
             str(float(w.evidence) + 0.0), str(float(w.run) + 0.0), str(float(w.budget)), csv_cell(w.decision),
             "true" if w.rule_tracking else "false")
            for w in windows
        )  # fmt: skip
        self.rows += len(windows)

    def close(self) -> None:
        self.handle.close()


def _why_unjudged(models: Any, ruleset: RuleSet) -> str:
    """Why a backtest with models judged nothing: the usual causes, with what to change."""
    from detector.model.features import metrics_of

    trained = {group: metrics_of(a.features) for group, a in models.artifacts.items()}
    reading = sorted({m for r in ruleset.rules if r.detector.type == "anomaly" for m in r.detector.params.metrics})
    said = "; ".join(f"{group} on metrics [{', '.join(m)}]" for group, m in sorted(trained.items()))
    return (f"the models were trained for {said} and the anomaly rule reads [{', '.join(reading)}] (--metrics must "
            "name what training read), or no resource of the file is in a trained group, or none had the rule's "
            "min_history of events")  # fmt: skip


def _print_comparison(diff: RuleDiff, as_json: bool) -> None:
    if as_json:
        for change, alerts in (("added", diff.added), ("removed", diff.removed)):
            for alert in alerts:
                print(json.dumps({"change": change, **alert.to_json()}))
        return
    print(f"The change would add {len(diff.added)} alerts ({money(diff.added_usd, exact=True)}) and remove "
          f"{len(diff.removed)} ({money(diff.removed_usd, exact=True)}); {len(diff.kept)} stay "
          f"(their dollars change by {'+' if diff.kept_usd_change >= 0.005 else ''}"
          f"{money(diff.kept_usd_change, exact=True)}).")  # fmt: skip
    by_type: dict[str, list[int]] = {}
    for column, alerts in ((0, diff.added), (1, diff.removed)):
        for alert in alerts:
            by_type.setdefault(alert.type, [0, 0])[column] += 1
    for rule_type, (added, removed) in sorted(by_type.items()):
        print(f"  {rule_type}: +{added} -{removed}")
    for sign, alerts in (("+", diff.added), ("-", diff.removed)):
        for alert in alerts:
            print(f"{sign} {printable(alert.summary())}")


def cmd_eval(args: argparse.Namespace) -> int:
    import time

    from detector.evaluate import evaluate
    from detector.runtime import tune_gc

    if args.series:
        return _eval_series(args)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise SystemExit(f"--seeds {args.seeds!r}: expected simulator seeds as integers with commas, e.g. 1,2,3") from None
    tune_gc()
    ruleset = _load_rules_or_exit(args.rules or _settings(args).rules_path)
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
    totals, runs = evaluate(ruleset, seeds, hours=args.hours, messy=args.messy, bill=args.bill)
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
    if args.bill:
        checked = sum(run["bill"]["checked"] for run in runs)
        agree = sum(run["bill"]["agree"] for run in runs)
        before = sum(run["bill"]["agree_without_bill"] for run in runs)
        print(f"against each fleet's FOCUS bill: {agree} of {checked} idle-GPU and untagged alerts priced within 1 % "
              f"of the billed rate (without the bill: {before})")  # fmt: skip
    return 0


def _eval_series(args: argparse.Namespace) -> int:
    """``eval --series DIR``: the shipped rules and a naive IsolationForest on labelled real series."""
    from detector.series import SeriesError, read_series_dir
    from detector.series_eval import Score, burnwatch_detector, evaluate_series, naive_forest

    if not 0 < args.train_fraction < 1:
        raise SystemExit(f"--train-fraction {args.train_fraction}: expected a fraction between 0 and 1")
    if args.tolerance < 0:
        raise SystemExit(f"--tolerance {args.tolerance}: expected a number of steps, 0 or more")
    try:
        series = read_series_dir(args.series)
    except SeriesError as exc:
        raise SystemExit(str(exc)) from None
    ruleset = _load_rules_or_exit(args.rules or _settings(args).rules_path)
    detectors = {"burnwatch": burnwatch_detector(ruleset), "naive_iforest": naive_forest}
    rows = []
    for s in series:
        try:
            scores = {name: evaluate_series(s, d, args.train_fraction, args.tolerance) for name, d in detectors.items()}
        except SeriesError as exc:
            raise SystemExit(str(exc)) from None
        rows.append((s, scores))
    labelled = {name: sum((sc[name] for s, sc in rows if s.windows), Score()) for name in detectors}
    unlabelled = {name: sum(sc[name].false_alerts for s, sc in rows if not s.windows) for name in detectors}
    n_unlabelled = sum(1 for s, _ in rows if not s.windows)
    if args.json:
        print(json.dumps({"series": [{"name": s.name, **{n: sc[n].to_json() for n in detectors}} for s, sc in rows],
                          "overall": {n: labelled[n].to_json() for n in detectors},
                          "false_alerts_unlabelled": unlabelled, "unlabelled_series": n_unlabelled,
                          "train_fraction": args.train_fraction, "tolerance_steps": args.tolerance}))  # fmt: skip
        return 0

    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    print(f"{len(series)} series from {args.series}: trained on the first {args.train_fraction:.0%} of each, "
          f"scored on the rest; a window is found by an alert inside it or up to {args.tolerance} steps after")  # fmt: skip
    print(f"{'series':<48}{'windows':>8}  " + "  ".join(f"{n + ' found/false':>26}{'F1':>7}" for n in detectors))
    for s, sc in rows:
        cells = "  ".join(f"{f'{sc[n].found}/{sc[n].false_alerts}':>26}{f(sc[n].f1):>7}" for n in detectors)
        print(f"{s.name:<48}{sc['burnwatch'].windows:>8}  {cells}")
    for name in detectors:
        t = labelled[name]
        print(f"{name}: overall on the labelled series: {t.found}/{t.windows} windows found, {t.false_alerts} false "
              f"alerts; precision {f(t.precision)}, recall {f(t.recall)}, F1 {f(t.f1)}; "
              f"{unlabelled[name]} false alerts on the {n_unlabelled} series without labels")  # fmt: skip
    return 0


def cmd_silence(args: argparse.Namespace) -> int:
    import getpass

    from detector.events import TS_MAX
    from detector.rules import RulesInvalid
    from detector.silencing import add_silence, expire_silence, list_silences, now_utc, parse_match, parse_time, tag_warnings
    from detector.units import parse_duration

    rules_dir = Path(args.rules or _settings(args).rules_path)
    now = now_utc()
    try:
        if args.silence_command == "add":
            starts = parse_time(args.start) if args.start else now
            until = starts + parse_duration(args.duration)
            if until >= TS_MAX.timestamp():
                raise ValueError(f"--for {args.duration}: the silence would end after {TS_MAX:%Y}; give it an end that "
                                 "comes (a silence for good is a rule's match, or the rule disabled)")  # fmt: skip
            match = parse_match(args.match or [])
            silence = add_silence(
                rules_dir, match, types=args.type or [], rules=args.rule or [], starts=starts,
                until=until, reason=args.reason, created_by=args.by or getpass.getuser(),
            )  # fmt: skip
            print(f"silence {silence.id} from {silence.starts.isoformat()} until {silence.until.isoformat()} added to "
                  f"{rules_dir}/silences.yaml; a running worker takes it up within seconds")  # fmt: skip
            for warning in tag_warnings(match, rules_dir):
                print(f"warning: {warning}", file=sys.stderr)
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


def _offender(o: dict[str, Any]) -> str:
    """A digest line's resource, type and team, as a terminal shows them (the resource's text is an event's)."""
    return f"{printable(o['resource_id'])} ({o['type']}, {printable(o['team'])})"


def cmd_digest(args: argparse.Namespace) -> int:
    from datetime import datetime, timezone

    from detector.charts.digest import digest_chart
    from detector.digest import TREND_DAYS, build_digests, offender_dollars, render_digest
    from detector.units import money, rfc3339

    settings = _settings(args)
    try:
        day = datetime.strptime(args.day, "%Y-%m-%d").replace(tzinfo=timezone.utc).timestamp()
    except ValueError as exc:  # strptime says which: a shape unlike the format, or a day the month lacks
        said = f"no such day ({exc})" if "out of range" in str(exc) else "expected YYYY-MM-DD"
        raise SystemExit(f"--day {args.day!r}: {said}") from None
    store = _open_store(settings)
    try:
        digests = build_digests(store.digests, day)
        span = None if digests else store.alerts.span()
    finally:
        store.close()
    if not digests:  # (a day outside the store's alerts says so: a typo of the year reads otherwise as a quiet day)
        held = (f"the store's alerts run from {rfc3339(span[0])[:10]} to {rfc3339(span[1])[:10]}" if span is not None
                else "the store holds no alert yet")  # fmt: skip
        print(f"nothing burned on {args.day} ({held})")
        return 0
    notifier = None
    if args.post:
        from streams.app import _notifier

        notifier = _notifier(settings) or sys.exit("--post needs SLACK_BOT_TOKEN and SLACK_CHANNEL, or SLACK_WEBHOOK_URL")
    for d in digests:
        channel = printable(d.channel or "(default channel)")
        print(f"{channel}: {money(d.total, exact=True)} on {d.date}; {d.incidents} incidents, "
              f"{d.open_incidents} open at the end ({money(d.open_usd_per_hour, exact=True)}/h)")  # fmt: skip
        for rule_type, usd in sorted(d.by_type.items(), key=lambda kv: -kv[1]):
            print(f"  {rule_type:<28}{money(usd, exact=True):>13}")
        for team, usd in sorted(d.by_team.items(), key=lambda kv: -kv[1]):
            print(f"  team {printable(team):<23}{money(usd, exact=True):>13}")
        for o in d.top:
            print(f"  top: {_offender(o)} {offender_dollars(o)}")
        for o in d.fixed:
            how = f", {o['how']}" if o["how"] else ""
            at = datetime.fromtimestamp(o["resolved_at"], tz=timezone.utc)
            print(f"  fixed: {_offender(o)} resolved {at:%H:%M} UTC{how}; "
                  f"{money(o['usd'], exact=True)} that day")  # fmt: skip
        for o in d.still_open:
            rate = f"{money(o['usd_per_hour'], exact=True)}/h" if o["usd_per_hour"] else "spent, not burning"
            print(f"  open: {_offender(o)} {rate}; {money(o['usd'], exact=True)} that day")
        if d.could_save:  # kept apart from the waste above, as in the Slack digest
            print(f"  could be saved (not waste, not in the total): {money(sum(d.could_save.values()), exact=True)}")
            for rule_type, usd in sorted(d.could_save.items(), key=lambda kv: -kv[1]):
                print(f"    {rule_type:<26}{money(usd, exact=True):>13}")
        if d.repriced:
            print(f"  {d.repriced} of {d.incidents} incidents re-priced from the bill (top offenders show what it "
                  "charged; the totals stay the events' dollars)")  # fmt: skip
        trend = " ".join(f"{datetime.fromtimestamp(t, tz=timezone.utc):%m-%d} {money(sum(v.values()))}"
                         for t, v in sorted(d.trend.items()))  # fmt: skip
        print(f"  last {TREND_DAYS} days: {trend or '(none)'}")
        png = digest_chart(d) if args.chart or notifier is not None else None
        if args.chart and png is not None:
            path = Path(args.chart if len(digests) == 1 else f"{Path(args.chart).with_suffix('')}-"
                        f"{(d.channel or 'default').strip('#') or 'default'}.png")  # fmt: skip
            path.write_bytes(png)
            print(f"  chart: {path}")
        if notifier is not None:
            notifier.post_digest(d, render_digest(d), png)
    return 0


def _load_models_or_exit(directory: Path) -> Any:
    """The models in ``directory``; a refused file (an old pickle, a foreign or damaged file) is
    a one-line error naming it, not a traceback."""
    from detector.model.forest import ModelRefused, ModelSet

    try:
        return ModelSet.load(directory)
    except ModelRefused as exc:
        raise SystemExit(str(exc)) from None


def _metrics(text: str | None) -> list[str]:
    """``--metrics a,b``: generic metric names (keys of a usage event's ``metrics``), each checked
    as the anomaly rule's ``params.metrics`` checks it."""
    if not text:
        return []
    from pydantic import TypeAdapter, ValidationError

    from detector.detectors.anomaly import MetricName

    names = [name.strip() for name in text.split(",")]
    check = TypeAdapter(MetricName)
    for name in names:
        try:
            check.validate_python(name)
        except ValidationError:
            raise SystemExit(f"--metrics {text!r}: {name!r} is not a metric name (1 to 128 letters, digits or "
                             "_ . : / -, as a key of a usage event's metrics; names separated by commas)") from None  # fmt: skip
    return names


def _with_metrics(anomaly_ruleset: Any, ruleset: RuleSet, metrics: list[str]) -> RuleSet:
    """The rule set with an anomaly rule reading ``metrics`` (``anomaly_ruleset``); one it refuses
    (too many metrics) is a one-line error."""
    from pydantic import ValidationError

    try:
        return anomaly_ruleset(ruleset, metrics)
    except ValidationError as exc:
        errors = "; ".join(f"{'.'.join(str(x) for x in e['loc'][-2:])}: {e['msg']}" for e in exc.errors()[:3])
        raise SystemExit(f"--metrics: the anomaly rule refuses them ({errors})") from None


def _until(text: str) -> float:
    """``--until``: an RFC 3339 time with its zone, or epoch seconds."""
    import math

    from detector.units import parse_rfc3339

    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value) or value < 0:
            raise SystemExit(f"--until {text!r}: expected epoch seconds (0 or more) or an RFC 3339 time")
        return value
    try:
        return parse_rfc3339(text.strip(), "--until", ", or epoch seconds")
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def _alert_rate(value: float | None) -> float:
    """``--alerts-per-1000h``: the rate the thresholds are calibrated to (the model's default if not given)."""
    import math

    from detector.model.forest import ALERTS_PER_1000H, RATE_BOUNDS

    if value is None:
        return ALERTS_PER_1000H
    low, high = RATE_BOUNDS
    if not math.isfinite(value) or not low <= value <= high:
        raise SystemExit(f"--alerts-per-1000h {value}: expected a number of alerts per 1,000 resource-hours from "
                         f"{low:g} to {high:g}")  # fmt: skip
    return value


def cmd_model(args: argparse.Namespace) -> int:
    settings = _settings(args)
    out = Path(args.dir) if args.dir else settings.model_path
    if args.model_command == "show":
        if out.exists() and not out.is_dir():
            raise SystemExit(f"{out}: not a directory (a model directory holds <group>.skops files)")
        models = _load_models_or_exit(out)
        if not models:
            there = "" if out.is_dir() else " (no such directory)"
            print(f"no model in {out}{there}: the worker runs rules only")
            return 0
        for artifact in models.artifacts.values():
            print(json.dumps(artifact.meta(), indent=2))
            print(f"{artifact.group}: {artifact.explain()}")
        return 0
    from detector.model.train import MIN_SAMPLES, ModelsPartlyWritten, anomaly_ruleset, train_from_file, train_from_store
    from detector.replay import ReplayError
    from detector.units import format_duration, parse_duration, rfc3339

    if args.from_file and args.since:
        raise SystemExit("model train reads a replay file (--from) or the events stored in ClickHouse (--since), "
                         "not both")  # fmt: skip
    if args.until and not args.from_file:
        raise SystemExit("--until works with --from FILE (a replay file); the store's training period is --since")
    until = _until(args.until) if args.until else None
    since_text = args.since or "14d"
    try:
        since = parse_duration(since_text)
    except ValueError as exc:
        raise SystemExit(f"--since: {exc}") from None
    rate = _alert_rate(args.alerts_per_1000h)
    metrics = _metrics(args.metrics)
    ruleset = _with_metrics(anomaly_ruleset, _load_rules_or_exit(args.rules or settings.rules_path), metrics)
    before = _load_models_or_exit(out)
    try:
        if args.from_file:
            try:
                artifacts, ts = train_from_file(args.from_file, ruleset, out, until=until, alerts_per_1000h=rate)
            except ReplayError as exc:
                raise SystemExit(f"{exc}; nothing was trained") from None
        else:
            store = _open_store(settings)
            try:
                artifacts, ts = train_from_store(store, since, ruleset, out, alerts_per_1000h=rate)
            finally:
                store.close()
    except ModelsPartlyWritten as exc:
        replaced = (f"the models of {', '.join(exc.written)} were replaced before it; the others stay as they were"
                    if exc.written else "no model was replaced")  # fmt: skip
        raise SystemExit(f"{exc.filename}: {exc.strerror}: {replaced}") from None
    except OSError as exc:
        raise SystemExit(f"{exc.filename or args.from_file}: {exc.strerror}; nothing was trained") from None
    trained = {a.group: a for a in artifacts}

    def kept(group: str) -> str:
        old = before.get(group)
        if old is None:
            return "no model: the worker runs rules only for it"
        return f"the model trained on {rfc3339(old.trained_from)} to {rfc3339(old.trained_to)} stays in use"

    for group in sorted(set(ts.windows) | set(before.artifacts)):
        windows = ts.windows.get(group, [])
        a = trained.get(group)
        if a is not None:
            what = f"trained on {a.samples}, threshold {a.threshold:.4f}"
        else:
            what = f"too few windows to train (it takes {MIN_SAMPLES}): {kept(group)}"
        print(f"{group}: {len(windows)} windows, {ts.excluded.get(group, 0)} left out (behaviour incidents); {what}")
        if a is not None:
            print(f"  {a.explain()}")
    if not artifacts:
        total = sum(len(w) for w in ts.windows.values())
        span = f" ({format_duration(ts.span[1] - ts.span[0])} of event time)" if total else ""
        old = (f"the models already in {out} stay in use ({', '.join(sorted(before.artifacts))})" if before
               else f"{out} holds no model: the worker runs rules only")  # fmt: skip
        if args.from_file and until is not None and not total:
            why = (f"no window of {args.from_file} ends by --until {rfc3339(until)}: nothing to learn from (windows "
                   "are learnt once a resource's events cover the anomaly rule's min_history; a later --until "
                   "learns from more)")  # fmt: skip
        elif args.from_file:
            upto = f" up to --until {rfc3339(until)}" if until is not None else ""
            why = (f"{total} windows in {args.from_file}{upto}{span}, and no group has {MIN_SAMPLES} to learn from "
                   "(more history gives more)")  # fmt: skip
        else:
            why = (f"{total} windows in the {since_text} before the newest stored event{span}, and no group has "
                   f"{MIN_SAMPLES} to learn from (a longer --since, or more history, gives more)")  # fmt: skip
        _note(f"trained nothing: {why}; {old}")
        return EXIT_FAILED
    print(f"trained {len(artifacts)} of {len(set(ts.windows) | set(before.artifacts))} groups; artifacts in {out}; "
          "a running worker loads them within 30 s")  # fmt: skip
    return 0


def cmd_rules_check(args: argparse.Namespace) -> int:
    from detector.rules import RulesInvalid, consistency_warnings, load_rules, unit_warnings

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
    for warning in [*unit_warnings(path), *consistency_warnings(ruleset)]:
        print(f"warning: {warning}")
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


def cmd_ingest_focus(args: argparse.Namespace) -> int:
    from detector.billing.focus import FocusError
    from detector.billing.ingest import read_bill, store_bill
    from detector.billing.rates import PRICED_IN
    from detector.billing.reprice import reprice
    from detector.billing.usage import over_no_time, telemetry_sql, usage_records
    from detector.events import TOPIC_RESOURCE_USAGE
    from detector.rules import RulesInvalid, load_limits
    from detector.store import Store, StoreBusy

    settings = _settings(args)
    bootstrap = settings.kafka_bootstrap
    if args.publish_usage and not bootstrap:
        raise SystemExit("--publish-usage: BURNWATCH_KAFKA_BOOTSTRAP is not set; nothing was stored")
    if args.publish_usage and args.currency != PRICED_IN:
        raise SystemExit(f"--publish-usage: usage events carry US dollars (cost_usd), and this bill is in "
                         f"{args.currency!r}; nothing was stored")  # fmt: skip
    try:
        limits = load_limits(settings.rules_path)
    except RulesInvalid as exc:
        raise SystemExit(f"{exc}; nothing was stored") from None
    try:  # every file checked before the store is touched
        bill = read_bill(args.path, currency=args.currency, max_usd_per_hour=limits.max_usd_per_hour)
    except FocusError as exc:
        raise SystemExit(f"{exc}; nothing was stored") from None
    _say_store(settings)
    try:
        store, days = Store.open_expiring(settings.dsn, settings.clickhouse_database, settings.event_ttl_days,
                                          settings.event_ttl_set)  # fmt: skip
    except StoreBusy as exc:
        raise SystemExit(f"{exc}; nothing was stored") from None
    if store.schema.created:
        _note(f"created the store; raw events kept {f'{days} days of event time' if days else 'forever'} "
              "(BURNWATCH_EVENT_TTL_DAYS sets it)")  # fmt: skip
    try:
        result = store_bill(store, bill)
        repriced = reprice(store, result.ingest_id, limits)
        with_telemetry = {r["resource_id"] for r in store.query(telemetry_sql(store.db))} if args.publish_usage else set()
    finally:
        store.close()
    print(f"ingest {result.ingest_id}: {result.rows:,} charges from {len(result.files)} file(s), "
          f"billed {result.billed_cost:,.2f} {args.currency}, effective {result.effective_cost:,.2f} {args.currency}")
    if result.overlapping:
        _note(f"{result.overlapping:,} usage charge(s) of this bill cover time another usage charge of the same resource "
              "and SKU covers over a period of another length (the same usage exported hourly and daily?), which the "
              f"billing table counts twice: on {', '.join(map(printable, result.overlapping_resources))}. Keep one "
              "granularity per resource (docs/billing.md)")  # fmt: skip
    if args.currency != PRICED_IN:
        print(f"a bill in {args.currency} is stored for queries; it prices no event and re-prices no incident "
              f"(burnwatch counts {PRICED_IN})")  # fmt: skip
    else:
        print(f"re-priced {repriced.repriced} incident(s) from the bill (episodes it covers end to end)")
        if repriced.beyond_limits:
            _note(f"{repriced.beyond_limits} incident(s) not re-priced by this bill: it charges their resource more "
                  f"over the episode than limits.yaml lets its events claim (max_usd_per_hour ${limits.max_usd_per_hour:,.2f}; "
                  f"for egress, max_egress_gbit_per_s), on resources {', '.join(map(printable, repriced.some_beyond))}; "
                  "a corrupt charge? They keep the figures they had")  # fmt: skip
        if repriced.overlapping:
            where = ", ".join(map(printable, repriced.some_overlapping))
            _note(f"{repriced.overlapping} incident(s) not re-priced: their resource's charges overlap one another over "
                  f"the episode (two granularities of the same hours?), on {where}; they keep the figures they had")  # fmt: skip
    if args.publish_usage:
        from streams.kafka import publish_records

        records = list(usage_records(bill.table, with_telemetry))
        n = _kafka(settings, lambda: publish_records(bootstrap, records, security=settings.kafka_security))
        _note(f"published {n} usage events of billed resources without telemetry and of commitments to "
              f"{TOPIC_RESOURCE_USAGE}")
        if instant := over_no_time(bill.table):
            _note(f"{instant} usage charge(s) over no time (ChargePeriodEnd equals ChargePeriodStart) were not "
                  "published: dollars over no time are no rate; the stored bill keeps them")  # fmt: skip
    return 0


def cmd_db_migrate(args: argparse.Namespace) -> int:
    from detector.store import RAW_TABLES, Store, connect

    settings = _settings(args)
    explicit_ttl = settings.event_ttl_set
    _say_store(settings)
    store = Store(connect(settings.dsn), settings.clickhouse_database)
    try:
        applied = store.migrate()
        restored = store.schema.restore_missing()
        missing = store.schema.missing_tables()
        days = store.schema.set_event_ttl(settings.event_ttl_days, explicit=explicit_ttl)
        expiring = 0
        if explicit_ttl and days > 0:
            expiring = sum(store.query(f"SELECT count() AS n FROM {store.db}.{table} "
                                       f"WHERE ts < now() - toIntervalDay({days})")[0]["n"] for table in RAW_TABLES)  # fmt: skip
        history = store.schema.applied()
    finally:
        store.close()
    done = (["created the store"] if store.schema.created else []) + (["applied " + ", ".join(applied)] if applied else [])
    done += [f"made again the missing {', '.join(restored)}"] if restored else []
    print(f"{redact_dsn(settings.dsn)} database {settings.clickhouse_database}: {'; '.join(done) or 'up to date'}")
    for m in history:
        print(f"  {m['version']:04d}_{m['name']}  {m['checksum']}  applied {m['applied_at']:%Y-%m-%d %H:%M:%S}")
    if explicit_ttl:
        why = "(BURNWATCH_EVENT_TTL_DAYS)"
    elif store.schema.created:
        why = "(the default for a new store; BURNWATCH_EVENT_TTL_DAYS sets it)"
    else:
        why = "(the store's own: BURNWATCH_EVENT_TTL_DAYS changes it, a default never does)"
    print(f"raw events kept {f'{days} days of event time' if days else 'forever'} {why}; rollups kept forever")
    if expiring:
        print(f"{expiring:,} raw events are older than {days} days of event time: ClickHouse deletes them as it "
              "merges (their hourly rollups stay)")  # fmt: skip
    if missing:
        raise SystemExit(f"still missing after migrating: {', '.join(missing)}")
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from detector.reports import REPORTS, format_rows, known_teams, newest_event_time, period, run_report
    from detector.units import parse_duration

    if args.report not in REPORTS:
        reports = "\n".join(f"  {name:<12} {r.title}" for name, r in REPORTS.items())
        raise SystemExit(f"unknown report {args.report!r}; the reports:\n{reports}")
    try:
        since = parse_duration(args.since)
    except ValueError as exc:
        raise SystemExit(f"--since: {exc}") from None
    if since <= 0:  # an empty period: every report would say "(no rows)", as if nothing had happened
        raise SystemExit(f"--since {args.since}: the period is empty; give a length, e.g. 1h, 1d, 7d")
    settings = _settings(args)
    store = _open_store(settings)
    try:
        if newest_event_time(store) is None:
            _note("the store holds no events yet")
        else:
            start, end = period(store, since)
            whole = ", to whole hours" if since % 3600 else ""
            _note(f"period: {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC, the {args.since} before the newest "
                  f"event time{whole}")  # fmt: skip
        ruleset = _load_rules_or_exit(settings.rules_path, "") if REPORTS[args.report].finish is not None else None
        rows = run_report(store, args.report, since, args.team or "", ruleset)
        known, teams = known_teams(store, args.team) if args.team and not rows else (True, [])
    finally:
        store.close()
    if not known:  # a typo or a team of another store: not "(no rows)", which reads as a team that wasted nothing
        raise SystemExit(f"--team {printable(args.team, 60)}: no such team in this store (team tags are matched "
                         f"exactly); its teams: {', '.join(printable(t, 40) for t in teams) or '(none)'}")  # fmt: skip
    shown, cut = _first_rows(rows, args.limit, args.format)
    sys.stdout.write(format_rows(shown, args.format))
    if cut:
        _note(cut)
    return 0


TABLE_ROWS = 100
"""The rows ``query`` shows as a table unless ``--limit`` says otherwise (csv and json: all)."""


def _first_rows(rows: list[dict[str, Any]], limit: int | None, fmt: str) -> tuple[list[dict[str, Any]], str]:
    """The rows ``query`` prints, and what it says of those it leaves out ('' for none): a fleet's incidents over
    days are thousands of rows, which a table in a terminal buries; cut, never silently."""
    most = limit if limit is not None else (TABLE_ROWS if fmt == "table" else 0)
    if not most or len(rows) <= most:
        return rows, ""
    return rows[:most], f"(the first {most:,} of {len(rows):,} rows: --limit 0 shows them all, --format csv for a spreadsheet)"


def cmd_sql(args: argparse.Namespace) -> int:
    from clickhouse_connect.driver.exceptions import DatabaseError

    from detector.reports import format_blocks, format_rows

    if not args.query.strip():
        raise SystemExit("sql: the query is empty; e.g. burnwatch sql \"SELECT count() FROM burnwatch.alerts\"")
    settings = _settings(args)
    store = _open_store(settings)
    try:  # read-only, as the commands that only read (docs/cli.md): ClickHouse holds it to that
        try:
            with store.stream(args.query, read_only=True) as (names, blocks):
                for text in format_blocks(names, blocks, args.format):  # as it comes: `| head` ends the query
                    sys.stdout.write(text)
        except DatabaseError as exc:
            if "Streaming query is not supported" not in str(exc):
                raise
            # the embedded engine streams a SELECT only (not SHOW, DESCRIBE, EXISTS, EXPLAIN): read it whole
            sys.stdout.write(format_rows(store.query(args.query, read_only=True), args.format))
    finally:
        store.close()
    return 0


def cmd_incidents(args: argparse.Namespace) -> int:
    from detector.incidents import DEFAULT_LIMIT, MAX_LIMIT, IncidentFilter, InvalidFilter, format_table, list_incidents, summary
    from detector.store import StoreBusy

    try:
        flt = IncidentFilter(open_only=args.open, team=args.team or None, limit=args.limit, offset=args.offset)
    except InvalidFilter as exc:
        raise SystemExit(f"--{exc}") from None
    settings = _settings(args, {"clickhouse_dsn": "--store"}, clickhouse_dsn=args.store)
    try:
        store = _open_store(settings, "--store" if args.store else "")
    except StoreBusy as exc:
        from urllib.parse import urlencode

        host = url_host(bind_host(settings.web_host) or "127.0.0.1")  # every interface: this machine's loopback among them
        asked = {**({"open": "1"} if args.open else {}), **({"team": flt.team} if flt.team else {}),
                 **({"limit": str(flt.limit)} if args.limit != DEFAULT_LIMIT else {}),
                 **({"offset": str(flt.offset)} if flt.offset else {})}  # fmt: skip
        query = f"?{urlencode(asked)}" if asked else ""
        raise StoreBusy(f"{exc}. A running worker serves this list itself: curl "
                        f"'http://{host}:{settings.web_port}/api/incidents{query}' (JSON), or open "
                        f"http://{host}:{settings.web_port}/incidents (BURNWATCH_WEB_PORT)") from None  # fmt: skip
    try:
        listed = list_incidents(store, flt, time.time())
    finally:
        store.close()
    if args.format == "json":
        sys.stdout.write(json.dumps(listed.to_json(settings.slack_workspace_url), indent=2) + "\n")
    else:
        sys.stdout.write(format_table(listed))
        if listed.incidents:
            more = ""
            if flt.offset + len(listed.incidents) < listed.total:  # --limit alone stops at MAX_LIMIT: say how to go on
                more = f" (--offset {flt.next_offset} shows the next" + (", --limit more at once)" if flt.limit < MAX_LIMIT
                                                                          else ")")  # fmt: skip
            _note(summary(listed) + more)
    return 0


def cmd_store_serve(args: argparse.Namespace) -> int:
    from streams.storeserver import redact_dsn, serve

    settings = _settings(args)
    configure_logging(settings.log_format, settings.log_level)
    embedded = settings.dsn if settings.dsn.startswith("chdb:") else f"chdb://{(settings.data_dir / 'clickhouse').resolve()}"
    dsn = args.dsn or embedded
    try:
        return serve(dsn, args.host, args.port, args.max_execution_time)
    except Exception as exc:  # a DSN that is not chdb, a directory another process holds, a port in use
        raise SystemExit(f"store serve {redact_dsn(dsn)} on {args.host}:{args.port}: {exc}") from None


def _print_table(rows: list[dict[str, Any]]) -> None:
    from detector.reports import format_rows

    sys.stdout.write(format_rows(rows, "table"))


def cmd_demo(args: argparse.Namespace) -> int:
    from streams.demo import run_demo

    return run_demo(_settings(args), hours=args.hours, speed=args.speed, config=args.config, via_bridge=args.via_bridge)


_ENV_HELP = {
    "kafka_bootstrap": "host:port[,...] of the Kafka brokers (required)",
    "kafka_security_protocol": "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
    "kafka_sasl_mechanism": "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or AWS_MSK_IAM (with SASL_*)",
    "kafka_oauth_token_url": "with OAUTHBEARER: the token endpoint (SASL user and password: client id, secret)",
    "kafka_oauth_scope": "with OAUTHBEARER: the scope asked with each token",
    "kafka_oauth_extensions": "with OAUTHBEARER: SASL extensions, key=value,... (Confluent's logicalCluster)",
    "kafka_oauth_ca_file": "with OAUTHBEARER: PEM bundle of the token endpoint's CAs (default: the system's)",
    "kafka_aws_region": "the MSK cluster's region, with AWS_MSK_IAM (default: from the brokers' names, AWS_REGION)",
    "kafka_sasl_username": "the SASL user",
    "kafka_sasl_password": "its password ...",
    "kafka_sasl_password_file": "... or a file holding it (a mounted Secret)",
    "kafka_ssl_ca_file": "PEM bundle of the CAs of the brokers' certificates (default: the system's)",
    "kafka_ssl_cert_file": "client certificate (PEM), for mutual TLS",
    "kafka_ssl_key_file": "its key (unencrypted PEM)",
    "kafka_ssl_check_hostname": "a broker's name must match its certificate",
    "clickhouse_dsn": "chdb:///dir, chdb://memory or http://user:pass@host:8123",
    "clickhouse_database": "database of all tables",
    "rules_path": "rules file or directory (pricing, routing, limits beside it)",
    "data_dir": "local data: the embedded ClickHouse (<data dir>/clickhouse), Faust's state",
    "app_id": "Kafka consumer group: workers with one id share the partitions",
    "partitions": "partitions of the topics it creates",
    "replication_factor": "replicas of the topics it creates (-1: the broker's default.replication.factor)",
    "web_port": "port of /healthz, /metrics, /slack/actions, /api/incidents, /incidents",
    "web_host": "address that web server binds",
    "batch_max_messages": "a batch closes at this many messages",
    "batch_max_bytes": "... or this many bytes of message values",
    "batch_within_s": "... or this long after its first message (a backlog's batches close full at once)",
    "max_held_per_partition": "messages a partition may have waiting for the others (or fetched) before its fetching pauses",
    "max_partition_fetch_bytes": "the most one fetch takes of one partition (Kafka's max.partition.fetch.bytes)",
    "fetch_max_bytes": "the most one fetch brings of all partitions together (Kafka's fetch.max.bytes)",
    "session_timeout_s": "Kafka group session timeout",
    "log_format": "auto, json or console",
    "log_level": "debug, info, warning or error",
    "slack_bot_token": "post with a bot (with SLACK_CHANNEL)",
    "slack_channel": "the bot's default channel",
    "slack_webhook_url": "or post through an incoming webhook",
    "slack_base_url": "a local Slack stand-in (tests)",
    "web_user_header": "the header an authenticating proxy names the person with (/incidents' Approve/Decline)",
    "web_origin": "the /incidents page's origin as browsers see it (https://burnwatch.example.com)",
    "web_token_secret": "the key of the page's form tokens, the same on every worker (16 characters or more)",
    "evict_after_s": "seconds of event time without an event before a resource's state leaves memory (0: never)",
    "delivery_memory_s": "seconds of event time a closed alert's delivery records stay in memory (older: read from the store)",
    "event_writer": "auto, process or thread: where event inserts run",
    "slack_signing_secret": "verifies button clicks on /slack/actions",
    "slack_workspace_url": "https://WORKSPACE.slack.com: incident lists link to each incident's message",
    "slack_charts": "a chart in each incident's thread",
    "slack_group_wait_s": "seconds a new opening waits for others of its type and team, to go out as one message",
    "model_dir": "anomaly model artifacts (default <data dir>/models)",
    "model_retrain_every": "retrain on this schedule, e.g. 24h (default: never)",
    "model_train_since": "history a retraining reads",
    "event_ttl_days": "days of event time raw events are kept, 0 forever; a new store "
                      "takes it, an existing one keeps its own unless this is set",
    "stall_exit_s": "exit 70 after this long without a write to (or an answer from) ClickHouse, or with a "
                    "write waiting for the Kafka group to confirm the worker's membership",
}  # fmt: skip


def _environment_help() -> str:
    """The worker's settings, for ``worker --help``: each variable, what it does, its default."""
    lines = ["environment (or, in --config FILE, the same settings by their lower-case names: "
             "kafka_bootstrap: ...):", f"  {'BURNWATCH_CONFIG':<30} that YAML file (the environment wins over it)"]  # fmt: skip
    for key, var in ENV.items():
        default = Settings.model_fields[key].default
        shown = "" if default in (None, "") else f" [{str(default).lower() if isinstance(default, bool) else default}]"
        if key == "clickhouse_dsn":
            shown = " [chdb://<data dir>/clickhouse]"
        lines.append(f"  {var:<30} {_ENV_HELP.get(key, '')}{shown}")
    return "\n".join(lines)


def _version() -> str:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("burnwatch")
    except PackageNotFoundError:
        installed = "(not installed)"
    return f"burnwatch {installed} (Python {platform.python_version()})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="burnwatch", description="Catch ML cloud waste while it happens.",
                                     epilog="Exit codes: docs/cli.md.")  # fmt: skip
    parser.add_argument("--config", help="YAML config file (env: BURNWATCH_CONFIG)")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("worker", help="run the streaming worker", description="Run the streaming worker: read the "
                   "input topics, store every event, detect, alert.", epilog=_environment_help(),
                   formatter_class=argparse.RawDescriptionHelpFormatter).set_defaults(func=cmd_worker)  # fmt: skip

    p = sub.add_parser("simulate", help="generate a simulated fleet with labelled waste")
    p.add_argument("--hours", type=_positive, default=24.0)
    p.add_argument("--hosts", type=_count, default=12, help="GPU training hosts")
    p.add_argument("--notebooks", type=_count, default=8)
    p.add_argument("--inference", type=_count, default=3)
    p.add_argument("--k8s-nodes", type=_count, default=0,
                   help="shared Kubernetes GPU nodes, pods holding some of their GPUs (burnwatch eval uses 4)")
    p.add_argument("--choices", type=_count, default=0,
                   help="sets of region and build-or-call workloads, with a week of usage before the start "
                        "(burnwatch eval uses 2)")
    p.add_argument("--serving", type=_count, default=0,
                   help="inference endpoints for the serving rules: idle schedules, batching, caching, spot "
                        "(burnwatch eval uses 20)")
    p.add_argument("--training-jobs", type=_count, default=0,
                   help="hosts whose jobs starve on their input or plateau, with look-alikes (burnwatch eval uses 6)")
    p.add_argument("--cpu-notebooks", type=_count, default=0,
                   help="notebooks without GPUs, their Jupyter activity in their usage, some left running overnight "
                        "(burnwatch eval uses 4)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", default="-", help="replay file to write ('-' for stdout)")
    p.add_argument("--labels", help="write the ground-truth labels (JSON lines) here")
    p.add_argument("--focus", help="write the fleet's bill here as FOCUS 1.2 (.parquet, .csv or .csv.gz)")
    p.add_argument("--publish", action="store_true", help="publish to Kafka instead of writing a file")
    p.add_argument("--speed", type=_positive, help="with --publish: event-time acceleration (e.g. 600)")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("replay", help="publish a replay file to Kafka")
    p.add_argument("file")
    p.add_argument("--speed", type=_positive, help="pace by event time at this acceleration; default: as fast as possible")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("bridge", help="scrape dcgm-exporter / kube-state-metrics / Prometheus federate into the topics",
                       description="Scrape the targets of a bridge config and publish gpu-metrics (and "
                       "resource-usage) to Kafka: docs/ingest.md.")  # fmt: skip
    p.add_argument("--config", dest="bridge_config", required=True, metavar="FILE",
                   help="bridge config (targets, file_sd, hosts); example: deploy/bridge.yaml")  # fmt: skip
    p.add_argument("--once", action="store_true", help="scrape every target once, publish, print what each gave; "
                   "exit 1 if any failed")  # fmt: skip
    p.set_defaults(func=cmd_bridge)

    p = sub.add_parser("backtest", help="run the rules over a replay file, or stored events, in-process")
    p.add_argument("file", nargs="?", help="replay file (JSON lines of topic/key/value)")
    p.add_argument("--since", help="instead of a file: the events stored in ClickHouse over this much event "
                   "time before the newest (e.g. 7d)")  # fmt: skip
    p.add_argument("--rules", help="rules file or directory (default: BURNWATCH_RULES or rules/)")
    p.add_argument("--compare", metavar="OTHER_RULES",
                   help="also run these rules over the same events; print what they would add or remove")  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object per alert")
    p.add_argument("--scores", metavar="OUT.csv", help="with a replay file: score it with the anomaly model and write "
                   "every judged window (score, threshold, evidence, decision) to this CSV")  # fmt: skip
    p.add_argument("--model-dir", metavar="DIR", help="the models that score (default: BURNWATCH_MODEL_DIR or "
                   "<data dir>/models; without --scores, giving it runs the model too)")  # fmt: skip
    p.add_argument("--metrics", metavar="A,B", help="generic metrics the anomaly rule reads (what `model train "
                   "--metrics` named)")  # fmt: skip
    p.add_argument("--bill", metavar="PATH", help="a FOCUS bill (file or directory): price events without cost_usd at "
                   "the rates it charged and fill in its tags, as a worker does after `ingest focus`")  # fmt: skip
    p.add_argument("--currency", default="USD", help="the --bill's billing currency: USD, the one burnwatch prices in "
                                                     "(another is refused: convert the bill)")  # fmt: skip
    p.add_argument("--jobs", type=_jobs, default=1, metavar="N",
                   help="with a replay file: detect in N processes at once, each for a shard of the resources, with "
                   "one process's alerts (docs/cli.md says the exceptions; each reads the whole file: worth it "
                   "from 2 CPUs; 0: one per usable CPU; default 1)")  # fmt: skip
    p.set_defaults(func=cmd_backtest)

    p = sub.add_parser("eval", help="precision, recall and dollar error per type on simulated fleets")
    p.add_argument("--seeds", default="1,2,3,4,5", help="comma-separated simulator seeds")
    p.add_argument("--hours", type=_positive, default=48.0, help="hours of fleet time per seed")
    p.add_argument("--rules", help="rules file or directory (default: BURNWATCH_RULES or rules/)")
    p.add_argument("--messy", action="store_true", help="lose 2 %% of scrapes, jitter clocks, duplicate and delay messages")
    p.add_argument("--bill", action="store_true", help="also write each fleet's FOCUS bill and check alert dollars "
                   "priced from it against the billed rates (docs/billing.md)")  # fmt: skip
    p.add_argument("--model", action="store_true", help="the anomaly model: train on 48 h, score the next 48 h")
    p.add_argument("--series", metavar="DIR", help="labelled real series (CSV TimeStamp,Value,Label, e.g. the Cloud "
                   "Monitoring Dataset): the rules and a naive IsolationForest, event-level precision/recall/F1")  # fmt: skip
    p.add_argument("--train-fraction", type=float, default=0.15, help="with --series: the part of each series "
                   "models may learn from, left out of the scores (default 0.15)")  # fmt: skip
    p.add_argument("--tolerance", type=int, default=3, help="with --series: steps after a window that still find it "
                   "(default 3)")  # fmt: skip
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

    p = sub.add_parser("digest", help="a day's waste by type and team, top offenders, what was fixed and what stayed "
                       "open, the last days' trend (what the worker posts daily)")  # fmt: skip
    p.add_argument("--day", required=True, help="UTC day, YYYY-MM-DD")
    p.add_argument("--post", action="store_true", help="also post it to Slack")
    p.add_argument("--chart", metavar="PATH", help="write its chart (the last 14 days' waste by type) as a PNG "
                   "(with several channels: PATH-CHANNEL.png)")  # fmt: skip
    p.set_defaults(func=cmd_digest)

    model = sub.add_parser("model", help="the anomaly model").add_subparsers(dest="model_command", required=True)
    p = model.add_parser("train", help="train the isolation forests on the events stored in ClickHouse, or on a "
                         "replay file")  # fmt: skip
    p.add_argument("--since", help="event time before the newest stored event (default 14d)")
    p.add_argument("--from", dest="from_file", metavar="FILE", help="instead of the store: a replay file (what "
                   "`backtest FILE` reads)")  # fmt: skip
    p.add_argument("--until", metavar="TIME", help="with --from: learn only the windows that end by this event time "
                   "(RFC 3339, e.g. 2026-11-02T08:00:00Z, or epoch seconds)")  # fmt: skip
    p.add_argument("--metrics", metavar="A,B", help="generic metrics (keys of a usage event's metrics) the anomaly "
                   "rule reads besides its group's features")  # fmt: skip
    p.add_argument("--alerts-per-1000h", type=float, metavar="X", help="the false-alert rate the thresholds are "
                   "calibrated to, per 1,000 resource-hours (default 0.5: ALERTS_PER_1000H)")  # fmt: skip
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

    ingest = sub.add_parser("ingest", help="read bills into the store").add_subparsers(dest="ingest_command",
                                                                                    required=True)  # fmt: skip
    p = ingest.add_parser("focus", help="store a FOCUS 1.0-1.2 export (CSV, CSV.gz, Parquet; a file or a directory)",
                          description="Every file is checked before anything is stored; a re-delivered or restated "
                          "export replaces the charges it restates (docs/billing.md).")  # fmt: skip
    p.add_argument("path", help="a FOCUS file, or a directory of them")
    p.add_argument("--currency", default="USD", help="the billing currency every row must carry (default USD)")
    p.add_argument("--publish-usage", action="store_true",
                   help="also publish the bill's usage to resource-usage: billed resources that send no telemetry "
                   "(buckets, managed databases), and commitments (for unused_commitment)")  # fmt: skip
    p.set_defaults(func=cmd_ingest_focus)

    db = sub.add_parser("db", help="the ClickHouse store").add_subparsers(dest="db_command", required=True)
    db.add_parser("migrate", help="create what the schema lacks (the worker does it on start too)").set_defaults(
        func=cmd_db_migrate)  # fmt: skip

    from detector.incidents import DEFAULT_LIMIT, MAX_LIMIT
    from detector.reports import REPORTS

    p = sub.add_parser("query", help="a named post-mortem report over the store (docs/postmortem.md)",
                       description="Reports: " + "; ".join(f"{n} ({r.title})" for n, r in REPORTS.items()))  # fmt: skip
    p.add_argument("report", help=", ".join(REPORTS))
    p.add_argument("--since", default="7d", help="period before the newest stored event time (default 7d)")
    p.add_argument("--team", help="only this team (the team tag)")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.add_argument("--limit", type=functools.partial(_whole, what="rows", zero="all"), default=None,
                   help=f"show the first N rows (default {TABLE_ROWS} as a table, all as csv or json; 0: all)")
    p.set_defaults(func=cmd_query)

    p = sub.add_parser("sql", help="run a query against the store")
    p.add_argument("query")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.set_defaults(func=cmd_sql)

    p = sub.add_parser("incidents", help="incidents with dollars so far, $/h, owner, age and state (open ones first, "
                       "highest $/h first)", description="Incidents from the store (docs/incidents.md). While a "
                       "worker holds the embedded store, ask the worker instead: /api/incidents on its web port.")
    p.add_argument("--open", action="store_true", help="only incidents not resolved yet")
    p.add_argument("--team", help="only this team (the team tag)")
    p.add_argument("--format", choices=["table", "json"], default="table",
                   help="table (for a terminal) or json (the document /api/incidents serves)")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help=f"at most this many, 1 to {MAX_LIMIT} "
                   f"(default {DEFAULT_LIMIT})")
    p.add_argument("--offset", type=int, default=0, help="skip this many first, in the list's order (the next page: "
                   "the offset plus the limit)")
    p.add_argument("--store", metavar="DSN", help="chdb:///dir or http://user:pass@host:8123 (default: "
                   "BURNWATCH_CLICKHOUSE_DSN, else <data dir>/clickhouse)")
    p.set_defaults(func=cmd_incidents)

    store = sub.add_parser("store", help="the store several workers share").add_subparsers(
        dest="store_command", required=True)  # fmt: skip
    p = store.add_parser("serve", help="own the embedded ClickHouse engine and serve it over ClickHouse's HTTP "
                         "interface (workers: BURNWATCH_CLICKHOUSE_DSN=http://127.0.0.1:PORT)")  # fmt: skip
    p.add_argument("--dsn", help="chdb:///dir to own (default: BURNWATCH_CLICKHOUSE_DSN if chdb://, "
                   "else <data dir>/clickhouse)")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback: there is no auth)")
    p.add_argument("--port", type=functools.partial(_whole, most=65535, zero="a free one"), default=8123,
                   help="port (default 8123, ClickHouse's; 0 picks a free one)")  # fmt: skip
    p.add_argument("--max-execution-time", type=functools.partial(_whole, what="seconds", most=10**9, zero="never"),
                   default=300, metavar="S",
                   help="stop a statement that sets no max_execution_time after S seconds: the engine runs one "
                   "at a time (default 300, clickhouse-connect's reply timeout; 0: never)")  # fmt: skip
    p.set_defaults(func=cmd_store_serve)

    p = sub.add_parser("demo", help="everything on embedded defaults, with a simulated fleet")
    p.add_argument("--hours", type=_positive, help="hours of simulated fleet time (default 24; 12 with --via-bridge)")
    p.add_argument("--speed", type=_positive, default=1800.0, help="event-time acceleration")
    p.add_argument("--via-bridge", action="store_true",
                   help="Kubernetes GPU nodes served by fake dcgm-exporters and kube-state-metrics, scraped by the bridge")
    p.set_defaults(func=cmd_demo)
    return parser


def _expected_failure(exc: Exception) -> tuple[str, int] | None:
    """(message, exit code) for a failure a user can meet and act on; None for a bug (its
    traceback is shown). Library types are looked up only if the command imported them."""
    if isinstance(exc, ConnectionError):  # the embedded store held by a worker; a server or broker not answering
        return str(exc), EXIT_UNAVAILABLE
    kafka = sys.modules.get("streams.kafka")
    if kafka is not None and isinstance(exc, (kafka.TopicsRefused, kafka.TopicsMismatched, kafka.KafkaRefused)):
        return str(exc), EXIT_FAILED
    clickhouse = sys.modules.get("clickhouse_connect.driver.exceptions")
    if clickhouse is not None and isinstance(exc, clickhouse.StreamFailureError) and "DB::Exception" in str(exc):
        # the engine's own refusal met while the rows stream (a SELECT naming a table or column that is not
        # there): clickhouse-connect raises it as an OperationalError, but the query is wrong, not the store down
        return f"ClickHouse refused the query: {_first_line(exc)}", EXIT_FAILED
    if clickhouse is not None and isinstance(exc, clickhouse.OperationalError):
        return f"ClickHouse is unavailable: {_first_line(exc)}", EXIT_UNAVAILABLE
    if clickhouse is not None and isinstance(exc, clickhouse.ClickHouseError):
        return f"ClickHouse refused the query: {_first_line(exc)}", EXIT_FAILED
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror}", EXIT_FAILED
    return None


def _first_line(exc: Exception, limit: int = 600) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= limit else text[:limit] + " ..."


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code (docs/cli.md)."""
    args = build_parser().parse_args(argv)
    install_redaction()
    if args.func not in (cmd_worker, cmd_store_serve):  # those configure it from their settings
        configure_logging("auto", "warning")  # stdout is the command's output: log lines go to stderr
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader gone away shows here, not as a traceback at exit
        return code
    except SystemExit as exc:
        if isinstance(exc.code, str):  # a message for the user: it may quote a DSN or an error
            raise SystemExit(redact(exc.code)) from None
        raise
    except BrokenPipeError:  # `burnwatch ... | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit has nowhere to fail
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        _note("interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:
        failure = _expected_failure(exc)
        if failure is None:
            raise
        _note(redact(failure[0]))
        return failure[1]


if __name__ == "__main__":
    sys.exit(main())
