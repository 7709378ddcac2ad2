"""What a container resource's props and labels say, read alike by an engine's rules and the policy pack:
the labels the product sets, what the container runs, the parts of an image reference."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

GPU_MODEL_LABEL = "llm-cluster.gpu-model"
IMAGE_LABEL = "llm-cluster.image"


def labels(props: Mapping[str, Any]) -> dict[str, str]:
    """A container's `labels` [{label, value}] as a dict."""
    return {str(item.get("label")): str(item.get("value")) for item in props.get("labels") or []}


def env_of(envs: Any) -> dict[str, str]:
    """A container's `envs` ["K=V"] (or a component's env dict) as a dict."""
    if isinstance(envs, Mapping):
        return {str(k): str(v) for k, v in envs.items()}
    out: dict[str, str] = {}
    for item in envs or []:
        key, _, value = str(item).partition("=")
        out[key] = value
    return out


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
