"""Stack model: where the nodes get their images (a private registry, tarballs on the nodes, or each
image's own registry), and whether the cluster is air-gapped."""

from __future__ import annotations

import re

from pydantic import field_validator, model_validator

from components.spec.base import Spec
from components.spec.cluster import absolute_path

# host[:port] then an optional path prefix, in the characters docker references allow
# (distribution/reference: a domain of dot-separated components, path components of [a-z0-9._-]).
REGISTRY_PATTERN = (
    r"(?P<host>[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"(?P<port>:\d{1,5})?)(?P<prefix>(/[a-z0-9]+([._-][a-z0-9]+)*)*)"
)
REGISTRY_RE = re.compile(REGISTRY_PATTERN)


class ImagesSpec(Spec):
    """Where every image the stack runs comes from: one mapping for serving, gateway, exporter and
    monitoring images alike (and the qualification gate, which runs the serving image)."""

    air_gapped: bool = False
    """The nodes reach no public registry and no model hub: the policy pack refuses an image that
    would still come from a public registry (or be built from one) and a server that would download
    from the hub."""
    registry: str | None = None
    """A private registry every image is pulled from, `host[:port][/prefix]`: `vllm/vllm-openai:v0.19.1`
    is pulled as `<registry>/vllm/vllm-openai:v0.19.1`, `nvcr.io/nvidia/k8s/dcgm-exporter:<tag>` as
    `<registry>/nvidia/k8s/dcgm-exporter:<tag>`, `python:3.12-slim` as `<registry>/library/python:3.12-slim`
    (the image's own registry host replaced, the path as the registry API names it). Credentials: the secrets registryUsername and registryPassword (both, or neither
    for a registry without auth)."""
    tarballs: str | None = None
    """A directory on every node holding `docker save` tarballs, one per image, named as
    `python -m ops.images` lists them; each is loaded with `docker load` instead of pulled."""

    @field_validator("registry")
    @classmethod
    def _registry(cls, v: str | None) -> str | None:
        if v is not None and "@" in v:
            # Not echoed: the part before @ is a credential.
            raise ValueError(
                "holds credentials (user:password@): give host[:port][/prefix] only, and the "
                "credentials as the secrets registryUsername and registryPassword "
                "(pulumi config set --secret registryPassword)"
            )
        m = REGISTRY_RE.fullmatch(v) if v is not None else None
        # Docker reads a first component as a registry host only with a dot, a port, or `localhost`.
        if v is not None and (m is None or not ("." in m["host"] or m["port"] or m["host"] == "localhost")):
            raise ValueError(
                f"{v!r} is not a registry address: host[:port][/prefix], e.g. registry.example:5000 "
                "or harbor.example/llm (no scheme, no tag)"
            )
        return v

    @field_validator("tarballs")
    @classmethod
    def _tarballs(cls, v: str | None) -> str | None:
        return v if v is None else absolute_path(v, "on the nodes")

    @model_validator(mode="after")
    def _one_source(self) -> ImagesSpec:
        if self.registry is not None and self.tarballs is not None:
            raise ValueError("state registry or tarballs, not both: every image comes from one place")
        return self

    @property
    def registry_host(self) -> str | None:
        """host[:port] of the private registry: the docker provider's registry auth is keyed by it."""
        return None if self.registry is None else self.registry.split("/", 1)[0]
