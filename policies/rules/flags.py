"""Rule 8 as a policy: every `vllm serve` flag is real in the pool's vLLM version and has a valid value. The
check is vLLM's own (components/engines/vllm/rules/flags.py)."""

from __future__ import annotations

from components.engines.vllm.rules.flags import check_flags
from policies.rules.common import launch_policy

POLICIES = [
    launch_policy(
        "vllm-serve-flags",
        "Every `vllm serve` (or api_server) flag must exist in the pool's vLLM version with a valid value, "
        "the model given as positional (as --model to the api_server).",
        check_flags,
        needs_gpu=False,
    ),
]
