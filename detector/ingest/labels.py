"""Label look-ups shared by the mappers: the spellings exporters and Prometheus use.

Prometheus renames a sample's label that collides with a target label it attaches
itself (``pod``, ``namespace``, ``container``, ``instance``, ``job`` under the usual
Kubernetes service discovery) to ``exported_<name>``. Where both are present, the
``exported_`` one is the exporter's own (the GPU's pod) and the plain one the
scraped exporter's (dcgm-exporter's own pod): the exported one wins.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["label"]


def label(labels: Mapping[str, str], *names: str) -> str:
    """The first non-empty label among ``names``, each tried as ``exported_<name>`` first."""
    for name in names:
        value = labels.get(f"exported_{name}") or labels.get(name)
        if value:
            return value
    return ""
