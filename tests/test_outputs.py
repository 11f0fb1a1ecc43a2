"""Outputs besides Slack against real local receivers: a webhook receiver (HTTP server), a real
Alertmanager (Debian's package), aiosmtpd's SMTP server. Each output is driven through the
outbox with the store on chdb: stored before sent, retried after a failing receiver,
never sent twice (a restart recovers from the store), hostile event values inert."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from detector.alerts import Alert
from detector.outputs.outbox import OutputOutbox
from detector.outputs.webhook import SIGNATURE, TIMESTAMP, verify
from detector.rules import Routing
from detector.units import parse_rfc3339, rfc3339
from tests.helpers import T0
from tests.receivers import LocalReceiver, alertmanager, free_port, smtp_server, wait_until

SECRET = "s3cret-for-tests-only"
HOSTILE = {
    "team": "nlp\r\nBcc: victim@example.com",
    "owner": "<script>alert(1)</script>&amp;",
    "project": "x" * 200_000,
    "note": "line1\nX-Injected: yes\r\n\r\n<b>bold</b>",
}


def alert(change: str = "fired", alert_id: str = "a1", *, tags: dict[str, str] | None = None,
          resource_id: str = "host-1", severity: str = "warning") -> Alert:  # fmt: skip
    resolved = change == "resolved"
    return Alert(alert_id=alert_id, type="idle_gpu", rule="idle-gpu", resource_id=resource_id,
                 status="resolved" if resolved else "firing", change=change, severity=severity,  # type: ignore[arg-type]
                 episode_start=T0, fired_at=T0 + 1800, updated_at=T0 + (5400 if resolved else 1800),
                 resolved_at=T0 + 5400 if resolved else None, waste_usd=49.16, usd_per_hour=32.77,
                 account="ml-prod", region="us-east-1", instance_type="p4d.24xlarge",
                 tags=tags if tags is not None else {"team": "nlp", "owner": "alice"},
                 details={"reason": "gpu_busy"} if resolved else {})  # fmt: skip


def routing(outputs: dict[str, Any], send: dict[str, Any] | None = None) -> Routing:
    return Routing.model_validate({
        "outputs": outputs, "send": send or {"default": ["slack", *outputs]},
        "links": [{"name": "Console", "url": "https://console.example.com/{region}/{resource_id}"}],
    })  # fmt: skip


class Clock:
    """The outbox's monotonic clock, moved by the test (backoff without sleeping)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stored(store, *alerts: Alert) -> None:
    """What the worker does before handing changes to an outbox: write them."""
    store.alerts.record(list(alerts), version=time.time_ns())


@pytest.fixture
def secret_env(monkeypatch):
    monkeypatch.setenv("BW_HOOK_SECRET", SECRET)


def hook(url: str, dedupes: bool = False, timeout_s: float = 5.0) -> dict[str, Any]:
    return {"hook": {"kind": "webhook", "url": url, "secret_env": "BW_HOOK_SECRET", "receiver_dedupes": dedupes,
                     "timeout_s": timeout_s}}  # fmt: skip


# -- webhook ------------------------------------------------------------------------------


def test_a_signing_secret_mounted_from_a_file_signs_without_its_trailing_newline(store, monkeypatch):
    """A Kubernetes Secret made with ``--from-file`` puts the file's last newline in the variable; the
    receiver's copy of the secret has none, so every signature failed (and a 401 waits forever)."""
    monkeypatch.setenv("BW_HOOK_SECRET", SECRET + "\n")
    with LocalReceiver() as receiver:
        outbox = OutputOutbox(store, routing(hook(receiver.url)))
        stored(store, alert())
        outbox.add([alert()])
        assert outbox.deliver_pending() == 1
    (opened,) = receiver.delivered
    assert verify(SECRET, opened.headers[TIMESTAMP.lower()], opened.body, opened.headers[SIGNATURE.lower()])


def test_the_webhook_posts_signed_json_with_an_idempotency_key(store, secret_env):
    with LocalReceiver() as receiver:
        outbox = OutputOutbox(store, routing(hook(receiver.url)))
        stored(store, alert())
        outbox.add([alert()])
        assert outbox.deliver_pending() == 1
        stored(store, alert("resolved"))
        outbox.add([alert("resolved")])
        assert outbox.deliver_pending() == 1
    opened, resolved = receiver.delivered
    headers = opened.headers
    assert verify(SECRET, headers[TIMESTAMP.lower()], opened.body, headers[SIGNATURE.lower()])
    assert not verify("another secret", headers[TIMESTAMP.lower()], opened.body, headers[SIGNATURE.lower()])
    assert not verify(SECRET, headers[TIMESTAMP.lower()], opened.body + b" ", headers[SIGNATURE.lower()])
    assert not verify(SECRET, str(int(headers[TIMESTAMP.lower()]) - 3600), opened.body, headers[SIGNATURE.lower()])
    assert headers["idempotency-key"] == "a1:hook:fired" and resolved.headers["idempotency-key"] == "a1:hook:resolved"
    body = opened.json
    assert {k: body[k] for k in ("id", "type", "rule", "severity", "status", "team", "owner", "output")} == {
        "id": "a1", "type": "idle_gpu", "rule": "idle-gpu", "severity": "warning", "status": "firing",
        "team": "nlp", "owner": "alice", "output": "hook",
    }  # fmt: skip
    assert body["resource"]["id"] == "host-1" and body["dollars_so_far"] == 49.16 and body["usd_per_hour"] == 32.77
    assert body["episode_start"] == "2026-11-02T00:00:00Z" and body["suggestion"]
    assert body["links"] == [{"name": "Console", "url": "https://console.example.com/us-east-1/host-1"}]
    assert resolved.json["status"] == "resolved" and resolved.json["resolved_at"] == "2026-11-02T01:30:00Z"
    assert body["withdrawn"] is False and resolved.json["withdrawn"] is False  # (True: a fire taken back)
    assert store.outputs.states("a1") == {("hook", "fired"): {"sending", "sent"}, ("hook", "resolved"): {"sending", "sent"}}



def _taken_back(resolved: Alert) -> Alert:
    """``resolved``, then taken back: a stop read after the sample that resolved it (change ``withdrawn``)."""
    return msgspec.structs.replace(resolved, change="withdrawn", waste_usd=0.0, usd_per_hour=0.0,
                                   resolved_at=T0 + 1770, details={"reason": "withdrawn"})  # fmt: skip


def _corrected(resolved: Alert) -> Alert:
    """``resolved`` (at 01:30, $49.16), then corrected: a stop read after the sample that resolved it, dated
    within a gap in the samples before, ended it at 01:00 with $32.77 (change ``corrected``)."""
    return msgspec.structs.replace(resolved, change="corrected", waste_usd=32.77, resolved_at=T0 + 3600,
                                   updated_at=T0 + 3600, details={
                                       "reason": "instance_stopped", "corrected": True,
                                       "was_resolved_at": resolved.resolved_at, "was_usd": resolved.waste_usd})  # fmt: skip


def _resolved_then(store, receiver, changed) -> None:
    """An opening and its resolution sent, then the change after the resolution (``changed`` of it) sent once,
    and nothing more by a restart; a second alert (``a2``) opened and sent, then stored resolved and changed
    before either was sent: a restarted outbox sends the one resolution, saying the change (then by)."""
    outbox = OutputOutbox(store, routing(hook(receiver.url)))
    stored(store, alert())
    stored(store, alert("resolved"))
    outbox.add([alert(), alert("resolved")])
    assert outbox.deliver_pending() == 2
    stored(store, changed(alert("resolved")))
    outbox.add([changed(alert("resolved"))])
    assert outbox.deliver_pending() == 1
    assert OutputOutbox(store, routing(hook(receiver.url))).recover() == 0
    stored(store, alert(alert_id="a2"))
    outbox.add([alert(alert_id="a2")])
    assert outbox.deliver_pending() == 1
    stored(store, alert("resolved", alert_id="a2"))
    stored(store, changed(alert("resolved", alert_id="a2")))
    restarted = OutputOutbox(store, routing(hook(receiver.url)))
    assert restarted.recover() == 2 and restarted.deliver_pending() == 1  # (the change: said by then)
    assert OutputOutbox(store, routing(hook(receiver.url))).recover() == 0


def test_a_receiver_hears_an_alert_taken_back_after_its_resolution_once(store, secret_env):
    """Opening and resolution sent, then the fire taken back: the receiver gets change ``withdrawn`` (its
    own idempotency key) with no dollars; a restart sends nothing more. Stored resolved and taken back
    before either was sent, a restarted outbox sends the one (withdrawn) resolution, not two."""
    with LocalReceiver() as receiver:
        _resolved_then(store, receiver, _taken_back)
    got = [(r.json["id"], r.json["change"], r.json["withdrawn"], r.json["dollars_so_far"]) for r in receiver.delivered]
    assert got == [("a1", "fired", False, 49.16), ("a1", "resolved", False, 49.16), ("a1", "withdrawn", True, 0.0),
                   ("a2", "fired", False, 49.16), ("a2", "resolved", True, 0.0)]  # fmt: skip
    assert receiver.delivered[2].headers["idempotency-key"] == "a1:hook:withdrawn"



@pytest.mark.parametrize("dedupes", [False, True], ids=["receiver-keeps-all", "receiver-dedupes"])
@pytest.mark.parametrize(("then", "change", "dollars"), [(_taken_back, "withdrawn", 0.0), (_corrected, "corrected", 32.77)])
def test_a_resolution_begun_before_a_restart_and_changed_since_is_followed_by_that_change(store, secret_env, dedupes,
                                                                                       then, change, dollars):  # fmt: skip
    """The resolution's send was begun when the worker died (it may have arrived, with the first figures),
    and the fire was taken back (or the alert corrected) since: the next worker sends the withdrawal (the
    correction) under its own key. A review found the withdrawal lost: taken as said by the resolution
    (marked unknown), or sent again as the resolution, which a deduping receiver drops."""
    with LocalReceiver() as receiver:
        outbox = OutputOutbox(store, routing(hook(receiver.url, dedupes=dedupes)))
        stored(store, alert())
        outbox.add([alert()])
        assert outbox.deliver_pending() == 1
        stored(store, alert("resolved"))
        store.outputs.record([("a1", "hook", "resolved", "sending", "")])  # begun, then the worker died
        stored(store, then(alert("resolved")))
        restarted = OutputOutbox(store, routing(hook(receiver.url, dedupes=dedupes)))
        restarted.recover()
        restarted.deliver_pending()
    got = [(r.json["change"], r.json["dollars_so_far"], r.headers["idempotency-key"]) for r in receiver.delivered]
    assert got == [("fired", 49.16, "a1:hook:fired"), (change, dollars, f"a1:hook:{change}")]
    assert store.outputs.states("a1")[("hook", "resolved")] == {"sending", "unknown"}



def test_a_recovered_resolution_saying_withdrawn_answered_in_doubt_is_not_followed_by_the_withdrawal(store,
                                                                                                  secret_env):  # fmt: skip
    """Resolved and taken back while no worker held the alert: the next one sends the resolution as the
    alert stands (withdrawn), and its answer is garbage (maybe arrived: unknown). That resolution said the
    withdrawal; a receiver that does not dedupe is not sent it again (a review found it sent twice)."""
    clock = Clock()
    with LocalReceiver() as receiver:
        outbox = OutputOutbox(store, routing(hook(receiver.url)))
        stored(store, alert())
        outbox.add([alert()])
        assert outbox.deliver_pending() == 1
        stored(store, alert("resolved"))
        stored(store, _taken_back(alert("resolved")))
        restarted = OutputOutbox(store, routing(hook(receiver.url)), clock=clock)
        assert restarted.recover() == 2
        receiver.garble_next(1)
        for _ in range(3):
            restarted.deliver_pending()
            clock.now += 60
    assert [(r.json["change"], r.json["withdrawn"]) for r in receiver.delivered] == [("fired", False), ("resolved", True)]


def test_a_receiver_hears_an_alert_corrected_after_its_resolution_once(store, secret_env):
    """Opening and resolution sent, then corrected: the receiver gets change ``corrected`` (its own
    idempotency key) with the corrected time and dollars and what the resolution said; a restart sends
    nothing more. Stored resolved and corrected before either was sent, a restarted outbox sends the one
    resolution, with the corrected figures, not two."""
    with LocalReceiver() as receiver:
        _resolved_then(store, receiver, _corrected)
    got = [(r.json["id"], r.json["change"], r.json["corrected"], r.json["dollars_so_far"], r.json["resolved_at"])
           for r in receiver.delivered]  # fmt: skip
    assert got == [("a1", "fired", False, 49.16, None), ("a1", "resolved", False, 49.16, "2026-11-02T01:30:00Z"),
                   ("a1", "corrected", True, 32.77, "2026-11-02T01:00:00Z"),
                   ("a2", "fired", False, 49.16, None), ("a2", "resolved", True, 32.77, "2026-11-02T01:00:00Z")]  # fmt: skip
    correction = receiver.delivered[2]
    assert correction.headers["idempotency-key"] == "a1:hook:corrected" and correction.json["status"] == "resolved"
    assert correction.json["corrects"] == {"resolved_at": "2026-11-02T01:30:00Z", "dollars_so_far": 49.16}
    assert correction.json["summary"].startswith("CORRECTED") and "(not $49.16)" in correction.json["summary"]
    assert receiver.delivered[1].json["corrects"] is None


def test_a_restarted_outbox_sends_an_opening_before_the_withdrawal_dated_before_it(store, secret_env):
    """Stored fired, then taken back (resolved, dated by the stop, before the fire), none sent: the
    opening goes first (sent after, it would open the alert again, in Alertmanager for good)."""
    with LocalReceiver() as receiver:
        OutputOutbox(store, routing(hook(receiver.url))).recover()  # the output enabled before
        withdrawn = msgspec.structs.replace(alert("resolved"), waste_usd=0.0, resolved_at=T0 + 1770,
                                            details={"reason": "withdrawn"})  # fmt: skip
        stored(store, alert())
        stored(store, withdrawn)
        restarted = OutputOutbox(store, routing(hook(receiver.url)))
        assert restarted.recover() == 2 and restarted.deliver_pending() == 2
    assert [r.json["change"] for r in receiver.delivered] == ["fired", "resolved"]  # (both as the alert stands now)


def test_a_failing_receiver_is_retried_with_backoff_and_gets_the_alert_once(store, secret_env):
    clock = Clock()
    with LocalReceiver() as receiver:
        outbox = OutputOutbox(store, routing(hook(receiver.url)), clock=clock)
        stored(store, alert())
        outbox.add([alert()])
        receiver.fail_next(2, status=503)
        with capture_logs() as logs:
            assert outbox.deliver_pending() == 0
            assert outbox.hold_s == 1.0  # the first backoff
            assert outbox.deliver_pending() == 0  # not due yet: nothing sent
            clock.now += 1.0
            assert outbox.deliver_pending() == 0
            assert outbox.hold_s == 2.0  # doubled
            clock.now += 2.0
            assert outbox.deliver_pending() == 1
            clock.now += 10
            assert outbox.deliver_pending() == 0
    assert len(receiver.requests) == 3 and len(receiver.delivered) == 1
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["output_delivery_retry"] * 2
    assert SECRET not in json.dumps(logs, default=str)
    assert len(outbox) == 0 and store.outputs.states("a1")[("hook", "fired")] == {"sending", "not_sent", "sent"}


def test_a_receiver_refusing_for_good_is_recorded_and_not_retried(store, secret_env):
    with LocalReceiver() as receiver:
        outbox = OutputOutbox(store, routing(hook(receiver.url)))
        stored(store, alert(), alert(alert_id="a2"))
        outbox.add([alert(), alert(alert_id="a2")])
        receiver.fail_next(1, status=400)
        with capture_logs() as logs:
            assert outbox.deliver_pending() == 1  # the second goes on
        assert OutputOutbox(store, routing(hook(receiver.url))).recover() == 0
        outbox.deliver_pending()
    assert len(receiver.requests) == 2
    assert store.outputs.states("a1")[("hook", "fired")] == {"sending", "refused"}
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["output_delivery_refused"]


def test_a_missing_secret_is_retried_and_named_never_shown(store, monkeypatch):
    monkeypatch.delenv("BW_HOOK_SECRET", raising=False)
    clock = Clock()
    with LocalReceiver() as receiver:
        outbox = OutputOutbox(store, routing(hook(receiver.url)), clock=clock)
        stored(store, alert())
        outbox.add([alert()])
        with capture_logs() as logs:
            assert outbox.deliver_pending() == 0
        assert "BW_HOOK_SECRET" in logs[-1]["error"] and receiver.requests == []
        monkeypatch.setenv("BW_HOOK_SECRET", SECRET)
        clock.now += outbox.hold_s
        assert outbox.deliver_pending() == 1


def test_alertmanagers_token_from_a_secret_file_is_sent_and_a_malformed_one_never_shown(store, monkeypatch):
    """A Secret made from a file ends in a newline (dropped); CR/LF inside made http.client raise
    ValueError quoting the header with the token escaped, which the log's redaction missed."""
    token = "am-token-" + "t" * 24
    clock = Clock()
    with LocalReceiver() as receiver:
        outbox = OutputOutbox(store, routing(am_output(receiver.url.removesuffix("/hook"), bearer_token_env="AM_TOKEN")),
                              clock=clock)  # fmt: skip
        monkeypatch.setenv("AM_TOKEN", token + "\r\nX-Injected: 1")
        stored(store, alert())
        outbox.add([alert()])
        with capture_logs() as logs:
            assert outbox.deliver_pending() == 0
        assert "AM_TOKEN" in logs[-1]["error"] and token not in str(logs) and receiver.requests == []
        monkeypatch.setenv("AM_TOKEN", token + "\n")
        clock.now += outbox.hold_s
        assert outbox.deliver_pending() == 1
        assert receiver.requests and all(r.path == "/api/v2/alerts" and r.headers["authorization"] == f"Bearer {token}"
                                         for r in receiver.requests)  # the alert, and its re-send once due  # fmt: skip


def test_a_restart_sends_what_was_stored_and_nothing_twice(store, secret_env):
    """Stored, never sent (the worker died before its pass): the next worker sends it once; what
    was sent is not sent again."""
    with LocalReceiver() as receiver:
        first = OutputOutbox(store, routing(hook(receiver.url)))
        stored(store, alert(), alert(alert_id="a2"))
        first.add([alert()])
        first.deliver_pending()  # a1 sent; a2 stored and never handed over (killed)
        restarted = OutputOutbox(store, routing(hook(receiver.url)))
        assert restarted.recover() == 1
        assert restarted.deliver_pending() == 1
        again = OutputOutbox(store, routing(hook(receiver.url)))
        assert again.recover() == 0
    assert [r.json["id"] for r in receiver.delivered] == ["a1", "a2"]


def test_adding_an_output_does_not_replay_history_to_it(store, secret_env):
    stored(store, alert("resolved"))
    with LocalReceiver() as receiver:
        outbox = OutputOutbox(store, routing(hook(receiver.url)))
        assert outbox.recover() == 0
        stored(store, alert(alert_id="a2"))
        assert OutputOutbox(store, routing(hook(receiver.url))).recover() == 1  # stored since: recovered


@pytest.mark.parametrize("dedupes", [False, True])
def test_a_send_cut_off_by_a_kill_is_resent_only_to_a_receiver_that_dedupes(store, secret_env, dedupes):
    """Marked begun, then the worker died with the request in flight (the receiver took it):
    a receiver that dedupes by Idempotency-Key gets it again and keeps one; one that does not
    is not sent it again (recorded unknown, logged)."""
    with LocalReceiver(dedupes=dedupes) as receiver:
        outbox = OutputOutbox(store, routing(hook(receiver.url, dedupes=dedupes, timeout_s=0.5)))
        stored(store, alert())
        outbox.add([alert()])
        receiver.hang(1.5)
        outbox.deliver_pending()  # the answer never comes: the worker is killed here
        receiver.hang(0)
        wait_until(lambda: len(receiver.requests) == 1, what="the request")
        store.query(f"ALTER TABLE {store.db}.output_deliveries DELETE WHERE state != 'sending' AND state != 'enabled' "
                    "SETTINGS mutations_sync = 1")  # fmt: skip  # the kill came before any outcome was written
        with capture_logs() as logs:
            restarted = OutputOutbox(store, routing(hook(receiver.url, dedupes=dedupes)))
            restarted.recover()
            restarted.deliver_pending()
    assert len(receiver.delivered) == 1
    if dedupes:
        assert len(receiver.requests) == 2
        assert receiver.requests[0].headers["idempotency-key"] == receiver.requests[1].headers["idempotency-key"]
        assert "sent" in store.outputs.states("a1")[("hook", "fired")]
    else:
        assert len(receiver.requests) == 1
        assert "unknown" in store.outputs.states("a1")[("hook", "fired")]
        assert any(e["event"] == "output_send_unknown" for e in logs)


def test_a_receiver_not_listening_is_retried_even_when_it_does_not_dedupe(store, secret_env):
    """A refused connection never delivered anything: retried, not recorded unknown."""
    outbox = OutputOutbox(store, routing(hook(f"http://127.0.0.1:{free_port()}/hook")), clock=Clock())
    stored(store, alert())
    outbox.add([alert()])
    assert outbox.deliver_pending() == 0 and outbox.hold_s == 1.0 and len(outbox) == 1
    assert store.outputs.states("a1") == {("hook", "fired"): {"sending", "not_sent"}}


def test_a_timeout_to_a_receiver_that_does_not_dedupe_is_not_resent(store, secret_env):
    clock = Clock()
    with LocalReceiver() as receiver:
        outbox = OutputOutbox(store, routing(hook(receiver.url, timeout_s=0.3)), clock=clock)
        stored(store, alert())
        outbox.add([alert()])
        receiver.hang(1.0)
        with capture_logs() as logs:
            outbox.deliver_pending()
        receiver.hang(0)
        clock.now += 60
        outbox.deliver_pending()
        wait_until(lambda: len(receiver.requests) == 1, what="the request")
    assert len(receiver.requests) == 1
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["output_delivery_unknown"]


def test_a_hanging_receiver_holds_the_other_outputs_up_one_timeout_not_one_per_change(store, secret_env):
    """A receiver that takes requests and never answers: its first change times out (recorded
    ``unknown``), the rest of its queue waits for its backoff, and the other output is served
    in the same pass, not after one timeout per queued change."""
    clock = Clock()
    with LocalReceiver() as hanging, LocalReceiver() as other:
        outputs = {**hook(hanging.url, timeout_s=0.3), "other": {**hook(other.url)["hook"]}}
        outbox = OutputOutbox(store, routing(outputs), clock=clock)
        changes = [alert(alert_id=f"a{i}") for i in range(3)]
        stored(store, *changes)
        outbox.add(changes)
        hanging.hang(1.0)
        assert outbox.deliver_pending() == 3  # the other output's three
        assert len(other.requests) == 3 and len(hanging.requests) == 1
        assert outbox.hold_s == 1.0 and len(outbox) == 2
        hanging.hang(0)
        outbox.deliver_pending()  # the backoff is not over: nothing is tried
        assert len(hanging.requests) == 1
        clock.now += 1
        assert outbox.deliver_pending() == 2
    assert [r.json["id"] for r in hanging.requests] == ["a0", "a1", "a2"]
    assert store.outputs.states("a0")[("hook", "fired")] == {"sending", "unknown"}


def test_a_receiver_timeout_is_capped_with_a_clear_error():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"3600 s is too long: at most 30 s \(one delivery thread"):
        routing(hook("http://127.0.0.1:1/hook", timeout_s=3600))
    with pytest.raises(ValidationError, match="timeout_s"):
        routing({"mail": {**mail_output(25)["mail"], "timeout_s": 31}})
    assert routing(hook("http://127.0.0.1:1/hook", timeout_s=30)).outputs["hook"].timeout_s == 30


def test_hostile_event_values_stay_inside_the_json_body(store, secret_env):
    """CR/LF cannot add a header (none of ours carries an event value), HTML is data, a huge
    tag is capped."""
    evil = alert(tags=HOSTILE, resource_id="host-1\r\nX-Evil: 1<img src=x>")
    with LocalReceiver() as receiver:
        outbox = OutputOutbox(store, routing(hook(receiver.url)))
        stored(store, evil)
        outbox.add([evil])
        assert outbox.deliver_pending() == 1
    (received,) = receiver.delivered
    assert "x-evil" not in received.headers and "bcc" not in received.headers
    assert set(received.headers) >= {"content-type", "idempotency-key", TIMESTAMP.lower(), SIGNATURE.lower()}
    body = received.json
    assert body["team"] == HOSTILE["team"] and body["owner"] == HOSTILE["owner"]
    assert body["resource"]["id"] == evil.resource_id
    assert len(received.body) < 20_000 and body["tags"]["project"].endswith("…")
    assert verify(SECRET, received.headers[TIMESTAMP.lower()], received.body, received.headers[SIGNATURE.lower()])


# -- routing --------------------------------------------------------------------------------


def test_routing_chooses_outputs_per_team_and_severity(store, secret_env):
    """nlp's alerts go to the webhook only; critical ones to the webhook as well as Slack."""
    with LocalReceiver() as receiver:
        chosen = routing(hook(receiver.url), {"default": ["slack"], "by_team": {"nlp": ["hook"]},
                                               "by_severity": {"critical": ["hook"]}})  # fmt: skip
        assert chosen.outputs_for({"team": "nlp"}, "warning") == ["hook"]
        assert chosen.outputs_for({"team": "vision"}, "warning") == ["slack"]
        assert chosen.outputs_for({"team": "vision"}, "critical") == ["slack", "hook"]
        assert Routing().outputs_for({"team": "nlp"}, "critical") == ["slack"]  # nothing said: Slack
        outbox = OutputOutbox(store, chosen)
        changes = [alert(alert_id="nlp", tags={"team": "nlp"}), alert(alert_id="vis", tags={"team": "vision"}),
                   alert(alert_id="crit", tags={"team": "vision"}, severity="critical")]  # fmt: skip
        stored(store, *changes)
        outbox.add(changes)
        assert outbox.deliver_pending() == 2
    assert sorted(r.json["id"] for r in receiver.delivered) == ["crit", "nlp"]


def test_a_reload_adds_and_removes_outputs(store, secret_env):
    """The worker hands each new routing over (``configure``, no I/O); the next pass uses it."""
    with LocalReceiver() as receiver:
        outbox = OutputOutbox(store, Routing())
        stored(store, alert(), alert(alert_id="a2"))
        outbox.add([alert()])
        assert outbox.deliver_pending() == 0 and outbox.outputs == []
        outbox.configure(routing(hook(receiver.url)))
        assert outbox.has_work
        outbox.add([alert(alert_id="a2")])
        assert outbox.deliver_pending() == 1 and outbox.outputs == ["hook"]
        outbox.configure(Routing())
        stored(store, alert("resolved", "a2"))
        outbox.add([alert("resolved", "a2")])
        assert outbox.deliver_pending() == 0 and outbox.outputs == []
    assert [(r.json["id"], r.json["change"]) for r in receiver.delivered] == [("a2", "fired")]


def test_slack_skips_alerts_routed_elsewhere_and_a_restart_does_not_post_them(store):
    from detector.delivery import Outbox
    from detector.outputs.config import SLACK
    from detector.slack import SlackNotifier
    from detector.testing import LocalSlack

    chosen = routing({"hook": {"kind": "webhook", "url": "http://127.0.0.1:9/x", "secret_env": "BW_HOOK_SECRET"}},
                     {"default": ["slack"], "by_team": {"nlp": ["hook"]}})  # fmt: skip

    def wants(a: Alert) -> bool:
        return SLACK in chosen.outputs_for(a.tags, a.severity)

    with LocalSlack() as slack:
        def outbox() -> Outbox:
            box = Outbox(store, SlackNotifier(token="xoxb-test", channel="#c", base_url=slack.api_url), group_wait_s=0,
                         edit_every_s=0)
            box.wants = wants
            return box

        first = outbox()
        changes = [alert(alert_id="nlp", tags={"team": "nlp"}), alert(alert_id="vis", tags={"team": "vision"})]
        stored(store, *changes)
        first.add(changes)
        first.deliver_pending()
        stored(store, alert("resolved", "nlp", tags={"team": "nlp"}))
        first.add([msgspec.structs.replace(changes[0], change="updated", waste_usd=99.0)])  # no message to edit
        first.deliver_pending()
        first.add([alert("resolved", "nlp", tags={"team": "nlp"})])
        first.deliver_pending()
        restarted = outbox()
        assert restarted.recover() == 0
        restarted.deliver_pending()
        posts = slack.calls("chat.postMessage")
    assert len(posts) == 1 and "alert `vis`" in posts[0].text_of_blocks()
    assert slack.calls("chat.update") == []
    assert store.deliveries.undelivered() == []


def test_a_bad_routing_file_is_refused_with_file_line_and_field(tmp_path, ruleset):
    from detector.rules import RulesInvalid, load_rules
    from streams.config import Config, LiveConfig

    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: idle-gpu\n    type: idle_gpu\n")
    good = ("outputs:\n  hook:\n    kind: webhook\n    url: https://hooks.example.com/x\n    secret_env: HOOK_SECRET\n"
            "send:\n  by_severity:\n    critical: [slack, hook]\n")  # fmt: skip
    (tmp_path / "routing.yaml").write_text(good)
    live = LiveConfig(Config.of(load_rules(rules)), rules)
    assert live.current.routing.outputs_for({}, "critical") == ["slack", "hook"]
    bad = {
        "send:\n  by_team:\n    nlp: [pager]\n": (1, "send", "unknown output(s) by_team.nlp: 'pager'; defined: slack"),
        "outputs:\n  h:\n    kind: webhook\n    url: https://x.example.com\n    secret: abc\n": (5, "outputs.h.secret",
                                                                                        "unknown key"),
        "outputs:\n  h:\n    kind: pager\n": (2, "outputs.h", "does not match any of the expected tags"),
        "outputs:\n  slack:\n    kind: webhook\n    url: https://x.example.com\n    secret_env: S\n": (1, "outputs",
                                                                                          "built-in Slack"),
        "outputs:\n  m:\n    kind: email\n    host: smtp.example.com\n    from: a@example.com\n"
        "    to: [\"b@example.com\\r\\nBcc: c@evil.example\"]\n": (6, "outputs.m.to[0]", "not a bare mail address"),
        "outputs:\n  am:\n    kind: alertmanager\n    url: http://am:9093\n    generator_url: https://g/{secret}\n": (
            1, "outputs", "am.generator_url: unknown field(s) secret"),
        "outputs:\n  am:\n    kind: alertmanager\n    url: http://am:9093\n    generator_url: https://g/{rule:>999999999}\n": (
            1, "outputs", "{rule:>999999999}: only plain fields"),
        "links:\n  - name: x\n    url: https://g/{resource_id!r}\n": (3, "links[0].url", "only plain fields"),
        "outputs:\n  am:\n    kind: alertmanager\n    url: http://am:9093\n    resend_s: 60\n    ends_after_s: 30\n": (
            2, "outputs.am", "must exceed resend_s"),
    }
    for text, (line, where, message) in bad.items():
        (tmp_path / "routing.yaml").write_text(text)
        with pytest.raises(RulesInvalid) as caught:
            load_rules(rules)
        error = caught.value.errors[-1]
        assert (error.line, error.path, message in error.message) == (line, where, True), (text, error)
    kept, refused = live.reload()
    assert kept is None and refused is not None
    assert live.current.routing.outputs_for({}, "critical") == ["slack", "hook"]  # the old config kept


# -- Alertmanager ---------------------------------------------------------------------------


def am_output(url: str, **extra: Any) -> dict[str, Any]:
    return {"pager": {"kind": "alertmanager", "url": url, **extra}}


def test_alertmanager_shows_the_alert_with_our_labels_and_annotations_and_resolves_it(store, tmp_path):
    with alertmanager(tmp_path) as am:
        outbox = OutputOutbox(store, routing(am_output(am.url)))
        stored(store, alert(severity="critical"))
        outbox.add([alert(severity="critical")])
        assert outbox.deliver_pending() == 1
        (shown,) = wait_until(am.alerts, what="the alert in Alertmanager")
        assert shown["labels"] == {
            "alertname": "BurnwatchIdleGpu", "severity": "critical", "team": "nlp", "resource_id": "host-1",
            "rule": "idle-gpu", "type": "idle_gpu", "account": "ml-prod", "region": "us-east-1",
            "burnwatch_alert_id": "a1",
        }  # fmt: skip
        notes = shown["annotations"]
        assert notes["dollars"] == "49.16" and notes["usd_per_hour"] == "32.7700" and notes["owner"] == "alice"
        assert "idle" in notes["summary"].lower() and notes["suggestion"]
        assert shown["generatorURL"] == "https://console.example.com/us-east-1/host-1"
        assert shown["status"]["state"] == "active"
        stored(store, alert("resolved", severity="critical"))
        outbox.add([alert("resolved", severity="critical")])
        assert outbox.deliver_pending() == 1
        wait_until(lambda: am.alerts() == [], what="the alert to resolve")


def test_alertmanager_alerts_are_resent_while_firing(store, tmp_path):
    """Alertmanager resolves an alert whose endsAt passes: each re-send pushes endsAt on, and a
    restarted worker re-sends what is firing at once."""
    clock = Clock()
    with alertmanager(tmp_path) as am:
        spec = am_output(am.url, resend_s=60, ends_after_s=120)
        outbox = OutputOutbox(store, routing(spec), clock=clock)
        stored(store, alert())
        outbox.add([alert()])
        outbox.deliver_pending()
        (first,) = wait_until(am.alerts, what="the alert")
        assert outbox.hold_s == pytest.approx(60, abs=1)
        clock.now += 60
        outbox.add([msgspec.structs.replace(alert(), change="updated", waste_usd=81.93)])
        outbox.deliver_pending()  # the re-send, with the newer dollars
        (second,) = wait_until(lambda: [a for a in am.alerts() if a["annotations"]["dollars"] == "81.93"],
                               what="the re-sent alert")  # fmt: skip
        assert second["endsAt"] > first["endsAt"]
        stored(store, msgspec.structs.replace(alert(), change="updated", waste_usd=99.99))  # figures since
        restarted = OutputOutbox(store, routing(spec), clock=clock)
        assert restarted.recover() == 0  # nothing pending, but the firing alert is known
        assert restarted.deliver_pending() == 0  # a re-send, not a delivery
        (third,) = wait_until(lambda: [a for a in am.alerts() if a["annotations"]["dollars"] == "99.99"],
                              what="the alert re-sent by the restarted worker")  # fmt: skip
        assert third["endsAt"] >= second["endsAt"] and third["labels"] == first["labels"]


def test_alertmanager_takes_hostile_values_as_label_values(store, tmp_path):
    evil = alert(tags=HOSTILE, resource_id="host-1\r\n<script>x</script>" + "y" * 100_000)
    with alertmanager(tmp_path) as am:
        outbox = OutputOutbox(store, routing(am_output(am.url)))
        stored(store, evil)
        outbox.add([evil])
        assert outbox.deliver_pending() == 1
        (shown,) = wait_until(am.alerts, what="the alert")
    assert shown["labels"]["team"] == HOSTILE["team"]
    assert shown["labels"]["resource_id"].startswith("host-1\r\n<script>") and len(shown["labels"]["resource_id"]) == 256


def test_alertmanager_down_then_up_gets_the_alert_once(store, tmp_path):
    clock = Clock()
    port = free_port()
    outbox = OutputOutbox(store, routing(am_output(f"http://127.0.0.1:{port}")), clock=clock)
    stored(store, alert())
    outbox.add([alert()])
    assert outbox.deliver_pending() == 0 and outbox.hold_s == 1.0  # refused connection: retried
    with alertmanager(tmp_path, port) as am:  # up, where the outbox was pointed all along
        outbox.deliver_pending()
        assert am.alerts() == []  # the backoff is not over
        clock.now += 1
        assert outbox.deliver_pending() == 1
        assert len(wait_until(am.alerts, what="the alert")) == 1
        clock.now += 1
        assert outbox.deliver_pending() == 0
    assert store.outputs.states("a1")[("pager", "fired")] == {"sending", "not_sent", "sent"}


# -- email ----------------------------------------------------------------------------------


def mail_output(port: int) -> dict[str, Any]:
    return {"mail": {"kind": "email", "host": "127.0.0.1", "port": port, "tls": "none", "from": "burnwatch@example.com",
                     "to": ["finops@example.com", "nlp@example.com"]}}  # fmt: skip


def test_email_arrives_with_headers_subject_and_both_bodies(store):
    with smtp_server() as (mailbox, port):
        outbox = OutputOutbox(store, routing(mail_output(port)))
        stored(store, alert())
        outbox.add([alert()])
        assert outbox.deliver_pending() == 1
        stored(store, alert("resolved"))
        outbox.add([alert("resolved")])
        assert outbox.deliver_pending() == 1
    (to, opened), (_, resolved) = mailbox.messages
    assert to == ["finops@example.com", "nlp@example.com"]
    assert opened["From"] == "burnwatch@example.com" and opened["To"] == "finops@example.com, nlp@example.com"
    assert opened["Subject"].startswith("[burnwatch] WARNING") and "host-1" in opened["Subject"]
    assert opened["Message-ID"] == "<a1.fired.mail@burnwatch>"
    assert resolved["In-Reply-To"] == "<a1.fired.mail@burnwatch>" and "RESOLVED" in resolved["Subject"]
    plain = opened.get_body(("plain",)).get_content()
    html = opened.get_body(("html",)).get_content()
    assert "Dollars wasted: $49.16" in plain and "Burn rate: $32.77/h" in plain and "Next step:" in plain
    assert "https://console.example.com/us-east-1/host-1" in plain and "<td>alice</td>" in html


def test_a_correction_is_mailed_in_the_opening_s_thread(store):
    """The email of a correction replies to the opening's, says CORRECTED in its subject and what the
    resolution it replaces said."""
    with smtp_server() as (mailbox, port):
        outbox = OutputOutbox(store, routing(mail_output(port)))
        for change in (alert(), alert("resolved"), _corrected(alert("resolved"))):
            stored(store, change)
            outbox.add([change])
        assert outbox.deliver_pending() == 3
    assert len(mailbox.messages) == 3
    _, mail = mailbox.messages[2]
    assert mail["Subject"].startswith("[burnwatch] CORRECTED Idle GPUs on host-1")
    assert mail["In-Reply-To"] == "<a1.fired.mail@burnwatch>" and mail["Message-ID"] == "<a1.corrected.mail@burnwatch>"
    assert "Corrected from: $49.16 at 2026-11-02T01:30:00Z" in mail.get_body(("plain",)).get_content()


def test_email_escapes_everything_an_event_carries(store):
    evil = alert(tags=HOSTILE, resource_id="host-1\r\nBcc: victim@example.com\r\nSubject: pwned <b>x</b>")
    with smtp_server() as (mailbox, port):
        outbox = OutputOutbox(store, routing(mail_output(port)))
        stored(store, evil)
        outbox.add([evil])
        assert outbox.deliver_pending() == 1
    ((to, message),) = mailbox.messages
    assert to == ["finops@example.com", "nlp@example.com"]  # no recipient added
    assert message["Bcc"] is None and len(message.get_all("Subject")) == 1
    assert "\r" not in message["Subject"] and "\n" not in message["Subject"] and len(message["Subject"]) <= 200
    html = message.get_body(("html",)).get_content()
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;&amp;amp;" in html
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
    assert len(html) < 40_000
    plain = message.get_body(("plain",)).get_content()
    assert "\nX-Injected" not in plain  # a value keeps to its own line


def test_email_retries_a_temporary_refusal_and_sends_once(store):
    clock = Clock()
    with smtp_server() as (mailbox, port):
        outbox = OutputOutbox(store, routing(mail_output(port)), clock=clock)
        stored(store, alert())
        outbox.add([alert()])
        mailbox.failures = ["451 4.3.0 try again later"]
        assert outbox.deliver_pending() == 0
        clock.now += 1
        assert outbox.deliver_pending() == 1
        assert OutputOutbox(store, routing(mail_output(port))).recover() == 0
    assert len(mailbox.messages) == 1


@pytest.mark.parametrize("case", ["no-starttls", "no-smtputf8"])
def test_what_the_mail_server_does_not_offer_is_a_refusal_not_retried_for_good(store, case):
    """A server without STARTTLS (asked for), or without SMTPUTF8 (needed by a non-ASCII
    address): it will never take the mail, so the change is refused and reported once,
    not retried for ever (nor taken for a maybe-sent)."""
    clock = Clock()
    spec = mail_output(0)
    with smtp_server(enable_SMTPUTF8=False) as (mailbox, port):
        spec["mail"]["port"] = port
        if case == "no-starttls":
            spec["mail"]["tls"] = "starttls"
        else:
            spec["mail"].update(smtputf8=True, to=["müller@example.com"])
        outbox = OutputOutbox(store, routing(spec), clock=clock)
        stored(store, alert())
        outbox.add([alert()])
        with capture_logs() as logs:
            outbox.deliver_pending()
            clock.now += 3600
            outbox.deliver_pending()
    assert mailbox.messages == []
    assert store.outputs.states("a1")[("mail", "fired")] == {"sending", "refused"}
    assert len(outbox) == 0 and outbox.hold_s == 0.0 and outbox.failed == 0
    (refused,) = [e for e in logs if e["event"] == "output_delivery_refused"]
    assert "does not offer" in refused["reason"] or "cannot take" in refused["reason"]


def test_a_non_ascii_address_reaches_a_server_that_speaks_smtputf8(store):
    spec = mail_output(0)
    with smtp_server(enable_SMTPUTF8=True) as (mailbox, port):
        spec["mail"].update(port=port, smtputf8=True, to=["müller@example.com"])
        outbox = OutputOutbox(store, routing(spec))
        stored(store, alert())
        outbox.add([alert()])
        assert outbox.deliver_pending() == 1
    ((to, message),) = mailbox.messages
    assert to == ["müller@example.com"] and message["To"] == "müller@example.com"


def test_a_non_ascii_mail_address_is_refused_at_load_unless_smtputf8(tmp_path):
    from detector.rules import RulesInvalid, load_rules

    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: idle-gpu\n    type: idle_gpu\n")
    text = ("outputs:\n  m:\n    kind: email\n    host: smtp.example.com\n    from: a@example.com\n"
            "    to: [b@example.com, müller@example.com]\n")  # fmt: skip
    (tmp_path / "routing.yaml").write_text(text)
    with pytest.raises(RulesInvalid) as caught:
        load_rules(rules)
    error = caught.value.errors[-1]
    assert error.path == "outputs.m.to" and "'müller@example.com' is not ASCII" in error.message
    assert "smtputf8" in error.message
    (tmp_path / "routing.yaml").write_text(text.replace("    from:", "    smtputf8: true\n    from:"))
    load_rules(rules)  # taken: the server is said to speak SMTPUTF8
    (tmp_path / "routing.yaml").write_text(text.replace("a@example.com", "ä@example.com").replace("müller", "m"))
    with pytest.raises(RulesInvalid) as caught:
        load_rules(rules)
    assert caught.value.errors[-1].path == "outputs.m.from" and "not ASCII" in caught.value.errors[-1].message


# -- the worker's path ----------------------------------------------------------------------


def test_an_idle_host_reaches_the_webhook_through_the_pipeline(store, ruleset, secret_env):
    """Events through the worker's pipeline (decode, detect, store) hand the opening to the
    outputs' outbox after it is stored; its pass posts it."""
    import asyncio

    from detector.alerts import AlertManager
    from detector.delivery import Outbox
    from detector.engine import Engine
    from streams.config import Config, LiveConfig
    from streams.pipeline import Pipeline
    from tests.test_pipeline import gpu_message, usage_message

    with LocalReceiver() as receiver:
        chosen = dataclasses.replace(ruleset, routing=routing(hook(receiver.url)))
        outputs = OutputOutbox(store, Routing())
        pipeline = Pipeline(engine=Engine(chosen), store=store, outbox=Outbox(store, None), manager=AlertManager(),
                            send_dead_letter=lambda key, value: asyncio.sleep(0), config=LiveConfig(Config.of(chosen)),
                            outputs=outputs)  # fmt: skip

        async def ack(messages: Any) -> None:
            pass

        async def run() -> None:
            batch = [usage_message(i, T0 + i * 600) for i in range(18)]
            batch += [gpu_message(i, T0 + i * 60, 1.0) for i in range(180)]
            await pipeline.process(batch, ack)
            await pipeline.drain()

        asyncio.run(run())
        assert pipeline.outputs_ready.is_set()
        assert outputs.deliver_pending() == 1
    (received,) = receiver.delivered
    (row,) = store.alerts.latest()
    assert received.json["id"] == row["alert_id"] and received.json["type"] == "idle_gpu"


# -- a kill at any write --------------------------------------------------------------------


class Killed(BaseException):
    """The worker died here (kill -9): nothing after this point ran, no handler saw it."""


class DiesBeforeWrite:
    """The store's real ClickHouse client, except that the process dies before its ``n``-th
    write (None: it never dies; it counts)."""

    def __init__(self, client: Any, n: int | None) -> None:
        self._client, self._n, self.writes = client, n, 0

    def insert(self, *args: Any, **kwargs: Any) -> Any:
        if self._n is not None and self.writes >= self._n:
            raise Killed(f"killed before write {self.writes}")
        self.writes += 1
        return self._client.insert(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


STEPS = [[alert(alert_id="k1"), alert(alert_id="k2")], [alert("resolved", "k1")], [alert("resolved", "k2")]]
CHANGES = {(a.alert_id, a.change) for step in STEPS for a in step}


def run_worker(store, url: str, dedupes: bool, done: list[int]) -> None:
    """What the worker does with the steps not yet acknowledged: write, acknowledge, hand over,
    deliver; a restart recovers first."""
    outbox = OutputOutbox(store, routing(hook(url, dedupes=dedupes)))
    outbox.recover()
    outbox.deliver_pending()
    for i, step in enumerate(STEPS):
        if i < len(done):
            continue
        stored(store, *step)
        done.append(i)
        outbox.add(step)
        outbox.deliver_pending()
    assert len(outbox) == 0


@pytest.mark.parametrize("dedupes", [False, True])
def test_a_kill_before_any_write_sends_nothing_twice(chdb_client, secret_env, dedupes):
    """For every write of a clean run, a worker killed just before it and restarted leaves the
    receiver with each change once. A kill between the send and its record leaves it begun:
    a receiver that dedupes is sent it again (and keeps one); to one that does not, it is not
    sent again but recorded unknown (here it had arrived)."""
    from detector.store import Store

    name = "t_out_kill"
    chdb_client.command(f"DROP DATABASE IF EXISTS {name}")
    Store(chdb_client, database=name).migrate()

    def fresh() -> Store:
        """The database as new for the outbox, which reads only these two tables (a new database per
        kill point, migrated each time, was a third of the test's time)."""
        for table in ("alerts", "output_deliveries"):
            chdb_client.command(f"TRUNCATE TABLE {name}.{table}")
        return Store(chdb_client, database=name)

    with LocalReceiver(dedupes=dedupes) as receiver:
        counted = DiesBeforeWrite(chdb_client, None)
        run_worker(Store(counted, fresh().db), receiver.url, dedupes, [])
        assert counted.writes >= 1 + 3 + 2 * len(CHANGES)  # enabled, 3 steps, each change begun and sent
        for n in range(counted.writes):
            receiver.requests.clear()
            receiver.delivered.clear()
            store, done = fresh(), []
            assert all(store.count(t) == 0 for t in ("alerts", "output_deliveries")), n  # nothing left of the last run
            with pytest.raises(Killed):
                run_worker(Store(DiesBeforeWrite(chdb_client, n), store.db), receiver.url, dedupes, done)
            run_worker(store, receiver.url, dedupes, done)  # the restarted worker
            got = [(r.json["id"], r.json["change"]) for r in receiver.delivered]
            assert len(got) == len(set(got)), f"killed at {n}: sent twice"
            unknown = {(a, c) for a, c in CHANGES if "unknown" in store.outputs.states(a).get(("hook", c), set())}
            assert set(got) == CHANGES, f"killed at {n}: lost"  # a kill here always comes after the send
            assert len(unknown) <= 1, n  # the one send cut off, recorded as maybe sent
            if dedupes:
                assert unknown == set(), n


# -- found in review ------------------------------------------------------------------------


def test_an_answer_that_is_not_http_is_taken_as_maybe_sent_not_sent_twice(store, secret_env):
    """The receiver took the request and answered garbage (http.client's BadStatusLine, not an
    OSError): to a receiver that does not dedupe it is recorded unknown, never sent again."""
    clock = Clock()
    with LocalReceiver() as receiver:
        receiver.garble_next(1)
        outbox = OutputOutbox(store, routing(hook(receiver.url)), clock=clock)
        stored(store, alert())
        outbox.add([alert()])
        for _ in range(3):
            outbox.deliver_pending()
            clock.now += 60
    assert len(receiver.requests) == 1
    assert store.outputs.states("a1")[("hook", "fired")] == {"sending", "unknown"}


def pager_posts(receiver: LocalReceiver) -> list[dict[str, Any]]:
    """Every alert Alertmanager was sent (``postableAlert``), in order."""
    return [a for r in receiver.requests for a in r.json]


def test_an_opening_is_posted_to_alertmanager_once_then_re_sent_each_resend_s(store):
    """The opening is one post; the first re-send comes ``resend_s`` later, not in the same pass."""
    clock = Clock()
    with LocalReceiver() as receiver:
        outbox = OutputOutbox(store, routing(am_output(receiver.url, resend_s=60)), clock=clock)
        stored(store, alert())
        outbox.add([alert()])
        assert outbox.deliver_pending() == 1
        assert len(pager_posts(receiver)) == 1 and outbox.hold_s == pytest.approx(60, abs=1)
        clock.now += 59
        outbox.deliver_pending()
        assert len(pager_posts(receiver)) == 1
        clock.now += 1
        outbox.deliver_pending()
    assert len(pager_posts(receiver)) == 2


def test_a_refused_resolution_is_not_resent_as_firing(store):
    """Alertmanager refused the resolution (400): the alert is no longer re-sent as firing
    (which would keep it open there for good)."""
    clock = Clock()
    with LocalReceiver() as receiver:
        outbox = OutputOutbox(store, routing(am_output(receiver.url, resend_s=60)), clock=clock)
        stored(store, alert())
        outbox.add([alert()])
        outbox.deliver_pending()
        receiver.fail_next(1, 400)
        stored(store, alert("resolved"))
        outbox.add([alert("resolved")])
        outbox.deliver_pending()
        assert store.outputs.states("a1")[("pager", "resolved")] == {"sending", "refused"}
        posted = len(pager_posts(receiver))
        clock.now += 120
        outbox.deliver_pending()
    assert len(pager_posts(receiver)) == posted  # no re-send of it as firing since


def test_a_correction_ends_the_alert_in_alertmanager_again_with_its_figures_and_is_not_resent(store):
    """A correction is posted once, ended (``endsAt`` now) with the corrected dollars, and the alert is no
    longer re-sent as firing after it."""
    clock = Clock()
    with LocalReceiver() as receiver:
        outbox = OutputOutbox(store, routing(am_output(receiver.url, resend_s=60)), clock=clock)
        for change in (alert(), alert("resolved"), _corrected(alert("resolved"))):
            stored(store, change)
            outbox.add([change])
            outbox.deliver_pending()
        clock.now += 120
        outbox.deliver_pending()
    posts = pager_posts(receiver)
    assert len(posts) == 3 and [p["annotations"]["dollars"] for p in posts] == ["49.16", "49.16", "32.77"]
    assert parse_rfc3339(posts[2]["endsAt"], "endsAt") <= time.time() < parse_rfc3339(posts[0]["endsAt"], "endsAt")
    assert posts[2]["annotations"]["summary"].startswith("CORRECTED")
    assert store.outputs.states("a1")[("pager", "corrected")] == {"sending", "sent"}


def test_alertmanager_labels_stay_those_first_sent_while_firing(store):
    """Alertmanager tells alerts apart by labels: a severity changed by a rules reload, or a
    team re-tagged, mid-episode must not open a second alert there; the resolution ends the
    one that is open, even when the new team is not routed to Alertmanager at all."""
    clock = Clock()
    with LocalReceiver() as receiver:
        send = {"default": ["slack"], "by_team": {"nlp": ["pager"]}}
        outbox = OutputOutbox(store, routing(am_output(receiver.url, resend_s=60), send), clock=clock)
        stored(store, alert())
        outbox.add([alert()])
        outbox.deliver_pending()
        moved = {"team": "vision", "owner": "alice"}
        outbox.add([msgspec.structs.replace(alert(severity="critical", tags=moved), change="updated", waste_usd=81.93)])
        clock.now += 60
        outbox.deliver_pending()  # the re-send, with the newer dollars
        stored(store, alert("resolved", severity="critical", tags=moved))
        outbox.add([alert("resolved", severity="critical", tags=moved)])
        outbox.deliver_pending()
    posts = pager_posts(receiver)
    assert posts[-2]["annotations"]["dollars"] == "81.93"  # the update reached the re-send
    assert all(p["labels"] == posts[0]["labels"] for p in posts), [p["labels"] for p in posts]
    assert posts[-1]["endsAt"] <= rfc3339(time.time() + 1)  # the resolution


def test_a_mail_taken_then_a_bad_answer_to_quit_is_sent_once_and_recorded_sent(store):
    """The server took the message (250), then answered QUIT with something else than 221:
    the mail is delivered (recorded ``sent``), not taken for a failure and not sent again."""
    clock = Clock()
    with smtp_server() as (mailbox, port):
        mailbox.quit_reply = "500 5.5.1 confused"
        outbox = OutputOutbox(store, routing(mail_output(port)), clock=clock)
        stored(store, alert())
        outbox.add([alert()])
        assert outbox.deliver_pending() == 1
        clock.now += 60
        outbox.deliver_pending()
    assert len(mailbox.messages) == 1
    assert store.outputs.states("a1")[("mail", "fired")] == {"sending", "sent"}


def test_a_token_with_a_line_break_is_trimmed_or_refused_never_shown(store, monkeypatch):
    """A secret mounted from a file ends with a newline: it is trimmed. One with a line break
    inside is refused naming the variable; http.client's own error would print it (as a
    repr, which the log's redaction of the value as set does not match)."""
    clock = Clock()
    with LocalReceiver() as receiver:
        monkeypatch.setenv("BW_AM_TOKEN", "tok-Zq81xw\r\nX-Evil: 1")
        outbox = OutputOutbox(store, routing(am_output(receiver.url, bearer_token_env="BW_AM_TOKEN")), clock=clock)
        stored(store, alert())
        outbox.add([alert()])
        with capture_logs() as logs:
            assert outbox.deliver_pending() == 0
        assert "BW_AM_TOKEN" in logs[-1]["error"] and "Zq81xw" not in json.dumps(logs) and receiver.requests == []
        assert not any("Zq81xw" in r["detail"] for r in store.query(f"SELECT detail FROM {store.db}.output_deliveries"))
        monkeypatch.setenv("BW_AM_TOKEN", "tok-Zq81xw\n")
        clock.now += 60
        assert outbox.deliver_pending() == 1
    assert receiver.requests[0].headers["authorization"] == "Bearer tok-Zq81xw"


def test_a_silenced_resolution_still_ends_what_alertmanager_has_open(store):
    """A silence added after the opening was sent holds the resolution back from every
    output, but the one keeping the alert open must hear it, or re-send it as firing for good."""
    clock = Clock()
    with LocalReceiver() as receiver:
        outbox = OutputOutbox(store, routing(am_output(receiver.url, resend_s=60)), clock=clock)
        stored(store, alert())
        outbox.add([alert()])
        outbox.deliver_pending()
        held = msgspec.structs.replace(alert("resolved"), silenced="silence: maintenance")
        stored(store, held)
        outbox.add([held])
        outbox.deliver_pending()
        posted = len(pager_posts(receiver))
        clock.now += 120
        outbox.deliver_pending()
    posts = pager_posts(receiver)
    assert len(posts) == posted and posts[-1]["endsAt"] <= rfc3339(time.time() + 1)  # resolved, not re-sent


def test_a_kill_after_a_failed_try_still_sends_to_a_receiver_that_does_not_dedupe(store, secret_env):
    """The receiver answered 503 (it has nothing), then the worker was killed before the
    retry: the restarted worker sends the change, not records it 'unknown' and never sends it."""
    with LocalReceiver() as receiver:
        receiver.fail_next(1, status=503)
        outbox = OutputOutbox(store, routing(hook(receiver.url)), clock=Clock())
        stored(store, alert())
        outbox.add([alert()])
        assert outbox.deliver_pending() == 0
        restarted = OutputOutbox(store, routing(hook(receiver.url)), clock=Clock())  # the kill: a new worker
        assert restarted.recover() == 1 and restarted.deliver_pending() == 1
    assert len(receiver.delivered) == 1
    assert store.outputs.states("a1")[("hook", "fired")] == {"sending", "not_sent", "sent"}


def test_a_redirect_is_not_followed_with_the_token_nor_taken_for_a_delivery(store, monkeypatch):
    """urllib follows a 302 to a POST with a GET to anywhere, carrying Authorization along,
    and the GET's 200 would be recorded 'sent' though nothing was delivered."""
    monkeypatch.setenv("BW_AM_TOKEN", "tok-Rr93kd")
    with LocalReceiver() as receiver, LocalReceiver() as elsewhere:
        receiver.redirect_next(elsewhere.url)
        outbox = OutputOutbox(store, routing(am_output(receiver.url, bearer_token_env="BW_AM_TOKEN")), clock=Clock())
        stored(store, alert())
        outbox.add([alert()])
        outbox.deliver_pending()
    assert elsewhere.gets == [] and elsewhere.requests == []
    assert "sent" not in store.outputs.states("a1")[("pager", "fired")]


def test_an_output_url_urllib_cannot_send_is_refused_at_load_never_quoted(tmp_path):
    """Each of these passed the old pattern and then failed every send, for good: a user and
    password (urllib takes ``user:pw@host`` for the host name: 'Name or service not known',
    retried forever, with a secret in the file), a control character or non-ASCII letter
    (http.client refuses them: the error, logged, quoted the URL and its token; the send was
    taken as maybe sent, so a webhook's alerts were recorded ``unknown``), no host, a bad
    port, and a stray '%' (Alertmanager answers 422 to a generatorURL with one)."""
    from detector.rules import RulesInvalid, load_rules

    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: idle-gpu\n    type: idle_gpu\n")
    cases = {
        "https://user:tok-Zq81@hooks.example.com/x": "a user or password in the URL",
        "https://hooks.example.com/a\\x01b?token=tok-Zq81": "only printable ASCII",
        "https://hooks.example.com/bürn?token=tok-Zq81": "only printable ASCII",
        "https:///x?token=tok-Zq81": "no host",
        "https://hooks.example.com:99999/x?token=tok-Zq81": "port is not a number",
        "https://hooks.example.com/x?token=tok-Zq81&fill=50%": "a '%' that does not start an escape",
    }
    for url, message in cases.items():
        for key, extra in [("url", ""), ("generator_url", "    url: http://am:9093\n")]:
            kind = "webhook\n    secret_env: S" if key == "url" else "alertmanager"
            (tmp_path / "routing.yaml").write_text(f"outputs:\n  out:\n    kind: {kind}\n{extra}    {key}: \"{url}\"\n")
            with pytest.raises(RulesInvalid) as caught:
                load_rules(rules)
            error = caught.value.errors[-1]
            assert (error.path, message in error.message) == (f"outputs.out.{key}", True), (url, error)
            assert "tok-Zq81" not in str(caught.value), url
    (tmp_path / "routing.yaml").write_text("outputs:\n  out:\n    kind: alertmanager\n    url: http://[::1]:9093\n"
                                           "    generator_url: https://g.example.com/d?var-host={resource_id}&x=%20\n")
    assert load_rules(rules).routing.outputs["out"].url == "http://[::1]:9093"  # type: ignore[union-attr]


def test_a_2xx_whose_body_is_cut_off_is_a_delivery_not_a_send_in_doubt(store, secret_env):
    """The status said it was taken: a body that stalls (or is cut off) after it was read as
    'no answer', maybe sent, and a webhook that does not dedupe recorded its delivered alert
    'unknown'."""
    with LocalReceiver() as receiver:
        receiver.cut_next(1)
        outbox = OutputOutbox(store, routing(hook(receiver.url, timeout_s=0.5)), clock=Clock())
        stored(store, alert())
        outbox.add([alert()])
        assert outbox.deliver_pending() == 1
    assert len(receiver.delivered) == 1
    assert store.outputs.states("a1")[("hook", "fired")] == {"sending", "sent"}


def test_half_a_mail_login_or_one_in_clear_is_refused_at_load(tmp_path):
    """``username_env`` alone (or ``password_env`` alone) was taken silently: no login was
    tried, and a server that wants one answered 530 to every mail, each refused for good."""
    from detector.rules import RulesInvalid, load_rules

    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: idle-gpu\n    type: idle_gpu\n")
    base = "outputs:\n  m:\n    kind: email\n    host: smtp.example.com\n    from: a@example.com\n    to: [b@example.com]\n"
    cases = {
        "    username_env: SMTP_USER\n": "username_env without password_env",
        "    password_env: SMTP_PASSWORD\n": "password_env without username_env",
        "    tls: none\n    username_env: SMTP_USER\n    password_env: SMTP_PASSWORD\n": "password in clear",
    }
    for extra, message in cases.items():
        (tmp_path / "routing.yaml").write_text(base + extra)
        with pytest.raises(RulesInvalid) as caught:
            load_rules(rules)
        error = caught.value.errors[-1]
        assert (error.path, message in error.message) == ("outputs.m", True), (extra, error)
    (tmp_path / "routing.yaml").write_text(base + "    username_env: SMTP_USER\n    password_env: SMTP_PASSWORD\n")
    assert load_rules(rules).routing.outputs["m"].username_env == "SMTP_USER"  # type: ignore[union-attr]


def test_a_wrong_credential_keeps_the_changes_until_it_is_fixed(store, secret_env):
    """A 401 (the webhook's receiver refusing the signature, a proxy before Alertmanager the
    token) or an SMTP 530/535 says the credential is wrong, not the message: each change was
    refused for good, so every alert sent while a secret was being rotated was lost. A secret
    not set already waits; a wrong one now does too."""
    clock = Clock()
    with LocalReceiver() as receiver, smtp_server() as (mailbox, port):
        receiver.fail_next(2, 401)
        mailbox.mail_failures = ["530 5.7.0 Authentication required", "535 5.7.8 Authentication credentials invalid"]
        outbox = OutputOutbox(store, routing({**hook(receiver.url), **mail_output(port)}), clock=clock)
        stored(store, alert())
        outbox.add([alert()])
        for _ in range(2):
            assert outbox.deliver_pending() == 0
            clock.now += 60
        assert outbox.deliver_pending() == 2
    assert len(receiver.delivered) == 1 and len(mailbox.messages) == 1
    assert "refused" not in store.outputs.states("a1")[("hook", "fired")]
    assert "refused" not in store.outputs.states("a1")[("mail", "fired")]


@pytest.mark.parametrize(("retry_after", "wait_s"), [
    ("30", 30.0),                               # asked for 30 s: not tried again sooner
    ("0", 1.0),                                 # the backoff's first step still applies
    ("Wed, 21 Oct 2099 07:28:00 GMT", 60.0),    # a date far ahead: bounded by max_backoff_s
    ("99999999999999999999", 60.0),             # a huge number: bounded the same way
    ("-5", 1.0),                                # negative: ignored
    ("soon, I promise", 1.0),                   # garbage: ignored
])  # fmt: skip
def test_a_receiver_s_retry_after_is_waited_out_within_the_longest_backoff(store, secret_env, retry_after, wait_s):
    """A 429 (or 503) with Retry-After was retried after 1 s, 2 s... whatever it asked,
    hammering a rate-limited receiver; now its ask is kept, bounded by ``max_backoff_s``."""
    clock = Clock()
    with LocalReceiver() as receiver:
        receiver.fail_next(1, 429, retry_after)
        outbox = OutputOutbox(store, routing(hook(receiver.url)), clock=clock)
        stored(store, alert())
        outbox.add([alert()])
        assert outbox.deliver_pending() == 0
        assert outbox.hold_s == pytest.approx(wait_s, abs=0.01)
        clock.now += wait_s - 0.5
        assert outbox.deliver_pending() == 0 and len(receiver.requests) == 1  # not asked again sooner
        clock.now += 0.5
        assert outbox.deliver_pending() == 1
    assert len(receiver.delivered) == 1


def test_an_alert_whose_link_alertmanager_would_refuse_goes_without_it_and_spoils_no_re_send(store, tmp_path):
    """Alertmanager answers 422 to a whole post if one generatorURL fails Go's URL parser: an
    event's region with a space, quoted into a link's host name, lost that alert (refused for
    good) and, in the re-send of every firing alert, all of them (left to expire)."""
    clock = Clock()
    links = [{"name": "Console", "url": "https://{region}.console.example.com/ec2?id={resource_id}"}]
    odd = msgspec.structs.replace(alert(alert_id="a2", resource_id="host-2"), region="us east")
    with alertmanager(tmp_path) as am:
        routed = Routing.model_validate({"outputs": am_output(am.url), "send": {"default": ["pager"]}, "links": links})
        outbox = OutputOutbox(store, routed, clock=clock)
        stored(store, alert(), odd)
        outbox.add([alert(), odd])
        assert outbox.deliver_pending() == 2
        shown = wait_until(lambda: len(am.alerts()) == 2 and am.alerts(), what="both alerts")
        urls = {a["labels"]["burnwatch_alert_id"]: a.get("generatorURL", "") for a in shown}
        assert urls == {"a1": "https://us-east-1.console.example.com/ec2?id=host-1", "a2": ""}
        clock.now += 60
        with capture_logs() as logs:
            outbox.deliver_pending()  # the re-send of both
    assert [e for e in logs if e["event"] == "output_refresh_refused"] == []


def test_a_redirected_output_keeps_its_changes_for_the_url_fixed_by_a_reload(store, secret_env):
    """A redirect says the URL is wrong (http:// where the ingress wants https://), not the
    message: each change was refused for good, so fixing the URL lost every alert until then.
    They now wait, retried, and a reload with the final URL delivers them."""
    clock = Clock()
    with LocalReceiver() as old, LocalReceiver() as final:
        old.redirect_next(final.url)
        old.redirect_next(final.url)
        outbox = OutputOutbox(store, routing(hook(old.url)), clock=clock)
        stored(store, alert())
        outbox.add([alert()])
        with capture_logs() as logs:
            assert outbox.deliver_pending() == 0
        (said,) = [e for e in logs if e["event"] == "output_delivery_retry"]
        assert f"a redirect to {final.url}, not followed: configure the final URL" in said["error"]
        outbox.configure(routing(hook(final.url)))
        clock.now += 1
        assert outbox.deliver_pending() == 1
    assert len(final.delivered) == 1 and final.gets == []
    assert store.outputs.states("a1")[("hook", "fired")] == {"sending", "not_sent", "sent"}


def test_an_error_answer_s_body_reaches_the_log_as_one_printable_line(store, secret_env):
    """A receiver's error page is quoted in the log (300 bytes): a terminal escape in it went
    to a console as is."""
    with LocalReceiver() as receiver:
        receiver.fail_next(1, 400, body=b"\x1b[2J\x1b]0;pwned\x07bad\r\nrequest" + b"x" * 100_000)
        outbox = OutputOutbox(store, routing(hook(receiver.url)), clock=Clock())
        stored(store, alert())
        outbox.add([alert()])
        with capture_logs() as logs:
            outbox.deliver_pending()
    (said,) = [e for e in logs if e["event"] == "output_delivery_refused"]
    assert said["reason"].startswith("webhook hook answered 400: [2J ]0;pwned bad request") and said["reason"].isprintable()


def test_an_email_s_subject_writes_its_dollars_as_its_body_does(store):
    """An untagged 100 GB bucket burning $0.004 an hour: 53ccf1d made the body say "under $0.01/h" (money()), but
    the subject, the one line a mailbox lists, still said "$0.00 so far, $0.00/h", as if it cost nothing (and a
    NaN rate "$nan/h"): the subject is the alert's summary, which wrote its own dollars."""
    cheap = msgspec.structs.replace(alert(), waste_usd=0.003, usd_per_hour=0.004)
    with smtp_server() as (mailbox, port):
        outbox = OutputOutbox(store, routing(mail_output(port)))
        stored(store, cheap)
        outbox.add([cheap])
        assert outbox.deliver_pending() == 1
    ((_, mail),) = mailbox.messages
    assert "Burn rate: under $0.01/h" in mail.get_body(("plain",)).get_content()
    assert "under $0.01 so far, under $0.01/h" in mail["Subject"] and "$0.00" not in mail["Subject"], mail["Subject"]
    assert "$?/h" in msgspec.structs.replace(cheap, usd_per_hour=float("nan")).summary()
