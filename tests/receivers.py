"""Real local receivers for the outputs' tests: an HTTP server that records what it is sent
(a webhook receiver, optionally one that dedupes by ``Idempotency-Key``), a real Prometheus
Alertmanager (Debian's package) started on 127.0.0.1, and aiosmtpd's SMTP server."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email import message_from_bytes, policy
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from streams.children import die_with_parent

ALERTMANAGER = "/usr/bin/prometheus-alertmanager"


def wait_until(condition: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    """Poll ``condition`` until it is truthy (its value) or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class LocalReceiver:
    """An HTTP server on 127.0.0.1 that records every POST and answers 200, or what it is told
    to (:meth:`fail_next`, :meth:`hang`). ``dedupes``: a second request with an
    ``Idempotency-Key`` already taken is answered 200 and not recorded as delivered."""

    def __init__(self, dedupes: bool = False) -> None:
        self.requests: list[Received] = []
        self.delivered: list[Received] = []
        self.dedupes = dedupes
        self._failures: list[tuple[int, str | None, bytes]] = []
        self._garbled = 0
        self._cut = 0
        self._redirects: list[str] = []
        self.gets: list[Received] = []
        """GET requests (a client following a redirect turns a POST into one)."""
        self._hang_s = 0.0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def __enter__(self) -> LocalReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def fail_next(self, count: int, status: int = 503, retry_after: str | None = None, body: bytes = b"ok") -> None:
        """Answer the next POSTs ``status`` (with ``Retry-After: retry_after`` if given) and ``body``."""
        with self._lock:
            self._failures += [(status, retry_after, body)] * count

    def redirect_next(self, location: str) -> None:
        """Answer the next POST with 302 to ``location``."""
        with self._lock:
            self._redirects.append(location)

    def garble_next(self, count: int) -> None:
        """Take the next requests whole (delivered), then answer with something not HTTP."""
        with self._lock:
            self._garbled += count

    def cut_next(self, count: int) -> None:
        """Take the next requests whole (delivered), answer 200, then stall mid-body for 2 s."""
        with self._lock:
            self._cut += count

    def hang(self, seconds: float) -> None:
        """Take the next requests whole, then answer only after ``seconds`` (a timeout for the sender)."""
        self._hang_s = seconds

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                with receiver._lock:
                    receiver.gets.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, b""))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                with receiver._lock:
                    location = receiver._redirects.pop(0) if receiver._redirects else None
                if location is not None:
                    with receiver._lock:
                        receiver.requests.append(received)
                    self.send_response(302)
                    self.send_header("Location", location)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with receiver._lock:
                    receiver.requests.append(received)
                    garbled = receiver._garbled > 0
                    receiver._garbled -= garbled
                    failure = receiver._failures.pop(0) if receiver._failures and not garbled else (200, None, b"ok")
                    status, retry_after, answer = failure
                    if status == 200:
                        key = received.headers.get("idempotency-key")
                        seen = {r.headers.get("idempotency-key") for r in receiver.delivered}
                        if not (receiver.dedupes and key in seen):
                            receiver.delivered.append(received)
                if receiver._hang_s:
                    time.sleep(receiver._hang_s)
                if garbled:
                    self.wfile.write(b"NOT HTTP AT ALL\r\n\r\n")
                    self.close_connection = True
                    return
                with receiver._lock:
                    cut = receiver._cut > 0 and status == 200
                    receiver._cut -= cut
                if cut:
                    self.send_response(200)
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.write(b"partial")
                    self.wfile.flush()
                    time.sleep(2.0)  # the rest never comes in time
                    self.close_connection = True
                    return
                self.send_response(status)
                if retry_after is not None:
                    self.send_header("Retry-After", retry_after)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        return Handler


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Alertmanager:
    """A real Alertmanager on 127.0.0.1 (clustering off, a config and storage in ``folder``)."""

    def __init__(self, folder: Path, port: int | None = None) -> None:
        if not Path(ALERTMANAGER).exists() or shutil.which(ALERTMANAGER) is None:
            pytest.skip(f"{ALERTMANAGER} is not installed (Debian's prometheus-alertmanager; .ci/run installs it)")
        self.port = port or free_port()
        config = folder / "alertmanager.yml"
        config.write_text("route:\n  receiver: blackhole\n  group_wait: 1h\nreceivers:\n  - name: blackhole\n")
        self.log = folder / "alertmanager.log"
        self._out = self.log.open("wb")
        self.process = subprocess.Popen(
            [ALERTMANAGER, f"--config.file={config}", f"--storage.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
            stdout=self._out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent(),
        )  # fmt: skip
        try:
            wait_until(self._ready, timeout=30, what="Alertmanager to be ready")
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"Alertmanager exited: {self.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def alerts(self) -> list[dict[str, Any]]:
        """``GET /api/v2/alerts``: the alerts it holds that are not resolved."""
        with urllib.request.urlopen(self.url + "/api/v2/alerts", timeout=5) as answer:
            return list(json.loads(answer.read()))

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._out.close()


@contextmanager
def alertmanager(folder: Path, port: int | None = None) -> Iterator[Alertmanager]:
    """A real Alertmanager, on ``port`` if given (one a sender already tried while it was down)."""
    server = Alertmanager(folder, port)
    try:
        yield server
    finally:
        server.stop()


class Mailbox:
    """aiosmtpd's handler: keeps every message taken; answers ``fail_next`` codes first."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], EmailMessage]] = []
        self.failures: list[str] = []
        self.mail_failures: list[str] = []
        """What the next MAIL FROM commands are answered (a server wanting a login: 530)."""
        self.quit_reply: str | None = None
        """What QUIT is answered (None: 221, as it should be)."""

    async def handle_QUIT(self, server: Any, session: Any, envelope: Any) -> Any:  # noqa: N802 - aiosmtpd's name
        from aiosmtpd.smtp import MISSING

        return self.quit_reply if self.quit_reply is not None else MISSING

    async def handle_MAIL(self, server: Any, session: Any, envelope: Any, address: str,  # noqa: N802 - aiosmtpd's
                          options: list[str]) -> str:  # fmt: skip
        if self.mail_failures:
            return self.mail_failures.pop(0)
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's name
        if self.failures:
            return self.failures.pop(0)
        message = message_from_bytes(envelope.content, policy=policy.default)
        self.messages.append((list(envelope.rcpt_tos), message))  # type: ignore[arg-type]
        return "250 OK"


@contextmanager
def smtp_server(**options: Any) -> Iterator[tuple[Mailbox, int]]:
    """aiosmtpd on 127.0.0.1; ``options`` go to its ``SMTP`` (``enable_SMTPUTF8=False``...)."""
    from aiosmtpd.controller import Controller

    mailbox = Mailbox()
    controller = Controller(mailbox, hostname="127.0.0.1", port=free_port(), **options)
    controller.start()
    try:
        yield mailbox, controller.port
    finally:
        controller.stop()
