"""Rule 14 as a policy: the CPU-side memory of a pool's vLLM servers fits the RAM of each of its nodes. The
check is vLLM's own (components/engines/vllm/rules/host_memory.py)."""

from __future__ import annotations

from components.engines.vllm.rules.host_memory import check_host_memory
from policies.rules.common import launch_policy

POLICIES = [
    launch_policy(
        "host-memory",
        "The CPU swap space and CPU offload of a pool's vLLM servers fit the RAM of each of its nodes.",
        check_host_memory,
        needs_gpu=False,
    ),
]
