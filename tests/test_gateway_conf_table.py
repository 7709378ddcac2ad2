"""The gateway's generated nginx.conf and host scripts as tables: each branch of the generator (TLS, the redirect
port, budgets, affinity, aliases, a shared model, limits, auth, the layout's optional paths) on both sides,
compared as the exact text it writes (no nginx here: the deployed nginx runs them in tests/test_gateway_*.py).

Three whole configs are compared with their committed text (tests/fixtures/gateway/): the reference stack,
a stack that takes the other side of each of its branches, and a loopback layout without auth. A deliberate
change to the generator changes them: `.venv/bin/python -m tests.test_gateway_conf_table` writes the new
text; the diff in git is the review of what nginx will read."""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from typing import Any

import pytest

from components.planning.gateway import nginx
from components.planning.gateway.layout import GatewayLayout, NginxControl, container_layout
from components.planning.gateway.nginx import (
    config_delete_script,
    config_script,
    drain_refusals,
    failure_statuses,
    healthcheck_probe,
    keyless_probe,
    keyless_status,
    nginx_conf,
    readiness_script,
    render_gateway,
    temp_path_directives,
    usage_dir_script,
)
from components.planning.gateway.upstreams import engine_server
from components.planning.load import load_stack_config
from components.spec import SpecError, StackSpec
from tests.conftest import ROOT, prod_config

FIXTURES = ROOT / "tests" / "fixtures" / "gateway"


def stack(**gateway: Any) -> StackSpec:
    """The reference stack with these gateway keys (YAML names) replaced."""
    config = prod_config()
    config["llm-cluster:gateway"].update(copy.deepcopy(gateway))
    return load_stack_config(config, set())


# --- the host scripts --------------------------------------------------------------------------------------

RELOAD = """if [ "$(docker inspect -f '{{.State.Running}}' llm-gateway 2>/dev/null)" = true ]; then
  if ! out=$(docker exec llm-gateway nginx -c /etc/llm-gateway/nginx.conf -t -q 2>&1); then
    echo "gateway: nginx -t refuses the new config: $out" >&2
    echo "nginx goes on serving the config it has loaded; fix the stack and deploy again" >&2
    exit 1
  fi
  docker exec llm-gateway nginx -c /etc/llm-gateway/nginx.conf -s reload
  echo "gateway: nginx reloaded (config changed; requests in flight finish on the old workers)" >&2
else
  echo "gateway: llm-gateway not running yet; it reads the config when it starts" >&2
fi
"""


def _put(mode: str) -> str:
    return f"""put() {{  # put <path>: stdin into <path>, atomically (same directory, then rename)
  local tmp
  install -d -m 0755 "$(dirname "$1")"
  tmp=$(mktemp "$1.XXXXXX")
  cat > "$tmp"
  chmod {mode} "$tmp"
  chown 0:0 "$tmp"
  mv -f "$tmp" "$1"
}}
"""


def test_the_config_script_writes_the_files_root_owned_and_reloads_nginx() -> None:
    script = config_script(stack(), {"nginx.conf": "A\n", "llm/x.lua": "B"})
    assert script == (
        "#!/usr/bin/env bash\n"
        "# llm-cluster: write the gateway config under /etc/llm-cluster/gateway/conf and reload nginx in place\n"
        "# key ids: default; tls: on\n"
        "set -euo pipefail\n" + _put("0644") + "install -d -m 0755 /etc/llm-cluster/gateway/conf\n"
        "put /etc/llm-cluster/gateway/conf/nginx.conf <<'LLM_CLUSTER_CONFIG_FILE'\nA\nLLM_CLUSTER_CONFIG_FILE\n"
        "put /etc/llm-cluster/gateway/conf/llm/x.lua <<'LLM_CLUSTER_CONFIG_FILE'\nB\nLLM_CLUSTER_CONFIG_FILE\n"
        "# Files an earlier config wrote and this one does not (a removed rules file): gone.\n"
        "find /etc/llm-cluster/gateway/conf -type f -print0 | while IFS= read -r -d '' f; do\n"
        '  case "$f" in /etc/llm-cluster/gateway/conf/nginx.conf|/etc/llm-cluster/gateway/conf/llm/x.lua) ;; '
        '*) rm -f -- "$f" ;; esac\n'
        "done\n" + RELOAD
    )


def test_the_config_script_with_the_digests_on_stdin_keeps_every_file_0600() -> None:
    # The digests come from the stack's secret: the whole directory is written 0600, the digest file from stdin.
    script = config_script(
        stack(apiKeys=[{"id": "ops"}, {"id": "ci"}], tls=False),
        {"nginx.conf": "A\n"},
        conf_dir="/c",
        digests_from_stdin="/k/d.json",
        control=NginxControl(nginx="ngx", running="true"),
    )
    assert script.splitlines()[:4] == [
        "#!/usr/bin/env bash",
        "# llm-cluster: write the gateway config under /c and reload nginx in place",
        "# key ids: ops, ci; tls: off",
        "set -euo pipefail",
    ]
    assert _put("0600") in script
    assert "\nput /k/d.json\n" in script and '  case "$f" in /c/nginx.conf|/k/d.json) ;;' in script
    assert script.endswith(
        "if true; then\n"
        "  if ! out=$(ngx -t -q 2>&1); then\n"
        '    echo "gateway: nginx -t refuses the new config: $out" >&2\n'
        '    echo "nginx goes on serving the config it has loaded; fix the stack and deploy again" >&2\n'
        "    exit 1\n"
        "  fi\n"
        "  ngx -s reload\n"
        '  echo "gateway: nginx reloaded (config changed; requests in flight finish on the old workers)" >&2\n'
        "else\n"
        '  echo "gateway: llm-gateway not running yet; it reads the config when it starts" >&2\n'
        "fi\n"
    )


def test_the_config_script_without_auth_says_so_and_defaults_to_the_stacks_files() -> None:
    spec = stack(auth=False, apiKeys=[])
    script = config_script(spec)
    assert script.splitlines()[2] == "# key ids: (auth off); tls: on"
    # Without files given: the stack's own (nginx.conf, the Lua modules, routes.json).
    assert [line.split()[1] for line in script.splitlines() if line.startswith("put /")] == [
        "/etc/llm-cluster/gateway/conf/nginx.conf",
        "/etc/llm-cluster/gateway/conf/llm/gateway.lua",
        "/etc/llm-cluster/gateway/conf/llm/gateway_metrics.lua",
        "/etc/llm-cluster/gateway/conf/llm/routes.json",
        "/etc/llm-cluster/gateway/conf/llm/gateway_affinity.lua",
    ]


def test_the_usage_dir_and_delete_scripts_quote_their_paths() -> None:
    assert usage_dir_script("/var/log/x y") == (
        "#!/usr/bin/env bash\n# llm-cluster: the gateway's usage-log directory\nset -euo pipefail\n"
        "install -d -m 0750 -o 101 -g 101 '/var/log/x y'\n"
    )
    assert config_delete_script("/a b") == (
        "#!/usr/bin/env bash\n# llm-cluster: remove the gateway config\nset -euo pipefail\nrm -rf -- '/a b'\n"
    )
    assert config_delete_script() == (
        "#!/usr/bin/env bash\n# llm-cluster: remove the gateway config\nset -euo pipefail\n"
        "rm -rf -- /etc/llm-cluster/gateway/conf\n"
    )


@pytest.mark.parametrize(
    ("port", "tls", "max_time", "probe"),
    [
        (443, True, 3, "curl -sk -o /dev/null -w '%{http_code}' --max-time 3 https://127.0.0.1:443/v1/models"),
        (8080, False, 5, "curl -sk -o /dev/null -w '%{http_code}' --max-time 5 http://127.0.0.1:8080/v1/models"),
        # A float timeout is written whole (curl's --max-time in the healthcheck reads seconds).
        (80, False, 2.9, "curl -sk -o /dev/null -w '%{http_code}' --max-time 2 http://127.0.0.1:80/v1/models"),
    ],
)
def test_the_keyless_probe_is_one_curl_of_v1_models(port: int, tls: bool, max_time: Any, probe: str) -> None:
    assert keyless_probe(port, tls, max_time) == probe


@pytest.mark.parametrize(
    ("gateway", "probe"),
    [
        ({}, "curl -sk -o /dev/null -w '%{http_code}' --max-time 3 https://127.0.0.1:443/v1/models | grep -qx 401"),
        (
            {"auth": False, "apiKeys": [], "tls": False, "port": 8080},
            "curl -sk -o /dev/null -w '%{http_code}' --max-time 3 http://127.0.0.1:8080/v1/models | grep -qx 200",
        ),
    ],
)
def test_the_healthcheck_expects_401_or_200_without_auth(gateway: dict[str, Any], probe: str) -> None:
    assert healthcheck_probe(stack(**gateway)) == ["CMD-SHELL", probe]
    assert (keyless_status(True), keyless_status(False)) == (401, 200)


READINESS = """#!/usr/bin/env bash
# Readiness gate: wait until the gateway {meaning}.
set -euo pipefail
where={where}
deadline=$((SECONDS + {timeout}))
code=none
while [ "$SECONDS" -lt "$deadline" ]; do
  code=$(curl -sk -o /dev/null -w '%{{http_code}}' --max-time 5 {url} || true)
  if [ "$code" = {status} ]; then
    echo "gateway on $where is up and {meaning}"
    exit 0
  fi
  sleep 2
done
echo "gateway on $where did not answer {status} on /v1/models within {timeout}s" \\
  "(last status: $code); see: docker logs llm-gateway" >&2
exit 1
"""


@pytest.mark.parametrize(
    ("args", "kwargs", "fields"),
    [
        (
            (443, True),
            {},
            {
                "meaning": "refuses requests without a key",
                "where": "443",
                "timeout": 120,
                "url": "https://127.0.0.1:443/v1/models",
                "status": 401,
            },
        ),
        (
            (8080, False, 7.5),
            {"node": "gpu-01", "auth": False},
            {
                "meaning": "serves without a key (auth: false)",
                "where": "gpu-01:8080",
                "timeout": 7,
                "url": "http://127.0.0.1:8080/v1/models",
                "status": 200,
            },
        ),
    ],
)
def test_the_readiness_script_whole(args: tuple[Any, ...], kwargs: dict[str, Any], fields: dict[str, Any]) -> None:
    assert readiness_script(*args, **kwargs) == READINESS.format(**fields)


def test_each_temp_path_goes_under_the_temp_dir() -> None:
    assert temp_path_directives("/t") == [
        "client_body_temp_path /t/client_body;",
        "proxy_temp_path /t/proxy;",
        "fastcgi_temp_path /t/fastcgi;",
        "uwsgi_temp_path /t/uwsgi;",
        "scgi_temp_path /t/scgi;",
    ]
    assert "_temp_path" not in nginx_conf(stack(), GatewayLayout(port=80))


# --- nginx.conf whole: three stacks that take both sides of every branch ------------------------------------


def other_sides() -> StackSpec:
    """The other side of each of the reference stack's branches: plain HTTP, no affinity pool (chat least_conn by
    its own routing, the others one instance each), a model shared by two pools (an unweighted pool's servers
    weight 1, the other's 6), an alias, token budgets, a default rate limit and a key's own without burst, a
    concurrency cap, no upstream keepalive, a 2 MiB body."""
    config = prod_config()
    pools = config["llm-cluster:pools"]
    pools["canary"] = {**copy.deepcopy(pools["chat"]), "nodes": ["gpu-06"]}
    pools["chat"]["nodes"] = ["gpu-03", "gpu-04", "gpu-05"]
    pools["chat"]["routing"] = "least_conn"
    config["llm-cluster:gateway"].update(
        tls=False,
        port=8080,
        maxBodyMib=2,
        upstreamKeepalive=0,
        aliases={"fast": "chat"},
        poolWeights={"canary": 2},
        defaultTokenBudget={"tokens": 500},
        defaultRateLimit={"requestsPerSecond": 2, "burst": 4},
        apiKeys=[
            {"id": "default", "maxConcurrent": 4},
            {"id": "ops", "rateLimit": {"requestsPerSecond": 0.5}},
            {"id": "analyst", "models": ["reasoning"]},
        ],
    )
    return load_stack_config(config, set())


def open_loopback() -> StackSpec:
    """No auth, no path route, HTTPS with a plain port that redirects."""
    return stack(auth=False, apiKeys=[], pathRoutes={}, port=8443, httpRedirectPort=8080)


# A test's layout: every optional path unset or its other side (no modules to load, no Lua paths of the image,
# no worker user, no usage log, no metrics listener; a temp dir and a listen address).
LOOPBACK = GatewayLayout(
    port=8443,
    listen_address="127.0.0.1",
    conf_dir="/gw",
    load_modules=(),
    lua_path="",
    lua_cpath="",
    tls_dir="/gw/tls",
    pid_file="/gw/nginx.pid",
    error_log="/gw/error.log",
    temp_dir="/gw/tmp",
    user=None,
    worker_processes="2",
)

CONFIGS: dict[str, Callable[[], dict[str, str]]] = {
    "reference": lambda: nginx.gateway_files(stack()),
    "other-sides": lambda: nginx.gateway_files(other_sides()),
    "open-loopback": lambda: render_gateway(open_loopback(), LOOPBACK),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_nginx_conf_whole(name: str) -> None:
    assert CONFIGS[name]()["nginx.conf"] == (FIXTURES / f"{name}.nginx.conf").read_text()


def test_the_reference_routes_json_whole() -> None:
    # One key a line, indented by one: the file gateway.lua reads when nginx starts.
    assert nginx.gateway_files(stack())["llm/routes.json"] == (FIXTURES / "reference.routes.json").read_text()


@pytest.mark.parametrize(
    ("name", "files"),
    [
        ("reference", ["gateway.lua", "gateway_metrics.lua", "routes.json", "gateway_affinity.lua"]),
        ("other-sides", ["gateway.lua", "gateway_metrics.lua", "routes.json", "gateway_budget.lua"]),
        ("open-loopback", ["gateway.lua", "gateway_metrics.lua", "routes.json", "gateway_affinity.lua"]),
    ],
)
def test_the_lua_modules_go_in_only_where_a_pool_or_key_needs_them(name: str, files: list[str]) -> None:
    rendered = CONFIGS[name]()
    assert list(rendered) == ["nginx.conf", *(f"llm/{f}" for f in files)]
    for f in files:
        if f.endswith(".lua"):
            assert rendered[f"llm/{f}"] == (ROOT / "components/planning/gateway/lua" / f).read_text()


# --- the branches the three leave on one side ------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "block"),
    [
        # The container's: every address, the gateway's own port in the redirect.
        (
            None,
            ["    server {", "        listen 8080;", "        server_name gpu-01;"]
            + ["        return 308 https://$host:443$request_uri;", "    }"],
        ),
        (
            GatewayLayout(port=18443, listen_address="127.0.0.1"),
            ["    server {", "        listen 127.0.0.1:8080;", "        server_name gpu-01;"]
            + ["        return 308 https://$host:18443$request_uri;", "    }"],
        ),
    ],
)
def test_the_redirect_port_listens_where_the_gateway_does(layout: GatewayLayout | None, block: list[str]) -> None:
    spec = stack(httpRedirectPort=8080)
    conf = nginx_conf(spec, layout or container_layout(spec)).splitlines()
    at = conf.index(block[1]) - 1
    assert conf[at : at + 5] == block
    # Without TLS there is nothing to redirect to: the spec refuses the port, and no plain server is written.
    with pytest.raises(SpecError) as err:
        stack(tls=False, httpRedirectPort=8080)
    assert str(err.value) == "gateway.httpRedirectPort: redirects to HTTPS, which needs tls: true"
    assert "return 308" not in nginx_conf(stack(tls=False), GatewayLayout(port=80))


@pytest.mark.parametrize(
    ("weights", "servers"),
    [
        # A pool weighted 0 is drained: its servers stay, marked down.
        (
            {"canary": 0},
            [
                "server 192.168.10.13:8000 max_fails=2 fail_timeout=30s;",
                "server 192.168.10.14:8000 max_fails=2 fail_timeout=30s;",
                "server 192.168.10.15:8000 max_fails=2 fail_timeout=30s;",
                "server 192.168.10.16:8000 down max_fails=2 fail_timeout=30s;",
            ],
        ),
        (
            {"chat": 2, "canary": 1},
            [
                "server 192.168.10.13:8000 weight=2 max_fails=2 fail_timeout=30s;",
                "server 192.168.10.14:8000 weight=2 max_fails=2 fail_timeout=30s;",
                "server 192.168.10.15:8000 weight=2 max_fails=2 fail_timeout=30s;",
                "server 192.168.10.16:8000 weight=3 max_fails=2 fail_timeout=30s;",
            ],
        ),
    ],
)
def test_a_shared_models_upstream_weighs_each_pools_servers(weights: dict[str, int], servers: list[str]) -> None:
    config = prod_config()
    pools = config["llm-cluster:pools"]
    pools["canary"] = {**copy.deepcopy(pools["chat"]), "nodes": ["gpu-06"]}
    pools["chat"]["nodes"] = ["gpu-03", "gpu-04", "gpu-05"]
    config["llm-cluster:gateway"]["poolWeights"] = weights
    conf = nginx_conf(load_stack_config(config, set()), GatewayLayout(port=80))
    upstream = conf[conf.index("    upstream llm_model_qwen3-30b-a3b {") :].splitlines()
    assert [line.strip() for line in upstream[3:7]] == servers
    # Its location is a pool's, over the model's upstream; without token budgets, no budget header.
    location = conf[conf.index("        location @llm_model_qwen3-30b-a3b {") :].splitlines()
    pool = conf[conf.index("        location @llm_pool_chat {") :].splitlines()
    assert location[1] == "            proxy_pass http://llm_model_qwen3-30b-a3b;"
    assert location[2:21] == pool[2:21]
    assert pool[19:21] == ["            body_filter_by_lua_block { package.loaded.gateway.usage() }", "        }"]


def test_given_upstreams_replace_the_stacks_replicas_pool_by_pool() -> None:
    # The real-nginx tests point a pool at their fake replicas; a pool left out keeps the stack's.
    spec = stack(routing={"policy": "least_conn"})
    files = render_gateway(spec, GatewayLayout(port=80), {"chat": [("127.0.0.1", 9001), ("127.0.0.1", 9002)]})
    conf = files["nginx.conf"]
    assert conf[conf.index("    upstream llm_pool_chat {") :].splitlines()[3:5] == [
        "        server 127.0.0.1:9001 max_fails=2 fail_timeout=30s;",
        "        server 127.0.0.1:9002 max_fails=2 fail_timeout=30s;",
    ]
    assert "        server 192.168.10.11:8000 max_fails=2 fail_timeout=30s;" in conf
    assert "192.168.10.13" not in conf


ONE = "it has one instance (no other replica could take its requests)"


def _least_conn(key: str) -> str:
    return (
        f"it is routed by least_conn ({key}), nginx's own balancer, which takes a replica out only by a reload; "
        "routing: prefix makes it drainable"
    )


@pytest.mark.parametrize(
    ("chat", "gateway", "refusals"),
    [
        # Prefix affinity over four instances: drainable; listed first, the pools after it are still judged.
        ({}, {}, {"reasoning": ONE}),
        ({"nodes": ["gpu-03", "gpu-04"]}, {}, {"reasoning": ONE}),
        ({"nodes": ["gpu-03"]}, {}, {"reasoning": ONE, "chat": ONE}),
        (
            {"nodes": ["gpu-03", "gpu-04"], "routing": "least_conn"},
            {},
            {"reasoning": ONE, "chat": "pools.chat.routing"},
        ),
        ({}, {"routing": {"policy": "least_conn"}}, {"reasoning": ONE, "chat": "gateway.routing.policy"}),
    ],
)
def test_drain_refusals_say_why_each_pool_cannot_be_drained(
    chat: dict[str, Any], gateway: dict[str, Any], refusals: dict[str, str]
) -> None:
    config = prod_config()
    # The chat pool first: an affinity pool before one that is not.
    config["llm-cluster:pools"] = {
        "chat": {**config["llm-cluster:pools"]["chat"], **chat},
        "reasoning": config["llm-cluster:pools"]["reasoning"],
    }
    config["llm-cluster:gateway"].update(gateway)
    got = drain_refusals(load_stack_config(config, set()))
    assert got == {
        pool: f"pool '{pool}' cannot be drained at the gateway: " + (why if why == ONE else _least_conn(why))
        for pool, why in refusals.items()
    }


def test_a_replicas_503_is_retried_whatever_the_engine_calls_not_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = stack()
    assert failure_statuses(spec, "chat") == [500, 502, 503, 504]
    server = engine_server("vllm")
    monkeypatch.setattr(
        nginx, "engine_server", lambda _: type(server)(**{**vars(server), "not_ready_statuses": (425,)})
    )
    assert failure_statuses(spec, "chat") == [425, 500, 502, 503, 504]


@pytest.mark.parametrize(
    ("message", "body"),
    [
        (
            "X-Request-Id: none",
            '\'{"error": {"message": "X-Request-Id: none", "type": "t", "param": null, "code": "c"}}\'',
        ),
        ("a < b", '\'{"error": {"message": "a < b", "type": "t", "param": null, "code": "c"}}\''),
    ],
)
def test_an_error_body_is_openai_json_in_single_quotes(message: str, body: str) -> None:
    assert nginx._json_error(message, "c", "t") == body
    assert json.loads(body.strip("'")) == {"error": {"message": message, "type": "t", "param": None, "code": "c"}}


@pytest.mark.parametrize("message", ["it's", 'a \\"b\\"'])
def test_an_error_body_nginx_would_unescape_is_refused(message: str) -> None:
    with pytest.raises(AssertionError):
        nginx._json_error(message, "c", "t")


@pytest.mark.parametrize(
    ("value", "lua"),
    [
        (True, "true"),
        (False, "false"),  # before int: a bool is an int to Python, and `True` no Lua value
        (0, "0"),
        (1.25, "1.25"),
        ("/v1/models", '"/v1/models"'),
        ([1, "a", [False]], '{1, "a", {false}}'),
        ((0.5, "0.5"), '{0.5, "0.5"}'),
        # A name Lua reads bare as a key; any other (a DNS label's `-`, a leading digit) as a string key.
        ({"Zone_2": 1, "chat-a": {"x": True}, "9b": []}, '{Zone_2 = 1, ["chat-a"] = {x = true}, ["9b"] = {}}'),
    ],
)
def test_each_python_value_as_its_lua_literal(value: object, lua: str) -> None:
    assert nginx._lua_value(value) == lua


@pytest.mark.parametrize(
    ("max_series", "kib"),
    [
        # (series x 512 bytes + 5 histograms (2 pools, 2 models, 1) x 17 counters x 128 bytes) x 1.05, rounded up:
        (1, 1024),  # under the floor: 1 MiB
        (1936, 1028),  # 1027.56: the first size over the floor
        (2032, 1078),  # 1077.96, where one byte more a counter or one more counter would round to 1079
        (10000, 5262),
    ],
)
def test_the_metrics_zone_holds_every_series_and_histogram(max_series: int, kib: int) -> None:
    assert nginx.metrics_zone_kib(stack(metricsMaxSeries=max_series)) == kib


def test_the_drain_refusal_is_escaped_for_nginxs_single_quotes() -> None:
    server = nginx._metrics_server(
        GatewayLayout(port=80, metrics_listen="127.0.0.1:9145"), admin=False, refusals={"a": "pool 'a' no", "b": "b"}
    )
    assert server[server.index("        location = /admin/drain {") :][:5] == [
        "        location = /admin/drain {",
        "            default_type application/json;",
        """            return 409 '{"error": "no pool of this gateway can be drained here: pool \\'a\\' no; b"}';""",
        "        }",
        "        location / {",
    ]
    # No metrics listener: no server at all.
    assert nginx._metrics_server(GatewayLayout(port=80), admin=True, refusals={}) == []


@pytest.mark.parametrize("why", ["costs $5", "a \\ b"])
def test_a_drain_refusal_nginx_would_read_as_a_variable_or_escape_is_refused(why: str) -> None:
    with pytest.raises(AssertionError):
        nginx._metrics_server(GatewayLayout(port=80, metrics_listen="127.0.0.1:9145"), admin=False, refusals={"a": why})


def write_fixtures() -> None:
    """Write the committed configs from the generator as it is (after a deliberate change: review the diff)."""
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, render in CONFIGS.items():
        (FIXTURES / f"{name}.nginx.conf").write_text(render()["nginx.conf"])
    (FIXTURES / "reference.routes.json").write_text(nginx.gateway_files(stack())["llm/routes.json"])


if __name__ == "__main__":
    write_fixtures()
    sys.exit(0)
