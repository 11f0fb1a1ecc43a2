"""The daily digest per channel: yesterday's waste by type and team, top offenders,
what could be saved, what is still open, and a bar chart.

A day's dollars are the waste ledger's (the store's ``waste_ledger``, which ``burnwatch
query waste`` reads too): each alert's dollars charged to the resource-hours they were
spent in, every dollar of a resource-hour to one category at most, so an episode spanning
midnight is split between the two days it burned and the day's total is never more than
what the resources cost (an untagged host's idle GPUs are not counted twice). "Could be
saved" (spot, a smaller instance) is a total of its own, never added to the waste.
The worker sends the digest of a day
once its stream has passed the day's end in event time (a replay gets the digests the
live stream got), and records it in ``digests`` so a restart does not send it twice.
``burnwatch digest --day`` prints or posts any day's.

Team names and resource ids come from events: the message escapes them
(:func:`detector.slack.escape`), and the chart shows a ``$`` in them as itself
rather than as the start of matplotlib math, which would fail the chart.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import msgspec

from detector.alerts import burning
from detector.detectors import REGISTRY
from detector.events import DAY_S
from detector.slack import code, escape
from detector.store.digests import Digests
from detector.units import epoch

__all__ = ["Digest", "build_digests", "digest_chart", "render_digest", "send_due_digests"]



@dataclass
class Digest:
    channel: str
    """'' = the notifier's default channel."""
    day: float
    """Start of the day (UTC midnight), epoch seconds."""
    by_type: dict[str, float] = field(default_factory=dict)
    """Waste by alert type (the ledger's kind ``waste``); :attr:`total` is their sum."""
    by_team: dict[str, float] = field(default_factory=dict)
    by_team_type: dict[tuple[str, str], float] = field(default_factory=dict)
    top: list[dict[str, Any]] = field(default_factory=list)
    incidents: int = 0
    open_incidents: int = 0
    open_usd_per_hour: float = 0.0
    """Burn rate of the open incidents: per resource the fastest of its incidents, since a
    host's idle GPUs and its untagged spend burn the same dollars. Those whose money is sunk
    (a failed run that has ended: ``DetectorBase.burning``) burn nothing now."""
    could_save: dict[str, float] = field(default_factory=dict)
    """What could have been saved that day by type (the ledger's kind ``could_save``)."""
    repriced: int = 0
    """Incidents of the day whose dollars the bill re-priced (``alert_billing``): their top
    offender line shows the billed figure beside what the alert said."""

    @property
    def total(self) -> float:
        return sum(self.by_type.values())

    @property
    def date(self) -> str:
        return datetime.fromtimestamp(self.day, tz=timezone.utc).strftime("%Y-%m-%d")


def build_digests(repo: Digests, day: float, top_n: int = 5) -> list[Digest]:
    """One digest per channel with activity in the UTC day starting at ``day``."""
    rows = repo.day_rows(day)
    digests: dict[str, Digest] = {}
    open_rates: dict[str, dict[str, float]] = {}
    for r in rows:
        d = digests.setdefault(r["channel"], Digest(channel=r["channel"], day=day))
        usd = max(0.0, float(r["usd"]))
        if r["kind"] != "waste":
            d.could_save[r["type"]] = d.could_save.get(r["type"], 0.0) + usd
            continue
        team = r["team"] or "(untagged)"
        d.by_type[r["type"]] = d.by_type.get(r["type"], 0.0) + usd
        d.by_team[team] = d.by_team.get(team, 0.0) + usd
        d.by_team_type[(team, r["type"])] = d.by_team_type.get((team, r["type"]), 0.0) + usd
        d.incidents += 1
        resolved = epoch(r["resolved_at"]) if r["resolved_at"] is not None else None
        still_open = r["status"] == "firing" or (resolved is not None and resolved >= day + DAY_S)
        if still_open:
            d.open_incidents += 1
            if not burning(r["type"], msgspec.json.decode(r["details"] or "{}")):
                continue
            rates = open_rates.setdefault(r["channel"], {})
            rates[r["resource_id"]] = max(rates.get(r["resource_id"], 0.0), r["usd_per_hour"])
        ratio = r.get("billed_ratio")
        billed = None if ratio is None else usd * float(ratio)
        d.repriced += billed is not None
        d.top.append({"resource_id": r["resource_id"], "type": r["type"], "team": team, "usd": usd,
                      "billed_usd": billed})
    for d in digests.values():
        d.open_usd_per_hour = sum(open_rates.get(d.channel, {}).values())
        d.top = sorted(d.top, key=lambda x: -x["usd"])[:top_n]
    return sorted(digests.values(), key=lambda d: d.channel)


def render_digest(d: Digest) -> list[dict[str, Any]]:
    def lines(pairs: dict[str, float]) -> str:
        return "\n".join(f"• {escape(k)}: *${v:,.2f}*" for k, v in sorted(pairs.items(), key=lambda kv: -kv[1]) if v >= 0.005)

    titles = {t: cls.title for t, cls in REGISTRY.items()}
    top = "\n".join(f"{i}. {code(o['resource_id'])} ({escape(titles.get(o['type'], o['type']))}, {escape(o['team'])}): "
                    + _dollars(o)
                    for i, o in enumerate(d.top, 1))  # fmt: skip
    return [
        {"type": "header", "text": {"type": "plain_text", "text": f"Cost waste on {d.date}: ${d.total:,.2f}"}},
        {"type": "section", "fields": [
            {"type": "mrkdwn", "text": "*By type*\n" + (lines({titles.get(k, k): v for k, v in d.by_type.items()}) or "_none_")},
            {"type": "mrkdwn", "text": "*By team*\n" + (lines(d.by_team) or "_none_")},
        ]},
        {"type": "section", "text": {"type": "mrkdwn", "text": "*Top offenders*\n" + (top or "_none_")}},
        *([{"type": "section", "text": {"type": "mrkdwn", "text": (
            f"*Could be saved* (apart from the waste): ${sum(d.could_save.values()):,.2f}\n"
            + lines({titles.get(k, k): v for k, v in d.could_save.items()}))}}] if d.could_save else []),
        {"type": "context", "elements": [{"type": "mrkdwn", "text": (
            f"{d.incidents} incidents burned money that day; {d.open_incidents} still open at its end, "
            f"${d.open_usd_per_hour:,.2f}/h. Dollars are each incident's share of that UTC day's bill, each "
            "dollar counted once (docs/architecture.md, Dollars)."
            + (f" {d.repriced} of {d.incidents} incidents re-priced from the bill (top offenders show what it "
               "charged; the totals stay the events' dollars)." if d.repriced else ""))}]},
    ]  # fmt: skip


def _dollars(o: dict[str, Any]) -> str:
    """An offender's dollars: the billed figure, and what the alert said, once the bill re-priced it."""
    if o.get("billed_usd") is None:
        return f"${o['usd']:,.2f}"
    return f"${o['billed_usd']:,.2f} billed (alert said ${o['usd']:,.2f})"


def digest_chart(d: Digest) -> bytes:
    """Bars per team, stacked by type."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    teams = sorted(d.by_team, key=lambda t: -d.by_team[t])[:12]
    types = sorted(d.by_type, key=lambda t: -d.by_type[t])
    labels = [team.replace("$", r"\$") for team in teams]  # a tag's "$" is text, not matplotlib math
    fig = Figure(figsize=(8, 3.4), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    bottom = [0.0] * len(teams)
    for rule_type in types:
        heights = [d.by_team_type.get((team, rule_type), 0.0) for team in teams]
        ax.bar(labels, heights, bottom=bottom, label=REGISTRY[rule_type].title if rule_type in REGISTRY else rule_type)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_ylabel("USD")
    ax.set_title(f"Cost waste by team on {d.date} (UTC)", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def send_due_digests(repo: Digests, notifier: Any, watermark: float, settle_s: float = 600.0) -> list[Digest]:
    """Post the digest of every finished day not yet sent: a day is finished once the
    stream's event time is ``settle_s`` past its end. The first day burnwatch sees is
    its first digest; days before it are not sent."""
    if watermark <= 0:
        return []
    last = repo.last_day()
    if last is None:
        repo.record(watermark - watermark % DAY_S - DAY_S, "", "")  # the day before the stream began
        return []
    sent: list[Digest] = []
    day = last + DAY_S
    while day + DAY_S + settle_s <= watermark:
        digests = build_digests(repo, day)
        for d in digests:
            channel, ts = notifier.post_digest(d, render_digest(d), digest_chart(d) if d.by_type else None)
            repo.record(day, d.channel, ts)
            sent.append(d)
        if not digests:
            repo.record(day, "", "")  # nothing burned that day: remembered, not posted
        day += DAY_S
    return sent
