"""The bridge's config file (``burnwatch bridge --config deploy/bridge.yaml``).

Validated whole before anything is scraped: every error at once, as
``bridge.yaml:12 targets[0].timeout: ...`` (the rule files' format). Targets come
from a static list and/or Prometheus ``file_sd`` JSON files (the same files a
Prometheus server reads), which :func:`file_sd_targets` turns into targets.
"""

from __future__ import annotations

import glob
import json
import os
import stat
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlencode, urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from detector.ingest.hosts import StaticHost
from detector.ingest.kube import DEFAULT_TAG_LABELS
from detector.rules import RuleError, _load_model, parse_yaml
from detector.units import Duration

__all__ = ["BridgeConfig", "ConfigInvalid", "FileSd", "FileSdWatch", "Target", "file_sd_targets", "load_bridge_config"]

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
        try:  # a port that is no number or out of range failed every scrape, as 'unreachable: <the URL>'
            port = parts.port
        except ValueError:
            port = 0
        if port == 0:
            raise ValueError(f"expected a port from 1 to 65535 in {url!r}")
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
_GLOB = frozenset("*?[")


class FileSdWatch:
    """The targets the ``file_sd`` entries name now, each file re-read when it changes, as
    Prometheus reads them: a file that cannot be read (half written, not JSON) keeps the targets
    it gave before, and alone: the other files' changes are taken; a file that is gone (deleted,
    no longer matched by its pattern) gives none. ``errors``: those of the files as they are now
    (``--once`` reports them as failures)."""

    def __init__(self, entries: list[FileSd], base: Path | None = None) -> None:
        self._entries = entries
        self._base = base
        self._files: dict[tuple[int, Path], tuple[tuple[int, ...], list[Target], str]] = {}
        """(entry, file) -> (the stat it was read at, its targets, the error of that read or '')."""
        self.errors: list[tuple[str, str]] = []
        """(file or pattern, message naming it) for each file that could not be read as it is now."""

    def poll(self) -> tuple[list[Target], list[tuple[str, str]]]:
        """The targets now, and the errors new since the last poll (to log and count once)."""
        before = set(self.errors)
        targets: list[Target] = []
        errors: list[tuple[str, str]] = []
        seen: set[tuple[int, Path]] = set()
        for i, sd in enumerate(self._entries):
            for name in sd.files:
                pattern = _resolve(name, self._base)
                paths = [Path(p) for p in sorted(glob.glob(str(pattern)))] if _GLOB & set(pattern.name) else [pattern]
                if not paths:
                    errors.append((str(pattern), f"{pattern}: no file matches"))
                for path in paths:
                    if (i, path) in seen:
                        continue
                    seen.add((i, path))
                    got, error = self._read(i, path, sd, literal=path == pattern)
                    targets.extend(got)
                    if error:
                        errors.append((str(path), error))
        for key in [k for k in self._files if k not in seen]:  # matched no longer: its targets go
            del self._files[key]
        self.errors = errors
        return targets, [e for e in errors if e not in before]

    def _read(self, i: int, path: Path, sd: FileSd, literal: bool) -> tuple[list[Target], str]:
        """A file's targets and error: read again only when its stat changed (a rename over it too)."""
        try:
            st = path.stat()
        except OSError as exc:
            self._files.pop((i, path), None)
            gone = isinstance(exc, FileNotFoundError) and not literal  # a file the pattern matched went
            return [], "" if gone else f"{path}: cannot read: {exc.strerror}"
        stamp = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        cached = self._files.get((i, path))
        if cached is not None and cached[0] == stamp:
            return cached[1], cached[2]
        try:
            targets, error = _group_targets(_load_file(path), sd), ""
        except _Unreadable as exc:
            targets, error = (cached[1] if cached else []), f"{path}{exc.where}: {exc.reason}"
        except ValueError as exc:
            targets, error = (cached[1] if cached else []), f"{path}: {exc}"
        self._files[(i, path)] = (stamp, targets, error)
        return targets, error


def file_sd_targets(sd: FileSd, base: Path | None = None) -> tuple[list[Target], list[str]]:
    """The targets of one ``file_sd`` entry, and an error per file that could not be read
    (that file then gives none)."""
    targets, errors = FileSdWatch([sd], base).poll()
    return targets, [message for _, message in errors]


class _Unreadable(Exception):
    """A file_sd file that is no target list: why, and the line where that is known."""

    def __init__(self, reason: str, line: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.where = f":{line}" if line is not None else ""


def _resolve(name: str, base: Path | None) -> Path:
    return Path(name) if base is None or Path(name).is_absolute() else base / name


def _load_file(path: Path) -> Any:
    """A file_sd file's data: YAML for ``.yml``/``.yaml``, JSON otherwise (as Prometheus reads them).
    What is wrong is :class:`_Unreadable`."""
    try:
        # Non-blocking and checked before reading: a FIFO would block the bridge, /dev/zero never end.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise _Unreadable(f"cannot read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Unreadable("cannot read: not a regular file")
        data = f.read(MAX_FILE_SD_BYTES + 1) if st.st_size <= MAX_FILE_SD_BYTES else b""
    if st.st_size > MAX_FILE_SD_BYTES or len(data) > MAX_FILE_SD_BYTES:
        raise _Unreadable(f"larger than {MAX_FILE_SD_BYTES:,} bytes: not a target list")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise _Unreadable(f"cannot read: not UTF-8 (byte 0x{data[exc.start]:02x})", line) from None
    if path.suffix in (".yml", ".yaml"):
        try:
            return parse_yaml(text)[1]
        except yaml.MarkedYAMLError as exc:
            line = exc.problem_mark.line + 1 if exc.problem_mark is not None else 1
            raise _Unreadable(f"not YAML: {exc.problem}", line) from None
        except yaml.YAMLError as exc:
            raise _Unreadable(f"not YAML: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Unreadable(f"not JSON: {exc.msg}", exc.lineno) from None
    except RecursionError:
        raise _Unreadable("not JSON: nested too deeply") from None


def _group_targets(groups: Any, sd: FileSd) -> list[Target]:
    if not isinstance(groups, list):
        raise ValueError('expected a list of {"targets": [...], "labels": {...}}')
    out = []
    for i, group in enumerate(groups):
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            raise ValueError(f'[{i}]: expected {{"targets": ["host:port", ...], "labels": {{...}}}}')
        labels = group.get("labels") or {}
        if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
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
