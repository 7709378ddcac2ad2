"""Stack model: the OpenAI-compatible gateway (nginx + Lua)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from components.facts.gateway_image import DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR, GATEWAY_IMAGE, build_args
from components.spec.base import Spec
from components.spec.cluster import Cidr, ImageRef, Name, Port


class RateLimitSpec(Spec):
    """Per-key request rate: nginx limit_req (leaky bucket) with a burst."""

    requests_per_second: float = Field(gt=0)
    """nginx counts whole requests per second or per minute: 0.5 (= 30/min) is fine, 0.3333 is not."""
    burst: int = Field(default=0, ge=0)
    """Requests above the rate served at once before 429s start (nginx `burst=` with `nodelay`)."""

    @field_validator("requests_per_second")
    @classmethod
    def _whole_per_minute(cls, v: float) -> float:
        # nginx's limit_req_zone takes `<int>r/s` or `<int>r/m`; anything finer would be rounded silently.
        per_minute = v * 60
        if abs(per_minute - round(per_minute)) > 1e-6:
            raise ValueError(
                f"{v} requests/s is not a whole number of requests per minute "
                f"({per_minute:.4f}/min); nginx rates are whole requests per second or "
                "per minute, e.g. 0.5 (= 30/min)"
            )
        if round(per_minute) < 1:
            # A whole number of requests per minute, but 0: nginx would be written `0r/m`.
            raise ValueError(
                f"{v} requests/s is less than one request per minute; nginx's slowest rate is one per minute "
                "(0.0166667)"
            )
        return v


class TokenBudgetSpec(Spec):
    """Tokens (prompt + completion, as the responses' usage says) a key may use per window."""

    tokens: int = Field(ge=1, le=10**15)
    """A request is admitted while the window's count is below this; its tokens are counted when it
    ends (so requests in flight can take a window past it)."""
    window_seconds: int = Field(default=60, ge=1, le=31 * 86400)
    """Fixed windows from the Unix epoch (86400: UTC days); the count starts again at 0 in each."""


class ApiKeySpec(Spec):
    """One client of the gateway. The key itself is a secret (config `gatewayApiKeys`), never here."""

    id: Name
    """Shown in logs in place of the key."""
    rate_limit: RateLimitSpec | None = None
    """This key's limit; when unset, `defaultRateLimit` (and when that is unset too, none)."""
    models: list[str] = Field(default_factory=list)
    """Served model names, aliases or pool names this key may use; empty = all."""
    max_concurrent: int | None = Field(default=None, ge=1)
    """Requests of this key in flight at once (streams included); above it 429. When unset,
    `defaultMaxConcurrent` (and when that is unset too, no cap)."""
    token_budget: TokenBudgetSpec | None = None
    """Tokens per window; above it 429 until the window ends. When unset, `defaultTokenBudget` (and
    when that is unset too, none)."""


class UsageLogSpec(Spec):
    """The usage log on the gateway host: one JSON line per request, a file per day (UTC)."""

    dir: str = "/var/log/llm-gateway"
    """Host directory (mounted into the gateway): survives container replacements."""
    retention_days: int = Field(default=30, ge=1, le=3660)
    """Daily files older than this are deleted (by the gateway's nginx, hourly)."""
    max_total_gib: float = Field(default=20, gt=0)
    """The oldest daily files are deleted while the directory holds more than this."""

    @field_validator("dir")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/") or v.rstrip("/") in ("", "/var/log", "/var", "/etc", "/tmp"):
            raise ValueError(f"{v!r} must be an absolute directory of its own (e.g. /var/log/llm-gateway)")
        return v.rstrip("/")


# A URL apt reads from a deb822 `URIs:` line (and the Dockerfile passes quoted to printf).
_MIRROR_RE = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%+:@/-]*)?$")


class ImageBuildSpec(Spec):
    """Where the default gateway image's build (on the gateway node) fetches its Debian packages."""

    debian_mirror: str = DEBIAN_MIRROR
    """The Debian archive (trixie, trixie-updates), e.g. a mirror on the site's network."""
    debian_security_mirror: str = DEBIAN_SECURITY_MIRROR
    """Debian's security archive (trixie-security), where the pinned nginx is published."""
    check_valid_until: bool = True
    """false for snapshot.debian.org (whose old Release files have expired), to build pins that
    have left the archive."""

    @field_validator("debian_mirror", "debian_security_mirror")
    @classmethod
    def _url(cls, v: str) -> str:
        if not _MIRROR_RE.match(v):
            raise ValueError(
                f"{v!r} must be an http:// or https:// URL of a Debian archive without spaces "
                "or quotes, e.g. http://deb.debian.org/debian"
            )
        return v.rstrip("/")

    def args(self) -> dict[str, str]:
        """The Dockerfile's build arguments for these mirrors."""
        return build_args(self.debian_mirror, self.debian_security_mirror, self.check_valid_until)


RoutingPolicy = Literal["prefix", "least_conn"]


class RoutingSpec(Spec):
    """How the gateway picks a replica of a pool of several instances."""

    policy: RoutingPolicy = "prefix"
    """`prefix`: the replica that already holds the conversation (a hash of its session, or of the head of its
    prompt, on a consistent-hash ring of the pool's healthy replicas, moved on when that replica is above its
    load bound); `least_conn`: the least busy replica. Each pool may set its own (`pools.<pool>.routing`)."""
    load_factor: float = Field(default=1.25, ge=1.0, le=10.0)
    """The load bound of `prefix`: a replica takes a request only while its requests in flight stay within
    ceil(loadFactor x (the pool's in flight + 1) / its healthy replicas); else the next on the ring does."""
    min_in_flight: int = Field(default=4, ge=1, le=4096)
    """A replica with fewer requests in flight than this is never above its bound: an engine batches a few
    requests at little cost, while moving them away loses their cached prefix (and, at low traffic, the
    bound's mean is mostly noise)."""
    sticky_seconds: int = Field(default=600, ge=0, le=86400)
    """A conversation the bound (or a failure) moved off its replica stays on the replica it moved to for this
    long after its last request (0: each turn goes back to its ring replica). The moved turn prefilled its
    whole history there, so its next turns hit it there; sent back, each would miss the turns in between,
    and every further spill would cost another prefill and evict other conversations' blocks."""
    prefix_chars: int = Field(default=2048, ge=64, le=65536)
    """How much of a request's head is hashed: the chat messages before the first user message (system
    prompt) cut to this many bytes, and the first user message cut to this many bytes on its own (so
    conversations sharing a long system prompt still differ by their first question); or a completion's
    prompt, cut to this many bytes."""
    session_header: str = Field(default="X-Session-Id", pattern=r"^[A-Za-z0-9-]{1,64}$")
    """A header whose value, when a client sends it, is the affinity key (before OpenAI's `user` field, before
    the prompt's head): one conversation, one replica."""


class GatewaySpec(Spec):
    """One endpoint that routes by the request's `model` and by path."""

    node: str
    port: Port = 443
    image: ImageRef = GATEWAY_IMAGE
    """Default: built on the gateway node from Debian with the nginx and Lua module versions the tests
    run (components/planning/gateway/image.py). Another image needs nginx with the NDK and Lua modules
    at /usr/lib/nginx/modules and resty.core and cjson on Debian's Lua paths (Debian's or Ubuntu's
    nginx with libnginx-mod-http-lua and lua-cjson), and is not what was tested."""
    image_build: ImageBuildSpec = ImageBuildSpec()
    """Only for the default image: the Debian mirrors its build on the gateway node uses."""
    auth: bool = True
    """Require an API key. `false` serves every model to anyone who reaches the port: for a lab only,
    and the policy pack's mandatory `gateway-auth` rule refuses it unless its level is lowered."""
    metrics_port: int = Field(default=9145, ge=1024, le=65535)
    """Where the gateway's nginx serves Prometheus' /metrics, on the node's cluster address (plain
    HTTP, whether or not the gateway serves TLS; the firewall keeps it to the cluster)."""
    metrics_max_series: int = Field(default=10000, ge=1, le=1_000_000)
    """Label sets the metrics keep at most (key id x model x pool x status, ...); beyond it new ones are
    dropped and counted in llm_gateway_series_overflow_total. Sizes nginx's llm_metrics zone."""
    default_pool: str
    """The runbook's default `/v1/` route: its models are listed first by GET /v1/models (clients that
    take the first listed model land there). Requests are routed by their `model`; an unknown model
    is answered 404, never sent here."""
    path_routes: dict[str, str] = Field(default_factory=dict)
    """Path prefix -> pool, e.g. {"/smart/v1/": reasoning}; the prefix is rewritten to /v1/ and only
    that pool's models are accepted under it."""
    aliases: dict[str, str] = Field(default_factory=dict)
    """Extra model name -> pool; the gateway rewrites `model` to the pool's first served name."""
    api_keys: list[ApiKeySpec] = Field(default_factory=list)
    """Key ids and limits; when empty, one key `default` is generated on the gateway host."""
    default_rate_limit: RateLimitSpec | None = None
    """Limit for keys that state none."""
    default_max_concurrent: int | None = Field(default=None, ge=1)
    """Concurrency cap for keys that state none."""
    default_token_budget: TokenBudgetSpec | None = None
    """Token budget for keys that state none."""
    max_body_mib: int = Field(default=16, ge=1, le=1024)
    """Largest request body (413 above); bodies are held in memory so the router can read `model`."""
    max_fails: int = Field(default=2, ge=0)
    """Passive health: failed attempts within failTimeoutSeconds that take a replica out."""
    fail_timeout_seconds: int = Field(default=30, ge=1)
    """Passive health: the failure window, and how long a failed replica stays out."""
    connect_timeout_seconds: int = Field(default=5, ge=1, le=75)
    """A replica that does not accept a connection within this is skipped for the next one."""
    client_timeout_seconds: int = Field(default=60, ge=1, le=3600)
    """A client that sends no byte of its request headers or body for this long is dropped (a slow
    client holds a connection and, with its body, memory); nginx logs it as 408 and closes."""
    routing: RoutingSpec = RoutingSpec()
    """How a pool's replica is picked for a request: prefix affinity with bounded load (the default), or
    least_conn."""
    upstream_keepalive: int = Field(default=32, ge=0)
    """Idle keepalive connections each nginx worker keeps to each pool (0 = none)."""
    tls: bool = True
    """Serve HTTPS: with the secrets `gatewayTlsCert` / `gatewayTlsKey` when both are set, else with a
    certificate made on the gateway host by a private CA (its certificate: stack output
    `gatewayCaCert`). `false` sends API keys in clear (the policy pack says so)."""
    tls_names: list[str] = Field(default_factory=list)
    """Extra DNS names or IPv4 addresses in the generated certificate (the node's name and cluster
    address are always in it)."""
    http_redirect_port: Port | None = None
    """A plain-HTTP port that only redirects (308) to HTTPS; unset: no HTTP at all. A client that
    sends its key there has sent it in clear before the redirect."""
    usage_log: UsageLogSpec = UsageLogSpec()
    pool_weights: dict[str, int] = Field(default_factory=dict)
    """Pool -> weight, for pools that serve the same model: its share of that model's traffic
    (e.g. {blue: 90, green: 10}); 0 drains a pool. Default 1 each (an even split by capacity-blind
    least_conn)."""
    allow_from: list[Cidr] = Field(default_factory=lambda: ["0.0.0.0/0", "::/0"], min_length=1)
    """Client networks the host firewall lets reach the gateway port (default: anyone); the
    cluster's nodes and firewall.trustedSources always can."""
    smoke_test: bool = True
    """After the gateway and every model's health gate: one chat completion per served name through
    the gateway with a deploy-time key, or the deployment fails."""

    @field_validator("image_build")
    @classmethod
    def _build_only_the_default_image(cls, v: ImageBuildSpec, info: ValidationInfo) -> ImageBuildSpec:
        # Runs only when the key is given: mirrors for an image that is pulled would be silently unused.
        image = info.data.get("image", GATEWAY_IMAGE)
        if image != GATEWAY_IMAGE:
            raise ValueError(
                f"applies only to the default image {GATEWAY_IMAGE} (built on the gateway node); "
                f"{image} is pulled: remove imageBuild or gateway.image"
            )
        return v

    @field_validator("api_keys", "default_rate_limit", "default_max_concurrent", "default_token_budget")
    @classmethod
    def _keys_need_auth(cls, v: object, info: ValidationInfo) -> object:
        # Keys and limits without auth would be listed and silently never checked.
        if v and info.data.get("auth") is False:
            raise ValueError("keys and limits are not checked when auth is false; remove them or set auth: true")
        return v

    @field_validator("path_routes")
    @classmethod
    def _prefixes(cls, v: dict[str, str]) -> dict[str, str]:
        for prefix in v:
            if not (prefix.startswith("/") and prefix.endswith("/v1/")):
                raise ValueError(f"path route {prefix!r} must start with / and end with /v1/ (e.g. /smart/v1/)")
            if prefix == "/v1/":
                raise ValueError("path route '/v1/' is the gateway's own model-routed prefix; use defaultPool for it")
            if not all(c.isalnum() or c in "/-_." for c in prefix):
                raise ValueError(f"path route {prefix!r} may hold only letters, digits and / - _ .")
        return v

    @field_validator("tls_names")
    @classmethod
    def _san_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not name or not all(c.isalnum() or c in "-." for c in name):
                raise ValueError(f"TLS name {name!r} must be a DNS name or an IPv4 address")
        return v

    @field_validator("pool_weights")
    @classmethod
    def _weights(cls, v: dict[str, int]) -> dict[str, int]:
        for pool, weight in v.items():
            if weight < 0 or weight > 1000:
                raise ValueError(f"weight of pool {pool!r} must be 0..1000, got {weight}")
        return v

    @field_validator("aliases")
    @classmethod
    def _alias_names(cls, v: dict[str, str]) -> dict[str, str]:
        for alias in v:
            if not alias or any(c in alias for c in '"\\') or not alias.isprintable():
                raise ValueError(f"alias {alias!r} must be a non-empty printable name without quotes or backslashes")
        return v
