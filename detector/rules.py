"""Rule files: validation with file:line errors, and compilation into a :class:`RuleSet`.

Every rule file is checked in full before anything runs and every error is
reported at once, in the form ``rules/team-nlp.yaml:14 rules[2].params.for:
invalid duration '30 minutes'; expected e.g. 30m``. Rules are compiled once
(durations parsed, selectors turned into predicates), never interpreted per
event.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal, Union, cast, get_args

import yaml
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from detector.detectors import REGISTRY, Detector, ResourceInfo
from detector.limits import LIMITS_FILE, Limits
from detector.outputs.config import (
    OUTPUT_KINDS,
    OutputName,
    OutputSpec,
    Send,
    check_outputs,
    check_send,
    outputs_for,
    template_fields,
)
from detector.pricing import Pricing
from detector.remediation.spec import ActionSpec, kind_error, mode_error
from detector.suppression.silence import Silence as CompiledSilence
from detector.tag_names import TagNames
from detector.units import Duration, Percent, _parse_percent, format_duration, parse_duration

__all__ = [
    "Approvers",
    "consistency_warnings",
    "unit_warnings",
    "LINK_FIELDS",
    "Link",
    "Match",
    "RuleError",
    "Routing",
    "RuleSet",
    "RulesInvalid",
    "compile_match",
    "explain",
    "load_rules",
    "matches_everything",
    "parse_rule",
    "validate_rule_files",
]

SPECIAL_FILES = {"pricing.yaml": "pricing", "routing.yaml": "routing", LIMITS_FILE: "limits"}
FILE_KEYS = ("rules", "silences", "allow_no_rules")
Selector = Union[str, list[str]]


class Match(BaseModel):
    """Which resources a rule applies to. Globs (``p4d.*``); ``!`` negates (``!dev-*``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    resource_id: Selector | None = None
    resource_type: Selector | None = None
    account: Selector | None = None
    region: Selector | None = None
    instance_type: Selector | None = None
    tags: dict[str, Selector] = {}


_MATCH_FIELDS = ("resource_id", "resource_type", "account", "region", "instance_type")
"""A :class:`Match`'s selectors besides ``tags``: what a silence narrows by and a rule matches on."""

Severity = Literal["info", "warning", "critical"]


class Override(BaseModel):
    """Different params (or severity) for the resources an override's ``match`` selects,
    e.g. a longer idle time for the research team, without copying the rule."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    match: Match
    params: dict[str, Any] = {}
    severity: Severity | None = None


class Route(BaseModel):
    """A rule's own destination, ahead of routing by team."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    channel: Annotated[str, Field(min_length=1)]


LINK_FIELDS = frozenset({"resource_id", "region", "account", "type", "rule", "alert_id", "instance_type", "team",
                         "owner", "project", "episode_start", "fired_at"})  # fmt: skip


class Link(BaseModel):
    """A link shown on every alert: ``url`` is a template over the alert's fields
    (``{resource_id}``, ``{region}``, ``{account}``, ``{type}``, ``{rule}``, ``{alert_id}``,
    ``{instance_type}``, ``{team}``, ``{owner}``, ``{project}``, ``{episode_start}``,
    ``{fired_at}``), each URL-quoted."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: Annotated[str, Field(min_length=1)]
    url: Annotated[str, Field(pattern=r"^https?://")]
    types: list[str] = []
    """Rule types it applies to; empty: every type."""

    @field_validator("url")
    @classmethod
    def _known_fields(cls, url: str) -> str:
        try:
            names = template_fields(url)
        except ValueError as exc:
            raise ValueError(f"invalid URL template: {exc}") from None
        unknown = sorted(names - LINK_FIELDS)
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)} in the URL; known: {', '.join(sorted(LINK_FIELDS))}")
        return url


SLACK_USER_ID = re.compile(r"[UW][A-Z0-9]{2,20}")
"""A Slack user id: ``U012AB3CD``, or ``W...`` on Enterprise Grid (a user group's is ``S...``)."""


def _slack_id(value: str) -> str:
    if not re.fullmatch(r"[UWS][A-Z0-9]{2,20}", value):
        raise ValueError(f"{value[:40]!r} is not a Slack user id (U012AB3CD, W... on Enterprise Grid) or user "
                         "group id (S0123ABCD); a name or @mention cannot be checked against a click")  # fmt: skip
    return value


SlackId = Annotated[str, AfterValidator(_slack_id)]
"""A Slack user id (``U…``, ``W…`` on Enterprise Grid) or user group id (``S…``)."""


class Approvers(BaseModel):
    """Who may approve an action (``routing.yaml``'s ``approvers``): per team (the
    ``by_tag`` tag's value), else ``default``; with ``owner: true`` also the resource's
    owner (``users``). Nobody else: a click from anyone else is refused and recorded."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    default: list[SlackId] = []
    teams: dict[str, list[SlackId]] = {}
    owner: bool = False


class Routing(BaseModel):
    """``rules/routing.yaml``: which Slack channel an alert goes to, who to mention, what to link.

    A rule's ``route`` wins; then the channel for the alert's severity (``by_severity``);
    then the channel mapped from the resource's ``by_tag`` tag (its team); then
    ``default_channel``; then the notifier's own (``SLACK_CHANNEL``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    default_channel: str = ""
    by_tag: str = "team"
    channels: dict[str, str] = {}
    by_severity: dict[Severity, str] = {}
    owner_tag: str = "owner"
    users: dict[str, str] = {}
    """Owner tag value → Slack user id (``U012AB3CD``), so alerts mention the owner."""
    links: list[Link] = []
    approvers: Approvers = Approvers()

    def approvers_for(self, tags: dict[str, str]) -> tuple[list[str], str]:
        """(Slack user and group ids who may approve an action, the owner's user id or '')
        for a resource with ``tags``: its team's list, else the default."""
        team = tags.get(self.by_tag, "")
        ids = self.approvers.teams.get(team, self.approvers.default) if team else self.approvers.default
        owner = self.users.get(tags.get(self.owner_tag, ""), "") if self.approvers.owner else ""
        return list(ids), owner
    # Outputs besides Slack and which alerts go to them (detector/outputs/config.py, docs/outputs.md).
    outputs: dict[OutputName, OutputSpec] = {}
    send: Send = Send()

    _send_known = field_validator("send")(check_send)

    @field_validator("outputs")
    @classmethod
    def _outputs_valid(cls, outputs: dict[str, Any]) -> dict[str, Any]:
        return check_outputs(outputs, LINK_FIELDS)

    def outputs_for(self, tags: dict[str, str], severity: str) -> list[str]:
        """The outputs (names; ``slack`` for Slack) an alert on a resource with ``tags`` goes to."""
        return outputs_for(self.send, self.outputs, tags.get(self.by_tag, ""), severity)


class Silence(BaseModel):
    """Findings it matches are recorded but not posted when their opening's event time falls
    in [``starts``, ``until``). It needs at least one matcher (``match``, ``rules``, ``types``).

    Example::

        silences:
          - match: {tags: {team: nlp}}
            types: [idle_gpu]
            starts: 2026-11-30T20:00:00Z
            until: 2026-12-01T08:00:00Z
            reason: cluster drained for the driver upgrade
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    id: str = ""
    """Set by ``burnwatch silence add``, for ``burnwatch silence expire``."""
    match: Match = Match()
    rules: list[str] = []
    """Rule names it applies to; empty: every rule."""
    types: list[str] = []
    """Rule types it applies to; empty: every type."""
    starts: AwareDatetime
    until: AwareDatetime
    reason: Annotated[str, Field(min_length=1)]
    created_by: str = ""

    @field_validator("types")
    @classmethod
    def _known_types(cls, types: list[str]) -> list[str]:
        unknown = [t for t in types if t not in REGISTRY]
        if unknown:
            raise ValueError(f"unknown rule type(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(REGISTRY))}")
        return types

    @model_validator(mode="after")
    def _bounded(self) -> Silence:
        if matches_everything(self.match) and not self.rules and not self.types:
            said = "one without" if self.match == Match() else f"{_shown_match(self.match)} matches every value, so it"
            raise ValueError(f"a silence needs at least one matcher (match, types or rules): {said} would hold "
                             "back every alert")  # fmt: skip
        if self.until < self.starts:
            raise ValueError(f"until ({self.until.isoformat()}) is before starts ({self.starts.isoformat()})")
        return self


class RuleBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    enabled: bool = True
    description: str = ""
    match: Match = Match()
    severity: Severity = "warning"
    overrides: list[Override] = []
    """First match wins; a resource no override selects gets the rule's own params."""
    route: Route | None = None
    realert: Duration = 0.0
    """The minimum event time between two posted alerts of this rule on one resource: a
    problem that comes back sooner is recorded, not posted. 0: every episode is posted."""
    action: ActionSpec = ActionSpec()
    """What to do about an incident besides telling people (docs/actions.md); the default,
    ``notify_only``, does nothing."""


def _literal(value: str) -> Any:
    """``Literal[value]`` for a value known only at run time (a type checker cannot see it)."""
    return cast(Any, Literal)[value]


def _rule_models() -> Any:
    models = [
        create_model(
            f"{cls.__name__}Rule",
            __base__=RuleBase,
            type=(_literal(cls.type), ...),
            params=(cls.Params, cls.Params()),
        )
        for cls in REGISTRY.values()
    ]
    return Annotated[Union[tuple(models)], Field(discriminator="type")]


_RULE: TypeAdapter[Any] = TypeAdapter(_rule_models())


def parse_rule(data: dict[str, Any]) -> Any:
    """One rule from its mapping, validated as a rule file's entry is (``ValidationError`` if not)."""
    return _RULE.validate_python(data)


# -- selectors ------------------------------------------------------------------


def _compile_selector(selector: Selector) -> Callable[[str | None], bool]:
    patterns = [selector] if isinstance(selector, str) else list(selector)
    include = [p for p in patterns if not p.startswith("!")]
    exclude = [p[1:] for p in patterns if p.startswith("!")]
    inc = re.compile("|".join(fnmatch.translate(p) for p in include)) if include else None
    exc = re.compile("|".join(fnmatch.translate(p) for p in exclude)) if exclude else None

    def matches(value: str | None) -> bool:
        if value is None:  # a missing tag: only a purely negative selector (``!*``) accepts it
            return inc is None
        if inc is not None and not inc.match(value):
            return False
        return exc is None or not exc.match(value)

    return matches


def _matches_any_value(selector: Selector) -> bool:
    """Whether a selector takes every value: one of its globs is only ``*`` (and ``?``: any value
    that long), and nothing is excluded."""
    patterns = [selector] if isinstance(selector, str) else list(selector)
    if any(p.startswith("!") for p in patterns):
        return False
    return any("*" in p and set(p) <= {"*", "?"} for p in patterns)


def _selectors(match: Match) -> dict[str, Selector]:
    fields = {a: s for a in _MATCH_FIELDS if (s := getattr(match, a)) is not None}
    return {**fields, **{f"tags.{k}": v for k, v in match.tags.items()}}


def matches_everything(match: Match) -> bool:
    """Whether ``match`` narrows nothing: no selector, or only ones like ``resource_id: '*'`` or
    ``team: '*'``. A silence needs more than that (it would hold back every alert)."""
    return all(_matches_any_value(s) for s in _selectors(match).values())


def _shown_match(match: Match) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in _selectors(match).items())[:200]


def compile_match(match: Match) -> Callable[[ResourceInfo], bool]:
    """Turn a :class:`Match` into one predicate over a resource. ``team: '!*'`` selects resources without a team tag."""
    checks: list[Callable[[ResourceInfo], bool]] = []
    for attr in _MATCH_FIELDS:
        selector = getattr(match, attr)
        if selector is not None:
            checks.append(_field_check(attr, _compile_selector(selector)))
    for tag, selector in match.tags.items():
        checks.append(_tag_check(tag, _compile_selector(selector)))
    return lambda resource: all(check(resource) for check in checks)


def _field_check(attr: str, test: Callable[[str | None], bool]) -> Callable[[ResourceInfo], bool]:
    return lambda resource: test(getattr(resource, attr))


def _tag_check(tag: str, test: Callable[[str | None], bool]) -> Callable[[ResourceInfo], bool]:
    return lambda resource: test(resource.tags.get(tag))


# -- loading with file:line errors -----------------------------------------------


@dataclass(frozen=True)
class RuleError:
    file: str
    line: int
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where} {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class RulesInvalid(ValueError):
    """Raised with every error of every file, so one run shows them all."""

    def __init__(self, errors: list[RuleError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser where PyYAML was built with it (the wheels are): the pure-Python one took a
third of a second over the shipped rules, at every command's start."""


_LIBYAML_MAX_INDICATORS = 5_000
"""libyaml's composer recurses in C, a frame a level of nesting: some 30,000 levels (60 KB of
brackets) overflow the stack, a segfault and not an error. Each level takes one of ``[{-?:``;
a text with more of them than this (the shipped files have a few hundred) is parsed by the
pure-Python loader, whose recursion is Python's: :class:`NestedTooDeeply`."""


class NestedTooDeeply(yaml.YAMLError):
    """A document deeper than its parse can recurse: an error of the file, not a crash."""

    def __init__(self) -> None:
        super().__init__("nested too deeply")


def parse_yaml(text: str) -> tuple[dict[tuple, int], Any]:
    """The line of each key path (:func:`_line_index`) and the document's data, parsed once: what
    ``yaml.compose`` and ``yaml.safe_load`` give, without reading the text twice. A document
    deeper than Python can walk is :class:`NestedTooDeeply`, as any YAML error. A text
    libyaml refuses is read again by the pure-Python loader for its error, which names what
    libyaml's does not (the character: "found character '\\t'", the alias)."""
    if _Loader is yaml.SafeLoader or sum(map(text.count, "[{-?:")) > _LIBYAML_MAX_INDICATORS:
        return _parse(text, yaml.SafeLoader)
    try:
        return _parse(text, _Loader)
    except yaml.YAMLError:
        try:
            _parse(text, yaml.SafeLoader)  # raises its own error; where it reads the text, libyaml's stands
        except NestedTooDeeply:
            pass
        raise


def _parse(text: str, loader_class: Any) -> tuple[dict[tuple, int], Any]:
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return {}, None
        return _line_index(node), loader.construct_document(node)
    except RecursionError:  # the pure-Python parse, or the walk over libyaml's deeper one
        raise NestedTooDeeply from None
    finally:
        loader.dispose()


def _read_text(path: Path) -> str:
    """The file's text, UTF-8 as YAML's is; :class:`UnicodeDecodeError` where it is not."""
    return path.read_bytes().decode("utf-8")


def _not_utf8(file: str, exc: UnicodeDecodeError) -> RuleError:
    """A file not in UTF-8 (saved as Latin-1, say) as an error of that file at that line."""
    line = exc.object[: exc.start].count(b"\n") + 1
    return RuleError(file, line, "", f"cannot read: not UTF-8 (byte 0x{exc.object[exc.start]:02x})")


class DuplicateKey(yaml.MarkedYAMLError):
    """A key given twice in one mapping: YAML keeps the last silently, so a second ``rules:`` block
    appended to a file would drop every rule above it. Refused as an error of the file."""

    def __init__(self, key: str, first_line: int, mark: yaml.Mark) -> None:
        super().__init__(problem=f"duplicate key {key!r} (first at line {first_line}); YAML would keep only the last",
                         problem_mark=mark)  # fmt: skip

    def __str__(self) -> str:
        return str(self.problem)


def _line_index(node: yaml.Node, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """Map each key path in a YAML document to its 1-based line; a key given twice is :class:`DuplicateKey`."""
    out = {} if out is None else out
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value != "<<":
                same = (key.tag, key.value)  # 1 and "1" are two keys
                if same in seen:
                    raise DuplicateKey(key.value, seen[same], key.start_mark)
                seen[same] = key.start_mark.line + 1
            child = path + (key.value,)
            out[child] = key.start_mark.line + 1
            _line_index(value, child, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_index(item, path + (i,), out)
    return out


def _format_path(loc: Iterable[Any]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _clean_loc(loc: tuple) -> tuple:
    """Drop the union tag pydantic inserts after ``rules[i]`` (and ``outputs.<name>``)."""
    if len(loc) > 2 and loc[0] == "rules" and isinstance(loc[1], int) and loc[2] in REGISTRY:
        return loc[:2] + loc[3:]
    if len(loc) > 2 and loc[0] == "outputs" and loc[2] in OUTPUT_KINDS:  # routing.yaml: outputs.<name>.<kind>
        return loc[:2] + loc[3:]
    return loc


def _alias_loc(loc: tuple) -> tuple:
    return tuple("for" if part == "for_" else part for part in loc)


def _type_error(rule: Any, loc: tuple, file: str, lines: dict[tuple, int]) -> RuleError | None:
    if not isinstance(rule, dict) or (isinstance(rule.get("type"), str) and rule["type"] in REGISTRY):
        return None
    if "type" not in rule:  # pydantic says "Unable to extract tag using discriminator 'type'"
        where = lines.get(loc + ("name",), lines.get(loc, 0))
        return RuleError(file, where, _format_path(loc + ("type",)), f"missing; known types: {', '.join(sorted(REGISTRY))}")
    near = difflib.get_close_matches(str(rule["type"]), list(REGISTRY), n=1)
    hint = f"; did you mean {near[0]!r}?" if near else f"; known types: {', '.join(sorted(REGISTRY))}"
    loc = loc + ("type",)
    return RuleError(file, lines.get(loc, 0), _format_path(loc), f"unknown rule type {rule['type']!r}{hint}")


def _errors_from(exc: ValidationError, prefix: tuple, file: str, lines: dict[tuple, int]) -> list[RuleError]:
    return _rule_errors(exc.errors(), prefix, file, lines)


def _rule_errors(found: Iterable[Any], prefix: tuple, file: str, lines: dict[tuple, int]) -> list[RuleError]:
    """pydantic's errors (``found``: ``ValidationError.errors()``) at ``prefix``, each with its line."""
    errors = []
    for err in found:
        loc = _alias_loc(_clean_loc(prefix + tuple(err["loc"])))
        line = next((lines[loc[:n]] for n in range(len(loc), -1, -1) if loc[:n] in lines), 0)
        message = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden" and len(loc) >= 2 and loc[-2] == "match":
            near = difflib.get_close_matches(str(loc[-1]), [*_MATCH_FIELDS, "tags"], n=1)
            message += (f"; did you mean {near[0]!r}?" if near else
                        f"; match takes {', '.join(_MATCH_FIELDS)} and tags, a tag under tags: "
                        f"{{tags: {{{loc[-1]}: ...}}}}")  # fmt: skip
        errors.append(RuleError(file, line, _format_path(loc), message))
    return errors


@dataclass
class _RuleFile:
    rules: list[Any] = field(default_factory=list)
    silences: list[Silence] = field(default_factory=list)
    errors: list[RuleError] = field(default_factory=list)
    allow_no_rules: bool = False
    """The file says that no enabled rule (detection off) is intended."""
    names: list[tuple[int, str, int]] = field(default_factory=list)
    """(index, name, line) of every rule that has a name, valid or not: duplicates are
    reported with the file's other errors, not only once those are fixed."""


def _validate_file(path: Path) -> _RuleFile:
    """Validate one file rule by rule, so one bad rule does not hide the errors of the others."""
    file = str(path)
    try:
        text = _read_text(path)
    except OSError as exc:
        return _RuleFile(errors=[RuleError(file, 0, "", f"cannot read: {exc.strerror}")])
    except UnicodeDecodeError as exc:
        return _RuleFile(errors=[_not_utf8(file, exc)])
    try:
        lines, data = parse_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = f"invalid YAML: {getattr(exc, 'problem', exc)}"
        return _RuleFile(errors=[RuleError(file, mark.line + 1 if mark else 0, "", problem)])
    if data is None:
        return _RuleFile()
    if not isinstance(data, dict) or set(data) - set(FILE_KEYS):
        keys = "'rules', 'silences' and 'allow_no_rules'"
        return _RuleFile(errors=[RuleError(file, 1, "", f"a rule file is a mapping with the keys {keys}")])
    items = data.get("rules") or []
    if not isinstance(items, list):
        return _RuleFile(errors=[RuleError(file, lines.get(("rules",), 0), "rules", "expected a list of rules")])
    silence_items = data.get("silences") or []
    if not isinstance(silence_items, list):
        return _RuleFile(errors=[RuleError(file, lines.get(("silences",), 0), "silences", "expected a list of silences")])
    names = [(i, item["name"], lines.get(("rules", i, "name"), 0)) for i, item in enumerate(items)
             if isinstance(item, dict) and isinstance(item.get("name"), str)]  # fmt: skip
    allow = data.get("allow_no_rules", False)
    if not isinstance(allow, bool):
        line = lines.get(("allow_no_rules",), 0)
        return _RuleFile(errors=[RuleError(file, line, "allow_no_rules", f"expected true or false, got {allow!r}")])
    rules, silences, errors = [], [], []
    for i, item in enumerate(silence_items):
        try:
            silences.append(Silence.model_validate(item))
        except ValidationError as exc:
            errors.extend(_errors_from(exc, ("silences", i), file, lines))
    for i, item in enumerate(items):
        type_error = _type_error(item, ("rules", i), file, lines)
        if type_error:
            errors.append(type_error)
            continue
        try:
            rule = parse_rule(item)
        except ValidationError as exc:
            errors.extend(_errors_from(exc, ("rules", i), file, lines))
            errors.extend(_override_errors_beside(item, i, file, lines))
            continue
        refused = kind_error(rule.action.kind, rule.type)
        field = "kind"
        if refused is None and rule.action.acts:
            refused, field = mode_error(rule.action.mode, rule.type), "mode"
        if refused:
            loc = ("rules", i, "action", field)
            errors.append(RuleError(file, lines.get(loc, lines.get(("rules", i), 0)), _format_path(loc), refused))
            continue
        override_errors = []
        for j, override in enumerate(rule.overrides):
            try:
                _override_params(rule, override)
            except ValidationError as exc:
                override_errors.extend(_errors_from(exc, ("rules", i, "overrides", j, "params"), file, lines))
        errors.extend(override_errors)
        if not override_errors:
            rules.append(rule)
    if errors:
        return _RuleFile(errors=errors, names=names)
    return _RuleFile(rules, silences, allow_no_rules=allow, names=names)


def _override_errors_beside(item: dict[str, Any], i: int, file: str, lines: dict[tuple, int]) -> list[RuleError]:
    """The errors of an invalid rule's overrides' params, in the same round as the rule's own: merged onto
    the rule's params where those are valid (else the detector's defaults), each override's params checked
    key by key (an error no key of the override's own names waits for the rule to be valid)."""
    kind = item.get("type") if isinstance(item, dict) else None
    cls = REGISTRY.get(kind) if isinstance(kind, str) else None
    overrides = item.get("overrides") if cls is not None else None
    if cls is None or not isinstance(overrides, list):
        return []
    try:
        base = cls.Params.model_validate(item.get("params") or {}).model_dump(by_alias=True)
    except (ValidationError, TypeError, ValueError):
        base = cls.Params().model_dump(by_alias=True)
    errors = []
    for j, override in enumerate(overrides):
        params = override.get("params") if isinstance(override, dict) else None
        if not isinstance(params, dict) or not params:
            continue
        try:
            cls.Params.model_validate({**base, **params})
        except ValidationError as exc:
            own = [e for e in exc.errors() if e["loc"] and e["loc"][0] in params]
            errors.extend(_rule_errors(own, ("rules", i, "overrides", j, "params"), file, lines))
    return errors


def _override_params(rule: Any, override: Override) -> Any:
    """The rule's params with the override's on top, validated by the detector's own model."""
    merged = {**rule.params.model_dump(by_alias=True), **override.params}
    return type(rule.params).model_validate(merged)


def _rule_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.glob("*.y*ml") if p.name not in SPECIAL_FILES)
    return [path]


def _unit_validators(info: FieldInfo) -> list[Any]:
    """A field's validators, those of an optional one's (``patience_for: Duration | None``) included."""
    return [*info.metadata, *(v for arg in get_args(info.annotation) for v in getattr(arg, "__metadata__", ()))]


def _unit_fields(model: type[BaseModel]) -> dict[Any, list[Any]]:
    """Each key a rule file may give ``model``'s field under (its alias, and its name: ``for`` and ``for_``)
    with the field's validators."""
    return {key: _unit_validators(f) for name, f in model.model_fields.items() for key in {name, f.alias or name}}


def _written(number: Decimal) -> str:
    """A number as a person writes it: ``60``, ``0.00001``, ``1000000``, never ``1e-05`` or ``1e+06`` (a
    duration so written does not parse) nor rounded to six digits (``0.123457`` for ``0.1234567``)."""
    return format(number.normalize(), "f")


def unit_warnings(path: str | Path) -> list[str]:
    """Numbers the rule files under ``path`` give without a unit where a person may well mean another than
    the one burnwatch reads: a duration as a bare number is seconds (``for: 30`` is 30 s, where a person
    may mean minutes: an idle GPU alerted after half a minute, a crash-loop ``loop_window: 6`` of six
    seconds, which catches no loop; an action's ``after: 2`` two seconds), and a percentage below 1 as a bare
    number is that many percent (``util_below: 0.05`` is 0.05 %, where a person may mean a fraction, 5 %).
    Valid, so said, not refused: ``file:line field: ...``, for ``rules check`` and the worker's log. Files
    that do not parse, or parse to no valid rule file, say nothing here (their errors are the loader's)."""
    duration, percent = get_args(Duration)[1], get_args(Percent)[1]  # their validators, as a field's metadata holds them
    action_fields = _unit_fields(ActionSpec)
    said: list[str] = []
    for file in _rule_files(Path(path)) if Path(path).exists() else []:
        try:
            lines, data = parse_yaml(_read_text(file))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        items = data.get("rules") if isinstance(data, dict) else None
        for i, item in enumerate(items if isinstance(items, list) else []):
            if not isinstance(item, dict):
                continue
            cls = REGISTRY.get(item["type"]) if isinstance(item.get("type"), str) else None
            fields = _unit_fields(cls.Params) if cls else {}
            overrides = item.get("overrides")
            places: list[tuple[tuple[Any, ...], Any, list[Any]]] = [(("rules", i, "realert"), item.get("realert"), [duration])]
            for where, params, known in [(("rules", i, "params"), item.get("params"), fields),
                                         (("rules", i, "action"), item.get("action"), action_fields),
                                         *((("rules", i, "overrides", j, "params"), o.get("params"), fields)
                                           for j, o in enumerate(overrides if isinstance(overrides, list) else [])
                                           if isinstance(o, dict))]:  # fmt: skip
                if isinstance(params, dict):
                    places += [((*where, key), raw, known.get(key, [])) for key, raw in params.items()]
            for loc, raw, metadata in places:
                if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 < raw < float("inf"):
                    continue
                number = Decimal(raw) if isinstance(raw, int) else Decimal(repr(raw))
                as_written = _written(number)
                at = f"{file}:{lines.get(loc, lines.get(loc[:3], 0))} {_format_path(loc)}: {as_written}"
                if duration in metadata and not (raw % 60 == 0 and raw >= 60):
                    said.append(f"{at} has no unit: read as {as_written} seconds; write {as_written}s to say so, "
                                f"or {as_written}m")  # fmt: skip
                elif percent in metadata and number < 1:
                    said.append(f"{at} is read as {as_written}%, not {_written(number * 100)}%; write {as_written}% "
                                f"to say so, or {_written(number * 100)}%")  # fmt: skip
    return said


def validate_rule_files(path: str | Path) -> tuple[list[tuple[Path, Any]], list[RuleError], list[Silence]]:
    """Validate every rule file under ``path``; return the rules with their files, all errors,
    and the silences."""
    rules, errors, silences, _ = _validate_rule_files(path)
    return rules, errors, silences


def _validate_rule_files(path: str | Path) -> tuple[list[tuple[Path, Any]], list[RuleError], list[Silence], bool]:
    """:func:`validate_rule_files`, and whether a file allows no enabled rule."""
    path = Path(path)
    if not path.exists():
        return [], [RuleError(str(path), 0, "", "no such file or directory")], [], False
    rules: list[tuple[Path, Any]] = []
    errors: list[RuleError] = []
    silences: list[tuple[Path, int, Silence]] = []
    seen: dict[str, str] = {}
    allow_no_rules = False
    for file in _rule_files(path):
        contents = _validate_file(file)
        errors.extend(contents.errors)
        allow_no_rules = allow_no_rules or contents.allow_no_rules
        silences.extend((file, i, s) for i, s in enumerate(contents.silences))
        for i, name, line in contents.names:
            if name in seen:
                errors.append(RuleError(str(file), line, f"rules[{i}].name",
                                        f"duplicate rule name {name!r} (also in {seen[name]})"))  # fmt: skip
            seen.setdefault(name, f"{file}:{line}")
        rules.extend((file, rule) for rule in contents.rules)
    for file, i, silence in silences:
        for name in silence.rules:
            if name not in seen:
                errors.append(RuleError(str(file), 0, f"silences[{i}].rules", f"no rule named {name!r}"))
    return rules, errors, [s for _, _, s in silences], allow_no_rules


# -- the compiled rule set ------------------------------------------------------------


@dataclass(frozen=True)
class CompiledRule:
    detector: Detector
    """The rule as written; overrides are variants of it under the same name (same state)."""
    matches: Callable[[ResourceInfo], bool]
    consumes: tuple[type, ...]
    overrides: tuple[tuple[Callable[[ResourceInfo], bool], Detector], ...] = ()
    source: Any = None
    """The validated rule model, for ``rules explain``."""

    def for_resource(self, resource: ResourceInfo) -> Detector:
        """The detector with the params that apply to this resource."""
        for matches, detector in self.overrides:
            if matches(resource):
                return detector
        return self.detector


@dataclass(frozen=True)
class RuleSet:
    """Enabled rules, compiled, plus the price list they use, the silences in force and the
    plausibility bounds events are decoded with."""

    rules: tuple[CompiledRule, ...]
    pricing: Pricing = field(default_factory=Pricing)
    silences: tuple[CompiledSilence, ...] = ()
    """Rule-file silences (:mod:`detector.suppression.silence`), judged at an opening's event time."""
    routing: Routing = field(default_factory=Routing)
    limits: Limits = field(default_factory=Limits)
    disabled: frozenset[str] = frozenset()
    """The names of the rules the files hold disabled (``enabled: false``): for ``rules explain`` to say so."""

    @cached_property
    def tag_names(self) -> TagNames:
        """How a resource's or a run's tags gain the spelling of the keys the rules name (:mod:`detector.tag_names`)."""
        return TagNames(self.named_tags)

    @property
    def named_tags(self) -> frozenset[str]:
        """The tag keys the rules and routing name: routing's team and owner tags, the rules' and their overrides'
        ``match: tags``, the tags ``untagged`` requires."""
        named = {self.routing.by_tag, self.routing.owner_tag}
        for rule in self.rules:
            if rule.source is not None:
                named.update(rule.source.match.tags, *(o.match.tags for o in rule.source.overrides))
                named.update(getattr(rule.source.params, "required_tags", ()))
        return frozenset(named)

    @property
    def channels(self) -> frozenset[str]:
        """Every Slack channel :meth:`channel_for` may name (the notifier's own, '', aside): rules' routes,
        routing's ``by_severity``, ``channels`` and ``default_channel``."""
        routing = self.routing
        named = {routing.default_channel, *routing.channels.values(), *routing.by_severity.values()}
        named.update(r.source.route.channel for r in self.rules if r.source is not None and r.source.route is not None)
        return frozenset(named - {""})

    def channel_for(self, rule: str, tags: dict[str, str], severity: str = "") -> str:
        """The Slack channel for an alert of ``rule`` on a resource with ``tags`` ('' = the notifier's)."""
        compiled = self.by_name(rule)
        if compiled is not None and compiled.source is not None and compiled.source.route is not None:
            return compiled.source.route.channel
        routing = self.routing
        by_severity = routing.by_severity.get(severity)  # type: ignore[call-overload]  # dict.get wants a Severity key; any str may be asked
        if by_severity:
            return by_severity
        return routing.channels.get(tags.get(routing.by_tag, ""), routing.default_channel)

    def action_for(self, rule: str) -> ActionSpec:
        """The rule's ``action`` (``notify_only`` for a rule not enabled)."""
        compiled = self.by_name(rule)
        return compiled.source.action if compiled is not None and compiled.source is not None else ActionSpec()

    def realert_for(self, rule: str) -> float:
        compiled = self.by_name(rule)
        return compiled.source.realert if compiled is not None and compiled.source is not None else 0.0

    @property
    def names(self) -> list[str]:
        return [r.detector.name for r in self.rules]

    def by_name(self, name: str) -> CompiledRule | None:
        return next((r for r in self.rules if r.detector.name == name), None)


def compile_rules(
    rules: Iterable[Any],
    pricing: Pricing | None = None,
    silences: Iterable[Silence] = (),
    routing: Routing | None = None,
    limits: Limits | None = None,
) -> RuleSet:
    pricing = pricing or Pricing()
    rules = list(rules)
    compiled = []
    for rule in rules:
        if not rule.enabled:
            continue
        cls = REGISTRY[rule.type]
        overrides = tuple(
            (compile_match(o.match), cls(rule.name, o.severity or rule.severity, _override_params(rule, o), pricing))
            for o in rule.overrides
        )
        base = cls(rule.name, rule.severity, rule.params, pricing)
        compiled.append(CompiledRule(base, compile_match(rule.match), cls.consumes, overrides, rule))
    compiled_silences = tuple(
        CompiledSilence(
            starts=s.starts.timestamp(), ends=s.until.timestamp(), reason=s.reason, id=s.id,
            matches=compile_match(s.match) if s.match != Match() else None,
            rules=frozenset(s.rules), types=frozenset(s.types),
        )  # fmt: skip
        for s in silences
    )
    return RuleSet(tuple(compiled), pricing, compiled_silences, routing or Routing(), limits or Limits(),
                   frozenset(rule.name for rule in rules if not rule.enabled))


SPLIT_PARAMS = ("util_below", "for_")
"""What ``idle_gpu`` and the per-GPU rules must agree on to split a host's idle hours exactly."""


RESOURCE_TYPES = frozenset({"gpu_instance", "cpu_instance", "notebook", "storage_bucket", "vector_db", "network",
                            "inference_endpoint", "llm_api", "commitment", "pod", "deployment", "run", "project"})  # fmt: skip
"""The resource types the exporters, the bridge, the bill's usage and the rules themselves use (docs/events.md).
The contract takes others, so a rule may select one; one written like these but for case, separators or a
plural is likely a typo."""


def _written_as(resource_type: str) -> str:
    """``gpu-instance``, ``GPU_Instances``, ``gpuinstance`` → ``gpuinstance``: what a typo leaves the same
    (``tpu_instance``, a type of its own, stays apart from ``gpu_instance``)."""
    return re.sub(r"[-_ .]", "", resource_type.lower()).removesuffix("s")


_TYPES_WRITTEN = {_written_as(t): t for t in RESOURCE_TYPES}


def _resource_type_typos(rule: CompiledRule) -> list[str]:
    """A ``match.resource_type`` (the rule's or an override's) no resource type is, but written like one."""
    source = rule.source
    matches = [getattr(source, "match", None), *(o.match for o in getattr(source, "overrides", []))]
    said = []
    for match in matches:
        wanted = getattr(match, "resource_type", None)
        for value in [wanted] if isinstance(wanted, str) else wanted or []:
            plain = value.removeprefix("!")
            if plain in RESOURCE_TYPES or any(c in plain for c in "*?["):
                continue
            near = _TYPES_WRITTEN.get(_written_as(plain))
            if near:
                said.append(f"rule {rule.detector.name}: match.resource_type {value!r} is no resource type burnwatch "
                            f"is sent; did you mean {near!r}? (a rule that selects no resource never fires)")  # fmt: skip
    return said


def consistency_warnings(ruleset: RuleSet) -> list[str]:
    """Rule combinations that are valid one by one but price wrong together: ``partly_idle_gpu``
    and ``unallocated_gpu`` count a host's idle hours that ``idle_gpu`` does not, which holds
    only while they share its busy threshold and ``for`` (docs/detectors.md). And no instance prices
    (a ConfigMap of rules.yaml alone: every alert on the bridge's usage said $0.00), a resource type
    selected that is likely a typo of one burnwatch is sent (``gpu-instance``), and an owner mapped to
    no Slack user id (``@farah``: the mention rendered ``<@@farah>``)."""
    whole = [r.detector for r in ruleset.rules if r.detector.type == "idle_gpu"]
    warnings = [] if ruleset.pricing.instances else [
        "no instance prices (pricing.yaml beside the rules is missing or lists no instances): usage events "
        "without cost_usd (the bridge's, most exporters') are priced $0.00 and their alerts say $0.00/h; "
        "copy rules/pricing.yaml beside the rules"]  # fmt: skip
    warnings += [said for rule in ruleset.rules for said in _resource_type_typos(rule)]
    warnings += [f"routing.yaml users.{name}: {user[:40]!r} is not a Slack user id (U012AB3CD, W... on Enterprise "
                 "Grid): alerts cannot mention this owner, nor may they approve as the owner"
                 for name, user in ruleset.routing.users.items() if not SLACK_USER_ID.fullmatch(user)]  # fmt: skip
    for rule in ruleset.rules:
        share = rule.detector
        if share.type not in ("partly_idle_gpu", "unallocated_gpu"):
            continue
        for idle in whole:
            for name in SPLIT_PARAMS:
                mine, theirs = getattr(share.params, name), getattr(idle.params, name)
                if mine != theirs:
                    show = format_duration if name == "for_" else (lambda v: f"{v:g}%")
                    warnings.append(
                        f"rule {share.name}: {name.rstrip('_')} {show(mine)} differs from rule {idle.name}'s "
                        f"{show(theirs)}: the two split a host's idle hours only when they agree, so some hours "
                        f"would be counted twice or by neither"
                    )
    return warnings


NO_RULES = (
    "no rule is enabled, so nothing would be detected; enable a rule, or add 'allow_no_rules: true' to a "
    "rule file if detection is meant to be off"
)


def load_rules(path: str | Path, pricing_path: str | Path | None = None) -> RuleSet:
    """Load, validate and compile rules; raise :class:`RulesInvalid` with every error found.

    ``pricing_path`` defaults to ``pricing.yaml`` beside the rules; ``routing.yaml`` and
    ``limits.yaml`` are read from beside them. Rules that leave no rule enabled (an
    empty or deleted rule file, every rule disabled) are refused unless a rule file
    says ``allow_no_rules: true``: detection switched off by accident is silent.
    """
    path = Path(path)
    found, errors, silences, allow_no_rules = _validate_rule_files(path)
    beside = path if path.is_dir() else path.parent
    pricing = _optional_model(Path(pricing_path) if pricing_path else beside / "pricing.yaml", Pricing, errors)
    routing = _optional_model(beside / "routing.yaml", Routing, errors)
    limits = _optional_model(beside / LIMITS_FILE, Limits, errors)
    if not errors and not allow_no_rules and not any(rule.enabled for _, rule in found):
        errors.append(RuleError(str(path), 0, "", NO_RULES))
    if errors:
        raise RulesInvalid(errors)
    return compile_rules((rule for _, rule in found), pricing, silences, routing, limits)


def load_pricing(path: str | Path) -> Pricing:
    """A pricing file alone (``simulate`` prices its fleet with it), refused as the rules are:
    :class:`RulesInvalid`, its errors at their file and line."""
    loaded = _load_model(Path(path), Pricing)
    if isinstance(loaded, list):
        raise RulesInvalid(loaded)
    return loaded


def load_limits(path: str | Path) -> Limits:
    """``limits.yaml`` beside the rules at ``path`` (its defaults when there is none); a bad file raises
    :class:`RulesInvalid` naming its line. For what reads the bounds without the rules (a bill's reader)."""
    path = Path(path)
    errors: list[RuleError] = []
    limits = _optional_model((path if path.is_dir() else path.parent) / LIMITS_FILE, Limits, errors)
    if errors:
        raise RulesInvalid(errors)
    return limits


def _optional_model(path: Path, model: type[BaseModel], errors: list[RuleError]) -> Any:
    """A whole-file model from ``path``; its defaults when the file is absent or invalid
    (its errors then added to ``errors``)."""
    if not path.exists():
        return model()
    loaded = _load_model(path, model)
    if isinstance(loaded, list):
        errors.extend(loaded)
        return model()
    return loaded


def _load_model(path: Path, model: type[BaseModel]) -> Any:
    """A whole-file model (pricing, routing, limits) with the same file:line errors as rule files."""
    file = str(path)
    try:
        text = _read_text(path)
        lines, data = parse_yaml(text)
    except UnicodeDecodeError as exc:
        return [_not_utf8(file, exc)]
    except (OSError, yaml.YAMLError) as exc:
        mark = getattr(exc, "problem_mark", None)
        return [RuleError(file, mark.line + 1 if mark else 0, "", f"cannot read: {exc}")]
    try:
        return model.model_validate(data or {})
    except ValidationError as exc:
        return _errors_from(exc, (), file, lines)




# -- explain ----------------------------------------------------------------------------


def _human(params: Any) -> dict[str, Any]:
    """Params as a user would write them: durations as 30m, percentages as 5%."""
    out = {}
    for field_name, info in type(params).model_fields.items():
        value = getattr(params, field_name)
        parsers = {getattr(m, "func", None) for m in info.metadata}
        if parse_duration in parsers:
            value = format_duration(value).replace(" ", "")
        elif _parse_percent in parsers:
            value = f"{value:g}%"
        out[info.alias or field_name] = value
    return out


def explain(ruleset: RuleSet, name: str) -> str:
    """The effective rule ``name`` as YAML: its params after defaults, and each override's
    params after merging, which is what detection uses."""
    rule = ruleset.by_name(name)
    if rule is None and name in ruleset.disabled:
        raise KeyError(f"rule {name!r} is disabled (enabled: false): nothing detects with it")
    if rule is None:
        near = difflib.get_close_matches(name, ruleset.names, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else f"; rules: {', '.join(ruleset.names) or '(none enabled)'}"
        raise KeyError(f"no enabled rule {name!r}{hint}")
    source = rule.source
    doc: dict[str, Any] = {
        "name": source.name,
        "type": source.type,
        "severity": source.severity,
        "match": source.match.model_dump(exclude_defaults=True) or "(every resource)",
        "params": _human(rule.detector.params),
    }
    if source.realert:
        doc["realert"] = format_duration(source.realert).replace(" ", "")
    action = source.action
    if action.acts:
        doc["action"] = {"kind": action.kind, "after": format_duration(action.after).replace(" ", ""), "mode": action.mode}
        if action.mode == "auto_unless_objected":
            doc["action"]["grace"] = format_duration(action.grace).replace(" ", "")
    else:
        doc["action"] = "notify_only"
    if rule.overrides:
        doc["overrides"] = [
            {"match": o.match.model_dump(exclude_defaults=True), "severity": detector.severity,
             "params": _human(detector.params)}
            for o, (_, detector) in zip(source.overrides, rule.overrides, strict=True)
        ]  # fmt: skip
    return yaml.safe_dump(doc, sort_keys=False)
