"""Every GPU-capability rule at every boundary: each known engine image x sm_70/75/80/86/89/90, through
the real pack. The threshold each case expects is read from the image's facts (components.engines.vllm.facts),
so the table follows the facts as they change; what the rules do with them is what is tested: a rule
that compares against another number, or against the wrong side of it, fails at the boundary.
A few facts that hold for every image are pinned here as written by their sources, so a facts edit
that moves them fails too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from pulumi_policy import EnforcementLevel

from components.engines.vllm.facts import FP8_WEIGHT_METHODS, ImageFacts, known_images
from components.facts.hardware import GPUS
from policies.pack import POLICIES
from tests.support.policies import GPU_AT, _props, model_server, server_with

CAPABILITIES = (70, 75, 80, 86, 89, 90)
VLLM_IMAGES = [f for f in known_images() if f.engine == "vllm"]


def test_the_table_has_one_gpu_per_capability_and_every_vllm_image() -> None:
    assert {c: GPUS[name].capability for c, name in GPU_AT.items()} == {c: c for c in CAPABILITIES}
    assert len(VLLM_IMAGES) >= 2


def test_facts_every_source_agrees_on_for_every_image() -> None:
    """Pinned as their sources state them, not read back from the table (the boundary tests below
    follow the table, so a wrong number there would move their expectations with it)."""
    for f in VLLM_IMAGES:
        # vllm/platforms/cuda.py of every line: below sm_80 the supported dtypes are fp16 and fp32.
        assert f.bf16_min_capability == 80, f.ref
        # MLA's prefill needs FlashAttention-2 (sm_80) on every line the facts cover (vllm#14016).
        assert f.mla_min_capability == 80, f.ref
        # get_min_capability of quantization/gptq.py (60), awq.py (75) and modelopt.py (89).
        assert {m: f.quantizations[m].min_capability for m in ("gptq", "awq", "modelopt")} == {
            "gptq": 60,
            "awq": 75,
            "modelopt": 89,
        }, f.ref
    by_tag = {f.tag: f for f in VLLM_IMAGES}
    # The runbook's image: torch 2.7.0+cu128 has no sm_70 kernels (pytorch#147607), V1 only from sm_80.
    assert 70 not in by_tag["v0.9.2"].torch_arch_list and by_tag["v0.9.2"].v1_min_capability == 80
    # 0.19.1: V1 on Volta and Turing (vllm PR #24022), torch 2.10 with sm_70 again (pytorch#182250).
    assert 70 in by_tag["v0.19.1"].torch_arch_list and by_tag["v0.19.1"].v1_min_capability == 70


def _argv_swap(props: dict[str, Any], old: str, new: list[str]) -> dict[str, Any]:
    argv = props["argv"]
    i = argv.index(old)
    argv[i : i + 1] = new
    return props


# Each rule's level as the pack declares it (mandatory where vLLM dies, advisory where it may run badly).
LEVEL = {p.name: (p.enforcement_level or EnforcementLevel.ADVISORY).value for p in POLICIES}


@dataclass(frozen=True)
class Rule:
    """One capability rule: the change that needs the capability, and the threshold the facts give."""

    policy: str
    change: Callable[[dict[str, Any]], dict[str, Any]]
    needs: Callable[[ImageFacts], int | None]  # None: never refused by this rule on this image
    prepare: Callable[[dict[str, Any]], dict[str, Any]] = lambda p: p  # the base the change starts from


def _v1(f: ImageFacts) -> int | None:
    # Only an image whose engine still reads VLLM_USE_V1 can be switched to a V1 it cannot run.
    return f.v1_min_capability if f.reads_vllm_use_v1 else None


RULES: dict[str, Rule] = {
    "bf16": Rule("gpu-dtype", lambda p: _argv_swap(p, "half", ["bfloat16"]), lambda f: f.bf16_min_capability),
    "prefix-caching": Rule(
        "gpu-chunked-prefill-prefix-caching",
        lambda p: _argv_swap(p, "--no-enable-prefix-caching", ["--enable-prefix-caching"]),
        lambda f: f.prefix_prefill_min_capability,
    ),
    "chunked-prefill": Rule(
        "gpu-chunked-prefill-prefix-caching",
        lambda p: _argv_swap(p, "--no-enable-chunked-prefill", ["--enable-chunked-prefill"]),
        lambda f: f.prefix_prefill_min_capability,
    ),
    "fp8-kv-cache": Rule(
        "gpu-fp8", lambda p: server_with(p, argv_add=["--kv-cache-dtype", "fp8"]), lambda f: f.fp8_kv_min_capability
    ),
    "vllm-use-v1": Rule("vllm-v1-engine", lambda p: {**p, "env": {**p["env"], "VLLM_USE_V1": "1"}}, _v1),
    # Fused MoE runs Triton's fp16 tl.dot: a dense model does not, the MoE chat model does.
    "triton-fp16-moe": Rule(
        "triton-fp16-dot",
        lambda p: {**p, "arch": "qwen3-30b-a3b", "model": "qwen3-30b-a3b"},
        lambda f: f.triton_facts.fp16_dot_min_capability if f.triton_facts else None,
        prepare=lambda p: {**p, "arch": "qwen3-32b", "model": "qwen3-32b"},
    ),
    "mla": Rule(
        "mla-attention", lambda p: {**p, "arch": "deepseek-r1", "model": "deepseek-r1"}, lambda f: f.mla_min_capability
    ),
}


def _verdicts(policy: str, props: dict[str, Any]) -> list[str]:
    return [level for p, level, _ in model_server(props) if p == policy]


CASES = [(rule, f.ref, cap) for rule in RULES for f in VLLM_IMAGES for cap in CAPABILITIES]


@pytest.mark.parametrize(
    ("rule", "image", "capability"), CASES, ids=[f"{r}-{i.split(':')[-1]}-sm{c}" for r, i, c in CASES]
)
def test_capability_rule_refuses_exactly_below_the_images_threshold(rule: str, image: str, capability: int) -> None:
    r = RULES[rule]
    f = next(x for x in VLLM_IMAGES if x.ref == image)
    need = r.needs(f)
    base = r.prepare(_props(f, capability))
    assert _verdicts(r.policy, base) == [], "the unchanged server must pass this rule"
    expected = [LEVEL[r.policy]] if need is not None and capability < need else []
    assert _verdicts(r.policy, r.change(base)) == expected, f"{r.policy} with threshold sm_{need}"


QUANT_CASES = [
    (f.ref, method, cap)
    for f in VLLM_IMAGES
    for method, q in sorted(f.quantizations.items())
    if q.min_capability is not None and method not in FP8_WEIGHT_METHODS
    for cap in CAPABILITIES
]


@pytest.mark.parametrize(
    ("image", "method", "capability"), QUANT_CASES, ids=[f"{m}-{i.split(':')[-1]}-sm{c}" for i, m, c in QUANT_CASES]
)
def test_quantization_is_refused_exactly_below_the_methods_capability(image: str, method: str, capability: int) -> None:
    f = next(x for x in VLLM_IMAGES if x.ref == image)
    need = f.quantizations[method].min_capability
    assert need is not None
    props = server_with(_props(f, capability), ["--quantization", method])
    refused = _verdicts("gpu-quantization", props)
    assert refused == ([LEVEL["gpu-quantization"]] if capability < need else []), f"{method} needs sm_{need}"


@pytest.mark.parametrize(
    ("image", "capability"),
    [(f.ref, c) for f in VLLM_IMAGES for c in CAPABILITIES],
    ids=[f"{f.tag}-sm{c}" for f in VLLM_IMAGES for c in CAPABILITIES],
)
def test_an_image_is_refused_exactly_on_the_gpus_its_torch_has_no_kernels_for(image: str, capability: int) -> None:
    f = next(x for x in VLLM_IMAGES if x.ref == image)
    messages = [m for p, _, m in model_server(_props(f, capability)) if p == "vllm-image" and "no kernel image" in m]
    assert len(messages) == (0 if capability in f.torch_arch_list else 1), f.torch_arch_list
