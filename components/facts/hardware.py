"""GPU models and what vLLM 0.9.2 supports on each compute capability.

Sources (cited per fact below):
  [vllm-cap]   vLLM 0.9.2 `get_min_capability` of each quantization method
               (vllm/model_executor/layers/quantization/*.py); gate in config.py:4469-4478.
  [vllm-dtype] vllm/platforms/cuda.py:62-72 (supported dtypes < sm_80 are fp16/fp32);
               worker/worker.py:540-557 (the bf16 refusal message).
  [vllm-v1]    vllm/engine/arg_utils.py:1353-1363 (V1 needs capability major >= 8).
  [vllm-compat] docs/features/compatibility_matrix.md:64-65 at v0.9.2 (chunked prefill and
               prefix caching are not supported on Volta; issues #2729, #3687, #8024, #13738).
  [vllm-cp32k] arg_utils.py:1511-1536 (V0 turns chunked prefill on when max_model_len > 32768).
  [vllm-mla]   attention/backends/mla/common.py:226,1069 (MLA prefill calls FlashAttention-2,
               which needs sm_80: vllm_flash_attn/flash_attn_interface.py:35-37).
  [nv-specs]   NVIDIA data sheets for memory sizes (V100, T4, A10, A100, L40S, H100, H200).
  [vllm-fp16]  vllm/config.py:3221-3241 (model types that refuse float16; on sm_70 `auto` gives float32).
  [vllm-ct]    compressed_tensors/schemes/* (no compressed-tensors linear scheme accepts sm_70; W8A8-int8
               needs 7.5) and compressed_tensors.py:213-235; issue #20216.
  [vllm-docs-q] docs/features/quantization/supported_hardware.md at v0.9.2 (Volta: GPTQ, BitBLAS, AQLM,
               bitsandbytes, DeepSpeedFP, GGUF yes; AWQ, Marlin, INT8 W8A8, FP8 no).
  [lmdeploy]   LMDeploy's supported-platforms table: TurboMind runs AWQ/GPTQ int4 on Volta (sm_70).
  [vllm-docker] docker/Dockerfile at v0.9.2: TORCH_CUDA_ARCH_LIST incl. 7.0 (:9,165); requirements/cuda.txt
               installs ray[cgraph], so every vllm/vllm-openai image carries Ray.
  [vllm-mem]   worker/worker.py determine_num_available_blocks and utils.memory_profiling at v0.9.2: the
               budget is total x gpuMemoryUtilization minus weights, activation peak and the non-torch
               increase over a baseline taken after CUDA init; startup logs in
               tests/fixtures/vllm-startup-logs ("non_torch_memory takes 0.30GiB" at TP 2).
"""
from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class GpuModel:
    """One GPU product as `nvidia-smi --query-gpu=name` reports it."""

    name: str
    arch: str
    capability: int  # compute capability as vLLM writes it: 70 for 7.0
    memory_gib: float  # usable HBM/GDDR as nvidia-smi reports it, in GiB
    nvlink: bool  # SXM / NVLink parts; PCIe parts talk over the PCIe switch


# Memory as nvidia-smi reports it (MiB / 1024), which is what vLLM's memory profiler sees. [nv-specs]
GPUS: dict[str, GpuModel] = {
    g.name: g
    for g in [
        GpuModel("Tesla V100-SXM2-16GB", "volta", 70, 16384 / 1024, True),
        GpuModel("Tesla V100-SXM2-32GB", "volta", 70, 32768 / 1024, True),
        GpuModel("Tesla V100-PCIE-16GB", "volta", 70, 16384 / 1024, False),
        GpuModel("Tesla V100-PCIE-32GB", "volta", 70, 32768 / 1024, False),
        GpuModel("Tesla T4", "turing", 75, 15360 / 1024, False),
        GpuModel("NVIDIA A10", "ampere", 86, 23028 / 1024, False),
        GpuModel("NVIDIA A100-SXM4-40GB", "ampere", 80, 40960 / 1024, True),
        GpuModel("NVIDIA A100-SXM4-80GB", "ampere", 80, 81920 / 1024, True),
        GpuModel("NVIDIA A100-PCIE-40GB", "ampere", 80, 40960 / 1024, False),
        GpuModel("NVIDIA A100 80GB PCIe", "ampere", 80, 81920 / 1024, False),
        GpuModel("NVIDIA L40S", "ada", 89, 46068 / 1024, False),
        GpuModel("NVIDIA H100 80GB HBM3", "hopper", 90, 81559 / 1024, True),
        GpuModel("NVIDIA H100 PCIe", "hopper", 90, 81559 / 1024, False),
        GpuModel("NVIDIA H200", "hopper", 90, 143771 / 1024, True),
    ]
}

# Minimum compute capability per `--quantization` method in vLLM 0.9.2. [vllm-cap]
QUANTIZATION_MIN_CAPABILITY: dict[str, int] = {
    "gptq": 60, "gguf": 60, "aqlm": 60, "deepspeedfp": 60, "auto-round": 60,
    "bitsandbytes": 70, "bitblas": 70, "moe_wna16": 70, "compressed-tensors": 70, "quark": 70,
    "awq": 75, "torchao": 75,
    "awq_marlin": 80, "gptq_marlin": 80, "gptq_marlin_24": 80, "gptq_bitblas": 80, "marlin": 80,
    "fp8": 80, "fbgemm_fp8": 80, "experts_int8": 80, "hqq": 80, "qqq": 80, "rtn": 80,
    "modelopt_fp4": 80, "ptpc_fp8": 80,
    "modelopt": 89,
}
# Methods vLLM knows but that are not CUDA methods (TPU, Neuron, Intel). [vllm-cap]
QUANTIZATION_NOT_CUDA = frozenset({"tpu_int8", "neuron_quant", "ipex"})
# Every value vLLM 0.9.2 accepts for --quantization (QUANTIZATION_METHODS).
QUANTIZATION_METHODS = frozenset(QUANTIZATION_MIN_CAPABILITY) | QUANTIZATION_NOT_CUDA

# vLLM 0.9.2 `--dtype` choices and what each means as a torch dtype.
DTYPE_ALIASES: dict[str, str] = {
    "auto": "auto", "half": "float16", "float16": "float16",
    "bfloat16": "bfloat16", "float": "float32", "float32": "float32",
}
DTYPE_BYTES: dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4}

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
FP8_KV_CACHE_DTYPES = frozenset(d for d in KV_CACHE_DTYPES if d.startswith("fp8"))

# GPU memory per GPU outside torch's allocator that vLLM's profiler counts *inside* the
# gpuMemoryUtilization budget (cuBLAS workspaces; NCCL buffers when TP x PP > 1), so the KV cache
# gets that much less. [vllm-mem]
NON_TORCH_GIB_SINGLE_GPU = 0.1
NON_TORCH_GIB_MULTI_GPU = 0.3
# GPU memory per GPU vLLM never counts in that budget: the process's CUDA context, created before the
# profiler's baseline. A GPU serving vLLM therefore shows about gpuMemoryUtilization x total plus
# this much used (DCGM_FI_DEV_FB_USED). [vllm-mem]
CUDA_CONTEXT_GIB = 0.5

# config.json model_type values vLLM 0.9.2 refuses to run in float16 ("The model type … does not
# support float16"); below sm_80 `--dtype auto` therefore resolves them to float32. [vllm-fp16]
FP16_REFUSING_MODEL_TYPES = frozenset({"gemma2", "gemma3", "plamo2", "glm4"})

# Checkpoint formats that store FP8 weights (Volta and Turing have no FP8 units). [vllm-cap]
FP8_QUANTIZATION_METHODS = frozenset({"fp8", "fbgemm_fp8", "ptpc_fp8", "modelopt"})
# compressed-tensors passes the config-level gate at 7.0, but none of its linear schemes loads
# below 7.5 (W8A8-int8); WNA16 and W8A16-fp8 need 8.0. [vllm-ct]
COMPRESSED_TENSORS_MIN_SCHEME_CAPABILITY = 75
# What to use instead when a method needs more than the GPU has. [vllm-docs-q] [lmdeploy]
QUANTIZATION_WAY_OUT: dict[str, str] = {
    "awq": "serve a GPTQ checkpoint of the model (--quantization gptq), or serve the AWQ checkpoint "
           "with LMDeploy (TurboMind runs AWQ on sm_70)",
    "awq_marlin": "serve a GPTQ checkpoint of the model (--quantization gptq), or serve the AWQ checkpoint "
                  "with LMDeploy (TurboMind runs AWQ on sm_70)",
    "gptq_marlin": "use --quantization gptq (or leave it unset: vLLM picks plain gptq itself below sm_80)",
    "gptq_marlin_24": "use a dense GPTQ checkpoint with --quantization gptq",
    "gptq_bitblas": "use --quantization gptq (or bitblas)",
    "marlin": "use --quantization gptq with a GPTQ checkpoint",
    "compressed-tensors": "use a GPTQ (--quantization gptq) or GGUF checkpoint of the model",
}


@dataclass(frozen=True)
class EngineSupport:
    """What vLLM 0.9.2 can do on one compute capability."""

    dtypes: frozenset[str]
    v1_engine: bool
    chunked_prefill: bool
    prefix_caching: bool
    fp8_kv_cache: bool
    mla: bool


def engine_support(capability: int) -> EngineSupport:
    """vLLM 0.9.2's feature set for a compute capability (70 for V100)."""
    ampere_plus = capability >= 80
    return EngineSupport(
        # [vllm-dtype] bf16 only from sm_80.
        dtypes=frozenset({"float16", "float32"} | ({"bfloat16"} if ampere_plus else set())),
        v1_engine=ampere_plus,  # [vllm-v1]
        # [vllm-compat] Triton prefix-prefill kernel asserts "mma -> mma layout conversion is only
        # supported on Ampere" on sm_70; sm_75 (Turing) runs it.
        chunked_prefill=capability >= 75,
        prefix_caching=capability >= 75,
        # [VLLM-VOLTA §4] fp8 KV on the Triton prefix path needs fp8e4nv (sm_89); on V0 without
        # prefix caching the CUDA paged-attention converts in software. Unconfirmed on sm_70, so
        # refused there: a preview-time "no" beats a load-time crash.
        fp8_kv_cache=capability >= 75,
        mla=ampere_plus,  # [vllm-mla]
    )


# vLLM turns chunked prefill on by itself above this max_model_len on V0. [vllm-cp32k]
CHUNKED_PREFILL_AUTO_ABOVE = 32768

# vLLM image lines and the GPUs they serve. 0.9.2 is the last line whose V0 engine runs Volta
# end to end (V0 removed in 0.10/0.11); the image is built with TORCH_CUDA_ARCH_LIST incl. 7.0
# (docker/Dockerfile:9,165 at v0.9.2). Every vllm/vllm-openai image carries Ray.
VLLM_IMAGE_REPO = "vllm/vllm-openai"
VLLM_VOLTA_VERSION = "v0.9.2"
# Image tags of VLLM_IMAGE_REPO whose engine runs on GPUs without V1 support (below sm_80): the
# product's flag table and facts are for 0.9.2, so that is the one tag accepted. [vllm-docker]
VLLM_V0_IMAGE_TAGS = frozenset({VLLM_VOLTA_VERSION})
# Image repositories that carry both Ray and vLLM: every container of a Ray pool needs both (the head
# runs `vllm serve`, the workers run vLLM's engine workers as Ray actors), so Ray-only images such as
# rayproject/ray or rayproject/ray-ml do not qualify. [vllm-docker]
IMAGES_WITH_RAY = frozenset({VLLM_IMAGE_REPO})


def gpu(name: str) -> GpuModel:
    """Look a GPU model up by its nvidia-smi name; KeyError lists the known names."""
    try:
        return GPUS[name]
    except KeyError:
        raise KeyError(f"unknown GPU model {name!r}; known: {', '.join(sorted(GPUS))}") from None


def quantization_min_capability(method: str) -> int | None:
    """The capability a quantization method really needs in vLLM 0.9.2 (None: unknown or not CUDA)."""
    need = QUANTIZATION_MIN_CAPABILITY.get(method)
    if need is not None and method == "compressed-tensors":
        need = max(need, COMPRESSED_TENSORS_MIN_SCHEME_CAPABILITY)  # [vllm-ct]
    return need


def capability_text(capability: int) -> str:
    """70 -> 'sm_70 (compute capability 7.0)'."""
    return f"sm_{capability} (compute capability {capability // 10}.{capability % 10})"
