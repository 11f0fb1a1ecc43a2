"""A scrape's samples folded into a window in one call are the same, bit for bit, as folded one by one."""

from __future__ import annotations

import math
import struct
from array import array

from hypothesis import given
from hypothesis import strategies as st

from detector.events import GpuMetric
from detector.floats import append, extend
from detector.model.features import WindowBuilder, WindowState
from tests.helpers import T0, at

_VALUES = (st.integers(0, 255).map(float) | st.sampled_from([-0.0, 0.0, 0.5, 255.0, 256.0, -1.0, math.nan, 99.9])
           | st.floats(allow_nan=True, allow_infinity=True))  # fmt: skip
"""Whole percents most of all (a byte series' values), and what widens one."""


def _bits(series: array) -> tuple[str, list[bytes]]:
    """A series as its type and each value's bits (-0.0 and NaN compared exactly)."""
    return series.typecode, [struct.pack("<d", float(x)) for x in series]


@given(st.lists(_VALUES, max_size=6), st.lists(_VALUES, max_size=12), st.booleans())
def test_extend_is_append_of_each_value_in_turn(before, xs, doubles):
    start = array("d", before) if doubles else array("B")
    one_by_one = array(start.typecode, start)
    if not doubles:
        for x in before:
            one_by_one = append(one_by_one, x)
        start = array(one_by_one.typecode, one_by_one)
    for x in xs:
        one_by_one = append(one_by_one, x)
    assert _bits(extend(start, xs)) == _bits(one_by_one)


_SAMPLE = st.tuples(_VALUES.filter(lambda x: 0.0 <= x <= 100.0), st.floats(0, 1e6), st.floats(0, 1e6),
                    st.floats(0, 5e3))  # fmt: skip


@given(st.lists(st.lists(_SAMPLE, min_size=1, max_size=8), min_size=1, max_size=6))
def test_a_scrape_folded_whole_sums_as_its_samples_folded_one_by_one(scrapes):
    """The window's utilisations, memory fractions and power: the same floats, added in the same order,
    as taking the samples one by one (written out here: :func:`append`, and each sum in turn)."""
    whole, single = WindowState(), WindowState()
    utils: array = array("B")  # (a window holds None until its first sample)
    for k, scrape in enumerate(scrapes):
        samples = [GpuMetric(ts=at(T0 + k), resource_id="h", gpu_index=i, util_pct=u, mem_used_mib=used,
                             mem_total_mib=total, power_w=power)
                   for i, (u, used, total, power) in enumerate(scrape)]  # fmt: skip
        WindowBuilder._fold(whole, samples)
        for sample in samples:
            utils = append(utils, sample.util_pct)
            if sample.mem_total_mib > 0:
                single.mem_frac_sum += sample.mem_used_mib / sample.mem_total_mib
            single.power_sum += sample.power_w
            single.gpu_samples += 1
    assert whole.utils is not None
    assert _bits(whole.utils) == _bits(utils)
    assert (whole.mem_frac_sum, whole.power_sum, whole.gpu_samples) == (single.mem_frac_sum, single.power_sum,
                                                                        single.gpu_samples)  # fmt: skip


def test_a_paused_window_need_not_hear_the_other_rules_again_the_next_one_must():
    """What the other rules track cannot change a window a pause has marked (nor one closed before it):
    the anomaly rule asks them nothing there, and asks again from the next window on."""
    builder, state = WindowBuilder(300.0), WindowState()
    sample = GpuMetric(ts=at(T0 + 60), resource_id="h", gpu_index=0, util_pct=0.0)
    assert not builder.paused_through(state, T0 + 60)  # no window yet
    builder.add(state, "h", "gpu_instance", 0.0, sample, T0 + 60, covered=True, paused=False)
    assert not builder.paused_through(state, T0 + 90)  # covered (a level), not paused: a pause may still come
    builder.add(state, "h", "gpu_instance", 0.0, sample, T0 + 90, covered=True, paused=True)
    assert builder.paused_through(state, T0 + 299) and builder.paused_through(state, T0 - 1)
    assert not builder.paused_through(state, T0 + 300)  # the next window: its own question
    builder.add(state, "h", "gpu_instance", 0.0, sample, T0 + 300)
    assert not state.paused and not builder.paused_through(state, T0 + 330)
