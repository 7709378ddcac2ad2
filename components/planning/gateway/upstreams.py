"""What the gateway must know about each engine's HTTP server, as data with sources.

The gateway keeps idle keep-alive connections to every replica. If the replica's server closes an
idle connection at the moment nginx reuses it, the request dies with it (a 502 before any byte), so
nginx must always give up an idle connection first: its upstream `keepalive_timeout` is the
engine's idle timeout minus a margin. An engine adds its entry here (developer E: LMDeploy,
llama.cpp); nothing else in the gateway branches on the engine's name.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# nginx gives up an idle upstream connection this long before the server would. The server's timer
# starts when it has written the response, nginx's when it has read it, and a busy server (an event
# loop doing detokenisation) notices an incoming request late: two seconds cover both.
KEEPALIVE_MARGIN_SECONDS = 2


@dataclass(frozen=True)
class EngineServer:
    """One engine's OpenAI HTTP server, as the gateway sees it."""

    keepalive_seconds: int
    """How long the server keeps an idle keep-alive connection open by default."""
    keepalive_env: str | None
    """Environment variable of the engine container that changes it (read from the pool's `env`)."""
    not_ready_statuses: tuple[int, ...]
    """Statuses the server answers while it cannot serve (loading, engine dead): failures to fail over."""
    source: str
    evidence: str
    """"read from code", "observed on hardware" or "unverified"."""


ENGINE_SERVERS: dict[str, EngineServer] = {
    "vllm": EngineServer(
        keepalive_seconds=5, keepalive_env="VLLM_HTTP_TIMEOUT_KEEP_ALIVE", not_ready_statuses=(503,),
        source=("vllm/entrypoints/openai/api_server.py passes timeout_keep_alive="
                "envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE to uvicorn; vllm/envs.py defaults it to 5 (seconds), "
                "as does uvicorn's own Config(timeout_keep_alive=5) (v0.10.2 .. v0.19.x; read from code). "
                "Not ready: 503 (unverified; the gateway counts every 500/502/503/504 as a failure anyway)."),
        evidence="read from code"),
    "lmdeploy": EngineServer(
        keepalive_seconds=5, keepalive_env="UVICORN_TIMEOUT_KEEP_ALIVE", not_ready_statuses=(503,),
        source=("lmdeploy/serve/openai/api_server.py (0.15.0, 0.16.0 wheels) runs uvicorn with timeout_keep_alive="
                "int(os.environ.get('UVICORN_TIMEOUT_KEEP_ALIVE', 5)); /health answers 503 while the engine's "
                "health monitor says unhealthy (endpoints/management.py); the server listens only after the "
                "engine is built (read from code)."),
        evidence="read from code"),
    "llamacpp": EngineServer(
        keepalive_seconds=5, keepalive_env=None, not_ready_statuses=(503,),
        source=("llama-server (b11312) leaves cpp-httplib's CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND at its default 5 "
                "(vendor/cpp-httplib/httplib.h; tools/server sets no keep-alive timeout) and answers every "
                "endpoint 503 'Loading model' until the model is loaded (tools/server/server-http.cpp) "
                "(read from code)."),
        evidence="read from code"),
    "lmdeploy": EngineServer(
        keepalive_seconds=5, keepalive_env=None, not_ready_statuses=(503,),
        source=("lmdeploy/serve/openai/api_server.py serves with uvicorn.run(...) without timeout_keep_alive, "
                "so uvicorn's default Config(timeout_keep_alive=5) applies (not re-read for each release)."),
        evidence="unverified"),
    "llamacpp": EngineServer(
        keepalive_seconds=5, keepalive_env=None, not_ready_statuses=(503,),
        source=("llama-server is built on cpp-httplib, whose CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND defaults to 5; "
                "while the model loads it answers 503 ({\"error\": {\"code\": 503, \"message\": \"Loading model\"}})."),
        evidence="read from code"),
}


def engine_server(engine: str) -> EngineServer:
    """The server facts of an engine; a clear error for an engine without an entry."""
    try:
        return ENGINE_SERVERS[engine]
    except KeyError:
        raise ValueError(f"the gateway has no server facts for engine {engine!r} "
                         f"(components/planning/gateway/upstreams.py knows: {', '.join(ENGINE_SERVERS)})") from None


def server_keepalive_seconds(engine: str, env: Mapping[str, str]) -> int:
    """The idle timeout of the engine's server in a pool with this environment."""
    server = engine_server(engine)
    value = env.get(server.keepalive_env) if server.keepalive_env else None
    if value is not None and value.strip().isdigit():
        return int(value)
    return server.keepalive_seconds


def upstream_keepalive_seconds(engine: str, env: Mapping[str, str]) -> int:
    """nginx's upstream keepalive_timeout for a pool: always shorter than its engine server's."""
    server = server_keepalive_seconds(engine, env)
    if server <= 1:
        return 0  # nothing shorter is safe: the pool gets no idle connections (keepalive off)
    return max(1, server - KEEPALIVE_MARGIN_SECONDS)
