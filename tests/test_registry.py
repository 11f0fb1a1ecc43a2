"""Every registered detector documents a rule example that validates, and keeps the contract."""

from __future__ import annotations

import inspect
import re
import textwrap

import pytest

from detector.detectors import REGISTRY, ResourceInfo
from detector.engine import Engine
from detector.rules import load_rules
from tests.conftest import ROOT


@pytest.mark.parametrize("rule_type", sorted(REGISTRY))
def test_documented_example_validates(rule_type, tmp_path):
    cls = REGISTRY[rule_type]
    doc = inspect.getmodule(cls).__doc__ or ""
    match = re.search(r"Example rule::\n\n(.*?)(?:\n\n\S|\Z)", doc, re.S)
    assert match, f"{rule_type}: module docstring has no 'Example rule::' block"
    (tmp_path / "example.yaml").write_text("rules:\n" + textwrap.indent(textwrap.dedent(match.group(1)), "  "))
    ruleset = load_rules(tmp_path / "example.yaml")
    assert [r.detector.type for r in ruleset.rules] == [rule_type]
    engine = Engine(ruleset)
    assert engine.process([]) == [] and engine.open_episodes() == []  # no input, nothing to say
    detector = ruleset.rules[0].detector
    assert detector.open_episodes(detector.new_state(), ResourceInfo()) == []


@pytest.mark.parametrize("rule_type", sorted(REGISTRY))
def test_detector_keeps_the_contract(rule_type):
    cls = REGISTRY[rule_type]
    assert cls.type == rule_type
    assert cls.consumes and cls.suggestion
    detector = cls("r", "warning", cls.Params())
    assert isinstance(detector.new_state(), cls.State)
    assert f"## `{rule_type}`" in (ROOT / "docs" / "detectors.md").read_text()
