"""Which executor carries out each kind of action.

:func:`executors` builds the registry the worker uses: ``stop_instance`` goes to
:class:`~detector.remediation.instances.StopInstances`, which sends each VM to EC2's
:class:`~detector.remediation.ec2.StopInstance`, Compute Engine's or Azure's executor
(those two only where their extra is installed); ``cull_notebook`` to Kubeflow's or
JupyterHub's culler (:class:`~detector.remediation.notebooks.CullNotebook`);
``scale_to_zero`` to a Deployment or InferenceService
(:class:`~detector.remediation.kubernetes.ScaleToZero`). A kind with no executor is recorded as not
applicable when an incident is due, never silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from detector.remediation.base import Executor

__all__ = ["executors"]


def executors(settings: Any = None) -> Mapping[str, Executor]:
    """Kind → executor, each taking its credentials from the environment or its standard chain
    (``settings``: the worker's :class:`~detector.settings.Settings`, for endpoints). Building
    them calls nothing: a cloud or cluster is reached at the first plan or call that needs it."""
    from detector.remediation.azure import DeallocateAzureVm
    from detector.remediation.ec2 import StopInstance
    from detector.remediation.gce import StopGceInstance
    from detector.remediation.instances import StopInstances
    from detector.remediation.jupyterhub import JupyterHubCuller
    from detector.remediation.kubeflow import KubeflowCuller
    from detector.remediation.kubernetes import ScaleToZero
    from detector.remediation.notebooks import CullNotebook

    return {
        "stop_instance": StopInstances(
            ec2=StopInstance(),
            gce=StopGceInstance() if StopGceInstance.available() else None,
            azure=DeallocateAzureVm() if DeallocateAzureVm.available() else None,
        ),
        "cull_notebook": CullNotebook(kubeflow=KubeflowCuller(), jupyterhub=JupyterHubCuller()),
        "scale_to_zero": ScaleToZero(),
    }
