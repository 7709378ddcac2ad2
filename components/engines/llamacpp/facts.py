"""llama.cpp server facts keyed by image: what each `ghcr.io/ggml-org/llama.cpp:server-*` image runs, per GPU.

Every fact names its source and evidence level (components.facts.evidence). Sources, as cited below:
  [src-bN]    llama.cpp at build tag bN (b11312 = commit 0c1e57098), read from the copy vendored in the
              PyPI sdist llama_cpp_python-0.3.36.tar.gz (its CHANGELOG: "update llama.cpp to
              ggml-org/llama.cpp@0c1e57098"): .devops/cuda.Dockerfile, .github/workflows/docker.yml,
              ggml/src/ggml-cuda/CMakeLists.txt, common/arg.cpp, src/llama-context.cpp, tools/server/*.cpp,
              tools/rpc/README.md.
  [cli-bN]    components/engines/llamacpp/data/llama.cpp-bN-server-args.json: `llama-server --help` of a CPU build of that
              source (components/engines/llamacpp/tools/dump_llamacpp.py).
  [ref]       ggml-org/llama.cpp PRs and issues by number, #N being https://github.com/ggml-org/llama.cpp/issues/N
              (a PR's number redirects there); two V100 user reports have no recorded URL: redlinedtm-jpg's
              and the 8 x V100-SXM2 llama-bench runs (builds 9644 and 9898).
Nothing here was run on a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from components.engines.http import EngineServer
from components.facts.evidence import Sourced, code, observed
from components.facts.sourced import SourcedImage, image_ref_key

ENGINE = "llamacpp"
REPO = "ghcr.io/ggml-org/llama.cpp"
DEFAULT_PORT = 8080  # the server's --port default ([cli-b11312])


@dataclass(frozen=True)
class GgufFormat:
    """The one model format llama.cpp loads: a GGUF file (its quant types are the file's business)."""

    min_capability: int | None


@dataclass(frozen=True)
class SplitMode:
    """One `--split-mode`: how a server spreads a model over the GPUs it is given."""

    parallel: str  # what runs in parallel across GPUs, in words
    production: bool  # whether the project deploys it without a warning
    why: str  # the evidence behind `production`


@dataclass(frozen=True)
class LlamacppImage(SourcedImage):
    """One llama.cpp server image. Capabilities as 70 for sm_70."""

    engine: str
    build: int  # the bNNNN build number of the tag
    repo: str
    tag: str
    variant: str  # "cuda" (CUDA 12), "cuda13"
    cuda: str
    sass: tuple[int, ...]  # real cubins in libggml-cuda
    ptx: tuple[int, ...]  # virtual archs (JIT-compiled by the driver on GPUs without matching SASS)
    model_formats: Mapping[str, GgufFormat]  # the model spec's `quantization` value -> format
    split_modes: Mapping[str, SplitMode]
    multi_node: str  # how llama.cpp spans nodes, in words (the project refuses it)
    kv_cache_types: tuple[str, ...]  # -ctk / -ctv values
    ctx_pad: int  # the per-slot context is padded to a multiple of this
    serve_args: str  # the `llama-server --help` dump in components/engines/<engine>/data
    metrics: Mapping[str, str]
    sources: Mapping[str, Sourced] = field(default_factory=dict)
    note: str = ""

    @property
    def quantizations(self) -> Mapping[str, GgufFormat]:
        """The seam's name for the accepted formats (each with its `min_capability`)."""
        return self.model_formats

    def runs_on(self, capability: int) -> bool:
        """libggml-cuda has code for this GPU: its own SASS, or PTX of an older arch the driver can JIT."""
        return capability in self.sass or any(p <= capability for p in self.ptx)

    def jit_only(self, capability: int) -> bool:
        """The GPU runs PTX compiled at first start (minutes; the driver must know the build's CUDA)."""
        return self.runs_on(capability) and capability not in self.sass


# [src-b11312] tools/server/server-task.cpp:1523-1600 server_task_result_metrics::to_metrics (prefix
# "llamacpp:"; served only with --metrics). llama.cpp has no KV-usage gauge, no waiting-queue gauge
# (requests_deferred is the nearest) and no latency histograms.
_METRICS = MappingProxyType(
    {
        "requests_running": "llamacpp:requests_processing",
        "requests_waiting": "llamacpp:requests_deferred",
        "prompt_tokens": "llamacpp:prompt_tokens_total",
        "generation_tokens": "llamacpp:tokens_predicted_total",
        "prompt_throughput": "llamacpp:prompt_tokens_seconds",
        "generation_throughput": "llamacpp:predicted_tokens_seconds",
        # Prompt tokens reused from a slot's cache, and those computed ("excluding cached tokens", its HELP text).
        "prefix_cache_hits": "llamacpp:prompt_tokens_cached_total",
        "prefix_cache_misses": "llamacpp:prompt_tokens_total",
    }
)

_SPLIT_MODES = MappingProxyType(
    {
        "none": SplitMode("nothing: one GPU", True, "[cli-b11312] -sm none: use one GPU only"),
        "layer": SplitMode(
            "nothing: layers are pipelined GPU after GPU",
            True,
            "[cli-b11312] the default; [ref] used by the 8 x V100 llama-bench reports [obs]",
        ),
        "row": SplitMode("each weight's rows", False, "[ref] redlinedtm-jpg: -sm row broken in recent builds [obs]"),
        "tensor": SplitMode("weights and KV", False, "[cli-b11312] '-sm tensor ... (parallelized, EXPERIMENTAL)'"),
    }
)

_COMMON = {
    "model_formats": code(
        "[src-b11312] llama-server loads GGUF files only (-m); every GGML quant type has "
        "CUDA kernels from sm_61 (dp4a MMQ); [ref] PR #16843, #17505 Volta tensor cores for "
        "MMF and FlashAttention with V100 benchmarks [obs]"
    ),
    "split_modes": code("[cli-b11312] --split-mode {none,layer,row,tensor}"),
    "multi_node": code(
        "[src-b11312] tools/rpc/README.md: the RPC backend is 'in a proof-of-concept development "
        "stage ... fragile and insecure. Never run the RPC server on an open network'"
    ),
    "kv_cache_types": code("[cli-b11312] -ctk/-ctv allowed values"),
    "ctx_pad": code(
        "[src-b11312] src/llama-context.cpp:295-296: n_ctx_seq = n_ctx / n_seq_max, padded to 256; "
        "a CPU build logs n_ctx_slot = 256 for -c 512 -np 2"
    ),
    "serve_args": code("[cli-b11312] components/engines/llamacpp/data/llama.cpp-b11312-server-args.json"),
    "metrics": code(
        "[src-b11312] tools/server/server-task.cpp server_task_result_metrics::to_metrics; the same "
        "names in a CPU build's /metrics (tests/fixtures/engines/llama.cpp-b11312-metrics.txt)"
    ),
}

IMAGES: dict[str, LlamacppImage] = {
    i.ref: i
    for i in [
        LlamacppImage(
            engine=ENGINE,
            build=11312,
            repo=REPO,
            tag="server-cuda-b11312",
            variant="cuda",
            cuda="12.8.1",
            sass=(86, 89, 120),
            ptx=(50, 61, 70, 75, 80, 90),
            model_formats=MappingProxyType({"gguf": GgufFormat(50)}),
            split_modes=_SPLIT_MODES,
            multi_node="llama-server --rpc host:port,... over rpc-server on the other nodes",
            kv_cache_types=("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"),
            ctx_pad=256,
            serve_args="llama.cpp-b11312-server-args.json",
            metrics=_METRICS,
            sources=MappingProxyType(
                {
                    **_COMMON,
                    "cuda": code(
                        "[src-b11312] .github/workflows/docker.yml:91 tag 'cuda cuda12' cuda_version 12.8.1 "
                        "(.devops/cuda.Dockerfile, CUDA_DOCKER_ARCH=default)"
                    ),
                    "sass": code(
                        "[src-b11312] ggml/src/ggml-cuda/CMakeLists.txt:43-62 default architectures for CUDA "
                        "12.8: 50-virtual 61-virtual 70-virtual 75-virtual 80-virtual 86-real 89-real "
                        "90-virtual 120a-real"
                    ),
                    "ptx": observed(
                        "[src-b11312] CMakeLists.txt as above: sm_70 only as PTX, JIT at first start; [ref] "
                        "#13008 -fa works on V100 and the 8 x V100-SXM2 llama-bench reports run these "
                        "images"
                    ),
                }
            ),
            note="sm_70 as PTX: the first start JIT-compiles for minutes; the driver must support CUDA 12.8 (R570+)",
        ),
        LlamacppImage(
            engine=ENGINE,
            build=11312,
            repo=REPO,
            tag="server-cuda13-b11312",
            variant="cuda13",
            cuda="13.4.1",
            sass=(86, 89, 120, 121),
            ptx=(75, 80, 90),
            model_formats=MappingProxyType({"gguf": GgufFormat(75)}),
            split_modes=_SPLIT_MODES,
            multi_node="llama-server --rpc host:port,... over rpc-server on the other nodes",
            kv_cache_types=("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"),
            ctx_pad=256,
            serve_args="llama.cpp-b11312-server-args.json",
            metrics=_METRICS,
            sources=MappingProxyType(
                {
                    **_COMMON,
                    "cuda": code("[src-b11312] .github/workflows/docker.yml:93 tag 'cuda13' cuda_version 13.4.1"),
                    "sass": code(
                        "[src-b11312] ggml/src/ggml-cuda/CMakeLists.txt:43-45: 50/61/70-virtual only for CUDA "
                        "< 13; CUDA 13 has no sm_70 target at all"
                    ),
                    "ptx": code("[src-b11312] ggml/src/ggml-cuda/CMakeLists.txt:47-62"),
                }
            ),
            note="CUDA 13 build: no Volta code; use server-cuda-b11312 on V100",
        ),
    ]
}

DEFAULT_IMAGE = f"{REPO}:server-cuda-b11312"


def llamacpp_image(ref: str) -> LlamacppImage | None:
    """The facts of a llama.cpp image reference, None when the table does not know it."""
    return IMAGES.get(image_ref_key(ref))


# Its OpenAI server as the gateway sees it: idle keep-alive timeout and the statuses of a replica that
# cannot serve (the gateway's upstream keepalive_timeout stays shorter; failover counts those statuses).
HTTP_SERVER = EngineServer(
    keepalive_seconds=5,
    keepalive_env=None,
    not_ready_statuses=(503,),
    sourced=code(
        "llama-server (b11312) leaves cpp-httplib's CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND at its default 5 "
        "(vendor/cpp-httplib/httplib.h; tools/server sets no keep-alive timeout) and answers every "
        "endpoint 503 'Loading model' until the model is loaded (tools/server/server-http.cpp) "
        "(read from code)."
    ),
)


# Bits per weight of the GGUF tensor types a whole checkpoint can be quantized to (`llama-quantize --pure`):
# a block of 32 weights is one fp16 scale plus 16 bytes (q4_0) or 32 bytes (q8_0). The advisor sizes such
# a file as parameters x bits / 8 (norms stay f32: a rounding error at these sizes).
GGUF_BITS_PER_WEIGHT: Mapping[str, float] = MappingProxyType({"q8_0": 8.5, "q4_0": 4.5})
GGUF_BITS_SOURCE = code(
    "[src-b11312] ggml/src/ggml-common.h: block_q4_0 {ggml_half d; uint8_t qs[QK4_0/2]} and block_q8_0 "
    "{ggml_half d; int8_t qs[QK8_0]} with QK4_0 = QK8_0 = 32"
)
