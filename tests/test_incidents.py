"""The incident list (detector/incidents.py) on the embedded engine: which alerts are
incidents, their states from the clicks, the order (open first, highest $/h first), the
filters people type or send in a query string, and the terminal table."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from detector.actions import Click
from detector.alerts import Alert
from detector.incidents import (
    MAX_LIMIT,
    IncidentFilter,
    InvalidFilter,
    format_table,
    list_incidents,
    slack_permalink,
    summary,
)
from detector.incidents_page import render_page
from detector.settings import load_settings
from detector.suppression import Hold

T0 = 1_790_000_000.0
NOW = 1_800_000_000.0  # wall time: clicks and snoozes are judged against it


def alert(alert_id: str, usd_per_hour: float, *, usd: float = 10.0, team: str = "nlp", owner: str = "ines",
          resolved_at: float | None = None, held: Hold | None = None, rid: str | None = None,
          start: float = T0, type_: str = "idle_gpu", details: dict | None = None) -> Alert:  # fmt: skip
    return Alert(
        alert_id=alert_id, type=type_, rule=type_.replace("_", "-"), details=details or {}, resource_id=rid or f"host-{alert_id}",
        status="resolved" if resolved_at else "firing", change="resolved" if resolved_at else "fired",
        severity="warning", episode_start=start, fired_at=start + 120, updated_at=resolved_at or start + 5400,
        resolved_at=resolved_at, waste_usd=usd, usd_per_hour=usd_per_hour, resource_type="gpu_instance",
        account="111", region="us-east-1", instance_type="p4d.24xlarge", tags={"team": team, "owner": owner},
        held=held, silenced=held.reason if held else "",
    )  # fmt: skip


def click(alert_id: str, action: str, user: str = "bob", user_id: str = "U1") -> Click:
    return Click(alert_id=alert_id, action=action, user_id=user_id, user_name=user, channel="C1", message_ts="1.2")


def ids(listed) -> list[str]:
    return [i.alert_id for i in listed.incidents]


def test_states_come_from_the_alert_and_the_clicks(store):
    store.alerts.record([alert("fire", 1), alert("ack", 1), alert("snz", 1), alert("old-snz", 1),
                         alert("done", 1, resolved_at=T0 + 7200)], version=1)  # fmt: skip
    store.actions.record(click("ack", "acknowledged", "bob"), at=NOW - 60)
    store.actions.record(click("snz", "acknowledged"), at=NOW - 120)
    store.actions.record(click("snz", "snoozed", "eve"), at=NOW - 60, until=NOW + 3600)  # running: wins over the ack
    store.actions.record(click("old-snz", "snoozed"), at=NOW - 90_000, until=NOW - 3600)  # ended: firing again
    store.actions.record(click("done", "acknowledged"), at=NOW - 60)  # resolved wins over everything
    listed = {i.alert_id: i for i in list_incidents(store, IncidentFilter(), NOW).incidents}
    assert {k: i.state for k, i in listed.items()} == {
        "fire": "firing", "ack": "acknowledged", "snz": "snoozed", "old-snz": "firing", "done": "resolved"}
    assert listed["ack"].acknowledged_by == "bob" and listed["ack"].acknowledged_at == pytest.approx(NOW - 60)
    assert listed["snz"].snoozed_by == "eve" and listed["snz"].snoozed_until == pytest.approx(NOW + 3600)
    assert listed["fire"].acknowledged_at is None and listed["fire"].snoozed_until is None


def test_a_withdrawn_fire_is_resolved_and_says_so_in_the_json_and_on_the_page(store):
    """A fire taken back (the host had stopped before the threshold, the stop read late) is a resolved
    incident of no dollars that says it was withdrawn; another resolved one does not."""
    store.alerts.record([alert("wd", 32.0, usd=0.0, resolved_at=T0 + 1790, details={"reason": "withdrawn"}),
                         alert("done", 1, resolved_at=T0 + 7200, details={"reason": "gpu_busy"})], version=1)  # fmt: skip
    listed = list_incidents(store, IncidentFilter(), NOW)
    by_id = {i["alert_id"]: i for i in listed.to_json()["incidents"]}
    assert (by_id["wd"]["state"], by_id["wd"]["withdrawn"]) == ("resolved", True)
    assert (by_id["done"]["state"], by_id["done"]["withdrawn"]) == ("resolved", False)
    page = render_page(listed)
    assert page.count(">withdrawn<") == 1 and page.count(">resolved<") == 1


def test_a_corrected_incident_shows_the_corrected_end_and_dollars(store):
    """Resolved at a busy sample, then corrected by the GPU rule (a stop read late ended it earlier): the
    alert manager records the correction, and the incident list, reading the latest row, shows the
    corrected end and dollars."""
    from detector.alerts import AlertManager
    from detector.detectors import Finding, ResourceInfo

    def finding(action: str, at: float, usd: float, **details: object) -> Finding:
        return Finding(action=action, rule="idle-gpu", type="idle_gpu", resource_id="host-c", episode_start=T0,
                       fired_at=T0 + 1800, at=at, waste_usd=usd, usd_per_hour=12.0, severity="warning",
                       details=details, resource=ResourceInfo(resource_id="host-c", tags={"team": "nlp"}))  # fmt: skip

    changes = AlertManager().handle([
        finding("fire", T0 + 1800, 6.0), finding("resolve", T0 + 7200, 24.0, reason="gpu_busy"),
        finding("resolve", T0 + 5400, 18.0, reason="instance_stopped", corrected=True, was_resolved_at=T0 + 7200,
                was_usd=24.0),
    ])  # fmt: skip
    for version, change in enumerate(changes, start=1):
        store.alerts.record([change], version=version)
    (incident,) = list_incidents(store, IncidentFilter(), NOW).incidents
    assert (incident.state, incident.usd, incident.resolved_at) == ("resolved", 18.0, pytest.approx(T0 + 5400))
    assert not incident.withdrawn


def test_a_click_without_a_user_name_is_shown_by_its_user_id(store):
    """Slack's payload may carry only the user's id (as the worker's log and the snooze notice show it)."""
    store.alerts.record([alert("ack", 1), alert("snz", 1)], version=1)
    store.actions.record(click("ack", "acknowledged", "", "U0ACK"), at=NOW - 60)
    store.actions.record(click("snz", "snoozed", "", "U0SNZ"), at=NOW - 60, until=NOW + 3600)
    listed = {i.alert_id: i for i in list_incidents(store, IncidentFilter(), NOW).incidents}
    assert (listed["ack"].acknowledged_by, listed["snz"].snoozed_by) == ("U0ACK", "U0SNZ")


def test_open_ones_first_by_dollars_per_hour_then_the_latest_resolved(store):
    store.alerts.record([
        alert("slow", 1.5), alert("fast", 98.0), alert("mid", 12.0, usd=5), alert("mid-costlier", 12.0, usd=50),
        alert("done-early", 500.0, resolved_at=T0 + 3600), alert("done-late", 0.5, resolved_at=T0 + 9000),
    ], version=1)  # fmt: skip
    listed = list_incidents(store, IncidentFilter(), NOW)
    assert ids(listed) == ["fast", "mid-costlier", "mid", "slow", "done-late", "done-early"]
    assert (listed.total, listed.open_total, listed.open_usd_per_hour) == (6, 4, pytest.approx(123.5))


def test_the_open_dollars_per_hour_count_a_resource_once(store):
    """An untagged host whose GPUs sit idle has two incidents open, idle GPUs and untagged spend, each at the
    host's $55.04/h: the host burns $55.04/h, not $110.08 (the demo's notebook-003 was counted twice). Per
    resource the fastest of its open incidents, as the daily digest counts them."""
    store.alerts.record([alert("idle", 55.04, rid="h8", team=""), alert("untagged", 55.04, rid="h8", team="",
                                                                        type_="untagged"),
                         alert("other", 10.0, rid="h9")], version=1)  # fmt: skip
    listed = list_incidents(store, IncidentFilter(open_only=True), NOW)
    assert (listed.total, listed.open_total, listed.open_usd_per_hour) == (3, 3, pytest.approx(65.04))
    assert summary(listed) == "3 open incidents, burning $65.04/h"
    assert list_incidents(store, IncidentFilter(team="nlp"), NOW).open_usd_per_hour == pytest.approx(10.0)


def test_a_failed_run_that_has_ended_is_sunk_not_burning(store):
    """A failed run's $/h is what it cost while it ran: it burns nothing now, so it is not in
    the open dollars per hour, shows no $/h, and comes after those still burning (by dollars).
    A crash loop of the same detector is still retrying: it burns."""
    run = {"run_id": "r1", "status": "failed", "error": "OOM"}
    store.alerts.record([
        alert("idle", 5.0), alert("run-big", 300.0, usd=900.0, type_="failed_run_spend", details=run),
        alert("run-small", 400.0, usd=20.0, type_="failed_run_spend", details=run),
        alert("loop", 30.0, type_="failed_run_spend", details={"crash_loop": True, "project": "p"}),
        alert("run-done", 9.0, resolved_at=T0 + 60, type_="failed_run_spend", details=run),
    ], version=1)  # fmt: skip
    listed = list_incidents(store, IncidentFilter(), NOW)
    assert ids(listed) == ["loop", "idle", "run-big", "run-small", "run-done"]
    assert (listed.open_total, listed.open_usd_per_hour) == (4, pytest.approx(35.0))
    assert summary(listed) == "5 incidents; 4 open, burning $35.00/h"
    by_id = {i.alert_id: i for i in listed.incidents}
    assert [by_id[k].burning for k in ("loop", "idle", "run-big")] == [True, True, False]
    assert by_id["run-big"].to_json()["usd_per_hour"] == 300.0  # the stored rate is kept, said while it ran
    rows = {line.split()[-1]: line.split() for line in format_table(listed).splitlines()[1:]}
    assert rows["run-big"][:3] == ["firing", "sunk", "$900.00"] and rows["loop"][1] == "$30.00"
    assert rows["run-done"][1] == "-"
    page = render_page(list_incidents(store, IncidentFilter(open_only=True), NOW))
    assert "burning $35.00/h" in page and page.count(">sunk<") == 2


@pytest.mark.parametrize("type_", ["vector_db_growth", "storage_growth"])
def test_a_forecasts_dollars_per_hour_are_no_burn(store, type_):
    """A database filling up carries its running cost per hour; it wastes none, and the list's
    "burning $/h" counted it as if it did."""
    store.alerts.record([alert("idle", 5.0), alert("filling", 0.2, usd=0.0, type_=type_)], version=1)
    listed = list_incidents(store, IncidentFilter(), NOW)
    assert summary(listed) == "2 incidents; 2 open, burning $5.00/h"
    rows = {line.split()[-1]: line.split() for line in format_table(listed).splitlines()[1:]}
    assert rows["filling"][1] == "-" and rows["idle"][1] == "$5.00"  # not "sunk": nothing was spent on it
    assert "burning $5.00/h" in render_page(listed)


def test_held_alerts_are_not_incidents(store):
    """Silenced, joined to another incident, held by realert: recorded, never posted, as in the reports."""
    silenced = Hold(kind="silenced", by="s1", reason="silence s1: maintenance")
    joined = Hold(kind="inhibited", by="posted", reason="joined incident posted")
    store.alerts.record([alert("posted", 1), alert("silenced", 9, held=silenced), alert("joined", 9, held=joined)], version=1)
    assert ids(list_incidents(store, IncidentFilter(), NOW)) == ["posted"]


def test_the_latest_change_of_an_alert_is_what_counts(store):
    store.alerts.record([alert("a", 2.0, usd=1.0)], version=1)
    store.alerts.record([alert("a", 40.0, usd=80.0)], version=2)
    store.alerts.record([alert("a", 40.0, usd=95.0, resolved_at=T0 + 9000)], version=3)
    (only,) = list_incidents(store, IncidentFilter(), NOW).incidents
    assert (only.state, only.usd, only.age_s) == ("resolved", 95.0, 9000)
    assert list_incidents(store, IncidentFilter(open_only=True), NOW).incidents == []


def test_filters_team_open_and_limit_with_the_totals_of_all_that_match(store):
    store.alerts.record([alert(f"n{i}", float(i), team="nlp") for i in range(5)]
                        + [alert("cv", 99.0, team="cv"), alert("n-done", 1.0, resolved_at=T0 + 60)], version=1)  # fmt: skip
    listed = list_incidents(store, IncidentFilter(open_only=True, team="nlp", limit=2), NOW)
    assert ids(listed) == ["n4", "n3"]
    assert (listed.total, listed.open_total, listed.open_usd_per_hour) == (5, 5, 10.0)
    assert summary(listed) == "showing 2 of 5 open incidents of team nlp, burning $10.00/h"
    assert ids(list_incidents(store, IncidentFilter(team="nlp' OR 1=1 --"), NOW)) == []  # bound, not pasted
    assert list_incidents(store, IncidentFilter(team="nlp"), NOW).total == 6


def test_a_list_longer_than_the_most_one_answer_holds_is_read_page_by_page(store):
    """A fleet with more incidents than MAX_LIMIT could see only its first MAX_LIMIT (the page said "Showing 1000 of
    2400" and `--limit shows more` when it could not): ``offset`` reads on, each incident on one page only."""
    store.alerts.record([alert(f"n{i}", float(i)) for i in range(5)], version=1)
    pages = [ids(list_incidents(store, IncidentFilter(open_only=True, limit=2, offset=o), NOW)) for o in (0, 2, 4)]
    assert pages == [["n4", "n3"], ["n2", "n1"], ["n0"]]
    second = list_incidents(store, IncidentFilter.from_query({"open": ["1"], "limit": ["2"], "offset": ["2"]}), NOW)
    assert (second.total, second.to_json()["filter"]["offset"]) == (5, 2)
    assert summary(second) == "showing 3-4 of 5 open incidents, burning $10.00/h"
    page = render_page(second)
    assert "Showing 3–4 of 5 open incidents" in page
    assert 'href="?limit=2&amp;offset=4">next 1</a>' in page and 'href="?limit=2">previous 2</a>' in page
    with pytest.raises(InvalidFilter, match="offset: '-1' is not a whole number"):
        IncidentFilter.from_query({"offset": ["-1"]})


class WriterWaiting:
    """The store's lock, except that a writer waits on it (the worker's pipeline, beside the web
    thread): the first time it is let go, the writer takes it and writes."""

    def __init__(self, write: Callable[[], None]) -> None:
        self._lock, self._write = threading.Lock(), write

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
        write, self._write = self._write, None
        if write is not None:
            write()


def test_a_write_of_the_worker_does_not_land_between_the_rows_and_the_totals(store):
    store.alerts.record([alert("a", 5.0)], version=1)
    store.lock = WriterWaiting(lambda: store.alerts.record([alert("b", 9.0)], version=2))  # type: ignore[assignment]
    listed = list_incidents(store, IncidentFilter(open_only=True), NOW)
    assert (ids(listed), listed.total, listed.open_total) == (["a"], 1, 1)  # one moment's answer, not "1 of 2"
    assert ids(list_incidents(store, IncidentFilter(open_only=True), NOW)) == ["b", "a"]  # the write was made after


@pytest.mark.parametrize(("query", "expected"), [
    ({}, IncidentFilter()),
    ({"open": ["1"], "team": ["nlp"], "limit": ["20"]}, IncidentFilter(open_only=True, team="nlp", limit=20)),
    ({"open": [""]}, IncidentFilter(open_only=True)),           # ?open alone
    ({"open": ["false"]}, IncidentFilter()),
    ({"team": [""]}, IncidentFilter()),                          # an emptied form field: all teams
    ({"team": ["<script>alert(1)</script>"]}, IncidentFilter(team="<script>alert(1)</script>")),  # a name, bound
    ({"limit": [str(MAX_LIMIT)]}, IncidentFilter(limit=MAX_LIMIT)),
])  # fmt: skip
def test_a_query_string_becomes_a_filter(query, expected):
    assert IncidentFilter.from_query(query) == expected


@pytest.mark.parametrize(("query", "message"), [
    ({"limit": ["0"]}, "limit: 0 is not between 1 and 1000"),
    ({"limit": ["1001"]}, "limit: 1001 is not between 1 and 1000"),
    ({"limit": ["-1"]}, "limit: '-1' is not a whole number"),
    ({"limit": ["1e9"]}, "limit: '1e9' is not a whole number"),
    ({"limit": ["99999999999999999999"]}, "is not a whole number"),   # no int() of a huge string
    ({"limit": ["\u0661\u0662"]}, "is not a whole number"),            # Arabic-Indic digits: isdigit() alone says yes
    ({"limit": ["10", "20"]}, "limit: give it once (it was given 2 times)"),
    ({"open": ["maybe"]}, "open: 'maybe' is not one of 1, true, 0, false"),
    ({"team": ["nlp\r\nSet-Cookie: x"]}, "team: control characters are not allowed"),
    ({"team": ["x" * 129]}, "team: longer than 128 characters"),
    ({"order": ["1; DROP TABLE alerts"]}, "unknown parameter 'order'; this takes open, team, limit"),
    ({"<img src=x>": ["1"]}, "unknown parameter '<img src=x>'"),
])  # fmt: skip
def test_a_bad_query_string_is_refused_saying_why(query, message):
    with pytest.raises(InvalidFilter) as caught:
        IncidentFilter.from_query(query)
    assert message in str(caught.value)


def test_the_page_takes_fewer_parameters():
    with pytest.raises(InvalidFilter, match="unknown parameter 'open'; this takes team, limit"):
        IncidentFilter.from_query({"open": ["0"]}, allowed=("team", "limit"), open_only=True)
    assert IncidentFilter.from_query({}, allowed=("team", "limit"), open_only=True).open_only


@pytest.mark.parametrize(("workspace", "channel", "ts", "url"), [
    ("https://acme.slack.com", "C0123ABC", "1790000060.123456", "https://acme.slack.com/archives/C0123ABC/p1790000060123456"),
    ("https://acme.slack.com/", "C0123ABC", "1790000060.123456", "https://acme.slack.com/archives/C0123ABC/p1790000060123456"),
    (None, "C0123ABC", "1790000060.123456", None),                 # no workspace configured
    ("https://acme.slack.com", "", "", None),                        # a webhook post: no channel, no ts
    ("https://acme.slack.com", "C0123ABC", "snoozed", None),         # recorded as delivered while snoozed: no message
    ("https://acme.slack.com", "C1/../../x", "1790000060.123456", None),
    ("javascript:alert(1)//", "C0123ABC", "1790000060.123456", None),
])  # fmt: skip
def test_a_slack_link_only_from_the_workspace_and_ids_of_slacks_form(workspace, channel, ts, url):
    assert slack_permalink(workspace, channel, ts) == url


def test_the_json_of_an_incident_keeps_its_documented_fields(store):
    store.alerts.record([alert("a", 3.25, usd=12.345)], version=1)
    store.deliveries.record("a", "fired", "C0123ABC", "1790000060.123456")
    body = list_incidents(store, IncidentFilter(open_only=True), NOW).to_json("https://acme.slack.com")
    assert set(body) == {"as_of", "filter", "total", "shown", "open_total", "open_usd_per_hour", "incidents"}
    (one,) = body["incidents"]
    assert set(one) == {
        "alert_id", "state", "type", "rule", "severity", "resource_id", "resource_type", "team", "owner", "account",
        "region", "instance_type", "usd", "usd_per_hour", "age_s", "episode_start", "fired_at", "updated_at",
        "resolved_at", "acknowledged_by", "acknowledged_at", "snoozed_until", "snoozed_by", "marked_expected",
        "slack_channel", "slack_ts", "slack_post", "slack_url", "tags", "burning", "withdrawn",
    }  # fmt: skip (docs/incidents.md lists these)
    assert one["usd"] == 12.35 and one["usd_per_hour"] == 3.25 and one["age_s"] == 5400
    assert one["episode_start"] == "2026-09-21T14:13:20Z" and one["resolved_at"] is None
    assert one["slack_url"] == "https://acme.slack.com/archives/C0123ABC/p1790000060123456"
    assert one["slack_post"] == "posted"
    assert body["filter"] == {"open": True, "team": None, "limit": 100, "offset": 0}


def test_an_opening_that_made_no_post_has_no_slack_ts_and_says_why(store):
    """The delivery records of an opening Slack refused, or that routing sent elsewhere, carry a word where a post's
    ts goes: the JSON said ``slack_ts: "refused"`` (a client building a link from it linked to nothing, one testing
    for null took it as posted). Now no channel and no ts, and ``slack_post`` says what became of it."""
    from detector.delivery import REFUSED, UNROUTED, WITHDRAWN_UNPOSTED

    made = {"refused": REFUSED, "unrouted": UNROUTED, "withdrawn": WITHDRAWN_UNPOSTED, "snoozed": ("", "snoozed"),
            "webhook": ("webhook", ""), "bot": ("C0123ABC", "1790000060.123456")}  # fmt: skip
    store.alerts.record([alert(name, 1.0) for name in [*made, "pending"]], version=1)
    store.deliveries.record_many([(name, "fired", *record) for name, record in made.items()])
    body = list_incidents(store, IncidentFilter(), NOW).to_json("https://acme.slack.com")
    got = {i["alert_id"]: (i["slack_post"], i["slack_channel"], i["slack_ts"]) for i in body["incidents"]}
    assert got == {"refused": ("refused", None, None), "unrouted": ("not_routed", None, None),
                   "withdrawn": ("withdrawn", None, None), "snoozed": ("snoozed", None, None),
                   "webhook": ("posted", "webhook", None), "bot": ("posted", "C0123ABC", "1790000060.123456"),
                   "pending": ("pending", None, None)}  # fmt: skip
    page = render_page(list_incidents(store, IncidentFilter(), NOW), "https://acme.slack.com")
    assert page.count('<td class="slack">refused</td>') == 1 and page.count(">Slack</a>") == 1


def test_the_table_is_for_a_terminal(store):
    store.alerts.record([alert("a", 98.0, usd=1234.5, owner="\x1b]0;pwned\x07ines", rid="i-" + "0" * 60),
                         alert("b", 0.5, resolved_at=T0 + 600)], version=1)  # fmt: skip
    text = format_table(list_incidents(store, IncidentFilter(), NOW))
    lines = text.splitlines()
    assert lines[0].split() == ["STATE", "$/H", "$", "SO", "FAR", "AGE", "TEAM", "OWNER", "TYPE", "RESOURCE", "ID"]
    assert lines[1].split()[:4] == ["firing", "$98.00", "$1,234.50", "1h"]
    assert lines[2].split()[:4] == ["resolved", "-", "$10.00", "10m"]
    assert "\x1b" not in text and "\x07" not in text and "\\x1b]0;pwned\\x07ines" in text  # shown, not obeyed
    assert "i-" + "0" * 37 + "…" in text and "0" * 60 not in text  # long ids cut


def test_the_slack_workspace_setting_takes_only_a_web_address():
    assert load_settings(environ={"SLACK_WORKSPACE_URL": "https://acme.slack.com"}).slack_workspace_url == (
        "https://acme.slack.com")
    for bad in ("javascript:alert(1)", "https://acme.slack.com/\"><script>"):
        with pytest.raises(ValueError, match="SLACK_WORKSPACE_URL: String should match pattern"):
            load_settings(environ={"SLACK_WORKSPACE_URL": bad})


def test_nothing_to_show_says_so(store):
    assert format_table(list_incidents(store, IncidentFilter(open_only=True), NOW)) == "no open incidents\n"
    assert format_table(list_incidents(store, IncidentFilter(team="cv"), NOW)) == "no incidents for team cv\n"


def test_one_open_incident_whose_dollars_are_spent_is_said_so_in_one_line(store):
    """One open incident of a forecast type (its dollars not burning): '1 open incident ..., none burning now',
    not '1 open incidents ..., burning $0.00/h' (first-day evaluation)."""
    store.alerts.record([alert("filling", 0.2, usd=0.0, type_="storage_growth")], version=1)
    listed = list_incidents(store, IncidentFilter(open_only=True), NOW)
    assert summary(listed) == "1 open incident, none burning now"


def test_open_incidents_none_burning_are_said_spent_only_where_their_dollars_are(store):
    """'their dollars are spent' is a failed run's that has ended (the list's "sunk"), not a forecast's: a database
    filling up has spent nothing on it (the list's "-"), and cd5e66c said 'spent' of it too."""
    run = {"run_id": "r1", "status": "failed", "error": "OOM"}
    store.alerts.record([alert("run", 300.0, usd=900.0, type_="failed_run_spend", details=run)], version=1)
    assert summary(list_incidents(store, IncidentFilter(), NOW)) == "1 incident; 1 open, none burning now (their " \
                                                                     "dollars are spent)"  # fmt: skip
    store.alerts.record([alert("filling", 0.2, usd=0.0, type_="storage_growth")], version=2)
    assert summary(list_incidents(store, IncidentFilter(), NOW)) == "2 incidents; 2 open, none burning now"


def test_a_rate_under_half_a_cent_reads_as_in_slack_not_as_nothing(store):
    """An untagged 100 GB bucket burns $0.004 an hour: its Slack message says 'under $0.01/h' (e18aaf5), and the
    list, its summary and the page said '$0.00' and 'burning $0.00/h' of the same incident, as if it cost nothing."""
    store.alerts.record([alert("bucket", 0.004, usd=0.003)], version=1)
    listed = list_incidents(store, IncidentFilter(open_only=True), NOW)
    row = format_table(listed).splitlines()[1]
    assert row.startswith("firing  under $0.01  under $0.01  ") and "$0.00" not in row
    assert summary(listed) == "1 open incident, burning under $0.01/h"
    page = render_page(listed)
    assert "burning under $0.01/h" in page and "$0.00" not in page
