"""The Faust topology: one agent over the three input topics, the dead-letter topic,
the Slack delivery task, timers and web views.

Thin on purpose: the work is in :mod:`streams.pipeline` and :mod:`detector`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
import traceback
from typing import Any

import faust
import structlog
from aiokafka.errors import KafkaError
from faust.types import TP
from faust.web import View

from detector.actions import ActionHandler, RequestVerifier
from detector.alerts import AlertManager
from detector.charts import ChartWorker
from detector.delivery import Outbox
from detector.digest import send_due_digests
from detector.engine import Engine
from detector.events import TOPICS, EventDecoder
from detector.logs import stdlib_logging_config
from detector.metrics import METRICS
from detector.model.forest import ModelSet
from detector.reload import RulesWatcher
from detector.rules import load_rules
from detector.settings import Settings
from detector.slack import SlackError, SlackNotifier
from detector.store import Store
from detector.units import one_line
from streams.kafka import DEAD_LETTER_TOPIC
from streams.pipeline import Message, Pipeline, PipelineStopped
from streams.web import serve_only_burnwatch

__all__ = ["build_worker_app"]

log = structlog.get_logger("burnwatch.worker")


def _notifier(settings: Settings) -> SlackNotifier | None:
    if settings.slack_bot_token and settings.slack_channel:
        return SlackNotifier(
            token=settings.slack_bot_token.get_secret_value(),
            channel=settings.slack_channel,
            base_url=settings.slack_base_url,
        )
    if settings.slack_webhook_url:
        return SlackNotifier(webhook_url=settings.slack_webhook_url.get_secret_value())
    return None


class HostDirectory:
    """Resources another worker holds, as the store has them at an event time (a run's hosts,
    for the run detectors). A look-up blocks the event loop for one small query, so answers
    are kept for 5 minutes of event time (a host's price and owner change rarely)."""

    def __init__(self, store: Store, keep_s: float = 300.0) -> None:
        self.store = store
        self.keep_s = keep_s
        self._known: dict[str, tuple[float, Any]] = {}

    def __call__(self, resource_id: str, at: float) -> Any:
        found = self._known.get(resource_id)
        if found is not None and 0 <= at - found[0] < self.keep_s:
            return found[1]
        info = self.store.resource_info(resource_id, at)
        if info is not None:  # not known yet: asked again at the next run event
            if len(self._known) > 100_000:
                self._known.clear()
            self._known[resource_id] = (at, info)
        return info


def build_worker_app(settings: Settings, store: Store) -> tuple[faust.App, Pipeline]:
    """Build the Faust app around an open store; rules are loaded (and validated) here."""
    ruleset = load_rules(settings.rules_path)
    app = faust.App(
        settings.app_id,
        broker=f"kafka://{settings.kafka_bootstrap}",
        store="memory://",
        datadir=str(settings.data_dir / "faust"),
        topic_partitions=settings.partitions,
        topic_replication_factor=1,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 3),
        consumer_auto_offset_reset="earliest",
        web_port=settings.web_port,
        web_host=settings.web_host,
        web_bind=settings.web_host,
        producer_max_request_size=8 << 20,
        stream_buffer_maxsize=max(4096, settings.batch_max_messages * 2),
        broker_max_poll_records=settings.batch_max_messages,
        consumer_max_fetch_size=8 << 20,
        # Faust's own partition assignor: it co-partitions the three inputs (a resource's usage
        # and its GPU metrics on one worker). Faust picks aiokafka's round-robin, which does
        # not, unless standby replicas are asked for; with no tables, they cost nothing.
        table_standby_replicas=1,
        # Faust's own wait for every delivered message to be acknowledged (at a rebalance or a
        # stop) never ends while the aligner holds messages back; the revocation handler below
        # drains the write in flight and commits what is done instead.
        stream_wait_empty=False,
    )
    serve_only_burnwatch(app)  # /healthz, /metrics, /slack/actions; not Faust's own views
    source = app.topic(
        *TOPICS, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw",
        partitions=settings.partitions,
    )  # fmt: skip
    dead_letters = app.topic(
        DEAD_LETTER_TOPIC, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw",
        partitions=settings.partitions,
    )  # fmt: skip
    # Per-resource state lives in ClickHouse beside the events it was built from, written
    # in the same step before offsets are acked, and loaded when partitions are assigned.
    assigned_states: dict[str, bytes] = {}
    engine = Engine(ruleset, loader=lambda key: assigned_states.pop(key, None))
    engine.directory = HostDirectory(store)  # a run's hosts held by another worker
    outbox = Outbox(store, _notifier(settings))
    if outbox.notifier is not None:
        outbox.notifier.routing = ruleset.routing
        if outbox.notifier.threads and settings.slack_charts:
            outbox.on_opened = ChartWorker(store, outbox.notifier).start().submit

    def alert_manager(rules: Any) -> AlertManager:
        """An alert manager that remembers what the store says was alerted (from any worker)."""
        return AlertManager(store.recent_alerts(), ruleset=rules, realert=store.realert_memory(),
                            open_incidents=store.open_incidents())  # fmt: skip

    async def send_dead_letter(key: bytes | None, value: bytes) -> None:
        await dead_letters.send(key=key, value=value)

    def caught_up(topic: str, partition: int, offset: int) -> bool:
        """Nothing more to read now: ``offset`` (the last one read) is the last the latest fetch
        reported. A partition whose fetch reported no high watermark is not caught up."""
        highwater = app.consumer.highwater(TP(topic, partition))
        return highwater is not None and offset + 1 >= highwater

    async def end_positions(tps: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[int | None, int | None]]:
        """(position, end offset) of assigned partitions that have delivered nothing yet. The
        end is the larger of the broker's listed end offset and a fetch's high watermark: some
        brokers (the embedded one) list the last batch's base offset + 1, short of the end."""
        partitions = [TP(topic, partition) for topic, partition in tps]
        ends = await app.consumer.highwaters(*partitions)
        out: dict[tuple[str, int], tuple[int | None, int | None]] = {}
        for tp in partitions:
            listed, fetched = ends.get(tp), app.consumer.highwater(tp)
            end = max(listed, fetched) if listed is not None and fetched is not None else listed
            out[(tp.topic, tp.partition)] = (await app.consumer.position(tp), end)
        return out

    pipeline = Pipeline(
        engine=engine,
        store=store,
        outbox=outbox,
        manager=alert_manager(ruleset),
        send_dead_letter=send_dead_letter,
        caught_up=caught_up,
        end_positions=end_positions,
        decoder=EventDecoder(limits=ruleset.limits),
    )

    def fail(reason: str, **details: Any) -> None:
        """The pipeline cannot make progress: exit non-zero so that an orchestrator restarts the
        worker. Nothing unfinished was acknowledged, so a restart reads it again."""
        log.critical("worker_failed", reason=reason, **details)
        logging.shutdown()
        sys.stderr.flush()
        os._exit(70)

    @app.agent(source, name="detect")
    async def detect(stream: faust.StreamT) -> Any:
        # Manual acks: a message is acknowledged only once it is stored and detection has seen all
        # of its events, which the event-time aligner may hold back for a while. ``noack_take``,
        # not ``take_events``: the latter acknowledges a whole batch as soon as the loop body
        # returns (and when the agent is cancelled at a stop), whatever became of it.
        manual = stream.noack()
        async for events in manual.noack_take(settings.batch_max_messages, within=settings.batch_within_s):
            messages = [
                Message(e.message.topic, e.message.partition, e.message.offset, e.key, e.value, e) for e in events
            ]
            try:
                await pipeline.process(messages, ack=lambda message: manual.ack(message.token))
            except PipelineStopped:
                return
            except Exception as exc:  # noqa: BLE001 - a bug must stop the worker, not the agent alone
                fail("pipeline_error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
        # State moves with partitions: what this worker holds may now belong to another. The
        # write in flight lands and what is done is committed before the group reassigns.
        await pipeline.pause()  # no batch until the next assignment's state is loaded
        await app.consumer.commit()
        pipeline.reset()
        assigned_states.clear()
        # Slack posts move with partitions too: after any post in progress, drop what is queued
        # (stored: the next holder recovers it), so no alert is posted by two workers.
        await asyncio.get_running_loop().run_in_executor(None, outbox.revoke)

    @app.on_partitions_assigned.connect
    async def on_assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
        partitions = sorted({tp.partition for tp in assigned if tp.topic in TOPICS})
        loop = asyncio.get_running_loop()
        states = await loop.run_in_executor(None, store.load_states, partitions)
        # What another worker alerted on these keys until now is in the store: the alert manager
        # learns it again, so re-read input neither re-opens nor re-closes those alerts.
        pipeline.manager = await loop.run_in_executor(None, alert_manager, pipeline.manager.ruleset)
        pipeline.reset()
        pipeline.expect((tp.topic, tp.partition) for tp in assigned if tp.topic in TOPICS)
        await pipeline.check_expected()
        assigned_states.clear()
        assigned_states.update(states)
        pipeline.stats.partitions = len(partitions)
        digest_owner[0] = 0 in partitions  # one worker of the group posts the digests: partition 0's
        log.info("state_loaded", partitions=partitions, keys=len(states))
        recovered = await loop.run_in_executor(None, outbox.assign, partitions)
        if recovered:
            log.info("outbox_recovered", pending=recovered)
        pipeline.outbox_ready.set()
        pipeline.resume()

    @app.task
    async def deliver_alerts() -> None:
        loop = asyncio.get_running_loop()
        if outbox.notifier is None:
            log.info("slack_not_configured", hint="set SLACK_BOT_TOKEN and SLACK_CHANNEL, or SLACK_WEBHOOK_URL")
            return
        backoff = 1.0
        while True:
            await pipeline.outbox_ready.wait()
            pipeline.outbox_ready.clear()
            try:
                await loop.run_in_executor(None, outbox.deliver_pending)
                backoff = 1.0
                if outbox.hold_s:  # a group collecting company: come back when it is due
                    loop.call_later(outbox.hold_s, pipeline.outbox_ready.set)
            except Exception as exc:  # noqa: BLE001 - Slack's or the store's (deliveries are recorded there)
                event = "slack_delivery_retry" if isinstance(exc, SlackError) else "delivery_store_error"
                log.warning(event, error=one_line(exc), retry_in_s=backoff, pending=len(outbox))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 60.0)
                pipeline.outbox_ready.set()

    @app.timer(interval=1.0)
    async def release_held() -> None:
        await pipeline.tick()

    @app.timer(interval=5.0)
    async def watch_progress() -> None:
        """A store that has taken no write for ``stall_exit_s`` will not by itself: exit, so the
        orchestrator restarts the worker (and it says why); until then /healthz says stalled."""
        stalled = pipeline.stalled_for()
        if stalled > settings.stall_exit_s:
            fail("store_unavailable", stalled_s=round(stalled, 1), error=pipeline.stall_reason)

    @app.on_before_shutdown.connect
    async def stopping(sender: Any, **kwargs: Any) -> None:
        """A clean stop hands the partitions over as a revocation does (Faust does not call the
        revocation handler at a stop): the write in flight lands (or, for a store that takes
        none, gives up unacknowledged) and any Slack post in progress finishes, before the
        consumer commits what is acknowledged and leaves the group."""
        pipeline.stop()
        await pipeline.pause()
        await asyncio.get_running_loop().run_in_executor(None, outbox.revoke)

    watcher = RulesWatcher(settings.rules_path, ruleset)

    @app.timer(interval=5.0)
    async def reload_rules() -> None:
        ruleset, refused = await asyncio.get_running_loop().run_in_executor(None, watcher.poll)
        if refused is not None:
            log.error("rules_refused", path=str(settings.rules_path), errors=[str(e) for e in refused.errors],
                      kept=[r.detector.name for r in watcher.current.rules])  # fmt: skip
        elif ruleset is not None:
            engine.set_ruleset(ruleset)
            pipeline.manager.ruleset = ruleset
            pipeline.decoder = EventDecoder(limits=ruleset.limits)
            if outbox.notifier is not None:
                outbox.notifier.routing = ruleset.routing
            log.info("rules_reloaded", path=str(settings.rules_path), rules=ruleset.names)

    digest_owner = [False]

    @app.timer(interval=15.0)
    async def daily_digest() -> None:
        """Once the stream's event time has passed a day's end, post that day's digest per channel."""
        if outbox.notifier is None or not digest_owner[0]:
            return
        loop = asyncio.get_running_loop()
        try:
            sent = await loop.run_in_executor(None, send_due_digests, store, outbox.notifier, engine.watermark)
        except SlackError as exc:
            log.warning("digest_retry", error=str(exc))
            return
        for digest in sent:
            log.info("digest_sent", day=digest.date, channel=digest.channel or "(default)", usd=round(digest.total, 2))

    model_dir = settings.model_path
    engine.set_models(ModelSet.load(model_dir))
    if engine.models:
        log.info("model_loaded", dir=str(model_dir), groups=sorted(engine.models.artifacts))
    else:
        log.info("model_absent", dir=str(model_dir), note="rules only until a model is trained (burnwatch model train)")

    @app.timer(interval=30.0)
    async def reload_models() -> None:
        if not engine.models.changed(model_dir):
            return
        models = await asyncio.get_running_loop().run_in_executor(None, ModelSet.load, model_dir)
        engine.set_models(models)
        log.info("model_loaded", dir=str(model_dir), groups=sorted(models.artifacts))

    if settings.model_retrain_every:
        from detector.model.train import train_from_store
        from detector.units import parse_duration

        since = parse_duration(settings.model_train_since)

        @app.timer(interval=parse_duration(settings.model_retrain_every))
        async def retrain_model() -> None:
            loop = asyncio.get_running_loop()
            try:
                artifacts, _ = await loop.run_in_executor(None, lambda: train_from_store(store, since, watcher.current,
                                                                                         model_dir))  # fmt: skip
            except Exception as exc:  # a failed retrain keeps the model in use
                log.error("model_retrain_failed", error=str(exc))
                return
            log.info("model_retrained", groups=[a.group for a in artifacts], samples=[a.samples for a in artifacts])

    @app.timer(interval=60.0)
    async def expire_state() -> None:
        expired = engine.expire()
        pipeline.forget(expired)
        if expired:
            await asyncio.get_running_loop().run_in_executor(None, store.delete_states, expired)

    @app.timer(interval=10.0)
    async def report() -> None:
        s = pipeline.stats
        log.info(
            "worker_stats", messages=s.messages, events=s.events, dead_letters=s.dead_letters,
            alerts_fired=s.alerts_fired, alerts_resolved=s.alerts_resolved, keys=len(engine),
            slack_pending=len(outbox), slack_delivered=outbox.delivered,
        )  # fmt: skip

    verifier = (
        RequestVerifier(settings.slack_signing_secret.get_secret_value()) if settings.slack_signing_secret else None
    )
    actions = ActionHandler(verifier, store, outbox.notifier, outbox) if verifier is not None else None

    @app.page("/slack/actions")
    class SlackActions(View):
        """Slack's interactivity endpoint: Acknowledge, Snooze 24h, Mark as expected."""

        async def post(self, request: Any, **kwargs: Any) -> Any:
            if actions is None:
                return self.json({"error": "Slack actions are not configured (SLACK_SIGNING_SECRET)"}, status=404)
            body = await request.read()
            headers = dict(request.headers)
            loop = asyncio.get_running_loop()
            status, answer = await loop.run_in_executor(None, actions.handle, body, headers)
            return self.json(answer, status=status)

    def consumer_lag() -> list[tuple[str, int, int]]:
        out = []
        for (topic, partition), next_offset in list(pipeline.positions.items()):
            highwater = app.consumer.highwater(TP(topic, partition))
            if highwater is not None:
                out.append((topic, partition, max(0, highwater - next_offset)))
        return out

    METRICS.stalled_seconds.set_function(pipeline.stalled_for)
    METRICS.watch(lag=consumer_lag,
                  freshness=lambda: time.time() - engine.watermark if engine.watermark else None)  # fmt: skip

    @app.page("/metrics")
    async def metrics(web: Any, request: Any) -> Any:
        """Prometheus text exposition of :mod:`detector.metrics`."""
        return web.bytes(METRICS.render(), content_type="text/plain; version=0.0.4")

    @app.page("/healthz")
    async def healthz(web: Any, request: Any) -> Any:
        s = pipeline.stats
        stalled = pipeline.stalled_for()
        return web.json(
            {
                "status": "stalled" if stalled else "ok",
                "stalled_s": round(stalled, 1),
                "stall_reason": pipeline.stall_reason or None,
                "holding_watermark": {f"{t}/{p}": why for (t, p), why in pipeline.holding.items()},
                "partitions": s.partitions,
                "messages": s.messages,
                "events": s.events,
                "detected": s.detected,
                "held": len(pipeline.aligner),
                "dead_letters": s.dead_letters,
                "detector_errors": engine.errors,
                "alerts_fired": s.alerts_fired,
                "alerts_resolved": s.alerts_resolved,
                "slack_pending": len(outbox),
                "slack_delivered": outbox.delivered,
            },
            status=503 if stalled else 200,
        )

    return app, pipeline


def run_worker(settings: Settings) -> None:
    """Open the store (creating the schema), then run the Faust worker until stopped."""
    asyncio.run(_ensure(settings))
    asyncio.set_event_loop(asyncio.new_event_loop())
    settings.data_dir.mkdir(parents=True, exist_ok=True)  # Faust's data; with a server DSN nothing else makes it
    store = Store.open(settings.dsn, settings.clickhouse_database)
    store.set_event_ttl(settings.event_ttl_days, explicit="event_ttl_days" in settings.model_fields_set)
    try:
        app, _ = build_worker_app(settings, store)
        worker = faust.Worker(
            app,
            loglevel="warn" if settings.log_level == "warning" else settings.log_level,
            logging_config=stdlib_logging_config(settings.log_format, settings.log_level),
        )
        worker.execute_from_commandline()
    finally:
        store.close()


async def _ensure(settings: Settings) -> None:
    from streams.kafka import ensure_topics

    try:
        await ensure_topics(settings.kafka_bootstrap, settings.partitions)
    except KafkaError as exc:
        raise SystemExit(f"cannot reach Kafka at {settings.kafka_bootstrap}: {exc}") from exc
