"""cull_notebook on JupyterHub: the executor against a real hub.

The hub (``jupyterhub``, from PyPI) runs as a process on 127.0.0.1 with its database,
scopes and spawner; only its proxy (configurable-http-proxy, an npm package the hub's API
does not need) and the single-user server are stand-ins (tests/hub/). A server started
through the hub's API is stopped by the executor, and the hub then reports it stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3

from detector.remediation.base import Call, NotApplicable, Target
from detector.remediation.jupyterhub import API, API_NAMED, JupyterHubCuller, _outcome
from streams.children import die_with_parent
from streams.embedded import free_port

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
CULLER, WEAK, ADMIN = "culler-" + "c" * 32, "weak-" + "w" * 32, "admin-" + "a" * 32


class Hub:
    """A running JupyterHub and an admin's view of it (for arranging and checking, not acting)."""

    def __init__(self, url: str) -> None:
        self.api = f"{url}/hub/api"
        self.http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=5.0, read=30.0), retries=False)

    def call(self, method: str, path: str, token: str = ADMIN, body: Any = None) -> urllib3.BaseHTTPResponse:
        return self.http.request(method, self.api + path, headers={"Authorization": f"token {token}"},
                                 body=json.dumps(body) if body is not None else None)  # fmt: skip

    def user(self, name: str) -> dict[str, Any]:
        resp = self.call("GET", f"/users/{name}")
        assert resp.status == 200, resp.data
        return json.loads(resp.data)

    def wait_ready(self, name: str, server: str = "", timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.user(name)["servers"].get(server)
            if info and info.get("ready"):
                return
            time.sleep(0.1)
        raise AssertionError(f"{name}'s server {server!r} did not start in {timeout} s")

    def start(self, name: str, server: str = "") -> None:
        """Create the user (if new) and start their server, as they would from the hub's home page."""
        created = self.call("POST", f"/users/{name}")
        assert created.status in (201, 409), created.data
        path = f"/users/{name}/servers/{server}" if server else f"/users/{name}/server"
        started = self.call("POST", path, body={})
        assert started.status in (201, 202), started.data
        self.wait_ready(name, server)

    def running(self, name: str) -> dict[str, Any]:
        return self.user(name)["servers"]

    def wait_stopped(self, name: str, server: str = "", timeout: float = 30.0) -> dict[str, Any]:
        """The user's servers once ``server`` is gone from them. A stop the hub does not finish
        within its ``slow_stop_timeout`` (1 s here: a loaded machine's process exit can take
        longer) is answered 202 and finished after; either way the hub must then report it gone."""
        deadline = time.monotonic() + timeout
        while server in (servers := self.running(name)):
            assert time.monotonic() < deadline, f"{name}'s server {server!r} still listed {timeout} s after the stop"
            time.sleep(0.1)
        return servers


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    state = tmp_path_factory.mktemp("hub")
    port = free_port()
    env = {**os.environ, "HUB_STATE_DIR": str(state), "HUB_PORT": str(port), "HUB_PUBLIC_PORT": str(free_port()),
           "HUB_CULLER_TOKEN": CULLER, "HUB_WEAK_TOKEN": WEAK, "HUB_ADMIN_TOKEN": ADMIN}  # fmt: skip
    log = (state / "hub.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(HERE / "hub" / "hub_config.py")],
                            cwd=state, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent())  # fmt: skip
    hub = Hub(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (state / "hub.log").read_text()[-3000:]
            try:
                if hub.http.request("GET", hub.api + "/", timeout=2.0).status == 200:
                    break
            except urllib3.exceptions.HTTPError:
                pass
            assert time.monotonic() < deadline, "the hub did not answer in 90 s:\n" + (state / "hub.log").read_text()[-3000:]
            time.sleep(0.2)
        yield hub
    finally:
        proc.terminate()  # the hub stops its users' servers on the way out
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def culler(hub: Hub, monkeypatch: pytest.MonkeyPatch) -> JupyterHubCuller:
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", CULLER)
    return JupyterHubCuller(api_url=hub.api)


def z2jh(user: str, server: str = "", pod: str | None = None) -> Target:
    """An idle-GPU alert on a node where a JupyterHub-on-Kubernetes user pod holds the GPU."""
    labels = {"hub.jupyter.org/username": user, **({"hub.jupyter.org/servername": server} if server else {})}
    item = {"namespace": "jhub", "pod": pod or f"jupyter-{user}", "gpus": [0], "labels": labels}
    return Target(resource_id="i-0abc", resource_type="gpu_instance", details={"pods": [item]})


def test_stops_the_users_server_and_the_hub_says_it_is_stopped(hub, culler):
    hub.start("alice")
    assert hub.running("alice")[""]["ready"] is True
    call = culler.plan(z2jh("alice"))
    assert call.api == API and call.request == {"user": "alice", "server": ""} and call.endpoint == hub.api
    assert CULLER not in json.dumps(call.request) + call.endpoint  # the token is read when calling, never planned
    outcome = culler.execute(call)
    assert outcome.ok, outcome.detail
    assert hub.wait_stopped("alice") == {}  # the default server is gone from the user's model
    assert hub.user("alice")["server"] is None


def test_stopping_twice_is_a_success_the_second_time_too(hub, culler):
    """The hub answers 204 to stopping a server that is not running (5.x); the incident's action is idempotent."""
    hub.start("bob")
    call = culler.plan(z2jh("bob"))
    assert culler.execute(call).ok
    again = culler.execute(call)
    assert again.ok and not again.retryable, again.detail
    assert hub.wait_stopped("bob") == {}


def test_a_slow_stop_is_accepted_then_finished_by_the_hub(hub, culler):
    """A server that takes a while to exit: 202 (stopping) is a success, and so is asking again meanwhile."""
    hub.start("slow-hana")
    call = culler.plan(z2jh("slow-hana", pod="jupyter-slow-hana"))
    first = culler.execute(call)
    assert first.ok and "stopping" in first.detail, first.detail
    assert hub.user("slow-hana")["servers"][""]["pending"] == "stop"
    again = culler.execute(call)  # while it stops
    assert again.ok and "stopping" in again.detail, again.detail
    assert hub.wait_stopped("slow-hana") == {}


def test_stops_a_named_server_and_leaves_the_users_other_server(hub, culler):
    hub.start("carol")
    hub.start("carol", "gpu")
    call = culler.plan(z2jh("carol", "gpu", pod="jupyter-carol--gpu"))
    assert call.api == API_NAMED and call.request == {"user": "carol", "server": "gpu"}
    outcome = culler.execute(call)
    assert outcome.ok, outcome.detail
    servers = hub.wait_stopped("carol", "gpu")
    assert "" in servers and servers[""]["ready"]  # the default server still runs


def test_a_username_from_a_tag_that_needs_quoting_reaches_the_right_user(hub, monkeypatch):
    """A hub outside Kubernetes: the user is the resource's tag. An e-mail address as the username:
    '@' and '+' are percent-quoted into one path segment."""
    hub.start("dana+ml@example.org")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", CULLER)
    culler = JupyterHubCuller(api_url=hub.api, user_tag="jupyterhub-user")
    target = Target(resource_id="nb-dana", resource_type="notebook", tags={"jupyterhub-user": "dana+ml@example.org"})
    outcome = culler.execute(culler.plan(target))
    assert outcome.ok, outcome.detail
    assert hub.wait_stopped("dana+ml@example.org") == {}


def test_an_unknown_user_is_reported_not_hidden_and_not_retried(culler):
    outcome = culler.execute(culler.plan(z2jh("nobody-here")))
    assert not outcome.ok and not outcome.retryable
    assert "404" in outcome.detail and "nobody-here" in outcome.detail


def test_a_token_without_the_scope_is_refused_and_not_retried(hub, monkeypatch):
    hub.start("erin")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", WEAK)
    weak = JupyterHubCuller(api_url=hub.api)
    outcome = weak.execute(weak.plan(z2jh("erin")))
    assert not outcome.ok and not outcome.retryable
    assert "403" in outcome.detail and "delete:servers" in outcome.detail
    assert WEAK not in outcome.detail
    assert hub.running("erin")[""]["ready"]  # nothing stopped


def test_no_token_in_the_environment_makes_no_call(hub, monkeypatch):
    hub.start("fay")
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    culler = JupyterHubCuller(api_url=hub.api)
    outcome = culler.execute(culler.plan(z2jh("fay")))
    assert not outcome.ok and "JUPYTERHUB_API_TOKEN" in outcome.detail
    assert hub.running("fay")[""]["ready"]


def test_a_token_ending_in_a_newline_works_and_one_with_control_characters_is_refused_unshown(hub, monkeypatch):
    """A Kubernetes Secret made from a file often ends in a newline; a CR/LF inside would make
    http.client raise ValueError with the header, token included, in its message."""
    hub.start("hal")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", CULLER + "\n")
    culler = JupyterHubCuller(api_url=hub.api)
    outcome = culler.execute(culler.plan(z2jh("hal")))
    assert outcome.ok, outcome.detail
    hub.start("hal")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", CULLER + "\r\nX-Injected: 1")
    outcome = culler.execute(culler.plan(z2jh("hal")))
    assert (outcome.ok, outcome.retryable) == (False, False) and "JUPYTERHUB_API_TOKEN" in outcome.detail
    assert CULLER not in outcome.detail and "X-Injected" not in outcome.detail
    assert hub.running("hal")[""]["ready"]  # nothing stopped


def test_a_hub_that_is_down_is_a_retryable_failure(monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", CULLER)
    culler = JupyterHubCuller(api_url=f"http://127.0.0.1:{free_port()}/hub/api")
    outcome = culler.execute(culler.plan(z2jh("alice")))
    assert not outcome.ok and outcome.retryable


def test_a_call_from_the_audit_table_is_checked_again(hub, culler):
    """A stored call whose name was tampered with, or that names another hub, is refused before any request."""
    hub.start("gus")
    for call in (Call(api=API, request={"user": "../admin", "server": ""}, endpoint=hub.api),
                 Call(api=API, request={"user": "gus\r\nX-Injected: 1", "server": ""}, endpoint=hub.api),
                 Call(api=API, request={"user": "gus", "server": ["../admin"]}, endpoint=hub.api),
                 Call(api=API, request={"user": 7}, endpoint=hub.api),
                 Call(api=API, request={"user": "gus", "server": ""}, endpoint="http://evil.example/hub/api")):  # fmt: skip
        outcome = culler.execute(call)
        assert not outcome.ok and outcome.detail.startswith("refused"), outcome.detail
    assert hub.running("gus")[""]["ready"]


def test_the_api_url_defaults_to_the_environment_as_the_hub_gives_it_to_services(monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_API_URL", "http://hub:8081/hub/api/")
    assert JupyterHubCuller().api_url == "http://hub:8081/hub/api"
    monkeypatch.delenv("JUPYTERHUB_API_URL")
    with pytest.raises(NotApplicable, match="JUPYTERHUB_API_URL"):
        JupyterHubCuller().plan(z2jh("alice"))
    with pytest.raises(ValueError, match="not http"):
        JupyterHubCuller(api_url="file:///etc/passwd")


def test_an_api_url_with_a_password_is_refused_without_quoting_it(monkeypatch):
    """The URL becomes every call's endpoint, which the audit table records and dry-run shows."""
    monkeypatch.setenv("JUPYTERHUB_API_URL", "http://burnwatch:s3cret-pw@hub:8081/hub/api")
    with pytest.raises(ValueError, match="user or password") as caught:
        JupyterHubCuller()
    assert "s3cret-pw" not in str(caught.value)


def test_a_server_an_older_hub_says_is_not_running_saves_nothing():
    """Hubs before 5.0 answer 400 "not running" to stopping a stopped server (the idle culler got there first):
    a success, as asked, whose succeeded step credits no saving (docs/actions.md, the audit table)."""
    outcome = _outcome(400, "carol's server is not running", "carol's server")
    assert outcome.ok and "was not running" in outcome.detail and not outcome.saves
    assert _outcome(204, "", "carol's server").saves
