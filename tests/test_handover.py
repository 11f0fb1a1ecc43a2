"""Partitions handed over at a stop: a worker stopped while it waits for the broker stops
cleanly, whatever it was waiting in. The real worker process and the embedded broker, with
a relay in front of the broker that holds back its answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.embedded import EmbeddedBroker, free_port
from tests.conftest import ROOT
from tests.kafka_proxy import KafkaProxy
from tests.reliability import PARTITIONS, Worker, publish, worker_env

pytestmark = pytest.mark.integration


def test_a_stop_while_the_broker_is_slow_to_give_end_offsets_is_clean(tmp_path: Path):
    """SIGTERM reaches the worker while its request for the partitions' end offsets (which
    tells a partition that delivered nothing has nothing to read) waits for the broker's
    answer, as under load, just after the assignment. The stop cancels that request: it must
    still commit, leave the group and exit 0, not hang until it is killed (status -9). Seen
    when the request was made inside the assignment callback, which the consumer's stop
    waits for."""
    broker_port = free_port()
    with KafkaProxy(broker_port) as proxy, \
            EmbeddedBroker(port=broker_port, advertised_port=proxy.port, log_path=tmp_path / "broker.log"):
        publish(proxy.bootstrap, [], partitions=PARTITIONS)
        proxy.hold_end_offsets()
        worker = Worker(worker_env(proxy.bootstrap, tmp_path / "data", ROOT / "rules", PARTITIONS),
                        tmp_path / "worker.log").start()  # fmt: skip
        try:
            assert proxy.held.wait(120), f"no request for end offsets held: {proxy.errors}\n{worker.tail()}"
            assert worker.running, worker.tail()
        finally:
            code = worker.stop(timeout=30)
    assert not proxy.errors
    assert code == 0, worker.tail(80)
