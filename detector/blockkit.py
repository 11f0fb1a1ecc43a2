"""Slack's Block Kit limits in one place: the numbers, a checker, and the clipping every
message builder uses to stay inside them.

A message over a limit is not shortened by Slack: ``chat.postMessage`` answers
``invalid_blocks`` (or ``msg_blocks_too_long``) and the alert never reaches the channel.
Tag values, resource ids and team names come from events and may be 10 kB long, so each
builder (:mod:`detector.slack`, :mod:`detector.digest`, :mod:`detector.remediation.messages`)
cuts what it shows with :func:`clip` / :func:`clip_lines` (an "…" and what was left out,
never half an ``&amp;`` or half a ``<link|label>``) and passes its blocks through :func:`fit`
as a last guard; :func:`check` lists what would still be refused (the tests hold every
builder's largest message to it, and :class:`detector.testing.LocalSlack` refuses such a
message as Slack does).

The limits, as Slack documents them:

- 50 blocks per message: https://api.slack.com/reference/block-kit/blocks
- section ``text`` 3,000 characters; ``fields`` at most 10, each 2,000 characters; ``block_id``
  255: https://docs.slack.dev/reference/block-kit/blocks/section-block
- header ``plain_text`` 150 characters: https://docs.slack.dev/reference/block-kit/blocks/header-block
- context ``elements`` at most 10: https://docs.slack.dev/reference/block-kit/blocks/context-block
- actions ``elements`` at most 25: https://docs.slack.dev/reference/block-kit/blocks/actions-block
- button ``text`` 75, ``value`` 2,000, ``action_id`` 255, ``url`` 3,000:
  https://docs.slack.dev/reference/block-kit/block-elements/button-element
- a text object's ``text`` 3,000: https://docs.slack.dev/reference/block-kit/composition-objects/text-object
- a message's top-level ``text`` is truncated past 40,000 characters (4,000 recommended):
  https://docs.slack.dev/reference/methods/chat.postMessage and
  https://api.slack.com/changelog/2018-04-truncating-really-long-messages

Slack also refuses a message whose blocks are long in total (``msg_blocks_too_long``) well
before 50 × 3,000 characters; the threshold is undocumented (about 13,000 characters in
https://github.com/slackapi/bolt-js/issues/2509), so :data:`MAX_TOTAL_TEXT` keeps ours under
12,000.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "MAX_ACTION_ID", "MAX_ACTIONS_ELEMENTS", "MAX_BLOCKS", "MAX_BLOCK_ID", "MAX_BUTTON_TEXT", "MAX_BUTTON_VALUE",
    "MAX_CONTEXT_ELEMENTS", "MAX_FIELDS", "MAX_FIELD_TEXT", "MAX_HEADER_TEXT", "MAX_NOTIFICATION_TEXT",
    "MAX_TEXT", "MAX_TOTAL_TEXT", "check", "clip", "clip_lines", "fit",
]  # fmt: skip

MAX_BLOCKS = 50
MAX_TEXT = 3000
"""A section's text, and any text object's."""
MAX_HEADER_TEXT = 150
MAX_FIELDS = 10
MAX_FIELD_TEXT = 2000
MAX_CONTEXT_ELEMENTS = 10
MAX_ACTIONS_ELEMENTS = 25
MAX_BUTTON_TEXT = 75
MAX_BUTTON_VALUE = 2000
MAX_BUTTON_URL = 3000
MAX_ACTION_ID = 255
MAX_BLOCK_ID = 255
MAX_MESSAGE_TEXT = 40_000
"""Slack truncates a message's ``text`` past this."""
MAX_NOTIFICATION_TEXT = 300
"""Ours: a phone's notification shows the first line or two; more is noise."""
MAX_TOTAL_TEXT = 12_000
"""Ours: all the blocks' texts together, under Slack's undocumented ``msg_blocks_too_long``."""

ELLIPSIS = "…"
_ENTITY = re.compile(r"&(?:amp|lt|gt);")
_BROKEN_ENTITY = re.compile(r"&(?!(?:amp|lt|gt|quot|#\d+);)")


def clip(text: str, limit: int, more: str = "") -> str:
    """``text`` within ``limit`` characters: unchanged when it fits, else cut, ended with "…"
    and ``more`` (what was left out, e.g. "+37 more hosts"). The cut never leaves half an
    entity (``&am``), half a ``<link|label>`` or mention, or an open code span."""
    if len(text) <= limit:
        return text
    tail = ELLIPSIS + (f" {more}" if more else "")
    if len(tail) >= limit:
        return tail[:limit]
    cut = limit - len(tail)
    while True:
        kept = _safe_prefix(text, cut)
        closing = "`" if kept.count("`") % 2 else ""
        if len(kept) + len(closing) + len(tail) <= limit:
            return kept + closing + tail
        cut = len(kept) - 1


def _safe_prefix(text: str, cut: int) -> str:
    """``text[:cut]``, shortened so it ends outside an entity and outside ``<...>``."""
    kept = text[: max(0, cut)]
    amp = kept.rfind("&")
    if amp >= 0 and ";" not in kept[amp:] and _ENTITY.match(text, amp):
        kept = kept[:amp]
    lt = kept.rfind("<")
    if lt > kept.rfind(">"):
        kept = kept[:lt]
    if kept and "\ud800" <= kept[-1] <= "\udbff":  # never half a surrogate pair
        kept = kept[:-1]
    return kept


def clip_lines(lines: list[str], limit: int, more: Callable[[int], str] = lambda n: f"+{n} more",
               sep: str = "\n") -> str:  # fmt: skip
    """Whole lines joined by ``sep`` within ``limit``: all when they fit, else as many as fit
    followed by one saying how many were left out ("… " + ``more(n)``); a first line too long
    to leave room for that is itself :func:`clip`-ped."""
    joined = sep.join(lines)
    if len(joined) <= limit:
        return joined
    out: list[str] = []
    size = 0
    for i, line in enumerate(lines[:-1]):  # they do not all fit: at least the last is left out
        need = len(line) + (len(sep) if out else 0)
        if size + need + len(sep) + len(f"{ELLIPSIS} {more(len(lines) - i - 1)}") > limit:
            break
        out.append(line)
        size += need
    note = f"{ELLIPSIS} {more(len(lines) - len(out))}"
    if out:
        return sep.join([*out, note])
    room = limit - len(sep) - len(note)
    if room >= 20:  # the first line, cut, then what follows
        note = f"{ELLIPSIS} {more(len(lines) - 1)}"
        return clip(lines[0], limit - len(sep) - len(note)) + sep + note
    return clip(note, limit)


def _texts(block: dict[str, Any]) -> Iterable[tuple[str, dict[str, Any], int]]:
    """(where, text object, its limit) for every text object of a block."""
    kind = block.get("type")
    if kind == "header":
        yield "text", block["text"], MAX_HEADER_TEXT
    elif kind == "section":
        if "text" in block:
            yield "text", block["text"], MAX_TEXT
        for i, f in enumerate(block.get("fields") or []):
            yield f"fields[{i}]", f, MAX_FIELD_TEXT
    elif kind == "context":
        for i, e in enumerate(block.get("elements") or []):
            if e.get("type") in ("mrkdwn", "plain_text"):
                yield f"elements[{i}]", e, MAX_TEXT
    elif kind == "actions":
        for i, e in enumerate(block.get("elements") or []):
            if isinstance(e.get("text"), dict):
                yield f"elements[{i}].text", e["text"], MAX_BUTTON_TEXT


def check(blocks: list[dict[str, Any]], text: str | None = None) -> list[str]:
    """What Slack would refuse in a message (``blocks``, and its notification ``text``), one line
    each naming where ("blocks[3].fields[2]: 2,104 characters (max 2,000)"); [] when it fits."""
    problems: list[str] = []

    def over(where: str, size: int, limit: int, what: str = "characters") -> None:
        if size > limit:
            problems.append(f"{where}: {size:,} {what} (max {limit:,})")

    if text is not None:
        over("text", len(text), MAX_MESSAGE_TEXT)
        if not text.strip():
            problems.append("text: empty (the notification would show nothing)")
    over("blocks", len(blocks), MAX_BLOCKS, "blocks")
    total = 0
    for b, block in enumerate(blocks):
        at = f"blocks[{b}]"
        if "block_id" in block:
            over(f"{at}.block_id", len(block["block_id"]), MAX_BLOCK_ID)
        kind = block.get("type")
        if kind == "header" and block.get("text", {}).get("type") != "plain_text":
            problems.append(f"{at}.text: a header's text must be plain_text")
        if kind == "section":
            if "text" not in block and not block.get("fields"):
                problems.append(f"{at}: a section needs text or fields")
            over(f"{at}.fields", len(block.get("fields") or []), MAX_FIELDS, "fields")
        if kind == "context":
            over(f"{at}.elements", len(block.get("elements") or []), MAX_CONTEXT_ELEMENTS, "elements")
        if kind == "actions":
            elements = block.get("elements") or []
            over(f"{at}.elements", len(elements), MAX_ACTIONS_ELEMENTS, "elements")
            for i, e in enumerate(elements):
                over(f"{at}.elements[{i}].value", len(str(e.get("value", ""))), MAX_BUTTON_VALUE)
                over(f"{at}.elements[{i}].action_id", len(str(e.get("action_id", ""))), MAX_ACTION_ID)
                over(f"{at}.elements[{i}].url", len(str(e.get("url", ""))), MAX_BUTTON_URL)
        for where, obj, limit in _texts(block):
            value = obj.get("text", "")
            if not isinstance(value, str) or not value:
                problems.append(f"{at}.{where}: empty text (Slack refuses it)")
                continue
            total += len(value)
            over(f"{at}.{where}", len(value), limit)
            if _BROKEN_ENTITY.search(value):
                problems.append(f"{at}.{where}: a bare '&' (an entity cut in half, or text not escaped)")
            if obj.get("type") == "mrkdwn" and not _balanced(value):
                problems.append(f"{at}.{where}: an unclosed '<' or a stray '>' (a link or mention cut in half)")
    over("blocks (all texts together)", total, MAX_TOTAL_TEXT)
    return problems


def _balanced(text: str) -> bool:
    """Every ``<`` closed by a ``>`` before the next ``<``, and no ``>`` outside one (event text
    has its own escaped, so a bare one is half of a link)."""
    depth = 0
    for ch in text:
        if ch == "<":
            if depth:
                return False
            depth = 1
        elif ch == ">":
            if not depth:
                return False
            depth = 0
    return depth == 0


def fit(blocks: list[dict[str, Any]], keep_last: int = 1) -> list[dict[str, Any]]:
    """A copy of ``blocks`` inside the limits, whatever a builder made: texts :func:`clip`-ped,
    fields, elements and blocks dropped past their counts (the last ``keep_last`` blocks, the
    footer naming the alert, are kept: :meth:`detector.slack.SlackNotifier.find_posted` looks
    for it), then the longest texts shortened until the total is under :data:`MAX_TOTAL_TEXT`.
    Identifiers (``block_id``, ``action_id``, a button's ``value`` or ``url``) are never cut: a
    cut one would point a click at another incident; :func:`check` reports them."""
    out = copy.deepcopy(blocks)
    if len(out) > MAX_BLOCKS:
        tail = out[len(out) - keep_last:] if keep_last else []
        out = out[: MAX_BLOCKS - len(tail)] + tail
    for block in out:
        if block.get("type") == "section" and block.get("fields"):
            block["fields"] = block["fields"][:MAX_FIELDS]
        if block.get("type") == "context":
            block["elements"] = block["elements"][:MAX_CONTEXT_ELEMENTS]
        if block.get("type") == "actions":
            block["elements"] = block["elements"][:MAX_ACTIONS_ELEMENTS]
        for _, obj, limit in _texts(block):
            if isinstance(obj.get("text"), str):
                obj["text"] = clip(obj["text"], limit)
    texts = [obj for block in out for _, obj, _ in _texts(block) if isinstance(obj.get("text"), str)]
    excess = sum(len(o["text"]) for o in texts) - MAX_TOTAL_TEXT
    while excess > 0:
        longest = max(texts, key=lambda o: len(o["text"]))
        size = len(longest["text"])
        if size <= 200:
            break  # nothing long left to shorten (cannot happen within 50 blocks' worth of short texts)
        longest["text"] = clip(longest["text"], max(200, size - excess))
        excess -= size - len(longest["text"])
    return out
