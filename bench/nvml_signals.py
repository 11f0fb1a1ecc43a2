"""What a real GPU's activity signals read when it is idle, busy, memory-bound, or "hung".

The GPU detectors decide busy, idle and stuck from dcgm-exporter's fields. Which of them
tell a hung job (a kernel resident forever, as in a stalled NCCL collective) from real
work was, until this script, only reasoned about. This runs on a machine with an NVIDIA
GPU (the device machine; never in tests or CI) and reads, once a second, the same
counters dcgm-exporter reads, through NVML:

- ``DCGM_FI_DEV_GPU_UTIL``: ``nvmlDeviceGetUtilizationRates().gpu``
- ``DCGM_FI_DEV_FB_USED/FREE/RESERVED``: ``nvmlDeviceGetMemoryInfo_v2`` (MiB)
- ``DCGM_FI_DEV_POWER_USAGE``: ``nvmlDeviceGetPowerUsage`` (W)
- ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ)
- the profiling ratios through NVML's GPU performance monitoring (GPM, Hopper and later),
  the same hardware counters DCGM's profiling module reads: ``GRAPHICS_UTIL`` for
  ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, ``SM_UTIL`` for ``DCGM_FI_PROF_SM_ACTIVE``,
  ``ANY_TENSOR_UTIL`` for ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``, ``DRAM_BW_UTIL`` for
  ``DCGM_FI_PROF_DRAM_ACTIVE`` (GPM reports 0-100; DCGM 0-1).

Phases, each in its own process so the sampler holds no CUDA context: ``idle``; ``matmul``
(bf16 matrix products: tensor cores); ``copy`` (device-to-device copies: memory-bound, no
tensor work); ``spin`` (one thread of one block spinning on the global timer: a kernel
resident with nothing to do, as a rank waiting forever in a collective); ``idle`` again.

Usage (on the GPU machine): ``python3 bench/nvml_signals.py OUT.jsonl``. Each line is one
sample: ``{"phase", "t", "gpu_util", "fb_used_mib", ..., "gpm": {...}}``. The capture taken
on an H200 is ``tests/data/h200_nvml_phases.jsonl``; ``tests/test_real_gpu_signals.py``
renders it as dcgm-exporter text and runs it through the bridge and the detectors.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

WORKLOADS = {
    "matmul": """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
torch.cuda.synchronize(); print("ready", flush=True); end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20): c = a @ b
    torch.cuda.synchronize()
""",
    "copy": """
import sys, time, torch
a = torch.empty(1 << 30, device="cuda", dtype=torch.uint8); b = torch.empty_like(a)
torch.cuda.synchronize(); print("ready", flush=True); end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20): b.copy_(a)
    torch.cuda.synchronize()
""",
    "spin": r"""
import sys, cupy
k = cupy.RawKernel(r'''
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}''', "spin")
k((1,), (1,), (cupy.uint64(1),)); cupy.cuda.Device().synchronize()
print("ready", flush=True)
k((1,), (1,), (cupy.uint64(int(float(sys.argv[1]) * 1e9)),)); cupy.cuda.Device().synchronize()
""",
}
GPM = {"gr_engine": 1, "sm": 2, "tensor": 5, "dram": 10}
"""NVML_GPM_METRIC_* ids: GRAPHICS_UTIL, SM_UTIL, ANY_TENSOR_UTIL, DRAM_BW_UTIL."""


class Sampler(threading.Thread):
    """Reads the counters once a second into ``samples``; every failure is recorded, never raised."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.samples: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.errors: dict[str, str] = {}
        self.gpm = False
        try:
            self.gpm = bool(pynvml.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice)
        except Exception as exc:  # noqa: BLE001 - recorded
            self.errors["gpm_support"] = repr(exc)

    def device(self) -> dict[str, Any]:
        nv, h = self.nvml, self.handle
        info: dict[str, Any] = {"gpm_supported": self.gpm}
        for name, call in (("name", lambda: nv.nvmlDeviceGetName(h)), ("uuid", lambda: nv.nvmlDeviceGetUUID(h)),
                           ("pci_bus_id", lambda: nv.nvmlDeviceGetPciInfo(h).busId),
                           ("driver", lambda: nv.nvmlSystemGetDriverVersion())):  # fmt: skip
            try:
                value = call()
                info[name] = value.decode() if isinstance(value, bytes) else value
            except Exception as exc:  # noqa: BLE001
                info[name] = f"error: {exc!r}"
        return info

    def _read(self, previous: Any, current: Any) -> dict[str, Any]:
        nv, h = self.nvml, self.handle
        out: dict[str, Any] = {"t": time.time()}
        reads = {
            "gpu_util": lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu,
            "power_w": lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "energy_mj": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
        }
        for name, call in reads.items():
            try:
                out[name] = call()
            except Exception as exc:  # noqa: BLE001
                self.errors.setdefault(name, repr(exc))
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
            out.update(fb_used_mib=mem.used / 2**20, fb_free_mib=mem.free / 2**20, fb_reserved_mib=mem.reserved / 2**20)
        except Exception as exc:  # noqa: BLE001
            self.errors.setdefault("memory_v2", repr(exc))
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                out.update(fb_used_mib=mem.used / 2**20, fb_free_mib=mem.free / 2**20)
            except Exception as exc2:  # noqa: BLE001
                self.errors.setdefault("memory", repr(exc2))
        if previous is not None and current is not None:
            try:
                mg = nv.c_nvmlGpmMetricsGet_t()
                mg.version = nv.NVML_GPM_METRICS_GET_VERSION
                mg.numMetrics = len(GPM)
                mg.sample1, mg.sample2 = previous, current
                for i, metric in enumerate(GPM.values()):
                    mg.metrics[i].metricId = metric
                nv.nvmlGpmMetricsGet(mg)
                out["gpm"] = {name: mg.metrics[i].value for i, name in enumerate(GPM)}
            except Exception as exc:  # noqa: BLE001
                self.errors.setdefault("gpm", repr(exc))
        return out

    def run(self) -> None:
        nv = self.nvml
        samples = [None, None]
        if self.gpm:
            try:
                samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
                nv.nvmlGpmSampleGet(self.handle, samples[0])
            except Exception as exc:  # noqa: BLE001
                self.errors.setdefault("gpm_sample", repr(exc))
                samples = [None, None]
        while not self.stop.wait(1.0):
            previous, current = samples
            if current is not None:
                try:
                    nv.nvmlGpmSampleGet(self.handle, current)
                except Exception as exc:  # noqa: BLE001
                    self.errors.setdefault("gpm_sample", repr(exc))
                    previous = current = None
            self.samples.append(self._read(previous, current))
            if current is not None:
                samples = [current, previous]


def run_phase(name: str, code: str, seconds: float) -> tuple[str, float, float]:
    """Run one workload in its own process: (its name, or ``NAME-failed``, when it was ready, when it ended)."""
    proc = subprocess.Popen([sys.executable, "-c", code, str(seconds)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    ready = proc.stdout.readline().strip() == "ready"
    start = time.time()
    _, err = proc.communicate(timeout=seconds + 120)
    if err.strip():
        print(f"{name}: {err.strip()[-2000:]}", file=sys.stderr)
    time.sleep(2.0)  # let the counters settle between phases (those samples are "between")
    return (name if ready and proc.returncode == 0 else f"{name}-failed", start, time.time())


def main(out_path: str, seconds: float = 12.0) -> int:
    sampler = Sampler()
    sampler.start()
    phases: list[tuple[str, float, float]] = []
    plan = [("idle", None), ("matmul", "matmul"), ("copy", "copy"), ("spin", "spin"), ("idle", None)]
    for phase, workload in plan:
        if workload is None:
            start = time.time()
            time.sleep(seconds * 0.75)
            phases.append((phase, start, time.time()))
            continue
        phases.append(run_phase(phase, WORKLOADS[workload], seconds))
    sampler.stop.set()
    sampler.join()
    with open(out_path, "w") as out:
        out.write(json.dumps({"device": sampler.device(), "errors": sampler.errors,
                              "phases": phases}) + "\n")  # fmt: skip
        for sample in sampler.samples:
            # A sample's readings cover the second before it: it belongs to a phase only
            # when that whole second lies inside the phase.
            name = next((p for p, lo, hi in phases if lo + 1.0 <= sample["t"] <= hi), "between")
            out.write(json.dumps({"phase": name, **sample}) + "\n")
    print(json.dumps({"device": sampler.device(), "errors": sampler.errors, "samples": len(sampler.samples)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "nvml_phases.jsonl"))
