"""Engine options of pools beside vLLM's: LMDeploy (TurboMind) and llama.cpp, and every engine name the
runbooks use. Each option maps to one flag of the engine's own CLI (policies/data holds the parser dumps)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from components.engines.llamacpp.facts import IMAGES as LLAMACPP_IMAGES
from components.facts.other_engines import OTHER_ENGINES, refusal
from components.spec.base import Spec, SpecIssue

if TYPE_CHECKING:
    from components.spec.cluster import PoolSpec
    from components.spec.stack import StackSpec

# Engines llm-cluster deploys, then the ones it knows by name and refuses with the reason per GPU.
DEPLOYED_ENGINES = ("vllm", "lmdeploy", "llamacpp")
ENGINE_NAMES = DEPLOYED_ENGINES + tuple(OTHER_ENGINES)
# What each deployed engine's options key is called in a pool.
OPTIONS_KEY = {"vllm": "vllm", "lmdeploy": "lmdeploy", "llamacpp": "llamacpp"}
_KV_CACHE_TYPES = sorted({t for i in LLAMACPP_IMAGES.values() for t in i.kv_cache_types})
# The model spec's quantization values TurboMind loads (None: an fp16/bf16 checkpoint, `--model-format hf`),
# and the dtypes it computes in (components.engines.lmdeploy.engine maps both onto its flags).
LMDEPLOY_FORMATS = frozenset({None, "awq", "gptq", "compressed-tensors", "fp8", "mxfp4"})
LMDEPLOY_DTYPES = frozenset({"auto", "half", "float16", "bfloat16"})
LLAMACPP_MULTI_NODE = ("llama.cpp spans nodes only through its RPC backend, which upstream calls \"a proof-of-"
                       "concept ... fragile and insecure\" (tools/rpc/README.md): the project does not deploy it")


class LmdeployOptions(Spec):
    """LMDeploy `serve api_server --backend turbomind` options; each maps to one flag."""

    session_len: int = Field(ge=16)
    """`--session-len`: the longest sequence (prompt + output) one request may reach."""
    max_batch_size: int = Field(default=128, ge=1)
    """`--max-batch-size`: sequences decoded at once."""
    cache_max_entry_count: float = Field(default=0.8, gt=0, lt=1)
    """`--cache-max-entry-count`: share of the GPU memory still free after the weights that becomes KV
    cache (TurboMind 0.15+ accepts only 0 < x < 1; the rest holds activations and workspaces)."""
    quant_policy: Literal[0, 4, 8] = 0
    """`--quant-policy`: KV cache quantization, 0 (fp16), 8 (int8) or 4 (int4); TurboMind has Volta
    kernels for all three and refuses its fp8 policies."""
    cache_block_seq_len: int = Field(default=64, ge=16)
    """`--cache-block-seq-len`: tokens per KV block."""
    max_prefill_token_num: int = Field(default=8192, ge=1)
    """`--max-prefill-token-num`: tokens one prefill iteration processes."""
    enable_prefix_caching: bool = False
    """`--enable-prefix-caching`."""
    extra_args: list[str] = Field(default_factory=list)
    """Further `lmdeploy serve api_server` flags verbatim; the policy pack checks each against the image's parser."""


class LlamacppOptions(Spec):
    """llama.cpp `llama-server` options; each maps to one flag."""

    context_per_slot: int = Field(ge=256)
    """Context of one request (prompt + output). llama-server's `-c` is the whole KV cache, shared out
    evenly among the `-np` slots: the product passes `-c contextPerSlot x parallel`."""
    parallel: int = Field(default=4, ge=1, le=256)
    """`-np`: requests served at once (slots)."""
    split_mode: Literal["none", "layer", "row", "tensor"] = "layer"
    """`-sm`: how one server spreads the model over its tensorParallel GPUs (layer: pipelined layers)."""
    flash_attention: Literal["on", "off", "auto"] = "on"
    """`-fa`: FlashAttention (llama.cpp has Volta tensor-core kernels for it); needed for a quantized V cache."""
    cache_type: str = "f16"
    """`-ctk`/`-ctv`: KV cache element type (f16, q8_0, q4_0, ...)."""
    gguf_file: str = Field(pattern=r"^[A-Za-z0-9._+-][A-Za-z0-9._+/-]*\.gguf$")
    """The GGUF file (or the first shard, `...-00001-of-0000N.gguf`) inside the model's path."""
    gguf_header: str | None = None
    """A copy of that file's header on the operator's machine (`head -c 64M model.gguf > header.gguf`, or
    the file itself): capacity then reads the real tensor sizes and attention shape from it."""
    extra_args: list[str] = Field(default_factory=list)
    """Further `llama-server` flags verbatim; the policy pack checks each against the image's parser."""

    @field_validator("cache_type")
    @classmethod
    def _known_cache_type(cls, v: str) -> str:
        if v not in _KV_CACHE_TYPES:
            raise ValueError(f"{v!r} is not a llama.cpp KV cache type; allowed: {', '.join(_KV_CACHE_TYPES)}")
        return v


def engine_issues(spec: StackSpec) -> list[SpecIssue]:
    """What each pool's engine cannot be asked to do, before any resource exists: an engine the project does
    not deploy (with the reason on the pool's GPU), a model format it does not load, a parallel mode it lacks."""
    from components.facts.hardware import GPUS  # facts.hardware reads the spec package: import late

    issues: list[SpecIssue] = []
    for pname, pool in spec.pools.items():
        at = f"pools.{pname}"
        node = spec.nodes.get(pool.nodes[0])
        gpu = spec.node(pool.nodes[0]).gpu if node is not None else None
        known = GPUS.get(gpu.model) if gpu is not None else None
        if pool.engine in OTHER_ENGINES:
            if known is not None:
                issues.append(SpecIssue(f"{at}.engine", refusal(pool.engine, known.capability, known.name)))
            continue
        model = spec.models.get(pool.model)
        if model is None or pool.engine == "vllm":
            continue
        issues += _extra_args_issues(pname, pool)
        if pool.pipeline_parallel > 1:
            why = (LLAMACPP_MULTI_NODE if pool.engine == "llamacpp" else
                   "TurboMind has no pipeline parallel; it spans nodes only as tensor parallel over the network "
                   "(--nnodes), which no one has shown on V100 and which would put every layer's all-reduce on "
                   "the NIC")
            issues.append(SpecIssue(f"{at}.pipelineParallel", f"{pool.engine} pools run on one node: {why}; "
                                    "serve one replica per node (pipelineParallel 1), or use engine: vllm for "
                                    "tensor x pipeline parallel across nodes"))
        is_gguf = model.quantization == "gguf"
        if pool.engine == "llamacpp" and not is_gguf:
            issues.append(SpecIssue(f"models.{pool.model}.quantization", f"pool {pname!r} runs llama.cpp, which "
                                    "loads GGUF files only: set quantization: gguf (and the pool's llamacpp.ggufFile)"))
        if pool.engine == "lmdeploy":
            if is_gguf or model.quantization not in LMDEPLOY_FORMATS:
                issues.append(SpecIssue(f"models.{pool.model}.quantization", f"{model.quantization!r} is not a "
                                        f"TurboMind model format (pool {pname!r}); TurboMind loads: unset (hf), "
                                        + ", ".join(sorted(f for f in LMDEPLOY_FORMATS if f))))
            if model.dtype not in LMDEPLOY_DTYPES:
                issues.append(SpecIssue(f"models.{pool.model}.dtype", f"{model.dtype!r}: TurboMind computes in "
                                        "float16 or bfloat16 (pool {0!r}); use half, bfloat16 or auto".format(pname)))
    return issues


# The flags the product sets from typed stack keys, per engine (the counterpart of cluster.TYPED_FLAGS for
# vLLM): a flag in extraArgs would be appended after the typed one and win in the engine, while the gates,
# the gateway, the capacity plan and the policies keep reading the typed key. The spec refuses it.
ENGINE_TYPED_FLAGS: dict[str, dict[str, str]] = {
    "lmdeploy": {
        "--backend": "pools.<pool>.engine (TurboMind is what the facts and capacity describe)",
        "--model-name": "models.<model>.servedNames", "--server-name": "nodes.<node>.address",
        "--server-port": "pools.<pool>.port", "--tp": "pools.<pool>.tensorParallel",
        "--dtype": "models.<model>.dtype", "--model-format": "models.<model>.quantization",
        "--session-len": "pools.<pool>.lmdeploy.sessionLen", "--max-batch-size": "pools.<pool>.lmdeploy.maxBatchSize",
        "--cache-max-entry-count": "pools.<pool>.lmdeploy.cacheMaxEntryCount",
        "--cache-block-seq-len": "pools.<pool>.lmdeploy.cacheBlockSeqLen",
        "--max-prefill-token-num": "pools.<pool>.lmdeploy.maxPrefillTokenNum",
        "--quant-policy": "pools.<pool>.lmdeploy.quantPolicy",
        "--enable-prefix-caching": "pools.<pool>.lmdeploy.enablePrefixCaching",
        "--trust-remote-code": "models.<model>.trustRemoteCode",
        "--nnodes": "pools.<pool>.pipelineParallel (lmdeploy pools run on one node)",
        "--node-rank": "pools.<pool>.pipelineParallel (lmdeploy pools run on one node)",
        "--disable-metrics": "monitoring (its Prometheus scrapes every server's /metrics)",
    },
    "llamacpp": {
        "--model": "pools.<pool>.llamacpp.ggufFile", "--alias": "models.<model>.servedNames",
        "--host": "nodes.<node>.address", "--port": "pools.<pool>.port",
        "--n-gpu-layers": "pools.<pool>.tensorParallel (every layer is offloaded)",
        "--split-mode": "pools.<pool>.llamacpp.splitMode", "--ctx-size": "pools.<pool>.llamacpp.contextPerSlot",
        "--parallel": "pools.<pool>.llamacpp.parallel", "--flash-attn": "pools.<pool>.llamacpp.flashAttention",
        "--cache-type-k": "pools.<pool>.llamacpp.cacheType", "--cache-type-v": "pools.<pool>.llamacpp.cacheType",
        "--fit": "pools.<pool>.llamacpp (the product sets --fit off: what the plan sizes is what starts)",
        "--metrics": "monitoring (the product turns metrics on)", "--jinja": "pools.<pool>.llamacpp",
        "--rpc": "pools.<pool>.pipelineParallel (the RPC backend is refused: fragile and insecure upstream)",
        "--threads": "nodes.<node>.cpuCores (split between the node's serving instances)",
    },
}
# llama-server's other spellings of typed flags and of its credential flag (common/arg.cpp at b11312).
LLAMACPP_ALIASES = {"-m": "--model", "-a": "--alias", "-ngl": "--n-gpu-layers", "--gpu-layers": "--n-gpu-layers",
                    "-sm": "--split-mode", "-c": "--ctx-size", "-np": "--parallel", "-fa": "--flash-attn",
                    "-ctk": "--cache-type-k", "-ctv": "--cache-type-v", "-fit": "--fit", "-hft": "--hf-token",
                    "-t": "--threads"}


def engine_flag(engine: str, token: str) -> str | None:
    """The long flag an extraArgs token of this engine sets (`--session_len=8`, `-c`), None for a value."""
    if not token.startswith("-") or token == "-" or token[1:2].isdigit():
        return None
    name = token.partition("=")[0]
    if engine == "llamacpp":
        return LLAMACPP_ALIASES.get(name, name)
    # LMDeploy's FlexibleArgumentParser reads --session_len as --session-len.
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def engine_typed_key(engine: str, flag: str, *, pool: str, model: str, node: str) -> str | None:
    """The stack key that owns an engine's flag, names filled in; None for flags extraArgs may carry."""
    template = ENGINE_TYPED_FLAGS.get(engine, {}).get(flag)
    if template is None:
        return None
    return template.replace("<pool>", pool).replace("<model>", model).replace("<node>", node)


def engine_options(pool: PoolSpec) -> LmdeployOptions | LlamacppOptions | None:
    """The options block of a non-vLLM pool (None for vLLM and the engines the project does not deploy)."""
    return pool.lmdeploy if pool.engine == "lmdeploy" else pool.llamacpp if pool.engine == "llamacpp" else None


def _extra_args_issues(pname: str, pool: PoolSpec) -> list[SpecIssue]:
    options = engine_options(pool)
    if options is None:
        return []
    issues = []
    for i, token in enumerate(options.extra_args):
        flag = engine_flag(pool.engine, token)
        key = engine_typed_key(pool.engine, flag, pool=pname, model=pool.model, node="<node>") if flag else None
        if key is not None:
            issues.append(SpecIssue(f"pools.{pname}.{OPTIONS_KEY[pool.engine]}.extraArgs[{i}]",
                                    f"{token!r} is set by the typed key {key}: state it there instead"))
    return issues
