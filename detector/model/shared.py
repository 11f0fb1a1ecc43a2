"""One model for a group of workers, shared through the store.

With ``BURNWATCH_MODEL_RETRAIN_EVERY`` every worker used to retrain over the whole store: N
trainings for N workers, each reading the same history, and workers that scored alike
resources with different forests depending on when each had last trained. Now the worker
that holds partition 0 retrains when the newest publication is older than the interval
(:func:`retrain_due`, so the schedule survives partition 0 moving) and :func:`publish` es
what it trained to the store (``model_artifacts``); every worker, itself included after a
restart, :func:`take` s each group's artifact trained on the latest events into its model
folder, where the folder's reload loads it. A folder shared by the workers works too (files
are replaced whole).

A published artifact is checked as a file in the folder is (:meth:`ModelArtifact.read`), and
must be its row's group's, before it replaces anything; it replaces a file only if it was
trained on events as late as the file's (``trained_to``): a model trained by hand into one
worker's folder (``burnwatch model train``) on newer history stays until a newer one is
published.
"""

from __future__ import annotations

import base64
import binascii
import os
import tempfile
from pathlib import Path

from detector.model.features import FEATURE_SETS
from detector.model.forest import SUFFIX, ModelArtifact, ModelRefused
from detector.store.models import ModelArtifacts

__all__ = ["publish", "retrain_due", "take"]


class _NotTaken(Exception):
    """A published artifact this worker does not take, and why."""


def retrain_due(holds_partition_0: bool, published_ns: int, now_ns: int, every_s: float) -> bool:
    """Whether this worker retrains now: it holds partition 0 (one worker of the group trains)
    and nothing was published within ``every_s`` (``published_ns``: the newest publication, 0
    for none; wall clock, as the interval is)."""
    return holds_partition_0 and (published_ns <= 0 or now_ns - published_ns >= every_s * 1e9)


def publish(models: ModelArtifacts, artifacts: list[ModelArtifact], version: int) -> list[str]:
    """Publish ``artifacts`` as ``version`` (serialised from the artifacts trained, not read back
    from a folder another worker may be writing); the groups published."""
    models.publish({a.group: (a.trained_to, a.to_bytes()) for a in artifacts}, version)
    return sorted(a.group for a in artifacts)


def take(models: ModelArtifacts, model_dir: Path) -> tuple[list[str], list[str]]:
    """Write into ``model_dir`` each group's latest published artifact that differs from the
    file there and was trained on events as late as it. Returns the groups written and, for each
    published artifact not taken for being unusable, why (the others are taken all the same)."""
    written: list[str] = []
    refused: list[str] = []
    for group, (version, encoded) in sorted(models.latest().items()):
        try:
            if _take(group, encoded, model_dir):
                written.append(group)
        except _NotTaken as exc:
            refused.append(f"the store's model_artifacts ({group!r}, version {version}): {exc}")
    return written, refused


def _take(group: str, encoded: str, model_dir: Path) -> bool:
    if group not in FEATURE_SETS:
        raise _NotTaken("not a model group of this burnwatch: not taken")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _NotTaken(f"not base64 ({exc}): not taken") from None
    path = model_dir / f"{group}{SUFFIX}"
    if path.exists() and path.read_bytes() == data:
        return False
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=model_dir, prefix=f".{group}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    except OSError as exc:
        raise _NotTaken(f"cannot write into {model_dir} ({exc.strerror or exc}): not taken") from None
    tmp = Path(name)
    try:
        artifact = ModelArtifact.read(tmp)
        if artifact.group != group:
            raise _NotTaken(f"holds the model of group {artifact.group!r}: not taken")
        here = _trained_to(path)
        if here is not None and here > artifact.trained_to:
            return False  # the folder's was trained on later events
        artifact.save(model_dir, data)
        return True
    except ModelRefused as exc:
        raise _NotTaken(str(exc).replace(str(tmp), "the artifact", 1)) from None
    finally:
        tmp.unlink(missing_ok=True)


def _trained_to(path: Path) -> float | None:
    """When the training of the artifact file at ``path`` ended; None: no file, or none that loads."""
    if not path.exists():
        return None
    try:
        return ModelArtifact.read(path).trained_to
    except ModelRefused:
        return None
