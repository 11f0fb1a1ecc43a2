"""Labelled series (the Cloud Monitoring Dataset's CSV format) read into the event contract."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from detector.events import TOPIC_RESOURCE_USAGE, EventDecoder, UsageEvent
from detector.series import SeriesError, read_series, read_series_dir, replay_records

DATASET = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "ms-cloud-monitoring" / "data"
HOUR = 3600.0


def write(path: Path, rows: list[str], header: str = "TimeStamp,Value,Label") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_rows_become_samples_and_runs_of_label_1_become_windows(tmp_path):
    f = write(tmp_path / "crash" / "app-01.csv", [
        '"2018-07-03T14:00:00Z",1,0', '"2018-07-03T15:00:00Z","2.5","1"', "2018-07-03 16:00:00,3,1",
        "2018-07-03 17:00:00,,0", "2018-07-03 18:00:00,5,1",
    ])  # fmt: skip
    s = read_series(f)
    assert (s.name, s.kind) == ("crash/app-01", "crash")
    assert s.values == [1.0, 2.5, 3.0, None, 5.0]
    t0 = s.times[0]
    assert s.step_s == HOUR
    assert [(a - t0, b - t0) for a, b in s.windows] == [(HOUR, 2 * HOUR), (4 * HOUR, 4 * HOUR)]


def test_a_repeated_row_is_one_sample_labelled_if_either_is(tmp_path):
    f = write(tmp_path / "d" / "s.csv", ["2018-07-03 14:00:00,1,0", "2018-07-03 14:00:00,1,1", "2018-07-03 15:00:00,2,0"])
    s = read_series(f)
    assert (len(s.times), s.duplicates, s.labels) == (2, 1, [1, 0])


@pytest.mark.parametrize(
    "row, where",
    [
        ("2018-07-03 15:00:00,abc,0", ":3: column Value: 'abc' is not a number"),
        ("2018-07-03 15:00:00,1e999,0", ":3: column Value: '1e999' is not a finite number"),
        ("yesterday,1,0", ":3: column TimeStamp: 'yesterday' is not an ISO 8601 time"),
        ("2018-07-03 13:00:00,1,0", ":3: column TimeStamp: '2018-07-03 13:00:00' is before the row above"),
        ("2018-07-03 15:00:00,1,2", ":3: column Label: '2' is not 0 or 1"),
        ("2018-07-03 15:00:00,1", ":3: expected 3 columns"),
    ],
)
def test_a_bad_row_is_an_error_naming_file_line_and_column(tmp_path, row, where):
    f = write(tmp_path / "d" / "s.csv", ["2018-07-03 14:00:00,1,0", row])
    with pytest.raises(SeriesError) as info:
        read_series(f)
    assert str(info.value).startswith(f"{f}{where}")


def test_a_file_without_the_header_is_refused(tmp_path):
    f = write(tmp_path / "d" / "s.csv", ["2018-07-03 14:00:00,1,0"], header="time,value")
    with pytest.raises(SeriesError, match=r"s\.csv:1: expected the header TimeStamp,Value,Label"):
        read_series(f)


def test_replay_records_are_usage_events_the_decoder_accepts(tmp_path):
    f = write(tmp_path / "ingress" / "i-01.csv", ["2018-04-25T00:00:00Z,10.5,0", "2018-04-25T00:01:00Z,,0",
                                                  "2018-04-25T00:02:00Z,-3,1"])  # fmt: skip
    records = list(replay_records(read_series(f)))
    assert [topic for _, topic, _, _ in records] == [TOPIC_RESOURCE_USAGE] * 2  # the missing sample sends nothing
    decoder = EventDecoder(clock=lambda: 2e9)
    events = [decoder.decode(topic, msgspec.json.encode(value))[0] for _, topic, _, value in records]
    assert all(isinstance(e, UsageEvent) for e in events)
    assert [(e.resource_id, e.resource_type, e.interval_s, e.metrics) for e in events] == [
        ("ingress/i-01", "ingress", 60.0, {"value": 10.5}), ("ingress/i-01", "ingress", 60.0, {"value": -3.0})]


def test_a_directory_is_read_domain_by_domain(tmp_path):
    write(tmp_path / "b" / "s2.csv", ["2018-07-03 14:00:00,1,0"])
    write(tmp_path / "a" / "s1.csv", ["2018-07-03 14:00:00,1,0"])
    assert [s.name for s in read_series_dir(tmp_path)] == ["a/s1", "b/s2"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(SeriesError, match="no \\*.csv series"):
        read_series_dir(tmp_path / "empty")


@pytest.mark.skipif(not DATASET.is_dir(), reason="the Cloud Monitoring Dataset is not in ../shared/datasets")
def test_a_real_file_of_the_dataset():
    """api-01: hourly, 6,192 rows after the header (one repeats a timestamp), 120 labelled (counted with grep)."""
    s = read_series(DATASET / "ecommerce-api-incoming-rps" / "api-01.csv")
    assert (s.kind, s.step_s, s.duplicates) == ("ecommerce-api-incoming-rps", HOUR, 1)
    assert len(s.times) == 6192 - 1
    assert sum(s.labels) == 120 and len(s.windows) == 19
