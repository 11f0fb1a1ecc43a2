"""What a Slack post costs the worker: one delivery pass of N single-alert posts (N teams, so no
grouping) into a fresh embedded store, against the local Slack server in this process.

    .venv/bin/python bench/outbox.py [N]
    TREE=/path/to/a/worktree .venv/bin/python bench/outbox.py      # a past commit (git worktree add)

Prints wall and CPU milliseconds a post: the process's (the local Slack server's share included,
the same for both sides of an A/B) and the delivering thread's (Block Kit, slack-sdk, the inserts
into ``alert_deliveries``, which hold the store's lock that the event writes wait on).
"""

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.environ.get("TREE", str(Path(__file__).resolve().parent.parent)))
from detector.delivery import Outbox  # noqa: E402
from detector.slack import SlackNotifier  # noqa: E402
from detector.store import Store  # noqa: E402
from detector.testing import LocalSlack  # noqa: E402
from tests.test_outbox_crash import idle  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 200


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, LocalSlack() as slack:
        store = Store.open(f"chdb://{tmp}/ch")
        store.migrate()
        ids = [f"a{i}" for i in range(N)]
        store.alerts.record([idle(alert_id=a) for a in ids], version=1)
        notifier = SlackNotifier(token="xoxb-bench", channel="#c", base_url=slack.api_url, timeout=5)
        outbox = Outbox(store, notifier, group_wait_s=0, landing_s=0)
        outbox.add([idle(alert_id=a) for a in ids])
        wall, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
        assert outbox.deliver_pending() == N
        wall, cpu, own = time.perf_counter() - wall, time.process_time() - cpu, time.thread_time() - own
    print(f"{os.environ.get('TREE', 'this tree')}: {N} posts: wall {wall / N * 1000:.1f} ms a post, "
          f"process CPU {cpu / N * 1000:.1f} ms, the delivering thread's {own / N * 1000:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
