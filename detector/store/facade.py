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
from detector.store.rule_sets import RuleSets
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
        self.rule_sets = RuleSets(self)
        """The rules each worker loaded, newest last: a rule removed, or not yet loaded everywhere."""

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

    @classmethod
    def open_expiring(cls, dsn: str, database: str, event_ttl_days: int, explicit: bool) -> tuple[Store, int]:
        """:meth:`open` with ``create``, for a command that may make the store (the worker, ``ingest focus``),
        and the days of event time its raw events are kept (0: forever): a store made here gets
        ``event_ttl_days``, the default included; one that exists keeps its own unless ``explicit``
        (:meth:`~detector.store.schema.Schema.set_event_ttl`). A store ``ingest focus`` made first had kept its
        events forever."""
        store = cls.open(dsn, database)
        try:
            return store, store.schema.set_event_ttl(event_ttl_days, explicit=explicit)
        except BaseException:
            store.close()
            raise

    def migrate(self) -> list[str]:
        """Apply the migrations not applied yet (:meth:`Schema.migrate`); returns their names."""
        return self.schema.migrate()
