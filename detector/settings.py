"""Configuration: environment variables, optionally over one YAML file.

Every setting has a default that runs on one machine with nothing installed:
an embedded broker, the embedded ClickHouse engine under ``./.burnwatch/``,
the rules in ``./rules/``. ``BURNWATCH_CONFIG`` (or ``--config``) names a YAML
file with the same keys in lower case; environment variables win over it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

__all__ = ["Settings", "load_settings"]

ENV = {
    "kafka_bootstrap": "BURNWATCH_KAFKA_BOOTSTRAP",
    "clickhouse_dsn": "BURNWATCH_CLICKHOUSE_DSN",
    "clickhouse_database": "BURNWATCH_CLICKHOUSE_DATABASE",
    "rules_path": "BURNWATCH_RULES",
    "data_dir": "BURNWATCH_DATA_DIR",
    "app_id": "BURNWATCH_APP_ID",
    "partitions": "BURNWATCH_PARTITIONS",
    "web_port": "BURNWATCH_WEB_PORT",
    "web_host": "BURNWATCH_WEB_HOST",
    "batch_max_messages": "BURNWATCH_BATCH_MAX_MESSAGES",
    "batch_within_s": "BURNWATCH_BATCH_WITHIN_S",
    "session_timeout_s": "BURNWATCH_SESSION_TIMEOUT_S",
    "log_format": "BURNWATCH_LOG_FORMAT",
    "log_level": "BURNWATCH_LOG_LEVEL",
    "slack_bot_token": "SLACK_BOT_TOKEN",
    "slack_channel": "SLACK_CHANNEL",
    "slack_webhook_url": "SLACK_WEBHOOK_URL",
    "slack_base_url": "SLACK_BASE_URL",
    "slack_signing_secret": "SLACK_SIGNING_SECRET",
    "slack_charts": "BURNWATCH_SLACK_CHARTS",
    "model_dir": "BURNWATCH_MODEL_DIR",
    "model_retrain_every": "BURNWATCH_MODEL_RETRAIN_EVERY",
    "model_train_since": "BURNWATCH_MODEL_TRAIN_SINCE",
    "event_ttl_days": "BURNWATCH_EVENT_TTL_DAYS",
    "stall_exit_s": "BURNWATCH_STALL_EXIT_S",
}


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kafka_bootstrap: str = ""
    """host:port[,host:port]; empty starts the embedded broker (demo) or is an error (worker)."""
    clickhouse_dsn: str = ""
    """``chdb:///abs/dir``, ``chdb://memory`` or ``http://user:pass@host:8123``; empty: embedded under data_dir."""
    clickhouse_database: str = "burnwatch"
    rules_path: Path = Path("rules")
    data_dir: Path = Path(".burnwatch")
    app_id: str = "burnwatch"
    partitions: int = Field(default=4, ge=1)
    web_port: int = 6066
    web_host: str = "127.0.0.1"
    batch_max_messages: int = Field(default=5000, ge=1)
    batch_within_s: float = Field(default=0.25, gt=0)
    session_timeout_s: float = Field(default=10.0, gt=0)
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    slack_bot_token: SecretStr | None = None
    slack_channel: str | None = None
    slack_webhook_url: SecretStr | None = None
    model_dir: Path | None = None
    """Anomaly model artifacts; default: <data dir>/models."""
    model_retrain_every: str = ""
    """Retrain on this schedule (e.g. 24h) over ``model_train_since`` of stored events; empty: never."""
    model_train_since: str = "14d"
    event_ttl_days: int = Field(default=30, ge=0)
    """Raw events are deleted this many days after their event time (0: kept forever); the
    hourly and daily rollups are kept. Longer than ``model_train_since``."""
    stall_exit_s: float = Field(default=300.0, gt=0)
    """A worker that could not write to ClickHouse for this long exits non-zero, so that its
    orchestrator restarts it; until then /healthz answers 503 ``stalled``."""
    slack_charts: bool = True
    """Attach a chart of the metric in each incident's thread (bot token only)."""
    slack_signing_secret: SecretStr | None = None
    """Verifies button clicks sent to ``/slack/actions``; without it the endpoint refuses them."""
    slack_base_url: str | None = None
    """Only for pointing slack-sdk at a local Slack stand-in (tests, demo)."""

    @property
    def dsn(self) -> str:
        if self.clickhouse_dsn:
            return self.clickhouse_dsn
        return f"chdb://{(self.data_dir / 'clickhouse').resolve()}"

    @property
    def model_path(self) -> Path:
        return self.model_dir or self.data_dir / "models"

    @property
    def slack_configured(self) -> bool:
        return bool((self.slack_bot_token and self.slack_channel) or self.slack_webhook_url)


def load_settings(config_file: str | Path | None = None, environ: Mapping[str, str] | None = None,
                  **overrides: Any) -> Settings:  # fmt: skip
    """File (if any) < environment (``environ``, default the process's) < explicit overrides.
    Errors name the file or variable."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    config_file = config_file or env.get("BURNWATCH_CONFIG")
    if config_file:
        try:
            loaded = yaml.safe_load(Path(config_file).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"{config_file}: cannot read config: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ValueError(f"{config_file}: a config file is a mapping of setting: value")
        values.update(loaded)
    for key, var in ENV.items():
        if env.get(var):
            values[key] = env[var]
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            key = str(err["loc"][0]) if err["loc"] else ""
            source = ENV.get(key, key) if key not in (overrides or {}) else f"--{key}"
            lines.append(f"{source}: {err['msg']}")
        raise ValueError("invalid settings:\n  " + "\n  ".join(lines)) from None
