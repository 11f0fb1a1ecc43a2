"""Scoring alerts against labels: what counts as found, as a false positive, as dollar error."""

from __future__ import annotations

import pytest

from detector.alerts import Alert
from detector.evaluate import score
from detector.simulate import Label


def alert(alert_id: str, rid: str, fired_at: float, usd: float, rule_type: str = "idle_gpu", **details) -> Alert:
    return Alert(alert_id=alert_id, type=rule_type, rule="r", resource_id=rid, status="firing", change="fired",
                 severity="warning", episode_start=fired_at, fired_at=fired_at, updated_at=fired_at,
                 waste_usd=usd, details=details)  # fmt: skip


def test_found_missed_duplicate_and_unexplained_alerts():
    labels = [
        Label("idle_gpu", "h1", 100, 200, 36.0),  # $1 over 100 s
        Label("idle_gpu", "h2", 100, 200, 36.0),  # missed
        Label("vector_db_growth", "v1", 0, 1000, 0.0, usd=0.0, expect={"growth_gb_per_day": 100.0}),
    ]
    alerts = [
        alert("a", "h1", 150, 1.1),  # found, 10 % over
        alert("b", "h1", 160, 1.0),  # a second alert for the same episode: a false positive
        alert("c", "h3", 150, 5.0),  # nobody's episode: a false positive
        alert("d", "h2", 250, 1.0),  # right resource, after the episode ended: a false positive
        alert("e", "v1", 500, 0.0, "vector_db_growth", growth_gb_per_day=95.0),
    ]
    scores = score(alerts, labels)
    idle = scores["idle_gpu"]
    assert (idle.labels, idle.alerts, idle.found, idle.true_alerts) == (2, 4, 1, 1)
    assert idle.precision == 0.25 and idle.recall == 0.5
    assert idle.median_error == pytest.approx(0.10)
    vdb = scores["vector_db_growth"]
    assert vdb.precision == vdb.recall == 1.0 and vdb.median_error == pytest.approx(0.05)


def test_an_alert_dated_a_jittered_sample_before_its_label_is_its_label():
    """An episode that fires at its first sample (a GPU long idle when another works again) is
    dated by that sample, whose clock may run a second or two early."""
    label = Label("partly_idle_gpu", "i-0abc", 1000, 2000, 36.0, gpus=[6, 7])
    early = score([alert("a", "i-0abc", 998.5, 10.0, "partly_idle_gpu")], [label])["partly_idle_gpu"]
    assert (early.found, early.true_alerts) == (1, 1)
    late = score([alert("b", "i-0abc", 1000 - 60, 10.0, "partly_idle_gpu")], [label])["partly_idle_gpu"]
    assert (late.found, late.true_alerts) == (0, 0)
