"""Workloads that could fool ``stuck_gpu`` without ``SM_ACTIVE``: what their signals read.

Without ``DCGM_FI_PROF_SM_ACTIVE`` (off in dcgm-exporter's defaults), ``stuck_gpu`` reads a
resident kernel with tensor pipes under 5 % and DRAM activity under 2 % as hung. Real work
whose data fits in L2 (a small model, an FP32 loop) could read that way; a hang with many
NCCL channels (many blocks polling flags) could read as alive on ``SM_ACTIVE``. This runs
such workloads on the GPU machine (never in tests) and samples the counters as
``bench/nvml_signals.py`` does (its :class:`Sampler`), each phase in its own process.

Usage: ``python3 bench/nvml_stuck_edges.py OUT.jsonl [seconds]``; prints each phase's median
readings. The capture taken on an H200 (10 s a phase) is ``tests/data/h200_stuck_edges.jsonl``;
``tests/test_stuck_edges.py`` runs it through the rules.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from nvml_signals import Sampler, run_phase  # noqa: E402

_HEAD = "import sys, time, torch\ntorch.manual_seed(0)\n"
_LOOP = 'torch.cuda.synchronize(); print("ready", flush=True); end = time.time() + float(sys.argv[1])\nwhile time.time() < end:\n'
WORKLOADS = {
    # a small MLP trained in FP32 (no TF32: no tensor cores), weights ~1 MB: L2-resident
    "mlp_fp32_small": _HEAD + """
m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()) for _ in range(8)]).cuda()
opt = torch.optim.SGD(m.parameters(), lr=1e-3); x = torch.randn(256, 256, device="cuda")
""" + _LOOP + """    for _ in range(50):
        opt.zero_grad(); m(x).square().mean().backward(); opt.step()
    torch.cuda.synchronize()
""",
    # the same in bf16 (tensor cores, tiny matrices)
    "mlp_bf16_small": _HEAD + """
m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()) for _ in range(8)]).cuda().bfloat16()
opt = torch.optim.SGD(m.parameters(), lr=1e-3); x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
""" + _LOOP + """    for _ in range(50):
        opt.zero_grad(); m(x).float().square().mean().backward(); opt.step()
    torch.cuda.synchronize()
""",
    # an FP32 elementwise loop over 4 MB (in L2), many FMAs per launch
    "fp32_l2_loop": _HEAD + """
x = torch.randn(1 << 20, device="cuda")
""" + _LOOP + """    for _ in range(200):
        x.mul_(0.999).add_(0.001).sin_()
    torch.cuda.synchronize()
""",
    # a hang as NCCL has it: 32 blocks (channels) polling a flag in device memory that never changes
    "poll_32_blocks": r"""
import sys, cupy
k = cupy.RawKernel(r'''
extern "C" __global__ void poll(volatile int* flag, unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { if (flag[blockIdx.x * 32] != 0) return; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); }
    while (now - start < ns);
}''', "poll")
flag = cupy.zeros(32 * 32, dtype=cupy.int32)
k((32,), (64,), (flag, cupy.uint64(1))); cupy.cuda.Device().synchronize()
print("ready", flush=True)
k((32,), (64,), (flag, cupy.uint64(int(float(sys.argv[1]) * 1e9)))); cupy.cuda.Device().synchronize()
""",
}


def main(out_path: str, seconds: float = 10.0) -> int:
    sampler = Sampler()
    sampler.start()
    phases: list[tuple[str, float, float]] = []
    for name, code in WORKLOADS.items():
        phases.append(run_phase(name, code, seconds))
    sampler.stop.set()
    sampler.join()
    by_phase: dict[str, list[dict]] = {}
    with open(out_path, "w") as out:
        out.write(json.dumps({"device": sampler.device(), "errors": sampler.errors, "phases": phases}) + "\n")
        for sample in sampler.samples:
            phase = next((p for p, lo, hi in phases if lo + 1.0 <= sample["t"] <= hi), "between")
            out.write(json.dumps({"phase": phase, **sample}) + "\n")
            by_phase.setdefault(phase, []).append(sample)
    for phase, samples in by_phase.items():
        if phase == "between":
            continue
        gpm = [s["gpm"] for s in samples if "gpm" in s]
        med = {k: round(statistics.median(g[k] for g in gpm), 3) for k in (gpm[0] if gpm else {})}
        util = statistics.median(s.get("gpu_util", 0) for s in samples)
        power = statistics.median(s.get("power_w", 0) for s in samples)
        print(json.dumps({"phase": phase, "n": len(samples), "gpu_util": util, "power_w": round(power, 1), **med}))
    print(json.dumps({"device": sampler.device(), "errors": sampler.errors}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "nvml_stuck_edges.jsonl",
                  float(sys.argv[2]) if len(sys.argv) > 2 else 10.0))
