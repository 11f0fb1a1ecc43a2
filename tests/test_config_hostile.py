"""Whatever a user writes in any field of a config file gives its loader's own error (file, line and
field) or a valid config, never a traceback: each shipped file with one of its values (or lists, or
mappings) replaced by a value of the wrong shape. A rule type written as a list was a TypeError."""

from __future__ import annotations

import contextlib
import copy
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detector.ingest.config import ConfigInvalid, load_bridge_config
from detector.rules import RulesInvalid, load_rules
from tests.conftest import ROOT

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
                     st.floats(), st.text(max_size=8),
                     st.sampled_from(["", "x", "!*", "1e999", "\x00", "5%", "30m"]))  # fmt: skip
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                       max_leaves=6)  # fmt: skip


def _paths(obj: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every place in a parsed YAML document: each mapping's value and each list's item."""
    yield prefix
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        yield from _paths(value, prefix + (key,))


def _replaced(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    doc = copy.deepcopy(doc)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return doc


_SHIPPED = {name: yaml.safe_load((ROOT / "rules" / name).read_text()) for name in
            ("rules.yaml", "routing.yaml", "limits.yaml", "pricing.yaml")}  # fmt: skip
_BRIDGE = yaml.safe_load((ROOT / "deploy" / "bridge.yaml").read_text())
_CASES: list[tuple[str, tuple]] = [(name, p) for name, doc in _SHIPPED.items() for p in _paths(doc)]
_CASES += [("bridge.yaml", p) for p in _paths(_BRIDGE)]


@pytest.fixture(scope="module")
def rules_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rules = tmp_path_factory.mktemp("hostile") / "rules"
    shutil.copytree(ROOT / "rules", rules)
    return rules


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(_CASES), value=_VALUES)
def test_any_value_anywhere_in_a_config_file_is_refused_by_name_or_taken(rules_copy: Path, case: tuple[str, tuple],
                                                                         value: Any) -> None:  # fmt: skip
    name, path = case
    if name == "bridge.yaml":
        target = rules_copy.parent / name
        target.write_text(yaml.safe_dump(_replaced(_BRIDGE, path, value), allow_unicode=True))
        with contextlib.suppress(ConfigInvalid):
            load_bridge_config(target)
        return
    target = rules_copy / name
    target.write_text(yaml.safe_dump(_replaced(_SHIPPED[name], path, value), allow_unicode=True))
    try:
        load_rules(rules_copy)
    except RulesInvalid as exc:
        assert all(e.file.startswith(str(rules_copy)) for e in exc.errors), str(exc)  # each names its file
    finally:
        target.write_text((ROOT / "rules" / name).read_text())
