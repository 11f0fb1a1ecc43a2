"""The chaos scenario of issue 11 at a larger size, with the figures docs/reliability.md records.

    .venv/bin/python bench/chaos.py --seed 1 --hours 24 --hosts 12 --kills 4 --speed 1200

A seeded fleet is replayed paced by event time into the embedded broker while the real
worker is SIGKILLed at seeded points (one of them while a Slack post hangs past the
client's timeout) and restarted, and the local Slack answers 429 and 500 in seeded
windows. Then the store and Slack are compared with backtest: events published, stored,
lost and doubled; alerts expected, got, missing, invented and different; posts missing
and doubled. The harness is ``tests/reliability.py`` (``chaos``), the same the test uses.
Exit status 1 when anything was lost, doubled or invented.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from detector.rules import load_rules  # noqa: E402
from detector.simulate import SimConfig  # noqa: E402
from detector.testing import LocalSlack  # noqa: E402
from streams.embedded import EmbeddedBroker  # noqa: E402
from streams.process import StoreServerProcess  # noqa: E402
from tests.reliability import chaos  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1, help="fleet, kill points and Slack windows (default 1)")
    parser.add_argument("--hours", type=float, default=24.0, help="event time the fleet covers (default 24)")
    parser.add_argument("--hosts", type=int, default=12, help="training hosts; notebooks are half as many (default 12)")
    parser.add_argument("--kills", type=int, default=4, help="SIGKILLs of the worker (default 4)")
    parser.add_argument("--speed", type=float, default=1200.0, help="event seconds per wall second (default 1200)")
    parser.add_argument("--no-slack-faults", action="store_true", help="Slack answers every request")
    parser.add_argument("--second-worker", action="store_true",
                        help="a second worker joins and leaves (both on one `burnwatch store serve`)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs, store)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for the workers (e.g. BURNWATCH_SLACK_GROUP_WAIT_S=30, the default outside tests)")
    args = parser.parse_args(argv)
    extra = dict(item.split("=", 1) for item in args.env)

    ruleset = load_rules(ROOT / "rules")
    cfg = SimConfig(hours=args.hours, training_hosts=args.hosts, notebooks=max(1, args.hosts // 2),
                    inference_endpoints=max(1, args.hosts // 4), seed=args.seed)  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="burnwatch-chaos-"))
    try:
        shutil.copytree(ROOT / "rules", workdir / "rules")
        server = StoreServerProcess(f"chdb://{workdir / 'ch'}", workdir / "store.log").wait_ready() \
            if args.second_worker else None  # fmt: skip
        try:
            with EmbeddedBroker(log_path=workdir / "broker.log") as broker, LocalSlack() as slack:
                report = chaos(workdir, ruleset, broker.bootstrap, slack, seed=args.seed, cfg=cfg, kills=args.kills,
                               speed=args.speed, rules_dir=workdir / "rules", slack_faults=not args.no_slack_faults,
                               timeout=900, store_url=server.url if server else None, extra_env=extra,
                               log=lambda line: print(line, file=sys.stderr))  # fmt: skip
        finally:
            if server is not None:
                server.stop()
    finally:
        if args.keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    figures = report.figures()
    print(json.dumps(figures, indent=2))
    if not report.ok:
        print(report, file=sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
