"""Fatal startup errors as the engines print them: the log line that says it, what it means, what to do.

The readiness gate (components.engines.base.health_gate_script) reads them on the node when a
server dies while it waits, and stops at once with the cause instead of waiting out its timeout and
blaming weights or memory; `doctor` reads them in every server's log. Each engine lists its own
(`Engine.own_startup_failures`); `Engine.startup_failures` adds the CUDA and NCCL ones every engine
shares.

A pattern is a POSIX extended regular expression (`grep -E` on the node) written so that Python's `re`
reads it the same way (tests/test_startup_failures.py runs both over real logs): literal text, `.`,
`[0-9]`, `( | )`, `*`, `+`, `\\.`; no `\\d`, `\\s`, `\\b` or `[[:classes:]]`. Patterns are matched
case-sensitively against one line at a time; the first entry of a list that matches names the cause,
so a list goes from the most specific to the most general.

Sources, as cited below: the engines' source at a tag (file:line, read with git), users' logs in
GitHub issues (their lines are in tests/fixtures/startup-failures, with SOURCES.md), and
shared/reference/volta (VOLTA-ENGINES.md and the two fact checks it summarises). Nothing here ran on a
GPU.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from components.facts.evidence import Sourced, code, observed

# What doctor files a finding under (its `check`): the runbook's troubleshooting rows.
OOM, DTYPE_KERNEL, KV_CAPACITY, DRIVER, STARTUP = "oom", "dtype-kernel", "kv-capacity", "driver", "startup"


@dataclass(frozen=True)
class StartupFailure:
    """One fatal startup error: the line an engine prints, its cause and what to change."""

    id: str
    check: str  # doctor's check name (OOM, DTYPE_KERNEL, ...)
    pattern: str  # POSIX ERE, read alike by Python's re (see the module's docstring)
    cause: str
    fix: str  # may name {pool}, {model} (their stack keys) and {memory_keys} (the engine's memory knobs)
    source: Sourced

    def __post_init__(self) -> None:
        for bad in ("\\d", "\\s", "\\b", "\\w", "[[:", "(?", "\\S", "\\D"):
            if bad in self.pattern:
                raise ValueError(f"startup failure {self.id}: {bad!r} is not POSIX ERE, or Python reads it "
                                 "differently; write the characters out")
        re.compile(self.pattern)

    def advice(self, pool: str, model: str, memory_keys: str) -> str:
        """The cause and the fix, the fix naming this pool's and model's stack keys, and the source."""
        fix = self.fix.format(pool=pool, model=model, memory_keys=memory_keys)
        return f"{self.cause}. Fix: {fix} ({self.source})"


def first_failure(text: str, failures: Sequence[StartupFailure]) -> tuple[StartupFailure, str] | None:
    """The first entry (in list order) whose pattern matches a line of `text`, with that line (stripped)."""
    lines = text.splitlines()
    for f in failures:
        compiled = re.compile(f.pattern)
        for line in lines:
            if compiled.search(line):
                return f, line.strip()
    return None


def all_failures(text: str, failures: Sequence[StartupFailure]) -> list[tuple[StartupFailure, str]]:
    """Every entry whose pattern matches a line of `text`, in list order, each with the first such line."""
    out = []
    for f in failures:
        found = first_failure(text, (f,))
        if found:
            out.append(found)
    return out


def any_pattern(failures: Iterable[StartupFailure]) -> str:
    """One ERE matching a line any of `failures` matches (doctor's grep on the node)."""
    return "|".join(f"({f.pattern})" for f in failures)


# --- every engine: CUDA, PyTorch, NCCL ---------------------------------------------------------------

COMMON: tuple[StartupFailure, ...] = (
    StartupFailure(
        "no-kernel-image", DTYPE_KERNEL,
        r"no kernel image is available for execution on the device|with CUDA capability sm_[0-9]+ is not "
        r"compatible with the current PyTorch installation|PyTorch no longer supports this GPU because it is too old",
        "the image's PyTorch or CUDA kernels were not built for this GPU (V100 is sm_70: the vLLM 0.9.x and "
        "0.10.0/0.10.1 images, and any cu13 or -ubuntu2404 build, have none)",
        "an image that has sm_70 kernels in pools.{pool}.image (vLLM 0.10.2 to 0.19.x plain tag, LMDeploy "
        "-cu12.8, llama.cpp server-cuda); `make plan` names the tested ones",
        observed("pytorch#147607 (sm_70 removed from torch 2.7.0+cu128); vllm#19185 on V100 with a 0.9.x image, "
                 "#16307; torch/cuda/__init__.py _check_capability and _check_cubins (2.7.1, 2.8.0)")),
    StartupFailure(
        "driver-too-old", DRIVER,
        r"CUDA driver version is insufficient for CUDA runtime version|The NVIDIA driver on your system is too "
        r"old|forward compatibility was attempted on non supported HW|the provided PTX was compiled with an "
        r"unsupported toolchain",
        "the node's NVIDIA driver is older than the image's CUDA (a PTX-only build such as llama.cpp's sm_70 "
        "JIT-compiles with the driver, which must know that CUDA)",
        "upgrade the driver on the node (R570 or later for CUDA 12.8 images; `nvidia-smi` shows it), or an "
        "image built for an older CUDA in pools.{pool}.image",
        code("CUDA runtime error strings (cudaErrorInsufficientDriver 35, cudaErrorCompatNotSupportedOnDevice "
             "804, cudaErrorUnsupportedPtxVersion 222); torch/cuda/__init__.py _check_driver")),
    StartupFailure(
        "cuda-oom", OOM,
        r"CUDA out of memory|OutOfMemoryError|cudaMalloc failed: out of memory|CUDA (runtime )?error: out of memory",
        "the GPU ran out of memory while the server loaded (weights, activations or KV cache), or another "
        "process holds GPU memory",
        "lower pools.{pool}.{memory_keys}, or spread the model over more GPUs; `nvidia-smi` on the node shows "
        "memory held by another process",
        observed("torch's CUDA caching allocator (vllm#12529); llama.cpp ggml-cuda.cu:888 (b11312); LMDeploy "
                 "TurboMind's allocator (lmdeploy#1459, #3557; from v0.14 `[TM][FATAL]… CUDA error: out of "
                 "memory`, src/turbomind/utils/cuda_utils.cc:28 at v0.16.0 [code])")),
    StartupFailure(
        "nccl-shm", STARTUP,
        r"Error while creating shared memory segment",
        "NCCL could not create its shared-memory segment in /dev/shm: the container's /dev/shm is too small",
        "raise pools.{pool}.shmSizeGib",
        code("NCCL src/misc/shmutils.cc: \"Error while creating shared memory segment %s (size %zu)\"")),
)


# --- vLLM ---------------------------------------------------------------------------------------------

VLLM: tuple[StartupFailure, ...] = (
    StartupFailure(
        # Not "FA2 is only supported on devices with compute capability >= 8": vLLM logs that (as an
        # ERROR, "Cannot use FA version 2 …") on every V100 start, then picks another backend.
        "mla-flash-attention", DTYPE_KERNEL,
        r"FlashAttention only supports Ampere GPUs or newer",
        "MLA (DeepSeek-V2/V3/R1, Kimi-K2) prefill calls FlashAttention-2, which needs sm_80 or newer; on V100 "
        "there is no fallback in any vLLM through 0.19",
        "set VLLM_MLA_DISABLE=1 in pools.{pool}.env (full K/V heads: about 10x the KV cache per token; `make "
        "plan` shows the capacity left)",
        observed("vllm#14016 (2080 Ti), vllm#8189; the TORCH_CHECK in vllm-flash-attn csrc/flash_attn/flash_api.cpp, "
                 "in _vllm_fa2_C.abi3.so of the 0.9.2 and 0.11.0 wheels; MLA prefill calls flash_attn_varlen_func "
                 "(v1/attention/backends/mla/common.py)")),
    StartupFailure(
        "triton-sm70", DTYPE_KERNEL,
        r"PassManager::run failed|LLVM ERROR: Unsupported rounding mode for conversion",
        "the image's Triton (3.2/3.3) cannot compile an fp16 dot kernel for sm_70: fused MoE, prefix prefill, "
        "Triton MLA decode",
        "vLLM 0.10.2 to 0.19.x in pools.{pool}.image (Triton 3.4 or later compiles them for sm_70)",
        observed("vllm#19215, #18993 (V100), #17639, sglang#7467 (the LLVM abort), unsloth#2947 (T4, vLLM 0.9.2); "
                 "both strings in triton 3.3.1's libtriton.so and backends/nvidia/compiler.py make_llir")),
    StartupFailure(
        "bf16-below-sm80", DTYPE_KERNEL,
        r"Bfloat16 is only supported on GPUs with compute capability of at least 8",
        "the model runs in bfloat16, which needs sm_80 or newer",
        "models.{model}.dtype: half",
        code("vllm worker/worker.py:553-557 and v1/worker/gpu_worker.py:404-408 at v0.9.2, platforms/cuda.py "
             "check_if_supports_dtype at v0.11.0 and v0.19.1; verl#2594 on V100 [observed]")),
    StartupFailure(
        "quantization-capability", DTYPE_KERNEL,
        r"Minimum capability: [0-9]+\. +Current capability: [0-9]+|(Min|Required) capability: [0-9' ,]*[0-9]+",
        "the checkpoint's quantization method has no kernels for this GPU (AWQ needs sm_75; Marlin, FP8 and "
        "the compressed-tensors schemes sm_75 to sm_90)",
        "a checkpoint whose method runs on sm_70 (GPTQ with desc_act false, or moe_wna16 for MoE) in "
        "models.{model}, or LMDeploy TurboMind (AWQ and GPTQ on sm_70) in pools.{pool}.engine",
        code("vllm config.py:4474-4478 at v0.9.2 (config/vllm.py at v0.19.1); compressed_tensors.py "
             "_check_scheme_supported; vllm#1488, #4202 (V100, AWQ), 1CatAI/1Cat-vLLM#255 (V100) [observed]")),
    StartupFailure(
        "fp8-triton", DTYPE_KERNEL,
        r"type fp8e4nv not supported in this architecture|fp8e4nv data type is not supported on CUDA arch",
        "an fp8 (e4m3) KV cache or weights through Triton, which has no fp8e4nv below sm_89",
        "pools.{pool}.vllm.kvCacheDtype: auto (and an fp16 or int4 checkpoint in models.{model})",
        observed("1CatAI/1Cat-vLLM#27 (V100, --kv-cache-dtype fp8), vllm#17581, #26431; triton language/core.py "
                 "(3.3.1) [code]")),
    StartupFailure(
        "kv-cache-too-small", KV_CAPACITY,
        r"KV cache is needed, which is larger than the available KV cache memory|is larger than the maximum "
        r"number of tokens that can be stored in KV cache|No available memory for the cache blocks",
        "after the weights, the GPUs' memory holds less KV cache than one request of maxModelLen needs",
        "lower pools.{pool}.vllm.maxModelLen (the message's estimated maximum model length fits), raise "
        "gpuMemoryUtilization, or more GPUs per instance; `make plan` prints the KV tokens it expects",
        code("vllm v1/core/kv_cache_utils.py check_enough_kv_cache_memory (l.555-579 at v0.9.2, l.626-653 at "
             "v0.19.1), worker/worker.py raise_if_cache_size_invalid (V0); vllm#14452, #13061 [observed]")),
    StartupFailure(
        "gptq-moe", STARTUP,
        r"assert (self\.)?quant_method is not None",
        "the checkpoint's quantization has no MoE method in this vLLM (plain GPTQ on a MoE model before 0.11: "
        "FusedMoE gets no quant_method)",
        "vLLM 0.11 to 0.19.x in pools.{pool}.image (GPTQ MoE falls back to MoeWNA16), or models.{model}."
        "quantization: moe_wna16 (desc_act false)",
        code("vllm model_executor/layers/fused_moe/layer.py:735 at v0.9.2; gptq.py falls back to MoeWNA16 from "
             "v0.11.0; vllm#22001, #16713 [observed]")),
    StartupFailure(
        "v0-engine", STARTUP,
        r"VLLM_USE_V1=1 is not supported with Compute Capability|V0 attention backends have been removed|MLA "
        r"attention backends require the V1 engine",
        "VLLM_USE_V1 asks for the engine this vLLM does not run here: V1 below sm_80 on 0.9.x, V0 on 0.11 "
        "(removed)",
        "remove VLLM_USE_V1 from pools.{pool}.env (vLLM 0.10.2 and later run V1 on sm_70)",
        code("vllm engine/arg_utils.py:1358-1363 at v0.9.2; platforms/cuda.py:390-392 and :244-247 at v0.11.0")),
    StartupFailure(
        "swap-space", STARTUP,
        r"Too large swap space",
        "the CPU swap space (per GPU, times tensorParallel) is more than 0.7 of the host's RAM",
        "lower pools.{pool}.vllm.swapSpaceGib",
        code("vllm config.py:1631 at v0.9.2, config/cache.py:218 at v0.11.0 (gone in 0.19); "
             "Ksuriuri/index-tts-vllm#99 [observed]")),
    StartupFailure(
        "pipeline-parallel-unsupported", STARTUP,
        r"Pipeline parallelism is not supported for this model|Pipeline parallelism is only supported for the "
        r"following",
        "the model's vLLM class does not implement pipeline parallelism (SupportsPP)",
        "pools.{pool}.pipelineParallel: 1, with the GPUs in tensorParallel",
        code("vllm config.py:1095-1097 at v0.9.2, config/model.py:1125-1128 at v0.19.1; vllm#16231 [observed]")),
)


# --- LMDeploy (TurboMind) ----------------------------------------------------------------------------

LMDEPLOY: tuple[StartupFailure, ...] = (
    StartupFailure(
        "turbomind-kernel-missing", DTYPE_KERNEL,
        r"No decoding kernel found|No attention kernel found|No feasible kernel found for the problem",
        "TurboMind has no kernel for this model's shapes on this GPU (on V100: head dim 256 decoding, whose "
        "3-stage kernel needs more than sm_70's 96 KB of shared memory)",
        "a model whose attention TurboMind runs on sm_70 (head dim 128) in pools.{pool}.model, a newer "
        "LMDeploy in pools.{pool}.image (lmdeploy PR #4412), or pools.{pool}.engine: vllm",
        observed("lmdeploy#4408 (Tesla V100-SXM2-32GB, Qwen3.5); TM_CHECK in src/turbomind/kernels/attention/"
                 "decoding.cu:36, attention.cu:25, gemm.cu:341 at v0.16.0 [code]")),
)


# --- llama.cpp (llama-server) ---------------------------------------------------------------------

LLAMACPP: tuple[StartupFailure, ...] = (
    StartupFailure(
        # Before the shared OOM entry: on a GPU this line follows "cudaMalloc failed: out of memory".
        "kv-cache-alloc", KV_CAPACITY,
        r"failed to allocate buffer for kv cache",
        "the KV cache of parallel slots x contextPerSlot tokens does not fit beside the weights",
        "lower pools.{pool}.llamacpp.contextPerSlot or parallel, or quantize the KV cache "
        "(pools.{pool}.llamacpp.cacheType: q8_0)",
        observed("llama.cpp b11312 src/llama-kv-cache.cpp:288; seen here from the CPU build of b11312 "
                 "(tests/fixtures/startup-failures)")),
    StartupFailure(
        "gguf-load", STARTUP,
        r"failed to load model|error loading model",
        "llama-server could not load the GGUF: missing or unreadable at the path it was given, or an "
        "architecture newer than the image's llama.cpp",
        "the weights of models.{model} on the node (`make plan` prints the path the server reads), or a newer "
        "llama.cpp in pools.{pool}.image",
        observed("llama.cpp b11312 src/llama.cpp:375 and :433, tools/server/server-context.cpp:1086; seen here "
                 "from the CPU build of b11312 (tests/fixtures/startup-failures)")),
)
