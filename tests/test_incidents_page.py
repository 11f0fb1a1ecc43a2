"""The worker's incident views, ``/api/incidents`` and ``/incidents`` (streams/web.py's
:class:`IncidentViews`), served by a real aiohttp server on loopback over the embedded
engine, and the page read in a real headless browser: Debian's Chromium driven by
Playwright (never a browser Playwright downloads). What is asserted is what a person sees:
the empty state, hundreds of incidents capped with a line saying so, and markup from an
event shown as text, never run. tests/test_web_surface.py checks the same paths on a real
worker."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from detector.incidents_page import HEADERS
from detector.store import Store
from streams.web import IncidentViews
from tests.test_incidents import NOW, T0, alert, click

pytestmark = pytest.mark.integration

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]  # fmt: skip
WORKSPACE = "https://acme.slack.com"


class Served:
    """Views on a real aiohttp server on 127.0.0.1, its loop in a thread of its own (as the worker's web
    server runs beside its pipeline): the incident views, or the ``routes`` given ((method, path, handler))."""

    def __init__(self, views: IncidentViews | None = None, routes: tuple[tuple[str, str, Any], ...] = ()) -> None:
        self.views = views
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        app = web.Application()
        if views is not None:
            routes = (("GET", "/api/incidents", views.api), ("GET", "/incidents", views.page),
                      ("POST", "/incidents", views.decide), *routes)  # fmt: skip
        for method, path, handler in routes:
            app.router.add_route(method, path, handler)
        self.runner = web.AppRunner(app)
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=30)

    async def _start(self) -> int:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return int(self.runner.addresses[0][1])

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        try:
            with urllib.request.urlopen(self.url(path), timeout=30) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


@pytest.fixture
def served(store):
    server = Served(IncidentViews(store, WORKSPACE, clock=lambda: NOW))
    yield server
    server.close()


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is not installed (Debian's package: apt-get install -y chromium; .ci/run installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the [test] extra")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    opened = context.new_page()
    opened.errors = []  # type: ignore[attr-defined]
    opened.on("pageerror", lambda exc: opened.errors.append(str(exc)))
    opened.on("console", lambda msg: opened.errors.append(msg.text) if msg.type == "error" else None)
    yield opened
    context.close()


# -- the JSON endpoint and its refusals ------------------------------------------------------------


def test_the_json_endpoint_serves_the_list_the_cli_prints(store, served):
    store.alerts.record([alert("a", 98.0, team="nlp"), alert("b", 2.0, team="cv"), alert("c", 5.0, team="nlp"),
                         alert("d", 9.0, team="nlp", resolved_at=T0 + 600)], version=1)  # fmt: skip
    store.actions.record(click("c", "acknowledged", "bob"), at=NOW - 60)
    store.deliveries.record("a", "fired", "C0123ABC", "1790000060.123456")
    status, headers, body = served.get("/api/incidents?open=1&team=nlp&limit=5")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["Cache-Control"] == "no-store"
    answer = json.loads(body)
    assert [(i["alert_id"], i["state"]) for i in answer["incidents"]] == [("a", "firing"), ("c", "acknowledged")]
    assert (answer["total"], answer["shown"], answer["open_usd_per_hour"]) == (2, 2, 103.0)
    assert answer["incidents"][0]["slack_url"] == "https://acme.slack.com/archives/C0123ABC/p1790000060123456"
    assert answer["incidents"][1]["acknowledged_by"] == "bob"
    everything = json.loads(served.get("/api/incidents")[2])
    assert [i["alert_id"] for i in everything["incidents"]] == ["a", "c", "b", "d"]  # open by $/h, then resolved


@pytest.mark.parametrize(("path", "says"), [
    ("/api/incidents?limit=abc", "limit: 'abc' is not a whole number from 1 to 1000"),
    ("/api/incidents?limit=100000", "limit: 100000 is not between 1 and 1000"),
    ("/api/incidents?limit=1&limit=2", "limit: give it once"),
    ("/api/incidents?team=nlp%00%0d%0aX-Injected:%201", "team: control characters are not allowed"),
    ("/api/incidents?open=%3Cscript%3E", "open: '<script>' is not one of 1, true, 0, false"),
    ("/api/incidents?%27%20OR%201=1--=1", "unknown parameter \"' OR 1\""),
    ("/api/incidents?team=" + "x" * 500, "team: longer than 128 characters"),
])  # fmt: skip
def test_a_hostile_query_string_is_a_400_saying_why(served, path, says):
    status, headers, body = served.get(path)
    assert status == 400 and headers["Content-Type"].startswith("application/json"), body
    assert says in json.loads(body)["error"]


def test_the_page_refuses_a_bad_query_with_an_escaped_message(served):
    status, headers, body = served.get("/incidents?%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E=1")
    assert status == 400 and headers["Content-Type"].startswith("text/html")
    assert headers["Content-Security-Policy"] == HEADERS["Content-Security-Policy"]
    assert b"<img" not in body and b"unknown parameter &#x27;&lt;img src=x onerror=alert(1)&gt;&#x27;" in body
    status, _, body = served.get("/incidents?open=0")  # the page is the open incidents'
    assert status == 400 and b"unknown parameter &#x27;open&#x27;; this takes team, limit" in body


def test_a_store_that_does_not_answer_is_a_503_not_a_traceback(chdb_client):
    server = Served(IncidentViews(Store(chdb_client, "no_such_database"), clock=lambda: NOW))
    try:
        status, _, body = server.get("/api/incidents")
        assert status == 503 and json.loads(body) == {"error": "the store did not answer; try again"}
        status, _, body = server.get("/incidents")
        assert status == 503 and b"The store did not answer" in body and b"Traceback" not in body
    finally:
        server.close()


def test_one_query_at_a_time_a_second_request_meanwhile_is_told_to_retry(store, served):
    """The store's lock has no fairness: requests arriving while a query runs are answered 429
    (JSON and page), so a loop of them cannot starve the pipeline's writes; once it ends, 200."""
    store.alerts.record([alert("a", 98.0)], version=1)
    conn = getattr(store, "conn", store)
    result: dict[str, int] = {}
    with conn.lock:  # the pipeline writing: the first request's query waits on the lock
        first = threading.Thread(target=lambda: result.update(status=served.get("/api/incidents")[0]))
        first.start()
        deadline = time.monotonic() + 30
        while not served.views._querying and time.monotonic() < deadline:  # the first request holds the slot
            time.sleep(0.05)
        status, headers, body = served.get("/api/incidents")
        assert status == 429 and headers["Retry-After"] == "1" and b"retry" in body
        status, headers, body = served.get("/incidents")
        assert status == 429 and headers["Retry-After"] == "1" and b"Traceback" not in body
    first.join(timeout=30)
    assert result == {"status": 200}
    assert served.get("/api/incidents")[0] == 200


# -- the page, in Chromium -------------------------------------------------------------------------


def test_with_no_incidents_the_page_says_so(store, served, page):
    store.alerts.record([alert("gone", 50.0, resolved_at=T0 + 600)], version=1)  # resolved: not on the page
    response = page.goto(served.url("/incidents"))
    assert response.headers["content-security-policy"].startswith("default-src 'none'; style-src 'sha256-")
    assert response.headers["x-content-type-options"] == "nosniff"
    assert page.title() == "burnwatch: open incidents"
    assert page.get_by_text("No open incidents.").is_visible()
    assert page.locator("table").count() == 0
    assert "0 open, burning $0.00/h" in page.inner_text(".summary")
    assert page.errors == []  # type: ignore[attr-defined]


def test_hundreds_of_incidents_are_capped_highest_dollars_per_hour_first(store, served, page, tmp_path):
    rates = [round((i * 37) % 300 + i / 1000, 3) for i in range(300)]  # 300 distinct rates, stored out of order
    store.alerts.record([alert(f"i{i:03d}", rate, usd=rate * 2, team=("nlp", "cv", "rec")[i % 3], owner=f"user{i}")
                         for i, rate in enumerate(rates)]
                        + [alert(f"r{i}", 999.0, resolved_at=T0 + 600) for i in range(20)], version=1)  # fmt: skip
    store.actions.record(click("i001", "acknowledged"), at=NOW - 60)
    page.goto(served.url("/incidents"))
    rows = page.locator("tbody tr")
    assert rows.count() == 100
    assert page.inner_text(".cap") == "Showing 100 of 300 open incidents, highest $/h first. next 100 · show up to 1000"
    assert "300 open, burning $" in page.inner_text(".summary")
    shown = [float(t.strip("$").replace(",", "")) for t in page.locator("tbody td.num:nth-child(1)").all_inner_texts()]
    assert shown == [round(r, 2) for r in sorted(rates, reverse=True)[:100]]
    assert page.locator("tbody tr.resolved").count() == 0 and "$999.00" not in page.inner_text("tbody")
    header = page.locator("thead th").all_inner_texts()
    assert header == ["$/h", "$ so far", "State", "Age", "Owner", "Team", "Resource", "Type", "Slack"]
    first = page.locator("tbody tr").first
    assert first.get_attribute("data-alert-id") == f"i{rates.index(max(rates)):03d}"
    # the page's own style applies under its Content-Security-Policy (the hash matches)
    assert page.eval_on_selector("thead th", "e => getComputedStyle(e).position") == "sticky"
    page.screenshot(path=str(tmp_path / "incidents.png"), full_page=False)
    assert (tmp_path / "incidents.png").stat().st_size > 10_000

    page.get_by_role("link", name="show up to 1000").click()
    page.wait_for_url("**/incidents?limit=1000")
    assert page.locator("tbody tr").count() == 300
    assert page.inner_text(".cap") == "Showing all 300 open incidents, highest $/h first."

    page.fill("input[name=team]", "cv")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url("**/incidents?team=cv")
    assert page.locator("tbody tr").count() == 100
    assert set(page.locator("tbody td.team").all_inner_texts()) == {"cv"}
    assert page.locator("h1").inner_text() == "Open incidents of team cv"
    assert page.errors == []  # type: ignore[attr-defined]


def test_markup_in_an_event_is_shown_as_text_and_never_runs(store, served, page):
    script = "<script>document.title='pwned';window.pwned=1</script>"
    image = "<img src=x onerror=\"window.pwned=2\">"
    store.alerts.record([alert("x", 50.0, rid=script, team=image, owner="a\" onmouseover=\"window.pwned=3")], version=1)
    store.deliveries.record("x", "fired", "C0123ABC", "1790000060.123456")
    page.goto(served.url("/incidents?team=" + urllib.request.quote(image)))
    assert page.locator("td.resource").inner_text() == script
    assert page.locator("td.team").inner_text() == image
    assert page.locator("td.owner").inner_text() == "a\" onmouseover=\"window.pwned=3"
    assert page.locator("h1").inner_text() == f"Open incidents of team {image}"
    assert page.input_value("input[name=team]") == image
    page.locator("td.owner").hover()
    assert page.evaluate("window.pwned") is None and page.title() == "burnwatch: open incidents"
    assert page.locator("body script, body img, td [onmouseover]").count() == 0
    assert page.get_by_role("link", name="Slack").get_attribute("href") == (
        "https://acme.slack.com/archives/C0123ABC/p1790000060123456")
    assert page.errors == []  # type: ignore[attr-defined]
