"""LMDeploy TurboMind behind the engine seam: `lmdeploy serve api_server` argv and env, and TurboMind's capacity.

Capacity follows TurboMind 0.15/0.16 as it loads a model (sources in components.engines.lmdeploy.facts):
- Weights are laid out per TP rank: q/o split by heads, K/V heads repeated up to a multiple of TP when
  there are fewer (builders/attention.py repeat_kv_for_tp), embeddings and LM head split by TP, and every
  FFN/expert intermediate dimension cut in groups of lcm(quant group, 32) whose count is zero-padded up to
  a multiple of TP (builders/ffn.py _pad_ffn_for_tp): Qwen3-235B-A22B int4 (1536 = 12 groups of 128) at
  TP 8 is padded to 16 groups, a third more expert weight and GEMM work.
- The KV cache is `cache-max-entry-count` of the memory free after the weights (cudaMemGetInfo, the
  minimum over the TP group; src/turbomind/turbomind.cc CreateEngine); what is left holds activations and
  workspaces. One KV block of `cache-block-seq-len` tokens holds every layer; per token and layer a GPU
  stores K and V of its heads at 16, 8 or 4 bits, quantized ones with a 16-bit scale and zero each
  (kernels/attention/block.h).
Assumptions, not measured: the CUDA context and cuBLAS/NCCL workspaces take RESERVED_GIB (+ COMM_GIB
with TP > 1) before the weights; int4 weights carry one fp16 scale and one fp16 zero per group.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from components.engines.base import Engine, MultiNode, nccl_env, offline_env, planned_capability
from components.engines.estimate import GIB, KV_ERROR_UNMEASURED, EngineEstimate, class_kv_error, pool_kind
from components.engines.gate import (
    ENGINE_VERSION_CHECK,
    FATBIN_SOURCE,
    TORCH_CHECKS,
    GateCheck,
    argv_check,
    python_check,
)
from components.engines.http import EngineServer
from components.engines.judged import EngineRule
from components.engines.lmdeploy.facts import (
    DEFAULT_IMAGE,
    HTTP_SERVER,
    IMAGES,
    MODEL_FORMATS,
    LmdeployImage,
    lmdeploy_image,
)
from components.engines.lmdeploy.options import LMDEPLOY_DTYPES, LMDEPLOY_FORMATS, TYPED_FLAGS, LmdeployOptions
from components.engines.lmdeploy.rules import RULES, quant_policy
from components.engines.lmdeploy.startup_failures import STARTUP_FAILURES as LMDEPLOY_STARTUP_FAILURES
from components.engines.weights import CheckpointFormat, model_params
from components.facts.engine_matrix import Cell, level
from components.facts.hardware import gpu
from components.facts.models import ModelArch
from components.facts.startup_failures import StartupFailure
from components.spec import SpecIssue, StackSpec
from components.spec.base import Spec
from components.spec.models import model_architecture
from components.spec.topology import Instance

# Memory a TurboMind process holds before it loads weights, per GPU [unverified: vLLM's measured figures
# for the same CUDA context and libraries, components.facts.hardware].
RESERVED_GIB = 0.5
COMM_GIB = 0.3
# TurboMind keeps logits in fp32 for the whole decode batch.
LOGIT_BYTES = 4
RULE_OF_THUMB_FACTOR = 1.2
# How far the KV-token estimate has erred on the optimistic side against real TurboMind start-up logs, per class
# of pool (bench/capacity_accuracy.py, docs/perf/capacity.md). No public log states the settings, GPU and block
# figures together (tests/fixtures/engine-startup-logs/SOURCES.md), so no class is measured and every pool takes
# the widest error measured on any engine's logs.
KV_ERROR_BY_CLASS: dict[tuple[str, str, str], float] = {}
KV_ERROR_WIDEST = KV_ERROR_UNMEASURED


@dataclass(frozen=True)
class FfnSplit:
    """How TurboMind cuts one FFN intermediate dimension over TP ranks."""

    width: int  # the checkpoint's intermediate size
    group: int  # the unit it is cut in: lcm(quant group, 32)
    padded: int  # after zero-padding the group count to a multiple of TP

    @property
    def padding_ratio(self) -> float:
        """Extra weight and GEMM work the padding adds (0.33 = a third more)."""
        return self.padded / self.width - 1 if self.width else 0.0


def ffn_split(width: int, tp: int, quant_group: int, align: int) -> FfnSplit:
    """TurboMind's `_pad_ffn_for_tp`: groups of lcm(block, align), their count rounded up to a multiple of TP."""
    group = math.lcm(max(quant_group, 1), align)
    groups = width // group
    if tp <= 1 or groups == 0:
        return FfnSplit(width, group, width)
    return FfnSplit(width, group, -(-groups // tp) * tp * group)


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """K/V heads one TP rank holds: repeated up to a multiple of TP when there are fewer (or not divisible)."""
    return -(-num_kv_heads // tp)


def kv_bytes_per_token_per_layer(arch: ModelArch, tp: int, kv_bits: int) -> float:
    """K and V of one token in one layer on one GPU; quantized caches add a 16-bit scale and zero per head."""
    params = 0 if kv_bits == 16 else 2 * 16 // 8
    return 2 * kv_heads_per_rank(arch.num_kv_heads, tp) * (kv_bits * arch.head_dim / 8 + params)


def weight_bytes_per_param(model_format: str, group_size: int) -> float:
    """Bytes one linear-layer weight costs in TurboMind's layout, scales and zeros included."""
    if model_format == "hf":
        return 2.0
    if model_format == "fp8":
        return 1.0 + 4 / (128 * 128)  # one fp32 scale per 128 x 128 block
    if model_format == "mxfp4":
        return 0.5 + 1 / 32  # one e8m0 scale per 32
    return 0.5 + 4 / group_size  # int4: fp16 scale + fp16 zero per group


def weights_per_gpu(
    arch: ModelArch, tp: int, model_format: str, group_size: int, align: int
) -> tuple[float, dict[str, FfnSplit]]:
    """Weight bytes on one TP rank, and how each FFN dimension was split (dense and expert)."""
    h, hd = arch.hidden_size, arch.head_dim
    linear_b = weight_bytes_per_param(model_format, group_size)
    quant_group = group_size if model_format in ("awq", "gptq", "compressed-tensors", "fp8", "mxfp4") else 1
    q = arch.num_attention_heads // tp * hd
    kv = kv_heads_per_rank(arch.num_kv_heads, tp) * hd
    attn_linear = h * q + 2 * h * kv + q * h
    attn_plain = (q + 2 * kv if arch.qkv_bias else 0) + (2 * hd if arch.model_type in ("qwen3", "qwen3_moe") else 0)
    splits: dict[str, FfnSplit] = {}
    linear = plain = 0.0
    for i in range(arch.num_layers):
        linear += attn_linear
        plain += attn_plain + 2 * h  # input and post-attention norms
        if arch.is_moe_layer(i):
            split = splits.setdefault("expert", ffn_split(arch.moe_intermediate_size, tp, quant_group, align))
            linear += arch.num_experts * 3 * h * split.padded / tp
            plain += arch.num_experts * h  # the router, replicated and never quantized
            if arch.num_shared_experts:
                width = arch.shared_expert_intermediate_size or arch.moe_intermediate_size
                shared = splits.setdefault("shared_expert", ffn_split(width, tp, quant_group, align))
                linear += arch.num_shared_experts * 3 * h * shared.padded / tp
        else:
            split = splits.setdefault("dense", ffn_split(arch.intermediate_size, tp, quant_group, align))
            linear += 3 * h * split.padded / tp
    vocab = arch.vocab_size * h / tp
    plain += vocab * (1 if arch.tie_word_embeddings else 2) + h  # embedding, LM head, final norm
    if model_format == "mxfp4":
        return plain * 2 + linear * 2.0, splits  # non-expert linears stay fp16 in mxfp4 checkpoints
    return plain * 2 + linear * linear_b, splits


def runtime_bytes(
    arch: ModelArch, tp: int, max_prefill_token_num: int, max_batch_size: int, expert_width: int
) -> float:
    """Activations and workspaces TurboMind allocates beside the KV cache (a prefill chunk through one
    layer plus fp32 logits of the decode batch) [unverified: an estimate of its buffers, not a measurement]."""
    h = arch.hidden_size
    tokens = max_prefill_token_num
    if arch.is_moe:
        mlp = tokens * arch.experts_per_token * 2 * expert_width / tp
    else:
        mlp = tokens * 2 * arch.intermediate_size / tp
    forward = (tokens * 4 * h + mlp) * 2
    logits = max_batch_size * arch.vocab_size * LOGIT_BYTES
    return forward + logits


def turbomind_estimate(
    arch: ModelArch,
    image: LmdeployImage,
    gpu_memory_gib: float,
    *,
    tp: int,
    model_format: str,
    group_size: int,
    quant_policy: int,
    session_len: int,
    max_batch_size: int,
    cache_max_entry_count: float,
    cache_block_seq_len: int,
    max_prefill_token_num: int,
) -> EngineEstimate:
    """What TurboMind will find on each GPU of one instance, and whether it can serve session_len."""
    if arch.num_attention_heads % tp:
        raise ValueError(
            f"{arch.name} has {arch.num_attention_heads} attention heads, not divisible by tensor parallel size {tp}"
        )
    weights, splits = weights_per_gpu(arch, tp, model_format, group_size, image.ffn_pad_align)
    reserved = (RESERVED_GIB + (COMM_GIB if tp > 1 else 0.0)) * GIB
    total = gpu_memory_gib * GIB
    free = total - reserved - weights
    kv_mem = max(0.0, free) * cache_max_entry_count
    kv_bits = image.kv_quant_policies[quant_policy].bits
    per_token = kv_bytes_per_token_per_layer(arch, tp, kv_bits) * arch.num_layers
    blocks = int(kv_mem // (per_token * cache_block_seq_len))
    kv_tokens = blocks * cache_block_seq_len
    expert = splits.get("expert")
    runtime = runtime_bytes(
        arch, tp, max_prefill_token_num, max_batch_size, expert.padded if expert else arch.moe_intermediate_size
    )
    room = free * (1 - cache_max_entry_count)  # read only where free > 0
    fits, reason, advice = True, "", ""
    share = f"{gpu_memory_gib:.1f} GiB per GPU"
    if free <= 0:
        fits, reason = (
            False,
            (
                f"the weights alone need {weights / GIB:.1f} GiB per GPU (TurboMind layout) of the "
                f"{share} ({reserved / GIB:.1f} GiB go to the CUDA context first)"
            ),
        )
        advice = "add GPUs (tensorParallel), or serve a 4-bit checkpoint (AWQ/GPTQ g128)"
    elif kv_tokens < session_len:
        fits, reason = (
            False,
            (
                f"the KV cache holds {kv_tokens} tokens ({cache_max_entry_count:g} of the "
                f"{free / GIB:.1f} GiB left after the weights), fewer than sessionLen {session_len}"
            ),
        )
        advice = (
            f"lower lmdeploy.sessionLen to {kv_tokens} or less, raise cacheMaxEntryCount, quantize the KV "
            "cache (quantPolicy 8), or add GPUs"
        )
    elif runtime > room:
        fits, reason = (
            False,
            (
                f"the {1 - cache_max_entry_count:.0%} of free memory left beside the KV cache "
                f"({room / GIB:.2f} GiB) is less than the ~{runtime / GIB:.2f} GiB of activations and "
                f"logits for maxPrefillTokenNum {max_prefill_token_num} and maxBatchSize "
                f"{max_batch_size}: TurboMind runs out of memory at the first long prompt"
            ),
        )
        advice = "lower cacheMaxEntryCount, maxPrefillTokenNum or maxBatchSize"
    concurrency = kv_tokens / session_len
    notes = []
    for kind, split in sorted(splits.items()):
        if split.padding_ratio > 0:
            notes.append(
                f"{kind} intermediate {split.width} is cut in groups of {split.group}: "
                f"{split.width // split.group} groups padded to {split.padded // split.group} for TP {tp} "
                f"({split.padding_ratio:.0%} more {kind} weight and GEMM work; a TP that divides the "
                "group count pads nothing)"
            )
    if fits and concurrency < max_batch_size:
        notes.append(
            f"only {concurrency:.1f} sequences of sessionLen fit at once, below maxBatchSize "
            f"{max_batch_size}: long requests queue"
        )
    linear_b = weight_bytes_per_param(model_format, group_size)
    rot = model_params(arch) * (2.0 if model_format == "hf" else min(linear_b, 1.0)) * RULE_OF_THUMB_FACTOR
    error, error_class = kv_estimate_error(kv_error_class(arch, tp))
    return EngineEstimate(
        engine="lmdeploy",
        model=arch.name,
        gpu_memory_gib=gpu_memory_gib,
        tp=tp,
        max_model_len=session_len,
        weights_gib_per_gpu=weights / GIB,
        weights_gib_total=weights * tp / GIB,
        kv_bytes_per_token_per_gpu=per_token,
        kv_cache_gib_per_gpu=kv_mem / GIB,
        kv_tokens=kv_tokens,
        max_concurrency=concurrency,
        rule_of_thumb_gib_total=rot / GIB,
        fits=fits,
        reason=reason,
        advice=advice,
        notes=tuple(notes),
        extra={
            "context_option": "--session-len (lmdeploy.sessionLen)",
            "model_format": model_format,
            "quant_policy": quant_policy,
            "kv_bits": kv_bits,
            "cache_max_entry_count": cache_max_entry_count,
            "free_gib_after_weights": max(0.0, free) / GIB,
            "runtime_gib": runtime / GIB,
            "kv_blocks": blocks,
            "kv_estimate_error": error,
            "kv_error_class": error_class,
            "kv_tokens_required": session_len,  # TurboMind truncates sessionLen to the cache it found
            "kv_tokens_low": math.floor(kv_tokens * (1 - error)),
            "max_concurrency_low": concurrency * (1 - error),
            "kv_cache_gib_per_gpu_low": kv_mem * (1 - error) / GIB,
            "kv_error_terms": "the memory TurboMind holds before its weights (CUDA context, cuBLAS and NCCL "
            "workspaces), which sets what cacheMaxEntryCount takes its share of",
            "ffn_padding": {
                k: {"width": s.width, "group": s.group, "padded": s.padded} for k, s in sorted(splits.items())
            },
        },
    )


def kv_error_class(arch: ModelArch, tp: int) -> tuple[str, str, str]:
    """The class whose measured error a pool's range takes: TurboMind, TP 1 or >= 2, dense/MoE/MLA."""
    return ("turbomind", "tp1" if tp == 1 else "tp>=2", pool_kind(uses_mla=arch.uses_mla, is_moe=arch.is_moe))


def kv_estimate_error(cls: tuple[str, str, str]) -> tuple[float, str]:
    """The class's measured optimistic KV error and how it was found, in words for the plan."""
    return class_kv_error(
        cls,
        KV_ERROR_BY_CLASS,
        KV_ERROR_WIDEST,
        engine="TurboMind",
        widest_how="no public TurboMind log to compare, the widest error measured on any engine's logs",
    )


# -- the server ------------------------------------------------------------------------------------------

# The model spec's dtype (vLLM's names) -> `--dtype` (auto|float16|bfloat16); float32 has no TurboMind path.
# Its keys are LMDEPLOY_DTYPES, and MODEL_FORMATS' LMDEPLOY_FORMATS: the spec refuses any other (spec_issues).
DTYPES = {"auto": "auto", "half": "float16", "float16": "float16", "bfloat16": "bfloat16"}


def lmdeploy_argv(spec: StackSpec, instance: Instance) -> list[str]:
    """`lmdeploy serve api_server` for one instance: TurboMind, the pool's TP and options, metrics on."""
    pool = spec.pools[instance.pool]
    model = spec.models[pool.model]
    o = pool.lmdeploy
    assert o is not None  # the spec requires the lmdeploy block with engine: lmdeploy
    argv = [
        "lmdeploy",
        "serve",
        "api_server",
        model.path,
        # TurboMind, stated: left unset LMDeploy falls back to its PyTorch engine (Triton kernels, which
        # do not compile on sm_70) for any architecture TurboMind does not know.
        "--backend",
        "turbomind",
        # One name only: the server answers 404 to any other (the spec allows one served name).
        "--model-name",
        spec.served_names(pool.model)[0],
        # Bound to the cluster address: only the gateway and Prometheus reach it.
        "--server-name",
        spec.node(instance.head).address,
        "--server-port",
        str(instance.port),
        "--tp",
        str(instance.tensor_parallel),
        "--dtype",
        DTYPES[model.dtype],
        "--model-format",
        MODEL_FORMATS[model.quantization],
        "--session-len",
        str(o.session_len),
        "--max-batch-size",
        str(o.max_batch_size),
        "--cache-max-entry-count",
        f"{o.cache_max_entry_count:g}",
    ]
    if o.cache_block_seq_len != 64:
        argv += ["--cache-block-seq-len", str(o.cache_block_seq_len)]
    if o.max_prefill_token_num != 8192:
        argv += ["--max-prefill-token-num", str(o.max_prefill_token_num)]
    if o.quant_policy:
        argv += ["--quant-policy", str(o.quant_policy)]
    if o.enable_prefix_caching:
        argv.append("--enable-prefix-caching")
    if model.trust_remote_code:
        argv.append("--trust-remote-code")
    # Metrics are on by default (--disable-metrics turns them off): monitoring scrapes /metrics.
    return argv + list(o.extra_args)


# The hub off (pools.*.offline): LMDeploy resolves a non-local model path with huggingface_hub's
# snapshot_download and loads tokenizers through transformers, both of which honour these
# (huggingface_hub constants.py: HF_HUB_OFFLINE = _is_true(HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE)).
# LMDeploy itself sends no usage statistics (none found in its source), so it has no telemetry switch.
LMDEPLOY_OFFLINE_ENV: dict[str, str] = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def lmdeploy_env(spec: StackSpec, instance: Instance, node: str) -> dict[str, str]:
    """Environment of the server container: the hub off, NCCL settings of the node (TP ranks talk over
    NCCL), the pool's own."""
    env = offline_env(spec, instance.pool, LMDEPLOY_OFFLINE_ENV)
    env.update(nccl_env(spec, node))
    env.update(spec.pools[instance.pool].env)
    return env


class LmdeployEngine(Engine):
    """LMDeploy's OpenAI server on its TurboMind backend; one node per instance (tensor parallel inside it)."""

    # api_server's draft model: a path, or a hub id it downloads (0.16.0 parser dump).
    offline_vars: ClassVar[dict[str, str]] = LMDEPLOY_OFFLINE_ENV
    hub_flags: ClassVar[dict[str, str]] = {"--speculative-draft-model": "path"}
    # [cli-0.16.0] `serve api_server --api-keys` takes any number of keys (nargs "*").
    secret_flags: ClassVar[dict[str, str]] = {"--api-keys": "+"}

    name: ClassVar[str] = "lmdeploy"
    title: ClassVar[str] = "LMDeploy"
    matrix_label: ClassVar[str] = "LMDeploy TurboMind"
    server_role: ClassVar[str] = "lmdeploy"
    multi_gpu: ClassVar[tuple[str, ...]] = ("tensor",)
    multi_node: ClassVar[MultiNode] = "none"
    memory_keys: ClassVar[str] = "lmdeploy.cacheMaxEntryCount or sessionLen"
    own_startup_failures: ClassVar[tuple[StartupFailure, ...]] = LMDEPLOY_STARTUP_FAILURES
    metrics_job: ClassVar[str] = "lmdeploy"
    http_server: ClassVar[EngineServer] = HTTP_SERVER
    one_served_name: ClassVar[bool] = True  # --model-name: any other name gets 404
    cli_program: ClassVar[str] = "lmdeploy serve api_server"
    refused_flags: ClassVar[dict[str, str]] = {"--disable-metrics": "monitoring scrapes /metrics, which it turns off"}
    policy_rules: ClassVar[tuple[EngineRule, ...]] = RULES

    options_key: ClassVar[str] = "lmdeploy"
    options_model: ClassVar[type[Spec]] = LmdeployOptions
    advice_formats: ClassVar[tuple[CheckpointFormat, ...]] = (
        CheckpointFormat("fp16"),
        CheckpointFormat("awq-int4", "awq", 4),
        CheckpointFormat("gptq-int4", "gptq", 4),
    )
    required_option: ClassVar[str] = "sessionLen"
    context_key: ClassVar[str] = "sessionLen"
    default_image: ClassVar[str] = DEFAULT_IMAGE
    typed_flags: ClassVar[dict[str, str]] = TYPED_FLAGS

    def checkpoint_quantizations(self) -> frozenset[str]:
        return frozenset(f for f in LMDEPLOY_FORMATS if f)

    def spec_issues(self, spec: StackSpec, pool: str) -> list[SpecIssue]:
        p = spec.pools[pool]
        model = spec.models.get(p.model)
        if model is None:
            return []
        issues = self.extra_args_issues(spec, pool)
        issues += self.one_node_issues(
            spec,
            pool,
            "TurboMind has no pipeline parallel; it spans nodes only as tensor "
            "parallel over the network (--nnodes), which no one has shown on V100 and which "
            "would put every layer's all-reduce on the NIC",
        )
        if model.quantization not in LMDEPLOY_FORMATS:
            issues.append(
                SpecIssue(
                    f"models.{p.model}.quantization",
                    f"{model.quantization!r} is not a "
                    f"TurboMind model format (pool {pool!r}); TurboMind loads: unset (hf), "
                    + ", ".join(sorted(f for f in LMDEPLOY_FORMATS if f)),
                )
            )
        if model.dtype not in LMDEPLOY_DTYPES:
            issues.append(
                SpecIssue(
                    f"models.{p.model}.dtype",
                    f"{model.dtype!r}: TurboMind computes in "
                    "float16 or bfloat16 (pool {0!r}); use half, bfloat16 or auto".format(pool),
                )
            )
        return issues

    def image_refs(self) -> list[str]:
        return [image.ref for image in IMAGES.values()]

    def image_cell(self, ref: str, capability: int) -> Cell | None:
        image = self.image_facts_of(ref)
        if image is None:
            return None
        return Cell("deployed" if image.runs_on(capability) else "no", level(image.sources["sass"], capability))

    def context_length(self, spec: StackSpec, pool: str) -> int:
        o = spec.pools[pool].lmdeploy
        assert o is not None
        return o.session_len

    def image_table(self) -> Mapping[str, LmdeployImage]:
        return IMAGES

    def cli_value_types(self) -> Mapping[str, Any]:
        return {"_parse": quant_policy}

    def serve_argv(self, spec: StackSpec, instance: Instance) -> list[str]:
        return lmdeploy_argv(spec, instance)

    def serve_env(self, spec: StackSpec, instance: Instance, node: str) -> dict[str, str]:
        return lmdeploy_env(spec, instance, node)

    def gate_check(self, spec: StackSpec, pool: str, node: str, argvs: tuple[tuple[str, ...], ...]) -> GateCheck | None:
        facts = self.image_facts(spec, pool)
        if facts is None:
            return None
        # lmdeploy.version, not the package: its __init__ loads the whole serving stack before the version.
        data = {
            "version": facts.version,
            "module": "lmdeploy.version",
            "argvs": [list(a) for a in argvs],
            "recommended": DEFAULT_IMAGE,
            "capability": planned_capability(spec, node),
        }
        return GateCheck(
            f"{self.title} {facts.version}",
            "python3",
            ("-c", LMDEPLOY_CHECK, json.dumps(data, sort_keys=True)),
            "torch's arch list, the planned GPU, an fp16 matmul, TurboMind's kernels for the GPU, the "
            "LMDeploy version and the planned flags",
        )

    def capacity(self, spec: StackSpec, pool: str, *, mla: bool | None = None) -> dict[str, object]:
        p = spec.pools[pool]
        o = p.lmdeploy
        assert o is not None  # the spec requires the lmdeploy block
        image, node_gpu = self.sizing_inputs(spec, pool, lmdeploy_image(DEFAULT_IMAGE))
        model = spec.models[p.model]
        try:
            return turbomind_estimate(
                model_architecture(spec, p.model),
                image,
                gpu(node_gpu.model).memory_gib,
                tp=p.tensor_parallel,
                model_format=MODEL_FORMATS[model.quantization],
                group_size=model.group_size,
                quant_policy=o.quant_policy,
                session_len=o.session_len,
                max_batch_size=o.max_batch_size,
                cache_max_entry_count=o.cache_max_entry_count,
                cache_block_seq_len=o.cache_block_seq_len,
                max_prefill_token_num=o.max_prefill_token_num,
            ).to_dict()
        except ValueError as err:
            return {"error": f"capacity not estimated: {err}"}


# TurboMind's library in the image has SASS for the GPU (torch's report of it, else the planned one): its own
# kernels, not torch's, serve the model. Needs FATBIN_SOURCE (fatbin_archs) and TORCH_CHECKS (arch) first.
TURBOMIND_KERNELS_CHECK = r"""
try:
    import glob, importlib, os
    root = list(importlib.import_module("lmdeploy").__path__)[0]
    libs = sorted(glob.glob(os.path.join(root, "lib", "_turbomind*.so")))
    if not libs:
        report("turbomind-kernels", False, f"no lib/_turbomind*.so under {root}",
               f"this lmdeploy has no TurboMind: use an image built with it ({facts['recommended']})")
    else:
        with open(libs[0], "rb") as f:
            found = fatbin_archs(f.read())
        sass = sorted((k for k in found if k.startswith("sm_")), key=lambda k: int(k[3:]))
        report("turbomind-kernels", found.get(arch, 0) > 0,
               f"{os.path.basename(libs[0])}: {found.get(arch, 0)} {arch} kernels (SASS for {', '.join(sass)})",
               f"TurboMind in this image has no {arch} kernels: use {facts['recommended']}")
except Exception as e:
    report("turbomind-kernels", False, f"{type(e).__name__}: {e}", "cannot read TurboMind's library in the image")
"""

# `lmdeploy serve api_server`'s own parser (lmdeploy/cli/serve.py), as the image's CLI builds it.
LMDEPLOY_ARGV_CHECK = argv_check(
    """
    from lmdeploy.cli.serve import SubCliServe
    if "api_server" not in SubCliServe.subparsers.choices:
        SubCliServe.add_parser_api_server()
    parser = SubCliServe.subparsers.choices["api_server"]
""",
    skip=3,
)
LMDEPLOY_CHECK = python_check(
    TORCH_CHECKS, FATBIN_SOURCE, TURBOMIND_KERNELS_CHECK, ENGINE_VERSION_CHECK, LMDEPLOY_ARGV_CHECK
)
