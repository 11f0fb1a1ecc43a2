"""FOCUS bills stored in ClickHouse (chdb): whole files or nothing, never a charge twice."""

from __future__ import annotations

import csv
from decimal import Decimal
from pathlib import Path

import pytest

from detector.billing.focus import FocusError, read_focus
from detector.billing.ingest import ingest_files
from detector.pricing import Pricing
from detector.simulate import SimConfig
from detector.simulate_focus import simulate_focus, write_focus

FIXTURE = Path(__file__).parent / "data" / "focus" / "charges-1.2.csv"


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _billed(store) -> tuple[int, Decimal]:
    (row,) = store.query(f"SELECT count() AS n, sum(effective_cost) AS usd FROM {store.db}.billing")
    return row["n"], row["usd"]


def test_a_file_is_stored_with_its_exact_dollars(store):
    table = read_focus(FIXTURE)
    result = ingest_files(store, FIXTURE)
    expected = sum(table.column("effective_cost").to_pylist(), Decimal(0))
    assert result.rows == table.num_rows
    assert _billed(store) == (table.num_rows, expected)  # Decimal: not a float sum


def test_a_redelivered_export_is_not_counted_twice(store):
    ingest_files(store, FIXTURE)
    ingest_files(store, FIXTURE)
    assert _billed(store) == (5, sum(read_focus(FIXTURE).column("effective_cost").to_pylist(), Decimal(0)))
    assert store.count("billing_charges") == 10  # both deliveries are kept until merged; one is read


def test_a_restated_charge_replaces_the_one_it_restates(store, tmp_path):
    rows = _rows(FIXTURE)
    ingest_files(store, FIXTURE)
    rows[0]["EffectiveCost"] = str(Decimal(rows[0]["EffectiveCost"]) + 1)  # the provider restates one charge
    restated = _write(tmp_path / "restated.csv", rows)
    ingest_files(store, restated)
    n, usd = _billed(store)
    assert n == len(rows)
    assert usd == sum(read_focus(FIXTURE).column("effective_cost").to_pylist(), Decimal(0)) + 1


def test_identical_charges_in_one_file_are_both_kept(store, tmp_path):
    rows = _rows(FIXTURE)
    twice = _write(tmp_path / "twice.csv", rows + [rows[0]])  # two charges alike in every dimension
    ingest_files(store, twice)
    n, usd = _billed(store)
    assert n == len(rows) + 1
    assert usd == sum(read_focus(FIXTURE).column("effective_cost").to_pylist(), Decimal(0)) + Decimal(rows[0]["EffectiveCost"])
    ingest_files(store, twice)  # and delivered again, still two
    assert _billed(store)[0] == len(rows) + 1


def test_a_bad_file_in_a_directory_stores_nothing(store, tmp_path):
    rows = _rows(FIXTURE)
    _write(tmp_path / "a-good.csv", rows)
    bad = [dict(r) for r in rows]
    bad[3]["BilledCost"] = "twelve"
    _write(tmp_path / "b-bad.csv", bad)
    with pytest.raises(FocusError, match=r"b-bad.csv: row 4, column BilledCost"):
        ingest_files(store, tmp_path)
    assert store.count("billing_charges") == 0
    assert store.count("billing_ingests") == 0


def test_rows_of_an_ingest_that_never_committed_are_not_read(store):
    """A kill after the rows and before the ingest's line: a newer, uncommitted version of a
    charge must neither count nor hide the committed one."""
    ingest_files(store, FIXTURE)
    before = _billed(store)
    store.command(f"INSERT INTO {store.db}.billing_charges SELECT row_key, 'killed', version + 1, source, source_row, "
                  f"* EXCEPT (row_key, ingest_id, version, source, source_row) REPLACE (effective_cost * 100 AS "
                  f"effective_cost) FROM {store.db}.billing_charges")  # fmt: skip
    assert store.count("billing_charges") == 10
    assert _billed(store) == before


def test_the_simulated_fleets_bill_is_stored_whole(store, tmp_path):
    bill = simulate_focus(SimConfig(hours=6, seed=3, training_hosts=3, notebooks=3), Pricing())
    path = write_focus(bill, tmp_path / "bill.parquet")
    result = ingest_files(store, path)
    total = sum((Decimal(str(r["EffectiveCost"])) for r in bill.rows), Decimal(0))
    assert result.rows == len(bill.rows)
    n, usd = _billed(store)
    assert n == len(bill.rows)
    assert abs(usd - total) < Decimal("1e-9") * len(bill.rows)


def test_the_command_refuses_another_currency_and_stores_nothing(tmp_path, monkeypatch, capsys):
    from streams import cli

    monkeypatch.setenv("BURNWATCH_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(cli, "configure_logging", lambda *a, **k: None)
    with pytest.raises(SystemExit) as exc:
        cli.main(["ingest", "focus", str(FIXTURE), "--currency", "EUR"])
    assert "column BillingCurrency" in str(exc.value) and "nothing was stored" in str(exc.value)


def test_a_bill_in_another_currency_is_stored_but_never_priced_from(tmp_path, monkeypatch):
    """Asked for, a bill in euros is stored for queries; its figures price no event and re-price no
    incident (burnwatch counts dollars), and --bill / --publish-usage, which would put them on alerts
    as dollars, refuse it."""
    from streams import cli
    from tests.test_cli import burnwatch, no_traceback

    eur = _write(tmp_path / "eur.csv", [{**r, "BillingCurrency": "EUR"} for r in _rows(FIXTURE)])
    env = {"BURNWATCH_DATA_DIR": str(tmp_path / "data"), "BURNWATCH_EVENT_TTL_DAYS": "0"}
    out = burnwatch("ingest", "focus", str(eur), "--currency", "EUR", env=env)  # a process of its own: a store
    no_traceback(out)
    assert out.returncode == 0, out.stderr
    assert "5 charges" in out.stdout and " EUR, effective " in out.stdout
    assert "stored for queries; it prices no event and re-prices no incident" in out.stdout
    monkeypatch.setattr(cli, "configure_logging", lambda *a, **k: None)
    monkeypatch.setenv("BURNWATCH_KAFKA_BOOTSTRAP", "127.0.0.1:9")  # refused before any broker is asked
    with pytest.raises(SystemExit) as exc:
        cli.main(["ingest", "focus", str(eur), "--currency", "EUR", "--publish-usage"])
    assert "usage events carry US dollars" in str(exc.value) and "nothing was stored" in str(exc.value)
    replay = tmp_path / "empty.jsonl"
    replay.write_text("")
    with pytest.raises(SystemExit) as exc:
        cli.main(["backtest", str(replay), "--bill", str(eur), "--currency", "EUR"])
    assert "burnwatch prices in USD" in str(exc.value)


def test_ingest_reads_the_rate_bound_beside_the_rules(tmp_path, monkeypatch):
    """A fleet whose resources cost more than limits.yaml's default an hour raises it there: its bill follows."""
    from streams import cli

    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "limits.yaml").write_text("max_usd_per_hour: 50\n")
    monkeypatch.setenv("BURNWATCH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("BURNWATCH_RULES", str(rules))
    monkeypatch.setattr(cli, "configure_logging", lambda *a, **k: None)
    with pytest.raises(SystemExit) as exc:
        cli.main(["ingest", "focus", str(FIXTURE)])
    assert "row 1, column EffectiveCost" in str(exc.value) and "above the plausible $50.00/h" in str(exc.value)
    assert "nothing was stored" in str(exc.value)


def test_a_month_exported_at_two_granularities_is_said(store, tmp_path):
    """The same usage exported hourly and then daily (Azure's export is daily, AWS's CUR hourly: a
    team switching, or both delivered) is two charges for one hour in the ``billing`` view, which
    counts both: the ingest says which resources, where a restatement or a redelivery says nothing."""
    hourly = _rows(FIXTURE)
    first = ingest_files(store, FIXTURE)
    assert first.overlapping == 0
    again = ingest_files(store, FIXTURE)  # a redelivery replaces its rows
    assert again.overlapping == 0
    daily = [dict(hourly[0], ChargePeriodStart="2026-11-03T00:00:00Z", ChargePeriodEnd="2026-11-04T00:00:00Z",
                  ConsumedQuantity="24", PricingQuantity="24")]  # fmt: skip
    result = ingest_files(store, _write(tmp_path / "daily.csv", daily))
    assert result.overlapping == 1
    assert result.overlapping_resources == (hourly[0]["ResourceId"],)
    both = _write(tmp_path / "both.csv", hourly + daily)  # one delivery holding both granularities
    assert ingest_files(store, both).overlapping == 2  # the daily charge and the hour it covers


def test_the_command_says_which_resources_two_granularities_count_twice(tmp_path):
    from tests.test_cli import burnwatch, no_traceback

    hourly = _rows(FIXTURE)
    daily = _write(tmp_path / "daily.csv", [dict(hourly[0], ChargePeriodStart="2026-11-03T00:00:00Z",
                                                 ChargePeriodEnd="2026-11-04T00:00:00Z", ConsumedQuantity="24")])  # fmt: skip
    env = {"BURNWATCH_DATA_DIR": str(tmp_path / "data"), "BURNWATCH_EVENT_TTL_DAYS": "0"}
    first = burnwatch("ingest", "focus", str(FIXTURE), env=env)
    assert first.returncode == 0 and "counts twice" not in first.stderr, first.stderr
    out = burnwatch("ingest", "focus", str(daily), env=env)
    no_traceback(out)
    assert out.returncode == 0, out.stderr
    assert "1 usage charge(s) of this bill cover time another usage charge" in out.stderr, out.stderr
    assert f"counts twice: on {hourly[0]['ResourceId']}." in out.stderr


def test_the_simulated_fleets_bill_overlaps_nothing(store, tmp_path):
    """No false alarm on a day's bill of a fleet, ingested twice."""
    bill = simulate_focus(SimConfig(hours=24, training_hosts=4, notebooks=2, inference_endpoints=1, seed=5), Pricing())
    path = write_focus(bill, tmp_path / "bill.parquet")
    assert ingest_files(store, path).overlapping == 0
    assert ingest_files(store, path).overlapping == 0
