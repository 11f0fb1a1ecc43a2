"""dcgm-exporter and kube-state-metrics text in, Slack alerts out: the bridge scrapes a local
HTTP server into the embedded broker, the Faust worker (its own process) detects, stores in
embedded ClickHouse and posts to the local Slack server.

One shared Kubernetes node (a p4d.24xlarge, 8 GPUs, known to billing by its instance id
through the node's providerID): a training Job's pod keeps GPUs 0-3 busy the whole time, a
Kubeflow notebook's pod holds GPUs 4-5 and leaves them idle for 90 minutes before its
owner comes back, and GPUs 6-7 are held by no pod. The host is never wholly idle, so the
whole-host rule must stay silent, and the two idle shares must come out as two different
waste types with the pod's owner, the pod, and what to run.

The exporter pages are written from the documented formats (``tests/exposition.py``) and
carry sample timestamps, as a Prometheus ``/federate`` answer does, so that the bridge can
walk two hours of event time in seconds: each dcgm-exporter request is the next 30 s scrape.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from detector.ingest.config import BridgeConfig
from detector.testing import LocalSlack
from streams.bridge import Bridge
from streams.embedded import EmbeddedBroker
from streams.kafka import ensure_topics
from streams.process import WorkerProcess, worker_env
from tests.conftest import ROOT
from tests.exposition import Gpu, dcgm_text, gpu_values, ksm_text, merge, node, pod
from tests.helpers import T0
from tests.test_bridge import Exporters
from tests.test_end_to_end import sql

pytestmark = pytest.mark.integration

PARTITIONS = 2
NODE, INSTANCE = "ip-10-0-7-21.ec2.internal", "i-0e2e5a1b2c3d4e5f6"
SCRAPE_S = 30.0
BACK_AT_MIN = 90
"""When the notebook's owner comes back: GPUs 4-5 work from then on."""
SCRAPES = 110 * 2
"""110 minutes of scrapes."""
TRAIN = ("nlp", "train-llm-7x2kq", ("Job", "train-llm"), {"team": "nlp", "owner": "alice", "project": "llm"})
NOTEBOOK = ("vision", "nb-dana-0", ("StatefulSet", "nb-dana"),
            {"team": "vision", "owner": "dana", "project": "segmentation", "notebook-name": "nb-dana"})  # fmt: skip


class Cluster:
    """The node's dcgm-exporter (``/dcgm/metrics``) and kube-state-metrics (``/ksm/metrics``),
    served by ``exporters``: every dcgm-exporter request is the next scrape (404 once the two
    hours are walked); kube-state-metrics answers for the time of the latest one."""

    def __init__(self, exporters: Exporters) -> None:
        self.scrape = 0
        self.lock = threading.Lock()
        self.url = f"http://{exporters.address}"
        exporters.pages["/dcgm/metrics"] = self.next_dcgm
        exporters.pages["/ksm/metrics"] = lambda: self.ksm(max(self.scrape - 1, 0))

    def next_dcgm(self) -> str | None:
        with self.lock:
            if self.scrape >= SCRAPES:
                return None
            self.scrape += 1
            return self.dcgm(self.scrape - 1)

    @staticmethod
    def t(scrape: int) -> float:
        return T0 + scrape * SCRAPE_S

    def dcgm(self, scrape: int) -> str:
        ts_ms = int(self.t(scrape) * 1000)
        back = scrape * SCRAPE_S >= BACK_AT_MIN * 60
        gpus = []
        for i in range(8):
            if i < 4:
                values, holder = gpu_values(96, power=380, gr=0.95, tensor=0.55, dram=0.4), TRAIN
            elif i < 6:
                values = gpu_values(88 if back else 0, power=300 if back else 60, gr=0.9 if back else 0.0,
                                    tensor=0.4 if back else 0.0, dram=0.3 if back else 0.0)  # fmt: skip
                holder = NOTEBOOK
            else:
                values, holder = gpu_values(0, power=58, used=0, gr=0.0, tensor=0.0, dram=0.0), None
            labels = {"namespace": holder[0], "pod": holder[1], "container": "main"} if holder else {}
            gpus.append(Gpu(i, values, host=NODE, labels=labels, ts_ms=ts_ms))
        return dcgm_text(gpus)

    def ksm(self, scrape: int) -> str:
        pods = [pod(ns, name, NODE, 4 if name == TRAIN[1] else 2, owner=owner, labels=labels)
                for ns, name, owner, labels in (TRAIN, NOTEBOOK)]  # fmt: skip
        page = merge(
            node(
                NODE,
                f"aws:///us-east-1a/{INSTANCE}",
                "p4d.24xlarge",
                "us-east-1",
                8,
                extra_labels={"label_team": "platform", "label_project": "gpu-pool"},
            ),
            *pods,
        )
        return ksm_text(page, ts_ms=int(self.t(scrape) * 1000))


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with Exporters() as exporters:
        yield Cluster(exporters)


async def bridge_rounds(cluster: Cluster, bootstrap: str) -> int:
    """Scrape until the exporter's two hours are walked; the number of messages published."""
    await ensure_topics(bootstrap, PARTITIONS)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks=1)
    await producer.start()
    sent = 0

    async def send(topic: str, key: str, value: bytes) -> None:
        nonlocal sent
        await producer.send_and_wait(topic, value=value, key=key.encode())
        sent += 1

    config = BridgeConfig.model_validate({
        "interval": "30s", "listen": "", "targets": [
            {"url": f"{cluster.url}/ksm/metrics", "job": "kube-state-metrics"},
            {"url": f"{cluster.url}/dcgm/metrics", "job": "dcgm"}]})  # fmt: skip
    # The bridge's clock walks with the pages (as the demo's does): samples hours behind the wall clock are no live
    # scrape's, and are refused.
    bridge = Bridge(config, send, clock=lambda: cluster.t(max(cluster.scrape - 1, 0)))
    try:
        while cluster.scrape < SCRAPES:
            results = await bridge.round()
            assert all(r.ok for r in results) or cluster.scrape >= SCRAPES, results
    finally:
        await bridge.close()
        await producer.stop()
    return sent


def test_dcgm_and_kube_state_metrics_through_the_bridge_to_slack(tmp_path: Path, cluster: Cluster, ruleset):
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker, LocalSlack() as slack:
        sent = asyncio.run(bridge_rounds(cluster, broker.bootstrap))
        assert sent >= SCRAPES * 2 - 2  # a gpu-metrics and a resource-usage message per scrape (the first two start the clock)
        rules = tmp_path / "rules"
        rules.mkdir()
        for name in ("rules.yaml", "pricing.yaml", "routing.yaml", "limits.yaml"):
            (rules / name).write_text((ROOT / "rules" / name).read_text())
        env = worker_env(broker.bootstrap, tmp_path / "data", rules, PARTITIONS, SLACK_BOT_TOKEN="xoxb-local",
                         SLACK_CHANNEL="#ml-cost", SLACK_BASE_URL=slack.api_url)  # fmt: skip
        worker = WorkerProcess(env, tmp_path / "worker.log").start()
        try:
            worker.wait_until(lambda h: h["events"] >= SCRAPES * 9 - 2 and h["detected"] >= SCRAPES * 9 - 2
                              and h["slack_pending"] == 0, timeout=180)  # fmt: skip
        finally:
            assert worker.stop() == 0, worker.tail()

        alerts = {r["type"]: r for r in sql(env, "SELECT * FROM burnwatch.alerts FINAL")}
        # Never idle_gpu (4 GPUs work), never untagged (the node pool is labelled team=platform).
        assert set(alerts) == {"partly_idle_gpu", "unallocated_gpu"}, alerts.keys()
        price = ruleset.pricing.hourly("p4d.24xlarge")

        partly = alerts["partly_idle_gpu"]
        details = json.loads(partly["details"])
        assert partly["resource_id"] == INSTANCE  # the node, as billing knows it
        assert partly["resolved_at"] is not None  # the owner came back
        assert partly["waste_usd"] == pytest.approx(price * 2 / 8 * BACK_AT_MIN / 60, abs=price * 2 / 8 * SCRAPE_S / 3600)
        assert partly["tags"]["team"] == "vision" and partly["tags"]["owner"] == "dana"  # the pod's, not the node's
        assert NOTEBOOK[1] in json.dumps(details)

        unallocated = alerts["unallocated_gpu"]
        assert unallocated["resource_id"] == INSTANCE and unallocated["resolved_at"] is None
        assert unallocated["usd_per_hour"] == pytest.approx(price * 2 / 8, rel=0.01)
        assert unallocated["tags"]["team"] == "platform"  # no pod holds them: the node's owner pays

        posts = [p.text_of_blocks() for p in slack.calls("chat.postMessage") if "thread_ts" not in p.body]
        (notebook_post,) = [p for p in posts if NOTEBOOK[1] in p]
        assert "kubeflow-resource-stopped" in notebook_post and "stop the instance" not in notebook_post.lower(), notebook_post
        (unallocated_post,) = [p for p in posts if "no pod" in p.lower()]
        assert INSTANCE in unallocated_post
