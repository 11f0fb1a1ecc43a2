"""What the worker does on a schedule, beside the agent: Slack delivery, actions on
incidents, releasing held events on a quiet stream, the stall exit, rules and model
reloads, retraining, the daily digest, state expiry and the stats line. Each is small and reads the shared parts."""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from detector.billing.rates import BilledRates
from detector.detectors.anomaly import Scoring
from detector.digest import send_due_digests
from detector.model import shared
from detector.model.forest import ModelArtifact, ModelSet
from detector.slack import SlackError
from detector.units import one_line, parse_duration
from streams.parts import WorkerParts, fail

if TYPE_CHECKING:
    from detector.store import Store

__all__ = ["install_timers", "load_models"]

log = structlog.get_logger("burnwatch.worker")


def install_timers(parts: WorkerParts) -> None:
    _deliver_alerts(parts)
    _deliver_outputs(parts)
    _act(parts)
    _pipeline_timers(parts)
    _reload_rules(parts)
    _daily_digest(parts)
    _models(parts)
    _bill(parts)
    _housekeeping(parts)
    _watch_kafka_credentials(parts)


KAFKA_CHECK_S = 15.0
"""How often a worker on TLS or SASL checks that the brokers still take the credentials it started with."""
REFUSALS_TO_STOP = 3
"""Checks in a row whose broker refused those credentials before the worker stops: a broker just restarted
may refuse valid SCRAM credentials for a few seconds, until it has loaded them."""


def _watch_kafka_credentials(parts: WorkerParts) -> None:
    """Faust's clients are made once, at start, with the credentials of that moment, and reconnect with them
    for ever: after a rotation (MSK's or Confluent's secret replaced, a client certificate renewed) the worker
    would retry the old password dozens of times a second, consume nothing and report itself healthy (review
    of the TLS/SASL settings). So, on TLS or SASL, every :data:`KAFKA_CHECK_S`: a password file that holds
    another password at two checks in a row stops the worker (exit 70) for its orchestrator to start it again
    with the new one (an empty or unreadable file, as one rewritten in place can be for a moment, says
    nothing), and so do the brokers refusing the credentials it started with at :data:`REFUSALS_TO_STOP`
    checks in a row, each asking a broker picked at random (SASL authentication failed, a certificate not
    trusted; not a broker down, nor a handshake cut short by one restarting), saying why
    (:func:`~streams.kafka.why_refused` with Faust's own client options)."""
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from streams.kafka import why_refused

    settings, app = parts.settings, parts.app
    started = settings.kafka_security
    if started.protocol == "PLAINTEXT":
        return
    options = dict(credentials_to_aiokafka_auth(app.conf.broker_credentials))
    secret = started.password.get_secret_value() if started.password is not None else None
    refusals, changes = 0, 0

    @app.timer(interval=KAFKA_CHECK_S)
    async def watch_kafka_credentials() -> None:
        nonlocal refusals, changes
        try:
            now = await asyncio.get_running_loop().run_in_executor(None, lambda: settings.kafka_security)
        except ValueError as exc:  # the file mid-rotation, unreadable: the brokers' answer below decides
            log.warning("kafka_password_unreadable", error=one_line(exc))
        else:
            read = now.password.get_secret_value() if now.password is not None else None
            changes = changes + 1 if read and read != secret else 0
            if changes >= 2:
                fail("kafka_password_changed", setting="BURNWATCH_KAFKA_SASL_PASSWORD_FILE",
                     note="the clients were made with the password read at start: restart to take up the new one")  # fmt: skip
        refused = await why_refused(settings.kafka_bootstrap, started, options, running=True)
        refusals = refusals + 1 if refused is not None else 0
        if refused is not None and refusals >= REFUSALS_TO_STOP:
            fail("kafka_refused", error=refused,
                 note="the brokers refuse the credentials this worker started with (rotated?): a restart reads "
                      "them again")  # fmt: skip


def _deliver_alerts(parts: WorkerParts) -> None:
    pipeline, outbox = parts.pipeline, parts.outbox

    @parts.app.task
    async def deliver_alerts() -> None:
        """Post queued alert changes to Slack when the pipeline says there are some; a failure
        is retried with backoff (the changes are stored, nothing is lost meanwhile)."""
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


def _deliver_outputs(parts: WorkerParts) -> None:
    pipeline, outputs = parts.pipeline, parts.outputs

    @parts.app.task
    async def deliver_outputs() -> None:
        """Send queued alert changes to the outputs besides Slack when the pipeline hands some
        over, and when a retry or an Alertmanager re-send is due (each output keeps its own
        backoff: :mod:`detector.outputs.outbox`)."""
        if outputs is None:
            return
        loop = asyncio.get_running_loop()
        while True:
            hold = outputs.hold_s
            try:
                await asyncio.wait_for(pipeline.outputs_ready.wait(), timeout=hold if hold > 0 else None)
            except asyncio.TimeoutError:
                pass
            pipeline.outputs_ready.clear()
            try:
                await loop.run_in_executor(None, outputs.deliver_pending)
            except Exception as exc:  # noqa: BLE001 - the store's, while taking a new configuration
                log.warning("output_delivery_error", error=one_line(exc), pending=len(outputs))
                await asyncio.sleep(1.0)
                pipeline.outputs_ready.set()
def _act(parts: WorkerParts, interval_s: float = 5.0) -> None:
    runner = parts.actions

    @parts.app.task
    async def act_on_incidents() -> None:
        """Actions on incidents (:mod:`detector.remediation.runner`): a pass every
        ``interval_s`` of wall time, or at once after an Approve or Decline click; only on the
        worker holding input partition 0. A failing pass (the store) is retried with backoff."""
        if runner is None:
            return

        membership = parts.pipeline.membership

        def holds_partition_0() -> bool:  # asked again under the runner's lock (a revocation may come between)
            # (and not after a freeze past the group's session, until the group is known to hold this worker still)
            return parts.holds_partition_0 and (membership is None or membership.held())

        loop = asyncio.get_running_loop()
        backoff, acting = interval_s, False
        while True:
            try:
                if parts.holds_partition_0:
                    acting = True
                    await loop.run_in_executor(None, runner.run_once, holds_partition_0)
                elif acting:  # partition 0 moved to another worker: it acts from now on
                    acting = False
                    await loop.run_in_executor(None, runner.reset)
                backoff = interval_s
            except Exception as exc:  # noqa: BLE001 - the store's: every step is stored before it is done
                log.warning("actions_retry", error=one_line(exc), retry_in_s=backoff)
                backoff = min(backoff * 2, 300.0)
            waited = 0.0
            while waited < backoff and not runner.wake.is_set():
                await asyncio.sleep(0.2)
                waited += 0.2
            runner.wake.clear()


def _pipeline_timers(parts: WorkerParts) -> None:
    app, pipeline, settings = parts.app, parts.pipeline, parts.settings

    @app.task
    async def release_held() -> None:
        """Every second, and as soon as an assignment's rebalance has ended (:meth:`Pipeline.tick_due`).
        Faust seeks to the committed offsets last in a rebalance, and where a partition's reading
        starts is read from them: a check before that could take an offset that is not yet (or, after
        a commit refused by the rebalance, never) the group's. So a tick waits for the rebalance's
        end, for a second at most, as the timer's tick came before."""
        loop = asyncio.get_running_loop()
        while not app.should_stop:
            await pipeline.tick_due(1.0)
            deadline = loop.time() + 1.0
            while app.rebalancing and not app.should_stop and loop.time() < deadline:
                await asyncio.sleep(0.01)
            if app.should_stop:
                break
            await pipeline.tick()

    @app.timer(interval=5.0)
    async def watch_progress() -> None:
        """A store that has taken no write for ``stall_exit_s`` will not by itself: exit, so the
        orchestrator restarts the worker (and it says why); until then /healthz says stalled."""
        stalled = pipeline.stalled_for()
        if stalled > settings.stall_exit_s:
            fail("store_unavailable", stalled_s=round(stalled, 1), error=pipeline.stall_reason)


def _reload_rules(parts: WorkerParts) -> None:
    config, path = parts.config, str(parts.settings.rules_path)

    @parts.app.timer(interval=5.0)
    async def reload_rules() -> None:
        """An edit of the rule files swaps the configuration snapshot; the pipeline hands it on
        at its next batch. An invalid edit is refused whole, the rules in force stay."""
        new, refused = await asyncio.get_running_loop().run_in_executor(None, config.reload)
        if refused is not None:
            log.error("rules_refused", path=path, errors=[str(e) for e in refused.errors],
                      kept=[r.detector.name for r in config.current.ruleset.rules])  # fmt: skip
        elif new is not None:
            log.info("rules_reloaded", path=path, rules=new.ruleset.names)


def _daily_digest(parts: WorkerParts) -> None:
    store, outbox, engine = parts.store, parts.outbox, parts.engine

    @parts.app.timer(interval=15.0)
    async def daily_digest() -> None:
        """Once the stream's event time has passed a day's end, post that day's digest per channel."""
        if outbox.notifier is None or not parts.holds_partition_0:
            return
        loop = asyncio.get_running_loop()
        try:
            sent = await loop.run_in_executor(None, functools.partial(
                send_due_digests, store.digests, outbox.notifier, engine.watermark, may_post=outbox.may_post))
        except SlackError as exc:
            log.warning("digest_retry", error=str(exc))
            return
        for digest in sent:
            log.info("digest_sent", day=digest.date, channel=digest.channel or "(default)", usd=round(digest.total, 2))


def load_models(parts: WorkerParts) -> None:
    """The anomaly models at start: what the group's retraining worker published is taken into
    the folder first (a new worker scores like the others from its first event), then the files
    that load are used, each refused one is named. They are handed to the anomaly rules (the
    configuration's :class:`Scoring`), not the engine."""
    model_dir = parts.settings.model_path
    _take_published(parts.store, model_dir)
    _use_models(parts.config.scoring, model_dir, *ModelSet.read(model_dir), at_start=True)


def _take_published(store: Store, model_dir: Path) -> bool:
    """What the group's retraining worker published, into ``model_dir`` (:func:`shared.take`),
    said in the log; False: the store did not answer (the reload timer tries again)."""
    try:
        written, refused = shared.take(store.models, model_dir)
    except Exception as exc:  # noqa: BLE001 - the store may be unreachable for a while
        log.warning("model_take_failed", error=one_line(exc), note="scoring with the models in the folder")
        return False
    if refused:
        log.error("model_refused", dir=str(model_dir), errors=refused)
    if written:
        log.info("model_taken", groups=written)
    return True


def _use_models(scoring: Scoring, model_dir: Path, models: ModelSet, refused: list[str], at_start: bool = False) -> None:
    """Score with the artifacts that loaded (every anomaly rule, of this rule set and the next);
    name each refused file. At start, an empty folder is said to mean rules only."""
    if refused:
        log.error("model_refused", dir=str(model_dir), errors=refused)
    scoring.scorer = models
    if models or not at_start:
        log.info("model_loaded", dir=str(model_dir), groups=sorted(models.artifacts))
    else:
        log.info("model_absent", dir=str(model_dir), note="rules only until a model is trained (burnwatch model train)")


def _bill(parts: WorkerParts) -> None:
    app, store, engine = parts.app, parts.store, parts.engine
    seen: list[int] = [-1]

    @app.timer(interval=60.0)
    async def reload_bill() -> None:
        """A bill ingested since (``burnwatch ingest focus``): price and tag from it. Between
        batches, like a rules reload; the bill's rates are read off the event loop."""
        loop = asyncio.get_running_loop()
        rows = await loop.run_in_executor(None, store.query, f"SELECT max(version) AS v FROM {store.db}.billing_ingests")
        newest = int(rows[0]["v"] or 0)
        if newest == seen[0]:
            return
        billed = await loop.run_in_executor(None, BilledRates.from_store, store)
        engine.set_billed(billed if len(billed) else None)
        seen[0] = newest
        if newest:
            log.info("bill_loaded", resources=len(billed))


def _models(parts: WorkerParts) -> None:
    """Model reloads, and retraining shared by the group of workers (:mod:`detector.model.shared`):
    the holder of partition 0 retrains and publishes to the store; every worker takes the
    published artifacts into its model folder and loads what changed there."""
    app, settings, store, scoring = parts.app, parts.settings, parts.store, parts.config.scoring
    model_dir = settings.model_path

    retraining = asyncio.Lock()  # this worker's retrain writes the files one group at a time
    taken: list[tuple[int, int]] = [(0, 0)]
    """The store's newest publication (version, rows) as this worker last took it (or published)."""

    async def load() -> None:
        _use_models(scoring, model_dir, *await asyncio.get_running_loop().run_in_executor(None, ModelSet.read, model_dir))

    async def take_if_published() -> None:
        """What a worker of the group published since: into the folder (the reload loads it). A
        publication is taken once: a refused artifact is named once, not every 30 s."""
        loop = asyncio.get_running_loop()
        try:
            newest = await loop.run_in_executor(None, store.models.newest)
        except Exception as exc:  # noqa: BLE001 - the store may be unreachable for a while: next time
            log.warning("model_take_failed", error=one_line(exc), note="scoring with the models in the folder")
            return
        if newest != taken[0] and await loop.run_in_executor(None, _take_published, store, model_dir):
            taken[0] = newest

    @app.timer(interval=30.0)
    async def reload_models() -> None:
        """Artifacts published by the worker that retrains, then a change of the model files: use
        the artifacts that load; a refused file is named (once per change of the files) and its
        group keeps no model from it. Not while this worker retrains: it would load the groups
        written so far (the retrain loads them all)."""
        if retraining.locked():
            return
        async with retraining:
            await take_if_published()
            in_use = scoring.scorer
            if not isinstance(in_use, ModelSet) or in_use.changed(model_dir):
                await load()

    if not settings.model_retrain_every:
        return
    from detector.model.train import train_from_store

    since, every = parse_duration(settings.model_train_since), parse_duration(settings.model_retrain_every)
    attempted = [0]
    """When this worker last began a retrain (wall clock, ns): a training that made no model
    (too little history yet) is not tried again before the interval has passed."""

    @app.timer(interval=min(60.0, every))
    async def retrain_model() -> None:
        """The holder of partition 0 retrains once nothing was published or tried within the
        interval: the schedule is the store's, so it holds when partition 0 moves."""
        if not parts.holds_partition_0 or retraining.locked():
            return
        loop = asyncio.get_running_loop()
        try:
            published, _ = await loop.run_in_executor(None, store.models.newest)
        except Exception as exc:  # noqa: BLE001 - the store may be unreachable for a while: next time
            log.warning("model_retrain_deferred", error=one_line(exc))
            return
        if not shared.retrain_due(parts.holds_partition_0, max(published, attempted[0]), time.time_ns(), every):
            return
        attempted[0] = time.time_ns()
        ruleset = parts.config.current.ruleset
        async with retraining:
            try:
                artifacts, _ = await loop.run_in_executor(None, lambda: train_from_store(store, since, ruleset, model_dir))
            except Exception as exc:  # the groups saved before the failure are loaded at the next change
                log.error("model_retrain_failed", error=str(exc))
                return
            log.info("model_retrained", groups=[a.group for a in artifacts], samples=[a.samples for a in artifacts])
            if artifacts and parts.holds_partition_0:  # partition 0 may have moved during the training
                await _publish(store, artifacts, taken)
            await load()


async def _publish(store: Store, artifacts: list[ModelArtifact], taken: list[tuple[int, int]]) -> None:
    """Publish a retrain's artifacts for the group's other workers (they keep theirs on failure)."""
    version = time.time_ns()
    loop = asyncio.get_running_loop()
    try:
        published = await loop.run_in_executor(None, shared.publish, store.models, artifacts, version)
        taken[0] = await loop.run_in_executor(None, store.models.newest)
    except Exception as exc:  # noqa: BLE001 - the others keep their models until the next retrain
        log.error("model_publish_failed", error=one_line(exc))
        return
    log.info("model_published", groups=published, version=version)


def _housekeeping(parts: WorkerParts) -> None:
    app, engine, pipeline, outbox = parts.app, parts.engine, parts.pipeline, parts.outbox

    @app.timer(interval=60.0)
    async def expire_state() -> None:
        """State expiry and eviction on the wall clock, for a quiet stream: batches sweep
        each time event time has moved an eighth of the eviction window (:meth:`Pipeline.process`)."""
        await pipeline.sweep()

    @app.timer(interval=10.0)
    async def report() -> None:
        s = pipeline.stats
        log.info(
            "worker_stats", messages=s.messages, events=s.events, dead_letters=s.dead_letters,
            alerts_fired=s.alerts_fired, alerts_resolved=s.alerts_resolved, keys=len(engine),
            slack_pending=parts.slack_pending, slack_delivered=outbox.delivered,
        )  # fmt: skip
