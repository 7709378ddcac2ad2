"""Serving engines behind one seam: `engine_for(pool)` picks the Engine a pool's `engine` names."""
from __future__ import annotations

from components.planning.engines.base import Engine
from components.planning.engines.llamacpp import LlamacppEngine
from components.planning.engines.lmdeploy import LmdeployEngine
from components.planning.engines.vllm import VllmEngine
from components.spec.cluster import PoolSpec

# pools.*.engine -> its Engine. Adding an engine: its own module, one line here, its Literal in PoolSpec.
ENGINES: dict[str, Engine] = {e.name: e for e in (VllmEngine(), LmdeployEngine(), LlamacppEngine())}


def engine_for(pool: PoolSpec) -> Engine:
    """The Engine that serves a pool (`pools.*.engine`)."""
    try:
        return ENGINES[pool.engine]
    except KeyError:
        raise KeyError(f"engine {pool.engine!r} has no planning module; known: {', '.join(sorted(ENGINES))}") from None


__all__ = ["ENGINES", "Engine", "engine_for"]
