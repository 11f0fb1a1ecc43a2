"""Deciding actions from the incidents page: Debian's Chromium (Playwright) clicks the page's
forms, served by the worker's views on a real aiohttp server over the embedded store, the
person named by a header as the authenticating proxy would set it (the browser context
sends it on every request). The decision goes through the worker's own ActionRunner and
policy, and the approved stop reaches EC2 (boto3 against moto's server). Then the checks
of who may decide, read as tables (the identity → Slack id → approver mapping, the token,
the origin)."""

from __future__ import annotations

import textwrap
import urllib.error
import urllib.parse
import urllib.request

import pytest

from detector.incidents_actions import (
    PageTokens,
    WebDecisions,
    cross_site,
    identity,
    slack_user,
    web_decider,
    who_may,
)  # fmt: skip
from detector.remediation.ec2 import StopInstance
from detector.remediation.instances import StopInstances
from detector.remediation.policy import may_approve
from detector.remediation.runner import ActionRunner
from detector.rules import Routing, load_rules
from detector.slack import SlackNotifier
from streams.web import IncidentViews
from tests import aws
from tests.aws import run_instance, session, state
from tests.test_incidents_page import Served, browser  # noqa: F401 - the fixture
from tests.test_remediation_runner import NOW, Wall, incident

pytestmark = pytest.mark.integration

moto_url = aws.moto_url
HEADER = "X-Forwarded-Email"
ALICE, BOB, MALLORY = "alice@example.com", "bob@example.com", "mallory@example.com"
APPROVER, STRANGER = "U0NLPLEAD", "U0STRANGER"


def rules(tmp_path, mode: str):
    (tmp_path / "rules.yaml").write_text(textwrap.dedent(f"""
        rules:
          - name: idle-gpu
            type: idle_gpu
            action: {{kind: stop_instance, after: 2h, mode: {mode}, grace: 1h}}
    """))  # fmt: skip
    (tmp_path / "routing.yaml").write_text(textwrap.dedent(f"""
        users: {{"{ALICE}": {APPROVER}, "{BOB}": {STRANGER}, alice: U0OTHERALICE}}
        approvers:
          default: [U0PLATFORM]
          teams: {{nlp: [{APPROVER}]}}
    """))  # fmt: skip
    return load_rules(tmp_path)


class World:
    """A worker's action side and its incident views: store, runner (EC2 in moto), server."""

    def __init__(self, store, tmp_path, moto: str, mode: str = "approve", user_header: str | None = HEADER,
                 slack_url: str = "") -> None:  # fmt: skip
        self.store, self.wall, self.moto = store, Wall(), moto
        ruleset = rules(tmp_path, mode)
        stop = StopInstances(ec2=StopInstance(endpoint_url=moto, session=session()))
        # a Slack to warn in (auto_unless_objected acts only after a warning there); the alert has no thread
        # in it here, so nothing is posted
        notifier = SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack_url, timeout=2) if slack_url else None
        self.runner = ActionRunner(store, {"stop_instance": stop}, lambda: ruleset, notifier, wall=self.wall)
        self.decisions = WebDecisions(store, self.runner, PageTokens(clock=self.wall), clock=self.wall)
        self.instance = run_instance(moto)
        store.alerts.record([incident(self.instance)], version=1)
        self.runner.run_once()  # proposed: the incident has lasted 3h of the rule's 2h
        views = IncidentViews(store, None, clock=self.wall, decisions=self.decisions, user_header=user_header)
        self.server = Served(views)

    def steps(self) -> list[tuple[str, str]]:
        return [(r["step"], r["decided_by"]) for r in self.store.remediations.steps("a1")]

    def post(self, fields: dict[str, str], headers: dict[str, str]) -> tuple[int, bytes]:
        body = urllib.parse.urlencode(fields).encode()
        req = urllib.request.Request(self.server.url("/incidents"), data=body, method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded", **headers})  # fmt: skip
        opener = urllib.request.build_opener(NoRedirect)
        try:
            with opener.open(req, timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201 - urllib's signature
        return None


@pytest.fixture
def world(store, tmp_path, moto_url, request, slack):
    mode, header = getattr(request, "param", ("approve", HEADER))
    made = World(store, tmp_path, moto_url, mode, header, slack.api_url)
    yield made
    made.server.close()


def as_person(browser, who: str | None):  # noqa: F811 - the fixture's value
    """A browser context behind the proxy: every request carries the person's header."""
    context = browser.new_context(extra_http_headers={HEADER: who} if who else {})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    return context, opened, errors


# -- in Chromium ------------------------------------------------------------------------------------


def test_an_approver_clicks_approve_and_the_page_then_shows_the_instance_stopped(world, browser):  # noqa: F811
    context, page, errors = as_person(browser, ALICE)
    try:
        page.goto(world.server.url("/incidents"))
        assert page.locator("thead th").last.inner_text() == "Action"
        cell = page.locator("tr[data-alert-id=a1] td.action")
        assert cell.locator(".state-proposed").inner_text() == (
            f'Awaiting approval: stop, calling ec2.StopInstances {{"InstanceIds": ["{world.instance}"]}} (us-east-1)'
        )
        assert page.inner_text("p.user") == f"Signed in as {ALICE}; may decide actions here."
        token = cell.locator("input[name=token]").input_value()
        with page.expect_navigation():
            cell.get_by_role("button", name="Approve").click()
        assert page.url == world.server.url("/incidents")  # 303 back to the page: a reload does not post again
        assert cell.locator(".state-approved").inner_text().startswith(f"Approved by {APPROVER}: calling ec2.StopInstances")
        assert cell.locator("form").count() == 0
        assert world.runner.wake.wait(timeout=10)  # the worker's timer runs a pass at once
        world.runner.run_once()
        assert state(world.moto, world.instance) in ("stopping", "stopped")
        page.reload()
        assert cell.locator(".state-succeeded").inner_text() == (
            f'Done by {APPROVER}: ec2.StopInstances {{"InstanceIds": ["{world.instance}"]}} (us-east-1): '
            f"{world.instance}: stopping"
        )
        assert world.steps() == [("proposed", ""), ("approved", APPROVER), ("begun", APPROVER), ("succeeded", APPROVER)]
        (click,) = world.store.actions.of("a1")
        assert (click["action"], click["user_id"], click["user_name"]) == ("approved", APPROVER, ALICE)
        # a replay of the same form (a double click, a resent request): nothing awaits, nothing changes
        status, body = world.post({"token": token, "alert_id": "a1", "decision": "approve"},
                                  {HEADER: ALICE, "Sec-Fetch-Site": "same-origin"})  # fmt: skip
        assert status == 409 and b"no action on alert a1 awaits a decision" in body
        assert [s for s, _ in world.steps()].count("approved") == 1 and len(world.store.actions.of("a1")) == 1
        assert errors == []
    finally:
        context.close()


@pytest.mark.parametrize(("who", "recorded", "why"), [
    (BOB, STRANGER, f"{STRANGER} is not an approver for this team"),
    (MALLORY, f"web:{MALLORY}", f"web:{MALLORY} is not an approver for this team"),  # not in users: nobody
])  # fmt: skip
def test_a_click_by_someone_not_an_approver_is_refused_and_recorded(world, browser, who, recorded, why):  # noqa: F811
    context, page, errors = as_person(browser, who)
    try:
        page.goto(world.server.url("/incidents"))
        with page.expect_navigation():
            page.locator("tr[data-alert-id=a1]").get_by_role("button", name="Approve").click()
        assert page.locator("h1").inner_text() == "403"
        assert page.inner_text("p.message") == f"{why}. Approvers for team nlp: {ALICE} ({APPROVER})."
        with page.expect_navigation():
            page.get_by_role("link", name="Back to the incidents").click()
        assert page.locator("tr[data-alert-id=a1] .state-proposed").is_visible()  # still awaits an approver
        assert world.steps() == [("proposed", ""), ("refused", recorded)]
        (refusal,) = [r for r in world.store.remediations.steps("a1") if r["step"] == "refused"]
        assert refusal["result"] == why
        assert world.store.actions.of("a1") == [] and state(world.moto, world.instance) == "running"
        assert errors == []
    finally:
        context.close()


@pytest.mark.parametrize("world", [("approve", None)], indirect=True)
def test_without_the_header_setting_the_page_shows_no_buttons_and_refuses_posts(world, browser):  # noqa: F811
    context, page, _ = as_person(browser, ALICE)  # the proxy sends it, but the worker is not told to trust it
    try:
        page.goto(world.server.url("/incidents"))
        assert page.locator("tr[data-alert-id=a1] .state-proposed").inner_text().startswith("Awaiting approval")
        assert page.locator("form.decide, button[name=decision]").count() == 0
        assert page.locator("p.user").count() == 0
    finally:
        context.close()
    token = world.decisions.tokens.issue(ALICE)  # even with a token that would be valid
    status, body = world.post({"token": token, "alert_id": "a1", "decision": "approve"},
                              {HEADER: ALICE, "Sec-Fetch-Site": "same-origin"})  # fmt: skip
    assert status == 403 and b"BURNWATCH_WEB_USER_HEADER is not set" in body
    assert world.steps() == [("proposed", "")]


def test_a_request_without_the_person_gets_a_read_only_page_and_a_403(world, browser):  # noqa: F811
    context, page, _ = as_person(browser, None)
    try:
        page.goto(world.server.url("/incidents"))
        assert page.locator("form.decide").count() == 0 and page.locator("p.user").count() == 0
    finally:
        context.close()
    status, body = world.post({"token": "1.x", "alert_id": "a1", "decision": "approve"}, {"Sec-Fetch-Site": "same-origin"})
    assert status == 403 and f"No person named by the proxy ({HEADER})".encode() in body


def test_forged_posts_are_refused_and_change_nothing(world, browser):  # noqa: F811
    same = {HEADER: ALICE, "Sec-Fetch-Site": "same-origin"}
    good = world.decisions.tokens.issue(ALICE)
    forged = [
        ({"alert_id": "a1", "decision": "approve"}, same),  # no token
        ({"token": "", "alert_id": "a1", "decision": "approve"}, same),
        ({"token": good[:-1] + ("0" if good[-1] != "0" else "1"), "alert_id": "a1", "decision": "approve"}, same),
        ({"token": world.decisions.tokens.issue(BOB), "alert_id": "a1", "decision": "approve"}, same),  # bob's page
        ({"token": good, "alert_id": "a1", "decision": "approve"}, {HEADER: ALICE, "Sec-Fetch-Site": "cross-site"}),
        ({"token": good, "alert_id": "a1", "decision": "approve"}, {HEADER: ALICE, "Origin": "https://evil.example"}),
        ({"token": good, "alert_id": "a1", "decision": "approve"}, {HEADER: ALICE}),  # neither header
    ]
    for fields, headers in forged:
        status, _ = world.post(fields, headers)
        assert status == 403, (fields, headers, status)
    # a form on another site, even holding a leaked token, submitted by Chromium: cross-site, refused
    context, page, _ = as_person(browser, ALICE)
    try:
        page.set_content(f'<form method="post" action="{world.server.url("/incidents")}">'
                         f'<input type="hidden" name="token" value="{good}"><input type="hidden" name="alert_id" value="a1">'
                         '<button name="decision" value="approve">Win a prize</button></form>')  # fmt: skip
        with page.expect_navigation():
            page.get_by_role("button", name="Win a prize").click()
        assert page.locator("h1").inner_text() == "403" and "only the page may post" in page.inner_text("p.message")
    finally:
        context.close()
    world.wall.t += 9 * 3600  # a page left open past its token's life
    status, body = world.post({"token": good, "alert_id": "a1", "decision": "approve"}, same)
    assert status == 403 and b"the page is too old; reload it" in body
    assert world.steps() == [("proposed", "")] and state(world.moto, world.instance) == "running"


@pytest.mark.parametrize("world", [("auto_unless_objected", HEADER)], indirect=True)
def test_an_automatic_action_can_be_snoozed_from_the_page_by_anyone_named(world, browser):  # noqa: F811
    context, page, errors = as_person(browser, BOB)  # not an approver: Snooze is open to all, as in Slack
    try:
        page.goto(world.server.url("/incidents"))
        cell = page.locator("tr[data-alert-id=a1] td.action")
        assert cell.locator(".state-proposed").inner_text().startswith("Will stop at ")
        assert "unless snoozed or declined" in cell.inner_text()
        assert cell.locator("button").all_inner_texts() == ["Approve now", "Object", "Snooze 24h"]
        with page.expect_navigation():
            cell.get_by_role("button", name="Snooze 24h").click()
        world.runner.run_once()
        page.reload()
        assert cell.locator(".state-cancelled").inner_text() == "Not acting (snoozed): will not stop"
        world.wall.t = NOW + 2 * 3600  # past the grace: it does not act
        world.runner.run_once()
        assert state(world.moto, world.instance) == "running"
        assert errors == []
    finally:
        context.close()


# -- tables ------------------------------------------------------------------------------------------

ROUTING = Routing.model_validate({
    "users": {"alice@example.com": "U0ALICE", "bob": "U0BOB", "carol@example.com": "U0CAROL", "dave": "not-an-id",
              "owner-olga": "U0OLGA"},
    "approvers": {"default": ["U0PLATFORM"], "teams": {"nlp": ["U0ALICE", "S0LEADS"], "cv": []}},
})  # fmt: skip


def test_who_may_names_the_approvers_by_their_users_entries():
    assert who_may(ROUTING, {"team": "nlp"}) == "Approvers for team nlp: alice@example.com (U0ALICE); user group S0LEADS."
    assert who_may(ROUTING, {}) == "Approvers for resources with no team: U0PLATFORM."
    assert who_may(ROUTING, {"team": "cv"}) == "Approvers for team cv: none are set in routing.yaml (approvers)."
    owners = ROUTING.model_copy(update={"approvers": ROUTING.approvers.model_copy(update={"owner": True})})
    assert who_may(owners, {"team": "cv", "owner": "bob"}) == "Approvers for team cv: the resource's owner (bob)."


@pytest.mark.parametrize(("who", "slack_id"), [
    ("alice@example.com", "U0ALICE"),
    ("ALICE@Example.COM", "U0ALICE"),      # an e-mail matches whatever its case
    ("alice", ""),                         # no part of an e-mail is ever taken for a name
    ("alice@example.com.evil.io", ""),
    ("bob", "U0BOB"),
    ("BOB", ""),                           # a user name matches exactly
    ("bob@example.com", ""),
    ("dave", ""),                          # a value that is not a Slack user id gives nobody
    ("", ""),
])  # fmt: skip
def test_a_web_identity_becomes_a_slack_id_only_through_users(who, slack_id):
    assert slack_user(ROUTING, who) == slack_id
    assert web_decider(ROUTING, who) == (slack_id or f"web:{who}")


@pytest.mark.parametrize(("who", "tags", "owner", "allowed"), [
    ("alice@example.com", {"team": "nlp"}, False, True),
    ("bob", {"team": "nlp"}, False, False),
    ("carol@example.com", {"team": "nlp"}, False, True),      # via the user group S0LEADS
    ("carol@example.com", {"team": "rec"}, False, False),     # rec: the default list
    ("alice@example.com", {"team": "cv"}, False, False),      # cv: nobody listed
    ("bob", {"team": "cv", "owner": "bob"}, True, True),      # the owner, with owner: true
    ("bob", {"team": "cv", "owner": "bob"}, False, False),
    ("mallory@example.com", {"team": "nlp"}, False, False),   # not in users
    ("U0ALICE", {"team": "nlp"}, False, False),               # a Slack id typed as a name is nobody
])  # fmt: skip
def test_the_web_uses_the_same_approvers_as_slack(who, tags, owner, allowed):
    routing = ROUTING.model_copy(update={"approvers": ROUTING.approvers.model_copy(update={"owner": owner})})
    members = {"S0LEADS": {"U0CAROL"}}
    ok, why = may_approve(routing, tags, web_decider(routing, who), lambda g: members[g])
    assert ok is allowed, why


@pytest.mark.parametrize(("headers", "who"), [
    ({HEADER: "alice@example.com"}, "alice@example.com"),
    ({HEADER: "  alice  "}, "alice"),
    ({HEADER: ""}, None),
    ({HEADER: "alice\r\nX-Evil: 1"}, None),
    ({HEADER: "a" * 255}, None),
    ({"X-Other": "alice"}, None),
])  # fmt: skip
def test_the_person_is_the_configured_header_only(headers, who):
    assert identity(headers, HEADER) == who
    assert identity(headers, None) is None


@pytest.mark.parametrize(("headers", "host", "origin", "refused"), [
    ({"Sec-Fetch-Site": "same-origin"}, "h:1", None, False),
    ({"Sec-Fetch-Site": "same-site"}, "h:1", None, True),
    ({"Sec-Fetch-Site": "cross-site", "Origin": "http://h:1"}, "h:1", None, True),  # the browser's word wins
    ({"Origin": "http://h:1"}, "h:1", None, False),
    ({"Origin": "http://evil:1"}, "h:1", None, True),
    ({"Origin": "null"}, "h:1", None, True),
    ({"Origin": "https://burnwatch.example.com"}, "worker:6066", "https://burnwatch.example.com", False),
    ({"Origin": "http://worker:6066"}, "worker:6066", "https://burnwatch.example.com", True),
    ({}, "h:1", None, True),
])  # fmt: skip
def test_only_the_pages_own_origin_may_post(headers, host, origin, refused):
    assert (cross_site(headers, host, origin) is not None) is refused


def test_a_token_is_the_persons_and_expires():
    now = [1_800_000_000.0]
    tokens = PageTokens(clock=lambda: now[0], ttl_s=3600)
    token = tokens.issue("alice")
    assert tokens.check("alice", token) is None
    assert tokens.check("bob", token) is not None
    assert PageTokens(clock=lambda: now[0]).check("alice", token) is not None  # another process's key
    shared = b"burnwatch-web-token-secret"  # BURNWATCH_WEB_TOKEN_SECRET: one key for a group's workers
    one, other = PageTokens(shared, clock=lambda: now[0]), PageTokens(shared, clock=lambda: now[0])
    assert other.check("alice", one.issue("alice")) is None and other.check("bob", one.issue("alice")) is not None
    assert tokens.check("alice", "x" + token) is not None and tokens.check("alice", "") is not None
    now[0] += 3601
    assert tokens.check("alice", token) == "the page is too old; reload it"
