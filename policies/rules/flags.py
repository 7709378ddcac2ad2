"""Rule 8: every `vllm serve` flag is real in vLLM 0.9.2 and has a valid value; the model is positional."""
from __future__ import annotations

from typing import Any

from policies.rules.common import Launch, launch_policy


def check_flags(launch: Launch, config: dict[str, Any]) -> list[str]:
    """One message per parse error of the argv after `vllm serve`, in argparse's (and vLLM's) words."""
    return [f"vllm serve: {error}" for error in launch.args.errors]


POLICIES = [
    launch_policy("vllm-serve-flags",
                  "Every `vllm serve` flag must exist in vLLM 0.9.2 with a valid value, the model given as positional.",
                  check_flags, needs_gpu=False),
]
