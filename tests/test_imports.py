"""What a process imports to start: the event writer's child (started with every worker) and a
command's parser (built by every ``burnwatch`` command) must not pull in what they never use."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_the_event_writer_child_imports_neither_rules_nor_detectors():
    loaded = _modules_after("import streams.event_writer")
    assert {"detector.store.events", "detector.store.batch"} <= loaded
    assert not loaded & {"detector.rules", "detector.detectors", "detector.alerts", "detector.store.facade"}


def test_building_the_parser_connects_to_nothing():
    """``burnwatch backtest FILE`` reads a file: clickhouse-connect and the store's repositories
    (once behind the incidents' and the reports' help) are imported by the commands that
    connect, when they connect."""
    loaded = _modules_after("from streams.cli import build_parser\nbuild_parser().parse_args(['backtest', 'fleet.jsonl'])")
    assert {"streams.cli", "detector.incidents", "detector.reports"} <= loaded
    assert not loaded & {"clickhouse_connect", "detector.store.facade", "detector.alerts"}


def test_the_store_package_gives_every_name_it_lists():
    import detector.store as store

    assert {name: getattr(store, name).__name__ for name in ("Store", "EventBatch", "connect", "epoch")} == {
        "Store": "Store", "EventBatch": "EventBatch", "connect": "connect", "epoch": "epoch"}  # fmt: skip
    for name in store.__all__:
        assert getattr(store, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        store.Nope  # noqa: B018


def test_building_a_workers_executors_imports_no_cloud_client():
    """Every worker builds its action executors at start; their clients (the Kubernetes client:
    ~0.7 CPU s of imports, ~3.6 s with ``kubernetes-validate`` beside it; boto3 ~0.5 s) are imported
    at the first call that needs them, which most workers never make."""
    loaded = _modules_after("from detector.remediation.executors import executors\nexecutors()")
    assert {"detector.remediation.kubeflow", "detector.remediation.kubernetes", "detector.remediation.ec2"} <= loaded
    assert not loaded & {"kubernetes", "boto3", "botocore"}


@pytest.mark.parametrize("process", ["store", "event writer child"])
def test_a_process_that_inserts_does_not_import_pandas(tmp_path, process: str):
    """clickhouse-connect imports pandas at a process's first insert to ask whether the rows are a DataFrame
    (0.3-0.6 CPU s and 40-70 MB in the worker and its event writer's child); burnwatch never
    inserts one, and its inserts go on without pandas. The child encodes the rows it sends the worker."""
    code = {"store": f"from detector.store import Store\nstore = Store.open('chdb://{tmp_path}/clickhouse')\n"
                     "assert store.count('schema_migrations') > 0  # migrated: its inserts ran",
            "event writer child": "from streams.event_writer import RelayClient\nfrom detector.store.events import native\n"
                                  "context = RelayClient(None).create_insert_context('t', ['a'], column_type_names=['UInt32'])\n"
                                  "context.data = [[1]]\nassert native(context)"}[process]  # fmt: skip
    loaded = _modules_after(code)
    assert "clickhouse_connect.driver.insert" in loaded
    assert "pandas" not in loaded


def test_nothing_asks_clickhouse_connect_for_a_dataframe():
    """``detector.store.connection.no_dataframes`` tells clickhouse-connect no process of burnwatch's holds
    a pandas DataFrame, for the process's life: its DataFrame calls would then refuse (its Arrow calls,
    which the FOCUS bill's ingest makes, need no pandas)."""
    calls = re.compile(r"\.(query_df|query_df_stream|query_df_arrow|insert_df|insert_df_arrow)\(")
    found = [f"{path.relative_to(ROOT)}:{n}" for package in ("detector", "streams", "bench")
             for path in sorted((ROOT / package).rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if calls.search(line)]  # fmt: skip
    assert not found
