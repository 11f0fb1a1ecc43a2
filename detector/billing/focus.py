"""Read FOCUS billing exports (CSV, gzip'd CSV, Parquet) into ONE normalized pyarrow Table.

Columnar all the way: pyarrow.csv reads every column as text and pyarrow.compute casts whole columns, so a
million-row export reads in seconds; only after a cast fails do we walk the column to name the bad row. Tags are
parsed once per distinct value, not per row. Money stays decimal128(38, 12) (never float); a Parquet float cost is
rounded to 12 places so binary float noise does not fail the cast. Timestamps are ISO 8601 / RFC 3339 with Z or an
offset; a value without one is taken as UTC (FOCUS requires date/times in UTC; its Date/Time Format section is not
in our reference copy, so this is our reading). Column constraints come from `detector.billing.columns`.

Every problem is a `FocusError` naming file, 1-based data row (None for whole-file problems) and column.
"""

from __future__ import annotations

import csv
import decimal
import gzip
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from detector.billing.columns import (
    BY_FOCUS,
    NORMALIZED,
    NOT_NULL,
    READ_REQUIRED,
    SERVICE_PROVIDER_NAME,
    Column,
)
from detector.billing.rates import hour_rows
from detector.events import TS_MAX, TS_MIN
from detector.limits import Limits

SUFFIXES = (".csv", ".csv.gz", ".parquet")
MAX_CELL_BYTES = 64 * 1024  # one cell (a tag blob, a description) larger than this is refused, naming it
CSV_BLOCK_BYTES = 16 * 1024 * 1024  # pyarrow's parse block: rows up to this size parse (and then meet the cap)
SHOW_CHARS = 80  # a bad value is quoted up to this many characters

DECIMAL = pa.decimal128(38, 12)
_TEXT_DECIMAL = "a decimal number"
_DECIMAL_RANGE = "a number Decimal(38, 12) holds (26 digits before the point)"
_WIDE = pa.decimal256(76, 30)  # parse at a wider scale, then round to 12 places
TIMESTAMP = pa.timestamp("ms", tz="UTC")
STR_MAP = pa.map_(pa.string(), pa.string())

_TYPES: dict[str, pa.DataType] = {"datetime": TIMESTAMP, "decimal": DECIMAL, "string": pa.string(), "json": STR_MAP}
SCHEMA = pa.schema(
    [pa.field(c.name, _TYPES[c.kind]) for c in NORMALIZED]
    + [pa.field("x_columns", STR_MAP), pa.field("source_row", pa.uint64())]
)


class FocusError(ValueError):
    """A FOCUS file burnwatch refuses, with where: file, 1-based data row (or None) and column (or None).
    The message names a file by its name (one of a directory's); ``whole`` names the path as given, for a
    path that is itself refused (missing, not a bill), where a bare name would point nowhere."""

    def __init__(self, file: Path | str, row: int | None, column: str | None, problem: str,
                 whole: bool = False) -> None:  # fmt: skip
        self.file = str(file)
        self.row = row
        self.column = column
        self.problem = problem
        where = []
        if row is not None:
            where.append(f"row {row}")
        if column is not None:
            where.append(f"column {column}")
        prefix = ": ".join([self.file if whole else Path(self.file).name] + ([", ".join(where)] if where else []))
        super().__init__(f"{prefix}: {problem}")


def focus_files(path: Path | str) -> list[Path]:
    """The export files at `path`: the file itself, or a directory's *.csv, *.csv.gz and *.parquet, sorted."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(SUFFIXES))
        if not files:
            raise FocusError(p, None, None, f"no FOCUS files ({', '.join(SUFFIXES)}) in this directory", whole=True)
        return files
    if not p.is_file():
        raise FocusError(p, None, None, "no such file or directory", whole=True)
    if not p.name.endswith(SUFFIXES):
        raise FocusError(p, None, None, f"not a FOCUS export: the name must end in {', '.join(SUFFIXES)}", whole=True)
    return [p]


def read_focus(path: Path | str, currency: str = "USD", max_usd_per_hour: float | None = None) -> pa.Table:
    """Every file at `path` read, checked and normalized into one table (source_row counts within each file).
    ``max_usd_per_hour``: the most an hour of a resource's usage may cost, as its events may (``limits.yaml``;
    default its default): see :func:`_check_periods`."""
    bound = Limits().max_usd_per_hour if max_usd_per_hour is None else max_usd_per_hour
    tables = [_read_file(f, currency, bound) for f in focus_files(path)]
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def _show(value: object) -> str:
    text = str(value)
    return repr(text if len(text) <= SHOW_CHARS else text[:SHOW_CHARS] + "...")


def _read_file(file: Path, currency: str, max_usd_per_hour: float) -> pa.Table:
    raw = _read_parquet(file) if file.name.endswith(".parquet") else _read_csv(file)
    return _normalize(file, raw, currency, max_usd_per_hour)


def _read_parquet(file: Path) -> pa.Table:
    if file.stat().st_size == 0:
        raise FocusError(file, None, None, "empty file")
    try:
        _check_unique(file, pq.read_schema(file).names)
        return pq.read_table(file)
    except (pa.ArrowException, OSError) as e:
        raise FocusError(file, None, None, f"not a readable Parquet file: {e}") from None


def _open(file: Path) -> Any:
    return gzip.open(file, "rb") if file.name.endswith(".gz") else open(file, "rb")


def _read_csv(file: Path) -> pa.Table:
    try:
        with _open(file) as f:
            head = f.read(CSV_BLOCK_BYTES)
    except (OSError, EOFError) as e:
        raise FocusError(file, None, None, f"cannot read: {e}") from None
    if not head.strip():
        raise FocusError(file, None, None, "empty file (not even a header row)")
    header_line = head.split(b"\n", 1)[0].rstrip(b"\r")
    try:
        header_text = header_line.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise FocusError(file, None, None, "the header row is not UTF-8") from None
    try:
        names = next(csv.reader([header_text]))
    except csv.Error as e:
        raise FocusError(file, None, None, f"unreadable header row: {e}") from None
    _check_unique(file, names)
    ragged: list[Any] = []

    def on_ragged(row: Any) -> str:
        ragged.append(row)
        return "error"

    try:
        with _open(file) as f:
            return pacsv.read_csv(
                f,
                read_options=pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES, use_threads=True),
                parse_options=pacsv.ParseOptions(newlines_in_values=True, invalid_row_handler=on_ragged),
                convert_options=pacsv.ConvertOptions(
                    column_types={n: pa.string() for n in names},
                    strings_can_be_null=True,
                    null_values=[""],
                ),
            )
    except (pa.ArrowInvalid, UnicodeDecodeError) as e:
        message = str(e)
        if "UTF8" in message or "utf" in message.lower():
            row = _first_non_utf8_row(file)
            raise FocusError(file, row, None, "not UTF-8 text") from None
        if ragged:
            bad = ragged[0]
            row = _first_ragged_row(file, bad.expected_columns)
            raise FocusError(
                file, row, None, f"{bad.actual_columns} fields where the header has {bad.expected_columns}"
            ) from None
        raise FocusError(file, None, None, f"not a readable CSV file: {message.splitlines()[0][:200]}") from None
    except (OSError, EOFError) as e:
        raise FocusError(file, None, None, f"cannot read: {e}") from None


def _check_unique(file: Path, names: Sequence[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise FocusError(file, None, name, "column appears twice in the header")
        seen.add(name)


def _first_ragged_row(file: Path, expected: int) -> int | None:
    """Error path only: the 1-based data row whose field count differs from the header's (pyarrow's parallel
    parser does not know row numbers)."""
    with _open(file) as f:
        text = io.TextIOWrapper(f, encoding="utf-8-sig", errors="replace", newline="")
        records = (record for record in csv.reader(text) if record)  # pyarrow skips blank lines too
        next(records, None)  # the header
        try:
            for number, record in enumerate(records, start=1):
                if len(record) != expected:
                    return number
        except csv.Error:  # a field over the csv module's size limit: give up on the row number, not the error
            return None
    return None


def _first_non_utf8_row(file: Path) -> int | None:
    """Error path only: the 1-based data row (line after the header) holding the first non-UTF-8 bytes."""
    with _open(file) as f:
        for number, line in enumerate(f):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return number if number > 0 else None
    return None


def _first(mask: pa.Array | pa.ChunkedArray) -> int | None:
    """The 0-based index of the first true in a boolean column (nulls are false), or None."""
    index = pc.index(pc.fill_null(mask, False), True).as_py()
    return None if index is None or index < 0 else int(index)


def _spelled_as_focus(file: Path, names: Sequence[str]) -> list[str]:
    """The header with FOCUS's columns named in another case (a warehouse's BILLEDCOST, a converter's ResourceID)
    spelt as the spec spells them, where the spec's own spelling is absent: read as absent, a Conditional column
    was lost with nothing said. Two such spellings of one column are refused: which is meant is not guessed."""
    spec = {name.casefold(): name for name in (*BY_FOCUS, SERVICE_PROVIDER_NAME)}
    present = set(names)
    found: dict[str, str] = {}
    out = []
    for name in names:
        focus = spec.get(name.casefold(), name)
        if focus == name or focus in present:
            out.append(name)
            continue
        if focus in found:
            raise FocusError(file, None, focus, f"named twice, as {found[focus]} and {name}")
        found[focus] = name
        out.append(focus)
    return out


def _normalize(file: Path, raw: pa.Table, currency: str, max_usd_per_hour: float) -> pa.Table:
    raw = raw.rename_columns(_spelled_as_focus(file, raw.column_names))
    names = raw.column_names
    present = set(names)
    provider_source = "ProviderName"
    if "ProviderName" not in present and SERVICE_PROVIDER_NAME in present:
        provider_source = SERVICE_PROVIDER_NAME
    for focus in READ_REQUIRED:
        if focus in present:
            continue
        if focus == "ProviderName" and provider_source == SERVICE_PROVIDER_NAME:
            continue
        if focus == "PublisherName" and SERVICE_PROVIDER_NAME in present:
            continue  # FOCUS 1.3 deprecates PublisherName alongside ProviderName
        raise FocusError(file, None, focus, "missing mandatory column")

    for name in names:
        _check_size(file, name, raw.column(name))

    n = raw.num_rows
    out: dict[str, pa.ChunkedArray | pa.Array] = {}
    for col in NORMALIZED:
        source = provider_source if col.focus == "ProviderName" else col.focus
        cells = raw.column(source) if source in present else None
        out[col.name] = _convert(file, col, source, cells, n)

    _check_values(file, out, currency)
    _check_periods(file, out, max_usd_per_hour)
    used = {c.focus for c in NORMALIZED if c.focus in present} | {provider_source}
    extra = [name for name in names if name not in used]
    out["x_columns"] = _x_columns(file, raw, extra)
    out["source_row"] = pa.array(np.arange(1, n + 1, dtype=np.uint64), type=pa.uint64())
    return pa.table([out[f.name] for f in SCHEMA], schema=SCHEMA)


def _check_size(file: Path, name: str, cells: pa.ChunkedArray) -> None:
    if not (pa.types.is_string(cells.type) or pa.types.is_large_string(cells.type)
            or pa.types.is_binary(cells.type)):
        return
    lengths = pc.binary_length(cells)
    too_big = _first(pc.greater(lengths, MAX_CELL_BYTES))
    if too_big is not None:
        size = lengths[too_big].as_py()
        raise FocusError(file, too_big + 1, name, f"cell of {size} bytes is larger than the {MAX_CELL_BYTES}-byte limit")


def _convert(file: Path, col: Column, source: str, cells: pa.ChunkedArray | None, n: int) -> pa.ChunkedArray | pa.Array:
    if cells is None:
        if col.kind == "string":
            return pa.array([""] * n, type=pa.string()) if n else pa.array([], type=pa.string())
        if col.kind == "json":
            return _empty_maps(n)
        return pa.nulls(n, type=_TYPES[col.kind])
    if pa.types.is_dictionary(cells.type):  # Parquet writers dictionary-encode repetitive columns
        cells = cells.cast(cells.type.value_type)
    if col.focus in NOT_NULL:
        missing = _first(pc.is_null(cells))
        if missing is None and _is_text(cells.type):
            missing = _first(pc.equal(cells, ""))
        if missing is not None:
            raise FocusError(file, missing + 1, source, "empty, but the spec does not allow null here")
    if col.kind == "string":  # without the blanks around a value: " i-0abc " matches no event's resource
        return pc.utf8_trim_whitespace(_to_string(file, source, cells).fill_null(""))
    if col.kind == "decimal":
        return _to_decimal(file, source, cells)
    if col.kind == "datetime":
        return _to_timestamp(file, source, cells)
    return _to_tags(file, source, cells)


def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _to_string(file: Path, source: str, cells: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_string(cells.type):
        return cells
    if pa.types.is_dictionary(cells.type):
        cells = cells.cast(cells.type.value_type)
    try:
        return cells.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise FocusError(file, None, source, f"a {cells.type} column where the spec says String") from None


def _bad_row(file: Path, source: str, cells: pa.ChunkedArray, cast: Any, what: str) -> FocusError:
    """Error path: find the first value `cast` rejects (slice by slice, then value by value), and name its row."""
    failures = (pa.ArrowInvalid, pa.ArrowNotImplementedError, OverflowError)
    step = 65536
    column = cells.combine_chunks()
    for start in range(0, len(column), step):
        piece = column.slice(start, step)
        try:
            cast(piece)
            continue
        except failures:
            pass
        for i, value in enumerate(piece.to_pylist()):
            if value is None:
                continue
            try:
                cast(pa.array([value], type=column.type))
            except failures:
                return FocusError(file, start + i + 1, source, f"{_show(value)} is not {_said(value, what)}")
    return FocusError(file, None, source, f"is not {what}")


def _said(value: Any, what: str) -> str:
    """What a rejected value is not: a decimal number written in text that is too large for the column is
    said to be so (it is a number, and "not a decimal number" sent the user looking for a typo)."""
    if what == _TEXT_DECIMAL and isinstance(value, str):
        try:
            number = decimal.Decimal(value.strip())
        except decimal.InvalidOperation:
            return what
        if number.is_finite():
            return _DECIMAL_RANGE
    return what


def _to_decimal(file: Path, source: str, cells: pa.ChunkedArray) -> pa.ChunkedArray:
    t = cells.type
    if pa.types.is_floating(t):
        cells = cells.cast(pa.string())  # shortest round-trip text: 0.1 stays 0.1, not 0.1000000000000000055
        t = cells.type
    if not (pa.types.is_integer(t) or pa.types.is_decimal(t) or _is_text(t)):
        raise FocusError(file, None, source, f"a {t} column where the spec says Decimal")

    def cast(a: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        if pa.types.is_integer(t) or (pa.types.is_decimal(t) and t.scale <= 12):
            return pc.cast(a, DECIMAL)
        return pc.cast(pc.round(pc.cast(a, _WIDE), 12), DECIMAL)

    try:
        return cast(cells)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        said = _TEXT_DECIMAL if _is_text(t) else _DECIMAL_RANGE
        raise _bad_row(file, source, cells, cast, said) from None


_ZONED = r"(Z|z|[+-]\d\d:?\d\d)$"
_DATE_ONLY = r"^\d{4}-\d\d-\d\d$"


def _to_timestamp(file: Path, source: str, cells: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_large_string(cells.type):  # Polars writes every text column so
        cells = cells.cast(pa.string())
    t = cells.type
    if pa.types.is_timestamp(t):
        return cells.cast(TIMESTAMP, safe=False)  # a naive timestamp's value is already UTC
    if pa.types.is_date(t):
        return cells.cast(pa.timestamp("ms")).cast(TIMESTAMP)
    if not _is_text(t):
        raise FocusError(file, None, source, f"a {t} column where the spec says Date/Time")

    def cast(a: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        zoned = pc.if_else(
            pc.match_substring_regex(a, _ZONED),
            a,
            pc.if_else(
                pc.match_substring_regex(a, _DATE_ONLY),
                pc.binary_join_element_wise(a, "T00:00:00Z", ""),
                pc.binary_join_element_wise(a, "Z", ""),
            ),
        )
        return pc.cast(pc.cast(zoned, pa.timestamp("ns", tz="UTC")), TIMESTAMP, safe=False)

    try:
        return cast(cells)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise _bad_row(file, source, cells, cast, "an ISO 8601 date/time") from None


def _empty_maps(n: int) -> pa.Array:
    return pa.MapArray.from_arrays(
        pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.string()), pa.array([], pa.string())
    )


def _tag_pairs(file: Path, source: str, text: str, row: int) -> list[tuple[str, str]]:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise FocusError(file, row, source, f"{_show(text)} is not JSON ({e.msg if hasattr(e, 'msg') else e})") from None
    if not isinstance(value, dict):
        raise FocusError(file, row, source, f"{_show(text)} is not a JSON object")
    # A key with a null value has none (tags.md: a provider MAY write such keys): left out, not the text 'null'.
    pairs = [(str(k), v if isinstance(v, str) else json.dumps(v)) for k, v in value.items() if v is not None]
    try:
        for k, v in pairs:
            k.encode(), v.encode()
    except UnicodeEncodeError as e:  # a \ud800 escape JSON allows: a lone surrogate, which no text holds
        raise FocusError(file, row, source, f"{_show(text)} is not text: {e.reason} at character {e.start}") from None
    return pairs


def _to_tags(file: Path, source: str, cells: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    t = cells.type
    if pa.types.is_map(t):
        try:
            maps = cells.cast(STR_MAP).combine_chunks()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise FocusError(file, None, source, f"a {t} column where the spec says JSON key-value") from None
        if maps.items.null_count:  # a key with a null value has none, as in JSON tags (rare: value by value)
            maps = pa.array([[(k, v) for k, v in m or [] if v is not None] for m in maps.to_pylist()], STR_MAP)
        return pc.if_else(pc.is_null(maps), _empty_maps(len(maps)), maps) if maps.null_count else maps
    if not _is_text(t):
        raise FocusError(file, None, source, f"a {t} column where the spec says JSON key-value")
    # Parse each distinct value once: a bill repeats the same few tag sets over millions of rows.
    encoded = pc.dictionary_encode(cells.combine_chunks())
    distinct = encoded.dictionary.to_pylist()
    offsets = [0]
    keys: list[str] = []
    values: list[str] = []
    indices = encoded.indices
    for code, text in enumerate(distinct):
        try:
            pairs = _tag_pairs(file, source, text, 0)
        except FocusError:  # error path: name the first row holding this value
            pairs = _tag_pairs(file, source, text, (_first(pc.equal(indices, code)) or 0) + 1)
        keys.extend(k for k, _ in pairs)
        values.extend(v for _, v in pairs)
        offsets.append(len(keys))
    unique_maps = pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(keys, pa.string()), pa.array(values, pa.string())
    )
    tags = unique_maps.take(indices)
    if tags.null_count:
        tags = pc.if_else(pc.is_null(indices), _empty_maps(len(tags)), tags)
    return tags


def _x_columns(file: Path, raw: pa.Table, extra: Sequence[str]) -> pa.Array:
    """Every column the normalized table has no place for, as text, in one map per row (null cells left out)."""
    n = raw.num_rows
    k = len(extra)
    if k == 0 or n == 0:
        return _empty_maps(n)
    texts = [_as_text(file, name, raw.column(name)) for name in extra]
    valid = np.stack([pc.is_valid(t).to_numpy(zero_copy_only=False) for t in texts], axis=1)  # n x k
    stacked = pa.concat_arrays([t.combine_chunks() if isinstance(t, pa.ChunkedArray) else t for t in texts])
    # Row-major order (row 0's columns, then row 1's, ...) of the column-major concatenation, valid cells only.
    order = (np.arange(k)[None, :] * n + np.arange(n)[:, None])[valid]
    key_codes = np.broadcast_to(np.arange(k)[None, :], (n, k))[valid]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(valid.sum(axis=1), out=offsets[1:])
    keys = pa.array(list(extra), pa.string()).take(pa.array(key_codes))
    values = stacked.take(pa.array(order))
    return pa.MapArray.from_arrays(pa.array(offsets), keys, values)


def _as_text(file: Path, name: str, cells: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_string(cells.type):
        return cells
    try:
        return _to_string(file, name, cells)
    except FocusError:
        # Nested Parquet types (lists, structs) have no cast to text: their JSON text, value by value.
        return pa.chunked_array([pa.array([None if v is None else json.dumps(v, default=str) for v in cells.to_pylist()],
                                          pa.string())])


def _check_periods(file: Path, out: dict[str, pa.ChunkedArray | pa.Array], max_usd_per_hour: float) -> None:
    """Charge periods within the dates events may carry, and not ending before they start; an hour of a
    resource's usage (the rows that price its hours, :mod:`detector.billing.rates`) at no more than
    ``max_usd_per_hour``, as its events: an absurd rate would price events and re-price incidents. Other
    charges are not bounded: a query engine's or a bucket's egress may cost thousands an hour."""
    start, end = out["charge_period_start"], out["charge_period_end"]
    for column, cells in (("ChargePeriodStart", start), ("ChargePeriodEnd", end)):
        outside = _first(pc.or_(pc.less(cells, pa.scalar(TS_MIN, TIMESTAMP)), pc.greater(cells, pa.scalar(TS_MAX, TIMESTAMP))))
        if outside is not None:
            raise FocusError(file, outside + 1, column, f"{cells[outside].as_py().isoformat()} is outside "
                                                        f"{TS_MIN:%Y-%m-%d} to {TS_MAX:%Y-%m-%d}")  # fmt: skip
    backwards = _first(pc.less(end, start))
    if backwards is not None:
        raise FocusError(file, backwards + 1, "ChargePeriodEnd",
                         f"{end[backwards].as_py().isoformat()} is before ChargePeriodStart "
                         f"{start[backwards].as_py().isoformat()}")  # fmt: skip
    quantity = pc.cast(out["consumed_quantity"], pa.float64())
    prices_hours = hour_rows(out)
    for column, name in (("effective_cost", "EffectiveCost"), ("billed_cost", "BilledCost")):
        rate = pc.divide(pc.abs(pc.cast(out[column], pa.float64())), quantity)
        row = _first(pc.and_(prices_hours, pc.greater(rate, max_usd_per_hour)).fill_null(False))
        if row is not None:
            raise FocusError(file, row + 1, name, f"${out[column][row].as_py():,.2f} for {quantity[row].as_py():g} "
                                                  f"hour(s) of {_show(out['resource_id'][row].as_py())} is "
                                                  f"${rate[row].as_py():,.2f}/h, above the plausible "
                                                  f"${max_usd_per_hour:,.2f}/h (limits.yaml's max_usd_per_hour)")  # fmt: skip


def _check_values(file: Path, out: dict[str, pa.ChunkedArray | pa.Array], currency: str) -> None:
    for col in NORMALIZED:
        if col.allowed is None:
            continue
        cells = out[col.name]
        outside = pc.and_(pc.not_equal(cells, ""), pc.invert(pc.is_in(cells, pa.array(sorted(col.allowed)))))
        row = _first(outside)
        if row is not None:
            raise FocusError(
                file, row + 1, col.focus,
                f"{_show(cells[row].as_py())} is not one of the spec's values ({', '.join(sorted(col.allowed))})",
            )
    wrong = _first(pc.not_equal(out["billing_currency"], currency))
    if wrong is not None:
        found = out["billing_currency"][wrong].as_py()
        raise FocusError(
            file, wrong + 1, "BillingCurrency",
            f"currency {_show(found)} is not the configured currency {currency!r}",
        )
