"""The hardware policies: what the pool's vLLM image cannot run on the GPU it is given. Their checks are
vLLM's own (pure functions of a Launch, in components/engines/vllm/rules/hardware.py)."""

from __future__ import annotations

from pulumi_policy import EnforcementLevel, PolicyConfigSchema

from components.engines.vllm.rules.hardware import (
    check_attention_backend,
    check_dtype,
    check_fp8,
    check_gpu_known,
    check_image_known,
    check_mla,
    check_prefill,
    check_quantization,
    check_quantization_moe,
    check_triton,
    check_v1,
    check_v1_ignored,
)
from policies.rules.common import launch_policy

FLOAT32_CONFIG = PolicyConfigSchema(
    properties={
        "allowFloat32": {
            "type": "boolean",
            "default": False,
            "description": "Accept float32 (explicit, or auto on a model type that refuses float16).",
        }
    }
)

POLICIES = [
    launch_policy(
        "gpu-dtype",
        "The dtype must be one the GPU computes in (no bfloat16 below sm_80).",
        check_dtype,
        config=FLOAT32_CONFIG,
    ),
    launch_policy(
        "vllm-v1-engine",
        "VLLM_USE_V1 must be 0 where the image's V1 engine refuses the GPU and its vLLM "
        "reads the switch (0.9.x below sm_80).",
        check_v1,
    ),
    launch_policy(
        "vllm-v1-ignored",
        "VLLM_USE_V1 is not given to an image whose vLLM no longer reads it (0.12+).",
        check_v1_ignored,
        level=EnforcementLevel.ADVISORY,
    ),
    launch_policy(
        "gpu-quantization",
        "The quantization method must run on the GPU's compute capability in the image's vLLM.",
        check_quantization,
    ),
    launch_policy(
        "quantization-moe",
        "A MoE model's quantization method must have a FusedMoE method in the image's "
        "vLLM (plain gptq has none in 0.9.2).",
        check_quantization_moe,
    ),
    launch_policy("gpu-fp8", "No FP8 KV cache or FP8 checkpoint on GPUs without FP8 support.", check_fp8),
    launch_policy(
        "triton-fp16-dot",
        "The image's Triton must compile fp16 tl.dot on the GPU for the kernels the pool "
        "runs (fused MoE, Triton attention, prefix prefill, Triton MLA).",
        check_triton,
    ),
    launch_policy(
        "gpu-chunked-prefill-prefix-caching",
        "Chunked prefill and prefix caching must stay off where the image's prefix-prefill kernel dies.",
        check_prefill,
    ),
    launch_policy(
        "mla-attention",
        "MLA attention (DeepSeek-V2/V3/R1, Kimi-K2) needs FlashAttention-2 (sm_80+): below, VLLM_MLA_DISABLE=1.",
        check_mla,
    ),
    launch_policy(
        "attention-backend", "--attention-backend must name a backend that runs on the GPU.", check_attention_backend
    ),
    launch_policy(
        "vllm-image-unknown",
        "The image is in the facts table (or its facts are declared), so every rule can judge it.",
        check_image_known,
        level=EnforcementLevel.ADVISORY,
        needs_gpu=False,
    ),
    launch_policy(
        "vllm-gpu-unknown",
        "A vLLM container names its GPU (llm-cluster.gpu-model) so the hardware rules can judge it.",
        check_gpu_known,
        level=EnforcementLevel.ADVISORY,
        needs_gpu=False,
    ),
]
