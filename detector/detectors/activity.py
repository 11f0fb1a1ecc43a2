"""What a GPU sample says about work: the activity signals the GPU detectors read, and in
which order they prefer them.

dcgm-exporter's default counters carry ``DCGM_FI_DEV_GPU_UTIL`` (``util_pct``) and the
profiling ratios ``GR_ENGINE_ACTIVE``, ``PIPE_TENSOR_ACTIVE`` and ``DRAM_ACTIVE``;
``SM_ACTIVE`` (``sm_active``) is commented out there, so a stock install never sends it.
Under MIG, ``util_pct`` is not supported at all and the profiling ratios are what there is.
Each detector therefore reads whichever signals a sample carries:

**Busy (``idle_gpu``, ``partly_idle_gpu``, ``unallocated_gpu``): any signal, busy wins.** A GPU
is busy when ``util_pct``, or any present ratio × 100 (``gr_engine_active``, ``sm_active``,
``tensor_active``, ``dram_active``), reaches the threshold. The order does not matter
because any one suffices: a missing ratio proves nothing, and telling someone to stop a
GPU that works is the costly mistake. Tensor and DRAM activity count too: tensor pipes sit
in the SMs (``tensor_active`` ≤ ``sm_active`` ≤ ``gr_engine_active``), so they can only
agree with the others; DRAM activity without any kernel resident is the copy engines
moving data (a checkpoint load, a cache served over NVLink), which is work, not idling. An
idle GPU reads 0 on all of them.

**Stuck (``stuck_gpu``): a kernel resident, nothing moving.** "Resident" is ``util_pct`` or
``gr_engine_active`` × 100 at or above ``util_above``; a hung kernel keeps both near 100 %,
so neither tells stuck from busy. What tells them apart, in order of preference:

1. ``tensor_active`` at or above ``tensor_below``: working (tensor pipes only run real math;
   below it proves nothing, an FP32 job never uses them);
2. ``dram_active``: under ``dram_below`` nothing moves through memory, so stuck, unless
   ``sm_active`` (when exported) is at or above ``sm_working`` (most SMs computing out of
   cache). Every training or inference step streams weights and activations through HBM,
   while a hung collective polls its flags from L2;
3. else ``sm_active`` under ``sm_below`` (no DRAM reading: few SMs hold a warp);
4. else power under ``power_below`` of the most this GPU has drawn.

Measured on an H200 (``tests/data/h200_nvml_phases.jsonl``, ``h200_stuck_edges.jsonl``):
bf16 matmul reads DRAM 17 %, SM 95 %; a memory copy DRAM 87 %; idle and every spinning or
polling kernel DRAM 0.0004 %. One spinning thread reads SM 0.8 %, but 32 blocks polling a
flag, as a collective's channels do, read SM 24 % (32 of 132 SMs): ``sm_active`` under 5 %
alone misses such a hang, which is why DRAM, in dcgm-exporter's default counters, comes
first.
"""

from __future__ import annotations

from detector.events import GpuMetric

__all__ = ["busy", "busy_flags", "resident", "resident_shares", "stuck_evidence"]


def busy(ev: GpuMetric, threshold_pct: float) -> bool:
    """Whether the sample shows work: ``util_pct`` or any present ratio × 100 reaches the threshold."""
    if ev.util_pct >= threshold_pct:
        return True
    ratio = threshold_pct / 100
    for value in (ev.gr_engine_active, ev.sm_active, ev.tensor_active, ev.dram_active):
        if value is not None and value >= ratio:
            return True
    return False


def resident(ev: GpuMetric) -> float:
    """The share of time (percent) a kernel was resident: ``util_pct``, or ``gr_engine_active``
    when higher (``util_pct`` reads 0 under MIG, where it is unsupported)."""
    gr = ev.gr_engine_active
    return max(ev.util_pct, gr * 100) if gr is not None else ev.util_pct


def busy_flags(samples: list[GpuMetric], threshold_pct: float) -> tuple[bool, ...]:
    """:func:`busy` of each sample, in one comprehension: no call a sample (every GPU rule asks it of
    every scrape of every host; the same comparisons, in the same order)."""
    ratio = threshold_pct / 100
    return tuple([ev.util_pct >= threshold_pct
                  or (ev.gr_engine_active is not None and ev.gr_engine_active >= ratio)
                  or (ev.sm_active is not None and ev.sm_active >= ratio)
                  or (ev.tensor_active is not None and ev.tensor_active >= ratio)
                  or (ev.dram_active is not None and ev.dram_active >= ratio)
                  for ev in samples])  # fmt: skip


def resident_shares(samples: list[GpuMetric]) -> tuple[float, ...]:
    """:func:`resident` of each sample, in one comprehension (as :func:`busy_flags`)."""
    return tuple([ev.util_pct if ev.gr_engine_active is None else max(ev.util_pct, ev.gr_engine_active * 100)
                  for ev in samples])  # fmt: skip


def stuck_evidence(ev: GpuMetric, *, tensor_below: float, dram_below: float, sm_working: float,
                   sm_below: float) -> bool | None:  # fmt: skip
    """For a sample whose GPU has a kernel resident: True if the profiling ratios say nothing runs,
    False if they say it works, None if the sample carries none that can tell (power decides).
    Thresholds in percent; the order is the module docstring's."""
    if ev.tensor_active is not None and ev.tensor_active * 100 >= tensor_below:
        return False
    if ev.dram_active is not None:
        if ev.dram_active * 100 >= dram_below:
            return False
        return ev.sm_active is None or ev.sm_active * 100 < sm_working
    if ev.sm_active is not None:
        return ev.sm_active * 100 < sm_below
    return None
