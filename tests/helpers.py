"""Builders for crafted event sequences (the detector tests' vocabulary)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from detector.events import GpuMetric, UsageEvent
from detector.pricing import Pricing
from detector.replay import write_replay
from detector.simulate import Label, SimConfig, simulate
from streams.children import die_with_parent

if TYPE_CHECKING:  # slack-sdk is imported by the tests that post, not by every test
    from detector.slack import SlackNotifier
    from detector.testing import LocalSlack

T0 = datetime(2026, 11, 2, tzinfo=timezone.utc).timestamp()
MIN = 60.0


def at(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=timezone.utc)


def usage(t: float, rid: str = "host-1", state: str = "running", usd_per_hour: float | None = 32.0,
          resource_type: str = "gpu_instance", tags: dict | None = None, interval_s: float = 60.0) -> UsageEvent:
    return UsageEvent(
        ts=at(t), resource_id=rid, resource_type=resource_type, instance_type="p4d.24xlarge",
        account="acct", region="us-east-1", state=state, interval_s=interval_s,
        cost_usd=None if usd_per_hour is None else usd_per_hour * interval_s / 3600,
        tags=tags if tags is not None else {"team": "nlp", "owner": "alice", "project": "llm"},
    )  # fmt: skip


def scrape(t: float, utils: list[float], rid: str = "host-1", sm: list[float] | None = None) -> list[GpuMetric]:
    """One exporter scrape of a host: one sample per GPU."""
    return [
        GpuMetric(ts=at(t), resource_id=rid, gpu_index=i, model="A100", util_pct=u,
                  sm_active=None if sm is None else sm[i])
        for i, u in enumerate(utils)
    ]  # fmt: skip


def idle_host(rid: str, team: str, minutes: int, start: float = T0) -> list:
    """A host of ``team`` with four GPUs idle for ``minutes`` from ``start``: scrapes every 30 s, a usage
    event (tagged with the team) every minute."""
    events: list = []
    for i in range(minutes * 2):
        t = start + i * 30
        if i % 2 == 0:
            events.append(usage(t, rid, tags={"team": team}))
        events.extend(scrape(t, [0.0] * 4, rid))
    return events


def timeline(start: float, end: float, utils: list[float], rid: str = "host-1", step: float = 30.0,
             with_usage: bool = True, usd_per_hour: float = 32.0) -> list:
    """Scrapes every ``step`` seconds in [start, end), with a usage event every minute."""
    events: list = []
    t = start
    while t < end:
        if with_usage and (t - start) % 60 == 0:
            events.append(usage(t, rid, usd_per_hour=usd_per_hour))
        events.extend(scrape(t, utils, rid))
        t += step
    return events


def fleet_file(path: Path, cfg: SimConfig, pricing: Pricing) -> tuple[Path, list[Label]]:
    """A simulated fleet written as a replay file (what backtest and replay read), and its labels."""
    records, labels = simulate(cfg, pricing)
    with open(path, "wb") as out:
        write_replay(records, out)
    return path, labels


def store_fleet(store, ruleset, path: Path) -> None:
    """A replay file through the worker's pipeline (decoder, aligner, engine, alert manager,
    store) into ``store``, in batches of 2,000 messages as the worker takes them."""
    import asyncio

    from detector.alerts import AlertManager
    from detector.delivery import Outbox
    from detector.engine import Engine
    from detector.replay import read_replay
    from streams.pipeline import Message, Pipeline

    async def ignore(*_):
        pass

    pipeline = Pipeline(engine=Engine(ruleset), store=store, outbox=Outbox(store, None),
                        manager=AlertManager(ruleset=ruleset), send_dead_letter=ignore)  # fmt: skip
    offsets: dict[str, int] = {}
    messages = []
    for _, record in read_replay(path):
        offset = offsets[record.topic] = offsets.get(record.topic, -1) + 1
        messages.append(Message(record.topic, 0, offset, record.key.encode() if record.key else None,
                                bytes(record.value)))  # fmt: skip

    async def feed():
        for i in range(0, len(messages), 2000):
            await pipeline.process(messages[i:i + 2000], ignore)
        await pipeline.drain()

    asyncio.run(feed())


@contextmanager
def store_held(directory: Path) -> Iterator[subprocess.Popen]:
    """Another process holding the embedded store at ``directory`` (chdb allows one engine per
    process, and one process per store) until the block ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from detector.store import connect; "
         f"c = connect('chdb://{directory}'); print('open', flush=True); sys.stdin.read()"],
        cwd=Path(__file__).resolve().parent.parent, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        preexec_fn=die_with_parent(),
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        yield holder
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)


def slack_bot(slack: LocalSlack, channel: str = "#ml-cost") -> SlackNotifier:
    """A bot-token notifier posting to the ``slack`` fixture's local server."""
    from detector.slack import SlackNotifier

    return SlackNotifier(token="xoxb-test", channel=channel, base_url=slack.api_url, timeout=2)


def burnwatch_in_process(capsys, *argv: str) -> tuple[int, str, str]:
    """``burnwatch ARGV`` through the CLI's ``main``, in this process: (exit code, stdout, stderr)
    as a user's shell would see them (a ``SystemExit`` message goes to stderr with exit code 1, as
    Python does). The caller keeps ``streams.cli.configure_logging`` from binding structlog
    (process-wide) to the test's captured stderr, which pytest closes after the test."""
    from streams.cli import EXIT_FAILED, main

    capsys.readouterr()
    try:
        code = main([*argv])
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            code = EXIT_FAILED
        else:
            code = int(exc.code or 0)
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out
    return code, out.out, out.err


def ipv6_loopback() -> bool:
    """Whether this machine can bind ::1 (tests of IPv6 listening skip where it cannot)."""
    import socket

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def slow_state_reads(monkeypatch, store, pipeline) -> None:
    """Saved states read 50 ms a key, in chunks of 10 keys, with a look-up bound of 1 s: 40 keys read in one
    look-up would pass the bound at every try (the pipeline stalls), in chunks each is read within it."""
    import streams.pipeline as pipeline_module
    from detector.store import states as states_module

    monkeypatch.setattr(states_module, "GET_MANY_CHUNK", 10)
    monkeypatch.setattr(pipeline_module, "_LOOKUP_TIMEOUT_S", 1.0)
    pipeline._retry_max_s = 0.2
    read = store.states.get_many_placed

    def slow(keys):  # a chunk in 0.5 s, the 40 keys in 2 s
        time.sleep(0.05 * len(keys))
        return read(keys)

    monkeypatch.setattr(store.states, "get_many_placed", slow)
