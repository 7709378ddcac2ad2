"""vLLM's policy rules: pure checks of a `Launch` (components/engines/vllm/launch.py) and the policy's config,
one module per topic (hardware, image, flags, engine args, topology, host memory, memory fit). `LAUNCH_RULES`
names them, with their levels and config; the pack lists each under its topic (policies/rules/<topic>.py)."""

from __future__ import annotations

from components.engines.judged import LaunchRule
from components.engines.vllm.rules.engine_args import check_engine_args
from components.engines.vllm.rules.flags import check_flags
from components.engines.vllm.rules.hardware import (
    check_attention_backend,
    check_dtype,
    check_fp8,
    check_gpu_known,
    check_image_known,
    check_mla,
    check_prefill,
    check_quantization,
    check_quantization_dtype,
    check_quantization_moe,
    check_triton,
    check_v1,
    check_v1_ignored,
)
from components.engines.vllm.rules.host_memory import check_host_memory
from components.engines.vllm.rules.image import check_arch, ray_problem
from components.engines.vllm.rules.topology import check_native_launcher, check_parallelism

FLOAT32_CONFIG = {
    "allowFloat32": {
        "type": "boolean",
        "default": False,
        "description": "Accept float32 (explicit, or auto on a model type that refuses float16).",
    }
}
RAY_IMAGES_CONFIG = {
    "rayImages": {
        "type": "array",
        "items": {"type": "string"},
        "default": [],
        "description": "Further image repositories (or refs) that contain Ray and vLLM.",
    },
}

LAUNCH_RULES = (
    LaunchRule(
        "hardware",
        "gpu-dtype",
        "The dtype must be one the GPU computes in (no bfloat16 below sm_80).",
        check_dtype,
        config=FLOAT32_CONFIG,
    ),
    LaunchRule(
        "hardware",
        "vllm-v1-engine",
        "VLLM_USE_V1 must be 0 where the image's V1 engine refuses the GPU and its vLLM "
        "reads the switch (0.9.x below sm_80).",
        check_v1,
    ),
    LaunchRule(
        "hardware",
        "vllm-v1-ignored",
        "VLLM_USE_V1 is not given to an image whose vLLM no longer reads it (0.12+).",
        check_v1_ignored,
        advisory=True,
    ),
    LaunchRule(
        "hardware",
        "gpu-quantization",
        "The quantization method must run on the GPU's compute capability in the image's vLLM.",
        check_quantization,
    ),
    LaunchRule(
        "hardware",
        "quantization-dtype",
        "The dtype must be one the quantization method accepts in the image's vLLM (plain gptq and awq: float16 only).",
        check_quantization_dtype,
        needs_gpu=False,
    ),
    LaunchRule(
        "hardware",
        "quantization-moe",
        "A MoE model's quantization method must have a FusedMoE method in the image's "
        "vLLM (plain gptq has none in 0.9.2).",
        check_quantization_moe,
    ),
    LaunchRule("hardware", "gpu-fp8", "No FP8 KV cache or FP8 checkpoint on GPUs without FP8 support.", check_fp8),
    LaunchRule(
        "hardware",
        "triton-fp16-dot",
        "The image's Triton must compile fp16 tl.dot on the GPU for the kernels the pool "
        "runs (fused MoE, Triton attention, prefix prefill, Triton MLA).",
        check_triton,
    ),
    LaunchRule(
        "hardware",
        "gpu-chunked-prefill-prefix-caching",
        "Chunked prefill and prefix caching must stay off where the image's prefix-prefill kernel dies.",
        check_prefill,
    ),
    LaunchRule(
        "hardware",
        "mla-attention",
        "MLA attention (DeepSeek-V2/V3/R1, Kimi-K2) needs FlashAttention-2 (sm_80+): below, VLLM_MLA_DISABLE=1.",
        check_mla,
    ),
    LaunchRule(
        "hardware",
        "attention-backend",
        "--attention-backend must name a backend that runs on the GPU.",
        check_attention_backend,
    ),
    LaunchRule(
        "hardware",
        "vllm-image-unknown",
        "The image is in the facts table (or its facts are declared), so every rule can judge it.",
        check_image_known,
        advisory=True,
        needs_gpu=False,
    ),
    LaunchRule(
        "hardware",
        "vllm-gpu-unknown",
        "A vLLM container names its GPU (llm-cluster.gpu-model) so the hardware rules can judge it.",
        check_gpu_known,
        advisory=True,
        needs_gpu=False,
    ),
    LaunchRule(
        "image",
        "vllm-image",
        "The image's torch must have kernels for the GPU (its CUDA arch list); Ray containers need Ray.",
        check_arch,
        config=RAY_IMAGES_CONFIG,
        needs_gpu=False,
        ray_node_image=ray_problem,
    ),
    LaunchRule(
        "topology",
        "parallelism",
        "Tensor parallelism stays inside a node, pipeline parallelism spans nodes, TP x PP fills the "
        "instance's GPUs and divides the attention heads.",
        check_parallelism,
        needs_gpu=False,
    ),
    LaunchRule(
        "topology",
        "vllm-native-multi-node",
        "vLLM's own multi-node launcher (--nnodes, --node-rank, --master-addr, --master-port; multiNode: native) "
        "only on an image whose vLLM has it (0.19.1 here, not 0.11.0 or older).",
        check_native_launcher,
        needs_gpu=False,
    ),
    LaunchRule(
        "flags",
        "vllm-serve-flags",
        "Every `vllm serve` (or api_server) flag must exist in the pool's vLLM version with a valid value, "
        "the model given as positional (as --model to the api_server).",
        check_flags,
        needs_gpu=False,
    ),
    LaunchRule(
        "engine_args",
        "vllm-engine-args",
        "vLLM's own startup validation: max-model-len within the model's context window, the batch "
        "budget against max-model-len and max-num-seqs, partial-prefill and scheduler settings.",
        check_engine_args,
        needs_gpu=False,
    ),
    LaunchRule(
        "host_memory",
        "host-memory",
        "The CPU swap space and CPU offload of a pool's vLLM servers fit the RAM of each of its nodes.",
        check_host_memory,
        needs_gpu=False,
    ),
)
