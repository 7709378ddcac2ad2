"""The capacity report above the engines' own models: plan.json `capacity`, per pool as deployed and the
variants a person weighs (MLA's other setting, one more pipeline stage)."""

from __future__ import annotations

from components.engines.registry import engine_for
from components.spec import StackSpec


def capacity_report(spec: StackSpec) -> dict[str, dict[str, object]]:
    """plan.json `capacity`: per pool the estimate as deployed, and for MLA models the other MLA setting too."""
    out: dict[str, dict[str, object]] = {}
    for pool, p in spec.pools.items():
        engine = engine_for(p)
        est = engine.capacity(spec, pool)
        entry: dict[str, object] = {"asDeployed": est}
        if est.get("uses_mla"):
            entry["mlaOn" if not est["mla_enabled"] else "mlaOff"] = engine.capacity(
                spec, pool, mla=not est["mla_enabled"]
            )
        if p.pipeline_parallel > 1:
            # What one more node per instance would give (the weights spread thinner, more KV cache per GPU).
            entry[f"pp{p.pipeline_parallel + 1}"] = engine.capacity(
                with_pipeline_stages(spec, pool, p.pipeline_parallel + 1), pool
            )
        out[pool] = entry
    return out


def with_pipeline_stages(spec: StackSpec, pool: str, stages: int) -> StackSpec:
    """The stack with the pool's instances spread over `stages` nodes each: only the estimate reads it
    (its nodes are not checked against the stack's; the capacity hooks read the parallel sizes and the
    first node's GPU)."""
    p = spec.pools[pool].model_copy(update={"pipeline_parallel": stages})
    return spec.model_copy(update={"pools": {**spec.pools, pool: p}})
