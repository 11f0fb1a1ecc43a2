"""Messages from Kafka a fetch at a time, and acknowledged by offset.

Faust hands an agent one message at a time: per message its consumer makes a
``ConsumerMessage``, waits on two futures (``wait_first``), the conductor makes an
``Event`` and queues it to the stream, the stream takes it, and the acknowledgement
goes back through the message. Measured on the development VM that is ~100 µs per
message, so with exporters that send one event per message the worker ran at 9k events/s
while aiokafka alone reads 400k+ messages/s (docs/performance.md).

The detect agent needs none of that machinery: it takes whole batches and acknowledges
them itself, in offset order, once stored (streams.acks). So the consumer here, Faust's
own aiokafka consumer with one method replaced, hands each fetch to the agent as one list
of :class:`~streams.pipeline.Message`, and an acknowledgement is one offset added to the
same bookkeeping Faust's ``Consumer.ack`` fills, from which Faust commits as before.
Faust keeps everything else: group membership and partition assignment, the rebalance
pause (``suspend_flow``), seeking to the committed offsets, commits, timers and the web
server. Topics not handed over in bulk still go through Faust's per-message path.

This reaches into Faust's consumer (``_wait_next_records``, ``_acked``, ``_acked_index``,
``_committed_offset``, ``_gap``, ``_read_offset``, ``_add_gap``, ``_commit_every``) and aiokafka's
(``_fetch_max_wait_ms``), whose versions the project pins (pyproject.toml); tests/test_bulk.py
checks that each still exists and runs the path against the embedded broker.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import faust
import structlog
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from faust.types.tuples import ack_lock
from mode.utils.futures import notify

from streams.membership import Membership, watch_heartbeats
from streams.pipeline import Message

log = structlog.get_logger("burnwatch.worker")

__all__ = ["FETCH_MAX_WAIT_MS", "BulkConsumer", "BulkTransport", "Fetches", "install_bulk"]


class Fetches:
    """Fetched messages on their way from the consumer to the agent. Bounded (two batches'
    worth), so that a pipeline that falls behind slows the fetching instead of filling memory."""

    def __init__(self, max_messages: int, max_bytes: int = 16 << 20, within_s: float = 0.1) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        """A batch closes at this many messages or bytes of values (a single fetch may be larger):
        each batch is one ClickHouse insert per table, whose cost is mostly fixed (ms), so a
        batch of one-event messages must be larger than one of arrays."""
        self.within_s = within_s
        """... or this long after it began: a trickle is processed within it, not one message at a time."""
        self._fetches: deque[tuple[list[Message], int, float, dict[tuple[str, int], tuple[int, int]]]] = deque()
        """(messages, bytes of their values, when they arrived, (messages, bytes) by partition) of each fetch queued."""
        self.queued: dict[tuple[str, int], int] = {}
        """Messages queued, by (topic, partition), changed in place (the pipeline reads it:
        :meth:`streams.pipeline.Pipeline.watch`): flow control counts them with what the aligner holds
        (:meth:`streams.pipeline.Pipeline._flow_control`), or a partition would take in the queue's worth
        (two batches) before its pause took effect."""
        self._queued_bytes: dict[tuple[str, int], int] = {}
        """Bytes of values queued, by (topic, partition)."""
        self.on_queued: Callable[[], None] | None = None
        """Called once a fetch is queued, before the consumer's next fetch: the pipeline pauses the
        partitions that now have more than their share coming (:meth:`streams.pipeline.Pipeline.fetched`)."""
        self._messages = 0
        self._bytes = 0
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    async def put(self, messages: list[Message]) -> None:
        """Queue one fetch; wait while two batches' worth are already queued."""
        while self._messages >= 2 * self.max_messages or self._bytes >= 2 * self.max_bytes:
            self._room.clear()
            await self._room.wait()
        by_partition: dict[tuple[str, int], tuple[int, int]] = {}  # (messages, bytes)
        size = 0
        for m in messages:
            tp, n = (m.topic, m.partition), len(m.value) if m.value is not None else 0  # None: a tombstone
            count, nbytes = by_partition.get(tp, (0, 0))
            by_partition[tp] = (count + 1, nbytes + n)
            size += n
        self._fetches.append((messages, size, asyncio.get_running_loop().time(), by_partition))
        self._messages += len(messages)
        self._bytes += size
        queued, queued_bytes = self.queued, self._queued_bytes
        for tp, (count, nbytes) in by_partition.items():
            queued[tp] = queued.get(tp, 0) + count
            queued_bytes[tp] = queued_bytes.get(tp, 0) + nbytes
        self._arrived.set()
        if self.on_queued is not None:
            self.on_queued()

    def _full(self) -> bool:
        return self._messages >= self.max_messages or self._bytes >= self.max_bytes

    async def take(self) -> list[Message]:
        """The next batch: the fetches queued, up to ``max_messages`` or ``max_bytes``, once that
        much is queued or ``within_s`` after the oldest of them arrived (which, behind a batch
        that took longer, has passed already). A backlog's batches are full at once; a
        trickle's messages wait at most ``within_s``."""
        loop = asyncio.get_running_loop()
        while True:
            while not self._fetches:
                self._arrived.clear()
                await self._arrived.wait()
            while self._fetches and not self._full():
                left = self._fetches[0][2] + self.within_s - loop.time()
                if left <= 0:
                    break
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except TimeoutError:
                    break
            if self._fetches:  # a revocation may have cleared the queue meanwhile: wait again
                break
        fetches, queued, queued_bytes = self._fetches, self.queued, self._queued_bytes
        batch, size, _, by_partition = fetches.popleft()
        taken = [by_partition]
        while fetches and len(batch) + len(fetches[0][0]) <= self.max_messages and size + fetches[0][1] <= self.max_bytes:
            more, more_size, _, by_partition = fetches.popleft()
            batch, size = batch + more, size + more_size
            taken.append(by_partition)
        for by_partition in taken:
            for tp, (count, nbytes) in by_partition.items():
                left = queued[tp] - count
                assert left >= 0, (tp, left)
                if left:
                    queued[tp] = left
                    queued_bytes[tp] -= nbytes
                else:
                    del queued[tp], queued_bytes[tp]
        self._messages -= len(batch)
        self._bytes -= size
        self._room.set()
        return batch

    def clear(self) -> None:
        """Partitions moved: what is queued was fetched in the old generation, and the pipeline
        would leave it alone anyway (read again from the committed offsets)."""
        self._fetches.clear()
        self.queued.clear()
        self._queued_bytes.clear()
        self._messages = self._bytes = 0
        self._room.set()

    def holds_a_batch(self, tp: tuple[str, int]) -> bool:
        """Whether a batch's worth (messages or bytes) of ``tp`` is queued: the next batch can be full of it."""
        return self.queued.get(tp, 0) >= self.max_messages or self._queued_bytes.get(tp, 0) >= self.max_bytes

    def __len__(self) -> int:
        """Messages queued."""
        return self._messages


FETCH_MAX_WAIT_MS = 100
"""How long the broker may hold a fetch that finds nothing new. Faust fixes 1500 ms; Kafka
answers a fetch as soon as there is a byte to give, but the embedded broker (and an idle
partition beside a busy one) makes the consumer wait it out: measured with bench/latency.py's
fetch probe, publish → fetchable p50 155-438 ms at 1500 against 10-33 ms at 100. Kafka's
own default is 500; at 100 an idle worker sends ten empty fetches a second per broker."""


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # Read when the consumer starts its fetcher; Faust sets neither from its settings.
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        if transport.fetch_max_bytes is not None:  # a BulkTransport's
            consumer._fetch_max_bytes = transport.fetch_max_bytes
        membership = getattr(transport, "membership", None)
        if membership is not None:  # its group coordinator, made when it starts, renews the membership
            start = consumer.start

            async def start_watched() -> None:
                await start()
                watch_heartbeats(consumer._coordinator, membership)

            consumer.start = start_watched
        return consumer


class BulkConsumer(faust_aiokafka.Consumer):
    """Faust's aiokafka consumer, handing fetches of ``bulk_topics`` to :attr:`fetches`."""

    fetches: Fetches | None = None
    bulk_topics: frozenset[str] = frozenset()
    _resumed: asyncio.Event | None = None
    """Set when flow control resumes a partition: wakes a fetcher waiting with every partition paused."""

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def partition_count(self, topic: str) -> int | None:
        """How many partitions ``topic`` has, from the cluster metadata every member of the group
        holds (Faust's ``topic_partitions`` reads the assignor's snapshot, which only the group's
        leader fills: on the others it knows no topic). None before the consumer has metadata."""
        consumer = self._thread._consumer  # the consumer thread's aiokafka consumer
        found = consumer.partitions_for_topic(topic) if consumer is not None else None
        return len(found) if found else None

    def acknowledge(self, messages: Iterable[Message]) -> None:
        """What ``Consumer.ack`` records for each message, from its offset alone, under one lock
        for the lot: Faust commits the first run of consecutive acknowledged offsets (and gaps)
        of each partition."""
        offsets: dict[tuple[str, int], list[int]] = {}
        for message in messages:
            tp = (message.topic, message.partition)
            per_tp = offsets.get(tp)
            if per_tp is None:
                per_tp = offsets[tp] = []
            per_tp.append(message.offset)
        if not offsets:
            return
        acked = 0
        with ack_lock:
            for (topic, partition), each in offsets.items():
                tp = TP(topic, partition)
                committed, index, in_order = self._committed_offset[tp], self._acked_index[tp], self._acked[tp]
                for offset in each:
                    if (committed is None or offset >= committed) and offset not in index:
                        index.add(offset)
                        in_order.append(offset)
                        acked += 1
            self._n_acked += acked
            notify(self._waiting_for_ack)
        now, inbound = time.monotonic(), self.app.monitor.stream_inbound_time
        for topic, partition in offsets:
            inbound[TP(topic, partition)] = now  # progress, for Faust's livelock check

    async def _drain_messages(self, fetcher: Any) -> None:  # the Fetcher service's task
        if self.fetches is None:
            return await super()._drain_messages(fetcher)
        consumer_stopped, fetcher_stopped = self._stopped.is_set, fetcher._stopped.is_set
        resumed = self._resumed = asyncio.Event()
        wait_s = FETCH_MAX_WAIT_MS / 1000
        try:
            while not (consumer_stopped() or fetcher_stopped()):
                if self.flow_active and not self._get_active_partitions():
                    # Every partition paused (flow control): Faust's loop would sleep a second whatever
                    # happens; a resume, a batch later, wakes this at once (the stop within wait_s).
                    resumed.clear()
                    try:
                        await asyncio.wait_for(resumed.wait(), wait_s)
                    except TimeoutError:
                        pass
                    continue
                # A short wait: a fetch from caught-up partitions alone waits it out, and a partition
                # resumed meanwhile is fetched only by the next call.
                records, _ = await self._wait_next_records(wait_s)
                await asyncio.sleep(0)  # a fetch that returns at once must not starve the loop
                if not records or self.should_stop:
                    continue
                if not self.flow_active:  # a rebalance began during the fetch: read again after it
                    try:
                        await self.perform_seek()
                    except Exception as exc:  # noqa: BLE001 - as Faust's own loop: the rebalance's end seeks again
                        # A partition revoked by a second rebalance meanwhile (aiokafka's IllegalStateError "No
                        # current assignment") crashed the fetcher, and so the worker; the recovery that ends the
                        # rebalance seeks every partition then assigned to its committed offset before resuming.
                        log.warning("seek_after_rebalance_failed", error=f"{type(exc).__name__}: {exc}")
                    continue
                await self._hand_over(records)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                return
            raise

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        """Each assigned partition's read offset and commit bookkeeping start afresh; Faust's seek to the
        committed offsets then sets them. Faust forgets them when the partition is revoked, but what the
        generation before does after the revocation writes them again, and the seek leaves them where nothing
        is committed:

        - a fetch handed over late (a worker frozen past the session wakes with one) sets the read offset
          (:meth:`_fresh`): every record below it was left out as read already, and the partition was never
          read again (seen with a worker frozen during a backlog's catch-up and given its partition back);
        - a commit that fails because the group moved on (aiokafka's "already rebalanced") is recorded as made
          all the same (Faust's ``_commit_offsets``): given the partition back, the worker read it again and
          acknowledged every offset, each below that offset and so dropped (:meth:`acknowledge`); nothing was
          committed again until a message past it came, and an idle partition was read whole at each restart
          (seen with a worker frozen as it committed)."""
        for tp in assigned:
            self._read_offset.pop(tp, None)
            self._committed_offset.pop(tp, None)
            self._acked.pop(tp, None)
            self._acked_index.pop(tp, None)
            self._gap.pop(tp, None)
        await super().on_partitions_assigned(assigned, generation_id)

    def resume_partitions(self, tps: Iterable[TP]) -> None:
        super().resume_partitions(tps)
        if self._resumed is not None:
            self._resumed.set()

    async def _hand_over(self, records: Mapping[TP, list[Any]]) -> None:
        """One fetch: the bulk topics' messages as one list (in offset order per partition),
        the others message by message through Faust's conductor, as Faust would."""
        generation = self.app.consumer_generation_id
        bulk: list[Message] = []
        for tp, fetched in records.items():
            # Every fetched record is handed over, even of a partition paused while the fetch ran
            # (streams.pipeline's flow control): the consumer's position is past it, so a record
            # left out here would never be read again (Faust's loop leaves out those of inactive
            # partitions). The pipeline leaves alone what belongs to a partition no longer
            # assigned, or was fetched in an earlier group generation.
            self.app.monitor.track_tp_end_offset(tp, self.highwater(tp))
            fresh = await self._fresh(tp, fetched)
            if not fresh:
                continue
            if tp.topic in self.bulk_topics:
                # Faust's livelock check reads when its stream last took a message of each
                # partition (``Monitor.on_stream_event_in``, which the bulk path never calls):
                # without this it logs "stream has not started processing" for every partition.
                self.app.monitor.stream_inbound_time[tp] = time.monotonic()
                topic, partition = tp.topic, tp.partition
                bulk.extend(Message(topic, partition, r.offset, r.key, r.value, None, generation) for r in fresh)
            else:
                for record in fresh:
                    await self.wait_first(self.callback(self._to_message(tp, record)), self.suspend_flow.wait())
        commit_every = self._commit_every
        if commit_every is not None and self._n_acked >= commit_every:
            self._n_acked = 0
            await self.commit()
        if bulk:
            await self.wait_first(cast(Fetches, self.fetches).put(bulk), self.suspend_flow.wait())

    async def _fresh(self, tp: TP, fetched: list[Any]) -> list[Any]:
        """The records past the partition's read offset, as Faust's own loop takes them (one
        fetched again after a seek is left out), noting the offsets the broker skipped
        (transaction markers, compaction) as gaps, which count as acknowledged: without them
        no commit could pass them."""
        acks = self.app.topics.acks_enabled_for(tp.topic)
        last = self._read_offset[tp]
        fresh = []
        for record in fetched:
            offset = record.offset
            if last is None or offset >= last:
                if acks and last and offset - last > 1:
                    await self._add_gap(tp, last + 1, offset)
                fresh.append(record)
                last = offset
        self._read_offset[tp] = last
        return fresh


class BulkTransport(faust_aiokafka.Transport):
    """The aiokafka transport, making :class:`BulkConsumer` consumers."""

    Consumer = BulkConsumer
    fetches: Fetches | None = None
    bulk_topics: frozenset[str] = frozenset()
    fetch_max_bytes: int | None = None
    """The most one fetch brings of all partitions together (Kafka's ``fetch.max.bytes``; None: aiokafka's 50 MB)."""
    membership: Membership | None = None
    """Renewed by the consumer's heartbeats (:mod:`streams.membership`; None: not watched)."""

    def create_consumer(self, callback: Any, **kwargs: Any) -> Any:
        consumer = cast(BulkConsumer, super().create_consumer(callback, **kwargs))
        consumer.fetches, consumer.bulk_topics = self.fetches, self.bulk_topics
        return consumer


def install_bulk(app: faust.App, topics: Iterable[str], fetches: Fetches, fetch_max_bytes: int | None = None,
                 membership: Membership | None = None) -> Fetches:  # fmt: skip
    """Give ``app`` a consumer that hands fetches of ``topics`` to ``fetches`` (before anything
    has made the app's transport), each fetch at most ``fetch_max_bytes`` (None: aiokafka's 50 MB),
    whose heartbeats renew ``membership``."""
    transport = BulkTransport(app.conf.broker_consumer, app)
    transport.fetches = fetches
    transport.bulk_topics = frozenset(topics)
    transport.fetch_max_bytes = fetch_max_bytes
    transport.membership = membership
    app.transport = transport
    return transport.fetches
