"""bf16, FP8 weights and an FP8 KV cache below sm_80: refused on V100 (sm_70) by every known vLLM image, each
message naming the evidence; on T4 (sm_75) each version as its code decides (0.9.2: FP8 weights refused, an
fp8 cache allowed on V0's XFORMERS; 0.19.1: FP8 weights allowed as Marlin weight-only, an fp8 cache refused,
since TRITON_ATTN's kernels load it as fp8e4nv, which Triton 3.6 has only from sm_89 — compiled here with
the real Triton wheel for the GPU targets, no GPU needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from components.engines.vllm.facts import FP8_WEIGHT_METHODS, known_images
from tests.support.policies import _props, model_server, server_with
from tests.support.qualification import triton_dir

VLLM_IMAGES = [f for f in known_images() if f.engine == "vllm"]
IDS = [f.tag for f in VLLM_IMAGES]

# What TRITON_ATTN does with an fp8 cache (triton_unified_attention.py: K_load.to(tl.float32) * k_scale):
# a load through a float8_e4m3fn pointer (Triton's fp8e4nv), upcast, scaled, stored in fp16.
FP8_CACHE_LOAD = """
import triton
import triton.language as tl


@triton.jit
def _fp8_cache_load(cache_ptr, scale_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    k = tl.load(cache_ptr + offs)
    tl.store(out_ptr + offs, (k.to(tl.float32) * tl.load(scale_ptr)).to(tl.float16))
"""


def _mandatory(policy: str, props: dict[str, Any]) -> list[str]:
    """The rule's mandatory messages, without the policy description the servicer puts first."""
    return [m.split("\n", 1)[-1] for p, level, m in model_server(props) if p == policy and level == "mandatory"]


@pytest.mark.parametrize("facts", VLLM_IMAGES, ids=IDS)
def test_v100_is_refused_bf16_in_every_image_naming_the_code(facts) -> None:
    props = _props(facts, 70)
    props["argv"][props["argv"].index("half")] = "bfloat16"
    [message] = _mandatory("gpu-dtype", props)
    assert message.startswith(
        "--dtype bfloat16: bfloat16 needs compute capability 8.0; Tesla V100-SXM2-32GB (sm_70) "
        "has none (vLLM refuses it at startup; "
    )
    assert facts.cite("bf16_min_capability") in message and "[read from code]" in message


@pytest.mark.parametrize("facts", VLLM_IMAGES, ids=IDS)
def test_v100_is_refused_an_fp8_kv_cache_in_every_image_naming_the_evidence(facts) -> None:
    for dtype in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        [message] = _mandatory("gpu-fp8", server_with(_props(facts, 70), ["--kv-cache-dtype", dtype]))
        assert message == (
            f"--kv-cache-dtype {dtype}: vLLM {facts.version} cannot keep an fp8 KV cache on Tesla V100-SXM2-32GB "
            f"(sm_70) ({facts.cite('fp8_kv_min_capability')}). Use --kv-cache-dtype auto (float16 cache) and lower "
            "--max-model-len or --max-num-seqs if the cache does not fit."
        )


@pytest.mark.parametrize("facts", VLLM_IMAGES, ids=IDS)
def test_v100_is_refused_every_fp8_checkpoint_in_every_image(facts) -> None:
    for method in sorted(FP8_WEIGHT_METHODS & set(facts.quantizations)):
        found = _mandatory("gpu-fp8", server_with(_props(facts, 70), ["--quantization", method]))
        assert len(found) == 1, method
        assert found[0].endswith(
            f"and Tesla V100-SXM2-32GB (sm_70) has no FP8 units ({facts.cite('quantizations')})."
            " Serve an fp16 or GPTQ checkpoint of the model instead."
        ), method


def test_on_t4_each_version_follows_its_own_code() -> None:
    by_tag = {f.tag: f for f in VLLM_IMAGES}
    old, new = by_tag["v0.9.2"], by_tag["v0.19.1"]
    # FP8 weights: 0.9.2's fp8.py needs sm_80; 0.19.1's runs them on sm_75 as Marlin weight-only.
    assert _mandatory("gpu-fp8", server_with(_props(old, 75), ["--quantization", "fp8"]))
    assert _mandatory("gpu-fp8", server_with(_props(new, 75), ["--quantization", "fp8"])) == []
    # An fp8 cache: 0.9.2's V0 XFORMERS keeps it with CUDA kernels; 0.19.1's TRITON_ATTN cannot compile it.
    assert _mandatory("gpu-fp8", server_with(_props(old, 75), ["--kv-cache-dtype", "fp8"])) == []
    [message] = _mandatory("gpu-fp8", server_with(_props(new, 75), ["--kv-cache-dtype", "fp8"]))
    assert "Triton 3.6 has fp8e4nv only from sm_89" in message and "Tesla T4 (sm_75)" in message
    # bf16 on neither.
    for facts in (old, new):
        props = _props(facts, 75)
        props["argv"][props["argv"].index("half")] = "bfloat16"
        assert len(_mandatory("gpu-dtype", props)) == 1


def compile_fp8_load(version: str, capability: int, tmp_path: Path) -> dict[str, Any]:
    """FP8_CACHE_LOAD compiled by one real Triton release for one GPU target, in a subprocess importing only it."""
    code = (
        "import json, sys; from components.engines.gate import compile_kernel; "
        "print(json.dumps(compile_kernel(sys.argv[2], '_fp8_cache_load', {'cache_ptr': '*fp8e4nv', "
        "'scale_ptr': '*fp32', 'out_ptr': '*fp16', 'BLOCK': 'constexpr'}, {'BLOCK': 16}, "
        f"{capability}, sys.argv[1])))"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), FP8_CACHE_LOAD],
        capture_output=True,
        text=True,
        timeout=600,
        env={
            "PYTHONPATH": f"{triton_dir(version)}:{root}",
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "TRITON_CACHE_DIR": str(tmp_path / "cache"),
        },
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("capability", [70, 75, 80, 89])
def test_triton_3_6_loads_an_fp8e4nv_cache_only_from_sm_89(capability: int, tmp_path: Path) -> None:
    got = compile_fp8_load("3.6.0", capability, tmp_path)
    if capability < 89:
        assert got["ok"] is False
        assert got["error"] == (
            'ValueError("type fp8e4nv not supported in this architecture. '
            "The supported fp8 dtypes are ('fp8e4b15', 'fp8e5')\")"
        )
    else:
        assert got == {"ok": True, "triton": "3.6.0", "tensor_cores": False, "error": ""}
    # The 0.19.1 image's facts say the same below sm_80 (on sm_80/86 FlashInfer, not Triton, keeps the cache).
    facts = next(f for f in VLLM_IMAGES if f.tag == "v0.19.1")
    assert facts.triton == "3.6.0"
    if capability < 80:
        assert capability < facts.fp8_kv_min_capability
