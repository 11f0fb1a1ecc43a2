"""A day of 5-minute egress rates in 5 bytes each, not 8, exactly.

``egress_runaway``'s baseline is the exact median of every closed 5-minute bucket's rate over a day
(288 of them a destination): as doubles 2.3 KB, most of a CPU instance's or an endpoint's state
after a day. A bucket's rate is its bytes over its seconds, and the bytes are whole and the
seconds 300 (five 60 s intervals, ten of 30 s...), so a rate is almost always ``b / 300.0`` for a
whole ``b`` under 2^40: :class:`BucketRates` holds that ``b`` in 5 bytes (a byte and a 32-bit word)
when dividing it by 300 gives the very double back, and any other rate (a bucket of odd seconds,
a fraction of a byte, beyond a terabyte) whole, as a double beside them. Nothing is rounded: each
rate read is the double appended, bit for bit, and the median is ``statistics.median``'s of those
doubles, at about its cost (:meth:`BucketRates.median`). A snapshot holds them as held (bytes, not
a list of doubles: 5 bytes a rate, and no loop over them at each save); the list of doubles saved
before (13c551f and earlier) reads back as the same rates. The code before reads a snapshot of this
shape as no state: a rollback starts the rule's baselines afresh.
"""

from __future__ import annotations

import math
import statistics
import sys
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
_FAST = sys.byteorder == "little" and array("I").itemsize == 4 and array("d").itemsize == 8
"""Whether the word array's bytes are the low half of a little-endian double's mantissa (x86, ARM)."""
_TWO52 = 2.0**52
_EXPONENT = bytes(6) + b"\x30\x43"
"""``2^52 + b`` for any ``b < 2^40``, little-endian, with ``b``'s five bytes still 0: a rate's eight."""


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

    def _shifted(self) -> Doubles:
        """Each rate's whole bytes ``b`` as the double ``2^52 + b`` (an odd rate's meaningless): for
        ``b < 2^52`` that double's bits are ``0x4330...`` with ``b`` as the mantissa, so it is put
        together from the word and the byte by slice copies, no Python loop and no int object (a
        day's 288 in a few µs); ``x - 2^52`` is then ``b`` as a double, exactly."""
        hi, lo = self._hi, self._lo
        if not _FAST:
            return array("d", [_TWO52 + ((h << 32) | w) for h, w in zip(hi, lo, strict=True)])
        words, packed = lo.tobytes(), bytearray(_EXPONENT * len(lo))
        for i in range(4):
            packed[i::8] = words[i::4]
        packed[4::8] = hi.tobytes()
        return array("d", packed)

    def values(self) -> list[float]:
        """The rates, oldest first, each the double appended."""
        if not self._odd:
            return [(x - _TWO52) / SECONDS for x in self._shifted()]
        odd = iter(self._odd)
        return [next(odd) if hi == _ODD else (x - _TWO52) / SECONDS
                for hi, x in zip(self._hi, self._shifted(), strict=True)]  # fmt: skip

    def median(self) -> float:
        """``statistics.median`` of the rates, to the bit. Without an odd rate, from the whole bytes
        sorted (dividing each by 300 keeps their order: IEEE division is monotonic), dividing only
        the middle one or two, as the median of the doubles reads them: as fast as that median."""
        if self._odd or not self._hi:
            return statistics.median(self.values())
        ordered = sorted(self._shifted())
        n = len(ordered)
        if n % 2:
            return (ordered[n // 2] - _TWO52) / SECONDS
        return ((ordered[n // 2 - 1] - _TWO52) / SECONDS + (ordered[n // 2] - _TWO52) / SECONDS) / 2

    def __len__(self) -> int:
        return len(self._hi)

    def __iter__(self) -> Iterator[float]:
        return iter(self.values())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BucketRates) and self.saved() == other.saved()

    __hash__ = None  # type: ignore[assignment]  # mutable, as the array was

    def __repr__(self) -> str:
        return f"BucketRates({self.values()!r})"

    # -- saved (detector.floats.enc_hook / dec_hook) ------------------------------------------

    def saved(self) -> dict[str, Any]:
        """As held: ``hi`` the bytes, ``lo`` the words little-endian, ``odd`` the doubles (5 bytes a
        usual rate in a snapshot, not 9; and no Python loop over the rates at each save)."""
        lo = self._lo
        if _FAST:
            words = lo.tobytes()
        else:
            words = b"".join(w.to_bytes(4, "little") for w in lo)
        return {"hi": self._hi.tobytes(), "lo": words, "odd": self._odd.tolist()}

    @classmethod
    def read_saved(cls, obj: Any) -> BucketRates:
        """What :meth:`saved` wrote, or the list of doubles saved before (13c551f and earlier)."""
        if isinstance(obj, list):
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in obj):
                raise ValueError("rates are a list of numbers")
            return cls(float(x) for x in obj)
        if not isinstance(obj, dict) or set(obj) != {"hi", "lo", "odd"}:
            raise ValueError("rates are a list of numbers, or hi, lo and odd")
        hi, words, odd = obj["hi"], obj["lo"], obj["odd"]
        if not (isinstance(hi, bytes) and isinstance(words, bytes) and isinstance(odd, list)
                and len(words) == 4 * len(hi) and hi.count(_ODD) == len(odd)
                and all(isinstance(x, float) and whole_bytes(x) is None for x in odd)):  # fmt: skip
            raise ValueError("a byte and a 32-bit word a rate, and a double for each odd one")
        rates = cls()
        rates._hi = array("B", hi)
        if _FAST:
            rates._lo = array("I")
            rates._lo.frombytes(words)
        else:
            rates._lo = array("I", [int.from_bytes(words[i : i + 4], "little") for i in range(0, len(words), 4)])
        if odd:
            rates._odd = array("d", odd)
        return rates
