"""Unboxed float sequences for per-key state.

A Python float in a list costs 32 bytes (the object and its slot); in an ``array('d')`` it
costs 8. Detector state that keeps series (the anomaly window's GPU samples, egress and
growth histories) holds them as arrays, a series of pairs flattened (``t0, v0, t1, v1...``).
msgspec does not know arrays: the engine saves them as lists (:func:`enc_hook`) and reads
them back (:func:`dec_hook`), taking a series saved as a list of pairs too (snapshots from
before), so a restart across the change loses nothing.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any

__all__ = ["FloatArray", "dec_hook", "enc_hook", "floats"]

if TYPE_CHECKING:
    FloatArray = array[float]
else:
    FloatArray = array  # not subscriptable at run time before Python 3.12


def floats() -> FloatArray:
    """An empty series (a struct field's ``default_factory``)."""
    return array("d")


def enc_hook(obj: Any) -> Any:
    """Arrays of a rule's state are saved as lists."""
    if isinstance(obj, array):
        return obj.tolist()
    raise NotImplementedError(f"cannot save {type(obj).__name__} in a key's state")


def dec_hook(kind: type, obj: Any) -> Any:
    """A saved list back into an array; a list of pairs (saved before) is flattened."""
    if kind is array and isinstance(obj, list):
        if obj and isinstance(obj[0], list):
            return array("d", (x for pair in obj for x in pair))
        return array("d", obj)
    raise NotImplementedError(f"cannot restore {kind.__name__} in a key's state")
