"""What the stack model needs to know of each deployed engine, filled in by components/engines/registry.py.

The spec sits below the engines: it cannot import them, yet a pool's options block (`pools.<pool>.<key>`),
its default image and the checkpoint formats a model may name are the engines' facts. Each engine's
registry entry hands them over here as `DeployedEngine`; the engines the runbooks name that the project
does not deploy (components.facts.other_engines) are known by name and refused with the reason per GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from components.facts.other_engines import OTHER_ENGINES
from components.spec.base import Spec


@dataclass(frozen=True)
class Launcher:
    """How a pool's instances that span nodes start: on a Ray cluster, with the engine's own launcher on each
    node (rank 0 serving the API), or not at all."""

    kind: str  # "ray", "native" or "none" (components.engines.base.MultiNode)
    port: int | None = None  # the native launcher's rendezvous port on an instance's first node
    port_key: str = ""  # the key under pools.<pool> that sets that port ("vllm.masterPort")


@dataclass(frozen=True)
class DeployedEngine:
    """One deployed engine as the stack model sees it."""

    name: str  # the `pools.*.engine` value
    options_key: str  # its options block under pools.<pool>
    options_model: type[Spec]
    required_option: str  # named in the error when the block is missing (camelCase, as in YAML)
    default_image: str  # `pools.*.image` when unset
    quantizations: frozenset[str]  # `models.*.quantization` values its images load
    declarable_images: Callable[[], list[str]]  # images whose facts a private build may start from (imageFacts.like)
    knows_image: Callable[[str], bool]  # whether a reference is one of them (as its facts table reads references)
    # How the pool's multi-node instances start, read from its options block (None: an engine without one).
    launcher: Callable[[Spec | None], Launcher] = lambda _options: Launcher("ray")


DEPLOYED: dict[str, DeployedEngine] = {}
DEPLOYED_KEYS: dict[str, str] = {}  # options key -> its engine
DEFAULT_ENGINE: list[str] = []  # the engine of a pool that names none (set once by the registry)


def register(engine: DeployedEngine, *, default: bool = False) -> None:
    """Make an engine known to the stack model (components/engines/registry.py calls this, once per engine)."""
    if engine.name in OTHER_ENGINES:
        raise ValueError(f"engine {engine.name!r} is the name of an engine the project does not deploy")
    taken = {e.options_key for e in DEPLOYED.values() if e.name != engine.name}
    if engine.options_key in taken:
        raise ValueError(f"engine {engine.name!r}: options key {engine.options_key!r} is taken")
    DEPLOYED[engine.name] = engine
    DEPLOYED_KEYS[engine.options_key] = engine.name
    if default:
        DEFAULT_ENGINE[:] = [engine.name]


def deployed() -> dict[str, DeployedEngine]:
    """The deployed engines; an empty registry is a programming error, not a stack error."""
    if not DEPLOYED:
        raise RuntimeError("no engine is registered: import components.engines.registry before parsing a stack")
    return DEPLOYED


def engine_names() -> tuple[str, ...]:
    """Every `pools.*.engine` value: the deployed engines, then those known by name and refused."""
    return tuple(deployed()) + tuple(OTHER_ENGINES)


def options_keys() -> dict[str, str]:
    """Options key -> the engine it belongs to."""
    return {e.options_key: e.name for e in deployed().values()}


def quantization_methods() -> frozenset[str]:
    """Every checkpoint quantization a deployed engine's images load."""
    return frozenset().union(*(e.quantizations for e in deployed().values()))


def knows_image(ref: str) -> bool:
    """Whether a private build's declared facts may start from this image."""
    return any(e.knows_image(ref) for e in deployed().values())


def declarable_images() -> list[str]:
    """Every image a private build's declared facts may start from."""
    return sorted({ref for e in deployed().values() for ref in e.declarable_images()})
