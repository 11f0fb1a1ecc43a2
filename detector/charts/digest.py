"""The daily digest's chart, posted in its thread: the last days' waste by type, the digest's
own day outlined (:func:`digest_figure`). Drawn with the look of every chart
(:mod:`detector.charts.style`); what it shows is the ledger's, as the digest counts it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from detector.charts import style
from detector.digest import TREND_DAYS, type_title
from detector.events import DAY_S
from detector.units import money

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from detector.digest import Digest

__all__ = ["digest_chart", "digest_figure"]

_SHOWN_TYPES = 6
"""Types the chart colours apart; the rest are one grey "other" (eight colours tell apart, twenty do not)."""


def digest_chart(d: Digest) -> bytes:
    """The digest's chart as PNG (:func:`digest_figure`), posted in the digest's thread."""
    return bytes(style.png(digest_figure(d)))


def digest_figure(d: Digest) -> Figure:
    """The last :data:`TREND_DAYS` UTC days' waste, stacked by type, the digest's day outlined on
    a light band with its total above it and its date on the axis, the average of the days
    before as a labelled line; the dollars in the title. Drawn with the shared chart style.
    Every day keeps its full colours: faded, vermillion reads as orange and a type as another."""
    days = [d.day - k * DAY_S for k in range(TREND_DAYS - 1, -1, -1)]
    trend = {**d.trend, d.day: dict(d.by_type)}  # the day itself as the digest counts it
    totals: dict[str, float] = {}
    for by_type in trend.values():
        for t, usd in by_type.items():
            totals[t] = totals.get(t, 0.0) + usd
    ranked = sorted(totals, key=lambda t: -totals[t])
    shown = ranked[:_SHOWN_TYPES] if len(ranked) <= _SHOWN_TYPES + 1 else ranked[: _SHOWN_TYPES - 1]
    # the two blues apart, green (the average's line) last
    palette = [style.COLOURS[c] for c in ("vermillion", "blue", "orange", "purple", "sky", "green")]
    series = [(type_title(t), palette[i], {day: trend.get(day, {}).get(t, 0.0) for day in days}) for i, t in enumerate(shown)]
    rest = [t for t in ranked if t not in shown]
    if rest:
        series.append((f"other ({len(rest)} types)", "#999999",
                       {day: sum(trend.get(day, {}).get(t, 0.0) for t in rest) for day in days}))  # fmt: skip
    fig, (ax,) = style.figure()
    centres = [style.utc(day) for day in days]  # a day's bar stands on its date's tick
    bottom = [0.0] * len(days)
    for label, colour, heights in series:
        values = [heights[day] if math.isfinite(heights[day]) else 0.0 for day in days]  # "$?" in the text, no bar
        bars = ax.bar(centres, values, width=0.8, bottom=bottom, color=colour, label=label, gid=f"type:{label}")
        bars[-1].set(gid="today", edgecolor=style.INK["threshold"], linewidth=1.0)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.axvspan(style.utc(d.day - DAY_S / 2), style.utc(d.day + DAY_S / 2), color=style.INK["muted"], alpha=0.12,
               linewidth=0, zorder=0, gid="today-band")  # fmt: skip
    ax.annotate(money(d.total, exact=True), xy=(centres[-1], bottom[-1]), xytext=(0, 3), textcoords="offset points",
                ha="center", va="bottom", fontsize=10, fontweight="bold", color=style.INK["problem"], gid="today-total",
                parse_math=False)  # fmt: skip
    usual = d.usual
    if usual is not None:
        style.level_line(ax, usual, f"average\n{money(usual)}/day", kind="usual")
    ax.set_ylim(0, max([*bottom, usual if usual is not None and math.isfinite(usual) else 0.0, 0.01]) * 1.18)
    ax.yaxis.set_major_formatter(style.dollar_ticks())
    style.time_axis(ax, days[0] - DAY_S / 2, days[-1] + DAY_S / 2)
    from matplotlib.dates import date2num
    from matplotlib.ticker import FixedLocator

    ax.xaxis.set_major_locator(FixedLocator([date2num(c) for c in centres[::-2]]))  # every other day, the day's own
    title = f"Cost waste {money(d.total, exact=True)} on {d.date}"
    if d.channel:
        title += f" · {style.clip(d.channel, 24)}"
    style.headline(ax, title, note=f"{money(d.open_usd_per_hour)}/h still burning at the day's end · "
                   f"the last {TREND_DAYS} UTC days")  # fmt: skip
    style.legend(ax)
    return fig
