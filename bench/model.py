"""``make bench``, the anomaly model's part: scoring throughput, and detection with the model on
against off. In-process (the worker runs the same engine code per batch).

A 48-hour fleet: a model is trained on its first 24 hours, then the whole fleet is
backtested with the 10 rules alone, with the ``anomaly`` rule building windows but no
model (the cold-start cost), and with the model scoring; then streamed through one
worker without and with the model (``BURNWATCH_MODEL_DIR``). The anomaly rule's state per
resource (open window, per-resource baselines, run of evidence) is measured with
tracemalloc: an engine's retained memory with the model against without the anomaly rule,
over the resources it holds. Writes bench/out/model.json.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from detector.backtest import backtest  # noqa: E402
from detector.model.forest import ModelSet  # noqa: E402
from detector.model.train import TrainingSet, anomaly_ruleset, train  # noqa: E402
from detector.replay import write_replay  # noqa: E402
from detector.rules import load_rules  # noqa: E402
from detector.runtime import tune_gc  # noqa: E402
from detector.simulate import SimConfig, simulate  # noqa: E402

FLEET = SimConfig(hours=48, training_hosts=46, notebooks=24, inference_endpoints=8, seed=21)


def main() -> int:
    tune_gc()
    rules = load_rules(ROOT / "rules")
    with_model_rule = anomaly_ruleset(rules)
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="burnwatch-bench-model-") as tmp:
        path = Path(tmp) / "fleet.jsonl"
        records, _ = simulate(FLEET, rules.pricing)
        with open(path, "wb") as f:
            write_replay(records, f)
        ts = TrainingSet()
        first = backtest(path, with_model_rule, on_windows=ts.collect)
        cut = FLEET.start + 24 * 3600
        ts.windows = {g: [w for w in ws if w.end <= cut] for g, ws in ts.windows.items()}
        started = time.perf_counter()
        artifacts = train(ts, [a for a in first.alerts if a.fired_at <= cut], set(), Path(tmp) / "models")
        out["train_s"] = time.perf_counter() - started
        out["train_windows"] = sum(a.samples for a in artifacts)
        models = ModelSet.load(Path(tmp) / "models")
        gpu = models.get("gpu")
        rows = np.array([w.vector() for w in ts.windows["gpu"]][:10_000])
        started = time.perf_counter()
        gpu.score(rows)
        out["score_windows_per_s_batch"] = len(rows) / (time.perf_counter() - started)
        started = time.perf_counter()
        for row in rows[:200]:
            gpu.score(row[None, :])
        out["score_windows_per_s_one_by_one"] = 200 / (time.perf_counter() - started)
        for name, ruleset, m in (("rules", rules, None), ("anomaly_rule_no_model", with_model_rule, None),
                                 ("anomaly_rule_with_model", with_model_rule, models)):  # fmt: skip
            started = time.perf_counter()
            result = backtest(path, ruleset, models=m)
            seconds = time.perf_counter() - started
            out[name] = {"events_per_s": result.events / seconds, "events": result.events,
                         "anomaly_alerts": sum(a.type == "anomaly" for a in result.alerts)}  # fmt: skip
            print(name, out[name], flush=True)
        out["anomaly_state"] = state_bytes(path, rules, with_model_rule, models)
        print("anomaly_state", out["anomaly_state"], flush=True)
        from bench.run import bench_streaming

        with_model = {"BURNWATCH_MODEL_DIR": str(Path(tmp) / "models")}
        for name, extra in (("streaming_no_model", {}), ("streaming_with_model", with_model)):
            out[name] = bench_streaming(path, Path(tmp), name, **extra)
            print(name, out[name], flush=True)
    (ROOT / "bench" / "out").mkdir(exist_ok=True)
    (ROOT / "bench" / "out" / "model.json").write_text(json.dumps(out, indent=2))
    print(f"\n| measure | figure |\n|---|---|\n"
          f"| train ({out['train_windows']:,} windows, 4 groups) | {out['train_s']:.1f} s |\n"
          f"| IsolationForest scoring, 10k windows in one call | {out['score_windows_per_s_batch']:,.0f} windows/s |\n"
          f"| the same, one window per call | {out['score_windows_per_s_one_by_one']:,.0f} windows/s |\n"
          f"| backtest, 10 rules | {out['rules']['events_per_s']:,.0f} events/s |\n"
          f"| + anomaly rule, no model (cold start) | {out['anomaly_rule_no_model']['events_per_s']:,.0f} events/s |\n"
          f"| + anomaly rule with the model | {out['anomaly_rule_with_model']['events_per_s']:,.0f} events/s |\n"
          f"| streaming, one worker, no model | {out['streaming_no_model']['events_per_s']:,.0f} events/s |\n"
          f"| streaming, one worker, with the model | {out['streaming_with_model']['events_per_s']:,.0f} events/s |\n"
          f"| anomaly rule's state per resource (tracemalloc) | {out['anomaly_state']['bytes_per_resource']:,.0f} bytes |")
    return 0


def state_bytes(path: Path, rules, with_model_rule, models) -> dict:
    """Retained bytes per resource of the anomaly rule's state: an engine fed the whole fleet with
    the model, against one with the other rules alone, after a full collection."""
    import gc
    import tracemalloc

    from detector.detectors.anomaly import Scoring, use_scoring
    from detector.engine import Engine
    from detector.events import EventDecoder, UsageEvent
    from detector.replay import read_replay

    decoder = EventDecoder(limits=rules.limits)
    events = sorted((e for _, r in read_replay(path) for e in decoder.decode(r.topic, bytes(r.value))),
                    key=lambda e: e.ts)  # fmt: skip
    from detector.rules import compile_rules

    rules_only = compile_rules([r.source for r in rules.rules if r.detector.type != "anomaly"], rules.pricing,
                               routing=rules.routing, limits=rules.limits)  # fmt: skip
    retained = {}
    for name, ruleset in (("rules", rules_only), ("with_model", with_model_rule)):
        use_scoring(ruleset.rules, Scoring(models))
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        engine = Engine(ruleset)
        for i in range(0, len(events), 5000):
            engine.process(events[i:i + 5000])
        gc.collect()
        retained[name] = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        del engine
    resources = len({e.resource_id for e in events if type(e) is UsageEvent})  # the anomaly rule's keys
    return {"resources": resources, "bytes_rules": retained["rules"], "bytes_with_model": retained["with_model"],
            "bytes_per_resource": (retained["with_model"] - retained["rules"]) / resources}


if __name__ == "__main__":
    sys.exit(main())
