"""The engine registry: one line per engine, and every engine-indexed table derived from it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.engines.base import Engine
from components.engines.llamacpp.engine import LlamacppEngine
from components.engines.lmdeploy.engine import LmdeployEngine
from components.engines.vllm.engine import VllmEngine
from components.spec import engines as spec_engines
from components.spec.cluster import TYPED_ENV as NODE_TYPED_ENV
from components.spec.cluster import PoolSpec
from components.spec.stack import StackSpec

# pools.*.engine -> its Engine. Adding an engine: its own package under components/engines and one line here.
ENGINES: dict[str, Engine] = {}
DEFAULT_IMAGES: dict[str, str] = {}  # engine -> the image of a pool that names none
# Every engine's credential flags, for what reads an argv without knowing its engine (the policy pack,
# the plan's redaction); a flag that takes several values in one engine is read so in all.
SECRET_FLAGS: dict[str, str] = {}
SECRET_FLAG_NAMES: dict[str, str] = {}  # short alias -> long flag
# Environment the product sets from typed keys in any engine's containers: variable -> the key that owns it.
TYPED_ENV: dict[str, str] = dict(NODE_TYPED_ENV)


def register(engine: Engine, *, default: bool = False) -> None:
    """Make an engine deployable: the spec takes its options block and image, and every table above has it."""
    ENGINES[engine.name] = engine
    DEFAULT_IMAGES[engine.name] = engine.default_image
    for flag, nargs in engine.secret_flags.items():
        SECRET_FLAGS[flag] = "+" if "+" in (nargs, SECRET_FLAGS.get(flag)) else nargs
    SECRET_FLAG_NAMES.update(engine.secret_flag_aliases)
    TYPED_ENV.update(engine.typed_env)
    TYPED_ENV.update({name: "pools.<pool>.offline" for name in engine.offline_vars})
    spec_engines.register(
        spec_engines.DeployedEngine(
            engine.name,
            engine.options_key,
            engine.options_model,
            engine.required_option,
            engine.default_image,
            engine.checkpoint_quantizations(),
            engine.declarable_images,
            engine.knows_image,
            engine.launcher,
        ),
        default=default,
    )


register(VllmEngine(), default=True)
register(LmdeployEngine())
register(LlamacppEngine())


def default_engine() -> Engine:
    """The engine of a pool that names none."""
    return ENGINES[spec_engines.DEFAULT_ENGINE[0]]


def engine_of(props: Mapping[str, Any]) -> Engine | None:
    """The engine of a ModelServer as the policy pack reads its props (`engine`, else the default); None for an
    engine no longer registered."""
    return ENGINES.get(str(props.get("engine") or spec_engines.DEFAULT_ENGINE[0]))


def flag_spellings(token: str) -> list[str]:
    """The long flags a server argv token may stand for, one per engine's reading (`-tp`: vLLM's
    --tensor-parallel-size), then the token itself: for messages that name a flag without its engine."""
    found = [flag for e in ENGINES.values() if (flag := e.canonical_flag(token)) is not None]
    return list(dict.fromkeys([*found, token]))


def short_flags() -> list[str]:
    """Every engine's short server flags that stand for a long one (`-tp`), for messages that name them."""
    return list(dict.fromkeys(alias for e in ENGINES.values() for alias in e.flag_aliases))


def env_prefixes() -> list[str]:
    """Prefixes of the engines' own environment variables (`VLLM`), for messages that name them."""
    return list(dict.fromkeys(prefix for e in ENGINES.values() for prefix in e.env_prefixes))


def engine_for(pool: PoolSpec) -> Engine:
    """The Engine that serves a pool (`pools.*.engine`)."""
    try:
        return ENGINES[pool.engine]
    except KeyError:
        raise KeyError(f"engine {pool.engine!r} has no planning module; known: {', '.join(sorted(ENGINES))}") from None


def stack_keys(s: StackSpec, pool: str, node: str) -> dict[str, str]:
    """Where a person edits what a pool's server is given: server flag or env name -> stack key.

    Typed flags map to their typed keys, flags from extraArgs to their extraArgs entry, env names to
    pools.<pool>.env, nccl.extraEnv or the node key the product derives them from. The policy pack
    names these keys in its messages (policies.rules.common.name_stack_keys).
    """
    p = s.pools[pool]
    engine = engine_for(p)
    keys: dict[str, str] = {}
    for flag in engine.typed_flags:
        key = engine.typed_key(flag, pool=pool, model=p.model, node=node)
        if key is not None:
            keys[flag] = key
    for name, template in TYPED_ENV.items():
        keys[name] = template.replace("<node>", node).replace("<pool>", pool)
    for i, token in enumerate(engine.options(p).extra_args):
        flag = engine.canonical_flag(token)
        if flag is not None:
            keys.setdefault(flag, f"pools.{pool}.{engine.options_key}.extraArgs[{i}] (given in extraArgs)")
    for name in s.nccl.extra_env:
        keys[name] = f"nccl.extraEnv.{name}"
    for name in p.env:
        keys[name] = f"pools.{pool}.env.{name}"
    # The pool's image, as a message names it ("image vllm/vllm-openai:latest is not pinned").
    keys[f"image {p.image}"] = f"pools.{pool}.image"
    # Any other variable a message suggests is set in the pool's env.
    keys["*env"] = f"pools.{pool}.env"
    return keys


__all__ = [
    "DEFAULT_IMAGES",
    "ENGINES",
    "SECRET_FLAGS",
    "SECRET_FLAG_NAMES",
    "TYPED_ENV",
    "Engine",
    "default_engine",
    "engine_for",
    "engine_of",
    "env_prefixes",
    "flag_spellings",
    "register",
    "short_flags",
    "stack_keys",
]
