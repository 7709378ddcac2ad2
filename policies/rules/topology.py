"""Rule 7: parallel layout (TP within a node, TP×PP = GPUs spanned, PP only across nodes, heads ÷ TP) and
the network of multi-node containers (host network, NCCL variables in every one)."""
from __future__ import annotations

from typing import Any

from pulumi_policy import EnforcementLevel, PolicyConfigSchema

from components.engines.vllm.launch import Launch
from policies.rules.common import (
    CONTAINER,
    LINK_LAYER_LABEL,
    env_of,
    is_ray_container,
    labels,
    launch_policy,
    number,
)
from policies.rules.grouped import Subject, pool_rule
from policies.rules.hardware import model_arch_or_none


def check_parallelism(launch: Launch, config: dict[str, Any]) -> list[str]:
    """TP and PP against the instance's nodes and GPUs, and the model's attention heads."""
    tp = number(launch.args.get("tensor_parallel_size")) or number(launch.props.get("tensorParallel")) or 1
    pp = number(launch.args.get("pipeline_parallel_size")) or number(launch.props.get("pipelineParallel")) or 1
    per_node, nodes = launch.gpus_per_node, len(launch.nodes) or 1
    out = []
    tp_too_wide = per_node is not None and tp > per_node
    if tp_too_wide:
        out.append(f"--tensor-parallel-size {tp} is more than the {per_node} GPUs of one node: tensor parallelism "
                   "all-reduces every layer and must stay inside a node (NVLink/PCIe). Use --tensor-parallel-size "
                   f"{per_node} --pipeline-parallel-size {max(1, tp * pp // per_node)} across "
                   f"{max(1, tp * pp // per_node)} nodes.")
    elif per_node is not None and nodes > 1 and tp * pp != per_node * nodes:
        out.append(f"tensor {tp} x pipeline {pp} = {tp * pp} GPUs, but the instance spans {nodes} nodes x "
                   f"{per_node} GPUs = {per_node * nodes}: Ray would leave GPUs idle or not find enough. Use "
                   f"--tensor-parallel-size {per_node} --pipeline-parallel-size {nodes}.")
    elif per_node is not None and nodes == 1 and tp * pp > per_node:
        out.append(f"tensor {tp} x pipeline {pp} = {tp * pp} GPUs, more than the {per_node} of the node.")
    # A too-wide TP's message already gives the whole layout.
    if not tp_too_wide and pp > 1 and nodes == 1:
        out.append(f"--pipeline-parallel-size {pp} inside one node: pipeline stages belong across nodes "
                   f"(only activations cross the network). Use --tensor-parallel-size {tp * pp} instead.")
    elif not tp_too_wide and nodes > 1 and pp != nodes:
        out.append(f"--pipeline-parallel-size {pp} on an instance of {nodes} nodes: pipeline parallelism is what "
                   f"crosses nodes, one stage per node. Use --pipeline-parallel-size {nodes}.")
    arch = model_arch_or_none(launch.arch)
    heads = getattr(arch, "num_attention_heads", None)
    if heads and tp and heads % tp:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0 and (per_node is None or d <= per_node)]
        out.append(f"--tensor-parallel-size {tp}: {launch.arch} has {heads} attention heads, not divisible by {tp} "
                   f"(vLLM: \"Total number of attention heads ({heads}) must be divisible by tensor parallel size "
                   f"({tp}).\"). Use one of: {', '.join(map(str, divisors))}.")
    return out


NETWORK_CONFIG = PolicyConfigSchema(properties={"linkLayer": {
    "type": "string", "enum": ["ethernet", "infiniband"], "default": "ethernet",
    "description": f"RDMA link layer when a container has no {LINK_LAYER_LABEL} label: ethernet (RoCE) "
                   "needs NCCL_IB_GID_INDEX."}})


def network_found(resource: Subject, config: dict[str, Any]) -> list[str]:
    """Every Ray container: host network, NCCL socket interface, HCA and (RoCE) GID index in its own env."""
    if resource.resource_type != CONTAINER or not is_ray_container(resource.props):
        return []
    props = resource.props
    out = []
    if props.get("networkMode") != "host":
        out.append(f"networkMode is {props.get('networkMode') or 'bridge (unset)'}: Ray and NCCL need the node's "
                   "own addresses and high ports (VLLM_HOST_IP, RDMA). Set network_mode=\"host\".")
    env = env_of(props.get("envs"))
    link = labels(props).get(LINK_LAYER_LABEL) or config["linkLayer"]
    needed = ["NCCL_SOCKET_IFNAME"]
    if env.get("NCCL_IB_DISABLE") != "1":
        needed.append("NCCL_IB_HCA")
        if link == "ethernet":
            needed.append("NCCL_IB_GID_INDEX")
    missing = [n for n in needed if not env.get(n)]
    if missing:
        out.append(f"{', '.join(missing)} not set in the container's env: Ray's executor passes only vLLM's own "
                   "variables to workers, so each container needs the NCCL ones itself, or NCCL falls back to "
                   "the wrong interface or TCP (RoCE needs the GID index, usually 3). Set them from the node's "
                   "hca and interface.")
    return out


POLICIES = [
    launch_policy("parallelism",
                  "Tensor parallelism stays inside a node, pipeline parallelism spans nodes, TP x PP fills the "
                  "instance's GPUs and divides the attention heads.", check_parallelism, needs_gpu=False),
    pool_rule("multi-node-network",
              "Containers of a multi-node instance run on the host network with the NCCL variables set.",
              network_found, config=NETWORK_CONFIG, level=EnforcementLevel.MANDATORY),
]
