from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

from detector.rules import RuleSet, load_rules

settings.register_profile("burnwatch", deadline=None)
settings.load_profile("burnwatch")
"""Tests never assert on timings, Hypothesis's neither: its 200 ms deadline per example failed a
pure aligner property under a loaded CI machine (445 ms once, 0.19 ms on the rerun)."""

ROOT = Path(__file__).resolve().parent.parent
DATASET = ROOT.parent / "shared" / "datasets" / "ms-cloud-monitoring" / "data"
"""Microsoft's Cloud Monitoring Dataset, read-only beside the checkout (``../shared/datasets``)."""
needs_dataset = pytest.mark.skipif(not DATASET.is_dir(), reason="the Cloud Monitoring Dataset is not in ../shared/datasets")
"""For a test of the real data: a checkout without it (a clone elsewhere) skips, saying why."""


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


def fresh_store(client, request, prefix: str = "t_"):
    """A fresh database named after the test (and ``prefix``) on ``client``, with the schema applied:
    dropped if it was there, then made as a copy of a database the migrations made once for the
    client (``tests.store_template``: the copy equals a migrated database, and ``migrate()`` on it
    applies nothing)."""
    from tests.store_template import migrated_copy

    name = prefix + "".join(c if c.isalnum() else "_" for c in request.node.name)[:60]
    return migrated_copy(client, name)


@pytest.fixture
def store(chdb_client, request):
    """A fresh database per test on the session's embedded engine, with the schema applied."""
    return fresh_store(chdb_client, request)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``burnwatch store serve`` in its own process, as an operator runs it: the one store several
    processes share here (``streams.storeserver``)."""
    from streams.process import StoreServerProcess

    directory = tmp_path_factory.mktemp("store")
    proc = StoreServerProcess(f"chdb://{directory / 'ch'}", directory / "server.log").wait_ready()
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log()  # SIGTERM: a clean stop, the engine closed


@pytest.fixture
def remote(server, request):
    """A fresh database on the server, through the HTTP client, with the schema applied."""
    from detector.store import connect

    store = fresh_store(connect(server.url), request)
    yield store
    store.close()
