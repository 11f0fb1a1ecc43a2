"""What the engine costs per event, counted, not timed: Python opcodes executed by ``Engine.process_timed``.

    .venv/bin/python bench/engine_opcodes.py bench/out/fleet.jsonl --messages 20000            # rules only
    .venv/bin/python bench/engine_opcodes.py bench/out/fleet.jsonl --messages 20000 --windows  # + anomaly windows
    PYTHONPATH=<a worktree of an older commit> .venv/bin/python bench/engine_opcodes.py ...  # its figures

The first ``--messages`` of a replay file are decoded (not counted) into batches of 5,000 events in
time order, then folded by a fresh engine with the shipped rules (``rules/``) under an opcode trace:
the routing, every step and what each calls, and the batch phase. The count is the same on every
run, where a timing on a shared VM swings with the neighbours: an A/B of two trees is a difference
of counts (opcodes are not equal in cost: a small difference says "about the same").
``bench/step_opcodes.py`` counts one GPU rule's step alone.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after PYTHONPATH: an older tree given there is the one measured

from bench.opcodes import Opcodes  # noqa: E402
from detector.detectors.anomaly import Scoring, use_scoring  # noqa: E402
from detector.engine import Engine  # noqa: E402
from detector.events import EventDecoder  # noqa: E402
from detector.replay import read_replay  # noqa: E402
from detector.rules import load_rules  # noqa: E402


def batches(path: str, messages: int, size: int = 5000) -> list[list[tuple[float, Any]]]:
    decoder = EventDecoder(max_future_s=10 * 365 * 86_400.0)
    out: list[list[tuple[float, Any]]] = []
    batch: list[tuple[float, Any]] = []
    for _, record in itertools.islice(read_replay(path), messages):
        batch.extend((ev.ts.timestamp(), ev) for ev in decoder.decode(record.topic, bytes(record.value)))
        if len(batch) >= size:
            out.append(sorted(batch, key=lambda item: item[0]))
            batch = []
    return [*out, sorted(batch, key=lambda item: item[0])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("replay")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--windows", action="store_true", help="the anomaly rule builds windows (as with a model)")
    args = parser.parse_args()
    ruleset = load_rules(ROOT / "rules")
    if args.windows:
        use_scoring(ruleset.rules, Scoring(observe=lambda windows: None))
    engine = Engine(ruleset)
    data = batches(args.replay, args.messages)
    found = 0
    with Opcodes() as counted:
        for items in data:
            found += len(engine.process_timed(items))
    executed = counted.executed
    events = sum(map(len, data))
    mode = "windows built" if args.windows else "rules only"
    print(f"{events:,} events ({args.messages:,} messages), {found} findings, {mode}: "
          f"{executed / events:.1f} opcodes an event")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
