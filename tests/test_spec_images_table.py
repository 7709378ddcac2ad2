"""Where images come from, as a table: every registry address shape docker reads as a registry (and those it
does not), tarball directories, and the one-source rule; each refusal with its exact message naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from components.planning.load import load_stack_config
from components.spec import SpecError
from tests.conftest import prod_config

NS = "llm-cluster:"
NOT_REGISTRY = "is not a registry address: host[:port][/prefix], e.g. registry.example:5000 or harbor.example/llm (no scheme, no tag)"


@pytest.mark.parametrize(
    ("registry", "host"),
    [
        ("localhost", "localhost"),  # docker's one dotless registry host
        ("localhost:5000/team", "localhost:5000"),
        ("reg:5000", "reg:5000"),  # a port makes it a host
        ("reg.example", "reg.example"),  # so does a dot
        ("10.0.0.5:5000", "10.0.0.5:5000"),
        ("harbor.example/llm/team-a", "harbor.example"),
        ("my-reg.example:65535/llm_x.y", "my-reg.example:65535"),
    ],
)
def test_registry_addresses_docker_reads_as_a_registry(registry: str, host: str) -> None:
    config = prod_config()
    config[NS + "images"] = {"registry": registry}
    spec = load_stack_config(config, set())
    assert spec.images is not None
    assert (spec.images.registry, spec.images.registry_host) == (registry, host)


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"registry": "reg/llm"}, f"images.registry: 'reg/llm' {NOT_REGISTRY}"),  # docker: an image path on Docker Hub
    ({"registry": "registry"}, f"images.registry: 'registry' {NOT_REGISTRY}"),
    ({"registry": "harbor.example/LLM"}, f"images.registry: 'harbor.example/LLM' {NOT_REGISTRY}"),
    ({"registry": "-reg.example"}, f"images.registry: '-reg.example' {NOT_REGISTRY}"),
    ({"registry": "reg.example:123456"}, f"images.registry: 'reg.example:123456' {NOT_REGISTRY}"),
    ({"registry": "reg.example/llm/"}, f"images.registry: 'reg.example/llm/' {NOT_REGISTRY}"),
    ({"registry": "https://reg.example"}, f"images.registry: 'https://reg.example' {NOT_REGISTRY}"),
    (
        {"registry": "deploy@reg.example"},
        "images.registry: holds credentials (user:password@): give host[:port][/prefix] only, and the credentials "
        "as the secrets registryUsername and registryPassword (pulumi config set --secret registryPassword)",
    ),
    (
        {"tarballs": "srv/images"},
        "images.tarballs: 'srv/images' must be an absolute path on the nodes (starting with /)",
    ),
    (
        {"tarballs": "/srv/my images"},
        "images.tarballs: '/srv/my images': the path may not hold whitespace, quotes or backslashes (found [' '])",
    ),
    (
        {"registry": "reg.example", "tarballs": "/srv/images"},
        "images: state registry or tarballs, not both: every image comes from one place",
    ),
]


@pytest.mark.parametrize(("images", "message"), REFUSED, ids=[str(i) for i, _ in REFUSED])
def test_refused_image_sources_name_the_key(images: dict[str, Any], message: str) -> None:
    config = prod_config()
    config[NS + "images"] = images
    with pytest.raises(SpecError) as err:
        load_stack_config(config, set())
    assert [str(i) for i in err.value.issues] == [message]


@pytest.mark.parametrize("images", [{}, {"tarballs": "/srv/images"}, {"airGapped": False}])
def test_without_a_registry_there_is_no_registry_host(images: dict[str, Any]) -> None:
    config = prod_config()
    config[NS + "images"] = images
    spec = load_stack_config(config, set())
    assert spec.images is not None
    assert spec.images.registry is None and spec.images.registry_host is None
    assert spec.images.tarballs == images.get("tarballs")
