"""How every burnwatch chart looks, in one place, so a person reads any of them in five seconds.

Colours are Okabe-Ito (safe for the common colour-blindnesses) with one meaning each: the
problem is vermillion, the rule's threshold black, the usual level green. The figure is sized
for Slack's thread preview and a phone (16:9, fonts that stay legible when scaled down to a
phone's width). Times are event time in UTC on a concise axis that never runs labels into
each other, at any span from minutes to months. Every mark carries a ``gid`` (``threshold``,
``usual``, ``episode``, ``episode-start``, ``alert``, ``resolved``, ``capacity``, ``forecast``)
so tests find them as a person would. Text never goes through mathtext: a ``$`` in a tag or
an id is a dollar sign, not a formula.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from detector.units import money

__all__ = [
    "COLOURS", "INK", "clip", "episode_marks", "figure", "finish", "headline", "legend", "level_line", "dollar_ticks",
    "png", "time_axis", "utc",
]  # fmt: skip

COLOURS = {
    "black": "#000000", "orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73",
    "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7",
}  # fmt: skip
"""Okabe & Ito's palette (https://jfly.uni-koeln.de/color/)."""

INK = {
    "problem": COLOURS["vermillion"],  # the idle GPUs, the runaway, the waste
    "ok": COLOURS["blue"],  # the busy GPUs, the normal series
    "threshold": COLOURS["black"],  # the rule's line
    "usual": COLOURS["green"],  # the usual level (baseline, median)
    "forecast": COLOURS["orange"],
    "capacity": COLOURS["vermillion"],
    "episode": COLOURS["vermillion"],
    "alert": COLOURS["purple"],
    "resolved": COLOURS["green"],
    "muted": "#777777",
}  # fmt: skip
"""What each colour means on every chart."""

SIZE_IN = (8.0, 4.5)
DPI = 110
"""880 x 495 px: Slack's preview shows it whole, and a phone's width keeps its 10-12 pt text legible."""



_LABEL_BOX = {"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8}
"""Behind a label written over the data, so a line through it does not strike it out."""


def utc(t: float) -> datetime:
    """Epoch seconds as an aware UTC datetime (what the axes plot)."""
    return datetime.fromtimestamp(t, tz=timezone.utc)


def dollar_ticks() -> Any:
    """A dollar axis's tick labels: :func:`~detector.units.money` from $100, and below it as
    many digits as the tick has ("$12.5" stays itself, not "$12"), "$0" at zero."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: "$0" if v == 0 else money(v) if abs(v) >= 100 else f"${v:,.4g}")


def clip(text: object, limit: int = 60) -> str:
    """Hostile text made safe for a chart: one line, no control characters, at most ``limit``
    characters (ending in "…"). ``$`` stays as it is: charts never parse mathtext."""
    line = " ".join("".join(c if c.isprintable() else " " for c in str(text)).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def figure(rows: int = 1, height_ratios: list[float] | None = None) -> tuple[Any, list[Any]]:
    """A figure sized for Slack and a phone with ``rows`` axes sharing the time axis."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # Sizes are set on the artists, not through rcParams: those are global, and charts are
    # drawn on the chart worker's thread while the digest may draw on another.
    size = (SIZE_IN[0], SIZE_IN[1] + (1.4 * (rows - 1)))
    fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)  # a renderer to measure text with (tests, label spreading)
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False, height_ratios=height_ratios)[:, 0].tolist()
    for ax in axes:
        ax.spines[["top", "right"]].set_visible(False)
        ax.grid(True, alpha=0.3, linewidth=0.6)
        ax.tick_params(labelsize=10)
        ax.xaxis.label.set_size(10)
        ax.yaxis.label.set_size(10)
    return fig, axes


def time_axis(ax: Any, lo: float | None = None, hi: float | None = None) -> None:
    """A concise UTC date axis (``AutoDateLocator`` + ``ConciseDateFormatter``): labels never
    overlap, whether the chart spans 30 minutes or 30 days. ``lo``/``hi``: the span, epoch s
    (call it once the data is drawn). With a span, the ticks are chosen once, here: the
    locator's calendar arithmetic is otherwise redone at every layout pass."""
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, date2num
    from matplotlib.ticker import FixedLocator

    locator = AutoDateLocator(tz=timezone.utc, minticks=3, maxticks=7)
    # ticks a day or more apart name their month ("Nov 22 Dec 01 Dec 08"): concise, they read
    # "22 Dec 08" under an offset of "2026-Dec", and the 22nd looked like December's
    formats = ["%Y", "%b", "%b %d", "%H:%M", "%H:%M", "%S.%f"]
    zero_formats = ["", "%Y", "%b %d", "%b-%d", "%H:%M", "%H:%M"]
    ax.xaxis.set_major_formatter(ConciseDateFormatter(locator, tz=timezone.utc, formats=formats,
                                                      zero_formats=zero_formats, show_offset=True))  # fmt: skip
    if lo is not None and hi is not None and hi > lo:
        ax.set_xlim(utc(lo), utc(hi))
        first, last = date2num(utc(lo)), date2num(utc(hi))
        ticks = [x for x in locator.tick_values(utc(lo), utc(hi)) if first <= x <= last]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
    else:
        ax.xaxis.set_major_locator(locator)
    ax.set_xlabel("UTC, event time", fontsize=9, color=INK["muted"])


LEVEL_KINDS = ("threshold", "usual", "capacity")


def level_line(ax: Any, value: float, label: str, kind: str = "threshold") -> Any:
    """A labelled horizontal line: ``kind`` is ``threshold`` (the rule's line, dashed black),
    ``usual`` (the usual level, green) or ``capacity`` (vermillion). The label is written just
    right of the plot, level with the line, where no data can cover it (keep it short; a
    ``\n`` makes two lines); labels that would touch are moved apart when the chart is saved."""
    style = {"threshold": "--", "usual": "-.", "capacity": "--"}.get(kind, "--")
    line = ax.axhline(value, color=INK.get(kind, INK["threshold"]), linestyle=style, linewidth=1.3, gid=kind,
                      zorder=3)  # fmt: skip
    text = "\n".join(clip(part, 18) for part in label.split("\n")[:2])
    ax.annotate(text, xy=(1.0, value), xycoords=("axes fraction", "data"), xytext=(4, 0), textcoords="offset points",
                ha="left", va="center", fontsize=9, color=line.get_color(), gid=f"{kind}-label", annotation_clip=True,
                parse_math=False, linespacing=1.0)  # fmt: skip
    return line


def episode_marks(ax: Any, start: float, fired_at: float | None, end: float, resolved: bool,
                  labels: bool = True, band: bool | None = None) -> None:  # fmt: skip
    """The episode as a light band from its start to ``end``, with lines at its start, the
    alert (``fired_at``) and, when ``resolved``, the resolution, each labelled at the top
    (``labels=False``: the lines alone, for a second panel under the first; ``band``: whether
    to shade it, by default where the labels are)."""
    if labels if band is None else band:
        ax.axvspan(utc(start), utc(max(end, start)), color=INK["episode"], alpha=0.07, gid="episode", zorder=0)
    marks = [("episode-start", start, "started", INK["episode"])]
    if fired_at is not None:
        marks.append(("alert", fired_at, "alert", INK["alert"]))
    if resolved:
        marks.append(("resolved", end, "resolved", INK["resolved"]))
    last_x, row = None, 0
    for gid, t, text, colour in marks:
        ax.axvline(utc(t), color=colour, linestyle=":", linewidth=1.3, gid=gid, zorder=3)
        if not labels:
            continue
        # labels of marks close together would collide: each goes a row below the one before
        # (an episode that fires and resolves within minutes has all three close together)
        row = row + 1 if last_x is not None and abs(t - last_x) < _near(ax) else 0
        ax.annotate(text, xy=(utc(t), 1.0), xycoords=("data", "axes fraction"), xytext=(3, -3 - 12 * row),
                    textcoords="offset points", ha="left", va="top", fontsize=9, color=colour, gid=f"{gid}-label",
                    annotation_clip=False, bbox=_LABEL_BOX, parse_math=False)  # fmt: skip
        last_x = t


def _near(ax: Any) -> float:
    """A tenth of the x span in seconds (0 before limits are set)."""
    from matplotlib.dates import num2date

    lo, hi = ax.get_xlim()
    try:
        return (num2date(hi) - num2date(lo)).total_seconds() / 10
    except (ValueError, OverflowError):
        return 0.0


def headline(ax: Any, title: str, waste_usd: float | None = None, usd_per_hour: float | None = None,
             burning: bool = True, what: str = "so far", note: str = "") -> None:  # fmt: skip
    """The chart's title (clipped, one line) and under it the dollars: "$1,234 so far · $32/h"
    (no per hour when the money is no longer being spent), then ``note`` ("5 of 8 GPUs idle").
    With no dollars (a forecast), the second line is the note alone."""
    pad = 20 if waste_usd is not None or note else 6
    ax.set_title(clip(title, 70), loc="left", fontsize=12, fontweight="bold", pad=pad, parse_math=False)
    if waste_usd is None and not note:
        return
    parts = [] if waste_usd is None else [f"{money(waste_usd)} {what}".strip()]
    if waste_usd is not None and usd_per_hour and burning:
        parts.append(f"{money(usd_per_hour)}/h")
    if note:
        parts.append(clip(note, 80))
    ax.annotate(clip(" · ".join(parts), 95), xy=(0, 1), xycoords="axes fraction", xytext=(0, 5), textcoords="offset points",
                ha="left", va="bottom", fontsize=10.5, color=INK["problem"], gid="dollars", annotation_clip=False,
                parse_math=False)  # fmt: skip


def legend(ax: Any, **kw: Any) -> Any:
    """The series' legend below the chart, out of the data's way (the level lines are labelled
    on the chart instead), or None when nothing is labelled."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    kw.setdefault("loc", "outside lower center")
    kw.setdefault("ncols", min(len(handles), 4))
    found = ax.figure.legend(handles, [clip(label, 40) for label in labels], fontsize=9, frameon=False, **kw)
    for text in found.get_texts():
        text.set_parse_math(False)
    return found


def png(fig: Any) -> bytes:
    """The figure as PNG bytes: level labels moved apart, then quantised to 256 colours (a
    chart has few; the file is a third of the size, quicker to upload and to open on a phone)."""
    from PIL import Image

    finish(fig)
    canvas = fig.canvas
    with _no_glyph_warnings():
        canvas.draw()
    rgba = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    out = io.BytesIO()
    rgba.convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(out, format="png")
    return out.getvalue()


def finish(fig: Any) -> None:
    """What every chart gets before it is saved (and before a test measures it): its level
    labels moved apart where two would touch. Once per figure."""
    if getattr(fig, "_burnwatch_finished", False):
        return
    _marks_left_of_view(fig)
    _spread_level_labels(fig)
    fig._burnwatch_finished = True


def _marks_left_of_view(fig: Any) -> None:
    """An episode that started (or alerted) before the chart's first data: its lines would sit
    outside the plot and their labels past its left edge, so they go, and one label at the left
    edge says when ("◂ started Sep 03 02:00, alert Sep 03 02:30")."""
    from matplotlib.dates import num2date

    for ax in fig.axes:
        lo = ax.get_xlim()[0]
        gone = []
        for gid, word in (("episode-start", "started"), ("alert", "alert")):
            for line in [line for line in ax.get_lines() if line.get_gid() == gid]:
                x = float(ax.convert_xunits(line.get_xdata()[0]))
                if x < lo:
                    line.set_visible(False)
                    gone.append((gid, word, x))
        labels = {t.get_gid(): t for t in ax.texts}
        for gid, _, _ in gone:
            if f"{gid}-label" in labels:
                labels[f"{gid}-label"].set_visible(False)
        first = labels.get("episode-start-label")
        if gone and first is not None:
            first.set_text("◂ " + ", ".join(f"{word} {num2date(x):%b %d %H:%M}" for _, word, x in gone))
            first.xy = (lo, 1.0)
            first.xyann = (3, -3)
            first.set_visible(True)


def _spread_level_labels(fig: Any) -> None:
    """Move level labels of one axes that would overlap apart, keeping their order."""
    kinds = {f"{k}-label" for k in LEVEL_KINDS}
    crowded = [ax for ax in fig.axes if sum(t.get_gid() in kinds for t in ax.texts) > 1]
    if not crowded:
        return  # nothing to measure: spare a draw
    with _no_glyph_warnings():
        fig.draw_without_rendering()  # lays it out (positions, ticks) without painting pixels
    fig.set_layout_engine("none")  # and keeps that layout: the labels move within its margin
    renderer = fig.canvas.get_renderer()
    for ax in crowded:
        labels = [t for t in ax.texts if t.get_gid() in kinds and t.get_visible()]
        boxes = sorted(((t.get_window_extent(renderer), t) for t in labels), key=lambda bt: bt[0].y0)
        top = None
        for box, text in boxes:
            if top is not None and box.y0 < top + 2:
                shift = top + 2 - box.y0
                x, y = text.xyann
                text.xyann = (x, y + shift * 72 / fig.dpi)
                top = box.y1 + shift
            else:
                top = box.y1


@contextmanager
def _no_glyph_warnings() -> Iterator[None]:
    """A character the font lacks (an emoji in a tag) draws as a box, without a warning in the
    worker's log for every chart."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        yield
