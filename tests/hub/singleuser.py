"""A stand-in for ``jupyterhub-singleuser`` that the hub's spawner launches in the tests:
it answers every request at ``$JUPYTERHUB_SERVICE_URL`` with 200 (the hub only waits for an
answer), so a server can be started and stopped without installing Jupyter Server."""

from __future__ import annotations

import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


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


def main() -> None:
    url = urlsplit(os.environ["JUPYTERHUB_SERVICE_URL"])
    ThreadingHTTPServer((url.hostname or "127.0.0.1", url.port or 80), _Handler).serve_forever()


if __name__ == "__main__":
    main()
