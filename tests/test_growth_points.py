"""A size history's points as whole differences (:class:`detector.detectors.growth_points.Points`)."""

from __future__ import annotations

import math
import random
import struct
import sys
from array import array

import msgspec
import pytest

from detector.detectors.growth_points import Points
from detector.engine import Engine
from detector.floats import dec_hook, enc_hook
from tests.test_storage_growth import DAY, GB, T0, TB, series

ODD = [0.5, 1e-9, math.nan, math.inf, -0.0, 2.0**53, 1e300, 123.25]
"""Values no int gives back exactly (or at all): a history holding one is held as doubles."""


def bits(xs) -> list[bytes]:
    return [struct.pack("<d", x) for x in xs]


class Flat:
    """What GrowthBase.observe did to the array of doubles before Points (the reference)."""

    def __init__(self) -> None:
        self.points = array("d")

    def add(self, t: float, b: float) -> None:
        self.points.extend((t, b))

    def replace_last(self, t: float, b: float) -> None:
        self.points[-2], self.points[-1] = t, b

    def forget_before(self, horizon: float) -> None:
        old = 0
        while old < len(self.points) and self.points[old] < horizon:
            old += 2
        if old:
            del self.points[:old]


@pytest.mark.parametrize("seed", range(8))
def test_points_hold_what_the_doubles_held(seed):
    """Random histories (whole and odd values, long gaps, shrinking sizes, huge ones, the window
    emptied): every point read is the double added, and the history saves as the doubles did."""
    rng = random.Random(seed)
    ref, points = Flat(), Points()
    t, b = float(rng.randrange(0, 2**33)), float(rng.randrange(0, 2**50))
    for step in range(600):
        pick = rng.random()
        t += rng.choice((900.0, 900.0, 300.0, 70_000.0, 2.0**33)) if pick < 0.97 else rng.choice(ODD)
        b += rng.choice((0.0, 1e6, -3e9, 5e9, 2.0**40, -(2.0**41)))
        if seed % 2 and rng.random() < 0.01:
            b = rng.choice(ODD)  # an odd size (half the seeds): doubles from then on
        if len(ref.points) and rng.random() < 0.4:
            ref.replace_last(t, b)
            points.replace_last(t, b)
        else:
            ref.add(t, b)
            points.add(t, b)
        if rng.random() < 0.2:
            horizon = rng.choice((t - 3 * DAY, t - 900.0, t + 1.0, -math.inf))
            ref.forget_before(horizon)
            points.forget_before(horizon)
        assert len(points) == len(ref.points) // 2
        assert bits(points) == bits(ref.points)
        if len(points):
            assert bits(points.last()) == bits(ref.points[-2:])
        if not math.isfinite(t):
            t = float(step)
    saved = msgspec.msgpack.encode(points, enc_hook=enc_hook)
    assert saved == msgspec.msgpack.encode(ref.points.tolist())  # the flat doubles saved before, byte for byte
    assert bits(msgspec.msgpack.decode(saved, type=Points, dec_hook=dec_hook)) == bits(ref.points)


def test_three_days_of_a_bucket_take_under_half_the_doubles():
    """288 points 900 s apart, a GB apart: 2-byte and 4-byte differences (and the arrays' room to
    grow), not 16 bytes a point."""
    points, doubles = Points(), array("d")
    for k in range(288):
        points.add(T0 + k * 900.0, 40 * TB + k * 1.1 * GB)
        doubles.extend((T0 + k * 900.0, 40 * TB + k * 1.1 * GB))
    assert (points._dt.typecode, points._db.typecode) == ("H", "i")
    held = sum(sys.getsizeof(x) for x in (points, points._dt, points._db, points._t0, points._b0))
    assert held < 7.5 * 288 < sys.getsizeof(doubles) / 2


def test_saved_points_read_back_flat_or_as_pairs_and_odd_shapes_are_refused():
    for saved in ([1.0, 10.0, 901.0, 12.5], [[1.0, 10.0], [901.0, 12.5]]):
        back = msgspec.msgpack.decode(msgspec.msgpack.encode(saved), type=Points, dec_hook=dec_hook)
        assert list(back) == [1.0, 10.0, 901.0, 12.5] and back._dt.typecode == "d"  # 12.5 bytes: doubles
    for bad in ([1.0], [1.0, "x"], [[1.0]], [True, 1.0], {"t": 1.0}):
        with pytest.raises(msgspec.ValidationError):
            msgspec.msgpack.decode(msgspec.msgpack.encode(bad), type=Points, dec_hook=dec_hook)


def test_a_snapshot_of_the_doubles_shape_restores_to_the_same_findings(ruleset):
    """What 13c551f saved (``points`` the flat list of doubles, as it is still saved) restores into
    Points, saves back byte for byte, and storage_growth then finds what an uninterrupted run finds."""
    events = series(lambda d: 40 * TB + 1 * TB * d + (7 if d > 2 else 0), 4)
    whole = [f for f in Engine(ruleset).process(events) if f.type == "storage_growth"]
    assert [f.action for f in whole][:1] == ["fire"]
    cut = len(events) * 5 // 8  # two and a half days: the window full, then more
    first = Engine(ruleset)
    before = [f for f in first.process(events[:cut]) if f.type == "storage_growth"]
    saved = first.snapshot("ckpt")
    assert saved is not None
    flat = msgspec.msgpack.decode(saved)["rules"]["storage-growth"]["points"]
    assert isinstance(flat, list) and len(flat) > 400 and all(isinstance(x, float) for x in flat)
    assert first._keys["ckpt"].rule("storage-growth").points._dt.typecode == "H"  # held as differences
    second = Engine(ruleset)
    second.restore("ckpt", saved)
    assert second.snapshot("ckpt") == saved
    after = [f for f in second.process(events[cut:]) if f.type == "storage_growth"]
    assert msgspec.json.encode(before + after) == msgspec.json.encode(whole)
