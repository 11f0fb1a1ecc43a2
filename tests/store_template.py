"""Freshly migrated databases for the tests, made cheaply: the migrations run once per ClickHouse
client, into a template database, and every later database is a copy of the template's final
DDL. Running the migrations (~100 statements) cost a test about a CPU second on the embedded
engine; the copy, one statement per table or view, a fifth of that. tests/test_store_template.py
checks that a copy equals a migrated database: its tables, columns, views and what they compute."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from detector.store import Store
from detector.store import schema as schema_module

__all__ = ["Template", "migrated_copy", "template"]

_VIEWS = ("View", "MaterializedView", "LiveView", "WindowView")


@dataclass(frozen=True)
class Template:
    """A database migrated once on a client, and how to copy it."""

    database: str
    tables: list[str]
    """The ``CREATE`` of each plain table, as ``system.tables`` has it (names qualified with ``database``)."""
    views: list[str]
    """The ``CREATE`` of each view and materialized view, in the order the migrations last made them
    (a view reads what was there before it)."""
    seeded: list[str]
    """Tables besides ``schema_migrations`` that the migrations put rows in."""

    def statements(self, name: str) -> list[str]:
        """The template's DDL, tables then views, made in database ``name``: only references
        qualified with the template's database change (``db.table``, ``TO db.table``, ``FROM db.table``)."""
        qualified = re.compile(rf"(?<![\w`]){re.escape(self.database)}\.|`{re.escape(self.database)}`\.")
        made = []
        for ddl in self.tables + self.views:
            statement = qualified.sub(f"{name}.", ddl)
            assert self.database not in statement, statement
            made.append(statement)
        return made


def _migrations() -> tuple[str, list[schema_module.Migration]]:
    """The template's name for the migrations now (a test that replaces them gets its own) and them."""
    found = schema_module.migrations()
    digest = hashlib.sha256(" ".join(f"{m.version}:{m.checksum}" for m in found).encode()).hexdigest()[:12]
    return f"t_template_{digest}", found


def _read(client: Any, database: str, found: list[schema_module.Migration]) -> Template:
    """The template's objects and rows, from ``system.tables``."""
    made: dict[str, int] = {}
    for position, migration in enumerate(found):
        for name in schema_module._MADE.findall(migration.sql):
            made.pop(name, None)  # the last time a migration makes it (a view dropped and made again)
            made[name] = position
    rows = client.query("SELECT name, engine, create_table_query, total_rows FROM system.tables "
                        "WHERE database = %(db)s", parameters={"db": database}).result_rows  # fmt: skip
    objects = {name: (engine, ddl, total) for name, engine, ddl, total in rows}
    missing = [name for name in made if name not in objects]
    assert not missing, f"the template {database} lacks {missing}"
    in_order = list(made) + sorted(name for name in objects if name not in made)
    tables = [objects[name][1] for name in in_order if objects[name][0] not in _VIEWS]
    views = [objects[name][1] for name in in_order if objects[name][0] in _VIEWS]
    seeded = [name for name in in_order
              if objects[name][0] not in _VIEWS and name != "schema_migrations" and objects[name][2]]  # fmt: skip
    return Template(database, tables, views, seeded)


def template(client: Any) -> Template:
    """The template for ``client``'s engine, migrated the first time (cached on the client; a new
    client of the same server, as ``remote`` makes each test, finds the database there)."""
    name, found = _migrations()
    cache: dict[str, Template] | None = getattr(client, "_burnwatch_templates", None)
    if cache is None:
        cache = {}
        client._burnwatch_templates = cache
    if name not in cache:
        done = int(client.command(f"EXISTS TABLE {name}.schema_migrations")) and int(
            client.command(f"SELECT uniqExact(version) FROM {name}.schema_migrations")) == len(found)  # fmt: skip
        if not done:
            client.command(f"DROP DATABASE IF EXISTS {name}")
            Store(client, database=name).migrate()
        cache[name] = _read(client, name, found)
    return cache[name]


def migrated_copy(client: Any, name: str) -> Store:
    """Database ``name`` on ``client``, dropped if it was there, made as the migrations make it:
    the template's tables, the rows the migrations wrote (``schema_migrations``: applied now, as
    :meth:`Schema.migrate` records them), then its views; the store in the state
    :meth:`Store.migrate` leaves it in (``schema.created``: it made the tables)."""
    client.command(f"DROP DATABASE IF EXISTS {name}")
    made = template(client)
    client.command(f"CREATE DATABASE {name}")
    statements = made.statements(name)
    for statement in statements[: len(made.tables)]:
        client.command(statement)
    # Rows before the views: a materialized view's target is copied, not fed again from its source.
    client.command(f"INSERT INTO {name}.schema_migrations (version, name, checksum) "
                   f"SELECT version, name, checksum FROM {made.database}.schema_migrations")  # fmt: skip
    for table in made.seeded:
        client.command(f"INSERT INTO {name}.{table} SELECT * FROM {made.database}.{table}")
    for statement in statements[len(made.tables):]:
        client.command(statement)
    store = Store(client, database=name)
    store.schema.created = True
    return store
