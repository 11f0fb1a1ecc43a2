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
else:
    Ints = Doubles = array

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
    """(t, bytes) points, oldest first: added at the end, the last replaced, forgotten from the front."""

    __slots__ = ("_t0", "_b0", "_dt", "_db", "_flat")

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self._t0 = self._b0 = 0
        self._dt: Ints = _NO_DIFFS  # t[i + 1] - t[i]
        self._db: Ints = _NO_DIFFS  # b[i + 1] - b[i]
        self._flat: Doubles | None = _NONE
        """The points as doubles, flat (``t0, b0, t1, b1...``): while none is held (empty) and once one
        was not a whole number; None while they are held as differences."""

    def __len__(self) -> int:
        """How many points."""
        return len(self._flat) // 2 if self._flat is not None else len(self._dt) + 1

    def last(self) -> tuple[float, float]:
        """The newest point (there must be one)."""
        if self._flat is not None:
            return self._flat[-2], self._flat[-1]
        return float(self._t0 + sum(self._dt)), float(self._b0 + sum(self._db))

    def pairs(self) -> list[tuple[float, float]]:
        """Every point, oldest first, each as the doubles added."""
        flat = self._flat
        if flat is not None:
            return list(zip(flat[0::2], flat[1::2], strict=True))
        t, b = self._t0, self._b0
        out = [(float(t), float(b))]
        for dt, db in zip(self._dt, self._db, strict=True):
            t += dt
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
        flat = self._flat = array("d", [x for pair in self.pairs() for x in pair])
        self._dt = self._db = _NO_DIFFS
        return flat

    def add(self, t: float, b: float) -> None:
        """A new newest point."""
        flat = self._flat
        wt, wb = _whole(t), _whole(b)
        if flat is not None and not flat and wt is not None and wb is not None:
            self._t0, self._b0, self._flat = wt, wb, None  # the first point: held whole from now
            return
        if flat is None:
            if wt is not None and wb is not None:
                lt, lb = self._t0 + sum(self._dt), self._b0 + sum(self._db)
                self._dt = _put(array("H", self._dt) if self._dt is _NO_DIFFS else self._dt, None, wt - lt)
                self._db = _put(array("i", self._db) if self._db is _NO_DIFFS else self._db, None, wb - lb)
                return
            flat = self._as_doubles()
        elif flat is _NONE:
            flat = self._flat = array("d")
        flat.extend((t, b))

    def replace_last(self, t: float, b: float) -> None:
        """The newest point becomes (t, b) (a later sample of its slot)."""
        flat = self._flat
        if flat is None:
            wt, wb = _whole(t), _whole(b)
            if wt is not None and wb is not None:
                if not self._dt:
                    self._t0, self._b0 = wt, wb
                    return
                lt, lb = self._t0 + sum(self._dt[:-1]), self._b0 + sum(self._db[:-1])  # the point before
                self._dt = _put(self._dt, -1, wt - lt)
                self._db = _put(self._db, -1, wb - lb)
                return
            flat = self._as_doubles()
        flat[-2], flat[-1] = t, b

    def forget_before(self, horizon: float) -> None:
        """The points older than ``horizon`` leave."""
        flat = self._flat
        if flat is not None:
            old = 0
            while old < len(flat) and flat[old] < horizon:
                old += 2
            if old:
                del flat[:old]
            return
        old, t, b, dts, dbs = 0, self._t0, self._b0, self._dt, self._db
        while t < horizon:
            if old == len(dts):  # the last point too: none left
                self._clear()
                return
            t, b, old = t + dts[old], b + dbs[old], old + 1
        if old:
            self._t0, self._b0 = t, b
            if old == len(dts):
                self._dt = self._db = _NO_DIFFS
            else:
                del dts[:old], dbs[:old]

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
