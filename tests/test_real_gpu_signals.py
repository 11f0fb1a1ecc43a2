"""The GPU detectors on readings of a real GPU, not ones we made up.

``tests/data/h200_nvml_phases.jsonl`` was taken on an NVIDIA H200 by ``bench/nvml_signals.py``:
once a second, the counters dcgm-exporter reads (NVML for utilisation, memory, power and
energy; NVML's GPU performance monitoring for the profiling ratios, the hardware counters
DCGM's profiling module reads) while the GPU idled, multiplied bf16 matrices, copied memory,
and ran one thread of one block spinning on the clock (a kernel resident with nothing to do,
as a rank hung in a collective). Each reading is rendered here as dcgm-exporter renders it
(its template, ``../shared/reference/dcgm-exporter/NOTES.md``), parsed and mapped by the
bridge, decoded by the contract, and run through the rules as shipped. A phase lasted about
12 s; the detectors need tens of minutes, so a phase's real readings are replayed in turn,
one scrape every 30 s (dcgm-exporter's default interval), for 40 minutes.

What the capture showed, and these tests hold the detectors to: the spinning kernel reads
100 % on DCGM_FI_DEV_GPU_UTIL *and* on GR_ENGINE_ACTIVE, so neither tells hung from busy;
SM_ACTIVE (off in dcgm-exporter's defaults) reads 0.76 %, tensor 0, DRAM as idle, power 17 %
of the matmul's; the copy reads tensor 0 too but DRAM 85 %.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from detector.engine import Engine
from detector.events import TOPIC_GPU_METRICS, EventDecoder
from detector.ingest.dcgm import DcgmMapper
from detector.ingest.prometheus import parse_exposition
from tests.exposition import Gpu, dcgm_text
from tests.helpers import T0, usage

CAPTURE = Path(__file__).parent / "data" / "h200_nvml_phases.jsonl"
HOST = "host-1"
PROFILING = {"gr_engine": "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "sm": "DCGM_FI_PROF_SM_ACTIVE",
             "tensor": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "dram": "DCGM_FI_PROF_DRAM_ACTIVE"}  # fmt: skip
STOCK = ("gr_engine", "tensor", "dram")
"""The profiling ratios dcgm-exporter's default counters export (SM_ACTIVE is commented out)."""


def _capture() -> tuple[dict, dict[str, list[dict]]]:
    lines = [json.loads(line) for line in CAPTURE.read_text().splitlines()]
    phases: dict[str, list[dict]] = {}
    for sample in lines[1:]:
        phases.setdefault(sample["phase"], []).append(sample)
    return lines[0]["device"], phases


DEVICE, PHASES = _capture()


def render(reading: dict, profiling: tuple[str, ...], energy: bool = False) -> str:
    """One scrape of dcgm-exporter as it prints it (``tests/exposition.py``), with the H200's own labels."""
    values = {"DCGM_FI_DEV_GPU_UTIL": reading["gpu_util"], "DCGM_FI_DEV_FB_USED": round(reading["fb_used_mib"]),
              "DCGM_FI_DEV_FB_FREE": round(reading["fb_free_mib"]),
              "DCGM_FI_DEV_FB_RESERVED": round(reading["fb_reserved_mib"])}  # fmt: skip
    if energy:
        values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] = reading["energy_mj"]
    else:
        values["DCGM_FI_DEV_POWER_USAGE"] = reading["power_w"]
    values |= {PROFILING[name]: reading["gpm"][name] / 100 for name in profiling}  # GPM: 0-100
    gpu = Gpu(0, values, host=HOST, model=DEVICE["name"], uuid=DEVICE["uuid"], pci_bus_id=DEVICE["pci_bus_id"])
    return dcgm_text([gpu])


def events_of(phase_plan: list[tuple[str, float]], profiling: tuple[str, ...]) -> list:
    """Each (phase, minutes) in turn: the phase's real readings, one scrape every 30 s, a
    usage event every minute (the host billed at $32/h)."""
    mapper, decoder = DcgmMapper(), EventDecoder(clock=lambda: T0)
    events: list = []
    t = T0
    for phase, minutes in phase_plan:
        readings = PHASES[phase]
        for i in range(int(minutes * 2)):
            if i % 2 == 0:
                events.append(usage(t, HOST))
            samples = parse_exposition(render(readings[i % len(readings)], profiling), "h200:9400")
            [batch] = mapper.map(samples, t=t, instance="h200:9400")
            events += decoder.decode(TOPIC_GPU_METRICS, msgspec.json.encode(batch.events))
            t += 30
    return events


def alerts(ruleset, events) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for f in Engine(ruleset).process(events):
        if f.type in ("idle_gpu", "stuck_gpu") and f.action != "update":
            found.setdefault(f.type, []).append(f.action)
    return found


def test_the_capture_holds_every_phase():
    assert DEVICE["gpm_supported"] and DEVICE["name"] == "NVIDIA H200"
    assert {p: len(s) >= 8 for p, s in PHASES.items() if p != "between"} == {
        "idle": True, "matmul": True, "copy": True, "spin": True}  # fmt: skip


@pytest.mark.parametrize("profiling", [STOCK, (*STOCK, "sm"), ()], ids=["stock-dcgm-exporter", "with-sm-active", "no-profiling"])
@pytest.mark.parametrize(
    "plan, expected",
    [
        # Nothing running for 40 min: idle, not stuck.
        ([("idle", 40)], {"idle_gpu": ["fire"]}),
        # Training (tensor cores) and a memory-bound copy: work, whatever the signals.
        ([("matmul", 40)], {}),
        ([("matmul", 5), ("copy", 40)], {}),
        # A kernel spinning for 40 min after real work: stuck (util 100 %), never idle.
        ([("matmul", 5), ("spin", 40)], {"stuck_gpu": ["fire"]}),
        # The hung job killed: the stuck episode resolves and the GPU idles.
        ([("matmul", 5), ("spin", 30), ("idle", 40)], {"stuck_gpu": ["fire", "resolve"], "idle_gpu": ["fire"]}),
    ],
    ids=["idle", "matmul", "copy", "spin", "spin-then-killed"],
)
def test_real_readings_through_the_bridge_and_the_rules(ruleset, plan, expected, profiling):
    assert alerts(ruleset, events_of(plan, profiling)) == expected


def test_average_power_from_the_energy_counter_matches_the_power_reading():
    """The bridge's fallback when POWER_USAGE is not exported: the energy counter's rise
    between two real scrapes, over the time between them."""
    for phase in ("idle", "matmul", "spin"):
        readings = PHASES[phase]
        gaps = [i + 1 for i in range(len(readings) - 1) if readings[i + 1]["t"] - readings[i]["t"] > 1.5]
        readings = readings[: gaps[0]] if gaps else readings  # one uninterrupted run of readings
        mapper, powers = DcgmMapper(), []
        for reading in readings:
            [batch] = mapper.map(parse_exposition(render(reading, (), energy=True), "h200:9400"),
                                 t=reading["t"], instance="h200:9400")  # fmt: skip
            powers += [batch.events[0]["power_w"]] if "power_w" in batch.events[0] else []
        measured = sum(r["power_w"] for r in readings[1:]) / (len(readings) - 1)
        assert len(powers) >= len(readings) - 2
        assert sum(powers) / len(powers) == pytest.approx(measured, rel=0.05), phase
