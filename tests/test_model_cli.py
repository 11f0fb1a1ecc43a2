"""``model train --from``, ``model show`` and ``backtest --scores`` (issue 14): the anomaly model
trained from a replay file of a labelled series, what its threshold means, and every judged
window written to a CSV a benchmark's own scorer can read.

The CLI runs in-process (``streams.cli.main``): none of these commands opens the store, so the
test process's own embedded ClickHouse is not in the way. The series is synthetic and small: 400
hourly samples of noise around a level, one large spike near the end, labelled."""

from __future__ import annotations

import csv
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from detector.model.forest import ALERTS_PER_1000H, ModelSet
from detector.replay import write_replay
from detector.series import Series, read_series, replay_records
from detector.units import rfc3339
from streams.cli import EXIT_FAILED, main
from tests.conftest import ROOT
from tests.helpers import burnwatch_in_process

HOURS = 400
SPIKE = 360
TRAIN_HOURS = 200
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
HEADER = ["resource_id", "group", "window_start", "window_end", "score", "threshold", "evidence", "run", "budget",
          "decision", "rule_tracking"]  # fmt: skip


def write_series_csv(path: Path) -> Path:
    """``TimeStamp,Value,Label``: noise around 50, a +40 spike at hour ``SPIKE`` (labelled)."""
    rng = np.random.default_rng(1)
    with open(path, "w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["TimeStamp", "Value", "Label"])
        for i in range(HOURS):
            value = 50 + rng.normal(0, 1) + (40 if i == SPIKE else 0)
            out.writerow([(T0 + timedelta(hours=i)).strftime("%Y-%m-%d %H:%M:%S"), f"{value:.3f}", int(i == SPIKE)])
    return path


def write_replay_file(series: Series, path: Path) -> Path:
    with open(path, "wb") as out:
        write_replay(replay_records(series), out)
    return path


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> Series:
    return read_series(write_series_csv(tmp_path_factory.mktemp("series") / "cpu-01.csv"))


@pytest.fixture(scope="module")
def replay(series, tmp_path_factory) -> Path:
    return write_replay_file(series, tmp_path_factory.mktemp("replay") / "series.jsonl")


@pytest.fixture(autouse=True)
def environment(monkeypatch, tmp_path):
    """No setting from the environment this runs in; a data directory with nothing in it."""
    import os

    for key in list(os.environ):
        if key.startswith(("BURNWATCH_", "SLACK_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("BURNWATCH_DATA_DIR", str(tmp_path / "data"))
    # In-process, the command would bind structlog (process-wide) to this test's captured stderr,
    # which pytest closes after it: every later test would fail on its first log line. The
    # process keeps the logging it has; what these tests read is the commands' own output.
    monkeypatch.setattr("streams.cli.configure_logging", lambda *args, **kwargs: None)


burnwatch = burnwatch_in_process


def rules() -> list[str]:
    return ["--rules", str(ROOT / "rules")]


def until(series: Series) -> str:
    return rfc3339(series.times[TRAIN_HOURS])


@pytest.fixture(scope="module")
def trained(series, replay, tmp_path_factory) -> Path:
    """A model directory trained on the series' first ``TRAIN_HOURS`` hours, as the CLI trains it."""
    from detector.model.train import anomaly_ruleset, train_from_file
    from detector.rules import load_rules

    models = tmp_path_factory.mktemp("models")
    train_from_file(replay, anomaly_ruleset(load_rules(ROOT / "rules"), ["value"]), models,
                    until=series.times[TRAIN_HOURS])  # fmt: skip
    return models


def read_scores(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        reader = csv.reader(handle)
        assert next(reader) == HEADER
        return [dict(zip(HEADER, row, strict=True)) for row in reader]


# -- model train --from ---------------------------------------------------------------------------


def test_model_train_from_a_replay_file_trains_the_series_group_up_to_until(capsys, series, replay, tmp_path):
    """An unknown resource type (the series' domain) is scored by the ``cpu`` group, with the
    series' value as a generic metric; only windows ending by --until are learnt."""
    models = tmp_path / "models"
    code, out, err = burnwatch(capsys, "model", "train", "--from", str(replay), "--until", until(series),
                               "--metrics", "value", "--dir", str(models), *rules())  # fmt: skip
    assert code == 0, err
    loaded = ModelSet.load(models)
    assert sorted(loaded.artifacts) == ["cpu"]
    artifact = loaded.artifacts["cpu"]
    assert "metric.value" in artifact.features and "metric.value_z" in artifact.features
    assert artifact.trained_to <= series.times[TRAIN_HOURS]  # nothing after --until was learnt
    assert artifact.calibration["alerts_per_1000h"] == ALERTS_PER_1000H  # the default rate
    lines = out.splitlines()
    assert lines[0].startswith(f"cpu: {artifact.samples} windows, 0 left out (behaviour incidents); trained on "
                               f"{artifact.samples}, threshold {artifact.threshold:.4f}")  # fmt: skip
    assert lines[1].strip() == artifact.explain()
    assert lines[-1].startswith(f"trained 1 of 1 groups; artifacts in {models}")
    assert "store:" not in err  # a replay file needs no store
    assert not (tmp_path / "data").exists()


def test_model_train_that_cannot_write_a_file_says_what_it_replaced(capsys, series, replay, tmp_path):
    """The file people read (cpu.json) cannot be written (a directory stands in for a full disk): the model
    file was replaced before it, and the command says so; it said "nothing was trained"."""
    models = tmp_path / "models"
    (models / "cpu.json").mkdir(parents=True)
    code, _, said = burnwatch(capsys, "model", "train", "--from", str(replay), "--until", until(series),
                              "--metrics", "value", "--dir", str(models), *rules())  # fmt: skip
    assert code == 1 and "cpu.json" in said and "the models of cpu were replaced before it" in said, said
    assert "nothing was trained" not in said and "Traceback" not in said
    assert sorted(ModelSet.load(models).artifacts) == ["cpu"]


def test_model_train_until_in_epoch_seconds_and_a_stated_alert_rate(capsys, series, replay, tmp_path):
    models = tmp_path / "models"
    code, out, err = burnwatch(capsys, "model", "train", "--from", str(replay), "--until", str(series.times[100]),
                               "--metrics", "value", "--alerts-per-1000h", "2", "--dir", str(models), *rules())  # fmt: skip
    assert code == 0, err
    artifact = ModelSet.load(models).artifacts["cpu"]
    assert artifact.trained_to <= series.times[100] and artifact.samples <= 100  # windows 0-99 end by then
    assert artifact.calibration["alerts_per_1000h"] == 2.0
    assert "calibrated to 2 alerts per 1,000 resource-hours" in out


def test_model_train_help_states_the_default_alert_rate(capsys):
    """The help says the default without importing the model (the CLI starts fast): it must say
    the model's."""
    with pytest.raises(SystemExit):
        main(["model", "train", "--help"])
    assert f"(default {ALERTS_PER_1000H:g}: ALERTS_PER_1000H)" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("argv, said", [
    (["--from", "MISSING"], "missing.jsonl: No such file or directory; nothing was trained"),
    (["--from", "SERIES_CSV"], "not a replay record"),
    (["--from", "REPLAY", "--until", "yesterday"], "--until 'yesterday': expected an RFC 3339 time"),
    (["--from", "REPLAY", "--until", "2026-01-09T08:00:00"], "--until '2026-01-09T08:00:00': give the time zone"),
    (["--from", "REPLAY", "--until", "nan"], "--until 'nan': expected epoch seconds"),
    (["--from", "REPLAY", "--until", "2025-12-31T00:00:00Z"],
     "trained nothing: no window of REPLAY ends by --until 2025-12-31T00:00:00Z: nothing to learn from"),
    (["--from", "REPLAY", "--metrics", "value,cpu util"], "--metrics 'value,cpu util': 'cpu util' is not a metric name"),
    (["--from", "REPLAY", "--metrics", "value,"], "'' is not a metric name"),
    (["--from", "REPLAY", "--metrics", ",".join(f"m{i}" for i in range(40))], "--metrics: the anomaly rule refuses"),
    (["--from", "REPLAY", "--alerts-per-1000h", "0"], "--alerts-per-1000h 0.0: expected a number of alerts per 1,000"),
    (["--from", "REPLAY", "--alerts-per-1000h", "inf"], "--alerts-per-1000h inf: expected a number of alerts"),
    (["--from", "REPLAY", "--alerts-per-1000h", "1e-306"], "from 1e-06 to 1e+06"),
    (["--from", "REPLAY", "--since", "7d"], "replay file (--from) or the events stored in ClickHouse (--since), not both"),
    (["--until", "2026-01-09T08:00:00Z"], "--until works with --from FILE"),
])  # fmt: skip
def test_model_train_refuses_bad_input_in_one_line(capsys, series, replay, tmp_path, argv, said):
    """Each refusal: one clear message naming what is wrong, exit 1, no traceback, no model written."""
    names = {"MISSING": str(tmp_path / "missing.jsonl"), "REPLAY": str(replay),
             "SERIES_CSV": str(write_series_csv(tmp_path / "cpu-01.csv"))}  # a series, not a replay file
    argv = [names.get(a, a) for a in argv]
    said = said.replace("REPLAY", str(replay))
    models = tmp_path / "models"
    code, out, err = burnwatch(capsys, "model", "train", *argv, "--dir", str(models), *rules())
    assert code == EXIT_FAILED, out
    assert said in err, err
    assert not list(models.glob("*.skops"))


def test_model_train_from_a_file_too_short_to_learn_says_why(capsys, series, tmp_path):
    """A file whose windows are fewer than a group needs: what there was, and what stays in use."""
    short = Series(name=series.name, kind=series.kind, times=series.times[:30], values=series.values[:30],
                   labels=series.labels[:30])  # fmt: skip
    path = write_replay_file(short, tmp_path / "short.jsonl")
    code, out, err = burnwatch(capsys, "model", "train", "--from", str(path), "--metrics", "value", "--dir",
                               str(tmp_path / "models"), *rules())  # fmt: skip
    assert code == EXIT_FAILED
    # hours 0 to 28 (the first 6 h judged against the fleet): the last window never closes
    assert out.startswith("cpu: 29 windows, 0 left out")
    assert f"trained nothing: 29 windows in {path}" in err and "holds no model" in err


# -- model show -----------------------------------------------------------------------------------


def test_model_show_says_a_directory_that_is_none(capsys, tmp_path):
    """A mistyped --dir said "no model", as an empty directory does; a file said the same."""
    code, out, _ = burnwatch(capsys, "model", "show", "--dir", str(tmp_path / "typo"))
    assert code == 0 and out.strip() == f"no model in {tmp_path / 'typo'} (no such directory): the worker runs rules only"
    (tmp_path / "file").write_text("")
    code, _, err = burnwatch(capsys, "model", "show", "--dir", str(tmp_path / "file"))
    assert code == 1 and err.strip().startswith(f"{tmp_path / 'file'}: not a directory"), err


def test_model_show_says_what_each_threshold_means(capsys, trained):
    code, out, err = burnwatch(capsys, "model", "show", "--dir", str(trained))
    assert code == 0, err
    artifact = ModelSet.load(trained).artifacts["cpu"]
    assert f"cpu: {artifact.explain()}" in out.splitlines()
    assert "alerts per 1,000 resource-hours" in artifact.explain()
    assert '"group": "cpu"' in out  # the metadata, as before


# -- backtest --scores ----------------------------------------------------------------------------


def test_backtest_scores_writes_every_judged_window(capsys, series, replay, trained, tmp_path):
    """Every window the model judges, one row each, in RFC 3339, with finite scores; the spike's
    window is the one that alerts."""
    from detector.model.train import anomaly_ruleset, train_from_file
    from detector.rules import load_rules

    out_csv = tmp_path / "scores.csv"
    code, out, err = burnwatch(capsys, "backtest", str(replay), "--scores", str(out_csv), "--model-dir",
                               str(trained), "--metrics", "value", *rules())  # fmt: skip
    assert code == 0, err
    rows = read_scores(out_csv)
    # the windows the anomaly rule closes over the whole file, collected as training collects them
    _, everything = train_from_file(replay, anomaly_ruleset(load_rules(ROOT / "rules"), ["value"]), tmp_path / "all")
    windows = sorted(w.start for w in everything.windows["cpu"])
    assert [r["window_start"] for r in rows] == [rfc3339(t) for t in windows]
    assert len(rows) == len(windows) > HOURS - 24
    assert {r["resource_id"] for r in rows} == {series.name} and {r["group"] for r in rows} == {"cpu"}
    assert all(r["window_end"] == rfc3339(t + 300) for r, t in zip(rows, windows, strict=True))
    assert all(math.isfinite(float(r[k])) for r in rows for k in ("score", "threshold", "evidence", "run", "budget"))
    assert {r["decision"] for r in rows} <= {"normal", "unusual", "alert", "open"}
    assert {r["rule_tracking"] for r in rows} <= {"true", "false"}
    # evidence is -log10 of a share, never below 0: a window as common as any read "-0.0"
    assert not [r for r in rows for k in ("evidence", "run") if r[k].startswith("-")]
    alerts = [r for r in rows if r["decision"] == "alert"]
    assert [r["window_start"] for r in alerts] == [rfc3339(series.times[SPIKE])]
    spike = alerts[0]
    assert float(spike["score"]) > float(spike["threshold"]) and float(spike["evidence"]) >= float(spike["budget"])
    assert f"{len(rows)} judged windows written to {out_csv}" in err


def test_backtest_scores_quotes_hostile_resource_ids_and_defuses_formulas(capsys, series, trained, tmp_path):
    """Resource ids come from anyone's events: commas and quotes are quoted by the csv module, and
    one that starts like a spreadsheet formula is written as text (a leading ')."""
    ids = ['=HYPERLINK("http://x","a,b")', 'plain "quoted", id', "-2+3", "@SUM(A1)"]
    path = tmp_path / "hostile.jsonl"
    with open(path, "wb") as out:
        for rid in ids:
            copy = Series(name=rid, kind=series.kind, times=series.times, values=series.values, labels=series.labels)
            write_replay(replay_records(copy), out)
    out_csv = tmp_path / "scores.csv"
    code, _, err = burnwatch(capsys, "backtest", str(path), "--scores", str(out_csv), "--model-dir", str(trained),
                             "--metrics", "value", *rules())  # fmt: skip
    assert code == 0, err
    written = {r["resource_id"] for r in read_scores(out_csv)}
    assert written == {"'" + ids[0], ids[1], "'" + ids[2], "'" + ids[3]}
    assert all(not line.startswith(("=", "+", "-", "@")) for line in out_csv.read_text().splitlines())


def test_backtest_scores_without_a_model_says_there_is_nothing_to_score(capsys, replay, tmp_path):
    out_csv = tmp_path / "scores.csv"
    code, out, err = burnwatch(capsys, "backtest", str(replay), "--scores", str(out_csv), "--model-dir",
                               str(tmp_path / "empty"), *rules())  # fmt: skip
    assert code == EXIT_FAILED
    assert f"no model in {tmp_path / 'empty'}: nothing to score" in err
    assert not out_csv.exists() and not out


def test_backtest_scores_reads_the_settings_model_dir_by_default(capsys, replay, trained, tmp_path, monkeypatch):
    monkeypatch.setenv("BURNWATCH_MODEL_DIR", str(trained))
    out_csv = tmp_path / "scores.csv"
    code, _, err = burnwatch(capsys, "backtest", str(replay), "--scores", str(out_csv), "--metrics", "value", *rules())
    assert code == 0, err
    assert read_scores(out_csv)


def test_backtest_scores_with_other_metrics_than_training_says_why_nothing_was_judged(capsys, replay, trained,
                                                                                    tmp_path):  # fmt: skip
    """A model trained on ``value`` cannot score windows built without it: said, with the remedy."""
    out_csv = tmp_path / "scores.csv"
    code, _, err = burnwatch(capsys, "backtest", str(replay), "--scores", str(out_csv), "--model-dir", str(trained),
                             *rules())  # fmt: skip
    assert code == EXIT_FAILED
    assert "no window was judged" in err and "cpu on metrics [value]" in err and "--metrics must name" in err
    assert read_scores(out_csv) == []
    code, _, err = burnwatch(capsys, "backtest", str(replay), "--model-dir", str(trained), *rules())
    assert code == 0 and "--model-dir: the model judged no window" in err and "--metrics must name" in err  # it was silent
    code, _, err = burnwatch(capsys, "backtest", str(replay), "--model-dir", str(trained), "--metrics", "value", *rules())
    assert code == 0 and "judged no window" not in err, err


@pytest.mark.parametrize("argv, said", [
    (["--since", "1d"], "--scores, --model-dir and --metrics work with a replay file, not --since"),
    (["REPLAY", "--metrics", "a b"], "'a b' is not a metric name"),
    (["REPLAY", "--scores", "NODIR/scores.csv"], "--scores NODIR/scores.csv: No such file or directory"),
    (["MISSING"], "missing.jsonl: No such file or directory"),
    (["REPLAY", "--scores", "REPLAY"], "that is the replay file being read; name another file"),
])  # fmt: skip
def test_backtest_scores_refuses_bad_input_in_one_line(capsys, replay, trained, tmp_path, argv, said):
    names = {"REPLAY": str(replay), "MISSING": str(tmp_path / "missing.jsonl"),
             "NODIR/scores.csv": str(tmp_path / "nodir" / "scores.csv")}  # fmt: skip
    argv = [names.get(a, a) for a in argv]
    if "--scores" not in argv:
        argv += ["--scores", str(tmp_path / "scores.csv")]
    said = said.replace("NODIR", str(tmp_path / "nodir"))
    code, _, err = burnwatch(capsys, "backtest", *argv, "--model-dir", str(trained), *rules())
    assert code == EXIT_FAILED
    assert said in err, err
    assert not (tmp_path / "scores.csv").exists()  # nothing half-written left behind
    assert replay.stat().st_size > 0  # the replay file is never opened for writing


@pytest.mark.parametrize("suffix", [".skops", ".json"])
def test_backtest_scores_refuses_to_write_over_the_model_it_reads(capsys, replay, trained, suffix):
    """``--scores`` onto a model's file (its forest, its metadata) emptied it: the CSV was opened for
    writing, then removed on the refusal that followed. A model's files are never a scores file."""
    before = {p.name: p.read_bytes() for p in trained.iterdir() if p.is_file()}
    target = trained / next(name for name in before if name.endswith(suffix))
    code, _, err = burnwatch(capsys, "backtest", str(replay), "--scores", str(target), "--model-dir", str(trained),
                             "--metrics", "value", *rules())  # fmt: skip
    assert code == EXIT_FAILED
    assert "that is a model's file, which the CSV would replace" in err, err
    assert {p.name: p.read_bytes() for p in trained.iterdir() if p.is_file()} == before
