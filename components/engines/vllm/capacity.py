"""Capacity of each pool from the stack: the capacity planner fed with the pool's real settings."""

from __future__ import annotations

import math

from components.engines.vllm.facts import pool_image_facts
from components.engines.vllm.memory import CapacityEstimate, estimate, pessimistic_end
from components.facts.hardware import gpu
from components.spec import StackSpec
from components.spec.models import model_architecture, resolved_dtype


def mla_enabled(spec: StackSpec, pool: str) -> bool:
    """MLA stays on unless the pool sets VLLM_MLA_DISABLE=1 (vLLM's own switch)."""
    return spec.pools[pool].env.get("VLLM_MLA_DISABLE") not in ("1", "true", "True")


def pool_capacity(spec: StackSpec, pool: str, *, mla: bool | None = None) -> CapacityEstimate:
    """Weights, KV cache and concurrency per GPU of one pool's instances, as vLLM will compute them."""
    p = spec.pools[pool]
    m = spec.models[p.model]
    node_gpu = spec.node(p.nodes[0]).gpu
    assert node_gpu is not None  # the spec refuses nodes without GPUs
    g = gpu(node_gpu.model)
    if p.tensor_parallel > node_gpu.count:
        # The communicator figures are fitted on GPUs of one node; the parallelism rule names the fault.
        raise ValueError(
            f"tensor parallel size {p.tensor_parallel} spans nodes of {node_gpu.count} GPUs: "
            "the planner models tensor parallelism within a node"
        )
    v = p.vllm
    return estimate(
        model_architecture(spec, p.model),
        g.visible_memory_gib,
        tp=p.tensor_parallel,
        pp=p.pipeline_parallel,
        gpu_memory_utilization=v.gpu_memory_utilization,
        dtype=resolved_dtype(m.dtype, g.capability),
        quantization=m.quantization,
        quant_bits=m.quant_bits,
        group_size=m.group_size,
        kv_cache_dtype=v.kv_cache_dtype,
        max_model_len=v.max_model_len,
        max_num_seqs=v.max_num_seqs,
        max_num_batched_tokens=v.max_num_batched_tokens,
        block_size=v.block_size,
        mla_enabled=mla_enabled(spec, pool) if mla is None else mla,
        # The image's engine line on this GPU picks the default batch budget (V1: chunked, 2048 under 70 GiB).
        v1_engine=_runs_v1(spec, pool, g.capability),
        gpu_name=g.name,
        chunked_prefill=v.enable_chunked_prefill,
        nccl_in_budget=_nccl_in_budget(spec, pool),
        nvls=g.nvls,
    )


def _nccl_in_budget(spec: StackSpec, pool: str) -> bool:
    """Whether the pool's image counts NCCL's buffers inside its budget (its facts; an unknown image: yes,
    the order that leaves the smaller KV cache)."""
    facts = pool_image_facts(spec, pool)
    return True if facts is None else facts.nccl_in_budget


def _runs_v1(spec: StackSpec, pool: str, capability: int) -> bool:
    """Whether the pool's image runs vLLM's V1 engine on this GPU (its facts; an unknown image: V1 from
    sm_80 as every known line does, V0's budget below, the larger of the two)."""
    p = spec.pools[pool]
    facts = pool_image_facts(spec, pool)
    if facts is None:
        return capability >= 80
    return facts.batch_budget == "v1" and facts.runs_v1(capability) and p.env.get("VLLM_USE_V1") != "0"


def capacity_dict(spec: StackSpec, pool: str, *, mla: bool | None = None) -> dict[str, object]:
    """The estimate as JSON, or {"error": why} when the planner cannot model the pool (say, heads not
    divisible by TP): the plan still runs and the policy pack names the real fault."""
    try:
        return with_range(pool_capacity(spec, pool, mla=mla).to_dict())
    except ValueError as err:
        return {"error": f"capacity not estimated: {err}"}


def with_range(d: dict[str, object]) -> dict[str, object]:
    """The estimate with its pessimistic end: KV tokens, KV cache and concurrency less the measured error of
    the pool's class (kv_estimate_error, set by the estimate)."""
    kv, conc, gib, error = d["kv_tokens"], d["max_concurrency"], d["kv_cache_gib_per_gpu"], d["kv_estimate_error"]
    assert isinstance(kv, int) and isinstance(conc, (int, float)) and isinstance(gib, (int, float))
    assert isinstance(error, float)
    d["kv_tokens_low"] = math.floor(pessimistic_end(kv, error))
    d["max_concurrency_low"] = round(pessimistic_end(conc, error), 4)
    d["kv_cache_gib_per_gpu_low"] = round(pessimistic_end(gib, error), 4)
    return d
