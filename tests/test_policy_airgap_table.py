"""air-gapped-images and air-gapped-hub (policies/rules/airgap.py) as tables through the real analyzer
servicer: every way an image's supply reaches a public registry or not, on every node or some, one image or
several; every engine's hub flags, offline switch and offline variables, with the whole message; and the reason
air-gapped-hub gives for a resource it does not judge."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import struct_pb2
from pulumi.runtime import proto

from components.engines.registry import ENGINES
from components.marks import GPU_NODE
from plan.analyze import configured_servicer
from policies.rules.airgap import WAY_OUT
from tests.support.policies import STACK, model_server, not_applicable, server


def images(*nodes: tuple[str, bool, list[dict[str, Any]]]) -> list[str]:
    """air-gapped-images' messages for a stack of these GPU nodes: (name, airGapped, imageSupply)."""
    resources = []
    for name, air_gapped, supply in nodes:
        s = struct_pb2.Struct()
        s.update({"airGapped": air_gapped, "imageSupply": supply})
        resources.append(
            proto.AnalyzerResource(urn=f"{STACK}{GPU_NODE}::{name}", type=GPU_NODE, name=name, properties=s)
        )
    got = configured_servicer(None).AnalyzeStack(proto.AnalyzeStackRequest(resources=resources), None).diagnostics
    return [d.message.split("\n", 1)[1] for d in got if d.policyName == "air-gapped-images"]


def refused(count: int, listed: str) -> str:
    return (
        f"images.airGapped is true, but {count} image{'s' if count > 1 else ''} would still come from a public "
        f"registry the nodes cannot reach: {listed}. {WAY_OUT}"
    )


VLLM = {"image": "vllm/vllm-openai:v0.19.1", "via": "origin", "source": "docker.io/vllm/vllm-openai:v0.19.1"}
DCGM = {"image": "dcgm", "via": "origin", "source": "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3"}
GATEWAY = {"image": "llm-gateway:1", "via": "build", "source": "debian:bookworm-slim"}
MIRRORED = {
    "image": "vllm/vllm-openai:v0.19.1",
    "via": "registry",
    "source": "registry.lab:5000/vllm/vllm-openai:v0.19.1",
}
TARBALL = {"image": "vllm/vllm-openai:v0.19.1", "via": "tarball", "source": "/srv/images/vllm.tar"}
FROM_VLLM = "vllm/vllm-openai:v0.19.1 from Docker Hub (docker.io/vllm/vllm-openai:v0.19.1)"
FROM_DCGM = "dcgm from NVIDIA NGC (nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3)"
BUILT = "llm-gateway:1 built on its node from debian:bookworm-slim (Docker Hub) and the Debian archive"


@pytest.mark.parametrize(
    ("nodes", "messages"),
    [
        # Not air-gapped: public registries are fine.
        ([("gpu-01", False, [VLLM, GATEWAY])], []),
        ([("gpu-01", False, [VLLM]), ("gpu-02", False, [DCGM])], []),
        # Air-gapped, every image from a private registry or a tarball: nothing to say.
        ([("gpu-01", True, [MIRRORED, TARBALL])], []),
        ([("gpu-01", True, [])], []),
        # One public image on the only node, on every node, on some.
        ([("gpu-01", True, [VLLM])], [refused(1, f"{FROM_VLLM} on every node")]),
        ([("gpu-01", True, [VLLM]), ("gpu-02", True, [VLLM])], [refused(1, f"{FROM_VLLM} on every node")]),
        (
            [("gpu-01", True, [VLLM]), ("gpu-02", True, [MIRRORED]), ("gpu-03", True, [VLLM])],
            [refused(1, f"{FROM_VLLM} on gpu-01, gpu-03")],
        ),
        # One node saying airGapped is enough (they all share the images section).
        ([("gpu-01", False, [MIRRORED]), ("gpu-02", True, [DCGM])], [refused(1, f"{FROM_DCGM} on gpu-02")]),
        # Several images, and one image from two sources counted once.
        ([("gpu-01", True, [VLLM, DCGM])], [refused(2, f"{FROM_VLLM} on every node; {FROM_DCGM} on every node")]),
        (
            [("gpu-01", True, [VLLM, DCGM, GATEWAY])],
            [refused(3, f"{FROM_VLLM} on every node; {FROM_DCGM} on every node; {BUILT} on every node")],
        ),
        (
            [("gpu-01", True, [VLLM]), ("gpu-02", True, [{**VLLM, "source": "quay.io/vllm/vllm-openai:v0.19.1"}])],
            [
                refused(
                    1,
                    f"{FROM_VLLM} on gpu-01; vllm/vllm-openai:v0.19.1 from Quay (quay.io/vllm/vllm-openai:v0.19.1) on gpu-02",
                )
            ],
        ),
        # images.registry naming a public registry: said so; a cloud registry by its suffix.
        (
            [("gpu-01", True, [{**MIRRORED, "source": "ghcr.io/acme/vllm-openai:v0.19.1"}])],
            [
                refused(
                    1,
                    "vllm/vllm-openai:v0.19.1 from GitHub Container Registry (ghcr.io/acme/vllm-openai:v0.19.1), "
                    "the registry images.registry names on every node",
                )
            ],
        ),
        (
            [("gpu-01", True, [{**MIRRORED, "source": "123.dkr.ecr.eu-west-1.amazonaws.com/vllm:1"}])],
            [
                refused(
                    1,
                    "vllm/vllm-openai:v0.19.1 from Amazon ECR (123.dkr.ecr.eu-west-1.amazonaws.com/vllm:1), "
                    "the registry images.registry names on every node",
                )
            ],
        ),
        # A tarball is read from the node's disk whatever its path says.
        ([("gpu-01", True, [{**TARBALL, "source": "docker.io/vllm/vllm-openai:v0.19.1"}])], []),
    ],
)
def test_air_gapped_images(nodes: list[tuple[str, bool, list[dict[str, Any]]]], messages: list[str]) -> None:
    assert images(*nodes) == messages


# --- air-gapped-hub ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("type_", "props", "reason"),
    [
        ("docker:index/container:Container", {"airGapped": True}, "not a model server"),
        ("llm-cluster:vllm:ModelServer", {"pool": "chat"}, "images.airGapped is false"),
        ("llm-cluster:vllm:ModelServer", {"pool": "chat", "airGapped": False}, "images.airGapped is false"),
        (
            "llm-cluster:vllm:ModelServer",
            {"pool": "chat", "airGapped": True, "engine": "tgi"},
            "engine 'tgi' has no planning module",
        ),
        ("llm-cluster:vllm:ModelServer", {"pool": "chat", "airGapped": True}, "engine None has no planning module"),
    ],
)
def test_air_gapped_hub_says_why_it_does_not_judge_a_resource(type_: str, props: dict[str, Any], reason: str) -> None:
    assert not_applicable(type_, props).get("air-gapped-hub") == reason


def hub(engine: str, argv_add: list[str] | None = None, **props: Any) -> list[str]:
    """air-gapped-hub's messages on the reference chat server run by `engine`, air-gapped and offline."""
    changed = server(**{"engine": engine, "airGapped": True, "offline": True, "argv_add": argv_add or [], **props})
    return [m.split("\n", 1)[1] for p, _, m in model_server(changed) if p == "air-gapped-hub"]


def download(flag: str, name: str, title: str) -> str:
    return (
        f"images.airGapped is true, but {flag} {name} would make {title} download {name!r} from a hub the nodes "
        "cannot reach: copy it to the nodes (beside the weights) and give its absolute path, or remove the flag."
    )


def online(pool: str, title: str) -> str:
    return (
        f"images.airGapped is true, but pools.{pool}.offline is false: {title} would try the model hub and send "
        f"usage statistics to hosts the nodes cannot reach. Remove pools.{pool}.offline (it defaults to true)."
    )


def turned_on(name: str, value: str, offline: str, pool: str = "chat") -> str:
    return (
        f"images.airGapped is true, but {name}={value} turns back on what pools.{pool}.offline turns off "
        f"({name}={offline}): remove pools.{pool}.env.{name}."
    )


@pytest.mark.parametrize(
    ("engine", "argv_add", "props", "messages"),
    [
        ("vllm", [], {}, []),
        ("vllm", ["--tokenizer", "/data/models/tok"], {}, []),
        ("vllm", ["--tokenizer", "Qwen/Qwen3-30B-A3B"], {}, [download("--tokenizer", "Qwen/Qwen3-30B-A3B", "vLLM")]),
        (
            "vllm",
            ["--tokenizer=Qwen/Qwen3-30B-A3B", "--hf-config-path", "org/cfg"],
            {},
            [download("--tokenizer", "Qwen/Qwen3-30B-A3B", "vLLM"), download("--hf-config-path", "org/cfg", "vLLM")],
        ),
        # The hub flags are read before the offline switch, and both are said.
        (
            "vllm",
            ["--tokenizer", "org/tok"],
            {"offline": False},
            [download("--tokenizer", "org/tok", "vLLM"), online("chat", "vLLM")],
        ),
        ("vllm", [], {"offline": None}, [online("chat", "vLLM")]),
        ("vllm", [], {"offline": False, "pool": "code"}, [online("code", "vLLM")]),
        # Offline off: the variables are not judged (the message says offline is false, once).
        ("vllm", [], {"offline": False, "env": {"HF_HUB_OFFLINE": "0"}}, [online("chat", "vLLM")]),
        # Each offline variable set back, set as offline sets it, or absent.
        ("vllm", [], {"env": {"HF_HUB_OFFLINE": "0"}}, [turned_on("HF_HUB_OFFLINE", "0", "1")]),
        ("vllm", [], {"env": {"HF_HUB_OFFLINE": "1"}}, []),
        (
            "vllm",
            [],
            {"env": {"RAY_USAGE_STATS_ENABLED": "1", "VLLM_NO_USAGE_STATS": "0"}},
            [turned_on("VLLM_NO_USAGE_STATS", "0", "1"), turned_on("RAY_USAGE_STATS_ENABLED", "1", "0")],
        ),
        (
            "vllm",
            [],
            {"env": {"RAY_USAGE_STATS_ENABLED": "1"}, "pool": "code"},
            [turned_on("RAY_USAGE_STATS_ENABLED", "1", "0", "code")],
        ),
        ("vllm", [], {"env": {"OTHER": "0"}}, []),
        ("vllm", [], {"env": None}, []),
        (
            "lmdeploy",
            ["--speculative-draft-model", "org/draft"],
            {},
            [download("--speculative-draft-model", "org/draft", "LMDeploy")],
        ),
        ("lmdeploy", [], {"offline": False}, [online("chat", "LMDeploy")]),
        ("lmdeploy", [], {"env": {"TRANSFORMERS_OFFLINE": "0"}}, [turned_on("TRANSFORMERS_OFFLINE", "0", "1")]),
        ("llamacpp", [], {"offline": False}, [online("chat", "llama.cpp")]),
        ("llamacpp", [], {"env": {"LLAMA_ARG_OFFLINE": "0"}}, [turned_on("LLAMA_ARG_OFFLINE", "0", "1")]),
        ("llamacpp", [], {"env": {"HF_HUB_OFFLINE": "0"}}, []),
    ],
)
def test_air_gapped_hub(engine: str, argv_add: list[str], props: dict[str, Any], messages: list[str]) -> None:
    assert hub(engine, argv_add, **props) == messages


def test_the_table_covers_every_engine_and_offline_variable() -> None:
    assert {e.title for e in ENGINES.values()} == {"vLLM", "LMDeploy", "llama.cpp"}
    assert ENGINES["llamacpp"].offline_vars == {"LLAMA_ARG_OFFLINE": "1"}
    assert ENGINES["lmdeploy"].offline_vars == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
