"""Unboxed float sequences for per-key state.

A Python float in a list costs 32 bytes (the object and its slot); in an ``array('d')`` it
costs 8. Detector state that keeps series (the anomaly window's GPU samples, egress and
growth histories) holds them as arrays, a series of pairs flattened (``t0, v0, t1, v1...``).
Values kept per GPU of a host (the latest sample time, the peak power) are an array indexed
by the GPU's index (:func:`per_gpu`, 0.0 where none: what the dict's ``.get(i, 0.0)`` said),
8 bytes a GPU instead of a dict slot and a float object (~70); an index is a ``UInt8``, so an
array holds at most 256.

A series of whole numbers 0..255 (GPU utilisation in percent, which DCGM and NVML report as
whole numbers) is held a byte each (:func:`bytewise`) until a value that is not one comes, which
:func:`append` makes a series of doubles: exact either way, never narrowed.

msgspec does not know arrays: the engine saves them as lists (:func:`enc_hook`) and reads
them back (:func:`dec_hook`), taking a series saved as a list of pairs too, and a per-GPU
map ``{index: value}`` (snapshots from before), so a restart across the change loses nothing.
"""

from __future__ import annotations

import math
from array import array
from typing import TYPE_CHECKING, Any, cast

__all__ = ["FloatArray", "Series", "append", "as_floats", "bytewise", "dec_hook", "enc_hook", "extend", "floats", "grow",
           "narrowed", "per_gpu", "shared_whole"]

if TYPE_CHECKING:
    FloatArray = array[float]
    Series = array[float] | array[int]
    """Doubles, or whole numbers 0..255 a byte each (:func:`bytewise`)."""
else:
    FloatArray = array  # not subscriptable at run time before Python 3.12
    Series = array


def floats() -> FloatArray:
    """An empty series (a struct field's ``default_factory``)."""
    return array("d")


_WHOLE = {float(i): i for i in range(256)}
"""The whole numbers a byte series holds, by their float."""


_SHARED_WHOLE = {float(i): float(i) for i in range(256)}
"""One float object for each whole number 0..255, shared by every state that keeps one."""


def shared_whole(x: float) -> float:
    """``x``, or where it is a whole number 0..255 (a GPU's percent, as DCGM and NVML report it) the one
    float object of that value every state holds: a value read from a sample and kept past it costs a
    float object (24 bytes) on each key otherwise. The same value and sign (-0.0 stays itself)."""
    whole = _SHARED_WHOLE.get(x)
    return whole if whole is not None and (whole or math.copysign(1.0, x) > 0.0) else x


def bytewise() -> Series:
    """An empty series held a byte a value while its values are whole numbers 0..255 (a struct
    field's ``default_factory``); :func:`append` widens it to doubles when one is not."""
    return array("B")


def append(series: Series, x: float) -> Series:
    """Append ``x`` to ``series``; a byte series that cannot hold ``x`` exactly (not a whole number
    in 0..255, or -0.0) is first copied into doubles. Returns the series (a new one when widened)."""
    if series.typecode == "B":
        whole = _WHOLE.get(x)  # -0.0 finds 0 (equal, same hash): its sign is what tells them apart
        if whole is not None and (whole or math.copysign(1.0, x) > 0.0):
            series.append(whole)
            return series
        series = array("d", series)
    cast("FloatArray", series).append(x)
    return series


def extend(series: Series, xs: list[float]) -> Series:
    """:func:`append` of each of ``xs`` in turn, in one call (a scrape's samples): a byte series takes
    them whole where each is a whole number in 0..255 and none is -0.0; else they go one by one."""
    if series.typecode == "d":
        cast("FloatArray", series).extend(xs)
        return series
    wholes = [_WHOLE.get(x) for x in xs]
    if None not in wholes and (0 not in wholes or all(math.copysign(1.0, x) > 0.0 for x in xs if x == 0.0)):
        series.extend(cast("list[int]", wholes))
        return series
    for x in xs:
        series = append(series, x)
    return series


def narrowed(series: Series) -> Series:
    """``series`` as the byte series it was before saving (a byte series is saved as whole numbers and
    read back as doubles): a restored window would otherwise hold 8 bytes a value, not 1. Doubles
    that a byte series could not hold (:func:`append` widened it) stay doubles: live, one of them
    always is such a value, so only a series that was bytes when saved is narrowed."""
    if series.typecode == "B":
        return series
    out = bytewise()
    for x in series:
        whole = _WHOLE.get(x)
        if whole is None or not (whole or math.copysign(1.0, x) > 0.0):
            return series
        out.append(whole)
    return out


def as_floats(series: Series) -> list[float]:
    """The series' values as floats (a byte series' whole numbers as the floats they were)."""
    return cast("FloatArray", series).tolist() if series.typecode == "d" else [float(x) for x in series]


def per_gpu() -> FloatArray:
    """An empty per-GPU series (a struct field's ``default_factory``): ``a[i]`` is GPU ``i``'s value
    once ``i < len(a)``, 0.0 before."""
    return array("d")


def grow(series: FloatArray, index: int) -> None:
    """Extend a per-GPU series with 0.0 up to ``index`` (a GPU seen for the first time)."""
    if not 0 <= index <= 255:
        raise ValueError(f"GPU index {index} out of 0..255")
    series.extend([0.0] * (index + 1 - len(series)))


def newer(times: FloatArray, index: int, t: float) -> bool:
    """Whether ``t`` is later than GPU ``index``'s latest sample time in the per-GPU series
    ``times``; when it is, it becomes that time. A sample read again (after a restart, or sent
    twice) is not newer, so it is not counted twice."""
    if index < len(times):
        if t <= times[index]:
            return False
    else:
        grow(times, index)
    times[index] = t
    return True


def enc_hook(obj: Any) -> Any:
    """Arrays of a rule's state are saved as lists; an object with a ``saved()`` as what it returns
    (:class:`detector.detectors.ended.Ended`: a map of run digest to end time)."""
    if isinstance(obj, array):
        return obj.tolist()
    saved = getattr(obj, "saved", None)
    if saved is not None:
        return saved()
    raise NotImplementedError(f"cannot save {type(obj).__name__} in a key's state")


def dec_hook(kind: type, obj: Any) -> Any:
    """A saved list back into an array; a list of pairs (saved before) is flattened, and a map of
    GPU index to value (saved before) becomes a per-GPU series; a class with a ``read_saved`` reads
    what its ``saved()`` wrote."""
    read = getattr(kind, "read_saved", None)
    if read is not None:
        return read(obj)
    if kind is array and isinstance(obj, dict):
        series = per_gpu()
        for index, value in sorted(obj.items()):
            if not isinstance(index, int) or not isinstance(value, (int, float)):
                raise ValueError("a per-GPU map takes GPU indexes to numbers")
            if index >= len(series):
                grow(series, index)
            series[index] = value
        return series
    if kind is array and isinstance(obj, list):
        if obj and isinstance(obj[0], list):
            return array("d", (x for pair in obj for x in pair))
        return array("d", obj)
    raise NotImplementedError(f"cannot restore {kind.__name__} in a key's state")
