"""The worker's web port serves burnwatch's own paths and refuses Faust's own views.

A real worker against the embedded broker: every route of every blueprint Faust 0.15
can mount (``/router/``, ``/table/``, the index, ``/graph/``, statistics,
``/performance/``) answers 404, while ``/healthz``, ``/metrics``, ``/slack/actions``,
``/api/incidents`` and ``/incidents`` still work, the last two reading the embedded store
the worker holds, seeded with incidents before it starts (tests/test_incidents_page.py
reads the page in a browser).
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from faust.web import base as faust_web
from mode.utils.imports import symbol_by_name

from streams.embedded import EmbeddedBroker
from streams.process import WorkerProcess, worker_env
from tests.conftest import ROOT
from tests.test_incidents_cli import SEED

pytestmark = pytest.mark.integration


def faust_paths() -> list[str]:
    """Every path Faust's own blueprints register, placeholders filled in."""
    blueprints = [*faust_web.DEFAULT_BLUEPRINTS, *faust_web.PRODUCTION_BLUEPRINTS, *faust_web.DEBUG_BLUEPRINTS,
                  *faust_web.OPTIONAL_BLUEPRINTS]  # fmt: skip
    paths = set()
    for prefix, name in blueprints:
        for route in symbol_by_name(name).routes:
            paths.add((prefix + route.uri).replace("{name}", "detect").replace("{key}", "k"))
    return sorted(paths)


def request(port: int, path: str, method: str = "GET", body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, bytes]:  # fmt: skip
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_only_burnwatch_paths_are_served(tmp_path):
    paths = faust_paths()
    assert {"/router/", "/table/", "/"} <= set(paths)  # the registry this test walks is Faust's real one
    seeded = subprocess.run([sys.executable, "-c", SEED, str(tmp_path / "data" / "clickhouse")], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert seeded.returncode == 0, seeded.stderr
    with EmbeddedBroker() as broker:
        env = worker_env(broker.bootstrap, tmp_path / "data", ROOT / "rules", 2,
                         BURNWATCH_WEB_USER_HEADER="X-Forwarded-Email")  # fmt: skip
        worker = WorkerProcess(env, tmp_path / "worker.log").start()
        try:
            worker.wait_until(lambda h: h["status"] == "ok", timeout=60)
            refused = {path: request(worker.port, path)[0] for path in [*paths, "/router/topics/", "/static/x"]}
            assert {p: s for p, s in refused.items() if s != 404} == {}
            assert request(worker.port, "/router/", method="POST", body=b"{}")[0] == 404
            status, body = request(worker.port, "/healthz")
            assert status == 200 and json.loads(body)["status"] == "ok"
            status, body = request(worker.port, "/metrics")
            assert status == 200 and b"burnwatch_messages_total" in body
            status, body = request(worker.port, "/slack/actions", method="POST", body=b"payload=x")
            assert status == 404 and b"SLACK_SIGNING_SECRET" in body  # our view answered: not configured here
            status, body = request(worker.port, "/api/incidents?open=1")
            assert status == 200 and [i["alert_id"] for i in json.loads(body)["incidents"]] == ["big", "cv", "small"]
            status, body = request(worker.port, "/incidents?team=nlp")
            assert status == 200 and b"Showing all 2 open incidents" in body and b'data-alert-id="big"' in body
            status, body = request(worker.port, "/incidents?team=search")
            assert status == 200 and b"No open incidents of team search." in body
            status, body = request(worker.port, "/api/incidents?limit=all")
            assert status == 400 and "limit: 'all' is not a whole number" in json.loads(body)["error"]
            # the page's decisions (tests/test_incidents_page_actions.py): the person is the proxy's header
            assert b"Signed in" not in request(worker.port, "/incidents")[1]
            status, body = request(worker.port, "/incidents", headers={"X-Forwarded-Email": "alice@example.com"})
            assert status == 200 and b"Signed in as <b>alice@example.com</b>; may decide actions here." in body
            status, body = request(worker.port, "/incidents", method="POST", body=b"x")
            assert status == 403 and b"No person named by the proxy (X-Forwarded-Email)" in body
            form = {"X-Forwarded-Email": "alice@example.com", "Sec-Fetch-Site": "same-origin",
                    "Content-Type": "application/x-www-form-urlencoded"}  # fmt: skip
            status, body = request(worker.port, "/incidents", method="POST", headers=form,
                                   body=b"token=1.forged&alert_id=big&decision=approve")  # fmt: skip
            assert status == 403 and b"not this person&#x27;s; reload the page" in body
        finally:
            worker.stop()
