"""Capacity planning: the numbers vLLM 0.9.2 (V0 engine) computes at start-up, computed at preview.

vLLM V0 sizes the KV cache in `Worker.determine_num_available_blocks` (worker/worker.py):
    kv_memory = total_gpu_memory * gpu_memory_utilization
                - (weights + activation peak of a profile run + non-torch memory)
    gpu_blocks = kv_memory // (block_size * layers_on_this_worker * kv_bytes_per_token_per_layer)
and the engine keeps the minimum over all workers (executor_base.py), logging
"# cuda blocks: N" and "Maximum concurrency for L tokens per request: (N * block_size / L)x".
This module reproduces each term from the architecture:

- Weights: every linear layer, split as vLLM splits it (column/row parallel divide by TP; MLA's
  q_a/kv_a projections, MoE routers and norms are replicated; KV heads are replicated when fewer
  than TP; the vocabulary is padded to a multiple of 64 and split by TP). The embedding sits on the
  first pipeline stage, the LM head and final norm on the last; a tied LM head costs nothing only
  when PP = 1. With MLA on, vLLM also keeps dequantized W_UK/W_UV copies of kv_b_proj.
- Quantization (assumptions, stated plainly): GPTQ/AWQ/moe_wna16 quantize every linear layer of the
  decoder, experts included, at `bits` with one fp16 scale and one packed `bits` zero per group;
  embeddings, LM head, norms, biases and MoE routers stay in the activation dtype (vLLM builds the
  routers with quant_config=None). bitsandbytes is NF4 with double quantization (4 bits + 8-bit
  absmax per 64 + fp32 per 256 blocks). fp8 is 1 byte + negligible scales. A GPTQ checkpoint that
  left some projections (e.g. MLA's) unquantized weighs more than this estimate.
- Activation peak: the profile run pushes max_num_batched_tokens tokens in max_num_seqs sequences
  through the model and samples one token per sequence over the full vocabulary; the peak is the
  larger of the forward pass (residual stream + the widest MLP/MoE intermediate) and the sampler
  (fp32 logits, probabilities, sort values and int64 indices: ~38 bytes per vocabulary entry per
  sequence, fitted on the startup logs in tests/fixtures/vllm-startup-logs).
- Non-torch memory: a base the profile run adds on every GPU (cuBLAS workspaces, kernels loaded; 0.03-0.04
  GiB in the one-GPU V0 logs, 0.13-0.14 GiB on V1), plus the NCCL communicators and custom all-reduce
  buffers, which grow with the peers a GPU talks to: 0.25 GiB per peer fitted on the TP 2 logs (PCIe or
  NVLink point to point), 0.32 GiB per peer on NVSwitch Hopper (NCCL NVLS), fitted on a TP 8 x PP 2 log
  (2.53-2.57 GiB). A GPU's peers are its TP-1 tensor-parallel peers plus its pipeline neighbours (one at
  either end, two inside). Where they count depends on the engine line: vLLM 0.9.2 (V0) takes its memory
  baseline before NCCL starts, so they come out of the budget. On V1 they come out of the budget too, on
  every image: NCCL connects its peers lazily, on the profile run's first collectives, and where GPUs
  reach each other peer to peer the custom all-reduce buffers join them, so the profiler logs a non-torch
  increase of about 2 GiB per GPU at TP >= 2 (V1_COMM_GIB_P2P). From 0.11 (vllm#25359) NCCL also starts
  before the baseline, and vLLM refuses to start when less than utilization x total is free after it and
  the CUDA context: that check is modelled too (both, on the safe side). CUDA graphs are captured after
  the KV cache is allocated and come out of the (1 - utilization) headroom, so they are not subtracted.
- V1's profile run keeps the forward pass's hidden states alive while it samples (profile_run,
  gpu_model_runner.py:5721-5739 in 0.19.1), and its dummy sampler sorts for top-p/top-k over max_num_seqs
  rows of fp32 logits (_dummy_sampler_run, :5556): ~39 bytes per logit, fitted on llm-d's H100 figures
  (docs/perf/capacity.md), with V1's default max_num_seqs (1024 on >= 70 GiB GPUs other than A100s).

Sources: vLLM 0.9.2 worker/worker.py, worker/cache_engine.py (get_cache_block_size), vLLM 0.19.1
v1/worker/gpu_worker.py (determine_available_memory) and v1/worker/utils.py (request_memory),
distributed/utils.py (get_pp_indices), model_executor/models/deepseek_v2.py (non-MLA attention pads
V to qk_head_dim), config.py (get_num_kv_heads: max(1, kv_heads // tp)).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from components.engines.estimate import KV_ERROR_FLOOR, KV_ERROR_UNMEASURED
from components.engines.estimate import (
    KV_ERROR_MIN_LOGS as KV_ERROR_MIN_LOGS,  # re-exported: the bench and tests read it here
)
from components.engines.vllm.facts import KV_CACHE_DTYPES, kv_cache_bytes
from components.engines.weights import (
    FP8_WEIGHT_METHODS as FP8_QUANTIZATION_METHODS,
)
from components.engines.weights import (
    GIB,
    kv_bytes_per_token_per_layer,
    layers_per_stage,
    linear_bytes_per_param,
    model_params,
    stage_weight_bytes,
)
from components.facts.hardware import CUDA_CONTEXT_GIB, DTYPE_BYTES
from components.facts.models import ModelArch

# GPU memory outside torch's allocator that the profile run adds on every GPU: 0.03 and 0.04 GiB logged on
# one GPU (vllm#13882, #12529 in tests/fixtures/vllm-startup-logs), rounded up.
NON_TORCH_BASE_GIB = 0.05
# NCCL communicators and custom all-reduce buffers per peer: the TP 2 logs show 0.25 (vllm#13061, 2 x RTX
# 4090) and 0.30 GiB (vllm#15815, 2 x L40S), the base included; the larger of the two, less the base.
COMM_GIB_PER_PEER = 0.25
# Below this much spare at start-up (free after NCCL less the request) the estimate says how thin it is:
# the communicators' size is fitted on other GPUs than the pool's.
STARTUP_MARGIN_GIB = 0.5
# On NVSwitch Hopper (NCCL NVLS): 2.53 and 2.57 GiB logged at TP 8 x PP 2 on H20 (vllm#13074): 8 peers.
COMM_GIB_PER_PEER_NVLS = 0.32
# V0 default when chunked prefill is off (arg_utils / SchedulerConfig): max(max_model_len, 2048).
DEFAULT_MIN_BATCHED_TOKENS = 2048
# V1 always chunks prefills; the OpenAI server's default budget (arg_utils _set_default_args_v1):
# 8192 on GPUs with >= 70 GiB that are not A100s (PR #17885: larger budgets slow A100s), else 2048.
V1_BATCHED_TOKENS_LARGE_GPU = 8192
V1_BATCHED_TOKENS = 2048
V1_LARGE_GPU_MIN_GIB = 70
# V0 fused MoE processes at most this many tokens at once (VLLM_FUSED_MOE_CHUNK_SIZE default).
FUSED_MOE_CHUNK = 32768
# Bytes per (sequence x vocabulary entry) held at the sampler's peak in the profile run (V0 logs).
SAMPLER_BYTES_PER_LOGIT = 38
# V1: the same, fitted on llm-d's H100 summary of vLLM logs (38.4-39.6 bytes with the hidden states below).
V1_SAMPLER_BYTES_PER_LOGIT = 39
# V1 defaults when max_num_seqs is unset (0.19.1 engine/arg_utils.py:2053-2073): 1024 on >= 70 GiB GPUs
# that are not A100s, else 256 (V0: 256).
V1_MAX_NUM_SEQS_LARGE_GPU = 1024
DEFAULT_MAX_NUM_SEQS = 256
# V1's profiler's non-torch increase on one GPU: 0.13-0.14 GiB logged on H100 (llm-d), rounded up.
V1_NON_TORCH_BASE_GIB = 0.15
# V1 at TP >= 2 where the GPUs reach each other peer to peer (custom all-reduce on): about 2 GiB per GPU of
# non-torch increase in the real logs (NCCL's lazily connected buffers and the all-reduce IPC
# buffers); a floor under the per-peer figure.
V1_COMM_GIB_P2P = 2.0
# Copies of the residual stream (hidden, residual, normed input, attention output) alive at once.
RESIDUAL_COPIES = 4
# The runbooks' rule of thumb: parameters x bytes per parameter x 1.2.
RULE_OF_THUMB_FACTOR = 1.2


# How far the KV-token estimate has erred on the optimistic side against real start-up logs, per class of
# pool (engine line, TP 1 or >= 2, dense/MoE/MLA): bench/capacity_accuracy.py measures it (docs/perf/capacity.md)
# and tests/test_capacity.py keeps each figure covering the bench's logs of its class. A class with fewer than
# KV_ERROR_MIN_LOGS compared logs takes the widest error measured on any log (KV_ERROR_UNMEASURED, one of this
# engine's logs); none claims less than the floor. The plan gives each pool's KV tokens, KV cache and concurrency
# as a range down to its class's error, and memory-fit-margin warns within it, naming the terms the error lies in.
KV_ERROR_BY_CLASS: dict[tuple[str, str, str], float] = {
    ("v1", "tp1", "dense"): KV_ERROR_FLOOR,  # 10 logs, none optimistic (A100, L40S, H100, H200)
    # 6 logs, none optimistic (Qwen2-7B on A100, Qwen3-32B on H100, Qwen2.5-72B on L40S)
    ("v1", "tp>=2", "dense"): KV_ERROR_FLOOR,
}
# Where that error lies: the terms of vLLM's budget the planner estimates rather than reads (memory-fit-margin's
# words; every engine's estimate carries its own).
KV_ERROR_TERMS = (
    "the activation peak (the sampler over max-num-seqs rows of the vocabulary) and the memory outside torch's "
    "allocator (NCCL and all-reduce buffers at TP >= 2)"
)


def pessimistic_end(value: float, error: float) -> float:
    """A KV figure (tokens, GiB, concurrency) at the pessimistic end of a range of `error` (a fraction)."""
    return value * (1 - error)


def kv_error_class(arch: ModelArch, *, tp: int, v1_engine: bool) -> tuple[str, str, str]:
    """The class whose measured error a pool's range takes: engine line, TP 1 or >= 2, dense/MoE/MLA (MLA
    first: DeepSeek's MoE models are classed by their attention)."""
    kind = "mla" if arch.uses_mla else "moe" if arch.is_moe else "dense"
    return ("v1" if v1_engine else "v0", "tp1" if tp == 1 else "tp>=2", kind)


def kv_estimate_error(cls: tuple[str, str, str]) -> tuple[float, str]:
    """The class's measured optimistic error and how it was found, in words for the plan."""
    kind = {"moe": "MoE", "mla": "MLA"}.get(cls[2], cls[2])
    name = f"{cls[0].upper()} · {cls[1].upper()} · {kind}"
    if cls in KV_ERROR_BY_CLASS:
        return KV_ERROR_BY_CLASS[cls], f"{name}, measured on its logs"
    return KV_ERROR_UNMEASURED, f"{name}: too few logs, the widest error measured"


@dataclass(frozen=True)
class CapacityEstimate:
    """What vLLM will find on each GPU of one pool, and whether the pool can serve max_model_len."""

    model: str
    gpu_memory_gib: float
    tp: int
    pp: int
    gpu_memory_utilization: float
    dtype: str
    quantization: str | None
    kv_cache_dtype: str
    uses_mla: bool
    mla_enabled: bool
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    layers_per_stage: tuple[int, ...]
    weights_gib_per_gpu: float  # worst pipeline stage
    weights_gib_total: float  # the whole model once (all stages, all TP ranks, replicas counted)
    kv_bytes_per_token_per_gpu: int  # on the stage that limits the block count
    activation_gib: float
    non_torch_gib: float
    kv_cache_gib_per_gpu: float
    gpu_blocks: int
    kv_tokens: int
    max_concurrency: float  # sequences of max_model_len tokens the KV cache holds at once
    fits: bool
    reason: str
    rule_of_thumb_gib_total: float
    notes: tuple[str, ...] = field(default=())
    communicator_gib: float = 0.0  # NCCL and custom all-reduce buffers per GPU
    communicator_in_budget: bool = True  # counted in non_torch_gib (else outside the budget)
    startup_free_gib: float | None = None  # free per GPU when vLLM checks its request (images that check)
    advice: str = ""  # what to change when vLLM refuses before the KV cache is sized
    weights_gib_per_stage: tuple[float, ...] = ()  # one GPU of each pipeline stage, first stage first
    kv_estimate_error: float = KV_ERROR_UNMEASURED  # the class's measured optimistic error (the range's width)
    kv_error_class: str = ""  # which class, and whether measured on its own logs
    kv_error_terms: str = KV_ERROR_TERMS  # the estimated terms the error lies in

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (plan.json `capacity`, `--json`)."""
        d = asdict(self)
        d["layers_per_stage"] = list(self.layers_per_stage)
        d["notes"] = list(self.notes)
        d["weights_gib_per_stage"] = [round(w, 4) for w in self.weights_gib_per_stage]
        for key, value in d.items():
            if isinstance(value, float):
                d[key] = round(value, 4)
        return d


def activation_peak_bytes(
    arch: ModelArch,
    *,
    tp: int,
    act_bytes: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    v1_engine: bool = False,
) -> float:
    """Peak PyTorch memory of vLLM's profile run beyond the weights (forward pass or sampler)."""
    h = arch.hidden_size
    if arch.is_moe:
        tokens = min(max_num_batched_tokens, FUSED_MOE_CHUNK)
        # fused_moe's three intermediate caches: gate_up, activated, and down outputs per routed copy.
        mlp = tokens * arch.experts_per_token * (3 * arch.moe_intermediate_size / tp + h)
    else:
        mlp = max_num_batched_tokens * 3 * arch.intermediate_size / tp
    forward = (max_num_batched_tokens * RESIDUAL_COPIES * h + mlp) * act_bytes
    if v1_engine:
        # V1 samples while the dummy forward's hidden states (one per batched token) are still alive.
        sampler = max_num_seqs * arch.vocab_size * V1_SAMPLER_BYTES_PER_LOGIT + max_num_batched_tokens * h * act_bytes
    else:
        sampler = max_num_seqs * arch.vocab_size * SAMPLER_BYTES_PER_LOGIT
    return max(forward, sampler)


def default_max_num_seqs(*, v1_engine: bool = False, gpu_name: str = "", gpu_memory_gib: float = 0.0) -> int:
    """vLLM's max_num_seqs when unset: V1's OpenAI server takes 1024 on >= 70 GiB GPUs that are not A100s."""
    if v1_engine and gpu_memory_gib >= V1_LARGE_GPU_MIN_GIB and "a100" not in gpu_name.lower():
        return V1_MAX_NUM_SEQS_LARGE_GPU
    return DEFAULT_MAX_NUM_SEQS


def default_max_num_batched_tokens(
    max_model_len: int,
    *,
    v1_engine: bool = False,
    gpu_name: str = "",
    gpu_memory_gib: float = 0.0,
    chunked_prefill: bool | None = None,
) -> int:
    """vLLM's max_num_batched_tokens when unset: V0 without chunked prefill, or V1's budget for the OpenAI
    server (2048, 8192 on >= 70 GiB non-A100 GPUs), raised to max_model_len when V1's chunked prefill is off
    (0.19.1 engine/arg_utils.py:2050-2075, 2213-2230)."""
    if not v1_engine:
        return max(max_model_len, DEFAULT_MIN_BATCHED_TOKENS)
    budget = V1_BATCHED_TOKENS
    if gpu_memory_gib >= V1_LARGE_GPU_MIN_GIB and "a100" not in gpu_name.lower():
        budget = V1_BATCHED_TOKENS_LARGE_GPU
    return budget if chunked_prefill is not False else max(max_model_len, budget)


def pipeline_neighbours(pp: int) -> int:
    """Pipeline stages a middle stage talks to (two) or an end stage (one); none without PP."""
    return min(pp - 1, 2)


def communicator_gib(tp: int, pp: int, *, nvls: bool = False, v1_engine: bool = False, p2p: bool = True) -> float:
    """NCCL communicators and custom all-reduce buffers on one GPU: a share per TP peer and pipeline
    neighbour, larger where NCCL uses NVLink SHARP (NVSwitch Hopper); on V1 at TP >= 2 between GPUs that
    reach each other peer to peer, at least V1_COMM_GIB_P2P."""
    peers = (tp - 1) + pipeline_neighbours(pp)
    per_peer = peers * (COMM_GIB_PER_PEER_NVLS if nvls else COMM_GIB_PER_PEER)
    if v1_engine and p2p and tp > 1:
        return max(per_peer, V1_COMM_GIB_P2P)
    return per_peer


def _rule_of_thumb_bytes_per_param(quantization: str | None, act_bytes: int, quant_bits: int) -> float:
    if quantization is None:
        return float(act_bytes)
    if quantization in FP8_QUANTIZATION_METHODS:
        return 1.0
    return quant_bits / 8


def estimate(
    arch: ModelArch,
    gpu_memory_gib: float,
    *,
    tp: int,
    pp: int,
    gpu_memory_utilization: float,
    dtype: str,
    quantization: str | None = None,
    quant_bits: int = 4,
    group_size: int = 128,
    kv_cache_dtype: str = "auto",
    max_model_len: int,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    block_size: int = 16,
    mla_enabled: bool = True,
    v1_engine: bool = False,
    gpu_name: str = "",
    chunked_prefill: bool | None = None,
    nccl_in_budget: bool = True,
    nvls: bool = False,
    p2p: bool = True,
) -> CapacityEstimate:
    """Estimate weights, KV cache and concurrency per GPU for one pool, the way vLLM will.

    `v1_engine` is the engine line (V1: its activation, non-torch and communicator terms, and the range of
    its class); with `gpu_name` and `chunked_prefill` (None: the engine's default) it also picks vLLM's
    defaults for max_num_seqs and max_num_batched_tokens when they are unset. `nccl_in_budget` is the
    image's profiler order (ImageFacts.nccl_in_budget), `nvls` whether the GPUs talk over NVSwitch with NCCL
    NVLS, `p2p` whether they reach each other peer to peer (NVLink: custom all-reduce on; unknown: yes).
    """
    if max_num_seqs is None:
        max_num_seqs = default_max_num_seqs(v1_engine=v1_engine, gpu_name=gpu_name, gpu_memory_gib=gpu_memory_gib)
    _check_inputs(
        arch,
        gpu_memory_gib,
        tp,
        pp,
        gpu_memory_utilization,
        dtype,
        kv_cache_dtype,
        max_model_len,
        max_num_seqs,
        block_size,
    )
    act_bytes = DTYPE_BYTES[dtype]
    kv_bytes = kv_cache_bytes(kv_cache_dtype, act_bytes)
    linear_bytes = linear_bytes_per_param(quantization, act_bytes, quant_bits, group_size)
    batched = max_num_batched_tokens or default_max_num_batched_tokens(
        max_model_len,
        v1_engine=v1_engine,
        gpu_name=gpu_name,
        gpu_memory_gib=gpu_memory_gib,
        chunked_prefill=chunked_prefill,
    )
    stages = layers_per_stage(arch.num_layers, pp)
    activation = activation_peak_bytes(
        arch,
        tp=tp,
        act_bytes=act_bytes,
        max_num_batched_tokens=batched,
        max_num_seqs=max_num_seqs,
        v1_engine=v1_engine,
    )
    comm = communicator_gib(tp, pp, nvls=nvls, v1_engine=v1_engine, p2p=p2p) * GIB
    # V1 logs NCCL's lazily connected buffers in its non-torch increase whatever the image's order.
    comm_in_budget = nccl_in_budget or v1_engine
    base = (V1_NON_TORCH_BASE_GIB if v1_engine else NON_TORCH_BASE_GIB) * GIB
    non_torch = base + (comm if comm_in_budget else 0.0)
    budget = gpu_memory_gib * GIB * gpu_memory_utilization
    # Where NCCL starts before the baseline, vLLM first checks that its whole request is still free.
    startup_free = None if nccl_in_budget else gpu_memory_gib * GIB - CUDA_CONTEXT_GIB * GIB - comm
    per_token_layer = kv_bytes_per_token_per_layer(arch, tp, kv_bytes, mla_enabled)

    weights, blocks, kv_mem, kv_per_token = [], [], [], []
    start = 0
    for rank, n in enumerate(stages):
        w = stage_weight_bytes(
            arch,
            start,
            start + n,
            tp=tp,
            pp=pp,
            first=rank == 0,
            last=rank == pp - 1,
            act_bytes=act_bytes,
            linear_bytes=linear_bytes,
            mla_enabled=mla_enabled,
        )
        free = budget - w - activation - non_torch
        weights.append(w)
        kv_mem.append(free)
        kv_per_token.append(per_token_layer * n)
        blocks.append(max(0, int(free // (block_size * per_token_layer * n))))
        start += n
    worst = min(range(pp), key=lambda r: blocks[r])
    gpu_blocks = blocks[worst]
    kv_tokens = gpu_blocks * block_size
    concurrency = kv_tokens / max_model_len
    weights_total = sum(weights) * tp
    rot = (
        model_params(arch) * _rule_of_thumb_bytes_per_param(quantization, act_bytes, quant_bits) * RULE_OF_THUMB_FACTOR
    )
    fits, reason = _verdict(
        weights[worst],
        max(weights),
        kv_mem[worst],
        activation,
        non_torch,
        budget,
        kv_tokens,
        max_model_len,
        gpu_memory_gib,
        gpu_memory_utilization,
    )
    advice = ""
    if startup_free is not None and startup_free < budget:
        fits, reason, advice = _startup_refusal(startup_free, comm, tp, pp, gpu_memory_gib, gpu_memory_utilization)
    notes = _notes(arch, mla_enabled, concurrency, max_num_seqs, fits)
    if fits and startup_free is not None and startup_free - budget < STARTUP_MARGIN_GIB * GIB:
        notes += (
            f"only {(startup_free - budget) / GIB:.2f} GiB per GPU to spare when vLLM checks its request "
            f"at start (NCCL/all-reduce buffers estimated at {comm / GIB:.2f} GiB): if it refuses with "
            "'Free memory on device ... on startup', lower gpu-memory-utilization",
        )
    error, error_class = kv_estimate_error(kv_error_class(arch, tp=tp, v1_engine=v1_engine))
    return CapacityEstimate(
        model=arch.name,
        gpu_memory_gib=gpu_memory_gib,
        tp=tp,
        pp=pp,
        gpu_memory_utilization=gpu_memory_utilization,
        dtype=dtype,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
        uses_mla=arch.uses_mla,
        mla_enabled=mla_enabled and arch.uses_mla,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=batched,
        layers_per_stage=tuple(stages),
        weights_gib_per_gpu=max(weights) / GIB,
        weights_gib_total=weights_total / GIB,
        kv_bytes_per_token_per_gpu=kv_per_token[worst],
        activation_gib=activation / GIB,
        non_torch_gib=non_torch / GIB,
        kv_cache_gib_per_gpu=max(0.0, kv_mem[worst]) / GIB,
        gpu_blocks=gpu_blocks,
        kv_tokens=kv_tokens,
        max_concurrency=concurrency,
        fits=fits,
        reason=reason,
        rule_of_thumb_gib_total=rot / GIB,
        notes=notes,
        communicator_gib=comm / GIB,
        communicator_in_budget=comm_in_budget,
        startup_free_gib=None if startup_free is None else startup_free / GIB,
        advice=advice,
        weights_gib_per_stage=tuple(w / GIB for w in weights),
        kv_estimate_error=error,
        kv_error_class=error_class,
    )


def _startup_refusal(free: float, comm: float, tp: int, pp: int, gpu_gib: float, util: float) -> tuple[bool, str, str]:
    """vLLM's request_memory refusal: less than utilization x total free once NCCL is up."""
    peers = (tp - 1) + pipeline_neighbours(pp)
    highest = max(0.0, (free / GIB) / gpu_gib)
    reason = (
        f"about {free / GIB:.2f} GiB per GPU is free when vLLM sizes its request ({gpu_gib:.2f} GiB less "
        f"the CUDA context, {CUDA_CONTEXT_GIB:g} GiB, and NCCL/all-reduce buffers for {peers} peers, "
        f"{comm / GIB:.2f} GiB), less than gpu-memory-utilization {util:.2f} x {gpu_gib:.2f} = "
        f"{gpu_gib * util:.2f} GiB: vLLM stops with 'Free memory on device ... on startup is less than "
        "desired GPU memory utilization'"
    )
    advice = f"lower gpu-memory-utilization from {util:g} to {int(highest * 100) / 100:.2f} or less"
    return False, reason, advice


def _check_inputs(
    arch: ModelArch,
    gpu_memory_gib: float,
    tp: int,
    pp: int,
    util: float,
    dtype: str,
    kv_cache_dtype: str,
    max_model_len: int,
    max_num_seqs: int,
    block_size: int,
) -> None:
    if gpu_memory_gib <= 0:
        raise ValueError(f"GPU memory must be positive, got {gpu_memory_gib}")
    if tp < 1 or pp < 1:
        raise ValueError(f"tensor and pipeline parallel sizes must be >= 1, got tp={tp} pp={pp}")
    if arch.num_attention_heads % tp:
        raise ValueError(
            f"{arch.name} has {arch.num_attention_heads} attention heads, not divisible by tensor parallel size {tp}"
        )
    if not 0 < util <= 1:
        raise ValueError(f"gpu-memory-utilization must be in (0, 1], got {util}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv-cache-dtype {kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
    if max_model_len < 1 or max_num_seqs < 1 or block_size < 1:
        raise ValueError("max-model-len, max-num-seqs and block-size must be >= 1")


def _verdict(
    stage_weights: float,
    max_weights: float,
    kv_mem: float,
    activation: float,
    non_torch: float,
    budget: float,
    kv_tokens: int,
    max_model_len: int,
    gpu_gib: float,
    util: float,
) -> tuple[bool, str]:
    """Whether vLLM will start and serve max_model_len, and if not, why in plain words."""
    share = f"{gpu_gib:.1f} GiB x {util:.2f} = {budget / GIB:.1f} GiB per GPU"
    if max_weights >= budget:
        return False, (
            f"the weights alone need {max_weights / GIB:.1f} GiB per GPU, more than the "
            f"{share}: add GPUs (TP/PP), quantize, or raise gpu-memory-utilization"
        )
    if kv_mem <= 0:
        return False, (
            f"weights {stage_weights / GIB:.1f} GiB + activations {activation / GIB:.1f} GiB + "
            f"non-torch {non_torch / GIB:.1f} GiB leave no KV cache in the {share}: vLLM "
            "stops with 'No available memory for the cache blocks'"
        )
    if kv_tokens < max_model_len:
        return False, (
            f"the KV cache holds {kv_tokens} tokens, fewer than max-model-len "
            f"{max_model_len}: vLLM refuses to start; lower max-model-len to {kv_tokens} "
            "or less, or add GPUs"
        )
    return True, ""


def _notes(arch: ModelArch, mla_enabled: bool, concurrency: float, max_num_seqs: int, fits: bool) -> tuple[str, ...]:
    notes = []
    if arch.uses_mla and mla_enabled:
        notes.append("MLA on: needs FlashAttention-2 (sm_80+); on V100 set VLLM_MLA_DISABLE=1 and plan with MLA off")
    if fits and concurrency < max_num_seqs:
        notes.append(
            f"only {concurrency:.1f} sequences of max-model-len fit at once, below "
            f"max-num-seqs {max_num_seqs}: long requests will queue or be preempted"
        )
    return tuple(notes)
