"""Python opcodes executed, counted: a cost that is the same on every run, where a timing on a
shared VM swings with the neighbours (``bench/engine_opcodes.py``, ``bench/step_opcodes.py``).

Opcodes are not equal in cost (a call is dearer than an add), so a small difference between two
trees says "about the same", not which is faster.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

__all__ = ["Opcodes"]


class Opcodes:
    """``with Opcodes() as counted:`` counts the opcodes of every call made inside the block
    (``counted.executed``), through ``sys.settrace``; the block's own frame is not counted."""

    def __init__(self) -> None:
        self.executed = 0

    def __enter__(self) -> Opcodes:
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)

    def _trace(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "call":
            frame.f_trace_opcodes = True
        elif event == "opcode":
            self.executed += 1
        return self._trace
