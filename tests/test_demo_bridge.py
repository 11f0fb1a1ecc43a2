"""`burnwatch demo --via-bridge`: fake dcgm-exporters and kube-state-metrics, the bridge
scraping them into the embedded broker, the worker alerting on per-GPU waste."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid

import pytest

from streams.children import die_with_parent
from tests.conftest import ROOT
from tests.test_demo import MARK, started_by, stop_demo, wait_for

pytestmark = pytest.mark.integration


def test_the_bridge_path_finds_gpus_idle_beside_busy_ones_and_gpus_nobody_requested(tmp_path):
    """Two hours: every injected episode (three GPUs idle beside busy ones, one host's GPUs no pod
    requested) spans the whole run, four times the rules' 30 m ``for``, so each still opens an
    alert; the bridge's rounds (one per 30 s scrape of event time, back to back) are 240, not 360."""
    run = uuid.uuid4().hex
    env = {"BURNWATCH_DATA_DIR": str(tmp_path), "BURNWATCH_RULES": str(ROOT / "rules"), "PATH": "/usr/bin:/bin",
           MARK: run}  # fmt: skip
    demo = subprocess.Popen([sys.executable, "-m", "streams.cli", "demo", "--via-bridge", "--hours", "2"], env=env,
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=die_with_parent())  # fmt: skip
    try:
        stdout, stderr = demo.communicate(timeout=300)
    finally:
        stop_demo(demo, run)
    assert demo.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "! bridge:" not in stdout  # every scrape of the fake exporters parsed
    assert re.search(r"🔥 WARNING Part of a host's GPUs idle on i-0[0-9a-f]{16} ", stdout)
    assert re.search(r"🔥 WARNING GPUs no pod requested on i-0[0-9a-f]{16} ", stdout)
    published = int(re.search(r"The bridge published ([\d,]+) events", stdout).group(1).replace(",", ""))
    assert published > 0
    found, injected = map(int, re.search(r"(\d+) of (\d+) injected episodes found", stdout).groups())
    assert found == injected > 0
    # its follow-up commands are those with something to show: this fleet has no bill and no egress, where
    # `query reconcile` listed every node "not billed (yet)" and `query egress` printed "(no rows)"
    follow_up = stdout[stdout.index("these commands read its store"):]
    assert "query waste" in follow_up and "query reconcile" not in follow_up and "query egress" not in follow_up
    config = (tmp_path / "demo" / "bridge.yaml").read_text()
    assert "job: kube-state-metrics" in config and config.count("job: dcgm") == 4
    wait_for(lambda: not started_by(run), 30, "every process the demo started to stop")
