from __future__ import annotations

from pathlib import Path

import pytest

from detector.rules import RuleSet, load_rules

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def slack():
    """A local Slack server (``detector.testing.LocalSlack``) that slack-sdk posts to, refusing
    what Slack refuses; its ``calls`` are what a channel received."""
    from detector.testing import LocalSlack

    with LocalSlack() as server:
        yield server


@pytest.fixture(scope="session")
def ruleset() -> RuleSet:
    """The rules and prices shipped in rules/ (what a user starts with)."""
    return load_rules(ROOT / "rules")


@pytest.fixture(scope="session")
def chdb_client():
    """One embedded ClickHouse engine for the session (chdb allows one per process)."""
    from detector.store import connect

    client = connect("chdb://memory")
    yield client
    client.close()


@pytest.fixture
def store(chdb_client, request):
    """A fresh database per test on the session's embedded engine, with the schema applied."""
    from detector.store import Store

    name = "t_" + "".join(c if c.isalnum() else "_" for c in request.node.name)[:60]
    chdb_client.command(f"DROP DATABASE IF EXISTS {name}")
    s = Store(chdb_client, database=name)
    s.migrate()
    return s
