"""The ClickHouse store, as small repositories on one connection.

- :mod:`~detector.store.connection`: the client, the database's name, the lock, ad hoc and
  named queries (``sql/*.sql``: the reports', the charts' and the digest's), the probes that
  tell a store that takes no write from rows it refuses;
- :mod:`~detector.store.schema`: migrations (``detector/migrations``) and the events' expiry;
- :mod:`~detector.store.batch` and :mod:`~detector.store.events`: events buffered as columns,
  inserted in batches, each event once (by its content's id);
- :mod:`~detector.store.history`: stored events read back (backtest, training, a resource
  another worker holds);
- :mod:`~detector.store.states`: detector state per key;
- :mod:`~detector.store.alerts`: alert changes, the latest state of each;
- :mod:`~detector.store.memory`: what the alert manager remembers after a restart;
- :mod:`~detector.store.actions`: clicks on an alert's buttons, and snoozes;
- :mod:`~detector.store.digests`: daily digests sent, and a day's ledger rows;
- :mod:`~detector.store.deliveries`: Slack posts made and begun (the outbox's record);
- :mod:`~detector.store.outputs`: deliveries to the other outputs (webhook, Alertmanager, email);
- :mod:`~detector.store.remediation`: actions on incidents, every step (the audit);
- :mod:`~detector.store.progress`: how far each worker has stored the partitions it holds.

:class:`~detector.store.facade.Store` opens all of them at once.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from detector.store.actions import Actions
    from detector.store.alerts import Alerts, alert_from_row
    from detector.store.batch import EventBatch, event_ids
    from detector.store.connection import Connection, StoreBusy, StoreNotFound, StoreOutdated, chdb_dir, connect, named_sql
    from detector.store.deliveries import Deliveries
    from detector.store.digests import Digests
    from detector.store.events import Events
    from detector.store.facade import Store
    from detector.store.history import EventHistory
    from detector.store.memory import ManagerMemory
    from detector.store.progress import PartitionProgress
    from detector.store.remediation import ActionStep, Remediations
    from detector.store.schema import MIGRATIONS_DIR, RAW_TABLES, Migration, Schema, migrations
    from detector.store.states import States
    from detector.units import epoch

_HOME = {
    "Actions": ".actions", "Alerts": ".alerts", "alert_from_row": ".alerts", "EventBatch": ".batch", "event_ids": ".batch",
    "Connection": ".connection", "StoreBusy": ".connection", "StoreNotFound": ".connection", "StoreOutdated": ".connection",
    "chdb_dir": ".connection", "connect": ".connection", "named_sql": ".connection", "Deliveries": ".deliveries",
    "Digests": ".digests", "Events": ".events", "Store": ".facade", "EventHistory": ".history", "ManagerMemory": ".memory",
    "PartitionProgress": ".progress",
    "ActionStep": ".remediation", "Remediations": ".remediation", "MIGRATIONS_DIR": ".schema", "RAW_TABLES": ".schema",
    "Migration": ".schema", "Schema": ".schema", "migrations": ".schema", "States": ".states", "epoch": "detector.units",
}  # fmt: skip
"""Where each name lives. Imported on first use (PEP 562), not with the package: a process that
needs one repository (the event writer's child: the connection, the batch, the events) does not
pay for the others' imports (the alerts', the rules', the detectors': half a second a start)."""


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'detector.store' has no attribute {name!r}")
    value = getattr(import_module(_HOME[name], __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "MIGRATIONS_DIR", "RAW_TABLES", "ActionStep", "Actions", "Alerts", "Connection", "Deliveries", "Digests", "EventBatch",
    "EventHistory", "Events", "ManagerMemory", "Migration", "PartitionProgress", "Remediations", "Schema", "States", "Store",
    "StoreBusy",
    "StoreNotFound", "StoreOutdated", "alert_from_row", "chdb_dir", "connect", "epoch", "event_ids", "migrations", "named_sql",
]  # fmt: skip
