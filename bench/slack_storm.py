"""A storm of openings to one channel against a Slack that takes one post a second per channel: the real
Outbox and SlackNotifier, delivered by a loop that does what the worker's ``deliver_alerts`` task does
(:mod:`streams.timers`: a pass when woken, back again after ``hold_s``, a failure retried after 1 s doubling
to 60 s), against :class:`detector.testing.LocalSlack` with :meth:`~detector.testing.LocalSlack.limit_rate`.

    .venv/bin/python bench/slack_storm.py [HOSTS] [SPREAD_S] [--resolve] [--other] [--group-wait=S]

HOSTS idle_gpu openings of one team, firing evenly over SPREAD_S seconds of wall time (live: event time is
wall time), as a cluster's jobs ending at night leave its hosts idle; with --resolve, then their resolutions
over the same spread (the morning). Prints messages, 429s, how long until the last opening was posted, and
any alert posted twice or never.
"""

import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, os.environ.get("TREE", str(Path(__file__).resolve().parent.parent)))
from detector.alerts import Alert  # noqa: E402
from detector.delivery import Outbox  # noqa: E402
from detector.slack import SlackError, SlackNotifier  # noqa: E402
from detector.store import Store  # noqa: E402
from detector.testing import LocalSlack  # noqa: E402

T0 = 1_767_225_600.0


def idle(i: int, fired_at: float, change: str = "fired", team: str = "nlp") -> Alert:
    resolved = change == "resolved"
    return Alert(alert_id=f"{i:016x}", type="idle_gpu", rule="idle-gpu", resource_id=f"gpu-host-{i:04d}",
                 status="resolved" if resolved else "firing", change=change, severity="warning",
                 episode_start=fired_at - 1800, fired_at=fired_at, updated_at=fired_at + (3600 if resolved else 0),
                 resolved_at=fired_at + 3600 if resolved else None, waste_usd=40.0, usd_per_hour=98.32,
                 account="111122223333", region="us-east-1", instance_type="p4d.24xlarge", channel=f"#{team}-cost",
                 tags={"team": team, "owner": "alice", "project": "llm-pretrain"},
                 details={"reason": "gpu_busy"} if resolved else {})  # fmt: skip


def deliver_loop(outbox: Outbox, wake: threading.Event, stop: threading.Event, log: list[str]) -> None:
    """:func:`streams.timers._deliver_alerts`, on a thread."""
    backoff = 1.0
    while not stop.is_set():
        if not wake.wait(0.2):
            continue
        wake.clear()
        try:
            outbox.deliver_pending()
            backoff = 1.0
            if outbox.hold_s:
                threading.Timer(outbox.hold_s, wake.set).start()
        except SlackError as exc:
            log.append(f"{time.monotonic():.1f} retry in {backoff}s: {str(exc)[:80]}")
            time.sleep(backoff)
            backoff = min(backoff * 2, 60.0)
            wake.set()


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    hosts = int(args[0]) if args else 300
    spread = float(args[1]) if len(args) > 1 else 180.0
    with tempfile.TemporaryDirectory() as tmp, LocalSlack() as slack:
        slack.limit_rate(per_s=1.0, burst=3.0)
        store = Store.open(f"chdb://{tmp}/ch")
        store.migrate()
        notifier = SlackNotifier(token="xoxb-bench", channel="#ml-cost", base_url=slack.api_url, timeout=10)
        wait = next((float(a.split("=", 1)[1]) for a in sys.argv if a.startswith("--group-wait=")), 30.0)
        outbox = Outbox(store, notifier, group_wait_s=wait)  # the worker's BURNWATCH_SLACK_GROUP_WAIT_S
        wake, stop, log = threading.Event(), threading.Event(), []
        worker = threading.Thread(target=deliver_loop, args=(outbox, wake, stop, log), daemon=True)
        worker.start()
        phases = [("fired", 0.0)] + ([("resolved", spread + 5)] if "--resolve" in sys.argv else [])
        for change, offset in phases:
            start = time.monotonic()
            for i in range(hosts):
                at = start + spread * i / hosts
                time.sleep(max(0.0, at - time.monotonic()))
                alert = idle(i, T0 + offset + spread * i / hosts, change)
                store.alerts.record([alert], version=1 if change == "fired" else 2)
                outbox.add([alert])
                wake.set()
                if i == hosts // 2 and "--other" in sys.argv:  # another team's one opening, mid-storm
                    other = idle(hosts + 1 + (change == "resolved"), T0 + offset + spread / 2, "fired", team="vision")
                    store.alerts.record([other], version=1)
                    outbox.add([other])
                    other_at = time.monotonic()
            last_added = time.monotonic()
            if "--other" in sys.argv:
                slack.wait_for(lambda reqs, since=other_at: any(r.body.get("channel") == "#vision-cost"
                                                            and r.received_at >= since for r in reqs), timeout=3600)  # fmt: skip
                seen = min(r.received_at for r in slack.calls("chat.postMessage")
                           if r.body.get("channel") == "#vision-cost" and r.received_at >= other_at)  # fmt: skip
                print(f"  {change}: team vision's one opening, added mid-storm, posted after {seen - other_at:.0f}s",
                      flush=True)
            ok = slack.wait_for(lambda reqs, c=change: len({(a, c) for a, k in delivered(reqs, c)}) >= hosts, timeout=3600)
            done = time.monotonic()
            posts = [r for r in slack.calls("chat.postMessage")
                     if r.received_at >= start and r.body.get("channel") == "#nlp-cost"]
            kinds = Counter("reply" if "thread_ts" in r.body else "message" for r in posts)
            ids = Counter(a for a, _ in delivered(posts, change))
            print(f"{change}: {hosts} alerts over {spread:.0f}s: all delivered={ok}; posts {dict(kinds)}, "
                  f"chat.update {sum(1 for r in slack.calls('chat.update') if r.received_at >= start)}; "
                  f"429s so far {slack.throttled}; last delivered {done - last_added:.0f}s after the last was added "
                  f"({done - start:.0f}s after the first); posted twice: {sum(1 for n in ids.values() if n > 1)}; "
                  f"never: {hosts - len(ids)}; outbox retries {len(log)}", flush=True)  # fmt: skip
            sizes = Counter(len(ids_in(r)) for r in posts if "thread_ts" not in r.body)
            if sizes:
                print("  opening messages by alerts in them:", dict(sorted(sizes.items())))
        stop.set()
        for line in log[:5]:
            print("  ", line)


def ids_in(request: object) -> list[str]:
    import re

    return re.findall(r"alert `([0-9a-f]{16})`", request.text_of_blocks())  # type: ignore[attr-defined]


def delivered(requests: list, change: str) -> list[tuple[str, str]]:
    """(alert id, change) for every post of that change: an opening message names its alerts, a reply its one."""
    out = []
    for r in requests:
        if r.method != "chat.postMessage":
            continue
        if ("thread_ts" in r.body) == (change == "resolved"):
            out += [(a, change) for a in ids_in(r)]
    return out


if __name__ == "__main__":
    main()
