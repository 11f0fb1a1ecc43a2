"""The worker, wired: the parts (store, engine, outbox, pipeline, configuration) are made
here once and handed to the topology, the partition handover, the timers and the web views.

Thin on purpose: the work is in :mod:`streams.pipeline` and :mod:`detector`.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import faust

from detector.billing.rates import BilledRates
from detector.charts import ChartWorker
from detector.delivery import Outbox
from detector.engine import Engine
from detector.logs import stdlib_logging_config
from detector.outputs.config import SLACK
from detector.outputs.outbox import OutputOutbox
from detector.remediation.executors import executors
from detector.remediation.runner import ActionRunner
from detector.settings import Settings
from detector.slack import SlackNotifier
from detector.store import EventHistory, Store
from streams.bulk import BulkConsumer, BulkTransport
from streams.config import LiveConfig
from streams.event_writer import writer_for
from streams.handover import install_handover
from streams.parts import WorkerParts, remembering_manager
from streams.pipeline import Pipeline
from streams.timers import install_timers, load_models
from streams.topology import caught_up, dead_letter_sender, end_positions, flow_control, install_agent, make_app
from streams.web import install_views, serve_only_burnwatch

__all__ = ["build_worker_app"]


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

    def __init__(self, history: EventHistory, keep_s: float = 300.0) -> None:
        self.history = history
        self.keep_s = keep_s
        self._known: dict[str, tuple[float, Any]] = {}

    def __call__(self, resource_id: str, at: float) -> Any:
        found = self._known.get(resource_id)
        if found is not None and 0 <= at - found[0] < self.keep_s:
            return found[1]
        info = self.history.resource_info(resource_id, at)
        if info is not None:  # not known yet: asked again at the next run event
            if len(self._known) > 100_000:
                self._known.clear()
            self._known[resource_id] = (at, info)
        return info


def build_worker_app(settings: Settings, store: Store, event_expiry_days: int = 0) -> tuple[faust.App, Pipeline]:
    """Build the Faust app around an open store; rules are loaded (and validated) here.
    The parts are wired in one place: the topology (:mod:`streams.topology`), the partition
    handover (:mod:`streams.handover`), the timers (:mod:`streams.timers`) and the web views
    (:mod:`streams.web`) each read what they need from :class:`WorkerParts`. ``event_expiry_days``: the
    store's expiry of raw events in force, as setting it at start returned (0: kept forever)."""
    config = LiveConfig.load(settings.rules_path)
    app = make_app(settings)
    membership = cast(BulkTransport, app.transport).membership  # renewed by the consumer's heartbeats
    serve_only_burnwatch(app)  # /healthz, /metrics, /slack/actions; not Faust's own views
    # Per-resource state lives in ClickHouse beside the events it was built from, written
    # in the same step before offsets are acked, and loaded when partitions are assigned.
    assigned_states: dict[str, bytes | None] = {}
    billed = BilledRates.from_store(store)  # the stored bill's rates and tags (streams.timers reloads them)
    engine = Engine(config.current.ruleset, loader=lambda key: store.states.take(assigned_states, key),
                    billed=billed if len(billed) else None, evict_after_s=settings.evict_after_s or None,
                    fetch=store.states.get)  # fmt: skip
    engine.directory = HostDirectory(store.history)  # a run's hosts held by another worker
    outbox = Outbox(store, _notifier(settings), group_wait_s=settings.slack_group_wait_s,
                    forget_after_s=settings.delivery_memory_s)  # fmt: skip
    outbox.wants = lambda alert: SLACK in config.current.routing.outputs_for(alert.tags, alert.severity)
    # Webhook, Alertmanager, email (docs/outputs.md).
    outputs = OutputOutbox(store, config.current.routing, forget_after_s=settings.delivery_memory_s)
    if outbox.notifier is not None and outbox.notifier.threads and settings.slack_charts:
        outbox.on_opened = ChartWorker(store, outbox.notifier).start().submit
    pipeline = Pipeline(
        engine=engine,
        store=store,
        outbox=outbox,
        manager=remembering_manager(store, config.current.ruleset),
        send_dead_letter=dead_letter_sender(app, settings),
        caught_up=caught_up(app),
        end_positions=end_positions(app),
        saved_states=assigned_states,
        config=config,
        generation=lambda: app.consumer_generation_id,
        flow=flow_control(app),
        max_held_per_partition=settings.max_held_per_partition,
        outputs=outputs,
        event_writer=writer_for(store, settings.dsn, settings.clickhouse_database, settings.event_writer),
        partition_count=lambda topic: cast(BulkConsumer, app.consumer).partition_count(topic) or settings.partitions,
        membership=membership,
        event_expiry_days=event_expiry_days,
    )
    if membership is not None:  # a worker frozen past the session posts nothing until the group holds it still
        outbox.may_post = outputs.may_post = membership.held
    actions = ActionRunner(store, executors(settings), lambda: config.current.ruleset, outbox.notifier)
    parts = WorkerParts(settings=settings, store=store, app=app, config=config, engine=engine, outbox=outbox,
                        pipeline=pipeline, assigned_states=assigned_states, outputs=outputs,
                        actions=actions)  # fmt: skip
    pipeline.configure()  # the rules' Slack routing, before anything is posted
    install_agent(parts)
    install_handover(parts)
    install_timers(parts)
    install_views(parts)
    load_models(parts)
    return app, pipeline


def run_worker(settings: Settings) -> None:
    """Open the store (creating the schema), then run the Faust worker until stopped. Its topics exist:
    ``burnwatch worker`` made them first (:func:`streams.kafka.ensure_worker_topics`), saying why a
    broker that refused is refusing."""
    asyncio.set_event_loop(asyncio.new_event_loop())
    settings.data_dir.mkdir(parents=True, exist_ok=True)  # Faust's data; with a server DSN nothing else makes it
    store, expiry_days = Store.open_expiring(settings.dsn, settings.clickhouse_database, settings.event_ttl_days,
                                             settings.event_ttl_set)  # fmt: skip
    try:
        app, _ = build_worker_app(settings, store, expiry_days)
        worker = faust.Worker(
            app,
            loglevel="warn" if settings.log_level == "warning" else settings.log_level,
            logging_config=stdlib_logging_config(settings.log_format, settings.log_level),
        )
        worker.execute_from_commandline()
    finally:
        store.close()
