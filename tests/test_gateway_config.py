"""The gateway's generated nginx config, routing table, key digests and host scripts (no Pulumi, no nginx)."""

from __future__ import annotations

import copy
import hashlib
import http.server
import json
import re
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from components.planning.gateway.keys import key_digests, key_ids, keys_delete_script, keys_script
from components.planning.gateway.layout import DIGESTS_FILE, GatewayLayout, nginx_argv
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
from components.planning.gateway.nginx import (
    BUDGET_SOURCE,
    ERRORS,
    LOG_FORMAT,
    gateway_files,
    healthcheck_probe,
    keyless_probe,
    nginx_conf,
    readiness_script,
    render_gateway,
)
from components.planning.gateway.routing import exposed_paths, routes, routes_table, upstream_servers
from components.planning.load import load_stack_config
from components.planning.nodes.scripts import bash_command
from components.spec import RateLimitSpec, SpecError, StackSpec
from tests.conftest import prod_config
from tests.support import free_port, tool


def spec_with(config: dict[str, Any], secrets: set[str] | None = None, **gateway: Any) -> StackSpec:
    """The reference stack with gateway keys replaced (YAML names) and these secret config keys set."""
    config["llm-cluster:gateway"].update(gateway)
    for key in secrets or ():
        config[f"llm-cluster:{key}"] = "[secret]"
    return load_stack_config(config, {f"llm-cluster:{key}" for key in secrets or ()})


def lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()]


def lua_content(handler: str, args: str = "") -> str:
    """A location's content handler: gateway.lua's function of that name, with these Lua arguments."""
    return f"content_by_lua_block {{ package.loaded.gateway.{handler}({args}) }}"


def handler_of(endpoint: str, pin: str | None = None) -> str:
    """What a location of the gateway's exposed paths runs: route() with the engine endpoint it
    proxies to and its path route's pool, or models()."""
    if endpoint == "models":
        return lua_content("models")
    return lua_content("route", f'"/v1/{endpoint}"' + (f', "{pin}"' if pin else ""))


# The reference chat pool's replicas, given to gateway_affinity.lua with the routing settings' defaults.
AFFINITY_INIT = (
    'require("gateway_affinity").init({factor = 1.25, floor = 4, sticky = 600, chars = 2048, max_fails = 2, '
    "fail_timeout = 30, "
    'tries = 3, header = "X-Session-Id", upstreams = {llm_pool_chat = {"chat", {"192.168.10.13:8000", '
    '"192.168.10.14:8000", "192.168.10.15:8000", "192.168.10.16:8000"}}}, undrainable = {reasoning = '
    "\"pool 'reasoning' cannot be drained at the gateway: it has one instance (no other replica could take its "
    'requests)"}})'
)


def block(conf: str, header: str) -> list[str]:
    """The stripped lines of the `{ … }` block that opens with `header`."""
    out, depth, inside = [], 0, False
    for line in lines(conf):
        if not inside and line == header + " {":
            inside, depth = True, 1
            continue
        if inside:
            depth += line.count("{") - line.count("}")
            if depth == 0:
                return out
            out.append(line)
    raise AssertionError(f"no block {header!r}")


# --- the reference stack ----------------------------------------------------------------------


def test_reference_upstreams_are_the_pools_heads_with_passive_health_and_keepalive(prod_spec: StackSpec) -> None:
    conf = gateway_files(prod_spec)["nginx.conf"]
    # Four replicas: prefix affinity picks one (gateway_affinity.lua, its replicas in its settings below).
    assert block(conf, "upstream llm_pool_chat") == [
        "zone llm_pool_chat 64k;",
        "# Never used: gateway_affinity.lua picks the replica (prefix affinity, bounded load).",
        "server 0.0.0.1 max_fails=0;",
        'balancer_by_lua_block { package.loaded.gateway_affinity.balance("llm_pool_chat") }',
        # vLLM's uvicorn closes idle connections after 5 s: nginx lets go at 3 s.
        "keepalive 32;",
        "keepalive_timeout 3s;",
    ]
    assert AFFINITY_INIT in conf
    # TP8 x PP2 on gpu-01 + gpu-02 is one engine served from its Ray head, gpu-01.
    assert block(conf, "upstream llm_pool_reasoning") == [
        "zone llm_pool_reasoning 64k;",
        "least_conn;",
        "server 192.168.10.11:8000 max_fails=2 fail_timeout=30s;",
        "keepalive 32;",
        "keepalive_timeout 3s;",
    ]
    assert upstream_servers(prod_spec, "reasoning") == [("192.168.10.11", 8000)]


def test_reference_pool_locations_stream_retry_before_any_byte_and_use_the_pools_timeouts(prod_spec: StackSpec) -> None:
    conf = gateway_files(prod_spec)["nginx.conf"]
    for pool, timeout in (("chat", 600), ("reasoning", 900)):
        body = block(conf, f"location @llm_pool_{pool}")
        # No variables: route() sets the URI to the routed endpoint when the request line's differs.
        assert f"proxy_pass http://llm_pool_{pool};" in body
        assert f"proxy_read_timeout {timeout}s;" in body
        assert "proxy_buffering off;" in body
        assert "proxy_http_version 1.1;" in body
        assert 'proxy_set_header Connection "";' in body
        assert 'proxy_set_header Authorization "";' in body
        # Errors, 5xx and not-ready answers go to another replica, POST included, until the read
        # timeout (a slow generation is never run twice), at most 3 attempts.
        assert [line for line in body if line.startswith("proxy_next_upstream")] == [
            "proxy_next_upstream error timeout http_500 http_502 http_503 http_504 non_idempotent;",
            "proxy_next_upstream_tries 3;",
            f"proxy_next_upstream_timeout {timeout}s;",
        ]
        assert not any(line.startswith("rewrite") for line in body)
        # A replica's error that is not JSON is answered as OpenAI JSON; every answer's usage read.
        assert body[-2:] == [
            "header_filter_by_lua_block { package.loaded.gateway.head() }",
            "body_filter_by_lua_block { package.loaded.gateway.usage() }",
        ]
    # Neither the endpoint nor a path route's pool is a variable: each location names them.
    assert "$llm_upstream_uri" not in conf and "$llm_pin" not in conf
    assert 'route("/v1/chat/completions", "reasoning")' in block(conf, "location = /smart/v1/chat/completions")[-1]


def test_reference_listener_limits_and_module_path(prod_spec: StackSpec) -> None:
    conf = lines(gateway_files(prod_spec)["nginx.conf"])
    # NDK first: the Lua module links against it.
    assert conf[1:3] == [
        "load_module /usr/lib/nginx/modules/ndk_http_module.so;",
        "load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;",
    ]
    assert "user nginx;" in conf
    server = block("\n".join(conf), "server")
    # HTTPS by default, and no plain-HTTP listener at all.
    assert server[:5] == [
        "listen 443 ssl;",
        "ssl_certificate /etc/llm-gateway-tls/cert.pem;",
        "ssl_certificate_key /etc/llm-gateway-tls/key.pem;",
        "ssl_protocols TLSv1.2 TLSv1.3;",
        "ssl_session_cache shared:llm_tls:10m;",
    ]
    # The Host of a request that sent none (HTTP/1.0), which replicas get: the node's name.
    assert server[5] == f"server_name {prod_spec.gateway.node};"
    # ... but the metrics' own, on the cluster address (test_metrics_are_served_by_nginx_on_...).
    assert [line for line in conf if line.startswith("listen")] == ["listen 443 ssl;", "listen 192.168.10.11:9145;"]
    assert "client_max_body_size 16m;" in conf and "client_body_buffer_size 16m;" in conf
    assert "limit_req_zone $llm_rl_0 zone=llm_rl_0:10m rate=20r/s;" in conf
    assert "limit_req_status 429;" in conf
    # `default` is a map keyword: the key id must be escaped to match literally.
    assert block("\n".join(conf), "map $llm_key_id $llm_rl_0") == ['default "";', "\\default $llm_key_id;"]
    for endpoint in ("chat/completions", "completions", "embeddings", "models"):
        for prefix in ("/v1/", "/smart/v1/"):
            loc = block("\n".join(conf), f"location = {prefix}{endpoint}")
            assert loc[:3] == ['if ($llm_key_id = "") {', "return 401;", "}"]
            assert loc[3] == "limit_req zone=llm_rl_0 burst=40 nodelay;"
            assert loc[4] == handler_of(endpoint, "reasoning" if prefix == "/smart/v1/" else None)


def test_a_requests_pool_is_sized_for_what_a_gateway_request_allocates(prod_spec: StackSpec) -> None:
    # One block of 16k from the start (nginx's default 4k grew by three blocks a request: 2.4k
    # instructions of malloc and free, bench/gateway_instructions.py).
    http = block("\n".join(lines(gateway_files(prod_spec)["nginx.conf"])), "http")
    assert [line for line in http if line.startswith("request_pool_size")] == ["request_pool_size 16k;"]


def test_reference_loads_the_lua_module_reads_its_tables_once_and_declares_the_request_variables(
    prod_spec: StackSpec,
) -> None:
    conf = lines(gateway_files(prod_spec)["nginx.conf"])
    http = block("\n".join(conf), "http")
    lua = [line for line in http if line.startswith(("lua_", "init_by_lua"))]
    # The image's packages' own search paths after the config's directory; the tables read in the
    # master, once per start or reload, never per request.
    assert lua == [
        'lua_package_path "/etc/llm-gateway/llm/?.lua;/usr/share/lua/5.1/?.lua;;";',
        'lua_package_cpath "/usr/lib/x86_64-linux-gnu/lua/5.1/?.so;;";',
        "lua_shared_dict llm_affinity 1m;",
        "lua_shared_dict llm_affinity_moves 4m;",
        'init_by_lua_block { jit.opt.start("loopunroll=60") collectgarbage("setpause", 400) '
        'require("gateway").init("/etc/llm-gateway/llm/routes.json", '
        '"/etc/llm-gateway-keys/key-hashes.json") require("gateway_metrics") '
        f"{AFFINITY_INIT} }}",
        "lua_shared_dict llm_metrics 5262k;",
    ]
    # Declared with their defaults (a map: kept across ngx.exec and error pages, no "uninitialized"
    # warning for a request that never reached the rewrite phase), and named once so ngx.var may set them.
    assert [line for line in http if line.startswith('map "" ') and "$llm_usage_line" not in line] == [
        "map \"\" $llm_key_id { default ''; }",
        "map \"\" $llm_body { default ''; }",
        # A routed request's id is gateway.lua's (X-Request-Id); the usage line's comes from Lua too.
        "map \"\" $llm_request_id { default ''; }",
        # The affinity key's hash, for the chat pool's balancer.
        "map \"\" $llm_affinity { default ''; }",
    ]
    assert "log_format llm_request_variables '$llm_key_id $llm_body $llm_request_id $llm_affinity';" in http
    # The model, pool, token counts and stream events are no nginx variables (gateway_metrics.routed).
    assert not {"$llm_model", "$llm_pool", "$llm_usage_counts", "$llm_events"} & set(
        re.findall(r"\$\w+", "\n".join(http))
    )
    # The key id is computed in the server's rewrite phase, before any location's `if` or limit reads it.
    server = block("\n".join(conf), "server")
    assert server[6] == "set_by_lua_block $llm_key_id { return package.loaded.gateway.key_id() }"
    assert not [line for line in conf if line.startswith("js_") or "njs" in line]


def test_the_tests_lua_paths_replace_the_images(prod_spec: StackSpec, tmp_path: Path) -> None:
    layout = GatewayLayout(port=8080, conf_dir=str(tmp_path), lua_path="/t/a/?.lua;/t/b/?.lua", lua_cpath="/t/?.so")
    conf = lines(nginx_conf(prod_spec, layout))
    assert [line for line in conf if line.startswith("lua_package")] == [
        f'lua_package_path "{tmp_path}/llm/?.lua;/t/a/?.lua;/t/b/?.lua;;";',
        'lua_package_cpath "/t/?.so;;";',
    ]


def test_usage_log_and_metrics_are_kept_by_lua_in_the_log_phase_at_http_level(prod_spec: StackSpec) -> None:
    conf = lines(gateway_files(prod_spec)["nginx.conf"])
    http = conf[conf.index("http {") :]
    # At http level: every request of every server is recorded, nginx's own errors too (and no API
    # location has a log phase of its own: record() forgets what the router kept of each request,
    # gateway_metrics.routed); nginx's own access log (one write per request) is off.
    assert [line for line in conf if line.startswith(("log_by_lua", "access_log", "init_worker", "exit_worker"))] == [
        'init_worker_by_lua_block { require("gateway_metrics").start({zone = "llm_metrics", flush_seconds = 1, '
        'max_pending = 512, field_max = 256, max_series = 10000, buckets = {{0.05, "0.05"}, {0.1, "0.1"}, {0.25, "0.25"}, {0.5, "0.5"}, '
        '{1.0, "1.0"}, {2.5, "2.5"}, {5.0, "5.0"}, {10.0, "10.0"}, {20.0, "20.0"}, {30.0, "30.0"}, {60.0, "60.0"}, '
        '{120.0, "120.0"}, {300.0, "300.0"}, {600.0, "600.0"}, {900.0, "900.0"}}, plain_paths = {"/v1/chat/completions", '
        '"/v1/completions", "/v1/embeddings", "/v1/models", "/smart/v1/chat/completions", "/smart/v1/completions", '
        '"/smart/v1/embeddings", "/smart/v1/models"}, usage_dir = "/var/log/llm-gateway", '
        "prune_seconds = 3600, retention_days = 30, max_bytes = 21474836480}) }",
        'exit_worker_by_lua_block { require("gateway_metrics").stop() }',
        "log_by_lua_block { package.loaded.gateway_affinity.done(package.loaded.gateway_metrics.count_route) "
        "package.loaded.gateway_metrics.record() }",
        "access_log off;",
        "log_by_lua_block { return }",
    ]
    assert http.index(
        "log_by_lua_block { package.loaded.gateway_affinity.done(package.loaded.gateway_metrics.count_route) "
        "package.loaded.gateway_metrics.record() }"
    ) < http.index("server {")
    assert "lua_shared_dict llm_metrics 5262k;" in conf
    assert "syslog" not in gateway_files(prod_spec)["nginx.conf"]
    # nginx composes its part of the line; the client's path goes in as it came (the line's last
    # field: Lua cuts and escapes it). No regular expression runs for the line.
    assert [line for line in http if "$llm_usage_line" in line] == [
        f"map \"\" $llm_usage_line {{ default '{LOG_FORMAT}'; }}"
    ]
    assert LOG_FORMAT.startswith('"time":"$time_iso8601","status":$status,"request_time":$request_time,')
    assert LOG_FORMAT.endswith(',"path":"$request_uri"') and "$llm_" not in LOG_FORMAT
    assert not [line for line in conf if line.startswith("map $request_uri $llm_log")]


def test_metrics_are_served_by_nginx_on_the_cluster_address_apart_from_the_api(config: dict[str, Any]) -> None:
    conf = lines(gateway_files(spec_with(config, metricsPort=9200))["nginx.conf"])
    server = conf[conf.index("listen 192.168.10.11:9200;") - 1 :]
    assert server[:16] == [
        "server {",
        "listen 192.168.10.11:9200;",
        "# Scrapes are not gateway requests: neither usage lines nor counted.",
        "log_by_lua_block { return }",
        "location = /metrics {",
        "content_by_lua_block { package.loaded.gateway_metrics.serve() }",
        "}",
        # The reference stack's chat pool is routed by prefix affinity: its replicas can be drained here.
        "# Drain (POST), undrain (DELETE), in flight (GET) per replica: ops/rollout.py, never the public port.",
        "location = /admin/drain {",
        "content_by_lua_block { package.loaded.gateway_affinity.admin() }",
        "}",
        "location / {",
        "default_type text/plain;",
        'return 404 "llm-cluster gateway: GET /metrics\\n";',
        "}",
        "}",
    ]


def test_without_a_prefix_affinity_pool_the_drain_endpoint_only_says_why(config: dict[str, Any]) -> None:
    spec = spec_with(config, metricsPort=9200, routing={"policy": "least_conn"})
    conf = gateway_files(spec)["nginx.conf"]
    assert "location = /metrics {" in conf and "gateway_affinity" not in conf
    # A static 409 (its text on the deployed nginx: tests/test_gateway_drain.py); no Lua, nothing drained.
    drain = block(conf, "location = /admin/drain")
    assert drain[0] == "default_type application/json;" and drain[1].startswith('return 409 \'{"error": "no pool')


@pytest.mark.parametrize(
    ("gateway", "message"),
    [
        ({"metricsPort": 80}, "gateway.metricsPort: 80 is not allowed: must be at least 1024"),
        ({"metricsPort": 8000}, "gateway.metricsPort: port 8000 on gpu-01 is already taken by pools.reasoning.port"),
    ],
)
def test_the_metrics_port_is_unprivileged_and_claimed_on_the_gateway_node(
    config: dict[str, Any], gateway: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError) as err:
        spec_with(config, **gateway)
    assert str(err.value) == message


@pytest.mark.parametrize("key", ["exporterSyslogPort", "exporterImage"])
def test_the_keys_of_the_gone_exporter_are_refused_by_name(config: dict[str, Any], key: str) -> None:
    # nginx serves the metrics itself now: a stack still setting the exporter's keys hears they are gone.
    with pytest.raises(SpecError) as err:
        spec_with(config, **{key: "python:3.12-slim" if key == "exporterImage" else 5514})
    assert str(err.value).startswith(f"gateway.{key}: unknown key '{key}'; allowed keys here:")


def test_only_the_openai_endpoints_are_exposed(prod_spec: StackSpec) -> None:
    assert exposed_paths(prod_spec) == [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/models",
        "/smart/v1/chat/completions",
        "/smart/v1/completions",
        "/smart/v1/embeddings",
        "/smart/v1/models",
    ]
    conf = gateway_files(prod_spec)["nginx.conf"]
    exact = sorted(
        line.split()[2]
        for line in block(conf, "server")
        if line.startswith("location = ") and not line.startswith("location = /_llm_error/")
    )
    assert exact == sorted(exposed_paths(prod_spec))
    # The error pages are internal: a client asking for one gets the 404.
    for status in ERRORS:
        assert block(conf, f"location = /_llm_error/{status}")[0] == "internal;"
    assert block(conf, "location /") == ["return 404;"]
    assert [
        line for line in block(conf, "server") if line.startswith("location ") and "@" not in line and "=" not in line
    ] == ["location / {"]


def test_reference_routes_every_served_name_to_its_pool(prod_spec: StackSpec) -> None:
    assert routes(prod_spec) == {
        "deepseek-r1": "reasoning",
        "/data/models/DeepSeek-R1-GPTQ-Int4": "reasoning",
        "qwen3-30b-a3b": "chat",
        "/data/models/Qwen3-30B-A3B": "chat",
    }
    table = routes_table(prod_spec)
    assert table["order"] == ["chat", "reasoning"]  # defaultPool first in /v1/models
    assert table["prefixes"] == {"/smart/v1/": "reasoning"}
    assert table["models"]["qwen3-30b-a3b"] == ["chat", {"chat": True}, "@llm_pool_chat", ""]
    assert table["meta"]["deepseek-r1"] == ["/data/models/DeepSeek-R1-GPTQ-Int4", 8192]
    assert table["allow"] == {}
    assert key_ids(prod_spec) == ["default"]


def test_reference_error_pages_are_openai_json(prod_spec: StackSpec) -> None:
    conf = gateway_files(prod_spec)["nginx.conf"]
    for raised, sent, code in (
        (401, 401, "invalid_api_key"),
        (404, 404, "not_found"),
        (413, 413, "request_too_large"),
        (429, 429, "rate_limit_exceeded"),
        (502, 502, "upstream_unavailable"),
        (504, 504, "upstream_timeout"),
        (503, 429, "concurrency_limit_exceeded"),
        (494, 431, "headers_too_large"),
        (497, 400, "https_required"),
    ):
        overwrite = f"={sent} " if sent != raised else ""
        assert f"error_page {raised} {overwrite}/_llm_error/{raised};" in lines(conf)
        ret = [line for line in block(conf, f"location = /_llm_error/{raised}") if line.startswith("return")][0]
        assert ret.split(" ", 2)[1] == str(sent)
        body = json.loads(ret.split(" ", 2)[2].rstrip(";").strip("'"))
        assert body["error"]["code"] == code and body["error"]["message"]
    assert 'add_header WWW-Authenticate "Bearer" always;' in block(conf, "location = /_llm_error/401")
    assert "16 MiB" in block(conf, "location = /_llm_error/413")[-1]
    assert block(conf, "location = /_llm_error/429")[2:6] == [
        "add_header Retry-After $llm_rl_retry_after always;",
        "add_header x-ratelimit-limit-requests $llm_rl_per_minute always;",
        "add_header x-ratelimit-remaining-requests 0 always;",
        "add_header x-ratelimit-reset-requests $llm_rl_reset always;",
    ]
    # The reference key: 20 r/s.
    assert block(conf, "map $llm_key_id $llm_rl_retry_after") == ["default 1;", '\\default "1";']
    assert block(conf, "map $llm_key_id $llm_rl_reset") == ['default "1s";', '\\default "50ms";']


# --- variants ---------------------------------------------------------------------------------


def test_aliases_get_a_rewriting_location_and_the_pools_first_name(config: dict[str, Any]) -> None:
    spec = spec_with(config, aliases={"fast": "chat"})
    table = routes_table(spec)
    assert table["models"]["fast"] == ["chat", {"chat": True}, "@llm_alias_chat", "qwen3-30b-a3b"]
    assert table["models"]["qwen3-30b-a3b"] == ["chat", {"chat": True}, "@llm_pool_chat", ""]
    assert table["listing"]["chat"] == ["qwen3-30b-a3b", "/data/models/Qwen3-30B-A3B", "fast"]
    conf = nginx_conf(spec, GatewayLayout(port=80))
    alias = block(conf, "location @llm_alias_chat")
    assert alias[0] == "proxy_set_body $llm_body;"
    assert alias[1:] == block(conf, "location @llm_pool_chat")
    assert "location @llm_alias_reasoning {" not in lines(conf)


def test_allowlists_expand_pool_names_to_served_names_and_aliases(config: dict[str, Any]) -> None:
    spec = spec_with(
        config, aliases={"fast": "chat"}, apiKeys=[{"id": "ops"}, {"id": "analyst", "models": ["reasoning", "fast"]}]
    )
    assert routes_table(spec)["allow"] == {
        "analyst": {"deepseek-r1": True, "/data/models/DeepSeek-R1-GPTQ-Int4": True, "fast": True}
    }


def test_one_rate_zone_per_distinct_rate_and_burst(config: dict[str, Any]) -> None:
    spec = spec_with(
        config,
        defaultRateLimit={"requestsPerSecond": 5, "burst": 10},
        apiKeys=[
            {"id": "a"},
            {"id": "b", "rateLimit": {"requestsPerSecond": 0.5, "burst": 2}},
            {"id": "c", "rateLimit": {"requestsPerSecond": 5, "burst": 10}},
            {"id": "d", "rateLimit": {"requestsPerSecond": 0.5, "burst": 3}},
        ],
    )
    assert [(nginx_rate(limit), limit.burst, ids) for limit, ids in rate_zones(spec)] == [
        ("5r/s", 10, ["a", "c"]),
        ("30r/m", 2, ["b"]),
        ("30r/m", 3, ["d"]),
    ]
    conf = nginx_conf(spec, GatewayLayout(port=80))
    loc = block(conf, "location = /v1/chat/completions")
    assert [line for line in loc if line.startswith("limit_req")] == [
        "limit_req zone=llm_rl_0 burst=10 nodelay;",
        "limit_req zone=llm_rl_1 burst=2 nodelay;",
        "limit_req zone=llm_rl_2 burst=3 nodelay;",
    ]
    assert block(conf, "map $llm_key_id $llm_rl_1") == ['default "";', "b $llm_key_id;"]


def test_a_default_rate_limit_without_api_keys_limits_the_default_key(config: dict[str, Any]) -> None:
    spec = spec_with(config, apiKeys=[], defaultRateLimit={"requestsPerSecond": 5, "burst": 10})
    assert [(nginx_rate(limit), limit.burst, ids) for limit, ids in rate_zones(spec)] == [("5r/s", 10, ["default"])]


def test_no_limit_stated_means_no_zone(config: dict[str, Any]) -> None:
    spec = spec_with(config, apiKeys=[])
    assert key_ids(spec) == ["default"] and rate_zones(spec) == []
    conf = nginx_conf(spec, GatewayLayout(port=80))
    assert "limit_req" not in conf
    assert block(conf, "location = /v1/models") == [
        'if ($llm_key_id = "") {',
        "return 401;",
        "}",
        lua_content("models"),
    ]


def test_rates_are_whole_per_second_or_per_minute(config: dict[str, Any]) -> None:
    assert nginx_rate(RateLimitSpec(requestsPerSecond=20)) == "20r/s"
    assert nginx_rate(RateLimitSpec(requestsPerSecond=0.5)) == "30r/m"
    assert nginx_rate(RateLimitSpec(requestsPerSecond=1.5)) == "90r/m"
    assert nginx_rate(RateLimitSpec(requestsPerSecond=1 / 60)) == "1r/m"
    with pytest.raises(SpecError) as err:
        spec_with(config, defaultRateLimit={"requestsPerSecond": 0.3333})
    assert str(err.value) == (
        "gateway.defaultRateLimit.requestsPerSecond: 0.3333 requests/s is not a whole "
        "number of requests per minute (19.9980/min); nginx rates are whole requests "
        "per second or per minute, e.g. 0.5 (= 30/min)"
    )


def test_path_routes_refuse_the_plain_prefix_and_odd_characters(config: dict[str, Any]) -> None:
    with pytest.raises(SpecError, match=r"path route '/v1/' is the gateway's own model-routed prefix"):
        spec_with(config, pathRoutes={"/v1/": "chat"})
    with pytest.raises(SpecError, match=r"may hold only letters, digits"):
        spec_with(config, pathRoutes={"/a b;/v1/": "chat"})


def test_without_auth_nothing_checks_or_loads_a_key(config: dict[str, Any], prod_spec: StackSpec) -> None:
    spec = spec_with(config, auth=False, apiKeys=[])
    assert key_ids(spec) == [] and rate_zones(spec) == []
    files = gateway_files(spec)
    assert "key-hashes" not in files["nginx.conf"] and "limit_req" not in files["nginx.conf"]
    # gateway.lua is told there is no digest file to read.
    assert (
        'init_by_lua_block { jit.opt.start("loopunroll=60") collectgarbage("setpause", 400) '
        'require("gateway").init("/etc/llm-gateway/llm/routes.json", nil) '
        f'require("gateway_metrics") {AFFINITY_INIT} }}' in lines(files["nginx.conf"])
    )
    assert "set_by_lua" in files["nginx.conf"]  # (it returns '' at once: routes.json says auth is off)
    for endpoint in ("chat/completions", "models"):
        assert block(files["nginx.conf"], f"location = /v1/{endpoint}") == [handler_of(endpoint)]
    assert json.loads(files["llm/routes.json"])["auth"] is False
    assert routes_table(prod_spec)["auth"] is True


@pytest.mark.parametrize(
    ("gateway", "path"),
    [
        ({"apiKeys": [{"id": "ops"}]}, "gateway.apiKeys"),
        ({"apiKeys": [], "defaultRateLimit": {"requestsPerSecond": 5}}, "gateway.defaultRateLimit"),
    ],
)
def test_without_auth_keys_and_limits_are_refused_not_ignored(
    config: dict[str, Any], gateway: dict[str, Any], path: str
) -> None:
    with pytest.raises(SpecError) as err:
        spec_with(config, auth=False, **gateway)
    assert str(err.value) == (
        f"{path}: keys and limits are not checked when auth is false; remove them or set auth: true"
    )


def test_tls_listens_with_the_uploaded_certificate(config: dict[str, Any]) -> None:
    spec = spec_with(config, {"gatewayTlsCert", "gatewayTlsKey"}, tls=True, port=443)
    server = block(nginx_conf(spec, GatewayLayout(port=443)), "server")
    assert server[:5] == [
        "listen 443 ssl;",
        "ssl_certificate /etc/nginx/llm-tls/cert.pem;",
        "ssl_certificate_key /etc/nginx/llm-tls/key.pem;",
        "ssl_protocols TLSv1.2 TLSv1.3;",
        "ssl_session_cache shared:llm_tls:10m;",
    ]


def test_loopback_layout_changes_only_paths_and_the_listener(prod_spec: StackSpec, tmp_path: Path) -> None:
    """What the nginx tests run is the deployed config: the same lines but for where files live."""
    deployed = gateway_files(prod_spec)
    local = render_gateway(
        prod_spec,
        GatewayLayout(
            port=18080,
            listen_address="127.0.0.1",
            conf_dir=str(tmp_path),
            load_modules=("/x.so", "/y.so"),
            lua_path="/t/?.lua",
            lua_cpath="/t/?.so",
            digests_file=f"{tmp_path}/k.json",
            tls_dir=f"{tmp_path}/tls",
            pid_file=f"{tmp_path}/pid",
            error_log=f"{tmp_path}/e",
            usage_dir=prod_spec.gateway.usage_log.dir,
            temp_dir=None,
            user=None,
            metrics_listen="127.0.0.1:19145",
        ),
    )
    assert local["llm/gateway.lua"] == deployed["llm/gateway.lua"]
    assert local["llm/gateway_metrics.lua"] == deployed["llm/gateway_metrics.lua"]
    assert local["llm/routes.json"] == deployed["llm/routes.json"]
    differ = set(lines(deployed["nginx.conf"])) ^ set(lines(local["nginx.conf"]))
    heads = {line.split()[0] for line in differ}
    assert heads == {
        "load_module",
        "user",
        "pid",
        "error_log",
        "lua_package_path",
        "lua_package_cpath",
        "init_by_lua_block",
        "listen",
        "ssl_certificate",
        "ssl_certificate_key",
    }


# --- token budgets (pure: the budgets' own nginx tests are tests/test_gateway_budgets.py) --------------


def test_keys_take_their_own_budget_or_the_default_and_the_zone_holds_them() -> None:
    config = prod_config()
    config["llm-cluster:gateway"].update(
        defaultTokenBudget={"tokens": 500},
        apiKeys=[{"id": "a"}, {"id": "b", "tokenBudget": {"tokens": 9, "windowSeconds": 86400}}],
    )
    spec = load_stack_config(config, set())
    assert {k: (b.tokens, b.window_seconds) for k, b in token_budgets(spec).items()} == {
        "a": (500, 60),
        "b": (9, 86400),
    }
    files = gateway_files(spec)
    conf = files["nginx.conf"]
    assert f"    lua_shared_dict {BUDGET_ZONE} 1024k;\n" in conf
    assert budget_zone_kib(spec) == 1024
    assert budget_init(spec) == 'require("gateway_budget").init("llm_budget", {["a"] = {500, 60}, ["b"] = {9, 86400}})'
    assert "init_by_lua_block {" in conf and budget_init(spec) in conf
    assert files["llm/gateway_budget.lua"] == BUDGET_SOURCE.read_text()
    # Admitted or refused in every model endpoint (rewrite phase, so before the limits count it),
    # after the key check.
    for endpoint in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        block = conf.split(f"        location = {endpoint} {{\n", 1)[1].split("\n        }\n", 1)[0]
        assert block.index("return 401;") < block.index(
            "            set_by_lua_block $llm_budget_refused { return package.loaded.gateway_budget.admit() }\n"
            "            if ($llm_budget_refused) {\n                return 439;\n            }"
        )
    # No budget anywhere: no shared dict, no budget module, no extra log field.
    plain = gateway_files(load_stack_config(prod_config(), set()))
    assert "lua_shared_dict llm_budget" not in plain["nginx.conf"] and "llm/gateway_budget.lua" not in plain
    assert "budget" not in plain["nginx.conf"]


def test_the_zone_is_sized_for_two_counts_of_every_key() -> None:
    config = prod_config()
    sizes = {}
    for keys in (1, 1950, 1951, 3900, 3901):
        config["llm-cluster:gateway"].update(
            apiKeys=[{"id": f"k{i}", "tokenBudget": {"tokens": 1}} for i in range(keys)]
        )
        sizes[keys] = budget_zone_kib(load_stack_config(config, set()))
    # keys x 2 counts x 256 bytes, and 5 % for the slab allocator, in the next power of two MiB
    assert sizes == {1: 1024, 1950: 1024, 1951: 2048, 3900: 2048, 3901: 4096}


# --- keys -------------------------------------------------------------------------------------


def test_key_digests_map_sha256_to_ids_and_refuse_gaps() -> None:
    text = key_digests({"a": "sk-one", "b": "sk-two"}, ["a", "b"])
    assert json.loads(text) == {hashlib.sha256(b"sk-one").hexdigest(): "a", hashlib.sha256(b"sk-two").hexdigest(): "b"}
    assert "sk-one" not in text
    with pytest.raises(ValueError, match=r"missing: b, not in the stack: c"):
        key_digests({"a": "sk-one", "c": "sk-three"}, ["a", "b"])
    with pytest.raises(ValueError, match="same key to two ids"):
        key_digests({"a": "sk-same", "b": "sk-same"}, ["a", "b"])


KEY_REFUSALS = [
    # (keys given, the stack's ids, the whole message): every list joined, "none" for an empty one.
    (
        {"a": "sk-one"},
        ["a", "b"],
        "gatewayApiKeys must hold one key for each gateway key id (a, b); missing: b, not in the stack: none",
    ),
    (
        {"a": "sk-one", "b": "sk-two", "c": "sk-three"},
        ["a", "b"],
        "gatewayApiKeys must hold one key for each gateway key id (a, b); missing: none, not in the stack: c",
    ),
    (
        {"a": "", "d": "sk-four", "c": "sk-three"},
        ["a", "b"],
        "gatewayApiKeys must hold one key for each gateway key id (a, b); missing: a, b, not in the stack: c, d",
    ),
    (
        {"a": "sk-same", "b": "sk-same"},
        ["a", "b"],
        "gatewayApiKeys gives the same key to two ids; each id needs its own key",
    ),
]


@pytest.mark.parametrize(("keys", "ids", "message"), KEY_REFUSALS)
def test_key_digests_refusals_say_what_is_missing_and_extra(keys: dict[str, str], ids: list[str], message: str) -> None:
    with pytest.raises(ValueError) as refused:
        key_digests(keys, ids)
    assert str(refused.value) == message


def test_the_digest_file_is_the_same_bytes_for_the_same_keys_in_any_order() -> None:
    keys = {"a": "sk-one", "b": "sk-two", "c": "sk-three"}
    digest = {i: hashlib.sha256(k.encode()).hexdigest() for i, k in keys.items()}
    # The ids given in the reverse of their digests' order: the file is sorted by digest all the same.
    ids = sorted(keys, key=digest.__getitem__, reverse=True)
    body = ",\n".join(f' "{digest[i]}": "{i}"' for i in sorted(keys, key=digest.__getitem__))
    assert key_digests(keys, ids) == key_digests(keys, ids[::-1]) == "{\n" + body + "\n}\n"


@pytest.mark.parametrize(
    ("ids", "keys_dir", "lines"),
    [
        (["default"], "/etc/llm-cluster/gateway", ["dir=/etc/llm-cluster/gateway", "ids=(default)"]),
        (["a", "we'ird"], "/srv/gw keys", ["dir='/srv/gw keys'", "ids=(a 'we'\"'\"'ird')"]),
    ],
)
def test_the_key_scripts_quote_the_ids_and_the_directory(ids: list[str], keys_dir: str, lines: list[str]) -> None:
    assert [line for line in keys_script(ids, keys_dir).splitlines() if line.startswith(("dir=", "ids="))] == lines
    assert keys_delete_script(keys_dir).splitlines()[-1] == "rm -rf -- " + lines[0].removeprefix("dir=")
    # The defaults: the host's directory.
    assert keys_script(ids) == keys_script(ids, "/etc/llm-cluster/gateway")
    assert keys_delete_script() == keys_delete_script("/etc/llm-cluster/gateway")


def test_no_generated_file_holds_a_key(config: dict[str, Any]) -> None:
    spec = spec_with(config, apiKeys=[{"id": "ops"}, {"id": "analyst", "models": ["chat"]}])
    files = gateway_files(spec)
    keys = {"ops": "sk-ops-9f8e7d", "analyst": "sk-analyst-1a2b3c"}
    digests = key_digests(keys, key_ids(spec))
    for text in [*files.values(), digests]:
        assert not any(k in text for k in keys.values())


def run_bash(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script, "keys", *args], capture_output=True, text=True, check=True)


def snapshot(root: Path) -> dict[str, tuple[str, int, int]]:
    return {
        str(p.relative_to(root)): (p.read_text(), p.stat().st_mtime_ns, p.stat().st_mode & 0o777)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_keys_script_makes_keeps_and_drops_keys_and_writes_digests(tmp_path: Path) -> None:
    root = tmp_path / "gw"
    first = run_bash(keys_script(["default", "ops"], str(root)))
    keys = json.loads(first.stdout)
    assert sorted(keys) == ["default", "ops"]
    assert all(k.startswith("sk-") and len(k) == 51 for k in keys.values())
    assert keys["default"] != keys["ops"]
    assert json.loads((root / "keys.json").read_text()) == keys
    assert (root / "keys.json").stat().st_mode & 0o777 == 0o600
    # The digests the host writes are the ones nginx looks up: same as key_digests.
    assert json.loads((root / "nginx" / DIGESTS_FILE).read_text()) == json.loads(key_digests(keys, ["default", "ops"]))

    before = snapshot(root)
    again = run_bash(keys_script(["default", "ops"], str(root)))
    assert again.stdout == first.stdout
    assert snapshot(root) == before  # a second run changes nothing, not even mtimes

    grown = json.loads(run_bash(keys_script(["default", "ops", "new"], str(root))).stdout)
    assert {k: grown[k] for k in ("default", "ops")} == keys and grown["new"] not in keys.values()
    shrunk = json.loads(run_bash(keys_script(["ops"], str(root))).stdout)
    assert shrunk == {"ops": keys["ops"]}
    assert sorted(p.name for p in (root / "keys").iterdir()) == ["ops"]

    run_bash(keys_delete_script(str(root)))
    assert not root.exists()
    run_bash(keys_delete_script(str(root)))  # deleting twice is fine


def test_host_scripts_pass_shellcheck() -> None:
    shellcheck = tool("shellcheck")
    for script in (
        keys_script(["default", "we'ird"]),
        keys_delete_script(),
        readiness_script(80, False, 120, "gpu-01"),
        readiness_script(443, True, 60),
        readiness_script(8080, False, 30, "gpu-01", auth=False),
    ):
        result = subprocess.run([shellcheck, "-s", "bash", "-"], input=script, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


class _Answer401(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(401 if self.path == "/v1/models" else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_readiness_script_passes_on_401_and_fails_with_a_message_otherwise() -> None:
    tool("curl")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer401)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ok = subprocess.run(
            ["bash", "-c", readiness_script(server.server_address[1], False, 30, "gpu-01")],
            capture_output=True,
            text=True,
        )
        assert ok.returncode == 0 and "refuses requests without a key" in ok.stdout
    finally:
        server.shutdown()
        server.server_close()
    closed = free_port()
    down = subprocess.run(["bash", "-c", readiness_script(closed, False, 1, "gpu-01")], capture_output=True, text=True)
    assert down.returncode == 1
    assert down.stderr.strip() == (
        f"gateway on gpu-01:{closed} did not answer 401 on /v1/models within 1s "
        "(last status: 000); see: docker logs llm-gateway"
    )


def test_healthcheck_probe_sends_the_readiness_request_under_sh(config: dict[str, Any]) -> None:
    tool("curl")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer401)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        kind, probe = healthcheck_probe(spec_with(config, port=port, tls=False))
        assert kind == "CMD-SHELL" and probe == f"{keyless_probe(port, False, 3)} | grep -qx 401"
        assert f"  code=$({keyless_probe(port, False, 5)} || true)\n" in readiness_script(port, False)
        # Docker runs CMD-SHELL with /bin/sh.
        assert subprocess.run(["sh", "-c", probe]).returncode == 0
        _, open_probe = healthcheck_probe(spec_with(config, auth=False, apiKeys=[], tls=False))
        assert open_probe == f"{keyless_probe(port, False, 3)} | grep -qx 200"
        assert subprocess.run(["sh", "-c", open_probe]).returncode == 1  # 401 is not what an open gateway answers
    finally:
        server.shutdown()
        server.server_close()


def test_host_scripts_run_when_the_login_shell_is_dash(tmp_path: Path) -> None:
    tool("dash")
    root = tmp_path / "gw"
    # Handed to dash as it is, the script fails (arrays, pipefail)...
    assert subprocess.run(["dash", "-c", keys_script(["default"], str(root))], capture_output=True).returncode != 0
    # ...so the component sends it through bash_command, which hands it to bash whatever the login shell.
    made = subprocess.run(
        ["dash", "-c", bash_command(keys_script(["default"], str(root)))], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    assert list(json.loads(made.stdout)) == ["default"]
    assert subprocess.run(["dash", "-c", bash_command(keys_delete_script(str(root)))]).returncode == 0
    assert not root.exists()


# --- engine servers, limits --------------------------------------------------------------------


def test_upstream_keepalive_follows_the_pools_engine_server_timeout(config: dict[str, Any]) -> None:
    config["llm-cluster:pools"]["chat"]["env"] = {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "30"}
    config["llm-cluster:pools"]["reasoning"]["env"] = {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "1"}
    conf = nginx_conf(load_stack_config(config, set()), GatewayLayout(port=80))
    assert block(conf, "upstream llm_pool_chat")[-2:] == ["keepalive 32;", "keepalive_timeout 28s;"]
    # Nothing shorter than 1 s is safe: no idle connections for that pool at all.
    assert not any(line.startswith("keepalive") for line in block(conf, "upstream llm_pool_reasoning"))


def test_engine_without_server_facts_is_a_clear_error() -> None:
    from components.planning.gateway.upstreams import engine_server

    with pytest.raises(
        ValueError,
        match="no server facts for engine 'tgi': no such engine is registered .*knows: vllm, lmdeploy, llamacpp",
    ):
        engine_server("tgi")


def test_concurrency_caps_get_one_zone_per_cap(config: dict[str, Any]) -> None:
    spec = spec_with(
        config,
        defaultMaxConcurrent=8,
        apiKeys=[{"id": "a"}, {"id": "b", "maxConcurrent": 2}, {"id": "default", "maxConcurrent": 8}],
    )
    assert concurrency_zones(spec) == [(8, ["a", "default"]), (2, ["b"])]
    conf = nginx_conf(spec, GatewayLayout(port=80))
    assert block(conf, "map $llm_key_id $llm_cc_0") == ['default "";', "a $llm_key_id;", "\\default $llm_key_id;"]
    assert "limit_conn_zone $llm_cc_1 zone=llm_cc_1:10m;" in lines(conf)
    assert "limit_conn_status 503;" in lines(conf)
    loc = block(conf, "location = /v1/chat/completions")
    assert loc[-3:-1] == ["limit_conn llm_cc_0 8;", "limit_conn llm_cc_1 2;"]


def test_concurrency_caps_need_auth(config: dict[str, Any]) -> None:
    with pytest.raises(SpecError, match="keys and limits are not checked when auth is false"):
        spec_with(config, auth=False, apiKeys=[], defaultMaxConcurrent=4)


@pytest.mark.parametrize(
    ("rps", "retry_after", "reset"),
    [(20, 1, "50ms"), (1, 1, "1s"), (0.999, 2, "2s"), (0.5, 2, "2s"), (1 / 60, 60, "1m0s"), (1 / 90, 90, "1m30s")],
)
def test_429_retry_after_and_reset_follow_the_rate(rps: float, retry_after: int, reset: str) -> None:
    limit = RateLimitSpec.model_construct(requests_per_second=rps, burst=0)
    assert (retry_after_seconds(limit), reset_interval(limit)) == (retry_after, reset)


def test_every_deployed_engine_has_server_facts_and_nginx_lets_go_first() -> None:
    from components.engines.registry import ENGINES
    from components.facts.evidence import Evidence
    from components.planning.gateway.upstreams import (
        engine_server,
        server_keepalive_seconds,
        upstream_keepalive_seconds,
    )

    assert set(ENGINES) == {"vllm", "lmdeploy", "llamacpp"}
    for engine in ENGINES:
        server = engine_server(engine)
        assert server.sourced.source and isinstance(server.sourced.evidence, Evidence), engine
        assert 0 < upstream_keepalive_seconds(engine, {}) < server_keepalive_seconds(engine, {}), engine


# Each engine's server facts as read from its source (the facts' `sourced` text says where), whole: a
# second, unverified entry for an engine (the duplicate-key bug of issue 37) or an edited value fails here.
SERVER_FACTS = {
    "vllm": (5, "VLLM_HTTP_TIMEOUT_KEEP_ALIVE", (503,)),
    "lmdeploy": (5, "UVICORN_TIMEOUT_KEEP_ALIVE", (503,)),
    "llamacpp": (5, None, (503,)),
}


def test_each_engines_server_facts_are_the_verified_ones() -> None:
    from components.engines.registry import ENGINES
    from components.planning.gateway.upstreams import engine_server

    assert {
        name: (s.keepalive_seconds, s.keepalive_env, s.not_ready_statuses)
        for name, s in ((name, engine_server(name)) for name in ENGINES)
    } == SERVER_FACTS
    for name, (_, env, _) in SERVER_FACTS.items():
        # The variable is named in the source text it was read from.
        assert env is None or env in ENGINES[name].http_server.sourced.source, name


@pytest.mark.parametrize(
    ("engine", "variable"), [("vllm", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"), ("lmdeploy", "UVICORN_TIMEOUT_KEEP_ALIVE")]
)
def test_a_pool_env_that_lengthens_the_servers_keepalive_lengthens_nginxs(engine: str, variable: str) -> None:
    from components.planning.gateway.upstreams import upstream_keepalive_seconds

    # The variable each server reads (its facts' source); llama-server has none.
    assert (upstream_keepalive_seconds(engine, {variable: "65"}), upstream_keepalive_seconds(engine, {})) == (63, 3)
    assert upstream_keepalive_seconds("llamacpp", {variable: "65"}) == 3


@pytest.mark.parametrize(
    ("value", "server", "upstream"),
    [
        ("65", 65, 63),
        (" 30 ", 30, 28),
        ("4", 4, 2),
        ("3", 3, 1),
        ("2", 2, 1),  # two seconds less would be none: one
        ("1", 1, 0),  # nothing shorter than the server's 1 s is safe: keepalive off
        ("0", 0, 0),
        ("-5", 5, 3),  # not a count of seconds: the server's default
        ("abc", 5, 3),
        ("", 5, 3),
    ],
)
def test_keepalive_on_both_sides_of_each_bound(value: str, server: int, upstream: int) -> None:
    from components.planning.gateway.upstreams import server_keepalive_seconds, upstream_keepalive_seconds

    env = {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": value}
    assert (server_keepalive_seconds("vllm", env), upstream_keepalive_seconds("vllm", env)) == (server, upstream)


def test_request_handlers_read_only_the_modules_init_by_lua_loaded(config: dict[str, Any]) -> None:
    # The handlers take their module from package.loaded (no require() call per request): one that
    # init_by_lua did not load would fail every request with "attempt to index a nil value".
    budgeted = spec_with(
        copy.deepcopy(config),
        apiKeys=[{"id": "default"}, {"id": "metered", "tokenBudget": {"tokens": 100, "windowSeconds": 60}}],
    )
    for spec in (spec_with(copy.deepcopy(config)), budgeted):
        conf = gateway_files(spec)["nginx.conf"]
        init = next(line for line in lines(conf) if line.startswith("init_by_lua_block"))
        loaded = set(re.findall(r'require\("(\w+)"\)', init))
        handlers = [
            line for line in lines(conf) if re.match(r"(set|content|header_filter|body_filter|log)_by_lua", line)
        ]
        used = {m for line in handlers for m in re.findall(r"package\.loaded\.(\w+)", line)}
        assert "require(" not in "".join(handlers)
        assert used <= loaded and "gateway" in used and "gateway_metrics" in used, (used, loaded)
        assert ("gateway_budget" in used) == (spec is budgeted), used


# --- a model shared by pools: the split, the server weights and routes.json, whole ------------------------


def _shared(weights: dict[str, int], routing: str | None = None) -> StackSpec:
    """The chat model on `chat` (gpu-03..05, three instances) and `canary` (gpu-06, one)."""
    from tests.support.gateway import gateway_config

    config = gateway_config()
    pools = config["llm-cluster:pools"]
    pools["canary"] = {**copy.deepcopy(pools["chat"]), "nodes": ["gpu-06"]}
    pools["chat"]["nodes"] = ["gpu-03", "gpu-04", "gpu-05"]
    if routing:
        pools["chat"]["routing"] = routing
    config["llm-cluster:gateway"]["poolWeights"] = weights
    return load_stack_config(config, set())


@pytest.mark.parametrize(
    ("weights", "percent", "server"),
    [
        ({"chat": 3, "canary": 1}, {"chat": 75.0, "canary": 25.0}, {"chat": 3, "canary": 3}),
        ({"chat": 2, "canary": 1}, {"chat": 66.7, "canary": 33.3}, {"chat": 2, "canary": 3}),
        # An unweighted pool counts 1; the three chat servers share its one part.
        ({"canary": 2}, {"chat": 33.3, "canary": 66.7}, {"chat": 1, "canary": 6}),
    ],
)
def test_a_shared_models_split_and_server_weights(
    weights: dict[str, int], percent: dict[str, float], server: dict[str, int]
) -> None:
    from components.planning.gateway.routing import server_weights, split

    spec = _shared(weights)
    assert split(spec) == {"qwen3-30b-a3b": percent}
    weights_of = server_weights(spec, ["chat", "canary"])
    # Whole numbers: nginx reads `weight=3`, and refuses `weight=3.0`.
    assert weights_of == server and all(type(w) is int for w in weights_of.values())
    assert routes(spec)["qwen3-30b-a3b"] == "chat+canary"


def test_routes_table_of_a_shared_model_an_alias_and_an_affinity_pool() -> None:
    table = routes_table(_shared({"chat": 3, "canary": 1}))  # prefix affinity: the gateway's default
    assert table["models"]["qwen3-30b-a3b"] == [  # type: ignore[index]
        "chat+canary",
        {"chat": True, "canary": True},
        "@llm_model_qwen3-30b-a3b",
        "",
    ]
    assert table["models"]["fast"] == ["chat", {"chat": True}, "@llm_alias_chat", "qwen3-30b-a3b"]  # type: ignore[index]
    assert table["meta"]["fast"] == ["/data/models/Qwen3-30B-A3B", 32768]  # type: ignore[index]
    assert table["affinity"] == {"@llm_pool_chat": "chat", "@llm_alias_chat": "chat"}
    # No pool routed by affinity: no affinity entry at all.
    assert "affinity" not in routes_table(_shared({"chat": 3, "canary": 1}, routing="least_conn"))


def test_the_gateway_container_runs_nginx_in_the_foreground_on_the_mounted_config() -> None:
    # The container's command whole: nginx's own flags (-c the config, -g a directive), and `daemon off;`, without
    # which nginx forks into the background and docker sees its container exit.
    assert nginx_argv() == ["nginx", "-c", "/etc/llm-gateway/nginx.conf", "-g", "daemon off;"]
