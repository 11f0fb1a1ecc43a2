"""``burnwatch bridge``: scrape dcgm-exporter, kube-state-metrics or a Prometheus'
``/federate`` on a schedule and publish ``gpu-metrics`` (and ``resource-usage``).

Each target is scraped by its own task with its own timeout, so an unreachable,
slow or garbage target is logged and counted and never stops or delays the others.
Each scrape of a host becomes one message (a JSON array of its GPUs' samples) keyed
by the host's resource id. What the samples mean is decided in
:mod:`detector.ingest`; this module only fetches, schedules and publishes.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from detector.events import TOPIC_GPU_METRICS, TOPIC_RESOURCE_USAGE
from detector.ingest.config import BridgeConfig, FileSdWatch, Target
from detector.ingest.dcgm import DcgmMapper
from detector.ingest.hosts import Host, resolve_host
from detector.ingest.kube import KubeState, kube_state
from detector.ingest.prometheus import ExpositionError, Sample, parse_exposition
from detector.ingest.usage import UsageClock
from detector.kafka_security import PLAINTEXT, KafkaSecurity
from detector.logs import redact
from detector.settings import BROKER_DEFAULT, bind_host

__all__ = ["Bridge", "ScrapeResult"]

log = structlog.get_logger("burnwatch.bridge")

KUBE_FRESH_INTERVALS = 5
"""kube-state-metrics state older than this many scrape intervals is not used (allocation unknown)."""
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
STALE_KUBE = "kube-state-metrics sample over an hour behind the scrape (a node or pod gone)"
"""The skipped reason of the ``kube_*`` samples :func:`kube_state` leaves out (``KubeState.stale``)."""


@dataclass
class ScrapeResult:
    """What one scrape of one target gave. ``ok``: the target answered and Kafka took all it gave
    (``--once`` checks both; the target's ``up`` on /metrics says only the first)."""

    target: str
    job: str
    ok: bool
    error: str = ""
    hosts: int = 0
    gpus: int = 0
    messages: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    unpublished: int = 0
    """Messages Kafka did not take; ``publish_error``: why, for the last of them."""
    publish_error: str = ""


class _Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.scrapes = Counter("burnwatch_bridge_scrapes", "Scrapes per target and result (ok, failed)",
                               ["target", "job", "result"], registry=r)  # fmt: skip
        self.up = Gauge("burnwatch_bridge_target_up", "1 if the target's last scrape succeeded", ["target", "job"],
                        registry=r)  # fmt: skip
        self.skipped = Counter("burnwatch_bridge_skipped", "Samples or GPUs left out, per target and reason",
                               ["target", "reason"], registry=r)  # fmt: skip
        self.messages = Counter("burnwatch_bridge_messages", "Messages published per topic", ["topic"], registry=r)
        self.publish_failures = Counter("burnwatch_bridge_publish_failures", "Messages Kafka did not take",
                                        ["topic"], registry=r)  # fmt: skip
        self.file_sd_errors = Counter("burnwatch_bridge_file_sd_errors",
                                      "file_sd files that could not be read (counted as the error appears)", ["file"],
                                      registry=r)  # fmt: skip


class Bridge:
    """Scrapes the configured targets and publishes through ``send(topic, key, value)``
    (an aiokafka producer's, see :meth:`run_with_kafka`). ``clock`` gives epoch seconds:
    a scrape's time when the exposition carries none."""

    def __init__(self, config: BridgeConfig, send: Callable[[str, str, bytes], Any], *,
                 base: Path | None = None, clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.config = config
        self._send = send
        self._clock = clock
        self.metrics = _Metrics()
        self._mappers: dict[str, DcgmMapper] = {}
        self._kube: dict[str, KubeState] = {}
        self._merged: tuple[tuple[int, ...], KubeState, list[KubeState]] | None = None
        """The fresh states merged, by their ids (the states kept with it, so no id is reused)."""
        self._usage = UsageClock(config.interval)
        self._file_sd = FileSdWatch(config.file_sd, base)
        self._skip_reasons: dict[str, set[str]] = {}
        """The reasons each target's samples were skipped for: its series on /metrics, to remove with it."""
        self._encode = msgspec.json.Encoder()
        self._session: aiohttp.ClientSession | None = None

    # -- targets ---------------------------------------------------------------------------

    def targets(self) -> list[Target]:
        """The static targets and those the file_sd files name now (each re-read when it changes)."""
        found = list(self.config.targets)
        if self.config.file_sd:
            targets, new_errors = self._file_sd.poll()
            for file, error in new_errors:
                log.warning("file_sd_unreadable", error=error)
                self.metrics.file_sd_errors.labels(file).inc()
            found.extend(targets)
        unique: dict[tuple[str, str], Target] = {}
        for target in found:
            unique.setdefault((target.address(), target.job), target)
        return list(unique.values())

    # -- one scrape ------------------------------------------------------------------------

    async def scrape(self, target: Target) -> ScrapeResult:
        """Fetch, parse, map and publish one target; never raises for the target's faults."""
        address = target.address()
        shown = redact(address)  # a password in the target's URL never reaches /metrics or --once's lines
        result = ScrapeResult(shown, target.job, ok=False)
        timeout = target.timeout or self.config.timeout
        try:
            body = await self._fetch(address, timeout)
            t = self._clock()
            long_lines: collections.Counter[str] = collections.Counter()
            samples = await asyncio.to_thread(parse_exposition, body, address, long_lines)
            result.skipped.update(long_lines)
        except (ExpositionError, _FetchError) as exc:
            result.error = redact(str(exc))
        else:
            result.ok = True
            if target.labels:
                samples = [Sample(s.name, {**target.labels, **s.labels}, s.value, s.timestamp) for s in samples]
            try:
                await self._publish_samples(target, samples, t, result)
            except Exception as exc:  # a bug of ours on this answer: this scrape fails, the target's task goes on
                log.exception("scrape_mapping_failed", target=shown, job=target.job)
                result.ok, result.error = False, redact(f"{address}: could not map the samples: {type(exc).__name__}: {exc}")
        self.metrics.scrapes.labels(shown, target.job, "ok" if result.ok else "failed").inc()
        self.metrics.up.labels(shown, target.job).set(1 if result.ok else 0)
        for reason, n in result.skipped.items():
            self.metrics.skipped.labels(shown, reason).inc(n)
            self._skip_reasons.setdefault(address, set()).add(reason)
        if result.ok:
            log.debug("scraped", target=shown, job=target.job, hosts=result.hosts, gpus=result.gpus,
                      skipped=result.skipped or None)  # fmt: skip
        else:
            log.warning("scrape_failed", target=shown, job=target.job, error=result.error)
        if result.ok and result.unpublished:  # logged per message (publish_failed): not the target's fault
            sent = sum(result.messages.values())
            result.ok = False
            result.error = (f"{shown}: scraped, but Kafka did not take {result.unpublished} of "
                            f"{result.unpublished + sent} messages: {result.publish_error}")  # fmt: skip
        return result

    async def _fetch(self, url: str, timeout: float) -> bytes:
        if self._session is None:
            # No connection pool limit (aiohttp's default is 100): each target has one request in
            # flight at most, and with a shared limit 100 hung exporters (a zone down, packets dropped)
            # held every connection until their timeout, failing the healthy ones queued behind them.
            connector = aiohttp.TCPConnector(limit=0)
            self._session = aiohttp.ClientSession(headers={"Accept": ACCEPT}, connector=connector)
        limit = self.config.max_bytes
        try:
            async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                if response.status != 200:
                    raise _FetchError(f"{url}: HTTP {response.status} {response.reason or ''}".rstrip())
                chunks, size = [], 0
                async for chunk in response.content.iter_chunked(1 << 16):
                    size += len(chunk)
                    if size > limit:
                        raise _FetchError(f"{url}: response longer than max_bytes ({limit} bytes)")
                    chunks.append(chunk)
        except asyncio.TimeoutError:
            raise _FetchError(f"{url}: no answer within {timeout:g}s") from None
        except aiohttp.ClientConnectorError as exc:  # its text carries aiohttp's "ssl:default" noise
            err = exc.os_error
            if err is None:
                reason = str(exc)
            else:  # asyncio's refusal has no strerror, a DNS failure a negative errno
                reason = err.strerror or (os.strerror(err.errno) if err.errno and err.errno > 0 else str(err))
            raise _FetchError(f"{url}: unreachable: {reason}") from None
        except aiohttp.TooManyRedirects:
            raise _FetchError(f"{url}: too many redirects") from None
        except aiohttp.ClientResponseError as exc:  # aiohttp refused the answer: its "400" is its own, no HTTP status
            raise _FetchError(f"{url}: not a valid HTTP answer: {_one_line(exc.message)}") from None
        except aiohttp.ClientPayloadError as exc:
            reason = _one_line(getattr(exc.__cause__, "message", "") or str(exc))  # the parser's error, where it has one
            raise _FetchError(f"{url}: answer cut short or not decodable: {reason}") from None
        except aiohttp.ClientError as exc:
            raise _FetchError(f"{url}: unreachable: {exc}") from None
        return b"".join(chunks)

    async def _publish_samples(self, target: Target, samples: list[Sample], t: float, result: ScrapeResult) -> None:
        if target.job in ("kube-state-metrics", "federate"):
            state = kube_state(samples, t, self.config.tag_labels)
            if state.stale:
                result.skipped[STALE_KUBE] = result.skipped.get(STALE_KUBE, 0) + state.stale
            if target.job == "kube-state-metrics" or state.nodes:
                self._kube[target.address()] = state
                await self._publish_node_usage(state, t, result)
        if target.job in ("dcgm", "federate"):
            mapper = self._mappers.setdefault(target.address(), DcgmMapper())
            kube = self.kube(t)
            kubernetes = self.config.kubernetes if target.kubernetes is None else target.kubernetes
            batches = mapper.map(samples, t=t, instance=target.address(), kube=kube, hosts=self.config.hosts,
                                 kubernetes=kubernetes)  # fmt: skip
            result.skipped.update(mapper.skipped)
            mapper.skipped.clear()
            for batch in batches:
                result.hosts += 1
                result.gpus += len(batch.events)
                await self._publish(TOPIC_GPU_METRICS, batch.host.resource_id, batch.events, result)
                if not _billed_by_node(batch.host):
                    await self._publish_usage(batch.host, batch.t, result)

    async def _publish_node_usage(self, state: KubeState, t: float, result: ScrapeResult) -> None:
        """Usage of the GPU nodes kube-state-metrics lists (allocatable GPUs): they exist, so they are billed."""
        kube = self.kube(t)
        for node in state.nodes.values():
            if node.gpus_allocatable > 0:
                await self._publish_usage(resolve_host(node.name, kube, self.config.hosts), node.t or t, result)

    async def _publish_usage(self, host: Host, t: float, result: ScrapeResult) -> None:
        if not self.config.usage:
            return
        event = self._usage.event(host, t)
        result.skipped.update(self._usage.skipped)
        self._usage.skipped.clear()
        if event is not None:
            await self._publish(TOPIC_RESOURCE_USAGE, host.resource_id, [event], result)

    async def _publish(self, topic: str, key: str, events: list[dict[str, Any]], result: ScrapeResult) -> None:
        try:
            await self._send(topic, key, self._encode.encode(events))
        except Exception as exc:  # the broker's fault, not the target's: counted, the next scrape tries again
            self.metrics.publish_failures.labels(topic).inc()
            result.unpublished += 1
            result.publish_error = f"{type(exc).__name__}: {exc}"
            log.error("publish_failed", topic=topic, key=key, error=result.publish_error)
            return
        self.metrics.messages.labels(topic).inc()
        result.messages[topic] = result.messages.get(topic, 0) + 1

    def kube(self, t: float) -> KubeState | None:
        """The kube-state-metrics states fresh at ``t``, merged (one cluster per target)."""
        fresh = [s for s in self._kube.values() if t - s.t <= KUBE_FRESH_INTERVALS * self.config.interval]
        if len(fresh) <= 1:
            return fresh[0] if fresh else None
        # Merged once per set of states, not per DCGM scrape: a thousand exporters a round would
        # each copy every pod of every cluster on the event loop.
        key = tuple(id(s) for s in fresh)
        if self._merged is None or self._merged[0] != key:
            self._merged = (key, KubeState.merged(fresh), fresh)
        return self._merged[1]

    # -- rounds and the loop ---------------------------------------------------------------

    async def round(self) -> list[ScrapeResult]:
        """Every target once: kube-state-metrics and federate first, so that the DCGM
        mapping of the same round has the cluster's state. A file_sd file that could not be
        read is a failed result of its own (``--once`` checks a config: it must say so)."""
        targets = self.targets()
        first = [t for t in targets if t.job != "dcgm"]
        results = [ScrapeResult(file, "file_sd", ok=False, error=error) for file, error in self._file_sd.errors]
        results += await asyncio.gather(*(self.scrape(t) for t in first))
        results += await asyncio.gather(*(self.scrape(t) for t in targets if t.job == "dcgm"))
        return results

    async def run(self, stop: asyncio.Event) -> None:
        """Scrape until ``stop`` is set, a task per target on its own schedule: a target that
        hangs until its timeout holds no other back. At the start the DCGM targets wait for
        kube-state-metrics' first answer (at most its timeout), so that no first sample is keyed
        by a host name instead of its instance. Targets that file_sd adds or removes are
        started or stopped as the files change."""
        tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        ready: asyncio.Future[Any] | None = None
        try:
            while not stop.is_set():
                wanted = {(t.address(), t.job): t for t in self.targets()}
                for key in [k for k in tasks if k not in wanted]:
                    tasks.pop(key).cancel()
                    self._forget_target(*key)
                    log.info("target_removed", target=key[0], job=key[1])
                new = {k: t for k, t in wanted.items() if k not in tasks}
                if ready is None:  # the first targets: cluster state first
                    ready = asyncio.gather(*(self.scrape(t) for t in new.values() if t.job != "dcgm"))
                    for key, target in new.items():
                        dcgm = target.job == "dcgm"
                        tasks[key] = asyncio.create_task(self._loop(target, stop, ready if dcgm else None, first=dcgm))
                else:
                    for key, target in new.items():
                        log.info("target_added", target=key[0], job=key[1])
                        tasks[key] = asyncio.create_task(self._loop(target, stop, None, first=True))
                await _wait(stop, min(5.0, self.config.interval))
        finally:
            for task in tasks.values():
                task.cancel()
            if ready is not None:
                ready.cancel()
            await asyncio.gather(*tasks.values(), *([ready] if ready else []), return_exceptions=True)

    def _forget_target(self, address: str, job: str) -> None:
        """What was kept of a target file_sd no longer lists: its mapper, its cluster state, and its
        series on /metrics (a removed target must not stay ``up``; nodes come and go all day)."""
        self._mappers.pop(address, None)
        self._kube.pop(address, None)
        shown = redact(address)  # as scrape() labels its series
        series: list[tuple[Any, tuple[str, ...]]] = [(self.metrics.up, (shown, job))]
        series += [(self.metrics.scrapes, (shown, job, r)) for r in ("ok", "failed")]
        series += [(self.metrics.skipped, (shown, reason)) for reason in self._skip_reasons.pop(address, ())]
        for gauge, labels in series:
            try:
                gauge.remove(*labels)
            except KeyError:
                pass

    async def _loop(self, target: Target, stop: asyncio.Event, ready: asyncio.Future[Any] | None, first: bool) -> None:
        if ready is not None:
            await asyncio.shield(ready)
        if first:
            await self.scrape(target)
        loop = asyncio.get_running_loop()
        due = loop.time() + _phase(target.address(), self.config.interval)
        while not await _wait(stop, due - loop.time()):
            await self.scrape(target)
            due += self.config.interval
            if due < loop.time():  # a scrape longer than the interval: skip the missed ticks
                due = loop.time() + self.config.interval

    def render_metrics(self) -> bytes:
        return generate_latest(self.metrics.registry)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class _FetchError(Exception):
    pass


def _one_line(text: str) -> str:
    """aiohttp's parser errors on one line: they come over several, with a caret under the byte."""
    shown = " ".join(line.strip() for line in text.splitlines() if line.strip() not in ("", "^"))
    return shown if len(shown) <= 200 else shown[:200] + "..."


def _billed_by_node(host: Host) -> bool:
    return host.node is not None and host.node.gpus_allocatable > 0


def _phase(address: str, interval: float) -> float:
    """When a target's second scrape comes after its first: between half an interval and one and a
    half, at a fraction of the interval its address sets (CRC-32, so a restart keeps it). Its later
    scrapes follow every interval, so a fleet's targets spread over the interval, as Prometheus
    spreads them, instead of thousands answering, parsed and published in the same instant."""
    fraction = zlib.crc32(address.encode()) / 2**32
    return interval * (0.5 + fraction)


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``stop``; whether it is set."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=max(seconds, 0.0))
    except asyncio.TimeoutError:
        pass
    return stop.is_set()


async def serve_metrics(bridge: Bridge, listen: str) -> Any:
    """The bridge's ``/metrics`` on ``host:port``; returns the runner to clean up."""
    from aiohttp import web

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=bridge.render_metrics(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    host, _, port = listen.rpartition(":")
    try:
        await web.TCPSite(runner, bind_host(host.strip("[]") or "127.0.0.1"), int(port)).start()
    except OSError as exc:
        await runner.cleanup()
        raise SystemExit(f"bridge: cannot serve /metrics on {listen} (listen in the config): {exc.strerror}") from None
    return runner


def open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit, and return it: every target
    is scraped at once on a connection of its own (no pool limit), and a soft limit of 1,024, a
    shell's default, would fail the round's sockets past it (Go's runtime, Prometheus', does the same)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # an infinite hard limit some kernels refuse as a soft one
            pass
    return soft


async def run_bridge(config: BridgeConfig, bootstrap: str, *, once: bool = False, base: Path | None = None,
                     stop: asyncio.Event | None = None, partitions: int = 4,
                     replication_factor: int = BROKER_DEFAULT,
                     security: KafkaSecurity = PLAINTEXT) -> list[ScrapeResult]:  # fmt: skip
    """Publish to Kafka at ``bootstrap``, connecting as ``security`` says: one round (``once``) or until ``stop``."""
    from streams.kafka import ensure_topics
    from streams.kafka import producer as new_producer

    open_files_limit()
    await ensure_topics(bootstrap, partitions, replication_factor=replication_factor, security=security)
    producer = new_producer(bootstrap, security)
    await producer.start()

    async def send(topic: str, key: str, value: bytes) -> None:
        await producer.send_and_wait(topic, value=value, key=key.encode())

    bridge = Bridge(config, send, base=base)
    runner = None
    try:
        if once:
            return await bridge.round()
        if config.listen:
            runner = await serve_metrics(bridge, config.listen)
            log.info("bridge_metrics", listen=config.listen)
        await bridge.run(stop or asyncio.Event())
        return []
    finally:
        await bridge.close()
        if runner is not None:
            await runner.cleanup()
        await producer.stop()
