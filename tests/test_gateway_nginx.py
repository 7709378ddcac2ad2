"""The generated gateway on the real nginx + Lua, on loopback, in front of fake OpenAI replicas (the
harness: tests/support/gateway.py).

The nginx, its Lua module, LuaJIT and the Lua libraries are the gateway image's own pinned Debian
packages (tests/support/deployed_nginx.py), never the machine's.

Fake replicas are Python HTTP/1.1 servers in threads that record every request and answer like vLLM's
OpenAI server (JSON with `usage`, or SSE chunks ending with a usage chunk and `[DONE]`). API keys
come from the real host script (keys_script), so the digests gateway.lua looks up are the ones bash wrote.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import socket
import ssl
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.planning.gateway.layout import GatewayLayout
from components.planning.gateway.nginx import LUA_SOURCE, LUA_VM_SETTINGS, readiness_script, render_gateway
from components.planning.load import load_stack_config
from tests.conftest import prod_config
from tests.support import free_port
from tests.support.gateway import (
    CHAT,
    R1,
    STREAM_USAGE,
    USAGE,
    WAIT,
    FakeReplica,
    NginxGateway,
    by_name,
    error_code,
    gateway_config,
    host_keys,
    log_line,
    lua_layout,
    lua_reports,
    nginx_binary,
    own_gateway,
    self_signed,
    send_held,
)


@pytest.fixture(scope="module")
def gw_keys(
    tmp_path_factory: pytest.TempPathFactory, replicas: dict[str, list[FakeReplica]]
) -> Iterator[tuple[NginxGateway, dict[str, str]]]:
    spec = load_stack_config(gateway_config(), set())
    keys, digests = host_keys(spec, tmp_path_factory.mktemp("keys"))
    gw = NginxGateway(spec, replicas, tmp_path_factory.mktemp("gateway"), digests)
    yield gw, keys
    gw.stop()


@pytest.fixture
def gw(gw_keys: tuple[NginxGateway, dict[str, str]]) -> NginxGateway:
    return gw_keys[0]


@pytest.fixture
def keys(gw_keys: tuple[NginxGateway, dict[str, str]]) -> dict[str, str]:
    return gw_keys[1]


# --- nginx -t -----------------------------------------------------------------------------------


VARIANTS: dict[str, dict[str, Any]] = {
    "reference": {},
    "plain-http": {"tls": False, "port": 80},
    "no-keys-no-limits": {"apiKeys": []},
    "default-limit-zones": {
        "defaultRateLimit": {"requestsPerSecond": 0.5, "burst": 2},
        "apiKeys": [{"id": "a"}, {"id": "b", "rateLimit": {"requestsPerSecond": 3}}],
    },
    "aliases-allowlists": {
        "aliases": {"fast": "chat", "smart": "reasoning"},
        "apiKeys": [{"id": "x", "models": ["fast", "deepseek-r1"]}],
    },
    "two-prefixes-big-body": {
        "pathRoutes": {"/smart/v1/": "reasoning", "/team/chat/v1/": "chat"},
        "maxBodyMib": 256,
        "upstreamKeepalive": 0,
    },
    "tls-from-secrets": {"tls": True, "port": 443},
    "http-redirect": {"httpRedirectPort": 80},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_nginx_accepts_the_generated_config(variant: str, tmp_path: Path) -> None:
    config = prod_config()
    config["llm-cluster:gateway"].update(VARIANTS[variant])
    secrets = set()
    if variant == "tls-from-secrets":
        config["llm-cluster:gatewayTlsCert"] = config["llm-cluster:gatewayTlsKey"] = "[secret]"
        secrets = {"llm-cluster:gatewayTlsCert", "llm-cluster:gatewayTlsKey"}
    spec = load_stack_config(config, secrets)
    layout = GatewayLayout(
        port=free_port(),
        listen_address="127.0.0.1",
        conf_dir=str(tmp_path),
        **lua_layout(),
        digests_file=str(tmp_path / "digests.json"),
        tls_dir=str(self_signed(tmp_path / "tls")),
        pid_file=str(tmp_path / "pid"),
        error_log=str(tmp_path / "error.log"),
        usage_dir=str(tmp_path / "usage"),
        temp_dir=str(tmp_path / "tmp"),
        user=None,
    )
    # The deployed upstreams (the stack's node addresses): nginx -t does not connect to them.
    for rel, text in render_gateway(spec, layout).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "digests.json").write_text("{}")
    (tmp_path / "tmp").mkdir()
    result = subprocess.run(
        [nginx_binary(), "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr


def test_the_workers_collect_lua_garbage_with_the_pause_the_master_set(tmp_path: Path) -> None:
    # collectgarbage("setpause", n) answers the pause it replaces: a worker's is the gateway's (set in
    # the master's init_by_lua, before the fork), where a worker of an nginx without it has LuaJIT's 200.
    (tmp_path / "gateway").mkdir()
    (tmp_path / "default").mkdir()
    report = 'ngx.print(collectgarbage("setpause", 200))'
    assert lua_reports(tmp_path / "gateway", report, init=LUA_VM_SETTINGS) == "400"
    assert lua_reports(tmp_path / "default", report) == "200"


# --- routing ------------------------------------------------------------------------------------


def test_a_port_taken_before_nginx_binds_it_moves_the_gateway_to_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another process holds the port free_port gave: nginx exits (Address already in use), a second port is tried.
    with socket.create_server(("127.0.0.1", 0)) as taken:
        held = taken.getsockname()[1]
        ports = iter([held])
        fresh = free_port  # the harness's, before the patch
        monkeypatch.setattr("tests.support.gateway.free_port", lambda: next(ports, None) or fresh())
        spec = load_stack_config(gateway_config(), set())
        with own_gateway(spec, {"chat": [FakeReplica("c")], "reasoning": [FakeReplica("r")]}, tmp_path) as (gw, keys):
            assert gw.port != held
            assert gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"])[0] == 200


def test_routes_by_model_to_the_pool_that_serves_it(
    gw: NginxGateway, keys: dict[str, str], replicas: dict[str, list[FakeReplica]]
) -> None:
    chat_names = {r.name for r in replicas["chat"]}
    for model in (CHAT, "/data/models/Qwen3-30B-A3B"):
        status, _, out = gw.call("POST", "/v1/chat/completions", {"model": model, "messages": []}, keys["default"])
        assert status == 200 and out["served_by"] in chat_names and out["model"] == model
    for endpoint in ("chat/completions", "completions", "embeddings"):
        status, _, out = gw.call("POST", f"/v1/{endpoint}", {"model": R1}, keys["default"])
        assert (status, out["served_by"], out["path"]) == (200, "reasoning-0", f"/v1/{endpoint}")


def test_path_route_pins_its_pool_and_rewrites_the_prefix(gw: NginxGateway, keys: dict[str, str]) -> None:
    status, _, out = gw.call("POST", "/smart/v1/chat/completions?x=1", {"model": R1}, keys["default"])
    assert (status, out["served_by"], out["path"]) == (200, "reasoning-0", "/v1/chat/completions?x=1")
    status, _, out = gw.call("POST", "/smart/v1/chat/completions", {"model": CHAT}, keys["default"])
    assert status == 404 and error_code(out) == "model_not_found"
    assert out["error"]["message"] == (
        "The model 'qwen3-30b-a3b' does not exist under /smart/v1/. "
        "Available models: deepseek-r1, /data/models/DeepSeek-R1-GPTQ-Int4"
    )


def test_alias_reaches_its_pool_with_the_served_name(
    gw: NginxGateway, keys: dict[str, str], replicas: dict[str, list[FakeReplica]]
) -> None:
    status, _, out = gw.call(
        "POST",
        "/v1/chat/completions",
        {"model": "fast", "messages": [{"role": "user", "content": "你好"}], "rid": "alias"},
        keys["default"],
    )
    assert status == 200 and out["model"] == CHAT
    sent = [r for rs in replicas["chat"] for r in rs.requests if r["body"].get("rid") == "alias"]
    assert [r["body"] for r in sent] == [
        {"model": CHAT, "messages": [{"role": "user", "content": "你好"}], "rid": "alias"}
    ]


@pytest.mark.parametrize(
    ("sent", "received"),
    [
        # Every byte but the name as the client sent it: numbers beyond a double's precision, key order,
        # escapes, empty arrays, a nested `model` (not the request's).
        (
            b'{"model": "fast", "rid": "as-sent", "messages": [], "seed": 123456789012345678901, "t": 0.1, '
            b'"m": {"model": "fast"}, "s": "a\\/b\\"c"}',
            b'{"model": "qwen3-30b-a3b", "rid": "as-sent", "messages": [], "seed": 123456789012345678901, "t": 0.1, '
            b'"m": {"model": "fast"}, "s": "a\\/b\\"c"}',
        ),
        (
            b' {"rid":"as-sent-escaped","\\u006dodel" :\t"f\\u0061st" }',
            b' {"rid":"as-sent-escaped","\\u006dodel" :\t"qwen3-30b-a3b" }',
        ),
        (
            b'{"model": "fast", "rid": "as-sent-twice", "model": "fast"}',
            b'{"model": "qwen3-30b-a3b", "rid": "as-sent-twice", "model": "qwen3-30b-a3b"}',
        ),
    ],
)
def test_an_aliased_body_changes_only_in_its_model(
    gw: NginxGateway, keys: dict[str, str], replicas: dict[str, list[FakeReplica]], sent: bytes, received: bytes
) -> None:
    status, _, out = gw.call("POST", "/v1/chat/completions", raw=sent, key=keys["default"])
    rid = json.loads(sent)["rid"]
    assert (status, out["model"], out["rid"]) == (200, CHAT, rid)
    assert [r["raw"] for rs in replicas["chat"] for r in rs.requests if r["body"].get("rid") == rid] == [received]


def test_least_conn_spreads_requests_and_avoids_a_busy_replica(
    gw: NginxGateway, keys: dict[str, str], replicas: dict[str, list[FakeReplica]]
) -> None:
    chat = replicas["chat"]
    before = {r.name: len(r.requests) for r in chat}
    for _ in range(8):
        assert gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"])[0] == 200
    spread = [len(r.requests) - before[r.name] for r in chat]
    assert min(spread) >= 1 and max(spread) <= 3, spread

    # One replica busy with a long request: least_conn sends everything else to the idle ones.
    busy, client, held = send_held(gw, keys["default"], chat, "busy")
    try:
        served = [
            gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"])[2]["served_by"] for _ in range(6)
        ]
        assert busy.name not in served and len(set(served)) == 3, served
    finally:
        busy.gates["busy"].set()
        client.join(WAIT)
    assert held["result"][0] == 200


def test_models_list_is_answered_by_the_gateway_per_key_and_prefix(
    gw: NginxGateway, keys: dict[str, str], replicas: dict[str, list[FakeReplica]]
) -> None:
    status, _, out = gw.call("GET", "/v1/models", key=keys["default"])
    assert status == 200 and out["object"] == "list"
    assert [m["id"] for m in out["data"]] == [
        CHAT,
        "/data/models/Qwen3-30B-A3B",
        "fast",
        R1,
        "/data/models/DeepSeek-R1-GPTQ-Int4",
    ]
    created = out["data"][0]["created"]
    assert isinstance(created, int) and abs(created - time.time()) < 3600
    assert out["data"][0] == {
        "id": CHAT,
        "object": "model",
        "created": created,
        "owned_by": "llm-cluster",
        "root": "/data/models/Qwen3-30B-A3B",
        "max_model_len": 32768,
    }
    assert list(out) == ["object", "data"] and all(list(m) == list(out["data"][0]) for m in out["data"])
    _, _, smart = gw.call("GET", "/smart/v1/models", key=keys["default"])
    assert [m["id"] for m in smart["data"]] == [R1, "/data/models/DeepSeek-R1-GPTQ-Int4"]
    _, _, analyst = gw.call("GET", "/v1/models", key=keys["analyst"])
    assert [m["id"] for m in analyst["data"]] == [R1, "/data/models/DeepSeek-R1-GPTQ-Int4"]
    assert not any("models" in r["path"] for rs in replicas.values() for rep in rs for r in rep.requests)


# --- errors -------------------------------------------------------------------------------------


def test_missing_or_wrong_key_is_401_before_anything_is_read(
    gw: NginxGateway, keys: dict[str, str], replicas: dict[str, list[FakeReplica]]
) -> None:
    seen = sum(len(r.requests) for r in by_name(replicas).values())
    for headers in (
        {},
        {"Authorization": "Bearer sk-wrong"},
        {"Authorization": f"Basic {keys['default']}"},
        {"Authorization": "Bearer "},
    ):
        for method, path in (
            ("POST", "/v1/chat/completions"),
            ("GET", "/v1/models"),
            ("POST", "/smart/v1/completions"),
        ):
            status, hdrs, out = gw.call(method, path, {"model": CHAT} if method == "POST" else None, headers=headers)
            assert status == 401 and error_code(out) == "invalid_api_key", (headers, path)
            assert hdrs["www-authenticate"] == "Bearer"
    assert sum(len(r.requests) for r in by_name(replicas).values()) == seen


def test_only_the_bearer_scheme_carries_a_key(gw: NginxGateway, keys: dict[str, str]) -> None:
    key = keys["default"]
    # The scheme is case-insensitive (RFC 7235 §2.1)…
    for scheme in ("Bearer", "bearer", "BEARER"):
        assert gw.call("GET", "/v1/models", headers={"Authorization": f"{scheme} {key}"})[0] == 200, scheme
    # Blanks around the key are not part of it.
    assert gw.call("GET", "/v1/models", headers={"Authorization": f"Bearer   {key}\t "})[0] == 200
    # …but only Bearer carries an API key: a valid key under any other scheme is refused. The 7-character
    # ones ("Basic  ", "Digest ") put the key exactly where a Bearer key would be, so only the scheme
    # check tells them apart.
    for header in (f"Basic {key}", f"Basic  {key}", f"Digest {key}", f"Token  {key}", key, f"Bearer{key}"):
        status, hdrs, out = gw.call("GET", "/v1/models", headers={"Authorization": header})
        assert (status, error_code(out), hdrs["www-authenticate"]) == (401, "invalid_api_key", "Bearer"), header


def test_every_header_with_a_key_passes_past_the_workers_header_bound_and_a_revoked_key_fails_at_once(
    tmp_path: Path, replicas: dict[str, list[FakeReplica]]
) -> None:
    spec = load_stack_config(gateway_config(), set())
    keys, digests = host_keys(spec, tmp_path / "keys")
    gw = NginxGateway(spec, replicas, tmp_path / "gateway", digests)
    try:
        key = keys["analyst"]  # (no rate limit: the default key's would answer 429s here)
        # gateway.lua remembers the headers that carried a known key, up to a bound, then starts
        # again: more distinct headers with one key than that (the blanks before it vary), on one
        # connection so one worker sees them all, every one of them the key. (What is remembered is
        # not visible from outside; a table that is emptied wrongly, or never, is.)
        found = re.search(r"^local HEADER_CACHE_MAX = (\d+)$", LUA_SOURCE.read_text(), re.M)
        assert found is not None
        bound = int(found.group(1))
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=WAIT)
        statuses = Counter()
        for blanks in range(1, bound + 3):
            conn.request("GET", "/v1/models", headers={"Authorization": "Bearer" + " " * blanks + key})
            response = conn.getresponse()
            response.read()
            statuses[response.status] += 1
        conn.close()
        assert statuses == {200: bound + 2}
        # Revoked: its digest leaves the file and nginx reloads. No worker answers it from memory,
        # the header it just remembered included.
        table = json.loads(digests.read_text())
        del table[hashlib.sha256(key.encode()).hexdigest()]
        digests.write_text(json.dumps(table))
        gw.reload()
        for _ in range(6):
            assert gw.call("GET", "/v1/models", key=key)[0] == 401
            assert gw.call("GET", "/v1/models", key=keys["default"])[0] == 200
    finally:
        gw.stop()


def test_key_not_allowed_the_model_is_403(gw: NginxGateway, keys: dict[str, str]) -> None:
    status, _, out = gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["analyst"])
    assert status == 403 and error_code(out) == "model_not_allowed"
    assert out["error"]["message"] == (
        "The API key 'analyst' may not use the model 'qwen3-30b-a3b'. "
        "Allowed models: deepseek-r1, /data/models/DeepSeek-R1-GPTQ-Int4"
    )
    status, _, out = gw.call("POST", "/v1/chat/completions", {"model": R1}, keys["analyst"])
    assert (status, out["served_by"]) == (200, "reasoning-0")


def test_rate_limit_is_per_key_and_429_is_openai_json(gw: NginxGateway, keys: dict[str, str]) -> None:
    # `limited`: 1 request/minute with a burst of 1, so the third request in a row is refused.
    statuses = [gw.call("GET", "/v1/models", key=keys["limited"]) for _ in range(3)]
    assert [s for s, _, _ in statuses] == [200, 200, 429]
    assert error_code(statuses[2][2]) == "rate_limit_exceeded"
    assert statuses[2][2]["error"]["type"] == "requests"
    # Other keys have their own buckets.
    assert gw.call("GET", "/v1/models", key=keys["default"])[0] == 200


def test_unknown_model_is_404_listing_the_available_ones(gw: NginxGateway, keys: dict[str, str]) -> None:
    status, _, out = gw.call("POST", "/v1/completions", {"model": "gpt-4o"}, keys["default"])
    assert status == 404 and error_code(out) == "model_not_found" and out["error"]["param"] == "model"
    assert out["error"]["message"] == (
        "The model 'gpt-4o' does not exist under /v1/. Available models: qwen3-30b-a3b, "
        "/data/models/Qwen3-30B-A3B, fast, deepseek-r1, /data/models/DeepSeek-R1-GPTQ-Int4"
    )


PARSE = "We could not parse the JSON body of your request: "
MISSING = "You must provide a model parameter (a string)."


# The parser's reason is cjson's (the Lua module's JSON library), its token names spelled out.
@pytest.mark.parametrize(
    ("raw", "code", "message"),
    [
        (
            b'{"model": "qwen3',
            "invalid_json",
            PARSE + "Expected value but found unexpected end of string at character 17",
        ),
        (b"", "invalid_json", PARSE + "Expected value but found the end of the body at character 1"),
        (b'{"model": "a",}', "invalid_json", PARSE + "Expected object key string but found '}' at character 15"),
        (b'{"model": "a"} x', "invalid_json", PARSE + "Expected the end but found invalid token at character 16"),
        (b'{"model": "a", "n": NaN}', "invalid_json", PARSE + "Expected value but found invalid token at character 21"),
        (b"[1, 2]", "invalid_json", "The request body must be a JSON object."),
        (b" null", "invalid_json", "The request body must be a JSON object."),
        (b'"qwen3-30b-a3b"', "invalid_json", "The request body must be a JSON object."),
        (b'{"messages": []}', "missing_model", MISSING),
        (b'{"model": 7}', "missing_model", MISSING),
        (b'{"model": ""}', "missing_model", MISSING),
        (b'{"model": null}', "missing_model", MISSING),
        # Only the top level's `model` counts: one inside another member is not the request's.
        (b'{"messages": [{"model": "qwen3-30b-a3b"}], "x": {"model": "qwen3-30b-a3b"}}', "missing_model", MISSING),
    ],
)
def test_bad_json_or_missing_model_is_400(
    gw: NginxGateway, keys: dict[str, str], raw: bytes, code: str, message: str
) -> None:
    status, headers, out = gw.call("POST", "/v1/chat/completions", raw=raw, key=keys["default"])
    assert (status, error_code(out), out["error"]["message"]) == (400, code, message)
    assert out["error"]["param"] == ("model" if code == "missing_model" else None)
    assert headers["content-type"] == "application/json"


LONG = "x" * 300  # longer than gateway.lua's LONG_STRING: checked by gateway.lua, not read by cjson


@pytest.mark.parametrize(
    ("raw", "code", "message"),
    [
        # A long string's escapes are cjson's to judge, with its own reason and position.
        (
            '{"model": "deepseek-r1", "prompt": "' + LONG + '\\x"}',
            "invalid_json",
            PARSE + "Expected value but found invalid escape code at character 337",
        ),
        (
            '{"model": "deepseek-r1", "prompt": "' + LONG + '\\ud800"}',
            "invalid_json",
            PARSE + "Expected value but found invalid unicode escape code at character 337",
        ),
        (
            '{"model": "deepseek-r1", "prompt": "' + LONG + '"',
            "invalid_json",
            PARSE + "Expected comma or object end but found the end of the body at character 338",
        ),
        (
            '{"model": "deepseek-r1", "prompt": "' + LONG,
            "invalid_json",
            PARSE + "Expected value but found unexpected end of string at character 337",
        ),
        (
            '{"model": "deepseek-r1", "prompt": "' + LONG + '" x}',
            "invalid_json",
            PARSE + "Expected comma or object end but found invalid token at character 339",
        ),
        ('{"model": "' + LONG + '", "prompt": "' + LONG + '"}', "model_not_found", None),
        ('{"model": "", "prompt": "' + LONG + '"}', "missing_model", MISSING),
        ('{"prompt": "' + LONG + '"}', "missing_model", MISSING),
    ],
)
def test_a_body_with_long_strings_is_judged_as_cjson_judges_it(
    gw: NginxGateway, keys: dict[str, str], raw: str, code: str, message: str | None
) -> None:
    status, _, out = gw.call("POST", "/v1/chat/completions", raw=raw.encode(), key=keys["default"])
    assert (status, error_code(out)) == ({"model_not_found": 404}.get(code, 400), code)
    if message is not None:
        assert out["error"]["message"] == message


@pytest.mark.parametrize(
    "raw",
    [
        '{"prompt": "' + LONG + '", "model": "deepseek-r1"}',
        '{"messages": [{"role": "user", "content": "'
        + LONG
        + '\\n\\"q\\" \\\\ \\/ \\t\\b\\f\\r"}], "model": "deepseek-r1"}',
        '{"model": "qwen3-30b-a3b", "m": "' + LONG + '\\u00e9", "model": "deepseek-r1"}',
        '{"model": "qwen3-30b-a3b", "a": ["'
        + LONG
        + '", {"model": "x"}], "model": "deepseek-r1", "b": "'
        + LONG
        + '"}',
        '{"' + LONG + '": 1, "model": "deepseek-r1"}',
        '{"model": "deepseek-r1", "end": "' + LONG + '\\\\"}',
    ],
)
def test_long_strings_do_not_change_the_model_json_reads(gw: NginxGateway, keys: dict[str, str], raw: str) -> None:
    status, _, out = gw.call("POST", "/v1/chat/completions", raw=raw.encode(), key=keys["default"])
    assert (status, out["served_by"]) == (200, "reasoning-0"), out


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"deepseek-r1"}',
        b'  {\n "model" : "deepseek-r1" }',
        b'{"model": "deepseek\\u002dr1"}',
        b'{"\\u006dodel": "deepseek-r1"}',
        b'{"model": "qwen3-30b-a3b", "model": "deepseek-r1"}',
        b'{"messages": [{"model": "qwen3-30b-a3b"}], "model": "deepseek-r1", "m": {"model": "fast"}}',
    ],
)
def test_the_model_is_the_top_level_member_as_json_reads_it(gw: NginxGateway, keys: dict[str, str], raw: bytes) -> None:
    # Escapes decoded, blanks anywhere, the last of two members (as Python's json, vLLM's, reads it),
    # never a nested `model`.
    status, _, out = gw.call("POST", "/v1/chat/completions", raw=raw, key=keys["default"])
    assert (status, out["served_by"]) == (200, "reasoning-0")


def test_body_over_the_limit_is_413(gw: NginxGateway, keys: dict[str, str]) -> None:
    big = {"model": CHAT, "prompt": "x" * (1024 * 1024)}  # maxBodyMib: 1
    status, _, out = gw.call("POST", "/v1/completions", big, keys["default"])
    assert status == 413 and error_code(out) == "request_too_large"
    assert out["error"]["message"] == "Request body too large: the gateway accepts at most 1 MiB."
    near = {"model": CHAT, "prompt": "x" * (1024 * 1024 - 100)}
    assert gw.call("POST", "/v1/completions", near, keys["default"])[0] == 200


def test_wrong_method_is_405(gw: NginxGateway, keys: dict[str, str]) -> None:
    status, headers, out = gw.call("GET", "/smart/v1/chat/completions", key=keys["default"])
    assert (status, headers["allow"], out) == (
        405,
        "POST",
        {
            "error": {
                "message": "Method GET is not allowed on /smart/v1/chat/completions; use POST.",
                "type": "invalid_request_error",
                "param": None,
                "code": "method_not_allowed",
            }
        },
    )
    status, headers, out = gw.call("PUT", "/v1/models", key=keys["default"])
    assert (status, headers["allow"], out["error"]["message"]) == (
        405,
        "GET, HEAD",
        "Method PUT is not allowed on /v1/models; use GET.",
    )


@pytest.mark.parametrize(
    "path",
    [
        "/metrics",
        "/health",
        "/load",
        "/ping",
        "/version",
        "/tokenize",
        "/v1/score",
        "/v1/chat/completions/",
        "/v1/../metrics",
        "/smart/metrics",
        "/smart/v1/../../health",
        "/",
        "/_llm_error/400",
    ],
)
def test_internal_endpoints_are_never_reachable(
    gw: NginxGateway, keys: dict[str, str], path: str, replicas: dict[str, list[FakeReplica]]
) -> None:
    seen = sum(len(r.requests) for r in by_name(replicas).values())
    for method in ("GET", "POST"):
        status, _, out = gw.call(method, path, {"model": CHAT} if method == "POST" else None, keys["default"])
        assert status == 404 and error_code(out) == "not_found"
    assert sum(len(r.requests) for r in by_name(replicas).values()) == seen


def test_replicas_never_see_the_clients_key(
    gw: NginxGateway, keys: dict[str, str], replicas: dict[str, list[FakeReplica]]
) -> None:
    assert gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"])[0] == 200
    received = [r for rep in by_name(replicas).values() for r in rep.requests]
    assert received and not any("authorization" in {h.lower() for h in r["headers"]} for r in received)
    assert all(r["headers"].get("X-Request-Id") for r in received)


def test_each_request_has_its_own_id_the_replica_and_the_usage_line_share(
    gw: NginxGateway, keys: dict[str, str], replicas: dict[str, list[FakeReplica]]
) -> None:
    """A routed request's id is gateway.lua's (a worker's random prefix and a count), one the
    refused requests get from nginx: 32 lowercase hex digits either way, never the same twice."""
    hexid = re.compile(r"[0-9a-f]{32}")
    sent = {}
    for i in range(6):  # each on a fresh connection: either worker may take it
        marker = f"rid{i}"
        assert gw.call("POST", f"/v1/chat/completions?t={marker}", {"model": CHAT}, keys["default"])[0] == 200
        got = [
            r["headers"]["X-Request-Id"]
            for rep in by_name(replicas).values()
            for r in rep.requests
            if r["path"] == "/v1/chat/completions?t=" + marker
        ]
        assert len(got) == 1 and hexid.fullmatch(got[0]), got
        sent[marker] = got[0]
    assert gw.call("POST", "/v1/chat/completions?t=rid-refused", {"model": CHAT}, "sk-not-a-key")[0] == 401
    logged = {marker: log_line(gw, marker)["request_id"] for marker in [*sent, "rid-refused"]}
    assert {m: logged[m] for m in sent} == sent
    assert hexid.fullmatch(logged["rid-refused"]) and len(set(logged.values())) == len(logged)


# --- streaming and usage ------------------------------------------------------------------------


def test_stream_chunks_reach_the_client_before_the_replica_finishes(
    gw: NginxGateway, keys: dict[str, str], replicas: dict[str, list[FakeReplica]]
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=WAIT)
    body = {"model": R1, "stream": True, "stream_options": {"include_usage": True}, "gate": "first-chunk"}
    conn.request(
        "POST",
        "/v1/chat/completions",
        json.dumps(body),
        {"Authorization": f"Bearer {keys['default']}", "Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    # The replica holds everything after its first event until this client has it: with buffering
    # this read would wait out the timeout and fail.
    first = resp.read1(65536)
    assert b'"t0"' in first and b'"t1"' not in first
    replica = by_name(replicas)["reasoning-0"]
    replica.gates["first-chunk"].set()
    rest = resp.read().decode()
    conn.close()
    assert rest.endswith("data: [DONE]\n\n") and '"t2"' in rest
    assert json.loads(rest.split("data: ")[-2])["usage"] == STREAM_USAGE


def test_log_lines_carry_key_id_model_pool_and_tokens_never_a_key(
    gw: NginxGateway, keys: dict[str, str], replicas: dict[str, list[FakeReplica]]
) -> None:
    # A query string marks this test's lines: the log is buffered and shared with the other tests.
    assert gw.call("POST", "/v1/chat/completions?t=plain", {"model": "fast"}, keys["default"])[0] == 200
    status, _, text = gw.call(
        "POST",
        "/smart/v1/chat/completions?t=stream",
        {"model": R1, "stream": True, "stream_options": {"include_usage": True}},
        keys["analyst"],
    )
    assert status == 200 and text.endswith("data: [DONE]\n\n")
    assert gw.call("POST", "/v1/chat/completions?t=refused", {"model": CHAT}, "sk-not-a-key")[0] == 401
    deadline = time.monotonic() + WAIT
    mine: dict[str, dict[str, Any]] = {}
    # This test's three lines: other tests on the shared gateway mark theirs with ?t= too (any order).
    while not {"plain", "stream", "refused"} <= set(mine) and time.monotonic() < deadline:
        mine = {line["path"].split("?t=")[1]: line for line in gw.log() if "?t=" in line["path"]}
        time.sleep(0.05)
    plain, stream, refused = mine["plain"], mine["stream"], mine["refused"]
    chat_addrs = {r.addr for r in replicas["chat"]}
    assert plain["key_id"] == "default" and plain["model"] == "fast" and plain["pool"] == "chat"
    assert plain["upstream"] in chat_addrs and plain["status"] == 200 and plain["upstream_status"] == "200"
    assert (plain["prompt_tokens"], plain["completion_tokens"], plain["total_tokens"]) == (11, 7, 18)
    assert plain["path"] == "/v1/chat/completions?t=plain" and plain["method"] == "POST"
    assert isinstance(plain["request_time"], float) and plain["request_bytes"] > 0 and plain["response_bytes"] > 0
    assert stream["key_id"] == "analyst" and stream["model"] == R1 and stream["pool"] == "reasoning"
    assert stream["upstream"] == by_name(replicas)["reasoning-0"].addr
    assert (stream["prompt_tokens"], stream["completion_tokens"], stream["total_tokens"]) == (5, 3, 8)
    assert refused["key_id"] == "" and refused["status"] == 401 and refused["prompt_tokens"] is None
    logs = "".join(f.read_text() for f in gw.usage_dir.glob("usage-*.log")) + (gw.root / "error.log").read_text()
    for key in [*keys.values(), "sk-not-a-key"]:
        assert key not in logs


@pytest.mark.parametrize("fragment", [1, 3, 7])
def test_usage_and_events_are_read_whatever_bytes_each_read_brings(
    gw: NginxGateway, keys: dict[str, str], fragment: int
) -> None:
    # The replica writes its answers a few bytes at a time: every marker ("usage", "data:") and the
    # usage object itself are cut across the pieces nginx reads and hands to the body filter.
    status, _, text = gw.call(
        "POST",
        f"/v1/chat/completions?t=frag-stream-{fragment}",
        {"model": R1, "stream": True, "stream_options": {"include_usage": True}, "fragment": fragment},
        keys["default"],
    )
    assert status == 200
    events = text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""] and json.loads(events[-3][len("data: ") :])["usage"] == STREAM_USAGE
    status, _, body = gw.call(
        "POST", f"/v1/chat/completions?t=frag-json-{fragment}", {"model": CHAT, "fragment": fragment}, keys["default"]
    )
    assert status == 200 and body["usage"] == USAGE
    deadline = time.monotonic() + WAIT
    mine: dict[str, dict[str, Any]] = {}
    while len(mine) < 2 and time.monotonic() < deadline:
        mine = {
            line["path"].split("?t=")[1]: line
            for line in gw.log()
            if "?t=frag-" in line["path"] and line["path"].endswith(f"-{fragment}")
        }
        time.sleep(0.05)
    stream, plain = mine[f"frag-stream-{fragment}"], mine[f"frag-json-{fragment}"]
    # 3 content events, the usage event, [DONE]; the counts of each usage object.
    assert (stream["events"], stream["prompt_tokens"], stream["completion_tokens"], stream["total_tokens"]) == (
        5,
        5,
        3,
        8,
    )
    assert (plain["events"], plain["prompt_tokens"], plain["completion_tokens"], plain["total_tokens"]) == (
        0,
        11,
        7,
        18,
    )


def test_usage_counts_are_read_from_a_pretty_printed_answer(gw: NginxGateway, keys: dict[str, str]) -> None:
    # Blanks and newlines around every `:` of the usage object (an engine that indents its JSON).
    status, _, body = gw.call("POST", "/v1/chat/completions?t=indented", {"model": CHAT, "indent": 2}, keys["default"])
    assert status == 200 and body["usage"] == USAGE
    line = log_line(gw, "indented")
    assert (line["prompt_tokens"], line["completion_tokens"], line["total_tokens"], line["events"]) == (11, 7, 18, 0)


# Every usage shape the engines' OpenAI servers send, through the gateway's accounting (its usage line).
# Counts 9 prompt + 5 completion = 14. vLLM writes prompt, total, completion, then prompt_tokens_details
# (null, or an object with enable_prompt_tokens_details); LMDeploy the same three without details;
# llama.cpp (nlohmann::json, keys sorted) completion, prompt, total, with `timings` beside `usage`, and
# in a stream usage and timings in the last chunk, the one with finish_reason. An embedding's usage has no
# completion_tokens; a stream without include_usage has no usage at all.
NINE_FIVE = {"prompt_tokens": 9, "total_tokens": 14, "completion_tokens": 5}
ALPHABETICAL = {"completion_tokens": 5, "prompt_tokens": 9, "total_tokens": 14}
TIMINGS = {"prompt_n": 9, "prompt_ms": 1.5, "predicted_n": 5, "predicted_ms": 2.5}
NO_COMPLETION = {"prompt_tokens": 9, "total_tokens": 9}
LLAMACPP_DETAILS = {
    "completion_tokens": 5,
    "completion_tokens_details": {"reasoning_tokens": 0},
    "prompt_tokens": 9,
    "prompt_tokens_details": {"cached_tokens": 4},
    "total_tokens": 14,
}


def _chunk(content: str | None = None, **extra: Any) -> dict[str, Any]:
    delta = {} if content is None else {"content": content}
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        **extra,
    }


USAGE_SHAPES: dict[str, tuple[dict[str, Any], tuple[int | None, int | None, int | None, int]]] = {
    "vllm-json": ({"answer_fields": {"usage": {**NINE_FIVE, "prompt_tokens_details": None}}}, (9, 5, 14, 0)),
    "vllm-json-cached-details": (
        {"answer_fields": {"usage": {**NINE_FIVE, "prompt_tokens_details": {"cached_tokens": 4}}}},
        (9, 5, 14, 0),
    ),
    "lmdeploy-json": ({"answer_fields": {"usage": NINE_FIVE}}, (9, 5, 14, 0)),
    "llamacpp-json": ({"answer_fields": {"usage": ALPHABETICAL, "timings": TIMINGS}}, (9, 5, 14, 0)),
    # Newer llama-servers: objects inside usage, sorted in before the counts after them.
    "llamacpp-json-token-details": ({"answer_fields": {"usage": LLAMACPP_DETAILS, "timings": TIMINGS}}, (9, 5, 14, 0)),
    "json-no-completion": ({"answer_fields": {"usage": NO_COMPLETION}}, (9, None, 9, 0)),
    "json-no-usage": ({"answer_fields": {}}, (None, None, None, 0)),
    "vllm-stream-include-usage": (
        {"events": [_chunk("a", usage=None), _chunk("b", usage=None), {"choices": [], "usage": NINE_FIVE}]},
        (9, 5, 14, 4),
    ),
    "vllm-stream-continuous-usage": (
        {
            "events": [
                _chunk("a", usage={"prompt_tokens": 9, "total_tokens": 10, "completion_tokens": 1}),
                _chunk("b", usage={"prompt_tokens": 9, "total_tokens": 11, "completion_tokens": 2}),
                {"choices": [], "usage": NINE_FIVE},
            ]
        },
        (9, 5, 14, 4),
    ),
    "lmdeploy-stream-include-usage": (
        {"events": [_chunk("a"), _chunk("b"), {"choices": [], "usage": NINE_FIVE}]},
        (9, 5, 14, 4),
    ),
    "llamacpp-stream-usage-in-the-last-chunk": (
        {
            "events": [
                _chunk("a"),
                _chunk("b"),
                {
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    "usage": ALPHABETICAL,
                    "timings": TIMINGS,
                },
            ]
        },
        (9, 5, 14, 4),
    ),
    "llamacpp-stream-token-details": (
        {
            "events": [
                _chunk("a"),
                {
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    "usage": LLAMACPP_DETAILS,
                    "timings": TIMINGS,
                },
            ]
        },
        (9, 5, 14, 3),
    ),
    "stream-no-completion": (
        {"events": [_chunk("a"), {"choices": [], "usage": NO_COMPLETION}]},
        (9, None, 9, 3),
    ),
    "stream-without-include-usage": ({"events": [_chunk("a"), _chunk("b")]}, (None, None, None, 3)),
}


@pytest.mark.parametrize("shape", list(USAGE_SHAPES))
def test_every_engines_usage_shape_is_counted_as_sent(gw: NginxGateway, keys: dict[str, str], shape: str) -> None:
    extra, expected = USAGE_SHAPES[shape]
    body = {"model": CHAT, "stream": "events" in extra, **extra}
    status, _, _ = gw.call("POST", f"/v1/chat/completions?t=shape-{shape}", body, keys["default"])
    assert status == 200
    line = log_line(gw, f"shape-{shape}")
    assert (line["prompt_tokens"], line["completion_tokens"], line["total_tokens"], line["events"]) == expected


# --- failover -----------------------------------------------------------------------------------


def test_killed_replica_its_read_request_is_rerun_and_the_rest_go_to_the_survivor(tmp_path: Path) -> None:
    spec = load_stack_config(gateway_config(), set())
    chat = [FakeReplica("a"), FakeReplica("b")]
    with own_gateway(spec, {"chat": chat, "reasoning": [FakeReplica("r")]}, tmp_path) as (gw, keys):
        key = keys["default"]
        for _ in range(4):  # warm keepalive connections to both replicas
            assert gw.call("POST", "/v1/chat/completions", {"model": CHAT}, key)[0] == 200

        # 1. A request the victim has read and not answered: no byte reached the client, so it is
        #    run again on the survivor, and the client gets that one answer.
        victim, client, held = send_held(gw, key, chat, "held")
        survivor = next(r for r in chat if r is not victim)
        survivor.gates["held"].set()  # the survivor answers the re-sent request at once
        victim.kill()
        client.join(WAIT)
        status, _, out = held["result"]
        assert (status, out["served_by"], out["rid"]) == (200, survivor.name, "held")

        # 2. Requests not yet sent: connection refused on the victim, retried on the survivor.
        results = [gw.call("POST", "/v1/chat/completions", {"model": CHAT, "rid": f"s{i}"}, key) for i in range(20)]
        assert [s for s, _, _ in results] == [200] * 20
        assert [o["served_by"] for _, _, o in results] == [survivor.name] * 20
        log = gw.log(at_least=4 + 1 + 20)
        assert all(line["status"] == 200 for line in log)
        # (Each worker buffers its own log lines: match lines by content, not position.)
        retried = [line["upstream"] for line in log if ", " in line["upstream"]]
        assert set(retried) == {f"{victim.addr}, {survivor.addr}"}
        # Passive health: maxFails (2) failures in all, the held request's included, take it out.
        assert 1 <= len(retried) <= 2

        # 3. The last replica gone: an OpenAI-style 502, no hang; its error page's redirect keeps what
        #    the router set for the log (model, pool).
        survivor.kill()
        status, _, out = gw.call("POST", "/v1/chat/completions?t=gone", {"model": "fast"}, key)
        assert status == 502 and error_code(out) == "upstream_unavailable"
        line = log_line(gw, "gone")
        assert (line["status"], line["key_id"], line["model"], line["pool"], line["events"]) == (
            502,
            "default",
            "fast",
            "chat",
            0,
        )


# --- TLS ----------------------------------------------------------------------------------------


def test_tls_gateway_serves_https_with_the_certificate(tmp_path: Path) -> None:
    config = gateway_config(tls=True, port=443)
    config["llm-cluster:gatewayTlsCert"] = config["llm-cluster:gatewayTlsKey"] = "[secret]"
    spec = load_stack_config(config, {"llm-cluster:gatewayTlsCert", "llm-cluster:gatewayTlsKey"})
    tls = self_signed(tmp_path / "tls")
    pools = {"chat": [FakeReplica("c")], "reasoning": [FakeReplica("r")]}
    with own_gateway(spec, pools, tmp_path, tls_dir=tls) as (gw, keys):
        context = ssl.create_default_context(cafile=str(tls / "cert.pem"))
        status, _, out = gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"], context=context)
        assert (status, out["served_by"]) == (200, "c")
        assert gw.call("GET", "/v1/models", context=context)[0] == 401
        assert gw.call("GET", "/v1/models", key=keys["default"])[0] == 400  # plain HTTP on the TLS port


# --- auth: false (a lab only) -------------------------------------------------------------------


def test_gateway_without_auth_serves_without_a_key_and_logs_no_key_id(tmp_path: Path) -> None:
    config = prod_config()
    config["llm-cluster:gateway"].update(auth=False, apiKeys=[], tls=False)
    spec = load_stack_config(config, set())
    pools = {"chat": [FakeReplica("c")], "reasoning": [FakeReplica("r")]}
    # No key file exists, and nginx must not need one.
    gw = NginxGateway(spec, pools, tmp_path, tmp_path / "no-such-key-file.json")
    try:
        status, _, out = gw.call("POST", "/v1/chat/completions", {"model": CHAT})
        assert (status, out["served_by"]) == (200, "c")
        # A presented key is neither required nor checked.
        status, _, out = gw.call("POST", "/smart/v1/chat/completions", {"model": R1}, key="sk-anything")
        assert (status, out["served_by"]) == (200, "r")
        status, _, models = gw.call("GET", "/v1/models")
        assert status == 200 and models["data"][0]["id"] == CHAT
        # Routing is unchanged: an unknown model is still 404, internal paths still unreachable.
        assert gw.call("POST", "/v1/chat/completions", {"model": "gpt-4o"})[0] == 404
        assert gw.call("GET", "/metrics")[0] == 404
        log = gw.log(at_least=5)
        assert [line["key_id"] for line in log] == [""] * 5
        # Two workers buffer their own lines: which pool comes first in the file is theirs to decide.
        assert sorted(line["pool"] for line in log if line["status"] == 200 and line["model"]) == ["chat", "reasoning"]
        ready = subprocess.run(
            ["bash", "-c", readiness_script(gw.port, False, 10, "gpu-01", auth=False)], capture_output=True, text=True
        )
        assert ready.returncode == 0, ready.stderr
        assert ready.stdout.strip() == f"gateway on gpu-01:{gw.port} is up and serves without a key (auth: false)"
    finally:
        gw.stop()
        for rs in pools.values():
            for r in rs:
                r.kill()
