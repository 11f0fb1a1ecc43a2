"""The daily digest per channel: yesterday's waste by type and team, top offenders,
what is still open, and a bar chart.

A day's dollars are the growth of each alert's dollars within the day (the store's
``waste_by_day``, which ``burnwatch query waste`` reads too), so an episode spanning
midnight is split between the two days it burned. The worker sends the digest of a day
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

from detector.detectors import REGISTRY, money_types
from detector.events import DAY_S
from detector.slack import code, escape
from detector.units import epoch

__all__ = ["Digest", "build_digests", "digest_chart", "render_digest", "send_due_digests"]



@dataclass
class Digest:
    channel: str
    """'' = the notifier's default channel."""
    day: float
    """Start of the day (UTC midnight), epoch seconds."""
    by_type: dict[str, float] = field(default_factory=dict)
    by_team: dict[str, float] = field(default_factory=dict)
    by_team_type: dict[tuple[str, str], float] = field(default_factory=dict)
    top: list[dict[str, Any]] = field(default_factory=list)
    incidents: int = 0
    open_incidents: int = 0
    open_usd_per_hour: float = 0.0

    @property
    def total(self) -> float:
        return sum(self.by_type.values())

    @property
    def date(self) -> str:
        return datetime.fromtimestamp(self.day, tz=timezone.utc).strftime("%Y-%m-%d")


def build_digests(store: Any, day: float, top_n: int = 5) -> list[Digest]:
    """One digest per channel with activity in the UTC day starting at ``day``."""
    rows = store.query(
        f"""SELECT a.alert_id AS alert_id, a.type AS type, a.resource_id AS resource_id, a.channel AS channel,
                   a.tags['team'] AS team, a.status AS status, a.usd_per_hour AS usd_per_hour,
                   a.resolved_at AS resolved_at, w.usd AS usd
            FROM (SELECT alert_id, usd FROM {store.db}.waste_by_day
                  WHERE day = %(day)s) AS w
            INNER JOIN (SELECT * FROM {store.db}.alerts FINAL) AS a ON a.alert_id = w.alert_id
            WHERE a.type IN %(types)s AND a.silenced = ''""",
        {"day": datetime.fromtimestamp(day, tz=timezone.utc).date(), "types": money_types()},
    )
    digests: dict[str, Digest] = {}
    for r in rows:
        d = digests.setdefault(r["channel"], Digest(channel=r["channel"], day=day))
        team = r["team"] or "(untagged)"
        usd = max(0.0, float(r["usd"]))
        d.by_type[r["type"]] = d.by_type.get(r["type"], 0.0) + usd
        d.by_team[team] = d.by_team.get(team, 0.0) + usd
        d.by_team_type[(team, r["type"])] = d.by_team_type.get((team, r["type"]), 0.0) + usd
        d.incidents += 1
        resolved = epoch(r["resolved_at"]) if r["resolved_at"] is not None else None
        still_open = r["status"] == "firing" or (resolved is not None and resolved >= day + DAY_S)
        if still_open:
            d.open_incidents += 1
            d.open_usd_per_hour += r["usd_per_hour"]
        d.top.append({"resource_id": r["resource_id"], "type": r["type"], "team": team, "usd": usd})
    for d in digests.values():
        d.top = sorted(d.top, key=lambda x: -x["usd"])[:top_n]
    return sorted(digests.values(), key=lambda d: d.channel)


def render_digest(d: Digest) -> list[dict[str, Any]]:
    def lines(pairs: dict[str, float]) -> str:
        return "\n".join(f"• {escape(k)}: *${v:,.2f}*" for k, v in sorted(pairs.items(), key=lambda kv: -kv[1]) if v >= 0.005)

    titles = {t: cls.title for t, cls in REGISTRY.items()}
    top = "\n".join(f"{i}. {code(o['resource_id'])} ({escape(titles.get(o['type'], o['type']))}, {escape(o['team'])}): "
                    f"${o['usd']:,.2f}"
                    for i, o in enumerate(d.top, 1))  # fmt: skip
    return [
        {"type": "header", "text": {"type": "plain_text", "text": f"Cost waste on {d.date}: ${d.total:,.2f}"}},
        {"type": "section", "fields": [
            {"type": "mrkdwn", "text": "*By type*\n" + (lines({titles.get(k, k): v for k, v in d.by_type.items()}) or "_none_")},
            {"type": "mrkdwn", "text": "*By team*\n" + (lines(d.by_team) or "_none_")},
        ]},
        {"type": "section", "text": {"type": "mrkdwn", "text": "*Top offenders*\n" + (top or "_none_")}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": (
            f"{d.incidents} incidents burned money that day; {d.open_incidents} still open at its end, "
            f"${d.open_usd_per_hour:,.2f}/h. Dollars are each incident's growth within the UTC day.")}]},
    ]  # fmt: skip


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


def send_due_digests(store: Any, notifier: Any, watermark: float, settle_s: float = 600.0) -> list[Digest]:
    """Post the digest of every finished day not yet sent: a day is finished once the
    stream's event time is ``settle_s`` past its end. The first day burnwatch sees is
    its first digest; days before it are not sent."""
    if watermark <= 0:
        return []
    last = store.last_digest_day()
    if last is None:
        store.record_digest(watermark - watermark % DAY_S - DAY_S, "", "")  # the day before the stream began
        return []
    sent: list[Digest] = []
    day = last + DAY_S
    while day + DAY_S + settle_s <= watermark:
        digests = build_digests(store, day)
        for d in digests:
            channel, ts = notifier.post_digest(d, render_digest(d), digest_chart(d) if d.by_type else None)
            store.record_digest(day, d.channel, ts)
            sent.append(d)
        if not digests:
            store.record_digest(day, "", "")  # nothing burned that day: remembered, not posted
        day += DAY_S
    return sent
