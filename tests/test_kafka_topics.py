"""The topics burnwatch creates and how its producers send: every topic with
``BURNWATCH_REPLICATION_FACTOR`` replicas (the broker's default unless set), every producer
with ``acks=all``. The embedded broker keeps one copy whatever is asked (it reports the
replicas asked for), and ignores ``acks``: a relay in front of it (tests.kafka_proxy) reads
what each request asked."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from detector.events import TOPICS
from detector.ingest.config import load_bridge_config
from detector.settings import load_settings
from streams.bridge import run_bridge
from streams.embedded import EmbeddedBroker, free_port
from streams.kafka import DEAD_LETTER_TOPIC, ensure_worker_topics, faust_leader_topic, publish_records
from streams.process import WorkerProcess, worker_env
from tests.conftest import ROOT
from tests.kafka_proxy import KafkaProxy
from tests.test_bridge import Exporters, bare_metal

pytestmark = pytest.mark.integration

PARTITIONS = 2
ALL_IN_SYNC = -1
"""A Produce request's ``acks`` for "all"."""


def replicas(bootstrap: str) -> dict[str, set[int]]:
    """topic: the replica counts of its partitions, as the broker describes them."""

    async def go() -> dict[str, set[int]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            described = await admin.describe_topics(await admin.list_topics())
            return {t["topic"]: {len(p["replicas"]) for p in t["partitions"]} for t in described}
        finally:
            await admin.close()

    return asyncio.run(go())


def test_a_worker_creates_every_topic_it_uses_with_the_replication_factor_set_and_sends_with_acks_all(tmp_path: Path):
    """BURNWATCH_REPLICATION_FACTOR=3: the inputs, the dead-letter topic and Faust's leader topic
    are created with 3 replicas (they had 1 whatever the cluster, lost with one broker, refused
    where a managed cluster asks for 3); Faust creates none of its own. A malformed message is
    dead-lettered by Faust's producer, and it, like the publisher, asks acks=all."""
    broker_port = free_port()
    with KafkaProxy(broker_port) as proxy, \
            EmbeddedBroker(port=broker_port, advertised_port=proxy.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        env = worker_env(proxy.bootstrap, tmp_path / "data", ROOT / "rules", PARTITIONS,
                         BURNWATCH_REPLICATION_FACTOR="3")  # fmt: skip
        worker = WorkerProcess(env, tmp_path / "worker.log").start()
        try:
            worker.wait_until(lambda h: h["partitions"] > 0, timeout=120)
            asyncio.run(publish_records(proxy.bootstrap, [("gpu-metrics", "gpu-host-000", b"{not json")]))
            worker.wait_until(lambda h: h["dead_letters"] >= 1, timeout=60)
        finally:
            worker.stop()
        topics = replicas(proxy.bootstrap)
    expected = {*TOPICS, DEAD_LETTER_TOPIC, faust_leader_topic("burnwatch")}
    assert topics == dict.fromkeys(expected, {3}), worker.tail()
    assert proxy.replication_asked == dict.fromkeys(expected, 3)
    assert not proxy.errors
    clients = {client for client, _ in proxy.produced}
    assert len(clients) == 2, proxy.produced  # the publisher, and the worker's (Faust's) dead-letter producer
    assert {acks for _, acks in proxy.produced} == {ALL_IN_SYNC}


def test_topics_take_the_brokers_default_replication_factor_unless_it_is_set(tmp_path: Path):
    """Unset, the variable asks the broker's ``default.replication.factor`` (-1, Kafka 2.4+), which the
    embedded broker accepts (its default: one replica); 0 and below -1 are refused by the settings."""
    broker_port = free_port()
    with KafkaProxy(broker_port) as proxy, \
            EmbeddedBroker(port=broker_port, advertised_port=proxy.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        settings = load_settings(environ={"BURNWATCH_KAFKA_BOOTSTRAP": proxy.bootstrap})
        assert settings.replication_factor == -1
        asyncio.run(ensure_worker_topics(settings))
        asyncio.run(ensure_worker_topics(settings))  # they exist: nothing is asked again, nothing refused
        topics = replicas(proxy.bootstrap)
    expected = {*TOPICS, DEAD_LETTER_TOPIC, faust_leader_topic(settings.app_id)}
    assert proxy.replication_asked == dict.fromkeys(expected, -1) and not proxy.errors
    assert topics == dict.fromkeys(expected, {1})
    for bad in ("0", "-2"):
        with pytest.raises(ValueError, match="BURNWATCH_REPLICATION_FACTOR"):
            load_settings(environ={"BURNWATCH_REPLICATION_FACTOR": bad})


def test_the_bridge_creates_its_topics_with_the_replication_factor_and_sends_with_acks_all(tmp_path: Path):
    """One round of the bridge (a bare-metal host's dcgm-exporter) through the relay."""
    broker_port = free_port()
    with Exporters() as exporters, KafkaProxy(broker_port) as proxy, \
            EmbeddedBroker(port=broker_port, advertised_port=proxy.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        exporters.pages["/lab/metrics"] = bare_metal()
        config = tmp_path / "bridge.yaml"
        config.write_text(json.dumps({
            "interval": "30s", "listen": "",
            "targets": [{"url": f"http://{exporters.address}/lab/metrics", "job": "dcgm"}],
            "hosts": {"lab-box-1": {"resource_id": "i-0lab0001", "instance_type": "g5.xlarge", "region": "us-east-1"}},
        }))  # fmt: skip
        (result,) = asyncio.run(run_bridge(load_bridge_config(config), proxy.bootstrap, once=True,
                                           partitions=PARTITIONS, replication_factor=2))  # fmt: skip
    assert result.ok and result.messages == {"gpu-metrics": 1}, result
    assert proxy.replication_asked == dict.fromkeys((*TOPICS, DEAD_LETTER_TOPIC), 2)
    assert proxy.produced and {acks for _, acks in proxy.produced} == {ALL_IN_SYNC}


def partition_counts(bootstrap: str) -> dict[str, int]:
    """topic: its partition count, as the broker describes it."""

    async def go() -> dict[str, int]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            return {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(await admin.list_topics())}
        finally:
            await admin.close()

    return asyncio.run(go())


def made_up_front(bootstrap: str, topics: dict[str, int]) -> None:
    """Topics an operator made before burnwatch ran (their own partition counts)."""
    from streams.kafka import create_missing

    asyncio.run(create_missing(bootstrap, topics))


def test_input_topics_made_with_different_partition_counts_are_refused_by_name(tmp_path: Path, monkeypatch, capsys):
    """An operator made gpu-metrics with 3 partitions and resource-usage with 2 (say, by infrastructure code,
    the GPU topic the busier): a host's usage and GPU samples would land on different partition numbers and
    be read by different workers, each deciding on half of what it sent, with nothing said. The worker
    refuses to start, exit 1 in one line naming each topic's count and what to do, before Faust starts."""
    from tests.helpers import burnwatch_in_process

    with EmbeddedBroker(port=free_port(), log_path=tmp_path / "broker.log") as broker:
        made_up_front(broker.bootstrap, {"resource-usage": 2, "gpu-metrics": 3})
        monkeypatch.setattr("streams.cli.configure_logging", lambda *a, **k: None)
        for var, value in worker_env(broker.bootstrap, tmp_path / "data", ROOT / "rules", PARTITIONS).items():
            monkeypatch.setenv(var, value)
        code, _, err = burnwatch_in_process(capsys, "worker")
        counts = partition_counts(broker.bootstrap)
    assert code == 1 and "Traceback" not in err, err
    assert "different partition counts (gpu-metrics 3, resource-usage 2)" in err, err
    assert "--alter --topic NAME --partitions 3" in err and "to resource-usage" in err, err
    assert "run-events" not in counts  # refused before anything more was made


def test_an_input_topic_missing_beside_others_is_made_with_their_partition_count(tmp_path: Path):
    """resource-usage and gpu-metrics exist with 4 partitions; BURNWATCH_PARTITIONS says 2: run-events is made
    with 4, as the inputs must have one count, and the dead-letter topic with 2."""
    with EmbeddedBroker(port=free_port(), log_path=tmp_path / "broker.log") as broker:
        made_up_front(broker.bootstrap, {"resource-usage": 4, "gpu-metrics": 4})
        settings = load_settings(environ={"BURNWATCH_KAFKA_BOOTSTRAP": broker.bootstrap, "BURNWATCH_PARTITIONS": "2"})
        asyncio.run(ensure_worker_topics(settings))
        counts = partition_counts(broker.bootstrap)
    assert {name: counts[name] for name in (*TOPICS, DEAD_LETTER_TOPIC)} == {**dict.fromkeys(TOPICS, 4), DEAD_LETTER_TOPIC: 2}


def test_topics_whose_creation_timed_out_are_waited_for_not_taken_as_refused(tmp_path: Path, monkeypatch):
    """A controller that does not finish creating topics within the request's timeout answers REQUEST_TIMED_OUT for
    each, and goes on creating them (a busy cluster). The worker's topics are then waited for until the brokers list
    them. Before, the answer was taken for a refusal: exit 1, telling the user to set the replication factor. Topics
    that never appear stop the command as Kafka unavailable (exit 69: try again), naming them."""
    import streams.kafka
    from streams.cli import EXIT_UNAVAILABLE, _expected_failure

    broker_port = free_port()
    with KafkaProxy(broker_port) as proxy, \
            EmbeddedBroker(port=broker_port, advertised_port=proxy.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        proxy.creates_time_out = True
        settings = load_settings(environ={"BURNWATCH_KAFKA_BOOTSTRAP": proxy.bootstrap})
        asyncio.run(ensure_worker_topics(settings))
        assert set(replicas(proxy.bootstrap)) == {*TOPICS, DEAD_LETTER_TOPIC, faust_leader_topic(settings.app_id)}

        proxy.creates_elsewhere = True  # the creation never finishes
        monkeypatch.setattr(streams.kafka, "CREATED_WITHIN_S", 1.0)
        with pytest.raises(streams.kafka.TopicsNotCreated) as caught:
            asyncio.run(streams.kafka.create_missing(proxy.bootstrap, {"never-made": PARTITIONS}))
        assert "never-made" not in replicas(proxy.bootstrap)
    assert f"Kafka at {proxy.bootstrap} timed out creating never-made and did not list them within 1 s" in str(caught.value)
    assert _expected_failure(caught.value) == (str(caught.value), EXIT_UNAVAILABLE)
    assert not proxy.errors


def test_the_relay_rewrites_the_create_topics_answer_of_its_own_connection_only(tmp_path: Path):
    """The relay rewrites a CreateTopics answer found by its correlation id. Each connection numbers its requests
    from 0, so with the ids kept for all connections at once another connection's answer of the same id arriving
    first (an ApiVersions while a large CreateTopics is being made) was rewritten as the CreateTopics': the relay's
    thread died on it (struct.error), that client waited for ever, and the CreateTopics came back unrewritten."""
    import socket
    import struct

    from aiokafka.protocol.admin import ApiVersionRequest_v0, ApiVersionResponse_v0, CreateTopicsRequest_v2

    def send(sock: socket.socket, request: object, correlation: int) -> None:
        body = request.build_request_header(correlation_id=correlation, client_id="t").encode() + request.encode()  # type: ignore[attr-defined]
        sock.sendall(struct.pack(">i", len(body)) + body)

    def answer(sock: socket.socket) -> bytes:
        with sock.makefile("rb") as f:
            return f.read(struct.unpack(">i", f.read(4))[0])

    broker_port = free_port()
    with KafkaProxy(broker_port) as proxy, \
            EmbeddedBroker(port=broker_port, advertised_port=proxy.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        proxy.creates_time_out = True
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as a, \
                socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as b:  # fmt: skip
            many = CreateTopicsRequest_v2(create_topic_requests=[("many", 50_000, 1, [], [])], timeout=30_000,
                                          validate_only=False)  # fmt: skip
            send(a, many, 7)  # tens of milliseconds to make: b's answer comes first
            send(b, ApiVersionRequest_v0(), 7)
            versions = ApiVersionResponse_v0.decode(answer(b)[4:])
            created = CreateTopicsRequest_v2.RESPONSE_TYPE.decode(answer(a)[4:])
    assert versions.error_code == 0
    assert [(topic, code) for topic, code, *_ in created.topic_errors] == [("many", 7)]  # REQUEST_TIMED_OUT
