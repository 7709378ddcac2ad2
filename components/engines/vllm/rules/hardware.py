"""What the pool's vLLM image cannot run on the GPU it is given, read from the image's facts
(components.engines.vllm.facts): dtype, the V1 switch, quantization (capability and MoE path), FP8, the Triton
kernels the pool will run, chunked prefill / prefix caching, MLA, the attention backend. Each message names
the stack key to edit, the evidence (issue or source line, with its evidence level) and the way out.

A few checks need no image facts: no bf16 or MLA below sm_80 (every known version), no FP8 KV cache or FP8
weights below sm_80 (the strictest known line: 0.9.2 and 0.19.1 each run one of them on sm_75, neither on
sm_70). Those rules also judge an image the table does not know. Every other rule needs the image's facts; for an unknown image the
`vllm-image-unknown` advisory says which rules could not judge it and how to declare its facts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from components.engines.containers import GPU_MODEL_LABEL
from components.engines.judged import number
from components.engines.vllm.facts import DEFAULT_IMAGE, FP8_WEIGHT_METHODS, ImageFacts, image_facts
from components.engines.vllm.launch import Launch
from components.facts.hardware import (
    DTYPE_ALIASES,
    FP16_REFUSING_MODEL_TYPES,
    GPUS,
    QUANTIZATION_WAY_OUT,
    capability_text,
)
from components.facts.models import model_arch

# An image the table does not know is judged by the strictest known line: below sm_80 every known version
# refuses bf16 and dies in MLA prefill; an FP8 KV cache and FP8 weights each run on sm_75 in one known line
# (0.9.2's XFORMERS cache, 0.19.1's Marlin FP8) and die there in the other, and on sm_70 in none.
# [images: bf16_min_capability, fp8_kv_min_capability, quantizations, mla_min_capability]
EVERY_VERSION_MIN = {"bf16": 80, "fp8_kv": 80, "fp8_weights": 80, "mla": 80}
# The image every way-out names: the newest line whose facts start on every GPU the pack knows.
RECOMMENDED = image_facts(DEFAULT_IMAGE) or image_facts("vllm/vllm-openai:v0.19.1")
VOLTA_IMAGE = "vllm/vllm-openai:v0.19.1"


def model_arch_or_none(name: str | None) -> Any:
    """The catalog's ModelArch for a name, None when unknown."""
    if not name:
        return None
    try:
        return model_arch(name)
    except KeyError:
        return None


def image_key(launch: Launch) -> str:
    """The stack key (or, for a raw container, the label) that states the image."""
    pool = launch.props.get("pool")
    return f"pools.{pool}.image" if launch.resource == "ModelServer" and pool else "the container's image"


def model_key(launch: Launch, field: str) -> str:
    """The stack key of a model field (models.<model>.<field>), or the flag for a raw container."""
    model = launch.props.get("model")
    return f"models.{model}.{field}" if launch.resource == "ModelServer" and model else f"--{field}"


def set_model(launch: Launch, field: str, value: str) -> str:
    """How to change a model field: 'set models.<model>.<field>: <value>', or 'pass --<field> <value>'."""
    key = model_key(launch, field)
    return f"set {key}: {value}" if not key.startswith("--") else f"pass {key} {value}"


def _image(facts: ImageFacts) -> str:
    """The image, as the rules that need its facts name it (an unknown image is not theirs to judge)."""
    return f"image {facts.ref} (vLLM {facts.version})"


def _dtype(launch: Launch) -> str:
    given = str(launch.args.get("dtype", "auto"))
    return DTYPE_ALIASES.get(given, given)


def _float32(launch: Launch, model_type: str) -> bool:
    """Whether the weights compute in float32: asked for, or auto below sm_80 on a model type refusing float16."""
    dtype = _dtype(launch)
    if dtype != "auto":
        return dtype == "float32"
    return (launch.capability or 0) < EVERY_VERSION_MIN["bf16"] and model_type in FP16_REFUSING_MODEL_TYPES


def check_dtype(launch: Launch, config: dict[str, Any]) -> list[str]:
    """bf16 below sm_80 (every version), and float32 where half was meant."""
    facts = launch.facts
    need = facts.bf16_min_capability if facts else EVERY_VERSION_MIN["bf16"]
    given = launch.args.get("dtype")  # read only where it is bfloat16 or float32: given
    dtype = _dtype(launch)
    arch = model_arch_or_none(launch.arch)
    model_type = getattr(arch, "model_type", None)
    cap = launch.capability or 0
    if dtype == "bfloat16" and cap < need:
        source = facts.cite("bf16_min_capability") if facts else "every known vLLM version"
        return [
            f"--dtype {given}: bfloat16 needs compute capability {need // 10}.{need % 10}; {launch.where()} has "
            f"none (vLLM refuses it at startup; {source}). Instead, {set_model(launch, 'dtype', 'half')}."
        ]
    if dtype == "float32" and not config["allowFloat32"]:
        return [
            f"--dtype {given}: float32 doubles the weights' memory and runs without tensor cores on "
            f"{launch.where()}. Use --dtype half, or set allowFloat32 in this policy's config if meant."
        ]
    if dtype == "auto" and cap < need and model_type in FP16_REFUSING_MODEL_TYPES and not config["allowFloat32"]:
        return [
            f"--dtype auto: model type {model_type} refuses float16 in vLLM, so on {launch.where()} "
            "auto resolves to float32 (twice the memory, no tensor cores). Serve it on sm_80+ (bfloat16), "
            "or set allowFloat32 in this policy's config to accept float32."
        ]
    return []


def check_v1(launch: Launch, config: dict[str, Any]) -> list[str]:
    """VLLM_USE_V1=0 where the image's V1 engine refuses the GPU and its envs.py reads the switch (unset
    means 1). An image without facts is the vllm-image rules' to judge."""
    facts = launch.facts
    if facts is None or not facts.reads_vllm_use_v1:
        return []
    value = launch.env.get("VLLM_USE_V1")
    if value == "0" and not facts.v0_engine:
        return [
            f"VLLM_USE_V1=0 selects the V0 engine, which {_image(facts)} no longer has: it stops at startup "
            f"({facts.cite('v0_engine')}). Remove VLLM_USE_V1 from the container's env (V1 runs on "
            f"{launch.where()} in this image)."
        ]
    if facts.runs_v1(launch.capability or 0):
        return []
    if value == "0":
        return []
    state = f"is unset (vLLM {facts.version} reads unset as 1)" if value is None else f"is {value!r}"
    return [
        f"VLLM_USE_V1 {state}: the V1 engine of {_image(facts)} needs compute capability "
        f"{(facts.v1_min_capability or 0) / 10:.1f} and {launch.where()} has less (VLLM_USE_V1=1 raises "
        f"NotImplementedError; {facts.cite('v1_min_capability')}). Set VLLM_USE_V1=0 in the container's env."
    ]


def check_v1_ignored(launch: Launch, config: dict[str, Any]) -> list[str]:
    """Advisory: VLLM_USE_V1 given to an image whose vLLM no longer reads it (V0 is gone)."""
    facts = launch.facts
    if facts is None or facts.reads_vllm_use_v1 or "VLLM_USE_V1" not in launch.env:
        return []
    return [
        f"VLLM_USE_V1={launch.env['VLLM_USE_V1']} does nothing in {_image(facts)}: its envs.py no longer "
        f"reads it and the only engine is V1 ({facts.cite('reads_vllm_use_v1')}). Remove VLLM_USE_V1."
    ]


def _quantization(launch: Launch) -> tuple[str | None, str]:
    """The method vLLM will use and where it comes from: --quantization, else the checkpoint's."""
    flag = launch.args.get("quantization")
    if flag:
        return str(flag), f"--quantization {flag}"
    if launch.quantization:
        return str(
            launch.quantization
        ), f"the checkpoint's quantization {launch.quantization} ({model_key(launch, 'quantization')})"
    return None, ""


def check_quantization(launch: Launch, config: dict[str, Any]) -> list[str]:
    """The method's minimum capability in the image's vLLM above the GPU's (FP8 methods: gpu-fp8)."""
    facts = launch.facts
    method, source = _quantization(launch)
    if facts is None or method is None or method in FP8_WEIGHT_METHODS or method not in facts.quantizations:
        return []
    need = facts.quantizations[method].min_capability
    cap = launch.capability or 0
    if need is None:
        return [f"{source}: not a CUDA method in vLLM {facts.version} (it targets TPU, Neuron, Intel or CPU)."]
    if need <= cap:
        return []
    works = sorted(
        m
        for m, q in facts.quantizations.items()
        if q.min_capability is not None and q.min_capability <= cap and m not in FP8_WEIGHT_METHODS
    )
    way_out = QUANTIZATION_WAY_OUT.get(method, "use a checkpoint in a method that runs here: " + ", ".join(works))
    return [
        f"{source}: vLLM {facts.version} needs {capability_text(need)} for {method}; {launch.where()} has less "
        f'("Minimum capability: {need}. Current capability: {cap}."; {facts.cite("quantizations")}). '
        f"Instead, {way_out}."
    ]


# The method vLLM swaps in for a GPTQ or AWQ checkpoint when no --quantization is given and its Marlin kernel runs on
# the GPU (override_quantization_method takes user_quant None, "marlin" or the Marlin name; an explicit gptq or awq
# stays as it is): ModelConfig._verify_quantization, vLLM 0.19.1 config/model.py:924-994, gptq_marlin.py:215-239,
# awq_marlin.py:232-255; 0.9.2 config.py:881, gptq_marlin.py:160-166, awq_marlin.py:107-111. [code]
CHECKPOINT_OVERRIDES = {"gptq": "gptq_marlin", "awq": "awq_marlin"}
# `--dtype` values as the way out names them (the stack's models.*.dtype spelling for float16).
_DTYPE_FLAG = {"float16": "half", "bfloat16": "bfloat16", "float32": "float32"}


def _act_dtypes_used(launch: Launch, facts: ImageFacts) -> tuple[str, ...]:
    """The activation dtypes vLLM may start with (ModelConfig.dtype): the one --dtype names; for auto
    (_resolve_auto_dtype) below sm_80 float16, or float32 for a model type that refuses float16, and from sm_80
    the checkpoint's config.json dtype, which the pack does not read (float16 or bfloat16; bfloat16 for those
    model types). () when the GPU is unknown and --dtype is auto."""
    dtype = _dtype(launch)
    if dtype != "auto":
        return (dtype,)
    if launch.capability is None:
        return ()
    bf16 = launch.capability >= facts.bf16_min_capability
    if getattr(model_arch_or_none(launch.arch), "model_type", None) in FP16_REFUSING_MODEL_TYPES:
        return ("bfloat16",) if bf16 else ("float32",)
    return ("float16", "bfloat16") if bf16 else ("float16",)


def _torch_list(dtypes: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"torch.{d}" for d in dtypes) + "]"


def check_quantization_dtype(launch: Launch, config: dict[str, Any]) -> list[str]:
    """The activation dtype outside what the quantization method accepts in the image's vLLM: VllmConfig
    refuses it at startup ("torch.bfloat16 is not supported for quantization method gptq"). Judged where the
    outcome is certain: every method vLLM may end with (a checkpoint's GPTQ/AWQ may become Marlin) refuses every
    dtype it may start with. A method whose capability the GPU lacks is gpu-quantization's to say."""
    facts = launch.facts
    method, source = _quantization(launch)
    if facts is None or method is None or method not in facts.quantizations:
        return []
    cap = launch.capability
    methods = [method]
    upgrade = CHECKPOINT_OVERRIDES.get(method)
    if not launch.args.get("quantization") and upgrade in facts.quantizations and cap is not None:
        need = facts.quantizations[upgrade].min_capability  # type: ignore[index]
        if need is not None and cap >= need:
            methods.append(upgrade)  # type: ignore[arg-type]
    quants = {m: facts.quantizations[m] for m in methods}
    if any(q.min_capability is None or (cap is not None and cap < q.min_capability) for q in quants.values()):
        return []
    accepted = {m: q.supported_act_dtypes(cap) for m, q in quants.items()}
    used = _act_dtypes_used(launch, facts)
    if not used or any(not a for a in accepted.values()) or any(d in a for d in used for a in accepted.values()):
        return []
    given = launch.args.get("dtype")  # read only where --dtype is given
    dtype = used[0]
    arch = model_arch_or_none(launch.arch)
    if _dtype(launch) != "auto":
        dtype_text = f"--dtype {given}"
    elif dtype == "float32":
        dtype_text = f"--dtype auto (float32 on {launch.where()}: model type {arch.model_type} refuses float16)"
    else:
        dtype_text = f"--dtype auto ({' or '.join(used)} on {launch.where()})"
    runs = " and ".join(f"{m} in {', '.join(a)} only" for m, a in accepted.items())
    if len(methods) > 1:
        runs += f" (vLLM swaps in {methods[1]} for the checkpoint when --quantization is unset)"
    says = " or ".join(
        f'"torch.{dtype} is not supported for quantization method {m}. Supported dtypes: {_torch_list(a)}"'
        for m, a in accepted.items()
    )
    defs = ", ".join(
        f"{m}: {q.act_dtypes_source.removeprefix('vllm/model_executor/layers/')}" for m, q in quants.items()
    )
    bf16_runs = cap is None or cap >= facts.bf16_min_capability
    refuses_fp16 = getattr(arch, "model_type", None) in FP16_REFUSING_MODEL_TYPES
    ways = [
        d
        for d in ("float16", "bfloat16", "float32")
        if d in accepted[method] and not (d == "bfloat16" and not bf16_runs) and not (d == "float16" and refuses_fp16)
    ]
    fix = (
        set_model(launch, "dtype", _DTYPE_FLAG[ways[0]])
        if ways
        else f"no dtype {method} accepts runs here: serve a checkpoint in a method that accepts {dtype}"
    )
    return [
        f"{source} with {dtype_text}: vLLM {facts.version} runs {runs}, so it stops at startup ({says}; "
        f"{facts.cite('quantization_act_dtypes')}; get_supported_act_dtypes of {defs}). Instead, {fix}."
    ]


def check_quantization_moe(launch: Launch, config: dict[str, Any]) -> list[str]:
    """A quantization method without a FusedMoE method for a MoE model (AssertionError at model build)."""
    facts = launch.facts
    method, source = _quantization(launch)
    arch = model_arch_or_none(launch.arch)
    if facts is None or method is None or arch is None or not arch.is_moe or method not in facts.quantizations:
        return []
    if facts.quantizations[method].moe != "none":
        return []
    routes = []
    if "moe_wna16" in facts.quantizations and method.startswith("gptq"):
        routes.append(
            f"{set_model(launch, 'quantization', 'moe_wna16')} (a GPTQ 4/8-bit checkpoint with "
            "desc_act: false; its Triton path needs a Triton that compiles for the GPU)"
        )
    later = [
        f
        for f in [RECOMMENDED]
        if f is not None and f.quantizations.get(method, None) is not None and f.quantizations[method].moe != "none"
    ]
    if later:
        routes.append(
            f"use {later[0].ref} ({image_key(launch)}), whose vLLM {later[0].version} routes {method} MoE "
            f"layers to MoeWNA16 by itself ({later[0].cite('quantizations')})"
        )
    return [
        f"{source} on {arch.name} ({arch.model_type}, a MoE model): vLLM {facts.version} has no FusedMoE method for "
        f"{method}, so the model fails to build (AssertionError in FusedMoE; {facts.cite('quantizations')}). "
        f"Instead, {' or '.join(routes) or 'use a method with a MoE path'}."
    ]


def check_fp8(launch: Launch, config: dict[str, Any]) -> list[str]:
    """An FP8 KV cache or FP8 checkpoint below the image's minimum (unknown images: the strictest known line)."""
    facts = launch.facts
    cap = launch.capability or 0
    out = []
    kv = str(launch.args.get("kv_cache_dtype", "auto"))
    need_kv = facts.fp8_kv_min_capability if facts else EVERY_VERSION_MIN["fp8_kv"]
    if kv.startswith("fp8") and cap < need_kv:
        source = (
            facts.cite("fp8_kv_min_capability")
            if facts
            else (f"no known vLLM version keeps one below {capability_text(EVERY_VERSION_MIN['fp8_kv'])}")
        )
        out.append(
            f"--kv-cache-dtype {kv}: vLLM{' ' + facts.version if facts else ''} cannot keep an fp8 KV cache on "
            f"{launch.where()} ({source}). Use --kv-cache-dtype auto (float16 cache) "
            "and lower --max-model-len or --max-num-seqs if the cache does not fit."
        )
    method, source = _quantization(launch)
    if method in FP8_WEIGHT_METHODS:
        q = facts.quantizations.get(method) if facts else None
        need = q.min_capability if q is not None and q.min_capability is not None else EVERY_VERSION_MIN["fp8_weights"]
        if cap < need:
            why = facts.cite("quantizations") if facts else "every known vLLM version"
            out.append(
                f"{source}: FP8 weights need {capability_text(need)} in vLLM"
                f"{' ' + facts.version if facts else ''} and {launch.where()} has no FP8 units ({why}). "
                "Serve an fp16 or GPTQ checkpoint of the model instead."
            )
    return out


def _mla_model(launch: Launch) -> str | None:
    arch = model_arch_or_none(launch.arch)
    if arch is not None:
        return arch.model_type if arch.uses_mla else None
    name = launch.arch or launch.model_path or ""
    if _MLA_NAME.search(name) and "distill" not in name.lower():
        return name
    return None


# Model names whose checkpoints use MLA, for containers without a catalog arch (DeepSeek-V2/V3/R1, Kimi-K2;
# not the R1 distills, which are Qwen/Llama models).
_MLA_NAME = re.compile(r"deepseek[-_]?(v2|v3|r1)(?![-_]?distill)|kimi[-_]?k2", re.IGNORECASE)


def _mla_on(launch: Launch) -> bool:
    return launch.env.get("VLLM_MLA_DISABLE") not in ("1", "true", "True")


def _moe_triton(launch: Launch) -> str | None:
    """The Triton fused-MoE kernel the pool runs in fp16, or None (dense model, fp32, or a method without it)."""
    arch = model_arch_or_none(launch.arch)
    if arch is None or not arch.is_moe or _float32(launch, arch.model_type):
        return None
    method, _ = _quantization(launch)
    if method is None:
        return f"the fp16 fused-MoE kernel of {arch.name}"
    q = launch.facts.quantizations.get(method) if launch.facts else None
    if method == "moe_wna16" or (q is not None and q.moe == "moe_wna16"):
        return f"the MoeWNA16 int4 fused-MoE Triton kernel of {arch.name} (every prefill)"
    return None


def triton_kernels(launch: Launch) -> list[str]:
    """The Triton kernels with fp16 `tl.dot` the pool will run (what a Triton without them kills)."""
    facts = launch.facts
    cap = launch.capability or 0
    kernels = []
    moe = _moe_triton(launch)
    if moe:
        kernels.append(moe)
    # Triton attention and FlexAttention (torch.compile's Triton templates) both run fp16 tl.dot.
    if facts is not None and facts.attention_backend(cap).startswith(("TRITON", "FLEX")):
        kernels.append(f"{facts.attention_backend(cap)} attention")
    elif launch.args.get("enable_prefix_caching") or launch.args.get("enable_chunked_prefill"):
        kernels.append("the prefix-prefill attention kernel (chunked prefill / prefix caching)")
    if _mla_model(launch) and _mla_on(launch):
        kernels.append("Triton MLA decode")
    return kernels


def check_triton(launch: Launch, config: dict[str, Any]) -> list[str]:
    """The image's Triton cannot compile fp16 `tl.dot` on this GPU, for a kernel the pool will run."""
    facts = launch.facts
    cap = launch.capability or 0
    if facts is None or facts.triton_fp16_dot(cap) is not False:
        return []
    kernels = triton_kernels(launch)
    if not kernels:
        return []
    t = facts.triton_facts
    assert t is not None
    ways = [
        f"use {VOLTA_IMAGE} ({image_key(launch)}; Triton {image_facts(VOLTA_IMAGE).triton} compiles them for "  # type: ignore[union-attr]
        "sm_70 with FMA, no tensor cores)"
    ]
    if _moe_triton(launch) and len(kernels) == 1:
        ways.append(f"{set_model(launch, 'dtype', 'float32')} (fp32 dots compile; twice the weights)")
    return [
        f"{', '.join(kernels)}: Triton {t.version} in {_image(facts)} cannot compile fp16 tl.dot below "
        f'sm_{t.fp16_dot_min_capability} ("{t.failure}"; {t.source}), so the engine dies at its startup '
        f"profile run on {launch.where()}. Instead, {' or '.join(ways)}."
    ]


def check_prefill(launch: Launch, config: dict[str, Any]) -> list[str]:
    """Chunked prefill and prefix caching where the image's kernels die on the GPU (incl. V0's >32k auto switch)."""
    facts = launch.facts
    cap = launch.capability or 0
    if facts is None or cap >= facts.prefix_prefill_min_capability:
        return []
    out = []
    why = (
        f"the prefix-prefill kernel of {_image(facts)} fails on {launch.where()} "
        f"({facts.cite('prefix_prefill_min_capability')})"
    )
    if launch.args.get("enable_prefix_caching"):
        out.append(f"--enable-prefix-caching: {why}. Remove it (enablePrefixCaching: false).")
    chunked = launch.args.get("enable_chunked_prefill")
    if chunked:
        out.append(f"--enable-chunked-prefill: {why}. Remove it (enableChunkedPrefill: false).")
    auto = facts.chunked_prefill_auto_above
    if chunked is None and auto is not None:
        length = launch.args.get("max_model_len")
        if length is None:
            out.append(
                f"--max-model-len is unset: vLLM takes the model's context length and turns chunked "
                f"prefill on by itself above {auto}; {why}. Set --max-model-len <= {auto} or pass "
                "--no-enable-chunked-prefill."
            )
        elif length > auto:
            out.append(
                f"--max-model-len {length}: above {auto} vLLM {facts.version} turns chunked prefill on by "
                f"itself; {why}. Set --max-model-len <= {auto} or pass --no-enable-chunked-prefill."
            )
    return out


def check_mla(launch: Launch, config: dict[str, Any]) -> list[str]:
    """MLA attention below sm_80 (every version through 0.19), unless VLLM_MLA_DISABLE=1."""
    facts = launch.facts
    cap = launch.capability or 0
    need = facts.mla_min_capability if facts else EVERY_VERSION_MIN["mla"]
    model = _mla_model(launch)
    if model is None or cap >= need or not _mla_on(launch):
        return []
    source = facts.cite("mla_min_capability") if facts else "vllm#14016 [observed]; every version through 0.19"
    message = (
        f"{model} uses MLA attention: its prefill calls FlashAttention-2, which needs compute capability "
        f"8.0, with no fallback, so vLLM dies in its startup profile run on {launch.where()} "
        f'("FlashAttention only supports Ampere GPUs or newer"; {source}). Set VLLM_MLA_DISABLE=1 in '
        "the pool's env (vLLM then keeps the full per-head KV cache: check the capacity plan), or serve it "
        "on sm_80+."
    )
    without = launch.props.get("capacityWithoutMla")
    if isinstance(without, Mapping) and without.get("fits") is False:
        message += f" With it, {without.get('reason')}."
    elif isinstance(without, Mapping) and without.get("kv_tokens") is not None:
        tokens, length = number(without["kv_tokens"]) or 0, number(without.get("max_model_len")) or 0
        message += (
            f" With it, the KV cache holds {tokens} tokens per instance "
            f"({tokens / length if length else 0:.1f} sequences of {length})."
        )
    return [message]


def check_attention_backend(launch: Launch, config: dict[str, Any]) -> list[str]:
    """--attention-backend naming a backend that does not run on this GPU."""
    facts = launch.facts
    # The flag from 0.14; VLLM_ATTENTION_BACKEND on the lines before it.
    backend, named = launch.args.get("attention_backend"), "--attention-backend"
    if not backend and launch.env.get("VLLM_ATTENTION_BACKEND"):
        backend, named = launch.env["VLLM_ATTENTION_BACKEND"], "VLLM_ATTENTION_BACKEND"
    if facts is None or not backend:
        return []
    need = ATTENTION_MIN_CAPABILITY.get(str(backend))
    cap = launch.capability or 0
    if need is None or cap >= need:
        return []
    return [
        f"{named} {backend}: needs {capability_text(need)}; {launch.where()} has less "
        f"(its supports_compute_capability in vLLM {facts.version}). On this GPU vLLM picks "
        f"{facts.attention_backend(cap)}: set that, or leave the flag out."
    ]


# vLLM 0.19.1 v1/attention/backends/*: supports_compute_capability (flash_attn.py:180 >= 8.0,
# flashinfer.py:394 >= 7.5, triton_attn.py:354 any, mla/flashmla.py:74 9.x/10.x, mla/cutlass_mla.py:66 10.x,
# mla/flashattn_mla.py:69 9.x, mla/flashinfer_mla.py:66 10.x, mla/triton_mla.py:62 any). [code]
ATTENTION_MIN_CAPABILITY = {
    "FLASH_ATTN": 80,
    "FLASHINFER": 75,
    "TRITON_ATTN": 0,
    "FLEX_ATTENTION": 0,
    "FLASHMLA": 90,
    "CUTLASS_MLA": 100,
    "FLASH_ATTN_MLA": 90,
    "FLASHINFER_MLA": 100,
    "TRITON_MLA": 0,
}


# The rules that need the GPU (LaunchRule.needs_gpu, and vllm-image's arch check).
GPU_RULES = (
    "gpu-dtype",
    "vllm-v1-engine",
    "gpu-quantization",
    "quantization-moe",
    "gpu-fp8",
    "triton-fp16-dot",
    "gpu-chunked-prefill-prefix-caching",
    "mla-attention",
    "attention-backend",
    "vllm-image",
)
# The rules that need the image's facts (an unknown image is not judged by them).
IMAGE_RULES = (
    "vllm-v1-engine",
    "gpu-quantization",
    "quantization-dtype",
    "quantization-moe",
    "triton-fp16-dot",
    "gpu-chunked-prefill-prefix-caching",
    "attention-backend",
    "vllm-serve-flags",
    "vllm-image",
)


def check_gpu_known(launch: Launch, config: dict[str, Any]) -> list[str]:
    """Advisory: a raw vLLM container whose GPU the hardware rules cannot look up (no label, or a name not
    in the facts table) would otherwise pass them silently as not applicable."""
    if launch.resource != "container" or launch.gpu is not None:
        return []
    rules = ", ".join(GPU_RULES)
    fix = (
        f"Add the label {GPU_MODEL_LABEL}=<nvidia-smi name> (nvidia-smi --query-gpu=name --format=csv,noheader, "
        "e.g. Tesla V100-SXM2-32GB) so the hardware rules apply."
    )
    if not launch.gpu_name:
        return [
            f"this vLLM container has no {GPU_MODEL_LABEL} label, so the hardware rules ({rules}) cannot "
            f"judge it. {fix}"
        ]
    return [
        f"{GPU_MODEL_LABEL}={launch.gpu_name} is not a GPU in this pack's facts table (known: "
        f"{', '.join(GPUS)}), so the hardware rules ({rules}) cannot judge this vLLM container. "
        f"Label it with one of the known names."
    ]


def check_image_known(launch: Launch, config: dict[str, Any]) -> list[str]:
    """Advisory: an image the facts table does not know cannot be judged by the rules that need its facts."""
    if launch.facts is not None:
        return []
    from components.engines.vllm.facts import IMAGES

    how = (
        "declare its facts under pools.<pool>.imageFacts (like: a known image, then version, cuda, torch, "
        "torchArchList, triton)"
        if launch.resource == "ModelServer"
        else "use a known image"
    )
    return [
        f"image {launch.image or '(none stated)'} is not in the facts table (known: {', '.join(sorted(IMAGES))}), so "
        f"{', '.join(IMAGE_RULES)} cannot judge it; only the checks that need no image facts ran (bf16, FP8 and "
        f"MLA below sm_80). To have it judged, {how}, or use {VOLTA_IMAGE} ({image_key(launch)})."
    ]
