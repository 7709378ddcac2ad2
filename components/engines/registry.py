"""The engine registry: one line per engine, and every engine-indexed table derived from it."""
from __future__ import annotations

from components.engines.base import Engine
from components.engines.llamacpp.engine import LlamacppEngine
from components.engines.lmdeploy.engine import LmdeployEngine
from components.engines.vllm.engine import VllmEngine
from components.spec.cluster import PoolSpec

# pools.*.engine -> its Engine. Adding an engine: its own module, one line here, its Literal in PoolSpec.
ENGINES: dict[str, Engine] = {e.name: e for e in (VllmEngine(), LmdeployEngine(), LlamacppEngine())}
# Every engine's credential flags, for what reads an argv without knowing its engine (the policy pack,
# the plan's redaction); a flag that takes several values in one engine is read so in all.
SECRET_FLAGS: dict[str, str] = {}
SECRET_FLAG_NAMES: dict[str, str] = {}  # short alias -> long flag
for _engine in ENGINES.values():
    for _flag, _nargs in _engine.secret_flags.items():
        SECRET_FLAGS[_flag] = "+" if "+" in (_nargs, SECRET_FLAGS.get(_flag)) else _nargs
    SECRET_FLAG_NAMES.update(_engine.secret_flag_aliases)


def engine_for(pool: PoolSpec) -> Engine:
    """The Engine that serves a pool (`pools.*.engine`)."""
    try:
        return ENGINES[pool.engine]
    except KeyError:
        raise KeyError(f"engine {pool.engine!r} has no planning module; known: {', '.join(sorted(ENGINES))}") from None


__all__ = ["ENGINES", "SECRET_FLAGS", "SECRET_FLAG_NAMES", "Engine", "engine_for"]
