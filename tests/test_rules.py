"""Rule files: every error at once with file:line, selectors, and the shipped rules."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys

import pytest
from structlog.testing import capture_logs

from detector.detectors import ResourceInfo
from detector.rules import Match, RulesInvalid, compile_match, load_rules
from detector.units import format_duration, parse_duration
from tests.conftest import ROOT


def test_shipped_rules_load_with_their_defaults(ruleset):
    rule = ruleset.by_name("idle-gpu")
    assert rule is not None
    params = rule.detector.params
    assert (params.util_below, params.for_, params.stale_after) == (5.0, 1800.0, 300.0)
    assert ruleset.pricing.hourly("p4d.24xlarge") == pytest.approx(32.77)


def test_every_error_reported_with_file_line_and_path(tmp_path):
    path = tmp_path / "team-nlp.yaml"
    path.write_text(
        "rules:\n"
        "  - name: ok\n"
        "    type: idle_gpu\n"
        "  - name: slow\n"
        "    type: idle_gpu\n"
        "    params:\n"
        "      for: 30 minutes\n"
        "  - name: typo\n"
        "    type: idle_gpus\n"
        "  - name: extra\n"
        "    type: idle_gpu\n"
        "    colour: red\n"
    )
    with pytest.raises(RulesInvalid) as info:
        load_rules(path)
    lines = str(info.value).splitlines()
    assert f"{path}:7 rules[1].params.for: invalid duration '30 minutes'; expected e.g. 30m, 6h, 7d" in lines
    assert f"{path}:9 rules[2].type: unknown rule type 'idle_gpus'; did you mean 'idle_gpu'?" in lines
    assert f"{path}:12 rules[3].colour: unknown key" in lines
    assert len(info.value.errors) == 3


def test_a_tag_written_as_a_selector_of_match_is_refused_saying_where_tags_go(tmp_path):
    """``match: {team: nlp}`` (the team tag written beside resource_type) selects nothing it could:
    the refusal says a tag goes under ``tags``; a near miss of a selector is named."""
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n"
        "  - name: nlp-idle\n"
        "    type: idle_gpu\n"
        "    match: {team: nlp}\n"
        "  - name: typo\n"
        "    type: idle_gpu\n"
        "    match: {resource_typ: gpu_instance}\n"
    )
    with pytest.raises(RulesInvalid) as info:
        load_rules(path)
    lines = str(info.value).splitlines()
    assert (f"{path}:4 rules[0].match.team: unknown key; match takes resource_id, resource_type, account, region, "
            "instance_type and tags, a tag under tags: {tags: {team: ...}}") in lines
    assert f"{path}:7 rules[1].match.resource_typ: unknown key; did you mean 'resource_type'?" in lines


def test_an_invalid_rules_overrides_are_checked_in_the_same_round(tmp_path):
    """An override's params are checked against the rule's params; when the rule itself is invalid they
    used to wait for it to be fixed, so a user fixed the file in two rounds. A key the override sets that
    is valid with the rule's own params (util_below 7% over a rule's 500%) is no error."""
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n"
        "  - name: idle\n"
        "    type: idle_gpu\n"
        "    severity: loud\n"
        "    params: {util_below: 500%}\n"
        "    overrides:\n"
        "      - match: {tags: {team: research}}\n"
        "        params:\n"
        "          for: forever-ish\n"
        "          util_below: 7%\n"
        "          colour: red\n"
        "      - 3\n"
        "  - name: untyped\n"
        "  - name: listed\n"
        "    type: [idle_gpu]\n"
    )
    with pytest.raises(RulesInvalid) as info:
        load_rules(path)
    lines = str(info.value).splitlines()
    assert f"{path}:4 rules[0].severity: Input should be 'info', 'warning' or 'critical'" in lines
    assert f"{path}:9 rules[0].overrides[0].params.for: invalid duration 'forever-ish'; expected e.g. 30m, 6h, 7d" in lines
    assert f"{path}:11 rules[0].overrides[0].params.colour: unknown key" in lines
    assert not [line for line in lines if "overrides[0].params.util_below" in line], lines
    assert any(line.startswith(f"{path}:13 rules[1].type: missing; known types: ") for line in lines), lines
    assert f"{path}:15 rules[2].type: unknown rule type ['idle_gpu']; did you mean 'idle_gpu'?" in lines  # a traceback


@pytest.mark.parametrize("name", ["rules.yaml", "routing.yaml", "limits.yaml", "pricing.yaml"])
def test_one_parse_reads_what_the_pure_python_loader_reads(name):
    """The rules are parsed once, by libyaml where PyYAML has it: the same data and the same
    line of every key as ``yaml.compose`` and ``yaml.safe_load`` with the pure-Python loader,
    on the shipped files and on the same file with its lines shuffled about (anchors, flow
    mappings, quoted keys, comments)."""
    import yaml

    from detector.rules import _line_index, parse_yaml

    texts = [(ROOT / "rules" / name).read_text(),
             "# c\na: &x {b: 1, 'c d': [1, 2.5, null, ~]}\n\ne: *x\nf:\n  - g: |\n      two\n      lines\n    h: 'x'\n"]
    for text in texts:
        lines, data = parse_yaml(text)
        assert data == yaml.load(text, Loader=yaml.SafeLoader)
        assert lines == _line_index(yaml.compose(text, Loader=yaml.SafeLoader))
    assert parse_yaml("") == ({}, None)


def test_a_wrong_price_is_refused_at_its_line(tmp_path):
    """pricing.yaml's errors read as the rule files' do (file:line field: what is wrong), not
    pydantic's report with the file named twice and line 0: a price is what puts dollars on an alert."""
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    pricing = rules / "pricing.yaml"
    lines = pricing.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("p3.8xlarge:"))
    assert "on_demand: 12.24," in lines[at]
    lines[at] = lines[at].replace("on_demand: 12.24,", "on_demand: -12.24,")
    pricing.write_text("".join(lines))
    with pytest.raises(RulesInvalid) as info:
        load_rules(rules)
    assert [str(e) for e in info.value.errors] == [
        f"{pricing}:{at + 1} instances.p3.8xlarge.on_demand: Input should be greater than or equal to 0"]


@pytest.mark.parametrize(
    "old, new, line_of, said",
    [
        ("      for: 30m ", "      for: .inf ", "      for: .inf", "rules[0].params.for: invalid duration inf"),
        ("      for: 30m ", "      for: .nan ", "      for: .nan", "rules[0].params.for: invalid duration nan"),
        ("      min_usd: 20 ", "      min_usd: .nan ", "      min_usd: .nan", "params.min_usd: invalid amount nan"),
        ("      min_usd: 20 ", "      min_usd: .inf ", "      min_usd: .inf", "params.min_usd: invalid amount inf"),
    ],
    ids=["for-inf", "for-nan", "money-nan", "money-inf"],
)  # fmt: skip
def test_a_number_that_is_not_finite_is_refused_at_its_line(tmp_path, old, new, line_of, said):
    """YAML reads `.inf` and `.nan` as numbers: a rule waiting forever, or a NaN that compares false to
    everything (failed-run-spend silently off), and `.inf` crashed a running worker at its reload."""
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    text = (rules / "rules.yaml").read_text()
    assert old in text
    (rules / "rules.yaml").write_text(text.replace(old, new, 1))
    with pytest.raises(RulesInvalid) as info:
        load_rules(rules)
    line = next(i for i, t in enumerate((rules / "rules.yaml").read_text().splitlines(), 1) if t.startswith(line_of))
    (error,) = info.value.errors
    assert error.line == line and said in str(error), str(error)


@pytest.mark.parametrize("where", ["rules", "params"])
def test_a_key_given_twice_is_refused_at_its_second_line(tmp_path, where):
    """YAML keeps the last of two equal keys silently: a team's `rules:` block appended to the shipped
    file left its one rule in force and dropped the 21 above it."""
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    text = (rules / "rules.yaml").read_text()
    if where == "rules":
        text += "\nrules:\n  - name: nlp-idle\n    type: idle_gpu\n"
    else:
        text = text.replace("      for: 30m ", "      for: 1h\n      for: 30m ", 1)
    (rules / "rules.yaml").write_text(text)
    with pytest.raises(RulesInvalid) as info:
        load_rules(rules)
    lines = text.splitlines()
    second = (len(lines) - 2 if where == "rules" else lines.index("      for: 1h") + 2)  # the later of the two
    (error,) = info.value.errors
    assert error.line == second and "duplicate key" in error.message, str(error)


def test_a_resource_type_selected_that_is_likely_a_typo_is_warned_of(tmp_path):
    """The contract takes any resource type, so a selector is no error; `gpu-instance` and `notebooks` made a
    rule that selects nothing, silently. The shipped rules select none such; globs and others are left alone."""
    from detector.rules import consistency_warnings

    assert consistency_warnings(load_rules(ROOT / "rules")) == []
    path = tmp_path / "rules.yaml"
    shutil.copy(ROOT / "rules" / "pricing.yaml", tmp_path)
    path.write_text("rules:\n  - name: idle\n    type: idle_gpu\n    match: {resource_type: [gpu-instance, notebooks, "
                    "'gpu_*', my_own_kind, tpu_instance, spot_instance]}\n    overrides:\n"
                    "      - match: {resource_type: '!vectordb'}\n        params: {for: 1h}\n")  # fmt: skip
    said = consistency_warnings(load_rules(path))
    assert [w.split(" is no ")[0] for w in said] == [
        "rule idle: match.resource_type 'gpu-instance'", "rule idle: match.resource_type 'notebooks'",
        "rule idle: match.resource_type '!vectordb'"]  # fmt: skip
    assert "did you mean 'gpu_instance'?" in said[0] and "did you mean 'vector_db'?" in said[2]


def test_rules_without_prices_are_warned_of(tmp_path):
    """A ConfigMap of rules.yaml alone (the Kubernetes manifest's, once): every alert on usage events without
    cost_usd, which is all of the bridge's, said $0.00/h, and nothing said why."""
    from detector.rules import consistency_warnings

    (tmp_path / "rules.yaml").write_text("rules:\n  - name: idle\n    type: idle_gpu\n")
    (said,) = consistency_warnings(load_rules(tmp_path))
    assert said.startswith("no instance prices (pricing.yaml beside the rules is missing") and "$0.00/h" in said
    shutil.copy(ROOT / "rules" / "pricing.yaml", tmp_path)
    assert consistency_warnings(load_rules(tmp_path)) == []


def test_an_owner_mapped_to_no_slack_user_id_is_warned_of(tmp_path):
    """`users: {farah: "@farah"}` rendered the mention `<@@farah>`; a name or an e-mail cannot be mentioned either."""
    from detector.rules import consistency_warnings

    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    (rules / "routing.yaml").write_text('users: {farah: "@farah", gus: gus@example.com, ines: U012AB3CD}\n')
    said = consistency_warnings(load_rules(rules))
    assert [w.split(":")[0] for w in said] == ["routing.yaml users.farah", "routing.yaml users.gus"], said


def test_keys_equal_as_text_but_not_as_values_are_two_keys():
    """YAML's 1 and "1" are two keys: no duplicate."""
    from detector.rules import parse_yaml

    assert parse_yaml('1: x\n"1": y\n')[1] == {1: "x", "1": "y"}


def test_invalid_yaml_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("rules:\n  - name: a\n    type: [idle_gpu\n")
    with pytest.raises(RulesInvalid) as info:
        load_rules(path)
    assert str(info.value).startswith(f"{path}:")
    assert "invalid YAML" in str(info.value)


def test_a_tab_is_named_in_the_error(tmp_path):
    """libyaml says "found character that cannot start any token"; the error names it, as the
    pure-Python loader did: a tab is the commonest mistake in a YAML file, and invisible."""
    path = tmp_path / "tabbed.yaml"
    path.write_text("rules:\n\t- name: a\n    type: idle_gpu\n")
    with pytest.raises(RulesInvalid) as info:
        load_rules(path)
    assert str(info.value) == f"{path}:2: invalid YAML: found character '\\t' that cannot start any token"


@pytest.mark.parametrize("name", ["rules.yaml", "routing.yaml", "limits.yaml", "pricing.yaml"])
def test_a_file_not_in_utf8_is_refused_with_its_line_and_the_rules_in_force_kept(tmp_path, name):
    """A file saved in Latin-1 (a comment's "café") is an error of that file, at that line, as
    any other: it used to escape as a UnicodeDecodeError, a traceback from ``rules check`` and
    the end of the worker's reload timer (its task's error crashes the app)."""
    from detector.reload import RulesWatcher

    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    watcher = RulesWatcher(rules, load_rules(rules))
    in_force = watcher.current
    edited = rules / name
    lines = edited.read_bytes().count(b"\n")
    edited.write_bytes(edited.read_bytes() + "# caf\u00e9\n".encode("latin-1"))
    ruleset, refused = watcher.poll()
    assert ruleset is None and refused is not None
    assert [str(e) for e in refused.errors] == [f"{edited}:{lines + 1}: cannot read: not UTF-8 (byte 0xe9)"]
    assert watcher.current is in_force


@pytest.mark.parametrize("prefix", ["rules: ", "rules:\n  - name: a\n    type: idle_gpu\n    params: "])
@pytest.mark.parametrize("depth", [2_000, 50_000])
def test_a_file_nested_deeper_than_libyaml_can_parse_is_an_error_not_a_crash(tmp_path, depth, prefix):
    """libyaml's composer recurses in C, a frame a level: 30,000 brackets (60 KB) overflowed the
    stack, and ``rules check`` (or a worker reloading the rules) died of a segfault, saying nothing;
    2,000 were parsed, and the lines of its keys then looked for to a RecursionError."""
    path = tmp_path / "deep.yaml"
    path.write_text(prefix + "[" * depth + "]" * depth + "\n")
    out = subprocess.run([sys.executable, "-m", "streams.cli", "rules", "check", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert (out.returncode, out.stderr.splitlines()[:1]) == (1, [f"{path}: invalid YAML: nested too deeply"]), out.stderr


def test_duplicate_names_across_files(tmp_path):
    (tmp_path / "a.yaml").write_text("rules:\n  - {name: idle, type: idle_gpu}\n")
    (tmp_path / "b.yaml").write_text("rules:\n  - {name: idle, type: idle_gpu}\n")
    with pytest.raises(RulesInvalid, match="duplicate rule name 'idle'"):
        load_rules(tmp_path)


def test_disabled_rules_are_not_compiled(tmp_path):
    (tmp_path / "r.yaml").write_text("rules:\n  - {name: idle, type: idle_gpu, enabled: false}\n"
                                     "  - {name: stuck, type: stuck_gpu}\n")  # fmt: skip
    assert load_rules(tmp_path).names == ["stuck"]


@pytest.mark.parametrize(
    "match, resource, expected",
    [
        ({"resource_type": ["gpu_instance", "notebook"]}, {"resource_type": "notebook"}, True),
        ({"resource_type": "gpu_*"}, {"resource_type": "cpu_instance"}, False),
        ({"instance_type": ["p4d.*", "!p4d.24xlarge"]}, {"instance_type": "p4d.24xlarge"}, False),
        ({"tags": {"env": "!dev*"}}, {"tags": {"env": "prod"}}, True),
        ({"tags": {"env": "!dev*"}}, {"tags": {"env": "dev-1"}}, False),
        ({"tags": {"team": "!*"}}, {"tags": {}}, True),  # selects untagged resources
        ({"account": "ml-*", "region": "us-*"}, {"account": "ml-prod", "region": "eu-west-1"}, False),
    ],
)
def test_selectors(match, resource, expected):
    assert compile_match(Match(**match))(ResourceInfo(**resource)) is expected


@pytest.mark.parametrize("seconds, shown", [(30, "30s"), (0, "0m"), (90, "1m"), (90_061, "1d 1h 1m"), (math.inf, "forever")])
def test_a_duration_shown(seconds, shown):
    """Under a minute in seconds: a rule's bare `for: 30` (30 seconds) was shown by `rules explain` as 0m."""
    assert format_duration(seconds) == shown


@pytest.mark.parametrize("text, seconds", [("30m", 1800), ("6h", 21600), ("7d", 604800), ("45s", 45), (90, 90)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


# -- detection switched off by accident is refused ---------------------------------------

NO_RULES = "no rule is enabled, so nothing would be detected"


@pytest.mark.parametrize("content", ["", "# every rule removed\n", "rules: []\n",
                                     "rules:\n  - {name: idle, type: idle_gpu, enabled: false}\n"],
                         ids=["empty", "comments-only", "empty-list", "all-disabled"])  # fmt: skip
def test_rules_that_leave_nothing_enabled_are_refused_unless_intended(tmp_path, content):
    (tmp_path / "rules.yaml").write_text(content)
    with pytest.raises(RulesInvalid, match=NO_RULES) as info:
        load_rules(tmp_path)
    assert "allow_no_rules: true" in str(info.value)  # says how to mean it
    (tmp_path / "rules.yaml").write_text(content + "allow_no_rules: true\n")
    assert load_rules(tmp_path).rules == ()


def test_a_deleted_rules_file_is_refused(tmp_path):
    (tmp_path / "pricing.yaml").write_text("instances: {}\n")
    with pytest.raises(RulesInvalid, match=NO_RULES):
        load_rules(tmp_path)  # a rules directory left with no rule file
    with pytest.raises(RulesInvalid, match="no such file or directory"):
        load_rules(tmp_path / "rules.yaml")  # a rules file that is gone


def test_allow_no_rules_must_be_a_boolean(tmp_path):
    (tmp_path / "rules.yaml").write_text("rules: []\nallow_no_rules: maybe\n")
    with pytest.raises(RulesInvalid) as info:
        load_rules(tmp_path)
    assert str(info.value) == f"{tmp_path / 'rules.yaml'}:2 allow_no_rules: expected true or false, got 'maybe'"


def rules_check(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streams.cli", "rules", "check", str(path)],
                          capture_output=True, text=True)  # fmt: skip


def test_rules_check_says_the_same(tmp_path):
    (tmp_path / "rules.yaml").write_text("rules: []\n")
    out = rules_check(tmp_path)
    assert out.returncode == 1 and NO_RULES in out.stderr
    (tmp_path / "rules.yaml").write_text("rules: []\nallow_no_rules: true\n")
    out = rules_check(tmp_path)
    assert out.returncode == 0, out.stderr
    assert "no rule enabled (allow_no_rules: true): detection is off" in out.stdout


@pytest.mark.integration
def test_the_worker_does_not_start_without_an_enabled_rule(tmp_path):
    from streams.embedded import EmbeddedBroker
    from streams.process import worker_env

    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "rules.yaml").write_text("rules: []\n")
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        env = {**os.environ, **worker_env(broker.bootstrap, tmp_path / "data", rules, 1)}
        out = subprocess.run([sys.executable, "-m", "streams.cli", "worker"], env=env, capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    assert out.returncode != 0
    assert "rules refused" in out.stderr and NO_RULES in out.stderr


def test_rules_that_split_a_hosts_idle_hours_are_checked_for_agreeing(tmp_path):
    """idle_gpu and the per-GPU rules split a host's idle hours only with the same busy threshold and
    `for`: valid one by one, wrong together, so `rules check` warns (and the worker logs it)."""
    from detector.rules import consistency_warnings

    assert consistency_warnings(load_rules(ROOT / "rules")) == []  # the shipped rules agree
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    text = (rules / "rules.yaml").read_text()
    idle_gpu_threshold = "util_below: 5%     # busy at or above this util_pct"
    (rules / "rules.yaml").write_text(text.replace(idle_gpu_threshold, "util_below: 10%    # x", 1))
    warnings = consistency_warnings(load_rules(rules))
    assert warnings and all("rule idle-gpu's 10%" in w and "util_below 5% differs" in w for w in warnings), warnings
    assert {w.split(":")[0] for w in warnings} == {"rule partly-idle-gpu", "rule unallocated-gpu"}


def test_a_number_without_the_unit_a_person_may_mean_is_said_by_rules_check_and_the_worker(tmp_path):
    """``for: 30`` is 30 seconds and ``util_below: 0.05`` is 0.05 %: valid, and read as written, but a person
    may mean 30 minutes and 5 % (an idle GPU alerted after half a minute; a crash-loop window of 6 seconds that
    catches no loop; a threshold a hundred times too low). ``rules check`` says so at the file and line, as does
    the worker's log when it loads them; a duration in whole minutes of seconds (``realert: 1800``), a unit
    written, and the shipped rules say nothing."""
    from streams.config import LiveConfig

    (tmp_path / "rules.yaml").write_text(
        "rules:\n"
        "  - name: idle-gpu\n"
        "    type: idle_gpu\n"
        "    params:\n"
        "      for: 30\n"
        "      util_below: 0.05\n"
        "      stale_after: 10m\n"
        "    realert: 1800\n"
        "    overrides:\n"
        "      - match: {tags: {team: nlp}}\n"
        "        params: {for: 45}\n"
        "  - name: failed\n"
        "    type: failed_run_spend\n"
        "    params: {loop_window: 6, min_usd: 20}\n"
    )  # fmt: skip
    out = rules_check(tmp_path)
    assert out.returncode == 0, out.stderr
    warned = [line for line in out.stdout.splitlines() if line.startswith("warning:") and "pricing" not in line]
    file = tmp_path / "rules.yaml"
    assert warned == [
        f"warning: {file}:5 rules[0].params.for: 30 has no unit: read as 30 seconds; write 30s to say so, or 30m",
        f"warning: {file}:6 rules[0].params.util_below: 0.05 is read as 0.05%, not 5%; write 0.05% to say so, or 5%",
        f"warning: {file}:11 rules[0].overrides[0].params.for: 45 has no unit: read as 45 seconds; write 45s to say so, "
        "or 45m",
        f"warning: {file}:14 rules[1].params.loop_window: 6 has no unit: read as 6 seconds; write 6s to say so, or 6m",
    ]
    with capture_logs() as logs:
        LiveConfig.load(tmp_path)
    assert len([e for e in logs if e["event"] == "rules_unit_unsaid"]) == 4
    assert not [line for line in rules_check(ROOT / "rules").stdout.splitlines() if "has no unit" in line or "is read as" in line]


def test_rules_explain_of_a_disabled_rule_says_it_is_disabled(tmp_path):
    """Not 'no enabled rule; did you mean' another: the rule is there, switched off."""
    from detector.rules import explain

    (tmp_path / "rules.yaml").write_text("rules:\n  - {name: idle-a, type: idle_gpu}\n"
                                         "  - {name: idle-b, type: idle_gpu, enabled: false}\n")  # fmt: skip
    ruleset = load_rules(tmp_path)
    with pytest.raises(KeyError, match="rule 'idle-b' is disabled"):
        explain(ruleset, "idle-b")
    with pytest.raises(KeyError, match="did you mean 'idle-a'"):
        explain(ruleset, "idle-c")


def test_unit_warnings_read_a_number_as_written_and_say_nothing_of_whole_minutes_given_as_floats(tmp_path):
    """``for: 3600.0`` is whole minutes as ``for: 3600`` is (it said "write 3600s to say so, or 3600m": 60 hours);
    a number is shown as written, never ``1e+06`` (``write 1e+06s`` does not parse) nor rounded to six digits;
    ``for_`` (the field's name, which the loader takes) and an optional duration (``patience_for``) are looked
    at as ``for`` is, and so is an action's ``after`` (``after: 2`` acts two seconds in); ``overrides: 5``, which
    the loader refuses, does not raise here (a reload reads the files again after they were validated)."""
    from detector.rules import unit_warnings

    (tmp_path / "rules.yaml").write_text(
        "rules:\n"
        "  - name: a\n"
        "    type: idle_gpu\n"
        "    params: {for: 3600.0, stale_after: 60.0, update_every: 1000000, util_below: 0.1234567}\n"
        "    realert: 0.00001\n"
        "    action: {kind: stop_instance, after: 2, mode: approve}\n"
        "  - name: b\n"
        "    type: idle_gpu\n"
        "    params: {for_: 30}\n"
        "  - name: c\n"
        "    type: plateaued_run\n"
        "    params: {patience_for: 45}\n"
    )  # fmt: skip
    load_rules(tmp_path)
    file = tmp_path / "rules.yaml"
    assert unit_warnings(tmp_path) == [
        f"{file}:5 rules[0].realert: 0.00001 has no unit: read as 0.00001 seconds; write 0.00001s to say so, or 0.00001m",
        f"{file}:4 rules[0].params.update_every: 1000000 has no unit: read as 1000000 seconds; write 1000000s to say "
        "so, or 1000000m",
        f"{file}:4 rules[0].params.util_below: 0.1234567 is read as 0.1234567%, not 12.34567%; write 0.1234567% to "
        "say so, or 12.34567%",
        f"{file}:6 rules[0].action.after: 2 has no unit: read as 2 seconds; write 2s to say so, or 2m",
        f"{file}:9 rules[1].params.for_: 30 has no unit: read as 30 seconds; write 30s to say so, or 30m",
        f"{file}:12 rules[2].params.patience_for: 45 has no unit: read as 45 seconds; write 45s to say so, or 45m",
    ]
    (tmp_path / "rules.yaml").write_text("rules:\n  - {name: a, type: idle_gpu, params: {for: 30}, overrides: 5}\n")
    assert unit_warnings(tmp_path) == [f"{file}:2 rules[0].params.for: 30 has no unit: read as 30 seconds; write 30s "
                                       "to say so, or 30m"]  # fmt: skip


def test_a_duration_too_large_for_a_float_is_an_error_of_the_file_not_an_overflow(tmp_path):
    """``for: 1000…0`` (400 digits, an int to YAML) made ``math.isfinite`` raise OverflowError: ``rules check`` and
    the worker's load crashed with a traceback where any other bad number is an error at its line."""
    (tmp_path / "rules.yaml").write_text("rules:\n  - name: a\n    type: idle_gpu\n    params: {for: 1" + "0" * 400 + "}\n")
    with pytest.raises(RulesInvalid, match=r"rules\.yaml:4 rules\[0\]\.params\.for: .*too large"):
        load_rules(tmp_path)
