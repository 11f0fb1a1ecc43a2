"""A local stand-in for Slack's Web API and incoming webhooks, for tests and benchmarks.

It implements what burnwatch calls: ``chat.postMessage``, ``chat.update``, the three
steps of ``files_upload_v2`` (``files.getUploadURLExternal``, the upload itself,
``files.completeUploadExternal``), ``usergroups.users.list``, incoming webhooks and a click's ``response_url``.

Slack cannot be reached from CI, so slack-sdk is pointed here (``base_url`` /
the webhook URL) and the tests assert on what this server received. It can be
told to answer 429 with Retry-After, 500, or to hang, to exercise delivery: for the
next requests (:meth:`LocalSlack.fail_next`, :meth:`LocalSlack.hang`) or during windows
of wall-clock time (:meth:`LocalSlack.fail_window`), as an outage would; and it can hold
``chat.postMessage`` to a rate per channel (:meth:`LocalSlack.limit_rate`), answering 429 with
Retry-After past it, as Slack does (about one message a second per channel).

Like Slack, it refuses a message outside Block Kit's limits (``chat.postMessage`` and
``chat.update`` answer ``invalid_blocks``, a webhook 400), judged by
:func:`detector.blockkit.check`, so a test that posts a message also shows it fits.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

__all__ = ["FaultWindow", "LocalSlack", "SlackRequest"]


@dataclass
class FaultWindow:
    """Requests arriving in ``[start, end)`` (``time.monotonic()``) fail: with ``status`` (429
    gets ``Retry-After``) or, with ``hang_s``, are held that long before being answered."""

    start: float
    end: float
    status: int | None = None
    retry_after: int | None = None
    hang_s: float = 0.0
    hits: int = 0
    """Requests this window failed or held."""


@dataclass
class SlackRequest:
    method: str
    """API method (``chat.postMessage``) or ``webhook``."""
    body: dict[str, Any]
    response: dict[str, Any] = field(default_factory=dict)
    """What the server answered (``ts`` of a posted message, for threading checks)."""
    received_at: float = field(default_factory=time.monotonic)

    @property
    def blocks(self) -> list[dict[str, Any]]:
        blocks = self.body.get("blocks") or []
        return json.loads(blocks) if isinstance(blocks, str) else blocks

    def text_of_blocks(self) -> str:
        """Every text in the blocks, joined: what a person would read."""
        from detector.slack import block_objects

        return "\n".join(obj["text"] for obj in block_objects(self.blocks) if isinstance(obj.get("text"), str))


class LocalSlack:
    """``with LocalSlack() as slack:`` then ``slack.api_url`` / ``slack.webhook_url``."""

    def __init__(self) -> None:
        self.requests: list[SlackRequest] = []
        self.uploads: dict[str, bytes] = {}
        """File id → the bytes uploaded for it (files_upload_v2)."""
        self.usergroups: dict[str, list[str]] = {}
        """User group id → its members' user ids (``usergroups.users.list``)."""
        self._failures: list[tuple[int, dict[str, str], str | None, bytes | None]] = []
        self._hang_s = 0.0
        self._holds: dict[str, threading.Event] = {}
        self.held = 0
        """Requests that arrived at a held method (:meth:`hold`)."""
        self.windows: list[FaultWindow] = []
        self._rate: tuple[float, float] | None = None
        self._buckets: dict[str, tuple[float, float]] = {}
        """Channel → (tokens, monotonic time they were counted) of :meth:`limit_rate`."""
        self.throttled = 0
        """``chat.postMessage`` requests answered 429 by :meth:`limit_rate` (not in :attr:`requests`)."""
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._ts = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    @property
    def webhook_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/services/T000/B000/XXXX"

    @property
    def response_url(self) -> str:
        """What Slack puts in a click's ``response_url`` (``https://hooks.slack.com/actions/...``)."""
        return f"http://127.0.0.1:{self.port}/actions/T000/1000000000001/XXXX"

    def __enter__(self) -> LocalSlack:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- behaviour -----------------------------------------------------------------

    def fail_next(self, count: int, status: int = 500, retry_after: int | str | None = None, method: str | None = None,
                  body: bytes | None = None) -> None:  # fmt: skip
        """Answer the next ``count`` requests (of ``method`` only, if given) with ``status``
        (429 gets Retry-After), and ``body`` if given (``{"ok": false, "error": "invalid_auth"}``
        with 200 is how the Web API refuses a revoked token)."""
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
        with self._lock:
            self._failures.extend([(status, headers, method, body)] * count)

    def hang(self, seconds: float) -> None:
        """Hold every request this long before answering (0 to stop)."""
        self._hang_s = seconds

    def hold(self, method: str) -> threading.Event:
        """Hold every request to ``method`` until the returned event is set (a slow answer that the
        test ends when it wants: no fixed sleep); :attr:`held` counts those that arrived."""
        gate = threading.Event()
        self._holds[method] = gate
        return gate

    def wait_held(self, count: int = 1, timeout: float = 30.0) -> bool:
        """Block until ``count`` requests wait at a held method, or the timeout passes."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.held < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def fail_window(self, start_in: float, duration: float, *, status: int | None = None,
                    retry_after: int | None = None, hang_s: float = 0.0) -> FaultWindow:  # fmt: skip
        """From ``start_in`` seconds from now, for ``duration`` seconds, answer ``status`` (429
        with Retry-After) or hold each request ``hang_s`` seconds (then answer normally)."""
        if (status is None) == (not hang_s):
            raise ValueError("a fault window either fails with a status or hangs")
        now = time.monotonic()
        window = FaultWindow(now + start_in, now + start_in + duration, status, retry_after, hang_s)
        with self._lock:
            self.windows.append(window)
        return window

    def limit_rate(self, per_s: float = 1.0, burst: float = 1.0) -> None:
        """Take at most ``per_s`` ``chat.postMessage`` a second per channel (a burst of ``burst``), as Slack does:
        one past it is answered 429 with the whole seconds until the next is taken as Retry-After."""
        with self._lock:
            self._rate = (per_s, burst)
            self._buckets.clear()

    def _throttle(self, channel: str) -> int:
        """0 when a post to ``channel`` is within :meth:`limit_rate`'s rate (and counts), else the Retry-After."""
        with self._lock:
            if self._rate is None:
                return 0
            per_s, burst = self._rate
            now = time.monotonic()
            tokens, at = self._buckets.get(channel, (burst, now))
            tokens = min(burst, tokens + (now - at) * per_s)
            if tokens >= 1.0:
                self._buckets[channel] = (tokens - 1.0, now)
                return 0
            self._buckets[channel] = (tokens, now)
            self.throttled += 1
            return max(1, math.ceil((1.0 - tokens) / per_s))

    def _window_at(self, t: float) -> FaultWindow | None:
        with self._lock:
            window = next((w for w in self.windows if w.start <= t < w.end), None)
            if window is not None:
                window.hits += 1
            return window

    # -- what was received --------------------------------------------------------

    def calls(self, method: str | None = None) -> list[SlackRequest]:
        with self._lock:
            return [r for r in self.requests if method is None or r.method == method]

    def wait_for(self, predicate: Callable[[list[SlackRequest]], bool], timeout: float = 30.0) -> bool:
        """Block until ``predicate(requests)`` is true or the timeout passes."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(list(self.requests)):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    # -- the server ------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        slack = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.startswith("/upload/"):  # step 2 of files_upload_v2: the bytes themselves
                    file_id = self.path.removeprefix("/upload/")
                    with slack._cond:
                        slack.uploads[file_id] = raw
                        slack.requests.append(SlackRequest("upload", {"file_id": file_id, "bytes": len(raw)}))
                        slack._cond.notify_all()
                    reply = f"OK - {len(raw)}".encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)
                    return
                window = slack._window_at(time.monotonic())
                if slack._hang_s or (window is not None and window.hang_s):
                    time.sleep(max(slack._hang_s, window.hang_s if window is not None else 0.0))
                called = self.path.removeprefix("/api/")
                gate = slack._holds.get(called)
                if gate is not None:
                    with slack._cond:
                        slack.held += 1
                        slack._cond.notify_all()
                    gate.wait(60)
                with slack._lock:
                    index = next((i for i, f in enumerate(slack._failures) if f[2] in (None, called)), None)
                    failure = slack._failures.pop(index) if index is not None else None
                if failure is None and window is not None and window.status is not None:
                    headers = {"Retry-After": str(window.retry_after)} if window.retry_after is not None else {}
                    failure = (window.status, headers, None, None)
                if failure is not None:
                    status, headers, _, given = failure
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    refusal = given if given is not None else (
                        b'{"ok": false, "error": "ratelimited"}' if status == 429 else b"server error")  # fmt: skip
                    if given is not None and given.startswith(b"{"):
                        self.send_header("Content-Type", "application/json; charset=utf-8")
                    self.send_header("Content-Length", str(len(refusal)))
                    self.end_headers()
                    self.wfile.write(refusal)
                    return
                body: dict[str, Any]
                if self.headers.get("Content-Type", "").startswith("application/json"):
                    body = json.loads(raw or b"{}")
                else:
                    body = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
                status = 200
                wait = slack._throttle(str(body.get("channel", ""))) if called == "chat.postMessage" else 0
                if wait:
                    refusal = b'{"ok": false, "error": "ratelimited"}'
                    self.send_response(429)
                    self.send_header("Retry-After", str(wait))
                    self.send_header("Content-Type", "application/json; charset=utf-8")
                    self.send_header("Content-Length", str(len(refusal)))
                    self.end_headers()
                    self.wfile.write(refusal)
                    return
                if self.path.startswith("/services/"):
                    method, reply = "webhook", b"ok"
                    if slack._refusal(body):
                        status, reply = 400, b"invalid_blocks"
                elif self.path.startswith("/actions/"):  # a click's response_url (an ephemeral answer)
                    method, reply = "response_url", b'{"ok": true}'
                else:
                    method = self.path.removeprefix("/api/")
                    reply = slack._reply(method, body)
                with slack._cond:
                    answer = json.loads(reply) if method != "webhook" else {}
                    slack.requests.append(SlackRequest(method, body, answer))
                    slack._cond.notify_all()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "text/plain" if method == "webhook" else "application/json")
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (a hang): the request still counts, as on Slack

        return Handler

    @staticmethod
    def _refusal(body: dict[str, Any]) -> list[str]:
        """What Slack would refuse in a message's blocks and text (:func:`detector.blockkit.check`)."""
        from detector.blockkit import check

        blocks = body.get("blocks")
        if blocks is None:
            return []
        return check(json.loads(blocks) if isinstance(blocks, str) else blocks, body.get("text") or None)

    def _reply(self, method: str, body: dict[str, Any]) -> bytes:
        with self._lock:
            self._ts += 1
            ts = f"1700000000.{self._ts:06d}"
        channel = body.get("channel", "C0CHANNEL")
        if method in ("chat.postMessage", "chat.update") and (problems := self._refusal(body)):
            return json.dumps({"ok": False, "error": "invalid_blocks", "errors": problems}).encode()
        if method in ("chat.postMessage", "chat.update"):
            message_ts = body.get("ts", ts) if method == "chat.update" else ts
            return json.dumps({"ok": True, "channel": channel, "ts": message_ts}).encode()
        if method == "files.getUploadURLExternal":
            file_id = f"F{ts.replace('.', '')[-8:]}"
            return json.dumps({"ok": True, "file_id": file_id,
                               "upload_url": f"http://127.0.0.1:{self.port}/upload/{file_id}"}).encode()  # fmt: skip
        if method == "files.completeUploadExternal":
            files = json.loads(body.get("files", "[]"))
            return json.dumps({"ok": True, "files": [{"id": f["id"], "title": f.get("title", "")} for f in files]}).encode()
        if method == "conversations.history":  # what was posted to a channel, newest first
            with self._lock:
                posted = [
                    {"ts": r.response["ts"], "text": r.body.get("text", ""), "blocks": r.blocks}
                    for r in self.requests
                    if r.method == "chat.postMessage" and r.body.get("channel") == channel and "thread_ts" not in r.body
                ]
            return json.dumps({"ok": True, "messages": posted[::-1][: int(body.get("limit", 100))]}).encode()
        if method == "conversations.replies":  # a thread: its parent, then its replies
            with self._lock:
                thread = [
                    {"ts": r.response["ts"], "text": r.body.get("text", ""), "blocks": r.blocks}
                    for r in self.requests
                    if r.method == "chat.postMessage" and r.body.get("channel") == channel
                    and body.get("ts") in (r.body.get("thread_ts"), r.response.get("ts"))
                ]  # fmt: skip
            return json.dumps({"ok": True, "messages": thread[: int(body.get("limit", 100))]}).encode()
        if method == "usergroups.users.list":  # the members of a user group (self.usergroups)
            group = body.get("usergroup", "")
            if group not in self.usergroups:
                return json.dumps({"ok": False, "error": "no_such_subteam"}).encode()
            return json.dumps({"ok": True, "users": self.usergroups[group]}).encode()
        if method == "auth.test":
            return json.dumps({"ok": True, "user_id": "U0BOT", "team_id": "T000"}).encode()
        return json.dumps({"ok": False, "error": "unknown_method"}).encode()
