"""Capacity of each pool from the stack: the capacity planner fed with the pool's real settings."""
from __future__ import annotations

import json
from pathlib import Path

from components.facts.hardware import DTYPE_ALIASES, gpu
from components.facts.models import (
    ModelArch, arch_from_config_json, context_window, model_arch, quantization_from_config_json,
)
from components.engines.capacity import CapacityEstimate, estimate
from components.spec import SpecError, SpecIssue, StackSpec


def model_architecture(spec: StackSpec, model: str) -> ModelArch:
    """The model's architecture: a catalog entry, or parsed from its config.json."""
    m = spec.models[model]
    if m.arch is not None:
        try:
            return model_arch(m.arch)
        except KeyError as e:
            raise SpecError([SpecIssue(f"models.{model}.arch", str(e.args[0]))]) from None
    path = Path(m.config_json or "")
    try:
        return arch_from_config_json(json.loads(path.read_text()), model)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecError([SpecIssue(f"models.{model}.configJson", f"cannot read {path}: {e}")]) from None


def checkpoint_quantization(spec: StackSpec, model: str) -> str | None:
    """The quantization method a configJson model's config.json states (quantization_config), None otherwise
    (catalog models carry no checkpoint file to read)."""
    m = spec.models[model]
    if m.config_json is None:
        return None
    try:
        found = quantization_from_config_json(json.loads(Path(m.config_json).read_text()))
    except (OSError, ValueError, TypeError):
        return None  # model_architecture reports an unreadable file
    return found[0] if found else None


def quantization_config(spec: StackSpec, model: str) -> dict[str, object] | None:
    """The checkpoint's quantization_config as its config.json states it (configJson models), for the rules an
    engine's converter enforces (TurboMind: group size, desc_act, sym, AWQ version); None when not known."""
    path = spec.models[model].config_json
    if path is None:
        return None
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None  # model_architecture reports an unreadable configJson
    q = (data.get("text_config") or {}).get("quantization_config") or data.get("quantization_config")
    if not isinstance(q, dict):
        return None
    keys = ("quant_method", "bits", "group_size", "desc_act", "sym", "version")
    return {k: q[k] for k in keys if k in q and isinstance(q[k], (str, int, float, bool))}


def context_window_dict(spec: StackSpec, model: str) -> dict[str, object] | None:
    """The model's context window as vLLM derives it (ModelServer prop `contextWindow`), None when unknown."""
    arch = model_architecture(spec, model)
    window = context_window(arch)
    if window is None:
        return None
    return {"tokens": window[0], "derivedFrom": window[1], "ropeScaled": bool(arch.rope_scaling)}


def resolved_dtype(dtype: str, capability: int) -> str:
    """What `--dtype` becomes on this GPU: `auto` falls back to float16 where bf16 is missing."""
    resolved = DTYPE_ALIASES[dtype]
    if resolved == "auto":
        # bf16 only from sm_80, in every known version (images: bf16_min_capability).
        return "bfloat16" if capability >= 80 else "float16"
    return resolved


def mla_enabled(spec: StackSpec, pool: str) -> bool:
    """MLA stays on unless the pool sets VLLM_MLA_DISABLE=1 (vLLM's own switch)."""
    return spec.pools[pool].env.get("VLLM_MLA_DISABLE", "0") not in ("1", "true", "True")


def pool_capacity(spec: StackSpec, pool: str, *, mla: bool | None = None) -> CapacityEstimate:
    """Weights, KV cache and concurrency per GPU of one pool's instances, as vLLM will compute them."""
    p = spec.pools[pool]
    m = spec.models[p.model]
    node_gpu = spec.node(p.nodes[0]).gpu
    assert node_gpu is not None  # the spec refuses nodes without GPUs
    g = gpu(node_gpu.model)
    if p.tensor_parallel > node_gpu.count:
        # The communicator figures are fitted on GPUs of one node; the parallelism rule names the fault.
        raise ValueError(f"tensor parallel size {p.tensor_parallel} spans nodes of {node_gpu.count} GPUs: "
                         "the planner models tensor parallelism within a node")
    v = p.vllm
    return estimate(
        model_architecture(spec, p.model), g.visible_memory_gib,
        tp=p.tensor_parallel, pp=p.pipeline_parallel, gpu_memory_utilization=v.gpu_memory_utilization,
        dtype=resolved_dtype(m.dtype, g.capability), quantization=m.quantization,
        quant_bits=m.quant_bits, group_size=m.group_size, kv_cache_dtype=v.kv_cache_dtype,
        max_model_len=v.max_model_len, max_num_seqs=v.max_num_seqs,
        max_num_batched_tokens=v.max_num_batched_tokens, block_size=v.block_size,
        mla_enabled=mla_enabled(spec, pool) if mla is None else mla,
        # The image's engine line on this GPU picks the default batch budget (V1: chunked, 2048 under 70 GiB).
        v1_engine=_runs_v1(spec, pool, g.capability), gpu_name=g.name, chunked_prefill=v.enable_chunked_prefill,
        nccl_in_budget=_nccl_in_budget(spec, pool), nvls=g.nvls,
    )


def _nccl_in_budget(spec: StackSpec, pool: str) -> bool:
    """Whether the pool's image counts NCCL's buffers inside its budget (its facts; an unknown image: yes,
    the order that leaves the smaller KV cache)."""
    from components.engines.registry import engine_for
    facts = engine_for(spec.pools[pool]).image_facts(spec, pool)
    return True if facts is None else facts.nccl_in_budget


def _runs_v1(spec: StackSpec, pool: str, capability: int) -> bool:
    """Whether the pool's image runs vLLM's V1 engine on this GPU (its facts; an unknown image: V1 from
    sm_80 as every known line does, V0's budget below, the larger of the two)."""
    from components.engines.registry import engine_for
    p = spec.pools[pool]
    facts = engine_for(p).image_facts(spec, pool)
    if facts is None:
        return capability >= 80
    return facts.batch_budget == "v1" and facts.runs_v1(capability) and p.env.get("VLLM_USE_V1") != "0"


def capacity_dict(spec: StackSpec, pool: str, *, mla: bool | None = None) -> dict[str, object]:
    """The estimate as JSON, or {"error": why} when the planner cannot model the pool (say, heads not
    divisible by TP): the plan still runs and the policy pack names the real fault."""
    try:
        return pool_capacity(spec, pool, mla=mla).to_dict()
    except ValueError as err:
        return {"error": f"capacity not estimated: {err}"}


def capacity_report(spec: StackSpec) -> dict[str, dict[str, object]]:
    """plan.json `capacity`: per pool the estimate as deployed, and for MLA models the other MLA setting too."""
    from components.engines.registry import engine_for  # the engines read this module

    out: dict[str, dict[str, object]] = {}
    for pool, p in spec.pools.items():
        engine = engine_for(p)
        est = engine.capacity(spec, pool)
        entry: dict[str, object] = {"asDeployed": est}
        if est.get("uses_mla"):
            entry["mlaOn" if not est["mla_enabled"] else "mlaOff"] = capacity_dict(
                spec, pool, mla=not est["mla_enabled"])
        if p.pipeline_parallel > 1:
            # What one more node per instance would give (the weights spread thinner, more KV cache per GPU).
            entry[f"pp{p.pipeline_parallel + 1}"] = engine.capacity(with_pipeline_stages(spec, pool, p.pipeline_parallel + 1), pool)
        out[pool] = entry
    return out


def with_pipeline_stages(spec: StackSpec, pool: str, stages: int) -> StackSpec:
    """The stack with the pool's instances spread over `stages` nodes each: only the estimate reads it
    (its nodes are not checked against the stack's; the capacity hooks read the parallel sizes and the
    first node's GPU)."""
    p = spec.pools[pool].model_copy(update={"pipeline_parallel": stages})
    return spec.model_copy(update={"pools": {**spec.pools, pool: p}})
