"""Rule 12: every container is repeatable and survives its node: pinned image, delete-first replacement
with a fixed name, a restart policy that brings it back after a reboot."""
from __future__ import annotations

from pulumi_policy import (
    EnforcementLevel, PolicyConfigSchema, ReportViolation, ResourceValidationArgs, ResourceValidationPolicy,
)

from policies.rules.common import CONTAINER, config_with_defaults, container_image, image_parts, role_of

PIN_CONFIG = PolicyConfigSchema(properties={"mutableTags": {
    "type": "array", "items": {"type": "string"},
    "default": ["latest", "stable", "mainline", "edge", "nightly", "main", "master"],
    "description": "Tags that move to new builds; an image with one of them (or none) is not pinned."}})
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
    return (f"image {ref} is not pinned ({why}): each node pulls whatever the tag points to that day, so nodes "
            "drift apart and a replaced node can come back with another version. Pin a version tag "
            f"({repo}:<version>) or a digest ({repo}@sha256:<digest>).")


def validate_pinned(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """The container's image ref (llm-cluster.image label, or `image` when it is a ref) has a fixed version."""
    if args.resource_type != CONTAINER:
        args.not_applicable("not a container")
        return
    ref = container_image(args.props)
    if ref is None:
        args.not_applicable("no image reference (only an image id)")
        return
    problem = pin_problem(ref, list(config_with_defaults(args, PIN_CONFIG)["mutableTags"]))
    if problem:
        report(problem, None)


def validate_replace(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """A container with a fixed name is replaced delete-first."""
    if args.resource_type != CONTAINER:
        args.not_applicable("not a container")
        return
    name = args.props.get("name")
    if not name:
        args.not_applicable("Docker names the container itself")
        return
    # None: the program did not set the option, which means create-first.
    if not args.opts.delete_before_replace:
        report(f"container {name} has a fixed name but is replaced create-first: Docker refuses a second container "
               f"named {name} (and the GPUs and ports the old one holds), so the first change that replaces it "
               "fails mid-update. Set delete_before_replace=True in its resource options.", None)


def validate_restart(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """A long-running container comes back after a crash and after a reboot of its node."""
    if args.resource_type != CONTAINER:
        args.not_applicable("not a container")
        return
    restart = str(args.props.get("restart") or "no")  # the provider's default is "no"
    if restart in RESTARTING:
        return
    what = role_of(args.props) or str(args.props.get("name") or "the container")
    when = ("after a clean exit or a reboot of the node (on-failure restarts only after a non-zero exit)"
            if restart == "on-failure" else "after it exits and after a reboot of the node")
    report(f"restart is {restart}: {what} stays down {when}. Set restart=\"unless-stopped\".", None)


POLICIES = [
    ResourceValidationPolicy(name="pinned-images", description="Container images are pinned to a version or digest.",
                             validate=validate_pinned, config_schema=PIN_CONFIG,
                             enforcement_level=EnforcementLevel.ADVISORY),
    ResourceValidationPolicy(name="container-replace",
                             description="A container with a fixed name is replaced delete-first.",
                             validate=validate_replace, enforcement_level=EnforcementLevel.MANDATORY),
    ResourceValidationPolicy(name="container-restart",
                             description="Containers restart unless stopped, so a node's reboot brings them back.",
                             validate=validate_restart, enforcement_level=EnforcementLevel.ADVISORY),
]
