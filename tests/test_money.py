"""Dollars are written by one function (:func:`detector.units.money`), so a figure reads the same
in the phone's notification, the Slack message, the chart and the digest; a figure that is no
number or below zero (a bad price upstream) reads as such, never as "$nan", "$inf" or "$-5"."""

from __future__ import annotations

import math

import pytest
from matplotlib.text import Text

from detector.alerts import Alert
from detector.blockkit import check
from detector.charts import style
from detector.charts.digest import digest_figure
from detector.digest import Digest, digest_text, render_digest
from detector.slack import group_text, notification_text, render_blocks, render_group, render_resolution
from detector.units import figure, money
from tests.helpers import T0

BROKEN = ("$nan", "$inf", "$-", "nan/h", "inf/h")
"""What a message or chart must never show of a dollar figure."""


@pytest.mark.parametrize(
    ("usd", "glance", "exact"),
    [
        (0.0, "$0.00", "$0.00"),
        (4.2, "$4.20", "$4.20"),
        (32.77, "$32.77", "$32.77"),  # an hourly rate as the price list has it
        (99.99, "$99.99", "$99.99"),
        (412.4, "$412", "$412.40"),
        (1234.567, "$1,235", "$1,234.57"),
        (-5.0, "-$5.00", "-$5.00"),  # a credit
        (-1234.0, "-$1,234", "-$1,234.00"),
        (-0.001, "$0.00", "$0.00"),  # no "-$0.00"
        (0.004, "under $0.01", "under $0.01"),  # a small bucket's rate an hour: not "$0.00", as if it cost nothing
        (0.005, "$0.01", "$0.01"),
        (math.nan, "$?", "$?"),
        (math.inf, "$?", "$?"),
        (-math.inf, "$?", "$?"),
    ],
)
def test_money_at_a_glance_and_to_the_cent(usd, glance, exact):
    assert money(usd) == glance
    assert money(usd, exact=True) == exact


def test_no_glance_figure_is_off_by_more_than_half_a_percent():
    for usd in [0.01, 0.5, 9.995, 10.5, 12.5, 55.55, 99.5, 100.49, 150.5, 999.5, 12_345.5, 1e7 + 0.5]:
        shown = float(money(usd).lstrip("$").replace(",", ""))
        assert abs(shown - usd) <= 0.005 * usd + 0.005, (usd, money(usd))


def alert(**kw) -> Alert:
    fields = dict(alert_id="a1", type="idle_gpu", rule="idle-gpu", resource_id="gpu-host-7", status="firing",
                  change="fired", severity="warning", episode_start=T0, fired_at=T0 + 1800, updated_at=T0 + 7200,
                  waste_usd=412.4, usd_per_hour=32.77, tags={"team": "nlp"}, details={"gpu_count": 8})  # fmt: skip
    return Alert(**{**fields, **kw})


def headline_of(a: Alert) -> str:
    fig, (ax,) = style.figure()
    style.headline(ax, a.title, a.waste_usd, a.usd_per_hour, a.burning, what=a.dollars)
    return " ".join(t.get_text() for t in fig.findobj(Text) if t.get_gid() == "dollars")


def test_a_figure_reads_the_same_on_the_phone_and_on_the_chart():
    a = alert()
    assert "$412 so far, $32.77/h" in notification_text(a)
    assert headline_of(a) == "$412 wasted · $32.77/h"


def test_a_rate_under_half_a_cent_is_not_shown_as_nothing(slack):
    """An untagged 100 GB bucket burns $0.004 an hour: its message said "$0.00/h ($2.92/month if left)",
    as if it cost nothing, and its phone notification "$0.00 so far, $0.00/h"."""
    from tests.helpers import slack_bot

    small = alert(resource_id="bucket-7", waste_usd=0.003, usd_per_hour=0.004)
    slack_bot(slack).post(small)
    (post,) = slack.calls("chat.postMessage")
    assert "under $0.01/h ($2.92/month if left)" in post.text_of_blocks() and "$0.00" not in post.text_of_blocks()
    assert post.body["text"].endswith("under $0.01 so far, under $0.01/h")


@pytest.mark.parametrize(
    ("waste", "rate"), [(math.nan, math.nan), (math.inf, math.inf), (-50.0, -3.0)], ids=["nan", "inf", "negative"]
)
def test_broken_dollars_never_read_as_nan_inf_or_dollar_minus(waste, rate):
    opened = alert(waste_usd=waste, usd_per_hour=rate)
    resolved = alert(waste_usd=waste, usd_per_hour=rate, status="resolved", change="resolved",
                     resolved_at=T0 + 7200, details={"reason": "gpu_busy"})  # fmt: skip
    group = [alert(alert_id=f"g{i}", resource_id=f"h{i}", waste_usd=waste, usd_per_hour=rate) for i in range(3)]
    messages = [
        (render_blocks(opened), notification_text(opened)),
        (render_blocks(resolved), notification_text(resolved)),
        (render_resolution(resolved), notification_text(resolved)),
        (render_group(group), group_text(group)),
    ]
    digest = Digest(channel="#ml", day=T0, by_type={"idle_gpu": abs(waste)}, by_team={"nlp": abs(waste)},
                    open_incidents=1, open_usd_per_hour=rate,
                    still_open=[{"resource_id": "h1", "type": "idle_gpu", "team": "nlp", "usd": waste,
                                 "usd_per_hour": rate}])  # fmt: skip
    messages.append((render_digest(digest), digest_text(digest)))
    for blocks, text in messages:
        assert check(blocks, text) == []
        shown = (str(blocks) + text).lower()
        assert not [b for b in BROKEN if b in shown], shown
    chart = headline_of(opened).lower()
    assert not [b for b in BROKEN if b in chart], chart
    style.png(digest_figure(digest))  # draws: a total that is no number does not break the chart


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1234.5678, "1,234.57"),  # a number, as the spec says
        (None, "?"),  # a price not known
        ("12", "?"),  # a string in a number's place (stored JSON)
        (float("nan"), "?"),
        (float("inf"), "?"),
        (True, "?"),  # a bool is not a figure
    ],
)
def test_a_details_figure_or_a_question_mark(value, text):
    assert figure(value, ",.2f") == text
