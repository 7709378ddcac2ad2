"""Rule 6: the vLLM image line must run on the GPU; images of multi-node (Ray) containers must carry Ray."""
from __future__ import annotations

from typing import Any

from pulumi_policy import EnforcementLevel, PolicyConfigSchema, ReportViolation, ResourceValidationArgs, ResourceValidationPolicy

from components.facts.hardware import (
    IMAGES_WITH_RAY, VLLM_IMAGE_REPO, VLLM_V0_IMAGE_TAGS, VLLM_VOLTA_VERSION, engine_support,
)
from policies.rules.common import (
    CONTAINER, IMAGE_LABEL, RAY_CLUSTER, config_with_defaults, container_image, image_parts, is_ray_container,
    launch_of, under_component,
)

CONFIG = PolicyConfigSchema(properties={
    "voltaImages": {"type": "array", "items": {"type": "string"}, "default": [],
                    "description": "Further image refs known to run vLLM 0.9.2's V0 engine (e.g. a mirror or a local build)."},
    "rayImages": {"type": "array", "items": {"type": "string"}, "default": [],
                  "description": "Further image repositories (or refs) that contain Ray and vLLM."},
})


def vllm_line_problem(ref: str | None, gpu_text: str, needs_v0: bool, config: dict[str, Any]) -> str | None:
    """Why an image cannot serve vLLM on this GPU, or None."""
    if not needs_v0:
        return None
    if ref is None:
        return (f"no image reference to check: label the container {IMAGE_LABEL}=<image ref> "
                f"({gpu_text} needs {VLLM_IMAGE_REPO}:{VLLM_VOLTA_VERSION}).")
    repo, tag = image_parts(ref)
    if (repo == VLLM_IMAGE_REPO and tag in VLLM_V0_IMAGE_TAGS) or ref in config["voltaImages"]:
        return None
    return (f"image {ref}: {gpu_text} needs vLLM's V0 engine, and this pack's facts and flag table are for "
            f"{VLLM_IMAGE_REPO}:{VLLM_VOLTA_VERSION}, the last line whose V0 engine runs Volta (later lines are "
            f"V1-only, which needs sm_80). Use {VLLM_IMAGE_REPO}:{VLLM_VOLTA_VERSION}, or list a tested build of "
            "it in this policy's voltaImages.")


def ray_problem(ref: str | None, config: dict[str, Any]) -> str | None:
    """Why an image cannot run a Ray node of a vLLM instance (it needs Ray and vLLM), or None."""
    if ref is None:
        return f"no image reference to check for Ray: label the container {IMAGE_LABEL}=<image ref>."
    repo, _ = image_parts(ref)
    if repo in IMAGES_WITH_RAY or repo in config["rayImages"] or ref in config["rayImages"]:
        return None
    return (f"image {ref} is not known to contain Ray and vLLM, which every container of a multi-node instance runs "
            f"(known: {', '.join(sorted(IMAGES_WITH_RAY))}). Use {VLLM_IMAGE_REPO}:{VLLM_VOLTA_VERSION}, or list "
            "the image in this policy's rayImages.")


def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """vLLM line on ModelServers and raw vLLM containers; Ray on RayClusters and raw Ray containers."""
    config = config_with_defaults(args, CONFIG)
    problems: list[str | None] = []
    launch = launch_of(args)
    if launch is not None and launch.gpu is not None:
        image = launch.image if launch.resource == "ModelServer" else container_image(args.props)
        problems.append(vllm_line_problem(image, launch.where(), not engine_support(launch.gpu.capability).v1_engine,
                                          config))
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
        description="The vLLM image must run on the GPU (vLLM 0.9.2, the V0 line, below sm_80); Ray containers need Ray.",
        validate=validate, config_schema=CONFIG,
        enforcement_level=EnforcementLevel.MANDATORY),
]
