"""Engine facts keyed by serving image: what each image carries and what its engine does per GPU.

One entry per known image (engine, version, tag, variant). Every fact field of an entry names its
source and evidence level (components.facts.evidence): the rules, the capacity planner, the argv and
env builders, monitoring and the qualification gate all read these entries, never a version string.
Iterate `IMAGES` (or `known_images()`) to test every image against every GPU capability.

Sources, as cited below:
  [sd-X]       the PyPI sdist vllm-X.tar.gz (https://pypi.org/project/vllm/X/, a build of tag vX):
               docker/Dockerfile, requirements/cuda.txt, CMakeLists.txt, vllm/..., cited by file:line (the
               sdists are not fetched by the tests: facts, not code run here).
  vLLM 0.19.1 the PyPI wheel vllm-0.19.1-cp38-abi3-manylinux_2_31_x86_64.whl (sha256 71a87f46…dc719),
               read here: vllm/envs.py, vllm/engine/arg_utils.py, vllm/v1/metrics/loggers.py,
               vllm/model_executor/layers/quantization/*.py.
  vLLM 0.9.2  the PyPI wheel vllm-0.9.2-cp38-abi3-manylinux1_x86_64.whl (sha256 f3c5da29…85cd34): its
               quantization methods' capabilities and activation dtypes dumped from its code
               (components/engines/vllm/data/vllm-0.9.2-quantizations.json), which agree with [sd-0.9.2] below.
  vLLM 0.11.0 the PyPI wheel vllm-0.11.0-cp38-abi3-manylinux1_x86_64.whl (sha256 3861c75f…68cd62), read
               here: vllm/envs.py, engine/arg_utils.py, platforms/cuda.py, v1/worker/gpu_worker.py,
               v1/metrics/loggers.py, v1/attention/backends/*.py; its quantization capabilities and
               flag list dumped from its code (components/engines/vllm/data, components/engines/<engine>/data).
  pytorch#147607:  pytorch/pytorch#147607 (sm_70 removed from the CUDA 12.8 builds of 2.7) [maint];
               #18818, #19185 "no kernel image is available" on V100 with the 0.9.x images [obs].
  pytorch#182250:  pytorch/pytorch#182250: torch 2.10.0+cu128 get_arch_list() includes sm_70 [obs].
  [triton]     the "Triton compile matrix for sm_70": vLLM's Triton kernels compiled for GPUTarget("cuda", 70, 32)
               with the Triton 3.2.0/3.3.0/3.3.1/3.4.0 wheels from PyPI (https://pypi.org/project/triton/), and
               0.19.0's fused_moe_kernel with 3.5.0 and 3.6.0 (compiles, 0 mma.sync: FMA only); vllm#17639,
               #19203, sglang#7467 [obs]; tests/test_qualification.py repeats it on the real 3.3.0, 3.4.0 and
               3.6.0 wheels with the qualification gate's fp16 tl.dot kernel.
         vllm#14016 [obs] (MLA prefill -> FlashAttention-2 "only supports Ampere GPUs or newer");
               0.19.0 mla_attention.py:1285-1322, 2139-2150 [code].
  vllm#22001, 0.9.2 fused_moe/layer.py:732-736   0.9.2 fused_moe/layer.py:732-736 (no FusedMoE method for plain gptq), vllm#22001 [obs],
               fixed by #21733; 0.19.1 quantization/gptq.py:171-183 (FusedMoE -> MoeWNA16) [code].
  vLLM 0.19.0 .buildkite/release-pipeline.yaml:151-158: the -ubuntu2404 image is built for
               '8.7 8.9 9.0 10.0+PTX 12.0' (no 7.0).
  vllm   vllm PR #23614 / #24022 [maint]: V1 enabled on Volta and Turing after Triton 3.4.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from components.engines.http import EngineServer
from components.engines.weights import FP8_WEIGHT_METHODS  # noqa: F401  (the rules read it with these facts)
from components.facts.evidence import Sourced, code, observed, unverified
from components.facts.sourced import SourcedImage, image_ref_key, split_tag

if TYPE_CHECKING:
    from components.spec import StackSpec

MoeRoute = Literal["native", "none", "moe_wna16"]


@dataclass(frozen=True)
class QuantMethod:
    """One `--quantization` method of one engine version."""

    min_capability: int | None  # None: not a CUDA method (TPU, Neuron, Intel)
    moe: MoeRoute  # how FusedMoE layers of a MoE model load: own method, none (dies), or the MoeWNA16 route
    # The activation dtypes (ModelConfig.dtype) vLLM starts with for this method: its config's
    # get_supported_act_dtypes(), in vLLM's order, as torch names them; () where it could not be asked.
    act_dtypes: tuple[str, ...] = ()
    act_dtypes_source: str = ""  # the `def get_supported_act_dtypes` that answers, "vllm/…/gptq.py:130"
    # Answers that change with the GPU: (from capability, dtypes), highest first (gguf on sm_100+, 0.19.1).
    act_dtypes_from: tuple[tuple[int, tuple[str, ...]], ...] = ()

    def supported_act_dtypes(self, capability: int | None) -> tuple[str, ...]:
        """The activation dtypes the method accepts on a GPU of this capability (None: not known)."""
        return next(
            (d for need, d in self.act_dtypes_from if capability is not None and capability >= need), self.act_dtypes
        )


@dataclass(frozen=True)
class TritonFacts:
    """What one Triton release compiles for old GPUs (fp16 `tl.dot`, the kernel of fused MoE,
    prefix-prefill and Triton MLA decode)."""

    version: str
    fp16_dot_min_capability: int  # below this, fp16 tl.dot does not compile (the engine dies)
    tensor_core_min_capability: int  # below this, tl.dot compiles to FMA only (slow prefill)
    failure: str  # what the compiler says where it fails
    source: Sourced


TRITON: dict[str, TritonFacts] = {
    t.version: t
    for t in [
        # 3.2.0: simple fp16 dots compile on sm_70 (Volta mma.m8n8k4), but the fused-MoE second GEMM
        # (MUL_ROUTED_WEIGHT), moe_wna16 and prefix-prefill abort. [triton] QwenLM/Qwen3#1294 [obs]
        TritonFacts(
            "3.2.0",
            75,
            70,
            "LLVM ERROR: Failed to compute parent layout for slice layout",
            observed("QwenLM/Qwen3#1294 (V100, vLLM 0.8.5 fp16 MoE fails); Triton compile matrix for sm_70"),
        ),
        TritonFacts(
            "3.3.0",
            80,
            80,
            "Unsupported conversion from f16 to f16 / LLVM ERROR: Unsupported rounding mode for conversion",
            observed("vllm#17639, #19203, sglang#7467 (sm_75); Triton compile matrix for sm_70"),
        ),
        TritonFacts(
            "3.3.1",
            80,
            80,
            "Unsupported conversion from f16 to f16 / LLVM ERROR: Unsupported rounding mode for conversion",
            code("Triton compile matrix for sm_70"),
        ),
        TritonFacts(
            "3.4.0", 70, 80, "", code("Triton compile matrix for sm_70: every kernel compiles for sm_70, FMA only")
        ),
        TritonFacts(
            "3.5.0", 70, 80, "", code("Triton compile matrix for sm_70: 0.19.0 fused_moe_kernel compiles, 0 mma.sync")
        ),
        TritonFacts(
            "3.6.0", 70, 80, "", code("Triton compile matrix for sm_70: 0.19.0 fused_moe_kernel compiles, 0 mma.sync")
        ),
    ]
}


# The vllm-openai image's ENTRYPOINT up to 0.9.2 (and what an image without facts is read as).
API_SERVER_ENTRYPOINT = ("python3", "-m", "vllm.entrypoints.openai.api_server")


@dataclass(frozen=True)
class ImageFacts(SourcedImage):
    """One serving image and what its engine does per compute capability. Capabilities are written
    as vLLM writes them: 70 for sm_70 (7.0)."""

    engine: str  # pools.*.engine that runs it ("vllm")
    version: str  # the engine's version inside ("0.19.1")
    repo: str
    tag: str
    variant: str  # "" for the default build, else the tag's suffix ("ubuntu2404")
    cuda: str
    torch: str
    torch_arch_list: tuple[int, ...]  # SASS in torch's CUDA build: torch.cuda.get_arch_list()
    triton: str | None
    engine_line: Literal["V0", "V1"]  # the engine the image runs on GPUs below sm_80
    v0_engine: bool  # the image still has the V0 engine (VLLM_USE_V1=0 selects it; else it dies)
    v1_min_capability: int | None  # None: no V1 engine
    reads_vllm_use_v1: bool  # whether envs.py still reads VLLM_USE_V1
    attention: tuple[tuple[int, str], ...]  # (min capability, backend), highest first
    attention_backend_flag: bool  # `--attention-backend` exists (else VLLM_ATTENTION_BACKEND)
    quantizations: Mapping[str, QuantMethod]
    kv_cache_dtypes: tuple[str, ...]
    fp8_kv_min_capability: int
    bf16_min_capability: int
    prefix_prefill_min_capability: int  # below: chunked prefill and prefix caching kernels die
    chunked_prefill_auto_above: int | None  # V0 turns chunked prefill on above this max_model_len
    mla_min_capability: int  # below: VLLM_MLA_DISABLE=1 is required
    batch_budget: Literal["v0", "v1"]  # how max_num_batched_tokens defaults (capacity planner)
    # Whether the memory profiler's baseline is taken before NCCL starts, so that the communicators' and
    # custom all-reduce buffers count inside gpu-memory-utilization's budget (else they sit outside it,
    # and vLLM refuses to start when less than utilization x total is free once they exist).
    nccl_in_budget: bool
    serve_args: str | None  # the parser dump in components/engines/<engine>/data (None: flags cannot be checked)
    metrics: Mapping[str, str]  # logical name -> exported series (counters with _total)
    tuned_moe_config_env: str | None  # env var of a folder of fused-MoE tile configs
    serve_refuses_model_flag: bool  # `vllm serve --model X` exits (else: a warning, X becomes the positional)
    # vLLM's own multi-node launcher: `vllm serve --nnodes N --node-rank R --master-addr A --master-port P` on
    # every node, `--headless` on all but rank 0 (the mp executor across nodes; pools.<pool>.vllm.multiNode: native).
    native_multi_node: bool = False
    # `--shutdown-timeout N`: on SIGTERM the server stops taking requests and lets those in flight run up to N
    # seconds (its default, 0, aborts them): a `docker stop` that lets streams finish.
    shutdown_timeout_flag: bool = False
    # The image's ENTRYPOINT: what a container that sets no entrypoint runs, its command appended as arguments.
    entrypoint: tuple[str, ...] = API_SERVER_ENTRYPOINT
    sources: Mapping[str, Sourced] = field(default_factory=dict)
    note: str = ""

    def torch_runs_on(self, capability: int) -> bool:
        """The image's torch has kernels for this GPU (else: "no kernel image is available")."""
        return capability in self.torch_arch_list

    @property
    def triton_facts(self) -> TritonFacts | None:
        """What the image's Triton compiles (None: no Triton, or a release not in TRITON)."""
        return TRITON.get(self.triton or "")

    def triton_fp16_dot(self, capability: int) -> bool | None:
        """fp16 `tl.dot` compiles on this GPU with the image's Triton (None: unknown Triton)."""
        t = self.triton_facts
        return None if t is None else capability >= t.fp16_dot_min_capability

    def attention_backend(self, capability: int) -> str:
        """The attention backend the engine picks on this GPU."""
        return next(b for need, b in self.attention if capability >= need)

    def runs_v1(self, capability: int) -> bool:
        """The engine runs its V1 engine on this GPU."""
        return self.v1_min_capability is not None and capability >= self.v1_min_capability


def _sources(common: Mapping[str, Sourced], **specific: Sourced) -> MappingProxyType[str, Sourced]:
    return MappingProxyType({**common, **specific})


# Metric names: V0 (engine/metrics.py of 0.9.2) and V1 (v1/metrics/loggers.py of 0.19.1), which renamed
# the KV-cache gauge and the per-output-token histogram.
_V0_METRICS = MappingProxyType(
    {
        "requests_running": "vllm:num_requests_running",
        "requests_waiting": "vllm:num_requests_waiting",
        "kv_cache_usage": "vllm:gpu_cache_usage_perc",
        "preemptions": "vllm:num_preemptions_total",
        "prompt_tokens": "vllm:prompt_tokens_total",
        "generation_tokens": "vllm:generation_tokens_total",
        "time_to_first_token": "vllm:time_to_first_token_seconds",
        "time_per_output_token": "vllm:time_per_output_token_seconds",
        "e2e_latency": "vllm:e2e_request_latency_seconds",
    }
)
_V1_METRICS = MappingProxyType(
    {
        **_V0_METRICS,
        "kv_cache_usage": "vllm:kv_cache_usage_perc",
        "time_per_output_token": "vllm:inter_token_latency_seconds",
        # Counters of prompt tokens looked up in, and found in, the prefix cache (0.11.0 and 0.19.1
        # v1/metrics/loggers.py: vllm:prefix_cache_queries / _hits, exported with _total).
        "prefix_cache_queries": "vllm:prefix_cache_queries_total",
        "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    }
)

_DATA = Path(__file__).resolve().parent / "data"


def _dumped(version: str) -> dict[str, dict[str, object]]:
    """One vLLM wheel's quantization dump (components/engines/vllm/tools/dump_vllm_quantizations.py)."""
    return json.loads((_DATA / f"vllm-{version}-quantizations.json").read_text())  # type: ignore[no-any-return]


def _dumped_capabilities(version: str) -> dict[str, int | None]:
    """{method: get_min_capability} as dumped from one vLLM wheel (None: not a CUDA method)."""
    return _dumped(version)["methods"]  # type: ignore[return-value]


def _with_act_dtypes(methods: Mapping[str, QuantMethod], version: str) -> MappingProxyType[str, QuantMethod]:
    """Each method with the activation dtypes its get_supported_act_dtypes() returned in the version's dump."""
    dump = _dumped(version)
    act: dict[str, list[str]] = dump["act_dtypes"]  # type: ignore[assignment]
    where: dict[str, str] = dump["act_dtypes_source"]  # type: ignore[assignment]
    by_cap: dict[str, dict[str, list[str]]] = dump["act_dtypes_by_capability"]  # type: ignore[assignment]
    return MappingProxyType(
        {
            m: replace(
                q,
                act_dtypes=tuple(act.get(m, ())),
                act_dtypes_source=where.get(m, ""),
                act_dtypes_from=tuple(
                    (int(c), tuple(d)) for c, d in sorted(by_cap.get(m, {}).items(), key=lambda i: -int(i[0]))
                ),
            )
            for m, q in methods.items()
        }
    )


_Q092 = _with_act_dtypes(
    {
        # vLLM 0.9.2 get_min_capability per method; MoE: which methods give FusedMoE a method. [sd-0.9.2]
        **{m: QuantMethod(60, "native") for m in ("gguf", "aqlm", "deepspeedfp", "auto-round")},
        "gptq": QuantMethod(60, "none"),  # vllm#22001, 0.9.2 fused_moe/layer.py:732-736: AssertionError in FusedMoE
        **{m: QuantMethod(70, "native") for m in ("bitsandbytes", "moe_wna16", "compressed-tensors", "quark")},
        "bitblas": QuantMethod(70, "none"),
        **{m: QuantMethod(75, "native") for m in ("awq", "torchao")},
        # fp8 (fp8.py:101-102) among the sm_80 methods: no FP8 checkpoint below sm_80 in 0.9.2.
        **{
            m: QuantMethod(80, "native")
            for m in (
                "awq_marlin",
                "gptq_marlin",
                "gptq_marlin_24",
                "gptq_bitblas",
                "marlin",
                "fp8",
                "fbgemm_fp8",
                "experts_int8",
                "hqq",
                "qqq",
                "rtn",
                "modelopt_fp4",
                "ptpc_fp8",
            )
        },
        "modelopt": QuantMethod(89, "native"),
        **{m: QuantMethod(None, "none") for m in ("tpu_int8", "neuron_quant", "ipex")},
    },
    "0.9.2",
)
_Q0191 = _with_act_dtypes(
    {
        # vLLM 0.19.1 get_min_capability of every QUANTIZATION_METHODS entry, called for real on the wheel's code
        # (components/engines/vllm/data/vllm-0.19.1-quantizations.json). fp8 from sm_75 (fp8.py:145-146): below sm_89
        # Fp8LinearMethod runs Marlin FP8 weight-only (fp8.py:294-310).
        **{m: QuantMethod(cap, "native") for m, cap in _dumped_capabilities("0.19.1").items()},
        "gptq": QuantMethod(60, "moe_wna16"),  # gptq.py:171-183 routes FusedMoE to MoeWNA16
    },
    "0.19.1",
)

_COMMON_092 = {
    "cuda": code("vLLM 0.9.2 docker/Dockerfile:9 CUDA_VERSION=12.8.1"),
    "torch": code(
        "vLLM 0.9.2 requirements/cuda.txt:9 torch==2.7.0 from the cu128 index (Dockerfile:157-159, "
        ":361-364); vllm#18841 env torch 2.7.0+cu128 [obs]"
    ),
    "torch_arch_list": observed(
        "pytorch#147607: torch 2.7.0+cu128 is built for sm_75..sm_120 without sm_70; "
        "vllm#18818, #19185 'no kernel image is available' on V100"
    ),
    "triton": code("torch 2.7.0's metadata pins triton==3.3.0; vllm#18841 env [obs]"),
    "engine_line": code("vLLM 0.9.2 vllm/engine/arg_utils.py:1353-1363 (V1 needs capability major >= 8, else V0)"),
    "v1_min_capability": code("vLLM 0.9.2 arg_utils.py:1353-1363"),
    "v0_engine": code("vLLM 0.9.2 vllm/worker/worker.py (the V0 worker) and vllm/engine/llm_engine.py"),
    "reads_vllm_use_v1": code("vLLM 0.9.2 vllm/envs.py (VLLM_USE_V1, unset reads as 1)"),
    "attention": code(
        "vLLM 0.9.2 platforms/cuda.py:206-212, 309-314 (XFormers below sm_80 on V0; TRITON_MLA for MLA models)"
    ),
    "attention_backend_flag": code("vLLM 0.9.2 no --attention-backend (VLLM_ATTENTION_BACKEND env)"),
    "quantizations": code(
        "vLLM 0.9.2 get_min_capability of each quantization/*.py; config.py:4469-4478; "
        "MoE vllm#22001, 0.9.2 fused_moe/layer.py:732-736"
    ),
    "quantization_act_dtypes": code(
        "vLLM 0.9.2 config.py:4479-4484 (VllmConfig._get_quantization_config, from __post_init__ :4538); each "
        "method's dtypes: components/engines/vllm/data/vllm-0.9.2-quantizations.json"
    ),
    "kv_cache_dtypes": code("vLLM 0.9.2 config.py CacheDType"),
    "fp8_kv_min_capability": code(
        "vLLM 0.9.2: on sm_75 V0 runs XFORMERS, whose cache write and paged-attention "
        "decode are CUDA kernels taking kv_cache_dtype (attention/backends/xformers.py:"
        "549-623) and CacheConfig checks no capability (config.py:1589-1599); below sm_75 "
        "refused: no report of an fp8 cache on Volta, and this image's torch has no sm_70"
    ),
    "bf16_min_capability": code("vLLM 0.9.2 platforms/cuda.py:62-72, worker/worker.py:540-557"),
    "prefix_prefill_min_capability": observed(
        "vllm#18993 (V100) and #19203 (T4): the Triton prefix-prefill "
        "kernel fails with Triton 3.3.0; Triton compile matrix for sm_70"
    ),
    "chunked_prefill_auto_above": code("vLLM 0.9.2 arg_utils.py:1510-1539 (V0 chunks prefill above 32768)"),
    "mla_min_capability": observed(
        "vllm#14016 (sm_75, same code path); 0.9.2 attention/backends/mla/"
        "common.py:1070-1078 calls FA2 with no fallback"
    ),
    "batch_budget": code("vLLM 0.9.2 config.py:2242-2279: max(max_model_len, 2048) with chunked prefill off"),
    "nccl_in_budget": code(
        "vLLM 0.9.2 worker/worker.py:188-195 and v1/worker/gpu_worker.py:140-160: the baseline "
        "snapshot precedes init_worker_distributed_environment; the logged non_torch_memory "
        "grows with TP (tests/fixtures/vllm-startup-logs) [obs]"
    ),
    "serve_args": code("components/engines/vllm/data/vllm-0.9.2-serve-args.json, dumped from 0.9.2's own parser"),
    "metrics": code(
        "vLLM 0.9.2 vllm/engine/metrics.py:64-222 (https://github.com/vllm-project/vllm/blob/v0.9.2/"
        "vllm/engine/metrics.py)"
    ),
    "tuned_moe_config_env": code("vLLM 0.9.2 envs.py VLLM_TUNED_CONFIG_FOLDER (fused_moe.py get_moe_configs)"),
    "serve_refuses_model_flag": code("vLLM 0.9.2 vllm/utils/__init__.py:1475-1481 (ValueError)"),
    "native_multi_node": code(
        "components/engines/vllm/data/vllm-0.9.2-serve-args.json: no --nnodes, --node-rank, --master-addr or "
        "--master-port (only the data-parallel --headless): multi-node needs Ray"
    ),
    "shutdown_timeout_flag": code("components/engines/vllm/data/vllm-0.9.2-serve-args.json: no --shutdown-timeout"),
    "entrypoint": code(
        'vLLM 0.9.2 docker/Dockerfile:527 (vllm-openai target): ENTRYPOINT ["python3", "-m", '
        '"vllm.entrypoints.openai.api_server"]'
    ),
}

_COMMON_0191 = {
    "cuda": code("vLLM 0.19.0 docker/Dockerfile:25 CUDA 12.9.1 (0.19.1 is its patch release)"),
    "torch": code("vLLM 0.19.0 requirements/cuda.txt torch==2.10.0, cu129 index in the image"),
    "torch_arch_list": unverified(
        "pytorch#182250: 2.10.0+cu128 includes sm_70 [obs]; the image's cu129 build is "
        "inferred from the same arch list, not verified: the qualification gate checks "
        "get_arch_list() on every node"
    ),
    "triton": code("torch 2.10.0's metadata pins triton==3.6.0"),
    "engine_line": code("vLLM 0.11.0 V0 removed (vllm/worker/ holds only worker_base.py); [v1-volta]"),
    "v1_min_capability": code("vllm PR #24022: V1 on Volta and Turing"),
    "v0_engine": code("vLLM 0.11.0 removed V0 (vllm/worker/ holds only worker_base.py)"),
    "reads_vllm_use_v1": code("vLLM 0.19.1 vllm/envs.py has no VLLM_USE_V1 (removed in 0.12.0)"),
    "attention": code(
        "vLLM 0.19.0 platforms/cuda.py:46-81 priority FLASH_ATTN, FLASHINFER, TRITON_ATTN: V100 "
        "lands on TRITON_ATTN (v1/attention/backends/triton_attn.py:327-328, 353-354)"
    ),
    "attention_backend_flag": code("vLLM 0.19.1 engine/arg_utils.py --attention-backend (since 0.14.0)"),
    "quantizations": code(
        "vLLM 0.19.1 quantization/__init__.py QUANTIZATION_METHODS, get_min_capability of "
        "each method; gptq.py:171-183 GPTQ MoE -> MoeWNA16"
    ),
    "quantization_act_dtypes": code(
        "vLLM 0.19.1 config/vllm.py:522-527 (VllmConfig._get_quantization_config, from __post_init__ :702); each "
        "method's dtypes: components/engines/vllm/data/vllm-0.19.1-quantizations.json"
    ),
    "kv_cache_dtypes": code("vLLM 0.19.1 config/cache.py:14-23 CacheDType"),
    "fp8_kv_min_capability": code(
        "vLLM 0.19.1: below sm_80 the only backend is TRITON_ATTN, which views an fp8 "
        "cache as float8_e4m3fn (v1/attention/backends/triton_attn.py:399, 475-478), and "
        "Triton 3.6 has fp8e4nv only from sm_89 (backends/nvidia/compiler.py:186-190): "
        "'type fp8e4nv not supported in this architecture' on sm_70 and sm_75, as "
        "tests/test_fp8_bf16_below_sm80.py compiles with the real Triton 3.6.0 wheel"
    ),
    "bf16_min_capability": code("vLLM 0.19.0 platforms/cuda.py supported dtypes below sm_80: fp16, fp32"),
    "prefix_prefill_min_capability": observed(
        "vllm#47019 (V100, vLLM 0.19, fp16 MoE serves with V1's defaults: "
        "chunked prefill and prefix caching on, TRITON_ATTN, Triton 3.6)"
    ),
    "chunked_prefill_auto_above": code("V1 chunks every prefill: no auto switch"),
    "mla_min_capability": code(
        "vLLM 0.19.0 mla_attention.py:1285-1322 (non-FA prefill only on sm_100), "
        ":2139-2150; config/model.py:1581 VLLM_MLA_DISABLE"
    ),
    "batch_budget": code(
        "vLLM 0.19.1 engine/arg_utils.py:2050-2075, 2213-2230: 2048 (8192 on >=70 GiB non-A100)"
        " for the OpenAI server, max(max_model_len, that) with chunked prefill off"
    ),
    "nccl_in_budget": code(
        "vLLM 0.19.1 v1/worker/gpu_worker.py:259-286: NCCL starts before the init snapshot "
        "(vllm#25359, in 0.11.0), and request_memory (v1/worker/utils.py:403-423) refuses a "
        "GPU with less than utilization x total free"
    ),
    "serve_args": code("components/engines/vllm/data/vllm-0.19.1-serve-args.json, dumped from 0.19.1's own parser"),
    "metrics": code(
        "vLLM 0.19.1 vllm/v1/metrics/loggers.py:437-894 (kv_cache_usage_perc, inter_token_latency_seconds)"
    ),
    "tuned_moe_config_env": code("vLLM 0.19.1 envs.py:213, 1491 VLLM_TUNED_CONFIG_FOLDER (fused_moe.py:1062)"),
    "serve_refuses_model_flag": code(
        "vLLM 0.19.1 utils/argparse_utils.py:185-214 (a warning; --model X becomes the positional)"
    ),
    "native_multi_node": code(
        "components/engines/vllm/data/vllm-0.19.1-serve-args.json, dumped from 0.19.1's parser: --nnodes/-n "
        "(default 1), --node-rank/-r (default 0), --master-addr (default 127.0.0.1), --master-port (default "
        "29501), --headless (store_true); vllm/entrypoints/cli/serve.py run_headless starts a MultiprocExecutor "
        "on a node of rank > 0 (vllm PR #23691, the mp executor across nodes, after 0.11.0); two such processes "
        "served TP 2 across them on the CPU build of 0.19.1 (issue 33) [obs]"
    ),
    "shutdown_timeout_flag": code(
        "components/engines/vllm/data/vllm-0.19.1-serve-args.json: --shutdown-timeout (int, default 0); vLLM "
        "0.19.1 vllm/entrypoints/launcher.py (SIGTERM with a timeout above 0: no new request, those in flight "
        "drained for up to it) and vllm/v1/engine/core.py _handle_shutdown (0: every request in flight aborted)"
    ),
    "entrypoint": unverified(
        'vllm-project/vllm docker/Dockerfile, vllm-openai target: ENTRYPOINT ["vllm", "serve"], no CMD, read at '
        "commit dead20ba (a tree between 0.11 and 0.19: FlashInfer 0.4.1) and quoted from a later tree "
        "(CUDA 13.0.3, Dockerfile:1088-1096); not read at the v0.19.1 tag itself"
    ),
}

_V1_ATTENTION = ((80, "FLASH_ATTN"), (0, "TRITON_ATTN"))
_KV_0191 = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")


_Q0110 = _with_act_dtypes(
    {
        # vLLM 0.11.0 get_min_capability of every QUANTIZATION_METHODS entry, called for real on the wheel's code
        # (components/engines/vllm/data/vllm-0.11.0-quantizations.json, components/engines/vllm/tools/dump_vllm_quantizations.py).
        **{m: QuantMethod(cap, "native") for m, cap in _dumped_capabilities("0.11.0").items()},
        "gptq": QuantMethod(60, "moe_wna16"),  # gptq.py:134-146 routes FusedMoE to MoeWNA16
    },
    "0.11.0",
)

_COMMON_0110 = {
    "cuda": unverified(
        "vLLM 0.11.0 requires torch==2.8.0 (wheel METADATA), whose PyPI build is +cu128; the image's "
        "Dockerfile CUDA_VERSION was not read here"
    ),
    "torch": code("vLLM 0.11.0 wheel METADATA Requires-Dist torch==2.8.0"),
    "torch_arch_list": unverified(
        "the real torch 2.8.0+cu128 wheel compiles sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 "
        "sm_120 (libtorch_python.so's arch flags, read by tests/test_qualification.py); "
        "that the image carries this build is inferred: the qualification gate checks "
        "get_arch_list() on every node"
    ),
    "triton": code("torch 2.8.0's wheel METADATA pins triton==3.4.0"),
    "engine_line": code("vLLM 0.11.0 platforms/cuda.py:386-388 'V0 attention backends have been removed'"),
    "v0_engine": code(
        "vLLM 0.11.0 platforms/cuda.py:386-388: VLLM_USE_V1=0 reaches 'V0 attention backends have "
        "been removed' (RuntimeError)"
    ),
    "v1_min_capability": code(
        "vLLM 0.11.0 engine/arg_utils.py:1449-1530 _is_v1_supported_oracle tests no compute capability (vllm PR #24022)"
    ),
    "reads_vllm_use_v1": code("vLLM 0.11.0 vllm/envs.py:900-901 (VLLM_USE_V1, unset reads as 1)"),
    "attention": code(
        "vLLM 0.11.0 platforms/cuda.py:356-370: FLASH_ATTN from sm_80, FlexAttention below (TRITON_ATTN "
        "only when VLLM_ATTENTION_BACKEND names it)"
    ),
    "attention_backend_flag": code(
        "vLLM 0.11.0 serve parser has no --attention-backend "
        "(components/engines/vllm/data/vllm-0.11.0-serve-args.json); VLLM_ATTENTION_BACKEND, envs.py:612"
    ),
    "quantizations": code(
        "vLLM 0.11.0 get_min_capability of each QUANTIZATION_METHODS entry, called on the wheel's "
        "code (components/engines/vllm/data/vllm-0.11.0-quantizations.json); gptq.py:134-146 GPTQ MoE -> "
        "MoeWNA16"
    ),
    "quantization_act_dtypes": code(
        "vLLM 0.11.0 config/__init__.py:267-272 (VllmConfig._get_quantization_config, from __post_init__ :320); each "
        "method's dtypes: components/engines/vllm/data/vllm-0.11.0-quantizations.json"
    ),
    "kv_cache_dtypes": code("vLLM 0.11.0 config/cache.py:25-26 CacheDType"),
    "fp8_kv_min_capability": code(
        "vLLM 0.11.0: below sm_80 FlexAttention refuses a quantized cache "
        "(v1/attention/backends/flex_attention.py:703-704) and TRITON_ATTN views it as "
        "float8_e4m3fn (triton_attn.py:236, 298-299), which Triton 3.4 has only from sm_89 "
        "(backends/nvidia/compiler.py:170-171)"
    ),
    "bf16_min_capability": code("vLLM 0.11.0 platforms/cuda.py:497-510 check_if_supports_dtype"),
    "prefix_prefill_min_capability": code(
        "vLLM 0.11.0 V1 runs chunked prefill and prefix caching inside its "
        "attention backend; Triton 3.4 compiles fp16 tl.dot for sm_70 (FMA), "
        "tests/test_qualification.py"
    ),
    "chunked_prefill_auto_above": code("V1 chunks every prefill: no auto switch"),
    "mla_min_capability": code(
        "vLLM 0.11.0 v1/attention/backends/mla/common.py:1127-1142 (MLA prefill calls "
        "flash_attn_varlen_func, FA2 needs sm_80); config/model.py:1444 VLLM_MLA_DISABLE"
    ),
    "batch_budget": code(
        "vLLM 0.11.0 engine/arg_utils.py:1600-1672: 2048 (8192 on >=70 GiB non-A100) for the "
        "OpenAI server; with chunked prefill off max_model_len itself"
    ),
    "nccl_in_budget": code(
        "vLLM 0.11.0 v1/worker/gpu_worker.py:165-195: NCCL starts before the init snapshot "
        "(vllm#25359), and a GPU with less than utilization x total free is refused"
    ),
    "serve_args": code("components/engines/vllm/data/vllm-0.11.0-serve-args.json, dumped from 0.11.0's own parser"),
    "metrics": code(
        "vLLM 0.11.0 vllm/v1/metrics/loggers.py (kv_cache_usage_perc, inter_token_latency_seconds; "
        "tests/fixtures/metrics/vllm-0.11.0-v1.txt)"
    ),
    "tuned_moe_config_env": code("vLLM 0.11.0 envs.py:192 VLLM_TUNED_CONFIG_FOLDER"),
    "serve_refuses_model_flag": code("vLLM 0.11.0 vllm/utils/__init__.py:1856-1864 (ValueError)"),
    "native_multi_node": code(
        "components/engines/vllm/data/vllm-0.11.0-serve-args.json: no --nnodes, --node-rank, --master-addr or "
        "--master-port (vllm PR #23691, the mp executor across nodes, is not in this release): multi-node needs Ray"
    ),
    "shutdown_timeout_flag": code("components/engines/vllm/data/vllm-0.11.0-serve-args.json: no --shutdown-timeout"),
    "entrypoint": unverified(
        "assumed as 0.9.2's (the api_server module); the release that turned the vllm-openai target's ENTRYPOINT "
        'into ["vllm", "serve"] was not pinned down here'
    ),
}
_KV_0110 = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")


def _vllm_0191(tag: str, variant: str, arch_list: tuple[int, ...], arch_source: Sourced, note: str) -> ImageFacts:
    return ImageFacts(
        engine="vllm",
        version="0.19.1",
        repo="vllm/vllm-openai",
        tag=tag,
        variant=variant,
        cuda="12.9.1",
        torch="2.10.0+cu129",
        torch_arch_list=arch_list,
        triton="3.6.0",
        engine_line="V1",
        v0_engine=False,
        v1_min_capability=70,
        reads_vllm_use_v1=False,
        attention=_V1_ATTENTION,
        attention_backend_flag=True,
        quantizations=_Q0191,
        kv_cache_dtypes=_KV_0191,
        fp8_kv_min_capability=80,
        bf16_min_capability=80,
        prefix_prefill_min_capability=70,
        chunked_prefill_auto_above=None,
        mla_min_capability=80,
        batch_budget="v1",
        nccl_in_budget=False,
        serve_args="vllm-0.19.1-serve-args.json",
        metrics=_V1_METRICS,
        tuned_moe_config_env="VLLM_TUNED_CONFIG_FOLDER",
        serve_refuses_model_flag=False,
        native_multi_node=True,
        shutdown_timeout_flag=True,
        entrypoint=("vllm", "serve"),
        sources=_sources(_COMMON_0191, torch_arch_list=arch_source),
        note=note,
    )


IMAGES: dict[str, ImageFacts] = {
    f.ref: f
    for f in [
        ImageFacts(
            engine="vllm",
            version="0.9.2",
            repo="vllm/vllm-openai",
            tag="v0.9.2",
            variant="",
            cuda="12.8.1",
            torch="2.7.0+cu128",
            torch_arch_list=(75, 80, 86, 90, 100, 120),
            triton="3.3.0",
            engine_line="V0",
            v0_engine=True,
            v1_min_capability=80,
            reads_vllm_use_v1=True,
            attention=((80, "FLASH_ATTN"), (0, "XFORMERS")),
            attention_backend_flag=False,
            quantizations=_Q092,
            kv_cache_dtypes=("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
            fp8_kv_min_capability=75,
            bf16_min_capability=80,
            prefix_prefill_min_capability=80,
            chunked_prefill_auto_above=32768,
            mla_min_capability=80,
            batch_budget="v0",
            nccl_in_budget=True,
            serve_args="vllm-0.9.2-serve-args.json",
            metrics=_V0_METRICS,
            tuned_moe_config_env="VLLM_TUNED_CONFIG_FOLDER",
            serve_refuses_model_flag=True,
            sources=_sources(_COMMON_092),
            note="the runbook's image: its torch has no sm_70 and its Triton cannot compile fp16 dots below sm_80",
        ),
        ImageFacts(
            engine="vllm",
            version="0.11.0",
            repo="vllm/vllm-openai",
            tag="v0.11.0",
            variant="",
            cuda="12.8",
            torch="2.8.0+cu128",
            torch_arch_list=(70, 75, 80, 86, 90, 100, 120),
            triton="3.4.0",
            engine_line="V1",
            v0_engine=False,
            v1_min_capability=70,
            reads_vllm_use_v1=True,
            attention=((80, "FLASH_ATTN"), (0, "FLEX_ATTENTION")),
            attention_backend_flag=False,
            quantizations=_Q0110,
            kv_cache_dtypes=_KV_0110,
            fp8_kv_min_capability=80,
            bf16_min_capability=80,
            prefix_prefill_min_capability=70,
            chunked_prefill_auto_above=None,
            mla_min_capability=80,
            batch_budget="v1",
            nccl_in_budget=False,
            serve_args="vllm-0.11.0-serve-args.json",
            metrics=_V1_METRICS,
            tuned_moe_config_env="VLLM_TUNED_CONFIG_FOLDER",
            serve_refuses_model_flag=True,
            sources=_sources(_COMMON_0110),
            note="the first V1-only line (V0 removed); FlexAttention below sm_80 unless VLLM_ATTENTION_BACKEND=TRITON_ATTN",
        ),
        _vllm_0191(
            "v0.19.1",
            "",
            (70, 75, 80, 86, 90, 100, 120),
            _COMMON_0191["torch_arch_list"],
            "the last upstream vLLM line that runs on Volta (V1, TRITON_ATTN)",
        ),
        _vllm_0191(
            "v0.19.1-ubuntu2404",
            "ubuntu2404",
            (87, 89, 90, 100, 120),
            code("vLLM 0.19.0 .buildkite/release-pipeline.yaml:151-158 ('8.7 8.9 9.0 10.0+PTX 12.0')"),
            "built without sm_70/sm_75/sm_80: use the plain tag on older GPUs",
        ),
    ]
}


def pool_image_facts(spec: StackSpec, pool: str) -> ImageFacts | None:
    """The facts of a pool's image: declared in the stack for a private build, else the table's entry, None
    when neither knows it (rules then say it cannot be judged)."""
    p = spec.pools[pool]
    if p.image_facts is not None:
        return declared_facts(p.image, p.image_facts.like, p.image_facts.overrides(), f"pools.{pool}.imageFacts")
    return image_facts(p.image)


def known_images() -> Iterator[ImageFacts]:
    """Every image in the table, in a stable order (for tests that iterate versions and GPUs)."""
    return iter(sorted(IMAGES.values(), key=lambda f: (f.engine, f.version, f.variant)))


def image_facts(ref: str | None) -> ImageFacts | None:
    """The facts of a known image reference, None when the table does not know it."""
    return IMAGES.get(image_ref_key(ref)) if ref else None


# The facts a stack may declare for a private build (pools.*.imageFacts), on top of a known image's.
DECLARABLE = ("version", "cuda", "torch", "torch_arch_list", "triton")


def facts_for(
    ref: str | None, declared: Mapping[str, object] | None = None, declared_by: str = ""
) -> ImageFacts | None:
    """The facts of an image: declared ({"like": known ref, field: value…}) or the table's."""
    if declared:
        like = str(declared["like"])
        # Props arrive through protobuf Structs: numbers as floats (70.0), lists as lists.
        overrides = {
            k: (tuple(int(c) for c in v) if not isinstance(v, str) and hasattr(v, "__iter__") else v)  # type: ignore[union-attr]
            for k, v in declared.items()
            if k in DECLARABLE
        }
        return declared_facts(ref or like, like, overrides, declared_by or "the stack")
    return image_facts(ref)


def declared_facts(ref: str, like: str, overrides: Mapping[str, object], declared_by: str) -> ImageFacts:
    """Facts a stack declares for a private build: a known image's entry with fields replaced, every
    replaced fact marked unverified and attributed to the stack key that declared it."""
    base = IMAGES[image_ref_key(like)]
    repo, tag = split_tag(image_ref_key(ref))
    sources = dict(base.sources)
    for name in overrides:
        sources[name] = unverified(f"declared by {declared_by}")
    return replace(
        base,
        repo=repo,
        tag=tag,
        variant="declared",
        sources=MappingProxyType(sources),
        note=f"declared by {declared_by}, based on {base.ref}",
        **overrides,
    )  # type: ignore[arg-type]


# The image a pool runs when it names none, per engine: the newest line whose facts say it starts on
# every GPU in components.facts.hardware (vLLM 0.19.x is the last with sm_70).
DEFAULT_IMAGE = "vllm/vllm-openai:v0.19.1"
# Every `--quantization` and `--kv-cache-dtype` value some known image accepts (the spec's first check;
# the policy pack then holds each pool to its own image's list).
QUANTIZATION_METHODS = frozenset(m for f in IMAGES.values() for m in f.quantizations)
KV_CACHE_DTYPES = tuple(dict.fromkeys(d for f in known_images() for d in f.kv_cache_dtypes))


def kv_cache_bytes(kv_cache_dtype: str, act_bytes: int) -> int:
    """Bytes per KV element: the activation dtype's for auto, 2 for float16/bfloat16, 1 for every fp8 form."""
    if kv_cache_dtype == "auto":
        return act_bytes
    return 2 if kv_cache_dtype in ("float16", "bfloat16") else 1


# Its OpenAI server as the gateway sees it: idle keep-alive timeout and the statuses of a replica that
# cannot serve (the gateway's upstream keepalive_timeout stays shorter; failover counts those statuses).
HTTP_SERVER = EngineServer(
    keepalive_seconds=5,
    keepalive_env="VLLM_HTTP_TIMEOUT_KEEP_ALIVE",
    not_ready_statuses=(503,),
    sourced=code(
        "vllm/entrypoints/openai/api_server.py passes timeout_keep_alive="
        "envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE to uvicorn; vllm/envs.py defaults it to 5 (seconds), "
        "as does uvicorn's own Config(timeout_keep_alive=5) (v0.10.2 .. v0.19.x; read from code). "
        "Not ready: 503 (unverified; the gateway counts every 500/502/503/504 as a failure anyway)."
    ),
)


VLLM_IMAGE_REPO = "vllm/vllm-openai"
# Image repositories that carry both Ray and vLLM: every container of a Ray pool needs both (the head
# runs `vllm serve`, the workers run vLLM's engine workers as Ray actors), so Ray-only images such as
# rayproject/ray or rayproject/ray-ml do not qualify (docker/Dockerfile and requirements/cuda.txt of
# v0.9.2 and v0.19.0 install ray; read from code).
IMAGES_WITH_RAY = frozenset({VLLM_IMAGE_REPO})


# vLLM refuses a CPU swap space of more than this share of the host's RAM, per instance:
# swap_space x tensor_parallel_size > 0.7 x psutil's total memory -> ValueError("Too large swap space. …"),
# and warns above 0.4. A container without a memory limit sees the host's total.
SWAP_SPACE_MAX_FRACTION = 0.7
SWAP_SPACE_SOURCE = code(
    "vllm/config.py CacheConfig.verify_with_parallel_config at v0.9.2 (swap space x "
    "tensor_parallel_size against 0.7 of get_cpu_memory())"
)
