"""Rule 6 as a policy: the image's torch must have kernels for the GPU (its CUDA arch list, from the image's
facts); images of multi-node (Ray) containers must carry Ray. The checks are vLLM's own
(components/engines/vllm/rules/image.py)."""

from __future__ import annotations

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
)

from components.engines.vllm.rules.image import arch_problem, ray_problem
from components.marks import RAY_CLUSTER
from policies.rules.common import (
    CONTAINER,
    config_with_defaults,
    container_image,
    is_ray_container,
    launch_of,
    per_pool,
    under_component,
)

CONFIG = PolicyConfigSchema(
    properties={
        "rayImages": {
            "type": "array",
            "items": {"type": "string"},
            "default": [],
            "description": "Further image repositories (or refs) that contain Ray and vLLM.",
        },
    }
)


def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """The torch arch list on ModelServers and raw vLLM containers; Ray on RayClusters and raw Ray containers."""
    config = config_with_defaults(args, CONFIG)
    problems: list[str | None] = []
    launch = launch_of(args)
    if launch is not None:
        problems.append(arch_problem(launch))
    if args.resource_type == RAY_CLUSTER:
        problems.append(ray_problem(args.props.get("image"), config))
    elif args.resource_type == CONTAINER and not under_component(args.urn):
        if is_ray_container(args.props):
            problems.append(ray_problem(container_image(args.props), config))
    for problem in problems:
        if problem:
            report(problem, None)


POLICIES = [
    ResourceValidationPolicy(
        name="vllm-image",
        description="The image's torch must have kernels for the GPU (its CUDA arch list); Ray containers need Ray.",
        validate=per_pool(validate),
        config_schema=CONFIG,
        enforcement_level=EnforcementLevel.MANDATORY,
    ),
]
