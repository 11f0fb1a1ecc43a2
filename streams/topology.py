"""The Faust app, its topics and the one agent over the three input topics.

The agent acknowledges nothing itself: the pipeline acknowledges each message, in offset
order, once it is stored and detection has seen all of its events (docs/reliability.md).
"""

from __future__ import annotations

import traceback
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import faust
from faust.types import TP

from detector.events import TOPICS
from detector.settings import Settings, bind_host, url_host
from streams.bulk import BulkConsumer, Fetches, install_bulk
from streams.kafka import DEAD_LETTER_TOPIC, faust_credentials
from streams.membership import Membership
from streams.parts import WorkerParts, fail
from streams.pipeline import Message, PipelineStopped

__all__ = ["caught_up", "dead_letter_sender", "end_positions", "flow_control", "install_agent", "make_app", "reading_starts"]

Positions = dict[tuple[str, int], tuple[int | None, int | None]]


def make_app(settings: Settings) -> faust.App:
    """The Faust app, configured for manual acknowledgement and co-partitioned inputs, with a
    consumer that hands the input topics' fetches to the detect agent whole (streams.bulk)."""
    app = faust.App(
        settings.app_id,
        broker=f"kafka://{settings.kafka_bootstrap}",
        broker_credentials=faust_credentials(settings.kafka_security),  # TLS, SASL; None: PLAINTEXT
        store="memory://",
        datadir=str(settings.data_dir / "faust"),
        topic_partitions=settings.partitions,
        # Every topic the worker uses, Faust's leader topic included, exists before Faust starts
        # (streams.kafka.ensure_worker_topics, with BURNWATCH_REPLICATION_FACTOR): Faust's own
        # setting cannot say "the broker's default" (it refuses -1 and makes 0 one replica), so
        # Faust creates no topic, rather than one of a replication factor nobody chose.
        topic_allow_declare=False,
        topic_replication_factor=max(settings.replication_factor, 1),  # what Faust's topics say; it creates none
        producer_acks=-1,  # "all": the dead-letter records, as every producer burnwatch runs (streams.kafka.ACKS)
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 3),
        consumer_auto_offset_reset="earliest",
        web_port=settings.web_port,
        web_host=url_host(settings.web_host),  # Faust's URL of itself
        web_bind=bind_host(settings.web_host),  # 0.0.0.0: IPv6 too
        producer_max_request_size=8 << 20,
        broker_max_poll_records=settings.batch_max_messages,
        consumer_max_fetch_size=settings.max_partition_fetch_bytes,
        # Faust's own partition assignor: it co-partitions the three inputs (a resource's usage
        # and its GPU metrics on one worker). Faust picks aiokafka's round-robin, which does
        # not, unless standby replicas are asked for; with no tables, they cost nothing.
        table_standby_replicas=1,
        # Faust's own wait for every delivered message to be acknowledged (at a rebalance or a
        # stop) never ends while the aligner holds messages back; the revocation handler
        # (streams.handover) drains the write in flight and commits what is done instead.
        stream_wait_empty=False,
    )
    install_bulk(app, TOPICS, Fetches(settings.batch_max_messages, settings.batch_max_bytes, settings.batch_within_s),
                 fetch_max_bytes=settings.fetch_max_bytes, membership=Membership(settings.session_timeout_s))
    return app


def _raw_topic(app: faust.App, settings: Settings, *names: str) -> faust.TopicT:
    return app.topic(*names, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw",
                     partitions=settings.partitions)  # fmt: skip


def dead_letter_sender(app: faust.App, settings: Settings) -> Callable[[bytes | None, bytes], Awaitable[None]]:
    """Sends a dead-letter record (the pipeline retries a failed send)."""
    dead_letters = _raw_topic(app, settings, DEAD_LETTER_TOPIC)

    async def send(key: bytes | None, value: bytes) -> None:
        await dead_letters.send(key=key, value=value)

    return send


def caught_up(app: faust.App) -> Callable[[str, int, int], bool]:
    """Whether a partition has nothing more to read now: ``offset`` (the last one read) is the
    last the latest fetch reported. A partition whose fetch reported no high watermark is not
    caught up."""

    def check(topic: str, partition: int, offset: int) -> bool:
        highwater = app.consumer.highwater(TP(topic, partition))
        return highwater is not None and offset + 1 >= highwater

    return check


def end_positions(app: faust.App) -> Callable[[list[tuple[str, int]]], Awaitable[Positions]]:
    """(start, end offset) of assigned partitions that have delivered nothing yet: the start is
    where reading began (the committed offset, else the earliest), never the consumer's fetch
    position, which moves past records fetched but not yet handed to the pipeline (a partition
    so counted as having nothing to read let the others' events be released past its own, which
    then came late: alerts the backtest does not make, seen with the worker's event loop slowed
    by chart rendering). The end is the larger of the broker's listed end offset and a fetch's
    high watermark: some brokers (the embedded one) list the last batch's base offset + 1,
    short of the end."""

    async def positions(tps: list[tuple[str, int]]) -> Positions:
        partitions = [TP(topic, partition) for topic, partition in tps]
        ends = await app.consumer.highwaters(*partitions)
        earliest = await app.consumer.earliest_offsets(*partitions)
        # Faust's own record of the committed offsets (the next offset to read), set at the seek
        committed: Mapping[TP, int | None] = getattr(app.consumer, "_committed_offset", {})
        out: Positions = {}
        for tp in partitions:
            listed, fetched = ends.get(tp), app.consumer.highwater(tp)
            end = max(listed, fetched) if listed is not None and fetched is not None else listed
            out[(tp.topic, tp.partition)] = (reading_starts(committed.get(tp), earliest.get(tp), end), end)
        return out

    return positions


def reading_starts(committed: int | None, earliest: int | None, end: int | None) -> int | None:
    """Where the consumer starts reading a partition: its committed offset, unless there is none
    or it lies outside the log, where the consumer resets to the earliest offset (a topic
    recreated shorter: committed past the end; retention deleted past it: committed before
    the earliest)."""
    if committed is None or (end is not None and committed > end):
        return earliest
    return committed if earliest is None else max(committed, earliest)


def flow_control(app: faust.App) -> Callable[[list[tuple[str, int]], list[tuple[str, int]]], None]:
    """``flow(pause, resume)``: stop and restart fetching from input partitions (the messages
    already fetched stay buffered in the consumer). Only assigned partitions are paused or resumed:
    one revoked meanwhile is not fetched again, and a pause of one not assigned would stay in Faust,
    and hold it if it were assigned here again."""

    def flow(pause: list[tuple[str, int]], resume: list[tuple[str, int]]) -> None:
        consumer = app.consumer
        assigned = consumer.assignment()
        if pause:
            consumer.pause_partitions([tp for tp in map(TP._make, pause) if tp in assigned])
        if resume:
            consumer.resume_partitions([tp for tp in map(TP._make, resume) if tp in assigned])

    return flow


def install_agent(parts: WorkerParts) -> None:
    """The ``detect`` agent: the input topics' fetches into the pipeline, acknowledged by it alone."""
    app, settings, pipeline = parts.app, parts.settings, parts.pipeline
    source = _raw_topic(app, settings, *TOPICS)
    app.topics.add(source)  # subscribed: the agent takes its messages from the bulk consumer, not a stream
    fetches = parts.fetches
    pipeline.watch(fetches)  # flow control counts what is fetched and not yet taken, deciding as each fetch lands

    async def ack(messages: list[Message]) -> None:
        cast(BulkConsumer, app.consumer).acknowledge(messages)

    @app.agent(source, name="detect")
    async def detect(stream: faust.StreamT) -> Any:
        # Manual acks: a message is acknowledged only once it is stored and detection has seen all
        # of its events, which the event-time aligner may hold back for a while; then by offset,
        # into the bookkeeping from which Faust commits (streams.bulk).
        while True:
            messages = await fetches.take()
            try:
                await pipeline.process(messages, ack=ack)
            except PipelineStopped:
                return
            except Exception as exc:  # noqa: BLE001 - a bug must stop the worker, not the agent alone
                fail("pipeline_error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
