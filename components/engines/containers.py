"""What a container resource's props and labels say, read alike by an engine's rules and the policy pack:
the labels the product sets, what the container runs, the parts of an image reference."""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

GPU_MODEL_LABEL = "llm-cluster.gpu-model"
IMAGE_LABEL = "llm-cluster.image"


def container_argv(props: Mapping[str, Any]) -> list[str]:
    """What a container runs: entrypoints followed by command (the image's own when both are unset)."""
    return [str(t) for t in list(props.get("entrypoints") or []) + list(props.get("command") or [])]


def image_parts(ref: str) -> tuple[str, str | None]:
    """'vllm/vllm-openai:v0.9.2@sha256:…' -> ('vllm/vllm-openai', 'v0.9.2'); Docker Hub prefixes removed."""
    ref = ref.split("@", 1)[0]
    repo, tag = ref, None
    if ":" in ref.rsplit("/", 1)[-1]:
        repo, tag = ref.rsplit(":", 1)
    repo = re.sub(r"^(docker\.io/|index\.docker\.io/|registry-1\.docker\.io/)", "", repo)
    repo = re.sub(r"^library/", "", repo)
    return repo, tag
