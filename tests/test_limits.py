"""rules/limits.yaml: plausibility bounds, validated like the other rule files, hot-reloaded,
and the same for the worker's decoder and backtest's."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from detector.backtest import backtest
from detector.events import EventDecoder, InvalidMessage
from detector.limits import Limits
from detector.reload import RulesWatcher
from detector.rules import RulesInvalid, load_rules
from tests.conftest import ROOT

RULES = "rules:\n  - {name: idle-gpu, type: idle_gpu}\n"
USAGE = {"ts": "2026-11-02T00:00:00Z", "resource_id": "h1", "resource_type": "gpu_instance", "interval_s": 3600}


def test_shipped_limits_are_the_defaults(ruleset):
    """The file users edit says what the code assumes when it is absent."""
    assert (ROOT / "rules" / "limits.yaml").exists()
    assert ruleset.limits == Limits()


def test_limits_are_read_beside_the_rules(tmp_path):
    (tmp_path / "rules.yaml").write_text(RULES)
    assert load_rules(tmp_path).limits == Limits()  # no limits.yaml: the defaults
    (tmp_path / "limits.yaml").write_text("max_usd_per_hour: 150\nmax_interval: 6h\nmax_egress_gbit_per_s: 100\n")
    limits = load_rules(tmp_path).limits
    assert (limits.max_usd_per_hour, limits.max_interval, limits.max_egress_bytes_per_s) == (150, 6 * 3600, 12.5e9)
    assert load_rules(tmp_path / "rules.yaml").limits == limits  # a rules file: limits.yaml beside it


@pytest.mark.parametrize(
    "text, error",
    [
        ("max_usd_per_hour: 2000\nmax_interval: 1 day\n", "limits.yaml:2 max_interval: invalid duration '1 day'"),
        ("max_usd_per_hr: 100\n", "limits.yaml:1 max_usd_per_hr: unknown key"),
        ("max_egress_gbit_per_s: 0\n", "limits.yaml:1 max_egress_gbit_per_s: Input should be greater than 0"),
    ],
    ids=["bad-duration", "unknown-key", "zero"],
)
def test_a_bad_limits_file_is_refused_with_its_line(tmp_path, text, error):
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "limits.yaml").write_text(text)
    with pytest.raises(RulesInvalid) as info:
        load_rules(tmp_path)
    assert f"{tmp_path}/{error}" in str(info.value)


def test_backtest_decodes_with_the_rule_sets_limits(tmp_path):
    """What the worker's decoder refuses (it is built from the same rule set), backtest refuses."""
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "limits.yaml").write_text("max_usd_per_hour: 100\n")
    replay = tmp_path / "r.jsonl"
    lines = [{"topic": "resource-usage", "key": "h1", "value": {**USAGE, "cost_usd": usd}} for usd in (98.32, 500.0)]
    replay.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = backtest(replay, load_rules(tmp_path))
    assert result.events == 1
    ((line, reason),) = result.invalid
    assert line == 2 and "above the plausible $100.00/h" in reason and reason.endswith("- at `$.cost_usd`")
    assert not backtest(replay, load_rules(ROOT / "rules")).invalid  # $500/h is within the shipped bound


def test_an_edited_limits_file_is_reloaded(tmp_path):
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    for path in (rules, rules / "rules.yaml"):  # a directory, or a file with limits.yaml beside it
        watcher = RulesWatcher(path, load_rules(path))
        limits_file = rules / "limits.yaml"
        limits_file.write_text(limits_file.read_text().replace("max_usd_per_hour: 2000", "max_usd_per_hour: 150"))
        os.utime(limits_file, ns=(1, 10**18 + len(str(path))))
        ruleset, refused = watcher.poll()
        assert refused is None and ruleset.limits.max_usd_per_hour == 150
        with pytest.raises(InvalidMessage, match=r"max_usd_per_hour"):
            EventDecoder(limits=ruleset.limits).decode("resource-usage", json.dumps({**USAGE, "cost_usd": 151}).encode())
        limits_file.write_text(limits_file.read_text().replace("max_usd_per_hour: 150", "max_usd_per_hour: 2000"))
