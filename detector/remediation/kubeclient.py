"""Reaching a Kubernetes cluster for an action, and reading its errors as outcomes.

Credentials come from the standard chain only: the pod's service account when the worker
runs in the cluster (``KUBERNETES_SERVICE_HOST`` and the mounted token), else the
kubeconfig ``KUBECONFIG`` names (or ``~/.kube/config``), with an optional context. They
stay inside the client: nothing here logs them or puts them in a :class:`Call`.

The Kubernetes client is imported at the first call, not with the worker: it is ~0.7 CPU s of
imports (its generated API and models), and with ``kubernetes-validate`` installed ~3.6 s (its
``dynamic`` module imports that, whose JSON Schema formats compile a grammar), paid by every
start of a worker that may never act on a cluster.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import urllib3

from detector.remediation.base import Outcome

if TYPE_CHECKING:
    from kubernetes import client as k8s

__all__ = ["FIELD_MANAGER", "TIMEOUT", "KubeClient", "failure"]

TIMEOUT = (5.0, 20.0)
"""(connect, read) seconds of each request: a hung API server is a retryable failure, not a
stuck worker."""
FIELD_MANAGER = "burnwatch"
"""Who the API server records as having changed the field (``managedFields``)."""


class KubeClient:
    """An :class:`kubernetes.client.ApiClient` made on first use (so building an executor
    needs no cluster), from in-cluster config, else the kubeconfig."""

    def __init__(self, context: str | None = None, config_file: str | None = None,
                 timeout: tuple[float, float] = TIMEOUT) -> None:  # fmt: skip
        self.context = context
        self.config_file = config_file
        self.timeout = timeout
        """(connect, read) seconds of each request."""
        self._api: k8s.ApiClient | None = None

    @property
    def endpoint(self) -> str:
        """The cluster as the audit shows it (a context name, not its credentials)."""
        return f"kubernetes context {self.context}" if self.context else "kubernetes (in-cluster, else the current context)"

    def api(self) -> k8s.ApiClient:
        """The client; raises ConfigException when no credentials are found."""
        if self._api is None:
            from kubernetes import client as k8s
            from kubernetes import config as k8s_config
            from kubernetes.config.config_exception import ConfigException

            cfg = k8s.Configuration()
            try:
                k8s_config.load_incluster_config(client_configuration=cfg)
            except ConfigException:
                # KUBECONFIG read now: the client reads it once, when it is imported
                paths = self.config_file or os.environ.get("KUBECONFIG") or None
                k8s_config.load_kube_config(config_file=paths, context=self.context, client_configuration=cfg)
            cfg.retries = 0  # one attempt per call: the caller decides about retrying
            self._api = k8s.ApiClient(cfg)
        return self._api


def _message(body: object) -> str:
    """The ``message`` of a Kubernetes Status body, else the body, on one short line."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")
    try:
        status: Any = json.loads(text)
        if isinstance(status, dict) and isinstance(status.get("message"), str):
            text = status["message"]
    except ValueError:
        pass
    text = " ".join(text.split())
    return text[:300]


def failure(exc: Exception, doing: str) -> Outcome:
    """An outcome for an exception raised while ``doing`` something: throttling, server errors and
    timeouts are retryable; refusals (401, 403, 404, 409, 422...) are not."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    if isinstance(exc, ApiException):
        status = exc.status or 0
        retryable = status == 429 or status >= 500 or status == 0
        message = _message(exc.body) or str(exc.reason or "")
        return Outcome(ok=False, detail=f"{doing}: HTTP {status} {message}".rstrip(), retryable=retryable)
    if isinstance(exc, ConfigException):
        return Outcome(ok=False, detail=f"{doing}: no Kubernetes credentials ({_message(str(exc))})")
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError | TimeoutError):
        return Outcome(ok=False, detail=f"{doing}: {type(exc).__name__}: {_message(str(exc))}", retryable=True)
    return Outcome(ok=False, detail=f"{doing}: {type(exc).__name__}: {_message(str(exc))}")
