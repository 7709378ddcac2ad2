"""Rule 12: every container is repeatable and survives its node: pinned image, delete-first replacement
with a fixed name, a restart policy that brings it back after a reboot."""

from __future__ import annotations

from typing import Any

from pulumi_policy import EnforcementLevel, PolicyConfigSchema

from components.engines.containers import image_parts
from policies.rules.common import CONTAINER, container_image, role_of
from policies.rules.grouped import Subject, pool_rule

PIN_CONFIG = PolicyConfigSchema(
    properties={
        "mutableTags": {
            "type": "array",
            "items": {"type": "string"},
            "default": ["latest", "stable", "mainline", "edge", "nightly", "main", "master"],
            "description": "Tags that move to new builds; an image with one of them (or none) is not pinned.",
        }
    }
)
# Docker's restart policies that start the container again when the daemon starts (after a reboot).
RESTARTING = ("unless-stopped", "always")


def pin_problem(ref: str, mutable_tags: list[str]) -> str | None:
    """Why an image reference can change under the stack, or None when it is pinned by tag or digest."""
    if "@sha256:" in ref:
        return None
    repo, tag = image_parts(ref)
    if tag is not None and tag not in mutable_tags:
        return None
    why = "it has no tag, so Docker pulls :latest" if tag is None else f"tag {tag} moves to new builds"
    return (
        f"image {ref} is not pinned ({why}): each node pulls whatever the tag points to that day, so nodes "
        "drift apart and a replaced node can come back with another version. Pin a version tag "
        f"({repo}:<version>) or a digest ({repo}@sha256:<digest>)."
    )


def pinned_found(resource: Subject, config: dict[str, Any]) -> list[str]:
    """The container's image ref (llm-cluster.image label, or `image` when it is a ref) has a fixed version."""
    if resource.resource_type != CONTAINER:
        return []
    ref = container_image(resource.props)  # None: only an image id, nothing to judge
    problem = pin_problem(ref, list(config["mutableTags"])) if ref is not None else None
    return [problem] if problem else []


def replace_found(resource: Subject, config: dict[str, Any]) -> list[str]:
    """A container with a fixed name is replaced delete-first (None: the program left the option unset,
    which means create-first)."""
    if resource.resource_type != CONTAINER or not resource.props.get("name"):
        return []  # Docker names the container itself
    if resource.opts.delete_before_replace:
        return []
    return [
        "the container has a fixed name but is replaced create-first: Docker refuses a second container of "
        "the same name (and the GPUs and ports the old one holds), so the first change that replaces it fails "
        "mid-update. Set delete_before_replace=True in its resource options."
    ]


def restart_found(resource: Subject, config: dict[str, Any]) -> list[str]:
    """A long-running container comes back after a crash and after a reboot of its node."""
    if resource.resource_type != CONTAINER:
        return []
    restart = str(resource.props.get("restart") or "no")  # the provider's default is "no"
    if restart in RESTARTING:
        return []
    what = role_of(resource.props) or "the container"
    when = (
        "after a clean exit or a reboot of the node (on-failure restarts only after a non-zero exit)"
        if restart == "on-failure"
        else "after it exits and after a reboot of the node"
    )
    return [f'restart is {restart}: {what} stays down {when}. Set restart="unless-stopped".']


POLICIES = [
    pool_rule(
        "pinned-images",
        "Container images are pinned to a version or digest.",
        pinned_found,
        config=PIN_CONFIG,
        level=EnforcementLevel.ADVISORY,
    ),
    pool_rule(
        "container-replace",
        "A container with a fixed name is replaced delete-first.",
        replace_found,
        level=EnforcementLevel.MANDATORY,
    ),
    pool_rule(
        "container-restart",
        "Containers restart unless stopped, so a node's reboot brings them back.",
        restart_found,
        level=EnforcementLevel.ADVISORY,
    ),
]
