"""Acknowledgement in offset order (streams/acks.py): whatever order messages are done in,
across however many batches, what is acknowledged is each partition's done prefix, once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.acks import InOrderAcks
from streams.pipeline import Message


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=3),
    data=st.data(),
)
def test_what_is_acknowledged_is_each_partitions_done_prefix_in_order(sizes: list[int], data: st.DataObject) -> None:
    acks = InOrderAcks()
    messages = {p: [Message("gpu-metrics", p, offset, None, b"{}") for offset in range(n)] for p, n in enumerate(sizes)}
    for p, ms in messages.items():
        acks.received(("gpu-metrics", p), ms)
    every = [m for ms in messages.values() for m in ms]
    order = data.draw(st.permutations(every))
    cuts = sorted(data.draw(st.lists(st.integers(min_value=0, max_value=len(order)), max_size=4)))
    acked: dict[int, list[int]] = {p: [] for p in messages}
    done: set[tuple[int, int]] = set()
    for start, end in zip([0, *cuts], [*cuts, len(order)], strict=True):  # batches of done messages
        batch = order[start:end]
        done.update((m.partition, m.offset) for m in batch)
        for m in acks.done(batch):
            acked[m.partition].append(m.offset)
        for p, offsets in acked.items():
            prefix = 0
            while (p, prefix) in done:
                prefix += 1
            assert offsets == list(range(prefix)), (p, offsets, prefix)  # the done prefix, in order, once
    assert all(acked[p] == list(range(n)) for p, n in enumerate(sizes))


def test_a_message_of_a_partition_handed_over_is_not_acknowledged() -> None:
    acks = InOrderAcks()
    held = Message("gpu-metrics", 0, 0, None, b"{}")
    acks.received(("gpu-metrics", 0), [held])
    acks.clear()  # the partition moved: its new holder reads it again
    assert acks.done([held]) == []


def test_an_offset_received_again_is_acknowledged_only_once_done_again() -> None:
    """A partition read again from an earlier offset (a rewind): an offset acknowledged before
    waits to be done anew; and a partition with nothing done is left as it is."""
    acks = InOrderAcks()
    first = [Message("gpu-metrics", 0, offset, None, b"{}") for offset in range(3)]
    acks.received(("gpu-metrics", 0), first)
    acks.received(("gpu-metrics", 1), [Message("gpu-metrics", 1, 0, None, b"{}")])
    assert [m.offset for m in acks.done(first[:2])] == [0, 1]
    again = Message("gpu-metrics", 0, 1, None, b"{}")
    acks.received(("gpu-metrics", 0), [again])
    assert acks.done([first[2]]) == [first[2]]  # offset 2 done; the 1 read again is not
    assert acks.done([]) == []
    assert acks.done([again]) == [again]
    later = Message("gpu-metrics", 0, 2, None, b"{}")
    acks.received(("gpu-metrics", 0), [later])
    assert acks.done([later]) == [later]
