"""The worker's ``/slack/actions`` view (streams/web.py's :class:`SlackActionsView`), the one
path exposed to the internet, served by a real aiohttp server on loopback over the embedded
store: whatever arrives, signed or not, is answered with a status and a JSON reason, never a
500 and a traceback. tests/test_actions.py checks what a click does; tests/test_web_surface.py
that a real worker serves the path."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from urllib.parse import urlencode

import pytest
from structlog.testing import capture_logs

from detector.actions import ActionHandler, RequestVerifier
from streams.web import SlackActionsView
from tests.test_actions import SECRET, click_body, signed
from tests.test_incidents_page import Served as IncidentsServed
from tests.test_slack import alert

pytestmark = pytest.mark.integration


class Served(IncidentsServed):
    """The view on a real aiohttp server (the incident views' test server, with this one route)."""

    def __init__(self, view: SlackActionsView) -> None:
        super().__init__(routes=(("POST", "/slack/actions", view.post),))

    def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], dict]:
        request = urllib.request.Request(self.url("/slack/actions"), data=body, method="POST",
                                         headers={"Content-Type": "application/x-www-form-urlencoded", **headers})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, dict(response.headers), json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), json.loads(exc.read())


def serve(store) -> Served:
    """The view as the worker builds it, on the wall clock (the requests are signed now)."""
    return Served(SlackActionsView(ActionHandler(RequestVerifier(SECRET), store, None, None)))


@pytest.fixture
def served(store):
    server = serve(store)
    yield server
    server.close()


def test_an_unsigned_body_that_is_not_utf8_is_refused_401(served):
    """slack-sdk decodes the body to check its signature: bytes that are not UTF-8 were a
    UnicodeDecodeError, a 500, before anyone was authenticated."""
    status, headers, answer = served.post(b"\xff\xfe", {"X-Slack-Request-Timestamp": str(int(time.time())),
                                                        "X-Slack-Signature": "v0=00"})  # fmt: skip
    assert status == 401 and "not UTF-8" in answer["error"]
    assert headers["Content-Type"].startswith("application/json")


def payload_of(shape: dict | list | str) -> bytes:
    return urlencode({"payload": json.dumps(shape)}).encode()


CLICK = {"actions": [{"action_id": "burnwatch_ack", "value": "a1"}]}


@pytest.mark.parametrize(
    "payload, where",
    [
        ("hello", "Expected `object`, got `str`"),
        ([1, 2], "Expected `object`, got `array`"),
        ({"actions": "abc"}, "`$.actions`"),
        ({"actions": {"0": {}}}, "`$.actions`"),
        ({"actions": ["burnwatch_ack"]}, "`$.actions[0]`"),
        ({"actions": [{"action_id": ["x"], "value": "a1"}]}, "`$.actions[0].action_id`"),
        ({"actions": [{"action_id": "burnwatch_ack", "value": 7}]}, "`$.actions[0].value`"),
        ({**CLICK, "user": "U1"}, "`$.user`"),
        ({**CLICK, "user": {"id": ["U1"]}}, "`$.user.id`"),
        ({**CLICK, "channel": "C1"}, "`$.channel`"),
        ({**CLICK, "message": [1]}, "`$.message`"),
        ({**CLICK, "response_url": 1}, "`$.response_url`"),
        ({"actions": []}, "no actions"),
    ],
    ids=["string", "list", "actions-string", "actions-object", "action-string", "action-id-list", "value-number",
         "user-string", "user-id-list", "channel-string", "message-list", "response-url-number", "no-actions"],
)
def test_a_signed_payload_of_the_wrong_shape_is_a_400_saying_where(served, payload, where):
    body = payload_of(payload)
    status, _, answer = served.post(body, signed(body, at=int(time.time())))
    assert status == 400, answer
    assert answer["error"].startswith("not a Slack block_actions payload") and where in answer["error"]


def test_a_signed_click_of_the_right_shape_still_passes(served, store):
    store.alerts.record([alert()], version=1)
    body = click_body("burnwatch_ack")
    status, _, answer = served.post(body, signed(body, at=int(time.time())))
    assert (status, answer) == (200, {"ok": True, "action": "acknowledged", "alert_id": "a1"})


def test_a_click_while_the_store_does_not_answer_is_a_503_and_a_warning(tmp_path, request):
    """The store (``burnwatch store serve``) stopped: the click is answered 503 with a JSON
    reason, as ``/incidents`` is, and logged as a warning without a traceback (it was a 500:
    ``ActionHandler.handle`` raised the client's OperationalError)."""
    from detector.store import connect
    from streams.process import StoreServerProcess
    from tests.conftest import fresh_store

    process = StoreServerProcess(f"chdb://{tmp_path / 'ch'}", tmp_path / "server.log").wait_ready()
    try:
        remote = fresh_store(connect(process.url), request)
        remote.alerts.record([alert()], version=1)
        server = serve(remote)
    finally:
        assert process.stop() == 0, process.log()
    try:
        body = click_body("burnwatch_ack")
        with capture_logs() as logs:
            status, headers, answer = server.post(body, signed(body, at=int(time.time())))
        assert status == 503 and headers["Content-Type"].startswith("application/json")
        assert answer == {"error": "the store did not answer; the click was not recorded. Try again"}
        (failed,) = [e for e in logs if e["event"] == "slack_action_failed"]
        assert failed["log_level"] == "warning" and failed["alert_id"] == "a1" and "exc_info" not in failed
        assert failed["error"].startswith("OperationalError")
    finally:
        server.close()
        remote.close()
