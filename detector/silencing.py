"""``burnwatch silence add|list|expire``: silences kept in ``rules/silences.yaml``.

Silences are part of the rules, so the worker takes a new one up with its hot reload
(within seconds) and a replay is silenced exactly as the live stream was. A silence
holds back the alerts that open in [starts, until) of event time; ``add`` starts it now
(or at ``--start``), ``expire`` ends it now, so it keeps covering only what opened while
it was in force. The CLI writes only its own file (``silences.yaml`` beside the rules),
validates the whole rules directory with the change before keeping it, and never
rewrites a file a person edits by hand.
"""

from __future__ import annotations

import difflib
import hashlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from detector.rules import Match, RulesInvalid, Silence, load_rules, matches_everything, validate_rule_files
from detector.suppression.silence import SilenceInvalid
from detector.units import parse_rfc3339, rfc3339

__all__ = ["SILENCES_FILE", "add_silence", "expire_silence", "list_silences", "parse_match", "parse_time"]

SILENCES_FILE = "silences.yaml"
_HEADER = "# Silences written by `burnwatch silence add`; the worker reloads this file like any rule file.\n"


def parse_match(pairs: list[str]) -> Match:
    """``["team=nlp", "resource_type=notebook"]`` → a :class:`Match` (tags for unknown keys)."""
    fields: dict[str, Any] = {}
    tags: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"--match {pair!r}: expected KEY=VALUE, e.g. team=nlp")
        if key in Match.model_fields and key != "tags":
            fields[key] = value
        else:
            tags[key.removeprefix("tags.")] = value
    return Match(**fields, tags=tags)


def tag_warnings(match: Match, rules_dir: Path) -> list[str]:
    """A tag the silence matches on that the rules beside it never name, and that is close to one they do
    (``tema=nlp`` where routing goes by ``team``): valid (a tag of any name may be matched), so said, not
    refused; a silence on a misspelled tag silences nothing, and nothing else would say so."""
    try:
        ruleset = load_rules(rules_dir)
    except RulesInvalid:
        return []
    named = set(ruleset.named_tags)
    said = []
    for key in match.tags:
        near = difflib.get_close_matches(key, sorted(named - {key}), n=1, cutoff=0.6) if key not in named else []
        if near:
            said.append(f"--match {key}=...: no rule or routing names a tag {key!r}; did you mean {near[0]!r}? "
                        "(a silence on a tag no resource has silences nothing)")  # fmt: skip
    return said


def parse_time(text: str) -> float:
    """``2026-11-02T00:00:00Z`` (RFC 3339, with its zone) → epoch seconds."""
    return parse_rfc3339(text, "--start")


def _file(rules_dir: Path) -> Path:
    if not rules_dir.is_dir():
        raise ValueError(f"{rules_dir}: silences are written beside the rules, which must be a directory")
    return rules_dir / SILENCES_FILE


def _read(path: Path) -> list[dict[str, Any]]:
    """The silences the file holds, once the rules beside it (the file among them) load: a hand edit
    that broke it (invalid YAML, a list where a mapping goes) is :class:`RulesInvalid`, naming its line."""
    if not path.exists():
        return []
    _, errors, _ = validate_rule_files(path.parent)
    if errors:
        raise RulesInvalid(errors)
    data = yaml.safe_load(path.read_text()) or {}
    return list(data.get("silences") or [])


def _write_checked(rules_dir: Path, path: Path, silences: list[dict[str, Any]]) -> None:
    """Write, then load the whole rules directory; on any error put the old file back."""
    old = path.read_text() if path.exists() else None
    path.write_text(_HEADER + yaml.safe_dump({"silences": silences}, sort_keys=False, allow_unicode=True))
    try:
        load_rules(rules_dir)
    except RulesInvalid:
        if old is None:
            path.unlink()
        else:
            path.write_text(old)
        raise


def add_silence(rules_dir: str | Path, match: Match, *, types: list[str], rules: list[str], starts: float,
                until: float, reason: str, created_by: str = "") -> Silence:  # fmt: skip
    """Append a silence to ``silences.yaml``; return it (with its new id). One without a matcher
    is refused (:class:`SilenceInvalid`): it would hold back every alert."""
    if matches_everything(match) and not types and not rules:
        said = "one without" if match == Match() else "--match with only '*' patterns matches every value, so it"
        raise SilenceInvalid(f"refused: a silence needs at least one matcher (--match KEY=VALUE, --type or --rule); "
                             f"{said} would hold back every alert")  # fmt: skip
    if until <= starts:
        raise SilenceInvalid("refused: the silence would end before it starts")
    rules_dir = Path(rules_dir)
    path = _file(rules_dir)
    entry: dict[str, Any] = {
        "match": match.model_dump(exclude_defaults=True),
        "types": types,
        "rules": rules,
        "starts": rfc3339(starts),
        "until": rfc3339(until),
        "reason": reason,
        "created_by": created_by,
    }
    entry["id"] = hashlib.blake2b(repr(sorted(entry.items())).encode(), digest_size=4).hexdigest()
    entry = {"id": entry.pop("id"), **entry}
    _write_checked(rules_dir, path, [*_read(path), entry])
    return Silence.model_validate(entry)


def expire_silence(rules_dir: str | Path, silence_id: str, now: float) -> Silence:
    """End a silence written by the CLI now (its record stays, with the earlier end): it keeps
    holding back what opened while it was in force, and nothing after. One not started yet
    ends where it starts, covering nothing."""
    rules_dir = Path(rules_dir)
    path = _file(rules_dir)
    entries = _read(path)
    for entry in entries:
        if entry.get("id") == silence_id:
            starts = parse_time(str(entry["starts"])) if "starts" in entry else now
            entry.setdefault("starts", rfc3339(starts))  # written before silences had a start
            entry["until"] = rfc3339(max(now, starts))
            _write_checked(rules_dir, path, entries)
            return Silence.model_validate(entry)
    raise KeyError(f"no silence {silence_id!r} in {path} (only silences added with the CLI can be expired by id)")


def list_silences(rules_path: str | Path, now: float) -> list[dict[str, Any]]:
    """Every silence in the rule files, with its state at ``now``: pending (starts later),
    active (in force) or expired."""
    _, errors, silences = validate_rule_files(rules_path)
    if errors:
        raise RulesInvalid(errors)
    out = []
    for s in silences:
        starts, until = s.starts.timestamp(), s.until.timestamp()
        state = "pending" if now < starts else "active" if now < until else "expired"
        out.append({
            "id": s.id or "(file)", "state": state, "active": state == "active", "starts": rfc3339(starts),
            "until": rfc3339(until),
            "match": s.match.model_dump(exclude_defaults=True) or "(any resource)",
            "types": s.types or "(all)", "rules": s.rules or "(all)", "reason": s.reason, "created_by": s.created_by,
        })  # fmt: skip
    return out


def now_utc() -> float:
    return datetime.now(timezone.utc).timestamp()
