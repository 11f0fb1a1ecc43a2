"""Child processes that end with the process that started them (Linux's parent-death signal).

``burnwatch demo``, the benchmarks and the tests start an embedded broker, workers and store
servers as children and stop them on their way out; killed -9, or its terminal closed, the
parent has no way out, and its children ran on for hours. Each child asks the kernel,
between fork and exec, for SIGKILL when its parent ends: nothing of theirs is worth a
graceful stop then (a demo's broker keeps its topics in memory; a worker is built to survive
a kill -9, and its store is the demo's, made afresh by the next one).

The signal comes when the *thread* that started the child ends, not the process: start
long-lived children from the main thread, or from a thread that lives as long as they should.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["ask_parent_death_signal", "die_with_parent"]

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()
"""Looked up once, here: a child between fork and exec calls it and loads nothing."""


def ask_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask for ``sig`` when this process's parent (thread) ends; False where there is no such
    signal (not Linux). From a child that runs Python itself, first thing."""
    return _PRCTL is not None and _PRCTL(_PR_SET_PDEATHSIG, int(sig)) == 0


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child is sent ``sig`` when this
    process (the calling thread) ends, and exits at once if it already has. None where there
    is no parent-death signal: the child then lives until it is stopped, as before."""
    if _PRCTL is None:
        return None
    prctl, number, parent = _PRCTL, int(sig), os.getpid()

    def hook() -> None:  # between fork and exec: as little as can be
        prctl(_PR_SET_PDEATHSIG, number)
        if os.getppid() != parent:  # the parent died between the fork and the request
            os._exit(1)

    return hook
