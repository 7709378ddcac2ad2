"""vLLM's hardware rules called directly on a Launch, as tables: the dtype on
each side of sm_80 (known and unknown images, float32 allowed or not, a model type that refuses float16),
the V1 switch per image line x GPU x value, an FP8 KV cache and FP8 weights per capability, MLA (by catalog
arch or by name, the switch's spellings, the capacity without it), the attention backend per GPU, and the
advisories for an unknown GPU or image, and the kernels that die below a minimum: chunked prefill and prefix
caching per image line x GPU x flag x --max-model-len, the Triton kernels each server runs and Triton without
fp16 tl.dot, each quantization method against its minimum, a method without a MoE path on a MoE model, and
the activation dtypes each method accepts per image line x GPU capability x model type: exact messages."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from components.engines.vllm.facts import IMAGES, image_facts
from components.engines.vllm.launch import Launch
from components.engines.vllm.rules.hardware import (
    GPU_RULES,
    IMAGE_RULES,
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
    triton_kernels,
)
from components.facts.hardware import GPUS
from tests.test_vllm_rules_table import V011, V19, V92, launch

V100 = "Tesla V100-SXM2-32GB"
A100 = "NVIDIA A100-SXM4-80GB"
T4 = "Tesla T4"
PRIVATE = "registry.example/vllm:1"
NO_F32 = {"allowFloat32": False}
F32 = {"allowFloat32": True}


def at(image: str = V19, gpu: str = V100, **changes: Any) -> Launch:
    """The chat server on `image` and `gpu` (0.9.2 and 0.11.0 without --attention-backend, which they lack)."""
    drop = changes.pop("argv_drop", [])
    if image in (V92, V011):
        drop = ["--attention-backend", *drop]
    return launch(image=image, gpuModel=gpu, argv_drop=drop, **changes)


def dtype(value: str, image: str = V19, gpu: str = V100, **changes: Any) -> Launch:
    return at(image, gpu, argv_drop=["--dtype"], argv_add=["--dtype", value], **changes)


def bf16(given: str, where: str, source: str, fix: str = "set models.qwen3-30b-a3b.dtype: half") -> str:
    return (
        f"--dtype {given}: bfloat16 needs compute capability 8.0; {where} has none (vLLM refuses it at startup; "
        f"{source}). Instead, {fix}."
    )


F32_MESSAGE = (
    "--dtype {given}: float32 doubles the weights' memory and runs without tensor cores on {where}. Use --dtype "
    "half, or set allowFloat32 in this policy's config if meant."
)
V100_AT = f"{V100} (sm_70)"


def test_bfloat16_below_sm80_names_the_images_source_or_every_version() -> None:
    found = dtype("bfloat16")
    assert found.facts is not None
    assert check_dtype(found, NO_F32) == [bf16("bfloat16", V100_AT, found.facts.cite("bf16_min_capability"))]
    assert check_dtype(dtype("bfloat16", image=PRIVATE), NO_F32) == [
        bf16("bfloat16", V100_AT, "every known vLLM version")
    ]
    assert check_dtype(dtype("bfloat16", gpu=A100), NO_F32) == []
    assert check_dtype(dtype("bfloat16", image=PRIVATE, gpu=A100), NO_F32) == []
    assert check_dtype(dtype("bfloat16", gpu="NVIDIA A10"), NO_F32) == []
    assert check_dtype(dtype("bfloat16", gpu=T4), NO_F32) == [
        bf16("bfloat16", f"{T4} (sm_75)", found.facts.cite("bf16_min_capability"))
    ]
    # A raw container says the flag to pass, not the stack key.
    raw = dtype("bfloat16", pool=None, model=None)
    assert check_dtype(raw, NO_F32)[0].endswith("Instead, pass --dtype half.")
    # The minimum is the image's facts' (every line's is 8.0 today).
    assert check_dtype(replace(found, facts=replace(found.facts, bf16_min_capability=70)), NO_F32) == []


@pytest.mark.parametrize("given", ["float32", "float"])
def test_float32_is_refused_unless_the_policy_allows_it(given: str) -> None:
    assert check_dtype(dtype(given), NO_F32) == [F32_MESSAGE.format(given=given, where=V100_AT)]
    assert check_dtype(dtype(given), F32) == []
    assert check_dtype(dtype(given, gpu=A100), NO_F32) == [F32_MESSAGE.format(given=given, where=f"{A100} (sm_80)")]


# A model type that refuses float16 resolves auto to float32 below sm_80 (gemma2 in the catalog).
AUTO_F32 = (
    "--dtype auto: model type {t} refuses float16 in vLLM, so on {where} auto resolves to float32 (twice the "
    "memory, no tensor cores). Serve it on sm_80+ (bfloat16), or set allowFloat32 in this policy's config to "
    "accept float32."
)


def test_auto_on_a_model_type_that_refuses_float16_is_float32_below_sm80(monkeypatch: pytest.MonkeyPatch) -> None:
    from components.engines.vllm.rules import hardware

    # No catalog model refuses float16 today: take Qwen3-MoE's type as one that does.
    monkeypatch.setattr(hardware, "FP16_REFUSING_MODEL_TYPES", frozenset({"qwen3_moe"}))
    assert check_dtype(dtype("auto"), NO_F32) == [AUTO_F32.format(t="qwen3_moe", where=V100_AT)]
    assert check_dtype(dtype("auto"), F32) == []
    assert check_dtype(dtype("auto", gpu=A100), NO_F32) == []
    assert check_dtype(dtype("auto", arch="deepseek-r1"), NO_F32) == []
    # A model not in the catalog has no model type to refuse float16.
    assert check_dtype(dtype("auto", arch=None), NO_F32) == []
    assert check_dtype(dtype("half"), NO_F32) == []
    # Unset, --dtype is auto.
    assert check_dtype(at(V19, argv_drop=["--dtype"]), NO_F32) == [AUTO_F32.format(t="qwen3_moe", where=V100_AT)]


def v1_needed(image: str, version: str, where: str, cite: str, state: str) -> str:
    return (
        f"VLLM_USE_V1 {state}: the V1 engine of image {image} (vLLM {version}) needs compute capability 8.0 and "
        f"{where} has less (VLLM_USE_V1=1 raises NotImplementedError; {cite}). Set VLLM_USE_V1=0 in the "
        "container's env."
    )


# (image, GPU, VLLM_USE_V1, whether vllm-v1-engine refuses it, with which state).
V1: list[tuple[str, str, str | None, str | None]] = [
    (V92, V100, None, "is unset (vLLM 0.9.2 reads unset as 1)"),
    (V92, V100, "1", "is '1'"),
    (V92, T4, None, "is unset (vLLM 0.9.2 reads unset as 1)"),
    (V92, V100, "0", None),
    (V92, A100, None, None),
    (V92, A100, "0", None),
    (V011, V100, None, None),
    (V19, V100, None, None),
    (V19, V100, "0", None),
    (PRIVATE, V100, None, None),
]


@pytest.mark.parametrize(("image", "gpu", "value", "state"), V1)
def test_vllm_use_v1_per_image_line_gpu_and_value(image: str, gpu: str, value: str | None, state: str | None) -> None:
    found = at(image, gpu, env={"VLLM_USE_V1": value} if value is not None else {})
    if state is None:
        assert check_v1(found, {}) == []
        return
    assert found.facts is not None
    where = f"{gpu} ({'sm_70' if gpu == V100 else 'sm_75'})"
    assert check_v1(found, {}) == [
        v1_needed(image, found.facts.version, where, found.facts.cite("v1_min_capability"), state)
    ]


def test_vllm_use_v1_0_on_a_line_without_v0_is_refused() -> None:
    found = at(V011, env={"VLLM_USE_V1": "0"})
    assert found.facts is not None
    assert check_v1(found, {}) == [
        f"VLLM_USE_V1=0 selects the V0 engine, which image {V011} (vLLM 0.11.0) no longer has: it stops at startup "
        f"({found.facts.cite('v0_engine')}). Remove VLLM_USE_V1 from the container's env (V1 runs on {V100_AT} in "
        "this image)."
    ]
    assert check_v1(at(V011, env={"VLLM_USE_V1": "1"}), {}) == []


@pytest.mark.parametrize(
    ("image", "env", "ignored"),
    [
        (V19, {"VLLM_USE_V1": "0"}, True),
        (V19, {"VLLM_USE_V1": "1"}, True),
        (V19, {}, False),
        (V92, {"VLLM_USE_V1": "0"}, False),
        (PRIVATE, {"VLLM_USE_V1": "0"}, False),
    ],
)
def test_vllm_use_v1_given_to_a_line_that_no_longer_reads_it(image: str, env: dict[str, str], ignored: bool) -> None:
    found = at(image, env=env)
    if not ignored:
        assert check_v1_ignored(found, {}) == []
        return
    assert found.facts is not None
    assert check_v1_ignored(found, {}) == [
        f"VLLM_USE_V1={env['VLLM_USE_V1']} does nothing in image {V19} (vLLM 0.19.1): its envs.py no longer reads it "
        f"and the only engine is V1 ({found.facts.cite('reads_vllm_use_v1')}). Remove VLLM_USE_V1."
    ]


def fp8_kv(kv: str, version: str, where: str, source: str) -> str:
    return (
        f"--kv-cache-dtype {kv}: vLLM{version} cannot keep an fp8 KV cache on {where} ({source}). Use "
        "--kv-cache-dtype auto (float16 cache) and lower --max-model-len or --max-num-seqs if the cache does not fit."
    )


@pytest.mark.parametrize(
    ("image", "gpu", "kv", "refused"),
    [
        (V19, V100, "fp8", True),
        (V19, V100, "fp8_e5m2", True),
        (V19, V100, "auto", False),
        (V19, A100, "fp8", False),
        (V92, T4, "fp8", False),
        (V92, V100, "fp8", True),
        (PRIVATE, T4, "fp8_e4m3", True),
        (PRIVATE, A100, "fp8", False),
    ],
)
def test_an_fp8_kv_cache_per_image_line_and_capability(image: str, gpu: str, kv: str, refused: bool) -> None:
    found = at(image, gpu, argv_add=["--kv-cache-dtype", kv])
    if not refused:
        assert check_fp8(found, {}) == []
        return
    where = f"{gpu} ({'sm_70' if gpu == V100 else 'sm_75'})"
    if found.facts is None:
        want = fp8_kv(kv, "", where, "no known vLLM version keeps one below sm_80 (compute capability 8.0)")
    else:
        want = fp8_kv(kv, f" {found.facts.version}", where, found.facts.cite("fp8_kv_min_capability"))
    assert check_fp8(found, {}) == [want]


def fp8_weights(source: str, need: str, version: str, where: str, why: str) -> str:
    return (
        f"{source}: FP8 weights need {need} in vLLM{version} and {where} has no FP8 units ({why}). Serve an fp16 or "
        "GPTQ checkpoint of the model instead."
    )


def test_fp8_weights_per_image_line_and_capability() -> None:
    found = at(V19, argv_add=["--quantization", "fp8"])
    assert found.facts is not None
    assert check_fp8(found, {}) == [
        fp8_weights(
            "--quantization fp8",
            "sm_75 (compute capability 7.5)",
            " 0.19.1",
            V100_AT,
            found.facts.cite("quantizations"),
        )
    ]
    assert check_fp8(at(V19, T4, argv_add=["--quantization", "fp8"]), {}) == []
    # The checkpoint's own method, on an image without facts: the strictest line, sm_80.
    private = at(PRIVATE, T4, quantization="fp8")
    assert check_fp8(private, {}) == [
        fp8_weights(
            "the checkpoint's quantization fp8 (models.qwen3-30b-a3b.quantization)",
            "sm_80 (compute capability 8.0)",
            "",
            f"{T4} (sm_75)",
            "every known vLLM version",
        )
    ]
    assert check_fp8(at(PRIVATE, A100, quantization="fp8"), {}) == []
    assert check_fp8(at(V19, argv_add=["--quantization", "gptq"]), {}) == []
    # Both at once: the cache first.
    both = at(PRIVATE, V100, argv_add=["--kv-cache-dtype", "fp8", "--quantization", "fp8"])
    assert len(check_fp8(both, {})) == 2


def mla(model: str, where: str, source: str) -> str:
    return (
        f"{model} uses MLA attention: its prefill calls FlashAttention-2, which needs compute capability 8.0, with no "
        f'fallback, so vLLM dies in its startup profile run on {where} ("FlashAttention only supports Ampere GPUs '
        f"or newer\"; {source}). Set VLLM_MLA_DISABLE=1 in the pool's env (vLLM then keeps the full per-head KV "
        "cache: check the capacity plan), or serve it on sm_80+."
    )


# (arch, model path, env, image, GPU, the model named, or None: not refused).
MLA: list[tuple[str | None, str, dict[str, str], str, str, str | None]] = [
    ("deepseek-r1", "/m", {}, V19, V100, "deepseek_v3"),
    ("deepseek-r1", "/m", {"VLLM_MLA_DISABLE": "1"}, V19, V100, None),
    ("deepseek-r1", "/m", {"VLLM_MLA_DISABLE": "true"}, V19, V100, None),
    ("deepseek-r1", "/m", {"VLLM_MLA_DISABLE": "True"}, V19, V100, None),
    ("deepseek-r1", "/m", {"VLLM_MLA_DISABLE": "0"}, V19, V100, "deepseek_v3"),
    ("deepseek-r1", "/m", {"VLLM_MLA_DISABLE": "yes"}, V19, V100, "deepseek_v3"),
    ("deepseek-r1", "/m", {}, V19, A100, None),
    ("deepseek-r1", "/m", {}, PRIVATE, T4, "deepseek_v3"),
    ("qwen3-30b-a3b", "/m", {}, V19, V100, None),
    # Not in the catalog: read from the name (the arch first, else the model's path); not the R1 distills.
    ("DeepSeek-V3-0324", "/m", {}, V19, V100, "DeepSeek-V3-0324"),
    (None, "/data/models/kimi_k2-instruct", {}, V19, V100, "/data/models/kimi_k2-instruct"),
    (None, "/data/models/DeepSeek-R1-Distill-Qwen-32B", {}, V19, V100, None),
    (None, "/data/models/deepseek-r1-distill", {}, V19, V100, None),
    (None, "/data/models/DeepSeek-R1-0528-Distill-Qwen3-8B", {}, V19, V100, None),
    (None, "/data/models/DeepSeek-V2-Lite", {}, V19, V100, "/data/models/DeepSeek-V2-Lite"),
    (None, "/data/models/deepseek-coder", {}, V19, V100, None),
]


@pytest.mark.parametrize(("arch", "path", "env", "image", "gpu", "model"), MLA)
def test_mla_below_sm80_by_catalog_or_name_unless_switched_off(
    arch: str | None, path: str, env: dict[str, str], image: str, gpu: str, model: str | None
) -> None:
    found = at(image, gpu, arch=arch, modelPath=path, env=env)
    if model is None:
        assert check_mla(found, {}) == []
        return
    where = f"{gpu} ({'sm_70' if gpu == V100 else 'sm_75'})"
    source = (
        found.facts.cite("mla_min_capability") if found.facts else "vllm#14016 [observed]; every version through 0.19"
    )
    assert check_mla(found, {}) == [mla(model, where, source)]


def test_the_mla_minimum_is_the_images_facts() -> None:
    found = at(arch="deepseek-r1")
    assert found.facts is not None
    assert check_mla(replace(found, facts=replace(found.facts, mla_min_capability=70)), {}) == []


@pytest.mark.parametrize(
    ("without", "tail"),
    [
        ({"fits": False, "reason": "the weights alone need 40 GiB"}, " With it, the weights alone need 40 GiB."),
        (
            {"fits": True, "kv_tokens": 10000.0, "max_model_len": 4000.0},
            " With it, the KV cache holds 10000 tokens per instance (2.5 sequences of 4000).",
        ),
        (
            {"fits": True, "kv_tokens": 10000.0},
            " With it, the KV cache holds 10000 tokens per instance (0.0 sequences of 0).",
        ),
        (
            {"fits": True, "kv_tokens": 0, "max_model_len": 4096.0},
            " With it, the KV cache holds 0 tokens per instance (0.0 sequences of 4096).",
        ),
        ({"fits": True}, ""),
        ("not a mapping", ""),
    ],
)
def test_the_mla_message_says_what_the_pool_holds_without_it(without: Any, tail: str) -> None:
    found = at(arch="deepseek-r1", capacityWithoutMla=without)
    assert found.facts is not None
    assert check_mla(found, {}) == [mla("deepseek_v3", V100_AT, found.facts.cite("mla_min_capability")) + tail]


def backend(named: str, value: str, need: str, where: str, version: str, picks: str) -> str:
    return (
        f"{named} {value}: needs {need}; {where} has less (its supports_compute_capability in vLLM {version}). On this "
        f"GPU vLLM picks {picks}: set that, or leave the flag out."
    )


@pytest.mark.parametrize(
    ("value", "gpu", "need"),
    [
        ("FLASH_ATTN", V100, "sm_80 (compute capability 8.0)"),
        ("FLASH_ATTN", A100, None),
        ("FLASHINFER", V100, "sm_75 (compute capability 7.5)"),
        ("FLASHINFER", T4, None),
        ("FLASHMLA", A100, "sm_90 (compute capability 9.0)"),
        ("FLASHMLA", "NVIDIA H100 80GB HBM3", None),
        ("CUTLASS_MLA", "NVIDIA H100 80GB HBM3", "sm_100 (compute capability 10.0)"),
        ("TRITON_ATTN", V100, None),
        ("SOMETHING_NEW", V100, None),
    ],
)
def test_the_attention_backend_flag_per_gpu(value: str, gpu: str, need: str | None) -> None:
    found = at(V19, gpu, argv_drop=["--attention-backend"], argv_add=["--attention-backend", value])
    assert found.facts is not None and found.gpu is not None
    if need is None:
        assert check_attention_backend(found, {}) == []
        return
    where = f"{gpu} (sm_{found.gpu.capability})"
    picks = found.facts.attention_backend(found.gpu.capability)
    assert check_attention_backend(found, {}) == [backend("--attention-backend", value, need, where, "0.19.1", picks)]


def test_the_attention_backend_from_the_env_on_lines_before_the_flag() -> None:
    found = at(V92, env={"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"})
    assert found.facts is not None
    assert check_attention_backend(found, {}) == [
        backend(
            "VLLM_ATTENTION_BACKEND",
            "FLASH_ATTN",
            "sm_80 (compute capability 8.0)",
            V100_AT,
            "0.9.2",
            found.facts.attention_backend(70),
        )
    ]
    assert check_attention_backend(at(V92), {}) == []
    assert check_attention_backend(at(PRIVATE), {}) == []
    # An image without facts is not judged, whatever it names.
    flash = at(PRIVATE, argv_drop=["--attention-backend"], argv_add=["--attention-backend", "FLASH_ATTN"])
    assert flash.args.get("attention_backend") == "FLASH_ATTN"
    assert check_attention_backend(flash, {}) == []
    assert check_attention_backend(at(V92, env={"VLLM_ATTENTION_BACKEND": ""}), {}) == []


def container(gpu_name: str | None, image: str | None = V19) -> Launch:
    found = at(V19)
    return Launch(
        resource="container",
        args=found.args,
        env={},
        gpu_name=gpu_name,
        gpu=GPUS.get(gpu_name or ""),
        image=image,
        props={},
        facts=found.facts if image == V19 else None,
    )


def test_a_container_whose_gpu_the_rules_cannot_look_up_is_named() -> None:
    rules = ", ".join(GPU_RULES)
    fix = (
        "Add the label llm-cluster.gpu-model=<nvidia-smi name> (nvidia-smi --query-gpu=name --format=csv,noheader, "
        "e.g. Tesla V100-SXM2-32GB) so the hardware rules apply."
    )
    assert check_gpu_known(container(None), {}) == [
        f"this vLLM container has no llm-cluster.gpu-model label, so the hardware rules ({rules}) cannot judge it. {fix}"
    ]
    assert check_gpu_known(container("Tesla X"), {}) == [
        f"llm-cluster.gpu-model=Tesla X is not a GPU in this pack's facts table (known: {', '.join(GPUS)}), so the "
        f"hardware rules ({rules}) cannot judge this vLLM container. Label it with one of the known names."
    ]
    assert check_gpu_known(container(V100), {}) == []
    # A ModelServer always states its GPU: the spec's.
    assert check_gpu_known(at(V19, "Tesla X"), {}) == []


def unknown_image(image: str, how: str, key: str) -> str:
    return (
        f"image {image} is not in the facts table (known: {', '.join(sorted(IMAGES))}), so {', '.join(IMAGE_RULES)} "
        "cannot judge it; only the checks that need no image facts ran (bf16, FP8 and MLA below sm_80). To have it "
        f"judged, {how}, or use {V19} ({key})."
    )


def test_an_image_without_facts_is_named_with_how_to_declare_them() -> None:
    assert check_image_known(at(V19), {}) == []
    assert check_image_known(at(PRIVATE), {}) == [
        unknown_image(
            PRIVATE,
            "declare its facts under pools.<pool>.imageFacts (like: a known image, then version, cuda, torch, "
            "torchArchList, triton)",
            "pools.chat.image",
        )
    ]
    assert check_image_known(container(V100, image=PRIVATE), {}) == [
        unknown_image(PRIVATE, "use a known image", "the container's image")
    ]
    assert check_image_known(container(V100, image=None), {}) == [
        unknown_image("(none stated)", "use a known image", "the container's image")
    ]


def prefill(kind: str, image: str, where: str, auto: int = 32768, length: int = 0) -> str:
    facts = image_facts(image)
    assert facts is not None
    why = (
        f"the prefix-prefill kernel of image {facts.ref} (vLLM {facts.version}) fails on {where} "
        f"({facts.cite('prefix_prefill_min_capability')})"
    )
    return {
        "prefix": f"--enable-prefix-caching: {why}. Remove it (enablePrefixCaching: false).",
        "chunked": f"--enable-chunked-prefill: {why}. Remove it (enableChunkedPrefill: false).",
        "unset": f"--max-model-len is unset: vLLM takes the model's context length and turns chunked prefill on by "
        f"itself above {auto}; {why}. Set --max-model-len <= {auto} or pass --no-enable-chunked-prefill.",
        "above": f"--max-model-len {length}: above {auto} vLLM {facts.version} turns chunked prefill on by itself; "
        f"{why}. Set --max-model-len <= {auto} or pass --no-enable-chunked-prefill.",
    }[kind]


BOTH = ["--enable-prefix-caching", "--enable-chunked-prefill"]
LONGER = ["--max-model-len", "32769"]
# (image, GPU, flags dropped, flags added, messages): 0.9.2's kernels need sm_80 and it chunks above 32768 by
# itself; 0.19.1's run from sm_70 (the chat server's --max-model-len is 32768).
PREFILL: list[tuple[str, str, list[str], list[str], list[str]]] = [
    (V92, V100, [], [], []),
    (V92, V100, ["--max-model-len"], LONGER, [prefill("above", V92, V100_AT, length=32769)]),
    (V92, V100, ["--max-model-len"], [], [prefill("unset", V92, V100_AT)]),
    (V92, V100, [], ["--enable-prefix-caching"], [prefill("prefix", V92, V100_AT)]),
    (V92, V100, [], ["--enable-chunked-prefill"], [prefill("chunked", V92, V100_AT)]),
    (V92, V100, [], BOTH, [prefill("prefix", V92, V100_AT), prefill("chunked", V92, V100_AT)]),
    (V92, V100, ["--max-model-len"], [*LONGER, "--no-enable-chunked-prefill"], []),
    (V92, V100, ["--max-model-len"], ["--no-enable-chunked-prefill"], []),
    (V92, T4, [], ["--enable-prefix-caching"], [prefill("prefix", V92, f"{T4} (sm_75)")]),
    (V92, A100, ["--max-model-len"], BOTH, []),
    (V19, V100, ["--max-model-len"], BOTH, []),
    (PRIVATE, V100, ["--max-model-len"], BOTH, []),
]


@pytest.mark.parametrize(("image", "gpu", "drop", "add", "messages"), PREFILL)
def test_chunked_prefill_and_prefix_caching_below_the_kernels_minimum(
    image: str, gpu: str, drop: list[str], add: list[str], messages: list[str]
) -> None:
    found = at(image, gpu, argv_drop=drop, argv_add=add)
    assert found.args.errors == ()
    assert check_prefill(found, {}) == messages


def test_a_line_that_never_chunks_by_itself_is_judged_by_the_flags_alone() -> None:
    """0.19.1 with a stricter kernel minimum: no --max-model-len is no auto switch, the flag still is."""
    found = at(V19, argv_drop=["--max-model-len"])
    assert found.facts is not None and found.facts.chunked_prefill_auto_above is None
    assert check_prefill(replace(found, facts=replace(found.facts, prefix_prefill_min_capability=80)), {}) == []
    chunked = at(V19, argv_add=["--enable-chunked-prefill"])
    assert chunked.facts is not None
    stricter = replace(chunked, facts=replace(chunked.facts, prefix_prefill_min_capability=80))
    assert check_prefill(stricter, {}) == [prefill("chunked", V19, V100_AT)]


MOE = "the fp16 fused-MoE kernel of qwen3-30b-a3b"
WNA16 = "the MoeWNA16 int4 fused-MoE Triton kernel of {} (every prefill)"
PREFILL_KERNEL = "the prefix-prefill attention kernel (chunked prefill / prefix caching)"
# (image, GPU, changes, the Triton kernels with fp16 tl.dot the server runs).
KERNELS: list[tuple[str, str, dict[str, Any], list[str]]] = [
    (V92, V100, {}, [MOE]),
    (V92, V100, {"arch": "qwen3-32b"}, []),
    (V92, V100, {"arch": None}, []),
    (V92, V100, {"argv_drop": ["--dtype"], "argv_add": ["--dtype", "float32"]}, []),
    # auto is bfloat16 from sm_80 (the MoE kernel runs), float16 below it.
    (V92, A100, {"argv_drop": ["--dtype"]}, [MOE]),
    (V92, V100, {"argv_drop": ["--dtype"]}, [MOE]),
    (V92, V100, {"argv_add": ["--quantization", "moe_wna16"]}, [WNA16.format("qwen3-30b-a3b")]),
    (V92, V100, {"argv_add": ["--quantization", "gptq"]}, []),
    (V92, V100, {"quantization": "awq"}, []),
    (V19, V100, {"argv_add": ["--quantization", "gptq"]}, [WNA16.format("qwen3-30b-a3b"), "TRITON_ATTN attention"]),
    (V011, V100, {"arch": "qwen3-32b"}, ["FLEX_ATTENTION attention"]),
    (V19, A100, {"arch": "qwen3-32b", "argv_drop": ["--attention-backend"]}, []),
    (V92, V100, {"arch": "qwen3-32b", "argv_add": ["--enable-prefix-caching"]}, [PREFILL_KERNEL]),
    (V92, V100, {"arch": "qwen3-32b", "argv_add": ["--enable-chunked-prefill"]}, [PREFILL_KERNEL]),
    (
        V92,
        V100,
        {"arch": "deepseek-r1"},
        ["the fp16 fused-MoE kernel of deepseek-r1", "Triton MLA decode"],
    ),
    (
        V92,
        V100,
        {"arch": "deepseek-r1", "env": {"VLLM_MLA_DISABLE": "1"}},
        ["the fp16 fused-MoE kernel of deepseek-r1"],
    ),
    (PRIVATE, V100, {"arch": None, "modelPath": "/data/models/kimi_k2-instruct"}, ["Triton MLA decode"]),
    # An image without facts: a method that is not moe_wna16 runs no Triton MoE kernel.
    (PRIVATE, V100, {"argv_add": ["--quantization", "gptq"]}, []),
]


@pytest.mark.parametrize(("image", "gpu", "changes", "kernels"), KERNELS)
def test_the_triton_kernels_each_server_runs(image: str, gpu: str, changes: dict[str, Any], kernels: list[str]) -> None:
    found = at(image, gpu, **changes)
    assert found.args.errors == ()
    assert triton_kernels(found) == kernels


def test_a_moe_model_computing_in_float32_runs_no_fp16_moe_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    from components.engines.vllm.rules import hardware

    # No catalog model refuses float16 today: take Qwen3-MoE's type as one that does.
    monkeypatch.setattr(hardware, "FP16_REFUSING_MODEL_TYPES", frozenset({"qwen3_moe"}))
    assert triton_kernels(at(V92, V100, argv_drop=["--dtype"])) == []
    assert triton_kernels(at(V92, V100, argv_drop=["--dtype"], argv_add=["--dtype", "auto"])) == []
    assert triton_kernels(at(V92, A100, argv_drop=["--dtype"])) == [MOE]
    assert triton_kernels(at(V92, V100)) == [MOE]
    assert triton_kernels(at(V92, V100, arch="deepseek-r1-distill-qwen-32b", argv_drop=["--dtype"])) == []
    assert triton_kernels(at(V92, V100, argv_drop=["--dtype"], argv_add=["--dtype", "float"])) == []


def no_fp16_dot(kernels: list[str], where: str, ways: list[str]) -> str:
    facts = image_facts(V92)
    assert facts is not None and facts.triton_facts is not None
    t = facts.triton_facts
    return (
        f"{', '.join(kernels)}: Triton {t.version} in image {facts.ref} (vLLM {facts.version}) cannot compile fp16 "
        f'tl.dot below sm_{t.fp16_dot_min_capability} ("{t.failure}"; {t.source}), so the engine dies at its '
        f"startup profile run on {where}. Instead, {' or '.join(ways)}."
    )


VOLTA = "use vllm/vllm-openai:v0.19.1 ({}; Triton 3.6.0 compiles them for sm_70 with FMA, no tensor cores)"
FP32 = "{} (fp32 dots compile; twice the weights)"
# (image, GPU, changes, messages): 0.9.2's Triton 3.3 has no fp16 tl.dot below sm_80; 0.11 and 0.19 do.
TRITON: list[tuple[str, str, dict[str, Any], list[str]]] = [
    (
        V92,
        V100,
        {},
        [
            no_fp16_dot(
                [MOE],
                V100_AT,
                [VOLTA.format("pools.chat.image"), FP32.format("set models.qwen3-30b-a3b.dtype: float32")],
            )
        ],
    ),
    (
        V92,
        T4,
        {"argv_add": ["--enable-chunked-prefill"]},
        [no_fp16_dot([MOE, PREFILL_KERNEL], f"{T4} (sm_75)", [VOLTA.format("pools.chat.image")])],
    ),
    (
        V92,
        V100,
        {"arch": "qwen3-32b", "argv_add": ["--enable-prefix-caching"]},
        [no_fp16_dot([PREFILL_KERNEL], V100_AT, [VOLTA.format("pools.chat.image")])],
    ),
    (
        V92,
        V100,
        {"pool": None, "model": None},
        [no_fp16_dot([MOE], V100_AT, [VOLTA.format("the container's image"), FP32.format("pass --dtype float32")])],
    ),
    (V92, V100, {"arch": "qwen3-32b"}, []),
    (V92, A100, {}, []),
    (V011, V100, {}, []),
    (V19, V100, {}, []),
    (PRIVATE, V100, {}, []),
]


@pytest.mark.parametrize(("image", "gpu", "changes", "messages"), TRITON)
def test_triton_without_fp16_dot_on_the_gpu(image: str, gpu: str, changes: dict[str, Any], messages: list[str]) -> None:
    found = at(image, gpu, **changes)
    assert found.args.errors == ()
    assert check_triton(found, {}) == messages


def below_method(source: str, image: str, method: str, need: int, where: str, cap: int, way_out: str) -> str:
    facts = image_facts(image)
    assert facts is not None
    return (
        f"{source}: vLLM {facts.version} needs sm_{need} (compute capability {need / 10:.1f}) for {method}; {where} has "
        f'less ("Minimum capability: {need}. Current capability: {cap}."; {facts.cite("quantizations")}). '
        f"Instead, {way_out}."
    )


AWQ_WAY_OUT = (
    "serve a GPTQ checkpoint of the model (--quantization gptq), or serve the AWQ checkpoint with LMDeploy "
    "(TurboMind runs AWQ on sm_70)"
)
RUNS_HERE = "use a checkpoint in a method that runs here: "
# (image, GPU, launch changes, messages): each method's minimum in the image's vLLM against the GPU's.
QUANTIZATION: list[tuple[str, str, dict[str, Any], list[str]]] = [
    (V92, V100, {}, []),
    (
        V92,
        V100,
        {"argv_add": ["--quantization", "awq"]},
        [below_method("--quantization awq", V92, "awq", 75, V100_AT, 70, AWQ_WAY_OUT)],
    ),
    (
        V92,
        V100,
        {"quantization": "awq"},
        [
            below_method(
                "the checkpoint's quantization awq (models.qwen3-30b-a3b.quantization)",
                V92,
                "awq",
                75,
                V100_AT,
                70,
                AWQ_WAY_OUT,
            )
        ],
    ),
    (V92, T4, {"argv_add": ["--quantization", "awq"]}, []),
    (
        V92,
        V100,
        {"argv_add": ["--quantization", "hqq"]},
        [
            below_method(
                "--quantization hqq",
                V92,
                "hqq",
                80,
                V100_AT,
                70,
                RUNS_HERE + "aqlm, auto-round, bitblas, bitsandbytes, compressed-tensors, deepspeedfp, gguf, gptq, "
                "moe_wna16, quark",
            )
        ],
    ),
    # The methods that run here leave out the FP8 ones (gpu-fp8 judges those) and take those at exactly sm_80.
    (
        V19,
        A100,
        {"argv_add": ["--quantization", "petit_nvfp4"]},
        [
            below_method(
                "--quantization petit_nvfp4",
                V19,
                "petit_nvfp4",
                90,
                f"{A100} (sm_80)",
                80,
                RUNS_HERE + "awq, awq_marlin, bitsandbytes, compressed-tensors, experts_int8, gguf, gptq, gptq_marlin, "
                "inc, moe_wna16, mxfp4, quark, torchao",
            )
        ],
    ),
    (
        V92,
        V100,
        {"argv_add": ["--quantization", "tpu_int8"]},
        ["--quantization tpu_int8: not a CUDA method in vLLM 0.9.2 (it targets TPU, Neuron, Intel or CPU)."],
    ),
    (V92, V100, {"argv_add": ["--quantization", "fp8"]}, []),
    (PRIVATE, V100, {"argv_add": ["--quantization", "awq"]}, []),
]


@pytest.mark.parametrize(("image", "gpu", "changes", "messages"), QUANTIZATION)
def test_each_quantization_method_against_its_minimum_capability(
    image: str, gpu: str, changes: dict[str, Any], messages: list[str]
) -> None:
    found = at(image, gpu, **changes)
    assert found.args.errors == ()
    assert check_quantization(found, {}) == messages


def no_moe_path(method: str, ways: str) -> str:
    facts = image_facts(V92)
    assert facts is not None
    return (
        f"--quantization {method} on qwen3-30b-a3b (qwen3_moe, a MoE model): vLLM 0.9.2 has no FusedMoE method for "
        f"{method}, so the model fails to build (AssertionError in FusedMoE; {facts.cite('quantizations')}). "
        f"Instead, {ways}."
    )


def wna16_way(set_it: str) -> str:
    return (
        f"{set_it} moe_wna16 (a GPTQ 4/8-bit checkpoint with desc_act: false; its Triton path needs a Triton that "
        "compiles for the GPU)"
    )


def later_way(key: str) -> str:
    facts = image_facts(V19)
    assert facts is not None
    return (
        f"use {V19} ({key}), whose vLLM 0.19.1 routes gptq MoE layers to MoeWNA16 by itself "
        f"({facts.cite('quantizations')})"
    )


GPTQ = ["--quantization", "gptq"]
# (image, launch changes, messages): 0.9.2 has no FusedMoE method for gptq or bitblas; 0.19.1 routes gptq to MoeWNA16.
QUANTIZATION_MOE: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        V92,
        {"argv_add": GPTQ},
        [
            no_moe_path(
                "gptq", wna16_way("set models.qwen3-30b-a3b.quantization:") + " or " + later_way("pools.chat.image")
            )
        ],
    ),
    (
        V92,
        {"argv_add": GPTQ, "pool": None, "model": None},
        [no_moe_path("gptq", wna16_way("pass --quantization") + " or " + later_way("the container's image"))],
    ),
    (V92, {"argv_add": ["--quantization", "bitblas"]}, [no_moe_path("bitblas", "use a method with a MoE path")]),
    (V92, {"argv_add": GPTQ, "arch": "qwen3-32b"}, []),
    (V92, {"argv_add": GPTQ, "arch": None}, []),
    (V92, {"argv_add": ["--quantization", "awq"]}, []),
    (V92, {}, []),
    (V19, {"argv_add": GPTQ}, []),
    (PRIVATE, {"argv_add": GPTQ}, []),
]


@pytest.mark.parametrize(("image", "changes", "messages"), QUANTIZATION_MOE)
def test_a_method_without_a_moe_path_on_a_moe_model(image: str, changes: dict[str, Any], messages: list[str]) -> None:
    found = at(image, V100, **changes)
    assert found.args.errors == ()
    assert check_quantization_moe(found, {}) == messages


def test_the_moe_wna16_way_out_only_where_the_image_has_it() -> None:
    found = at(V92, V100, argv_add=GPTQ)
    assert found.facts is not None
    without = {m: q for m, q in found.facts.quantizations.items() if m != "moe_wna16"}
    stripped = replace(found, facts=replace(found.facts, quantizations=without))
    assert check_quantization_moe(stripped, {}) == [no_moe_path("gptq", later_way("pools.chat.image"))]


def test_the_newer_line_is_named_only_where_its_method_has_a_moe_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from components.engines.vllm.rules import hardware

    newer = image_facts(V19)
    assert newer is not None
    quants = {**newer.quantizations, "gptq": replace(newer.quantizations["gptq"], moe="none")}
    monkeypatch.setattr(hardware, "RECOMMENDED", replace(newer, quantizations=quants))
    found = at(V92, V100, argv_add=GPTQ)
    assert check_quantization_moe(found, {}) == [
        no_moe_path("gptq", wna16_way("set models.qwen3-30b-a3b.quantization:"))
    ]


def act_refused(source: str, given: str, image: str, runs: list[tuple[str, str]], dtype: str, fix: str) -> str:
    """quantization-dtype's message: `runs` is each judged method with the torch dtypes it takes, as listed."""
    facts = image_facts(image)
    assert facts is not None
    listed = " and ".join(f"{m} in {', '.join(d.split())} only" for m, d in runs)
    says = " or ".join(
        f'"torch.{dtype} is not supported for quantization method {m}. Supported dtypes: '
        f'[{", ".join("torch." + x for x in d.split())}]"'
        for m, d in runs
    )
    defs = ", ".join(
        f"{m}: {facts.quantizations[m].act_dtypes_source.removeprefix('vllm/model_executor/layers/')}" for m, _ in runs
    )
    return (
        f"{source} with {given}: vLLM {facts.version} runs {listed}, so it stops at startup ({says}; "
        f"{facts.cite('quantization_act_dtypes')}; get_supported_act_dtypes of {defs}). Instead, {fix}."
    )


def quant(image: str, gpu: str | None, value: str, *argv: str, **changes: Any) -> Launch:
    """The chat server with --dtype value and argv added (a checkpoint's method: quantization=...)."""
    found = at(image, gpu, argv_drop=["--dtype"], argv_add=["--dtype", value, *argv], **changes)  # type: ignore[arg-type]
    assert found.args.errors == ()
    return found


HALF = "set models.qwen3-30b-a3b.dtype: half"
BF16 = "set models.qwen3-30b-a3b.dtype: bfloat16"
NONE_RUNS = "no dtype {} accepts runs here: serve a checkpoint in a method that accepts {}"
CHECKPOINT_GPTQ = "the checkpoint's quantization gptq (models.qwen3-30b-a3b.quantization)"
A100_AT = f"{A100} (sm_80)"
# (image, GPU, --dtype, argv added, launch changes, gemma2: the catalog model read as a type that refuses float16,
# messages). mxfp4 takes bfloat16 only and starts at sm_80 (the A100 is both boundaries); gptq_marlin starts at
# sm_75 in 0.19.1 and sm_80 in 0.9.2, where a GPTQ checkpoint without the flag may run as it.
QUANTIZATION_DTYPE: list[tuple[str, str | None, str, list[str], dict[str, Any], bool, list[str]]] = [
    (
        V19,
        A100,
        "float16",
        ["--quantization", "mxfp4"],
        {},
        False,
        [act_refused("--quantization mxfp4", "--dtype float16", V19, [("mxfp4", "bfloat16")], "float16", BF16)],
    ),
    (V19, A100, "bfloat16", ["--quantization", "mxfp4"], {}, False, []),
    # auto from sm_80 may be the checkpoint's bfloat16: not refused.
    (V19, A100, "auto", ["--quantization", "mxfp4"], {}, False, []),
    # A type that refuses float16 on a T4: auto is float32, bfloat16 does not run (sm_75), so no way but the method.
    (
        V19,
        T4,
        "auto",
        ["--quantization", "gptq_marlin"],
        {},
        True,
        [
            act_refused(
                "--quantization gptq_marlin",
                "--dtype auto (float32 on Tesla T4 (sm_75): model type gemma2 refuses float16)",
                V19,
                [("gptq_marlin", "float16 bfloat16")],
                "float32",
                NONE_RUNS.format("gptq_marlin", "float32"),
            )
        ],
    ),
    # The same on an A100: auto is bfloat16, which gptq_marlin takes; float32 is refused, the way out is bfloat16.
    (V19, A100, "auto", ["--quantization", "gptq_marlin"], {}, True, []),
    (
        V19,
        A100,
        "float32",
        ["--quantization", "gptq_marlin"],
        {},
        True,
        [
            act_refused(
                "--quantization gptq_marlin",
                "--dtype float32",
                V19,
                [("gptq_marlin", "float16 bfloat16")],
                "float32",
                BF16,
            )
        ],
    ),
    (
        V19,
        A100,
        "auto",
        ["--quantization", "gptq"],
        {},
        True,
        [
            act_refused(
                "--quantization gptq",
                f"--dtype auto (bfloat16 on {A100_AT})",
                V19,
                [("gptq", "float16")],
                "bfloat16",
                NONE_RUNS.format("gptq", "bfloat16"),
            )
        ],
    ),
    # A model outside the catalog: its type is not known to refuse float16.
    (
        V19,
        A100,
        "bfloat16",
        ["--quantization", "gptq"],
        {"arch": None},
        False,
        [act_refused("--quantization gptq", "--dtype bfloat16", V19, [("gptq", "float16")], "bfloat16", HALF)],
    ),
    (V19, V100, "auto", ["--quantization", "gptq"], {"arch": None}, False, []),
    # A GPU the pack does not know: an explicit --dtype is still judged (bfloat16 counted as running).
    (
        V19,
        None,
        "float32",
        ["--quantization", "gptq"],
        {},
        False,
        [act_refused("--quantization gptq", "--dtype float32", V19, [("gptq", "float16")], "float32", HALF)],
    ),
    # A GPTQ checkpoint without the flag: judged with Marlin from its minimum (sm_80 in 0.9.2), plain gptq below.
    (V92, A100, "bfloat16", [], {"quantization": "gptq"}, False, []),
    (
        V92,
        T4,
        "bfloat16",
        [],
        {"quantization": "gptq"},
        False,
        [act_refused(CHECKPOINT_GPTQ, "--dtype bfloat16", V92, [("gptq", "float16")], "bfloat16", HALF)],
    ),
    # Not judged: an image without facts, a checkpoint method this line does not have, no method at all.
    (PRIVATE, A100, "bfloat16", ["--quantization", "gptq"], {}, False, []),
    (V19, A100, "float32", [], {"quantization": "aqlm"}, False, []),
    (V19, A100, "float32", [], {}, False, []),
]


@pytest.mark.parametrize(("image", "gpu", "value", "argv", "changes", "gemma2", "messages"), QUANTIZATION_DTYPE)
def test_the_dtypes_each_quantization_method_accepts(
    image: str,
    gpu: str | None,
    value: str,
    argv: list[str],
    changes: dict[str, Any],
    gemma2: bool,
    messages: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from components.engines.vllm.rules import hardware

    if gemma2:
        real = hardware.model_arch_or_none
        gemma = replace(real("qwen3-30b-a3b"), model_type="gemma2")
        monkeypatch.setattr(
            hardware, "model_arch_or_none", lambda name: gemma if name == "qwen3-30b-a3b" else real(name)
        )
    assert check_quantization_dtype(quant(image, gpu, value, *argv, **changes), {}) == messages


def with_method(found: Launch, method: str, dtypes: tuple[str, ...]) -> Launch:
    """The launch with its image's method taking other activation dtypes (a line the pack does not list)."""
    assert found.facts is not None
    quants = {**found.facts.quantizations, method: replace(found.facts.quantizations[method], act_dtypes=dtypes)}
    return replace(found, facts=replace(found.facts, quantizations=quants))


def test_dtypes_no_listed_line_pairs_with_a_method() -> None:
    # A method taking float32 only: auto from sm_80 names both dtypes it may start with; the way out is float32.
    found = with_method(quant(V19, A100, "auto", "--quantization", "gptq"), "gptq", ("float32",))
    assert check_quantization_dtype(found, {}) == [
        act_refused(
            "--quantization gptq",
            f"--dtype auto (float16 or bfloat16 on {A100_AT})",
            V19,
            [("gptq", "float32")],
            "float16",
            "set models.qwen3-30b-a3b.dtype: float32",
        )
    ]
    # A method taking bfloat16 only below sm_80: auto is float16 there, and bfloat16 does not run.
    found = with_method(quant(V19, V100, "auto", "--quantization", "moe_wna16"), "moe_wna16", ("bfloat16",))
    assert check_quantization_dtype(found, {}) == [
        act_refused(
            "--quantization moe_wna16",
            f"--dtype auto (float16 on {V100_AT})",
            V19,
            [("moe_wna16", "bfloat16")],
            "float16",
            NONE_RUNS.format("moe_wna16", "float16"),
        )
    ]


def test_gguf_drops_bfloat16_from_sm_100_in_0_19_1() -> None:
    """No GPU the pack lists is sm_100+: the H100 given capability 10.0 and 12.0 stands for one."""
    h100 = quant(V19, "NVIDIA H100 80GB HBM3", "bfloat16", "--quantization", "gguf")
    assert check_quantization_dtype(h100, {}) == []
    for cap in (100, 120):
        assert h100.gpu is not None
        found = replace(h100, gpu=replace(h100.gpu, capability=cap))
        assert check_quantization_dtype(found, {}) == [
            act_refused("--quantization gguf", "--dtype bfloat16", V19, [("gguf", "float16 float32")], "bfloat16", HALF)
        ]
