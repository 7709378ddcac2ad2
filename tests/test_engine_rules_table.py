"""LMDeploy's and llama.cpp's own policy rules (components/engines/{lmdeploy,llamacpp}/rules.py) as tables:
each rule on both sides of its boundary (capability, format, group size, head size, KV policy, cache type
and FlashAttention, split mode, PTX), with its whole message; an unknown image is never judged by them
(the pack's image rules speak for it)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from components.engines.judged import JudgedServer
from components.engines.llamacpp.rules import check_llamacpp_cache, check_llamacpp_jit, check_llamacpp_split
from components.engines.lmdeploy.facts import IMAGES as LMDEPLOY_IMAGES
from components.engines.lmdeploy.rules import (
    check_lmdeploy_checkpoint,
    check_lmdeploy_dtype,
    check_lmdeploy_kv,
    check_lmdeploy_model,
    quant_policy,
)
from components.engines.registry import ENGINES
from components.facts.hardware import GPUS, GpuModel

LMDEPLOY = "openmmlab/lmdeploy:v0.16.0-cu12.8"
LLAMACPP = "ghcr.io/ggml-org/llama.cpp:server-cuda-b11312"
LLAMACPP_13 = "ghcr.io/ggml-org/llama.cpp:server-cuda13-b11312"
V100 = GPUS["Tesla V100-SXM2-32GB"]
T4 = GPUS["Tesla T4"]
A100 = GPUS["NVIDIA A100-SXM4-80GB"]
A10 = GPUS["NVIDIA A10"]
L40S = GPUS["NVIDIA L40S"]
F = LMDEPLOY_IMAGES[LMDEPLOY]


def lmdeploy(flags: tuple[str, ...] = (), gpu: GpuModel = V100, image: str = LMDEPLOY, **props: Any) -> JudgedServer:
    argv = ["lmdeploy", "serve", "api_server", "/m", *flags]
    return JudgedServer(ENGINES["lmdeploy"], {"image": image, "argv": argv, **props}, gpu)


def llamacpp(flags: tuple[str, ...] = (), gpu: GpuModel = V100, image: str = LLAMACPP) -> JudgedServer:
    return JudgedServer(ENGINES["llamacpp"], {"image": image, "argv": ["llama-server", "-m", "/m.gguf", *flags]}, gpu)


NOT_TURBOMIND = (
    "DeepseekV3ForCausalLM is not a TurboMind architecture in LMDeploy 0.16.0 ({}): with --backend turbomind the "
    "server refuses it, and LMDeploy's PyTorch engine runs on Triton kernels that do not compile for sm_70. Serve "
    "it with engine: vllm (DeepSeek-V3/R1: VLLM_MLA_DISABLE=1) or engine: llamacpp (GGUF)"
).format(F.cite("architectures"))
HEAD_192_ON_V100 = (
    "head size 192: TurboMind's attention kernels on Tesla V100-SXM2-32GB (sm_70) take 64, 128, 256, 576 "
    f"({F.cite('attention_head_dims')})"
)
GROUP_64 = (
    "--model-format gptq with group size 64: TurboMind's converter accepts group size 128 only (it raises "
    f"'Unsupported group_size'); quantize with group size 128 ({F.cite('model_formats')})"
)


@pytest.mark.parametrize(
    ("flags", "gpu", "props", "messages"),
    [
        ((), V100, {"modelType": "qwen3_moe", "headDim": 128}, []),
        ((), V100, {"modelType": "deepseek_v3", "headDim": 192}, [NOT_TURBOMIND, HEAD_192_ON_V100]),
        # The catalog's arch gives the model type when the props do not; a type given wins.
        ((), V100, {"arch": "deepseek-r1"}, [NOT_TURBOMIND]),
        ((), V100, {"modelType": "qwen3", "arch": "deepseek-r1"}, []),
        ((), V100, {"arch": "no-such-model"}, []),
        ((), V100, {"modelType": "no_such_type"}, []),
        # Head size 192 has kernels from sm_80.
        ((), A100, {"headDim": 192}, []),
        ((), V100, {"headDim": 256.0}, []),
        # Group size: from the flag or from the model's quantization.
        (("--model-format", "gptq"), V100, {"groupSize": 64}, [GROUP_64]),
        ((), V100, {"quantization": "gptq", "groupSize": 64.0}, [GROUP_64]),
        (("--model-format", "gptq"), V100, {"groupSize": 128}, []),
        (("--model-format", "gptq"), V100, {}, []),
        # hf has no group sizes to check.
        ((), V100, {"groupSize": 64}, []),
    ],
)
def test_lmdeploy_model_rule(flags: tuple[str, ...], gpu: GpuModel, props: dict[str, Any], messages: list[str]) -> None:
    assert check_lmdeploy_model(lmdeploy(flags, gpu, **props)) == messages


@pytest.mark.parametrize(("minimum", "refused"), [(75, True), (70, False), (None, True)])
def test_lmdeploy_model_format_capability_boundary(minimum: int | None, refused: bool) -> None:
    """A format whose kernels start above the GPU (or exist on none) is refused; at the GPU's own it is not."""
    s = lmdeploy(("--model-format", "awq"))
    rule = dataclasses.replace(F.model_formats["awq"], min_capability=minimum)
    s.facts = dataclasses.replace(F, model_formats={**F.model_formats, "awq": rule})
    expected = f"--model-format awq: TurboMind has no kernels for it on Tesla V100-SXM2-32GB (sm_70) ({F.cite('model_formats')})"
    assert check_lmdeploy_model(s) == ([expected] if refused else [])


BF16 = (
    "--dtype bfloat16 on Tesla V100-SXM2-32GB (sm_70): no bf16 there; TurboMind falls back to float16 with a "
    f"warning ({F.cite('bf16_min_capability')}). State models.<model>.dtype: half"
)


@pytest.mark.parametrize(
    ("flags", "gpu", "messages"),
    [
        (("--dtype", "bfloat16"), V100, [BF16]),
        (("--dtype", "bfloat16"), T4, [BF16.replace("Tesla V100-SXM2-32GB (sm_70)", "Tesla T4 (sm_75)")]),
        (("--dtype", "bfloat16"), A100, []),
        (("--dtype", "float16"), V100, []),
        ((), V100, []),
    ],
)
def test_lmdeploy_dtype_rule(flags: tuple[str, ...], gpu: GpuModel, messages: list[str]) -> None:
    assert check_lmdeploy_dtype(lmdeploy(flags, gpu)) == messages


def _kv(policy: str, name: str, where: str, ok: str) -> str:
    return (
        f"--quant-policy {policy} ({name}): no TurboMind KV kernels {where} ({F.cite('kv_quant_policies')}); "
        f"use lmdeploy.quantPolicy {ok}"
    )


ON_ANY = "on any GPU (TurboMind refuses fp8 KV caches)"
OK_V100 = "0 (none), 4 (int4), 8 (int8)"
OK_A100 = "0 (none), 4 (int4), 8 (int8), 42 (turbo_quant)"


@pytest.mark.parametrize(
    ("policy", "gpu", "messages"),
    [
        ("0", V100, []),
        ("4", V100, []),
        ("8", V100, []),
        ("int8", V100, []),
        ("16", V100, [_kv("16", "fp8", ON_ANY, OK_V100)]),
        ("16", A100, [_kv("16", "fp8", ON_ANY, OK_A100)]),
        ("fp8", V100, [_kv("16", "fp8", ON_ANY, OK_V100)]),
        ("FP8_E4M3", V100, [_kv("16", "fp8", ON_ANY, OK_V100)]),
        ("17", V100, [_kv("17", "fp8_e5m2", ON_ANY, OK_V100)]),
        # turbo_quant: kernels from sm_80, both sides.
        ("42", V100, [_kv("42", "turbo_quant", "on Tesla V100-SXM2-32GB (sm_70)", OK_V100)]),
        ("42", T4, [_kv("42", "turbo_quant", "on Tesla T4 (sm_75)", OK_V100)]),
        ("42", A100, []),
        # A policy LMDeploy does not know is its parser's to refuse.
        ("99", V100, []),
    ],
)
def test_lmdeploy_kv_cache_rule(policy: str, gpu: GpuModel, messages: list[str]) -> None:
    assert check_lmdeploy_kv(lmdeploy(("--quant-policy", policy), gpu)) == messages


def test_no_quant_policy_is_policy_0() -> None:
    assert check_lmdeploy_kv(lmdeploy()) == []


@pytest.mark.parametrize(
    ("value", "policy"),
    [("0", 0), ("4", 4), ("int4", 4), ("INT8", 8), ("fp8", 16), ("fp8_e4m3", 16), ("fp8_e5m2", 17), ("42", 42)],
)
def test_quant_policy_reads_names_and_numbers_as_lmdeploy_does(value: str, policy: int) -> None:
    assert quant_policy(value) == policy


def test_an_unknown_quant_policy_name_is_no_number() -> None:
    with pytest.raises(ValueError, match="invalid literal for int"):
        quant_policy("fp4")


def _checkpoint(found: str) -> str:
    return (
        f"the checkpoint's quantization_config (/data/m): {found} ({F.cite('model_formats')}). Use a checkpoint "
        "quantized for TurboMind (Qwen/Qwen3-*-GPTQ-Int4 and *-AWQ are g128, desc_act false, sym)"
    )


ACT_ORDER = (
    "desc_act {}, sym {}: TurboMind takes desc_act false and sym true only (act-order or asymmetric GPTQ dies in "
    "the converter's assert)"
)


@pytest.mark.parametrize(
    ("fmt", "config", "messages"),
    [
        ("gptq", {"quant_method": "gptq", "desc_act": False, "sym": True}, []),
        ("gptq", {"quant_method": "gptq", "desc_act": True, "sym": True}, [_checkpoint(ACT_ORDER.format(True, True))]),
        (
            "gptq",
            {"quant_method": "gptq", "desc_act": False, "sym": False},
            [_checkpoint(ACT_ORDER.format(False, False))],
        ),
        ("gptq", {"quant_method": "gptq"}, []),
        ("awq", {"quant_method": "awq", "version": "gemm"}, []),
        ("awq", {"version": None}, []),
        (
            "awq",
            {"quant_method": "awq", "version": "gemv"},
            [_checkpoint("AWQ version 'gemv': TurboMind takes version 'gemm' only")],
        ),
        (
            "awq",
            {"quant_method": "gptq", "version": "gemv"},
            [
                _checkpoint(
                    "quant_method 'gptq' but --model-format awq (TurboMind asserts 'mismatched quant method'); "
                    "AWQ version 'gemv': TurboMind takes version 'gemm' only"
                )
            ],
        ),
        # desc_act and version belong to their own format only.
        ("awq", {"quant_method": "awq", "desc_act": True}, []),
        ("gptq", {"quant_method": "gptq", "version": "gemv"}, []),
        (
            "fp8",
            {"quant_method": "awq"},
            [_checkpoint("quant_method 'awq' but --model-format fp8 (TurboMind asserts 'mismatched quant method')")],
        ),
        (
            "compressed-tensors",
            {"quant_method": "gptq"},
            [
                _checkpoint(
                    "quant_method 'gptq' but --model-format compressed-tensors (TurboMind asserts 'mismatched quant method')"
                )
            ],
        ),
        (
            "mxfp4",
            {"quant_method": "fp8"},
            [_checkpoint("quant_method 'fp8' but --model-format mxfp4 (TurboMind asserts 'mismatched quant method')")],
        ),
        ("mxfp4", {"quant_method": "mxfp4"}, []),
        # No format flag (an hf checkpoint): nothing to compare.
        (None, {"quant_method": "awq"}, []),
        ("awq", "not a mapping", []),
    ],
)
def test_lmdeploy_checkpoint_rule(fmt: str | None, config: Any, messages: list[str]) -> None:
    flags = ("--model-format", fmt) if fmt else ()
    s = lmdeploy(flags, quantizationConfig=config, modelPath="/data/m")
    assert check_lmdeploy_checkpoint(s) == messages


@pytest.mark.parametrize(
    "rule", [check_lmdeploy_model, check_lmdeploy_dtype, check_lmdeploy_kv, check_lmdeploy_checkpoint]
)
def test_lmdeploy_rules_do_not_judge_an_unknown_image(rule: Any) -> None:
    s = lmdeploy(
        ("--dtype", "bfloat16", "--quant-policy", "16", "--model-format", "gptq"),
        image="unknown/lmdeploy:1",
        modelType="deepseek_v3",
        headDim=192,
        groupSize=64,
        quantizationConfig={"quant_method": "awq", "desc_act": True},
    )
    assert rule(s) == []


SPLIT_ROW = (
    "--split-mode row splits each weight's rows across GPUs, but [ref] redlinedtm-jpg: -sm row broken in recent "
    "builds [obs]; -sm layer is the default that the V100 reports use"
)
SPLIT_TENSOR = (
    "--split-mode tensor splits weights and KV across GPUs, but [cli-b11312] '-sm tensor ... (parallelized, "
    "EXPERIMENTAL)'; -sm layer is the default that the V100 reports use"
)


@pytest.mark.parametrize(
    ("flags", "messages"),
    [
        ((), []),
        (("-sm", "layer"), []),
        (("-sm", "none"), []),
        (("-sm", "row"), [SPLIT_ROW]),
        (("--split-mode", "tensor"), [SPLIT_TENSOR]),
    ],
)
def test_llamacpp_split_mode_rule(flags: tuple[str, ...], messages: list[str]) -> None:
    assert check_llamacpp_split(llamacpp(flags)) == messages


def _v_cache(v_type: str) -> list[str]:
    return [
        f"--cache-type-v {v_type} with --flash-attn off: llama.cpp stops with 'quantized V cache requires "
        "flash_attn to be enabled' (src/llama-context.cpp at b11312); set llamacpp.flashAttention: on"
    ]


@pytest.mark.parametrize(
    ("flags", "messages"),
    [
        ((), []),
        (("-ctv", "q8_0"), []),
        (("-ctv", "q8_0", "-fa", "on"), []),
        (("-ctv", "q8_0", "-fa", "auto"), []),
        (("-ctv", "q8_0", "-fa", "off"), _v_cache("q8_0")),
        (("--cache-type-v", "q4_0", "--flash-attn", "0"), _v_cache("q4_0")),
        (("-ctv", "q4_0", "-fa", "false"), _v_cache("q4_0")),
        # Unquantized V caches need no FlashAttention; a quantized K cache alone is not this rule's.
        (("-ctv", "f16", "-fa", "off"), []),
        (("-ctv", "f32", "-fa", "off"), []),
        (("-ctv", "bf16", "-fa", "off"), []),
        (("-ctk", "q8_0", "-fa", "off"), []),
        # An empty type is no quantized one (llama-server refuses it itself at start).
        (("-ctv", "", "-fa", "off"), []),
    ],
)
def test_llamacpp_kv_cache_rule(flags: tuple[str, ...], messages: list[str]) -> None:
    assert check_llamacpp_cache(llamacpp(flags)) == messages


def _jit(image: str, where: str) -> list[str]:
    facts = ENGINES["llamacpp"].image_facts_of(image)
    assert facts is not None
    return [
        f"{image} has no SASS for {where}, only PTX: the first start JIT-compiles every kernel for minutes (keep "
        f"loadTimeoutMinutes generous) and the driver must support CUDA {facts.cuda} (R570+), or the load fails "
        f"({facts.cite('ptx')})"
    ]


@pytest.mark.parametrize(
    ("image", "gpu", "ptx"),
    [
        (LLAMACPP, V100, True),
        (LLAMACPP, T4, True),
        (LLAMACPP, A100, True),
        (LLAMACPP, A10, False),
        (LLAMACPP, L40S, False),
        (LLAMACPP_13, T4, True),
        (LLAMACPP_13, A100, True),
        (LLAMACPP_13, A10, False),
    ],
)
def test_llamacpp_ptx_jit_rule(image: str, gpu: GpuModel, ptx: bool) -> None:
    where = f"{gpu.name} (sm_{gpu.capability})"
    assert check_llamacpp_jit(llamacpp(gpu=gpu, image=image)) == (_jit(image, where) if ptx else [])


@pytest.mark.parametrize("rule", [check_llamacpp_split, check_llamacpp_cache, check_llamacpp_jit])
def test_llamacpp_rules_do_not_judge_an_unknown_image(rule: Any) -> None:
    assert rule(llamacpp(("-sm", "row", "-ctv", "q8_0", "-fa", "off"), image="unknown/llama:1")) == []


def test_a_quantization_lmdeploy_does_not_name_is_judged_as_hf() -> None:
    """Without --model-format, a checkpoint quantization LMDeploy has no format for loads as hf."""
    s = lmdeploy(quantization="gguf")
    s.facts = dataclasses.replace(
        F, model_formats={**F.model_formats, "hf": dataclasses.replace(F.model_formats["hf"], min_capability=75)}
    )
    assert check_lmdeploy_model(s) == [
        f"--model-format hf: TurboMind has no kernels for it on Tesla V100-SXM2-32GB (sm_70) ({F.cite('model_formats')})"
    ]


def test_every_group_size_a_format_takes_is_named() -> None:
    s = lmdeploy(("--model-format", "compressed-tensors"), groupSize=64)
    assert check_lmdeploy_model(s) == [
        "--model-format compressed-tensors with group size 64: TurboMind's converter accepts group size 32, 128 "
        f"only (it raises 'Unsupported group_size'); quantize with group size 32, 128 ({F.cite('model_formats')})"
    ]
