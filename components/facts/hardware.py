"""GPU models (name, architecture, compute capability, memory) and the engine-neutral facts around them.

What each engine version does per compute capability is in each engine's facts (components/engines/<engine>/facts.py, keyed by image).

Sources:
  [nv-specs]   NVIDIA data sheets for memory sizes (V100, T4, A10, A100, L40S, H100, H200).
  [vllm-fp16]  vLLM 0.9.2 config.py:3221-3241 (model types that refuse float16; on sm_70 `auto` gives float32).
  [vllm-docs-q] docs/features/quantization/supported_hardware.md at v0.9.2 (Volta: GPTQ, BitBLAS, AQLM,
               bitsandbytes, DeepSpeedFP, GGUF yes; AWQ, Marlin, INT8 W8A8, FP8 no).
  [lmdeploy]   LMDeploy's supported-platforms table: TurboMind runs AWQ/GPTQ int4 on Volta (sm_70).
  [vllm-docker] docker/Dockerfile and requirements/cuda.txt (0.9.2, 0.19.0): every vllm/vllm-openai image
               installs ray[cgraph], so it carries Ray.
  [nccl-nvls]  NCCL's NVLS algorithm needs NVSwitch and sm_90 (NCCL_NVLS_ENABLE); NVIDIA/NeMo-Framework-Launcher#127
               turns it off "for memory saving"; vllm#13074 (8 x H20, TP 8) logs 2.53-2.57 GiB non-torch memory.
  [vllm-mem]   the memory profiler (0.9.2 worker/worker.py, 0.19.1 v1/worker/gpu_worker.py): the CUDA context
               is created before its baseline, so it is outside gpuMemoryUtilization's budget.
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
    # What PyTorch sees (cudaMemGetInfo's total, vLLM's total_gpu_memory): a little less than nvidia-smi's,
    # and what vLLM multiplies by gpuMemoryUtilization. None: no public log states it for this GPU yet.
    torch_memory_gib: float | None = None

    @property
    def nvls(self) -> bool:
        """NCCL's NVLink SHARP path: NVSwitch-connected Hopper and later (SXM), whose multicast buffers make
        the communicators several times larger per peer. [nccl-nvls]"""
        return self.nvlink and self.capability >= 90

    @property
    def visible_memory_gib(self) -> float:
        """The memory vLLM's budget starts from: PyTorch's total where a log states it, else nvidia-smi's less
        the share torch never sees on the GPUs that state both (TORCH_VISIBLE_FRACTION: on the safe side)."""
        if self.torch_memory_gib is not None:
            return self.torch_memory_gib
        return round(self.memory_gib * TORCH_VISIBLE_FRACTION, 2)


# PyTorch's total (cudaMemGetInfo) over nvidia-smi's where both are known: 0.987 on L40S (44.42 of 44.99 GiB),
# 0.992 on V100-SXM2-32GB (31.74 of 32), 0.985 on A100 40GB (39.39 GiB in PyTorch's OOM messages, of 40):
# below the smallest, so a GPU whose torch figure no log states is not planned on memory torch cannot see.
TORCH_VISIBLE_FRACTION = 0.984


# Memory as nvidia-smi reports it (MiB / 1024), which is what vLLM's memory profiler sees. [nv-specs]
GPUS: dict[str, GpuModel] = {
    g.name: g
    for g in [
        GpuModel("Tesla V100-SXM2-16GB", "volta", 70, 16384 / 1024, True),
        # torch sees 31.74 GiB: "total_gpu_memory (31.74GiB)" in two public V100-32GB vLLM startup logs
        # (V0 0.7.1 and 0.8.5, DeepSeek-R1-Distill-Qwen-7B / Qwen2.5-7B fp16). [observed]
        GpuModel("Tesla V100-SXM2-32GB", "volta", 70, 32768 / 1024, True, 31.74),
        GpuModel("Tesla V100-PCIE-16GB", "volta", 70, 16384 / 1024, False),
        GpuModel("Tesla V100-PCIE-32GB", "volta", 70, 32768 / 1024, False),
        GpuModel("Tesla T4", "turing", 75, 15360 / 1024, False),
        GpuModel("NVIDIA A10", "ampere", 86, 23028 / 1024, False),
        GpuModel("NVIDIA A100-SXM4-40GB", "ampere", 80, 40960 / 1024, True),
        GpuModel("NVIDIA A100-SXM4-80GB", "ampere", 80, 81920 / 1024, True),
        GpuModel("NVIDIA A100-PCIE-40GB", "ampere", 80, 40960 / 1024, False),
        GpuModel("NVIDIA A100 80GB PCIe", "ampere", 80, 81920 / 1024, False),
        # 44.42 GiB in tests/fixtures/vllm-startup-logs (vllm#15815, 2 x L40S). [observed]
        GpuModel("NVIDIA L40S", "ada", 89, 46068 / 1024, False, 44.42),
        GpuModel("NVIDIA H100 80GB HBM3", "hopper", 90, 81559 / 1024, True),
        GpuModel("NVIDIA H100 PCIe", "hopper", 90, 81559 / 1024, False),
        GpuModel("NVIDIA H200", "hopper", 90, 143771 / 1024, True),
    ]
}

# vLLM's `--dtype` choices (0.9.2 and 0.19.1 alike) and what each means as a torch dtype.
DTYPE_ALIASES: dict[str, str] = {
    "auto": "auto",
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float": "float32",
    "float32": "float32",
}
DTYPE_BYTES: dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4}

# GPU memory per GPU vLLM never counts in its budget: the process's CUDA context, created before the
# profiler's baseline. A GPU serving vLLM therefore shows about gpuMemoryUtilization x total plus
# this much used (DCGM_FI_DEV_FB_USED). [vllm-mem]
CUDA_CONTEXT_GIB = 0.5

# config.json model_type values vLLM 0.9.2 refuses to run in float16 ("The model type … does not
# support float16"); below sm_80 `--dtype auto` therefore resolves them to float32. [vllm-fp16]
FP16_REFUSING_MODEL_TYPES = frozenset({"gemma2", "gemma3", "plamo2", "glm4"})

# What to use instead when a method needs more than the GPU has. [vllm-docs-q] [lmdeploy]
QUANTIZATION_WAY_OUT: dict[str, str] = {
    "awq": "serve a GPTQ checkpoint of the model (--quantization gptq), or serve the AWQ checkpoint "
    "with LMDeploy (TurboMind runs AWQ on sm_70)",
    "awq_marlin": "serve a GPTQ checkpoint of the model (--quantization gptq), or serve the AWQ checkpoint "
    "with LMDeploy (TurboMind runs AWQ on sm_70)",
    "gptq_marlin": "use --quantization gptq (or leave it unset: vLLM picks plain gptq itself where Marlin does not run)",
    "gptq_marlin_24": "use a dense GPTQ checkpoint with --quantization gptq",
    "gptq_bitblas": "use --quantization gptq (or bitblas)",
    "marlin": "use --quantization gptq with a GPTQ checkpoint",
    "compressed-tensors": "use a GPTQ (--quantization gptq) or GGUF checkpoint of the model",
}


def gpu(name: str) -> GpuModel:
    """Look a GPU model up by its nvidia-smi name; KeyError lists the known names."""
    try:
        return GPUS[name]
    except KeyError:
        raise KeyError(f"unknown GPU model {name!r}; known: {', '.join(sorted(GPUS))}") from None


def capability_text(capability: int) -> str:
    """70 -> 'sm_70 (compute capability 7.0)'."""
    return f"sm_{capability} (compute capability {capability // 10}.{capability % 10})"
