"""Where a consumer starts reading an assigned partition, which decides whether a partition
that has delivered nothing has anything to read (and so holds the watermark): never the
fetch position, which runs ahead of what was handed to the pipeline."""

from __future__ import annotations

import pytest

from streams.topology import reading_starts


@pytest.mark.parametrize(
    ("committed", "earliest", "end", "starts"),
    [
        (None, 0, 2832, 0),          # never committed: from the earliest offset
        (1500, 0, 2832, 1500),       # committed: from there (holds the watermark until delivered)
        (2832, 0, 2832, 2832),       # committed at the end: nothing to read
        (9000, 0, 2832, 0),          # topic recreated shorter: the consumer resets to the earliest
        (100, 2832, 2832, 2832),     # retention deleted past the commit: reset to the earliest, the end
        (100, 50, 2832, 100),        # the commit still inside the log
        (None, None, None, None),    # the broker answered nothing: unknown (the partition keeps holding)
        (10, None, None, 10),        # no end known: the commit stands
    ],
)
def testreading_starts_where_the_consumer_will(committed, earliest, end, starts):
    assert reading_starts(committed, earliest, end) == starts
