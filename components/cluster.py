"""Wire the whole cluster from a validated spec: nodes, pools, gateway, monitoring."""
from __future__ import annotations

import pulumi

from components.spec import StackSpec


def deploy(spec: StackSpec) -> dict[str, pulumi.Output | object]:
    """Register every component of the stack; return the stack outputs to export."""
    outputs: dict[str, pulumi.Output | object] = {}
    # Components are added here as they land: GpuNode, RayCluster, ModelServer, Gateway, Monitoring.
    return outputs
