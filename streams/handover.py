"""Partitions moving between workers, and what moves with them: per-resource state, the
alert manager's memory and the Slack posts still to make (docs/reliability.md).

- **revoked**: the write in flight lands and what is done is committed, then the cached
  state and held messages are dropped (unacknowledged: the next holder reads them again),
  and Slack posts still queued are left to the next holder.
- **assigned**: the state of the new partitions and the alerts every worker made are loaded
  from the store, then batches resume. Nothing here asks the broker: the consumer's stop
  waits for this handler, and a stop cancels the consumer thread's calls (the release timer
  asks which new partitions have nothing to read, :meth:`Pipeline.tick`).
- **stopping** (Faust does not call the revocation handler at a stop): the same handover as
  a revocation, before the consumer commits and leaves the group.
"""

from __future__ import annotations

import asyncio
from typing import Any

import faust
import structlog

from detector.events import TOPICS
from detector.store.states import SavedTimes
from streams.parts import WorkerParts
from streams.pipeline import Pipeline

__all__ = ["install_handover"]

log = structlog.get_logger("burnwatch.worker")


def install_handover(parts: WorkerParts) -> None:
    app, store, pipeline, outbox = parts.app, parts.store, parts.pipeline, parts.outbox

    # Faust's signal types say a receiver takes any positional arguments; Faust passes these.
    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
        # State moves with partitions: what this worker holds may now belong to another. The
        # write in flight lands and what is done is committed before the group reassigns.
        await pipeline.pause()  # no batch until the next assignment's state is loaded
        parts.posts_recovered = False
        await _commit(app, pipeline)
        parts.fetches.clear()  # fetched in this generation: read again from the committed offsets
        pipeline.reset()
        parts.assigned_states.clear()
        # Slack posts move with partitions too: after any post in progress, drop what is queued
        # (stored: the next holder recovers it), so no alert is posted by two workers.
        await asyncio.get_running_loop().run_in_executor(None, outbox.revoke)
        if parts.outputs is not None:
            await asyncio.get_running_loop().run_in_executor(None, parts.outputs.revoke)
        await _stop_acting(parts)

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
        partitions = sorted({tp.partition for tp in assigned if tp.topic in TOPICS})
        parts.posts_recovered = False  # (an assignment without a revocation before it: the first)
        loop = asyncio.get_running_loop()
        # Keys saved within the eviction horizon (of the newest save) come with their bytes, held
        # until each speaks; older ones come as names and are read from the store when they speak.
        def load() -> tuple[dict[str, bytes | None], SavedTimes]:
            """Off the event loop: a million keys' rows and their times sorted take seconds."""
            latest: dict[str, float] = {}  # each key's latest event time: the sweeps reclaim those that never speak
            loaded = store.states.load(partitions, parts.settings.evict_after_s or None, latest)
            return loaded, SavedTimes(latest)

        states, saved_times = await loop.run_in_executor(None, load)
        if pipeline.stopping:  # a stop came meanwhile: its hook has handed everything over
            return
        # What another worker alerted on these keys until now is in the store: the alert manager
        # learns it again, so re-read input neither re-opens nor re-closes those alerts.
        pipeline.manager = await loop.run_in_executor(None, parts.alert_manager)
        pipeline.reset()
        # Each holds the watermark until it delivers or the release timer, woken here, finds it
        # has nothing to read: asking the broker here held a stop up until the worker was killed.
        pipeline.expect((tp.topic, tp.partition) for tp in assigned if tp.topic in TOPICS)
        parts.assigned_states.clear()
        parts.assigned_states.update(states)
        pipeline.saved_times = saved_times
        pipeline.stats.partitions = len(partitions)
        parts.holds_partition_0 = 0 in partitions  # one worker of the group posts the digests: partition 0's
        log.info("state_loaded", partitions=partitions, keys=len(states),
                 read_when_they_speak=sum(1 for data in states.values() if data is None))
        if pipeline.stopping:  # a stop came during the assignment: its hook revoked the outbox
            return
        recovered = await loop.run_in_executor(None, outbox.assign, partitions)
        if recovered:
            log.info("outbox_recovered", pending=recovered)
        pipeline.outbox_ready.set()
        if pipeline.stopping:  # a stop came during the recovery: its hook revokes the outputs next, or has
            return  # (taking them now could leave them owned, and delivering, through the shutdown)
        if parts.outputs is not None:
            recovered = await loop.run_in_executor(None, parts.outputs.assign, partitions)
            if recovered:
                log.info("outputs_recovered", pending=recovered)
            pipeline.outputs_ready.set()
        # Refused during a stop (its hook has revoked the outboxes): the posts are the next holder's.
        parts.posts_recovered = pipeline.resume()

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def stopping(sender: Any, **kwargs: Any) -> None:
        """A clean stop hands the partitions over as a revocation does (Faust does not call the
        revocation handler at a stop): the write in flight lands (or, for a store that takes
        none, gives up unacknowledged) and any Slack post in progress finishes, before the
        consumer commits what is acknowledged and leaves the group."""
        pipeline.stop()
        parts.posts_recovered = False
        await pipeline.pause()
        await asyncio.get_running_loop().run_in_executor(None, pipeline.event_writer.close)
        await asyncio.get_running_loop().run_in_executor(None, outbox.revoke)
        if parts.outputs is not None:
            await asyncio.get_running_loop().run_in_executor(None, parts.outputs.revoke)
        await _stop_acting(parts)


async def _commit(app: faust.App, pipeline: Pipeline) -> None:
    """Commit what is acknowledged, unless the worker is stopping: the consumer commits at its
    stop, and its thread, stopping, cancels a commit in progress or never answers a new one
    (the revocation, which its stop waits for, would never end)."""
    if pipeline.stopping:
        return
    try:
        await app.consumer.commit()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if not pipeline.stopping or (task is not None and task.cancelling()):
            raise  # this handler's own cancellation, not the consumer thread's stop


async def _stop_acting(parts: WorkerParts) -> None:
    """Actions on incidents move with partition 0: stop acting, after any pass in progress (its
    steps are stored: the next holder reads them), so no action is taken by two workers."""
    parts.holds_partition_0 = False
    if parts.actions is not None:
        await asyncio.get_running_loop().run_in_executor(None, parts.actions.reset)
