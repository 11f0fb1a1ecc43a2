"""What the worker's topology, timers and web views share, built once by
:func:`streams.app.build_worker_app`, and the one way the worker gives up."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any, NoReturn, cast

import faust
import structlog

from detector.alerts import AlertManager, AlertMemory
from detector.delivery import Outbox
from detector.engine import Engine
from detector.outputs.outbox import OutputOutbox
from detector.remediation.runner import ActionRunner
from detector.rules import RuleSet
from detector.settings import Settings
from detector.store import Store
from streams.bulk import BulkTransport, Fetches
from streams.config import LiveConfig
from streams.pipeline import Pipeline

__all__ = ["EXIT_FAILED", "WorkerParts", "fail", "remembering_manager"]

log = structlog.get_logger("burnwatch.worker")

EXIT_FAILED = 70
"""The worker's exit status when it cannot make progress (EX_SOFTWARE): restart it."""


@dataclass
class WorkerParts:
    settings: Settings
    store: Store
    app: faust.App
    config: LiveConfig
    engine: Engine
    outbox: Outbox
    pipeline: Pipeline
    outputs: OutputOutbox | None = None
    """The outputs besides Slack (None: routing.yaml defines none at start)."""
    assigned_states: dict[str, bytes | None] = field(default_factory=dict)
    """Per-resource state of the assigned partitions, as loaded from the store; the engine
    takes a key's state from here the first time it sees the key (None: saved long ago, read
    from the store then)."""
    holds_partition_0: bool = False
    """This worker holds input partition 0, so it posts the daily digests and carries out
    actions on incidents (one worker of the group)."""
    actions: ActionRunner | None = None
    """Actions on incidents (docs/actions.md): proposed, decided and carried out on the wall clock."""
    posts_recovered: bool = False
    """The outboxes (Slack's and the other outputs') have taken the partitions held now, with the
    posts their previous holder left undelivered in the store. Until then how many posts wait is
    not known: ``/healthz`` says so (null) rather than 0."""

    @property
    def slack_pending(self) -> int | None:
        """Slack posts waiting (None until :attr:`posts_recovered`: not known yet, not 0)."""
        return len(self.outbox) if self.posts_recovered else None

    @property
    def outputs_pending(self) -> int | None:
        """The other outputs' messages waiting (None until :attr:`posts_recovered`)."""
        if not self.posts_recovered:
            return None
        return len(self.outputs) if self.outputs is not None else 0

    @property
    def fetches(self) -> Fetches:
        """The input topics' fetches on their way to the detect agent (:mod:`streams.bulk`)."""
        return cast(Fetches, cast(BulkTransport, self.app.transport).fetches)

    def alert_manager(self) -> AlertManager:
        """Blocking (queries): :func:`remembering_manager` under the rules in force."""
        return remembering_manager(self.store, self.config.current.ruleset)


def remembering_manager(store: Store, ruleset: RuleSet) -> AlertManager:
    """An alert manager that remembers what the store says was alerted (from any worker), so
    re-read input neither re-opens nor re-closes those alerts. Blocking: run it in an executor
    on the event loop."""
    return AlertManager(AlertMemory.load(store.memory), ruleset=ruleset)


def fail(reason: str, **details: Any) -> NoReturn:
    """The pipeline cannot make progress: exit non-zero so that an orchestrator restarts the
    worker. Nothing unfinished was acknowledged, so a restart reads it again."""
    log.critical("worker_failed", reason=reason, **details)
    logging.shutdown()
    sys.stderr.flush()
    os._exit(EXIT_FAILED)
