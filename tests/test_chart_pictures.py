"""Charts checked as a person sees them: drawn from events stored in ClickHouse (the gallery's
scenes), then measured with the renderer: labels that run into each other, text cut off at
the edge, the rule's line, the episode's marks and the dollars."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from matplotlib.lines import Line2D
from matplotlib.text import Text

from detector.charts import CHARTED_TYPES, NOT_CHARTED, draw_chart, render_chart, style
from detector.charts import gallery as scenes
from detector.detectors import REGISTRY
from detector.units import money

PNG = b"\x89PNG\r\n\x1a\n"
HOUR = 3600.0
SPANS = {"30 min": 1800.0, "6 h": 6 * HOUR, "3 days": 3 * 86_400.0, "30 days": 30 * 86_400.0}
LEVELS = {
    "idle_gpu": {"threshold", "usual"}, "partly_idle_gpu": {"threshold", "usual"}, "unallocated_gpu": {"threshold", "usual"},
    "stuck_gpu": {"threshold", "usual"}, "inference_overprovisioned": {"threshold", "usual"},
    "egress_runaway": {"threshold", "usual"}, "vector_db_growth": {"capacity"}, "failed_run_spend": {"threshold"},
    "failed_run_spend-crash_loop": set(), "storage_growth": set(), "untagged": set(), "unused_commitment": set(),
    "anomaly": {"usual"},
}  # fmt: skip
"""Per gallery scene, the labelled level lines a person must see: the rule's line where the
rule has one that the chart's unit can show, the usual level where there is one."""


@pytest.fixture(scope="module")
def fleet(chdb_client, tmp_path_factory, ruleset):
    """The gallery drawn once on a fresh database (it stores every scene), plus the idle host at
    several spans: the store, the gallery's folder and each scene's figure as it was saved."""
    from detector.store import Store

    chdb_client.command("DROP DATABASE IF EXISTS t_chart_pictures")
    store = Store(chdb_client, database="t_chart_pictures")
    store.migrate()
    out = tmp_path_factory.mktemp("gallery")
    figures: dict = {}
    scenes.gallery(store, out, figures=figures, ruleset=ruleset)
    for label, span in SPANS.items():
        scenes.store_scene(store, scenes.idle_gpu(span, rid=f"i-span-{label.replace(' ', '')}"))
    return store, out, figures


def _shown(axis) -> list[Text]:
    """The tick labels drawn on ``axis``: those of ticks within its view (an axis keeps tick
    objects of earlier draws beyond it)."""
    lo, hi = sorted(axis.get_view_interval())
    eps = (hi - lo) * 1e-9
    ticks = zip(axis.get_majorticklocs(), axis.get_major_ticks(), strict=False)
    return [tick.label1 for loc, tick in ticks if lo - eps <= loc <= hi + eps and tick.label1.get_visible()]


def _texts_of(fig) -> list[Text]:
    """What a person reads: titles, annotations, legends, axis labels, the shown tick labels."""
    out: list[Text] = []
    for ax in fig.axes:
        out += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        out += [ax.xaxis.get_offset_text(), *_shown(ax.xaxis), *_shown(ax.yaxis)]
        if ax.get_legend() is not None:
            out += ax.get_legend().get_texts()
    for legend in fig.legends:
        out += legend.get_texts()
    return [t for t in out if t.get_visible() and t.get_text().strip()]


def _clashes(texts: list[Text], renderer) -> list[tuple[str, str]]:
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    clashes = []
    for (a, p), (b, q) in itertools.combinations(boxes, 2):
        if min(p.x1, q.x1) - max(p.x0, q.x0) > 0.5 and min(p.y1, q.y1) - max(p.y0, q.y0) > 0.5:
            clashes.append((a, b))
    return clashes


def _drawn(fig):
    """The figure as saved: :func:`style.png` draws it (and quantises a copy)."""
    assert style.png(fig).startswith(PNG)
    return fig


def _axis_clashes(fig) -> list[tuple[str, str]]:
    """Labels of one axis (its ticks, its offset, its label) that overlap, on every axis (of a
    drawn figure: positions are the last draw's)."""
    renderer = fig.canvas.get_renderer()
    found = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            texts = [*_shown(axis), axis.label, *([axis.get_offset_text()] if axis is ax.xaxis else [])]
            found += _clashes([t for t in texts if t.get_visible() and t.get_text().strip()], renderer)
    return found


def _outside(fig) -> list[str]:
    """Texts that the figure's edge cuts (of a drawn figure)."""
    renderer = fig.canvas.get_renderer()
    w, h = fig.canvas.get_width_height()
    cut = []
    for t in _texts_of(fig):
        box = t.get_window_extent(renderer)
        if box.x0 < -1 or box.y0 < -1 or box.x1 > w + 1 or box.y1 > h + 1:
            cut.append(t.get_text())
    return cut


def _gids(fig, kind: type) -> set[str]:
    return {a.get_gid() for a in fig.findobj(kind) if a.get_gid() and a.get_visible()}


def _text(fig, gid: str) -> str:
    return " ".join(t.get_text() for t in fig.findobj(Text) if t.get_gid() == gid)


def test_the_measures_see_what_a_person_would():
    """The checks below can fail: the time axis the issue showed ("11-02 00:0011-02 01:00…")
    clashes, and a headline past the edge is cut."""
    from matplotlib.dates import DateFormatter, HourLocator

    fig, (ax,) = style.figure()
    ax.plot([style.utc(scenes.T0), style.utc(scenes.T0 + 2 * 86_400)], [0, 1])
    ax.xaxis.set_major_locator(HourLocator(interval=2))
    ax.xaxis.set_major_formatter(DateFormatter("%m-%d %H:%M"))
    ax.annotate("x" * 300, xy=(0, 0.5), xycoords="axes fraction").set_in_layout(False)  # as if the layout missed it
    _drawn(fig)
    assert _axis_clashes(fig) and _outside(fig)
    style.time_axis(ax, scenes.T0, scenes.T0 + 2 * 86_400)
    ax.texts[0].set_text("fits")
    _drawn(fig)
    assert _axis_clashes(fig) == [] and _outside(fig) == []


def test_every_detector_type_has_a_chart_or_a_reason_and_a_gallery_scene():
    assert set(REGISTRY) == set(CHARTED_TYPES) | set(NOT_CHARTED)
    assert not set(CHARTED_TYPES) & set(NOT_CHARTED)
    assert {scenes.scene(name).alert.type for name in scenes.SCENES} == set(CHARTED_TYPES)


def test_the_gallery_draws_what_the_shipped_rules_detect_in_each_scene(ruleset):
    """The pictures show the detectors' own alerts (dollars, moments, details), not ones
    written for the gallery; only the anomaly needs a trained model, so its alert is written."""
    detected = {name for name in scenes.SCENES if scenes.scene(name, ruleset).detected}
    assert detected == set(scenes.SCENES) - {"anomaly"}


def test_the_gallery_writes_one_small_png_per_chart(fleet):
    out = fleet[1]
    written = sorted(p.name for p in Path(out).iterdir())
    assert written == sorted(f"{name}.png" for name in [*scenes.SCENES, scenes.DIGEST])
    for name in written:
        data = (Path(out) / name).read_bytes()
        assert data.startswith(PNG) and len(data) < 80_000, (name, len(data))


def test_the_gallery_command_draws_the_scenes_it_is_given(store, tmp_path, capsys):
    assert scenes.main(["--out", str(tmp_path), "egress_runaway", "untagged"], store=store) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["egress_runaway.png", "untagged.png"]
    assert "egress_runaway.png" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        scenes.main(["--out", str(tmp_path), "no_such_scene"], store=store)


@pytest.mark.parametrize("name", list(scenes.SCENES))
def test_each_chart_reads_in_five_seconds(fleet, ruleset, name):
    alert, fig = scenes.scene(name, ruleset).alert, fleet[2][name]
    assert _axis_clashes(fig) == []
    assert _outside(fig) == []
    lines, texts = _gids(fig, Line2D), _gids(fig, Text)
    assert {"episode-start", "alert"} <= lines and "started" in _text(fig, "episode-start-label")
    assert ("resolved" in lines) == (alert.resolved_at is not None)
    for kind in LEVELS[name]:
        assert kind in lines and f"{kind}-label" in texts, kind
    assert "UTC" in " ".join(ax.get_xlabel() for ax in fig.axes)
    headline = _text(fig, "dollars")
    if alert.dollars:  # money gone: how much so far and, while it burns, per hour
        assert money(alert.waste_usd) in headline
        assert (f"{money(alert.usd_per_hour)}/h" in headline) == alert.burning
    else:  # a forecast: what it will come to
        assert "full in" in headline or "→" in headline
    if name == "unused_commitment":  # the rule is a share and a floor, not a line on a $ axis: in words
        assert "(alerts from 5% and $10.00/day)" in headline
    if len(LEVELS[name]) > 1:  # labels of the levels never overlap
        labels = [t for t in fig.findobj(Text) if str(t.get_gid()).endswith("-label") and t.get_gid()[:-6] in LEVELS[name]]
        assert _clashes(labels, fig.canvas.get_renderer()) == []


def test_the_gallerys_digest_reads_in_five_seconds(fleet):
    """The digest of the stored fortnight, built from the ledger as the worker builds it: how
    much and which day in the title, what still burns, the day's total, the average, one colour
    per type, and nothing that clashes or is cut."""
    fig = fleet[2][scenes.DIGEST]
    assert _axis_clashes(fig) == [] and _outside(fig) == []
    assert _clashes(_texts_of(fig), fig.canvas.get_renderer()) == []
    (ax,) = fig.axes
    title = ax.get_title(loc="left")
    assert title.startswith("Cost waste $") and title.endswith(" on 2026-11-15"), title
    total = _text(fig, "today-total")
    assert total in title and "." in total  # to the cent, as the bill
    assert "/h still burning" in _text(fig, "dollars") and "/day" in _text(fig, "usual-label")
    legend = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    assert legend[0] == "Idle GPUs" and "Stuck GPUs (busy, nothing running)" in legend
    colours = [h.get_facecolor() for lg in fig.legends for h in lg.legend_handles]
    assert len(set(colours)) == len(colours)


@pytest.mark.parametrize("span", list(SPANS))
def test_the_time_axis_stays_readable_at_any_span(fleet, span):
    store = fleet[0]
    alert = scenes.idle_gpu(SPANS[span], rid=f"i-span-{span.replace(' ', '')}").alert
    fig = _drawn(draw_chart(alert, store))
    assert _axis_clashes(fig) == []
    bottom = fig.axes[1]  # the per-GPU strip carries the shared time axis
    shown = [t.get_text() for t in _shown(bottom.xaxis) if t.get_text()]
    assert len(shown) >= 3, shown
    if span == "30 days":  # ticks days apart name their month: a bare "22" under "2026-Dec" read as December's
        assert all(re.fullmatch(r"[A-Z][a-z]{2} \d\d", label) for label in shown), shown
    assert _outside(fig) == []


def test_a_host_of_eight_is_drawn_as_idle_and_busy_groups_naming_the_idle_gpus(fleet):
    fig = fleet[2]["partly_idle_gpu"]
    top, strip = fig.axes[0], fig.axes[1]
    gids = {line.get_gid() for line in top.get_lines()}
    assert {"idle", "busy"} <= gids and not any("-gpu" in str(g) for g in gids)  # two groups, not eight lines
    legend = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    assert "idle: 5 of 8 GPUs" in legend and "busy: 3 of 8 GPUs" in legend
    assert "5 of 8 GPUs idle (GPU 3–7)" in _text(fig, "dollars")
    marked = {t.get_text() for t in strip.get_yticklabels() if t.get_color() == style.INK["problem"]}
    assert marked == {f"GPU {g}" for g in (3, 4, 5, 6, 7)}


@pytest.mark.parametrize("gpus", [1, 64])
def test_a_notebook_and_a_host_of_sixty_four_read_as_well(fleet, gpus):
    store = fleet[0]
    s = scenes.partly_idle_gpu(rid=f"i-gpus-{gpus}", gpus=gpus)
    if gpus == 1:  # a notebook idle as a whole
        s = scenes.idle_gpu(HOUR, rid=f"i-gpus-{gpus}")
        s.events = [e for e in s.events if getattr(e, "gpu_index", 0) == 0]
        s.alert.details["gpu_count"] = 1
    scenes.store_scene(store, s)
    fig = _drawn(draw_chart(s.alert, store))
    assert _axis_clashes(fig) == [] and _outside(fig) == []
    headline = _text(fig, "dollars")
    if gpus == 1:
        assert len(fig.axes) == 1 and "its GPU idle" in headline  # no per-GPU strip for one GPU
    else:
        assert "61 of 64 GPUs idle (GPU 3–63)" in headline
        strip = fig.axes[1]
        assert 4 <= len([t for t in strip.get_yticklabels() if t.get_text()]) <= 8  # every eighth GPU named


def test_a_host_of_four_gets_a_line_per_gpu_coloured_by_its_group(fleet):
    fig = fleet[2]["unallocated_gpu"]
    colours = {line.get_gid(): line.get_color() for line in fig.axes[0].get_lines()}
    assert {colours["idle-gpu2"], colours["idle-gpu3"]} == {style.INK["problem"]}
    assert {colours["busy-gpu0"], colours["busy-gpu1"]} == {style.INK["ok"]}


def test_an_episode_that_fires_and_resolves_within_minutes_keeps_its_three_labels_apart(fleet, ruleset):
    """Start, alert and resolution all within a tenth of the chart: three labels, none over another."""
    import copy

    alert = copy.deepcopy(scenes.scene("idle_gpu", ruleset).alert)
    alert.fired_at, alert.resolved_at = alert.episode_start + 30, alert.episode_start + 90
    alert.updated_at, alert.status = alert.resolved_at, "resolved"
    fig = _drawn(draw_chart(alert, fleet[0]))
    labels = [t for t in fig.findobj(Text) if t.get_gid() in ("episode-start-label", "alert-label", "resolved-label")]
    assert len(labels) == 3
    assert _clashes(labels, fig.canvas.get_renderer()) == []
    assert _outside(fig) == []


@pytest.mark.parametrize("usd", [float("nan"), float("inf"), -50.0], ids=["nan", "inf", "negative"])
def test_a_failed_runs_chart_draws_when_its_dollars_are_broken(fleet, ruleset, usd):
    """A bad price upstream must not cost the thread its chart (matplotlib refuses a NaN axis)."""
    import copy

    alert = copy.deepcopy(scenes.scene("failed_run_spend", ruleset).alert)
    alert.waste_usd = usd
    fig = _drawn(draw_chart(alert, fleet[0]))
    assert _text(fig, "dollars").startswith(money(usd)) and "nan" not in _text(fig, "dollars")


def test_hostile_ids_and_tags_do_not_break_a_chart(store):
    idle = scenes.idle_gpu(HOUR, rid=scenes.HOSTILE)
    untagged = scenes.untagged(rid=scenes.HOSTILE + "-2", tags={"owner": scenes.HOSTILE})
    for s in (idle, untagged):
        scenes.store_scene(store, s)
        fig = _drawn(draw_chart(s.alert, store))  # drawing is the test: mathtext would raise on it
        title = fig.axes[0].get_title(loc="left")
        assert "$HOME <@U123> *bold* $x$" in title and "\n" not in title and len(title) <= 70
        assert all(not t.get_parse_math() for t in fig.findobj(Text) if "$x$" in t.get_text())
        assert _outside(fig) == []


def test_a_host_forgotten_for_sixty_days_shows_what_is_stored_and_says_when_it_started(fleet):
    """Its events aged out after 30 days: the chart spans those 30 days, not 80 of which 50 are
    blank, and writes the start and the alert, off the left, at the left edge."""
    from matplotlib.dates import date2num

    day, rid = 86_400.0, "i-forgotten"
    start, end = scenes.T0, scenes.T0 + 60 * day
    s = scenes.Scene("forgotten", scenes.idle_gpu().alert, scenes._host(rid, end - 30 * day, end, HOUR, lambda g, t: 0.5,
                                                                      gpus=4))  # fmt: skip
    s.alert = scenes._alert("idle_gpu", rid, start, start + 1800, end, False, 32.77 * 24 * 60, 32.77,
                            {"gpu_count": 4, "util_below_pct": 5.0})  # fmt: skip
    scenes.store_scene(fleet[0], s)
    fig = _drawn(draw_chart(s.alert, fleet[0]))
    lo, hi = fig.axes[0].get_xlim()
    assert date2num(style.utc(end - 30 * day)) - lo < 1 and hi - date2num(style.utc(end)) < 3  # days
    assert _text(fig, "episode-start-label") == "◂ started Nov 02 00:00, alert Nov 02 00:30"
    assert not [line for line in fig.findobj(Line2D) if line.get_gid() in ("episode-start", "alert") and line.get_visible()]
    assert "$47,189 wasted" in _text(fig, "dollars")
    assert _outside(fig) == [] and _clashes(_texts_of(fig), fig.canvas.get_renderer()) == []


def test_no_text_we_write_on_a_chart_goes_through_mathtext(fleet):
    """Titles, headlines, level and mark labels, legends: a "$" in any of them (a tag, a price)
    is a dollar sign; two of them would otherwise start a formula, or fail the chart."""
    for name, fig in fleet[2].items():
        written = [t for ax in fig.axes for t in (ax.title, ax._left_title, *ax.texts)]
        written += [t for legend in fig.legends for t in legend.get_texts()]
        assert [t.get_text() for t in written if t.get_text() and t.get_parse_math()] == [], name


def test_a_chart_is_none_without_data_or_for_a_type_without_one(store):
    assert draw_chart(scenes.idle_gpu().alert, store) is None  # nothing stored
    spot = scenes.idle_gpu().alert
    spot.type = "spot_eligible"
    assert render_chart(spot, store) is None


def test_an_anomaly_that_names_no_feature_still_shows_what_it_cost(fleet):
    store = fleet[0]
    alert = scenes.anomaly().alert
    alert.details = {"score": 0.7, "threshold": 0.6}
    fig = _drawn(draw_chart(alert, store))
    assert [ax.get_ylabel() for ax in fig.axes] == ["$ per hour"]
    assert "score 0.70 (alone alerts above 0.60)" in _text(fig, "dollars")
