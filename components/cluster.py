"""Wire the whole cluster from a validated spec: nodes, pools, gateway, monitoring."""
from __future__ import annotations

from typing import Any

from components.gpu_node import GpuNode, GpuNodeArgs
from components.planning.topology import images_for_node
from components.spec import StackSpec


def deploy(spec: StackSpec) -> dict[str, Any]:
    """Register every component of the stack; return the stack outputs to export."""
    outputs: dict[str, Any] = {}
    nodes = {n: GpuNode(n, GpuNodeArgs(spec, n, images_for_node(spec, n))) for n in spec.nodes}

    # --- model weights and pools (issue 3) ---

    # --- gateway (issue 6) ---

    # --- monitoring (issue 7) ---

    return outputs
