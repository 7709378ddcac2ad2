"""Rule 6: the image's torch must have kernels for the GPU (its CUDA arch list, from the image's facts);
images of multi-node (Ray) containers must carry Ray."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.engines.containers import IMAGE_LABEL, image_parts
from components.engines.vllm.facts import IMAGES, IMAGES_WITH_RAY
from components.engines.vllm.launch import Launch
from components.engines.vllm.rules.hardware import VOLTA_IMAGE, image_key


def _runs_on(capability: int) -> list[str]:
    return sorted(f.ref for f in IMAGES.values() if f.torch_runs_on(capability) and f.engine == "vllm")


def arch_problem(launch: Launch) -> str | None:
    """Why the image's torch cannot run on the launch's GPU ("no kernel image is available"), or None."""
    facts, gpu = launch.facts, launch.gpu
    if facts is None or gpu is None or facts.torch_runs_on(gpu.capability):
        return None
    arch = ", ".join(f"sm_{c}" for c in facts.torch_arch_list)
    return (
        f"{image_key(launch)} {facts.ref}: its torch {facts.torch} is built for {arch}, without "
        f'sm_{gpu.capability}, so the first CUDA kernel on {launch.where()} fails with "no kernel image is '
        f'available for execution on the device" ({facts.cite("torch_arch_list")}). Use an image whose torch '
        f"has sm_{gpu.capability}: {', '.join(_runs_on(gpu.capability)) or 'none in the facts table'}."
    )


def check_arch(launch: Launch, config: Mapping[str, Any]) -> list[str]:
    """The launch's image has kernels for its GPU (arch_problem as a rule's check)."""
    problem = arch_problem(launch)
    return [problem] if problem else []


def ray_problem(ref: str | None, config: Mapping[str, Any]) -> str | None:
    """Why an image cannot run a Ray node of a vLLM instance (it needs Ray and vLLM), or None."""
    if ref is None:
        return f"no image reference to check for Ray: label the container {IMAGE_LABEL}=<image ref>."
    repo, _ = image_parts(ref)
    if repo in IMAGES_WITH_RAY or repo in config["rayImages"] or ref in config["rayImages"]:
        return None
    return (
        f"image {ref} is not known to contain Ray and vLLM, which every container of a multi-node instance runs "
        f"(known: {', '.join(sorted(IMAGES_WITH_RAY))}). Use {VOLTA_IMAGE}, or list the image in this "
        "policy's rayImages."
    )
