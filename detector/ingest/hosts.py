"""Which resource a host is: the same ``resource_id`` billing uses.

A GPU host's samples and its billing must meet on one id, or nothing is priced. In
order: a static entry in the bridge's config (explicit, so it wins), the cloud
instance id of the Kubernetes node of that name (``providerID``), the host name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from detector.ingest.kube import KubeState, Node

__all__ = ["Host", "StaticHost", "resolve_host"]


class StaticHost(BaseModel):
    """A host described in config (``hosts: {gpu-node-1: {resource_id: i-0abc, ...}}``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    resource_id: str = ""
    instance_type: str = ""
    region: str = ""
    provider: str = ""
    account: str = ""
    pricing: Literal["on_demand", "spot", "reserved"] = "on_demand"
    tags: dict[str, str] = {}


@dataclass(frozen=True)
class Host:
    """A host label resolved: its resource id, and what is known of it."""

    name: str
    resource_id: str
    node: Node | None = None
    static: StaticHost | None = None

    @property
    def instance_type(self) -> str:
        return (self.static.instance_type if self.static else "") or (self.node.instance_type if self.node else "")


def resolve_host(name: str, kube: KubeState | None, hosts: Mapping[str, StaticHost]) -> Host:
    """The resource a host label (or address) names."""
    node = kube.node(name) if kube is not None else None
    static = hosts.get(name) or (hosts.get(node.name) if node is not None else None)
    resource_id = (static.resource_id if static else "") or (node.instance_id if node else "") or name
    return Host(name=name, resource_id=resource_id, node=node, static=static)
