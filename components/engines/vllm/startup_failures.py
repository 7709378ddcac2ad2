"""vLLM's own fatal startup errors (the entries and their form: components.facts.startup_failures)."""

from __future__ import annotations

from components.facts.evidence import code, observed
from components.facts.startup_failures import DTYPE_KERNEL, KV_CAPACITY, STARTUP, StartupFailure

STARTUP_FAILURES: tuple[StartupFailure, ...] = (
    StartupFailure(
        # Not "FA2 is only supported on devices with compute capability >= 8": vLLM logs that (as an
        # ERROR, "Cannot use FA version 2 …") on every V100 start, then picks another backend.
        "mla-flash-attention",
        DTYPE_KERNEL,
        r"FlashAttention only supports Ampere GPUs or newer",
        "MLA (DeepSeek-V2/V3/R1, Kimi-K2) prefill calls FlashAttention-2, which needs sm_80 or newer; on V100 "
        "there is no fallback in any vLLM through 0.19",
        "set VLLM_MLA_DISABLE=1 in pools.{pool}.env (full K/V heads: about 10x the KV cache per token; `make "
        "plan` shows the capacity left)",
        observed(
            "vllm#14016 (2080 Ti), vllm#8189; the TORCH_CHECK in vllm-flash-attn csrc/flash_attn/flash_api.cpp, "
            "in _vllm_fa2_C.abi3.so of the 0.9.2 and 0.11.0 wheels; MLA prefill calls flash_attn_varlen_func "
            "(v1/attention/backends/mla/common.py)"
        ),
    ),
    StartupFailure(
        "triton-sm70",
        DTYPE_KERNEL,
        r"PassManager::run failed|LLVM ERROR: Unsupported rounding mode for conversion",
        "the image's Triton (3.2/3.3) cannot compile an fp16 dot kernel for sm_70: fused MoE, prefix prefill, "
        "Triton MLA decode",
        "vLLM 0.10.2 to 0.19.x in pools.{pool}.image (Triton 3.4 or later compiles them for sm_70)",
        observed(
            "vllm#19215, #18993 (V100), #17639, sglang#7467 (the LLVM abort), unsloth#2947 (T4, vLLM 0.9.2); "
            "both strings in triton 3.3.1's libtriton.so and backends/nvidia/compiler.py make_llir"
        ),
    ),
    StartupFailure(
        "bf16-below-sm80",
        DTYPE_KERNEL,
        r"Bfloat16 is only supported on GPUs with compute capability of at least 8",
        "the model runs in bfloat16, which needs sm_80 or newer",
        "models.{model}.dtype: half",
        code(
            "vllm worker/worker.py:553-557 and v1/worker/gpu_worker.py:404-408 at v0.9.2, platforms/cuda.py "
            "check_if_supports_dtype at v0.11.0 and v0.19.1; verl#2594 on V100 [observed]"
        ),
    ),
    StartupFailure(
        "quantization-capability",
        DTYPE_KERNEL,
        r"Minimum capability: [0-9]+\. +Current capability: [0-9]+|(Min|Required) capability: [0-9' ,]*[0-9]+",
        "the checkpoint's quantization method has no kernels for this GPU (AWQ needs sm_75; Marlin, FP8 and "
        "the compressed-tensors schemes sm_75 to sm_90)",
        "a checkpoint whose method runs on sm_70 (GPTQ with desc_act false, or moe_wna16 for MoE) in "
        "models.{model}, or LMDeploy TurboMind (AWQ and GPTQ on sm_70) in pools.{pool}.engine",
        code(
            "vllm config.py:4474-4478 at v0.9.2 (config/vllm.py at v0.19.1); compressed_tensors.py "
            "_check_scheme_supported; vllm#1488, #4202 (V100, AWQ), 1CatAI/1Cat-vLLM#255 (V100) [observed]"
        ),
    ),
    StartupFailure(
        "fp8-triton",
        DTYPE_KERNEL,
        r"type fp8e4nv not supported in this architecture|fp8e4nv data type is not supported on CUDA arch",
        "an fp8 (e4m3) KV cache or weights through Triton, which has no fp8e4nv below sm_89",
        "pools.{pool}.vllm.kvCacheDtype: auto (and an fp16 or int4 checkpoint in models.{model})",
        observed(
            "1CatAI/1Cat-vLLM#27 (V100, --kv-cache-dtype fp8), vllm#17581, #26431; triton language/core.py "
            "(3.3.1) [code]"
        ),
    ),
    StartupFailure(
        "kv-cache-too-small",
        KV_CAPACITY,
        r"KV cache is needed, which is larger than the available KV cache memory|is larger than the maximum "
        r"number of tokens that can be stored in KV cache|No available memory for the cache blocks",
        "after the weights, the GPUs' memory holds less KV cache than one request of maxModelLen needs",
        "lower pools.{pool}.vllm.maxModelLen (the message's estimated maximum model length fits), raise "
        "gpuMemoryUtilization, or more GPUs per instance; `make plan` prints the KV tokens it expects",
        code(
            "vllm v1/core/kv_cache_utils.py check_enough_kv_cache_memory (l.555-579 at v0.9.2, l.626-653 at "
            "v0.19.1), worker/worker.py raise_if_cache_size_invalid (V0); vllm#14452, #13061 [observed]"
        ),
    ),
    StartupFailure(
        "gptq-moe",
        STARTUP,
        r"assert (self\.)?quant_method is not None",
        "the checkpoint's quantization has no MoE method in this vLLM (plain GPTQ on a MoE model before 0.11: "
        "FusedMoE gets no quant_method)",
        "vLLM 0.11 to 0.19.x in pools.{pool}.image (GPTQ MoE falls back to MoeWNA16), or models.{model}."
        "quantization: moe_wna16 (desc_act false)",
        code(
            "vllm model_executor/layers/fused_moe/layer.py:735 at v0.9.2; gptq.py falls back to MoeWNA16 from "
            "v0.11.0; vllm#22001, #16713 [observed]"
        ),
    ),
    StartupFailure(
        "v0-engine",
        STARTUP,
        r"VLLM_USE_V1=1 is not supported with Compute Capability|V0 attention backends have been removed|MLA "
        r"attention backends require the V1 engine",
        "VLLM_USE_V1 asks for the engine this vLLM does not run here: V1 below sm_80 on 0.9.x, V0 on 0.11 (removed)",
        "remove VLLM_USE_V1 from pools.{pool}.env (vLLM 0.10.2 and later run V1 on sm_70)",
        code("vllm engine/arg_utils.py:1358-1363 at v0.9.2; platforms/cuda.py:390-392 and :244-247 at v0.11.0"),
    ),
    StartupFailure(
        "swap-space",
        STARTUP,
        r"Too large swap space",
        "the CPU swap space (per GPU, times tensorParallel) is more than 0.7 of the host's RAM",
        "lower pools.{pool}.vllm.swapSpaceGib",
        code(
            "vllm config.py:1631 at v0.9.2, config/cache.py:218 at v0.11.0 (gone in 0.19); "
            "Ksuriuri/index-tts-vllm#99 [observed]"
        ),
    ),
    StartupFailure(
        "pipeline-parallel-unsupported",
        STARTUP,
        r"Pipeline parallelism is not supported for this model|Pipeline parallelism is only supported for the "
        r"following",
        "the model's vLLM class does not implement pipeline parallelism (SupportsPP)",
        "pools.{pool}.pipelineParallel: 1, with the GPUs in tensorParallel",
        code("vllm config.py:1095-1097 at v0.9.2, config/model.py:1125-1128 at v0.19.1; vllm#16231 [observed]"),
    ),
)
