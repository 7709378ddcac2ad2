"""Rule 14: the CPU-side memory of a pool's vLLM servers fits the RAM of each of its nodes.

What a vLLM server takes from its host, per GPU it runs on the node: the CPU swap space (`--swap-space`,
GiB per GPU, 4 by default on the lines that have it; 0.19 has no such flag) and the weights it offloads
to CPU (`--cpu-offload-gb`, GiB per GPU, pinned: the kernel cannot page it out); plus, once per node, a
KV offloading buffer (`--kv-offloading-size`, GiB summed over the TP ranks). Two refusals:
- vLLM's own: swap space x tensor_parallel_size above 0.7 of the host's RAM stops the server at startup
  ("Too large swap space", components.engines.vllm.facts);
- the node's: every instance of the pool on a node together needs more than the node's RAM
  (nodes.<node>.memoryGib, nodeDefaults.memoryGib, else the reference server's).
Each message says what fits. Host RAM comes from the ModelServer's `hostMemory` prop (every node of the
pool, so each instance judges the whole pool).
"""

from __future__ import annotations

import math
from typing import Any

from components.engines.judged import number
from components.engines.vllm.facts import SWAP_SPACE_MAX_FRACTION, SWAP_SPACE_SOURCE
from components.engines.vllm.launch import Launch


def _gib(value: Any) -> float:
    try:
        return max(0.0, float(value or 0))
    except (TypeError, ValueError):
        return 0.0


def check_host_memory(launch: Launch, config: dict[str, Any]) -> list[str]:
    """Swap space and CPU offload of the pool's instances against each node's RAM."""
    nodes = launch.props.get("hostMemory") or {}
    if not nodes:
        return []
    gpus = number(launch.args.get("tensor_parallel_size")) or number(launch.props.get("tensorParallel")) or 1
    swap = _gib(launch.args.get("swap_space"))
    offload = _gib(launch.args.get("cpu_offload_gb"))
    buffer = _gib(launch.args.get("kv_offloading_size"))
    per_instance = (swap + offload) * gpus + buffer
    out = []
    smallest = min(nodes.items(), key=lambda item: (float(item[1]["memoryGib"]), item[0]))
    ram, key = float(smallest[1]["memoryGib"]), str(smallest[1]["key"])
    if swap * gpus > SWAP_SPACE_MAX_FRACTION * ram:
        most = math.floor(SWAP_SPACE_MAX_FRACTION * ram / gpus)
        out.append(
            f"--swap-space {swap:g} GiB per GPU x {gpus} GPUs = {swap * gpus:g} GiB, more than "
            f"{SWAP_SPACE_MAX_FRACTION:g} of the {ram:g} GiB of RAM of node {smallest[0]} ({key}): vLLM "
            f'refuses to start ("Too large swap space", {SWAP_SPACE_SOURCE}). At most {most} GiB per GPU '
            "fits; the V1 engine does not swap, so 0 loses nothing there."
        )
    over = []
    for node, entry in sorted(nodes.items()):
        count = int(number(entry.get("instances")) or 0)
        if count and per_instance * count > float(entry["memoryGib"]):
            over.append((node, entry, count))
    if over:
        node, entry, count = over[0]
        node_ram = float(entry["memoryGib"])
        parts = [f"--swap-space {swap:g}" if swap else "", f"--cpu-offload-gb {offload:g}" if offload else ""]
        what = " + ".join(p for p in parts if p) + " GiB per GPU" if swap or offload else ""
        what += (" + " if what else "") + f"--kv-offloading-size {buffer:g} GiB" if buffer else ""
        fits = (node_ram / count - buffer) / gpus
        also = f" (also {', '.join(n for n, _, _ in over[1:])})" if len(over) > 1 else ""
        pin = f"its {count} instances of the pool pin" if count > 1 else "the pool's instance there pins"
        out.append(
            f"node {node}{also} has {node_ram:g} GiB of RAM ({entry['key']}), but {pin} "
            f"{per_instance * count:g} GiB of it on the host ({what}, x {gpus} GPUs"
            f"{' each' if count > 1 else ''}): the kernel's OOM killer stops a "
            f"server, or the node swaps. Swap space plus CPU offload must stay within "
            f"{max(0.0, fits):.1f} GiB per GPU, or state the node's real RAM."
        )
    return out
