"""One model for a group of workers, shared through the store.

With ``BURNWATCH_MODEL_RETRAIN_EVERY`` every worker used to retrain over the whole store: N
trainings for N workers, each reading the same history, and workers that scored alike
resources with different forests depending on when each had last trained. Now the worker
that holds partition 0 retrains and :func:`publish` es what it wrote to the store
(``model_artifacts``); every worker, itself included after a restart, :func:`take` s each
group's newest published artifact into its model folder, where the folder's reload loads it.
A folder shared by the workers works as before (the files are replaced whole).

An artifact from the store is checked as a file in the folder is (:meth:`ModelArtifact.read`)
before it replaces anything, and it replaces a file only if it was trained on later events
(``trained_to``): a model trained by hand into one worker's folder (``burnwatch model train``)
on newer history stays until a newer one is published.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from detector.model.forest import SUFFIX, ModelArtifact, ModelRefused
from detector.store.models import ModelArtifacts

__all__ = ["publish", "take"]

_GROUP = re.compile(r"[a-z0-9_]{1,64}")
"""What a group's name may be, as a file name: a published name outside it is refused."""


def publish(models: ModelArtifacts, model_dir: Path, artifacts: list[ModelArtifact], version: int) -> list[str]:
    """Publish the files just written in ``model_dir`` for ``artifacts`` as ``version``; the
    groups published."""
    files = {a.group: (a.trained_to, (model_dir / f"{a.group}{SUFFIX}").read_bytes()) for a in artifacts}
    models.publish(files, version)
    return sorted(files)


def take(models: ModelArtifacts, model_dir: Path) -> tuple[list[str], list[str]]:
    """Write into ``model_dir`` each group's newest published artifact that was trained on later
    events than the file there (or has none there). Returns the groups written and, for each
    published artifact not taken because it is not a model this burnwatch loads, why."""
    written: list[str] = []
    refused: list[str] = []
    for group, (version, trained_to, data) in sorted(models.latest().items()):
        where = f"the store's model_artifacts ({group!r}, version {version})"
        if not _GROUP.fullmatch(group):
            refused.append(f"{where}: not a model group's name: not taken")
            continue
        path = model_dir / f"{group}{SUFFIX}"
        here = _trained_to(path)
        if here is not None and here >= trained_to:
            continue
        model_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.taken.tmp")
        tmp.write_bytes(data)
        try:
            artifact = ModelArtifact.read(tmp)
        except ModelRefused as exc:
            tmp.unlink()
            refused.append(f"{where}: {str(exc).replace(str(tmp), 'the artifact', 1)}")
            continue
        tmp.replace(path)  # a reader sees the old file or the new one, never half of one
        (model_dir / f"{group}.json").write_text(json.dumps(artifact.meta(), indent=2) + "\n")
        written.append(group)
    return written, refused


def _trained_to(path: Path) -> float | None:
    """When the training of the artifact file at ``path`` ended; None: no file, or none that loads."""
    if not path.exists():
        return None
    try:
        return ModelArtifact.read(path).trained_to
    except ModelRefused:
        return None
