"""Settings from the environment, a config file and options (pydantic-settings): which wins,
and a bad value's error names where it came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.settings import ENV, Settings, load_settings


def test_environment_variables_keep_their_names():
    """Deployments set these names (docker-compose.yml, deploy/k8s): renaming one silently
    drops a setting."""
    assert ENV["rules_path"] == "BURNWATCH_RULES"
    assert ENV["slack_bot_token"] == "SLACK_BOT_TOKEN" and ENV["slack_signing_secret"] == "SLACK_SIGNING_SECRET"
    assert ENV["slack_charts"] == "BURNWATCH_SLACK_CHARTS"
    assert all(var == f"BURNWATCH_{name.upper()}" for name, var in ENV.items()
               if not name.startswith("slack_") and name != "rules_path")  # fmt: skip
    settings = load_settings(environ={"BURNWATCH_RULES": "/etc/rules", "BURNWATCH_PARTITIONS": "8",
                                      "SLACK_BOT_TOKEN": "xoxb-1", "BURNWATCH_SLACK_CHARTS": "false",
                                      "BURNWATCH_LOG_LEVEL": ""})  # fmt: skip
    assert settings.rules_path == Path("/etc/rules") and settings.partitions == 8
    assert settings.slack_bot_token is not None and settings.slack_bot_token.get_secret_value() == "xoxb-1"
    assert settings.slack_charts is False
    assert settings.log_level == "info"  # an empty variable is unset, not an invalid level


def test_slack_secrets_mounted_from_files_lose_their_trailing_newline():
    """A Kubernetes Secret made ``--from-file`` ends with the file's newline: the bot token then made every
    Slack call fail (a header with a line break) and the signing secret every click's signature differ."""
    settings = load_settings(environ={"SLACK_BOT_TOKEN": "xoxb-1\n", "SLACK_SIGNING_SECRET": " abc123\r\n",
                                      "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T/B/x\n",
                                      "SLACK_CHANNEL": "#ml-cost\n"})  # fmt: skip
    assert settings.slack_bot_token is not None and settings.slack_bot_token.get_secret_value() == "xoxb-1"
    assert settings.slack_signing_secret is not None and settings.slack_signing_secret.get_secret_value() == "abc123"
    assert settings.slack_webhook_url is not None
    assert settings.slack_webhook_url.get_secret_value() == "https://hooks.slack.com/services/T/B/x"
    assert settings.slack_channel == "#ml-cost"
    assert load_settings(environ={"SLACK_BOT_TOKEN": "\n"}).slack_bot_token is None  # blank: unset


def test_file_then_environment_then_options(tmp_path):
    config = tmp_path / "burnwatch.yaml"
    config.write_text("partitions: 2\nweb_port: 7000\napp_id: from-file\n")
    settings = load_settings(config, environ={"BURNWATCH_PARTITIONS": "3", "BURNWATCH_WEB_PORT": "7001"}, web_port=7002)
    assert (settings.app_id, settings.partitions, settings.web_port) == ("from-file", 3, 7002)
    assert load_settings(environ={"BURNWATCH_CONFIG": str(config)}).app_id == "from-file"


def test_settings_alone_read_no_environment(monkeypatch):
    monkeypatch.setenv("BURNWATCH_PARTITIONS", "9")
    assert Settings().partitions == 4
    assert load_settings().partitions == 9


@pytest.mark.parametrize(
    "environ, overrides, config, expected",
    [
        ({"BURNWATCH_PARTITIONS": "eight"}, {}, None, "BURNWATCH_PARTITIONS: Input should be a valid integer"),
        ({"BURNWATCH_PARTITIONS": "0"}, {}, None, "BURNWATCH_PARTITIONS: Input should be greater than or equal to 1"),
        ({"BURNWATCH_SLACK_CHARTS": "perhaps"}, {}, None, "BURNWATCH_SLACK_CHARTS: Input should be a valid boolean"),
        ({"BURNWATCH_LOG_LEVEL": "warn"}, {}, None, "BURNWATCH_LOG_LEVEL: Input should be 'debug', 'info'"),
        ({"BURNWATCH_PARTITIONS": "2"}, {"partitions": 0}, None, "--partitions: Input should be greater"),
        ({}, {}, "batch_max_messages: 0\n", "burnwatch.yaml: batch_max_messages: Input should be greater"),
        ({}, {}, "partition: 2\n", "burnwatch.yaml: partition: not a setting (did you mean 'partitions'?)"),
        # a rules file given as --config: where rules go, not pydantic's "Extra inputs are not permitted"
        ({}, {}, "rules: []\n", "burnwatch.yaml: rules: not a setting (rules are read from their own files: rules_path"),
        # a key in its variable's form (BURNWATCH_PARTITIONS: 2 is read) or in capitals is hinted in that form: the hint
        # looked among the settings' names alone, and said nothing
        ({}, {}, "BURNWATCH_PARTITON: 2\n",
         "burnwatch.yaml: BURNWATCH_PARTITON: not a setting (did you mean 'BURNWATCH_PARTITIONS'?)"),
        ({}, {}, "PARTITIONS: 2\n", "burnwatch.yaml: PARTITIONS: not a setting (did you mean 'partitions'?)"),
        ({}, {}, "slack_bot_tokn: x\n", "burnwatch.yaml: slack_bot_tokn: not a setting (did you mean 'slack_bot_token'?)"),
        # an escape sequence in a key is shown escaped, not run by the terminal
        ({}, {}, '"part\\x1b[2Jitions": 2\n', "burnwatch.yaml: part\\x1b[2Jitions: not a setting"),
        # a key that is no string (1: 2, null: x) was pydantic's TypeError 'keywords must be strings', a traceback
        ({}, {}, "1: 2\n", "burnwatch.yaml: a config file is a mapping of setting: value; 1 is no setting's name"),
        # a relative chdb DSN made its store at the root (/clickhouse), then failed on a database named so
        ({"BURNWATCH_CLICKHOUSE_DSN": "chdb://.burnwatch/clickhouse"}, {}, None,
         "BURNWATCH_CLICKHOUSE_DSN: Value error, an embedded store is chdb:///absolute/directory (three slashes)"),
        ({"BURNWATCH_SESSION_TIMEOUT_S": "inf"}, {}, None, "BURNWATCH_SESSION_TIMEOUT_S: Input should be a finite number"),
        # any other scheme was taken for an HTTP server's host ("x")
        ({"BURNWATCH_CLICKHOUSE_DSN": "foo://x"}, {}, None, "BURNWATCH_CLICKHOUSE_DSN: Value error, expected chdb:///dir"),
        # written unquoted into every statement: a hyphen was a ClickHouse syntax error, a ';' worse
        ({"BURNWATCH_CLICKHOUSE_DATABASE": "burnwatch-prod"}, {}, None, "BURNWATCH_CLICKHOUSE_DATABASE: String should match"),
        ({"BURNWATCH_WEB_PORT": "70000"}, {}, None, "BURNWATCH_WEB_PORT: Input should be less than or equal to 65535"),
        # read only when the worker's timers start, after the store was made: a traceback naming nothing
        ({"BURNWATCH_MODEL_RETRAIN_EVERY": "daily"}, {}, None,
         "BURNWATCH_MODEL_RETRAIN_EVERY: Value error, invalid duration 'daily'"),
        ({"BURNWATCH_MODEL_TRAIN_SINCE": "two weeks"}, {}, None, "BURNWATCH_MODEL_TRAIN_SINCE: Value error, invalid duration"),
        ({"BURNWATCH_SLACK_GROUP_WAIT_S": "-1"}, {}, None,
         "BURNWATCH_SLACK_GROUP_WAIT_S: Input should be greater than or equal to 0"),
    ],
)
def test_a_bad_value_names_its_variable(tmp_path, environ, overrides, config, expected):
    path = None
    if config is not None:
        path = tmp_path / "burnwatch.yaml"
        path.write_text(config)
    with pytest.raises(ValueError) as caught:
        load_settings(path, environ=environ, **overrides)
    assert expected in str(caught.value).replace(str(tmp_path) + "/", "")


def test_every_bad_value_is_reported_at_once_and_secrets_are_not_echoed(tmp_path):
    config = tmp_path / "burnwatch.yaml"
    config.write_text("slack_signing_secret: {value: s3cr3t}\n")
    with pytest.raises(ValueError) as caught:
        load_settings(config, environ={"BURNWATCH_PARTITIONS": "x", "BURNWATCH_WEB_PORT": "y",
                                       "BURNWATCH_BATCH_WITHIN_S": "-1"})  # fmt: skip
    text = str(caught.value)
    assert "BURNWATCH_PARTITIONS" in text and "BURNWATCH_WEB_PORT" in text and "BURNWATCH_BATCH_WITHIN_S" in text
    assert "burnwatch.yaml: slack_signing_secret: Input should be a valid string" in text
    assert "(got 'x')" in text and "s3cr3t" not in text


def test_an_unreadable_config_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="missing.yaml: cannot read config"):
        load_settings(tmp_path / "missing.yaml", environ={})
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ValueError, match="list.yaml: a config file is a mapping"):
        load_settings(tmp_path / "list.yaml", environ={})


def test_every_setting_has_its_line_in_worker_help():
    """`worker --help` listed five variables with no description."""
    from streams.cli import _ENV_HELP

    assert sorted(set(ENV) - set(_ENV_HELP)) == []


def test_a_misspelt_variable_is_said_with_the_one_it_likely_means():
    """``BURNWATCH_PARTITON=8`` is ignored by the settings (their source reads the variables it knows), the
    partitions left at the default with nothing said: it is said, with the variable it likely means. One of
    another name (a secret an output's ``secret_env`` names) and the config file's variable say nothing."""
    from detector.settings import unknown_variables

    environ = {"BURNWATCH_PARTITON": "8", "BURNWATCH_PARTITIONS": "2", "BURNWATCH_HOOK_SECRET": "s3cret",
               "BURNWATCH_CONFIG": "/etc/burnwatch.yaml", "PATH": "/usr/bin"}  # fmt: skip
    assert unknown_variables(environ) == [
        "BURNWATCH_PARTITON is no setting's variable and is ignored; did you mean BURNWATCH_PARTITIONS?"]
    assert load_settings(environ={k: v for k, v in environ.items() if k != "BURNWATCH_CONFIG"}).partitions == 2


def test_openings_wait_thirty_seconds_for_company_unless_told_otherwise():
    """Alertmanager's group_wait: a storm of hosts going idle at once is a few messages (2 s made it 75 of 300)."""
    assert load_settings(None, environ={}).slack_group_wait_s == 30.0
    assert load_settings(None, environ={"BURNWATCH_SLACK_GROUP_WAIT_S": "0"}).slack_group_wait_s == 0.0
