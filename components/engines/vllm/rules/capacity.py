"""Rule 11, vLLM's part: a pool that does not fit is told which fixes can work, computed from the capacity
planner's estimate (the ModelServer's `capacity` prop): a higher gpuMemoryUtilization only when the extra share
would hold the weights and one sequence, else a shorter context, more GPUs per instance or quantized weights,
each with its figure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# The highest gpuMemoryUtilization worth proposing: the CUDA context and NCCL buffers live outside it.
MAX_UTILIZATION = 0.95
# 4-bit GPTQ weights against fp16: a little over a quarter of the bytes (scales and zero points).
GPTQ4_WEIGHT_SHARE = 0.3
_GENERIC_ADVICE = re.compile(r"(: add GPUs \(TP/PP\).*|; lower max-model-len to \d+ or less, or add GPUs)$")


def _f(capacity: Mapping[str, Any], key: str) -> float:
    value = capacity.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def fit_fixes(capacity: Mapping[str, Any], pool: str, model: str) -> list[str]:
    """Changes that would make the pool fit, each checked against the estimate's own figures."""
    gpu, util = _f(capacity, "gpu_memory_gib"), _f(capacity, "gpu_memory_utilization")
    weights, activation, non_torch = (
        _f(capacity, k) for k in ("weights_gib_per_gpu", "activation_gib", "non_torch_gib")
    )
    per_token = _f(capacity, "kv_bytes_per_token_per_gpu") / 2**30
    length = int(_f(capacity, "max_model_len"))
    gpus = int(_f(capacity, "tp") or 1) * int(_f(capacity, "pp") or 1)
    if not gpu or not length:
        return []
    one_sequence = length * per_token

    def room(u: float, w: float = weights) -> float:
        return gpu * u - w - activation - non_torch

    fixes = []
    if util < MAX_UTILIZATION and room(MAX_UTILIZATION) >= one_sequence:
        fixes.append(f"raise pools.{pool}.vllm.gpuMemoryUtilization (a fraction) from {util:g} to {MAX_UTILIZATION:g}")
    elif util < MAX_UTILIZATION:
        fixes.append(
            f"raising pools.{pool}.vllm.gpuMemoryUtilization (a fraction) to {MAX_UTILIZATION:g} would not be enough"
        )
    # What the KV cache holds now, in whole blocks as vLLM counts it.
    tokens = int(_f(capacity, "kv_tokens"))
    if tokens >= 16:
        fixes.append(f"lower pools.{pool}.vllm.maxModelLen from {length} to {tokens} or less")
    # Weights and the KV cache of a sequence split over the GPUs of an instance (TP within a node, PP across).
    need = weights * gpus + one_sequence * gpus
    for factor in (2, 4, 8):
        spare = gpu * util - activation - non_torch
        if spare > 0 and need / (gpus * factor) <= spare:
            fixes.append(
                f"spread each instance over {gpus * factor} GPUs instead of {gpus} (pools.{pool}."
                f"tensorParallel within a node, pools.{pool}.pipelineParallel across nodes)"
            )
            break
    if not capacity.get("quantization") and room(util, weights * GPTQ4_WEIGHT_SHARE) >= one_sequence:
        fixes.append(
            f"serve a 4-bit GPTQ checkpoint (models.{model}.quantization: gptq; about "
            f"{weights * GPTQ4_WEIGHT_SHARE:.1f} GiB of weights per GPU instead of {weights:.1f})"
        )
    return fixes


def check_fit(capacity: Mapping[str, Any], pool: str, model: str) -> list[str]:
    """Not one sequence of max-model-len fits in the KV cache left after the weights: the planner's reason
    with the fixes that work (fit_fixes), or that no single change does."""
    if capacity.get("fits") is not False:
        return []
    fixes = fit_fixes(capacity, pool, model)
    # The planner's reason ends in generic advice; the checked fixes below replace it.
    reason = _GENERIC_ADVICE.sub("", str(capacity.get("reason") or "")) or "no room for one sequence of max-model-len"
    working = [f for f in fixes if not f.startswith("raising")]
    advice = (
        "To fit: " + "; or ".join(working) + "."
        if working
        else "No single change of this pool fits it: use GPUs with more memory, or a smaller model."
    )
    note = next((f for f in fixes if f.startswith("raising")), None)
    return [f"does not fit: {reason}. {advice}" + (f" ({note[0].upper() + note[1:]}.)" if note else "")]
