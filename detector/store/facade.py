"""The store opened as one thing: the connection with each repository on it."""

from __future__ import annotations

from typing import Any

from detector.store.actions import Actions
from detector.store.alerts import Alerts
from detector.store.connection import Connection, connect
from detector.store.deliveries import Deliveries
from detector.store.digests import Digests
from detector.store.events import Events
from detector.store.handovers import PartitionHandovers
from detector.store.history import EventHistory
from detector.store.memory import ManagerMemory
from detector.store.models import ModelArtifacts
from detector.store.outputs import OutputDeliveries
from detector.store.progress import PartitionProgress
from detector.store.remediation import Remediations
from detector.store.schema import Schema
from detector.store.states import States

__all__ = ["Store"]


class Store(Connection):
    """burnwatch's tables in one ClickHouse database: the :class:`Connection` (ad hoc
    queries, the write probes) with one repository per concern, sharing its client and lock.
    Code that needs one concern takes that repository (``store.states``, ``store.digests``…),
    not the whole store."""

    def __init__(self, client: Any, database: str = "burnwatch") -> None:
        super().__init__(client, database)
        self.schema = Schema(self)
        self.events = Events(self)
        """Event batches written, leaving out what is stored already."""
        self.history = EventHistory(self)
        """Stored events read back."""
        self.states = States(self)
        self.alerts = Alerts(self)
        self.memory = ManagerMemory(self)
        """The alert manager's memory after a restart."""
        self.actions = Actions(self)
        """Clicks and snoozes."""
        self.digests = Digests(self)
        self.deliveries = Deliveries(self)
        self.remediations = Remediations(self)
        """Actions on incidents: the audit (docs/actions.md)."""
        self.outputs = OutputDeliveries(self)
        """Deliveries to outputs besides Slack."""
        self.models = ModelArtifacts(self)
        """The anomaly model's artifacts, as the worker that retrains publishes them."""
        self.progress = PartitionProgress(self)
        """How far each worker has stored the partitions it holds (several workers)."""
        self.handovers = PartitionHandovers(self)
        """Partitions a worker is giving up, until its last write has landed (several workers)."""

    @classmethod
    def open(cls, dsn: str, database: str = "burnwatch", *, create: bool = True) -> Store:
        """The store at ``dsn``. ``create``: make it, or migrate it, as needed (the worker,
        ``db migrate``); otherwise it must exist with its schema up to date (the commands
        that only read: a mistyped path or database is
        :class:`~detector.store.connection.StoreNotFound`, not a new empty store)."""
        store = cls(connect(dsn, create=create), database)
        try:
            if create:
                store.migrate()
            else:
                store.schema.check()
        except BaseException:
            store.close()
            raise
        return store

    def migrate(self) -> list[str]:
        """Apply the migrations not applied yet (:meth:`Schema.migrate`); returns their names."""
        return self.schema.migrate()
