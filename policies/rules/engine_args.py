"""Rule 13 as a policy: what vLLM's own argument validation refuses at startup, across flags. The checks are
vLLM's own (components/engines/vllm/rules/engine_args.py)."""

from __future__ import annotations

from components.engines.vllm.rules.engine_args import check_engine_args
from policies.rules.common import launch_policy

POLICIES = [
    launch_policy(
        "vllm-engine-args",
        "vLLM's own startup validation: max-model-len within the model's context window, the batch "
        "budget against max-model-len and max-num-seqs, partial-prefill and scheduler settings.",
        check_engine_args,
        needs_gpu=False,
    ),
]
