"""A day of 5-minute egress rates in 5 bytes each, not 8, exactly.

``egress_runaway``'s baseline is the exact median of every closed 5-minute bucket's rate over a day
(288 of them a destination): as doubles 2.3 KB, most of a CPU instance's or an endpoint's state
after a day. A bucket's rate is its bytes over its seconds, and the bytes are whole and the
seconds 300 (five 60 s intervals, ten of 30 s...), so a rate is almost always ``b / 300.0`` for a
whole ``b`` under 2^40: :class:`BucketRates` holds that ``b`` in 5 bytes (a byte and a 32-bit word)
when dividing it by 300 gives the very double back, and any other rate (a bucket of odd seconds,
a fraction of a byte, beyond a terabyte) whole, as a double beside them. Nothing is rounded: each
rate read is the double appended, bit for bit. A snapshot holds the rates as the list of doubles
it held before, so one saved before reads back as it was, and one saved now in the code before.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

__all__ = ["BucketRates", "whole_bytes"]

if TYPE_CHECKING:
    Bytes = array[int]
    Doubles = array[float]
else:
    Bytes = Doubles = array

SECONDS = 300.0
"""A bucket's seconds: a rate held in 5 bytes is its whole bytes over this."""
_ODD = 255
"""The high byte of a rate held as a double (in :attr:`BucketRates._odd`, in order)."""
_LIMIT = _ODD << 32
"""Whole bytes below this fit a high byte under :data:`_ODD` and a 32-bit word."""
_NO_ODD: Doubles = array("d")
"""No rate held as a double (never appended to: shared by every BucketRates without one)."""


def whole_bytes(rate: float) -> int | None:
    """The whole ``b`` under 2^40 with ``b / 300.0`` the very double ``rate``, or None."""
    if not 0.0 <= rate < _LIMIT / SECONDS:  # NaN, negative, too large
        return None
    b = round(rate * SECONDS)
    if b >= _LIMIT or b / SECONDS != rate or (b == 0 and math.copysign(1.0, rate) < 0.0):  # -0.0 is not 0 / 300
        return None
    return b


class BucketRates:
    """Rates, oldest first: appended at the end, forgotten from the front (see the module)."""

    __slots__ = ("_hi", "_lo", "_odd")

    def __init__(self, rates: Iterable[float] = ()) -> None:
        self._hi: Bytes = array("B")
        self._lo: Bytes = array("I")
        self._odd: Doubles = _NO_ODD
        for rate in rates:
            self.append(rate)

    def append(self, rate: float) -> None:
        b = whole_bytes(rate)
        if b is None:
            self._hi.append(_ODD)
            self._lo.append(0)
            if self._odd is _NO_ODD:
                self._odd = array("d")
            self._odd.append(rate)
        else:
            self._hi.append(b >> 32)
            self._lo.append(b & 0xFFFFFFFF)

    def drop_first(self, n: int) -> None:
        """Forget the ``n`` oldest rates."""
        odd = self._hi[:n].count(_ODD) if self._odd else 0
        del self._hi[:n], self._lo[:n]
        if odd:
            del self._odd[:odd]
            if not self._odd:
                self._odd = _NO_ODD

    def values(self) -> list[float]:
        """The rates, oldest first, each the double appended."""
        if not self._odd:
            return [((hi << 32) | lo) / SECONDS for hi, lo in zip(self._hi, self._lo, strict=True)]
        odd = iter(self._odd)
        return [next(odd) if hi == _ODD else ((hi << 32) | lo) / SECONDS
                for hi, lo in zip(self._hi, self._lo, strict=True)]  # fmt: skip

    def __len__(self) -> int:
        return len(self._hi)

    def __iter__(self) -> Iterator[float]:
        return iter(self.values())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BucketRates) and self.saved() == other.saved()

    __hash__ = None  # type: ignore[assignment]  # mutable, as the array was

    def __repr__(self) -> str:
        return f"BucketRates({self.values()!r})"

    # -- saved as the list of doubles it replaces (detector.floats.enc_hook / dec_hook) -------

    def saved(self) -> list[float]:
        return self.values()

    @classmethod
    def read_saved(cls, obj: Any) -> BucketRates:
        if not isinstance(obj, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in obj):
            raise ValueError("rates are a list of numbers")
        return cls(float(x) for x in obj)
