"""Rule 7, its vLLM part: parallel layout (TP within a node, TP×PP = GPUs spanned, PP only across nodes,
heads ÷ TP) of a vLLM launch."""

from __future__ import annotations

from typing import Any

from components.engines.containers import container_argv
from components.engines.judged import number
from components.engines.vllm.facts import known_images
from components.engines.vllm.launch import Launch, server_tokens
from components.engines.vllm.options import canonical_flag
from components.engines.vllm.rules.hardware import image_key, model_arch_or_none

# The flags only vLLM's own multi-node launcher takes (--headless alone is also data parallel's, since 0.9).
LAUNCHER_FLAGS = ("--nnodes", "--node-rank", "--master-addr", "--master-port")


def check_parallelism(launch: Launch, config: dict[str, Any]) -> list[str]:
    """TP and PP against the instance's nodes and GPUs, and the model's attention heads."""
    tp = number(launch.args.get("tensor_parallel_size")) or number(launch.props.get("tensorParallel")) or 1
    pp = number(launch.args.get("pipeline_parallel_size")) or number(launch.props.get("pipelineParallel")) or 1
    per_node, nodes = launch.gpus_per_node, len(launch.nodes) or 1
    out = []
    tp_too_wide = per_node is not None and tp > per_node
    if tp_too_wide:
        out.append(
            f"--tensor-parallel-size {tp} is more than the {per_node} GPUs of one node: tensor parallelism "
            "all-reduces every layer and must stay inside a node (NVLink/PCIe). Use --tensor-parallel-size "
            f"{per_node} --pipeline-parallel-size {max(1, tp * pp // per_node)} across "
            f"{max(1, tp * pp // per_node)} nodes."
        )
    elif per_node is not None and nodes > 1 and tp * pp != per_node * nodes:
        out.append(
            f"tensor {tp} x pipeline {pp} = {tp * pp} GPUs, but the instance spans {nodes} nodes x "
            f"{per_node} GPUs = {per_node * nodes}: Ray would leave GPUs idle or not find enough. Use "
            f"--tensor-parallel-size {per_node} --pipeline-parallel-size {nodes}."
        )
    elif per_node is not None and nodes == 1 and tp * pp > per_node:
        out.append(f"tensor {tp} x pipeline {pp} = {tp * pp} GPUs, more than the {per_node} of the node.")
    # A too-wide TP's message already gives the whole layout.
    if not tp_too_wide and pp > 1 and nodes == 1:
        out.append(
            f"--pipeline-parallel-size {pp} inside one node: pipeline stages belong across nodes "
            f"(only activations cross the network). Use --tensor-parallel-size {tp * pp} instead."
        )
    elif not tp_too_wide and nodes > 1 and pp != nodes:
        out.append(
            f"--pipeline-parallel-size {pp} on an instance of {nodes} nodes: pipeline parallelism is what "
            f"crosses nodes, one stage per node. Use --pipeline-parallel-size {nodes}."
        )
    arch = model_arch_or_none(launch.arch)
    heads = getattr(arch, "num_attention_heads", None)
    if heads and tp and heads % tp:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0 and (per_node is None or d <= per_node)]
        out.append(
            f"--tensor-parallel-size {tp}: {launch.arch} has {heads} attention heads, not divisible by {tp} "
            f'(vLLM: "Total number of attention heads ({heads}) must be divisible by tensor parallel size '
            f'({tp})."). Use one of: {", ".join(map(str, divisors))}.'
        )
    return out


def _launcher_flags(launch: Launch) -> list[str]:
    """The multi-node launcher's flags the launch gives, read from its tokens (an older parser knows none)."""
    # A ModelServer states its argv; a container's props have no `argv`, only docker's command.
    argv = [str(t) for t in launch.props.get("argv") or []]
    found = server_tokens(argv or container_argv(launch.props))
    tokens = found[1] if found else []
    return list(dict.fromkeys(f for t in tokens if (f := canonical_flag(t)) in LAUNCHER_FLAGS))


def check_native_launcher(launch: Launch, config: dict[str, Any]) -> list[str]:
    """vLLM's own multi-node launcher (pools.<pool>.vllm.multiNode: native) only on an image whose vLLM has it."""
    facts = launch.facts
    flags = _launcher_flags(launch)
    if facts is None or facts.native_multi_node or not flags:
        return []
    pool = launch.props.get("pool")
    choice = f"pools.{pool}.vllm.multiNode: native" if launch.resource == "ModelServer" and pool else flags[0]
    having = [f.ref for f in known_images() if f.engine == "vllm" and f.native_multi_node]
    return [
        f"{choice} starts vLLM's own multi-node launcher ({', '.join(flags)}, --headless on the other nodes), "
        f"which vLLM {facts.version} of {image_key(launch)} {facts.ref} does not have "
        f"({facts.cite('native_multi_node')}): it would exit on an unrecognized argument. Keep multiNode: ray "
        f"on this image, or use one whose vLLM has the launcher: {', '.join(having) or 'none in the facts table'}."
    ]
