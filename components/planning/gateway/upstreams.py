"""What the gateway must know about each engine's HTTP server, as data with sources.

The gateway keeps idle keep-alive connections to every replica. If the replica's server closes an
idle connection at the moment nginx reuses it, the request dies with it (a 502 before any byte), so
nginx must always give up an idle connection first: its upstream `keepalive_timeout` is the
engine's idle timeout minus a margin. Each engine states its server (`Engine.http_server`, in its
facts); nothing in the gateway branches on the engine's name.
"""

from __future__ import annotations

from collections.abc import Mapping

from components.engines.http import EngineServer
from components.engines.registry import ENGINES

# nginx gives up an idle upstream connection this long before the server would. The server's timer
# starts when it has written the response, nginx's when it has read it, and a busy server (an event
# loop doing detokenisation) notices an incoming request late: two seconds cover both.
KEEPALIVE_MARGIN_SECONDS = 2


def engine_server(engine: str) -> EngineServer:
    """The server facts of an engine; a clear error for an engine without an entry."""
    try:
        return ENGINES[engine].http_server
    except KeyError:
        raise ValueError(
            f"the gateway has no server facts for engine {engine!r}: no such engine is registered "
            f"(components/engines/registry.py knows: {', '.join(ENGINES)})"
        ) from None


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
