"""The idle_notebook detector on crafted usage sequences: a CPU notebook's Jupyter activity as exporters
read it (``metrics.last_activity``, ``metrics.kernels_busy``), stops, GPUs, late and hostile readings."""

from __future__ import annotations

import msgspec
import pytest

from detector.alerts import AlertManager
from detector.detectors.idle_notebook import IdleNotebook
from detector.engine import Engine
from detector.events import UsageEvent
from tests.helpers import MIN, T0, at, scrape

HOUR = 3600.0
RATE = 0.384  # m6i.2xlarge's list price, $/h (rules/pricing.yaml): no GPUs


def nb(t: float, last: float | None = None, busy: float | None = None, state: str = "running", rid: str = "nb-1",
       interval_s: float = 300.0, instance_type: str = "m6i.2xlarge", **metrics: float) -> UsageEvent:
    """A notebook's usage interval from ``t``, with Jupyter's last activity as read at its end."""
    if last is not None:
        metrics["last_activity"] = last
    if busy is not None:
        metrics["kernels_busy"] = busy
    return UsageEvent(ts=at(t), resource_id=rid, resource_type="notebook", instance_type=instance_type, account="acct",
                      region="us-east-1", state=state, interval_s=interval_s, metrics=metrics,
                      tags={"team": "research", "owner": "hiro", "project": "nb"})  # fmt: skip


def quiet(start: float, end: float, last: float, step: float = 300.0, **kw) -> list[UsageEvent]:
    """Intervals every ``step`` from ``start`` to ``end``, each reading the same last activity."""
    return [nb(start + i * step, last, **kw) for i in range(int((end - start) // step))]


def findings(ruleset, events, engine: Engine | None = None):
    return [f for f in (engine if engine is not None else Engine(ruleset)).process(events) if f.type == "idle_notebook"]


def opened_and_closed(found):
    return [f for f in found if f.action != "update"]


def test_fires_after_three_hours_without_activity_and_resolves_when_someone_comes_back(ruleset):
    """Idle from 18:00 (the last activity, read at every interval since), alerted at 21:00, resolved
    by the activity at 08:10 the next morning, priced for the 14 h 10 m between at the list price."""
    evening = T0 + 18 * HOUR
    morning = evening + 14 * HOUR + 10 * MIN
    events = quiet(evening - HOUR, morning, last=evening - 2 * MIN)  # (a minute's typing before 18:00 read as 17:58)
    events += quiet(morning, morning + HOUR, last=morning, step=300.0)
    (fire, resolve) = opened_and_closed(findings(ruleset, events))
    assert fire.action == "fire" and fire.episode_start == evening - 2 * MIN
    assert fire.fired_at == evening - 2 * MIN + 3 * HOUR and fire.usd_per_hour == pytest.approx(RATE)
    assert fire.details["last_activity"] == evening - 2 * MIN
    assert resolve.action == "resolve" and resolve.details["reason"] == "notebook_active" and resolve.at == morning
    assert resolve.waste_usd == pytest.approx(RATE * (morning - (evening - 2 * MIN)) / HOUR, rel=1e-6)
    facts = dict(IdleNotebook.facts(fire.details))
    assert facts == {"Last activity": "2026-11-02 17:58 UTC"}


def test_an_alert_names_the_owner_and_the_next_step(ruleset):
    events = quiet(T0, T0 + 4 * HOUR, last=T0)
    alerts = AlertManager(ruleset=ruleset).handle(findings(ruleset, events))
    alert = alerts[0]
    assert alert.tags["team"] == "research" and alert.tags["owner"] == "hiro"
    assert "idle shutdown" in IdleNotebook.suggest(alert.details)


@pytest.mark.parametrize(
    "events",
    [
        quiet(T0, T0 + 2 * HOUR + 50 * MIN, last=T0),  # idle under 3 hours
        [nb(T0 + i * 300, last=T0 + i * 300 + 200) for i in range(60)],  # someone works in it all along
        [nb(T0 + i * 300, last=T0, busy=1) for i in range(60)],  # a cell computing for 5 hours, printing nothing
        [nb(T0 + i * 300) for i in range(60)],  # no activity figures: silence is not evidence
        quiet(T0, T0 + 5 * HOUR, last=T0, state="stopped"),  # stopped: nothing billed
        quiet(T0, T0 + 5 * HOUR, last=T0, instance_type="g5.xlarge"),  # a GPU notebook: idle-gpu's
    ],
    ids=["under-3h", "active", "busy-kernel", "no-figures", "stopped", "gpu-instance-type"],
)
def test_no_alert(ruleset, events):
    assert findings(ruleset, events) == []


def test_a_busy_kernel_ends_the_spell_and_idle_counts_from_the_end_of_its_interval(ruleset):
    """A job started at 01:00 in a notebook idle since midnight computes till 02:00: the spell it ended
    resolves with it (not fired: an hour), the next one starts where the kernel was last seen busy."""
    events = quiet(T0, T0 + HOUR, last=T0) + [nb(T0 + HOUR + i * 300, last=T0 + HOUR, busy=1) for i in range(12)]
    events += quiet(T0 + 2 * HOUR, T0 + 6 * HOUR, last=T0 + HOUR)
    (fire,) = opened_and_closed(findings(ruleset, events))
    assert fire.episode_start == T0 + 2 * HOUR and fire.fired_at == T0 + 5 * HOUR


def test_a_night_stopped_is_not_idle_time(ruleset):
    """Stopped at 19:00 with its last activity at 18:00, started at 08:00: idle from 08:00, not from 18:00
    the day before, and the stop resolved nothing that had not fired."""
    events = quiet(T0 + 18 * HOUR, T0 + 19 * HOUR, last=T0 + 18 * HOUR)
    events += quiet(T0 + 19 * HOUR, T0 + 32 * HOUR, last=T0 + 18 * HOUR, state="stopped")
    events += quiet(T0 + 32 * HOUR, T0 + 36 * HOUR, last=T0 + 18 * HOUR)
    (fire,) = opened_and_closed(findings(ruleset, events))
    assert fire.episode_start == T0 + 32 * HOUR and fire.fired_at == T0 + 35 * HOUR
    assert fire.waste_usd == pytest.approx(RATE * 3, rel=1e-6)  # the three billed hours since the start


def test_a_stop_resolves_what_fired(ruleset):
    events = quiet(T0, T0 + 4 * HOUR, last=T0) + [nb(T0 + 4 * HOUR, state="stopped")]
    (fire, resolve) = opened_and_closed(findings(ruleset, events))
    assert resolve.details["reason"] == "instance_stopped" and resolve.at == T0 + 4 * HOUR
    assert resolve.waste_usd == pytest.approx(RATE * 4, rel=1e-6)


def test_activity_heard_late_takes_back_what_it_predates(ruleset):
    """JupyterHub hears of a server's activity every 5 minutes: the reading at 03:00 still says midnight,
    the next says 02:57. In time order the spell lasted 2 h 57 m and never fired: withdrawn, no dollars."""
    events = quiet(T0, T0 + 3 * HOUR, last=T0) + [nb(T0 + 3 * HOUR, last=T0 + 2 * HOUR + 57 * MIN)]
    (fire, resolve) = opened_and_closed(findings(ruleset, events))
    assert fire.fired_at == T0 + 3 * HOUR
    assert resolve.details["reason"] == "withdrawn" and resolve.at == T0 + 2 * HOUR + 57 * MIN
    assert resolve.waste_usd == 0
    alerts = AlertManager(ruleset=ruleset).handle([fire, resolve])
    assert alerts[-1].status == "resolved" and alerts[-1].withdrawn


def test_activity_heard_late_after_the_fire_is_priced_to_that_activity(ruleset):
    events = quiet(T0, T0 + 5 * HOUR, last=T0) + [nb(T0 + 5 * HOUR, last=T0 + 4 * HOUR + 58 * MIN)]
    (_, resolve) = opened_and_closed(findings(ruleset, events))
    assert resolve.details["reason"] == "notebook_active" and resolve.at == T0 + 4 * HOUR + 58 * MIN
    assert resolve.waste_usd == pytest.approx(RATE * (4 * HOUR + 58 * MIN) / HOUR, rel=1e-6)


def test_a_gpu_sample_makes_it_idle_gpus_and_resolves_what_fired(ruleset):
    events = quiet(T0, T0 + 4 * HOUR, last=T0)
    events.append(scrape(T0 + 4 * HOUR, [0.0], rid="nb-1")[0])
    events += quiet(T0 + 4 * HOUR, T0 + 10 * HOUR, last=T0)
    (fire, resolve) = opened_and_closed(findings(ruleset, events))
    assert resolve.details["reason"] == "has_gpus" and resolve.at == T0 + 4 * HOUR


def test_hourly_usage_is_priced_for_the_idle_share_of_the_interval_the_spell_began_in(ruleset):
    """Hourly intervals (a billing export), the last activity at 00:20: the first hour counts 40 minutes."""
    events = quiet(T0, T0 + 5 * HOUR, last=T0 + 20 * MIN, step=HOUR, interval_s=HOUR)
    engine = Engine(ruleset)
    (fire,) = opened_and_closed(findings(ruleset, events, engine))
    assert fire.fired_at == T0 + 3 * HOUR + 20 * MIN
    (open_now,) = [f for f in engine.open_episodes() if f.type == "idle_notebook"]
    assert open_now.waste_usd == pytest.approx(RATE * (5 * HOUR - 20 * MIN) / HOUR, rel=1e-6)


def test_re_read_and_out_of_order_intervals_change_nothing(ruleset):
    events = quiet(T0, T0 + 5 * HOUR, last=T0)
    once, again = Engine(ruleset), Engine(ruleset)
    first = findings(ruleset, events, once)
    second = findings(ruleset, events, again) + findings(ruleset, events[10:], again)
    second += findings(ruleset, [nb(T0 + 100 * MIN, last=T0 + 100 * MIN)], again)  # an old reading, read late
    assert first == second
    assert [f.waste_usd for f in once.open_episodes() if f.type == "idle_notebook"] == \
           [f.waste_usd for f in again.open_episodes() if f.type == "idle_notebook"]  # fmt: skip


@pytest.mark.parametrize("last", [1e15, -1e9, 0.0], ids=["far-future", "negative", "epoch"])
def test_absurd_readings_give_no_absurd_alert(ruleset, last):
    """A clock far ahead reads as active now; one at or before 1970 dates the spell from the first interval
    seen, never from 1970, and the message shows no such date."""
    found = findings(ruleset, quiet(T0, T0 + 4 * HOUR, last=last))
    if last > T0:
        assert found == []
        return
    (fire,) = opened_and_closed(found)
    assert fire.episode_start == T0 and fire.fired_at == T0 + 3 * HOUR
    assert IdleNotebook.facts(fire.details) == []  # (no "Last activity 1970-01-01")


def test_the_slack_message_says_since_when_and_what_to_do(ruleset):
    from detector.slack import render_blocks

    alerts = AlertManager(ruleset=ruleset).handle(findings(ruleset, quiet(T0, T0 + 4 * HOUR, last=T0 + 5 * MIN)))
    text = str(render_blocks(alerts[0]))
    assert "Idle notebooks" in text and "2026-11-02 00:05 UTC" in text and "idle shutdown" in text
    assert "$0.38" in text  # an hour of it


def test_a_late_interval_of_the_notebook_s_old_gpu_instance_type_changes_nothing(ruleset):
    """A g5 notebook resized to m6i at 01:00, idle since: an hour-0 interval read again (its type then had GPUs)
    is a re-read, not news that the notebook has GPUs: the open alert stays open."""
    events = [nb(T0 + i * 300, last=T0, instance_type="g5.xlarge") for i in range(12)]
    events += quiet(T0 + HOUR, T0 + 5 * HOUR, last=T0 + HOUR)
    engine = Engine(ruleset)
    (fire,) = opened_and_closed(findings(ruleset, events, engine))
    assert fire.episode_start == T0 + HOUR
    assert findings(ruleset, [nb(T0 + 300, last=T0, instance_type="g5.xlarge")], engine) == []
    assert [f.episode_start for f in engine.open_episodes() if f.type == "idle_notebook"] == [T0 + HOUR]


def test_a_stop_read_late_withdraws_what_in_time_order_never_lasted_three_hours(ruleset):
    """Idle from midnight, stopped 02:00-02:05, running again since: in time order the spell began anew
    at 02:05 and no alert by 04:00. The stop read after the intervals to 04:00 withdraws the 03:00 fire."""
    before, after = quiet(T0, T0 + 2 * HOUR, last=T0), quiet(T0 + 2 * HOUR + 300, T0 + 4 * HOUR, last=T0)
    stop = nb(T0 + 2 * HOUR, state="stopped")
    assert findings(ruleset, before + [stop] + after) == []
    engine = Engine(ruleset)
    found = opened_and_closed(findings(ruleset, before + after + [stop], engine))
    assert [f.action for f in found] == ["fire", "resolve"] and found[-1].details["reason"] == "withdrawn"
    assert AlertManager(ruleset=ruleset).handle(found)[-1].withdrawn
    assert [f for f in engine.open_episodes() if f.type == "idle_notebook"] == []
    (fire,) = opened_and_closed(findings(ruleset, quiet(T0 + 4 * HOUR, T0 + 6 * HOUR, last=T0), engine))
    assert fire.episode_start == T0 + 2 * HOUR + 300  # the spell after the stop, as in time order


def test_a_stop_read_late_after_the_fire_resolves_there_with_the_dollars_before_it(ruleset):
    events = quiet(T0, T0 + 4 * HOUR, last=T0) + quiet(T0 + 4 * HOUR + 300, T0 + 5 * HOUR, last=T0)
    found = opened_and_closed(findings(ruleset, events + [nb(T0 + 4 * HOUR, state="stopped")]))
    assert [f.action for f in found] == ["fire", "resolve"]
    assert found[-1].details["reason"] == "instance_stopped" and found[-1].at == T0 + 4 * HOUR
    assert found[-1].waste_usd <= RATE * 4 + 1e-6


def test_activity_heard_late_takes_back_no_less_than_was_counted_when_the_price_changed(ruleset):
    """Billed $10 a 5-minute interval until 04:00, then $0.001 (cost_usd, as a billing export says):
    activity at 03:30 heard at 04:00. The spell's bill is 42 intervals, $420: never more."""
    dear = [msgspec.structs.replace(e, cost_usd=10.0) for e in quiet(T0, T0 + 4 * HOUR, last=T0)]
    cheap = msgspec.structs.replace(nb(T0 + 4 * HOUR, last=T0 + 3.5 * HOUR), cost_usd=0.001)
    (_, resolve) = opened_and_closed(findings(ruleset, dear + [cheap]))
    assert resolve.details["reason"] == "notebook_active" and resolve.at == T0 + 3.5 * HOUR
    assert resolve.waste_usd <= 420.0 + 1e-6


@pytest.mark.parametrize("ending", ["busy", "stopped", "active"])
def test_an_interval_counted_past_the_end_of_the_spell_is_taken_back(ruleset, ending):
    """Hourly intervals (a billing export); a 5-minute interval at 04:30 (the exporter's own) ends the
    spell there: the hour 04:00-05:00 counted in full is counted to 04:30 only."""
    events = quiet(T0, T0 + 5 * HOUR, last=T0, step=HOUR, interval_s=HOUR)
    t = T0 + 4.5 * HOUR
    events.append({"busy": nb(t, last=T0, busy=1), "stopped": nb(t, state="stopped"),
                   "active": nb(t, last=t + 60)}[ending])  # fmt: skip
    (_, resolve) = opened_and_closed(findings(ruleset, events))
    assert resolve.waste_usd <= RATE * (resolve.at - T0) / HOUR + 1e-6


def test_after_an_interval_of_a_type_with_gpus_the_spell_starts_anew(ruleset):
    """Idle from midnight on m6i, an interval on g5 at 04:00 (resized), m6i again from 04:05 with the same last
    activity: the alert resolved at 04:00 (has_gpus) stays resolved, and the spell after the resize is one of
    its own, from 04:05 (the same start would be the same alert id: its fire, after the resolve, lost)."""
    events = quiet(T0, T0 + 4 * HOUR, last=T0) + [nb(T0 + 4 * HOUR, last=T0, instance_type="g5.xlarge")]
    events += quiet(T0 + 4 * HOUR + 300, T0 + 8 * HOUR, last=T0)
    found = opened_and_closed(findings(ruleset, events))
    assert [(f.action, f.episode_start) for f in found] == [("fire", T0), ("resolve", T0), ("fire", T0 + 4 * HOUR + 300)]
    assert found[1].details["reason"] == "has_gpus"
