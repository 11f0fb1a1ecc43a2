"""The local Slack server's fault windows (detector/testing.py), which the chaos test relies on."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

from detector.testing import LocalSlack


def _post(slack: LocalSlack, timeout: float = 5.0) -> int:
    request = urllib.request.Request(slack.api_url + "chat.postMessage", data=b"channel=C1&text=hi", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_window_fails_requests_while_open_and_counts_them():
    with LocalSlack() as slack:
        window = slack.fail_window(0, 60, status=429, retry_after=1)
        assert _post(slack) == 429 and _post(slack) == 429
        assert window.hits == 2 and not slack.calls("chat.postMessage")
        window.end = time.monotonic()  # the outage is over
        assert _post(slack) == 200 and len(slack.calls("chat.postMessage")) == 1


def test_a_hanging_window_holds_requests_past_the_clients_timeout():
    with LocalSlack() as slack:
        window = slack.fail_window(0, 60, hang_s=1.5)
        try:
            _post(slack, timeout=0.5)
            raise AssertionError("answered inside the client's timeout")
        except (TimeoutError, urllib.error.URLError):
            pass
        assert window.hits == 1
        assert slack.wait_for(lambda reqs: len(reqs) == 1, timeout=10)  # Slack still posted it, as Slack would
