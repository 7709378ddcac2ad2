"""Rules 1-5 and 10: what vLLM 0.9.2 cannot run on the GPU it is given (dtype, engine, quantization, FP8,
chunked prefill / prefix caching, MLA). Facts come from components.facts.hardware. A raw vLLM container
whose GPU is not known gets one advisory (vllm-gpu-unknown) instead of passing these silently."""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pulumi_policy import EnforcementLevel, PolicyConfigSchema

from components.facts.hardware import (
    CHUNKED_PREFILL_AUTO_ABOVE, DTYPE_ALIASES, FP8_KV_CACHE_DTYPES, FP8_QUANTIZATION_METHODS,
    FP16_REFUSING_MODEL_TYPES, GPUS, QUANTIZATION_METHODS, QUANTIZATION_MIN_CAPABILITY, QUANTIZATION_WAY_OUT,
    capability_text, engine_support, quantization_min_capability,
)
from components.facts.images import image_facts
from policies.rules.common import GPU_MODEL_LABEL, Launch, launch_policy, number


def model_arch_or_none(name: str | None) -> Any:
    """The catalog's ModelArch for a name, None when unknown (or the catalog is not installed)."""
    if not name:
        return None
    try:
        from components.facts.models import model_arch
        return model_arch(name)
    except (ImportError, KeyError):
        return None


def check_dtype(launch: Launch, config: dict[str, Any]) -> list[str]:
    """Rule 1: bf16 below sm_80, and float32 where half was meant."""
    support = engine_support(launch.capability or 0)
    given = launch.args.get("dtype", "auto")
    dtype = DTYPE_ALIASES.get(given, given)
    arch = model_arch_or_none(launch.arch)
    model_type = getattr(arch, "model_type", None)
    if dtype == "bfloat16" and "bfloat16" not in support.dtypes:
        return [f"--dtype {given}: bfloat16 needs compute capability 8.0; {launch.where()} has none "
                "(vLLM 0.9.2 refuses it at startup). Use --dtype half (the stack's model dtype: half)."]
    if dtype == "float32" and not config["allowFloat32"]:
        return [f"--dtype {given}: float32 doubles the weights' memory and runs without tensor cores on "
                f"{launch.where()}. Use --dtype half, or set allowFloat32 in this policy's config if meant."]
    if dtype == "auto" and "bfloat16" not in support.dtypes and model_type in FP16_REFUSING_MODEL_TYPES \
            and not config["allowFloat32"]:
        return [f"--dtype auto: model type {model_type} refuses float16 in vLLM 0.9.2, so on {launch.where()} "
                "auto resolves to float32 (twice the memory, no tensor cores). Serve it on sm_80+ (bfloat16), "
                "or set allowFloat32 in this policy's config to accept float32."]
    return []


def check_v1(launch: Launch, config: dict[str, Any]) -> list[str]:
    """Rule 2: VLLM_USE_V1=0 where the image's V1 engine refuses the GPU and its envs.py reads the switch
    (unset means 1). An image without facts is the vllm-image rule's to judge."""
    facts = image_facts(launch.image)
    if facts is None or not facts.reads_vllm_use_v1 or facts.runs_v1(launch.capability or 0):
        return []
    value = launch.env.get("VLLM_USE_V1")
    if value == "0":
        return []
    state = "is unset (vLLM 0.9.2 reads unset as 1)" if value is None else f"is {value!r}"
    return [f"VLLM_USE_V1 {state}: the V1 engine needs compute capability 8.0 and {launch.where()} has "
            "less (VLLM_USE_V1=1 raises NotImplementedError). Set VLLM_USE_V1=0 in the container's env."]


def _quantization(launch: Launch) -> tuple[str | None, str]:
    """The method vLLM will use and where it comes from: --quantization, else the checkpoint's."""
    flag = launch.args.get("quantization")
    if flag:
        return str(flag), f"--quantization {flag}"
    if launch.quantization:
        return str(launch.quantization), f"the checkpoint's quantization {launch.quantization}"
    return None, ""


def check_quantization(launch: Launch, config: dict[str, Any]) -> list[str]:
    """Rule 3: the method's minimum capability above the GPU's (FP8 methods: rule 4)."""
    method, source = _quantization(launch)
    if method is None or method in FP8_QUANTIZATION_METHODS or method not in QUANTIZATION_METHODS:
        return []
    need = quantization_min_capability(method)
    cap = launch.capability or 0
    if need is None:
        return [f"{source}: not a CUDA method in vLLM 0.9.2 (it targets TPU, Neuron or Intel)."]
    if need <= cap:
        return []
    works = sorted(m for m, c in QUANTIZATION_MIN_CAPABILITY.items() if quantization_min_capability(m) <= cap
                   and m not in FP8_QUANTIZATION_METHODS)
    way_out = QUANTIZATION_WAY_OUT.get(method, "use a checkpoint in a method that runs here: " + ", ".join(works))
    return [f"{source}: vLLM 0.9.2 needs {capability_text(need)} for {method}; {launch.where()} has less "
            f"(\"Minimum capability: {need}. Current capability: {cap}.\"). Instead, {way_out}."]


def check_fp8(launch: Launch, config: dict[str, Any]) -> list[str]:
    """Rule 4: FP8 KV cache and FP8 checkpoints on GPUs without FP8 support."""
    cap = launch.capability or 0
    out = []
    kv = launch.args.get("kv_cache_dtype", "auto")
    if kv in FP8_KV_CACHE_DTYPES and not engine_support(cap).fp8_kv_cache:
        out.append(f"--kv-cache-dtype {kv}: {launch.where()} has no FP8 support; vLLM 0.9.2's Triton "
                   "prefill kernels cannot cast the cache to fp8 there. Use --kv-cache-dtype auto (float16 cache) "
                   "and lower --max-model-len or --max-num-seqs if the cache does not fit.")
    method, source = _quantization(launch)
    need = quantization_min_capability(method) if method in FP8_QUANTIZATION_METHODS else None
    if need is not None and need > cap:
        out.append(f"{source}: FP8 weights need {capability_text(need)} in vLLM 0.9.2 and {launch.where()} "
                   "has no FP8 units. Serve an fp16 or GPTQ checkpoint of the model instead "
                   "(--quantization gptq).")
    return out


def check_prefill(launch: Launch, config: dict[str, Any]) -> list[str]:
    """Rule 5: chunked prefill and prefix caching where the Triton kernels assert (incl. the >32k auto switch)."""
    support = engine_support(launch.capability or 0)
    out = []
    why = (f"vLLM 0.9.2's Triton prefix-prefill kernel asserts on {launch.where()} "
           "(\"mma -> mma layout conversion is only supported on Ampere\"; issues #2729, #3687, #8024)")
    if not support.prefix_caching and launch.args.get("enable_prefix_caching"):
        out.append(f"--enable-prefix-caching: {why}. Remove it (enablePrefixCaching: false).")
    chunked = launch.args.get("enable_chunked_prefill")
    if not support.chunked_prefill and chunked:
        out.append(f"--enable-chunked-prefill: {why}. Remove it (enableChunkedPrefill: false).")
    if not support.chunked_prefill and chunked is None:
        length = launch.args.get("max_model_len")
        if length is None:
            out.append(f"--max-model-len is unset: vLLM takes the model's context length and turns chunked "
                       f"prefill on by itself above {CHUNKED_PREFILL_AUTO_ABOVE}; {why}. Set --max-model-len "
                       f"<= {CHUNKED_PREFILL_AUTO_ABOVE} or pass --no-enable-chunked-prefill.")
        elif length > CHUNKED_PREFILL_AUTO_ABOVE:
            out.append(f"--max-model-len {length}: above {CHUNKED_PREFILL_AUTO_ABOVE} vLLM 0.9.2 turns chunked "
                       f"prefill on by itself; {why}. Set --max-model-len <= {CHUNKED_PREFILL_AUTO_ABOVE} or pass "
                       "--no-enable-chunked-prefill.")
    return out


# Model names whose checkpoints use MLA, for containers without a catalog arch (DeepSeek-V2/V3/R1, Kimi-K2;
# not the R1 distills, which are Qwen/Llama models).
_MLA_NAME = re.compile(r"deepseek[-_]?(v2|v3|r1)(?![-_]?distill)|kimi[-_]?k2", re.IGNORECASE)


def _uses_mla(launch: Launch) -> str | None:
    arch = model_arch_or_none(launch.arch)
    if arch is not None:
        return arch.model_type if arch.uses_mla else None
    name = launch.arch or launch.model_path or ""
    if _MLA_NAME.search(name) and "distill" not in name.lower():
        return name
    return None


def check_mla(launch: Launch, config: dict[str, Any]) -> list[str]:
    """Rule 10 (advisory): MLA attention below sm_80, unless VLLM_MLA_DISABLE=1."""
    cap = launch.capability or 0
    model = _uses_mla(launch)
    if model is None or engine_support(cap).mla or launch.env.get("VLLM_MLA_DISABLE") == "1":
        return []
    message = (f"{model} uses MLA attention: vLLM 0.9.2 picks TRITON_MLA on V0, but its prefill calls "
               f"FlashAttention-2, which needs compute capability 8.0; on {launch.where()} it is likely to fail "
               "(inferred from vLLM's code, not tested). Set VLLM_MLA_DISABLE=1 in the pool's env (vLLM then "
               "keeps the full per-head KV cache: check the capacity plan), or serve it on sm_80+.")
    without = launch.props.get("capacityWithoutMla")
    if isinstance(without, Mapping) and without.get("fits") is False:
        message += f" With it, {without.get('reason')}."
    elif isinstance(without, Mapping) and without.get("kv_tokens") is not None:
        tokens, length = number(without["kv_tokens"]) or 0, number(without.get("max_model_len")) or 0
        message += (f" With it, the KV cache holds {tokens} tokens per instance "
                    f"({tokens / length if length else 0:.1f} sequences of {length}).")
    return [message]


# The rules that need the GPU (launch_policy's needs_gpu, and vllm-image's vLLM line).
GPU_RULES = ("gpu-dtype", "vllm-v1-engine", "gpu-quantization", "gpu-fp8", "gpu-chunked-prefill-prefix-caching",
             "mla-attention", "vllm-image")


def check_gpu_known(launch: Launch, config: dict[str, Any]) -> list[str]:
    """Advisory: a raw vLLM container whose GPU the hardware rules cannot look up (no label, or a name not
    in the facts table) would otherwise pass them silently as not applicable."""
    if launch.resource != "container" or launch.gpu is not None:
        return []
    rules = ", ".join(GPU_RULES)
    fix = (f"Add the label {GPU_MODEL_LABEL}=<nvidia-smi name> (nvidia-smi --query-gpu=name --format=csv,noheader, "
           "e.g. Tesla V100-SXM2-32GB) so the hardware rules apply.")
    if not launch.gpu_name:
        return [f"this vLLM container has no {GPU_MODEL_LABEL} label, so the hardware rules ({rules}) cannot "
                f"judge it. {fix}"]
    return [f"{GPU_MODEL_LABEL}={launch.gpu_name} is not a GPU in this pack's facts table (known: "
            f"{', '.join(GPUS)}), so the hardware rules ({rules}) cannot judge this vLLM container. "
            f"Label it with one of the known names."]


FLOAT32_CONFIG = PolicyConfigSchema(properties={"allowFloat32": {
    "type": "boolean", "default": False,
    "description": "Accept float32 (explicit, or auto on a model type that refuses float16)."}})

POLICIES = [
    launch_policy("gpu-dtype", "The dtype must be one the GPU computes in (no bfloat16 below sm_80).",
                  check_dtype, config=FLOAT32_CONFIG),
    launch_policy("vllm-v1-engine", "VLLM_USE_V1 must be 0 on GPUs the V1 engine does not support (below sm_80).",
                  check_v1),
    launch_policy("gpu-quantization", "The quantization method must run on the GPU's compute capability.",
                  check_quantization),
    launch_policy("gpu-fp8", "No FP8 KV cache or FP8 checkpoint on GPUs without FP8 support.", check_fp8),
    launch_policy("gpu-chunked-prefill-prefix-caching",
                  "Chunked prefill and prefix caching must stay off where vLLM 0.9.2's Triton kernels assert (Volta).",
                  check_prefill),
    launch_policy("mla-attention", "MLA attention (DeepSeek-V2/V3/R1, Kimi-K2) needs FlashAttention-2 (sm_80+).",
                  check_mla, level=EnforcementLevel.ADVISORY),
    launch_policy("vllm-gpu-unknown",
                  "A vLLM container names its GPU (llm-cluster.gpu-model) so the hardware rules can judge it.",
                  check_gpu_known, level=EnforcementLevel.ADVISORY, needs_gpu=False),
]
