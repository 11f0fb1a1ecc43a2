"""The GPU rules read live (the usage topic behind the samples) against time order, on seeded random
hosts stopped and started again: what docs/reliability.md records of the restart's gap.

    .venv/bin/python bench/gpu_live_order.py --draws 400                 # GPUs idle and busy by turns
    .venv/bin/python bench/gpu_live_order.py --draws 300 --seed 1000 --whole   # every GPU alike (idle_gpu)
    .venv/bin/python bench/gpu_live_order.py --draws 400 --lags 5,9,15 --show  # each difference

Each draw is one 8-GPU host for 4 hours: every GPU idle (0 %) and busy (90 %) by turns at up to four
random half-minutes (``--whole``: every GPU the same turns), scraped every 30 s; one gap of 2-30
minutes in its scrapes, the host stopped from its start or up to 3 minutes into it to its end; with
a chance of 3 in 10, GPUs back from that gap up to 10 minutes after the others (``--dark-again``: the
host, running, dark once more for 2-10 minutes, 1-20 minutes after the gap). Usage every minute,
$32/h; then an hour more as the 4 hours left it, so that what live reading decides once the usage of the
last minutes is read is made (a stream does not end where a draw does). The engine reads the events in time
order, and then with the usage topic a random lag of ``--lags`` minutes behind; the draw differs where, of
what is dated in the 4 hours, a fire's episode or time, or a resolution's time or dollars, differ, leaving
out what live reading takes back (a fire withdrawn with its withdrawal, a resolution corrected: its
correction stands in its place) and a fire's dollars (made scrapes after its date, live, those time order
counted where the rule can tell them; ``--fire-dollars`` compares them too). Exit status 0: a measurement,
not a test (docs/reliability.md names the differences left).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from detector.engine import Engine  # noqa: E402
from detector.events import GpuMetric  # noqa: E402
from detector.rules import load_rules  # noqa: E402
from tests.helpers import MIN, T0, at, usage  # noqa: E402

TYPES = ("partly_idle_gpu", "idle_gpu", "stuck_gpu", "unallocated_gpu")
END_MIN = 240
TAIL_MIN = 60
"""Minutes of events after ``END_MIN``, the GPUs and the host as it left them: what is dated in them is not compared."""


def draw(rng: random.Random, whole: bool, dark_again: bool = False) -> tuple[list, dict]:
    """One host's events, and what was drawn (for ``--show``)."""
    def turns() -> tuple[bool, list[float]]:
        return rng.random() < 0.5, sorted(rng.choice(range(2 * END_MIN)) / 2 for _ in range(rng.randint(0, 4)))

    segs = [turns()] * 8 if whole else [turns() for _ in range(8)]
    gap_at = rng.randint(20, 180) + rng.choice([0, 0.5])
    back = gap_at + rng.choice([2, 3, 4, 6, 10, 15, 30])
    stop = gap_at + rng.choice([0, 0.5, 1, 2, 3])
    stop = gap_at if stop >= back else stop
    late = {g: rng.choice([0, 2, 5, 10]) for g in range(8)} if rng.random() < 0.3 else {}
    # (--dark-again: the whole host dark once more, running, 1-20 minutes after the gap, for 2-10 minutes)
    again = back + rng.choice([1, 3, 5, 10, 20]) if dark_again else 0.0
    again_end = again + rng.choice([2, 4, 6, 10]) if dark_again else 0.0

    def util(g: int, m: float) -> float:
        busy, points = segs[g]
        return 90.0 if busy ^ (sum(m >= p for p in points) % 2 == 1) else 0.0

    events: list = []
    for k in range(2 * (END_MIN + TAIL_MIN)):
        m = k / 2
        if gap_at < m < back or again < m < again_end:
            continue
        events += [GpuMetric(ts=at(T0 + m * MIN), resource_id="host-1", gpu_index=g, model="A100", util_pct=util(g, m))
                   for g in range(8) if not back <= m < back + late.get(g, 0)]  # fmt: skip
    events += [usage(T0 + m * MIN, state="stopped" if stop <= m < back else "running") for m in range(END_MIN + TAIL_MIN)]
    return events, {"gap": (gap_at, back), "stopped": stop, "late": late, "dark_again": (again, again_end)}


def read(events: list, lag_min: float) -> list:
    """Time order (samples first at equal times, as ``align``), or the usage topic ``lag_min`` behind."""
    lag = lag_min * MIN
    return sorted(events, key=lambda e: (e.ts.timestamp() + (lag if type(e).__name__ == "UsageEvent" else 0.0),
                                         type(e).__name__ == "UsageEvent"))  # fmt: skip


def stood(ruleset, events: list, fire_dollars: bool = False) -> list[tuple]:
    """Each fire (rule, episode start, time; its dollars with ``fire_dollars``) and resolution (and its
    dollars) that stood, in minutes."""
    found = [f for f in Engine(ruleset).process(events) if f.type in TYPES and f.action != "update"]
    withdrawn = {(f.type, f.episode_start) for f in found if f.details.get("reason") == "withdrawn"}
    corrected = {(f.type, f.episode_start) for f in found if f.details.get("corrected")}
    return [(f.type, f.action, (f.episode_start - T0) / MIN, (f.at - T0) / MIN,
             round(f.waste_usd, 2) if f.action == "resolve" or fire_dollars else None)
            for f in found if f.at < T0 + END_MIN * MIN and (f.type, f.episode_start) not in withdrawn
            and (f.action != "resolve" or f.details.get("corrected") or (f.type, f.episode_start) not in corrected)]  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0, help="the first draw's seed (draws take seed, seed+1, ...)")
    ap.add_argument("--lags", default="5,9,15,40,45", help="minutes the usage topic is read behind, one drawn a host")
    ap.add_argument("--whole", action="store_true", help="every GPU of a host idle and busy alike")
    ap.add_argument("--dark-again", action="store_true", help="the host dark once more, running, soon after the gap")
    ap.add_argument("--fire-dollars", action="store_true", help="a fire's dollars differing makes a draw differ too")
    ap.add_argument("--show", action="store_true", help="print each draw that differs")
    args = ap.parse_args()
    lags = [float(x) for x in args.lags.split(",")]
    ruleset = load_rules(ROOT / "rules")
    differ = 0
    for seed in range(args.seed, args.seed + args.draws):
        rng = random.Random(seed)
        events, drawn = draw(rng, args.whole, args.dark_again)
        lag = rng.choice(lags)
        in_order = stood(ruleset, read(events, 0.0), args.fire_dollars)
        live = stood(ruleset, read(events, lag), args.fire_dollars)
        if sorted(in_order, key=repr) != sorted(live, key=repr):  # (a correction comes after what followed)
            differ += 1
            if args.show:
                print(f"seed {seed}, usage {lag:g} min behind, {drawn}")
                print("   only in time order:", [x for x in in_order if x not in live])
                print("   only live:         ", [x for x in live if x not in in_order])
    print(f"{differ} of {args.draws} draws differ from time order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
