"""The unused_commitment detector on crafted commitment usage (as ``ingest focus --publish-usage`` sends it)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from detector.alerts import AlertManager, from_finding
from detector.backtest import backtest
from detector.detectors.episode import SILENT
from detector.engine import Engine
from detector.events import UsageEvent
from detector.rules import load_rules
from detector.slack import SlackNotifier
from detector.testing import LocalSlack
from tests.helpers import T0, at

DAY = 86_400.0
HOUR = 3600.0


def charge(t: float, used: float, unused: float, interval_s: float = DAY, rid: str = "sp-1") -> UsageEvent:
    """One commitment's charge period: ``used`` and ``unused`` dollars of its amortised cost."""
    return UsageEvent(
        ts=at(t), resource_id=rid, resource_type="commitment", provider="AWS", account="acct", region="us-east-1",
        pricing="reserved", interval_s=interval_s, cost_usd=unused,
        metrics={"commitment_used_usd": used, "commitment_unused_usd": unused},
        extra={"commitment_type": "Savings Plan", "commitment_name": "compute-sp-3yr"},
    )  # fmt: skip


def days(*pairs: tuple[float, float], start: float = T0) -> list[UsageEvent]:
    """Daily charge periods from ``start``: (used, unused) per day."""
    return [charge(start + i * DAY, used, unused) for i, (used, unused) in enumerate(pairs)]


def hourly(*pairs: tuple[float, float], start: float = T0) -> list[UsageEvent]:
    """The same days as :func:`days`, each as 24 hourly charge periods."""
    return [charge(start + i * DAY + h * HOUR, used / 24, unused / 24, HOUR)
            for i, (used, unused) in enumerate(pairs) for h in range(24)]  # fmt: skip


def findings(ruleset, events):
    return [f for f in Engine(ruleset).process(events) if f.type == "unused_commitment"]


def actions(found):
    return [(f.action, f.at, round(f.waste_usd, 2)) for f in found]


CASES = [
    # fully used for three days: nothing unused, nothing to say
    (days((100, 0), (100, 0), (100, 0)), []),
    # 30 % unused for a day: fires at the end of that (first complete) day with its $30
    (days((70, 30)), [("fire", T0 + DAY, 30.0)]),
    # 30 % unused but $6 a day, under the $10 floor: nothing
    (days((14, 6), (14, 6)), []),
    # 4 % unused ($40): a big bill, but under the 5 % share: nothing
    (days((960, 40)), []),
    # unused for two days, then fully used: fires, updates with the second day's dollars, resolves
    (days((70, 30), (60, 40), (100, 0)),
     [("fire", T0 + DAY, 30.0), ("update", T0 + 2 * DAY, 70.0), ("resolve", T0 + 3 * DAY, 70.0)]),
    # a used day between two unused ones: two episodes
    (days((70, 30), (100, 0), (70, 30)),
     [("fire", T0 + DAY, 30.0), ("resolve", T0 + 2 * DAY, 30.0), ("fire", T0 + 3 * DAY, 30.0)]),
    # every day read twice (a re-delivered export): counted once
    ([e for e in days((70, 30), (60, 40)) for e in (e, e)], [("fire", T0 + DAY, 30.0), ("update", T0 + 2 * DAY, 70.0)]),
    # out-of-order day: the third day arrives before the second; the days are judged in order
    ([days((70, 30), (60, 40), (50, 50))[i] for i in (0, 2, 1)],
     [("fire", T0 + DAY, 30.0), ("update", T0 + 2 * DAY, 70.0), ("update", T0 + 3 * DAY, 120.0)]),
    # hourly charge periods give the daily dollars
    (hourly((70, 30), (60, 40)), [("fire", T0 + DAY, 30.0), ("update", T0 + 2 * DAY, 70.0)]),
    # hourly, shuffled within each day and across the boundary: the same dollars and dates
    (sorted(hourly((70, 30), (60, 40)), key=lambda e: e.ts.timestamp() + random.Random(3).uniform(0, 6 * HOUR)),
     [("fire", T0 + DAY, 30.0), ("update", T0 + 2 * DAY, 70.0)]),
    # half a day read, then the whole day restated before it was complete: each period counts once, as restated
    (hourly((100, 0))[:12] + hourly((70, 30)), [("fire", T0 + DAY, 30.0)]),
    # a two-hour period across midnight is split between the days it covers
    (hourly((70, 30))[:23] + [charge(T0 + 23 * HOUR, 70 / 12, 30 / 12, 2 * HOUR)] + hourly((70, 30), start=T0 + DAY)[1:],
     [("fire", T0 + DAY, 30.0), ("update", T0 + 2 * DAY, 60.0)]),
]


@pytest.mark.parametrize("events,expected", CASES, ids=[
    "fully-used", "30pct-unused-a-day", "under-dollar-floor", "under-share", "resolves-when-used", "two-episodes",
    "duplicates", "out-of-order-day", "hourly", "hourly-shuffled", "reread-half-day", "across-midnight"])  # fmt: skip
def test_cases(ruleset, events, expected):
    assert actions(findings(ruleset, events)) == expected


def test_facts_and_dollars_of_a_firing(ruleset):
    (fire,) = findings(ruleset, days((70, 30)))
    assert fire.episode_start == T0 and fire.fired_at == T0 + DAY
    assert fire.usd_per_hour == pytest.approx(30 / 24)
    d = fire.details
    assert (d["commitment_type"], d["commitment_name"], d["unused_share"]) == ("Savings Plan", "compute-sp-3yr", 0.3)
    assert (d["day_used_usd"], d["day_unused_usd"]) == (70, 30)
    assert (d["min_unused_share"], d["min_unused_usd"]) == (5.0, 10.0)  # the rule's line, which the chart writes


def test_data_resuming_after_expire_after_resolves_as_expired_not_used(ruleset):
    """Data stops for three days (past ``expire_after``) and resumes used: the episode resolves as
    expired. The engine's state TTL is made longer than the gap here: past it (the shipped TTL is
    two days) the commitment starts afresh at its next event instead (below)."""
    engine = Engine(ruleset, state_ttl_s=5 * DAY)
    found = [f for f in engine.process(days((70, 30)) + days((100, 0), start=T0 + 4 * DAY)) if f.type == "unused_commitment"]
    assert actions(found) == [("fire", T0 + DAY, 30.0), ("resolve", T0 + DAY, 30.0)]
    assert found[-1].details["reason"] == "expired"
    found = findings(ruleset, days((70, 30), (100, 0)))
    assert found[-1].details["reason"] == "used"


def test_data_resuming_past_the_state_ttl_starts_the_commitment_afresh(ruleset):
    """The same gap with the shipped state TTL (two days of event time after the commitment's
    latest event): the commitment starts afresh when its data resumes (docs/architecture.md,
    Per-resource state), its episode resolved where its data stopped (``went_silent``), as in a
    worker whose sweep had reclaimed it. Daily data that stops for ``expire_after`` (2d) has been
    quiet three days since its latest event, the start of its last day: past the TTL first."""
    found = findings(ruleset, days((70, 30)) + days((100, 0), start=T0 + 4 * DAY))
    assert actions(found) == [("fire", T0 + DAY, 30.0), ("resolve", T0 + DAY, 30.0)]
    assert found[-1].details["reason"] == SILENT


def test_reread_after_judgement_is_not_counted(ruleset):
    engine = Engine(ruleset)
    events = days((70, 30), (60, 40))
    engine.process(events)
    engine.process(events)  # read again (a restart, a re-delivered bill)
    (open_episode,) = [f for f in engine.open_episodes() if f.type == "unused_commitment"]
    assert open_episode.waste_usd == pytest.approx(70.0)


def test_a_day_resumed_after_an_expiry_within_it_is_not_judged_again_nor_its_alert_reopened(tmp_path):
    """``expire_after`` shorter than a day: hourly data stops 10 h into a day and resumes 7 h later. The
    expiry judges the part-day (fires) and resolves; the rest of that day, once judged again, opened an
    episode with the same start, the resolved alert's id, whose fire and updates the alert manager
    drops as a replay's. A day is judged once: the next episode starts at the next day."""
    rules = tmp_path / "rules"
    shutil.copytree(Path(__file__).resolve().parent.parent / "rules", rules)
    text = (rules / "rules.yaml").read_text()
    assert text.count("expire_after: 2d") == 1
    (rules / "rules.yaml").write_text(text.replace("expire_after: 2d", "expire_after: 6h"))
    ruleset = load_rules(rules)
    found = findings(ruleset, hourly((70, 60))[:10] + hourly((70, 60))[17:] + hourly((70, 60), (70, 60), start=T0 + DAY))
    assert [f.action for f in found if f.action != "update"] == ["fire", "resolve", "fire"]
    assert found[0].episode_start == T0 and found[-1].episode_start == T0 + DAY
    alerts = AlertManager(ruleset=ruleset).handle(found)
    assert [a.change for a in alerts if a.change != "updated"] == ["fired", "resolved", "fired"]
    assert alerts[-1].status == "firing" and alerts[-1].alert_id != alerts[0].alert_id


def test_missing_used_figure_is_an_error_naming_the_field(ruleset):
    engine = Engine(ruleset)
    event = charge(T0, 70, 30)
    event.metrics = {}
    assert [f for f in engine.process([event]) if f.type == "unused_commitment"] == []
    assert engine.errors == {"unused-commitment": 1}


def test_for_must_be_whole_days():
    from detector.detectors.unused_commitment import UnusedCommitmentParams

    with pytest.raises(ValueError, match="whole days"):
        UnusedCommitmentParams.model_validate({"for": "12h"})


def test_through_backtest_from_published_json(ruleset, tmp_path):
    """The event as the bill ingest publishes it (unknown fields kept in ``extra``), through
    the decoder, aligner, engine and alert manager."""
    path = tmp_path / "bill.jsonl"
    with open(path, "w") as out:
        for i, (used, unused) in enumerate([(70.0, 30.0), (60.0, 40.0), (100.0, 0.0)]):
            value = {"ts": at(T0 + i * DAY).isoformat(), "resource_id": "sp-1", "resource_type": "commitment",
                     "provider": "AWS", "account": "acct", "region": "us-east-1", "pricing": "reserved",
                     "state": "running", "interval_s": DAY, "cost_usd": unused,
                     "metrics": {"commitment_used_usd": used, "commitment_unused_usd": unused},
                     "tags": {"team": "platform", "project": "commitments"},
                     "commitment_type": "Reserved Instance", "commitment_name": "p5-ri"}  # fmt: skip
            out.write(json.dumps({"topic": "resource-usage", "key": "sp-1", "value": value}) + "\n")
    result = backtest(path, ruleset)
    assert result.invalid == []
    (alert,) = [a for a in result.alerts if a.type == "unused_commitment"]
    assert alert.status == "resolved" and alert.waste_usd == pytest.approx(70.0)
    assert alert.details["commitment_name"] == "p5-ri" and alert.details["reason"] == "used"


def test_slack_message_names_the_commitment_dollars_and_step(ruleset):
    fire, update = findings(ruleset, days((70, 30), (60, 40)))
    alert = from_finding(update)
    with LocalSlack() as slack:
        SlackNotifier(token="xoxb-test", channel="#finops", base_url=slack.api_url, timeout=2).post(alert)
        (post,) = slack.calls("chat.postMessage")
    text = post.text_of_blocks()
    for expected in ("Unused commitment", "sp-1", "compute-sp-3yr", "Savings Plan", "$70.00", "40.0 %",
                     "$60.00 used, $40.00 unused", "Left unused so far", "size the next purchase"):  # fmt: skip
        assert expected in text, expected


def test_commitments_report_lists_unused_dollars_per_commitment_and_day(store):
    """The stored usage rows (``usd`` = the unused dollars), a day read twice counted once."""
    from detector.reports import run_report
    from detector.store.batch import EventBatch

    batch = EventBatch()
    batch.extend(days((70, 30), (60, 40)) + days((60, 40), start=T0 + DAY) + hourly((100, 0), start=T0 + 2 * DAY))
    store.events.insert(batch)
    rows = run_report(store, "commitments", 30 * DAY)
    got = [(str(r["day"]), r["commitment_name"], r["commitment_type"], r["used_usd"], r["unused_usd"], r["unused_pct"])
           for r in rows]  # fmt: skip
    assert got == [("2026-11-02", "compute-sp-3yr", "Savings Plan", 70.0, 30.0, 30.0),
                   ("2026-11-03", "compute-sp-3yr", "Savings Plan", 60.0, 40.0, 40.0),
                   ("2026-11-04", "compute-sp-3yr", "Savings Plan", 100.0, 0.0, 0.0)]  # fmt: skip
    assert run_report(store, "commitments", 30 * DAY, team="nobody") == []
