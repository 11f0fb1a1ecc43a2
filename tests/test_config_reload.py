"""A rules reload reaches every part that uses the rule files: the engine (rules), the alert
manager (routes), the decoder (limits) and Slack (mentions). Real pipeline, engine, store
(chdb), outbox and Slack stand-in; the reload is the worker's own (:class:`LiveConfig`)."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading

import pytest
import yaml

from detector.alerts import AlertManager
from detector.delivery import Outbox
from detector.engine import Engine
from detector.slack import SlackNotifier
from detector.testing import LocalSlack
from streams.config import LiveConfig
from streams.event_writer import ProcessEventWriter, writer_for
from streams.pipeline import Message, Pipeline
from tests.conftest import ROOT
from tests.helpers import MIN, T0, at

TAGS = {"team": "nlp", "project": "llm", "owner": "alice"}


def minute(offset: int, t: float, usd: float = 0.5) -> list[Message]:
    """One minute of an idle GPU host: its bill and its two GPUs at 1 %."""
    usage = {"ts": at(t).isoformat(), "resource_id": "h1", "resource_type": "gpu_instance", "cost_usd": usd,
             "interval_s": 60, "tags": TAGS}  # fmt: skip
    gpus = [{"ts": at(t).isoformat(), "resource_id": "h1", "gpu_index": i, "util_pct": 1.0} for i in range(2)]
    return [Message("resource-usage", 0, offset, b"h1", json.dumps(usage).encode()),
            Message("gpu-metrics", 0, offset, b"h1", json.dumps(gpus).encode())]  # fmt: skip


def edit(path, change) -> None:
    data = yaml.safe_load(path.read_text()) or {}
    change(data)
    path.write_text(yaml.safe_dump(data))


def idle_for(duration: str):
    def change(data):
        (rule,) = [r for r in data["rules"] if r["name"] == "idle-gpu"]
        rule["params"]["for"] = duration

    return change


def test_a_reload_reaches_the_engine_the_manager_the_decoder_and_slack(store, tmp_path):
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    edit(rules / "rules.yaml", idle_for("6h"))  # before the reload: an hour idle is not alerted
    config = LiveConfig.load(rules)
    dead: list[dict] = []

    async def send_dead_letter(key, value):
        dead.append(json.loads(value))

    async def ack(messages):
        pass

    with LocalSlack() as slack:
        outbox = Outbox(store, SlackNotifier(token="x", channel="#fallback", base_url=slack.api_url), group_wait_s=0)
        pipeline = Pipeline(engine=Engine(config.current.ruleset), store=store, outbox=outbox,
                            manager=AlertManager(ruleset=config.current.ruleset), send_dead_letter=send_dead_letter,
                            config=config)  # fmt: skip

        async def run(messages):
            await pipeline.process(messages, ack)
            await pipeline.drain()

        asyncio.run(run([m for i in range(10) for m in minute(i, T0 + i * MIN)]))
        assert store.alerts.latest() == [] and dead == []

        edit(rules / "rules.yaml", idle_for("30m"))  # the engine
        edit(rules / "routing.yaml", lambda r: r.update(channels={"nlp": "#nlp-cost"}))  # the manager
        edit(rules / "routing.yaml", lambda r: r.update(users={"alice": "U0ALICE"}))  # Slack's rendering
        edit(rules / "limits.yaml", lambda r: r.update(max_usd_per_hour=100))  # the decoder
        new, refused = config.reload()
        assert refused is None and new is config.current

        after = [m for i in range(10, 60) for m in minute(i, T0 + i * MIN)]
        after += minute(60, T0 + 60 * MIN, usd=2.0)  # $120/h: over the new bound
        asyncio.run(run(after))
        outbox.deliver_pending()

        (alert,) = store.alerts.latest()
        assert alert["rule"] == "idle-gpu" and alert["channel"] == "#nlp-cost"
        (post,) = slack.calls("chat.postMessage")
        assert post.body["channel"] == "#nlp-cost"
        assert "<@U0ALICE>" in json.dumps(post.body["blocks"])
        (letter,) = dead
        assert letter["topic"] == "resource-usage" and "max_usd_per_hour" in letter["reason"]


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_batch_written_after_a_reload_keeps_the_prices_it_was_read_with(mode, store, tmp_path):
    """Egress is priced where it is stored: a batch read (and detected) under one price list whose
    write lands after an edit of ``pricing.yaml`` is reloaded keeps that list's dollars; the batch
    read after the reload has the new ones. With the inserts in a child (``process``), the batch was
    prepared ahead, priced at its read (the batch before started the child)."""
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    config = LiveConfig.load(rules)
    writer = writer_for(store, "chdb://memory", store.db, mode)
    pipeline = Pipeline(engine=Engine(config.current.ruleset), store=store, outbox=Outbox(store, None),
                        manager=AlertManager(ruleset=config.current.ruleset), event_writer=writer,
                        send_dead_letter=lambda key, value: asyncio.sleep(0), config=config)  # fmt: skip
    gate, writing = threading.Event(), threading.Event()
    real_write = pipeline._write
    writes = 0

    def gated_write(step):
        nonlocal writes
        writes += 1
        if writes == 2:  # the second batch: read at the shipped prices
            writing.set()
            gate.wait(30)
        return real_write(step)

    pipeline._write = gated_write
    exchanges: list[tuple[str, float]] = []  # with the child: each kind, and the internet price it was given
    if isinstance(writer, ProcessEventWriter):
        exchange = writer._exchange

        def recorded(kind, items, pricing, held_until=None):
            exchanges.append((kind, pricing.egress_per_gb.internet))
            return exchange(kind, items, pricing, held_until)

        writer._exchange = recorded

    def egress(offset: int, t: float) -> Message:
        usage = {"ts": at(t).isoformat(), "resource_id": "i-1", "resource_type": "cpu_instance", "cost_usd": 0.1,
                 "interval_s": 60, "region": "us-east-1", "dest_region": "internet", "egress_bytes": 2_000_000_000}  # fmt: skip
        return Message("resource-usage", 0, offset, b"i-1", json.dumps(usage).encode())

    async def ack(messages):
        pass

    async def go():
        await pipeline.process([egress(0, T0)], ack)
        await pipeline.drain()  # (its write starts the child)
        try:
            await pipeline.process([egress(1, T0 + MIN)], ack)  # read at the shipped prices; its write waits at the gate
            assert await asyncio.to_thread(writing.wait, 30)
            edit(rules / "pricing.yaml", lambda p: p["egress_per_gb"].update(internet=4.5))
            new, refused = config.reload()
            assert refused is None and new is config.current
        finally:
            gate.set()  # a failure above must not leave the writer thread waiting
        await pipeline.process([egress(2, T0 + 2 * MIN)], ack)
        await pipeline.drain()

    try:
        asyncio.run(go())
    finally:
        writer.close()
    rows = store.query(f"SELECT toUnixTimestamp(ts) AS t, egress_usd FROM {store.db}.resource_usage ORDER BY ts")
    old, new = pytest.approx(2 * 0.09), pytest.approx(2 * 4.5)
    assert [(r["t"], r["egress_usd"]) for r in rows] == [(T0, old), (T0 + MIN, old), (T0 + 2 * MIN, new)]
    if mode == "process":  # the second and third batches prepared as read and stored from that, no write by the child
        assert exchanges[2:] == [("prepare", 0.09), ("prepare", 4.5)]


def test_a_channel_routing_no_longer_names_leaves_the_refusing_channels(store, tmp_path):
    """A misspelt team channel (``channel_not_found``) fixed in ``routing.yaml``, as that refusal's fix usually is:
    no post goes to the old name again, so it stayed on /healthz's ``slack_refusing`` and the gauge until a restart.
    At the reload it leaves them; a channel still routed, and SLACK_CHANNEL, stay until they take a post."""
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    edit(rules / "routing.yaml", lambda r: r.update(channels={"nlp": "#nlp-cots", "cv": "#cv-cost"}))
    config = LiveConfig.load(rules)

    async def send_dead_letter(key, value):
        pass

    with LocalSlack() as slack:
        notifier = SlackNotifier(token="x", channel="#fallback", base_url=slack.api_url)
        pipeline = Pipeline(engine=Engine(config.current.ruleset), store=store, outbox=Outbox(store, notifier),
                            manager=AlertManager(ruleset=config.current.ruleset), send_dead_letter=send_dead_letter,
                            config=config)  # fmt: skip
        pipeline.configure()
        notifier.refusing.update({"#nlp-cots": "channel_not_found", "#cv-cost": "not_in_channel",
                                  "#fallback": "is_archived"})  # fmt: skip
        edit(rules / "routing.yaml", lambda r: r.update(channels={"nlp": "#nlp-cost", "cv": "#cv-cost"}))
        new, refused = config.reload()
        assert refused is None and new is config.current
        pipeline.configure()
        assert sorted(notifier.refusing) == ["#cv-cost", "#fallback"]
