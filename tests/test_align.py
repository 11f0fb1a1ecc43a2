"""Event-time alignment: a source running ahead waits for the one behind; tokens come back
only when every event of their message has been released."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from detector.align import EventTimeAligner, HeldKeys, count, each_event


@dataclass(frozen=True)
class Ev:
    t: float
    resource_id: str = "host"
    """A GPU sample's host: a message's samples of one host at one time are held as one item."""

    @property
    def ts(self):  # the aligner reads ts.timestamp(), as on real events
        return self

    def timestamp(self) -> float:
        return self.t


def times(released):
    return [t for t, _ in released]


def test_a_source_ahead_waits_for_the_one_behind():
    aligner = EventTimeAligner(lateness_s=0)
    aligner.push("usage", [Ev(100), Ev(400), Ev(700)], token="u1")  # hours ahead in a backlog
    aligner.push("gpu", [Ev(10)], token="g0")
    aligner.push("gpu", [Ev(20), Ev(30)], token="g1")
    released, tokens = aligner.release()
    assert times(released) == [10, 20]  # usage at 100 must wait: gpu's next message may start at 20
    assert tokens == ["g0"]  # g1 still has an event (30) held
    aligner.push("gpu", [Ev(450)], token="g2")
    released, tokens = aligner.release()
    assert times(released) == [30, 100]  # usage's next message may start at 100
    assert tokens == ["g1"]
    aligner.push("usage", [Ev(800)], token="u2")
    released, tokens = aligner.release()
    assert times(released) == [400, 450] and tokens == ["g2"]  # u1 still has an event (700) held
    aligner.caught_up("gpu")  # nothing more to read on gpu: it no longer holds usage back
    released, tokens = aligner.release()
    assert times(released) == [700, 800] and tokens == ["u1", "u2"]


def test_a_sources_time_is_the_start_of_its_latest_message():
    """A message spans minutes of event time (an exporter flushing five minutes at once), and the
    next message of its partition, another resource's flush, may start before this one ends: the
    source has passed the start of its latest message, not its end. Held: the message's own later
    events, until a later message starts past them (less the lateness)."""
    aligner = EventTimeAligner(lateness_s=60)
    aligner.push("a", [Ev(0), Ev(150), Ev(300)])
    assert times(aligner.release()[0]) == []  # watermark = 0 - 60
    aligner.push("a", [Ev(120), Ev(420)])  # another host's flush, starting before 300
    assert times(aligner.release()[0]) == [0]  # watermark = 120 - 60 = 60
    aligner.push("a", [Ev(400)])
    assert times(aligner.release()[0]) == [120, 150, 300]  # watermark = 340
    assert times(aligner.release(everything=True)[0]) == [400, 420]


def test_an_expected_source_holds_everything_until_it_reports():
    aligner = EventTimeAligner(lateness_s=0)
    aligner.expect("slow")
    aligner.push("fast", [Ev(5)], token="f")
    assert aligner.release() == ([], [])
    aligner.push("slow", [Ev(3)], token="s")
    released, tokens = aligner.release()
    assert times(released) == [3] and tokens == ["s"]


def test_clear_drops_everything_held():
    aligner = EventTimeAligner()
    aligner.push("a", [Ev(1)], token="x")
    aligner.clear()
    assert len(aligner) == 0 and aligner.release(everything=True) == ([], [])


@given(st.lists(st.tuples(st.sampled_from("abc"), st.lists(st.floats(0, 1e6), min_size=1, max_size=5)), max_size=40))
def test_everything_comes_out_once_in_time_order(messages):
    """Whatever the interleaving, every event is released exactly once, in time order, and
    every message's token once."""
    aligner = EventTimeAligner(lateness_s=0)
    out, tokens = [], []
    for i, (source, ts) in enumerate(messages):
        aligner.push(source, [Ev(t) for t in sorted(ts)], token=i)
        released, done = aligner.release()
        assert times(released) == sorted(times(released))
        out += times(released)
        tokens += done
    released, done = aligner.release(everything=True)
    out += times(released)
    tokens += done
    assert sorted(out) == sorted(t for _, ts in messages for t in ts)
    assert sorted(tokens) == list(range(len(messages)))


_KINDS = [type(name, (Ev,), {}) for name in ("GpuMetric", "UsageEvent", "RunEvent", "Other")]
"""Event types by the names the aligner ranks (samples, usage, runs, anything else)."""
_message = st.tuples(
    st.sampled_from("abc"),  # source
    st.sampled_from(range(len(_KINDS))),  # the type of its events
    st.lists(st.sampled_from([0.0, 1.0, 2.0, 5.0, 30.0, 61.0, 100.0]), max_size=4),  # times: ties are frequent
    st.booleans(),  # with a token
)
_batch = st.tuples(st.lists(_message, max_size=12), st.sets(st.sampled_from("abc")), st.booleans())


@given(st.lists(_batch, max_size=8), st.sampled_from([0.0, 60.0]))
def test_push_many_is_push_of_each_message(batches, lateness_s):
    """A run of one source's messages pushed in one call gives what pushing them one by one gives:
    the same events in the same order, the same tokens in the same order, the same time per source
    and messages held per source, batch after batch (ties of time and rank, empty messages and
    messages without a token included)."""
    one, many = EventTimeAligner(lateness_s), EventTimeAligner(lateness_s)
    number = 0
    order: dict[int, tuple[float, int, int]] = {}  # id of an event or token → (time, rank, arrival)
    for messages, caught_up, everything in batches:
        made = []
        for source, kind, ts, with_token in messages:
            events = [_KINDS[kind](t) for t in ts]
            rank = (0, 1, 2, 9)[kind]
            for i, event in enumerate(events):
                order[id(event)] = (event.t, rank, number * 10 + i)
            if events and with_token:
                order[number] = (max(ts), rank, number)
            made.append((source, number if with_token else None, events))
            number += 1
        for source, token, events in made:
            one.push(source, events, token)
        run: list = []
        for i, (source, token, events) in enumerate(made):
            run.append((token, events))
            if i + 1 == len(made) or made[i + 1][0] != source:
                many.push_many(source, run)
                run = []
        for aligner in (one, many):
            for source in "abc":
                aligner.caught_up(source, source in caught_up)
        (items_one, tokens_one), (items_many, tokens_many) = one.release(everything), many.release(everything)
        out_one, out_many = list(each_event(items_one)), list(each_event(items_many))
        assert [(t, id(e)) for t, e in out_many] == [(t, id(e)) for t, e in out_one]
        assert count(items_one) == len(out_one)
        assert tokens_many == tokens_one
        # in (time, rank, arrival) order: a token where its message's last event is
        assert out_one == sorted(out_one, key=lambda pair: order[id(pair[1])])
        assert tokens_one == sorted(tokens_one, key=order.__getitem__)
        assert many.held_by_source == one.held_by_source
        assert many._source_t == one._source_t and many.slowest() == one.slowest()
        assert len(many) == len(one)
    assert many.release(everything=True)[1] == one.release(everything=True)[1]


def test_push_many_of_nothing_changes_nothing():
    aligner: EventTimeAligner[str] = EventTimeAligner(lateness_s=0)
    aligner.caught_up("a")
    aligner.push_many("a", [])
    assert aligner.slowest() is None and aligner.release() == ([], [])


def test_push_many_marks_its_source_not_caught_up_as_push_does():
    """A source that said it had caught up and then gives a run holds the watermark again (the
    property test above says every source caught up or not after each push, so it cannot tell)."""
    one, many = EventTimeAligner(lateness_s=0), EventTimeAligner(lateness_s=0)
    for aligner in (one, many):
        aligner.push("a", [Ev(10.0)])
        aligner.push("b", [Ev(50.0)])
        aligner.caught_up("a")
    one.push("a", [Ev(20.0)])
    many.push_many("a", [(None, [Ev(20.0)])])
    assert one.slowest() == many.slowest() == "a" and one.watermark == many.watermark == 20.0


@dataclass(frozen=True)
class Keyed(Ev):
    @property
    def key(self) -> str:
        return self.resource_id


class CountingAligner(EventTimeAligner):
    """Counts how often the held keys are gathered (a walk over every event held)."""

    gathered = 0

    def held_keys(self):
        self.gathered += 1
        return super().held_keys()


def test_held_keys_are_gathered_at_the_first_look_up_only_and_answer_as_the_set():
    """A sweep asks only about keys gone quiet; one that finds none must not walk what the aligner holds."""
    aligner = CountingAligner(lateness_s=0)
    aligner.expect("b")  # holds the watermark until it delivers: what "a" gives is held
    aligner.push("a", [Keyed(100.0, "h1"), Keyed(100.0, "h2")], object())
    aligner.push("a", [Keyed(160.0, "h3")], object())
    keys = HeldKeys(aligner)
    assert aligner.gathered == 0
    assert all(k in keys for k in ("h1", "h2", "h3")) and "h4" not in keys
    assert aligner.gathered == 1 and aligner.held_keys() == {"h1", "h2", "h3"}
    aligner.push("b", [Keyed(130.0, "h4")], object())
    aligner.release()  # h1, h2 (100) go; h3 (160) waits for "b", at 130
    assert "h3" in HeldKeys(aligner) and "h1" not in HeldKeys(aligner)
