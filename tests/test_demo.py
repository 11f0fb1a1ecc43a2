"""`burnwatch demo` end to end, on a short fleet: what `make demo` runs, kept working."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration


def pids(pattern: str) -> set[str]:
    return set(subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split())


def test_demo_shows_alerts_summary_and_a_postmortem(tmp_path):
    before = pids("streams.cli worker") | pids("tansu")
    env = {"BURNWATCH_DATA_DIR": str(tmp_path), "BURNWATCH_RULES": str(ROOT / "rules"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "streams.cli", "demo", "--hours", "12", "--speed", "3600"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "🔥 WARNING Idle GPUs on" in out.stdout and "✅ RESOLVED Idle GPUs on" in out.stdout
    found, injected = map(int, re.search(r"(\d+) of (\d+) injected episodes found", out.stdout).groups())
    assert found == injected > 0
    assert "FROM burnwatch.alerts FINAL" in out.stdout and "wasted_usd" in out.stdout
    assert pids("streams.cli worker") | pids("tansu") <= before  # the demo stopped what it started
