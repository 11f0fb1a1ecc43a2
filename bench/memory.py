"""Memory of the worker's detector state per resource, by part.

    .venv/bin/python bench/memory.py --resources 20000 --minutes 10     # the breakdown
    .venv/bin/python bench/memory.py --resources 1000000 --minutes 3    # a million resources
    .venv/bin/python bench/memory.py --resources 1000000 --minutes 2 --waves 10 --evict-after 60
    .venv/bin/python bench/memory.py --replay bench/out/fleet.jsonl   # a day of history, by kind

An :class:`~detector.engine.Engine` with the shipped rules (``rules/``) and the anomaly rule
building windows (and, with ``--model-dir``, judging them) is fed ``--minutes`` of event time
for N distinct resources, in the proportions of the simulated fleet (:class:`detector.simulate.SimConfig`'s
defaults: 12 GPU hosts with 8 GPUs, 8 notebooks, 3 inference endpoints, 6 CPU instances with
egress, 3 buckets, 3 vector databases in every 35), decoded from JSON by the worker's decoder
(so strings and tag dicts are as fresh as a worker's), in batches of a few thousand events.

Reported: the process's peak and final RSS, tracemalloc's bytes still allocated per resource,
and a deep size of the state of a sample of keys by part (the engine's per-key objects; each
rule's state, by detector type), where an object shared by several keys counts once over the
sample (so a shared routes list or an interned string costs its share).

``--waves K``: the resources speak in K waves one after another (each for ``--minutes``), so
that with ``--evict-after S`` the engine evicts the waves gone quiet for S seconds of event time.
Every batch's touched keys are then saved as the worker saves them, to ``--store``: ``sqlite``
(a file: the store's memory is not the worker's, as with a ClickHouse server) or ``chdb``
(the embedded ClickHouse, whose memory is counted in this process's RSS).

``--model-dir DIR``: the anomaly rule scores with the model in DIR (``burnwatch model train``), as a
worker with a model does, so each resource also holds its run of judged windows and, where
a window stands out, its open episode. The model's groups are the resource types', whatever
fleet it was trained on. Without it the windows are built and not judged.

``--rules-only``: neither, as a worker without a model runs (the anomaly rule builds no window).

``--whole-utils`` (with ``--replay``): each GPU sample's ``util_pct`` rounded to a whole percent, as DCGM
reports ``DCGM_FI_DEV_GPU_UTIL`` (an integer field) and NVML ``utilization.gpu``; the simulator writes one
decimal, which a window of samples holds in 8 bytes each rather than 1 (:func:`detector.floats.append`).

``--replay FILE``: instead, a replay file (the bench fleet: 24 h of history) through the same
engine, then each key's state by resource kind, in memory and saved (a steady state: the
series a rule keeps over its window are full).
"""

from __future__ import annotations

import argparse
import gc
import resource
import sqlite3
import sys
import tempfile
import time
import tracemalloc
import types
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from detector.detectors.anomaly import Scoring, use_scoring  # noqa: E402
from detector.detectors.base import DetectorBase  # noqa: E402
from detector.engine import Engine, KeyState  # noqa: E402
from detector.events import TOPIC_GPU_METRICS, TOPIC_RESOURCE_USAGE, EventDecoder  # noqa: E402
from detector.rules import load_rules  # noqa: E402
from detector.units import rfc3339  # noqa: E402

START = datetime(2026, 11, 2, tzinfo=timezone.utc).timestamp()
MIX = [("gpu_instance", 12), ("notebook", 8), ("inference_endpoint", 3), ("cpu_instance", 6),
       ("storage_bucket", 3), ("vector_db", 3)]  # fmt: skip
TEAMS = ["nlp", "vision", "recsys", "research"]
_enc = msgspec.json.Encoder()


def kind_of(i: int) -> str:
    """The i-th resource's kind, cycling through :data:`MIX`."""
    slot = i % sum(n for _, n in MIX)
    for kind, n in MIX:
        if slot < n:
            return kind
        slot -= n
    raise AssertionError


def messages(i: int, t: float, since: float = START) -> list[tuple[str, bytes]]:
    """What resource ``i`` sends at second ``t`` (a 30 s grid): GPU samples every 30 s, usage
    every minute (storage every 5) from ``since``, each as one message."""
    kind = kind_of(i)
    rid = f"{kind}-{i:07d}"
    ts = rfc3339(t)
    out: list[tuple[str, bytes]] = []
    gpus = 8 if kind == "gpu_instance" else 1 if kind in ("notebook", "inference_endpoint") else 0
    if gpus:
        busy = i % 5 != 0
        out.append((TOPIC_GPU_METRICS, _enc.encode([
            {"ts": ts, "resource_id": rid, "gpu_index": g, "gpu_uuid": f"GPU-{rid}-{g}", "model": "A100-SXM4-40GB",
             "util_pct": (80.0 + g + (t % 7)) if busy else 1.0, "mem_used_mib": 30000.0, "mem_total_mib": 40960.0,
             "power_w": 320.0 if busy else 60.0, "sm_active": 0.7 if busy else 0.01}
            for g in range(gpus)])))  # fmt: skip
    storage = kind in ("storage_bucket", "vector_db")
    if (t - since) % (300 if storage else 60) == 0:
        tags = {"team": TEAMS[i % 4], "project": f"proj-{i % 8}", "owner": f"user-{i % 13}"}
        if i % 10 == 0:
            del tags["project"]  # some untagged spend
        event: dict[str, Any] = {
            "ts": ts, "resource_id": rid, "resource_type": kind, "provider": "aws", "account": f"ml-prod-{i % 2}",
            "region": "us-east-1", "state": "running", "interval_s": 300.0 if storage else 60.0, "tags": tags,
        }  # fmt: skip
        if kind in ("gpu_instance", "notebook", "inference_endpoint", "cpu_instance"):
            event["instance_type"] = {"gpu_instance": "p4d.24xlarge", "notebook": "g5.xlarge",
                                      "inference_endpoint": "g5.2xlarge", "cpu_instance": "m6i.2xlarge"}[kind]
        if kind in ("inference_endpoint", "cpu_instance"):
            event["egress_bytes"] = 2_000_000_000 + (i % 97) * 1_000_000
            event["dest_region"] = "eu-west-1" if kind == "cpu_instance" else ""
        if kind == "inference_endpoint":
            event["requests"] = 3000
        if storage:
            event["storage_bytes"] = 10**13 + int(t - START) * 10**6
            event["cost_usd"] = 0.05
        if kind == "vector_db":
            event["capacity_bytes"] = 2 * 10**13
            event["vector_count"] = 10**9
        out.append((TOPIC_RESOURCE_USAGE, _enc.encode([event])))
    return out


Save = Callable[[list[tuple[str, int, bytes]], int], None]


def feed(engine: Engine, n: int, minutes: float, waves: int = 1, save: Save | None = None, batch: int = 5000,
         progress: bool = True) -> int:  # fmt: skip
    """Send ``minutes`` of event time to resources 0..n-1, in ``waves`` groups one after another;
    after each batch save what it touched (``save``) as the worker does, and at each 30 s step
    expire (and evict) as the worker's timer does. Return the events fed."""
    decoder = EventDecoder(max_future_s=10 * 365 * 86_400.0)
    steps = int(minutes * 2)
    events = version = 0
    pending: list[tuple[float, Any]] = []

    def process() -> None:
        nonlocal events, version, pending
        engine.process_timed(pending)
        events += len(pending)
        pending = []
        if save is not None:
            version += 1
            save([(key, 0, engine.snapshot(key)) for key in engine.dirty], version)  # type: ignore[misc]
        engine.dirty.clear()

    for wave in range(waves):
        group = range(wave * n // waves, (wave + 1) * n // waves)
        for step in range(steps):
            since = START + 30.0 * wave * steps
            t = since + 30.0 * step
            for i in group:
                for topic, value in messages(i, t, since):
                    for ev in decoder.decode(topic, value):
                        pending.append((t, ev))
                if len(pending) >= batch:
                    process()
            if pending:
                process()
            engine.expire()
            if progress:
                print(f"  wave {wave}, t+{30 * (step + 1)}s: {len(engine):,} keys in memory, {engine.evicted:,} evicted, "
                      f"{rss_mb():,.0f} MB RSS", flush=True)  # fmt: skip
    return events


def sqlite_store(path: str) -> tuple[Save, Callable[[str], bytes | None]]:
    """A file-backed key → snapshot table: what the worker's store does for eviction, out of
    this process's memory (SQLite keeps a 2 MB page cache)."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=OFF")
    db.execute("PRAGMA synchronous=OFF")
    db.execute("CREATE TABLE state (key TEXT PRIMARY KEY, snapshot BLOB)")

    def save(states: list[tuple[str, int, bytes]], version: int) -> None:
        db.executemany("INSERT OR REPLACE INTO state VALUES (?, ?)", [(k, s) for k, _, s in states])

    def fetch(key: str) -> bytes | None:
        row = db.execute("SELECT snapshot FROM state WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    return save, fetch


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


_STOP = (type, types.ModuleType, types.CodeType, DetectorBase, Engine)


def deep_size(obj: Any, seen: set[int]) -> int:
    """Bytes of ``obj`` and what it alone reaches, counting each object once over ``seen``;
    stops at classes, modules, code, detectors and the engine (shared by every key), and
    at a function's globals."""
    total, stack = 0, [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, _STOP) or o is None or o is True or o is False:
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        elif isinstance(o, types.MethodType):
            stack.append(o.__self__)
        elif isinstance(o, types.FunctionType):
            stack.extend(c.cell_contents for c in (o.__closure__ or ()))
        elif isinstance(o, msgspec.Struct):
            stack.extend(getattr(o, f) for f in o.__struct_fields__)
        elif hasattr(type(o), "__slots__"):
            stack.extend(getattr(o, s) for s in type(o).__slots__ if hasattr(o, s))
        elif hasattr(o, "__dict__"):
            stack.append(o.__dict__)
    return total


def breakdown(engine: Engine, sample: int = 3000) -> dict[str, float]:
    """Bytes per key by part over ``sample`` keys spread over the engine's keys."""
    keys = list(engine._keys)
    picked = keys[:: max(1, len(keys) // sample)][:sample]
    types_by_name = {r.detector.name: r.detector.type for r in engine.ruleset.rules}
    seen: set[int] = set()
    parts: dict[str, int] = {}

    def add(part: str, obj: Any) -> None:
        parts[part] = parts.get(part, 0) + deep_size(obj, seen)

    for key in picked:
        state: KeyState = engine._keys[key]
        # The rule states first: what the routes and context reach of them is theirs.
        for name, rule_state in state.rules.items():
            add(f"rule: {types_by_name.get(name, name)}", rule_state)
        add("key: id string", key)
        add("key: ResourceInfo", state.info)
        for slot in type(state).__slots__:
            if slot not in ("info",):
                add(f"key: {slot}", getattr(state, slot))
        add("key: KeyState object", state)
    n = len(picked)
    per_key = {part: size / n for part, size in sorted(parts.items(), key=lambda kv: -kv[1])}
    # The engine's tables: a slot per key in _keys and dirty (dict and set), measured whole.
    per_key["engine: _keys dict + dirty set (per key)"] = (
        sys.getsizeof(engine._keys) + sys.getsizeof(engine.dirty) + sys.getsizeof(engine._restored_t)
    ) / max(1, len(keys))
    return per_key


def scoring(model_dir: str | None) -> Scoring:
    """The anomaly rule's scoring: the model in ``model_dir``, else windows built and not judged."""
    if model_dir is None:
        return Scoring(observe=lambda windows: None)
    from detector.model.forest import ModelSet

    return Scoring(ModelSet.load(model_dir))


def replayed(path: str, model_dir: str | None = None, rules_only: bool = False, whole_utils: bool = False) -> Engine:
    """An engine with the shipped rules after the replay file ``path``, fed in sorted batches
    (``rules_only``: no window built, as a worker without a model; ``whole_utils``: each GPU sample's
    ``util_pct`` rounded to a whole percent, as DCGM and NVML report it)."""
    import msgspec

    from detector.events import GpuMetric
    from detector.replay import read_replay

    ruleset = load_rules(ROOT / "rules")
    if not rules_only:
        use_scoring(ruleset.rules, scoring(model_dir))
    engine = Engine(ruleset)
    decoder = EventDecoder(max_future_s=10 * 365 * 86_400.0)
    batch: list[tuple[float, Any]] = []
    for _, record in read_replay(path):
        events = decoder.decode(record.topic, bytes(record.value))
        if whole_utils:
            events = [msgspec.structs.replace(ev, util_pct=float(round(ev.util_pct))) if type(ev) is GpuMetric else ev
                      for ev in events]  # fmt: skip
        batch.extend((ev.ts.timestamp(), ev) for ev in events)
        if len(batch) >= 5000:
            engine.process_timed(sorted(batch, key=lambda item: item[0]))
            batch = []
    engine.process_timed(sorted(batch, key=lambda item: item[0]))
    return engine


def by_kind(path: str, model_dir: str | None = None, rules_only: bool = False, whole_utils: bool = False) -> None:
    """Each key's state after a replay file, by resource kind: in memory (deep size) and saved."""
    engine = replayed(path, model_dir, rules_only, whole_utils)
    kinds: dict[str, list[int]] = {}
    seen: set[int] = set()
    for key, state in engine._keys.items():
        row = kinds.setdefault(state.info.resource_type or "(run project)", [0, 0, 0, 0])
        size = deep_size(state, seen) + deep_size(key, seen)
        row[0] += 1
        row[1] += size
        row[2] += len(engine.snapshot(key) or b"")
        row[3] = max(row[3], size)
    print(f"state per key after {path}:")
    for kind, (n, size, saved, most) in sorted(kinds.items()):
        print(f"  {kind:20} {n:4} keys {size / n:8,.0f} B in memory (most {most:,}) {saved / n:7,.0f} B saved")
    n = sum(row[0] for row in kinds.values())
    print(f"  {'all':20} {n:4} keys {sum(row[1] for row in kinds.values()) / n:8,.0f} B in memory"
          f"{'':16}{sum(row[2] for row in kinds.values()) / n:7,.0f} B saved")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resources", type=int, default=20_000)
    parser.add_argument("--minutes", type=float, default=10.0, help="event time fed to every resource")
    parser.add_argument("--waves", type=int, default=1, help="groups of resources that speak one after another")
    parser.add_argument("--evict-after", type=float, default=None, help="evict keys quiet this long (event s)")
    parser.add_argument("--store", choices=("sqlite", "chdb"), default="sqlite", help="where evicted state goes")
    parser.add_argument("--no-tracemalloc", action="store_true", help="RSS only (tracemalloc slows 2-3x)")
    parser.add_argument("--sample", type=int, default=3000, help="keys whose state is measured by part")
    parser.add_argument("--replay", help="measure the state after this replay file instead, by resource kind")
    parser.add_argument("--model-dir", help="score windows with the model in this folder (default: built, not judged)")
    parser.add_argument("--rules-only", action="store_true", help="no model and no windows, as a worker without a model")
    parser.add_argument("--whole-utils", action="store_true",
                        help="with --replay: GPU utilisation in whole percents, as DCGM and NVML report it")  # fmt: skip
    args = parser.parse_args()
    if args.replay:
        if args.rules_only and args.model_dir:
            parser.error("--rules-only is a worker without a model: leave out --model-dir")
        by_kind(args.replay, args.model_dir, args.rules_only, args.whole_utils)
        return 0

    ruleset = load_rules(ROOT / "rules")
    if not args.rules_only:
        use_scoring(ruleset.rules, scoring(args.model_dir))
    tmp = tempfile.TemporaryDirectory(prefix="burnwatch-memory-")
    save: Save | None = None
    fetch: Callable[[str], bytes | None] | None = None
    if args.evict_after is not None:
        if args.store == "chdb":
            from detector.store import Store, connect

            store = Store(connect(f"chdb://{tmp.name}/chdb"), database="bench")
            store.migrate()
            save, fetch = (lambda states, version: store.states.save(states, version=version)), store.states.get
        else:
            save, fetch = sqlite_store(f"{tmp.name}/state.sqlite")
    engine = Engine(ruleset, evict_after_s=args.evict_after, fetch=fetch)
    gc.collect()
    base_rss = rss_mb()
    if not args.no_tracemalloc:
        tracemalloc.start()
    base_traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
    started = time.perf_counter()
    events = feed(engine, args.resources, args.minutes, args.waves, save)
    took = time.perf_counter() - started
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - base_traced if tracemalloc.is_tracing() else 0
    rss = rss_mb()
    n = args.resources
    print(f"{n:,} resources in {args.waves} wave(s), {events:,} events, {args.minutes:g} min of event time each, "
          f"in {took:.0f} s; {len(engine):,} keys in memory, {engine.evicted:,} evicted")  # fmt: skip
    print(f"RSS: {base_rss:,.0f} MB before, {rss:,.0f} MB after, {peak_rss_mb():,.0f} MB peak; "
          f"{(rss - base_rss) * 1048576 / n:,.0f} bytes per resource (RSS growth)")  # fmt: skip
    if traced:
        print(f"tracemalloc: {traced / n:,.0f} bytes per resource still allocated")
    parts = breakdown(engine, args.sample)
    print(f"deep size by part over {min(args.sample, len(engine)):,} keys (bytes per key):")
    for part, size in parts.items():
        print(f"  {size:8,.0f}  {part}")
    print(f"  {sum(parts.values()):8,.0f}  total")
    if engine.evicted:
        index = sys.getsizeof(engine._evicted) + sum(sys.getsizeof(k) + sys.getsizeof(t) for k, t in engine._evicted.items())
        print(f"evicted keys: {index / engine.evicted:,.0f} bytes each in memory (the index and the key)")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
