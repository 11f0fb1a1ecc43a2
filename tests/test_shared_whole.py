"""floats.shared_whole: the same value and sign as given, one object for a whole percent."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from detector.floats import shared_whole


@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(0, 255).map(float))
def test_the_same_value_and_sign(x):
    y = shared_whole(x)
    assert type(y) is float
    assert (math.isnan(x) and math.isnan(y)) or (y == x and math.copysign(1.0, y) == math.copysign(1.0, x))
    if 0.0 < x <= 255.0 and x == int(x) or x == 0.0 and math.copysign(1.0, x) > 0:
        assert y is shared_whole(float(int(x)))  # one object for each whole number 0..255
    elif not (x == 0.0 and math.copysign(1.0, x) > 0):
        assert y is x  # any other value (-0.0, NaN, 255.5, 256.0, inf) is itself
