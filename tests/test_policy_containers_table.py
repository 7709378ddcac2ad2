"""pinned-images, container-replace and container-restart (policies/rules/containers.py) as tables through the
real analyzer servicer: every shape of image reference against the mutable tags (the defaults and a configured
list), the replacement order a fixed name needs, every restart policy, each with its whole message, and the
resources the rules leave alone."""

from __future__ import annotations

from typing import Any

import pytest

from policies.rules.containers import PIN_CONFIG
from tests.support.policies import analyze

CONTAINER = "docker:index/container:Container"


def said(
    rule: str,
    props: dict[str, Any],
    *,
    type_: str = CONTAINER,
    config: dict[str, Any] | None = None,
    delete_before_replace: bool | None = True,
) -> list[tuple[str, str]]:
    """(level, message) of one rule on one resource of no pool (without the policy's description)."""
    got = analyze(type_, "c", props, config=config, delete_before_replace=delete_before_replace)
    return [(level, message.split("\n", 1)[1]) for policy, level, message in got if policy == rule]


def unpinned(ref: str, why: str, repo: str) -> list[tuple[str, str]]:
    return [
        (
            "advisory",
            f"image {ref} is not pinned ({why}): each node pulls whatever the tag points to that day, so nodes drift "
            "apart and a replaced node can come back with another version. Pin a version tag "
            f"({repo}:<version>) or a digest ({repo}@sha256:<digest>).",
        )
    ]


def labelled(ref: str) -> dict[str, Any]:
    return {"labels": [{"label": "llm-cluster.image", "value": ref}], "image": "sha256:0123", "restart": "always"}


@pytest.mark.parametrize(
    ("props", "config", "found"),
    [
        # Pinned by a version tag or a digest.
        ({"image": "prom/node-exporter:v1.8.2"}, None, []),
        ({"image": "prom/node-exporter@sha256:abc"}, None, []),
        ({"image": "prom/node-exporter:latest@sha256:abc"}, None, []),
        ({"image": "registry.lab:5000/prom/node-exporter:v1.8.2"}, None, []),
        # No tag, or a tag that moves: every default mutable tag.
        (
            {"image": "prom/node-exporter"},
            None,
            unpinned("prom/node-exporter", "it has no tag, so Docker pulls :latest", "prom/node-exporter"),
        ),
        (
            {"image": "registry.lab:5000/prom/node-exporter"},
            None,
            unpinned(
                "registry.lab:5000/prom/node-exporter",
                "it has no tag, so Docker pulls :latest",
                "registry.lab:5000/prom/node-exporter",
            ),
        ),
        *[
            (
                {"image": f"docker.io/library/nginx:{tag}"},
                None,
                unpinned(f"docker.io/library/nginx:{tag}", f"tag {tag} moves to new builds", "nginx"),
            )
            for tag in PIN_CONFIG.properties["mutableTags"]["default"]
        ],
        # The configured list replaces the defaults.
        ({"image": "nginx:latest"}, {"mutableTags": ["rolling"]}, []),
        (
            {"image": "nginx:rolling"},
            {"mutableTags": ["rolling"]},
            unpinned("nginx:rolling", "tag rolling moves to new builds", "nginx"),
        ),
        ({"image": "nginx"}, {"mutableTags": []}, unpinned("nginx", "it has no tag, so Docker pulls :latest", "nginx")),
        # The llm-cluster.image label names the ref when `image` is the pulled image's id.
        (
            labelled("vllm/vllm-openai:latest"),
            None,
            unpinned("vllm/vllm-openai:latest", "tag latest moves to new builds", "vllm/vllm-openai"),
        ),
        (labelled("vllm/vllm-openai:v0.19.1"), None, []),
        # Only an image id, or none: nothing to judge.
        ({"image": "sha256:0123"}, None, []),
        ({}, None, []),
    ],
)
def test_pinned_images(props: dict[str, Any], config: dict[str, Any] | None, found: list[tuple[str, str]]) -> None:
    props = {"restart": "always", **props}
    assert said("pinned-images", props, config={"pinned-images": config} if config else None) == found


REPLACE = (
    "mandatory",
    "the container has a fixed name but is replaced create-first: Docker refuses a second container of the same "
    "name (and the GPUs and ports the old one holds), so the first change that replaces it fails mid-update. Set "
    "delete_before_replace=True in its resource options.",
)


@pytest.mark.parametrize(
    ("props", "delete_before_replace", "found"),
    [
        ({"name": "exporter"}, True, []),
        ({"name": "exporter"}, False, [REPLACE]),
        # Left unset by the program: Pulumi replaces create-first.
        ({"name": "exporter"}, None, [REPLACE]),
        # Docker names an unnamed container itself: two can live side by side.
        ({}, None, []),
        ({"name": ""}, False, []),
    ],
)
def test_container_replace(
    props: dict[str, Any], delete_before_replace: bool | None, found: list[tuple[str, str]]
) -> None:
    props = {"image": "nginx:1.27", "restart": "always", **props}
    assert said("container-replace", props, delete_before_replace=delete_before_replace) == found


FIX = 'Set restart="unless-stopped".'


@pytest.mark.parametrize(
    ("props", "found"),
    [
        ({"restart": "unless-stopped"}, []),
        ({"restart": "always"}, []),
        # The provider's default is "no".
        (
            {},
            [
                (
                    "advisory",
                    f"restart is no: the container stays down after it exits and after a reboot of the node. {FIX}",
                )
            ],
        ),
        (
            {"restart": ""},
            [
                (
                    "advisory",
                    f"restart is no: the container stays down after it exits and after a reboot of the node. {FIX}",
                )
            ],
        ),
        (
            {"restart": "no"},
            [
                (
                    "advisory",
                    f"restart is no: the container stays down after it exits and after a reboot of the node. {FIX}",
                )
            ],
        ),
        (
            {"restart": "on-failure"},
            [
                (
                    "advisory",
                    "restart is on-failure: the container stays down after a clean exit or a reboot of the node (on-failure restarts only after a non-zero exit). "
                    + FIX,
                )
            ],
        ),
        # Named by its role: its label, or its image.
        (
            {"restart": "no", "labels": [{"label": "llm-cluster.role", "value": "ray-head"}]},
            [("advisory", f"restart is no: ray-head stays down after it exits and after a reboot of the node. {FIX}")],
        ),
        (
            {"restart": "on-failure", "image": "grafana/grafana-oss:11.3.0"},
            [
                (
                    "advisory",
                    "restart is on-failure: grafana stays down after a clean exit or a reboot of the node (on-failure restarts only after a non-zero exit). "
                    + FIX,
                )
            ],
        ),
    ],
)
def test_container_restart(props: dict[str, Any], found: list[tuple[str, str]]) -> None:
    assert said("container-restart", {"image": "nginx:1.27", **props}) == found


@pytest.mark.parametrize("rule", ["pinned-images", "container-replace", "container-restart"])
def test_the_container_rules_leave_other_resources_alone(rule: str) -> None:
    props = {"image": "nginx:latest", "name": "x", "restart": "no"}
    assert said(rule, props, type_="command:remote:Command", delete_before_replace=None) == []
    assert said(rule, props, type_="llm-cluster:vllm:ModelServer", delete_before_replace=None) == []
