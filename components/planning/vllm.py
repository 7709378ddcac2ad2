"""Compatibility names for code written before the engine seam: everything here now lives in
components.planning.engines (base: engine-neutral helpers; vllm: the vLLM engine). New code asks
`engine_for(pool)`; these wrappers pick the pool's engine the same way."""
from __future__ import annotations

from components.planning.engines import engine_for
from components.planning.engines import base as _base
from components.planning.engines.base import (  # noqa: F401  (re-exported)
    LABEL_PREFIX, WATCHDOG_SCRIPT, container_envs, container_labels, container_name, endpoint, health_gate_script,
    health_probe_argv, watchdog_script,
)
from components.planning.topology import Instance
from components.spec import StackSpec


def vllm_argv(spec: StackSpec, instance: Instance) -> list[str]:
    """The instance's server argv (its pool's engine)."""
    return engine_for(spec.pools[instance.pool]).serve_argv(spec, instance)


def vllm_env(spec: StackSpec, instance: Instance, node: str) -> dict[str, str]:
    """The instance's container environment on `node` (its pool's engine)."""
    return engine_for(spec.pools[instance.pool]).serve_env(spec, instance, node)


def server_container_name(instance: Instance, spec: StackSpec | None = None) -> str:
    """The container that runs the server (the vLLM engine's naming when no spec is given)."""
    engine = engine_for(spec.pools[instance.pool]) if spec is not None else _vllm()
    return _base.server_container_name(engine, instance)


def health_url(spec: StackSpec, instance: Instance) -> str:
    """The instance's readiness URL."""
    return _base.ready_url(engine_for(spec.pools[instance.pool]), spec, instance)


def instance_watchdog_script(spec: StackSpec, instance: Instance) -> str:
    """The instance's watchdog script."""
    return _base.instance_watchdog_script(engine_for(spec.pools[instance.pool]), spec, instance)


def supervised_argv(spec: StackSpec, instance: Instance) -> list[str]:
    """The watchdog followed by the instance's server argv."""
    return _base.supervised_argv(engine_for(spec.pools[instance.pool]), spec, instance)


def _vllm() -> _base.Engine:
    from components.planning.engines import ENGINES
    return ENGINES["vllm"]
