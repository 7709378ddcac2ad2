"""How a container resource's props are read by the engines' rules and the policy pack alike
(components/engines/containers.py): labels, env in both of its shapes, what the container runs, and an image
reference's repository and tag in every form Docker takes."""

from __future__ import annotations

from typing import Any

import pytest

from components.engines.containers import container_argv, env_of, image_parts, labels


@pytest.mark.parametrize(
    ("props", "read"),
    [
        ({}, {}),
        ({"labels": None}, {}),
        ({"labels": []}, {}),
        (
            {"labels": [{"label": "llm-cluster.gpu-model", "value": "Tesla T4"}, {"label": "n", "value": 8}]},
            {"llm-cluster.gpu-model": "Tesla T4", "n": "8"},
        ),
        ({"labels": [{"label": "a"}, {"value": "v"}]}, {"a": "None", "None": "v"}),
    ],
)
def test_labels(props: dict[str, Any], read: dict[str, str]) -> None:
    assert labels(props) == read


@pytest.mark.parametrize(
    ("envs", "read"),
    [
        (None, {}),
        ([], {}),
        ({}, {}),
        ({"A": 1, 2: "b"}, {"A": "1", "2": "b"}),
        (["A=1", "B=x=y", "C", "D=", 5], {"A": "1", "B": "x=y", "C": "", "D": "", "5": ""}),
        (("A=1", "A=2"), {"A": "2"}),
    ],
)
def test_env_of_a_list_or_a_mapping(envs: Any, read: dict[str, str]) -> None:
    assert env_of(envs) == read


@pytest.mark.parametrize(
    ("props", "argv"),
    [
        ({}, []),
        ({"entrypoints": None, "command": None}, []),
        ({"command": ["vllm", "serve", 8]}, ["vllm", "serve", "8"]),
        ({"entrypoints": ["/bin/sh", "-c"]}, ["/bin/sh", "-c"]),
        ({"entrypoints": ["python3"], "command": ["-m", "x"]}, ["python3", "-m", "x"]),
    ],
)
def test_container_argv_is_entrypoints_then_command(props: dict[str, Any], argv: list[str]) -> None:
    assert container_argv(props) == argv


@pytest.mark.parametrize(
    ("ref", "parts"),
    [
        ("vllm/vllm-openai:v0.9.2", ("vllm/vllm-openai", "v0.9.2")),
        ("vllm/vllm-openai:v0.9.2@sha256:0123abcd", ("vllm/vllm-openai", "v0.9.2")),
        ("vllm/vllm-openai@sha256:0123abcd", ("vllm/vllm-openai", None)),
        ("vllm/vllm-openai", ("vllm/vllm-openai", None)),
        ("nginx:1.27", ("nginx", "1.27")),
        ("nginx", ("nginx", None)),
        # The digest starts at the first @; a colon before the last segment is no tag.
        ("vllm/vllm-openai:v1@sha256:ab@cd", ("vllm/vllm-openai", "v1")),
        ("team/x:y/vllm", ("team/x:y/vllm", None)),
        # A registry's port is no tag; the tag is read from the last path segment only.
        ("registry.local:5000/team/vllm", ("registry.local:5000/team/vllm", None)),
        ("registry.local:5000/team/vllm:dev", ("registry.local:5000/team/vllm", "dev")),
        ("registry.local:5000/vllm:a:b", ("registry.local:5000/vllm:a", "b")),
        # Docker Hub's own names for itself and its official images' library/ are removed.
        ("docker.io/vllm/vllm-openai:v0.19.1", ("vllm/vllm-openai", "v0.19.1")),
        ("index.docker.io/vllm/vllm-openai", ("vllm/vllm-openai", None)),
        ("registry-1.docker.io/library/nginx:1.27", ("nginx", "1.27")),
        ("docker.io/library/nginx", ("nginx", None)),
        ("library/nginx:1.27", ("nginx", "1.27")),
        # Only as a prefix.
        ("mydocker.io/vllm:1", ("mydocker.io/vllm", "1")),
        ("ghcr.io/docker.io/x", ("ghcr.io/docker.io/x", None)),
        ("team/library/nginx", ("team/library/nginx", None)),
        ("docker.io/library/library/nginx", ("library/nginx", None)),
    ],
)
def test_image_parts(ref: str, parts: tuple[str, str | None]) -> None:
    assert image_parts(ref) == parts
