"""Block Kit's limits: the checker catches every kind of violation (so the message tests below
cannot pass vacuously), clipping never breaks markup, and the largest realistic messages of
every builder (an alert of each type with 10 kB hostile values, a group of 50 and 500 hosts, a
resolution, action messages, a big team's digest) fit, and post through slack-sdk."""

from __future__ import annotations

import copy
import functools
import json
import re
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detector import blockkit
from detector.alerts import Alert
from detector.blockkit import MAX_TEXT, check, clip, clip_lines, fit
from detector.detectors import REGISTRY
from detector.digest import Digest, digest_text, render_digest
from detector.remediation.base import Call
from detector.remediation.messages import action_blocks
from detector.remediation.policy import Action
from detector.rules import Link, Routing
from detector.slack import (
    SlackNotifier,
    block_objects,
    escape,
    group_text,
    notification_text,
    render_blocks,
    render_group,
    render_resolution,
)
from detector.testing import LocalSlack
from tests.helpers import T0


def utc(t: float) -> datetime:
    """Epoch seconds as the store reads a DateTime64 back (naive UTC)."""
    return datetime.fromtimestamp(t, tz=timezone.utc).replace(tzinfo=None)

HOSTILE = "*bold* <!channel> @channel <https://evil.example|click> a & b $x^$ \u202eRTL \U0001f525 :fire:\nnew line `tick` "
"""Everything an event's text may hold that could break a message or a chart."""
HUGE = (HOSTILE * 200)[:10_000]
"""A 10 kB tag value."""


def message() -> list[dict[str, Any]]:
    """A small message using every block kind the builders use, inside every limit."""
    return [
        {"type": "header", "text": {"type": "plain_text", "text": "Idle GPUs on h1: $32.00/h"}},
        {"type": "section", "text": {"type": "mrkdwn", "text": "*Next step:* stop it &amp; <https://x.example|see>"}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": "*Team*\nnlp"}, {"type": "mrkdwn", "text": "*Cost*\n$4"}]},
        {"type": "actions", "block_id": "burnwatch:a1", "elements": [
            {"type": "button", "text": {"type": "plain_text", "text": "Acknowledge"}, "action_id": "burnwatch_ack",
             "value": "a1"}]},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": "rule `idle` · alert `a1`"}]},
    ]  # fmt: skip


def _set(path: str, value: Any) -> Any:
    """A mutation of :func:`message` that sets ``path`` (``2.fields``) to ``value``."""

    def mutate(blocks: list[dict[str, Any]]) -> None:
        *keys, last = [int(k) if k.isdigit() else k for k in path.split(".")]
        node: Any = blocks
        for k in keys:
            node = node[k]
        node[last] = value

    return mutate


FIELD = {"type": "mrkdwn", "text": "f"}
BUTTON = {"type": "button", "text": {"type": "plain_text", "text": "b"}, "action_id": "b", "value": "v"}
VIOLATIONS = [
    # (what, mutation of the valid message, a fragment of the one problem it must report)
    ("51 blocks", lambda b: b.extend([copy.deepcopy(b[4]) for _ in range(46)]), "blocks: 51 blocks (max 50)"),
    ("a header over 150", _set("0.text.text", "h" * 151), "blocks[0].text: 151 characters (max 150)"),
    ("a mrkdwn header", _set("0.text.type", "mrkdwn"), "blocks[0].text: a header's text must be plain_text"),
    ("a section text over 3,000", _set("1.text.text", "s" * 3001), "blocks[1].text: 3,001 characters (max 3,000)"),
    ("a section with nothing", lambda b: b.__setitem__(1, {"type": "section"}), "a section needs text or fields"),
    ("11 fields", _set("2.fields", [FIELD] * 11), "blocks[2].fields: 11 fields (max 10)"),
    ("a field over 2,000", _set("2.fields.0.text", "f" * 2001), "blocks[2].fields[0]: 2,001 characters (max 2,000)"),
    ("26 buttons", _set("3.elements", [BUTTON] * 26), "blocks[3].elements: 26 elements (max 25)"),
    ("a button text over 75", _set("3.elements.0.text.text", "b" * 76), "blocks[3].elements[0].text: 76 characters"),
    ("a button value over 2,000", _set("3.elements.0.value", "v" * 2001), "elements[0].value: 2,001 characters"),
    ("an action_id over 255", _set("3.elements.0.action_id", "a" * 256), "elements[0].action_id: 256 characters"),
    ("a button url over 3,000", _set("3.elements.0.url", "u" * 3001), "elements[0].url: 3,001 characters"),
    ("a block_id over 255", _set("3.block_id", "i" * 256), "blocks[3].block_id: 256 characters (max 255)"),
    ("11 context elements", _set("4.elements", [FIELD] * 11), "blocks[4].elements: 11 elements (max 10)"),
    ("an empty text", _set("4.elements.0.text", ""), "blocks[4].elements[0]: empty text"),
    ("half an entity", _set("1.text.text", "a &am"), "blocks[1].text: a bare '&'"),
    ("half a link", _set("1.text.text", "see <https://x.example|se"), "blocks[1].text: an unclosed '<'"),
    ("a stray '>'", _set("1.text.text", "x> y"), "blocks[1].text: an unclosed '<' or a stray '>'"),
    ("too long in total", lambda b: b.extend([{"type": "section", "text": {"type": "mrkdwn", "text": "t" * 2999}}] * 5),
     "blocks (all texts together): 15,"),
]  # fmt: skip


def test_the_valid_message_passes():
    assert check(message(), "Idle GPUs on h1 (team nlp): $4 so far, $32/h") == []


@pytest.mark.parametrize(("what", "mutate", "problem"), VIOLATIONS, ids=[v[0] for v in VIOLATIONS])
def test_the_checker_catches_each_kind_of_violation(what, mutate, problem):
    blocks = message()
    mutate(blocks)
    problems = check(blocks)
    assert len(problems) == 1 and problem in problems[0], problems


def test_the_checker_catches_a_notification_text_too_long_or_empty():
    assert check(message(), "t" * 40_001) == ["text: 40,001 characters (max 40,000)"]
    assert check(message(), "  ") == ["text: empty (the notification would show nothing)"]


@pytest.mark.parametrize(("what", "mutate", "problem"), VIOLATIONS, ids=[v[0] for v in VIOLATIONS])
def test_fit_brings_each_violation_of_size_back_inside(what, mutate, problem):
    """What :func:`fit` can repair (texts' sizes and counts) it does, keeping the last block (the
    footer naming the alert); a wrong type, an empty text, broken markup or an identifier too long
    (cut, a click would name another incident) it leaves for :func:`check` to report."""
    blocks = message()
    mutate(blocks)
    if any(p in problem for p in ("plain_text", "needs text", "empty text", "bare", "unclosed", "value", "action_id",
                                  "url", "block_id")):  # fmt: skip
        assert fit(blocks) == blocks
        return
    fitted = fit(blocks)
    assert check(fitted) == []
    assert len(fitted) == min(len(blocks), 50) and fitted[-1]["type"] == blocks[-1]["type"]
    if len(blocks) > 50:
        assert fitted[-1] == blocks[-1]


MARKUP = st.lists(st.sampled_from(["abc ", "&amp;", "&lt;", "&gt;", "<https://x.example/a?b=1&amp;c=2|label>",
                                   "<@U012AB3CD>", "`code &lt;x&gt;`", "\U0001f525", "\u202e", "\n", "*b*"]),
                  max_size=400).map("".join)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(text=MARKUP, limit=st.integers(min_value=10, max_value=600))
def test_clip_never_breaks_an_entity_a_link_or_a_code_span(text, limit):
    clipped = clip(text, limit, "+3 more")
    assert len(clipped) <= limit
    if len(text) <= limit:
        assert clipped == text
        return
    assert clipped.endswith("… +3 more")
    body = clipped.removesuffix("… +3 more")
    assert check([{"type": "section", "text": {"type": "mrkdwn", "text": clipped}}]) == []
    assert body.count("`") % 2 == 0 and text.startswith(body.rstrip("`"))


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(MARKUP.map(lambda s: s.replace("\n", " ")).filter(bool), min_size=1, max_size=60),
       limit=st.integers(min_value=40, max_value=3000))
def test_clip_lines_keeps_whole_lines_and_counts_the_rest(lines, limit):
    text = clip_lines(lines, limit, lambda n: f"+{n} more hosts")
    assert len(text) <= limit
    assert check([{"type": "section", "text": {"type": "mrkdwn", "text": text}}]) == []
    if len("\n".join(lines)) <= limit:
        assert text == "\n".join(lines)
        return
    *shown, last = text.split("\n")
    left = int(re.fullmatch(r"… \+(\d+) more hosts", last).group(1))  # type: ignore[union-attr]
    if shown and shown[0] != lines[0]:  # the first line alone left no room: cut, the others counted
        assert shown[0].endswith("…") and len(shown) == 1 and left == len(lines) - 1
    else:
        assert shown == lines[: len(lines) - left] and left >= 1


# -- the largest realistic messages ---------------------------------------------------------

LONG = {"gpu_model": HUGE, "gpu_count": 8, "gpus_unallocated": 8, "gpus_idle": list(range(64)),
        "pods": [{"namespace": HUGE, "pod": HUGE, "workload": HUGE, "command": f"kubectl delete pod -n ns{i} p{i}"}
                 for i in range(40)], "pods_more": 300}  # fmt: skip
DETAILS: dict[str, dict[str, Any]] = {
    "idle_gpu": LONG, "partly_idle_gpu": LONG, "unallocated_gpu": LONG, "stuck_gpu": LONG, "telemetry_stale": LONG,
    "untagged": {"missing_tags": [HUGE] * 20},
    "idle_notebook": {"idle_s": 1e308, "for_s": 1e9, "last_activity": 99_999_999_999.0, "reason": HUGE},
    "egress_runaway": {"destination": HUGE, "dest_region": HUGE, "excess_gb": 1e9, "usd_per_gb": 0.09,
                       "rate_gb_per_hour": 1e6, "baseline_gb_per_hour": 1.0},
    "failed_run_spend": {"run_id": HUGE, "status": HUGE, "error": HUGE, "gpu_hours": 1e6, "crash_loop": True,
                         "failed_runs": 500, "project": HUGE, "errors": [HUGE] * 50},
    "vector_db_growth": {"forecast_full": HUGE, "days_to_full": 3, "fill_pct": 97, "capacity_gb": 1e6,
                         "growth_gb_per_day": 1e4, "growth_pct_per_day": 9.0,
                         "next_tier": {"name": HUGE, "usd_per_month": 1e6}},
    "storage_growth": {"size_gb": 1e9, "growth_gb_per_day": 1e6, "monthly_usd_now": 1e7, "monthly_usd_in_30d": 2e7,
                       "monthly_usd_in_90d": 4e7},
    "inference_overprovisioned": {"suggested_instance_type": HUGE, "suggested_gpu_model": HUGE,
                                  "suggested_usd_per_hour": 1.0, "saving_usd_per_hour": 30.0, "util_pct": HUGE,
                                  "requests_per_s": 1e6, "gpu_mem_peak_gb": HUGE},
    "data_starved_training": {**LONG, "job_gpus": 255, "used_pct": 1e9, "evidence": HUGE, "host_gauge": HUGE,
                              "host_pct": 1e9},
    "plateaued_run": {"run_id": HUGE, "project": HUGE, "metric": HUGE, "mode": HUGE, "best": -1e308,
                      "best_step": 2**63 - 1, "latest": 1e308, "evaluations_since_best": 10**9, "gpu_count": 65535},
    "spot_eligible": {"run_id": HUGE, "instance_type": HUGE, "spot_usd_per_hour": 9.0, "saving_usd_per_hour": 20.0},
    "unused_commitment": {"commitment_type": HUGE, "commitment_name": HUGE, "unused_share": 0.9, "day": HUGE,
                          "day_used_usd": 1.0, "day_unused_usd": 9.0, "days": 40},
    "inference_scale_to_zero": {"idle_hours_per_week": 168, "usd_per_idle_hour": 1e6, "saving_usd_per_week": 1.7e8,
                                "schedule_text": HUGE, "timezone": HUGE, "schedule": [[i, 1] for i in range(168)]},
    "inference_unbatched": {"causes": [HUGE] * 5, "batch_size": 1e9, "requests_per_s": 1e9, "sm_active_pct": HUGE,
                            "duplicate_share_pct": 1e9, "cache_hit_pct": 1e9, "replicas": 10_000,
                            "replicas_needed": 1, "saving_usd_per_hour": 1e6, "how": HUGE},
    "spot_without_redundancy": {"replicas": HUGE, "zones": HUGE, "min_replicas": 1000, "min_zones": 100,
                                "extra_replica_usd_per_hour": 1e6, "on_demand_premium_usd_per_hour": 1e9},
    "build_or_call": {"direction": "build", "model": HUGE, "usd_per_1k_requests": HUGE, "alternative_usd_per_1k_requests": 1e12,
                      "requests_per_h": 1e12, "input_tokens_per_request": None, "output_tokens_per_request": "x",
                      "token_source": HUGE, "api_provider": HUGE, "api_usd_per_1m_input": 1e9, "api_usd_per_1m_output": 1e9,
                      "api_price_as_of": HUGE, "self_host_instances": HUGE, "self_host_instance_type": HUGE,
                      "self_host_model": HUGE, "self_host_output_tokens_per_s": float("nan")},
    "wrong_region": {"region": HUGE, "suggested_region": HUGE, "usd_per_hour": 1e9, "suggested_usd_per_hour": HUGE,
                     "net_monthly_usd": 1e15, "monthly_saving_usd": None, "move_usd": "1", "data_gb": 1e18,
                     "data_source": HUGE, "break_even_h": float("inf")},
    "anomaly": {"score": 0.9, "threshold": 0.6, "windows": 3, "evidence": 2.0, "budget": 1.5,
                "stands_out": [{"feature": HUGE, "value": 1e9, "usual_range": [0.0, 1.0]} for _ in range(30)]},
}  # fmt: skip
ROUTING = Routing(users={"alice": "U012AB3CD"},
                  links=[Link(name=f"Console {i} <&>", url="https://console.example/{region}/{resource_id}?t={team}")
                         for i in range(12)])  # fmt: skip


def huge_alert(rule_type: str, i: int = 0, resolved: bool = False, **kw: Any) -> Alert:
    """An alert of ``rule_type`` whose every value from events is 10 kB of hostile text."""
    fields: dict[str, Any] = dict(
        alert_id=f"{i:016x}", type=rule_type, rule=f"{rule_type}-{HUGE}", resource_id=f"host-{i}-{HUGE}",
        status="resolved" if resolved else "firing", change="resolved" if resolved else "fired", severity="critical",
        episode_start=T0, fired_at=T0 + 1800, updated_at=T0 + 7200, resolved_at=T0 + 7200 if resolved else None,
        waste_usd=412.0 + i, usd_per_hour=32.0 + i, resource_type=HUGE, account=HUGE, region=HUGE, instance_type=HUGE,
        tags={"team": HUGE, "owner": "alice", "project": HUGE},
        details={**DETAILS[rule_type], **({"reason": HUGE} if resolved else {})})  # fmt: skip
    return Alert(**{**fields, **kw})


def test_every_type_has_long_details_here():
    assert set(DETAILS) == set(REGISTRY)  # a new detector gets its largest message checked too


def _action(alert_id: str, state: str) -> Action:
    call = Call(api="ec2.StopInstances", request={"InstanceIds": [HUGE] * 5}, endpoint=HUGE)
    return Action(alert_id=alert_id, kind="stop_instance", mode="approve", rule="idle", resource_id=HUGE, team=HUGE,
                  state=state, decided_by="U012AB3CD", result=HUGE, usd_per_hour=32.0, call=call)  # fmt: skip


@functools.cache
def largest_messages() -> list[tuple[str, str, list[dict[str, Any]]]]:
    """(name, notification text, blocks) of every builder's largest realistic message."""
    clicks = [{"action": "snoozed", "user_id": "W" if i % 2 else HUGE, "user_name": HUGE, "at": utc(T0 + i),
               "until": utc(T0 + 86400)} for i in range(200)]  # fmt: skip
    out = []
    for rule_type in sorted(REGISTRY):
        opened = huge_alert(rule_type)
        out.append((f"{rule_type} opened", notification_text(opened), render_blocks(opened, clicks, ROUTING)))
        resolved = huge_alert(rule_type, resolved=True)
        out.append((f"{rule_type} resolved", notification_text(resolved), render_blocks(resolved, clicks, ROUTING)))
        out.append((f"{rule_type} thread reply", notification_text(resolved), render_resolution(resolved)))
    for n in (50, 500):
        group = [huge_alert("untagged", i) for i in range(n)]
        out.append((f"a group of {n}", group_text(group), render_group(group)))
    for state in ("dry_run", "proposed", "succeeded", "failed", "declined"):
        text, blocks = action_blocks(_action("a" * 16, state), T0)
        out.append((f"action {state}", text, blocks))
    out.append(("a big team's digest", digest_text(big_digest()), render_digest(big_digest())))
    return out


def big_digest() -> Digest:
    """A day of 200 offenders across 40 teams and 20 types (more types than burnwatch has)."""
    types = [*sorted(REGISTRY), *[f"custom_{HUGE[:40]}_{i}" for i in range(20 - len(REGISTRY))]]
    teams = [f"team-{i}-{HUGE[:200]}" for i in range(40)]
    rows = [{"resource_id": f"h{i}-{HUGE}", "type": types[i % 20], "team": teams[i % 40], "usd": 1000.0 - i}
            for i in range(200)]  # fmt: skip
    d = Digest(channel="#ml-cost", day=T0, incidents=200, open_incidents=100, open_usd_per_hour=3200.0, repriced=50)
    for r in rows:
        d.by_type[r["type"]] = d.by_type.get(r["type"], 0.0) + r["usd"]
        d.by_team[r["team"]] = d.by_team.get(r["team"], 0.0) + r["usd"]
    d.top = [{**r, "billed_usd": r["usd"] * 1.1} for r in rows[:5]]
    d.fixed = [{**r, "resolved_at": T0 + 3600, "how": "stopped by burnwatch, approved by <@U012AB3CD>"}
               for r in rows[:100]]  # fmt: skip
    d.still_open = [{**r, "usd_per_hour": 32.0} for r in rows[100:]]
    d.could_save = {t: 10.0 for t in types}
    return d


@pytest.mark.parametrize("index", range(len(REGISTRY) * 3 + 8))
def test_the_largest_messages_fit_slack(index):
    name, text, blocks = largest_messages()[index]
    assert check(blocks, text) == [], name
    assert len(text) <= blockkit.MAX_NOTIFICATION_TEXT
    shown = json.dumps(blocks)
    assert "<!channel>" not in shown and "<https://evil" not in shown  # still inert after clipping


def test_a_cut_list_says_how_many_more_and_where():
    group = render_group([huge_alert("untagged", i) for i in range(500)])
    listed = group[2]["text"]["text"]
    shown = listed.count("\n• ") + listed.startswith("• ")
    match = re.search(r"… \+(\d+) more resources: `burnwatch incidents` or the /incidents page lists them all$", listed)
    assert match and shown + int(match.group(1)) == 500
    assert "$531.00/h" in listed.split("\n")[0]  # the costliest first (i = 499: $32 + 499)
    digest = render_digest(big_digest())
    by_team = digest[2]["fields"][1]["text"]
    assert re.search(r"\+(\d+) more teams$", by_team)
    assert int(re.search(r"\+(\d+) more teams$", by_team).group(1)) + by_team.count("\n• ") == 40  # type: ignore[union-attr]


def test_the_largest_messages_post_through_slack_sdk():
    """slack-sdk to the local Slack, which refuses what Slack would (``invalid_blocks``):
    the largest alert, group and digest are accepted; an oversized one is refused."""
    with LocalSlack() as slack:
        notifier = SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=2)
        notifier.routing = ROUTING
        notifier.post(huge_alert("idle_gpu"))
        notifier.post_group([huge_alert("untagged", i) for i in range(500)])
        notifier.post_digest(big_digest(), render_digest(big_digest()), None)
        posts = slack.calls("chat.postMessage")
        assert [p.response["ok"] for p in posts] == [True, True, True]
        assert posts[0].body["text"].startswith("Idle GPUs on host-0-")
        too_big = [{"type": "section", "text": {"type": "mrkdwn", "text": "x" * (MAX_TEXT + 1)}}]
        with pytest.raises(Exception, match="invalid_blocks"):
            notifier._send("#ml-cost", "too big", too_big)
    hook = LocalSlack()
    with hook:
        webhook = SlackNotifier(webhook_url=hook.webhook_url, timeout=2)
        webhook.post(huge_alert("egress_runaway"))
        with pytest.raises(Exception, match="400"):
            webhook._send("", "too big", too_big)


def test_a_hostile_value_is_escaped_before_it_is_clipped():
    """The cut is made in the escaped text: an entity is never split, a mention never revived."""
    value = "&<>" * 2000
    blocks = render_blocks(huge_alert("idle_gpu", tags={"team": value, "owner": "bob", "project": value}))
    assert check(blocks) == []
    team = next(f["text"] for b in blocks for f in b.get("fields", []) if f["text"].startswith("*Team*"))
    assert team.startswith("*Team*\n&amp;&lt;&gt;") and team.endswith("…")
    assert escape("<!here>") == "&lt;!here&gt;"
    assert all(o.get("verbatim") is not True for o in block_objects(blocks))  # verbatim is added when sent
