"""Incidents re-priced from the bill: once a bill covers an episode, the incident's record
gains what the bill charged over the same hours, a restated bill replaces the figure, and the
daily digest shows the billed dollars and says so."""

from __future__ import annotations

import csv
from datetime import datetime, timezone
from pathlib import Path

import pytest

from detector.alerts import Alert
from detector.billing.ingest import ingest_files
from detector.billing.reprice import reprice
from detector.digest import build_digests, render_digest
from detector.limits import Limits
from detector.store import EventBatch
from tests.helpers import T0, fleet_file, store_fleet, usage

HOUR = 3600.0
FIXTURE = Path(__file__).parent / "data" / "focus" / "charges-1.2.csv"


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_bill(path: Path, hourly: dict[str, float], hours: int, category: str = "Usage", currency: str = "USD") -> Path:
    """A FOCUS 1.2 CSV: each resource billed ``hourly[rid]`` for each of ``hours`` hours from T0."""
    with open(FIXTURE, newline="") as f:
        header, template = list(csv.reader(f))[:2]
    col = {name: i for i, name in enumerate(header)}
    with open(path, "w", newline="") as out:
        w = csv.writer(out)
        w.writerow(header)
        for rid, usd in hourly.items():
            for k in range(hours):
                row = list(template)
                row[col["ResourceId"]] = rid
                row[col["ChargePeriodStart"]], row[col["ChargePeriodEnd"]] = iso(T0 + k * HOUR), iso(T0 + (k + 1) * HOUR)
                for c in ("BilledCost", "EffectiveCost", "ListCost", "ContractedCost"):
                    row[col[c]] = f"{usd:.2f}"
                row[col["ChargeCategory"]], row[col["BillingCurrency"]] = category, currency
                w.writerow(row)
    return path


def alert(alert_id: str, rid: str, start: float, end: float, usd: float) -> Alert:
    return Alert(alert_id=alert_id, type="idle_gpu", rule="idle_gpu", resource_id=rid, status="resolved",
                 change="resolved", severity="warning", episode_start=start, fired_at=start, updated_at=end,
                 resolved_at=end, waste_usd=usd, usd_per_hour=25.0, tags={"team": "nlp"})  # fmt: skip


@pytest.fixture
def incidents(store):
    """h1 and h2 claimed $50/h by their events for two days; an incident on each."""
    batch = EventBatch()
    batch.extend([usage(T0 + k * HOUR, rid, usd_per_hour=50.0, interval_s=HOUR) for rid in ("h1", "h2") for k in range(48)])
    store.events.insert(batch)
    store.alerts.record([
        alert("a", "h1", T0 + 2.5 * HOUR, T0 + 6.5 * HOUR, 100.0),  # 4 hours, half of what the events claimed
        alert("b", "h2", T0 + 7 * HOUR, T0 + 9 * HOUR, 50.0),  # the first bill stops an hour into it
    ], version=1)  # fmt: skip
    return store


def figures(store) -> dict[str, dict]:
    return {r["alert_id"]: r for r in store.query(f"SELECT * FROM {store.db}.alert_billing FINAL")}


def test_an_incident_gains_the_bills_prorated_dollars_and_a_restatement_replaces_them(incidents, tmp_path):
    first = ingest_files(incidents, write_bill(tmp_path / "bill-1.csv", {"h1": 40.0, "h2": 40.0}, hours=8))
    # h2's episode runs past the bill's last hour: left for a later bill
    assert reprice(incidents, first.ingest_id).repriced == 1
    (a,) = figures(incidents).values()
    assert a["alert_id"] == "a"
    assert a["claimed_usd"] == pytest.approx(200.0)  # 4 hours at $50, the first and last prorated by half
    assert a["billed_usd"] == pytest.approx(160.0)  # 4 hours at $40
    assert a["billed_waste_usd"] == pytest.approx(80.0)  # $100 x 160 / 200

    restated = ingest_files(incidents, write_bill(tmp_path / "bill-2.csv", {"h1": 30.0, "h2": 30.0}, hours=24))
    assert reprice(incidents, restated.ingest_id).repriced == 2
    now = figures(incidents)
    assert now["a"]["billed_usd"] == pytest.approx(120.0) and now["a"]["billed_waste_usd"] == pytest.approx(60.0)
    assert now["b"]["billed_waste_usd"] == pytest.approx(30.0)  # $50 x 60 / 100


@pytest.mark.parametrize(
    "others, waste",
    [
        ([("Credit", -300.0)], 80.0),  # a credit on the resource: netted in, the billed waste was -$220
        ([("Tax", 4.0), ("Adjustment", -10.0)], 80.0),
        ([("Usage", -70.0)], 0.0),  # a usage refund beyond the usage: nothing billed, never below
    ],
    ids=["credit", "tax-and-adjustment", "refund"],
)  # fmt: skip
def test_only_the_resources_usage_reprices_its_incident(incidents, tmp_path, others, waste):
    bill = tmp_path / "bill"
    bill.mkdir()
    write_bill(bill / "usage.csv", {"h1": 40.0}, hours=8)
    for i, (category, usd) in enumerate(others):
        write_bill(bill / f"other-{i}.csv", {"h1": usd}, hours=8, category=category)
    assert reprice(incidents, ingest_files(incidents, bill).ingest_id).repriced == 1
    assert figures(incidents)["a"]["billed_waste_usd"] == pytest.approx(waste)


def test_a_bill_beyond_the_limits_reprices_nothing_and_says_so(incidents, tmp_path):
    """A corrupt charge in a unit that is no hour (the reader bounds only hourly rates) would price
    the waste at it: an incident whose bill is over limits.yaml's max_usd_per_hour over its episode
    keeps its events' dollars and is counted; one within the limit is re-priced as before."""
    bill = tmp_path / "bill"
    bill.mkdir()
    write_bill(bill / "usage.csv", {"h1": 40.0, "h2": 40.0}, hours=24)
    with open(write_bill(bill / "gb.csv", {"h2": 1e11}, hours=24)) as f:  # $1e11 an hour of "Requests" on h2
        text = f.read()
    (bill / "gb.csv").write_text(text.replace(",Hours,", ",Requests,"))
    ingest = ingest_files(incidents, bill)
    assert ingest.rows == 72
    done = reprice(incidents, ingest.ingest_id, Limits(max_usd_per_hour=2000.0))
    assert (done.repriced, done.beyond_limits, done.some_beyond) == (1, 1, ["h2"])
    assert set(figures(incidents)) == {"a"} and figures(incidents)["a"]["billed_waste_usd"] == pytest.approx(80.0)
    assert reprice(incidents, ingest.ingest_id, Limits(max_usd_per_hour=1e12)).repriced == 2  # the user's limit is theirs


def _egress_incident(store) -> None:
    """e1 ran at $10/h for 8 hours and sent 100 GB an hour (its events priced the egress); an egress
    runaway on it for hours 2 to 6, its waste the egress."""
    import msgspec

    batch = EventBatch()
    batch.extend([msgspec.structs.replace(usage(T0 + k * HOUR, "e1", usd_per_hour=10.0, interval_s=HOUR),
                                          egress_bytes=100 * 10**9) for k in range(8)])  # fmt: skip
    store.events.insert(batch, store_pricing())
    (claimed,) = store.query(f"SELECT sum(egress_usd) AS egress FROM {store.db}.cost_hourly WHERE resource_id = 'e1'")
    assert claimed["egress"] > 0
    egress = Alert(alert_id="x", type="egress_runaway", rule="egress-runaway", resource_id="e1", status="resolved",
                   change="resolved", severity="warning", episode_start=T0 + 2 * HOUR, fired_at=T0 + 2 * HOUR,
                   updated_at=T0 + 6 * HOUR, resolved_at=T0 + 6 * HOUR, waste_usd=30.0, usd_per_hour=9.0,
                   tags={"team": "nlp"})  # fmt: skip
    store.alerts.record([egress], version=1)


def store_pricing():
    from detector.rules import load_pricing
    from tests.conftest import ROOT

    return load_pricing(ROOT / "rules" / "pricing.yaml")


def test_an_egress_incident_is_repriced_by_the_bills_network_charges_only(store, tmp_path):
    """Scaled by the instance's compute bill, $77.92 of egress was priced at $0.81: an egress incident
    compares the events' egress dollars with the bill's network charges, and a bill without them
    leaves it as its events priced it."""
    _egress_incident(store)
    compute = write_bill(tmp_path / "compute.csv", {"e1": 10.0}, hours=8)
    assert reprice(store, ingest_files(store, compute).ingest_id).repriced == 0 and figures(store) == {}
    network = tmp_path / "network.csv"
    text = write_bill(network, {"e1": 4.5}, hours=8).read_text()  # 100 GB an hour at $0.045
    network.write_text(text.replace(",Compute,", ",Networking,").replace(",Hours,Hours,", ",GB,GB,"))
    assert reprice(store, ingest_files(store, network).ingest_id).repriced == 1
    (x,) = figures(store).values()
    (claimed,) = store.query(f"SELECT sum(egress_usd) AS usd FROM {store.db}.cost_hourly "
                             f"WHERE resource_id = 'e1' AND hour >= toDateTime({T0 + 2 * HOUR}) "
                             f"AND hour < toDateTime({T0 + 6 * HOUR})")  # fmt: skip
    assert x["billed_usd"] == pytest.approx(4 * 4.5) and x["claimed_usd"] == pytest.approx(claimed["usd"])
    assert x["billed_waste_usd"] == pytest.approx(30.0 * 18.0 / claimed["usd"])


def test_an_egress_incident_is_bounded_by_the_egress_limit_not_the_hourly_one(store, tmp_path):
    """$5,000 of egress an hour is above max_usd_per_hour ($2,000, an instance's bound) but within what
    max_egress_gbit_per_s lets an hour of egress cost: re-priced, not called beyond the limits."""
    _egress_incident(store)
    network = tmp_path / "network.csv"
    text = write_bill(network, {"e1": 5000.0}, hours=8).read_text()
    network.write_text(text.replace(",Compute,", ",Networking,").replace(",Hours,Hours,", ",GB,GB,"))
    done = reprice(store, ingest_files(store, network).ingest_id, Limits())
    assert (done.repriced, done.beyond_limits) == (1, 0)
    tight = Limits(max_egress_gbit_per_s=1.0)  # 450 GB, $112.50 an hour at most
    assert reprice(store, ingest_files(store, network).ingest_id, tight).beyond_limits == 1


def test_a_days_charge_counts_the_hours_it_billed(incidents, tmp_path):
    """A daily bill (Azure's FOCUS export is daily): h1 billed $320 for the 8 hours it ran that day. The
    incident's 4 hours are half of those, $160, not 4/24 of the day ($53.33) as a period's share."""
    path = write_bill(tmp_path / "daily.csv", {"h1": 320.0}, hours=1)
    text = path.read_text().replace(iso(T0 + HOUR), iso(T0 + 24 * HOUR))  # one row over the whole day
    path.write_text(text.replace(",1,1,Hours,Hours,", ",8,8,Hours,Hours,"))
    assert reprice(incidents, ingest_files(incidents, path).ingest_id).repriced == 1
    a = figures(incidents)["a"]
    assert a["billed_usd"] == pytest.approx(160.0) and a["billed_waste_usd"] == pytest.approx(100.0 * 160 / 200)


def test_the_same_hours_billed_at_two_granularities_reprice_nothing_and_are_said(incidents, tmp_path):
    """An hourly export, then a daily one of the same day (both stored: their periods differ, so neither
    replaces the other): the daily charge's $320 was added to the hours' $160 over the episode, pricing
    the waste at three times the bill. Overlapping charges re-price nothing; the hourly figure stays."""
    hourly = ingest_files(incidents, write_bill(tmp_path / "hourly.csv", {"h1": 40.0, "h2": 40.0}, hours=8))
    assert reprice(incidents, hourly.ingest_id).repriced == 1
    path = write_bill(tmp_path / "daily.csv", {"h1": 320.0, "h2": 320.0}, hours=1)
    text = path.read_text().replace(iso(T0 + HOUR), iso(T0 + 24 * HOUR))  # one row over the whole day
    path.write_text(text.replace(",1,1,Hours,Hours,", ",8,8,Hours,Hours,"))
    daily = ingest_files(incidents, path)
    assert daily.overlapping == 2  # said at the ingest
    done = reprice(incidents, daily.ingest_id)
    assert (done.overlapping, sorted(done.some_overlapping)) == (2, ["h1", "h2"])
    assert figures(incidents)["a"]["billed_usd"] == pytest.approx(160.0)  # the hourly bill's, not $160 + $160
    assert set(figures(incidents)) == {"a"}


def test_an_hours_charge_billing_more_hours_than_it_lasts_is_that_hours(incidents, tmp_path):
    """An hourly row billing 8 GPU-hours (GPUs x hours, as Google's export counts them) is its hour's charge:
    the episode's 4 hours at $40 are $160, where the share of 8 billed hours had made them $20."""
    path = write_bill(tmp_path / "gpu.csv", {"h1": 40.0}, hours=8)
    path.write_text(path.read_text().replace(",1,1,Hours,Hours,", ",8,8,Hours,Hours,"))
    assert reprice(incidents, ingest_files(incidents, path).ingest_id).repriced == 1
    assert figures(incidents)["a"]["billed_usd"] == pytest.approx(160.0)


@pytest.mark.parametrize("quantity", ["-8", ""])
def test_a_refund_cancels_its_charge_whatever_quantity_it_states(incidents, tmp_path, quantity):
    """A day's $320 for 8 hours and its -$320 correction (its quantity negative, or not given): the bill
    charged nothing (shared by hours and by the period, the two had left $106.67)."""
    bill = tmp_path / "bill"
    bill.mkdir()
    for name, usd, hours in (("daily.csv", 320.0, "8"), ("refund.csv", -320.0, quantity)):
        path = write_bill(bill / name, {"h1": usd}, hours=1)
        text = path.read_text().replace(iso(T0 + HOUR), iso(T0 + 24 * HOUR))
        path.write_text(text.replace(",1,1,Hours,Hours,", f",{hours},{hours},Hours,Hours,"))
    assert reprice(incidents, ingest_files(incidents, bill).ingest_id).repriced == 1
    assert figures(incidents)["a"]["billed_usd"] == pytest.approx(0.0, abs=1e-9)


def test_a_bill_in_another_currency_reprices_nothing(incidents, tmp_path):
    """Stored for queries, as the user asked; its figures are no dollars."""
    bill = ingest_files(incidents, write_bill(tmp_path / "eur.csv", {"h1": 40.0}, hours=8, currency="EUR"), currency="EUR")
    assert bill.rows == 8 and reprice(incidents, bill.ingest_id).repriced == 0 and figures(incidents) == {}


def test_the_digest_shows_billed_dollars_and_says_how_many_were_repriced(incidents, tmp_path):
    bill = ingest_files(incidents, write_bill(tmp_path / "bill.csv", {"h1": 40.0}, hours=8))
    reprice(incidents, bill.ingest_id)
    (d,) = build_digests(incidents.digests, T0)
    assert d.incidents == 2 and d.repriced == 1
    top = {o["resource_id"]: o for o in d.top}
    assert top["h1"]["billed_usd"] == pytest.approx(80.0) and top["h1"]["usd"] == pytest.approx(100.0)
    assert "billed_usd" not in top["h2"] or top["h2"]["billed_usd"] is None
    text = str(render_digest(d))
    assert "$80.00 billed (alert said $100.00)" in text
    assert "1 of 2 incidents re-priced from the bill" in text


def test_a_billed_figure_equal_to_the_alerts_is_said_once():
    from detector.digest import offender_dollars

    assert offender_dollars({"usd": 12.5, "billed_usd": 12.5}) == "$12.50 billed (the alert said so too)"
    assert offender_dollars({"usd": 12.5, "billed_usd": None}) == "$12.50"


def test_ingest_focus_says_how_many_incidents_it_repriced(tmp_path):
    """The CLI re-prices after storing the bill, against a store on disk (no incidents there yet)."""
    from tests.test_cli import burnwatch, no_traceback

    env = {"BURNWATCH_DATA_DIR": str(tmp_path / "data"), "BURNWATCH_EVENT_TTL_DAYS": "0"}
    assert burnwatch("db", "migrate", env=env).returncode == 0
    out = burnwatch("ingest", "focus", str(write_bill(tmp_path / "bill.csv", {"h1": 40.0}, hours=2)), env=env)
    no_traceback(out)
    assert out.returncode == 0, out.stderr
    assert "re-priced 0 incident(s) from the bill" in out.stdout


def test_ingest_focus_making_the_store_gives_it_the_default_expiry(tmp_path):
    """Ingesting the bill first (a natural first step) made the store with its raw events kept forever,
    silently, and a worker started on the default never changed it."""
    from tests.test_cli import burnwatch, no_traceback

    env = {"BURNWATCH_DATA_DIR": str(tmp_path / "data")}
    out = burnwatch("ingest", "focus", str(write_bill(tmp_path / "bill.csv", {"h1": 40.0}, hours=2)), env=env)
    no_traceback(out)
    assert out.returncode == 0 and "created the store; raw events kept 30 days of event time" in out.stderr, out.stderr
    out = burnwatch("db", "migrate", env=env)
    assert out.returncode == 0 and "raw events kept 30 days of event time" in out.stdout, out.stdout


def test_a_simulated_fleets_incidents_are_repriced_at_what_its_bill_charged(store, ruleset, tmp_path):
    """The simulator's fleet through the real pipeline, then the bill it writes: every incident
    the bill covers is re-priced at the bill's dollars over its episode, reckoned here from
    the file itself: each usage charge of the incident's kind (network charges for egress, the
    others for the rest) counts the share of the hours it billed that the episode overlaps, or of
    its period where it bills no hours."""
    from detector.billing.focus import read_focus
    from detector.billing.rates import HOUR_UNITS
    from detector.simulate import SimConfig
    from detector.simulate_focus import simulate_focus, write_focus
    from detector.units import epoch

    cfg = SimConfig(hours=30, training_hosts=6, notebooks=8, seed=9)
    store_fleet(store, ruleset, fleet_file(tmp_path / "fleet.jsonl", cfg, ruleset.pricing)[0])
    path = write_focus(simulate_focus(cfg, ruleset.pricing), tmp_path / "bill.parquet")
    n = reprice(store, ingest_files(store, path).ingest_id).repriced
    repriced = figures(store)
    assert n == len(repriced) > 0
    types = {r["alert_id"]: r["type"] for r in store.query(f"SELECT alert_id, type FROM {store.db}.alerts FINAL")}
    rows = read_focus(path).to_pylist()
    for r in repriced.values():
        s, e = epoch(r["episode_start"]), epoch(r["episode_end"])  # naive UTC: .timestamp() reads the machine's zone
        egress = types[r["alert_id"]] == "egress_runaway"
        expected = 0.0
        for c in rows:
            network = c["service_category"] == "Networking" or c["consumed_unit"] in ("GB", "GiB", "Bytes")
            if c["resource_id"] != r["resource_id"] or c["charge_category"] != "Usage" or network != egress:
                continue
            start, end = c["charge_period_start"].timestamp(), c["charge_period_end"].timestamp()
            overlap = max(0.0, min(e, end) - max(s, start))
            used = float(c["consumed_quantity"] or 0) * 3600 if c["consumed_unit"] in HOUR_UNITS else 0.0
            expected += float(c["effective_cost"]) * (min(1.0, overlap / used) if used > 0 else overlap / (end - start))
        assert r["billed_usd"] == pytest.approx(expected, rel=1e-9, abs=1e-9), r["alert_id"]
