"""The gateway's nginx + njs configuration and its key scripts, generated from the stack (no Pulumi).

One OpenAI endpoint for every pool:
- POST /v1/chat/completions, /v1/completions, /v1/embeddings go to the pool whose served names (or
  aliases) hold the body's `model`; each path-route prefix (`/smart/v1/`) accepts its pool's models
  only; GET /v1/models is answered by the gateway; every other path is a JSON 404, so vLLM's
  /metrics, /health, /load, /tokenize… are never reachable through it.
- API keys: nginx never sees a key in its config; njs hashes the presented key and looks the digest
  up in a preloaded `sha256 -> key id` file. Missing or unknown key: 401 (before the body is read);
  per-key limit_req zones: 429; per-key model allowlists: 403.
- Per pool: least_conn over the replicas (a shared zone, so every worker sees the same counts and
  failures), passive health with max_fails/fail_timeout, keepalive, unbuffered streaming, the pool's
  read timeout, and retries on connection errors only: `proxy_next_upstream error timeout` without
  `non_idempotent` never re-sends a POST that reached a replica (nginx docs, proxy_next_upstream:
  "requests with a non-idempotent method (POST, LOCK, PATCH) are not passed to the next server if a
  request has been sent to an upstream server").
- One JSON access-log line per request with the key id (never the key), model, pool, upstream,
  status, times, bytes and the response's token usage: to stdout, and as a syslog datagram to the
  metrics exporter on loopback (gateway_exporter.py), which counts them for Prometheus.
- `auth: false` (a lab only; the policy pack refuses it by default): no key lookup, no 401, no keys.
"""
from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from components.planning.monitoring import host_port
from components.planning.topology import instances
from components.spec.gateway import RateLimitSpec
from components.spec.stack import StackSpec

NJS_SOURCE = Path(__file__).with_suffix(".js")
EXPORTER_SOURCE = Path(__file__).with_name("gateway_exporter.py")

# Endpoints routed by `model` (POST) under /v1/ and under every path-route prefix.
MODEL_ENDPOINTS = ("chat/completions", "completions", "embeddings")
DEFAULT_KEY_ID = "default"
# Where the gateway host keeps its generated keys: keys.json (id -> key, 0600, the operator's copy)
# outside the directory mounted into the container, which holds only the digests.
HOST_KEYS_DIR = "/etc/llm-cluster/gateway"
HOST_DIGESTS_DIR = f"{HOST_KEYS_DIR}/nginx"
DIGESTS_FILE = "key-hashes.json"
CONTAINER_NAME = "llm-gateway"
EXPORTER_CONTAINER_NAME = "llm-gateway-exporter"
EXPORTER_PATH = "/opt/llm-cluster/gateway_exporter.py"
# The syslog tag nginx puts before each line (letters, digits, _; at most 32).
SYSLOG_TAG = "llmgw"
# nginx `map` keywords: a key id spelled like one must be escaped to be matched literally.
_MAP_KEYWORDS = {"default", "hostnames", "include", "volatile"}


@dataclass(frozen=True)
class GatewayLayout:
    """Where nginx runs: paths and listener. The container's by default; tests use a temp prefix."""

    port: int
    listen_address: str = ""
    """Empty: every address (host network); tests bind 127.0.0.1."""
    conf_dir: str = "/etc/nginx"
    load_module: str = "modules/ngx_http_js_module.so"
    """Relative to nginx's prefix (/etc/nginx in the image); Debian: /usr/lib/nginx/modules/…."""
    digests_file: str = f"/etc/nginx/llm-keys/{DIGESTS_FILE}"
    tls_dir: str = "/etc/nginx/llm-tls"
    pid_file: str = "/var/run/nginx.pid"
    error_log: str = "/dev/stderr"
    access_log: str = "/dev/stdout"
    temp_dir: str | None = None
    """Client body / proxy temp paths; None keeps the build's defaults."""
    user: str | None = "nginx"
    """Worker user (the image has `nginx`); None when nginx does not start as root."""
    worker_processes: str = "auto"
    syslog_port: int | None = None
    """UDP port on 127.0.0.1 of the metrics exporter that receives a copy of the usage log; None: none."""

    @property
    def njs_file(self) -> str:
        """The njs module inside the container."""
        return f"{self.conf_dir}/llm/gateway.js"

    @property
    def routes_file(self) -> str:
        """The generated routing table (a preloaded object) inside the container."""
        return f"{self.conf_dir}/llm/routes.json"


def container_layout(spec: StackSpec) -> GatewayLayout:
    """The layout of the gateway container: official nginx image, host network, the stack's port."""
    assert spec.gateway is not None
    return GatewayLayout(port=spec.gateway.port, syslog_port=spec.gateway.exporter_syslog_port)


def key_ids(spec: StackSpec) -> list[str]:
    """Key ids of the stack: the apiKeys' ids, or `default` when none are stated; none without auth."""
    assert spec.gateway is not None
    if not spec.gateway.auth:
        return []
    return [k.id for k in spec.gateway.api_keys] or [DEFAULT_KEY_ID]


def routes(spec: StackSpec) -> dict[str, str]:
    """Every model name clients may send (served names, then aliases) -> its pool."""
    assert spec.gateway is not None
    out = {name: pool for pool, p in spec.pools.items() for name in spec.served_names(p.model)}
    out.update(spec.gateway.aliases)
    return out


def path_routes(spec: StackSpec) -> dict[str, str | None]:
    """Prefix -> the pool it pins, with `/v1/` -> None (routed by model)."""
    assert spec.gateway is not None
    return {"/v1/": None, **spec.gateway.path_routes}


def exposed_paths(spec: StackSpec) -> list[str]:
    """Every path the gateway serves (exact matches); everything else is a 404."""
    return [f"{prefix}{endpoint}" for prefix in path_routes(spec)
            for endpoint in (*MODEL_ENDPOINTS, "models")]


def upstream_servers(spec: StackSpec, pool: str) -> list[tuple[str, int]]:
    """(address, port) of every instance of a pool: the head node serves the OpenAI API."""
    return [(spec.node(i.head).address, i.port) for i in instances(spec, pool)]


def nginx_rate(limit: RateLimitSpec) -> str:
    """limit_req_zone's rate: whole requests per second, else per minute (the spec guarantees one)."""
    rps = limit.requests_per_second
    if abs(rps - round(rps)) < 1e-9:
        return f"{round(rps)}r/s"
    return f"{round(rps * 60)}r/m"


def rate_zones(spec: StackSpec) -> list[tuple[RateLimitSpec, list[str]]]:
    """One limit_req zone per distinct (rate, burst), with the key ids it limits (stack order)."""
    g = spec.gateway
    assert g is not None
    if not g.auth:
        return []  # the limits are per key (the spec refuses limits without auth)
    limits = ({k.id: k.rate_limit or g.default_rate_limit for k in g.api_keys} if g.api_keys
              else {DEFAULT_KEY_ID: g.default_rate_limit})
    zones: dict[tuple[str, int], tuple[RateLimitSpec, list[str]]] = {}
    for key_id, limit in limits.items():
        if limit is not None:
            zones.setdefault((nginx_rate(limit), limit.burst), (limit, []))[1].append(key_id)
    return list(zones.values())


def routes_table(spec: StackSpec) -> dict[str, object]:
    """routes.json, the object njs preloads: names -> [pool, rewrite-to], listing order, allowlists."""
    g = spec.gateway
    assert g is not None
    first = {pool: spec.served_names(p.model)[0] for pool, p in spec.pools.items()}
    models: dict[str, list[str]] = {}
    listing: dict[str, list[str]] = {pool: [] for pool in spec.pools}
    meta: dict[str, list[object]] = {}
    for name, pool in routes(spec).items():
        alias = name in g.aliases
        models[name] = [pool, first[pool] if alias else ""]
        listing[pool].append(name)
        p = spec.pools[pool]
        meta[name] = [spec.models[p.model].path, p.vllm.max_model_len]
    allow: dict[str, dict[str, bool]] = {}
    for k in g.api_keys:
        if k.models:
            allowed = [n for m in k.models for n in (listing.get(m) or [m])]
            allow[k.id] = {n: True for n in allowed}
    order = [g.default_pool] + [p for p in spec.pools if p != g.default_pool]
    return {"auth": g.auth, "models": models, "listing": listing, "meta": meta, "order": order,
            "prefixes": dict(g.path_routes), "allow": allow}


def key_digests(keys: Mapping[str, str], ids: Sequence[str]) -> str:
    """The file nginx preloads: {sha256(key): id} for exactly the stack's ids; refuses gaps and extras."""
    missing = [i for i in ids if not keys.get(i)]
    extra = sorted(set(keys) - set(ids))
    if missing or extra:
        raise ValueError("gatewayApiKeys must hold one key for each gateway key id "
                         f"({', '.join(ids)}); missing: {', '.join(missing) or 'none'}, "
                         f"not in the stack: {', '.join(extra) or 'none'}")
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


# Responses nginx itself produces (before njs runs, or when no replica answers).
ERRORS: dict[int, tuple[str, str, str]] = {
    401: ("Missing or invalid API key: send the header Authorization: Bearer <key>.", "invalid_api_key",
          "invalid_request_error"),
    404: ("Unknown path: the gateway serves POST /v1/chat/completions, /v1/completions, "
          "/v1/embeddings and GET /v1/models.", "not_found", "invalid_request_error"),
    413: ("Request body too large.", "request_too_large", "invalid_request_error"),
    429: ("Rate limit reached for this API key; slow down and retry.", "rate_limit_exceeded", "requests"),
    502: ("No replica of the model pool could be reached; retry later.", "upstream_unavailable",
          "server_error"),
    504: ("The model pool did not answer in time.", "upstream_timeout", "server_error"),
}


def _error_locations(max_body_mib: int) -> list[str]:
    lines = []
    for status, (message, code, type_) in ERRORS.items():
        if status == 413:
            message = f"Request body too large: the gateway accepts at most {max_body_mib} MiB."
        lines += [f"        location @llm_e{status} {{",
                  "            default_type application/json;"]
        if status == 401:
            lines.append('            add_header WWW-Authenticate "Bearer" always;')
        lines += [f"            return {status} {_json_error(message, code, type_)};",
                  "        }"]
    return lines


LOG_FORMAT = (
    '{"time":"$time_iso8601","request_id":"$request_id","key_id":"$llm_key_id",'
    '"method":"$request_method","path":"$request_uri","model":"$llm_model","pool":"$llm_pool",'
    '"upstream":"$upstream_addr","status":$status,"upstream_status":"$upstream_status",'
    '"request_time":$request_time,"upstream_time":"$upstream_response_time",'
    '"request_bytes":$request_length,"response_bytes":$bytes_sent,'
    '"prompt_tokens":$llm_prompt_tokens,"completion_tokens":$llm_completion_tokens,'
    '"total_tokens":$llm_total_tokens}'
)
"""One JSON object per request. Token counts are JSON numbers, or null when the response had no usage."""


def nginx_conf(spec: StackSpec, layout: GatewayLayout,
               upstreams: Mapping[str, Sequence[tuple[str, int]]] | None = None) -> str:
    """nginx.conf for the gateway; `upstreams` (pool -> [(host, port)]) replaces the stack's replicas."""
    g = spec.gateway
    assert g is not None
    servers = {pool: list((upstreams or {}).get(pool) or upstream_servers(spec, pool)) for pool in spec.pools}
    listen = f"{layout.listen_address}:{layout.port}" if layout.listen_address else str(layout.port)
    out = ["# Generated by llm-cluster from the stack; change Pulumi.<stack>.yaml, not this file.",
           f"load_module {layout.load_module};"]
    if layout.user:
        out.append(f"user {layout.user};")
    out += [f"worker_processes {layout.worker_processes};",
            f"pid {layout.pid_file};",
            f"error_log {layout.error_log} warn;",
            "",
            "events {",
            "    worker_connections 16384;",
            "}",
            "",
            "http {",
            "    server_tokens off;",
            "    default_type application/json;",
            "    tcp_nodelay on;",
            "    keepalive_timeout 75s;",
            "    keepalive_requests 10000;",
            "    # njs reads `model` from the body: it must be whole and in memory, never in a temp file.",
            f"    client_max_body_size {g.max_body_mib}m;",
            f"    client_body_buffer_size {g.max_body_mib}m;",
            "    client_body_in_single_buffer on;"]
    if layout.temp_dir:
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            out.append(f"    {kind}_temp_path {layout.temp_dir}/{kind};")
    out += ["",
            f"    js_preload_object llm_routes from {layout.routes_file};",
            *([f"    js_preload_object llm_keys from {layout.digests_file};"] if g.auth else []),
            f"    js_import gateway from {layout.njs_file};",
            "    js_set $llm_key_id gateway.keyId;",
            "    js_var $llm_model;",
            "    js_var $llm_pool;",
            "    js_var $llm_body;",
            "    js_var $llm_prompt_tokens null;",
            "    js_var $llm_completion_tokens null;",
            "    js_var $llm_total_tokens null;",
            "",
            f"    log_format llm_usage escape=json '{LOG_FORMAT}';",
            # Buffered: one write per 64k of lines or per second instead of one per request.
            f"    access_log {layout.access_log} llm_usage buffer=64k flush=1s;"]
    if layout.syslog_port is not None:
        # One UDP datagram per request (nginx cannot buffer syslog): the metrics exporter's input.
        # A stopped exporter costs nothing but an error-log line per failed send.
        out.append(f"    access_log syslog:server=127.0.0.1:{layout.syslog_port},tag={SYSLOG_TAG},nohostname llm_usage;")
    out.append("")

    zones = rate_zones(spec)
    if zones:
        out += ["    # Per-key rate limits: one zone per (rate, burst); a key outside a zone maps to ''",
                "    # there, and limit_req does not count empty keys.",
                "    limit_req_status 429;",
                "    limit_req_log_level warn;"]
    for i, (limit, ids) in enumerate(zones):
        out.append(f"    map $llm_key_id $llm_rl_{i} {{")
        out.append('        default "";')
        for key_id in ids:
            literal = f"\\{key_id}" if key_id in _MAP_KEYWORDS else key_id
            out.append(f"        {literal} $llm_key_id;")
        out.append("    }")
        out.append(f"    limit_req_zone $llm_rl_{i} zone=llm_rl_{i}:10m rate={nginx_rate(limit)};")
    out.append("")

    for pool, addrs in servers.items():
        out += [f"    upstream llm_pool_{pool} {{",
                f"        zone llm_pool_{pool} 64k;",
                "        least_conn;"]
        out += [f"        server {host}:{port} max_fails={g.max_fails} fail_timeout={g.fail_timeout_seconds}s;"
                for host, port in addrs]
        if g.upstream_keepalive:
            out.append(f"        keepalive {g.upstream_keepalive};")
        out += ["    }", ""]

    out += ["    server {",
            f"        listen {listen}{' ssl' if g.tls else ''};"]
    if g.tls:
        out += [f"        ssl_certificate {layout.tls_dir}/cert.pem;",
                f"        ssl_certificate_key {layout.tls_dir}/key.pem;",
                "        ssl_protocols TLSv1.2 TLSv1.3;",
                "        ssl_session_cache shared:llm_tls:10m;"]
    out += [*(f"        error_page {status} @llm_e{status};" for status in ERRORS), ""]
    guard = ['            if ($llm_key_id = "") {',
             "                return 401;",
             "            }"] if g.auth else []
    # nginx refuses `burst=0`: without a burst the zone's rate alone applies.
    guard += [f"            limit_req zone=llm_rl_{i}" + (f" burst={limit.burst} nodelay;" if limit.burst else ";")
              for i, (limit, _) in enumerate(zones)]
    for prefix in path_routes(spec):
        for endpoint in MODEL_ENDPOINTS:
            out += [f"        location = {prefix}{endpoint} {{", *guard,
                    "            js_content gateway.route;", "        }"]
        out += [f"        location = {prefix}models {{", *guard,
                "            js_content gateway.models;", "        }"]
    out += ["", "        location / {", "            return 404;", "        }", ""]

    aliased = set(g.aliases.values())
    for pool in spec.pools:
        proxy = _proxy_block(spec, pool, rewrite_prefix=bool(g.path_routes))
        out += [f"        location @llm_pool_{pool} {{", *proxy, "        }"]
        if pool in aliased:
            out += [f"        location @llm_alias_{pool} {{",
                    "            proxy_set_body $llm_body;", *proxy, "        }"]
    out += ["", *_error_locations(g.max_body_mib), "    }", "}", ""]
    return "\n".join(out)


def _proxy_block(spec: StackSpec, pool: str, *, rewrite_prefix: bool) -> list[str]:
    """The proxy directives of one pool's named location."""
    g = spec.gateway
    assert g is not None
    lines = []
    if rewrite_prefix:
        # /smart/v1/chat/completions -> /v1/chat/completions; plain /v1/… paths do not match.
        lines.append("            rewrite ^/.+?(/v1/.*)$ $1 break;")
    lines += [
        f"            proxy_pass http://llm_pool_{pool};",
        "            proxy_http_version 1.1;",
        '            proxy_set_header Connection "";',
        "            proxy_set_header Host $host;",
        "            proxy_set_header X-Request-Id $request_id;",
        "            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
        "            # The client's key stays here; vLLM listens on the cluster network without one.",
        '            proxy_set_header Authorization "";',
        "            # Uncompressed, so the usage filter can read the response.",
        '            proxy_set_header Accept-Encoding "";',
        "            proxy_buffering off;",
        f"            proxy_connect_timeout {g.connect_timeout_seconds}s;",
        "            proxy_send_timeout 60s;",
        f"            proxy_read_timeout {spec.pools[pool].read_timeout_seconds}s;",
        "            proxy_next_upstream error timeout;",
        "            js_body_filter gateway.usage buffer_type=buffer;",
    ]
    return lines


def render_gateway(spec: StackSpec, layout: GatewayLayout,
                   upstreams: Mapping[str, Sequence[tuple[str, int]]] | None = None) -> dict[str, str]:
    """Every file the gateway container needs, by path relative to the layout's conf_dir."""
    return {
        "nginx.conf": nginx_conf(spec, layout, upstreams),
        "llm/gateway.js": NJS_SOURCE.read_text(),
        "llm/routes.json": json.dumps(routes_table(spec), indent=1) + "\n",
    }


def gateway_files(spec: StackSpec) -> dict[str, str]:
    """The container's files (nginx.conf, njs module, routing table) for the stack as deployed."""
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


def exporter_source() -> str:
    """The metrics exporter program uploaded into the exporter container."""
    return EXPORTER_SOURCE.read_text()


def metrics_address(spec: StackSpec) -> str:
    """host:port where the exporter serves /metrics: the gateway node's cluster address."""
    g = spec.gateway
    assert g is not None
    return host_port(spec.node(g.node).address, g.metrics_port)


def exporter_argv(spec: StackSpec) -> list[str]:
    """The exporter's command: syslog from nginx on loopback, /metrics on the cluster address."""
    g = spec.gateway
    assert g is not None
    return ["python3", EXPORTER_PATH, "--syslog", f"127.0.0.1:{g.exporter_syslog_port}",
            "--listen", metrics_address(spec)]


def exporter_probe(spec: StackSpec) -> list[str]:
    """The exporter container's healthcheck: the slim Python image has no curl, so Python fetches /metrics."""
    url = f"http://{metrics_address(spec)}/metrics"
    return ["CMD", "python3", "-c", f"import urllib.request; urllib.request.urlopen({url!r}, timeout=3)"]
