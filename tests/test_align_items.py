"""A message's GPU samples of one host at one time, held and released as one ``(t, samples)`` item
(:mod:`detector.align`), are the events one item each would be: the same events in the same order,
batch by batch, counted as events, and the engine finds the same in them.

Random streams (seeded): hosts of 1, 4 and 8 GPUs, idle, partly idle, busy or stuck, some on
Kubernetes, scraped every 30 s with gaps; GPU messages of two scrapes of a host (as the bench fleet's),
of one, of a scrape split in two, of one sample, of several hosts, of times out of order; another
shard's hosts as :class:`~detector.engine.SeenSample` (one a host and time, as ``backtest --jobs``
makes them); usage flushed a minute or five at a time; each message published 0-60 s late, keyed to
one of several partitions per topic, read in runs from partitions drawn at random. The released
order is checked against a model of the aligner written from its docstring (time, rank, arrival;
a source's time the earliest event of its latest message), the findings against an engine fed the
same items one event each (the engine's path for ``(t, event)`` pairs)."""

from __future__ import annotations

import math
import random
import zlib

import msgspec
import pytest

from detector.align import EventTimeAligner, count, each_event
from detector.engine import Engine, SeenSample
from detector.events import GpuMetric, UsageEvent
from tests.helpers import T0, at, usage

LATENESS = (0.0, 30.0, 60.0)
_RANK = {GpuMetric: 0, SeenSample: 0, UsageEvent: 1}
FOREIGN = "other-shard-host"
"""A host another shard detects: its samples come as SeenSamples, its usage as usage."""


def _sample(t: float, host: str, gpu: int, util: float, k8s: bool, rng: random.Random) -> GpuMetric:
    stuck = util > 95
    return GpuMetric(ts=at(t), resource_id=host, gpu_index=gpu, model="A100", util_pct=util,
                     tensor_active=0.0 if stuck else None, dram_active=0.0 if stuck else None,
                     pod=f"train-{gpu % 2}" if k8s and rng.random() < 0.7 else "", namespace="ml" if k8s else "",
                     allocated=(rng.random() < 0.8) if k8s else None)  # fmt: skip


def _stream(rng: random.Random) -> list[tuple[float, str, str, list]]:
    """``(publish time, topic, key, events)`` of each message, in publish order."""
    hosts = {f"h{i}": rng.choice((1, 4, 8)) for i in range(rng.randint(2, 5))}
    hosts["h0"], hosts[FOREIGN] = 8, 8  # one host at least whose scrapes are lists
    mood = {h: rng.choice(("idle", "idle", "partly", "busy", "stuck")) for h in hosts}
    k8s = {h: rng.random() < 0.3 for h in hosts}
    lateness = rng.choice(LATENESS)
    messages: list[tuple[float, str, str, list]] = []

    def publish(t: float, topic: str, key: str, events: list) -> None:
        if events:
            messages.append((t + rng.uniform(0, lateness), topic, key, events))

    minutes = rng.randint(50, 90)
    for h in hosts:
        flush = rng.choice((1, 5))
        for m in range(0, minutes, flush):
            publish(T0 + (m + flush) * 60, "resource-usage", h, [usage(T0 + (m + i) * 60, h) for i in range(flush)])
    scrapes: dict[str, list[list[GpuMetric | SeenSample]]] = {h: [] for h in hosts}
    for h, gpus in hosts.items():
        for step in range(minutes * 2):
            if rng.random() < 0.03:
                continue  # a scrape lost
            t = T0 + step * 30.0
            utils = {"idle": [0.0] * gpus, "busy": [80.0] * gpus, "stuck": [99.0] * gpus,
                     "partly": [0.0 if g % 2 else 70.0 for g in range(gpus)]}[mood[h]]  # fmt: skip
            if rng.random() < 0.05:
                utils = [rng.choice((0.0, 50.0)) for _ in range(gpus)]
            samples: list[GpuMetric | SeenSample] = [_sample(t, h, g, u, k8s[h], rng) for g, u in enumerate(utils)]
            if h == FOREIGN:
                samples = [SeenSample(h, samples[0].ts)]
            scrapes[h].append(samples)
    for h, own in scrapes.items():
        i = 0
        while i < len(own):
            shape = rng.random()
            first = own[i][0].ts.timestamp()
            if shape < 0.5 and i + 1 < len(own):  # two scrapes of the host, as the bench fleet's
                publish(first + 30, "gpu-metrics", h, own[i] + own[i + 1])
                i += 2
                continue
            if shape < 0.6 and len(own[i]) > 1:  # a scrape split across two messages
                cut = rng.randint(1, len(own[i]) - 1)
                publish(first, "gpu-metrics", h, own[i][:cut])
                publish(first, "gpu-metrics", h, own[i][cut:])
            elif shape < 0.7:  # a sample a message
                for sample in own[i]:
                    publish(first, "gpu-metrics", h, [sample])
            elif shape < 0.8 and i + 1 < len(own):  # times out of order, and a time repeated apart
                mixed = own[i + 1][:1] + own[i] + own[i + 1][1:]
                publish(first + 30, "gpu-metrics", h, mixed)
                i += 2
                continue
            else:
                publish(first, "gpu-metrics", h, own[i])
            i += 1
    for _ in range(rng.randint(0, 6)):  # several hosts in a message, interleaved by time
        two = rng.sample(sorted(scrapes), 2)
        picks = [scrapes[h][rng.randrange(len(scrapes[h]))] for h in two if scrapes[h]]
        publish(T0 + rng.uniform(0, minutes * 60), "gpu-metrics", "mixed", [e for s in picks for e in s])
    messages.sort(key=lambda m: m[0])
    return messages


class _Model:
    """The aligner as its docstring says, one event an item: events released at or before the
    watermark (the slowest source's time, the earliest event of its latest message, less the
    lateness; sources caught up hold nothing back) in (time, rank, arrival) order; a message's
    token once its last event is out, in (latest time, rank, arrival) order."""

    def __init__(self, lateness_s: float) -> None:
        self.lateness_s = lateness_s
        self.held: list[tuple[float, int, int, object, int]] = []
        """(time, rank, arrival, event, token) of each event held."""
        self.source_t: dict[object, float] = {}
        self.caught: set[object] = set()
        self.arrival = 0
        self.left: dict[int, list] = {}
        """Token → [events not released, latest time, rank, arrival]."""

    def expect(self, source: object) -> None:
        self.source_t.setdefault(source, -math.inf)

    def push(self, source: object, events: list, token: int) -> None:
        times = [e.ts.timestamp() for e in events]
        rank = _RANK[type(events[0])]
        self.left[token] = [len(events), max(times), rank, self.arrival]
        for t, e in zip(times, events, strict=True):
            self.held.append((t, rank, self.arrival, e, token))
            self.arrival += 1
        if min(times) > self.source_t.get(source, -math.inf):
            self.source_t[source] = min(times)
        self.caught.discard(source)

    def release(self, everything: bool) -> tuple[list[tuple[float, object]], list[int]]:
        behind = [t for s, t in self.source_t.items() if s not in self.caught]
        limit = math.inf if everything or not behind else min(behind) - self.lateness_s
        out = sorted((h for h in self.held if h[0] <= limit), key=lambda h: h[:3])
        self.held = [h for h in self.held if h[0] > limit]
        done = []
        for *_, token in out:
            self.left[token][0] -= 1
            if not self.left[token][0]:
                done.append(token)
        done.sort(key=lambda token: tuple(self.left[token][1:]))
        for token in done:
            del self.left[token]
        return [(t, e) for t, _, _, e, _ in out], done


def _findings(found: list) -> list:
    return [msgspec.to_builtins(f) for f in found]


def _scrapes(engine: Engine) -> list[tuple[str, float, list[int]]]:
    """Record the scrapes ``engine`` hands its rules: key, time and the samples (by identity), in order."""
    scrapes: list[tuple[str, float, list[int]]] = []
    fold = engine._scrape

    def recorded(route, state, ctx, key, scrape, t):
        scrapes.append((key, t, list(map(id, scrape.samples))))
        return fold(route, state, ctx, key, scrape, t)

    engine._scrape = recorded  # type: ignore[method-assign]
    return scrapes


def _check(seed: int, ruleset) -> dict[str, int]:
    rng = random.Random(seed)
    messages = _stream(rng)
    partitions = rng.randint(1, 4)
    queues: dict[tuple[str, int], list[list]] = {}
    for _, topic, key, events in messages:
        queues.setdefault((topic, zlib.crc32(key.encode()) % partitions), []).append(events)
    lateness_s = rng.choice((0.0, 60.0))
    aligner: EventTimeAligner[int] = EventTimeAligner(lateness_s)
    model = _Model(lateness_s)
    foreign = FOREIGN.__eq__
    gathered, per_event = Engine(ruleset, foreign=foreign), Engine(ruleset, foreign=foreign)
    scrapes, scrapes_per_event = _scrapes(gathered), _scrapes(per_event)
    position = dict.fromkeys(queues, 0)
    token = 0
    seen = {"lists": 0, "items": 0, "events": 0, "findings": 0}

    def detect(everything: bool = False) -> None:
        items, tokens = aligner.release(everything)
        expected, expected_tokens = model.release(everything)
        events = list(each_event(items))
        assert [(t, id(e)) for t, e in events] == [(t, id(e)) for t, e in expected]
        assert tokens == expected_tokens
        assert count(items) == len(events) and len(aligner) == len(model.held)
        for t, item in items:
            if type(item) is list:
                assert len(item) > 1 and all(type(e) is GpuMetric for e in item)
                assert {(e.resource_id, e.ts.timestamp()) for e in item} == {(item[0].resource_id, t)}
                seen["lists"] += 1
        found = gathered.process_timed(items)
        assert _findings(found) == _findings(per_event.process_timed(events))
        assert scrapes == scrapes_per_event  # a scrape split across messages is one scrape, as it was
        seen["items"] += len(items)
        seen["events"] += len(events)
        seen["findings"] += len(found)

    for source in queues:
        aligner.expect(source)
        model.expect(source)
    while left := [s for s in queues if position[s] < len(queues[s])]:
        for source in rng.sample(left, rng.randint(1, len(left))):
            start = position[source]
            end = min(start + rng.randint(1, 12), len(queues[source]))
            run = []
            for events in queues[source][start:end]:
                run.append((token, events))
                model.push(source, events, token)
                token += 1
            if rng.random() < 0.5:
                aligner.push_many(source, run)
            else:
                for number, events in run:
                    aligner.push(source, events, number)
            position[source] = end
        for source in queues:
            done = position[source] == len(queues[source]) and rng.random() < 0.8
            aligner.caught_up(source, done)
            if done:
                model.caught.add(source)
            else:
                model.caught.discard(source)
        detect()
    detect(everything=True)
    assert len(aligner) == 0
    assert _findings(gathered.open_episodes()) == _findings(per_event.open_episodes())
    keys = set(gathered._keys) | set(per_event._keys)
    assert {k: gathered.snapshot(k) for k in keys} == {k: per_event.snapshot(k) for k in keys}
    return seen


@pytest.mark.parametrize("seed", range(24))
def test_a_messages_samples_of_a_host_at_a_time_as_one_item_release_and_detect_as_one_item_each(seed, ruleset):
    seen = _check(seed, ruleset)
    assert seen["lists"] and seen["items"] < seen["events"]


def test_the_streams_find_something(ruleset):
    """The streams reach the GPU rules' findings, so that the equality above is worth something."""
    assert sum(_check(seed, ruleset)["findings"] for seed in range(6)) > 0
