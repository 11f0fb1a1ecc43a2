"""What an on-call sees of a running worker, from outside it: ``/healthz`` and ``/metrics``
of a real worker process against the embedded broker and store, as Prometheus and an
orchestrator read them."""

from __future__ import annotations

import re
import shutil
import urllib.request

import pytest

from detector.metrics import Metrics
from streams.embedded import EmbeddedBroker
from streams.process import WorkerProcess, worker_env
from tests.conftest import ROOT

pytestmark = pytest.mark.integration


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def sample(metrics: str, name: str) -> float:
    (value,) = re.findall(rf"^{name} (\S+)$", metrics, re.M)
    return float(value)


def test_a_refused_rules_edit_shows_on_metrics_and_healthz_until_a_valid_one_loads(tmp_path):
    """A rules edit the worker refuses (a ConfigMap pushed with a typo) was one ``rules_refused`` log line per
    pod, and nothing on ``/metrics`` or ``/healthz``: the pods went on with the old rules, and the next pod to
    start (a KEDA scale-up, a node drain, the next rollout) refused to start at all. Now it is
    ``burnwatch_rules_refused`` 1 and ``rules_refused`` on ``/healthz`` (still 200: the worker works) until a
    valid edit loads; and the partitions a worker holds are on ``/metrics`` too, so that their sum across the
    group says whether every partition is read (``/healthz`` said it of one worker)."""
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        worker = WorkerProcess(worker_env(broker.bootstrap, tmp_path / "data", rules, 2), tmp_path / "worker.log").start()
        try:
            health = worker.wait_until(lambda h: h["partitions"] == 2, timeout=120)  # alone in the group: both
            assert health["rules_refused"] is None
            metrics = scrape(worker.port)
            assert sample(metrics, "burnwatch_rules_refused") == 0
            assert sample(metrics, "burnwatch_partitions_assigned") == 2
            # nothing read yet: no freshness claimed, and the event time is 0, which a staleness alert catches
            assert not re.search(r"^burnwatch_event_time_lag_seconds ", metrics, re.M)
            assert sample(metrics, "burnwatch_event_time_seconds") == 0

            good = (rules / "rules.yaml").read_text()
            (rules / "rules.yaml").write_text(good.replace("for: 30m", "for: 30 minutes", 1))
            health = worker.wait_until(lambda h: h["rules_refused"] is not None, timeout=60)
            assert health["status"] == "ok" and "invalid duration '30 minutes'" in health["rules_refused"]
            assert sample(scrape(worker.port), "burnwatch_rules_refused") == 1

            (rules / "rules.yaml").write_text(good.replace("for: 30m", "for: 45m", 1))
            worker.wait_until(lambda h: h["rules_refused"] is None, timeout=60)
            assert sample(scrape(worker.port), "burnwatch_rules_refused") == 0
        finally:
            assert worker.stop() == 0, worker.tail()


def test_detector_errors_are_a_counter_per_rule_on_metrics():
    """A rule that raises skips the events it raised on, logged once per rule and error type: ``/healthz`` counted
    them, ``/metrics`` did not, so nothing alerted on a rule that had stopped detecting."""
    metrics = Metrics()
    errors = {"idle-gpu": 3}
    metrics.watch(lag=list, watermark=lambda: 0.0, detector_errors=lambda: errors)
    text = metrics.render().decode()
    assert re.search(r'^burnwatch_detector_errors_total\{rule="idle-gpu"\} 3\.0$', text, re.M)
    errors["idle-gpu"] = 5
    assert 'burnwatch_detector_errors_total{rule="idle-gpu"} 5.0' in metrics.render().decode()


def test_event_time_freshness_is_not_claimed_before_any_event_is_detected():
    """``burnwatch_event_time_lag_seconds`` read 0 (perfectly fresh) on a worker that had detected nothing: a
    worker restarted while the exporters or the bridge were down cleared the staleness alert that had fired
    before, with still nothing flowing. Now the lag has no sample until an event is detected, and
    ``burnwatch_event_time_seconds`` (the newest event time detected, 0 before any) lets the alert be
    ``time() - max(burnwatch_event_time_seconds) > 900``, which a restart does not clear."""
    metrics = Metrics()
    watermark = 0.0
    metrics.watch(lag=list, watermark=lambda: watermark, clock=lambda: 1_800_000_600.0)
    text = metrics.render().decode()
    assert "burnwatch_event_time_seconds 0.0" in text
    assert not re.search(r"^burnwatch_event_time_lag_seconds ", text, re.M)
    watermark = 1_800_000_000.0
    text = metrics.render().decode()
    assert "burnwatch_event_time_lag_seconds 600.0" in text and "burnwatch_event_time_seconds 1.8e+09" in text
