"""A stand-in for ``jupyterhub-singleuser`` that the hub's spawner launches in the tests:
it answers every request at ``$JUPYTERHUB_SERVICE_URL`` with 200 (the hub only waits for an
answer), so a server can be started and stopped without installing Jupyter Server.

The server of a user whose name starts with ``slow-`` takes 3 s to exit after the hub's
SIGINT, as a server saving its state does: the hub answers the stop with 202 (stopping)."""

from __future__ import annotations

import os
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from streams.children import ask_parent_death_signal


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b'{"version": "stand-in"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
        pass


def _exit_soon(signum: int, frame: object) -> None:
    threading.Timer(3.0, os._exit, args=(0,)).start()


def main() -> None:
    ask_parent_death_signal()  # the hub killed -9 (its own parent gone: tests/test_remediation_jupyterhub.py) takes it along
    if os.environ.get("USER", "").startswith("slow-"):
        signal.signal(signal.SIGINT, _exit_soon)
    url = urlsplit(os.environ["JUPYTERHUB_SERVICE_URL"])
    ThreadingHTTPServer((url.hostname or "127.0.0.1", url.port or 80), _Handler).serve_forever()


if __name__ == "__main__":
    main()
