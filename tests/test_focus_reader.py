"""FOCUS reader: spec-shaped fixtures in, one normalized table out; bad files named by file, row and column."""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import shutil
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from detector.billing.columns import NORMALIZED, READ_REQUIRED
from detector.billing.focus import MAX_CELL_BYTES, SCHEMA, STR_MAP, FocusError, focus_files, read_focus

FIXTURE = Path(__file__).parent / "data" / "focus" / "charges-1.2.csv"


def _rows() -> list[dict[str, str]]:
    with FIXTURE.open(newline="") as f:
        return list(csv.DictReader(f))


def _write(path: Path, rows: list[dict[str, str]], drop: tuple[str, ...] = ()) -> Path:
    names = [n for n in rows[0] if n not in drop] if rows else [n for n in _rows()[0] if n not in drop]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=names, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(buf.getvalue(), encoding="utf-8")
    return path


def _error(path: Path, currency: str = "USD") -> FocusError:
    with pytest.raises(FocusError) as info:
        read_focus(path, currency=currency)
    return info.value


def test_spec_fixture_reads_into_the_normalized_schema() -> None:
    table = read_focus(FIXTURE)
    assert table.schema == SCHEMA
    assert [f.name for f in table.schema][: len(NORMALIZED)] == [c.name for c in NORMALIZED]
    rows = table.to_pylist()
    assert [r["source_row"] for r in rows] == [1, 2, 3, 4, 5]
    first = rows[0]
    assert first["billed_cost"] == Decimal("98.32")
    assert first["charge_period_start"] == datetime(2026, 11, 3, 10, tzinfo=timezone.utc)
    assert first["billing_period_end"] == datetime(2026, 12, 1, tzinfo=timezone.utc)
    assert first["consumed_quantity"] == Decimal(1)
    assert first["provider_name"] == "AWS" and first["region_id"] == "us-east-1"
    # Tags: keys verbatim with their provider prefixes; a non-string value becomes its JSON text.
    assert dict(first["tags"]) == {
        "user:team": "ml-research", "aws:createdBy": "arn:aws:iam::1:user/x", "cost-center": "42", "spot": "true",
    }
    # AWS export columns and spec columns the table has no place for land in x_columns as text.
    assert dict(first["x_columns"]) == {
        "InvoiceId": "INV-1", "x_ServiceCode": "AmazonEC2", "x_UsageType": "BoxUsage:p5.48xlarge",
        "x_Operation": "RunInstances",
    }
    committed, unused, credit, correction = rows[1], rows[2], rows[3], rows[4]
    assert committed["pricing_category"] == "Committed" and committed["commitment_discount_status"] == "Used"
    assert committed["effective_cost"] == Decimal("40.125") and committed["contracted_cost"] == Decimal("60.5")
    assert unused["commitment_discount_status"] == "Unused" and unused["charge_category"] == "Purchase"
    assert unused["consumed_quantity"] is None and unused["resource_id"] == "" and dict(unused["tags"]) == {}
    assert "x_Operation" not in dict(unused["x_columns"])  # an empty cell is left out, not stored as ''
    assert credit["charge_category"] == "Credit" and credit["billed_cost"] == Decimal("-25")
    assert dict(credit["x_columns"]) == {"InvoiceId": "INV-1", "x_UsageType": "Credit"}
    assert correction["charge_class"] == "Correction"
    assert correction["billed_cost"] == Decimal("-3.000000000001")  # 12 places kept exactly
    assert rows[0]["charge_class"] == ""


def test_money_sums_exactly_in_decimal() -> None:
    table = read_focus(FIXTURE)
    assert pc.sum(table.column("billed_cost")).as_py() == Decimal("98.32") - Decimal("25") - Decimal("3.000000000001")


def test_csv_gzip_and_parquet_give_the_same_table(tmp_path: Path) -> None:
    plain = read_focus(FIXTURE)
    gz = tmp_path / "charges.csv.gz"
    gz.write_bytes(gzip.compress(FIXTURE.read_bytes()))
    assert read_focus(gz).equals(plain)

    # Parquet with native types, the way exporters write it: float costs, naive timestamps (UTC by the spec),
    # a tags column still JSON text.
    raw = pacsv.read_csv(FIXTURE, convert_options=pacsv.ConvertOptions(
        column_types={n: pa.string() for n in _rows()[0]}, strings_can_be_null=True))
    typed = raw
    for name in ("BilledCost", "EffectiveCost", "ListCost", "ContractedCost", "ConsumedQuantity"):
        i = typed.column_names.index(name)
        typed = typed.set_column(i, name, typed.column(name).cast(pa.float64()))
    for name in ("BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd"):
        i = typed.column_names.index(name)
        naive = typed.column(name).cast(pa.timestamp("us", tz="UTC")).cast(pa.timestamp("us"))
        typed = typed.set_column(i, name, naive)
    parquet = tmp_path / "charges.parquet"
    pq.write_table(typed, parquet)
    assert read_focus(parquet).equals(plain)


def test_parquet_float_noise_rounds_to_twelve_places(tmp_path: Path) -> None:
    rows = _rows()[:1]
    raw = pa.Table.from_pylist(rows)
    i = raw.column_names.index("BilledCost")
    raw = raw.set_column(i, "BilledCost", pa.array([0.1 + 0.2]))  # 0.30000000000000004
    i = raw.column_names.index("EffectiveCost")
    raw = raw.set_column(i, "EffectiveCost", pa.array([123456.789]))
    path = tmp_path / "noise.parquet"
    pq.write_table(raw, path)
    row = read_focus(path, max_usd_per_hour=1e6).to_pylist()[0]  # $123,456.79 in an hour: a bound raised
    assert row["billed_cost"] == Decimal("0.3")
    assert row["effective_cost"] == Decimal("123456.789")


def test_parquet_decimal_finer_than_twelve_places_is_rounded(tmp_path: Path) -> None:
    raw = pa.Table.from_pylist(_rows()[:1])
    i = raw.column_names.index("BilledCost")
    raw = raw.set_column(i, "BilledCost", pa.array([Decimal("1.123456789012345678")], pa.decimal128(38, 18)))
    path = tmp_path / "fine.parquet"
    pq.write_table(raw, path)
    assert read_focus(path).to_pylist()[0]["billed_cost"] == Decimal("1.123456789012")


def test_directory_reads_its_focus_files_sorted_with_rows_counted_per_file(tmp_path: Path) -> None:
    shutil.copy(FIXTURE, tmp_path / "b.csv")
    (tmp_path / "a.csv.gz").write_bytes(gzip.compress(FIXTURE.read_bytes()))
    (tmp_path / "notes.txt").write_text("not a bill")
    assert [f.name for f in focus_files(tmp_path)] == ["a.csv.gz", "b.csv"]
    table = read_focus(tmp_path)
    assert table.num_rows == 10
    assert table.column("source_row").to_pylist() == [1, 2, 3, 4, 5] * 2


def test_empty_directory_and_other_extensions_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FocusError, match="no FOCUS files"):
        focus_files(tmp_path)
    other = tmp_path / "bill.json"
    other.write_text("{}")
    with pytest.raises(FocusError, match=r"bill\.json: not a FOCUS export"):
        focus_files(other)


def test_a_path_that_is_no_bill_is_named_as_typed(tmp_path: Path) -> None:
    """`ingest focus exports/2026-11/` with no such directory said `2026-11: no such file or directory`,
    which reads as a file named 2026-11 somewhere: the path given is named whole."""
    missing = tmp_path / "exports" / "2026-11"
    with pytest.raises(FocusError, match=re.escape(f"{missing}: no such file or directory")):
        focus_files(missing)
    with pytest.raises(FocusError, match=re.escape(f"{tmp_path}: no FOCUS files")):
        focus_files(tmp_path)


def test_header_only_file_is_zero_rows(tmp_path: Path) -> None:
    path = tmp_path / "header.csv"
    path.write_text(FIXTURE.read_text().splitlines()[0] + "\n")
    table = read_focus(path)
    assert table.num_rows == 0 and table.schema == SCHEMA


def test_empty_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("")
    err = _error(path)
    assert str(err) == "empty.csv: empty file (not even a header row)" and err.row is None


def test_missing_mandatory_column_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path / "bill.csv", _rows(), drop=("EffectiveCost",))
    err = _error(path)
    assert (err.file, err.row, err.column) == (str(path), None, "EffectiveCost")
    assert str(err) == "bill.csv: column EffectiveCost: missing mandatory column"


def test_every_read_required_column_is_checked(tmp_path: Path) -> None:
    for name in READ_REQUIRED:
        err = _error(_write(tmp_path / "bill.csv", _rows(), drop=(name,)))
        assert err.column == name, name


def test_list_and_contracted_cost_absent_are_null(tmp_path: Path) -> None:
    table = read_focus(_write(tmp_path / "bill.csv", _rows(), drop=("ListCost", "ContractedCost")))
    assert table.column("list_cost").null_count == 5 and table.column("contracted_cost").null_count == 5


def test_wrong_decimal_names_row_column_and_value(tmp_path: Path) -> None:
    rows = _rows()
    rows[1]["BilledCost"] = "abc"
    err = _error(_write(tmp_path / "bill.csv", rows))
    assert str(err) == "bill.csv: row 2, column BilledCost: 'abc' is not a decimal number"
    assert (err.row, err.column) == (2, "BilledCost")


@pytest.mark.parametrize("value", ["1" + "0" * 30, "-1e40"])
def test_a_decimal_too_large_for_the_column_is_said_to_be(tmp_path: Path, value: str) -> None:
    """A number, not a typo: the message names the range, as a Parquet decimal's does."""
    rows = _rows()
    rows[2]["EffectiveCost"] = value
    err = _error(_write(tmp_path / "bill.csv", rows))
    assert str(err) == (f"bill.csv: row 3, column EffectiveCost: {value!r} is not a number Decimal(38, 12) holds "
                        "(26 digits before the point)")  # fmt: skip


def test_long_bad_value_is_truncated_in_the_message(tmp_path: Path) -> None:
    rows = _rows()
    rows[2]["ConsumedQuantity"] = "9" * 50 + "x" * 500
    message = str(_error(_write(tmp_path / "bill.csv", rows)))
    assert message.startswith("bill.csv: row 3, column ConsumedQuantity: '" + "9" * 50)
    assert len(message) < 200 and "...'" in message


def test_empty_cost_is_refused(tmp_path: Path) -> None:
    rows = _rows()
    rows[3]["EffectiveCost"] = ""
    err = _error(_write(tmp_path / "bill.csv", rows))
    assert (err.row, err.column) == (4, "EffectiveCost")


def test_datetimes_with_offsets_naive_and_date_only_are_utc(tmp_path: Path) -> None:
    rows = _rows()[:3]
    rows[0]["ChargePeriodStart"] = "2026-11-03T12:00:00+02:00"
    rows[1]["ChargePeriodStart"] = "2026-11-03 10:00:00"
    rows[2]["ChargePeriodStart"] = "2026-11-03"
    starts = read_focus(_write(tmp_path / "bill.csv", rows)).column("charge_period_start").to_pylist()
    assert starts == [datetime(2026, 11, 3, 10, tzinfo=timezone.utc)] * 2 + [datetime(2026, 11, 3, tzinfo=timezone.utc)]


def test_bad_datetime_names_row_and_column(tmp_path: Path) -> None:
    rows = _rows()
    rows[4]["ChargePeriodEnd"] = "2026-13-01T00:00:00Z"
    assert str(_error(_write(tmp_path / "bill.csv", rows))) == (
        "bill.csv: row 5, column ChargePeriodEnd: '2026-13-01T00:00:00Z' is not an ISO 8601 date/time"
    )


@pytest.mark.parametrize(("column", "value"), [
    ("ChargeCategory", "Refund"),
    ("ChargeClass", "Fix"),
    ("PricingCategory", "Spot"),
    ("CommitmentDiscountStatus", "Partial"),
    ("ServiceCategory", "GPUs"),
])
def test_value_outside_the_spec_set_is_refused(tmp_path: Path, column: str, value: str) -> None:
    rows = _rows()
    rows[1][column] = value
    err = _error(_write(tmp_path / "bill.csv", rows))
    assert (err.row, err.column) == (2, column)
    assert f"{value!r} is not one of the spec's values" in str(err)


def test_other_currency_is_refused_unless_configured(tmp_path: Path) -> None:
    rows = _rows()
    for row in rows:
        row["BillingCurrency"] = "EUR"
    path = _write(tmp_path / "eur.csv", rows)
    err = _error(path)
    assert str(err) == "eur.csv: row 1, column BillingCurrency: currency 'EUR' is not the configured currency 'USD'"
    assert read_focus(path, currency="EUR").column("billing_currency").to_pylist() == ["EUR"] * 5


def test_mixed_currencies_name_the_first_foreign_row(tmp_path: Path) -> None:
    rows = _rows()
    rows[3]["BillingCurrency"] = "JPY"
    err = _error(_write(tmp_path / "mixed.csv", rows))
    assert (err.row, err.column) == (4, "BillingCurrency") and "'JPY'" in str(err)


def test_service_provider_name_of_focus_1_3(tmp_path: Path) -> None:
    rows = _rows()
    for row in rows:
        row["ServiceProviderName"] = "Amazon Web Services"
    only = read_focus(_write(tmp_path / "v13.csv", rows, drop=("ProviderName", "PublisherName")))
    assert only.column("provider_name").to_pylist() == ["Amazon Web Services"] * 5
    assert "ServiceProviderName" not in dict(only.column("x_columns")[0].as_py())
    both = read_focus(_write(tmp_path / "both.csv", rows)).to_pylist()[0]
    assert both["provider_name"] == "AWS"
    assert dict(both["x_columns"])["ServiceProviderName"] == "Amazon Web Services"


@pytest.mark.parametrize("tags", ['{"user:team": "ml"', '["user:team"]'])
def test_malformed_tags_name_the_row(tmp_path: Path, tags: str) -> None:
    rows = _rows()
    rows[2]["Tags"] = tags
    err = _error(_write(tmp_path / "bill.csv", rows))
    assert (err.row, err.column) == (3, "Tags")
    assert str(err).startswith("bill.csv: row 3, column Tags: ")


def test_formula_text_is_kept_verbatim(tmp_path: Path) -> None:
    rows = _rows()
    formula = '=HYPERLINK("http://evil.example","x")'
    rows[0]["ResourceName"] = formula
    rows[0]["Tags"] = json.dumps({"user:owner": formula, "+cmd": "@SUM(1+1)"})
    row = read_focus(_write(tmp_path / "bill.csv", rows)).to_pylist()[0]
    assert row["resource_name"] == formula
    assert dict(row["tags"]) == {"user:owner": formula, "+cmd": "@SUM(1+1)"}


def test_cell_over_the_size_cap_names_row_and_column(tmp_path: Path) -> None:
    rows = _rows()
    rows[1]["Tags"] = json.dumps({"user:blob": "x" * (2 * 1024 * 1024)})  # megabytes in one cell
    err = _error(_write(tmp_path / "bill.csv", rows))
    assert (err.row, err.column) == (2, "Tags") and f"{MAX_CELL_BYTES}-byte limit" in str(err)
    rows[1]["Tags"] = json.dumps({"user:blob": "x" * (MAX_CELL_BYTES - 100)})  # under the cap: data, kept
    kept = read_focus(_write(tmp_path / "bill.csv", rows)).to_pylist()[1]
    assert len(dict(kept["tags"])["user:blob"]) == MAX_CELL_BYTES - 100


def test_non_utf8_bytes_name_the_row(tmp_path: Path) -> None:
    lines = FIXTURE.read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b"Compute Savings Plan", b"Compute \xff\xfe Plan", 1)
    path = tmp_path / "latin.csv"
    path.write_bytes(b"\n".join(lines))
    err = _error(path)
    assert str(err) == "latin.csv: row 3: not UTF-8 text"


def test_not_parquet_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "bill.parquet"
    path.write_bytes(b"PAR1 but not really")
    err = _error(path)
    assert err.row is None and str(err).startswith("bill.parquet: not a readable Parquet file")


def test_a_column_named_twice_is_refused(tmp_path: Path) -> None:
    lines = FIXTURE.read_text().splitlines()
    path = tmp_path / "twice.csv"
    path.write_text("\n".join([lines[0] + ",BilledCost"] + [line + ",1" for line in lines[1:]]) + "\n")
    err = _error(path)
    assert str(err) == "twice.csv: column BilledCost: column appears twice in the header"


def test_a_row_with_too_few_fields_is_named(tmp_path: Path) -> None:
    lines = FIXTURE.read_text().splitlines()
    lines[4] = lines[4].rsplit(",", 1)[0]
    path = tmp_path / "ragged.csv"
    path.write_text("\n".join(lines) + "\n")
    assert str(_error(path)) == "ragged.csv: row 4: 45 fields where the header has 46"


def test_parquet_dictionary_columns_and_a_bad_value_deep_in_a_big_file(tmp_path: Path) -> None:
    base = pa.Table.from_pylist(_rows()[:1])
    big = pa.concat_tables([base] * 70000).combine_chunks()
    i = big.column_names.index("ChargeCategory")
    big = big.set_column(i, "ChargeCategory", big.column("ChargeCategory").dictionary_encode())
    i = big.column_names.index("ChargePeriodStart")
    big = big.set_column(i, "ChargePeriodStart", big.column("ChargePeriodStart").dictionary_encode())
    path = tmp_path / "big.parquet"
    pq.write_table(big, path)
    table = read_focus(path)
    assert table.num_rows == 70000 and table.column("charge_category")[69999].as_py() == "Usage"
    costs = big.column("BilledCost").to_pylist()
    costs[68000] = "1.2.3"
    big = big.set_column(big.column_names.index("BilledCost"), "BilledCost", pa.array(costs))
    pq.write_table(big, path)
    assert str(_error(path)) == "big.parquet: row 68001, column BilledCost: '1.2.3' is not a decimal number"


def test_parquet_duplicate_column_is_refused(tmp_path: Path) -> None:
    base = pa.Table.from_pylist(_rows()[:1])
    twice = base.append_column("Tags", base.column("Tags"))
    path = tmp_path / "twice.parquet"
    pq.write_table(twice, path)
    assert str(_error(path)) == "twice.parquet: column Tags: column appears twice in the header"


def test_parquet_nested_extra_column_map_tags_and_nan_cost(tmp_path: Path) -> None:
    base = pa.Table.from_pylist(_rows()[:2])
    table = base.append_column("x_Discounts", pa.array([{"rate": 1, "tiers": [1, 2]}, None]))
    i = table.column_names.index("Tags")
    table = table.set_column(i, "Tags", pa.array([[("user:team", 1)], []], pa.map_(pa.string(), pa.int64())))
    path = tmp_path / "nested.parquet"
    pq.write_table(table, path)
    rows = read_focus(path).to_pylist()
    assert dict(rows[0]["x_columns"])["x_Discounts"] == '{"rate": 1, "tiers": [1, 2]}'
    assert "x_Discounts" not in dict(rows[1]["x_columns"])
    assert dict(rows[0]["tags"]) == {"user:team": "1"} and dict(rows[1]["tags"]) == {}
    i = table.column_names.index("BilledCost")
    pq.write_table(table.set_column(i, "BilledCost", pa.array([1.0, float("nan")])), path)
    assert str(_error(path)) == "nested.parquet: row 2, column BilledCost: 'nan' is not a decimal number"


@pytest.mark.parametrize(
    "change, column, said",
    [
        ({"ChargePeriodEnd": "2026-11-03T09:00:00Z"}, "ChargePeriodEnd", "is before ChargePeriodStart 2026-11-03T10:00:00"),
        ({"EffectiveCost": "99999999999999"}, "EffectiveCost",
         "$99,999,999,999,999.00 for 1 hour(s) of 'i-0abc' is $99,999,999,999,999.00/h, above the plausible $2,000.00/h"),
        ({"BilledCost": "-5000"}, "BilledCost", "for 1 hour(s) of 'i-0abc' is $5,000.00/h"),  # a refund as absurd
        ({"EffectiveCost": "4800", "ChargePeriodEnd": "2026-11-04T10:00:00Z", "ConsumedQuantity": "24"}, None, None),
        ({"ChargeCategory": "Purchase", "EffectiveCost": "99999999"}, None, None),  # a purchase prices no hour
        ({"ConsumedUnit": "GB", "EffectiveCost": "3125", "BilledCost": "3125"}, None, None),  # a query engine's hour
        ({"ChargePeriodEnd": "2026-11-03T10:00:00Z", "EffectiveCost": "0", "BilledCost": "0"}, None, None),  # no time
    ],
    ids=["backwards", "absurd-rate", "absurd-refund", "a-day", "purchase", "not-hours", "no-time"],
)  # fmt: skip
def test_charge_periods_and_the_rate_of_an_hour_are_checked(tmp_path: Path, change, column, said) -> None:
    """A bill's hourly rates price events and re-price incidents: one no event could carry is refused, naming
    it. What prices no hour is not bounded (a BigQuery dataset, a bucket's egress), so a real bill is not
    refused whole for it; a usage charge over no time is stored (``--publish-usage`` leaves it out, saying so)."""
    rows = _rows()
    rows[0].update(change)
    path = _write(tmp_path / "bill.csv", rows)
    if column is None:
        assert read_focus(path).num_rows == len(rows)
        return
    error = _error(path)
    assert (error.row, error.column) == (1, column) and said in error.problem, str(error)


def test_a_parquet_date_beyond_what_events_carry_is_refused(tmp_path: Path) -> None:
    """CSV refuses 9999-12-31 (no ISO date/time pyarrow reads); a Parquet timestamp holds it: refused alike."""
    raw = pacsv.read_csv(FIXTURE, convert_options=pacsv.ConvertOptions(strings_can_be_null=True))
    i = raw.column_names.index("ChargePeriodEnd")
    ends = [datetime(9999, 12, 31, tzinfo=timezone.utc), *raw.column(i).to_pylist()[1:]]
    raw = raw.set_column(i, "ChargePeriodEnd", pa.array(ends, pa.timestamp("us", tz="UTC")))
    pq.write_table(raw, tmp_path / "far.parquet")
    error = _error(tmp_path / "far.parquet")
    assert (error.row, error.column) == (1, "ChargePeriodEnd") and "outside 1970-01-01 to 2200-01-01" in error.problem


def test_polars_large_string_dates_are_read(tmp_path: Path) -> None:
    """Polars writes every text column as large_string: dates among them read as the CSV's do."""
    names = pacsv.read_csv(FIXTURE).column_names
    text = pacsv.ConvertOptions(column_types=dict.fromkeys(names, pa.large_string()), strings_can_be_null=True)
    pq.write_table(pacsv.read_csv(FIXTURE, convert_options=text), tmp_path / "polars.parquet")
    assert read_focus(tmp_path / "polars.parquet").to_pylist() == read_focus(FIXTURE).to_pylist()


def test_a_tag_with_a_lone_surrogate_is_refused_naming_its_row(tmp_path: Path) -> None:
    rows = _rows()
    rows[1]["Tags"] = '{"team":"\\ud800"}'  # JSON allows the escape; no UTF-8 text holds it
    error = _error(_write(tmp_path / "bill.csv", rows))
    assert (error.row, error.column) == (2, "Tags") and "is not text: surrogates not allowed" in error.problem, str(error)


def test_a_parquet_decimal_too_wide_is_refused_naming_its_row(tmp_path: Path) -> None:
    raw = pa.Table.from_pylist(_rows())
    i = raw.column_names.index("BilledCost")
    wide = [Decimal("98"), Decimal("9" * 38), Decimal("1"), Decimal("1"), Decimal("1")]
    raw = raw.set_column(i, "BilledCost", pa.array(wide, pa.decimal128(38, 0)))
    pq.write_table(raw, tmp_path / "wide.parquet")
    error = _error(tmp_path / "wide.parquet")
    assert (error.row, error.column) == (2, "BilledCost") and "Decimal(38, 12)" in error.problem, str(error)


def test_a_tag_key_with_a_null_value_is_no_tag(tmp_path: Path) -> None:
    """FOCUS 1.2 (tags.md): Tags "MAY include tag keys with a null value ... depending on the provider's tag
    finalization process". Such a key says the resource has no value for it: read as the text 'null' it tagged
    the resource team='null', which the bill's tags then gave its events (untagged said nothing, routing went to
    a team 'null'). A valueless tag's true stays 'true', as the spec has the provider write it."""
    rows = _rows()
    rows[0]["Tags"] = json.dumps({"user:team": None, "user:owner": "ana", "user:gpu": True})
    row = read_focus(_write(tmp_path / "bill.csv", rows)).to_pylist()[0]
    assert dict(row["tags"]) == {"user:owner": "ana", "user:gpu": "true"}
    # Parquet's own map type, a null item beside a value (it was kept as None, which --publish-usage choked on)
    table = pa.Table.from_pylist(_rows()[:2])
    i = table.column_names.index("Tags")
    table = table.set_column(i, "Tags", pa.array([[("user:team", None), ("user:owner", "ana")], None], STR_MAP))
    pq.write_table(table, tmp_path / "bill.parquet")
    rows = read_focus(tmp_path / "bill.parquet").to_pylist()
    assert dict(rows[0]["tags"]) == {"user:owner": "ana"} and dict(rows[1]["tags"]) == {}


def test_column_names_in_another_case_are_the_specs_columns(tmp_path: Path) -> None:
    """A bill unloaded through a warehouse that folds identifiers (Snowflake: BILLEDCOST; others: billedcost), or
    a converter writing ResourceID, names FOCUS's columns in another case. A mandatory one was refused as missing
    beside its own spelling; a Conditional one (ResourceID, consumedQuantity) was read as absent, with nothing
    said: every row's resource empty or quantity null, so the bill priced no event and reconciled nothing."""
    rows = _rows()
    want = read_focus(_write(tmp_path / "spec.csv", rows)).drop_columns(["x_columns"])
    for name, fold in [("lower", str.lower), ("upper", str.upper)]:
        path = _write(tmp_path / f"{name}.csv", [{fold(k): v for k, v in r.items() if not k.startswith("x_")} | {
            k: v for k, v in r.items() if k.startswith("x_")} for r in rows])  # fmt: skip
        assert read_focus(path).drop_columns(["x_columns"]).to_pylist() == want.to_pylist(), name
    renamed = [{("ResourceID" if k == "ResourceId" else k): v for k, v in r.items()} for r in rows]
    assert read_focus(_write(tmp_path / "id.csv", renamed)).column("resource_id").to_pylist()[0] == "i-0abc"
    # two spellings of one column, neither the spec's: which one is meant is not guessed
    both = [{**r, "RESOURCEID": "i-other"} for r in renamed]
    err = _error(_write(tmp_path / "both.csv", both))
    assert str(err) == "both.csv: column ResourceId: named twice, as ResourceID and RESOURCEID"


def test_text_cells_are_read_without_the_blanks_around_them(tmp_path: Path) -> None:
    """A hand-edited or spreadsheet-exported bill pads cells: " i-0abc " matched no event's resource id (the bill
    priced and reconciled nothing of it) and " USD" no currency. Read as the values they hold."""
    rows = _rows()
    rows[0] = {**rows[0], "ResourceId": f"  {rows[0]['ResourceId']}\t", "ServiceName": f" {rows[0]['ServiceName']} "}
    table = read_focus(_write(tmp_path / "padded.csv", rows))
    assert table.column("resource_id")[0].as_py() == _rows()[0]["ResourceId"]
    assert table.column("service_name")[0].as_py() == _rows()[0]["ServiceName"]
