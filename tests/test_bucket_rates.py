"""egress_runaway's 5-minute rates held as whole bytes (:class:`detector.detectors.bucket_rates.BucketRates`)."""

from __future__ import annotations

import math
import random
import statistics
import struct
import sys
from array import array

import msgspec
import pytest

from detector.detectors.bucket_rates import BucketRates, whole_bytes
from detector.engine import Engine
from detector.floats import dec_hook, enc_hook
from tests.test_egress_runaway import runaway_at, series

ODD = [1 / 7, 123.456789, 2.5e-300, 5e9 + 0.5, 1e12, 2.0**60, math.inf, -1.0, -0.0, math.nan]
"""Rates no whole number of bytes over 300 s gives: each held as the double it is."""


def bits(xs) -> list[bytes]:
    return [struct.pack("<d", x) for x in xs]


@pytest.mark.parametrize("seed", range(4))
def test_every_rate_reads_back_bit_for_bit_and_forgets_from_the_front(seed):
    """Whole bytes over 300 s (the usual rate), any double, -0.0, NaN, infinities: each rate read is
    the double appended; forgetting the oldest keeps the rest in order, as the array did."""
    rng = random.Random(seed)
    model: list[float] = []
    rates = BucketRates()
    for _ in range(1500):
        pick = rng.random()
        if pick < 0.7:
            rate = rng.randrange(0, 2**40 + 5) / 300.0
        elif pick < 0.85:
            rate = rng.choice(ODD)
        else:
            rate = struct.unpack("<d", rng.randbytes(8))[0]
        model.append(rate)
        rates.append(rate)
        if rng.random() < 0.1:
            n = rng.randrange(0, len(model) + 2)
            del model[:n]
            rates.drop_first(n)
        assert len(rates) == len(model)
        if rng.random() < 0.05:
            whole = [x for x in model if whole_bytes(x) is not None]
            if len(whole) == len(model) and model:
                assert bits([rates.median()]) == bits([statistics.median(model)])
    assert bits(rates.values()) == bits(model) and bits(rates) == bits(model)
    saved = msgspec.msgpack.encode(rates, enc_hook=enc_hook)
    back = msgspec.msgpack.decode(saved, type=BucketRates, dec_hook=dec_hook)
    assert bits(back.values()) == bits(model) and back == rates
    before = msgspec.msgpack.decode(msgspec.msgpack.encode(model), type=BucketRates, dec_hook=dec_hook)
    assert bits(before.values()) == bits(model) and before == rates  # the list of doubles 13c551f saved


@pytest.mark.parametrize("n", [1, 2, 3, 287, 288])
def test_the_median_is_the_median_of_the_doubles_to_the_bit(n):
    """From the whole bytes sorted, or (an odd rate among them) from the doubles: either way
    statistics.median's double, ties and the mean of the middle two included."""
    rng = random.Random(n)
    for odd in (False, True):
        day = [rng.choice((rng.randrange(0, 2**40 - 2**33), 3 * 10**9, 2**39 + 1)) / 300.0 for _ in range(n)]
        if odd:
            day[rng.randrange(n)] = 1 / 7
        rates = BucketRates(day)
        assert bool(rates._odd) == odd
        assert bits([rates.median()]) == bits([statistics.median(day)])


def test_a_rate_is_held_whole_only_where_that_gives_the_same_double():
    assert whole_bytes(4_000_000_123 / 300.0) == 4_000_000_123 and whole_bytes(0.0) == 0
    assert whole_bytes(0.1) == 30 and whole_bytes(1 / 3) == 100  # 30 / 300.0 is the double 0.1
    assert all(whole_bytes(x) is None for x in ODD)
    assert whole_bytes((2**40 - 1) / 300.0) is None  # the high byte that marks a double
    for b in (1, 299, 300, 301, 10**9 + 7, (255 << 32) - 1):
        assert whole_bytes(b / 300.0) == b


def test_a_day_of_rates_takes_five_bytes_a_bucket():
    rng = random.Random(1)
    day = [rng.randrange(10**9, 10**10) / 300.0 for _ in range(288)]
    rates, doubles = BucketRates(), array("d")
    for rate in day:  # appended one by one, as the rule does (both over-allocate as they grow)
        rates.append(rate)
        doubles.append(rate)
    held = sys.getsizeof(rates) + sum(sys.getsizeof(getattr(rates, s)) for s in ("_hi", "_lo"))
    assert held < 0.72 * sys.getsizeof(doubles)
    assert rates._odd is BucketRates()._odd  # none held as a double: the one shared empty array


@pytest.mark.parametrize("bad", [{"a": 1.0}, ["5"], [True], 5.0, {"hi": b"\x01", "lo": b"\0\0\0", "odd": []},
                                 {"hi": b"\xff", "lo": bytes(4), "odd": []}, {"hi": b"", "lo": b"", "odd": [1.0]},
                                 {"hi": b"\xff", "lo": bytes(4), "odd": [0.5]}])
def test_saved_rates_that_are_not_numbers_are_refused(bad):
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(msgspec.msgpack.encode(bad), type=BucketRates, dec_hook=dec_hook)


def test_a_snapshot_of_the_array_shape_restores_to_the_same_findings(ruleset):
    """What 13c551f saved (a destination's ``rates`` a list of doubles) restores into the state never
    saved, and the rule then finds what an uninterrupted run finds: a day of baseline (odd rates
    among the whole ones), then a runaway and its end; so does what this code saves."""
    events = series(runaway_at(26, 60, 20), 28 * 60)
    for i, ev in enumerate(events):
        if i % 7 == 0:
            ev.egress_bytes += 1 if i % 2 else 0
            ev.interval_s = 59.5 if i % 3 == 0 else 60.0  # buckets of odd seconds: rates held as doubles
    whole = [f for f in Engine(ruleset).process(events) if f.type == "egress_runaway"]
    assert [f.action for f in whole][:1] == ["fire"] and whole[-1].action == "resolve"
    cut = 25 * 60
    first = Engine(ruleset)
    before = [f for f in first.process(events[:cut]) if f.type == "egress_runaway"]
    saved = first.snapshot("etl-1")
    assert saved is not None
    (dest,) = msgspec.msgpack.decode(saved)["rules"]["egress-runaway"]["destinations"].values()
    st = next(iter(first._keys["etl-1"].rule("egress-runaway").destinations.values()))
    assert st.rates._odd and len(st.rates._odd) < len(st.rates) / 2  # both forms held
    assert len(dest["rates"]["hi"]) == 24 * 12 and len(dest["rates"]["odd"]) == len(st.rates._odd)
    raw = msgspec.msgpack.decode(saved)
    (old_dest,) = raw["rules"]["egress-runaway"]["destinations"].values()
    old_dest["rates"] = list(st.rates)  # as 13c551f saved them: the list of doubles
    old = msgspec.msgpack.encode(raw)
    second = Engine(ruleset)
    second.restore("etl-1", old)
    assert second.snapshot("etl-1") == saved  # read into the same state as never saved
    after = [f for f in second.process(events[cut:]) if f.type == "egress_runaway"]
    assert msgspec.json.encode(before + after) == msgspec.json.encode(whole)
    third = Engine(ruleset)  # and what this code saves restores too
    third.restore("etl-1", saved)
    again = [f for f in third.process(events[cut:]) if f.type == "egress_runaway"]
    assert msgspec.json.encode(before + again) == msgspec.json.encode(whole)
