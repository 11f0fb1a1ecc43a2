"""The bridge's config file (``burnwatch bridge --config deploy/bridge.yaml``).

Validated whole before anything is scraped: every error at once, as
``bridge.yaml:12 targets[0].timeout: ...`` (the rule files' format). Targets come
from a static list and/or Prometheus ``file_sd`` JSON files (the same files a
Prometheus server reads), which :func:`file_sd_targets` turns into targets.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlencode, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from detector.ingest.hosts import StaticHost
from detector.ingest.kube import DEFAULT_TAG_LABELS
from detector.rules import RuleError, _load_model
from detector.units import Duration

__all__ = ["BridgeConfig", "ConfigInvalid", "FileSd", "Target", "file_sd_targets", "load_bridge_config"]

Job = Literal["dcgm", "kube-state-metrics", "federate"]
FEDERATE_MATCH = '{__name__=~"DCGM_FI_.*|kube_.*"}'
DEFAULT_PATHS = {"dcgm": "/metrics", "kube-state-metrics": "/metrics", "federate": "/federate"}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Target(_Model):
    """One endpoint to scrape."""

    url: str
    """``http://gpu-node-1:9400/metrics``; ``host:port`` alone takes the job's path."""
    job: Job = "dcgm"
    timeout: Duration | None = None
    """Default: the config's ``timeout`` (10 s)."""
    kubernetes: bool | None = None
    """The target's GPUs are Kubernetes nodes' even where kube-state-metrics does not name
    them (allocation, docs/ingest.md). Default: the config's ``kubernetes`` (false)."""
    labels: dict[str, str] = {}
    """Added to each sample that lacks them, as Prometheus adds target labels (``hostname``
    names the host of an exporter that does not say it)."""
    match: list[str] = [FEDERATE_MATCH]
    """``federate`` only: the ``match[]`` selectors asked of Prometheus."""

    @field_validator("url")
    @classmethod
    def _http(cls, url: str) -> str:
        text = url if "://" in url else f"http://{url}"
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected http(s)://host:port/path or host:port, got {url!r}")
        return text

    def address(self) -> str:
        """The URL scraped: the job's default path when none is given, and ``match[]`` for federate."""
        parts = urlsplit(self.url)
        path = parts.path if parts.path not in ("", "/") else DEFAULT_PATHS[self.job]
        query = parts.query
        if self.job == "federate" and "match" not in query:
            query = urlencode([("match[]", m) for m in self.match])
        return f"{parts.scheme}://{parts.netloc}{path}" + (f"?{query}" if query else "")


class FileSd(_Model):
    """Prometheus file-based service discovery: JSON files of ``[{"targets": [...], "labels": {...}}]``,
    re-read when they change. ``__scheme__`` and ``__metrics_path__`` labels are honoured."""

    files: list[str] = Field(min_length=1)
    job: Job = "dcgm"
    timeout: Duration | None = None
    kubernetes: bool | None = None


class BridgeConfig(_Model):
    interval: Duration = 30.0
    """Scrape interval: dcgm-exporter collects every 30 s by default."""
    timeout: Duration = 10.0
    kubernetes: bool = False
    usage: bool = True
    """Publish ``resource-usage`` (running, priced from pricing.yaml) for the GPU hosts known from
    kube-state-metrics or ``hosts``. Off where a cloud usage exporter reports them: else counted twice."""
    listen: str = "127.0.0.1:6067"
    """``host:port`` of the bridge's own ``/metrics``; empty: none."""
    tag_labels: list[str] = list(DEFAULT_TAG_LABELS)
    max_bytes: int = Field(default=64 << 20, ge=1024)
    """A response longer than this is refused (a wrong URL serving a file, a runaway exporter)."""
    targets: list[Target] = []
    file_sd: list[FileSd] = []
    hosts: dict[str, StaticHost] = {}

    @field_validator("interval", "timeout")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be more than 0")
        return value

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        port = value.rpartition(":")[2]
        if value and not (port.isascii() and port.isdigit() and 0 < int(port) <= 65535):
            raise ValueError(f"expected host:port with a port from 1 to 65535, got {value!r}")
        return value


class ConfigInvalid(ValueError):
    """Every error of a bridge config, one per line, each naming the file, line and field."""

    def __init__(self, errors: list[RuleError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


def load_bridge_config(path: str | Path) -> BridgeConfig:
    """The config in ``path``, or :class:`ConfigInvalid` with every error."""
    loaded = _load_model(Path(path), BridgeConfig)
    if isinstance(loaded, list):
        raise ConfigInvalid(loaded)
    config: BridgeConfig = loaded
    if not config.targets and not config.file_sd:
        raise ConfigInvalid([RuleError(str(path), 0, "targets", "no targets and no file_sd: nothing to scrape")])
    return config


MAX_FILE_SD_BYTES = 16 * 2**20
"""A file_sd file larger than this (100,000 targets take about 10 MiB) is refused, not read into memory."""


def file_sd_targets(sd: FileSd, base: Path | None = None) -> tuple[list[Target], list[str]]:
    """The targets of one ``file_sd`` entry, and an error per file that could not be read
    (that file then gives none; the caller keeps what it had, as Prometheus does)."""
    targets: list[Target] = []
    errors: list[str] = []
    for name in sd.files:
        path = Path(name) if base is None or Path(name).is_absolute() else base / name
        try:
            if path.stat().st_size > MAX_FILE_SD_BYTES:
                errors.append(f"{path}: larger than {MAX_FILE_SD_BYTES:,} bytes: not a target list")
                continue
            groups = json.loads(path.read_text())
            targets.extend(_group_targets(groups, sd))
        except OSError as exc:
            errors.append(f"{path}: cannot read: {exc.strerror}")
        except json.JSONDecodeError as exc:
            errors.append(f"{path}:{exc.lineno}: not JSON: {exc.msg}")
        except ValueError as exc:
            errors.append(f"{path}: {exc}")
    return targets, errors


def _group_targets(groups: Any, sd: FileSd) -> list[Target]:
    if not isinstance(groups, list):
        raise ValueError('expected a list of {"targets": [...], "labels": {...}}')
    out = []
    for i, group in enumerate(groups):
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            raise ValueError(f'[{i}]: expected {{"targets": ["host:port", ...], "labels": {{...}}}}')
        labels = group.get("labels") or {}
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise ValueError(f"[{i}].labels: expected an object of strings")
        scheme = labels.get("__scheme__", "http")
        path = labels.get("__metrics_path__", DEFAULT_PATHS[sd.job])
        kept = {k: v for k, v in labels.items() if not k.startswith("__")}
        for j, address in enumerate(group["targets"]):
            if not isinstance(address, str) or not address:
                raise ValueError(f"[{i}].targets[{j}]: expected host:port")
            try:
                out.append(Target(url=f"{scheme}://{address}{path}", job=sd.job, timeout=sd.timeout,
                                  kubernetes=sd.kubernetes, labels=kept))  # fmt: skip
            except ValueError as exc:
                raise ValueError(f"[{i}].targets[{j}]: {address!r} is not a host:port ({exc})") from None
    return out
