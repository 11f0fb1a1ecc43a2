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
