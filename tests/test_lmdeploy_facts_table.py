"""LMDeploy's image facts (components.engines.lmdeploy.facts): what each image runs per GPU over the whole table,
the lookup, and the functions that build an entry (called directly: the table is built at import)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest

from components.engines.lmdeploy import facts
from components.engines.lmdeploy.facts import IMAGES, LmdeployImage, lmdeploy_image
from components.facts.evidence import code, observed, unverified

CU128_16, CU128_15, CU130_16 = (
    "openmmlab/lmdeploy:v0.16.0-cu12.8",
    "openmmlab/lmdeploy:v0.15.0-cu12.8",
    "openmmlab/lmdeploy:v0.16.0-cu13.0",
)
CAPABILITIES = (60, 69, 70, 75, 79, 80, 86, 89, 90, 100, 120)
HEADS_70 = frozenset({64, 128, 256, 576})
HEADS_80 = frozenset({64, 128, 192, 256, 576})
# image -> per capability of CAPABILITIES: (TurboMind has kernels for it, the head sizes it has kernels for).
PER_GPU = {
    CU128_16: [
        (False, frozenset()),
        (False, frozenset()),
        (True, HEADS_70),
        (True, HEADS_70),
        (False, HEADS_70),
        (True, HEADS_80),
        (True, HEADS_80),
        (True, HEADS_80),
        (True, HEADS_80),
        (True, HEADS_80),
        (True, HEADS_80),
    ],
    CU130_16: [
        (False, frozenset()),
        (False, frozenset()),
        (False, HEADS_70),
        (False, HEADS_70),
        (False, HEADS_70),
        (True, HEADS_80),
        (True, HEADS_80),
        (True, HEADS_80),
        (True, HEADS_80),
        (True, HEADS_80),
        (True, HEADS_80),
    ],
}
PER_GPU[CU128_15] = PER_GPU[CU128_16]


def test_the_table() -> None:
    assert list(IMAGES) == [CU128_16, CU128_15, CU130_16]
    assert facts.DEFAULT_IMAGE == CU128_16


@pytest.mark.parametrize("ref", list(PER_GPU))
def test_what_each_image_runs_per_gpu(ref: str) -> None:
    f = IMAGES[ref]
    assert [(f.runs_on(c), f.head_dims(c)) for c in CAPABILITIES] == PER_GPU[ref]
    assert f.quantizations is f.model_formats


@pytest.mark.parametrize(
    ("ref", "key"),
    [
        (CU128_16, CU128_16),
        ("docker.io/openmmlab/lmdeploy:v0.15.0-cu12.8", CU128_15),
        ("openmmlab/lmdeploy:v0.16.0-cu13.0@sha256:" + "0" * 64, CU130_16),
        ("openmmlab/lmdeploy:v0.16.0", None),
        ("openmmlab/lmdeploy", None),
    ],
)
def test_lmdeploy_image(ref: str, key: str | None) -> None:
    assert lmdeploy_image(ref) is (IMAGES[key] if key else None)


def common(v: str) -> dict[str, Any]:
    """The sources every image of LMDeploy `v` shares, as messages cite them."""
    return {
        "architectures": code(f"[src-{v}] lmdeploy/turbomind/supported_models.py SUPPORTED_ARCHS"),
        "model_formats": code(
            f"[src-{v}] lmdeploy/turbomind/converter.py _SUPPORTED_GROUP_SIZES and the quantization_config asserts of "
            "get_tm_config; src/turbomind/kernels/gemm/kernel/sm70_884_{4,8,16}.cu"
        ),
        "kv_quant_policies": code(
            f"[src-{v}] lmdeploy/messages.py QuantPolicy and TurbomindEngineConfig; "
            "kernels/attention/kernel/decoding_sm70_*.cu (half, uint8, uint4 KV)"
        ),
        "attention_head_dims": code(
            f"[src-{v}] src/turbomind/kernels/attention/kernel/{{attention,decoding}}_sm70_{{64,128,256,576}}.cu; "
            "sm80 adds 192"
        ),
        "bf16_min_capability": code(
            f"[src-{v}] lmdeploy/turbomind/converter.py _resolve_dtype (bf16 falls back to fp16 when "
            "torch.cuda.is_bf16_supported() is false)"
        ),
        "pipeline_parallel": code(
            f"[cli-{v}] no pipeline-parallel option; TurboMind splits by TP/DP/EP only "
            "(src/turbomind/turbomind.cc CreateCommunicator)"
        ),
        "multi_node": code(
            f"[cli-{v}] --nnodes --node-rank --dist-init-addr (TP across nodes, Gloo/TCP bootstrap, lmdeploy#3362); "
            "[ref] no V100 multi-node report found"
        ),
        "cache_ratio_range": code(
            f"[src-{v}] src/turbomind/turbomind.cc CreateEngine (0 < cache_max_block_count < 1; a block count is "
            "no longer accepted)"
        ),
        "cache_block_seq_len": code(f"[cli-{v}] --cache-block-seq-len default 64"),
        "ffn_pad_align": code(
            f"[src-{v}] lmdeploy/turbomind/builders/ffn.py _pad_ffn_for_tp (groups of lcm(block, 32) rounded up to "
            "a multiple of TP, added by #4557)"
        ),
        "served_names": code(
            f"[whl-{v}] lmdeploy/serve/openai/endpoints/common.py validate_request: 404 'The model ... does not "
            "exist.' for any name but --model-name"
        ),
        "serve_args": code(f"[cli-{v}] components/engines/lmdeploy/data/lmdeploy-{v}-api_server-args.json"),
        "metrics": code(f"[metrics-{v}] lmdeploy/metrics/loggers.py PrometheusStatLogger"),
    }


@pytest.mark.parametrize("version", ["0.15.0", "0.16.0", "9.9"])
def test_the_sources_every_image_of_a_version_shares(version: str) -> None:
    assert facts._common(version) == common(version)


def as_dict(f: LmdeployImage) -> dict[str, Any]:
    return {x.name: getattr(f, x.name) for x in fields(f)}


def test_an_image_entry_is_its_versions_facts_with_its_own_build() -> None:
    own = {"cuda": code("c"), "torch": unverified("t"), "sass": observed("s"), "metrics": code("m")}
    f = facts._image("0.15.0", "cu99", cuda="9.9", torch="2.0", sass=(70, 80), sources=own, note="a note")
    assert as_dict(f) == {
        "engine": "lmdeploy",
        "version": "0.15.0",
        "repo": "openmmlab/lmdeploy",
        "tag": "v0.15.0-cu99",
        "variant": "cu99",
        "cuda": "9.9",
        "torch": "2.0",
        "sass": (70, 80),
        "architectures": facts._ARCHS_0150,
        "model_formats": facts._FORMATS,
        "kv_quant_policies": facts._KV_POLICIES,
        "attention_head_dims": {70: HEADS_70, 80: HEADS_80},
        "bf16_min_capability": 80,
        "pipeline_parallel": False,
        "multi_node": "TurboMind spans nodes only as tensor parallel over the network (--nnodes); no pipeline parallel",
        "cache_ratio_range": (0.0, 1.0),
        "cache_block_seq_len": 64,
        "ffn_pad_align": 32,
        "served_names": 1,
        "serve_args": "lmdeploy-0.15.0-api_server-args.json",
        "metrics": {
            "requests_running": "lmdeploy:num_requests_running",
            "requests_waiting": "lmdeploy:num_requests_waiting",
            "kv_cache_usage": "lmdeploy:gpu_cache_usage_perc",
            "prompt_tokens": "lmdeploy:prompt_tokens_total",
            "generation_tokens": "lmdeploy:generation_tokens_total",
            "time_to_first_token": "lmdeploy:time_to_first_token_seconds",
            "time_per_output_token": "lmdeploy:time_per_output_token_seconds",
            "e2e_latency": "lmdeploy:e2e_request_latency_seconds",
            "prefix_cache_hits": "lmdeploy:cached_tokens_total",
            "prefix_cache_queries": "lmdeploy:prompt_tokens_total",
        },
        # The image's own sources over its version's (here, its metrics').
        "sources": {**common("0.15.0"), **own},
        "note": "a note",
    }
    assert facts._image("0.16.0", "x", cuda="", torch="", sass=(), sources=own, note="").architectures == (
        facts._ARCHS_0160
    )


# image -> the facts its own arguments set (each entry's build; the rest is its version's, above).
BUILDS = {
    CU128_16: ("0.16.0", "cu12.8", "12.8.1", "<=2.12.1 from the cu126 index", (70, 75, 80, 86, 89, 90, 100, 120)),
    CU128_15: ("0.15.0", "cu12.8", "12.8.1", "<=2.10.0 from the cu128 index", (70, 75, 80, 86, 89, 90, 100, 120)),
    CU130_16: ("0.16.0", "cu13.0", "13.0.3", "<=2.12.1 from the cu130 index", (80, 86, 89, 90, 100, 120)),
}


@pytest.mark.parametrize("ref", list(BUILDS))
def test_every_entry_is_built_from_its_version(ref: str) -> None:
    f = IMAGES[ref]
    assert (f.version, f.variant, f.cuda, f.torch, f.sass) == BUILDS[ref]
    assert {k: f.sources[k] for k in common(f.version)} == common(f.version)
    assert (f.serve_args, f.architectures) == (
        f"lmdeploy-{f.version}-api_server-args.json",
        facts._ARCHS[f.version],
    )
