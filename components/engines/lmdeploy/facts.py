"""LMDeploy (TurboMind backend) facts keyed by image: what each `openmmlab/lmdeploy` image runs, per GPU.

Every fact names its source and evidence level (components.facts.evidence). Sources, as cited below:
  [whl-X]     the PyPI wheel lmdeploy-X-cp311-cp311-manylinux_2_28_x86_64.whl, read here: its
              lmdeploy/*.py, its METADATA, and the cubins of lmdeploy/lib/_turbomind*.so counted with
              ops/fatbin_archs.py (0.16.0: 91 sm_70 cubins; 0.15.0: 99).
  [src-X]     the InternLM/lmdeploy repository at tag vX (file:line), read with git.
  [ref]       InternLM/lmdeploy issues and PRs by number, #N being https://github.com/InternLM/lmdeploy/issues/N,
              and the users' reports on V100 posted there.
  [cli-X]     components/engines/lmdeploy/data/lmdeploy-X-api_server-args.json: `lmdeploy serve api_server`'s own argparse
              parser, dumped by components/engines/lmdeploy/tools/dump_lmdeploy.py from [whl-X].
  [metrics-X] tests/fixtures/engines/lmdeploy-X-metrics.txt: the exposition lmdeploy's
              PrometheusStatLogger registers ([whl-X] lmdeploy/metrics/loggers.py), rendered for real.
Nothing here was run on a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from components.engines.http import EngineServer
from components.facts.evidence import Sourced, code, observed, unverified
from components.facts.sourced import SourcedImage, image_ref_key

ENGINE = "lmdeploy"
REPO = "openmmlab/lmdeploy"
# The server's default port ([cli-0.16.0] --server-port: "Effective default is 23333 when unset").
DEFAULT_PORT = 23333


@dataclass(frozen=True)
class ModelFormat:
    """One `--model-format` of TurboMind: the GPUs it has kernels for and the checkpoints it accepts."""

    min_capability: int | None  # None: no TurboMind kernels on any GPU this table knows
    group_sizes: frozenset[int]  # accepted quantization group sizes (empty: not a grouped format)
    rule: str  # what the converter asserts of the checkpoint's quantization_config, in words


@dataclass(frozen=True)
class KvQuantPolicy:
    """One `--quant-policy` (KV cache quantization) value."""

    name: str
    bits: int  # bits per cached K/V element (16: not quantized)
    min_capability: int | None  # None: TurboMind refuses it on every GPU


@dataclass(frozen=True)
class LmdeployImage(SourcedImage):
    """One `openmmlab/lmdeploy` image and what TurboMind does in it. Capabilities as 70 for sm_70."""

    engine: str
    version: str
    repo: str
    tag: str
    variant: str  # the tag's CUDA suffix: "cu12.8", "cu13.0"
    cuda: str
    torch: str
    sass: tuple[int, ...]  # compute capabilities _turbomind.so has cubins for
    architectures: frozenset[str]  # config.json `architectures` TurboMind loads (else: PyTorch engine)
    model_formats: Mapping[str, ModelFormat]
    kv_quant_policies: Mapping[int, KvQuantPolicy]
    attention_head_dims: Mapping[int, frozenset[int]]  # min capability -> head sizes with kernels
    bf16_min_capability: int  # below: bfloat16 checkpoints fall back to float16
    pipeline_parallel: bool  # TurboMind splits layers across GPUs or nodes
    multi_node: str  # how TurboMind spans nodes, in words (the project does not deploy it)
    cache_ratio_range: tuple[float, float]  # --cache-max-entry-count must lie strictly inside
    cache_block_seq_len: int  # tokens per KV block (the --cache-block-seq-len default)
    ffn_pad_align: int  # _GEMM_K_ALIGN: the intermediate dim is split in groups of lcm(group, this)
    served_names: int  # how many model names one server answers to (--model-name)
    serve_args: str  # the parser dump in components/engines/<engine>/data
    metrics: Mapping[str, str]  # logical name -> exported series
    sources: Mapping[str, Sourced] = field(default_factory=dict)
    note: str = ""

    @property
    def quantizations(self) -> Mapping[str, ModelFormat]:
        """The seam's name for the accepted formats (each with its `min_capability`)."""
        return self.model_formats

    def runs_on(self, capability: int) -> bool:
        """TurboMind has kernels for this GPU in this image."""
        return capability in self.sass

    def head_dims(self, capability: int) -> frozenset[int]:
        """Attention head sizes TurboMind has kernels for on this GPU."""
        return next(
            (dims for need, dims in sorted(self.attention_head_dims.items(), reverse=True) if capability >= need),
            frozenset(),
        )


# TurboMind computes AWQ, GPTQ and compressed-tensors checkpoints in float16 whatever --dtype says: _build_resolver
# sets torch.float16 for them ([src-0.16.0] lmdeploy/turbomind/converter.py:39-48, after _resolve_dtype's bf16
# fallback, :127-151), so no dtype x format pair is refused at startup and the pack has no rule for one.
# What each `--model-format` needs ([src-0.16.0] lmdeploy/turbomind/converter.py:78-92 group sizes,
# :176-200 quantization_config asserts; GEMM kernels per arch: src/turbomind/kernels/gemm/kernel/
# sm70_884_{4,8,16}.cu register U4 dense + grouped, MXF4, E4M3 and F16 grouped tiles for sm_70).
_FORMATS = MappingProxyType(
    {
        "hf": ModelFormat(70, frozenset(), "fp16/bf16 weights (bf16 falls back to fp16 below sm_80)"),
        "awq": ModelFormat(70, frozenset({128}), "4-bit, group size 128, quantization_config.version 'gemm'"),
        "gptq": ModelFormat(70, frozenset({128}), "4-bit, group size 128, desc_act false, sym true"),
        "compressed-tensors": ModelFormat(
            70, frozenset({32, 128}), "pack-quantized 4-bit int weights, group size 32 or 128"
        ),
        "fp8": ModelFormat(70, frozenset({128}), "blocked fp8 (E4M3) weights, block 128"),
        "mxfp4": ModelFormat(70, frozenset({32}), "MXFP4 expert weights, group size 32"),
    }
)

# [src-0.16.0] lmdeploy/messages.py:20-27 QuantPolicy; :380-383 TurbomindEngineConfig refuses FP8 and
# FP8_E5M2; kernels: src/turbomind/kernels/attention/kernel/decoding_sm70_*.cu register half, uint8 and
# uint4 KV; TurboQuant's iterator exists only in iterator_sm80.h.
_KV_POLICIES = MappingProxyType(
    {
        0: KvQuantPolicy("none", 16, 70),
        4: KvQuantPolicy("int4", 4, 70),
        8: KvQuantPolicy("int8", 8, 70),
        16: KvQuantPolicy("fp8", 8, None),
        17: KvQuantPolicy("fp8_e5m2", 8, None),
        42: KvQuantPolicy("turbo_quant", 4, 80),
    }
)

# [src-0.16.0] lmdeploy/turbomind/supported_models.py:7-36 SUPPORTED_ARCHS (text models; the VL
# wrappers are listed too). DeepseekV3ForCausalLM (DeepSeek-V3/R1) is not there: [ref] #3294 open.
_ARCHS_0160 = frozenset(
    {
        "Qwen2ForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen2VLForConditionalGeneration",
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "InternS2PreviewForConditionalGeneration",
        "InternS2MobiusForConditionalGeneration",
        "InternVLChatModel",
        "InternVLForConditionalGeneration",
        "InternS1ForConditionalGeneration",
        "LlamaForCausalLM",
        "InternLM2ForCausalLM",
        "InternLM3ForCausalLM",
        "Glm4MoeLiteForCausalLM",
        "GptOssForCausalLM",
        "MixtralForCausalLM",
    }
)
# [src-0.15.0] the same table without the Qwen2-VL wrappers and InternS2-Mobius (added in 0.16.0).
_ARCHS_0150 = _ARCHS_0160 - {
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "InternS2MobiusForConditionalGeneration",
}
_ARCHS = {"0.15.0": _ARCHS_0150, "0.16.0": _ARCHS_0160}

# [metrics-0.16.0]: the series lmdeploy exports, under the logical names monitoring uses.
_METRICS = MappingProxyType(
    {
        "requests_running": "lmdeploy:num_requests_running",
        "requests_waiting": "lmdeploy:num_requests_waiting",
        "kv_cache_usage": "lmdeploy:gpu_cache_usage_perc",
        "prompt_tokens": "lmdeploy:prompt_tokens_total",
        "generation_tokens": "lmdeploy:generation_tokens_total",
        "time_to_first_token": "lmdeploy:time_to_first_token_seconds",
        "time_per_output_token": "lmdeploy:time_per_output_token_seconds",
        "e2e_latency": "lmdeploy:e2e_request_latency_seconds",
        # [whl-0.16.0] metrics/loggers.py: cached_tokens_total adds each finished request's cached prompt tokens;
        # prompt_tokens_total each request's whole prompt (stats.py: RequestStats(prompt_tokens=input_len)).
        "prefix_cache_hits": "lmdeploy:cached_tokens_total",
        "prefix_cache_queries": "lmdeploy:prompt_tokens_total",
    }
)


def _common(version: str) -> dict[str, Sourced]:
    """Sources shared by every image of one LMDeploy version."""
    return {
        "architectures": code(f"[src-{version}] lmdeploy/turbomind/supported_models.py SUPPORTED_ARCHS"),
        "model_formats": code(
            f"[src-{version}] lmdeploy/turbomind/converter.py _SUPPORTED_GROUP_SIZES and the "
            "quantization_config asserts of get_tm_config; "
            "src/turbomind/kernels/gemm/kernel/sm70_884_{4,8,16}.cu"
        ),
        "kv_quant_policies": code(
            f"[src-{version}] lmdeploy/messages.py QuantPolicy and TurbomindEngineConfig; "
            "kernels/attention/kernel/decoding_sm70_*.cu (half, uint8, uint4 KV)"
        ),
        "attention_head_dims": code(
            f"[src-{version}] src/turbomind/kernels/attention/kernel/"
            "{attention,decoding}_sm70_{64,128,256,576}.cu; sm80 adds 192"
        ),
        "bf16_min_capability": code(
            f"[src-{version}] lmdeploy/turbomind/converter.py _resolve_dtype (bf16 falls back "
            "to fp16 when torch.cuda.is_bf16_supported() is false)"
        ),
        "pipeline_parallel": code(
            f"[cli-{version}] no pipeline-parallel option; TurboMind splits by TP/DP/EP "
            "only (src/turbomind/turbomind.cc CreateCommunicator)"
        ),
        "multi_node": code(
            f"[cli-{version}] --nnodes --node-rank --dist-init-addr (TP across nodes, Gloo/TCP "
            "bootstrap, lmdeploy#3362); [ref] no V100 multi-node report found"
        ),
        "cache_ratio_range": code(
            f"[src-{version}] src/turbomind/turbomind.cc CreateEngine (0 < "
            "cache_max_block_count < 1; a block count is no longer accepted)"
        ),
        "cache_block_seq_len": code(f"[cli-{version}] --cache-block-seq-len default 64"),
        "ffn_pad_align": code(
            f"[src-{version}] lmdeploy/turbomind/builders/ffn.py _pad_ffn_for_tp "
            "(groups of lcm(block, 32) rounded up to a multiple of TP, added by #4557)"
        ),
        "served_names": code(
            f"[whl-{version}] lmdeploy/serve/openai/endpoints/common.py validate_request: "
            "404 'The model ... does not exist.' for any name but --model-name"
        ),
        "serve_args": code(f"[cli-{version}] components/engines/lmdeploy/data/lmdeploy-{version}-api_server-args.json"),
        "metrics": code(f"[metrics-{version}] lmdeploy/metrics/loggers.py PrometheusStatLogger"),
    }


def _image(
    version: str,
    variant: str,
    *,
    cuda: str,
    torch: str,
    sass: tuple[int, ...],
    sources: Mapping[str, Sourced],
    note: str,
) -> LmdeployImage:
    return LmdeployImage(
        engine=ENGINE,
        version=version,
        repo=REPO,
        tag=f"v{version}-{variant}",
        variant=variant,
        cuda=cuda,
        torch=torch,
        sass=sass,
        architectures=_ARCHS[version],
        model_formats=_FORMATS,
        kv_quant_policies=_KV_POLICIES,
        attention_head_dims=MappingProxyType(
            {70: frozenset({64, 128, 256, 576}), 80: frozenset({64, 128, 192, 256, 576})}
        ),
        bf16_min_capability=80,
        pipeline_parallel=False,
        multi_node="TurboMind spans nodes only as tensor parallel over the network (--nnodes); no pipeline parallel",
        cache_ratio_range=(0.0, 1.0),
        cache_block_seq_len=64,
        ffn_pad_align=32,
        served_names=1,
        serve_args=f"lmdeploy-{version}-api_server-args.json",
        metrics=_METRICS,
        sources=MappingProxyType({**_common(version), **sources}),
        note=note,
    )


_SASS_CU12 = (70, 75, 80, 86, 89, 90, 100, 120)

IMAGES: dict[str, LmdeployImage] = {
    i.ref: i
    for i in [
        _image(
            "0.16.0",
            "cu12.8",
            cuda="12.8.1",
            torch="<=2.12.1 from the cu126 index",
            sass=_SASS_CU12,
            sources={
                "cuda": code("[src-0.16.0] docker/Dockerfile:8 FROM nvidia/cuda:12.8.1-devel-ubuntu24.04 AS cu128"),
                "torch": unverified(
                    "[src-0.16.0] docker/Dockerfile:9-11 torch from the cu126 index (requirements/"
                    "runtime_cuda.txt torch<=2.12.1); 2.11.0+cu126 lists sm_70 (pytorch#182250) "
                    "[obs], 2.12 cu126 is inferred"
                ),
                "sass": code(
                    "[whl-0.16.0] _turbomind.so: 91 sm_70 cubins; [src-0.16.0] CMakeLists.txt:236-262 adds "
                    "70-real 75-real for CUDA < 13 (the image builds with CUDA 12.8.1)"
                ),
            },
            note="TurboMind's Volta HMMA kernels; V100 out of LMDeploy's CI since 2025-03 (#3253)",
        ),
        _image(
            "0.15.0",
            "cu12.8",
            cuda="12.8.1",
            torch="<=2.10.0 from the cu128 index",
            sass=_SASS_CU12,
            sources={
                "cuda": code("[src-0.15.0] docker/Dockerfile:8 FROM nvidia/cuda:12.8.1-devel-ubuntu22.04 AS cu12.8"),
                "torch": observed(
                    "[src-0.15.0] requirements/runtime_cuda.txt torch<=2.10.0 (cu128 index); "
                    "pytorch#182250: 2.10.0+cu128 get_arch_list() includes sm_70"
                ),
                "sass": code("[whl-0.15.0] _turbomind.so: 99 sm_70 cubins; CMakeLists.txt as in 0.16.0"),
            },
            note="the previous release, whose torch (2.10.0+cu128) is the better-evidenced sm_70 build",
        ),
        _image(
            "0.16.0",
            "cu13.0",
            cuda="13.0.3",
            torch="<=2.12.1 from the cu130 index",
            sass=(80, 86, 89, 90, 100, 120),
            sources={
                "cuda": code("[src-0.16.0] docker/Dockerfile:4 FROM nvidia/cuda:13.0.3-devel-ubuntu24.04 AS cu130"),
                "torch": code("[src-0.16.0] docker/Dockerfile:6 PYTORCH_CUDA_VERSION=cu130"),
                "sass": code(
                    "[src-0.16.0] CMakeLists.txt:238-240: 70-real and 75-real only for CUDA < 13.0; CUDA 13 "
                    "itself has no sm_70 target"
                ),
            },
            note="CUDA 13 build: no Volta kernels; use the -cu12.8 tag on V100",
        ),
    ]
}

DEFAULT_IMAGE = f"{REPO}:v0.16.0-cu12.8"


def lmdeploy_image(ref: str) -> LmdeployImage | None:
    """The facts of an LMDeploy image reference, None when the table does not know it."""
    return IMAGES.get(image_ref_key(ref))


# Its OpenAI server as the gateway sees it: idle keep-alive timeout and the statuses of a replica that
# cannot serve (the gateway's upstream keepalive_timeout stays shorter; failover counts those statuses).
HTTP_SERVER = EngineServer(
    keepalive_seconds=5,
    keepalive_env="UVICORN_TIMEOUT_KEEP_ALIVE",
    not_ready_statuses=(503,),
    sourced=code(
        "lmdeploy/serve/openai/api_server.py (0.15.0, 0.16.0 wheels) runs uvicorn with timeout_keep_alive="
        "int(os.environ.get('UVICORN_TIMEOUT_KEEP_ALIVE', 5)); /health answers 503 while the engine's "
        "health monitor says unhealthy (endpoints/management.py); the server listens only after the "
        "engine is built (read from code)."
    ),
)


# config.json `architectures[0]` of each catalog model_type (the Hugging Face config files the catalog
# cites), which is what TurboMind's SUPPORTED_ARCHS is keyed by.
HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "kimi_k2": "DeepseekV3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}
# The model spec's `quantization` (vLLM's method names) -> TurboMind's `--model-format`.
MODEL_FORMATS = {
    None: "hf",
    "awq": "awq",
    "gptq": "gptq",
    "compressed-tensors": "compressed-tensors",
    "fp8": "fp8",
    "mxfp4": "mxfp4",
}
