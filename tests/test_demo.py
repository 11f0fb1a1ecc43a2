"""`burnwatch demo` end to end, on a short fleet: what `make demo` runs, kept working, and the
follow-up commands it prints working as printed."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from detector.settings import load_settings
from streams.children import die_with_parent
from tests.conftest import ROOT

pytestmark = pytest.mark.integration

MARK = "BURNWATCH_TEST_DEMO_RUN"
"""Set in the demo's environment only, and so inherited by every process it starts (the
broker, the worker): what tells them from other demos, workers or brokers on the machine."""


def started_by(run: str) -> set[int]:
    """Live processes whose environment carries this run's mark: the demo and its children."""
    found = set()
    needle = f"{MARK}={run}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        if needle in environ.split(b"\0"):
            found.add(int(entry))
    return found


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def stop_demo(demo: subprocess.Popen, run: str) -> None:
    """A demo still running (its test failed or timed out) is killed with every process it started:
    they die with it (:mod:`streams.children`), and any that did not (that broken, or not Linux) is
    killed here rather than left running. A demo that ended by itself is left alone: the test
    then checks its processes stop on their own."""
    if demo.poll() is not None:
        return
    demo.kill()
    demo.wait()
    kill_started(run)


def kill_started(run: str) -> None:
    """SIGKILL every live process of this run: what a failed test must not leave running."""
    for pid in started_by(run):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def test_demo_shows_alerts_summary_a_postmortem_and_commands_that_work(tmp_path):
    """Also where the shell names a broker (here one nobody listens on): the demo's simulated fleet
    never goes to the topics real workers read, so it starts its own."""
    run = uuid.uuid4().hex
    env = {"BURNWATCH_DATA_DIR": str(tmp_path), "BURNWATCH_RULES": str(ROOT / "rules"), "PATH": "/usr/bin:/bin",
           "BURNWATCH_KAFKA_BOOTSTRAP": "127.0.0.1:9", MARK: run}  # fmt: skip
    demo = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", "demo", "--hours", "12", "--speed", "3600"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent(),
    )  # fmt: skip
    try:
        # the mark finds the demo, its broker and its worker while they run (so finding none later means something)
        wait_for(lambda: len(started_by(run) - {demo.pid}) >= 2 or demo.poll() is not None, 120, "the demo's broker and worker")
        stdout, stderr = demo.communicate(timeout=300)
    finally:
        stop_demo(demo, run)
    assert demo.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "(not BURNWATCH_KAFKA_BOOTSTRAP's: the demo's fleet is simulated)" in stdout
    assert "🔥 WARNING Idle GPUs on" in stdout and "✅ RESOLVED Idle GPUs on" in stdout
    found, injected = map(int, re.search(r"(\d+) of (\d+) injected episodes found", stdout).groups())
    assert found == injected > 0
    assert "FROM burnwatch.alerts FINAL" in stdout and "wasted_usd" in stdout
    wait_for(lambda: not started_by(run), 30, "every process the demo started to stop")

    # the follow-up commands, run exactly as printed, from the directory the demo ran in
    commands = [line.strip() for line in stdout.split("(not the default store):", 1)[1].splitlines() if line.strip()]
    assert len(commands) >= 4 and any(" query waste " in c for c in commands)
    for command in commands:
        out = subprocess.run(["bash", "-c", command], env={"PATH": "/usr/bin:/bin"}, cwd=ROOT, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
        assert out.returncode == 0, f"{command}\n{out.stderr[-2000:]}"
        assert out.stdout.strip() and "(no rows)" not in out.stdout, f"{command}\n{out.stdout}"
        assert f"store: chdb://{tmp_path / 'demo' / 'clickhouse'}" in out.stderr  # it says which store it read
    assert not (tmp_path / "clickhouse").exists()  # no command created a store where the demo's is not


def test_the_follow_up_commands_name_the_demos_store_over_a_dsn_set_in_the_shell(tmp_path):
    """The demo never writes the configured store (its worker would turn off the store's event expiry and put
    simulated alerts beside real ones): with BURNWATCH_CLICKHOUSE_DSN set in the shell, a data directory
    would not win over it, so the commands name the demo's store by DSN."""
    from streams.demo import follow_up_commands

    settings = load_settings(environ={"BURNWATCH_CLICKHOUSE_DSN": "http://user:pw@clickhouse:8123",
                                  "BURNWATCH_DATA_DIR": str(tmp_path)})  # fmt: skip
    commands = follow_up_commands(settings, tmp_path / "demo", 24, "2026-11-02")
    assert commands and all(c.startswith(f"BURNWATCH_CLICKHOUSE_DSN=chdb://{tmp_path / 'demo' / 'clickhouse'} ")
                            for c in commands), commands  # fmt: skip
    plain = follow_up_commands(load_settings(environ={"BURNWATCH_DATA_DIR": str(tmp_path)}), tmp_path / "demo", 24, None)
    assert all(c.startswith("BURNWATCH_DATA_DIR=") for c in plain), plain


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGHUP, signal.SIGTERM],
                         ids=["killed", "terminal-closed", "terminated"])  # fmt: skip
def test_a_demo_killed_takes_the_broker_and_worker_it_started_with_it(tmp_path, how: signal.Signals):
    """``make demo`` killed -9, or its terminal closed, has no chance to stop what it started:
    the broker and the worker end with it all the same (they used to run on: a pair outlived
    its demo by 1 h 45 min)."""
    run = uuid.uuid4().hex
    env = {"BURNWATCH_DATA_DIR": str(tmp_path), "BURNWATCH_RULES": str(ROOT / "rules"), "PATH": "/usr/bin:/bin",
           MARK: run}  # fmt: skip
    said = tmp_path / "demo.out"
    dies_with_parent = die_with_parent()

    def as_in_a_terminal() -> None:  # SIGHUP's default action, as a terminal's shell has it, even where this
        dies_with_parent()  # test runs with SIGHUP ignored (under nohup), which its children would inherit
        signal.signal(signal.SIGHUP, signal.SIG_DFL)

    with open(said, "w") as out:  # a minute of replay: the demo is still replaying when it is killed
        demo = subprocess.Popen([sys.executable, "-m", "streams.cli", "demo", "--hours", "1", "--speed", "60"],
                                env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=as_in_a_terminal)  # fmt: skip
    try:
        wait_for(lambda: "- worker up" in said.read_text() or demo.poll() is not None, 180, "the demo's worker")
        assert demo.poll() is None, said.read_text()
        started = started_by(run) - {demo.pid}
        assert len(started) >= 2, started  # the broker and the worker
        demo.send_signal(how)
        if how == signal.SIGTERM:  # (``kill``, ``timeout``, a supervisor) stopped as Ctrl-C stops it
            assert demo.wait(timeout=60) == 130
            assert "interrupted; stopping" in said.read_text()
        else:
            assert demo.wait(timeout=30) == -how
        wait_for(lambda: not started_by(run), 30, f"the processes the demo started ({started}) to end with it")
    finally:
        demo.kill()
        demo.wait()
        kill_started(run)  # what did not end with it (the test failed): not left running
