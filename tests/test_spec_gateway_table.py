"""The gateway section's own rules as a table: both sides of each, the refused side with its exact message
naming the stack key and what is allowed, the accepted side with the value the plan reads."""

from __future__ import annotations

from typing import Any

import pytest

from components.planning.load import load_stack_config
from components.spec import SpecError, StackSpec
from tests.conftest import prod_config

NS = "llm-cluster:"
RATE = "nginx rates are whole requests per second or per minute, e.g. 0.5 (= 30/min)"
DIR = "must be an absolute directory of its own (e.g. /var/log/llm-gateway)"
MIRROR = (
    "must be an http:// or https:// URL of a Debian archive without spaces or quotes, e.g. http://deb.debian.org/debian"
)
NO_AUTH = "keys and limits are not checked when auth is false; remove them or set auth: true"
ROUTE = "must start with / and end with /v1/ (e.g. /smart/v1/)"
ROUTE_CHARS = "may hold only letters, digits and / - _ ."
TLS = "must be a DNS name or an IPv4 address"
ALIAS = "must be a non-empty printable name without quotes or backslashes"


def gateway_spec(**gateway: Any) -> StackSpec:
    """The reference stack with a `canary` pool sharing chat's model (gpu-06), its gateway keys set."""
    config = prod_config()
    pools = config[NS + "pools"]
    pools["canary"] = {**pools["chat"], "nodes": ["gpu-06"]}
    pools["chat"]["nodes"] = ["gpu-03", "gpu-04", "gpu-05"]
    config[NS + "gateway"].update(gateway)
    return load_stack_config(config, set())


REFUSED: list[tuple[dict[str, Any], str]] = [
    (
        {"defaultRateLimit": {"requestsPerSecond": 0.3333}},
        "gateway.defaultRateLimit.requestsPerSecond: 0.3333 requests/s is not a whole number of requests per "
        f"minute (19.9980/min); {RATE}",
    ),
    # Just past the rounding tolerance (1e-6 of a request per minute).
    (
        {"defaultRateLimit": {"requestsPerSecond": 0.0166669}},
        "gateway.defaultRateLimit.requestsPerSecond: 0.0166669 requests/s is not a whole number of requests per "
        f"minute (1.0000/min); {RATE}",
    ),
    # Within the tolerance of a whole number of requests per minute, but that number is 0 (nginx `0r/m`).
    (
        {"defaultRateLimit": {"requestsPerSecond": 1e-9}},
        "gateway.defaultRateLimit.requestsPerSecond: 1e-09 requests/s is less than one request per minute; "
        "nginx's slowest rate is one per minute (0.0166667)",
    ),
    (
        {"apiKeys": [{"id": "team", "rateLimit": {"requestsPerSecond": 2.001}}]},
        "gateway.apiKeys[0].rateLimit.requestsPerSecond: 2.001 requests/s is not a whole number of requests per "
        f"minute (120.0600/min); {RATE}",
    ),
    ({"usageLog": {"dir": "var/log/llm-gateway"}}, f"gateway.usageLog.dir: 'var/log/llm-gateway' {DIR}"),
    ({"usageLog": {"dir": ""}}, f"gateway.usageLog.dir: '' {DIR}"),
    ({"usageLog": {"dir": "/"}}, f"gateway.usageLog.dir: '/' {DIR}"),
    ({"usageLog": {"dir": "/var/log/"}}, f"gateway.usageLog.dir: '/var/log/' {DIR}"),
    ({"usageLog": {"dir": "/var/log"}}, f"gateway.usageLog.dir: '/var/log' {DIR}"),
    ({"usageLog": {"dir": "/var"}}, f"gateway.usageLog.dir: '/var' {DIR}"),
    ({"usageLog": {"dir": "/etc/"}}, f"gateway.usageLog.dir: '/etc/' {DIR}"),
    ({"usageLog": {"dir": "/tmp"}}, f"gateway.usageLog.dir: '/tmp' {DIR}"),
    (
        {"imageBuild": {"debianMirror": "ftp://deb.example/debian"}},
        f"gateway.imageBuild.debianMirror: 'ftp://deb.example/debian' {MIRROR}",
    ),
    (
        {"imageBuild": {"debianMirror": "http://a b/debian"}},
        f"gateway.imageBuild.debianMirror: 'http://a b/debian' {MIRROR}",
    ),
    (
        {"imageBuild": {"debianMirror": "http://x:123456/d"}},
        f"gateway.imageBuild.debianMirror: 'http://x:123456/d' {MIRROR}",
    ),
    (
        {"imageBuild": {"debianSecurityMirror": "http://x/a'b"}},
        f'gateway.imageBuild.debianSecurityMirror: "http://x/a\'b" {MIRROR}',
    ),
    (
        {"image": "nginx:1.27", "imageBuild": {"debianMirror": "http://deb.debian.org/debian"}},
        "gateway.imageBuild: applies only to the default image "
        "llm-cluster/gateway:nginx-1.26.3-3-deb13u12-lua-0.10.28-2 (built on the gateway node); nginx:1.27 is "
        "pulled: remove imageBuild or gateway.image",
    ),
    ({"auth": False, "apiKeys": [{"id": "team"}]}, f"gateway.apiKeys: {NO_AUTH}"),
    (
        {"auth": False, "apiKeys": [], "defaultRateLimit": {"requestsPerSecond": 1}},
        f"gateway.defaultRateLimit: {NO_AUTH}",
    ),
    ({"auth": False, "apiKeys": [], "defaultMaxConcurrent": 4}, f"gateway.defaultMaxConcurrent: {NO_AUTH}"),
    ({"auth": False, "apiKeys": [], "defaultTokenBudget": {"tokens": 100}}, f"gateway.defaultTokenBudget: {NO_AUTH}"),
    ({"pathRoutes": {"smart/v1/": "reasoning"}}, f"gateway.pathRoutes: path route 'smart/v1/' {ROUTE}"),
    ({"pathRoutes": {"/smart/v1": "reasoning"}}, f"gateway.pathRoutes: path route '/smart/v1' {ROUTE}"),
    (
        {"pathRoutes": {"/v1/": "reasoning"}},
        "gateway.pathRoutes: path route '/v1/' is the gateway's own model-routed prefix; use defaultPool for it",
    ),
    ({"pathRoutes": {"/a b/v1/": "reasoning"}}, f"gateway.pathRoutes: path route '/a b/v1/' {ROUTE_CHARS}"),
    ({"pathRoutes": {"/a;b/v1/": "reasoning"}}, f"gateway.pathRoutes: path route '/a;b/v1/' {ROUTE_CHARS}"),
    ({"tlsNames": ["gw.example", ""]}, f"gateway.tlsNames: TLS name '' {TLS}"),
    ({"tlsNames": ["a_b"]}, f"gateway.tlsNames: TLS name 'a_b' {TLS}"),
    ({"tlsNames": ["a b"]}, f"gateway.tlsNames: TLS name 'a b' {TLS}"),
    ({"poolWeights": {"chat": -1, "canary": 1}}, "gateway.poolWeights: weight of pool 'chat' must be 0..1000, got -1"),
    (
        {"poolWeights": {"chat": 1, "canary": 1001}},
        "gateway.poolWeights: weight of pool 'canary' must be 0..1000, got 1001",
    ),
    ({"aliases": {"": "chat"}}, f"gateway.aliases: alias '' {ALIAS}"),
    ({"aliases": {'a"b': "chat"}}, f"gateway.aliases: alias 'a\"b' {ALIAS}"),
    ({"aliases": {"a\\b": "chat"}}, f"gateway.aliases: alias 'a\\\\b' {ALIAS}"),
    ({"aliases": {"a\tb": "chat"}}, f"gateway.aliases: alias 'a\\tb' {ALIAS}"),
]


@pytest.mark.parametrize(
    ("gateway", "message"), REFUSED, ids=[m.split(":")[0] + f"-{i}" for i, (_, m) in enumerate(REFUSED)]
)
def test_refused_gateway_values_name_the_key_and_what_is_allowed(gateway: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        gateway_spec(**gateway)
    assert [str(i) for i in err.value.issues] == [message]


def test_rates_within_a_millionth_of_a_whole_request_per_minute_pass() -> None:
    spec = gateway_spec(
        defaultRateLimit={"requestsPerSecond": 0.01666668},
        apiKeys=[{"id": "a", "rateLimit": {"requestsPerSecond": 0.5}}],
    )
    assert spec.gateway is not None and spec.gateway.default_rate_limit is not None
    assert spec.gateway.default_rate_limit.requests_per_second == 0.01666668
    assert spec.gateway.api_keys[0].rate_limit is not None
    assert spec.gateway.api_keys[0].rate_limit.requests_per_second == 0.5


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("/var/log/llm-gateway/", "/var/log/llm-gateway"),
        ("/tmp/usage", "/tmp/usage"),
        ("/var/log/x", "/var/log/x"),
        ("/srv", "/srv"),
    ],
)
def test_usage_log_dirs_of_their_own_pass_without_a_trailing_slash(given: str, kept: str) -> None:
    spec = gateway_spec(usageLog={"dir": given})
    assert spec.gateway is not None and spec.gateway.usage_log.dir == kept


@pytest.mark.parametrize(
    ("build", "args"),
    [
        (
            {},
            {
                "DEBIAN_MIRROR": "http://deb.debian.org/debian",
                "DEBIAN_SECURITY_MIRROR": "http://deb.debian.org/debian-security",
                "APT_CHECK_VALID_UNTIL": "yes",
            },
        ),
        (
            {
                "debianMirror": "https://m.example:8080/debian/",
                "debianSecurityMirror": "http://sec.example/debian-security/",
            },
            {
                "DEBIAN_MIRROR": "https://m.example:8080/debian",
                "DEBIAN_SECURITY_MIRROR": "http://sec.example/debian-security",
                "APT_CHECK_VALID_UNTIL": "yes",
            },
        ),
        (
            {"debianMirror": "http://x", "checkValidUntil": False},
            {
                "DEBIAN_MIRROR": "http://x",
                "DEBIAN_SECURITY_MIRROR": "http://deb.debian.org/debian-security",
                "APT_CHECK_VALID_UNTIL": "no",
            },
        ),
    ],
)
def test_image_build_mirrors_become_the_dockerfiles_arguments(build: dict[str, Any], args: dict[str, str]) -> None:
    spec = gateway_spec(imageBuild=build)
    assert spec.gateway is not None
    assert spec.gateway.image_build.args() == args


def test_without_auth_an_empty_key_list_passes() -> None:
    spec = gateway_spec(auth=False, apiKeys=[])
    assert spec.gateway is not None and spec.gateway.auth is False and spec.gateway.api_keys == []


def test_allowed_side_of_routes_tls_names_weights_and_aliases() -> None:
    spec = gateway_spec(
        pathRoutes={"/smart/v1/": "reasoning", "/a_b-c.d/v1/": "chat"},
        tlsNames=["gw.example", "10.0.0.1", "a-b"],
        poolWeights={"chat": 0, "canary": 1000},
        aliases={"fast": "chat", "a b": "canary"},
    )
    g = spec.gateway
    assert g is not None
    assert g.path_routes == {"/smart/v1/": "reasoning", "/a_b-c.d/v1/": "chat"}
    assert g.tls_names == ["gw.example", "10.0.0.1", "a-b"]
    assert g.pool_weights == {"chat": 0, "canary": 1000}
    assert g.aliases == {"fast": "chat", "a b": "canary"}
