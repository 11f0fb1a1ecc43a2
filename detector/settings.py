"""Configuration: environment variables, optionally over one YAML file.

Every setting has a default that runs on one machine with nothing installed:
an embedded broker, the embedded ClickHouse engine under ``./.burnwatch/``,
the rules in ``./rules/``. ``BURNWATCH_CONFIG`` (or ``--config``) names a YAML
file with the same keys in lower case; environment variables win over it, and
command-line options over both.

Read with pydantic-settings: each field names its environment variable
(``validation_alias``), so a bad value's error names the variable it came from.
"""

from __future__ import annotations

import difflib
import os
import re
import ssl
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, InitSettingsSource, SettingsConfigDict
from pydantic_settings import PydanticBaseSettingsSource as Source

from detector.kafka_security import (
    AWS_MSK_IAM,
    MECHANISMS,
    OAUTHBEARER,
    PASSWORD_MECHANISMS,
    SASL_PROTOCOLS,
    TLS_PROTOCOLS,
    KafkaSecurity,
    Mechanism,
    Protocol,
    check_identity,  # fmt: skip
    check_trust,
    msk_region,
)
from detector.units import parse_duration, printable

__all__ = ["BROKER_DEFAULT", "ENV", "Settings", "bind_host", "load_settings", "unknown_variables", "url_host"]

BROKER_DEFAULT = -1
"""A replication factor of -1: the broker's ``default.replication.factor`` (Kafka 2.4 and later, KIP-464)."""


class Settings(BaseSettings):
    """The worker's and the CLI's settings. Built by :func:`load_settings`; ``Settings(...)``
    alone reads only its arguments, never the environment."""

    model_config = SettingsConfigDict(extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True,
                                      case_sensitive=True, env_ignore_empty=True, allow_inf_nan=False)  # fmt: skip

    kafka_bootstrap: str = Field(default="", validation_alias="BURNWATCH_KAFKA_BOOTSTRAP")
    """host:port[,host:port]; empty starts the embedded broker (demo) or is an error (worker)."""
    kafka_security_protocol: Protocol = Field(default="PLAINTEXT", validation_alias="BURNWATCH_KAFKA_SECURITY_PROTOCOL")
    """How every Kafka client burnwatch makes connects (:mod:`detector.kafka_security`): PLAINTEXT, SSL (TLS),
    SASL_PLAINTEXT or SASL_SSL (SASL over TLS, what managed clusters ask). The settings below are checked
    against it when they load: one it would not use is refused rather than ignored."""
    kafka_sasl_mechanism: Mechanism | None = Field(default=None, validate_default=True,
                                                   validation_alias="BURNWATCH_KAFKA_SASL_MECHANISM")  # fmt: skip
    kafka_sasl_username: str | None = Field(default=None, validate_default=True,
                                            validation_alias="BURNWATCH_KAFKA_SASL_USERNAME")  # fmt: skip
    kafka_sasl_password: SecretStr | None = Field(default=None, validation_alias="BURNWATCH_KAFKA_SASL_PASSWORD")
    kafka_sasl_password_file: Path | None = Field(default=None, validate_default=True,
                                                  validation_alias="BURNWATCH_KAFKA_SASL_PASSWORD_FILE")  # fmt: skip
    """The password in a file (a mounted Kubernetes Secret), read by each client as it is made; instead of
    ``kafka_sasl_password``, never with it."""
    kafka_aws_region: str | None = Field(default=None, validate_default=True, pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]+$",
                                         validation_alias="BURNWATCH_KAFKA_AWS_REGION")  # fmt: skip
    """The MSK cluster's region, with ``BURNWATCH_KAFKA_SASL_MECHANISM=AWS_MSK_IAM`` alone; unset: where its brokers'
    names say (MSK's own names do), else the AWS SDK's ``AWS_REGION`` or ``AWS_DEFAULT_REGION``."""
    kafka_oauth_token_url: str | None = Field(default=None, validate_default=True,
                                              validation_alias="BURNWATCH_KAFKA_OAUTH_TOKEN_URL")  # fmt: skip
    """With ``BURNWATCH_KAFKA_SASL_MECHANISM=OAUTHBEARER`` (and needed there): the OAuth server's token endpoint, which
    each client asks for a token by the client credentials grant, as the client ``kafka_sasl_username`` with the
    secret ``kafka_sasl_password`` (or its file). https, or http to this machine alone: the secret goes with it."""
    kafka_oauth_scope: str | None = Field(default=None, validation_alias="BURNWATCH_KAFKA_OAUTH_SCOPE")
    """The scope asked with each token (space-separated), where the server wants one."""
    kafka_oauth_extensions: str | None = Field(default=None, validation_alias="BURNWATCH_KAFKA_OAUTH_EXTENSIONS")
    """SASL extensions sent beside each token, ``key=value,key=value`` (Confluent Cloud:
    ``logicalCluster=lkc-abc12,identityPoolId=pool-AbCd``)."""
    kafka_oauth_ca_file: Path | None = Field(default=None, validation_alias="BURNWATCH_KAFKA_OAUTH_CA_FILE")
    """A PEM bundle of the CAs that sign the token endpoint's certificate (a Keycloak or another OIDC server behind a
    private CA, often not the brokers'); unset: the system's trust store (``SSL_CERT_FILE`` where set)."""
    kafka_ssl_ca_file: Path | None = Field(default=None, validation_alias="BURNWATCH_KAFKA_SSL_CA_FILE")
    """A PEM bundle of the CAs that sign the brokers' certificates; unset: the system's trust store."""
    kafka_ssl_cert_file: Path | None = Field(default=None, validation_alias="BURNWATCH_KAFKA_SSL_CERT_FILE")
    kafka_ssl_key_file: Path | None = Field(default=None, validate_default=True,
                                            validation_alias="BURNWATCH_KAFKA_SSL_KEY_FILE")  # fmt: skip
    """A client certificate and its unencrypted PEM key, for clusters that authenticate clients by TLS (mutual TLS)."""
    kafka_ssl_check_hostname: bool = Field(default=True, validation_alias="BURNWATCH_KAFKA_SSL_CHECK_HOSTNAME")
    """Whether a broker's name must match its certificate (the certificate is verified either way)."""
    clickhouse_dsn: str = Field(default="", validation_alias="BURNWATCH_CLICKHOUSE_DSN")
    """``chdb:///abs/dir``, ``chdb://memory`` or ``http://user:pass@host:8123``; empty: embedded under data_dir."""
    clickhouse_database: str = Field(default="burnwatch", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$",
                                     validation_alias="BURNWATCH_CLICKHOUSE_DATABASE")  # fmt: skip
    """A plain identifier: it is written into every statement, unquoted."""
    rules_path: Path = Field(default=Path("rules"), validation_alias="BURNWATCH_RULES")
    data_dir: Path = Field(default=Path(".burnwatch"), validation_alias="BURNWATCH_DATA_DIR")
    app_id: str = Field(default="burnwatch", validation_alias="BURNWATCH_APP_ID")
    partitions: int = Field(default=4, ge=1, validation_alias="BURNWATCH_PARTITIONS")
    replication_factor: int = Field(default=BROKER_DEFAULT, ge=BROKER_DEFAULT, le=32767,
                                    validation_alias="BURNWATCH_REPLICATION_FACTOR")  # fmt: skip
    """Replicas of every topic burnwatch creates (inputs, dead letters, Faust's own); -1: the broker's
    ``default.replication.factor``, so that a cluster's own policy holds (1 was lost with its one broker,
    and refused where ``min.insync.replicas`` or a managed cluster asks for more). Topics that exist are
    left as they are."""
    web_port: int = Field(default=6066, ge=1, le=65535, validation_alias="BURNWATCH_WEB_PORT")
    web_host: str = Field(default="127.0.0.1", validation_alias="BURNWATCH_WEB_HOST")
    web_user_header: str | None = Field(default=None, pattern=r"^[A-Za-z0-9-]{1,64}$",
                                        validation_alias="BURNWATCH_WEB_USER_HEADER")
    """The header the authenticating proxy in front of ``/incidents`` names the person with
    (``X-Forwarded-Email``, ``X-Auth-Request-User``): with it, the page offers Approve /
    Decline to that person (docs/incidents.md); unset, the page is read-only and its POSTs
    are refused. Only set it when nothing but the proxy can reach the worker's port."""
    web_origin: str | None = Field(default=None, pattern=r"^https?://[A-Za-z0-9.:\[\]-]+$",
                                   validation_alias="BURNWATCH_WEB_ORIGIN")
    """The page's origin as browsers see it (``https://burnwatch.example.com``), checked against
    a POST's ``Origin`` when the browser sends no ``Sec-Fetch-Site``; unset: the ``Host`` header."""
    web_token_secret: SecretStr | None = Field(default=None, min_length=16, validation_alias="BURNWATCH_WEB_TOKEN_SECRET")
    """The key of the incidents page's form tokens. The same on every worker of a group lets a
    page served by one be posted to another (a load balancer between); unset: a random key
    per process (a page must be reloaded after a restart, or on another worker)."""
    batch_max_messages: int = Field(default=50_000, ge=1, validation_alias="BURNWATCH_BATCH_MAX_MESSAGES")
    batch_max_bytes: int = Field(default=16 << 20, ge=1, validation_alias="BURNWATCH_BATCH_MAX_BYTES")
    batch_within_s: float = Field(default=0.1, gt=0, validation_alias="BURNWATCH_BATCH_WITHIN_S")
    """How long a live trickle's batch waits for more after its first message: the decision's delay
    against the store's inserts a second (docs/performance.md, "The delay to a decision")."""
    max_held_per_partition: int = Field(default=2000, ge=1, validation_alias="BURNWATCH_MAX_HELD_PER_PARTITION")
    max_partition_fetch_bytes: int = Field(default=1 << 20, ge=1 << 10, validation_alias="BURNWATCH_MAX_PARTITION_FETCH_BYTES")
    """The most one fetch takes of one partition (Kafka's ``max.partition.fetch.bytes``, whose default
    this is; a record batch larger is still taken whole): what a partition can take in past its share
    before its pause takes effect, and what the consumer buffers for a paused one. 8 MiB until
    2026-12-04 (docs/performance.md, Memory)."""
    fetch_max_bytes: int = Field(default=50 << 20, ge=1 << 10, validation_alias="BURNWATCH_FETCH_MAX_BYTES")
    """The most one fetch brings of all partitions together (Kafka's ``fetch.max.bytes``, whose default
    this is; a first record batch larger is still returned): how much lands between two decisions of flow
    control. A broker that honours the per-partition limit above bounds each partition's part anyway; the
    embedded broker does not, and honours this one: there 2 MiB took 15 % off a catch-up's peak memory
    over 16 partitions and 4 % off one event a message's throughput (docs/performance.md, Memory)."""
    session_timeout_s: float = Field(default=10.0, gt=0, validation_alias="BURNWATCH_SESSION_TIMEOUT_S")
    log_format: Literal["auto", "json", "console"] = Field(default="auto", validation_alias="BURNWATCH_LOG_FORMAT")
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", validation_alias="BURNWATCH_LOG_LEVEL")
    slack_bot_token: SecretStr | None = Field(default=None, validation_alias="SLACK_BOT_TOKEN")
    slack_channel: str | None = Field(default=None, validation_alias="SLACK_CHANNEL")
    slack_webhook_url: SecretStr | None = Field(default=None, validation_alias="SLACK_WEBHOOK_URL")
    model_dir: Path | None = Field(default=None, validation_alias="BURNWATCH_MODEL_DIR")
    """Anomaly model artifacts; default: <data dir>/models."""
    model_retrain_every: str = Field(default="", validation_alias="BURNWATCH_MODEL_RETRAIN_EVERY")
    """Retrain on this schedule (e.g. 24h) over ``model_train_since`` of stored events; empty: never."""
    model_train_since: str = Field(default="14d", validation_alias="BURNWATCH_MODEL_TRAIN_SINCE")
    evict_after_s: float = Field(default=3600.0, ge=0, validation_alias="BURNWATCH_EVICT_AFTER_S")
    """A resource with no event for this long (event time) leaves the worker's memory; its state,
    saved in the store, is read back when it speaks again (0: state stays in memory until it expires)."""
    delivery_memory_s: float = Field(default=7 * 86_400.0, ge=0, validation_alias="BURNWATCH_DELIVERY_MEMORY_S")
    """A closed alert's delivery records (Slack's, the other outputs') leave the worker's memory this long
    (event time) after it closed; a change of it after that is looked up in the store. The default is
    :data:`detector.closed_alerts.DELIVERY_HORIZON_S` (the alert manager's horizon, why: that module)."""
    event_ttl_days: int = Field(default=30, ge=0, validation_alias="BURNWATCH_EVENT_TTL_DAYS")
    """Raw events are deleted this many days after their event time (0: kept forever); the
    hourly and daily rollups are kept. Longer than ``model_train_since``."""
    stall_exit_s: float = Field(default=300.0, gt=0, validation_alias="BURNWATCH_STALL_EXIT_S")
    """A worker that could not write to ClickHouse for this long exits non-zero, so that its
    orchestrator restarts it; until then /healthz answers 503 ``stalled``."""
    event_writer: Literal["auto", "process", "thread"] = Field(default="auto", validation_alias="BURNWATCH_EVENT_WRITER")
    """Where a worker's event inserts run: in a child process (``process``; ``auto`` when the worker
    may use two CPUs or more): the insert's Python off the worker's GIL, the child reaching a
    ClickHouse server with its own client and the embedded engine (one per process) through the
    worker; or always in the worker's writer thread (``thread``)."""
    slack_charts: bool = Field(default=True, validation_alias="BURNWATCH_SLACK_CHARTS")
    """Attach a chart of the metric in each incident's thread (bot token only)."""
    slack_group_wait_s: float = Field(default=30.0, ge=0, le=600, validation_alias="BURNWATCH_SLACK_GROUP_WAIT_S")
    """How long a new opening waits in the Slack outbox for others of its type and team (the account for
    ``untagged``) fired within two minutes of it, to go out as one message: Alertmanager's ``group_wait``, 30 s.
    A cluster's jobs ending at night idle hundreds of hosts within minutes; at the 2 s it was, a storm of 300 was
    75 messages (docs/architecture.md, "Alert volume"). Every opening is that much later in Slack."""
    slack_signing_secret: SecretStr | None = Field(default=None, validation_alias="SLACK_SIGNING_SECRET")
    """Verifies button clicks sent to ``/slack/actions``; without it the endpoint refuses them."""
    slack_workspace_url: str | None = Field(default=None, pattern=r"^https?://[^\s\"'<>]+$",
                                            validation_alias="SLACK_WORKSPACE_URL")
    """The workspace's address (``https://acme.slack.com``): incident lists link each incident's
    Slack message from it (``/archives/CHANNEL/pTS``); unset, they show no link."""
    slack_base_url: str | None = Field(default=None, validation_alias="SLACK_BASE_URL")
    """Only for pointing slack-sdk at a local Slack stand-in (tests, demo)."""

    @field_validator("clickhouse_dsn")
    @classmethod
    def _a_store_address(cls, dsn: str) -> str:
        """An embedded store by its absolute directory (``chdb://dir`` reads ``dir`` as a host: a store made at the
        root), or a server (any other scheme was taken for a server at a host of that name)."""
        if dsn.startswith("chdb:") and dsn != "chdb://memory" and not dsn.startswith("chdb:///"):
            raise ValueError("an embedded store is chdb:///absolute/directory (three slashes) or chdb://memory")
        scheme = dsn.partition("://")[0].lower() if "://" in dsn else ""
        if dsn and scheme not in ("chdb", "http", "https", "clickhouse", "clickhouses"):
            raise ValueError("expected chdb:///dir, chdb://memory or http(s)://user:pass@host:8123 (a server)")
        return dsn

    @field_validator("slack_bot_token", "slack_signing_secret", "slack_webhook_url", "slack_channel",
                     "kafka_sasl_username", "kafka_sasl_password", mode="before")  # fmt: skip
    @classmethod
    def _trimmed(cls, value: Any) -> Any:
        """Without the whitespace around it: a Kubernetes Secret made ``--from-file`` ends with the
        file's newline, which made every Slack call fail (a header with a line break) and every
        click's signature differ."""
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if isinstance(value, str):
            return value.strip() or None
        return value

    @field_validator("kafka_security_protocol", "kafka_sasl_mechanism", mode="before")
    @classmethod
    def _kafka_name(cls, value: Any, info: ValidationInfo) -> Any:
        """Kafka's names in any case; a SASL mechanism burnwatch does not speak (GSSAPI, OAUTHBEARER) is said
        to be one."""
        if not isinstance(value, str):
            return value
        value = value.strip().upper() or None
        if info.field_name == "kafka_sasl_mechanism" and value is not None and value not in MECHANISMS:
            raise ValueError(f"{value} is not supported: burnwatch speaks {', '.join(PASSWORD_MECHANISMS)} (a username "
                             f"and a password), {OAUTHBEARER} (an OAuth server's tokens) and {AWS_MSK_IAM} (Amazon "
                             "MSK's IAM access control)")  # fmt: skip
        return value

    @field_validator("kafka_sasl_mechanism", "kafka_sasl_username", "kafka_sasl_password", "kafka_sasl_password_file")
    @classmethod
    def _with_sasl(cls, value: Any, info: ValidationInfo) -> Any:
        """SASL settings go with a SASL protocol: the mechanism and the user are needed there, and refused
        elsewhere (a password set beside PLAINTEXT meant SASL, and would have connected without it)."""
        protocol = info.data.get("kafka_security_protocol")
        if protocol is None:  # its own error is reported
            return value
        sasl = protocol in SASL_PROTOCOLS
        if value is not None and not sasl:
            raise ValueError(f"set, but BURNWATCH_KAFKA_SECURITY_PROTOCOL is {protocol}: SASL settings go with "
                             "SASL_SSL or SASL_PLAINTEXT")  # fmt: skip
        if value is None and sasl and info.field_name == "kafka_sasl_mechanism":
            raise ValueError(f"needed with BURNWATCH_KAFKA_SECURITY_PROTOCOL={protocol}: one of {', '.join(MECHANISMS)}")
        if value == AWS_MSK_IAM and protocol != "SASL_SSL":
            raise ValueError(f"{AWS_MSK_IAM} goes with BURNWATCH_KAFKA_SECURITY_PROTOCOL=SASL_SSL: MSK's IAM listener "
                             "(port 9098) is TLS")  # fmt: skip
        iam = info.data.get("kafka_sasl_mechanism") == AWS_MSK_IAM
        if value is not None and iam and info.field_name != "kafka_sasl_mechanism":
            raise ValueError(f"set, but BURNWATCH_KAFKA_SASL_MECHANISM is {AWS_MSK_IAM}, which signs with the AWS "
                             "credentials (IRSA's role, the instance profile, AWS_* variables): no username or "
                             "password")  # fmt: skip
        if value is None and sasl and not iam and info.field_name == "kafka_sasl_username":
            raise ValueError(f"needed with BURNWATCH_KAFKA_SECURITY_PROTOCOL={protocol}")
        return value

    @field_validator("kafka_sasl_password_file")
    @classmethod
    def _one_password(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        """With SASL, the password from the variable or from a readable, non-empty file: one of them."""
        if info.data.get("kafka_security_protocol") not in SASL_PROTOCOLS or "kafka_sasl_password" not in info.data \
                or info.data.get("kafka_sasl_mechanism") == AWS_MSK_IAM:  # fmt: skip
            return path
        given = info.data["kafka_sasl_password"] is not None
        if given and path is not None:
            raise ValueError("set beside BURNWATCH_KAFKA_SASL_PASSWORD: give the password one way")
        if not given and path is None:
            raise ValueError("BURNWATCH_KAFKA_SASL_PASSWORD, or this file holding it, is needed with "
                             f"BURNWATCH_KAFKA_SECURITY_PROTOCOL={info.data['kafka_security_protocol']}")  # fmt: skip
        if path is not None:
            try:
                content = _read_secret(path)
            except ValueError:  # not "{path}: ...": a password put in this variable by mistake would be shown
                raise ValueError(f"cannot read the file it names ({_reason_reading(path)})") from None
            if not content:
                raise ValueError(f"{path} is empty")
        return path

    @field_validator("kafka_oauth_token_url", "kafka_oauth_scope", "kafka_oauth_extensions")
    @classmethod
    def _with_oauth(cls, value: str | None, info: ValidationInfo) -> str | None:
        """The OAuth settings go with OAUTHBEARER alone, where the token endpoint is needed: https, or http to this
        machine (the client secret goes with each request); extensions as RFC 7628 has them (a key of letters)."""
        if "kafka_sasl_mechanism" not in info.data:  # its own error is reported
            return value
        value = value.strip() or None if isinstance(value, str) else value
        oauth = info.data["kafka_sasl_mechanism"] == OAUTHBEARER
        if value is not None and not oauth:
            raise ValueError(f"set, but BURNWATCH_KAFKA_SASL_MECHANISM is not {OAUTHBEARER}")
        if info.field_name == "kafka_oauth_token_url" and oauth:
            if value is None:
                raise ValueError(f"needed with BURNWATCH_KAFKA_SASL_MECHANISM={OAUTHBEARER}: the OAuth server's token "
                                 "endpoint (https://...)")  # fmt: skip
            parts = urllib.parse.urlsplit(value)
            loopback = parts.hostname in ("localhost", "127.0.0.1", "::1")
            if parts.scheme != "https" and not (parts.scheme == "http" and loopback) or not parts.hostname:
                raise ValueError("expected an https:// URL (http:// to this machine alone): the client secret goes "
                                 "with each request")  # fmt: skip
        if info.field_name == "kafka_oauth_extensions" and value is not None:
            _oauth_extensions(value)
        return value

    @field_validator("kafka_oauth_ca_file")
    @classmethod
    def _oauth_ca(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        """The token endpoint's CAs go with OAUTHBEARER alone, and are read now: a file missing or not PEM is named at
        start, not found at the first token."""
        if path is None or "kafka_sasl_mechanism" not in info.data:
            return path
        if info.data["kafka_sasl_mechanism"] != OAUTHBEARER:
            raise ValueError(f"set, but BURNWATCH_KAFKA_SASL_MECHANISM is not {OAUTHBEARER}")
        return _ca_bundle(path)

    @field_validator("kafka_aws_region")
    @classmethod
    def _region_with_iam(cls, region: str | None, info: ValidationInfo) -> str | None:
        """The region goes with AWS_MSK_IAM alone; unset, it is read from the brokers' names where they say it."""
        iam = info.data.get("kafka_sasl_mechanism") == AWS_MSK_IAM
        if region is not None and not iam and "kafka_sasl_mechanism" in info.data:
            raise ValueError(f"set, but BURNWATCH_KAFKA_SASL_MECHANISM is not {AWS_MSK_IAM}: the region is what MSK's "
                             "IAM tokens are signed for")  # fmt: skip
        if region is None and iam:
            return msk_region(info.data.get("kafka_bootstrap", ""), {})  # (else AWS_REGION, read as a client is made)
        return region

    @field_validator("kafka_ssl_ca_file", "kafka_ssl_cert_file", "kafka_ssl_key_file")
    @classmethod
    def _with_tls(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        """TLS files go with a TLS protocol, and are read now: a file missing or not PEM is named at start,
        not found at the first connection."""
        protocol = info.data.get("kafka_security_protocol")
        if path is None or protocol is None:
            return path
        if protocol not in TLS_PROTOCOLS:
            raise ValueError(f"set, but {_not_tls(protocol)}")
        if info.field_name == "kafka_ssl_ca_file":
            return _ca_bundle(path)
        if not path.is_file():
            raise ValueError(f"{path}: no such file")
        return path

    @field_validator("kafka_ssl_check_hostname")
    @classmethod
    def _hostname_with_tls(cls, check: bool, info: ValidationInfo) -> bool:
        """Turning the check of the brokers' names off goes with a TLS protocol: beside another it would say
        nothing, and likely means the protocol was meant to be SSL or SASL_SSL."""
        protocol = info.data.get("kafka_security_protocol")
        if not check and protocol is not None and protocol not in TLS_PROTOCOLS:
            raise ValueError(f"set to false, but {_not_tls(protocol)}")
        return check

    @field_validator("kafka_ssl_key_file")
    @classmethod
    def _a_key_pair(cls, key: Path | None, info: ValidationInfo) -> Path | None:
        """A client certificate and its key, both or neither, and loadable together."""
        if "kafka_ssl_cert_file" not in info.data:  # its own error is reported
            return key
        cert = info.data["kafka_ssl_cert_file"]
        if cert is None and key is not None:
            raise ValueError("set without BURNWATCH_KAFKA_SSL_CERT_FILE: the client certificate and its key go together")
        if cert is not None and key is None:
            raise ValueError("needed with BURNWATCH_KAFKA_SSL_CERT_FILE: the client certificate's key")
        if cert is not None and key is not None:
            try:
                check_identity(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), cert, key)
            except (ssl.SSLError, OSError) as exc:
                raise ValueError(f"{cert} and {key} are not a PEM certificate and its unencrypted key "
                                 f"({_reason(exc)})") from None  # fmt: skip
        return key

    @field_validator("replication_factor")
    @classmethod
    def _replicas(cls, value: int) -> int:
        if value == 0:
            raise ValueError("a topic has one replica or more; -1 is the broker's default.replication.factor")
        return value

    @field_validator("model_retrain_every", "model_train_since")
    @classmethod
    def _a_duration(cls, value: str) -> str:
        if value:
            parse_duration(value)  # its error names the value: "invalid duration 'daily'; expected e.g. 30m, 6h, 7d"
        return value

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: Source, env_settings: Source,
                                   dotenv_settings: Source, file_secret_settings: Source) -> tuple[Source, ...]:  # fmt: skip
        """Arguments only: the environment and the file are read by :func:`load_settings`."""
        return (init_settings,)

    @property
    def event_ttl_set(self) -> bool:
        """Whether the event expiry was given (the variable, the file, an option), not the default: a default
        never changes an existing store's expiry (:meth:`detector.store.schema.Schema.set_event_ttl`)."""
        return "event_ttl_days" in self.model_fields_set

    @property
    def kafka_security(self) -> KafkaSecurity:
        """How to connect to Kafka, for every client; the password file is read again each time, so that a
        client made after a Kubernetes Secret's rotation takes the new password."""
        password = self.kafka_sasl_password
        if self.kafka_sasl_password_file is not None:
            password = SecretStr(_read_secret(self.kafka_sasl_password_file))
        region = self.kafka_aws_region
        if region is None and self.kafka_sasl_mechanism == AWS_MSK_IAM:
            region = msk_region("", os.environ)  # the AWS SDK's own variables, as boto3 reads them
        return KafkaSecurity(protocol=self.kafka_security_protocol, mechanism=self.kafka_sasl_mechanism,
                             username=self.kafka_sasl_username, password=password, ca_file=self.kafka_ssl_ca_file,
                             cert_file=self.kafka_ssl_cert_file, key_file=self.kafka_ssl_key_file,
                             check_hostname=self.kafka_ssl_check_hostname, aws_region=region,
                             oauth_token_url=self.kafka_oauth_token_url, oauth_scope=self.kafka_oauth_scope,
                             oauth_extensions=_oauth_extensions(self.kafka_oauth_extensions or ""),
                             oauth_ca_file=self.kafka_oauth_ca_file)  # fmt: skip

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


def _not_tls(protocol: str) -> str:
    """Why a TLS setting is refused beside ``protocol``."""
    return f"BURNWATCH_KAFKA_SECURITY_PROTOCOL is {protocol}: TLS settings go with {' or '.join(TLS_PROTOCOLS)}"


def _ca_bundle(path: Path) -> Path:
    """``path`` if it is a readable PEM bundle of CA certificates; else a ``ValueError`` saying what it is."""
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        check_trust(path)
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"{path} is not a PEM bundle of CA certificates ({_reason(exc)})") from None
    return path


_EXTENSION_KEY = re.compile(r"^[A-Za-z]+$")


def _oauth_extensions(text: str) -> tuple[tuple[str, str], ...]:
    """``key=value,key=value`` as SASL OAUTHBEARER extensions (RFC 7628 3.1: a key of letters, not ``auth``; a value
    of printable ASCII); a ``ValueError`` naming the one that is not."""
    pairs = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not _EXTENSION_KEY.match(key) or key.lower() == "auth":
            raise ValueError(f"{item!r} is not key=value with a key of letters (not 'auth')")
        if not value or not (value.isascii() and value.isprintable()):
            raise ValueError(f"{key}: its value is empty, or not printable ASCII")
        pairs.append((key, value))
    return tuple(pairs)


def _read_secret(path: Path) -> str:
    """A secret mounted as a file, without the whitespace around it (a Secret made ``--from-file`` ends with a
    newline); an unreadable file is a ``ValueError`` naming it."""
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read it ({_reason(exc)})") from None


def _reason_reading(path: Path) -> str:
    """Why ``path`` cannot be read as text, without its name."""
    try:
        path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        return _reason(exc)
    return "unreadable"


def _reason(exc: Exception) -> str:
    """An ``OSError``'s or ``ssl.SSLError``'s reason, without the file name or OpenSSL's source line."""
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


ENV: dict[str, str] = {name: str(field.validation_alias) for name, field in Settings.model_fields.items()}
"""Setting → the environment variable it is read from."""
_NAMES = {name.lower(): name for name in [*ENV.values(), *ENV]}  # a name over its variable where they differ in case alone
"""What a config file's key may be, lower-cased → as written: a setting's name or its variable (BURNWATCH_PARTITIONS),
for a misspelt key's 'did you mean' in the form it was written in."""


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """``BURNWATCH_`` variables set that no setting reads, each close to one that does: a misspelt variable
    (``BURNWATCH_PARTITON=8``) is ignored, its setting left at its default, with nothing said. One not close to
    a setting's (a secret an output's ``secret_env`` names, ``BURNWATCH_HOOK_SECRET``) says nothing."""
    known = sorted({*ENV.values(), "BURNWATCH_CONFIG"})
    said = []
    for var in sorted(environ):
        if var.startswith("BURNWATCH_") and var not in known:
            near = difflib.get_close_matches(var, known, n=1, cutoff=0.85)
            if near:
                said.append(f"{printable(var, 80)} is no setting's variable and is ignored; did you mean {near[0]}?")
    return said


_RULE_KEYS = {"rules", "silences", "allow_no_rules", "pricing", "routing", "limits"}
"""Keys of the rule files, not of settings: a config file that holds them is a rules file given as ``--config``."""
_SECRET = {name for name, field in Settings.model_fields.items() if "SecretStr" in str(field.annotation)}
_SECRET |= {"kafka_sasl_password_file"}  # its value is never echoed either: it may be the password, set in the wrong variable
"""Settings whose bad value is not repeated in the error."""


class _Environment(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping (the process's by default),
    so that tests read the variables exactly as the worker does."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {var: value for var, value in self._environ.items() if value != ""}


def _config_file(path: str | Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: cannot read config: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: a config file is a mapping of setting: value")
    if keys := [key for key in loaded if not isinstance(key, str)]:  # pydantic: TypeError 'keywords must be strings'
        raise ValueError(f"{path}: a config file is a mapping of setting: value; {keys[0]!r} is no setting's name")
    return loaded


EVERY_INTERFACE = ("0.0.0.0", "::", "*")
"""Hosts that mean "every interface" to whoever writes them, IPv4 and IPv6 alike."""


def bind_host(host: str) -> str:
    """The host a server binds for ``host`` as configured: ``0.0.0.0``, ``::`` or ``*`` become every interface of
    both families (asyncio's empty host), as Go's and Java's servers read them; a server bound to ``0.0.0.0``
    alone never answered on an IPv6-only Kubernetes cluster (EKS in IPv6 mode), whose probes and Services
    reach a pod by its IPv6 address, and one bound to ``::`` alone (asyncio sets IPV6_V6ONLY) missed IPv4."""
    return "" if host in EVERY_INTERFACE else host


def url_host(host: str) -> str:
    """``host`` as a URL writes it: an IPv6 address in brackets (``http://[::1]:6066``)."""
    return f"[{host}]" if ":" in host else host


def load_settings(config_file: str | Path | None = None, environ: Mapping[str, str] | None = None,
                  options: Mapping[str, str] | None = None, **overrides: Any) -> Settings:  # fmt: skip
    """File (if any) < environment (``environ``, default the process's) < explicit overrides.
    Every bad value is reported at once, as ``ValueError`` naming where it came from: the
    variable, the ``--option`` (``options``: an override's option where it is not ``--its-name``,
    as ``incidents --store``) or the config file's key."""
    env = os.environ if environ is None else environ
    config_file = config_file or env.get("BURNWATCH_CONFIG")
    from_file = _config_file(config_file) if config_file else {}
    given = {k: v for k, v in overrides.items() if v is not None}
    sources = (InitSettingsSource(Settings, given), _Environment(Settings, env), InitSettingsSource(Settings, from_file))
    try:
        return Settings(_build_sources=(sources, {}))  # type: ignore[call-arg]  # BaseSettings' own argument
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            key = str(err["loc"][0]) if err["loc"] else ""
            name = next((n for n, var in ENV.items() if key in (n, var)), key)
            if name in given:
                source = (options or {}).get(name) or f"--{name.replace('_', '-')}"
            elif env.get(ENV.get(name, "")):
                source = ENV[name]
            elif config_file and {key, name, ENV.get(name)} & from_file.keys():
                source = f"{config_file}: {printable(name, 80)}"
            else:  # a setting left unset that another one needs: its variable
                source = ENV.get(name, name)
            if err["type"] == "extra_forbidden":  # a key no setting has: say which one it likely means
                near = difflib.get_close_matches(key.lower(), list(_NAMES), n=1, cutoff=0.6)
                shown = (" (rules are read from their own files: rules_path names the folder)" if key in _RULE_KEYS
                         else f" (did you mean {_NAMES[near[0]]!r}?)" if near else "")  # fmt: skip
                lines.append(f"{source}: not a setting{shown}")
                continue
            shown = "" if name in _SECRET or err.get("input") is None else f" (got {err.get('input')!r})"
            lines.append(f"{source}: {err['msg']}{shown}")
        raise ValueError("invalid settings:\n  " + "\n  ".join(lines)) from None
