"""The gateway's nginx + Lua configuration and its key scripts, generated from the stack (no Pulumi).

One OpenAI endpoint for every pool:
- POST /v1/chat/completions, /v1/completions, /v1/embeddings go to the pool whose served names (or
  aliases) hold the body's `model`; each path-route prefix (`/smart/v1/`) accepts its pool's models
  only; GET /v1/models is answered by the gateway; every other path is a JSON 404, so vLLM's
  /metrics, /health, /load, /tokenize… are never reachable through it.
- API keys: nginx never sees a key in its config; the Lua module (gateway.lua) hashes the presented
  key and looks the digest up in a `sha256 -> key id` file it reads when nginx starts (each worker
  remembers the headers that held a known key until nginx reloads, as a key's revocation does).
  Missing or unknown key: 401 (before the body is read); per-key limit_req zones: 429; per-key model
  allowlists: 403.
- Per pool: least_conn over the replicas (a shared zone, so every worker sees the same counts and
  failures), passive health with max_fails/fail_timeout, keepalive, unbuffered streaming, the pool's
  read timeout, and retries on connection errors only: `proxy_next_upstream error timeout` without
  `non_idempotent` never re-sends a POST that reached a replica (nginx docs, proxy_next_upstream:
  "requests with a non-idempotent method (POST, LOCK, PATCH) are not passed to the next server if a
  request has been sent to an upstream server").
- One JSON line per request (the usage log) with the key id (never the key), model, pool, upstream,
  status, times, bytes and the response's token usage, in a file a day on the host, and the
  Prometheus metrics counted from the same request: both kept by gateway_metrics.lua in the log
  phase (every request, refusals and nginx's own errors too), written and merged once a second,
  served by nginx on the cluster address (gateway.metricsPort, plain HTTP) at /metrics.
- `auth: false` (a lab only; the policy pack refuses it by default): no key lookup, no 401, no keys.
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from components.engines.registry import engine_for
from components.planning.gateway.image import (
    LUA_CPATHS,
    LUA_MODULE,
    LUA_PATHS,
    MODULES_DIR,
    NDK_MODULE,
    WORKER_UID,
)
from components.planning.gateway.upstreams import engine_server, upstream_keepalive_seconds
from components.planning.monitoring.prometheus import host_port
from components.planning.nodes.scripts import put_files_lines
from components.spec.gateway import ApiKeySpec, RateLimitSpec, TokenBudgetSpec
from components.spec.stack import StackSpec
from components.spec.topology import instances

T = TypeVar("T")

LUA_SOURCE = Path(__file__).with_name("lua") / "gateway.lua"
# The token budgets' Lua module (module `gateway_budget`), loaded only when a key has a budget.
BUDGET_SOURCE = LUA_SOURCE.with_name("gateway_budget.lua")
BUDGET_ZONE = "llm_budget"
# A count's share of that lua_shared_dict: the slab slot of the longest count, "<63-character key
# id>/<window seconds>" (ngx_http_lua_shdict's 76 bytes of node, the key, 8 of value: 147, in 256).
BUDGET_COUNT_BYTES = 256
# The usage record and the metrics (module `gateway_metrics`), and its shared dict of counters.
METRICS_SOURCE = LUA_SOURCE.with_name("gateway_metrics.lua")
METRICS_ZONE = "llm_metrics"
# Seconds; LLM requests run from milliseconds (refusals, short embeddings) up to the pools' readTimeoutSeconds.
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0)
# Each worker writes its usage lines and merges its counts this often (and when it exits).
USAGE_FLUSH_SECONDS = 1
# ... or as soon as it holds this many lines, as nginx's buffered access_log writes a full buffer: a
# busy gateway's whole second of lines (25k at the bench's rate, ~10 MB) written at once held its
# worker long enough to put ~45 ms on the bench's p99 (47 ms, 2.7 ms with the bound).
USAGE_MAX_PENDING = 512
USAGE_PRUNE_SECONDS = 3600
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# The image's NDK and Lua modules, NDK's first: the Lua module links against it.
LUA_MODULES = (f"{MODULES_DIR}/{NDK_MODULE}", f"{MODULES_DIR}/{LUA_MODULE}")

# Endpoints routed by `model` (POST) under /v1/ and under every path-route prefix.
MODEL_ENDPOINTS = ("chat/completions", "completions", "embeddings")
DEFAULT_KEY_ID = "default"
# Where the gateway host keeps its generated keys: keys.json (id -> key, 0600, the operator's copy)
# outside the directory mounted into the container, which holds only the digests.
HOST_KEYS_DIR = "/etc/llm-cluster/gateway"
HOST_DIGESTS_DIR = f"{HOST_KEYS_DIR}/nginx"
# The rest of the gateway's host files, each directory mounted read-only into the container, so a
# changed file is an update of the command that writes it, which reloads nginx (never a new container):
HOST_CONF_DIR = f"{HOST_KEYS_DIR}/conf"  # nginx.conf, the Lua module, the routing table
HOST_TLS_DIR = f"{HOST_KEYS_DIR}/tls"  # cert.pem, key.pem (0600)
HOST_CA_DIR = f"{HOST_KEYS_DIR}/ca"  # the private CA of generated certificates; its key never leaves
CONTAINER_CONF_DIR = "/etc/llm-gateway"
CONTAINER_KEYS_DIR = "/etc/llm-gateway-keys"
CONTAINER_TLS_DIR = "/etc/llm-gateway-tls"
# Certificates the gateway host makes: valid 397 days (what browsers accept), renewed by any
# deployment within 30 days of expiry; the CA for 10 years.
CERT_DAYS = 397
CERT_RENEW_DAYS = 30
CA_DAYS = 3650
DIGESTS_FILE = "key-hashes.json"
CONTAINER_NAME = "llm-gateway"
# nginx `map` keywords: a key id spelled like one must be escaped to be matched literally.
_MAP_KEYWORDS = {"default", "hostnames", "include", "volatile"}


@dataclass(frozen=True)
class GatewayLayout:
    """Where nginx runs: paths and listener. The container's by default; tests use a temp prefix."""

    port: int
    listen_address: str = ""
    """Empty: every address (host network); tests bind 127.0.0.1."""
    conf_dir: str = "/etc/nginx"
    load_modules: tuple[str, ...] = LUA_MODULES
    """The NDK and Lua modules, in load order: the image's; tests: the unpacked packages'."""
    lua_path: str = ";".join(LUA_PATHS)
    """Where resty.core and resty.lrucache are (`…/?.lua`, `;`-separated): the image's; tests: the tree's."""
    lua_cpath: str = ";".join(LUA_CPATHS)
    """Where cjson is (`…/?.so`): the image's; tests: the tree's."""
    digests_file: str = f"/etc/nginx/llm-keys/{DIGESTS_FILE}"
    tls_dir: str = "/etc/nginx/llm-tls"
    pid_file: str = "/var/run/nginx.pid"
    error_log: str = "/dev/stderr"
    usage_dir: str | None = None
    """The usage log as one file a day (usage-YYYY-MM-DD.log, UTC) in this directory, pruned by
    gateway.usageLog's retention; None: counted in the metrics, written nowhere."""
    metrics_listen: str | None = None
    """host:port of GET /metrics (the container's: the node's cluster address); None: not served."""
    temp_dir: str | None = None
    """Client body / proxy temp paths; None keeps the build's defaults."""
    user: str | None = "nginx"
    """Worker user (the image has `nginx`); None when nginx does not start as root."""
    worker_processes: str = "auto"

    @property
    def lua_dir(self) -> str:
        """Where the gateway's Lua modules (gateway.lua, …) are inside the container."""
        return f"{self.conf_dir}/llm"

    @property
    def routes_file(self) -> str:
        """The generated routing table (read when nginx starts) inside the container."""
        return f"{self.conf_dir}/llm/routes.json"


def container_layout(spec: StackSpec) -> GatewayLayout:
    """The layout of the gateway container: host network, the stack's port, config from host mounts."""
    g = spec.gateway
    assert g is not None
    return GatewayLayout(
        port=g.port,
        conf_dir=CONTAINER_CONF_DIR,
        digests_file=f"{CONTAINER_KEYS_DIR}/{DIGESTS_FILE}",
        tls_dir=CONTAINER_TLS_DIR,
        usage_dir=g.usage_log.dir,
        metrics_listen=metrics_address(spec),
    )


def nginx_argv() -> list[str]:
    """The gateway container's command: nginx in the foreground on the mounted config."""
    return ["nginx", "-c", f"{CONTAINER_CONF_DIR}/nginx.conf", "-g", "daemon off;"]


def key_ids(spec: StackSpec) -> list[str]:
    """Key ids of the stack: the apiKeys' ids, or `default` when none are stated; none without auth."""
    assert spec.gateway is not None
    if not spec.gateway.auth:
        return []
    return [k.id for k in spec.gateway.api_keys] or [DEFAULT_KEY_ID]


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


def upstream_servers(spec: StackSpec, pool: str) -> list[tuple[str, int]]:
    """(address, port) of every instance of a pool: the head node serves the OpenAI API."""
    return [(spec.node(i.head).address, i.port) for i in instances(spec, pool)]


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
    }


def key_digests(keys: Mapping[str, str], ids: Sequence[str]) -> str:
    """The file gateway.lua reads: {sha256(key): id} for exactly the stack's ids; refuses gaps and extras."""
    missing = [i for i in ids if not keys.get(i)]
    extra = sorted(set(keys) - set(ids))
    if missing or extra:
        raise ValueError(
            "gatewayApiKeys must hold one key for each gateway key id "
            f"({', '.join(ids)}); missing: {', '.join(missing) or 'none'}, "
            f"not in the stack: {', '.join(extra) or 'none'}"
        )
    digests = {hashlib.sha256(keys[i].encode()).hexdigest(): i for i in ids}
    if len(digests) != len(ids):
        raise ValueError("gatewayApiKeys gives the same key to two ids; each id needs its own key")
    return json.dumps(digests, indent=1, sort_keys=True) + "\n"


def _json_error(message: str, code: str, type_: str) -> str:
    """An OpenAI-style error body as a single-quoted nginx string."""
    body = json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})
    # nginx unescapes \" and \' inside quoted strings, which would break the JSON: keep both out.
    assert not set("'\\") & set(body), body
    return f"'{body}'"


@dataclass(frozen=True)
class ErrorPage:
    """A response nginx produces itself (no Lua, no replica), always an OpenAI-style JSON error."""

    status: int
    """The status the client sees (nginx's internal 494/497/503 become 431/400/429)."""
    message: str
    code: str
    type: str = "invalid_request_error"


# Every status nginx can answer by itself in this config, by the status nginx raises internally.
# Not 408: a client silent past client_header_timeout / client_body_timeout is dropped without an
# answer (ngx_http_finalize_request terminates a request finalized with 408), only logged as 408.
ERRORS: dict[int, ErrorPage] = {
    400: ErrorPage(400, "The request could not be parsed (malformed request line, header or path).", "bad_request"),
    401: ErrorPage(401, "Missing or invalid API key: send the header Authorization: Bearer <key>.", "invalid_api_key"),
    404: ErrorPage(
        404,
        "Unknown path: the gateway serves POST /v1/chat/completions, /v1/completions, "
        "/v1/embeddings and GET /v1/models.",
        "not_found",
    ),
    405: ErrorPage(405, "Method not allowed on this path; see the Allow header.", "method_not_allowed"),
    411: ErrorPage(411, "A request body needs Content-Length or chunked Transfer-Encoding.", "length_required"),
    413: ErrorPage(413, "Request body too large.", "request_too_large"),
    414: ErrorPage(414, "Request URI too long.", "uri_too_long"),
    429: ErrorPage(
        429,
        "Rate limit reached for this API key; retry after the seconds in Retry-After.",
        "rate_limit_exceeded",
        "requests",
    ),
    # limit_conn answers 503 (limit_conn_status): the concurrency cap, sent as a 429 of its own.
    503: ErrorPage(
        429,
        "Too many concurrent requests for this API key; wait for one to finish.",
        "concurrency_limit_exceeded",
        "requests",
    ),
    494: ErrorPage(431, "Request headers too large.", "headers_too_large"),
    497: ErrorPage(400, "This port speaks HTTPS: use https://.", "https_required"),
    500: ErrorPage(500, "The gateway failed to handle the request.", "internal_error", "server_error"),
    501: ErrorPage(501, "Unsupported Transfer-Encoding.", "not_implemented"),
    502: ErrorPage(
        502, "No replica of the model pool could be reached; retry later.", "upstream_unavailable", "server_error"
    ),
    504: ErrorPage(504, "The model pool did not answer in time.", "upstream_timeout", "server_error"),
    505: ErrorPage(505, "HTTP version not supported: use HTTP/1.1.", "http_version_not_supported"),
}

# A token budget used up: gateway_budget.admit refuses (nginx returns this internal status), and the
# error page answers 429 with the headers' values admit set.
BUDGET_REFUSED = 439
BUDGET_ERROR = ErrorPage(
    429,
    "Token budget reached for this API key ($llm_tb_limit tokens in this window); "
    "retry after the seconds in Retry-After.",
    "rate_limit_exceeded",
    "tokens",
)

# Error pages are internal locations with a URI, not named ones: nginx cannot redirect a request
# whose request line it could not parse (no URI) to a named location.
ERROR_PREFIX = "/_llm_error/"


def error_page(raised: int) -> str:
    """The error_page directive of a status nginx raises; `=status` where the client sees another."""
    page = BUDGET_ERROR if raised == BUDGET_REFUSED else ERRORS[raised]
    overwrite = f"={page.status} " if page.status != raised else ""
    return f"        error_page {raised} {overwrite}{ERROR_PREFIX}{raised};"


# Allow of a 405 nginx answers itself (TRACE, or a method it refuses before Lua runs), by path.
ALLOW_MODELS = "GET, HEAD"
ALLOW_ENDPOINTS = "POST"


def _error_locations(max_body_mib: int, budgets: bool) -> list[str]:
    lines = []
    pages = {**ERRORS, BUDGET_REFUSED: BUDGET_ERROR} if budgets else ERRORS
    for raised, page in pages.items():
        message = page.message
        if raised == 413:
            message = f"Request body too large: the gateway accepts at most {max_body_mib} MiB."
        lines += [
            f"        location = {ERROR_PREFIX}{raised} {{",
            "            internal;",
            "            default_type application/json;",
        ]
        if raised == 401:
            lines.append('            add_header WWW-Authenticate "Bearer" always;')
        if raised == 405:
            lines.append("            add_header Allow $llm_allow always;")
        if raised == 429:
            # The headers OpenAI clients read to back off (the bucket's rate per minute, nothing left).
            lines += [
                "            add_header Retry-After $llm_rl_retry_after always;",
                "            add_header x-ratelimit-limit-requests $llm_rl_per_minute always;",
                "            add_header x-ratelimit-remaining-requests 0 always;",
                "            add_header x-ratelimit-reset-requests $llm_rl_reset always;",
            ]
        if raised == 503:
            lines.append("            add_header Retry-After 1 always;")
        if raised == BUDGET_REFUSED:
            lines.append("            add_header Retry-After $llm_tb_retry_after always;")
        if budgets:
            # What is left of a key's budget, on nginx's own answers too (a 502, a rate limit's 429).
            lines += _budget_headers()
        lines += [f"            return {page.status} {_json_error(message, page.code, page.type)};", "        }"]
    return lines


LOG_FORMAT = (
    '"time":"$time_iso8601","status":$status,"request_time":$request_time,"upstream_status":"$upstream_status",'
    '"method":"$request_method","upstream":"$upstream_addr","completed":"$request_completion",'
    '"upstream_time":"$upstream_response_time","request_bytes":$request_length,"response_bytes":$bytes_sent,'
    '"path":"$request_uri"'
)
"""nginx's part of a usage line ($llm_usage_line, composed in C): gateway_metrics.lua record() puts
the request path's part before it, `{"request_id":"…","key_id":"…","pool":"…","model":"…",` the
three token counts and `"events":N,` (USAGE_LINE_FIELDS), from what the router and the usage filter
kept of the request (gateway_metrics.routed), and after it `}` (or `,"budget_tokens":N}`): one JSON
object per request, one line.

Token counts are JSON numbers, or null when the response had no usage. `completed` is "OK" when the
whole response reached the client and "" when it was cut (the client went away mid-stream, or the
replica died mid-answer); `events` counts the stream events the client was sent, so a cut stream
still says what it was served. Client-chosen fields (path, model) are cut to LOG_FIELD_MAX bytes so
that a line stays short, and JSON-escaped: the model by gateway.lua as it routes, the path by
gateway_metrics.lua. With token budgets, gateway_metrics.lua adds "budget_tokens" (the tokens
charged; null: none) at the end.

record() reads the labels it needs from nginx's part by position, so the order is part of the
contract between the two: "time" (25 bytes) and "status" (3 digits) at fixed offsets, then each
value it reads found by a search for the one byte that ends it; the path, the client's own bytes,
last, so that every byte before it is nginx's."""
USAGE_LINE_FIELDS = (
    "request_id",
    "key_id",
    "pool",
    "model",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "events",
)

# Client-controlled text in a log line is cut to this many characters (a line stays < 2 KiB).
LOG_FIELD_MAX = 256
# The token counts of a response's `usage` object, each a log field `<kind>_tokens`.
USAGE_COUNTS = ("prompt", "completion", "total")
# The three count fields of a usage line whose response had no usage (gateway_metrics.lua NO_COUNTS).
NO_USAGE_COUNTS = ",".join(f'"{kind}_tokens":null' for kind in USAGE_COUNTS)
# Attempts per request (first + retries), so one request that makes every replica fail cannot take
# a whole large pool out of service.
MAX_TRIES = 3


def failure_statuses(spec: StackSpec, pool: str) -> list[int]:
    """Replica statuses counted as failures (retried elsewhere, toward maxFails): 5xx and not-ready."""
    return sorted({500, 502, 503, 504, *engine_server(spec.pools[pool].engine).not_ready_statuses})


def pool_keepalive_seconds(spec: StackSpec, pool: str) -> int:
    """nginx's idle timeout for a pool's upstream connections, shorter than its engine server's."""
    p = spec.pools[pool]
    return upstream_keepalive_seconds(p.engine, p.env)


def temp_path_directives(temp_dir: str | Path) -> list[str]:
    """Each of nginx's temp paths under temp_dir: the built-in ones (/var/lib/nginx/...) exist only where
    the nginx package was installed, and nginx will not start when one is missing."""
    return [f"{kind}_temp_path {temp_dir}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")]


def nginx_conf(
    spec: StackSpec, layout: GatewayLayout, upstreams: Mapping[str, Sequence[tuple[str, int]]] | None = None
) -> str:
    """nginx.conf for the gateway; `upstreams` (pool -> [(host, port)]) replaces the stack's replicas."""
    g = spec.gateway
    assert g is not None
    servers = {pool: list((upstreams or {}).get(pool) or upstream_servers(spec, pool)) for pool in spec.pools}
    budgets = token_budgets(spec)
    listen = f"{layout.listen_address}:{layout.port}" if layout.listen_address else str(layout.port)
    out = [
        "# Generated by llm-cluster from the stack; change Pulumi.<stack>.yaml, not this file.",
        *(f"load_module {module};" for module in layout.load_modules),
    ]
    if layout.user:
        out.append(f"user {layout.user};")
    out += [
        f"worker_processes {layout.worker_processes};",
        # The one regular expression (the Allow map of 405 answers) compiled to machine code.
        "pcre_jit on;",
        f"pid {layout.pid_file};",
        f"error_log {layout.error_log} warn;",
        "",
        "events {",
        "    worker_connections 16384;",
        "}",
        "",
        "http {",
        "    server_tokens off;",
        # A gateway request allocates 8-16 KB from its pool: from the default 4k pool, three more
        # malloc/free pairs a request (bench/gateway_instructions.py; docs/perf/gateway.md).
        "    request_pool_size 16k;",
        "    default_type application/json;",
        "    tcp_nodelay on;",
        "    keepalive_timeout 75s;",
        "    keepalive_requests 10000;",
        "    # Lua reads `model` from the body: whole, and in memory (but a chunked body whose encoding",
        "    # outgrows the buffer: gateway.lua reads nginx's temp file then).",
        f"    client_max_body_size {g.max_body_mib}m;",
        f"    client_body_buffer_size {g.max_body_mib}m;",
        "    client_body_in_single_buffer on;",
        # A client silent this long while sending its request is dropped (nginx closes, logs 408).
        f"    client_header_timeout {g.client_timeout_seconds}s;",
        f"    client_body_timeout {g.client_timeout_seconds}s;",
    ]
    if layout.temp_dir:
        out += [f"    {line}" for line in temp_path_directives(layout.temp_dir)]
    out += [
        "",
        *_lua_directives(spec, layout),
        *_request_variables(),
        *(_budget_directives(spec) if budgets else []),
        *_usage_directives(spec, layout),
        "",
    ]

    out += _maps(spec)
    zones = rate_zones(spec)
    caps = concurrency_zones(spec)
    out += _limit_zones(
        "req",
        [f"rate={nginx_rate(limit)}" for limit, _ in zones],
        [ids for _, ids in zones],
        [
            "    # Per-key rate limits: one zone per (rate, burst); a key outside a zone maps to ''",
            "    # there, and limit_req does not count empty keys.",
            "    limit_req_status 429;",
        ],
    )
    out += _limit_zones(
        "conn",
        ["" for _ in caps],
        [ids for _, ids in caps],
        [
            "    # Per-key concurrency caps: limit_conn counts a request until its last byte is sent.",
            "    # Its 503 is turned into a 429 of its own (error_page 503 =429).",
            "    limit_conn_status 503;",
        ],
    )
    out.append("")

    for pool, addrs in servers.items():
        out += _upstream(spec, f"llm_pool_{pool}", [pool], {pool: addrs}, {pool: 1})
    for model, pools in model_pools(spec).items():
        if len(pools) > 1:
            # One group over every pool serving the model: a pool's servers carry its poolWeight.
            out += _upstream(spec, f"llm_model_{model}", pools, servers, server_weights(spec, pools))

    if g.tls and g.http_redirect_port is not None:
        plain = (
            f"{layout.listen_address}:{g.http_redirect_port}" if layout.listen_address else str(g.http_redirect_port)
        )
        # Plain HTTP only sends clients to HTTPS (308 keeps the method and body).
        out += [
            "    server {",
            f"        listen {plain};",
            f"        server_name {g.node};",
            f"        return 308 https://$host:{layout.port}$request_uri;",
            "    }",
            "",
        ]
    out += ["    server {", f"        listen {listen}{' ssl' if g.tls else ''};"]
    if g.tls:
        out += [
            f"        ssl_certificate {layout.tls_dir}/cert.pem;",
            f"        ssl_certificate_key {layout.tls_dir}/key.pem;",
            "        ssl_protocols TLSv1.2 TLSv1.3;",
            "        ssl_session_cache shared:llm_tls:10m;",
        ]
    # $host of a request without a Host (HTTP/1.0): the Host replicas get (HTTP/1.1 requires one) and
    # the redirect's. A server's name costs nothing per request.
    out.append(f"        server_name {g.node};")
    out += [
        "        set_by_lua_block $llm_key_id { return package.loaded.gateway.key_id() }",
        *(error_page(raised) for raised in (*ERRORS, *([BUDGET_REFUSED] if budgets else []))),
        "",
    ]
    guard = ['            if ($llm_key_id = "") {', "                return 401;", "            }"] if g.auth else []
    # nginx refuses `burst=0`: without a burst the zone's rate alone applies.
    guard += [
        f"            limit_req zone=llm_rl_{i}" + (f" burst={limit.burst} nodelay;" if limit.burst else ";")
        for i, (limit, _) in enumerate(zones)
    ]
    guard += [f"            limit_conn llm_cc_{i} {cap};" for i, (cap, _) in enumerate(caps)]
    # A used-up token budget is refused after the key check (its `if`, then admit and its `if`, run
    # in the rewrite phase in this order) and before the rate limits count the request (preaccess);
    # the router's own refusals carry the budget's headers too.
    refuse = (
        [
            "            set_by_lua_block $llm_budget_refused { return package.loaded.gateway_budget.admit() }",
            "            if ($llm_budget_refused) {",
            f"                return {BUDGET_REFUSED};",
            "            }",
            *_budget_headers(),
        ]
        if budgets
        else []
    )
    for prefix, pin in path_routes(spec).items():
        for endpoint in MODEL_ENDPOINTS:
            out += [
                f"        location = {prefix}{endpoint} {{",
                *guard,
                *refuse,
                f"            content_by_lua_block {{ {route_call(endpoint, pin)} }}",
                "        }",
            ]
        out += [
            f"        location = {prefix}models {{",
            *guard,
            "            content_by_lua_block { package.loaded.gateway.models() }",
            "        }",
        ]
    out += ["", "        location / {", "            return 404;", "        }", ""]

    aliased = set(g.aliases.values())
    for pool in spec.pools:
        proxy = _proxy_block(spec, f"llm_pool_{pool}", [pool]) + (_budget_headers() if budgets else [])
        out += [f"        location @llm_pool_{pool} {{", *proxy, "        }"]
        if pool in aliased:
            out += [
                f"        location @llm_alias_{pool} {{",
                "            proxy_set_body $llm_body;",
                *proxy,
                "        }",
            ]
    for model, pools in model_pools(spec).items():
        if len(pools) > 1:
            out += [
                f"        location @llm_model_{model} {{",
                *_proxy_block(spec, f"llm_model_{model}", pools),
                *(_budget_headers() if budgets else []),
                "        }",
            ]
    out += ["", *_error_locations(g.max_body_mib, bool(budgets)), "    }", *_metrics_server(layout), "}", ""]
    return "\n".join(out)


def route_call(endpoint: str, pin: str | None) -> str:
    """A routing location's handler: gateway.lua's route() with the engine endpoint the location
    proxies to and the pool its path route pins."""
    args = _lua_string(f"/v1/{endpoint}") + (f", {_lua_string(pin)}" if pin else "")
    return f"package.loaded.gateway.route({args})"


def _lua_string(text: str) -> str:
    """A path as a double-quoted Lua string inside nginx.conf (nothing in it that either would unescape)."""
    assert not set('"\\') & set(text), text
    return f'"{text}"'


# The Lua VM's settings, made in the master before it loads the modules (the workers inherit them):
# - loopunroll=60 (LuaJIT's 15, openresty/luajit2 src/lj_jit.h): at 15 plain_model's loops abort its
#   trace, and some worker starts then run it interpreted for their whole life.
# - setpause 400 (200: luaconf.h LUAI_GCPAUSE, the deployed LuaJIT's, tests/test_gateway_nginx.py): a
#   collection when the heap is 4x what the last one left live, not 2x: half the cycles a request.
# Both measured by bench/gateway_instructions.py (the runs: docs/perf/gateway.md).
LUA_VM_SETTINGS = 'jit.opt.start("loopunroll=60") collectgarbage("setpause", 400)'


def _lua_directives(spec: StackSpec, layout: GatewayLayout) -> list[str]:
    """Where the Lua modules are, and gateway.lua's tables read once per start (and per reload)."""
    g = spec.gateway
    assert g is not None
    digests = _lua_string(layout.digests_file) if g.auth else "nil"
    out = [f'    lua_package_path "{layout.lua_dir}/?.lua;{layout.lua_path + ";" if layout.lua_path else ""};";']
    if layout.lua_cpath:
        out.append(f'    lua_package_cpath "{layout.lua_cpath};;";')
    budgets = f" {budget_init(spec)}" if token_budgets(spec) else ""
    # Every module loaded here, in the master: the workers (another user) inherit them read, and the
    # request handlers take them from package.loaded, a table lookup where require() is a C call on
    # every handler entry (bench/gateway_instructions.py; docs/perf/gateway.md).
    return out + [
        f'    init_by_lua_block {{ {LUA_VM_SETTINGS} require("gateway").init({_lua_string(layout.routes_file)}, {digests})'
        f'{budgets} require("gateway_metrics") }}'
    ]


# The variables the request path sets (ngx.var, set_by_lua) for nginx's own directives (limits, an
# alias's body, X-Request-Id) and the log phase, with the value a request has until then.
REQUEST_VARIABLES = {"llm_key_id": "", "llm_body": "", "llm_request_id": ""}


def _request_variables() -> list[str]:
    """Each request variable declared by a `map` of its default. A map's variable is changeable
    and keeps a value set in it, across ngx.exec and error_page redirects alike (a server-level
    `set` would run again on an error page's redirect and blank them), and it reads as its default
    in a request that never reached the rewrite phase (a 408 on headers), where a `set` variable
    would be "uninitialized": no value, and a warning per request in the error log."""
    return [
        "    # What gateway.lua sets for the log phase: a default in every request, kept across redirects.",
        *(f"    map \"\" ${name} {{ default '{value}'; }}" for name, value in REQUEST_VARIABLES.items()),
        # ngx.var assigns only a variable nginx has indexed, i.e. one a directive names: this
        # format, never written, names every one of them whatever the log phase reads.
        f"    log_format llm_request_variables '{' '.join(f'${name}' for name in REQUEST_VARIABLES)}';",
    ]


def _budget_directives(spec: StackSpec) -> list[str]:
    """The shared dict of token counts, and the variables of the budget headers (gateway_budget.lua)."""
    return [
        "",
        "    # Token budgets per key per window (gateway_budget.lua): one count per key, the same for",
        "    # every worker, kept across reloads (a zone keeps its counts while its size is unchanged).",
        f"    lua_shared_dict {BUDGET_ZONE} {budget_zone_kib(spec)}k;",
        "    # The x-ratelimit-*-tokens values gateway_budget.admit sets for a key with a budget ('' until",
        "    # then, and for the others: no header); maps for the reason _request_variables says.",
        *(f'    map "" $llm_tb_{name} {{ default ""; }}' for name in ("limit", "remaining", "reset", "retry_after")),
    ]


def metrics_zone_kib(spec: StackSpec) -> int:
    """llm_metrics' size: a 512-byte slot per label set (the longest key: a 256-byte model name with
    its key id, pool and status), a histogram's 17 counters per pool, +5 %, at least 1 MiB."""
    g = spec.gateway
    assert g is not None
    histograms = (len(spec.pools) + len(model_pools(spec)) + 1) * (len(DURATION_BUCKETS) + 2) * 128
    return max(1024, math.ceil((g.metrics_max_series * 512 + histograms) * 1.05 / 1024))


def _lua_value(value: object) -> str:
    """A Python number, string, list or dict as a Lua literal inside an nginx *_by_lua_block."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _lua_string(value)
    if isinstance(value, (list, tuple)):
        return "{" + ", ".join(_lua_value(v) for v in value) + "}"
    assert isinstance(value, dict), value
    return "{" + ", ".join(f"{k} = {_lua_value(v)}" for k, v in value.items()) + "}"


def metrics_settings(spec: StackSpec, layout: GatewayLayout) -> dict[str, object]:
    """What gateway_metrics.start() is given: where the usage lines go, retention, the series cap, buckets,
    and the paths the gateway serves (a line's path that is one of them needs no escaping check)."""
    g = spec.gateway
    assert g is not None
    settings: dict[str, object] = {
        "zone": METRICS_ZONE,
        "flush_seconds": USAGE_FLUSH_SECONDS,
        "max_pending": USAGE_MAX_PENDING,
        "field_max": LOG_FIELD_MAX,
        "max_series": g.metrics_max_series,
        "buckets": [[b, repr(b)] for b in DURATION_BUCKETS],
        "plain_paths": exposed_paths(spec),
    }
    if layout.usage_dir:
        settings.update(
            usage_dir=layout.usage_dir,
            prune_seconds=USAGE_PRUNE_SECONDS,
            retention_days=g.usage_log.retention_days,
            max_bytes=round(g.usage_log.max_total_gib * 2**30),
        )
    return settings


def _usage_directives(spec: StackSpec, layout: GatewayLayout) -> list[str]:
    """The usage record and the metrics (gateway_metrics.lua) at http level: every request is recorded,
    refusals and nginx's own errors too. nginx composes its part of the line (LOG_FORMAT) in C,
    Lua the rest; Lua keeps lines and counts in the worker, and a timer writes and merges them once
    a second."""
    charge = "package.loaded.gateway_budget.charge" if token_budgets(spec) else ""
    return [
        f"    map \"\" $llm_usage_line {{ default '{LOG_FORMAT}'; }}",
        "    # Counters merged from every worker's own tables; kept across reloads (same name and size).",
        f"    lua_shared_dict {METRICS_ZONE} {metrics_zone_kib(spec)}k;",
        f'    init_worker_by_lua_block {{ require("gateway_metrics").start({_lua_value(metrics_settings(spec, layout))}) }}',
        '    exit_worker_by_lua_block { require("gateway_metrics").stop() }',
        f"    log_by_lua_block {{ package.loaded.gateway_metrics.record({charge}) }}",
        # nginx's own access log would write each request again, one write() apiece.
        "    access_log off;",
    ]


def _metrics_server(layout: GatewayLayout) -> list[str]:
    """The Prometheus endpoint: GET /metrics on its own listener (the node's cluster address)."""
    if not layout.metrics_listen:
        return []
    return [
        "",
        "    server {",
        f"        listen {layout.metrics_listen};",
        "        # Scrapes are not gateway requests: neither usage lines nor counted.",
        "        log_by_lua_block { return }",
        "        location = /metrics {",
        "            content_by_lua_block { package.loaded.gateway_metrics.serve() }",
        "        }",
        "        location / {",
        "            default_type text/plain;",
        '            return 404 "llm-cluster gateway: GET /metrics\\n";',
        "        }",
        "    }",
    ]


def _budget_headers() -> list[str]:
    """The x-ratelimit-*-tokens headers, on every answer once admit has read the key's budget (empty,
    hence not sent, for a key without one, and for what nginx refuses before: a 401, a 413 by
    Content-Length)."""
    return [
        "            add_header x-ratelimit-limit-tokens $llm_tb_limit always;",
        "            add_header x-ratelimit-remaining-tokens $llm_tb_remaining always;",
        "            add_header x-ratelimit-reset-tokens $llm_tb_reset always;",
    ]


def _limit_zones(kind: str, params: Sequence[str], ids: Sequence[Sequence[str]], preamble: list[str]) -> list[str]:
    """limit_req or limit_conn zones, one per distinct limit, each keyed by a map of its key ids."""
    if not params:
        return []
    var = {"req": "rl", "conn": "cc"}[kind]
    out = [*preamble, f"    limit_{kind}_log_level warn;"]
    for i, (param, zone_ids) in enumerate(zip(params, ids)):
        out += _key_map(f"$llm_{var}_{i}", zone_ids)
        out.append(f"    limit_{kind}_zone $llm_{var}_{i} zone=llm_{var}_{i}:10m{' ' + param if param else ''};")
    return out


def _key_map(variable: str, ids: Sequence[str]) -> list[str]:
    """A map that is the key id for these keys and '' (not counted by nginx's limits) for others."""
    out = [f"    map $llm_key_id {variable} {{", '        default "";']
    out += [f"        {_map_literal(key_id)} $llm_key_id;" for key_id in ids]
    return out + ["    }"]


def _map_literal(key_id: str) -> str:
    """A key id as a map source: escaped when it is spelled like a map keyword."""
    return f"\\{key_id}" if key_id in _MAP_KEYWORDS else key_id


def _maps(spec: StackSpec) -> list[str]:
    """Variables computed by nginx alone (no Lua): Allow, 429 headers."""
    # On $request_uri: the error page's internal redirect has changed $uri by then.
    out = [
        "    map $request_uri $llm_allow {",
        f'        "~^[^?]*/v1/models(?:[?]|$)" "{ALLOW_MODELS}";',
        f'        default "{ALLOW_ENDPOINTS}";',
        "    }",
    ]
    zones = rate_zones(spec)
    for variable, value in (
        ("$llm_rl_retry_after", lambda lim: str(retry_after_seconds(lim))),
        ("$llm_rl_per_minute", lambda lim: str(round(lim.requests_per_second * 60))),
        ("$llm_rl_reset", reset_interval),
    ):
        out += [
            f"    map $llm_key_id {variable} {{",
            "        default 1;" if variable != "$llm_rl_reset" else '        default "1s";',
        ]
        out += [f'        {_map_literal(key_id)} "{value(limit)}";' for limit, ids in zones for key_id in ids]
        out.append("    }")
    return out


def _upstream(
    spec: StackSpec,
    name: str,
    pools: Sequence[str],
    servers: Mapping[str, Sequence[tuple[str, int]]],
    weights: Mapping[str, int],
) -> list[str]:
    """An upstream block over the servers of these pools (one pool, or the pools sharing a model)."""
    g = spec.gateway
    assert g is not None
    out = [f"    upstream {name} {{", f"        zone {name} 64k;", "        least_conn;"]
    for pool in pools:
        weight = weights[pool]
        extra = " down" if weight == 0 else (f" weight={weight}" if weight != 1 else "")
        out += [
            f"        server {host}:{port}{extra} max_fails={g.max_fails} fail_timeout={g.fail_timeout_seconds}s;"
            for host, port in servers[pool]
        ]
    idle = min(pool_keepalive_seconds(spec, pool) for pool in pools)
    if g.upstream_keepalive and idle:
        out += [
            f"        keepalive {g.upstream_keepalive};",
            # Shorter than the engine server's own idle timeout: nginx always closes first.
            f"        keepalive_timeout {idle}s;",
        ]
    return out + ["    }", ""]


def _proxy_block(spec: StackSpec, upstream: str, pools: Sequence[str]) -> list[str]:
    """The proxy directives of a named location over one upstream (one pool, or pools sharing a model)."""
    g = spec.gateway
    assert g is not None
    failures = " ".join(f"http_{status}" for status in sorted({s for p in pools for s in failure_statuses(spec, p)}))
    timeout = max(spec.pools[p].read_timeout_seconds for p in pools)
    return [
        # No variables: the URI is the routed endpoint's (gateway.lua's route() sets it when the
        # request line's differs), with the query string.
        f"            proxy_pass http://{upstream};",
        "            proxy_http_version 1.1;",
        '            proxy_set_header Connection "";',
        "            proxy_set_header Host $host;",
        "            proxy_set_header X-Request-Id $llm_request_id;",
        "            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
        "            # The client's key stays here; vLLM listens on the cluster network without one.",
        '            proxy_set_header Authorization "";',
        "            # Uncompressed, so the usage filter can read the response.",
        '            proxy_set_header Accept-Encoding "";',
        "            proxy_buffering off;",
        f"            proxy_connect_timeout {g.connect_timeout_seconds}s;",
        "            proxy_send_timeout 60s;",
        f"            proxy_read_timeout {timeout}s;",
        # Retry semantics (README, "Failover"): a request goes to another replica when the one it
        # was sent to refused it, closed or reset the connection, or answered a 5xx / not-ready
        # status, before any byte of an answer reached the client (nginx never retries after that).
        # POST too (non_idempotent): an inference request has no side effect but compute, so the
        # client still gets exactly one answer. Not after the read timeout (the window below ends
        # then): a slow generation is not run twice. These failures also count toward maxFails.
        f"            proxy_next_upstream error timeout {failures} non_idempotent;",
        f"            proxy_next_upstream_tries {MAX_TRIES};",
        f"            proxy_next_upstream_timeout {timeout}s;",
        # A replica's error that is not JSON is answered as OpenAI JSON (gateway.lua head()).
        "            header_filter_by_lua_block { package.loaded.gateway.head() }",
        "            body_filter_by_lua_block { package.loaded.gateway.usage() }",
    ]


def render_gateway(
    spec: StackSpec, layout: GatewayLayout, upstreams: Mapping[str, Sequence[tuple[str, int]]] | None = None
) -> dict[str, str]:
    """Every file the gateway container needs, by path relative to the layout's conf_dir."""
    return {
        "nginx.conf": nginx_conf(spec, layout, upstreams),
        "llm/gateway.lua": LUA_SOURCE.read_text(),
        "llm/gateway_metrics.lua": METRICS_SOURCE.read_text(),
        "llm/routes.json": json.dumps(routes_table(spec), indent=1) + "\n",
        **({"llm/gateway_budget.lua": BUDGET_SOURCE.read_text()} if token_budgets(spec) else {}),
    }


def gateway_files(spec: StackSpec) -> dict[str, str]:
    """The container's files (nginx.conf, Lua modules, routing table) for the stack as deployed."""
    return render_gateway(spec, container_layout(spec))


def keys_script(ids: Sequence[str], keys_dir: str = HOST_KEYS_DIR) -> str:
    """Make one key per id on the gateway host (kept across runs), drop others; print id -> key JSON.

    Writes keys.json (id -> key, 0600) for the operator and nginx/key-hashes.json (sha256 -> id,
    the only file mounted into the container). Files are rewritten only when their content changes.
    """
    quoted = " ".join(shlex.quote(i) for i in ids)
    d = shlex.quote(keys_dir)
    return f"""#!/usr/bin/env bash
# Gateway API keys, generated on this host and never sent anywhere but the Pulumi state (as a secret).
set -euo pipefail
umask 077
dir={d}
ids=({quoted})
mkdir -p "$dir/keys" "$dir/nginx"
for id in "${{ids[@]}}"; do
  if [ ! -s "$dir/keys/$id" ]; then
    key="sk-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \\n')"
    printf '%s\\n' "$key" > "$dir/keys/$id.new"
    mv "$dir/keys/$id.new" "$dir/keys/$id"
  fi
done
for f in "$dir/keys"/*; do
  [ -e "$f" ] || continue
  keep=0
  for id in "${{ids[@]}}"; do
    if [ "$(basename "$f")" = "$id" ]; then keep=1; fi
  done
  if [ "$keep" = 0 ]; then rm -f -- "$f"; fi
done
keys='{{'
digests='{{'
sep=''
for id in "${{ids[@]}}"; do
  key=$(cat "$dir/keys/$id")
  digest=$(printf '%s' "$key" | sha256sum | cut -d' ' -f1)
  keys+="$sep\\"$id\\": \\"$key\\""
  digests+="$sep\\"$digest\\": \\"$id\\""
  sep=', '
done
keys+='}}'
digests+='}}'
write_if_changed() {{
  if [ ! -f "$1" ] || [ "$(cat "$1")" != "$2" ]; then
    printf '%s\\n' "$2" > "$1.new"
    mv "$1.new" "$1"
  fi
}}
write_if_changed "$dir/keys.json" "$keys"
write_if_changed "$dir/nginx/{DIGESTS_FILE}" "$digests"
printf '%s\\n' "$keys"
"""


def keys_delete_script(keys_dir: str = HOST_KEYS_DIR) -> str:
    """Undo keys_script: the keys go with the gateway."""
    return f"""#!/usr/bin/env bash
set -euo pipefail
rm -rf -- {shlex.quote(keys_dir)}
"""


# --- host files, reloaded in place ---------------------------------------------------------------


@dataclass(frozen=True)
class NginxControl:
    """How a host script reaches the running nginx: `docker exec` on a node, the binary in tests."""

    nginx: str = f"docker exec {CONTAINER_NAME} nginx -c {CONTAINER_CONF_DIR}/nginx.conf"
    """A shell command prefix that runs nginx against the gateway's config."""
    running: str = f"[ \"$(docker inspect -f '{{{{.State.Running}}}}' {CONTAINER_NAME} 2>/dev/null)\" = true ]"
    """A shell condition: true when that nginx is up (else it reads the files when it starts)."""


def reload_lines(what: str, control: NginxControl = NginxControl()) -> str:
    """Check the config the files now make with `nginx -t`, then `nginx -s reload`: new workers take
    new requests, old ones finish theirs (streams included). Messages on stderr (stdout may be a secret)."""
    return f"""if {control.running}; then
  if ! out=$({control.nginx} -t -q 2>&1); then
    echo "gateway: nginx -t refuses the new {what}: $out" >&2
    echo "nginx goes on serving the config it has loaded; fix the stack and deploy again" >&2
    exit 1
  fi
  {control.nginx} -s reload
  echo "gateway: nginx reloaded ({what} changed; requests in flight finish on the old workers)" >&2
else
  echo "gateway: {CONTAINER_NAME} not running yet; it reads the {what} when it starts" >&2
fi
"""


def config_script(
    spec: StackSpec,
    files: Mapping[str, str] | None = None,
    conf_dir: str = HOST_CONF_DIR,
    digests_from_stdin: str | None = None,
    control: NginxControl = NginxControl(),
) -> str:
    """Write the gateway's config files (nginx.conf, Lua, routes) on its host and reload nginx in place.

    `digests_from_stdin`: the host path of the key digests, when they come from the stack's secret.
    """
    g = spec.gateway
    assert g is not None
    files = gateway_files(spec) if files is None else files
    lines = [
        "#!/usr/bin/env bash",
        f"# llm-cluster: write the gateway config under {conf_dir} and reload nginx in place",
        # Key ids and TLS mode in the script: a change to either reloads nginx (digests, certificate).
        f"# key ids: {', '.join(key_ids(spec)) or '(auth off)'}; tls: {'on' if g.tls else 'off'}",
        "set -euo pipefail",
    ]
    lines += put_files_lines(
        {f"{conf_dir}/{rel}": text for rel, text in files.items()},
        [conf_dir],
        "0:0",
        "0600" if digests_from_stdin else "0644",
        digests_from_stdin,
    )
    return "\n".join(lines) + "\n" + reload_lines("config", control)


def usage_dir_script(directory: str) -> str:
    """Make the usage-log directory, owned by nginx's worker user (who writes it) and 0750."""
    return (
        f"#!/usr/bin/env bash\n# llm-cluster: the gateway's usage-log directory\nset -euo pipefail\n"
        f"install -d -m 0750 -o {WORKER_UID} -g {WORKER_UID} {shlex.quote(directory)}\n"
    )


def config_delete_script(conf_dir: str = HOST_CONF_DIR) -> str:
    """Undo config_script (the usage log stays: it is the operator's record)."""
    return f"#!/usr/bin/env bash\n# llm-cluster: remove the gateway config\nset -euo pipefail\nrm -rf -- {shlex.quote(conf_dir)}\n"


def tls_names(spec: StackSpec) -> list[str]:
    """Names in a generated certificate: the node's name and cluster address, then gateway.tlsNames."""
    g = spec.gateway
    assert g is not None
    return list(dict.fromkeys([g.node, spec.node(g.node).address, *g.tls_names]))


def tls_generate_script(spec: StackSpec, root: str = HOST_KEYS_DIR, control: NginxControl = NginxControl()) -> str:
    """Make (once) a private CA on the gateway host and a server certificate it signs; print the CA's certificate.

    The certificate is made again when its names change, when it expires within CERT_RENEW_DAYS, or
    when it no longer verifies against the CA; then nginx reloads. The CA key stays on the host (0600).
    """
    g = spec.gateway
    assert g is not None
    q = shlex.quote
    san = ",".join(f"{'IP' if _is_ipv4(n) else 'DNS'}:{n}" for n in tls_names(spec))
    return f"""#!/usr/bin/env bash
# llm-cluster: the gateway's TLS certificate, signed by a private CA made on this host
set -euo pipefail
umask 077
ca={q(root + "/ca")}
tls={q(root + "/tls")}
san={q(san)}
mkdir -p "$ca" "$tls"
if [ ! -s "$ca/ca.key" ] || [ ! -s "$ca/ca.pem" ]; then
  openssl req -x509 -newkey rsa:3072 -nodes -sha256 -days {CA_DAYS} -subj {q(f"/CN=llm-cluster gateway CA ({g.node})")} \\
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \\
    -keyout "$ca/ca.key.new" -out "$ca/ca.pem.new" 2>/dev/null
  mv -f "$ca/ca.key.new" "$ca/ca.key"
  mv -f "$ca/ca.pem.new" "$ca/ca.pem"
  chmod 0644 "$ca/ca.pem"
  echo "gateway: made a private CA in $ca" >&2
fi
current() {{
  [ -s "$tls/cert.pem" ] && [ -s "$tls/key.pem" ] && [ "$(cat "$tls/names" 2>/dev/null)" = "$san" ] &&
    openssl x509 -checkend {CERT_RENEW_DAYS * 86400} -noout -in "$tls/cert.pem" >/dev/null &&
    openssl verify -CAfile "$ca/ca.pem" "$tls/cert.pem" >/dev/null 2>&1
}}
if ! current; then
  openssl req -newkey rsa:2048 -nodes -sha256 -subj {q(f"/CN={g.node}")} -keyout "$tls/key.pem.new" \\
    -out "$tls/req.csr" 2>/dev/null
  printf 'subjectAltName=%s\\nextendedKeyUsage=serverAuth\\nbasicConstraints=critical,CA:FALSE\\n' "$san" > "$tls/ext.cnf"
  openssl x509 -req -sha256 -days {CERT_DAYS} -in "$tls/req.csr" -CA "$ca/ca.pem" -CAkey "$ca/ca.key" \\
    -set_serial "0x$(od -An -tx1 -N16 /dev/urandom | tr -d ' \\n')" -extfile "$tls/ext.cnf" \\
    -out "$tls/cert.pem.new" 2>/dev/null
  rm -f "$tls/req.csr" "$tls/ext.cnf"
  chmod 0644 "$tls/cert.pem.new"
  mv -f "$tls/key.pem.new" "$tls/key.pem"
  mv -f "$tls/cert.pem.new" "$tls/cert.pem"
  printf '%s' "$san" > "$tls/names"
  echo "gateway: new certificate for $san, valid {CERT_DAYS} days" >&2
{_indent(reload_lines("certificate", control))}
fi
cat "$ca/ca.pem"
"""


def tls_from_stdin_script(root: str = HOST_KEYS_DIR, control: NginxControl = NginxControl()) -> str:
    """Install the stack's certificate chain and key (one PEM stream on stdin), checked to match; reload."""
    q = shlex.quote
    return f"""#!/usr/bin/env bash
# llm-cluster: the gateway's TLS certificate and key from the stack's secrets
set -euo pipefail
umask 077
tls={q(root + "/tls")}
mkdir -p "$tls"
pem=$(cat)
key=$(printf '%s\\n' "$pem" | sed -n '/-----BEGIN .*PRIVATE KEY-----/,/-----END .*PRIVATE KEY-----/p')
cert=$(printf '%s\\n' "$pem" | sed '/-----BEGIN .*PRIVATE KEY-----/,/-----END .*PRIVATE KEY-----/d')
if [ -z "$key" ] || ! printf '%s\\n' "$cert" | openssl x509 -noout 2>/dev/null; then
  echo "gateway: gatewayTlsCert must hold a PEM certificate (chain) and gatewayTlsKey its PEM private key" >&2
  exit 1
fi
if [ "$(printf '%s\\n' "$cert" | openssl x509 -noout -pubkey)" != "$(printf '%s\\n' "$key" | openssl pkey -pubout)" ]; then
  echo "gateway: gatewayTlsKey is not the key of the certificate in gatewayTlsCert" >&2
  exit 1
fi
if [ "$(cat "$tls/cert.pem" 2>/dev/null)" != "$cert" ] || [ "$(cat "$tls/key.pem" 2>/dev/null)" != "$key" ]; then
  printf '%s\\n' "$key" > "$tls/key.pem.new"
  printf '%s\\n' "$cert" > "$tls/cert.pem.new"
  chmod 0644 "$tls/cert.pem.new"
  mv -f "$tls/key.pem.new" "$tls/key.pem"
  mv -f "$tls/cert.pem.new" "$tls/cert.pem"
  rm -f "$tls/names"
{_indent(reload_lines("certificate", control))}
fi
"""


def tls_delete_script(root: str = HOST_KEYS_DIR) -> str:
    """Undo the TLS scripts: certificate, key and the private CA go with the gateway."""
    return (
        f"#!/usr/bin/env bash\n# llm-cluster: remove the gateway's certificate and CA\nset -euo pipefail\n"
        f"rm -rf -- {shlex.quote(root + '/tls')} {shlex.quote(root + '/ca')}\n"
    )


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" if line else line for line in text.rstrip("\n").split("\n"))


def _is_ipv4(name: str) -> bool:
    parts = name.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)


def keyless_status(auth: bool) -> int:
    """What GET /v1/models answers a request without a key: 401, or 200 when auth is off."""
    return 401 if auth else 200


def keyless_probe(port: int, tls: bool, max_time: int) -> str:
    """A curl printing the status of GET /v1/models without a key on the gateway's host (000 if none)."""
    url = shlex.quote(f"{'https' if tls else 'http'}://127.0.0.1:{port}/v1/models")
    return f"curl -sk -o /dev/null -w '%{{http_code}}' --max-time {int(max_time)} {url}"


def healthcheck_probe(spec: StackSpec) -> list[str]:
    """The nginx container's healthcheck: the readiness script's request, answered as it expects."""
    g = spec.gateway
    assert g is not None
    return ["CMD-SHELL", f"{keyless_probe(g.port, g.tls, 3)} | grep -qx {keyless_status(g.auth)}"]


def readiness_script(port: int, tls: bool, timeout_seconds: int = 120, node: str = "", auth: bool = True) -> str:
    """Wait until GET /v1/models without a key answers 401 (up, and not open), or 200 when auth is off."""
    where = shlex.quote(f"{node}:{port}" if node else str(port))
    expected = keyless_status(auth)
    meaning = "refuses requests without a key" if auth else "serves without a key (auth: false)"
    return f"""#!/usr/bin/env bash
# Readiness gate: wait until the gateway {meaning}.
set -euo pipefail
where={where}
deadline=$((SECONDS + {int(timeout_seconds)}))
code=none
while [ "$SECONDS" -lt "$deadline" ]; do
  code=$({keyless_probe(port, tls, 5)} || true)
  if [ "$code" = {expected} ]; then
    echo "gateway on $where is up and {meaning}"
    exit 0
  fi
  sleep 2
done
echo "gateway on $where did not answer {expected} on /v1/models within {int(timeout_seconds)}s" \\
  "(last status: $code); see: docker logs {CONTAINER_NAME}" >&2
exit 1
"""


def metrics_address(spec: StackSpec) -> str:
    """host:port where nginx serves /metrics: the gateway node's cluster address, plain HTTP."""
    g = spec.gateway
    assert g is not None
    return host_port(spec.node(g.node).address, g.metrics_port)
