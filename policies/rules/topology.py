"""Rule 7: parallel layout (TP within a node, TP×PP = GPUs spanned, PP only across nodes, heads ÷ TP) and
the network of multi-node containers (host network, NCCL variables in every one). The layout checks are each
engine's own (`LaunchRule`s of topic "topology")."""

from __future__ import annotations

from typing import Any

from pulumi_policy import EnforcementLevel, PolicyConfigSchema

from components.engines.containers import env_of, labels
from policies.rules.common import (
    CONTAINER,
    LINK_LAYER_LABEL,
    is_ray_container,
    launch_policies,
)
from policies.rules.grouped import Subject, pool_rule

NETWORK_CONFIG = PolicyConfigSchema(
    properties={
        "linkLayer": {
            "type": "string",
            "enum": ["ethernet", "infiniband"],
            "default": "ethernet",
            "description": f"RDMA link layer when a container has no {LINK_LAYER_LABEL} label: ethernet (RoCE) "
            "needs NCCL_IB_GID_INDEX.",
        }
    }
)


def network_found(resource: Subject, config: dict[str, Any]) -> list[str]:
    """Every Ray container: host network, NCCL socket interface, HCA and (RoCE) GID index in its own env."""
    if resource.resource_type != CONTAINER or not is_ray_container(resource.props):
        return []
    props = resource.props
    out = []
    if props.get("networkMode") != "host":
        out.append(
            f"networkMode is {props.get('networkMode') or 'bridge (unset)'}: Ray and NCCL need the node's "
            'own addresses and high ports (VLLM_HOST_IP, RDMA). Set network_mode="host".'
        )
    env = env_of(props.get("envs"))
    link = labels(props).get(LINK_LAYER_LABEL) or config["linkLayer"]
    needed = ["NCCL_SOCKET_IFNAME"]
    if env.get("NCCL_IB_DISABLE") != "1":
        needed.append("NCCL_IB_HCA")
        if link == "ethernet":
            needed.append("NCCL_IB_GID_INDEX")
    missing = [n for n in needed if not env.get(n)]
    if missing:
        out.append(
            f"{', '.join(missing)} not set in the container's env: Ray's executor passes only vLLM's own "
            "variables to workers, so each container needs the NCCL ones itself, or NCCL falls back to "
            "the wrong interface or TCP (RoCE needs the GID index, usually 3). Set them from the node's "
            "hca and interface."
        )
    return out


POLICIES = [
    *launch_policies("topology"),
    pool_rule(
        "multi-node-network",
        "Containers of a multi-node instance run on the host network with the NCCL variables set.",
        network_found,
        config=NETWORK_CONFIG,
        level=EnforcementLevel.MANDATORY,
    ),
]
