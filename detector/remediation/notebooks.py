"""``cull_notebook``: stop a notebook through whichever system runs it.

A Kubeflow notebook (its pod's ``notebook-name`` label or ``Notebook`` controller) is
stopped by :mod:`.kubeflow`'s annotation; a JupyterHub user's server (its pod's
``hub.jupyter.org/username`` label, or the configured tag) by :mod:`.jupyterhub`'s REST
call. One executor for the action kind, so a rule says ``cull_notebook`` without knowing
which.
"""

from __future__ import annotations

from typing import ClassVar

from detector.remediation.base import ActionKind, Call, NotApplicable, Outcome, Target
from detector.remediation.jupyterhub import JupyterHubCuller
from detector.remediation.kubeflow import KubeflowCuller

__all__ = ["CullNotebook"]


class CullNotebook:
    """Dispatches to the Kubeflow or the JupyterHub culler (either may be absent: not configured)."""

    kind: ClassVar[ActionKind] = "cull_notebook"

    def __init__(self, kubeflow: KubeflowCuller | None = None, jupyterhub: JupyterHubCuller | None = None) -> None:
        self.kubeflow = kubeflow
        self.jupyterhub = jupyterhub

    def plan(self, target: Target) -> Call:
        if self.kubeflow is not None and self.kubeflow.applies(target):
            return self.kubeflow.plan(target)
        if self.jupyterhub is not None and self.jupyterhub.applies(target):
            return self.jupyterhub.plan(target)
        known = [name for name, ex in (("Kubeflow", self.kubeflow), ("JupyterHub", self.jupyterhub)) if ex is not None]
        if not known:
            raise NotApplicable("no notebook system is configured (Kubeflow or JupyterHub)")
        raise NotApplicable(f"the alert names no {' or '.join(known)} notebook")

    def execute(self, call: Call) -> Outcome:
        if call.api.startswith("kubeflow.org/") and self.kubeflow is not None:
            return self.kubeflow.execute(call)
        if call.api.startswith("jupyterhub.") and self.jupyterhub is not None:
            return self.jupyterhub.execute(call)
        return Outcome(ok=False, detail=f"refused: no executor configured for {call.api!r}")

    def observe(self, call: Call) -> Outcome | None:
        """Kubeflow's look-up (:meth:`KubeflowCuller.observe`); None for a JupyterHub call (the hub's token may
        not read servers: the runner reports the action for a person) or one no culler here makes."""
        if call.api.startswith("kubeflow.org/") and self.kubeflow is not None:
            return self.kubeflow.observe(call)
        return None
