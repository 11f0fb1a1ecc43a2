"""Named reports over a store filled the way the worker fills it: a simulated fleet's
messages through the real pipeline (decoder, aligner, engine, alert manager, store), then
each report checked against the alerts, the labels or the raw events."""

from __future__ import annotations

import subprocess
import sys
import time

import msgspec
import pytest

from detector.actions import Click
from detector.reports import REPORTS, format_rows, run_report
from detector.simulate import SimConfig
from detector.store import Store
from tests.helpers import fleet_file, store_fleet

ALL = 40 * 86_400.0  # longer than the fleet: every report covers all of it


@pytest.fixture(scope="module")
def filled(tmp_path_factory, chdb_client, ruleset):
    """A 30-hour fleet stored by the pipeline (about 10 s)."""
    cfg = SimConfig(hours=30, training_hosts=10, notebooks=6, seed=11)
    path, labels = fleet_file(tmp_path_factory.mktemp("fleet") / "fleet.jsonl", cfg, ruleset.pricing)
    chdb_client.command("DROP DATABASE IF EXISTS t_reports")
    store = Store(chdb_client, "t_reports")
    store.migrate()
    store_fleet(store, ruleset, path)
    return store, labels


def alerts_of(store, rule_type):
    return [a for a in store.alerts.latest() if a["type"] == rule_type and not a["silenced"]]


def test_waste_per_day_adds_up_to_the_alerts_dollars(filled):
    """Idle GPUs come first in the ledger: the report has all their dollars. Later categories
    have what the bill left them (a failed run that hung first is stuck, not failed, dollars;
    a run alerted alone and in a crash loop counts once), never more than their alerts say."""
    store, _ = filled
    rows = run_report(store, "waste", ALL)
    by_type: dict[str, float] = {}
    for r in rows:
        by_type[r["type"]] = by_type.get(r["type"], 0.0) + r["usd"]
    idle = sum(a["waste_usd"] for a in alerts_of(store, "idle_gpu"))
    assert idle > 0 and by_type["idle_gpu"] == pytest.approx(idle, abs=0.01 * len(rows))
    for rule_type in ("failed_run_spend", "egress_runaway"):
        alerted = sum(a["waste_usd"] for a in alerts_of(store, rule_type))
        assert 0.5 * alerted < by_type[rule_type] <= alerted + 0.01 * len(rows)
    assert len({r["day"] for r in rows}) == 2  # the 30 hours span two days


def test_idle_gpu_hours_cover_every_idle_episode(filled):
    store, labels = filled
    rows = {r["resource_id"]: r for r in run_report(store, "idle-gpus", ALL)}
    idle = [label for label in labels if label.type == "idle_gpu"]
    assert idle
    for label in idle:
        # every GPU of the host idle for the labelled span (one GPU at least)
        assert rows[label.resource_id]["idle_gpu_hours"] >= 0.9 * (label.end - label.start) / 3600
    assert all(0 <= r["idle_pct"] <= 100 and r["idle_usd"] >= 0 for r in rows.values())
    assert list(rows.values()) == sorted(rows.values(), key=lambda r: -r["idle_gpu_hours"])


def test_failed_run_spend_by_project_and_error(filled):
    store, _ = filled
    rows = run_report(store, "failed-runs", ALL)
    failures = [a for a in alerts_of(store, "failed_run_spend") if not a["details"].startswith('{"crash_loop"')]
    assert rows and sum(r["failures"] for r in rows) == len(failures)
    assert sum(r["usd"] for r in rows) == pytest.approx(sum(a["waste_usd"] for a in failures), abs=0.01 * len(rows))


def test_untagged_spend_by_account(filled):
    store, _ = filled
    rows = run_report(store, "untagged", ALL)
    flagged = {a["account"] for a in alerts_of(store, "untagged")}
    assert flagged and flagged <= {r["account"] for r in rows}
    assert all(r["usd"] > 0 and r["resources"] >= 1 for r in rows)


def test_egress_by_destination_matches_the_raw_events(filled):
    store, _ = filled
    rows = run_report(store, "egress", ALL)
    (raw,) = store.query(f"SELECT sum(egress_bytes) / 1e9 AS gb, sum(egress_usd) AS usd FROM {store.db}.resource_usage")
    assert sum(r["gb"] for r in rows) == pytest.approx(raw["gb"], abs=0.1 * len(rows))
    assert sum(r["usd"] for r in rows) == pytest.approx(raw["usd"], abs=0.01 * len(rows))
    runaways = {a["resource_id"] for a in alerts_of(store, "egress_runaway")}
    assert runaways & {r["top_resource"] for r in rows}


def test_vector_db_fill_and_forecast(filled):
    store, _ = filled
    rows = {r["resource_id"]: r for r in run_report(store, "vector-db", ALL)}
    assert rows and all(0 < r["fill_pct"] <= 100 for r in rows.values())
    firing = {a["resource_id"] for a in alerts_of(store, "vector_db_growth") if a["status"] == "firing"}
    for rid in firing:
        assert rows[rid]["forecast_full"]
    for rid in set(rows) - firing:  # no forecast: none shown, not a growth of 0 GB a day
        assert (rows[rid]["forecast_full"], rows[rid]["growth_gb_per_day"], rows[rid]["next_tier"]) == (None, None, None)
    assert set(rows) - firing, "the fleet should have a database with no growth alert firing"


def test_incidents_time_to_acknowledge_and_resolve_and_precision_by_rule(filled):
    store, _ = filled
    idle = alerts_of(store, "idle_gpu")
    acked, expected = idle[0], idle[1]
    posted = time.time()
    store.deliveries.record(acked["alert_id"], "fired", "#ml-cost", "1.0")
    store.actions.record(Click("acknowledged", acked["alert_id"], "U1", "alice", "#ml-cost", "1.0"), posted + 300)
    store.actions.record(Click("expected", expected["alert_id"], "U2", "bob", "#ml-cost", "2.0"), posted + 60)
    # Slack refused this opening (recorded so), acknowledged on the incidents page: no post to count from
    refused = idle[2]
    store.deliveries.record(refused["alert_id"], "fired", "", "refused")
    store.actions.record(Click("acknowledged", refused["alert_id"], "U1", "alice", "", ""), posted + 120)
    incidents = {r["alert_id"]: r for r in run_report(store, "incidents", ALL)}
    assert incidents[refused["alert_id"]]["minutes_to_ack"] is None
    assert len(incidents) == len([a for a in store.alerts.latest() if not a["silenced"]])
    row = incidents[acked["alert_id"]]
    assert row["acked_by"] == "alice" and row["minutes_to_ack"] == pytest.approx(5.0, abs=0.2)
    resolved = next(a for a in idle if a["resolved_at"] is not None)
    hours = (resolved["resolved_at"] - resolved["fired_at"]).total_seconds() / 3600
    assert incidents[resolved["alert_id"]]["hours_to_resolve"] == pytest.approx(hours, abs=0.01)
    precision = {r["rule"]: r for r in run_report(store, "precision", ALL)}
    rule = precision[acked["rule"]]
    assert (rule["acknowledged"], rule["expected"], rule["precision"]) == (2, 1, 0.667)
    assert rule["alerts"] == len(idle)
    # The app invited an hour later: the refused opening posted then (Outbox._post_refused_again), after the click.
    # Acknowledged before Slack had it, it has no time to acknowledge from Slack (it said -58 minutes).
    store.deliveries.record_made([(refused["alert_id"], "fired", "#ml-cost", "9.0", posted + 3600)])
    incidents = {r["alert_id"]: r for r in run_report(store, "incidents", ALL)}
    assert incidents[refused["alert_id"]]["minutes_to_ack"] is None
    assert incidents[acked["alert_id"]]["minutes_to_ack"] == pytest.approx(5.0, abs=0.2)



def test_a_withdrawn_fire_is_neither_an_incident_nor_counted_in_precision(store):
    """A fire taken back (the host had stopped before it, the stop read late) never stood: the incidents
    report leaves it out (it showed it resolved before it fired, hours to resolve below zero) and so
    does the precision report."""
    from tests.test_ledger import alert

    stood = alert("stood", "idle_gpu", 5.0, time.time() - 7200, time.time() - 3600)
    fired = alert("taken", "idle_gpu", 5.0, time.time() - 7200, time.time() - 3600)
    taken = msgspec.structs.replace(fired, status="resolved", change="resolved", waste_usd=0.0,
                                    resolved_at=fired.fired_at - 60, details={"reason": "withdrawn"})  # fmt: skip
    store.alerts.record([stood, fired], version=1)
    store.alerts.record([taken], version=2)
    assert [r["alert_id"] for r in run_report(store, "incidents", ALL)] == ["stood"]
    assert [r["alerts"] for r in run_report(store, "precision", ALL)] == [1]


def test_team_filter_is_bound_not_pasted(filled):
    store, _ = filled
    teams = {r["team"] for r in run_report(store, "idle-gpus", ALL)}
    team = sorted(t for t in teams if t)[0]
    rows = run_report(store, "idle-gpus", ALL, team=team)
    assert rows and {r["team"] for r in rows} == {team}
    assert run_report(store, "idle-gpus", ALL, team="x' OR '1'='1") == []


def test_every_report_runs_and_formats(filled):
    store, _ = filled
    for name in REPORTS:
        rows = run_report(store, name, ALL)
        if name == "commitments" and not rows:
            continue  # the simulated fleet bills no commitment (tests/test_unused_commitment.py fills one)
        if name == "build-or-call" and not rows:
            continue  # this fleet tags no model (tests/test_build_or_call_report.py fills some)
        assert rows, name
        csv_text = format_rows(rows, "csv")
        assert csv_text.splitlines()[0] == ",".join(rows[0]) and len(csv_text.splitlines()) == len(rows) + 1
        assert len(format_rows(rows, "json").splitlines()) == len(rows)
        assert format_rows(rows, "table").splitlines()[0].split() == list(rows[0])
    short = run_report(store, "incidents", 6 * 3600)  # only the last six hours of event time
    assert 0 < len(short) < len(run_report(store, "incidents", ALL))


def test_query_command_names_the_reports_on_a_typo(tmp_path):
    import os

    env = {**os.environ, "BURNWATCH_CLICKHOUSE_DSN": f"chdb://{tmp_path / 'ch'}"}
    out = subprocess.run([sys.executable, "-m", "streams.cli", "query", "wast"], env=env, capture_output=True,
                         text=True)  # fmt: skip
    assert out.returncode != 0 and "unknown report 'wast'" in out.stderr
    assert all(name in out.stderr for name in REPORTS)
    out = subprocess.run([sys.executable, "-m", "streams.cli", "query", "waste", "--since", "7x"], env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode != 0 and "--since" in out.stderr


def test_docs_show_each_reports_sql_as_it_runs():
    """docs/postmortem.md shows the SQL a user can run in clickhouse-client: the very text."""
    from tests.conftest import ROOT

    doc = (ROOT / "docs" / "postmortem.md").read_text()
    for name, report in REPORTS.items():
        assert f"### `{name}`" in doc
        assert report.body in doc, f"docs/postmortem.md: the SQL of {name} is out of date"


def test_the_ledger_of_a_worker_filled_store_is_held_to_the_bill(filled):
    """The worker records every change of an incident (an update every 15 minutes): the
    ledger spreads what each added since the one before, and still no resource-hour, kind
    by kind, is charged more than it cost; idle GPUs, first in precedence, keep all their dollars."""
    store, _ = filled
    over = store.query(f"""SELECT resource_id, hour, kind, sum(usd) AS usd, any(bill_usd) AS bill
                           FROM {store.db}.waste_ledger GROUP BY resource_id, hour, kind
                           HAVING usd > bill + 1e-6""")  # fmt: skip
    assert over == []
    pieces = store.query(f"SELECT count() AS n FROM {store.db}.alert_changes WHERE type = 'idle_gpu'")[0]["n"]
    assert pieces > 2 * len(alerts_of(store, "idle_gpu"))  # several changes per incident: spread piece by piece
    ledger = store.query(f"SELECT sum(usd) AS usd FROM {store.db}.waste_ledger WHERE type = 'idle_gpu'")[0]["usd"]
    assert ledger == pytest.approx(sum(a["waste_usd"] for a in alerts_of(store, "idle_gpu")), abs=0.01)


def test_reconcile_puts_the_events_dollars_against_the_bill(filled, ruleset, tmp_path):
    """The fleet's own FOCUS bill ingested: resources whose events carried the billed cost agree
    within 1 % on every day both have; those priced from the price list differ by the discount
    or commitment, and the report says so; nothing billed goes missing."""
    from detector.billing.ingest import ingest_files
    from detector.simulate import build
    from detector.simulate_focus import simulate_focus, write_focus

    store, _ = filled
    cfg = SimConfig(hours=30, training_hosts=10, notebooks=6, seed=11)
    bill = simulate_focus(cfg, ruleset.pricing)
    ingest_files(store, write_focus(bill, tmp_path / "bill.parquet"))
    fleet = build(cfg, ruleset.pricing)
    sends_cost = {r.resource_id for r in fleet.gpu_resources + fleet.cpu_resources if r.send_cost}
    list_priced = {r.resource_id for r in fleet.gpu_resources + fleet.cpu_resources if not r.send_cost}
    rows = run_report(store, "reconcile", ALL, "")
    both = [r for r in rows if r["claimed_usd"] and r["billed_usd"]]
    assert {r["resource_id"] for r in both} >= sends_cost
    for r in both:
        if r["resource_id"] in sends_cost:
            assert r["why"].startswith("agrees"), r  # the simulated bill has no network rows
    differ = [r for r in both if r["resource_id"] in list_priced and not r["why"].startswith("agrees")]
    assert differ and all(r["why"] for r in differ), [(r["resource_id"], r["claimed_usd"], r["billed_usd"], r["why"])
                                                      for r in differ]  # fmt: skip
    billed = {r["ResourceId"] for r in bill.rows if r["ResourceId"]}
    assert billed <= {r["resource_id"] for r in rows}


def test_reconcile_says_egress_is_missing_from_the_bill_beside_a_discount(store, tmp_path):
    """A host list-priced at $10/h that sent 100 GB an hour, on a bill at 8 % off with no network
    charges: nearly all of the difference is the egress the bill does not carry. The report said
    "list vs effective price (discount or commitment)", sending the analyst after a $19 discount to
    explain a $200 gap; it now says both."""
    import csv

    from detector.billing.ingest import ingest_files
    from detector.store import EventBatch
    from tests.helpers import T0, usage
    from tests.test_reprice import store_pricing, write_bill

    batch = EventBatch()
    batch.extend([msgspec.structs.replace(usage(T0 + k * 3600, "e1", usd_per_hour=10.0, interval_s=3600),
                                          egress_bytes=100 * 10**9, dest_region="eu-west-1") for k in range(24)])  # fmt: skip
    store.events.insert(batch, store_pricing())
    path = write_bill(tmp_path / "bill.csv", {"e1": 9.2}, hours=24)
    rows = list(csv.reader(path.open(newline="")))
    list_cost = rows[0].index("ListCost")
    for row in rows[1:]:
        row[list_cost] = "10.00"
    with path.open("w", newline="") as out:
        csv.writer(out).writerows(rows)
    ingest_files(store, path)
    (row,) = run_report(store, "reconcile", ALL)
    assert row["billed_usd"] == pytest.approx(24 * 9.2) and row["claimed_usd"] > 24 * 10.0 + 24 * 1.0
    assert row["why"] == "list vs effective price, and the bill has no network charges for it"


def test_csv_text_cells_a_spreadsheet_would_run_are_shown_as_text():
    """Resource ids and tags come from the events (anyone's input): ``query reconcile --format csv``
    opened in a spreadsheet ran a resource id ``=cmd|' /C calc'!A0`` or a team ``=1+1`` as a formula.
    Such text gets a leading ``'`` as ``backtest --scores`` gives it; numbers (a credit's -5.0) stay numbers."""
    rows = [{"resource_id": "=cmd|' /C calc'!A0", "team": "@SUM(A1)", "owner": "+1", "why": "-x", "tab": "\tx",
             "usd": -5.0, "plain": "gpu-host-1"}]  # fmt: skip
    lines = format_rows(rows, "csv").splitlines()
    assert lines[1] == "'=cmd|' /C calc'!A0,'@SUM(A1),'+1,'-x,'\tx,-5.0,gpu-host-1"
    assert format_rows(rows, "json").count("'") == 2  # JSON and the table show the text as it is


def test_json_rows_are_json_even_with_a_value_that_is_not_a_number():
    """``burnwatch sql "SELECT 0/0 AS x" --format json`` wrote ``{"x": NaN}``, which no JSON parser but
    Python's reads (jq refuses it): a value that is not a finite number is null, as JSON has no other."""
    import json

    text = format_rows([{"x": float("nan"), "y": float("inf"), "z": -float("inf"), "ok": 1.5,
                         "arr": [1.0, float("nan")], "map": {"a": float("nan")}, "tup": (float("inf"), "s")}], "json")
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in {text}")) == {
        "x": None, "y": None, "z": None, "ok": 1.5, "arr": [1.0, None], "map": {"a": None}, "tup": [None, "s"]}


def test_a_known_team_is_told_without_reading_every_bill(store):
    """``query vector-db --team nlp``, nlp a team with no vector DB: before saying "(no rows)" the command asks
    whether the store knows nlp, and that read every team tag of every rollup, alert and bill the store ever
    held, the bill through its view that sorts all of it (a 10-million-charge bill: 12 s and 2 GB where the
    report took 2.5 s, a bigger one past the memory limit, a valid query refused). A team the rollups name is
    known at its first row; only a team no row names reads everything, to list the teams there are."""
    from detector.reports import known_teams

    db = store.db
    store.command(f"INSERT INTO {db}.usage_hourly (hour, resource_id, team, usd) VALUES (now(), 'h1', 'nlp', 1)")
    store.command(f"INSERT INTO {db}.billing_ingests (ingest_id, version, at) VALUES ('i1', 1, now64(3))")
    store.command(f"INSERT INTO {db}.billing_charges (row_key, ingest_id, version, resource_id, charge_period_start, "
                  "billing_period_start, tags) SELECT number, 'i1', 1, concat('r-', toString(number % 500)), now64(3), "
                  "now64(3), map('team', concat('team', toString(number % 7))) FROM numbers(200000)")  # fmt: skip
    store.command("SET max_rows_to_read = 100000")  # the bill is more than this: reading it all is refused
    try:
        assert known_teams(store, "nlp")[0] and known_teams(store, "(untagged)")[0]
    finally:
        store.command("SET max_rows_to_read = 0")
    assert known_teams(store, "team3")[0]  # a team only the bill names
    assert known_teams(store, "Team3") == (False, ["nlp", *(f"team{i}" for i in range(7))])


def test_tags_in_another_case_are_the_teams_of_the_reports(store, ruleset, tmp_path):
    """A fleet tagging as AWS's examples do (``Team``, ``OWNER``, a Cost and Usage Report's ``user:Project``):
    detection reads them as the rules' ``team``, ``owner`` and ``project``, but the hourly rollup read
    ``tags['team']`` alone, so ``query untagged`` listed every such resource, ``egress`` showed it of no team,
    and reconcile's teams were "(untagged)", while its alerts named the team. The key itself wins where it is
    written and not empty; else the first key written that folds to it."""
    from detector.reports import known_teams

    tags = {"cpu-a": {"Team": "nlp", "user:Project": "llm", "OWNER": "ann"},
            "cpu-b": {"team": "", "TEAM": "vision", "Team": "later", "owner": "bo", "Owner": "ignored"},
            "cpu-c": {"Owner": "cy", "steam": "not-a-team", "user:teams": "nor-this"}}  # fmt: skip
    lines = []
    for minute in range(120):
        for i, (rid, tag) in enumerate(tags.items()):
            event = {"ts": f"2026-11-02T{minute // 60:02d}:{minute % 60:02d}:00Z", "resource_id": rid,
                     "resource_type": "cpu_instance", "provider": "aws", "account": f"acct-{i}",
                     "region": "us-east-1", "instance_type": "c6i.4xlarge", "pricing": "on_demand",
                     "state": "running", "interval_s": 60.0, "tags": tag, "egress_bytes": 10**9,
                     "dest_region": "eu-west-1"}  # fmt: skip
            lines.append(msgspec.json.encode({"topic": "resource-usage", "key": rid, "value": event}))
    path = tmp_path / "tagged.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    store_fleet(store, ruleset, path)
    db = store.db
    # A bill that tags as a CUR exports: a resource only the bill has, of team 'ml'.
    store.command(f"INSERT INTO {db}.billing_ingests (ingest_id, version, at) VALUES ('i1', 1, now64(3))")
    store.command(f"INSERT INTO {db}.billing_charges (row_key, ingest_id, version, resource_id, charge_period_start, "
                  "billing_period_start, effective_cost, tags) VALUES (1, 'i1', 1, 'cpu-d', "
                  "toDateTime64('2026-11-02 00:00:00', 3, 'UTC'), toDateTime64('2026-11-01 00:00:00', 3, 'UTC'), 5, "
                  "map('user:Team', 'ml'))")  # fmt: skip

    rollup = {r["resource_id"]: (r["team"], r["project"], r["owner"]) for r in store.query(
        f"SELECT resource_id, anyLast(team) AS team, anyLast(project) AS project, anyLast(owner) AS owner "
        f"FROM {db}.cost_hourly GROUP BY resource_id")}  # fmt: skip
    assert rollup == {"cpu-a": ("nlp", "llm", "ann"), "cpu-b": ("vision", "", "bo"), "cpu-c": ("", "", "cy")}
    assert [(r["account"], r["resources"]) for r in run_report(store, "untagged", ALL)] == [("acct-2", 1)]
    assert [(r["top_resource"], r["resources"]) for r in run_report(store, "egress", ALL, team="vision")] == [
        ("cpu-b", 1)]
    reconciled = {r["resource_id"]: r["team"] for r in run_report(store, "reconcile", ALL)}
    assert reconciled == {"cpu-a": "nlp", "cpu-b": "vision", "cpu-c": "(untagged)", "cpu-d": "ml"}
    assert known_teams(store, "vision")[0] and known_teams(store, "ml")[0]
    assert known_teams(store, "later") == (False, ["ml", "nlp", "vision"])


def test_reports_of_events_and_bills_read_tags_in_any_case():
    """Each report that reads the stored events' or the bill's tags (kept as written) reads ``team`` as
    ``tag_names.stored_tag`` writes it; those reading alerts (whose tags detection completed) read the key."""
    from detector.store.schema import migrations
    from detector.tag_names import stored_tag

    for name, report in REPORTS.items():
        rest = report.sql.replace(stored_tag("team"), "")
        if "resource_usage" in rest or "billing" in rest:
            assert "tags['team']" not in rest, f"{name}.sql reads the team tag as written"
    rollup = next(m for m in migrations() if m.version == 27).statements("db")[0]
    assert all(stored_tag(t) in rollup for t in ("team", "project", "owner"))
