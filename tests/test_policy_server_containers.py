"""internal-ports and no-plaintext-secrets on raw containers that start an engine's server or a Ray node
(policies/rules/security.py), through the analyzer: a vLLM image run without entrypoints (the image's own
ENTRYPOINT reads the command), a server no engine's container reader parses (its credential flags found in
the argv), and `ray start` in a script uploaded into the container."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.policies import analyze

CONTAINER = "docker:index/container:Container"
OPEN_HOST = (
    "on the host network listens on every interface of the node, and /v1, /metrics and /health answer without a "
    "key there (only the gateway checks keys). Pass --host <the node's cluster address>."
)
SECRET_ADVICE = (
    "Anyone with docker or shell access on the node reads it (docker inspect, ps, the command log). Read it from a "
    'file on the host (NAME__FILE, --api-key "$(cat /etc/llm-cluster/…)"), or list a harmless env name in this '
    "policy's ignoreEnv."
)


def said(rule: str, props: dict[str, Any]) -> list[str]:
    return [m.split("\n", 1)[1] for p, _, m in analyze(CONTAINER, "raw", props) if p == rule]


@pytest.mark.parametrize(
    ("image", "command", "messages"),
    [
        # The image's ENTRYPOINT is `vllm serve` from 0.19.1 (its facts), the api_server up to 0.9.2.
        (
            "vllm/vllm-openai:v0.19.1",
            ["/data/models/m", "--host", "0.0.0.0"],
            [f"vllm serve --host 0.0.0.0 {OPEN_HOST}"],
        ),
        ("vllm/vllm-openai:v0.19.1", ["/data/models/m", "--host", "10.0.0.5"], []),
        ("vllm/vllm-openai:v0.19.1", ["/data/models/m"], [f"vllm serve --host (unset) {OPEN_HOST}"]),
        (
            "vllm/vllm-openai:v0.9.2",
            ["--model", "/data/models/m", "--host", "::"],
            [f"vllm.entrypoints.openai.api_server --host :: {OPEN_HOST}"],
        ),
        # Another image: its command is not read as vLLM's arguments.
        ("nginx:1.27", ["/data/models/m", "--host", "0.0.0.0"], []),
    ],
)
def test_a_vllm_image_run_without_entrypoints_is_read_by_its_own_entrypoint(
    image: str, command: list[str], messages: list[str]
) -> None:
    props = {
        "networkMode": "host",
        "restart": "always",
        "labels": [{"label": "llm-cluster.image", "value": image}],
        "image": "sha256:0123",
        "command": command,
    }
    assert said("internal-ports", props) == messages


@pytest.mark.parametrize(
    ("argv", "found"),
    [
        # LMDeploy's server has no container reader here: its credential flag is found in the argv itself.
        (["lmdeploy", "serve", "api_server", "/m", "--api-keys", "sk-live-abcdef"], "--api-keys"),
        (["lmdeploy", "serve", "api_server", "/m", "--api-keys=sk-live-abcdef"], "--api-keys"),
        (["llama-server", "-m", "/m.gguf", "--api-key", "sk-live-abcdef"], "--api-key"),
        (["lmdeploy", "serve", "api_server", "/m", "--api-keys", "$KEY"], None),
    ],
)
def test_a_server_no_reader_parses_has_its_credential_flags_found_in_the_argv(
    argv: list[str], found: str | None
) -> None:
    props = {"restart": "always", "image": "openmmlab/lmdeploy:v0.10.0", "command": argv}
    assert said("no-plaintext-secrets", props) == (
        [f"credential in plain text: {found}. {SECRET_ADVICE}"] if found else []
    )


@pytest.mark.parametrize(
    ("script", "messages"),
    [
        (
            "#!/bin/bash\nset -euo pipefail\nexec ray start --head --dashboard-host=0.0.0.0 --block\n",
            [
                "ray start --dashboard-host=0.0.0.0 opens Ray's dashboard (job submission = code execution) on every "
                "interface. Bind it to the node's cluster address or leave it on 127.0.0.1."
            ],
        ),
        ("#!/bin/bash\nexec ray start --head --dashboard-host=10.0.0.5 --block\n", []),
        # Every `ray start` of the script is read, not only the last.
        (
            "#!/bin/bash\nray start --head --dashboard-host=0.0.0.0\nexec ray start --head --block\n",
            [
                "ray start --dashboard-host=0.0.0.0 opens Ray's dashboard (job submission = code execution) on every "
                "interface. Bind it to the node's cluster address or leave it on 127.0.0.1."
            ],
        ),
        # A line that does not start Ray is not read for its flags.
        ("#!/bin/bash\necho --dashboard-host=0.0.0.0\nexec ray start --head --block\n", []),
    ],
)
def test_a_ray_start_in_an_uploaded_script_is_read(script: str, messages: list[str]) -> None:
    props = {
        "networkMode": "host",
        "restart": "always",
        "image": "rayproject/ray:2.40.0",
        "labels": [{"label": "llm-cluster.role", "value": "ray-head"}],
        "command": ["bash", "/ray-head.sh"],
        "uploads": [{"file": "/ray-head.sh", "content": script}],
    }
    assert said("internal-ports", props) == messages


def test_the_ray_start_of_the_argv_is_read_beside_an_uploaded_script() -> None:
    props = {
        "networkMode": "host",
        "restart": "always",
        "image": "rayproject/ray:2.40.0",
        "command": ["ray", "start", "--head", "--dashboard-host=::", "--block"],
        "uploads": [{"file": "/ray-env.sh", "content": "# sourced before ray start\nexport RAY_DEDUP_LOGS=0\n"}],
    }
    assert said("internal-ports", props) == [
        "ray start --dashboard-host=:: opens Ray's dashboard (job submission = code execution) on every "
        "interface. Bind it to the node's cluster address or leave it on 127.0.0.1."
    ]


def test_ports_of_a_host_network_container_are_not_read_as_published() -> None:
    # Docker discards published ports on the host network (with a warning): what the services bind is what is open.
    props = {
        "networkMode": "host",
        "restart": "always",
        "image": "nginx:1.27",
        "ports": [{"internal": 8000.0, "external": 8000.0, "ip": "0.0.0.0"}],
    }
    assert said("internal-ports", props) == []
    props["networkMode"] = "bridge"
    assert said("internal-ports", props) == [
        "port 8000 of a unlabelled container is published on every interface: vLLM, Ray and metrics ports serve "
        "without authentication. Publish it on the node's cluster address (ports[].ip) or drop it and let the "
        "gateway/Prometheus reach it over the cluster network."
    ]
