"""Stack model: the OpenAI-compatible gateway (nginx + njs)."""
from __future__ import annotations

from pydantic import Field, field_validator

from components.spec.base import Spec
from components.spec.cluster import Name, Port


class RateLimitSpec(Spec):
    """Per-key request rate: nginx limit_req (leaky bucket) with a burst."""

    requests_per_second: float = Field(gt=0)
    burst: int = Field(default=0, ge=0)


class ApiKeySpec(Spec):
    """One client of the gateway. The key itself is a secret (config `gatewayApiKeys`), never here."""

    id: Name
    """Shown in logs and metrics in place of the key."""
    rate_limit: RateLimitSpec | None = None
    models: list[str] = Field(default_factory=list)
    """Served model names (or pool names) this key may use; empty = all."""


class GatewaySpec(Spec):
    """One endpoint that routes by the request's `model` and by path."""

    node: str
    port: Port = 80
    image: str = "nginx:1.27.5"
    """An official nginx image: it carries the njs module the router needs."""
    default_pool: str
    """Pool for plain /v1/ requests whose model names no pool (the runbook's default route)."""
    path_routes: dict[str, str] = Field(default_factory=dict)
    """Path prefix -> pool, e.g. {"/smart/v1/": reasoning}; the prefix is rewritten to /v1/."""
    aliases: dict[str, str] = Field(default_factory=dict)
    """Extra model name -> pool."""
    api_keys: list[ApiKeySpec] = Field(default_factory=list)
    """Key ids and limits; when empty, one key `default` is generated on the gateway host."""
    default_rate_limit: RateLimitSpec | None = None
    max_body_mib: int = Field(default=16, ge=1, le=1024)
    max_fails: int = Field(default=2, ge=0)
    fail_timeout_seconds: int = Field(default=30, ge=1)
    tls: bool = False
    """Serve HTTPS with the secrets `gatewayTlsCert` / `gatewayTlsKey`."""

    @field_validator("path_routes")
    @classmethod
    def _prefixes(cls, v: dict[str, str]) -> dict[str, str]:
        for prefix in v:
            if not (prefix.startswith("/") and prefix.endswith("/v1/")):
                raise ValueError(f"path route {prefix!r} must start with / and end with /v1/ "
                                 "(e.g. /smart/v1/)")
        return v
