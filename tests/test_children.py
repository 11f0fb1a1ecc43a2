"""streams.children: a child started with the parent-death signal ends when its parent is
killed -9, which gives the parent no chance to stop it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.receivers import wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a parent-death signal is Linux's")

PARENT = """
import subprocess, sys
from streams.children import die_with_parent
child = subprocess.Popen(["sleep", "600"], preexec_fn=die_with_parent(), start_new_session=True)
print(child.pid, flush=True)
sys.stdin.read()
"""
"""Starts a child in a session of its own (as the demo starts its broker and worker: a
terminal's or a process group's signal does not reach it) and waits to be killed."""


def alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped (by whatever adopted it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_child_ends_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert alive(child)
        parent.kill()
        parent.wait()
        wait_until(lambda: not alive(child), timeout=15, what="the child to end with its parent")
    finally:
        parent.kill()
        parent.wait()
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)
