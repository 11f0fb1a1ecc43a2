"""A worker in a child process, watched through its /healthz view.

Shared by ``burnwatch demo``, the benchmarks and the end-to-end tests, which
all need the real worker exactly as an operator runs it, plus a way to wait
for a condition instead of sleeping.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from detector.settings import ENV, url_host
from streams.children import die_with_parent

__all__ = ["KAFKA_SECURITY_ENV", "SESSION_TIMEOUT_S", "StoreServerProcess", "WorkerProcess", "log_events", "stop_group",
           "worker_env"]  # fmt: skip

_KAFKA_SECURITY = ("kafka_security_", "kafka_sasl_", "kafka_ssl_", "kafka_aws_", "kafka_oauth_")
KAFKA_SECURITY_ENV = [var for name, var in ENV.items() if name.startswith(_KAFKA_SECURITY)]
"""The variables of how a worker connects to Kafka (TLS, SASL)."""
SESSION_TIMEOUT_S = 6
"""The group session timeout of a :func:`worker_env` worker: short, so that a rebalance is quick."""


def worker_env(bootstrap: str, data_dir: Path, rules: Path, partitions: int, **extra: str) -> dict[str, str]:
    """Environment for a worker on loopback: its own web port, JSON logs, a short session timeout, and
    PLAINTEXT to the embedded broker whatever TLS or SASL settings this process's environment holds
    (``burnwatch demo`` run where a cluster's are exported; ``extra`` sets them)."""
    from streams.embedded import free_port

    return {
        **dict.fromkeys(KAFKA_SECURITY_ENV, ""),  # an empty variable is unset
        "BURNWATCH_KAFKA_BOOTSTRAP": bootstrap,
        "BURNWATCH_DATA_DIR": str(data_dir),
        "BURNWATCH_RULES": str(rules),
        "BURNWATCH_PARTITIONS": str(partitions),
        "BURNWATCH_WEB_PORT": str(free_port()),
        "BURNWATCH_LOG_FORMAT": "json",
        "BURNWATCH_SESSION_TIMEOUT_S": str(SESSION_TIMEOUT_S),
        "BURNWATCH_EVENT_TTL_DAYS": "0",  # simulated and replayed fleets are dated in the past: keep them
        "BURNWATCH_SLACK_GROUP_WAIT_S": "2",  # a test's or a demo's few alerts: no 30 s a post
        **extra,
    }


def log_events(path: Path, event: str) -> list[dict[str, Any]]:
    """The entries of ``event`` in a JSON log (``BURNWATCH_LOG_FORMAT=json``), in order; a line still being
    written is left out."""
    found = []
    for line in path.read_text(errors="replace").splitlines():
        if f'"event": "{event}"' in line:
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


class WorkerProcess:
    """``burnwatch worker`` in a child process, which dies with the thread that started it
    (:mod:`streams.children`)."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = {**os.environ, **env}
        self.port = int(self.env.get("BURNWATCH_WEB_PORT", "6066"))
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        log = open(self.log_path, "ab")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "streams.cli", "worker"],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=die_with_parent(),
        )  # fmt: skip
        log.close()
        return self

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int:
        """The worker's process id (started)."""
        assert self._proc is not None, "not started"
        return self._proc.pid

    def health(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def wait_until(self, predicate: Callable[[dict[str, Any]], bool], timeout: float, poll_s: float = 0.2) -> dict[str, Any]:
        """Poll /healthz until ``predicate(health)`` holds; raise with the log's tail on timeout or exit."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"worker exited ({self._proc.returncode if self._proc else '?'}):\n{self.tail()}")
            last = self.health()
            if last is not None and predicate(last):
                return last
            time.sleep(poll_s)
        raise TimeoutError(f"worker condition not met in {timeout}s; last health {last}\n{self.tail()}")

    def wait_exit(self, timeout: float) -> int:
        """The exit status of a worker expected to stop by itself (a start it refuses); ``TimeoutError``, with the
        log's tail, if it is still running after ``timeout`` seconds."""
        assert self._proc is not None, "not started"
        try:
            return self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"worker still running after {timeout}s\n{self.tail()}") from None

    def wait_for_log(self, text: str, timeout: float, poll_s: float = 0.2, after: str | None = None) -> str:
        """Wait until a line containing ``text`` appears in the worker's log (if ``after`` is
        given, below the first line containing that); return it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                seen = after is None
                for line in self.log_path.read_text(errors="replace").splitlines():
                    if seen and text in line:
                        return line
                    seen = seen or (after is not None and after in line)
            except OSError:
                pass
            if not self.running:
                break
            time.sleep(poll_s)
        raise TimeoutError(f"{text!r} not in the worker's log within {timeout}s\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def log_events(self, event: str) -> list[dict]:
        """Its JSON log's entries of ``event``, in order."""
        return log_events(self.log_path, event)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (Faust stops cleanly and commits), then SIGKILL if it does not exit in time."""
        return stop_group(self._proc, timeout) if self._proc is not None else None


def stop_group(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """SIGTERM a child's process group, then SIGKILL if it does not exit in time; its status."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


class StoreServerProcess:
    """``burnwatch store serve`` in a child process, ready once ``GET /ping`` answers: the
    store several workers share (tests, benchmarks). It dies with the thread that started it."""

    def __init__(self, dsn: str, log_path: Path, *args: str, host: str = "127.0.0.1") -> None:
        """``args``: more of ``store serve``'s options (``--max-execution-time 2``)."""
        from streams.embedded import free_port

        self.port = free_port()
        self.url = f"http://{url_host(host)}:{self.port}"
        args = ("--host", host, *args)
        self.log_path = log_path
        env = {**os.environ, "BURNWATCH_LOG_FORMAT": "json"}
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "streams.cli", "store", "serve", "--dsn", dsn, "--port", str(self.port), *args],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=die_with_parent(),
            )  # fmt: skip

    def wait_ready(self, timeout: float = 60.0) -> StoreServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"store serve exited ({self.proc.returncode}):\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/ping", timeout=2) as response:
                    if response.read() == b"Ok.\n":
                        return self
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"store serve did not answer /ping within {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_events(self, event: str) -> list[dict]:
        return log_events(self.log_path, event)

    def stop(self, timeout: float = 30.0) -> int:
        return stop_group(self.proc, timeout)
