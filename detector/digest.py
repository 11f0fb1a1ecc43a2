"""The daily digest per channel, a picture of the day: its waste by type and team, the top
offenders, what was fixed (and by whom or what), what stayed open (and how fast it burns),
what could be saved, and one chart of the last days' waste with the day outlined
(:mod:`detector.charts.digest`).

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

Team names and resource ids come from events: the message escapes and clips them
(:func:`detector.slack.escape`, :mod:`detector.blockkit`: a big team's digest still fits
Slack's limits, saying how many more it left out), and the chart shows a ``$`` in them as
itself rather than as the start of matplotlib math, which would fail the chart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import msgspec

from detector.alerts import burning
from detector.blockkit import MAX_HEADER_TEXT, MAX_NOTIFICATION_TEXT, clip, clip_lines, fit
from detector.detectors import REGISTRY
from detector.events import DAY_S
from detector.pricing import HOURS_PER_MONTH
from detector.slack import code, escape
from detector.store.digests import DAY_DONE, Digests
from detector.units import epoch, money

__all__ = ["DAY_DONE", "TREND_DAYS", "Digest", "build_digests", "digest_text", "render_digest", "send_due_digests", "type_title"]

TREND_DAYS = 14
"""Days the digest's chart shows, the digest's own the last."""
_LIST = 1500
"""Characters a list section of the Slack digest shows (six of them stay under Slack's total)."""
_VERBS = {"stop_instance": "stopped", "cull_notebook": "notebook culled", "scale_to_zero": "scaled to zero"}


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
    fixed: list[dict[str, Any]] = field(default_factory=list)
    """Incidents resolved that day, costliest first: ``resource_id``, ``type``, ``team``, ``usd``
    (that day), ``resolved_at`` and ``how`` (an action and who approved it, or the resolution's
    reason, or '')."""
    still_open: list[dict[str, Any]] = field(default_factory=list)
    """Incidents open at the day's end, fastest burning first: ``resource_id``, ``type``, ``team``,
    ``usd`` (that day) and ``usd_per_hour`` (0 when its money is sunk)."""
    trend: dict[float, dict[str, float]] = field(default_factory=dict)
    """Waste by day (UTC midnight, epoch s) and type over the :data:`TREND_DAYS` days ending
    with this one (days with none absent)."""

    @property
    def total(self) -> float:
        return sum(self.by_type.values())

    @property
    def date(self) -> str:
        return datetime.fromtimestamp(self.day, tz=timezone.utc).strftime("%Y-%m-%d")

    @property
    def usual(self) -> float | None:
        """The average waste per day over the trend's days before this one (days with none
        count as $0 from the first with any); None without any."""
        days = self.usual_days
        if not days:
            return None
        return sum(sum(by_type.values()) for d, by_type in self.trend.items() if d < self.day) / days

    @property
    def usual_days(self) -> int:
        """How many days :attr:`usual` averages: from the first of the trend's with any waste."""
        before = [d for d in self.trend if d < self.day]
        return round((self.day - min(before)) / DAY_S) if before else 0


def build_digests(repo: Digests, day: float, top_n: int = 5, trend_days: int = TREND_DAYS) -> list[Digest]:
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
        details = msgspec.json.decode(r["details"] or "{}")
        who = {"resource_id": r["resource_id"], "type": r["type"], "team": team, "usd": usd}
        if still_open:
            d.open_incidents += 1
            rate = float(r["usd_per_hour"]) if burning(r["type"], details) else 0.0
            d.still_open.append({**who, "usd_per_hour": rate})
            if rate:
                rates = open_rates.setdefault(r["channel"], {})
                rates[r["resource_id"]] = max(rates.get(r["resource_id"], 0.0), rate)
        elif resolved is not None and resolved >= day:
            d.fixed.append({**who, "resolved_at": resolved, "how": _how(r, details)})
        ratio = r.get("billed_ratio")
        billed = None if ratio is None else usd * float(ratio)
        d.repriced += billed is not None
        d.top.append({**who, "billed_usd": billed})
    for row in repo.trend_rows(day, trend_days) if digests else []:
        if row["channel"] in digests:
            by_type = digests[row["channel"]].trend.setdefault(epoch(row["day"]), {})
            by_type[row["type"]] = by_type.get(row["type"], 0.0) + float(row["usd"])
    for d in digests.values():
        d.open_usd_per_hour = sum(open_rates.get(d.channel, {}).values())
        d.top = sorted(d.top, key=lambda x: -x["usd"])[:top_n]
        d.fixed.sort(key=lambda x: -x["usd"])
        d.still_open.sort(key=lambda x: (-x["usd_per_hour"], -x["usd"]))
    return sorted(digests.values(), key=lambda d: d.channel)


def _how(row: dict[str, Any], details: dict[str, Any]) -> str:
    """How an incident ended, in words (escaped): the action that fixed it and who decided, else
    the detector's reason ("busy again"), else ''."""
    kind = row.get("fixed_kind") or ""
    if kind:
        action, by = _VERBS.get(kind, escape(kind)), str(row.get("fixed_by") or "")
        if by[:1] in ("U", "W") and by.isalnum():
            return f"{action} by burnwatch, approved by <@{by}>"
        return f"{action} by burnwatch" + (" (no objection)" if by == "auto" else "")
    reason = details.get("reason")
    return escape(str(reason).replace("_", " "), 200) if reason else ""


def type_title(rule_type: str) -> str:
    """What a type is called in the digest: its detector's title ("Idle GPUs")."""
    cls = REGISTRY.get(rule_type)
    return cls.title if cls is not None else rule_type.replace("_", " ").capitalize()


def digest_text(d: Digest) -> str:
    """The digest's notification text, complete on its own: how much, whose most, what is still
    burning ("Cost waste on 2026-11-02: $1,234; most: team nlp $800; 3 still open, $30/h")."""
    parts = [f"Cost waste on {d.date}: {money(d.total, exact=True)}"]
    if d.by_team:
        team, usd = max(d.by_team.items(), key=lambda kv: kv[1])
        parts.append(f"most: {'untagged' if team == '(untagged)' else 'team ' + escape(team, 40)} {money(usd)}")
    if d.open_incidents:
        parts.append(f"{d.open_incidents} still open, {money(d.open_usd_per_hour)}/h")
    if d.fixed:
        parts.append(f"{len(d.fixed)} fixed")
    return clip("; ".join(parts), MAX_NOTIFICATION_TEXT)


def render_digest(d: Digest) -> list[dict[str, Any]]:
    """The digest's Slack message: a summary line, waste by type and by team, the top offenders,
    what was fixed, what stayed open, what could be saved; every list as long as Slack allows,
    then how many more (``burnwatch digest --day`` prints them all)."""
    full = f"`burnwatch digest --day {d.date}`"

    def lines(pairs: dict[str, float], noun: str) -> str:
        shown = [f"• {escape(k, 80)}: *{money(v, exact=True)}*"
                 for k, v in sorted(pairs.items(), key=lambda kv: -kv[1])
                 if v >= 0.005]  # fmt: skip
        return clip_lines(shown, _LIST, lambda n: f"+{n} more {noun}") or "_none_"

    def who(o: dict[str, Any]) -> str:
        return f"{code(o['resource_id'], 60)} ({escape(type_title(o['type']))}, {escape(o['team'], 40)})"

    top = [f"{i}. {who(o)}: {offender_dollars(o)}" for i, o in enumerate(d.top, 1)]
    fixed = [f"• {who(o)}: resolved {_hhmm(o['resolved_at'])}" + (f", {o['how']}" if o["how"] else "")
             + f"; {money(o['usd'], exact=True)} that day" for o in d.fixed]  # fmt: skip
    still = [f"• {who(o)}: "
             + (f"*{money(o['usd_per_hour'], exact=True)}/h*" if o["usd_per_hour"] else "spent, not burning")
             + f"; {money(o['usd'], exact=True)} that day" for o in d.still_open]  # fmt: skip
    usual = d.usual
    summary = (f"*{money(d.total, exact=True)}* wasted in {d.incidents} incidents"
               + (f" (the {d.usual_days} days before: {money(usual, exact=True)}/day on average)"
                  if usual is not None else "")
               + f"; *{len(d.fixed)} fixed*; *{d.open_incidents} still open* at the day's end, "
               f"*{money(d.open_usd_per_hour, exact=True)}/h* "
               f"({money(d.open_usd_per_hour * HOURS_PER_MONTH)}/month if left).")  # fmt: skip
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": clip(
            f"Cost waste on {d.date}: {money(d.total, exact=True)}", MAX_HEADER_TEXT)}},
        {"type": "section", "text": {"type": "mrkdwn", "text": summary}},
        {"type": "section", "fields": [
            {"type": "mrkdwn", "text": "*By type*\n" + lines({type_title(k): v for k, v in d.by_type.items()}, "types")},
            {"type": "mrkdwn", "text": "*By team*\n" + lines(d.by_team, "teams")},
        ]},
        {"type": "section", "text": {"type": "mrkdwn", "text": "*Top offenders*\n" + (
            clip_lines(top, _LIST, lambda n: f"+{n} more") if top else "_none_")}},
        {"type": "section", "text": {"type": "mrkdwn", "text": "*Fixed that day*\n" + (
            clip_lines(fixed, _LIST, lambda n: f"+{n} more fixed: {full}") if fixed else "_none_")}},
        {"type": "section", "text": {"type": "mrkdwn", "text": "*Still open*, fastest burning first\n" + (
            clip_lines(still, _LIST, lambda n: f"+{n} more open: {full}") if still else "_none_")}},
        *([{"type": "section", "text": {"type": "mrkdwn", "text": (
            f"*Could be saved* (apart from the waste): {money(sum(d.could_save.values()), exact=True)}\n"
            + lines({type_title(k): v for k, v in d.could_save.items()}, "types"))}}] if d.could_save else []),
        {"type": "context", "elements": [{"type": "mrkdwn", "text": (
            "Dollars are each incident's share of that UTC day's bill, each dollar counted once "
            "(docs/architecture.md, Dollars); the chart in the thread shows the last days."
            + (f" {d.repriced} of {d.incidents} incidents re-priced from the bill (top offenders show what it "
               "charged; the totals stay the events' dollars)." if d.repriced else ""))}]},
    ]  # fmt: skip
    return fit(blocks)


def _hhmm(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%H:%M UTC")


def offender_dollars(o: dict[str, Any]) -> str:
    """An offender's dollars: the billed figure, and what the alert said, once the bill re-priced it
    (one figure where the two agree to the cent)."""
    if o.get("billed_usd") is None:
        return money(o["usd"], exact=True)
    billed, said = money(o["billed_usd"], exact=True), money(o["usd"], exact=True)
    return f"{billed} billed (the alert said so too)" if billed == said else f"{billed} billed (alert said {said})"


def send_due_digests(repo: Digests, notifier: Any, watermark: float, settle_s: float = 600.0,
                     may_post: Callable[[], bool] = lambda: True) -> list[Digest]:  # fmt: skip
    """Post the digest of every finished day not yet sent: a day is finished once the
    stream's event time is ``settle_s`` past its end. The first day burnwatch sees is
    its first digest; days before it are not sent. ``may_post`` is asked before each day's
    posts (:attr:`detector.delivery.Outbox.may_post`): a day it refuses is posted at a later call."""
    if watermark <= 0:
        return []
    last = repo.last_day()
    if last is None:
        repo.record(watermark - watermark % DAY_S - DAY_S, DAY_DONE, "")  # the day before the stream began
        return []
    from detector.charts.digest import digest_chart

    sent: list[Digest] = []
    posted = repo.channels(last)
    day = last if DAY_DONE not in posted else last + DAY_S  # (a day some of whose channels' digests failed: the rest now)
    while day + DAY_S + settle_s <= watermark:
        digests = [d for d in build_digests(repo, day) if d.channel not in posted]
        if digests and not may_post():  # (asked once a day: a day's channels are posted together, then recorded)
            return sent
        for d in digests:
            channel, ts = notifier.post_digest(d, render_digest(d), digest_chart(d) if d.by_type else None)
            repo.record(day, d.channel, ts)
            sent.append(d)
        repo.record(day, DAY_DONE, "")  # every channel's posted, or nothing burned that day
        day += DAY_S
        posted = set()
    return sent
