"""Per-field deep size of chosen rules' states, by resource kind: which field of which rule
state a memory pass should shrink next (bench/memory.py gives the state by rule, not by field).

    .venv/bin/python bench/state_by_field.py                                   # 700 resources, 5 min
    .venv/bin/python bench/state_by_field.py --resources 700 --rules anomaly,data_starved_training
    .venv/bin/python bench/state_by_field.py --replay bench/out/fleet.jsonl --rules all   # after a day
    .venv/bin/python bench/state_by_field.py --replay bench/out/fleet.jsonl --held   # what each rule tracks

An :class:`~detector.engine.Engine` with the shipped rules is fed bench/memory.py's feed (the
simulated fleet's proportions) for ``--minutes`` of event time; then each chosen rule's state
(by detector type) is walked: a msgspec struct field by field (nested structs recursively, the
struct's own object as ``.<struct>``), anything else as a whole. Sizes are per key of the kind,
and an object shared by several keys counts once (bench/memory.py's ``deep_size``).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

import memory  # noqa: E402

from detector.detectors.anomaly import use_scoring  # noqa: E402
from detector.engine import Engine  # noqa: E402
from detector.rules import load_rules  # noqa: E402


def fed_engine(resources: int, minutes: float, model_dir: str | None) -> Engine:
    """An engine with the shipped rules after bench/memory.py's feed of ``resources`` for ``minutes``."""
    ruleset = load_rules(memory.ROOT / "rules")
    use_scoring(ruleset.rules, memory.scoring(model_dir))
    engine = Engine(ruleset)
    memory.feed(engine, resources, minutes, progress=False)
    return engine


def by_field(engine: Engine, rules: set[str]) -> tuple[dict[str, Counter[str]], Counter[str]]:
    """Bytes by ``kind`` and ``type.field`` path over the chosen detector types' states, and keys by kind."""
    types_by_name = {r.detector.name: r.detector.type for r in engine.ruleset.rules}
    seen: set[int] = set()
    sizes: dict[str, Counter[str]] = defaultdict(Counter)
    keys: Counter[str] = Counter()

    def walk(path: str, obj: Any, kind: str) -> None:
        if not isinstance(obj, msgspec.Struct):
            sizes[kind][path] += memory.deep_size(obj, seen)
            return
        if id(obj) not in seen:
            seen.add(id(obj))
            sizes[kind][path + ".<struct>"] += sys.getsizeof(obj)
        for field in obj.__struct_fields__:
            walk(f"{path}.{field}", getattr(obj, field), kind)

    for state in engine._keys.values():
        kind = state.info.resource_type or "(run project)"
        keys[kind] += 1
        for name, rule_state in state.rules.items():
            rule_type = types_by_name.get(name, name)
            if rule_type in rules:
                walk(rule_type, rule_state, kind)
    return sizes, keys


def report(sizes: dict[str, Counter[str]], keys: Counter[str]) -> None:
    """Per kind, then over all keys: the total per key and each field's bytes per key, largest first."""
    everything: Counter[str] = Counter()
    for counter in sizes.values():
        everything.update(counter)
    rows = [(kind, sizes[kind], keys[kind]) for kind in sizes] + [("ALL", everything, keys.total())]
    for kind, counter, n in rows:
        print(f"== {kind} ({n} keys) total {sum(counter.values()) / n:.0f}")
        for path, size in sorted(counter.items(), key=lambda kv: -kv[1]):
            if size:
                print(f"   {size / n:8.1f} {path}")


def held(engine: Engine) -> None:
    """Per kind and rule: keys holding None (a lazy rule not started), and of the others, how many hold
    each field otherwise than a new state does (saved bytes compared): a rule whose states differ from
    new ones in the key's latest times alone tracks nothing there, a candidate to make lazy."""
    detectors = {r.detector.name: r.detector for r in engine.ruleset.rules}
    encode = engine._encoder.encode
    nones: Counter[tuple[str, str]] = Counter()
    keys: Counter[tuple[str, str]] = Counter()
    fields: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for state in engine._keys.values():
        kind = state.info.resource_type or "(run project)"
        for name, rule_state in state.rules.items():
            detector = detectors[name]
            row = (kind, detector.type)
            keys[row] += 1
            if rule_state is None:
                nones[row] += 1
                continue
            new = detector.new_state()
            for field in rule_state.__struct_fields__:
                if encode(getattr(rule_state, field)) != encode(getattr(new, field)):
                    fields[row][field] += 1
    for row in sorted(keys):
        differ = ", ".join(f"{field} {n}" for field, n in fields[row].most_common())
        print(f"{row[0]:20} {row[1]:26} {keys[row]:4} keys {nones[row]:4} None   {differ or '-'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resources", type=int, default=700, help="distinct resources fed (default 700)")
    parser.add_argument("--minutes", type=float, default=5.0, help="event time fed to every resource")
    parser.add_argument("--rules", default="anomaly,data_starved_training",
                        help="detector types whose states are broken down, comma-separated, or all")  # fmt: skip
    parser.add_argument("--model-dir", help="score windows with the model in this folder (default: built, not judged)")
    parser.add_argument("--replay", help="the state after this replay file (a day: bench/out/fleet.jsonl) instead")
    parser.add_argument("--held", action="store_true",
                        help="instead of sizes: per kind and rule, keys holding None and the fields held otherwise "
                             "than in a new state")  # fmt: skip
    args = parser.parse_args()
    if args.replay:
        engine = memory.replayed(args.replay, args.model_dir)
    else:
        engine = fed_engine(args.resources, args.minutes, args.model_dir)
    if args.held:
        held(engine)
        return 0
    rules = {r.detector.type for r in engine.ruleset.rules} if args.rules == "all" else set(args.rules.split(","))
    report(*by_field(engine, rules))
    return 0


if __name__ == "__main__":
    sys.exit(main())
