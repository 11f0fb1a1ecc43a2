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
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from detector.detectors import REGISTRY, Detector, ResourceInfo
from detector.pricing import Pricing, load_pricing

__all__ = [
    "Match",
    "RuleError",
    "RuleSet",
    "RulesInvalid",
    "compile_match",
    "load_rules",
    "validate_rule_files",
]

SPECIAL_FILES = {"pricing.yaml": "pricing"}
Selector = Union[str, list[str]]


class Match(BaseModel):
    """Which resources a rule applies to. Globs (``p4d.*``); ``!`` negates (``!dev-*``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    resource_type: Selector | None = None
    account: Selector | None = None
    region: Selector | None = None
    instance_type: Selector | None = None
    tags: dict[str, Selector] = {}


class RuleBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    enabled: bool = True
    description: str = ""
    match: Match = Match()
    severity: Literal["info", "warning", "critical"] = "warning"


def _rule_models() -> Any:
    models = [
        create_model(
            f"{cls.__name__}Rule",
            __base__=RuleBase,
            type=(Literal[cls.type], ...),  # type: ignore[valid-type]
            params=(cls.Params, cls.Params()),
        )
        for cls in REGISTRY.values()
    ]
    return Annotated[Union[tuple(models)], Field(discriminator="type")]  # type: ignore[arg-type]


_RULE: TypeAdapter[Any] = TypeAdapter(_rule_models())


# -- selectors ------------------------------------------------------------------


def _compile_selector(selector: Selector) -> Callable[[str], bool]:
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


def compile_match(match: Match) -> Callable[[ResourceInfo], bool]:
    """Turn a :class:`Match` into one predicate over a resource. ``team: '!*'`` selects resources without a team tag."""
    checks: list[Callable[[ResourceInfo], bool]] = []
    for attr in ("resource_type", "account", "region", "instance_type"):
        selector = getattr(match, attr)
        if selector is not None:
            test = _compile_selector(selector)
            checks.append(lambda r, a=attr, f=test: f(getattr(r, a)))
    for tag, selector in match.tags.items():
        test = _compile_selector(selector)
        checks.append(lambda r, k=tag, f=test: f(r.tags.get(k)))
    return lambda resource: all(check(resource) for check in checks)


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


def _line_index(node: yaml.Node, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """Map each key path in a YAML document to its 1-based line."""
    out = {} if out is None else out
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
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
    """Drop the union tag pydantic inserts after ``rules[i]``."""
    if len(loc) > 2 and loc[0] == "rules" and isinstance(loc[1], int) and loc[2] in REGISTRY:
        return loc[:2] + loc[3:]
    return loc


def _alias_loc(loc: tuple) -> tuple:
    return tuple("for" if part == "for_" else part for part in loc)


def _type_error(rule: Any, loc: tuple, file: str, lines: dict[tuple, int]) -> RuleError | None:
    if not isinstance(rule, dict) or "type" not in rule or rule["type"] in REGISTRY:
        return None
    near = difflib.get_close_matches(str(rule["type"]), list(REGISTRY), n=1)
    hint = f"; did you mean {near[0]!r}?" if near else f"; known types: {', '.join(sorted(REGISTRY))}"
    loc = loc + ("type",)
    return RuleError(file, lines.get(loc, 0), _format_path(loc), f"unknown rule type {rule['type']!r}{hint}")


def _errors_from(exc: ValidationError, prefix: tuple, file: str, lines: dict[tuple, int]) -> list[RuleError]:
    errors = []
    for err in exc.errors():
        loc = _alias_loc(_clean_loc(prefix + tuple(err["loc"])))
        line = next((lines[loc[:n]] for n in range(len(loc), -1, -1) if loc[:n] in lines), 0)
        message = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        errors.append(RuleError(file, line, _format_path(loc), message))
    return errors


def _validate_file(path: Path) -> tuple[list[Any], list[RuleError]]:
    """Validate one file rule by rule, so one bad rule does not hide the errors of the others."""
    file = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        return [], [RuleError(file, 0, "", f"cannot read: {exc.strerror}")]
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        return [], [RuleError(file, mark.line + 1 if mark else 0, "", f"invalid YAML: {getattr(exc, 'problem', exc)}")]
    if data is None:
        return [], []
    lines = _line_index(node) if node is not None else {}
    if not isinstance(data, dict) or set(data) - {"rules"}:
        return [], [RuleError(file, 1, "", "a rule file is a mapping with one key, 'rules', holding a list of rules")]
    items = data.get("rules") or []
    if not isinstance(items, list):
        return [], [RuleError(file, lines.get(("rules",), 0), "rules", "expected a list of rules")]
    rules, errors = [], []
    for i, item in enumerate(items):
        type_error = _type_error(item, ("rules", i), file, lines)
        if type_error:
            errors.append(type_error)
            continue
        try:
            rules.append(_RULE.validate_python(item))
        except ValidationError as exc:
            errors.extend(_errors_from(exc, ("rules", i), file, lines))
    return (rules if not errors else []), errors


def _rule_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.glob("*.y*ml") if p.name not in SPECIAL_FILES)
    return [path]


def validate_rule_files(path: str | Path) -> tuple[list[tuple[Path, Any]], list[RuleError]]:
    """Validate every rule file under ``path``; return the rules with their files, and all errors."""
    path = Path(path)
    if not path.exists():
        return [], [RuleError(str(path), 0, "", "no such file or directory")]
    rules: list[tuple[Path, Any]] = []
    errors: list[RuleError] = []
    seen: dict[str, str] = {}
    for file in _rule_files(path):
        parsed, errs = _validate_file(file)
        errors.extend(errs)
        for i, rule in enumerate(parsed):
            if rule.name in seen:
                message = f"duplicate rule name {rule.name!r} (also in {seen[rule.name]})"
                errors.append(RuleError(str(file), 0, f"rules[{i}].name", message))
            seen[rule.name] = str(file)
            rules.append((file, rule))
    return rules, errors


# -- the compiled rule set ------------------------------------------------------------


@dataclass(frozen=True)
class CompiledRule:
    detector: Detector
    matches: Callable[[ResourceInfo], bool]
    consumes: tuple[type, ...]


@dataclass(frozen=True)
class RuleSet:
    """Enabled rules, compiled, plus the price list they use."""

    rules: tuple[CompiledRule, ...]
    pricing: Pricing = field(default_factory=Pricing)

    @property
    def names(self) -> list[str]:
        return [r.detector.name for r in self.rules]

    def by_name(self, name: str) -> CompiledRule | None:
        return next((r for r in self.rules if r.detector.name == name), None)


def compile_rules(rules: Iterable[Any], pricing: Pricing | None = None) -> RuleSet:
    compiled = []
    for rule in rules:
        if not rule.enabled:
            continue
        cls = REGISTRY[rule.type]
        compiled.append(CompiledRule(cls(rule.name, rule.severity, rule.params), compile_match(rule.match), cls.consumes))
    return RuleSet(tuple(compiled), pricing or Pricing())


def load_rules(path: str | Path, pricing_path: str | Path | None = None) -> RuleSet:
    """Load, validate and compile rules; raise :class:`RulesInvalid` with every error found.

    ``pricing_path`` defaults to ``pricing.yaml`` beside the rules.
    """
    path = Path(path)
    found, errors = validate_rule_files(path)
    pricing = Pricing()
    pricing_file = Path(pricing_path) if pricing_path else (path if path.is_dir() else path.parent) / "pricing.yaml"
    if pricing_file.exists():
        try:
            pricing = load_pricing(pricing_file)
        except ValueError as exc:
            errors.append(RuleError(str(pricing_file), 0, "", str(exc)))
    if errors:
        raise RulesInvalid(errors)
    return compile_rules((rule for _, rule in found), pricing)


