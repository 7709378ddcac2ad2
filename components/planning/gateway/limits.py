"""The gateway's per-key limits, generated from the stack (no Pulumi): request rates (limit_req),
concurrency caps (limit_conn), each grouped into one nginx zone per distinct limit, and token budgets
(gateway_budget.lua), with the headers their refusals carry."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

from components.planning.gateway.keys import DEFAULT_KEY_ID
from components.spec.gateway import ApiKeySpec, RateLimitSpec, TokenBudgetSpec
from components.spec.stack import StackSpec

T = TypeVar("T")

BUDGET_ZONE = "llm_budget"
# A count's share of that lua_shared_dict: the slab slot of the longest count, "<63-character key
# id>/<window seconds>" (ngx_http_lua_shdict's 76 bytes of node, the key, 8 of value: 147, in 256).
BUDGET_COUNT_BYTES = 256


def nginx_rate(limit: RateLimitSpec) -> str:
    """limit_req_zone's rate: whole requests per second, else per minute (the spec guarantees one)."""
    rps = limit.requests_per_second
    if abs(rps - round(rps)) < 1e-9:
        return f"{round(rps)}r/s"
    return f"{round(rps * 60)}r/m"


def _per_key(spec: StackSpec, own: Callable[[ApiKeySpec], T | None], default: T | None) -> dict[str, T | None]:
    """Key id -> its own value or the stack's default (keys are `default` alone when none are stated)."""
    g = spec.gateway
    assert g is not None
    if not g.auth:
        return {}  # limits are per key (the spec refuses limits without auth)
    return {k.id: own(k) or default for k in g.api_keys} if g.api_keys else {DEFAULT_KEY_ID: default}


def _zones(values: Mapping[str, T | None], group: Callable[[T], Hashable]) -> list[tuple[T, list[str]]]:
    """One zone per distinct limit, with the key ids it limits (stack order); unlimited keys in none."""
    zones: dict[Hashable, tuple[T, list[str]]] = {}
    for key_id, value in values.items():
        if value is not None:
            zones.setdefault(group(value), (value, []))[1].append(key_id)
    return list(zones.values())


def rate_zones(spec: StackSpec) -> list[tuple[RateLimitSpec, list[str]]]:
    """One limit_req zone per distinct (rate, burst), with the key ids it limits (stack order)."""
    g = spec.gateway
    assert g is not None
    return _zones(
        _per_key(spec, lambda k: k.rate_limit, g.default_rate_limit), lambda limit: (nginx_rate(limit), limit.burst)
    )


def concurrency_zones(spec: StackSpec) -> list[tuple[int, list[str]]]:
    """One limit_conn zone per distinct cap, with the key ids it caps (stack order)."""
    g = spec.gateway
    assert g is not None
    return _zones(_per_key(spec, lambda k: k.max_concurrent, g.default_max_concurrent), lambda cap: cap)


def token_budgets(spec: StackSpec) -> dict[str, TokenBudgetSpec]:
    """Key id -> its token budget (its own or defaultTokenBudget), for the keys that have one."""
    g = spec.gateway
    assert g is not None
    return {k: b for k, b in _per_key(spec, lambda k: k.token_budget, g.default_token_budget).items() if b}


def budget_zone_kib(spec: StackSpec) -> int:
    """The shared dict's size: two counts of every key with a budget (its window's, and the one a reload
    that changed its window leaves until that window ends), 5 % for the slab allocator, rounded up to
    a power of two MiB: a reload that resizes the zone starts every count at 0, so adding keys should
    seldom do it."""
    need = len(token_budgets(spec)) * 2 * BUDGET_COUNT_BYTES * 1.05 / 1024
    size = 1024
    while size < need:
        size *= 2
    return size


def budget_init(spec: StackSpec) -> str:
    """gateway_budget.init's call in init_by_lua: the zone, and key id -> {tokens, window seconds}."""
    table = ", ".join(f'["{key_id}"] = {{{b.tokens}, {b.window_seconds}}}' for key_id, b in token_budgets(spec).items())
    return f'require("gateway_budget").init("{BUDGET_ZONE}", {{{table}}})'


def retry_after_seconds(limit: RateLimitSpec) -> int:
    """Retry-After of a 429 from the rate limit: the time the bucket takes to admit one more request."""
    return max(1, math.ceil(1 / limit.requests_per_second - 1e-9))


def reset_interval(limit: RateLimitSpec) -> str:
    """x-ratelimit-reset-requests, OpenAI's spelling of a duration: "50ms", "1s", "1m0s"."""
    ms = round(1000 / limit.requests_per_second)
    if ms < 1000:
        return f"{ms}ms"
    seconds = math.ceil(ms / 1000)
    return f"{seconds // 60}m{seconds % 60}s" if seconds >= 60 else f"{seconds}s"
