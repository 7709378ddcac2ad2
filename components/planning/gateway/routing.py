"""The gateway's routing, generated from the stack (no Pulumi): the pool that serves each model name
(aliases included), the split of a model served by several pools, path routes, the paths the gateway
serves, and routes.json, the table gateway.lua reads."""

from __future__ import annotations

import math
from collections.abc import Sequence

from components.engines.registry import engine_for
from components.spec.stack import StackSpec
from components.spec.topology import affinity_pools, instances

# Endpoints routed by `model` (POST) under /v1/ and under every path-route prefix.
MODEL_ENDPOINTS = ("chat/completions", "completions", "embeddings")


def model_pools(spec: StackSpec) -> dict[str, list[str]]:
    """Model -> the pools serving it, in stack order."""
    out: dict[str, list[str]] = {}
    for pool, p in spec.pools.items():
        out.setdefault(p.model, []).append(pool)
    return out


def target(pools: Sequence[str]) -> str:
    """The route target of a model: its pool, or `blue+green` for pools that share it (also logged as `pool`)."""
    return "+".join(pools)


def routes(spec: StackSpec) -> dict[str, str]:
    """Every model name clients may send (served names, then aliases) -> its pool (`a+b` when shared)."""
    assert spec.gateway is not None
    out = {name: target(pools) for model, pools in model_pools(spec).items() for name in spec.served_names(model)}
    out.update(spec.gateway.aliases)
    return out


def split(spec: StackSpec) -> dict[str, dict[str, float]]:
    """Model -> {pool: percent of its requests} for every model served by more than one pool."""
    g = spec.gateway
    assert g is not None
    out: dict[str, dict[str, float]] = {}
    for model, pools in model_pools(spec).items():
        if len(pools) > 1:
            weights = {p: g.pool_weights.get(p, 1) for p in pools}
            total = sum(weights.values())
            out[model] = {p: round(100 * w / total, 1) for p, w in weights.items()}
    return out


def server_weights(spec: StackSpec, pools: Sequence[str]) -> dict[str, int]:
    """nginx `weight=` per server of each pool, so that a pool's servers together carry its poolWeight."""
    g = spec.gateway
    assert g is not None
    counts = {p: max(1, len(instances(spec, p))) for p in pools}
    common = math.lcm(*counts.values())
    return {p: g.pool_weights.get(p, 1) * common // counts[p] for p in pools}


def path_routes(spec: StackSpec) -> dict[str, str | None]:
    """Prefix -> the pool it pins, with `/v1/` -> None (routed by model)."""
    assert spec.gateway is not None
    return {"/v1/": None, **spec.gateway.path_routes}


def exposed_paths(spec: StackSpec) -> list[str]:
    """Every path the gateway serves (exact matches); everything else is a 404."""
    return [f"{prefix}{endpoint}" for prefix in path_routes(spec) for endpoint in (*MODEL_ENDPOINTS, "models")]


def affinity_locations(spec: StackSpec) -> dict[str, str]:
    """Named location -> the affinity pool it proxies to (gateway.lua hashes the request's key for those)."""
    return {f"{kind}{pool}": pool for pool in affinity_pools(spec) for kind in ("@llm_pool_", "@llm_alias_")}


def upstream_servers(spec: StackSpec, pool: str) -> list[tuple[str, int]]:
    """(address, port) of every instance of a pool: the head node serves the OpenAI API."""
    return [(spec.node(i.head).address, i.port) for i in instances(spec, pool)]


def context_length(spec: StackSpec, pool: str) -> int:
    """The longest request a pool's servers accept (the engine's own setting: maxModelLen, sessionLen, ...)."""
    return engine_for(spec.pools[pool]).context_length(spec, pool)


def routes_table(spec: StackSpec) -> dict[str, object]:
    """routes.json, the table gateway.lua reads: names -> [pool label, {pool: true}, location, rewrite-to],
    listing, allowlists."""
    g = spec.gateway
    assert g is not None
    by_model = model_pools(spec)
    models: dict[str, list[object]] = {}
    listing: dict[str, list[str]] = {pool: [] for pool in spec.pools}
    meta: dict[str, list[object]] = {}
    for model, pools in by_model.items():
        location = f"@llm_pool_{pools[0]}" if len(pools) == 1 else f"@llm_model_{model}"
        first = spec.served_names(model)[0]
        # A server that answers to its first name only (LMDeploy) gets the others rewritten to it.
        one_name = any(engine_for(spec.pools[p]).one_served_name for p in pools)
        for name in spec.served_names(model):
            models[name] = [
                target(pools),
                {p: True for p in pools},
                location,
                first if one_name and name != first else "",
            ]
            for pool in pools:
                listing[pool].append(name)
            meta[name] = [spec.models[model].path, context_length(spec, pools[0])]
    for alias, pool in g.aliases.items():
        # An alias names one pool: the engine only knows its served names, so the body goes out with the first.
        model = spec.pools[pool].model
        models[alias] = [pool, {pool: True}, f"@llm_alias_{pool}", spec.served_names(model)[0]]
        listing[pool].append(alias)
        meta[alias] = [spec.models[model].path, context_length(spec, pool)]
    allow: dict[str, dict[str, bool]] = {}
    for k in g.api_keys:
        if k.models:
            allowed = [n for m in k.models for n in (listing.get(m) or [m])]
            allow[k.id] = {n: True for n in allowed}
    order = [g.default_pool] + [p for p in spec.pools if p != g.default_pool]
    return {
        "auth": g.auth,
        "models": models,
        "listing": listing,
        "meta": meta,
        "order": order,
        "prefixes": dict(g.path_routes),
        "allow": allow,
        **({"affinity": affinity} if (affinity := affinity_locations(spec)) else {}),
    }
