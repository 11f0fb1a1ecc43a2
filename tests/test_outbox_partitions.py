"""With several workers, each posts the alerts of the keys on the partitions it holds, and a
rebalance moves the unposted ones to the new holder: every incident is posted once, by one
worker. Two outboxes over one store (chdb) and the local Slack server stand for two workers."""

from __future__ import annotations

import re

from detector.alerts import AlertManager
from detector.delivery import Outbox
from detector.detectors import Finding, ResourceInfo
from detector.slack import SlackNotifier
from detector.testing import LocalSlack
from tests.helpers import T0


def opening(rid: str, partition: int):
    found = Finding(action="fire", rule="idle-gpu", type="idle_gpu", resource_id=rid, episode_start=T0,
                    fired_at=T0 + 1800, at=T0 + 1800, waste_usd=16.0, usd_per_hour=32.0, severity="warning",
                    resource=ResourceInfo(resource_id=rid, tags={"owner": rid}), key=rid)  # fmt: skip
    (alert,) = AlertManager().handle([found])
    alert.partition = partition
    return alert


ALERT_ID = re.compile(r"alert `([0-9a-f]{16})`")


def posted_ids(slack: LocalSlack) -> list[str]:
    return [alert_id for p in slack.calls("chat.postMessage") for alert_id in ALERT_ID.findall(p.text_of_blocks())]


def test_each_worker_posts_its_partitions_and_a_rebalance_moves_the_rest(store):
    alerts = [opening(f"h{i}", i % 4) for i in range(8)]
    store.alerts.record(alerts, version=1)
    with LocalSlack() as slack:
        notifier = SlackNotifier(token="xoxb-test", channel="#c", base_url=slack.api_url)
        first, second = Outbox(store, notifier, group_wait_s=0), Outbox(store, notifier, group_wait_s=0)
        assert first.assign([0, 1]) == 4 and second.assign([2, 3]) == 4
        first.add(alerts)  # the first worker made them all, say, before the group settled
        first.deliver_pending()
        mine = {a.alert_id for a in alerts if a.partition in (0, 1)}
        assert set(posted_ids(slack)) == mine  # none of partitions 2 and 3
        second.revoke()  # the second worker leaves before it posted anything
        second.deliver_pending()
        assert set(posted_ids(slack)) == mine
        first.revoke()
        assert first.assign([0, 1, 2, 3]) == 4  # the rest, recovered from the store
        first.deliver_pending()
        ids = posted_ids(slack)
    assert sorted(ids) == sorted(a.alert_id for a in alerts)  # every incident once
