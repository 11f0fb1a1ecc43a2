"""A size history's points held as differences of whole numbers, exactly.

``storage_growth`` and ``vector_db_growth`` keep a (time, bytes) point per 15 minutes over a
3-day window: as doubles 16 bytes a point, 4.6 KB a bucket once the window is full. Event times
are whole seconds and sizes whole bytes, and each point is 900 s after the one before with a
size a few GB away, so :class:`Points` holds the first point as two whole numbers and each next
one as its differences: the time's in 2 bytes (an ``array('H')``, 4 past 18 hours) and the
size's in 4 (``array('i')``, 8 past ±2 GB): 6 bytes a point (7 with the arrays' room to grow). A time or size that is not a whole
number (a fraction of a second, NaN, -0.0) or not exact as an integer (2^53 and beyond) turns
the history into the doubles it was before, for good. Every value read is the double observed,
bit for bit. It is saved as the flat list of doubles it replaces (``t0, b0, t1, b1...``), and
reads that, or the list of pairs saved before it, back.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

__all__ = ["Points"]

if TYPE_CHECKING:
    Ints = array[int]
    Doubles = array[float]
    Column = array[Any]
    """The doubles, or the time differences: which, its typecode says."""
else:
    Ints = Doubles = Column = array

_EXACT = 2**53
"""Whole doubles below this in size are exactly Python ints and back."""
_WIDER = {"H": "I", "I": "q", "i": "q"}
"""A difference that outgrows its array's type widens the array (whole doubles' differences fit ``q``)."""
_NO_DIFFS: Ints = array("H")
"""No difference yet (never appended to: shared until a second point)."""
_NONE: Doubles = array("d")
"""No point (never appended to: shared by every empty history)."""


def _whole(x: float) -> int | None:
    """``x`` as the int it equals, where ``float(that int)`` is ``x`` bit for bit; else None."""
    if -_EXACT < x < _EXACT and x.is_integer() and (x or math.copysign(1.0, x) > 0.0):
        return int(x)
    return None


def _put(diffs: Ints, i: int | None, d: int) -> Ints:
    """``diffs`` with ``d`` appended (``i`` None) or at ``i``, widened to a type that holds it."""
    while True:
        try:
            if i is None:
                diffs.append(d)
            else:
                diffs[i] = d
            return diffs
        except OverflowError:
            diffs = array(_WIDER[diffs.typecode], diffs)


class Points:
    """(t, bytes) points, oldest first: added at the end, the last replaced, forgotten from the front.

    Four slots: ``_dt`` says which form. An ``array('d')``: the points as doubles, flat (``t0, b0,
    t1, b1...``; none held, or one was not a whole number). Else the time differences (``t[i + 1] -
    t[i]``), with ``_db`` the sizes' and ``_t0``, ``_b0`` the first point, whole, as its doubles (a
    float object is 8 bytes less than an int past 2^30)."""

    __slots__ = ("_t0", "_b0", "_dt", "_db")
    _t0: float
    _b0: float
    _dt: Column
    _db: Ints

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self._t0 = self._b0 = 0.0
        self._dt = _NONE
        self._db = _NO_DIFFS

    def __len__(self) -> int:
        """How many points."""
        dt = self._dt
        return len(dt) // 2 if dt.typecode == "d" else len(dt) + 1

    def last(self) -> tuple[float, float]:
        """The newest point (there must be one)."""
        dt = self._dt
        if dt.typecode == "d":
            return dt[-2], dt[-1]
        return float(int(self._t0) + sum(dt)), float(int(self._b0) + sum(self._db))

    def pairs(self) -> list[tuple[float, float]]:
        """Every point, oldest first, each as the doubles added."""
        dt = self._dt
        if dt.typecode == "d":
            return list(zip(dt[0::2], dt[1::2], strict=True))
        t, b = int(self._t0), int(self._b0)
        out = [(self._t0, self._b0)]
        for d, db in zip(dt, self._db, strict=True):
            t += d
            b += db
            out.append((float(t), float(b)))
        return out

    def __iter__(self) -> Iterator[float]:
        """The points flat: ``t0, b0, t1, b1...`` (as the array before)."""
        return iter([x for pair in self.pairs() for x in pair])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Points) and self.saved() == other.saved()

    __hash__ = None  # type: ignore[assignment]  # mutable, as the array was

    def __repr__(self) -> str:
        return f"Points({self.pairs()!r})"

    def _as_doubles(self) -> Doubles:
        """The points as doubles from now on (one is not a whole number)."""
        flat = array("d", [x for pair in self.pairs() for x in pair])
        self._dt, self._db, self._t0, self._b0 = flat, _NO_DIFFS, 0.0, 0.0
        return flat

    def add(self, t: float, b: float) -> None:
        """A new newest point."""
        dt = self._dt
        wt, wb = _whole(t), _whole(b)
        if dt.typecode == "d":
            if not dt and wt is not None and wb is not None:  # the first point: held whole from now
                self._t0, self._b0, self._dt = float(wt), float(wb), _NO_DIFFS
                return
            if dt is _NONE:
                dt = self._dt = array("d")
            dt.extend((t, b))
            return
        if wt is None or wb is None:
            self._as_doubles().extend((t, b))
            return
        lt, lb = int(self._t0) + sum(dt), int(self._b0) + sum(self._db)
        self._dt = _put(array("H") if dt is _NO_DIFFS else dt, None, wt - lt)
        self._db = _put(array("i") if self._db is _NO_DIFFS else self._db, None, wb - lb)

    def replace_last(self, t: float, b: float) -> None:
        """The newest point becomes (t, b) (a later sample of its slot)."""
        dt = self._dt
        if dt.typecode != "d":
            wt, wb = _whole(t), _whole(b)
            if wt is not None and wb is not None:
                if not dt:
                    self._t0, self._b0 = float(wt), float(wb)
                    return
                lt, lb = int(self._t0) + sum(dt[:-1]), int(self._b0) + sum(self._db[:-1])  # the point before
                self._dt = _put(dt, -1, wt - lt)
                self._db = _put(self._db, -1, wb - lb)
                return
            dt = self._as_doubles()
        dt[-2], dt[-1] = t, b

    def forget_before(self, horizon: float) -> None:
        """The points older than ``horizon`` leave."""
        dt = self._dt
        if dt.typecode == "d":
            old = 0
            while old < len(dt) and dt[old] < horizon:
                old += 2
            if old:
                del dt[:old]
            return
        old, t, b, dbs = 0, int(self._t0), int(self._b0), self._db
        while t < horizon:
            if old == len(dt):  # the last point too: none left
                self._clear()
                return
            t, b, old = t + dt[old], b + dbs[old], old + 1
        if old:
            self._t0, self._b0 = float(t), float(b)
            if old == len(dt):
                self._dt = self._db = _NO_DIFFS
            else:
                del dt[:old], dbs[:old]

    # -- saved as the flat doubles it replaces (detector.floats.enc_hook / dec_hook) ----------

    def saved(self) -> list[float]:
        return [x for pair in self.pairs() for x in pair] if len(self) else []

    @classmethod
    def read_saved(cls, obj: Any) -> Points:
        if not isinstance(obj, list):
            raise ValueError("points are a list of numbers")
        if obj and isinstance(obj[0], list):  # saved before as a list of pairs
            obj = [x for pair in obj for x in (pair if isinstance(pair, list) and len(pair) == 2 else [None])]
        if len(obj) % 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in obj):
            raise ValueError("points are (t, bytes) pairs of numbers")
        points = cls()
        for i in range(0, len(obj), 2):
            points.add(float(obj[i]), float(obj[i + 1]))
        return points
