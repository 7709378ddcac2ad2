"""The gateway's nginx + Lua configuration and its config scripts, generated from the stack (no Pulumi).
Routing, keys, limits and TLS are in the sibling modules routing.py, keys.py, limits.py and tls.py; where
nginx runs (paths, listener, host directories) in layout.py.

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

import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from components.planning.gateway.image import WORKER_UID
from components.planning.gateway.keys import key_ids
from components.planning.gateway.layout import (
    CONTAINER_NAME,
    HOST_CONF_DIR,
    GatewayLayout,
    NginxControl,
    container_layout,
    reload_lines,
)
from components.planning.gateway.limits import (
    BUDGET_ZONE,
    budget_init,
    budget_zone_kib,
    concurrency_zones,
    nginx_rate,
    rate_zones,
    reset_interval,
    retry_after_seconds,
    token_budgets,
)
from components.planning.gateway.routing import (
    MODEL_ENDPOINTS,
    exposed_paths,
    model_pools,
    path_routes,
    routes_table,
    server_weights,
    upstream_servers,
)
from components.planning.gateway.upstreams import engine_server, upstream_keepalive_seconds
from components.planning.nodes.scripts import put_files_lines
from components.spec.stack import StackSpec
from components.spec.topology import affinity_pools, instances

LUA_SOURCE = Path(__file__).with_name("lua") / "gateway.lua"
# The token budgets' Lua module (module `gateway_budget`), loaded only when a key has a budget.
BUDGET_SOURCE = LUA_SOURCE.with_name("gateway_budget.lua")
# The usage record and the metrics (module `gateway_metrics`), and its shared dict of counters.
METRICS_SOURCE = LUA_SOURCE.with_name("gateway_metrics.lua")
AFFINITY_SOURCE = LUA_SOURCE.with_name("gateway_affinity.lua")
AFFINITY_ZONE = "llm_affinity"
AFFINITY_MOVES_ZONE = "llm_affinity_moves"  # ~25k conversations; dropping one only sends it back to its ring replica
METRICS_ZONE = "llm_metrics"
# The metrics listener's drain endpoint (gateway_affinity.lua admin()), which ops/rollout.py calls.
DRAIN_PATH = "/admin/drain"
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
# nginx `map` keywords: a key id spelled like one must be escaped to be matched literally.
_MAP_KEYWORDS = {"default", "hostnames", "include", "volatile"}


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
        *_lua_directives(spec, layout, servers),
        *_request_variables(spec),
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

    affinity = affinity_pools(spec)
    for pool, addrs in servers.items():
        out += _upstream(spec, f"llm_pool_{pool}", [pool], {pool: addrs}, {pool: 1}, affinity=pool in affinity)
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
    out += [
        "",
        *_error_locations(g.max_body_mib, bool(budgets)),
        "    }",
        *_metrics_server(layout, admin=bool(affinity), refusals=drain_refusals(spec)),
        "}",
        "",
    ]
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


def _lua_directives(
    spec: StackSpec, layout: GatewayLayout, servers: Mapping[str, Sequence[tuple[str, int]]]
) -> list[str]:
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
    affinity = (
        f' require("gateway_affinity").init({_lua_value(affinity_settings(spec, servers))})'
        if affinity_pools(spec)
        else ""
    )
    zone = (
        [
            "    # Requests in flight and recent failures per replica of the affinity pools, shared by the workers.",
            f"    lua_shared_dict {AFFINITY_ZONE} 1m;",
            "    # Conversations the load bound or a failure moved, and where to (least recently used dropped when full).",
            f"    lua_shared_dict {AFFINITY_MOVES_ZONE} 4m;",
        ]
        if affinity
        else []
    )
    return out + [
        *zone,
        f'    init_by_lua_block {{ {LUA_VM_SETTINGS} require("gateway").init({_lua_string(layout.routes_file)}, {digests})'
        f'{budgets} require("gateway_metrics"){affinity} }}',
    ]


def affinity_settings(spec: StackSpec, servers: Mapping[str, Sequence[tuple[str, int]]]) -> dict[str, object]:
    """What gateway_affinity.init() is given: the load factor, the head's length, passive health, the tries,
    the session header, and each affinity upstream's pool label and replicas (host:port, in stack order)."""
    g = spec.gateway
    assert g is not None
    return {
        "factor": g.routing.load_factor,
        "floor": g.routing.min_in_flight,
        "sticky": g.routing.sticky_seconds,
        "chars": g.routing.prefix_chars,
        "max_fails": g.max_fails,
        "fail_timeout": g.fail_timeout_seconds,
        "tries": MAX_TRIES,
        "header": g.routing.session_header,
        "upstreams": {
            f"llm_pool_{pool}": [pool, [f"{host}:{port}" for host, port in servers[pool]]]
            for pool in affinity_pools(spec)
        },
        "undrainable": drain_refusals(spec),
    }


def drain_refusals(spec: StackSpec) -> dict[str, str]:
    """Pool -> why /admin/drain cannot drain it (a 409's message): the pools nginx balances itself."""
    g = spec.gateway
    assert g is not None
    affinity = affinity_pools(spec)
    out = {}
    for pool in spec.pools:
        if pool in affinity:
            continue
        if len(instances(spec, pool)) < 2:
            why = "it has one instance (no other replica could take its requests)"
        else:
            key = f"pools.{pool}.routing" if spec.pools[pool].routing else "gateway.routing.policy"
            why = (
                f"it is routed by least_conn ({key}), nginx's own balancer, which takes a replica out only by a "
                f"reload; routing: prefix makes it drainable"
            )
        out[pool] = f"pool '{pool}' cannot be drained at the gateway: {why}"
    return out


# The variables the request path sets (ngx.var, set_by_lua) for nginx's own directives (limits, an
# alias's body, X-Request-Id) and the log phase, with the value a request has until then.
REQUEST_VARIABLES = {"llm_key_id": "", "llm_body": "", "llm_request_id": ""}


def _request_variables(spec: StackSpec) -> list[str]:
    """Each request variable declared by a `map` of its default. A map's variable is changeable
    and keeps a value set in it, across ngx.exec and error_page redirects alike (a server-level
    `set` would run again on an error page's redirect and blank them), and it reads as its default
    in a request that never reached the rewrite phase (a 408 on headers), where a `set` variable
    would be "uninitialized": no value, and a warning per request in the error log."""
    # The affinity key's hash, for the balancer of an affinity pool ('': no key, the ring's spread).
    names = {**REQUEST_VARIABLES, **({"llm_affinity": ""} if affinity_pools(spec) else {})}
    return [
        "    # What gateway.lua sets for the log phase: a default in every request, kept across redirects.",
        *(f"    map \"\" ${name} {{ default '{value}'; }}" for name, value in names.items()),
        # ngx.var assigns only a variable nginx has indexed, i.e. one a directive names: this
        # format, never written, names every one of them whatever the log phase reads.
        f"    log_format llm_request_variables '{' '.join(f'${name}' for name in names)}';",
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
    # A pool's name may hold '-' (a DNS label): such a key is written as a string, ["chat-a"] = ...
    return "{" + ", ".join(f"{_lua_key(k)} = {_lua_value(v)}" for k, v in value.items()) + "}"


def _lua_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) else f"[{_lua_string(key)}]"


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
    Lua the rest; Lua keeps lines and counts in the worker, and a timer merges the counts and then
    writes the lines once a second."""
    charge = "package.loaded.gateway_budget.charge" if token_budgets(spec) else ""
    # An affinity pool's slot given back and its routing outcome counted (gateway_affinity.lua), before
    # record(): a record() that flushes (max_pending) then flushes this request's outcome with its line.
    done = (
        "package.loaded.gateway_affinity.done(package.loaded.gateway_metrics.count_route) "
        if affinity_pools(spec)
        else ""
    )
    return [
        f"    map \"\" $llm_usage_line {{ default '{LOG_FORMAT}'; }}",
        "    # Counters merged from every worker's own tables; kept across reloads (same name and size).",
        f"    lua_shared_dict {METRICS_ZONE} {metrics_zone_kib(spec)}k;",
        f'    init_worker_by_lua_block {{ require("gateway_metrics").start({_lua_value(metrics_settings(spec, layout))}) }}',
        '    exit_worker_by_lua_block { require("gateway_metrics").stop() }',
        f"    log_by_lua_block {{ {done}package.loaded.gateway_metrics.record({charge}) }}",
        # nginx's own access log would write each request again, one write() apiece.
        "    access_log off;",
    ]


def _metrics_server(layout: GatewayLayout, *, admin: bool, refusals: Mapping[str, str]) -> list[str]:
    """The Prometheus endpoint: GET /metrics on its own listener (the node's cluster address); with `admin`
    (prefix-affinity pools), /admin/drain there too: a replica out of rotation and back without a reload.
    Without, /admin/drain answers 409 with `refusals`: why none of the pools can be drained here."""
    if not layout.metrics_listen:
        return []
    if admin:
        drain = [
            "        # Drain (POST), undrain (DELETE), in flight (GET) per replica: ops/rollout.py, never the public port.",
            f"        location = {DRAIN_PATH} {{",
            "            content_by_lua_block { package.loaded.gateway_affinity.admin() }",
            "        }",
        ]
    else:
        why = "no pool of this gateway can be drained here: " + "; ".join(refusals.values())
        body = json.dumps({"error": why})
        # nginx unescapes \' inside a quoted string (the pools' names are quoted so); no other escape in it.
        assert "\\" not in body and "$" not in body, body
        body = body.replace("'", "\\'")
        drain = [
            "        # No pool routed by prefix affinity: nothing to drain, and the answer says why (ops/rollout.py).",
            f"        location = {DRAIN_PATH} {{",
            "            default_type application/json;",
            f"            return 409 '{body}';",
            "        }",
        ]
    return [
        "",
        "    server {",
        f"        listen {layout.metrics_listen};",
        "        # Scrapes are not gateway requests: neither usage lines nor counted.",
        "        log_by_lua_block { return }",
        "        location = /metrics {",
        "            content_by_lua_block { package.loaded.gateway_metrics.serve() }",
        "        }",
        *drain,
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
    *,
    affinity: bool = False,
) -> list[str]:
    """An upstream block over the servers of these pools (one pool, or the pools sharing a model): least_conn,
    or with `affinity` gateway_affinity.lua's choice (its replicas are in its settings)."""
    g = spec.gateway
    assert g is not None
    out = [f"    upstream {name} {{", f"        zone {name} 64k;"]
    if affinity:
        out += [
            "        # Never used: gateway_affinity.lua picks the replica (prefix affinity, bounded load).",
            "        server 0.0.0.1 max_fails=0;",
            f'        balancer_by_lua_block {{ package.loaded.gateway_affinity.balance("{name}") }}',
        ]
    else:
        out.append("        least_conn;")
    for pool in [] if affinity else pools:
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
        **({"llm/gateway_affinity.lua": AFFINITY_SOURCE.read_text()} if affinity_pools(spec) else {}),
    }


def gateway_files(spec: StackSpec) -> dict[str, str]:
    """The container's files (nginx.conf, Lua modules, routing table) for the stack as deployed."""
    return render_gateway(spec, container_layout(spec))


# --- host files, reloaded in place ---------------------------------------------------------------


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
