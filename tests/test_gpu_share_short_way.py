"""gpu_share's short way at the clock (every unit fresh and busy, no episode, no whole-host idle
spell: return at once) decides exactly what the long path decides: the same findings and the same
states, over random GPU hosts (whole GPUs and MIG instances, Kubernetes holders or none, pods,
units missing, telemetry gaps, stops, samples of one scrape at mixed times), with the default rules
and with short ``for`` / ``stale_after`` (more episodes and spells in a short stream)."""

from __future__ import annotations

import random
import re
import shutil

import msgspec
import pytest

from detector.detectors import gpu_share
from detector.engine import Engine
from detector.events import GpuMetric
from detector.floats import enc_hook
from detector.rules import load_rules
from tests.conftest import ROOT
from tests.helpers import MIN, T0, at, usage

_RANK = {GpuMetric: 0}  # at equal times samples before usage, as the aligner releases them


def _pod(rng: random.Random) -> dict:
    n = rng.randrange(3)
    return {"namespace": "ml", "pod": f"p-{n}", "workload": f"Job/j{n}", "tags": {"team": "nlp", "owner": f"o{n}"}}


def stream(seed: int) -> list:
    """A random stream of one or two GPU hosts, time-sorted."""
    rng = random.Random(seed)
    events: list = []
    for h in range(rng.choice((1, 1, 2))):
        rid = f"host-{h}"
        units = []  # (gpu, mig instance or "")
        for g in range(rng.randint(1, 8)):
            if rng.random() < 0.3:
                units += [(g, str(i)) for i in range(rng.randint(1, 4))]
            else:
                units.append((g, ""))
        kube = rng.random() < 0.6
        step = rng.choice((30, 60))
        t = T0 + rng.randrange(0, 60, 15)
        for _ in range(rng.randint(1, 10)):
            minutes = rng.choice((0.5, 1, 3, 6, 10, 25, 29, 31, 40, 61, 90))
            kind = rng.choices(("scrape", "gap", "stopped"), (8, 1, 1))[0]
            p_busy = rng.choice((0.0, 0.0, 0.3, 0.7, 1.0, 1.0, 1.0))
            p_here = rng.choice((1.0, 1.0, 0.9, 0.6))
            jitter = rng.random() < 0.15
            # per unit for the segment: busy, present, allocated (None outside Kubernetes), pod
            plan = []
            for gpu, mig in units:
                allocated = rng.choice((True, True, False, None)) if kube else None
                plan.append((gpu, mig, rng.random() < p_busy, rng.random() < p_here, allocated,
                             _pod(rng) if allocated else {}))
            end = t + minutes * MIN
            while t < end:
                if (t - T0) % 60 < step:
                    events.append(usage(t, rid, state="stopped" if kind == "stopped" else "running"))
                if kind == "scrape" or (kind == "stopped" and rng.random() < 0.3):
                    for gpu, mig, busy, here, allocated, pod in plan:
                        if not here:
                            continue
                        ts = t + (rng.randrange(0, 10) if jitter else 0)
                        fields = {"allocated": allocated, **pod} if allocated is not None else {}
                        events.append(GpuMetric(ts=at(ts), resource_id=rid, model="A100", gpu_index=gpu,
                                                mig_instance=mig, util_pct=95.0 if busy else 1.0, **fields))
                t += step
    events.sort(key=lambda e: (e.ts, _RANK.get(type(e), 1)))
    return events


def outcome(ruleset, events) -> tuple[list[bytes], dict[str, bytes]]:
    engine = Engine(ruleset)
    found = [msgspec.json.encode(f, enc_hook=enc_hook) for f in engine.process(events)]
    states = {key: msgspec.json.encode(list(zip(ks.names, ks.states, strict=True)), enc_hook=enc_hook)
              for key, ks in engine._keys.items()}  # fmt: skip
    return found, states


@pytest.fixture(scope="module")
def short_rules(tmp_path_factory):
    """The shipped rules with the GPU share rules' ``for`` 6m and ``stale_after`` 2m."""
    where = tmp_path_factory.mktemp("rules")
    shutil.copytree(ROOT / "rules", where, dirs_exist_ok=True)
    text = (where / "rules.yaml").read_text()
    text = re.sub(r"for: 30m", "for: 6m", text)
    text = re.sub(r"stale_after: 5m", "stale_after: 2m", text)
    (where / "rules.yaml").write_text(text)
    return load_rules(where)


@pytest.mark.parametrize("rules", ["shipped", "short"])
@pytest.mark.parametrize("block", range(6))
def test_short_way_decides_as_the_long_path(ruleset, short_rules, monkeypatch, rules, block):
    rs = ruleset if rules == "shipped" else short_rules
    for seed in range(block * 25, block * 25 + 25):
        events = stream(seed)
        with monkeypatch.context() as m:
            m.setattr(gpu_share, "BUSY_CODES", b"")  # deletes nothing: the short way never taken
            long_path = outcome(rs, events)
        short = outcome(rs, events)
        assert short[0] == long_path[0], f"seed {seed}: findings differ"
        assert short[1] == long_path[1], f"seed {seed}: states differ"
