"""What the gateway must know about an engine's OpenAI HTTP server; each engine states it, with its source."""

from __future__ import annotations

from dataclasses import dataclass

from components.facts.evidence import Sourced


@dataclass(frozen=True)
class EngineServer:
    """One engine's OpenAI HTTP server, as the gateway sees it."""

    keepalive_seconds: int
    """How long the server keeps an idle keep-alive connection open by default."""
    keepalive_env: str | None
    """Environment variable of the engine container that changes it (read from the pool's `env`)."""
    not_ready_statuses: tuple[int, ...]
    """Statuses the server answers while it cannot serve (loading, engine dead): failures to fail over."""
    sourced: Sourced
