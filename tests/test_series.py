"""Labelled series (the Cloud Monitoring Dataset's CSV format) read into the event contract."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
import pytest

from detector.events import TOPIC_RESOURCE_USAGE, EventDecoder, UsageEvent
from detector.series import SeriesError, read_series, read_series_dir, replay_records
from detector.series_eval import evaluate_series, first_of_runs, naive_forest, score
from detector.store import EventBatch
from tests.conftest import DATASET, needs_dataset

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
    empty = tmp_path / "d" / "empty.csv"
    empty.write_text("")
    with pytest.raises(SeriesError, match=r"empty\.csv:1: expected the header TimeStamp,Value,Label, got an empty file$"):
        read_series(empty)


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


@needs_dataset
def test_a_real_file_of_the_dataset():
    """api-01: hourly, 6,192 rows after the header (one repeats a timestamp), 120 labelled (counted with grep)."""
    s = read_series(DATASET / "ecommerce-api-incoming-rps" / "api-01.csv")
    assert (s.kind, s.step_s, s.duplicates) == ("ecommerce-api-incoming-rps", HOUR, 1)
    assert len(s.times) == 6192 - 1
    assert sum(s.labels) == 120 and len(s.windows) == 19


# -- event-level scoring ------------------------------------------------------------------

W = [(100.0, 200.0), (500.0, 500.0)]  # two labelled windows: a long one and a single sample
TOL = 30.0


@pytest.mark.parametrize(
    "alerts, found, false_alerts",
    [
        pytest.param([150.0], 1, 0, id="inside-found"),  # one alert inside a window finds it
        pytest.param([100.0, 150.0, 200.0], 1, 0, id="found-once"),  # more alerts in it: found once, none false
        pytest.param([100.0, 500.0], 2, 0, id="both-edges"),  # a window's first sample and a one-sample window
        pytest.param([230.0], 1, 0, id="tolerance-edge"),  # exactly `tolerance` after the last sample: still found
        pytest.param([230.5], 0, 1, id="past-tolerance"),  # just beyond it: a false positive, the window missed
        pytest.param([99.0], 0, 1, id="just-before"),  # before a window starts: no tolerance on that side
        pytest.param([300.0, 310.0, 150.0], 1, 2, id="false-positives"),  # every alert outside counts
        pytest.param([], 0, 0, id="silent"),  # a detector that never fires: recall 0, no precision
    ],
)
def test_event_level_score(alerts, found, false_alerts):
    s = score(W, alerts, TOL)
    assert (s.windows, s.found, s.false_alerts, s.alerts) == (2, found, false_alerts, len(alerts))


def test_scores_without_labels_count_only_false_alerts():
    s = score([], [10.0, 20.0], TOL)  # a series with no labelled anomaly: every alert is false
    assert (s.found, s.false_alerts, s.recall, s.precision, s.f1) == (0, 2, None, 0.0, None)


def test_precision_recall_f1():
    s = score(W, [150.0, 300.0, 310.0], TOL)  # 1 of 2 found, 2 false
    assert (s.precision, s.recall) == (pytest.approx(1 / 3), 0.5)
    assert s.f1 == pytest.approx(2 * (1 / 3) * 0.5 / (1 / 3 + 0.5))
    assert score(W, [], TOL).f1 == 0.0


def test_the_training_part_is_left_out_of_the_score(tmp_path):
    """20 hourly samples, windows at hours 1 and 15; trained on the first 25 %: the first is left out,
    and so is an alert raised before training ends."""
    rows = [f"2018-07-03T{h:02d}:00:00Z,1,{int(h in (1, 15))}" for h in range(20)]
    s = read_series(write(tmp_path / "d" / "s.csv", rows))
    t0 = s.times[0]
    result = evaluate_series(s, lambda series, until: [t0 + HOUR, t0 + 15 * HOUR], train_fraction=0.25)
    assert (result.windows, result.found, result.false_alerts) == (1, 1, 0)


@pytest.mark.parametrize(
    "flags, alerts",
    [
        ([0, 1, 1, 1, 0], [1]),  # a run of three anomalous samples is one alert, at its first
        ([1, 0, 1, 1, 0, 1], [0, 2, 5]),  # separate runs: one alert each, the first and last samples included
        ([0, 0, 0], []),  # nothing anomalous: no alert
    ],
)
def test_consecutive_anomalous_samples_are_one_alert(flags, alerts):
    assert first_of_runs([float(i) for i in range(len(flags))], [bool(f) for f in flags]) == [float(a) for a in alerts]


NOISE = np.random.default_rng(0).normal(100.0, 1.0, 1000)
"""A normal series (fixed seed): a forest learns its centre as normal and its far tails as not."""


def _noisy(i: int) -> float:
    return float(NOISE[i])


def test_the_naive_forest_finds_spikes_far_outside_its_training(tmp_path):
    calm = [100.0]  # the centre, next to each run, so a run's start is where its spike starts
    values = [_noisy(i) for i in range(59)] + calm + [1e6] * 3 + calm * 10 + [1e6] * 2 + calm
    rows = [f"2018-07-0{1 + i // 24}T{i % 24:02d}:00:00Z,{v},0" for i, v in enumerate(values)]
    s = read_series(write(tmp_path / "d" / "s.csv", rows))
    alerts = naive_forest(s, s.times[50])
    assert s.times[60] in alerts and s.times[73] in alerts
    assert s.times[61] not in alerts and s.times[74] not in alerts  # the rest of each run is the same alert
    assert all(t >= s.times[50] for t in alerts)


# -- the command line ---------------------------------------------------------------------


def _hourly(path: Path, spike_at: int | None) -> None:
    rows = []
    for i in range(480):
        value = 1e6 if i == spike_at else _noisy(i)
        rows.append(f"2018-07-{1 + i // 24:02d}T{i % 24:02d}:00:00Z,{value},{int(i == spike_at)}")  # 20 days
    write(path, rows)


def test_eval_series_end_to_end(tmp_path):
    """Two series: one with a labelled spike, one without labels. burnwatch (the rules and a model
    trained on each series' first 15 % through the replay path) finds the spike with no false
    alert on either; the naive forest finds it too, and pays for its tails in false alerts."""
    _hourly(tmp_path / "svc" / "labelled.csv", spike_at=400)
    _hourly(tmp_path / "svc" / "clean.csv", spike_at=None)
    out = subprocess.run([sys.executable, "-m", "streams.cli", "eval", "--series", str(tmp_path), "--json"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [s["name"] for s in report["series"]] == ["svc/clean", "svc/labelled"]
    assert report["unlabelled_series"] == 1
    ours, naive = report["overall"]["burnwatch"], report["overall"]["naive_iforest"]
    assert (ours["windows"], ours["found"], ours["false_alerts"]) == (1, 1, 0)
    assert (naive["windows"], naive["found"]) == (1, 1)
    assert report["false_alerts_unlabelled"]["burnwatch"] == 0
    clean, labelled = report["series"]
    # the totals add up each kind of series on its own side: unlabelled ones only as false alerts
    assert report["false_alerts_unlabelled"]["naive_iforest"] == clean["naive_iforest"]["false_alerts"]
    assert naive["false_alerts"] == labelled["naive_iforest"]["false_alerts"]
    assert labelled["naive_iforest"]["false_alerts"] > 0  # the normal tails: what a naive model pays


def test_eval_series_refuses_a_bad_file_in_one_line(tmp_path):
    write(tmp_path / "svc" / "bad.csv", ["2018-07-01T00:00:00Z,1,0", "2018-07-01T01:00:00Z,oops,0"])
    out = subprocess.run([sys.executable, "-m", "streams.cli", "eval", "--series", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode != 0
    assert out.stderr.strip() == f"{tmp_path / 'svc' / 'bad.csv'}:3: column Value: 'oops' is not a number"


def test_eval_series_refuses_a_series_burnwatch_cannot_replay_in_one_line(tmp_path):
    """A series from before 1970: its rows are valid CSV, but no event of burnwatch can carry them. It was a
    traceback."""
    write(tmp_path / "svc" / "old.csv", ["1960-01-01T00:00:00Z,1,0", "1960-01-01T01:00:00Z,2,0"])
    out = subprocess.run([sys.executable, "-m", "streams.cli", "eval", "--series", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("svc/old: line 2 of its file is refused as burnwatch refuses events: timestamp "
                                 "1960-01-01T00:00:00+00:00 is before 1970"), out.stderr  # fmt: skip


def test_series_events_keep_their_metric_through_the_store(store, tmp_path):
    """The generic metric is stored (migration 0011) and read back as the event that was sent."""
    f = write(tmp_path / "ingress" / "i-01.csv", ["2018-04-25T00:00:00Z,10.5,0", "2018-04-25T00:01:00Z,-3,0"])
    decoder = EventDecoder(clock=lambda: 2e9)
    sent = [decoder.decode(topic, msgspec.json.encode(value))[0] for _, topic, _, value in replay_records(read_series(f))]
    batch = EventBatch()
    batch.extend(sent)
    assert store.events.insert(batch) == 2
    back = [event for _, event in store.history.between(0, 2e9)]
    assert [e.metrics for e in back] == [{"value": 10.5}, {"value": -3.0}]
    assert back == sent


def test_a_file_that_is_not_text_or_not_there_is_one_clear_error(tmp_path):
    binary = tmp_path / "d" / "bin.csv"
    binary.parent.mkdir()
    binary.write_bytes(b"TimeStamp,Value,Label\n\xff\xfe,1,0\n")
    with pytest.raises(SeriesError, match=r"bin\.csv: not UTF-8 text"):
        read_series(binary)
    with pytest.raises(SeriesError, match=r"gone\.csv: No such file"):
        read_series(tmp_path / "d" / "gone.csv")
