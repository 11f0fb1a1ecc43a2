"""Detector registry: one module per rule ``type``, registered here.

A new detector is a module beside these that keeps the contract in
:mod:`detector.detectors.base` (episodes through :mod:`detector.detectors.episode`), one
line below, and its docs in ``docs/detectors.md`` ("Writing a detector").
"""

from __future__ import annotations

from detector.detectors.anomaly import Anomaly
from detector.detectors.base import Behaviour, Context, Detector, Finding, Params, ResourceInfo
from detector.detectors.build_or_call import BuildOrCall
from detector.detectors.data_starved_training import DataStarvedTraining
from detector.detectors.egress_runaway import EgressRunaway
from detector.detectors.failed_run_spend import FailedRunSpend
from detector.detectors.idle_gpu import IdleGpu
from detector.detectors.idle_notebook import IdleNotebook
from detector.detectors.inference_overprovisioned import InferenceOverprovisioned
from detector.detectors.inference_scale_to_zero import InferenceScaleToZero
from detector.detectors.inference_unbatched import InferenceUnbatched
from detector.detectors.partly_idle_gpu import PartlyIdleGpu
from detector.detectors.plateaued_run import PlateauedRun
from detector.detectors.spot_eligible import SpotEligible
from detector.detectors.spot_without_redundancy import SpotWithoutRedundancy
from detector.detectors.storage_growth import StorageGrowth
from detector.detectors.stuck_gpu import StuckGpu
from detector.detectors.telemetry_stale import TelemetryStale
from detector.detectors.unallocated_gpu import UnallocatedGpu
from detector.detectors.untagged import Untagged
from detector.detectors.unused_commitment import UnusedCommitment
from detector.detectors.vector_db_growth import VectorDbGrowth
from detector.detectors.wrong_region import WrongRegion

__all__ = ["REGISTRY", "Behaviour", "Context", "Detector", "Finding", "Params", "ResourceInfo", "money_types"]

REGISTRY: dict[str, type[Detector]] = {
    cls.type: cls  # type: ignore[misc]
    for cls in (IdleGpu, PartlyIdleGpu, UnallocatedGpu, StuckGpu, TelemetryStale, Untagged, EgressRunaway, FailedRunSpend,
                VectorDbGrowth, StorageGrowth, InferenceOverprovisioned, SpotEligible, UnusedCommitment, Anomaly,
                InferenceScaleToZero, InferenceUnbatched, SpotWithoutRedundancy, BuildOrCall, WrongRegion,
                DataStarvedTraining, PlateauedRun, IdleNotebook)
}


def money_types() -> list[str]:
    """Alert types whose dollars are money (spent, wasted or to be saved), not a forecast."""
    return [t for t, cls in REGISTRY.items() if cls.dollars]
